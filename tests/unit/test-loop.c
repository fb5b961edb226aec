/* Unit tests of the event loop core: deferred work, fd handlers, poll handlers,
 * flush hooks, adaptive polling, io_uring ops and backend selection. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>
#include <liburing.h>

#include "loop/iothread.h"
#include "loop/loop-int.h"
#include "loop/loop.h"

static struct loop *new_loop(int64_t poll_max_ns)
{
	struct loop_opts o = {.backend = LOOP_BACKEND_AUTO, .poll_max_ns = poll_max_ns};
	struct loop *loop;

	assert_int_equal(loop_new(&o, &loop), 0);
	loop_bind_current(loop);
	return loop;
}

/* ---- deferred work ---- */

struct dtest {
	struct loop_defer d;
	struct loop *loop;
	int *order;
	int *n;
	int id;
	int requeue;
};

static void dtest_cb(struct loop_defer *d)
{
	struct dtest *t = (struct dtest *)d;

	t->order[(*t->n)++] = t->id;
	if (t->requeue) {
		t->requeue--;
		loop_defer(t->loop, &t->d);
	}
}

static void test_defer_fifo_and_next_round(void **state)
{
	struct loop *loop = new_loop(0);
	int order[16], n = 0;
	struct dtest t[3];
	int i;

	(void)state;
	for (i = 0; i < 3; i++) {
		t[i] = (struct dtest){
			.d.cb = dtest_cb, .loop = loop, .order = order, .n = &n, .id = i};
		loop_defer(loop, &t[i].d);
	}
	t[1].requeue = 1;
	/* Nothing runs until a round ends. */
	assert_int_equal(n, 0);
	/* Pending deferred work means the round must not block. */
	loop_run_once(loop, true);
	assert_int_equal(n, 3);
	assert_int_equal(order[0], 0);
	assert_int_equal(order[1], 1);
	assert_int_equal(order[2], 2);
	/* Work deferred from a deferred callback runs in the next round. */
	loop_run_once(loop, true);
	assert_int_equal(n, 4);
	assert_int_equal(order[3], 1);
	loop_free(loop);
}

/* ---- fd handlers ---- */

struct fdtest {
	struct loop_fd h;
	int calls;
	uint32_t last;
	bool drain;
};

static void fd_cb(struct loop_fd *h, uint32_t revents)
{
	struct fdtest *t = (struct fdtest *)h;
	char buf[64];

	t->calls++;
	t->last = revents;
	if (t->drain)
		while (read(h->fd, buf, sizeof(buf)) > 0)
			;
}

