/* Unit tests for drain with real iothreads under load: while the main
 * thread drains one node, no request reaches that node's driver, requests
 * in flight there have finished, new ones wait (and later succeed), and
 * the iothreads go on serving another node.
 * Threading: the main thread drains; two iothreads run load generators,
 * each owning its own requests; the "slow" driver's counters are atomics. */
#include <stdatomic.h>
#include <unistd.h>

#include "blk-test-ram.h"
#include "block/graph.h"
#include "loop/iothread.h"
#include "util/compiler.h"

#define NTHREADS 2
#define DEPTH 8
#define WAIT_ROUNDS 20000 /* x 500 us: 10 s at most for any wait */

/* "slow": a protocol driver completing each request after 50 us on the
 * submitting loop's timer; counts what executes, per device (dev=0|1). */
struct slow_dev {
	atomic_uint active;   /* requests in the driver now */
	atomic_ulong started; /* requests the driver got */
};
static struct slow_dev devs[3];

struct slow_ctx {
	struct loop_timer t;
	struct slow_dev *d;
};
_Static_assert(sizeof(struct slow_ctx) <= BLK_DRV_CTX_SIZE, "slow context");

static int slow_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	uint64_t dev = 0;

	if (kv_get_u64(opts, "dev", &dev) || dev > 2) {
		snprintf(err, errlen, "slow: dev=0|1|2");
		return -EINVAL;
	}
	bs->opaque = &devs[dev];
	bs->size = 1 << 20;
	return 0;
}

static int slow_truncate(struct blk_node *bs, uint64_t size)
{
	/* Called drained: nothing may be running. */
	assert_int_equal(atomic_load(&((struct slow_dev *)bs->opaque)->active), 0);
	bs->size = size;
	return 0;
}

static void slow_done(struct loop_timer *t)
{
	struct slow_ctx *c = container_of(t, struct slow_ctx, t);

	atomic_fetch_sub(&c->d->active, 1);
	blk_complete(blk_req_from_drv(c), 0);
}

static int slow_submit(struct blk_node *bs, struct blk_request *req)
{
	struct slow_ctx *c = (struct slow_ctx *)req->drv.bytes;

	c->d = bs->opaque;
	c->t = (struct loop_timer){.cb = slow_done};
	atomic_fetch_add(&c->d->active, 1);
	atomic_fetch_add(&c->d->started, 1);
	loop_timer_arm(req->loop, &c->t, loop_now_ns() + 50000);
	return 0;
}

static const struct blk_driver slow_driver = {
	.name = "slow",
	.open = slow_open,
	.submit = slow_submit,
	.truncate = slow_truncate,
};

/* A load generator on one iothread: DEPTH reads on one node, each
 * resubmitted when it completes, until `stop`. */
struct gen {
	struct blk_node *bs;
	struct blk_request req[DEPTH];
	struct iovec iov[DEPTH];
	char buf[DEPTH][512];
	atomic_uint outstanding;
	atomic_ulong done, errors;
	atomic_bool stop;
};

static void gen_cb(struct blk_request *req, int ret);

static void gen_submit(struct gen *g, struct blk_request *r)
{
	unsigned i = (unsigned)(r - g->req);
	int ret;

	g->iov[i] = (struct iovec){.iov_base = g->buf[i], .iov_len = 512};
	*r = (struct blk_request){.op = BLK_OP_READ,
				  .offset = 512 * i,
				  .len = 512,
				  .iov = &g->iov[i],
				  .iovcnt = 1,
				  .cb = gen_cb,
				  .opaque = g};
	/* The node may be replaced meanwhile (gen_replaced, main thread). */
	ret = blk_submit(__atomic_load_n(&g->bs, __ATOMIC_RELAXED), r);
	if (ret) {
		atomic_fetch_add(&g->errors, 1);
		atomic_fetch_sub(&g->outstanding, 1);
	}
}

static void gen_cb(struct blk_request *req, int ret)
{
	struct gen *g = req->opaque;

	if (ret)
		atomic_fetch_add(&g->errors, 1);
	atomic_fetch_add(&g->done, 1);
	if (atomic_load(&g->stop))
		atomic_fetch_sub(&g->outstanding, 1);
	else
		gen_submit(g, req);
}

static void gen_start(void *arg)
{
	struct gen *g = arg;

	atomic_store(&g->outstanding, DEPTH);
	for (unsigned i = 0; i < DEPTH; i++)
		gen_submit(g, &g->req[i]);
}

