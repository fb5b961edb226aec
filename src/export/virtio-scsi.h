/* virtio-scsi device model (virtio 1.2 section 5.6), independent of the
 * transport: feature bits, configuration space, the LUN table, and the three
 * kinds of virtqueue: control (task management), event (hot-plug events to
 * the driver) and request (SCSI commands, decoded by scsi.c and run on the
 * block layer with the data in guest memory).
 *
 * THREADING RULE: a struct vscsi_dev is set up on the control (main) thread.
 * LUNs are added and removed there; a request queue's thread takes a LUN's
 * reference (refs, seq_cst against present) for each command, so a removal
 * waits for refs to reach 0 before the node is let go. cdb_size/sense_size
 * are written by the main thread (SET_CONFIG) while queues may run: relaxed
 * atomics. The parked event buffers and the pending events belong to the
 * event queue's thread; pending events are posted under ev_lock. */
#ifndef IOPLANE_VIRTIO_SCSI_H
#define IOPLANE_VIRTIO_SCSI_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "block/block.h"
#include "export/scsi.h"
#include "export/virtio-blk.h"

#define VIRTIO_SCSI_F_INOUT 0
#define VIRTIO_SCSI_F_HOTPLUG 1
#define VIRTIO_SCSI_F_CHANGE 2
#define VIRTIO_SCSI_F_T10_PI 3

/* Response codes */
#define VIRTIO_SCSI_S_OK 0
#define VIRTIO_SCSI_S_FUNCTION_COMPLETE 0
#define VIRTIO_SCSI_S_OVERRUN 1
#define VIRTIO_SCSI_S_BAD_TARGET 3
#define VIRTIO_SCSI_S_FAILURE 9
#define VIRTIO_SCSI_S_FUNCTION_SUCCEEDED 10
#define VIRTIO_SCSI_S_FUNCTION_REJECTED 11
#define VIRTIO_SCSI_S_INCORRECT_LUN 12

/* Control queue */
#define VIRTIO_SCSI_T_TMF 0
#define VIRTIO_SCSI_T_AN_QUERY 1
#define VIRTIO_SCSI_T_AN_SUBSCRIBE 2
#define VIRTIO_SCSI_T_TMF_ABORT_TASK 0
#define VIRTIO_SCSI_T_TMF_ABORT_TASK_SET 1
#define VIRTIO_SCSI_T_TMF_CLEAR_ACA 2
#define VIRTIO_SCSI_T_TMF_CLEAR_TASK_SET 3
#define VIRTIO_SCSI_T_TMF_I_T_NEXUS_RESET 4
#define VIRTIO_SCSI_T_TMF_LOGICAL_UNIT_RESET 5
#define VIRTIO_SCSI_T_TMF_QUERY_TASK 6
#define VIRTIO_SCSI_T_TMF_QUERY_TASK_SET 7

/* Events */
#define VIRTIO_SCSI_T_NO_EVENT 0
#define VIRTIO_SCSI_T_TRANSPORT_RESET 1
#define VIRTIO_SCSI_T_PARAM_CHANGE 3
#define VIRTIO_SCSI_T_EVENTS_MISSED 0x80000000u
#define VIRTIO_SCSI_EVT_RESET_RESCAN 1
#define VIRTIO_SCSI_EVT_RESET_REMOVED 2

#define VIRTIO_SCSI_CDB_DEFAULT 32
#define VIRTIO_SCSI_SENSE_DEFAULT 96
#define VSCSI_SENSE_MAX 252
#define VSCSI_CDB_MAX 64
#define VSCSI_CTRL_Q 0
#define VSCSI_EVENT_Q 1
#define VSCSI_FIRST_REQ_Q 2
#define VSCSI_EVENTS_PENDING 16 /* posted, not yet delivered (more: EVENTS_MISSED) */

struct virtio_scsi_config {
	uint32_t num_queues;
	uint32_t seg_max;
	uint32_t max_sectors;
	uint32_t cmd_per_lun;
	uint32_t event_info_size;
	uint32_t sense_size;
	uint32_t cdb_size;
	uint16_t max_channel;
	uint16_t max_target;
	uint32_t max_lun;
} __attribute__((packed));

#define VSCSI_CONFIG_SENSE_OFF 20
#define VSCSI_CONFIG_CDB_OFF 24

struct virtio_scsi_event {
	uint32_t event;
	uint8_t lun[8];
	uint32_t reason;
} __attribute__((packed));

struct vscsi_lun {
	atomic_bool present;
	atomic_uint refs;    /* commands in flight on it */
	struct blk_node *bs; /* set before present, cleared after refs is 0 */
	struct scsi_lu lu;   /* blocks: relaxed atomics on a resize */
	char serial[32];
};

struct vscsi_event {
	uint32_t event, reason;
	uint16_t lun;
};

