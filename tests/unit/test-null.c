/* Unit tests for the null driver: options, read-zeroes, block-status,
 * completion by deferral, loop timer and thread pool. No timing asserts:
 * latency shows only as completion order and statistics order.
 * Threading: one loop on the test thread (plus pool workers in threads mode). */
#include "blk-test-ram.h"

static bool in_submit;

static void test_options(void **state)
{
	char err[256];

	(void)state;
	assert_int_equal(test_open_fail("driver=null", err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "size"));
	assert_int_equal(test_open_fail("driver=null,size=lots", err, sizeof(err)), -EINVAL);
	assert_int_equal(test_open_fail("driver=null,size=1M,mode=magic", err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(test_open_fail("driver=null,size=1M,latency-ns=x", err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(test_open_fail("driver=null,size=1M,read-zeroes=perhaps", err,
					sizeof(err)), -EINVAL);
	assert_int_equal(test_open_fail("driver=null,size=1M,filename=x", err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "unknown option 'filename'");
}

static void test_read_zeroes(void **state)
{
	struct blk_node *off = test_open("driver=null,size=1G");
	struct blk_node *on = test_open("driver=null,size=1G,read-zeroes=on");
	uint8_t buf[4096];
	unsigned i;

	(void)state;
	memset(buf, 0xaa, sizeof(buf));
	assert_int_equal(blk_pread(off, 0, buf, sizeof(buf)), 0);
	for (i = 0; i < sizeof(buf); i++)
		assert_int_equal(buf[i], 0xaa);
	assert_int_equal(blk_pread(on, 4096, buf, sizeof(buf)), 0);
	for (i = 0; i < sizeof(buf); i++)
		assert_int_equal(buf[i], 0);
	blk_close(off);
	blk_close(on);
}

static void test_block_status_and_ops(void **state)
{
	struct blk_node *off = test_open("driver=null,size=1G");
	struct blk_node *on = test_open("driver=null,size=1G,read-zeroes=on");
	struct test_req t;
	struct blk_stats st;

	(void)state;
	test_req_init(&t, BLK_OP_BLOCK_STATUS, 0, NULL, 1 << 20, 0, NULL);
	assert_int_equal(blk_do_sync(off, &t.req), 0);
	assert_true(t.req.status & BLK_STATUS_DATA);
	assert_false(t.req.status & BLK_STATUS_ZERO);
	assert_int_equal(t.req.status_len, 1 << 20);
	test_req_init(&t, BLK_OP_BLOCK_STATUS, 0, NULL, 1 << 20, 0, NULL);
	assert_int_equal(blk_do_sync(on, &t.req), 0);
	assert_true(t.req.status & BLK_STATUS_ZERO);
	assert_false(t.req.status & BLK_STATUS_DATA);
	/* discard, write-zeroes (driver's own, also with NO_FALLBACK), flush */
	assert_true(blk_can_discard(off));
	assert_true(blk_can_write_zeroes(off));
	assert_true(blk_can_multi_conn(off));
	test_req_init(&t, BLK_OP_DISCARD, 0, NULL, 1 << 20, 0, NULL);
	assert_int_equal(blk_do_sync(off, &t.req), 0);
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 0, NULL, 1 << 20,
		      BLK_F_NO_FALLBACK | BLK_F_MAY_UNMAP | BLK_F_FUA, NULL);
	assert_int_equal(blk_do_sync(off, &t.req), 0);
	assert_int_equal(blk_flush_sync(off), 0);
	blk_get_stats(off, &st);
	assert_int_equal(st.op[BLK_OP_DISCARD].ops, 1);
	assert_int_equal(st.op[BLK_OP_WRITE_ZEROES].ops, 1);
	assert_int_equal(st.op[BLK_OP_WRITE_ZEROES].bytes, 1 << 20);
	assert_int_equal(st.op[BLK_OP_FLUSH].ops, 1);
	assert_int_equal(st.op[BLK_OP_BLOCK_STATUS].ops, 1);
	blk_close(off);
	blk_close(on);
}

static double mean_ns(const struct blk_op_stats *o)
{
	return o->ops ? (double)o->total_ns / (double)o->ops : 0;
}

static unsigned top_bucket(const struct blk_op_stats *o)
{
	unsigned i, top = 0;

	for (i = 0; i < BLK_HIST_BUCKETS; i++)
		if (o->hist[i])
			top = i;
	return top;
}

/* A slow node's request submitted first completes after a fast node's, and
 * the statistics agree on which was slower. The latency (100 ms) is far
 * above the time to the first loop round even under valgrind: only then can
 * the two finish in one round. */
static void check_latency_order(struct loop *loop, const char *slow_opts)
{
	struct blk_node *slow = test_open(slow_opts);
	struct blk_node *fast = test_open("driver=null,size=1G");
	static char buf[2][4096];
	struct test_req ts, tf;
	struct blk_stats ss, sf;
	unsigned done = 0;

	test_req_init(&ts, BLK_OP_READ, 0, buf[0], 4096, 0, &done);
	test_req_init(&tf, BLK_OP_READ, 0, buf[1], 4096, 0, &done);
	assert_int_equal(test_submit(slow, &ts, &in_submit), 0);
	assert_int_equal(test_submit(fast, &tf, &in_submit), 0);
	blk_get_stats(slow, &ss);
	assert_int_equal(ss.in_flight, 1);
	ram_pump(NULL, loop, &done, 2);
	assert_int_equal(tf.order, 0);
	assert_int_equal(ts.order, 1);
	assert_false(ts.saw_in_submit);
	assert_int_equal(ts.calls, 1);
	assert_int_equal(ts.ret, 0);
	blk_get_stats(slow, &ss);
	blk_get_stats(fast, &sf);
	assert_int_equal(ss.in_flight, 0);
	assert_int_equal(ss.op[BLK_OP_READ].ops, 1);
	assert_true(mean_ns(&ss.op[BLK_OP_READ]) > mean_ns(&sf.op[BLK_OP_READ]));
	assert_true(top_bucket(&ss.op[BLK_OP_READ]) > top_bucket(&sf.op[BLK_OP_READ]));
	blk_close(slow);
	blk_close(fast);
}

static void test_latency_timer(void **state)
{
	check_latency_order(*state, "driver=null,size=1G,latency-ns=100000000");
	check_latency_order(*state, "driver=null,size=1G,latency-ns=100000000,mode=timer");
}

static void test_latency_threads(void **state)
{
	check_latency_order(*state, "driver=null,size=1G,latency-ns=100000000,mode=threads");
}

/* Many requests at once on the pool (and the timer): each completes once. */
static void check_many(struct loop *loop, const char *opts)
{
	struct blk_node *bs = test_open(opts);
	static uint8_t buf[32][512];
	struct test_req t[32];
	unsigned done = 0, i, j;

	memset(buf, 0x55, sizeof(buf));
	for (i = 0; i < 32; i++) {
		test_req_init(&t[i], i % 3 ? BLK_OP_READ : BLK_OP_WRITE, i * 4096ull, buf[i], 512, 0,
			      &done);
		assert_int_equal(test_submit(bs, &t[i], &in_submit), 0);
	}
	ram_pump(NULL, loop, &done, 32);
	for (i = 0; i < 32; i++) {
		assert_int_equal(t[i].calls, 1);
		assert_int_equal(t[i].ret, 0);
		assert_false(t[i].saw_in_submit);
		for (j = 0; j < 512; j++) /* read-zeroes=on */
			assert_int_equal(buf[i][j], i % 3 ? 0 : 0x55);
	}
	for (i = 0; i < 10; i++)
		loop_run_once(loop, false);
	for (i = 0; i < 32; i++)
		assert_int_equal(t[i].calls, 1);
	blk_close(bs);
}

static void test_many(void **state)
{
	check_many(*state, "driver=null,size=1G,read-zeroes=on,mode=threads");
	check_many(*state, "driver=null,size=1G,read-zeroes=on,mode=threads,latency-ns=10000");
	check_many(*state, "driver=null,size=1G,read-zeroes=on,latency-ns=10000");
	check_many(*state, "driver=null,size=1G,read-zeroes=on");
}

static void test_truncate(void **state)
{
	struct blk_node *bs = test_open("driver=null,size=1M");
	char buf[512];

	(void)state;
	assert_int_equal(blk_pread(bs, 2 << 20, buf, 512), -EINVAL);
	assert_int_equal(blk_truncate(bs, 4 << 20), 0);
	assert_int_equal(blk_size(bs), 4 << 20);
	assert_int_equal(blk_pread(bs, 2 << 20, buf, 512), 0);
	blk_close(bs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		RAM_TEST(test_options),
		RAM_TEST(test_read_zeroes),
		RAM_TEST(test_block_status_and_ops),
		RAM_TEST(test_latency_timer),
		RAM_TEST(test_latency_threads),
		RAM_TEST(test_many),
		RAM_TEST(test_truncate),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