static void detach(void *arg)
{
	struct blk_node *bs = arg;

	blk_detach_loop(bs, loop_current());
}

struct rig {
	struct iothread *t[NTHREADS];
	struct gen g[NTHREADS][2]; /* [thread][node a|b] */
	struct blk_node *a, *b;
};

static unsigned long done_of(struct rig *r, int which)
{
	unsigned long n = 0;

	for (int i = 0; i < NTHREADS; i++)
		n += atomic_load(&r->g[i][which].done);
	return n;
}

/* Wait until node `which` completed `more` requests beyond `from`. */
static void wait_done(struct rig *r, int which, unsigned long from, unsigned long more)
{
	for (int i = 0; i < WAIT_ROUNDS && done_of(r, which) < from + more; i++)
		usleep(500);
	assert_true(done_of(r, which) >= from + more);
}

static void rig_start(struct rig *r, struct blk_node *a, struct blk_node *b)
{
	memset(devs, 0, sizeof(devs));
	r->a = a;
	r->b = b;
	for (int i = 0; i < NTHREADS; i++) {
		char name[16];

		snprintf(name, sizeof(name), "io%d", i);
		assert_int_equal(iothread_start(name, NULL, &r->t[i]), 0);
		r->g[i][0].bs = a;
		r->g[i][1].bs = b;
		iothread_run_sync(r->t[i], gen_start, &r->g[i][0]);
		iothread_run_sync(r->t[i], gen_start, &r->g[i][1]);
	}
	wait_done(r, 0, 0, 100);
	wait_done(r, 1, 0, 100);
}

static void rig_stop(struct rig *r)
{
	for (int i = 0; i < NTHREADS; i++) {
		for (int w = 0; w < 2; w++) {
			struct gen *g = &r->g[i][w];

			atomic_store(&g->stop, true);
			for (int k = 0; k < WAIT_ROUNDS && atomic_load(&g->outstanding); k++)
				usleep(500);
			assert_int_equal(atomic_load(&g->outstanding), 0);
			assert_int_equal(atomic_load(&g->errors), 0);
		}
		iothread_run_sync(r->t[i], detach, r->a);
		iothread_run_sync(r->t[i], detach, r->b);
		iothread_join(r->t[i]);
	}
}

/* The core of it: drained node idle, the other busy, then all resumes. */
static void check_drain(struct rig *r, struct blk_node *drain, struct slow_dev *quiet)
{
	unsigned long started, a0, b0;

	assert_int_equal(blk_drain_begin(drain), 0);
	assert_true(blk_drained(drain));
	assert_int_equal(atomic_load(&quiet->active), 0);
	started = atomic_load(&quiet->started);
	a0 = done_of(r, 0);
	b0 = done_of(r, 1);
	wait_done(r, 1, b0, 500); /* the other node keeps being served */
	assert_int_equal(atomic_load(&quiet->started), started);
	assert_int_equal(atomic_load(&quiet->active), 0);
	assert_int_equal(done_of(r, 0), a0); /* its submitters wait */
	blk_drain_end(drain);
	assert_false(blk_drained(drain));
	wait_done(r, 0, a0, 500); /* and go on */
}

static struct blk_node *open_slow(const char *spec)
{
	return test_open(spec);
}

static void test_drain_under_load(void **state)
{
	struct blk_node *a = open_slow("driver=slow,dev=0"), *b = open_slow("driver=slow,dev=1");
	struct rig *r = calloc(1, sizeof(*r));

	(void)state;
	rig_start(r, a, b);
	for (int i = 0; i < 3; i++)
		check_drain(r, a, &devs[0]);
	rig_stop(r);
	free(r);
	blk_close(a);
	blk_close(b);
}

/* Draining the protocol node under a format node holds the format node's
 * submitters too (their requests would reach it). */
static void test_drain_child_holds_parent(void **state)
{
	struct blk_node *a = open_slow("driver=slow,dev=0,format=raw");
	struct blk_node *b = open_slow("driver=slow,dev=1");
	struct rig *r = calloc(1, sizeof(*r));

	(void)state;
	rig_start(r, a, b);
	check_drain(r, a->next, &devs[0]);
	assert_false(blk_drained(a));
	rig_stop(r);
	free(r);
	blk_close(a);
	blk_close(b);
}

