/* Unit tests for the thread pool (and iothreads, which it is tested with).
 * Threading: the test body runs on the main thread with its own loop; some
 * tests add iothreads. The pool is bounded to TEST_MAX_WORKERS for the whole
 * program, before the first submission. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "loop/iothread.h"
#include "loop/loop.h"
#include "loop/thread-pool.h"
#include "util/compiler.h"

#define TEST_MAX_WORKERS 4
#define TEST_TIMEOUT_NS	 (20ull * 1000 * 1000 * 1000)

static void sleep_us(unsigned us)
{
	struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000l};

	nanosleep(&ts, NULL);
}

static struct loop *new_loop(int64_t poll_max_ns)
{
	struct loop_opts opts = {.backend = LOOP_BACKEND_AUTO, .poll_max_ns = poll_max_ns};
	struct loop *loop = NULL;

	assert_int_equal(loop_new(&opts, &loop), 0);
	loop_bind_current(loop);
	return loop;
}

/* Run `loop` until *count reaches want or a generous deadline passes (a
 * timer ends the blocking wait, so a lost completion fails, not hangs). */
struct deadline {
	struct loop_timer t;
	bool fired;
};

static void deadline_cb(struct loop_timer *t)
{
	container_of(t, struct deadline, t)->fired = true;
}

static void run_until(struct loop *loop, const unsigned *count, unsigned want)
{
	struct deadline d = {.t.cb = deadline_cb};

	loop_timer_arm(loop, &d.t, loop_now_ns() + TEST_TIMEOUT_NS);
	while (*count < want && !d.fired)
		loop_run_once(loop, true);
	loop_timer_cancel(loop, &d.t);
	assert_int_equal(*count, want);
}

/* Wait (without a loop) for an atomic counter set by workers. */
static void wait_atomic(atomic_uint *v, unsigned want)
{
	uint64_t end = loop_now_ns() + TEST_TIMEOUT_NS;

	while (atomic_load(v) != want && loop_now_ns() < end)
		sleep_us(100);
	assert_int_equal(atomic_load(v), want);
}

/* ---- many jobs, exactly-once done ------------------------------------------- */

struct per_thread;

struct job {
	struct tp_work w;
	struct loop *loop;
	unsigned idx;
	unsigned result; /* written by fn */
	unsigned ndone;	 /* written by done */
	int ret;
	pthread_t worker;
	struct per_thread *pt; /* test_two_iothreads only */
};

static struct {
	struct loop *loop;
	pthread_t main_tid;
	unsigned done;
	unsigned bad_thread; /* done() not on the submitting loop's thread */
	bool in_submit;
	unsigned done_in_submit;
} g;

static int job_fn(struct tp_work *w)
{
	struct job *j = container_of(w, struct job, w);

	j->result = j->idx * 3 + 1;
	j->worker = pthread_self();
	return j->idx % 7 == 0 ? -EIO : 0;
}

static void job_done(struct tp_work *w, int ret)
{
	struct job *j = container_of(w, struct job, w);

	j->ndone++;
	j->ret = ret;
	g.done++;
	g.bad_thread += loop_current() != j->loop;
	g.done_in_submit += g.in_submit;
}

static void submit(struct loop *loop, struct tp_work *w)
{
	g.in_submit = true;
	tp_submit(loop, w);
	g.in_submit = false;
}

static void check_jobs(struct job *jobs, unsigned n)
{
	unsigned i;

	for (i = 0; i < n; i++) {
		assert_int_equal(jobs[i].ndone, 1);
		assert_int_equal(jobs[i].result, i * 3 + 1);
		assert_int_equal(jobs[i].ret, i % 7 == 0 ? -EIO : 0);
		assert_false(pthread_equal(jobs[i].worker, g.main_tid));
	}
}

