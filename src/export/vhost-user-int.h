/* vhost-user back-end internals shared by vhost-user.c (connection, message
 * loop, rings) and vhost-user-mem.c (memory table, inflight area).
 *
 * THREADING RULE: everything here is owned by the control loop's thread
 * but mem_faulted (atomic, see there); see vhost-user.h for what the
 * device's threads may touch. */
#ifndef IOPLANE_VHOST_USER_INT_H
#define IOPLANE_VHOST_USER_INT_H

#include <stdatomic.h>
#include "export/vhost-user.h"
#include "loop/loop.h"

struct vu_reply {
	uint32_t size;
	int fd; /* sent with the reply when >= 0, then closed */
	uint64_t payload[VU_MAX_PAYLOAD / 8];
};

/* A message handler (see vu_msg_wait). */
typedef int vu_handler_fn(struct vu_dev *d, struct vu_reply *rep);

struct vu_dev {
	struct loop *loop;
	int fd;
	struct loop_fd h;
	bool watching;
	const struct vu_dev_ops *ops;
	void *opaque;
	char name[64];

	unsigned num_queues;
	struct vu_vq *vqs;
	unsigned nrunning;
	uint64_t features, protocol_features;
	struct vring_mem mem;
	/* Set to 1 by mapguard's SIGBUS handler (util/mapguard.c), on whichever
	 * thread touched the page, when the front-end shrank a file behind a
	 * guarded mapping of this connection (guest memory, or an inflight
	 * area it gave us); the mapping then reads zero pages. Never cleared:
	 * the device's queues stop (broken) when they see it, and stay so
	 * until the front-end reconnects. */
	atomic_int mem_faulted;

	/* Dirty log (SET_LOG_BASE): log_size bytes at log, inside the mapping
	 * [log_map, log_map + log_map_len); NULL: none. */
	uint8_t *log, *log_map;
	size_t log_size, log_map_len;
	int log_guard;

	/* Inflight area (GET/SET_INFLIGHT_FD): nq queues of qsize entries. */
	uint8_t *inflight;
	size_t inflight_len;
	int inflight_guard;
	uint16_t inflight_nq, inflight_qsize;

	/* The message being received or handled. */
	struct vu_msg_hdr hdr;
	uint64_t payload[VU_MAX_PAYLOAD / 8];
	size_t have; /* bytes of header + payload received */
	int fds[VU_MAX_FDS];
	unsigned nfds;

	/* The back-end channel (SET_BACKEND_REQ_FD): messages to the front-end,
	 * only VHOST_USER_BACKEND_CONFIG_CHANGE_MSG so far; -1: none. */
	int backend_fd;

	unsigned pending; /* queue stops and fd hand-overs not finished yet */
	bool busy;        /* a handler waits for `pending` to reach 0 */
	/* What runs when it has: NULL, the handler again (a stop), else this. */
	vu_handler_fn *resume;
	bool closing;
};

/* Message handlers (vu_h_*, h_* in vhost-user.c) return 0 or -errno. One
 * that must wait for queues to stop, or for a device to take new fds,
 * returns vu_msg_wait(d) (0, with d->busy set): the socket is not read
 * meanwhile, and once `pending` is back at 0 the handler runs again (or
 * d->resume, which then only finishes the message). */
int vu_msg_wait(struct vu_dev *d);
/* Stop every running queue: true when none runs any more, false when some
 * stops finish later (vu_queue_stopped). */
bool vu_stop_all(struct vu_dev *d);
/* Start every queue that is ready to run (after a memory change). */
int vu_start_ready(struct vu_dev *d);
/* Take fds[i] from the message (the caller now owns it). */
int vu_take_fd(struct vu_dev *d, unsigned i);
bool vu_has_pf(const struct vu_dev *d, unsigned bit);

int vu_h_set_mem_table(struct vu_dev *d, struct vu_reply *rep);
int vu_h_add_mem_reg(struct vu_dev *d, struct vu_reply *rep);
int vu_h_rem_mem_reg(struct vu_dev *d, struct vu_reply *rep);
int vu_h_get_max_mem_slots(struct vu_dev *d, struct vu_reply *rep);
int vu_h_get_inflight_fd(struct vu_dev *d, struct vu_reply *rep);
int vu_h_set_inflight_fd(struct vu_dev *d, struct vu_reply *rep);
void vu_mem_unmap_all(struct vring_mem *m);
void vu_inflight_unmap(struct vu_dev *d);
/* Map queue idx's rings (split or packed, as the features say) through the
 * memory table, with its features, log and inflight region, and start its
 * vring: 0 or -errno. */
int vu_vq_setup(struct vu_dev *d, unsigned idx);
int vu_h_set_log_base(struct vu_dev *d, struct vu_reply *rep);
void vu_log_unmap(struct vu_dev *d);
/* The inflight region for queue idx of `num` entries, or NULL. */
struct vring_inflight *vu_inflight_queue(struct vu_dev *d, unsigned idx, unsigned num);

#endif