/* Nested drains: requests resume only after the last end; a resize under
 * load runs drained (the driver's truncate asserts it) and grows the node. */
static void test_nested_and_resize(void **state)
{
	struct blk_node *a = open_slow("driver=slow,dev=0"), *b = open_slow("driver=slow,dev=1");
	struct rig *r = calloc(1, sizeof(*r));
	unsigned long a0;
	char err[128];

	(void)state;
	rig_start(r, a, b);
	assert_int_equal(blk_drain_begin(a), 0);
	assert_int_equal(blk_drain_begin(a), 0);
	a0 = done_of(r, 0);
	blk_drain_end(a);
	assert_true(blk_drained(a));
	wait_done(r, 1, done_of(r, 1), 200);
	assert_int_equal(done_of(r, 0), a0);
	blk_drain_end(a);
	wait_done(r, 0, a0, 200);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(blk_resize(a, (2 + i) << 20, err, sizeof(err)), 0);
		assert_int_equal(blk_size(a), (uint64_t)(2 + i) << 20);
	}
	wait_done(r, 0, done_of(r, 0), 200);
	rig_stop(r);
	free(r);
	blk_close(a);
	blk_close(b);
}

/* On one thread: a request in flight on the main loop finishes inside
 * blk_drain_begin(); one submitted during the drain is held, then runs. */
static void test_drain_main_loop(void **state)
{
	struct blk_node *a = open_slow("driver=slow,dev=0");
	struct gen *g = calloc(1, sizeof(*g));

	memset(devs, 0, sizeof(devs));
	g->bs = a;
	gen_start(g);
	assert_int_equal(atomic_load(&devs[0].active), DEPTH);
	assert_int_equal(blk_drain_begin(a), 0);
	assert_int_equal(atomic_load(&devs[0].active), 0);
	assert_int_equal(atomic_load(&g->done), DEPTH); /* resubmitted, held */
	for (int i = 0; i < 20; i++)
		loop_run_once(*state, false);
	assert_int_equal(atomic_load(&devs[0].started), DEPTH);
	atomic_store(&g->stop, true);
	blk_drain_end(a);
	for (int i = 0; i < WAIT_ROUNDS && atomic_load(&g->outstanding); i++)
		loop_run_once(*state, true);
	assert_int_equal(atomic_load(&g->outstanding), 0);
	assert_int_equal(atomic_load(&devs[0].started), 2 * DEPTH);
	assert_int_equal(atomic_load(&g->errors), 0);
	free(g);
	blk_close(a);
}

/* Synchronous work in a control section (blk_ctl_enter) leaves the node
 * knowing the control loop, which runs only inside such sections: a later
 * drain from the thread's own loop must not wait for it. */
static void test_drain_after_ctl_section(void **state)
{
	struct blk_node *a = open_slow("driver=slow,dev=0");
	struct loop *prev;
	char buf[512];

	memset(devs, 0, sizeof(devs));
	assert_int_equal(blk_ctl_enter(&prev), 0);
	assert_int_equal(blk_pread(a, 0, buf, sizeof(buf)), 0);
	blk_ctl_leave(prev);
	assert_ptr_equal(loop_current(), *state);
	assert_int_equal(blk_drain_begin(a), 0);
	blk_drain_end(a);
	blk_close(a);
	blk_ctl_free();
}

/* A generator follows a replaced node, as an export does. */
static void gen_replaced(struct blk_node *from, struct blk_node *to, void *opaque)
{
	struct gen *g = opaque;

	assert_ptr_equal(g->bs, from);
	__atomic_store_n(&g->bs, to, __ATOMIC_RELEASE);
}

/* blk_replace_node() under load from two iothreads: from the switch on, no
 * request reaches the old node's driver - not even those the drain held
 * for it, which resume on the new node - every request succeeds, and the
 * user's reference and notifiers moved. */
