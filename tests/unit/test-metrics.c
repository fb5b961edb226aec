/* Unit tests for the Prometheus text of the metrics endpoint (metrics-text.c):
 * counters past what a float keeps, nanoseconds shown as exact seconds,
 * cumulative histogram buckets, and the text buffer.
 * Threading: one loop on the test thread. */
#include "blk-test-ram.h"
#include "block/graph.h"
#include "control/metrics.h"

/* A null node named name, and the statistics slot that a read on this
 * thread filled in. */
static struct blk_stats *named_node(const char *name, struct blk_node **out)
{
	struct blk_node *bs = test_open("driver=null,size=1M");
	char err[128], buf[4096];
	unsigned i = 0;

	assert_int_equal(blk_node_set_name(bs, name, err, sizeof(err)), 0);
	assert_int_equal(blk_pread(bs, 0, buf, sizeof(buf)), 0);
	*out = bs;

	while (i < LOOP_MAX_THREADS - 1 && !bs->stats[i])
		i++;
	assert_non_null(bs->stats[i]);
	return bs->stats[i];
}

static char *render(void)
{
	struct mbuf b = {0};

	metrics_render(&b);
	assert_false(b.oom);
	mbuf_put(&b, "", 1); /* a C string */
	assert_false(b.oom);
	return b.p;
}

static void want_line(const char *text, const char *line)
{
	char buf[512];

	snprintf(buf, sizeof(buf), "\n%s\n", line);
	if (!strstr(text, buf))
		fail_msg("no line '%s' in the metrics", line);
}

/* Values that %g would print with 9 significant digits (1.23456789e+09)
 * come out as every digit: a counter that loses its low digits seems to
 * stand still between scrapes. */
static void test_exact_values(void **state)
{
	struct blk_node *bs;
	struct blk_stats *st = named_node("m0", &bs);
	char *text;

	(void)state;
	st->op[BLK_OP_READ].ops = 12345678901234567ull;
	st->op[BLK_OP_READ].total_ns = 1152921504606846977ull;
	st->throttle_waits = 1234567891;
	st->throttle_wait_ns = 5;
	st->in_flight = 0;
	text = render();
	want_line(text, "ioplane_node_operations_total{node=\"m0\",op=\"read\"} 12345678901234567");
	want_line(text, "ioplane_node_latency_seconds_count{node=\"m0\",op=\"read\"} "
			"12345678901234567");
	want_line(text, "ioplane_node_latency_seconds_sum{node=\"m0\",op=\"read\"} "
			"1152921504.606846977");
	want_line(text, "ioplane_node_throttle_waits_total{node=\"m0\"} 1234567891");
	want_line(text, "ioplane_node_throttle_wait_seconds_total{node=\"m0\"} 0.000000005");
	want_line(text, "ioplane_node_in_flight{node=\"m0\"} 0");
	free(text);
	blk_close(bs);
}

/* Bucket le=2^k ns holds the bins below k: cumulative, ending at +Inf = count. */
static void test_histogram(void **state)
{
	struct blk_node *bs;
	struct blk_op_stats *o = &named_node("h0", &bs)->op[BLK_OP_WRITE];
	char *text;

	(void)state;
	memset(o->hist, 0, sizeof(o->hist));
	o->hist[9] = 3;                    /* [512, 1024) ns: in the first bucket, le=1.024e-06 */
	o->hist[10] = 4;                   /* [1024, 2048) ns: from le=2.048e-06 on */
	o->hist[BLK_HIST_BUCKETS - 1] = 1; /* past the last bucket: only in +Inf */
	o->ops = 8;
	text = render();
	want_line(text, "ioplane_node_latency_seconds_bucket{node=\"h0\",op=\"write\","
			"le=\"1.024e-06\"} 3");
	want_line(text, "ioplane_node_latency_seconds_bucket{node=\"h0\",op=\"write\","
			"le=\"2.048e-06\"} 7");
	want_line(text, "ioplane_node_latency_seconds_bucket{node=\"h0\",op=\"write\","
			"le=\"17.1798692\"} 7");
	want_line(text, "ioplane_node_latency_seconds_bucket{node=\"h0\",op=\"write\","
			"le=\"+Inf\"} 8");
	free(text);
	blk_close(bs);
}

static void test_mbuf(void **state)
{
	struct mbuf b = {0};
	char big[40000];

	(void)state;
	memset(big, 'x', sizeof(big));
	mbuf_put(&b, NULL, 0);
	assert_int_equal(b.len, 0);
	mbuf_printf(&b, "%d-", 42);
	mbuf_put(&b, big, sizeof(big));
	mbuf_printf(&b, "%s", "end");
	assert_false(b.oom);
	assert_int_equal(b.len, 3 + sizeof(big) + 3);
	assert_memory_equal(b.p, "42-x", 4);
	assert_memory_equal(b.p + b.len - 4, "xend", 4);
	assert_true(b.cap > b.len);
	mbuf_free(&b);
	assert_null(b.p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		RAM_TEST(test_exact_values),
		RAM_TEST(test_histogram),
		RAM_TEST(test_mbuf),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
