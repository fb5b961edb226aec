/* vhost-user-blk and vhost-user-scsi exports: a unix socket where one
 * front-end at a time (QEMU, cloud-hypervisor, `ioplane bench --vhost-user`)
 * attaches a block node as a virtio-blk device, or block nodes as the LUNs
 * of a virtio-scsi controller (cfg->scsi: num_queues request queues after a
 * control and an event queue). Queue i runs on loops[(first_loop + i) % nloops].
 *
 * Exports are started and stopped at any time, each on its own: one
 * export's start or stop never pauses another's queues.
 *
 * THREADING RULE: created, stopped and freed on the main thread, whose loop
 * (main_loop) accepts the connection and handles its messages; queues run on
 * their iothreads. */
#ifndef IOPLANE_VHOST_USER_BLK_H
#define IOPLANE_VHOST_USER_BLK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "export/virtio-blk.h"

struct loop;
struct vub_export;

struct vub_export_config {
	const char *path; /* unix socket for vub_export_listen; NULL: none,
			   * connections come from vub_export_attach_fd */
	mode_t mode;      /* socket permissions; 0: 0600 */
	struct blk_node *bs;
	struct vblk_dev_opts blk; /* writable, logical block size, serial, num_queues */
	struct loop *main_loop;
	struct loop **loops;
	unsigned nloops;
	unsigned first_loop; /* spreads queue 0 of several exports */
	bool scsi;           /* virtio-scsi; bs is LUN 0 */
	bool write_cache;    /* virtio-scsi: WCE (else every write is FUA) */
	const char *id;      /* virtio-scsi: makes the LUNs' device identifiers */
};

/* Set the export up (not listening yet). err gets a human message on failure. */
int vub_export_start(const struct vub_export_config *cfg, struct vub_export **out, char *err,
		     size_t errlen);
/* Listen on cfg->path, by unix-listener.h's rules (a live socket is refused,
 * a stale one replaced). err gets "cannot listen on PATH: REASON". */
int vub_export_listen(struct vub_export *e, char *err, size_t errlen);
/* Accept front-ends on fd, a listening socket the parent passed in
 * (addr.type=fd); ownership passes on success. */
int vub_export_listen_fd(struct vub_export *e, int fd, char *err, size_t errlen);
/* Stop listening, drop the front-end (in-flight requests finish and reach
 * the used ring first); then done(opaque) runs on the main loop. */
void vub_export_stop(struct vub_export *e, void (*done)(void *opaque), void *opaque);
/* After the stop's done() (or if it was never started). */
void vub_export_free(struct vub_export *e);

/* The node was replaced (blk_replace_node): the queues submit to bs. */
void vub_export_set_node(struct vub_export *e, struct blk_node *bs);

/* Tests and fuzzing: serve an already connected socket (ownership passes);
 * -EBUSY while another front-end is attached. */
int vub_export_attach_fd(struct vub_export *e, int fd);
bool vub_export_connected(const struct vub_export *e);
unsigned vub_export_queues(const struct vub_export *e); /* num-queues */

/* vhost-user-scsi: LUN hot-plug (main thread). The driver gets a transport
 * reset event for the LUN and rescans. add: 0, -EEXIST, -EINVAL, -EROFS
 * (err says which). remove: the LUN is gone for new commands at once;
 * done(bs) runs on the main loop once no command uses it any more (the
 * caller's reference to bs is then free to drop). */
int vub_export_lun_add(struct vub_export *e, unsigned lun, struct blk_node *bs, char *err,
		       size_t errlen);
int vub_export_lun_remove(struct vub_export *e, unsigned lun,
			  void (*done)(struct blk_node *bs, void *opaque), void *opaque, char *err,
			  size_t errlen);
bool vub_export_is_scsi(const struct vub_export *e);
/* The node of LUN lun, or NULL. */
struct blk_node *vub_export_lun_node(const struct vub_export *e, unsigned lun);

#endif