static void test_many_jobs(void **state)
{
	enum { N = 3000 };
	struct job *jobs = calloc(N, sizeof(*jobs));
	struct tp_stats before, after;
	unsigned i;

	(void)state;
	assert_non_null(jobs);
	g.done = 0;
	tp_get_stats(&before);
	for (i = 0; i < N; i++) {
		jobs[i] = (struct job){
			.w = {.fn = job_fn, .done = job_done}, .loop = g.loop, .idx = i};
		submit(g.loop, &jobs[i].w);
	}
	run_until(g.loop, &g.done, N);
	check_jobs(jobs, N);
	assert_int_equal(g.bad_thread, 0);
	assert_int_equal(g.done_in_submit, 0);
	tp_get_stats(&after);
	assert_int_equal(after.submitted - before.submitted, N);
	assert_int_equal(after.completed - before.completed, N);
	assert_true(after.workers <= TEST_MAX_WORKERS);
	free(jobs);
}

/* ---- done never runs inside tp_submit, even when submitting from done ------- */

struct chain {
	struct tp_work w;
	unsigned left;
	unsigned ndone;
	uint64_t busy_ns; /* each job holds its worker this long */
};

static int chain_fn(struct tp_work *w)
{
	struct chain *c = container_of(w, struct chain, w);
	uint64_t end = loop_now_ns() + c->busy_ns;

	while (c->busy_ns && loop_now_ns() < end)
		;
	return 0;
}

static void chain_done(struct tp_work *w, int ret)
{
	struct chain *c = container_of(w, struct chain, w);

	assert_int_equal(ret, 0);
	g.done_in_submit += g.in_submit;
	c->ndone++;
	if (--c->left)
		submit(g.loop, &c->w); /* resubmit the same work from its done() */
}

static void run_chain_busy(struct loop *loop, unsigned n, uint64_t busy_ns)
{
	struct chain c = {.w = {.fn = chain_fn, .done = chain_done}, .left = n,
			  .busy_ns = busy_ns};

	g.done_in_submit = 0;
	submit(loop, &c.w);
	run_until(loop, &c.ndone, n);
	assert_int_equal(g.done_in_submit, 0);
}

static void run_chain(struct loop *loop, unsigned n)
{
	run_chain_busy(loop, n, 0);
}

static void test_done_not_in_submit(void **state)
{
	struct job jobs[64];
	unsigned i;

	(void)state;
	/* Jobs that finish at once: a synchronous completion would show here. */
	g.done = 0;
	g.done_in_submit = 0;
	for (i = 0; i < 64; i++) {
		jobs[i] = (struct job){
			.w = {.fn = job_fn, .done = job_done}, .loop = g.loop, .idx = i};
		submit(g.loop, &jobs[i].w);
		sleep_us(50); /* let the worker finish before the next submit */
	}
	run_until(g.loop, &g.done, 64);
	assert_int_equal(g.done_in_submit, 0);
	check_jobs(jobs, 64);
	run_chain(g.loop, 500);
}

/* ---- polling reaps completions without eventfd writes ----------------------- */

static void test_polling_reaps(void **state)
{
	struct loop *loop, *saved = g.loop;
	struct tp_stats before, after;
	struct loop_stats lbefore, lafter;
	uint64_t completed;

	(void)state;
	/* A long poll window: the loop busy-polls while each job runs. */
	loop = new_loop(1000ll * 1000 * 1000);
	g.loop = loop;
	/* Jobs of 200 us, so that the loop has to wait for each one (instant
	 * jobs finish before the loop even looks, and arrive by message), on
	 * workers that sleep between jobs (a spinning one may share the loop's
	 * CPU and finish only when the loop yields, which a loaded machine or a
	 * sanitizer build makes likely). */
	tp_set_spin_ns(0);
	run_chain_busy(loop, 100, 200000); /* warm up: polling grows its window */
	tp_get_stats(&before);
	loop_get_stats(loop, &lbefore);
	run_chain_busy(loop, 500, 200000);
	tp_set_spin_ns(20000);
	tp_get_stats(&after);
	loop_get_stats(loop, &lafter);
	completed = after.completed - before.completed;
	assert_int_equal(completed, 500);
	/* Some completions were reaped by the poll handler, and fewer eventfd
	 * writes were made than completions (bounds kept loose on purpose: the
	 * test machine may be busy). */
	assert_true(after.reaped_polling - before.reaped_polling > 0);
	assert_true(lafter.wakeups_sent - lbefore.wakeups_sent < completed);
	loop_free(loop);
	g.loop = saved;
	loop_bind_current(saved);
}

