/* Per-thread event loop: fd handlers, poll handlers (adaptive polling), timers,
 * deferred completions and cross-thread messages.
 *
 * Threading: a struct loop is owned by the one thread that runs it. Every
 * function here must be called from that thread, except loop_send() and
 * loop_stop(), which any thread may call. */
#ifndef IOPLANE_LOOP_H
#define IOPLANE_LOOP_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

struct loop;
struct io_uring;
struct io_uring_sqe;

enum loop_backend {
	LOOP_BACKEND_AUTO = 0, /* io_uring when it works, else epoll */
	LOOP_BACKEND_URING,
	LOOP_BACKEND_EPOLL,
};

#define LOOP_POLL_MAX_NS_DEFAULT 32768

struct loop_opts {
	enum loop_backend backend; /* AUTO: honour $IOPLANE_LOOP_BACKEND=uring|epoll */
	int64_t poll_max_ns;       /* <0: default (32768 or $IOPLANE_POLL_MAX_NS); 0: off */
	unsigned uring_entries;    /* 0: default (256) */
	/* QEMU's iothread properties; 0: the default (x2, /2, the engine's). */
	unsigned poll_grow;     /* poll time multiplier when events came just too late */
	unsigned poll_shrink;   /* its divisor when polling was wasted on a long sleep */
	unsigned aio_max_batch; /* requests per submit call, for I/O engines */
};

/* Deferred work: runs at the end of the current dispatch round, on the same
 * thread, in FIFO order, with no system call. Items queued while the list is
 * being run go to the next round. */
struct loop_defer {
	struct loop_defer *next;
	void (*cb)(struct loop_defer *d);
};

/* Cross-thread message. Pushed onto the target's lock-free queue; runs on the
 * target thread. The sender must not touch it after loop_send(). */
struct loop_msg {
	struct loop_msg *next;
	void (*cb)(struct loop_msg *m);
};

/* Timer: a one-shot deadline on CLOCK_MONOTONIC. Re-arm from the callback for
 * periodic work. */
struct loop_timer {
	uint64_t deadline_ns;
	unsigned heap_idx; /* 0 = not armed */
	void (*cb)(struct loop_timer *t);
};

/* File descriptor handler. events: EPOLLIN/EPOLLOUT bits (same values as
 * POLLIN/POLLOUT). The callback gets the ready events (EPOLLERR/EPOLLHUP too). */
struct loop_fd {
	int fd;
	uint32_t events;
	void (*cb)(struct loop_fd *h, uint32_t revents);
	/* private to the loop */
	struct loop *loop;
	uint64_t gen;
	bool armed;
};

/* Poll handler: called repeatedly while the loop busy-polls before sleeping.
 * Returns true when it found and handled work.
 * sleep (optional): called once before the loop sleeps, whether it polled or
 * not. A source that can tell its producer to stop notifying while it is
 * polled (a virtqueue's NO_NOTIFY) turns notifications back on here, then
 * looks once more; it returns true (and handles the work) if work came in
 * meanwhile, and the loop then does not sleep. */
struct loop_poll {
	bool (*poll)(struct loop_poll *p);
	bool (*sleep)(struct loop_poll *p);
	/* Set by the owner (on the loop's thread) while it expects no work for
	 * longer than polling lasts: a loop whose poll handlers are all idle,
	 * with no I/O in flight on its ring, sleeps without busy-polling (the
	 * handlers are still called while it polls for other reasons). */
	bool idle;
	struct loop_poll *next; /* private */
	struct loop_poll **pprev;
};

/* Flush hook: called once at the end of a round in which it was requested
 * (loop_request_flush), before the loop polls or sleeps. I/O engines submit
 * the round's batch here (io_submit). */
struct loop_flush {
	struct loop_flush *next;
	void (*cb)(struct loop_flush *f);
	bool queued;
};

/* io_uring completion target: sqe->user_data points at one of these. */
struct loop_uring_op {
	void (*cb)(struct loop_uring_op *op, int res, uint32_t cqe_flags);
	/* Queued with loop_uring_peer_poll_sqe() and not completed yet (owned
	 * by the loop's thread; set and cleared by the loop). */
	bool polled;
};