static void test_replace_under_load(void **state)
{
	struct blk_node *a = open_slow("driver=slow,dev=0"), *b = open_slow("driver=slow,dev=1");
	struct blk_node *c = open_slow("driver=slow,dev=2");
	struct rig *r = calloc(1, sizeof(*r));
	unsigned long started, c0;
	char err[128], why[128];

	(void)state;
	rig_start(r, a, b);
	blk_ref(a, "test user");
	for (int i = 0; i < NTHREADS; i++)
		assert_int_equal(blk_replace_notifier_add(a, gen_replaced, &r->g[i][0]), 0);
	assert_int_equal(blk_drain_begin(a), 0);
	assert_int_equal(blk_drain_begin(c), 0);
	wait_done(r, 1, done_of(r, 1), 200); /* a's generators are held meanwhile */
	started = atomic_load(&devs[0].started);
	c0 = done_of(r, 0);
	assert_int_equal(blk_replace_node(a, c, err, sizeof(err)), 0);
	blk_drain_end(c);
	blk_drain_end(a);
	wait_done(r, 0, c0, 1000);
	assert_int_equal(atomic_load(&devs[0].started), started);
	assert_true(atomic_load(&devs[2].started) >= 1000);
	assert_int_equal(blk_user_count(a), 0);
	assert_int_equal(blk_user_count(c), 1);
	assert_true(blk_in_use(c, why, sizeof(why)));
	assert_string_equal(why, "used by test user");
	for (int i = 0; i < NTHREADS; i++)
		assert_ptr_equal(r->g[i][0].bs, c);
	/* Sizes must match; nothing moves then. */
	c->size = 4096;
	assert_int_equal(blk_replace_node(c, a, err, sizeof(err)), -EINVAL);
	assert_int_equal(blk_user_count(c), 1);
	c->size = a->size;
	rig_stop(r);
	free(r);
	blk_unref(c, "test user");
	blk_close(a);
	blk_close(b);
	blk_close(c);
}

/* Replaced and put back within one drain (an aborted snapshot): the
 * requests held for the node return to it, none reaches the other one.
 * Before retargeting recorded the threads on the new node, the way back
 * missed them. */
static void test_replace_and_back(void **state)
{
	struct blk_node *a = open_slow("driver=slow,dev=0"), *b = open_slow("driver=slow,dev=1");
	struct blk_node *c = open_slow("driver=slow,dev=2");
	struct rig *r = calloc(1, sizeof(*r));
	unsigned long a0;
	char err[128];

	(void)state;
	rig_start(r, a, b);
	blk_ref(a, "test user");
	for (int i = 0; i < NTHREADS; i++)
		assert_int_equal(blk_replace_notifier_add(a, gen_replaced, &r->g[i][0]), 0);
	assert_int_equal(blk_drain_begin(a), 0);
	assert_int_equal(blk_drain_begin(c), 0);
	wait_done(r, 1, done_of(r, 1), 200);
	a0 = done_of(r, 0);
	assert_int_equal(blk_replace_node(a, c, err, sizeof(err)), 0);
	assert_int_equal(blk_replace_node(c, a, err, sizeof(err)), 0);
	blk_drain_end(c);
	blk_drain_end(a);
	wait_done(r, 0, a0, 500);
	assert_int_equal(atomic_load(&devs[2].started), 0);
	assert_int_equal(blk_user_count(a), 1);
	assert_int_equal(blk_user_count(c), 0);
	rig_stop(r);
	free(r);
	blk_unref(a, "test user");
	blk_close(a);
	blk_close(b);
	blk_close(c);
}

/* A drain from a control section after the thread's own loop submitted to
 * the node (an open at start-up): that loop is blocked in the callback that
 * entered and cannot acknowledge. This hung before drains skipped it. */
static void test_drain_in_ctl_after_main_loop_io(void **state)
{
	struct blk_node *a = open_slow("driver=slow,dev=0");
	struct loop *prev;
	char buf[512];

	(void)state;
	memset(devs, 0, sizeof(devs));
	assert_int_equal(blk_pread(a, 0, buf, sizeof(buf)), 0);
	assert_int_equal(blk_ctl_enter(&prev), 0);
	assert_int_equal(blk_drain_begin(a), 0);
	blk_drain_end(a);
	blk_ctl_leave(prev);
	blk_close(a);
	blk_ctl_free();
}

static int setup(void **state)
{
	static bool registered;

	if (!registered) {
		assert_int_equal(ram_register(), 0);
		assert_int_equal(blk_register_driver(&slow_driver), 0);
		registered = true;
	}
	*state = test_loop_new();
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_drain_under_load, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_drain_child_holds_parent, setup,
						ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_nested_and_resize, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_drain_main_loop, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_drain_after_ctl_section, setup,
						ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_replace_under_load, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_replace_and_back, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_drain_in_ctl_after_main_loop_io, setup,
						ram_test_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