static void test_no_polling_uses_eventfd(void **state)
{
	struct loop *loop, *saved = g.loop;
	struct tp_stats before, after;
	struct loop_stats lst;

	(void)state;
	loop = new_loop(0); /* polling off: only the eventfd can wake the loop */
	g.loop = loop;
	tp_get_stats(&before);
	run_chain(loop, 300);
	tp_get_stats(&after);
	loop_get_stats(loop, &lst);
	assert_int_equal(after.completed - before.completed, 300);
	assert_int_equal(after.reaped_polling - before.reaped_polling, 0);
	assert_true(after.loop_wakeups - before.loop_wakeups >= 1);
	assert_true(lst.wakeups_sent >= 1);
	loop_free(loop);
	g.loop = saved;
	loop_bind_current(saved);
}

/* ---- sleeping workers are woken ------------------------------------------------ */

static void test_sleeping_workers_woken(void **state)
{
	struct tp_stats before, after;
	int i;

	(void)state;
	tp_set_spin_ns(0); /* idle workers go straight to the condvar */
	sleep_us(20000);
	tp_get_stats(&before);
	for (i = 0; i < 10; i++) {
		run_chain(g.loop, 1);
		sleep_us(2000); /* the worker is asleep again by now */
	}
	tp_get_stats(&after);
	tp_set_spin_ns(50000);
	assert_int_equal(after.completed - before.completed, 10);
	assert_true(after.worker_wakeups - before.worker_wakeups >= 1);
}

/* ---- the worker count is bounded ---------------------------------------------- */

static atomic_uint running, max_running, released;

static int blocking_fn(struct tp_work *w)
{
	unsigned now = atomic_fetch_add(&running, 1) + 1, max = atomic_load(&max_running);
	uint64_t end = loop_now_ns() + TEST_TIMEOUT_NS;

	(void)w;
	while (now > max && !atomic_compare_exchange_weak(&max_running, &max, now))
		;
	while (!atomic_load(&released) && loop_now_ns() < end)
		sleep_us(200);
	atomic_fetch_sub(&running, 1);
	return 0;
}

static void test_workers_bounded(void **state)
{
	enum { N = 3 * TEST_MAX_WORKERS };
	struct job jobs[N];
	struct tp_stats st;
	unsigned i;

	(void)state;
	g.done = 0;
	atomic_store(&released, 0);
	for (i = 0; i < N; i++) {
		jobs[i] = (struct job){
			.w = {.fn = blocking_fn, .done = job_done}, .loop = g.loop, .idx = i};
		submit(g.loop, &jobs[i].w);
	}
	wait_atomic(&running, TEST_MAX_WORKERS);
	sleep_us(20000); /* room for a fifth worker to show up if the bound broke */
	tp_get_stats(&st);
	assert_int_equal(atomic_load(&running), TEST_MAX_WORKERS);
	assert_true(st.workers <= TEST_MAX_WORKERS);
	atomic_store(&released, 1);
	run_until(g.loop, &g.done, N);
	assert_int_equal(atomic_load(&max_running), TEST_MAX_WORKERS);
}

/* ---- loop_free waits for jobs in flight ------------------------------------------ */

static int slow_fn(struct tp_work *w)
{
	(void)w;
	sleep_us(2000);
	return 0;
}

static void test_cleanup_drains(void **state)
{
	enum { N = 16 };
	struct job jobs[N];
	struct loop *loop, *saved = g.loop;
	unsigned i;

	(void)state;
	loop = new_loop(-1);
	g.done = 0;
	g.bad_thread = 0;
	for (i = 0; i < N; i++) {
		jobs[i] = (struct job){
			.w = {.fn = slow_fn, .done = job_done}, .loop = loop, .idx = i};
		submit(loop, &jobs[i].w);
	}
	loop_free(loop); /* runs every done() before it returns */
	assert_int_equal(g.done, N);
	for (i = 0; i < N; i++)
		assert_int_equal(jobs[i].ndone, 1);
	loop_bind_current(saved);
}

/* ---- two loops on two iothreads -------------------------------------------------- */