struct loop_stats {
	uint64_t rounds;
	uint64_t submits;      /* io_uring_enter calls made by the loop (submit and/or wait) */
	uint64_t sleeps;       /* times the loop announced it may sleep */
	uint64_t wakeups_sent; /* eventfd writes made by senders to this loop */
	uint64_t msgs;         /* messages run */
	uint64_t poll_hits;    /* polling phases that found work */
	uint64_t poll_misses;
	uint64_t poll_ns;     /* current adaptive poll time */
	uint64_t poll_max_ns; /* its limit (0: polling off) */
};

int loop_new(const struct loop_opts *opts, struct loop **out);
void loop_free(struct loop *loop);

/* The calling thread's loop (NULL if none has been bound). */
struct loop *loop_current(void);
void loop_bind_current(struct loop *loop);

enum loop_backend loop_backend(const struct loop *loop);
const char *loop_backend_name(const struct loop *loop);

/* Run one dispatch round; block for events when `blocking`. A wait may end
 * with nothing to do (a signal, or the kernel's task-work notification when
 * an io_uring this thread used is torn down): wait for something in a loop,
 * never with one round. */
void loop_run_once(struct loop *loop, bool blocking);
/* Run until loop_stop() is called (any thread). */
void loop_run(struct loop *loop);
void loop_stop(struct loop *loop);
bool loop_stopping(const struct loop *loop);

void loop_defer(struct loop *loop, struct loop_defer *d);

/* Any thread. Wakes the target (eventfd) only when it may be sleeping and the
 * caller is not its thread. */
void loop_send(struct loop *target, struct loop_msg *m);

/* Any thread: something the loop waits for became ready at when_ns
 * (CLOCK_MONOTONIC). Adaptive polling then judges the loop's last sleep by
 * when its event arrived rather than by when the loop woke up, which on a
 * virtual machine can be tens of microseconds later. */
void loop_hint_event(struct loop *loop, uint64_t when_ns);

void loop_timer_arm(struct loop *loop, struct loop_timer *t, uint64_t deadline_ns);
void loop_timer_cancel(struct loop *loop, struct loop_timer *t);
static inline bool loop_timer_armed(const struct loop_timer *t)
{
	return t->heap_idx != 0;
}

int loop_fd_add(struct loop *loop, struct loop_fd *h);
int loop_fd_modify(struct loop *loop, struct loop_fd *h, uint32_t events);
void loop_fd_del(struct loop *loop, struct loop_fd *h);

void loop_poll_add(struct loop *loop, struct loop_poll *p);
void loop_poll_del(struct loop *loop, struct loop_poll *p);
void loop_set_poll_max_ns(struct loop *loop, int64_t ns);
/* The loop's own thread (or before it runs): as loop_opts.aio_max_batch. */
void loop_set_aio_max_batch(struct loop *loop, unsigned n);
/* The loop's aio-max-batch (0: none set); read on the loop's thread. */
unsigned loop_aio_max_batch(const struct loop *loop);

void loop_request_flush(struct loop *loop, struct loop_flush *f);
/* The loop's thread: will its next round find work without waiting?
 * Completions already posted in its ring (a burst larger than one round
 * takes, LOOP_REAP_BUDGET) or deferred work queued. A flush hook may leave
 * what it would batch for that round: it costs no sleep. */
bool loop_more_ready(struct loop *loop);

/* The loop's io_uring, used by I/O engines. With the uring backend it is also
 * the fd monitor, and its submission happens in the same io_uring_enter that
 * waits. With the epoll backend the loop owns a ring that is watched through
 * epoll. NULL when io_uring is unavailable. */
struct io_uring *loop_uring(struct loop *loop);
/* A free SQE (submitting queued ones first if the SQ is full); NULL only if
 * io_uring is unavailable. The loop submits queued SQEs at the end of the round. */
struct io_uring_sqe *loop_uring_sqe(struct loop *loop);
/* Submit the queued SQEs now instead of at the end of the round, without
 * waiting (an engine's batch limit). */
void loop_uring_submit(struct loop *loop);

/* True when the loop waits in its own io_uring, set up with DEFER_TASKRUN
 * (Linux 6.1 or later, and not IOPLANE_RING_PLAIN=1): then a socket receive
 * queued with loop_uring_peer_sqe() goes to the kernel in the io_uring_enter
 * that waits, its completion ends that wait with the bytes already
 * received, and the kernel has IORING_RECVSEND_POLL_FIRST. */