struct vscsi_dev {
	struct vscsi_lun luns[SCSI_MAX_LUNS];
	unsigned num_queues; /* request queues */
	bool writable, write_cache;
	_Atomic uint32_t cdb_size, sense_size;
	uint64_t naa_base; /* VPD 0x83: naa_base + LUN */
	/* Event queue: parked buffers (its thread), posted events (ev_lock). */
	struct vscsi_req *parked;
	pthread_mutex_t ev_lock;
	struct vscsi_event pending[VSCSI_EVENTS_PENDING];
	unsigned npending;
	bool missed;
};

struct vscsi_req {
	struct vblk_req v; /* first: iov, lengths, used_len, error and done */
	struct vscsi_dev *dev;
	struct vscsi_lun *lun;  /* holds a reference while set */
	struct vscsi_req *next; /* parked */
	struct scsi_extent ext[SCSI_UNMAP_MAX];
	unsigned next_ext, next_ext_end;
	struct iovec saved; /* the writable iovec split at the data-in start */
	unsigned saved_idx;
	uint32_t resid, resp_size;
	uint8_t status, response, sense_len, key;
	uint16_t asc;
	uint8_t tmf_kind; /* control request waiting for its LUN(s) to drain */
	uint16_t tmf_lun;
};

/* writable/write_cache for every LUN. 0 or -errno. */
int vscsi_dev_init(struct vscsi_dev *d, unsigned num_queues, bool writable, bool write_cache);
void vscsi_dev_destroy(struct vscsi_dev *d);
uint64_t vscsi_dev_features(const struct vscsi_dev *d);
void vscsi_dev_config(const struct vscsi_dev *d, struct virtio_scsi_config *c);
int vscsi_dev_set_config(struct vscsi_dev *d, uint32_t off, const uint8_t *buf, uint32_t len);

/* Main thread. add: -EEXIST (taken), -EINVAL (lun >= SCSI_MAX_LUNS),
 * -EROFS (writable device, read-only node). remove: -ENOENT, else the
 * unit is gone for new commands; vscsi_lun_busy() says when the last in
 * flight finished, then vscsi_lun_release() returns the node. */
int vscsi_lun_add(struct vscsi_dev *d, unsigned lun, struct blk_node *bs, const char *serial);
int vscsi_lun_remove(struct vscsi_dev *d, unsigned lun);
bool vscsi_lun_busy(struct vscsi_dev *d, unsigned lun);
struct blk_node *vscsi_lun_release(struct vscsi_dev *d, unsigned lun);
/* The node of a present LUN was resized or replaced (main thread). */
void vscsi_lun_resized(struct vscsi_dev *d, struct blk_node *bs);
void vscsi_lun_set_node(struct vscsi_dev *d, struct blk_node *from, struct blk_node *to);

/* Post an event for the driver (any thread); vscsi_events_deliver() on the
 * event queue's thread hands it over. */
void vscsi_event_post(struct vscsi_dev *d, uint32_t event, uint16_t lun, uint32_t reason);
/* Event queue thread: fill parked buffers with pending events (done runs
 * for each). */
void vscsi_events_deliver(struct vscsi_dev *d);
/* Event queue thread, at a stop: give every parked buffer back empty. */
void vscsi_events_flush(struct vscsi_dev *d);

/* Handle one chain of virtqueue qidx (control, event or request).
 * VBLK_SUBMITTED: r->v.done runs later (an event buffer is parked, a task
 * management function waits, an I/O runs). */
enum vblk_submit_result vscsi_req_submit(struct vscsi_req *r, unsigned qidx);
/* A task management function that returned VBLK_SUBMITTED: retry; true
 * when it finished (status written, done not called). */
bool vscsi_tmf_retry(struct vscsi_req *r);

/* ---- internal: virtio-scsi.c for virtio-scsi-cmd.c ---- */
enum vblk_submit_result vscsi_cmd_submit(struct vscsi_req *r);

/* Inline: every command takes these. */

/* A reference on a present LUN, or NULL (see the threading rule). */
static inline struct vscsi_lun *vscsi_lun_get(struct vscsi_dev *d, unsigned lun)
{
	struct vscsi_lun *l;

	if (lun >= SCSI_MAX_LUNS)
		return NULL;
	l = &d->luns[lun];
	atomic_fetch_add(&l->refs, 1);
	if (atomic_load(&l->present))
		return l;
	atomic_fetch_sub(&l->refs, 1);
	return NULL;
}

static inline void vscsi_lun_put(struct vscsi_lun *l)
{
	if (l)
		atomic_fetch_sub_explicit(&l->refs, 1, memory_order_release);
}

/* The 8-byte LUN field: target 0, single-level flat or peripheral LUN.
 * Returns the LUN, -1 for another target (BAD_TARGET), or SCSI_MAX_LUNS
 * for a LUN that cannot exist. */
static inline int vscsi_lun_decode(const uint8_t *f)
{
	unsigned lun;

	if (f[0] != 1 || f[1] != 0)
		return -1;
	lun = ((unsigned)f[2] << 8 | f[3]) & 0x3fff;
	if (f[4] | f[5] | f[6] | f[7] || lun >= SCSI_MAX_LUNS)
		return SCSI_MAX_LUNS;
	return (int)lun;
}

#endif