static void test_fd_readable_level_triggered(void **state)
{
	struct loop *loop = new_loop(0);
	struct fdtest t = {0};
	int p[2];

	(void)state;
	assert_int_equal(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
	t.h = (struct loop_fd){.fd = p[0], .events = EPOLLIN, .cb = fd_cb};
	assert_int_equal(loop_fd_add(loop, &t.h), 0);
	loop_run_once(loop, false);
	assert_int_equal(t.calls, 0);
	assert_int_equal(write(p[1], "x", 1), 1);
	loop_run_once(loop, true);
	assert_int_equal(t.calls, 1);
	assert_true(t.last & EPOLLIN);
	/* Not drained: level-triggered, so it fires again. */
	loop_run_once(loop, true);
	assert_int_equal(t.calls, 2);
	t.drain = true;
	loop_run_once(loop, true);
	assert_int_equal(t.calls, 3);
	loop_run_once(loop, false);
	loop_run_once(loop, false);
	assert_int_equal(t.calls, 3);
	/* After deletion nothing fires, even with data pending. */
	assert_int_equal(write(p[1], "y", 1), 1);
	loop_fd_del(loop, &t.h);
	loop_run_once(loop, false);
	loop_run_once(loop, false);
	assert_int_equal(t.calls, 3);
	close(p[0]);
	close(p[1]);
	loop_free(loop);
}

static void test_fd_modify_writable(void **state)
{
	struct loop *loop = new_loop(0);
	struct fdtest t = {0};
	int p[2];

	(void)state;
	assert_int_equal(pipe2(p, O_NONBLOCK | O_CLOEXEC), 0);
	t.h = (struct loop_fd){.fd = p[1], .events = EPOLLIN, .cb = fd_cb};
	assert_int_equal(loop_fd_add(loop, &t.h), 0);
	loop_run_once(loop, false);
	loop_run_once(loop, false);
	assert_int_equal(t.calls, 0);
	assert_int_equal(loop_fd_modify(loop, &t.h, EPOLLOUT), 0);
	loop_run_once(loop, true);
	assert_true(t.calls >= 1);
	assert_true(t.last & EPOLLOUT);
	loop_fd_del(loop, &t.h);
	close(p[0]);
	close(p[1]);
	loop_free(loop);
}

/* Many fds added and removed: slots are reused and stale events dropped. */
static void test_fd_many(void **state)
{
	struct loop *loop = new_loop(0);
	enum { N = 100 };
	static struct fdtest t[N];
	static int p[N][2];
	int i, total = 0;

	(void)state;
	for (i = 0; i < N; i++) {
		assert_int_equal(pipe2(p[i], O_NONBLOCK | O_CLOEXEC), 0);
		t[i] = (struct fdtest){.h = {.fd = p[i][0], .events = EPOLLIN, .cb = fd_cb},
				       .drain = true};
		assert_int_equal(loop_fd_add(loop, &t[i].h), 0);
	}
	for (i = 0; i < N; i += 2)
		loop_fd_del(loop, &t[i].h);
	for (i = 0; i < N; i++)
		assert_int_equal(write(p[i][1], "z", 1), 1);
	for (i = 0; i < 10; i++)
		loop_run_once(loop, false);
	for (i = 0; i < N; i++) {
		assert_int_equal(t[i].calls, i % 2 ? 1 : 0);
		total += t[i].calls;
	}
	assert_int_equal(total, N / 2);
	for (i = 0; i < N; i++) {
		if (i % 2)
			loop_fd_del(loop, &t[i].h);
		close(p[i][0]);
		close(p[i][1]);
	}
	loop_free(loop);
}

/* ---- flush hooks ---- */

struct ftest {
	struct loop_flush f;
	int calls;
};

static void flush_cb(struct loop_flush *f)
{
	((struct ftest *)f)->calls++;
}

struct fdefer {
	struct loop_defer d;
	struct loop *loop;
	struct ftest *ft;
};

static void defer_requests_flush(struct loop_defer *d)
{
	struct fdefer *x = (struct fdefer *)d;

	loop_request_flush(x->loop, &x->ft->f);
}

static void test_flush_once_per_round(void **state)
{
	struct loop *loop = new_loop(0);
	struct ftest ft = {.f.cb = flush_cb};
	struct fdefer x[3];
	int i;

	(void)state;
	for (i = 0; i < 3; i++) {
		x[i] = (struct fdefer){.d.cb = defer_requests_flush, .loop = loop, .ft = &ft};
		loop_defer(loop, &x[i].d);
	}
	loop_run_once(loop, false);
	/* Three requests in one round: one flush, after the deferred work. */
	assert_int_equal(ft.calls, 1);
	loop_run_once(loop, false);
	assert_int_equal(ft.calls, 1);
	loop_free(loop);
}

/* ---- poll handlers and adaptive polling ---- */

struct ptest {
	struct loop_poll p;
	int calls;
	int fire_after; /* returns true on this call number */
	bool fired;
};

static bool poll_cb(struct loop_poll *p)
{
	struct ptest *t = (struct ptest *)p;

	t->calls++;
	if (t->fire_after && t->calls == t->fire_after) {
		t->fired = true;
		return true;
	}
	return false;
}

struct tick {
	struct loop_timer t;
	int fired;
};

static void tick_cb(struct loop_timer *t)
{
	((struct tick *)t)->fired++;
}

static void on_alarm(int sig)
{
	(void)sig;
}

/* SIGALRM every 40 us, without SA_RESTART, so that waits end early with
 * EINTR; (false) back to what was there. */
static void interrupt_waits(bool on)
{
	static struct sigaction old;
	struct sigaction sa = {.sa_handler = on_alarm};
	struct itimerval it = {{0, 40}, {0, 40}};

	if (on) {
		assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
	} else {
		memset(&it, 0, sizeof(it));
	}
	assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
	if (!on)
		assert_int_equal(sigaction(SIGALRM, &old, NULL), 0);
}

/* With polling off the poll handler is never called, and timers fire.
 * Waits here are interrupted on purpose: a signal, or the task-work
 * notification the kernel sends a thread when an io_uring it used is torn
 * down (the previous test's loop's, late on a busy machine), ends a wait
 * early, and the round then has nothing to do; so the test runs rounds until
 * each timer fired, not one round per timer. */
static void test_poll_off_never_polls(void **state)
{
	struct loop *loop = new_loop(0);
	struct ptest pt = {.p.poll = poll_cb};
	struct tick tk = {.t.cb = tick_cb};
	int i, rounds;

	(void)state;
	loop_poll_add(loop, &pt.p);
	interrupt_waits(true);
	for (i = 0; i < 5; i++) {
		loop_timer_arm(loop, &tk.t, loop_now_ns() + 100000);
		for (rounds = 0; loop_timer_armed(&tk.t) && rounds < 100000; rounds++)
			loop_run_once(loop, true);
	}
	interrupt_waits(false);
	assert_int_equal(tk.fired, 5);
	assert_int_equal(pt.calls, 0);
	loop_poll_del(loop, &pt.p);
	loop_free(loop);
}

/* Events arriving a little after each sleep starts make the poll time grow;
 * long sleeps make it shrink back. */
static void test_poll_adapts(void **state)
{
	struct loop *loop = new_loop(1000000);
	struct ptest pt = {.p.poll = poll_cb};
	struct tick tk = {.t.cb = tick_cb};
	struct loop_stats st;
	uint64_t grown;
	int i;

	(void)state;
	loop_poll_add(loop, &pt.p);
	for (i = 0; i < 6; i++) {
		loop_timer_arm(loop, &tk.t, loop_now_ns() + 200000); /* 200 us < max 1 ms */
		while (loop_timer_armed(&tk.t))
			loop_run_once(loop, true);
	}
	loop_get_stats(loop, &st);
	grown = st.poll_ns;
	assert_true(grown > 0);
	assert_true(pt.calls > 0); /* it did poll */
	for (i = 0; i < 8; i++) {
		loop_timer_arm(loop, &tk.t, loop_now_ns() + 20000000); /* 20 ms > max */
		while (loop_timer_armed(&tk.t))
			loop_run_once(loop, true);
	}
	loop_get_stats(loop, &st);
	assert_true(st.poll_ns < grown);
	loop_poll_del(loop, &pt.p);
	loop_free(loop);
}

/* Run rounds until a timer armed `ns` from now has fired, n times. */
static void sleep_events(struct loop *loop, int n, uint64_t ns)
{
	struct tick tk = {.t.cb = tick_cb};

	for (int i = 0; i < n; i++) {
		loop_timer_arm(loop, &tk.t, loop_now_ns() + ns);
		while (loop_timer_armed(&tk.t))
			loop_run_once(loop, true);
	}
}

/* poll-grow=8, poll-shrink=4 (QEMU's iothread properties): three events just
 * after polling stopped take the poll time 0 -> 4 us -> 32 us -> 256 us
 * (x2 would be 16 us); one sleep far past the maximum divides it by 4. A
 * late event only lengthens the sleep, which still grows it (up to 2x max). */
static void test_poll_grow_shrink(void **state)
{
	struct loop_opts o = {.poll_max_ns = 10000000, .poll_grow = 8, .poll_shrink = 4};
	struct ptest pt = {.p.poll = poll_cb};
	struct loop_stats st;
	struct loop *loop;
	uint64_t grown;

	(void)state;
	assert_int_equal(loop_new(&o, &loop), 0);
	loop_poll_add(loop, &pt.p);
	sleep_events(loop, 3, 200000); /* 200 us: each sleep outlasts the poll time */
	loop_get_stats(loop, &st);
	grown = st.poll_ns;
	if (grown < 256000)
		fail_msg("poll_ns %llu", (unsigned long long)grown);
	/* One sleep of 30 ms (> 2 x max; two such sleeps do not fit in one event)
	 * divides it by 4; a wake-up from elsewhere mid-sleep (the kernel's
	 * task work for a torn-down ring) may disturb one attempt, not five. */
	for (int i = 0; i < 5 && grown; i++) {
		sleep_events(loop, 1, 30000000);
		loop_get_stats(loop, &st);
		if (st.poll_ns == grown / 4)
			break;
		grown = st.poll_ns;
	}
	assert_int_equal(st.poll_ns, grown / 4);
	loop_poll_del(loop, &pt.p);
	loop_free(loop);
}

/* aio-max-batch of the loop: kept for the I/O engines to read. */
static void test_aio_max_batch(void **state)
{
	struct loop_opts o = {.poll_max_ns = -1, .aio_max_batch = 3};
	struct loop *loop;

	(void)state;
	assert_int_equal(loop_new(&o, &loop), 0);
	assert_int_equal(loop_aio_max_batch(loop), 3);
	loop_set_aio_max_batch(loop, 0);
	assert_int_equal(loop_aio_max_batch(loop), 0);
	loop_free(loop);
}

/* A loop whose only poll handler is idle sleeps without polling, however
 * short its sleeps; once the handler expects work again it is polled. */
static void test_poll_idle_handler(void **state)
{
	struct loop *loop = new_loop(1000000);
	struct ptest pt = {.p.poll = poll_cb};
	struct tick tk = {.t.cb = tick_cb};
	struct loop_stats st;
	int i, rounds;

	(void)state;
	loop_poll_add(loop, &pt.p);
	for (pt.p.idle = true;; pt.p.idle = false) {
		for (i = 0; i < 6; i++) {
			loop_timer_arm(loop, &tk.t, loop_now_ns() + 200000); /* < max 1 ms */
			for (rounds = 0; loop_timer_armed(&tk.t) && rounds < 100000; rounds++)
				loop_run_once(loop, true);
		}
		loop_get_stats(loop, &st);
		if (!pt.p.idle)
			break;
		assert_int_equal(pt.calls, 0);
		assert_int_equal(st.poll_hits + st.poll_misses, 0);
	}
	assert_true(pt.calls > 0);
	assert_true(st.poll_misses > 0);
	loop_poll_del(loop, &pt.p);
	loop_free(loop);
}

/* A poll handler finding work ends the wait without sleeping. */
static void test_poll_handler_wakes(void **state)
{
	struct loop *loop = new_loop(1000000000);
	struct ptest pt = {.p.poll = poll_cb};
	struct tick tk = {.t.cb = tick_cb};
	struct loop_stats st;
	int i;

	(void)state;
	loop_poll_add(loop, &pt.p);
	/* Grow the poll time first with short timer waits. */
	for (i = 0; i < 12; i++) {
		loop_timer_arm(loop, &tk.t, loop_now_ns() + 100000);
		while (loop_timer_armed(&tk.t))
			loop_run_once(loop, true);
	}
	pt.calls = 0;
	pt.fire_after = 50;
	loop_timer_arm(loop, &tk.t, loop_now_ns() + 60ull * 1000000000); /* far away */
	loop_get_stats(loop, &st);
	assert_true(st.poll_ns > 0);
	loop_run_once(loop, true);
	assert_true(pt.fired);
	assert_int_equal(tk.fired, 12);
	loop_timer_cancel(loop, &tk.t);
	loop_poll_del(loop, &pt.p);
	loop_free(loop);
}

/* No options means the defaults, and the default is to poll: a daemon's
 * iothreads started without options must not lose polling. */
static void read_stats(void *arg)
{
	loop_get_stats(loop_current(), arg);
}

static void test_default_opts_poll(void **state)
{
	struct loop_stats st;
	struct iothread *t;
	struct loop *loop;

	(void)state;
	unsetenv("IOPLANE_POLL_MAX_NS");
	assert_int_equal(loop_new(NULL, &loop), 0);
	loop_get_stats(loop, &st);
	assert_int_equal(st.poll_max_ns, LOOP_POLL_MAX_NS_DEFAULT);
	loop_free(loop);
	assert_int_equal(iothread_start("dflt", NULL, &t), 0);
	memset(&st, 0, sizeof(st));
	iothread_run_sync(t, read_stats, &st);
	assert_int_equal(st.poll_max_ns, LOOP_POLL_MAX_NS_DEFAULT);
	iothread_join(t);
}

/* The sleep hook runs once before each sleep, polling or not; work it finds
 * ends the wait with no sleep. */
struct stest {
	struct loop_poll p;
	int polls, sleeps;
	int find_on_sleep; /* the sleep hook reports work this many times */
};

static bool stest_poll(struct loop_poll *p)
{
	((struct stest *)p)->polls++;
	return false;
}

static bool stest_sleep(struct loop_poll *p)
{
	struct stest *t = (struct stest *)p;

	t->sleeps++;
	if (t->find_on_sleep) {
		t->find_on_sleep--;
		return true;
	}
	return false;
}

static void test_poll_sleep_hook(void **state)
{
	struct stest t = {.p.poll = stest_poll, .p.sleep = stest_sleep};
	struct tick tk = {.t.cb = tick_cb};
	struct loop_stats a, b;
	int64_t max;

	(void)state;
	for (max = 0; max <= 32768; max += 32768) {
		struct loop *loop = new_loop(max);

		memset(&t, 0, sizeof(t));
		t.p.poll = stest_poll;
		t.p.sleep = stest_sleep;
		tk.fired = 0;
		loop_poll_add(loop, &t.p);
		/* Three rounds in which the hook finds work: no sleep in them. */
		t.find_on_sleep = 3;
		loop_timer_arm(loop, &tk.t, loop_now_ns() + 60ull * 1000000000);
		loop_get_stats(loop, &a);
		loop_run_once(loop, true);
		loop_run_once(loop, true);
		loop_run_once(loop, true);
		loop_get_stats(loop, &b);
		assert_int_equal(t.sleeps, 3);
		assert_int_equal(b.sleeps, a.sleeps);
		assert_int_equal(tk.fired, 0);
		/* Then it finds nothing: the loop sleeps until the timer. */
		loop_timer_cancel(loop, &tk.t);
		loop_timer_arm(loop, &tk.t, loop_now_ns() + 1000000);
		while (loop_timer_armed(&tk.t))
			loop_run_once(loop, true);
		loop_get_stats(loop, &b);
		assert_int_equal(tk.fired, 1);
		assert_true(t.sleeps >= 4);
		assert_true(b.sleeps > a.sleeps);
		if (max == 0)
			assert_int_equal(t.polls, 0);
		loop_poll_del(loop, &t.p);
		loop_free(loop);
	}
}

/* ---- io_uring ops through the loop's ring ---- */

struct uop {
	struct loop_uring_op op;
	int res;
	int done;
};

static void uop_cb(struct loop_uring_op *op, int res, uint32_t flags)
{
	struct uop *u = (struct uop *)op;

	(void)flags;
	u->res = res;
	u->done++;
}

static void test_uring_ops_batched(void **state)
{
	struct loop *loop = new_loop(0);
	enum { N = 32 };
	struct uop u[N];
	char buf[N][16];
	int p[2], i, done = 0, spins = 0;

	(void)state;
	if (!loop_uring(loop)) {
		loop_free(loop);
		skip();
	}
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	assert_int_equal(write(p[1], "0123456789abcdef0123456789abcdef", 32), 32);
	for (i = 0; i < N; i++) {
		struct io_uring_sqe *sqe = loop_uring_sqe(loop);

		assert_non_null(sqe);
		u[i] = (struct uop){.op.cb = uop_cb};
		io_uring_prep_read(sqe, p[0], buf[i], 1, 0);
		io_uring_sqe_set_data(sqe, &u[i].op);
	}
	/* Queued, not yet submitted: nothing completes before a round. */
	for (i = 0; i < N; i++)
		assert_int_equal(u[i].done, 0);
	while (done < N && spins++ < 1000) {
		loop_run_once(loop, true);
		for (done = 0, i = 0; i < N; i++)
			done += u[i].done;
	}
	assert_int_equal(done, N);
	for (i = 0; i < N; i++)
		assert_int_equal(u[i].res, 1);
	close(p[0]);
	close(p[1]);
	loop_free(loop);
}

/* Run rounds until u has completed (bounded). */
static void run_until_done(struct loop *loop, struct uop *u)
{
	for (int spins = 0; !u->done && spins < 1000; spins++)
		loop_run_once(loop, true);
	assert_int_equal(u->done, 1);
}

/* A loop with an io_uring (the test is skipped without) and a pipe. */
static struct loop *ring_loop_pipe(int64_t poll_max_ns, int p[2])
{
	struct loop *loop = new_loop(poll_max_ns);

	if (!loop_uring(loop)) {
		loop_free(loop);
		skip();
	}
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	return loop;
}

/* A peer operation queued with loop_uring_peer_poll_sqe() lets the loop
 * poll while it is pending (events just after each sleep grow the poll
 * time), and stops counting once it completes; one queued with
 * loop_uring_peer_sqe() does not. */
static void test_peer_poll(void **state)
{
	struct loop_stats st;
	struct uop u = {.op.cb = uop_cb};
	struct io_uring_sqe *sqe;
	char buf[4];
	int p[2];
	struct loop *loop = ring_loop_pipe(1000000, p);

	(void)state;
	sqe = loop_uring_peer_sqe(loop, &u.op);
	assert_non_null(sqe);
	io_uring_prep_read(sqe, p[0], buf, 1, 0);
	sleep_events(loop, 6, 200000);
	loop_get_stats(loop, &st);
	assert_int_equal(st.poll_ns, 0);
	assert_int_equal(write(p[1], "a", 1), 1);
	run_until_done(loop, &u);

	u = (struct uop){.op.cb = uop_cb};
	sqe = loop_uring_peer_poll_sqe(loop, &u.op);
	assert_non_null(sqe);
	io_uring_prep_read(sqe, p[0], buf, 1, 0);
	assert_int_equal(loop->peers_polled, 1);
	sleep_events(loop, 6, 200000); /* 200 us < max 1 ms */
	loop_get_stats(loop, &st);
	assert_true(st.poll_ns > 0);
	assert_true(st.poll_hits + st.poll_misses > 0);
	assert_int_equal(write(p[1], "b", 1), 1);
	run_until_done(loop, &u);
	assert_int_equal(u.res, 1);
	assert_int_equal(loop->peers_polled, 0);
	assert_false(u.op.polled);
	close(p[0]);
	close(p[1]);
	loop_free(loop);
}

/* A receive behind loop_uring_delay_link() starts only once the delay has
 * passed, though its bytes are there; loop_uring_cancel_delay() fails a receive still waiting with
 * -ECANCELED, where a cancel of the receive itself does not find it. */
static void queue_delayed_read(struct loop *loop, struct __kernel_timespec *ts, struct uop *u,
			       int fd, char *buf)
{
	struct io_uring_sqe *sqe;

	*u = (struct uop){.op.cb = uop_cb};
	assert_true(loop_uring_delay_link(loop, ts));
	sqe = loop_uring_peer_sqe(loop, &u->op);
	assert_non_null(sqe);
	io_uring_prep_read(sqe, fd, buf, 1, 0);
}

static void test_delay_link(void **state)
{
	struct __kernel_timespec ts = {.tv_nsec = 20 * 1000000};
	struct uop u, c = {.op.cb = uop_cb};
	uint64_t t0;
	char buf[4];
	int p[2];
	struct loop *loop = ring_loop_pipe(0, p);

	(void)state;
	assert_int_equal(write(p[1], "ab", 2), 2);
	t0 = loop_now_ns();
	queue_delayed_read(loop, &ts, &u, p[0], buf);
	run_until_done(loop, &u);
	assert_int_equal(u.res, 1);
	assert_true(loop_now_ns() - t0 >= 20 * 1000000);

	ts.tv_sec = 60; /* far beyond the test: only the cancel ends it */
	queue_delayed_read(loop, &ts, &u, p[0], buf);
	loop_run_once(loop, false);
	assert_int_equal(u.done, 0);
	assert_int_equal(loop_uring_cancel_peer(loop, &u.op, &c.op), 0);
	run_until_done(loop, &c);
	assert_int_equal(u.done, 0);
	assert_int_equal(loop_uring_cancel_delay(loop, &ts), 0);
	run_until_done(loop, &u);
	assert_int_equal(u.res, -ECANCELED);
	close(p[0]);
	close(p[1]);
	loop_free(loop);
}

/* A burst of completions is dispatched LOOP_REAP_BUDGET at a time, one
 * batch per round, and the rounds after the first do not sleep on the rest
 * (a far-away timer would hold a sleeping loop for a minute). */
static void test_reap_budget(void **state)
{
	struct loop *loop = new_loop(0);
	struct tick tk = {.t.cb = tick_cb};
	enum { N = 40 };
	struct uop u[N];
	uint64_t t0;
	int i, done, rounds = 0;

	(void)state;
	if (!loop_uring(loop)) {
		loop_free(loop);
		skip();
	}
	for (i = 0; i < N; i++) {
		struct io_uring_sqe *sqe = loop_uring_sqe(loop);

		assert_non_null(sqe);
		u[i] = (struct uop){.op.cb = uop_cb};
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data(sqe, &u[i].op);
	}
	loop_timer_arm(loop, &tk.t, loop_now_ns() + 60ull * 1000000000);
	t0 = loop_now_ns();
	do {
		loop_run_once(loop, true);
		rounds++;
		for (done = 0, i = 0; i < N; i++)
			done += u[i].done;
		assert_true(done <= rounds * LOOP_REAP_BUDGET);
	} while (done < N && rounds < 100);
	assert_int_equal(done, N);
	assert_true(rounds >= (N + LOOP_REAP_BUDGET - 1) / LOOP_REAP_BUDGET);
	assert_true(loop_now_ns() - t0 < 30ull * 1000000000);
	loop_timer_cancel(loop, &tk.t);
	loop_free(loop);
}

/* A completion callback that waits for more I/O by running the loop (the
 * synchronous work a QMP handler does: a resize, a reopen) reaps the
 * completions behind its own; the outer round must not dispatch them again. */
struct nested_op {
	struct uop u;
	struct loop *loop;
	struct uop *inner;
};

static void nested_cb(struct loop_uring_op *op, int res, uint32_t flags)
{
	struct nested_op *n = (struct nested_op *)op;
	struct io_uring_sqe *sqe;
	int spins = 0;

	uop_cb(op, res, flags);
	if (n->u.done != 1)
		return;
	sqe = loop_uring_sqe(n->loop);
	assert_non_null(sqe);
	io_uring_prep_nop(sqe);
	io_uring_sqe_set_data(sqe, &n->inner->op);
	while (!n->inner->done && spins++ < 1000)
		loop_run_once(n->loop, true);
}

static void test_reap_nested(void **state)
{
	struct loop *loop = new_loop(0);
	enum { N = 4 };
	struct uop u[N], inner = {.op.cb = uop_cb};
	struct nested_op first = {.u.op.cb = nested_cb, .loop = loop, .inner = &inner};
	int i, rounds = 0;

	(void)state;
	if (!loop_uring(loop)) {
		loop_free(loop);
		skip();
	}
	for (i = -1; i < N; i++) {
		struct io_uring_sqe *sqe = loop_uring_sqe(loop);

		assert_non_null(sqe);
		io_uring_prep_nop(sqe);
		if (i < 0) {
			io_uring_sqe_set_data(sqe, &first.u.op);
			continue;
		}
		u[i] = (struct uop){.op.cb = uop_cb};
		io_uring_sqe_set_data(sqe, &u[i].op);
	}
	while ((!first.u.done || !inner.done || !u[N - 1].done) && rounds++ < 100)
		loop_run_once(loop, true);
	for (i = 0; i < 3; i++) /* rounds that find nothing more to dispatch */
		loop_run_once(loop, false);
	assert_int_equal(first.u.done, 1);
	assert_int_equal(inner.done, 1);
	for (i = 0; i < N; i++)
		assert_int_equal(u[i].done, 1);
	loop_free(loop);
}

/* What a completion's callback learns from loop_more_ready(): true while
 * the burst has completions the round's budget left in the ring, false at
 * the last of them; deferred work counts too. */
struct more_op {
	struct loop_uring_op op;
	struct loop *loop;
	int *done;
	bool more;
};

static void more_cb(struct loop_uring_op *op, int res, uint32_t flags)
{
	struct more_op *m = (struct more_op *)op;

	(void)res;
	(void)flags;
	m->more = loop_more_ready(m->loop);
	(*m->done)++;
}

static void nop_defer_cb(struct loop_defer *d)
{
	(void)d;
}

static void test_more_ready(void **state)
{
	struct loop *loop = new_loop(0);
	enum { N = LOOP_REAP_BUDGET + 4 };
	struct more_op m[N];
	struct loop_defer d = {.cb = nop_defer_cb};
	int i, done = 0, rounds = 0;

	(void)state;
	if (!loop_uring(loop)) {
		loop_free(loop);
		skip();
	}
	assert_false(loop_more_ready(loop));
	for (i = 0; i < N; i++) {
		struct io_uring_sqe *sqe = loop_uring_sqe(loop);

		assert_non_null(sqe);
		m[i] = (struct more_op){.op.cb = more_cb, .loop = loop, .done = &done};
		io_uring_prep_nop(sqe);
		io_uring_sqe_set_data(sqe, &m[i].op);
	}
	while (done < N && rounds++ < 100)
		loop_run_once(loop, true);
	assert_int_equal(done, N);
	/* The budget's last callback saw the four left in the ring... */
	assert_true(m[LOOP_REAP_BUDGET - 1].more);
	/* ...and the burst's last saw none. */
	assert_false(m[N - 1].more);
	assert_false(loop_more_ready(loop));
	loop_defer(loop, &d);
	assert_true(loop_more_ready(loop));
	loop_run_once(loop, false);
	assert_false(loop_more_ready(loop));
	loop_free(loop);
}

static void test_backend_env(void **state)
{
	const char *env = getenv("IOPLANE_LOOP_BACKEND");
	struct loop *loop = new_loop(0);

	(void)state;
	if (env && !strcmp(env, "epoll"))
		assert_int_equal(loop_backend(loop), LOOP_BACKEND_EPOLL);
	if (env && !strcmp(env, "uring"))
		assert_int_equal(loop_backend(loop), LOOP_BACKEND_URING);
	assert_non_null(loop_backend_name(loop));
	loop_free(loop);
}

static void test_forced_backends(void **state)
{
	struct loop_opts o = {.backend = LOOP_BACKEND_EPOLL};
	struct loop *loop;

	(void)state;
	assert_int_equal(loop_new(&o, &loop), 0);
	assert_int_equal(loop_backend(loop), LOOP_BACKEND_EPOLL);
	loop_free(loop);
	o.backend = LOOP_BACKEND_URING;
	if (loop_new(&o, &loop) == 0) {
		assert_int_equal(loop_backend(loop), LOOP_BACKEND_URING);
		loop_free(loop);
	}
}

/* Loops made and freed while others live (iothreads added and deleted at
 * runtime) never share an index with a live loop. */
static void test_index_reused_never_shared(void **state)
{
	struct loop *held[3], *l;
	unsigned i, j;

	(void)state;
	for (i = 0; i < 3; i++)
		assert_int_equal(loop_new(NULL, &held[i]), 0);
	for (i = 0; i < 3 * LOOP_MAX_THREADS; i++) {
		assert_int_equal(loop_new(NULL, &l), 0);
		for (j = 0; j < 3; j++)
			assert_int_not_equal(loop_index(l), loop_index(held[j]));
		loop_free(l);
	}
	for (i = 0; i < 3; i++)
		loop_free(held[i]);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defer_fifo_and_next_round),
		cmocka_unit_test(test_fd_readable_level_triggered),
		cmocka_unit_test(test_fd_modify_writable),
		cmocka_unit_test(test_fd_many),
		cmocka_unit_test(test_flush_once_per_round),
		cmocka_unit_test(test_poll_off_never_polls),
		cmocka_unit_test(test_poll_adapts),
		cmocka_unit_test(test_poll_grow_shrink),
		cmocka_unit_test(test_aio_max_batch),
		cmocka_unit_test(test_poll_idle_handler),
		cmocka_unit_test(test_poll_handler_wakes),
		cmocka_unit_test(test_default_opts_poll),
		cmocka_unit_test(test_poll_sleep_hook),
		cmocka_unit_test(test_uring_ops_batched),
		cmocka_unit_test(test_reap_budget),
		cmocka_unit_test(test_peer_poll),
		cmocka_unit_test(test_delay_link),
		cmocka_unit_test(test_reap_nested),
		cmocka_unit_test(test_more_ready),
		cmocka_unit_test(test_backend_env),
		cmocka_unit_test(test_forced_backends),
		cmocka_unit_test(test_index_reused_never_shared),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
