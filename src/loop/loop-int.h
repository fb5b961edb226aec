/* Private parts of the event loop shared by loop.c, loop-fd.c, loop-io.c and
 * its two fd-monitor backends (loop-uring.c, loop-epoll.c). Threading:
 * everything here is owned by the loop's thread except the fields marked
 * atomic. */
#ifndef IOPLANE_LOOP_INT_H
#define IOPLANE_LOOP_INT_H

#include <liburing.h>
#include <stdatomic.h>
#include <sys/epoll.h>

#include "loop/loop.h"

/* io_uring user_data / epoll data: a tagged value. Tag in the low 2 bits:
 * TAG_OP = pointer to struct loop_uring_op (8-byte aligned), TAG_FD = fd slot
 * (index << 32 | generation << 2), TAG_IGNORE = internal (poll removal),
 * TAG_PEER = pointer to a struct loop_uring_op that waits on a peer
 * (loop_uring_peer_sqe: not counted in ops_inflight). */
#define TAG_OP 0u
#define TAG_FD 1u
#define TAG_IGNORE 2u
#define TAG_PEER 3u
#define TAG_MASK 3u

struct fd_slot {
	struct loop_fd *h; /* NULL when free */
	uint32_t gen;      /* bumped on every del: stale completions are dropped */
};

struct loop {
	enum loop_backend backend;
	unsigned index;
	_Atomic bool stop;

	/* Adaptive polling. */
	int64_t poll_max_ns;
	uint64_t poll_ns;
	unsigned poll_grow, poll_shrink; /* 0: x2, /2 */
	unsigned aio_max_batch;          /* 0: the engines' default */
	struct loop_poll *polls;
	unsigned npolls;

	/* Deferred work: FIFO, run at the end of the round. */
	struct loop_defer *defer_head, **defer_tail;

	/* Flush hooks requested this round. */
	struct loop_flush *flush_head;

	/* Timers: binary min-heap, 1-based (heap[0] unused). */
	struct loop_timer **heap;
	unsigned heap_n, heap_cap;

	/* Registered fds. */
	struct fd_slot *slots;
	unsigned nslots, slots_cap;
	unsigned free_slot_hint;

	/* Cross-thread messages: lock-free stack (senders push with CAS, the loop
	 * takes all with exchange). notify_me is set only around a blocking wait;
	 * notified says an eventfd write is pending consumption. */
	_Atomic(struct loop_msg *) msg_head;
	atomic_int notify_me;
	atomic_bool notified;
	atomic_uint_fast64_t wakeups_sent;
	int efd;
	struct loop_fd efd_h;
	/* Latest event arrival time reported by loop_hint_event() (any thread);
	 * taken and cleared after each sleep. */
	atomic_uint_fast64_t event_hint_ns;

	/* io_uring: the fd monitor (uring backend) and the I/O engine's ring. */
	struct io_uring ring;
	bool have_ring;
	/* The ring was set up with DEFER_TASKRUN: completions are posted only
	 * when this thread enters the kernel to get events, and the kernel says
	 * there are some with IORING_SQ_TASKRUN. */
	bool ring_defer;
	unsigned ops_inflight; /* TAG_OP SQEs handed out and not yet completed */
	unsigned peers_polled; /* loop_uring_peer_poll_sqe() ops not yet completed */
	/* SQEs queued with loop_uring_inline_sqe() and not yet submitted: each
	 * posts its CQE within the submitting io_uring_enter. */
	unsigned inline_sqes;
	struct loop_fd ring_h; /* epoll backend: watches the ring fd */

	/* epoll backend */
	int epfd;

	struct loop_stats stats;
	void *tp_state;
	unsigned busy_rounds; /* consecutive non-blocking rounds (epoll fd checks) */
};

/* Completions dispatched per round at most (loop_reap_cqes). */
#define LOOP_REAP_BUDGET 16

/* Every io_uring_enter made by the loop goes through here (counted). */
static inline int loop_ring_submit(struct loop *loop)
{
	loop->stats.submits++;
	loop->inline_sqes = 0;
	return io_uring_submit(&loop->ring);
}

/* With a DEFER_TASKRUN ring, post the completions the kernel holds for us
 * (one system call, only when it says there are some). */
static inline void loop_ring_get_events(struct loop *loop)
{
	if (loop->ring_defer && (IO_URING_READ_ONCE(*loop->ring.sq.kflags) & IORING_SQ_TASKRUN)) {
		loop->stats.submits++;
		io_uring_get_events(&loop->ring);
	}
}

/* loop-fd.c and loop-io.c, for the backends and loop.c */
void loop_dispatch_fd(struct loop *loop, uint64_t tag, uint32_t revents);
bool loop_reap_cqes(struct loop *loop);
uint64_t loop_fd_tag(struct loop *loop, struct loop_fd *h);

/* Backends: wait for events for at most timeout_ns (-1: no limit, 0: don't
 * block), submitting queued SQEs first, and dispatch them. */
int loop_uring_init(struct loop *loop);
void loop_uring_fini(struct loop *loop);
int loop_uring_fd_arm(struct loop *loop, struct loop_fd *h);
void loop_uring_fd_disarm(struct loop *loop, struct loop_fd *h, uint64_t old_tag);
void loop_uring_wait(struct loop *loop, int64_t timeout_ns);

int loop_epoll_init(struct loop *loop);
void loop_epoll_fini(struct loop *loop);
int loop_epoll_fd_arm(struct loop *loop, struct loop_fd *h, bool modify);
void loop_epoll_fd_disarm(struct loop *loop, struct loop_fd *h);
void loop_epoll_wait(struct loop *loop, int64_t timeout_ns);

#endif