bool loop_uring_waits(const struct loop *loop);
/* An SQE for an operation that waits on a peer (a socket receive, a write
 * to an eventfd that a peer reads), completing to op: like a watched fd,
 * and unlike loop_uring_sqe(), it does not make the loop busy-poll (what a
 * peer does next takes, as a rule, longer than polling lasts). op->cb runs
 * for each of its CQEs. Its user_data is set; do not change it. NULL when
 * the submission queue cannot give one. */
struct io_uring_sqe *loop_uring_peer_sqe(struct loop *loop, struct loop_uring_op *op);
/* As loop_uring_peer_sqe(), for a one-shot operation (one CQE) on a peer
 * that, while it talks to us, answers at once (an NBD client's next request
 * after a reply): while it is queued the loop busy-polls before it sleeps,
 * as adaptive polling (poll-max-ns) decides, so a peer that answers within
 * the poll time is seen without a sleep and a wake-up; one that does not
 * (an idle client) brings the poll time down to nothing after a few sleeps.
 * Between looks the loop yields its CPU, and stops polling once a yield
 * shows that another task wants it. */
struct io_uring_sqe *loop_uring_peer_poll_sqe(struct loop *loop, struct loop_uring_op *op);
/* As loop_uring_peer_sqe(), for an operation that always completes while
 * the kernel takes it in (a socket send with MSG_DONTWAIT, which fails with
 * EAGAIN rather than wait for room): the io_uring_enter that submits it and
 * waits then waits for one completion more than these, so that the op and
 * the wait share one system call. Queue nothing here that may wait. After
 * preparing the SQE, call loop_uring_inline_link() on it: a NOP linked
 * behind it posts a second completion (-ECANCELED, not seen by op) when the
 * op fails or does less than asked (with MSG_WAITALL, a short send), which
 * ends that wait at once, so that the owner hears of it now. */
struct io_uring_sqe *loop_uring_inline_sqe(struct loop *loop, struct loop_uring_op *op);
void loop_uring_inline_link(struct loop *loop, struct io_uring_sqe *sqe);
/* Hold back the operation whose SQE is taken next (at once, with
 * loop_uring_peer_sqe()) until *ts (relative) has passed: a timeout linked
 * before it, whose own completion the loop drops. *ts is read when the
 * two are submitted (it need not live longer) and names the timeout for
 * loop_uring_cancel_delay(), which ends it early and so fails the op
 * behind it with -ECANCELED (a cancel of that op itself does not find it
 * while it waits). False when the submission queue cannot take both. */
struct __kernel_timespec;
bool loop_uring_delay_link(struct loop *loop, struct __kernel_timespec *ts);
int loop_uring_cancel_delay(struct loop *loop, const struct __kernel_timespec *ts);
/* Cancel an operation queued with loop_uring_peer_sqe(): it completes
 * (with -ECANCELED unless it finished meanwhile) after the loop's next
 * submission; so does the cancel itself, to done (NULL: no callback). */
int loop_uring_cancel_peer(struct loop *loop, struct loop_uring_op *op, struct loop_uring_op *done);

uint64_t loop_now_ns(void); /* CLOCK_MONOTONIC */

/* One pointer of per-loop state for the thread pool (thread-pool.c owns it;
 * loop_free() calls tp_loop_cleanup()). */
void *loop_tp_state(struct loop *loop);
void loop_set_tp_state(struct loop *loop, void *state);
void loop_get_stats(const struct loop *loop, struct loop_stats *out);

/* Number used to index per-thread state (0 .. LOOP_MAX_THREADS-1), stable
 * for the loop's life. */
#define LOOP_MAX_THREADS 128
unsigned loop_index(const struct loop *loop);

/* The signal mask for threads ioplane starts (iothreads, pool workers):
 * every signal blocked - they are the main thread's business - except the
 * synchronous ones, which a blocked mask would turn fatal whatever their
 * handler (the SIGBUS guard of util/mapguard.h must run on such threads). */
void loop_thread_sigmask(sigset_t *set);

#endif
