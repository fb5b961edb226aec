/* vhost-user-blk export internals shared by vhost-user-blk.c (the export,
 * the request path, start and stop) and vhost-user-blk-signal.c (the
 * front-end's eventfds: kicks read, calls and errors written).
 *
 * THREADING RULE: as vhost-user-blk.c says - struct vub_export is main-thread
 * only; a running struct vub_queue belongs to its iothread. */
#ifndef IOPLANE_EXPORT_VHOST_USER_BLK_INT_H
#define IOPLANE_EXPORT_VHOST_USER_BLK_INT_H
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "export/vhost-user-blk.h"
#include "export/vhost-user.h"
#include "export/virtio-scsi.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/unix-listener.h"

struct vub_queue;

/* A call or error eventfd of the front-end, written by the iothread through
 * its loop's io_uring with at most one write in flight. */
struct vub_notifier {
	int fd;          /* -1: none (the number is owned by vhost-user.c) */
	int write_fd;    /* the fd the write in flight goes to */
	bool inflight;   /* a write SQE not completed yet */
	bool again;      /* signal once more when it has */
	bool cancelling; /* a cancel SQE for it not completed yet */
	bool lost;       /* a write was cancelled: signal at the next start */
	bool nonblock;   /* fd is O_NONBLOCK and the loop waits in io_uring */
	struct loop_uring_op op, cancel_op;
	struct vub_queue *q;
};

/* Kicks through the loop's io_uring (loops that wait in it): a kick arrives
 * in the loop's wait as a completion, where the fd handler took a readiness
 * event and then a read call. Best, a multishot poll of the kick eventfd
 * (armed once per run): every write of the front-end wakes the eventfd's
 * wait queue and so posts a completion, and the counter is never read - it
 * only grows (2^64 kicks to overflow), and whoever gets the fd next sees at
 * worst one spurious kick. Kernels older than multishot poll: a read of the
 * eventfd, armed again after each kick (the kernel polls it internally).
 * Threading: the queue's iothread (set up in vub_kick_start). */
struct vub_kick {
	struct loop_uring_op op, cancel_op;
	uint64_t val;    /* the counter read (read SQE): written by the kernel while armed */
	bool ring;       /* this run takes kicks so (else through kick_h) */
	bool multishot;  /* ... as a multishot poll (else as reads) */
	bool armed;      /* a poll or read SQE not ended yet (multishot: no final CQE yet) */
	bool cancelling; /* a cancel SQE for it not completed yet */
};

struct vub_req {
	union { /* first: completions cast back */
		struct vblk_req vr;
		struct vscsi_req sr; /* vhost-user-scsi; sr.v is vr */
	};
	struct vub_queue *q;
	uint16_t head;
	struct iovec iov[VBLK_MAX_IOV];
};

struct vub_queue {
	/* Written by the main thread while stopped, read by the iothread. */
	struct vub_export *exp;
	struct vu_dev *dev;
	atomic_int *mem_faulted; /* the device's, set from the SIGBUS guard */
	struct vring *vr;
	unsigned idx;
	struct loop *loop;
	int new_call_fd, new_err_fd; /* also while running: read by fds_msg's handler */
	uint16_t *resubmit;          /* inflight heads to run again at start */
	unsigned nresubmit, resubmit_cap;
	struct vub_req *reqs;
	unsigned nreqs;

	/* Owned by the iothread while running (kick_h.fd and the notifiers' fd
	 * are set by the main thread at start). */
	struct loop_fd kick_h;
	struct vub_kick kick;
	struct loop_poll poll;
	struct loop_flush flush;
	struct loop_defer again;
	struct vub_notifier call, err;
	struct vub_req **free;
	unsigned nfree, inflight;
	struct log_errors io_errors; /* block-layer errors (util/log.h) */
	bool handlers_on, poll_on, stopping, starved, broken, again_queued, swapping;

