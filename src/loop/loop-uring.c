/* io_uring backend of the event loop: the ring is both the fd monitor (one-shot
 * POLL_ADD requests, re-armed after each event) and the I/O engine's ring, so
 * one io_uring_enter submits the round's I/O and waits for the next events.
 * Threading: owned by the loop's thread. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "loop/loop-int.h"
#include "util/log.h"

#define RING_ENTRIES 256
#define CQ_ENTRIES 4096

/* Also used by the epoll backend for the I/O ring (owner_waits false: that
 * ring is watched through its fd by epoll, which deferred completions would
 * not wake). */
int loop_ring_setup(struct loop *loop, unsigned entries, bool owner_waits);

/* The flags we would like, best first; each step drops what an older kernel
 * refuses. COOP_TASKRUN: a completion does not interrupt the thread (no IPI)
 * while it runs or polls; DEFER_TASKRUN: completions are processed in a batch
 * when the loop asks for events, on its own thread - the ring is only ever
 * entered by the loop's thread, which SINGLE_ISSUER holds the kernel to. */
static const unsigned ring_flag_steps[] = {
	IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG |
		IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
	IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_TASKRUN_FLAG,
	IORING_SETUP_SUBMIT_ALL,
	0,
};

int loop_ring_setup(struct loop *loop, unsigned entries, bool owner_waits)
{
	struct io_uring_params p;
	unsigned i = owner_waits ? 0 : 2;
	int ret;

	for (;; i++) {
		memset(&p, 0, sizeof(p));
		p.flags = IORING_SETUP_CQSIZE | ring_flag_steps[i];
		p.cq_entries = CQ_ENTRIES;
		ret = io_uring_queue_init_params(entries ? entries : RING_ENTRIES, &loop->ring, &p);
		if (ret != -EINVAL || i + 1 == sizeof(ring_flag_steps) / sizeof(ring_flag_steps[0]))
			break;
	}
	if (ret < 0)
		return ret;
	loop->have_ring = true;
	loop->ring_defer = (p.flags & IORING_SETUP_DEFER_TASKRUN) != 0;
	return 0;
}

int loop_uring_init(struct loop *loop)
{
	return loop_ring_setup(loop, 0, getenv("IOPLANE_RING_PLAIN") == NULL);
}

void loop_uring_fini(struct loop *loop)
{
	if (loop->have_ring)
		io_uring_queue_exit(&loop->ring);
	loop->have_ring = false;
}

static struct io_uring_sqe *internal_sqe(struct loop *loop)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&loop->ring);

	if (!sqe) {
		loop_ring_submit(loop);
		sqe = io_uring_get_sqe(&loop->ring);
	}
	return sqe;
}

int loop_uring_fd_arm(struct loop *loop, struct loop_fd *h)
{
	struct io_uring_sqe *sqe = internal_sqe(loop);

	if (!sqe)
		return -EBUSY;
	io_uring_prep_poll_add(sqe, h->fd, h->events);
	io_uring_sqe_set_data64(sqe, h->gen);
	return 0;
}

void loop_uring_fd_disarm(struct loop *loop, struct loop_fd *h, uint64_t old_tag)
{
	struct io_uring_sqe *sqe = internal_sqe(loop);

	(void)h;
	if (!sqe) {
		/* The stale tag is ignored when its poll fires; only the fd's
		 * poll request lingers until then. */
		return;
	}
	io_uring_prep_poll_remove(sqe, old_tag);
	io_uring_sqe_set_data64(sqe, TAG_IGNORE);
}

/* Completions a blocking wait asks for: one event, beyond those of the
 * inline operations it submits (loop_uring_inline_sqe), which are posted
 * before the kernel starts waiting. */
static unsigned wait_nr(struct loop *loop)
{
	unsigned n = loop->inline_sqes + 1;

	loop->inline_sqes = 0;
	return n;
}

void loop_uring_wait(struct loop *loop, int64_t timeout_ns)
{
	struct io_uring_cqe *cqe;
	struct __kernel_timespec ts;
	int ret;

	if (timeout_ns == 0) {
		if (io_uring_sq_ready(&loop->ring))
			loop_ring_submit(loop);
		loop_ring_get_events(loop);
	} else if (timeout_ns < 0) {
		loop->stats.submits++;
		ret = io_uring_submit_and_wait(&loop->ring, wait_nr(loop));
		if (ret < 0 && ret != -EINTR && ret != -ETIME)
			log_err("loop: io_uring_enter: %s", strerror(-ret));
	} else {
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		loop->stats.submits++;
		ret = io_uring_submit_and_wait_timeout(&loop->ring, &cqe, wait_nr(loop), &ts, NULL);
		if (ret < 0 && ret != -EINTR && ret != -ETIME)
			log_err("loop: io_uring_enter: %s", strerror(-ret));
	}
	loop_reap_cqes(loop);
}
