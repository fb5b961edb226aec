/* Unit tests for throttle groups and the throttle filter: QEMU's option
 * checks and messages, the leaky-bucket arithmetic on a simulated clock
 * (rates, bursts, iops-size), and the driver on a null node: requests over
 * the limit wait in order per direction and all complete, none fails. No
 * timing asserts: the arithmetic runs on made-up time, the driver's test
 * only counts what completed before the loop slept.
 * Threading: one loop on the test thread. */
#include "blk-test-ram.h"
#include "block/throttle-group.h"

static int parse(const char *s, struct throttle_config *cfg, char *err, size_t errlen)
{
	struct kv_opts o = {0};
	int ret;

	assert_int_equal(kv_parse(&o, s, NULL), 0);
	ret = throttle_config_parse(cfg, &o, "", err, errlen);
	if (!ret)
		assert_null(kv_first_unused(&o));
	kv_free(&o);
	return ret;
}

static void expect_refused(const char *s, const char *msg)
{
	struct throttle_config cfg;
	char err[256] = "";

	assert_int_equal(parse(s, &cfg, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, msg);
}

static void test_config(void **state)
{
	struct throttle_config cfg;
	char err[256];

	(void)state;
	assert_int_equal(parse("iops-total=100,iops-total-max=200,iops-total-max-length=3,"
			       "bps-read=1000,bps-write=2000,iops-size=4096",
			       &cfg, err, sizeof(err)),
			 0);
	assert_int_equal(cfg.b[THR_OPS_TOTAL].avg, 100);
	assert_int_equal(cfg.b[THR_OPS_TOTAL].max, 200);
	assert_int_equal(cfg.b[THR_OPS_TOTAL].burst_length, 3);
	assert_int_equal(cfg.b[THR_BPS_WRITE].avg, 2000);
	assert_int_equal(cfg.b[THR_BPS_TOTAL].burst_length, 1);
	assert_int_equal(cfg.op_size, 4096);
	assert_true(throttle_config_enabled(&cfg));
	assert_int_equal(parse("", &cfg, err, sizeof(err)), 0);
	assert_false(throttle_config_enabled(&cfg));
	expect_refused("iops-total=1,iops-read=2", "bps/iops/max total values and read/write "
						    "values cannot be used at the same time");
	expect_refused("bps-total=10,bps-total-max=5",
		       "bps_max/iops_max cannot be lower than bps/iops");
	expect_refused("bps-total-max=5", "bps_max/iops_max require corresponding bps/iops values");
	expect_refused("iops-read=5,iops-read-max-length=4", "burst length set without burst rate");
	expect_refused("iops-read=5,iops-read-max=6,iops-read-max-length=0",
		       "the burst length cannot be 0");
	expect_refused("iops-write=1000000000000001",
		       "bps/iops/max values must be within [0, 1000000000000000]");
	expect_refused("iops-write=many", "Parameter 'iops-write' expects a non-negative number "
					  "below 2^64");
}

/* Requests of `bytes` admitted over `secs` simulated seconds, each as soon
 * as the group allows it (the caller asks again after the wait it is told),
 * by a submitter that could send one per microsecond. */
static uint64_t run_for(const char *limits, bool write, uint64_t bytes, double secs,
			uint64_t *first_second)
{
	struct throttle_config cfg;
	struct throttle_level lv[THR__COUNT] = {0};
	char err[256];
	uint64_t now = 0, last = 0, n = 0, end = (uint64_t)(secs * 1e9);

	assert_int_equal(parse(limits, &cfg, err, sizeof(err)), 0);
	*first_second = 0;
	while (now < end) {
		uint64_t wait;

		throttle_leak(&cfg, lv, now - last);
		last = now;
		wait = throttle_wait_ns(&cfg, lv, write);
		if (wait) {
			now += wait;
			continue;
		}
		throttle_account(&cfg, lv, write, bytes);
		n++;
		if (now < 1000000000ull)
			(*first_second)++;
		now += 1000;
	}
	return n;
}

static void assert_near(double got, double want, double rel)
{
	if (got < want * (1 - rel) || got > want * (1 + rel)) {
		fprintf(stderr, "got %.1f, want %.1f +- %.1f%%\n", got, want, rel * 100);
		fail();
	}
}

static void test_rates(void **state)
{
	uint64_t first;

	(void)state;
	/* 1000 IOPS for 20 s: the rate holds; the bucket lets avg/10 start at once. */
	assert_near((double)run_for("iops-total=1000", false, 4096, 20, &first), 20000, 0.01);
	assert_near((double)first, 1000, 0.15);
	/* 50 MB/s of 64 KiB requests, plus the bucket's tenth of a second. */
	assert_near((double)run_for("bps-total=50000000", true, 65536, 10, &first) * 65536,
		    505000000.0, 0.005);
	/* A read limit does not hold writes back, and the reverse. */
	assert_int_equal(run_for("iops-read=10", true, 4096, 1, &first), 1000000);
	assert_near((double)run_for("iops-read=10", false, 4096, 10, &first), 100, 0.05);
	/* iops-size: a 64 KiB request counts as 16 operations of 4 KiB. */
	assert_near((double)run_for("iops-total=1600,iops-size=4096", false, 65536, 10, &first),
		    1000, 0.02);
}

static void test_burst(void **state)
{
	uint64_t first, n;

	(void)state;
	/* 100 IOPS with bursts of 1000 IOPS for 5 s: the first second runs at
	 * the burst rate, and over 60 s the average is back to 100 plus the
	 * burst's allowance. */
	n = run_for("iops-total=100,iops-total-max=1000,iops-total-max-length=5", false, 512, 60,
		    &first);
	assert_near((double)first, 1000, 0.12);
	assert_near((double)n, 100 * 60 + 1000 * 5, 0.05);
	/* Without a burst length, max is only the bucket size: one second's worth at once. */
	run_for("iops-total=100,iops-total-max=1000", false, 512, 10, &first);
	assert_near((double)first, 1100, 0.05);
}

static void test_registry(void **state)
{
	struct throttle_config cfg = {0};
	char err[256];

	(void)state;
	for (int i = 0; i < THR__COUNT; i++)
		cfg.b[i].burst_length = 1;
	cfg.b[THR_OPS_TOTAL].avg = 10;
	assert_int_equal(throttle_group_add("tg0", &cfg, err, sizeof(err)), 0);
	assert_int_equal(throttle_group_add("tg0", &cfg, err, sizeof(err)), -EEXIST);
	assert_non_null(throttle_group_find("tg0"));
	cfg.b[THR_OPS_READ].avg = 10;
	assert_int_equal(throttle_group_set(throttle_group_find("tg0"), &cfg, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(throttle_group_find("tg0")->cfg.b[THR_OPS_READ].avg, 0);
	assert_int_equal(throttle_group_del("tg0", err, sizeof(err)), 0);
	assert_null(throttle_group_find("tg0"));
	assert_int_equal(throttle_group_del("tg0", err, sizeof(err)), -ENOENT);
}

#define NREQ 60

static void test_driver(void **state)
{
	struct blk_stats st;
	struct loop *loop = *state;
	struct throttle_config cfg;
	struct test_req r[NREQ], w[4];
	unsigned done = 0, wdone = 0;
	uint8_t buf[512];
	bool in_submit = false;
	char err[256];
	struct blk_node *bs;

	assert_int_equal(parse("iops-read=200,iops-write=2", &cfg, err, sizeof(err)), 0);
	assert_int_equal(throttle_group_add("tg1", &cfg, err, sizeof(err)), 0);
	assert_int_equal(test_open_fail("driver=null,size=1M,format=throttle", err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "Parameter 'throttle-group' is missing");
	assert_int_equal(test_open_fail("driver=null,size=1M,format=throttle,throttle-group=no",
					err, sizeof(err)),
			 -ENOENT);
	bs = test_open("driver=null,size=1M,read-zeroes=on,format=throttle,throttle-group=tg1");
	assert_int_equal(throttle_group_del("tg1", err, sizeof(err)), -EBUSY);

	/* Writes: one passes, the rest wait; reads go past them. */
	for (int i = 0; i < 4; i++) {
		test_req_init(&w[i], BLK_OP_WRITE, 0, buf, sizeof(buf), 0, &wdone);
		assert_int_equal(test_submit(bs, &w[i], &in_submit), 0);
	}
	for (int i = 0; i < NREQ; i++) {
		test_req_init(&r[i], BLK_OP_READ, (uint64_t)i * 512, buf, sizeof(buf), 0, &done);
		assert_int_equal(test_submit(bs, &r[i], &in_submit), 0);
	}
	for (int i = 0; i < 3; i++)
		loop_run_once(loop, false);
	/* 200 IOPS lets 21 start at once; 60 take about 0.2 s more. */
	assert_true(done > 0 && done < NREQ);
	assert_true(wdone < 4);
	for (unsigned n = 0; n < 10000 && done < NREQ; n++)
		loop_run_once(loop, true);
	assert_int_equal(done, NREQ);
	for (int i = 0; i < NREQ; i++) {
		assert_int_equal(r[i].calls, 1);
		assert_int_equal(r[i].ret, 0);
		assert_int_equal(r[i].order, i); /* in order */
		assert_false(r[i].saw_in_submit);
	}
	assert_true(wdone < 4); /* 2 writes per second: still waiting */
	assert_true(throttle_group_find("tg1")->waits > 0);
	for (unsigned n = 0; n < 10000 && wdone < 4; n++)
		loop_run_once(loop, true);
	for (int i = 0; i < 4; i++) {
		assert_int_equal(w[i].ret, 0);
		assert_int_equal(w[i].order, i);
	}
	/* The node counts the requests that waited (3 writes and the reads
	 * past the first burst) and their time. */
	blk_get_stats(bs, &st);
	assert_true(st.throttle_waits >= 3 + 1 && st.throttle_waits <= 3 + NREQ);
	assert_true(st.throttle_wait_ns > 0);
	assert_int_equal(st.in_flight, 0);
	blk_close(bs);
	assert_int_equal(throttle_group_del("tg1", err, sizeof(err)), 0);
}

/* Flush, discard and block status are not limited. */
static void test_unlimited_ops(void **state)
{
	struct loop *loop = *state;
	struct throttle_config cfg;
	struct test_req t[8];
	unsigned done = 0;
	bool in_submit = false;
	char err[256];
	struct blk_node *bs;

	assert_int_equal(parse("iops-total=1", &cfg, err, sizeof(err)), 0);
	assert_int_equal(throttle_group_add("tg2", &cfg, err, sizeof(err)), 0);
	bs = test_open("driver=null,size=1M,format=throttle,throttle-group=tg2");
	for (int i = 0; i < 8; i++) {
		test_req_init(&t[i], i % 2 ? BLK_OP_FLUSH : BLK_OP_BLOCK_STATUS, 0, NULL,
			      i % 2 ? 0 : 4096, 0, &done);
		assert_int_equal(test_submit(bs, &t[i], &in_submit), 0);
	}
	for (int i = 0; i < 3 && done < 8; i++)
		loop_run_once(loop, false);
	assert_int_equal(done, 8);
	blk_close(bs);
	assert_int_equal(throttle_group_del("tg2", err, sizeof(err)), 0);
}

/* New limits reach requests already waiting: with 1 byte/s a 512-byte read
 * would wait minutes; raised meanwhile, it goes at the next look (a tenth
 * of a second at most), so a few blocking rounds finish it. */
static void test_set_while_waiting(void **state)
{
	struct loop *loop = *state;
	struct throttle_config cfg;
	struct test_req r[3];
	unsigned done = 0;
	bool in_submit = false;
	uint8_t buf[512];
	char err[256];
	struct blk_node *bs;

	assert_int_equal(parse("bps-read=1", &cfg, err, sizeof(err)), 0);
	assert_int_equal(throttle_group_add("tg3", &cfg, err, sizeof(err)), 0);
	bs = test_open("driver=null,size=1M,format=throttle,throttle-group=tg3");
	for (int i = 0; i < 3; i++) {
		test_req_init(&r[i], BLK_OP_READ, 0, buf, sizeof(buf), 0, &done);
		assert_int_equal(test_submit(bs, &r[i], &in_submit), 0);
	}
	for (int i = 0; i < 3; i++)
		loop_run_once(loop, false);
	assert_true(done < 3);
	assert_int_equal(parse("bps-read=1000000000", &cfg, err, sizeof(err)), 0);
	assert_int_equal(throttle_group_set(throttle_group_find("tg3"), &cfg, err, sizeof(err)), 0);
	for (unsigned n = 0; n < 50 && done < 3; n++)
		loop_run_once(loop, true);
	assert_int_equal(done, 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(r[i].ret, 0);
	blk_close(bs);
	assert_int_equal(throttle_group_del("tg3", err, sizeof(err)), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config),   cmocka_unit_test(test_rates),
		cmocka_unit_test(test_burst),    cmocka_unit_test(test_registry),
		RAM_TEST(test_driver),           RAM_TEST(test_unlimited_ops),
		RAM_TEST(test_set_while_waiting),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