	struct loop_msg start_msg, stop_msg, stopped_msg, fds_msg, fds_done_msg;
	/* vhost-user-scsi: the control queue's task management functions that
	 * wait for commands to finish, retried by tmf_timer (iothread); the
	 * event queue's message that events were posted (events_queued: the
	 * message is on its way, cleared by the iothread). */
	struct vscsi_req *tmf_wait;
	struct loop_timer tmf_timer;
	struct loop_msg events_msg;
	atomic_bool events_queued;
};

struct vub_export {
	char name[128];
	char *path;
	mode_t mode;
	struct loop *main_loop;
	struct unix_listener ul;
	struct loop_fd listen_h;
	bool listening, stopping;
	bool notifier; /* registered for the node's resizes */
	struct vblk_dev blk;
	struct vscsi_dev *scsi;           /* vhost-user-scsi (blk unused but bs, num_queues) */
	struct vub_lun_removal *removals; /* LUNs waiting for their last command */
	struct loop_timer removal_timer;
	struct vub_queue *queues;
	unsigned nqueues;
	struct vu_dev *conn;
	void (*stop_done)(void *opaque);
	void *stop_opaque;
	struct loop_defer done_defer;
};

/* A hot-removed LUN whose node is handed back once no command uses it. */
struct vub_lun_removal {
	struct vub_lun_removal *next;
	unsigned lun;
	void (*done)(struct blk_node *bs, void *opaque);
	void *opaque;
};

/* ---- vhost-user-blk.c ---- */

/* A request is done: on the used ring (flushed at the end of the round). */
void vub_req_done(struct vblk_req *vr);
/* The node's resize notifier (every LUN's node, for vhost-user-scsi). */
void vub_resized(struct blk_node *bs, void *opaque);
/* Process the avail ring with kicks suppressed, then look again. */
void vub_run(struct vub_queue *q);
/* The driver broke the virtqueue rules: stop this queue (device needs reset). */
void vub_broken(struct vub_queue *q, int err);
/* Run the queue's again hook next round (once). */
void vub_defer_again(struct vub_queue *q);

/* ---- vhost-user-blk-signal.c (the queue's iothread, except _init) ---- */

/* The call and error notifiers of a new queue, no fds yet (main thread). */
void vub_notifiers_init(struct vub_queue *q);
/* An fd arrived (start, hand-over): how it will be written. */
void vub_notifier_prepare(struct vub_notifier *n);
/* A running queue's notifier gets fd (a hand-over). */
void vub_notifier_swap(struct vub_notifier *n, int fd);
/* Signal the eventfd; never blocks the thread. */
void vub_signal(struct vub_notifier *n);
/* Call the driver. */
void vub_notify(struct vub_queue *q);
/* Send a signal that waited for a free SQE or for the last write. */
void vub_signal_retry(struct vub_notifier *n);
/* A write or its cancel is still in flight. */
bool vub_notifier_busy(const struct vub_notifier *n);
/* Cancel the writes (and the kick read) that hold up a stop or a hand-over. */
void vub_cancel_writes(struct vub_queue *q);
/* After a hand-over: tell the main thread once no write uses an old fd. */
void vub_maybe_fds_done(struct vub_queue *q);
/* Start taking kicks (through the ring or the fd handler). 0 or -errno. */
int vub_kick_start(struct vub_queue *q);
/* A stop: end the kick read in flight. */
void vub_kick_cancel(struct vub_queue *q);

/* ---- vhost-user-scsi.c (main thread unless said) ---- */

/* The virtio-scsi device of a new export, LUN 0 cfg->bs; e->nqueues grows
 * by the control and event queues. */
int vus_init(struct vub_export *e, const struct vub_export_config *cfg, char *err, size_t errlen);
void vus_free(struct vub_export *e);
void vus_queue_init(struct vub_queue *q);
void vus_get_config(struct vub_export *e, uint8_t *buf, uint32_t off, uint32_t len);
/* Events were posted: the event queue's thread hands them to the driver. */
void vus_kick_events(struct vub_export *e);
/* The control queue's thread: r waits for commands to finish. */
void vus_tmf_wait(struct vub_queue *q, struct vscsi_req *r);

#endif