struct per_thread {
	struct iothread *t;
	struct job jobs[500];
	atomic_uint done;
	unsigned wrong_loop; /* written on the iothread only */
};

static void pt_done(struct tp_work *w, int ret)
{
	struct job *j = container_of(w, struct job, w);
	struct per_thread *pt = j->pt;

	(void)ret;
	j->ndone++;
	pt->wrong_loop += loop_current() != iothread_loop(pt->t);
	atomic_fetch_add(&pt->done, 1);
}

/* Runs on the iothread. */
static void pt_submit(void *arg)
{
	struct per_thread *pt = arg;
	unsigned i;

	for (i = 0; i < 500; i++) {
		pt->jobs[i] = (struct job){.w = {.fn = job_fn, .done = pt_done},
					   .loop = loop_current(),
					   .idx = i,
					   .pt = pt};
		tp_submit(loop_current(), &pt->jobs[i].w);
	}
}

static void test_two_iothreads(void **state)
{
	static struct per_thread pt[2];
	unsigned i, k;

	(void)state;
	for (k = 0; k < 2; k++) {
		memset(&pt[k], 0, sizeof(pt[k]));
		assert_int_equal(iothread_start(k ? "tp-io1" : "tp-io0", NULL, &pt[k].t), 0);
	}
	for (k = 0; k < 2; k++)
		iothread_run_sync(pt[k].t, pt_submit, &pt[k]);
	for (k = 0; k < 2; k++) {
		wait_atomic(&pt[k].done, 500);
		iothread_join(pt[k].t);
		assert_int_equal(pt[k].wrong_loop, 0);
		for (i = 0; i < 500; i++) {
			assert_int_equal(pt[k].jobs[i].ndone, 1);
			assert_int_equal(pt[k].jobs[i].result, i * 3 + 1);
		}
	}
}

/* ---- iothreads: start, run_sync, join ------------------------------------------- */

struct probe {
	struct iothread *t;
	struct loop *seen_loop;
	pthread_t tid;
	char name[16];
	int calls;
};

static void probe_fn(void *arg)
{
	struct probe *p = arg;

	p->seen_loop = loop_current();
	p->tid = pthread_self();
	pthread_getname_np(pthread_self(), p->name, sizeof(p->name));
	p->calls++;
}

static void test_iothreads_run_sync(void **state)
{
	struct probe p[3] = {{0}};
	const char *names[3] = {"io-a", "io-b", "io-c"};
	int i;

	(void)state;
	for (i = 0; i < 3; i++) {
		assert_int_equal(iothread_start(names[i], NULL, &p[i].t), 0);
		assert_string_equal(iothread_name(p[i].t), names[i]);
		assert_non_null(iothread_loop(p[i].t));
	}
	for (i = 0; i < 3; i++) {
		iothread_run_sync(p[i].t, probe_fn, &p[i]);
		/* run_sync returns only after fn ran, on the iothread, in its loop */
		assert_int_equal(p[i].calls, 1);
		assert_ptr_equal(p[i].seen_loop, iothread_loop(p[i].t));
		assert_false(pthread_equal(p[i].tid, g.main_tid));
		assert_string_equal(p[i].name, names[i]);
	}
	assert_false(pthread_equal(p[0].tid, p[1].tid));
	assert_false(pthread_equal(p[1].tid, p[2].tid));
	for (i = 0; i < 3; i++)
		iothread_join(p[i].t);
}

static int group_setup(void **state)
{
	(void)state;
	tp_set_max_workers(TEST_MAX_WORKERS);
	g.main_tid = pthread_self();
	g.loop = new_loop(-1);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	loop_free(g.loop);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_many_jobs),
		cmocka_unit_test(test_done_not_in_submit),
		cmocka_unit_test(test_polling_reaps),
		cmocka_unit_test(test_no_polling_uses_eventfd),
		cmocka_unit_test(test_sleeping_workers_woken),
		cmocka_unit_test(test_workers_bounded),
		cmocka_unit_test(test_cleanup_drains),
		cmocka_unit_test(test_two_iothreads),
		cmocka_unit_test(test_iothreads_run_sync),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
