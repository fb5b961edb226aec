/* Unit tests for the copy state (src/block/block-copy.c): claims never
 * overlap what is in flight, a guest write waits for an overlapping copy and
 * is woken when it ends, failed copies are to copy again, write-blocking
 * writes clear only granules they cover wholly; and the copy-before-write
 * filter (src/block/cbw.c) on ram nodes: the target keeps the data as it
 * was when the filter was opened, once per granule.
 * Threading: one loop on the test thread. */
#include "blk-test-ram.h"
#include "block/block-copy.h"
#include "block/cbw.h"
#include "block/dirty-bitmap.h"
#include "block/graph.h"
#include "util/compiler.h"

#define G 65536u

struct wake_count {
	struct bcopy_waiter w;
	int woken;
};

static void count_wake(struct bcopy_waiter *w)
{
	container_of(w, struct wake_count, w)->woken++;
}

static void test_claim_next(void **state)
{
	struct bcopy s;
	struct bcopy_range a, b, c, d;

	(void)state;
	assert_int_equal(bcopy_init(&s, 10 * G + 100, G, true), 0);
	assert_int_equal(bcopy_remaining(&s), 11ull * G);
	assert_true(bcopy_claim_next(&s, 0, 4 * G, &a));
	assert_int_equal(a.lo, 0);
	assert_int_equal(a.hi, 4 * G);
	/* The next claim starts past the first, even from 0. */
	assert_true(bcopy_claim_next(&s, 0, 4 * G, &b));
	assert_int_equal(b.lo, 4 * G);
	assert_int_equal(b.hi, 8 * G);
	/* The last run is cut at the size. */
	assert_true(bcopy_claim_next(&s, 0, 4 * G, &c));
	assert_int_equal(c.lo, 8 * G);
	assert_int_equal(c.hi, 10 * G + 100);
	assert_false(bcopy_claim_next(&s, 0, 4 * G, &c));
	assert_int_equal(bcopy_remaining(&s), 0);
	/* A write marks granule 1 again while a is in flight: it is not
	 * claimable until a ends (two copies of one granule in flight could
	 * land in the wrong order). */
	bcopy_mark(&s, G + 5, 10);
	assert_false(bcopy_claim_next(&s, 0, 4 * G, &d));
	bcopy_end(&s, &a, 0);
	assert_true(bcopy_claim_next(&s, 0, 4 * G, &d));
	assert_int_equal(d.lo, G);
	assert_int_equal(d.hi, 2 * G);
	/* A failed copy is to copy again. */
	bcopy_end(&s, &b, -EIO);
	assert_int_equal(bcopy_remaining(&s), 4ull * G);
	assert_int_equal(s.error, -EIO);
	bcopy_end(&s, &c, 0);
	assert_true(bcopy_busy(&s));
	bcopy_end(&s, &d, 0);
	assert_false(bcopy_busy(&s));
	bcopy_destroy(&s);
}

static void test_claim_in_waits(void **state)
{
	struct bcopy s;
	struct bcopy_range bg, r;
	struct wake_count wc = {.w.wake = count_wake};

	(void)state;
	assert_int_equal(bcopy_init(&s, 8 * G, G, true), 0);
	/* Nothing but granules 2..3 is left to copy. */
	bcopy_skip(&s, 0, 2 * G);
	bcopy_skip(&s, 4 * G, 4 * G);
	/* A write to copied data goes at once. */
	assert_int_equal(bcopy_claim_in(&s, 100, 4096, G, &r, &wc.w), 0);
	/* A write over granule 2 claims it (at most max bytes at a time). */
	assert_int_equal(bcopy_claim_in(&s, G + 10, 2 * G, G, &r, &wc.w), 1);
	assert_int_equal(r.lo, 2 * G);
	assert_int_equal(r.hi, 3 * G);
	/* The background copy skips what is in flight and takes granule 3. */
	assert_true(bcopy_claim_next(&s, 0, 8 * G, &bg));
	assert_int_equal(bg.lo, 3 * G);
	/* Another write over granule 3 waits for the background copy. */
	assert_int_equal(bcopy_claim_in(&s, 3 * G + 1, 1, G, &r, &wc.w), -EAGAIN);
	assert_int_equal(wc.woken, 0);
	bcopy_end(&s, &bg, 0);
	assert_int_equal(wc.woken, 1);
	assert_int_equal(bcopy_claim_in(&s, 3 * G + 1, 1, G, &bg, &wc.w), 0);
	/* A range past the end needs nothing. */
	assert_int_equal(bcopy_claim_in(&s, 9 * G, 1, G, &bg, &wc.w), 0);
	bcopy_end(&s, &r, 0);
	assert_int_equal(bcopy_remaining(&s), 0);
	bcopy_destroy(&s);
}

static void test_write_blocking(void **state)
{
	struct bcopy s;
	struct bcopy_range w1, w2, cp;
	struct wake_count wc = {.w.wake = count_wake};

	(void)state;
	assert_int_equal(bcopy_init(&s, 8 * G, G, true), 0);
	/* A write over granules 1 (part), 2, 3 (whole) and 4 (part). */
	assert_int_equal(bcopy_write_begin(&s, G + 512, 3 * G, &w1, &wc.w), 0);
	/* The background copy keeps off it... */
	assert_true(bcopy_claim_next(&s, G, 8 * G, &cp));
	assert_int_equal(cp.lo, 5 * G);
	/* ... and an overlapping write waits. */
	assert_int_equal(bcopy_write_begin(&s, 4 * G, 10, &w2, &wc.w), -EAGAIN);
	bcopy_end(&s, &w1, 0);
	assert_int_equal(wc.woken, 1);
	/* Only the wholly covered granules 2 and 3 are clean now. */
	assert_true(blk_dirty_bitmap_bit(s.todo, 1));
	assert_false(blk_dirty_bitmap_bit(s.todo, 2));
	assert_false(blk_dirty_bitmap_bit(s.todo, 3));
	assert_true(blk_dirty_bitmap_bit(s.todo, 4));
	/* A write that failed on the target clears nothing. */
	assert_int_equal(bcopy_write_begin(&s, 0, G, &w2, &wc.w), 0);
	bcopy_end(&s, &w2, -EIO);
	assert_true(blk_dirty_bitmap_bit(s.todo, 0));
	assert_int_equal(s.error, 0); /* a write's failure is not a copy's */
	bcopy_end(&s, &cp, 0);
	bcopy_destroy(&s);
}

static struct blk_node *open_cbw(struct blk_node *src, struct blk_node *tgt, const char *extra)
{
	struct blk_child c = {.role = BLK_ROLE_TARGET, .node = tgt};
	struct kv_opts o = {0};
	struct blk_node *bs = NULL;
	char err[256] = "";

	assert_int_equal(kv_parse(&o, extra, NULL), 0);
	blk_ref(src, NULL);
	blk_ref(tgt, NULL);
	if (blk_open_node("copy-before-write", src, &c, 1, &o, &bs, err, sizeof(err)))
		fprintf(stderr, "open cbw: %s\n", err);
	kv_free(&o);
	return bs;
}

static void test_cbw_filter(void **state)
{
	struct blk_node *src = test_open("driver=ram,ram-size=1M");
	struct blk_node *tgt = test_open("driver=ram,ram-size=1M");
	struct blk_node *small = test_open("driver=ram,ram-size=512K");
	struct blk_node *cbw;
	uint8_t *buf = malloc(1 << 20);
	struct bcopy *bc;

	(void)state;
	memset(buf, 0xa1, 1 << 20);
	assert_int_equal(blk_pwrite(src, 0, buf, 1 << 20, 0), 0);
	assert_null(open_cbw(src, small, ""));
	cbw = open_cbw(src, tgt, "");
	assert_non_null(cbw);
	bc = cbw_copy_state(cbw);
	assert_non_null(bc);
	assert_null(cbw_copy_state(src));
	assert_int_equal(bcopy_remaining(bc), 1u << 20);
	/* A write to granule 2: the old data goes to the target first. */
	memset(buf, 0xb2, 4096);
	assert_int_equal(blk_pwrite(cbw, 2 * G + 4096, buf, 4096, 0), 0);
	assert_int_equal(bcopy_remaining(bc), (1u << 20) - G);
	assert_int_equal(blk_pread(tgt, 2 * G, buf, G), 0);
	assert_true(all_bytes(buf, G, 0xa1));
	assert_int_equal(blk_pread(cbw, 2 * G + 4096, buf, 4096), 0);
	assert_true(all_bytes(buf, 4096, 0xb2));
	/* The same granule again: not copied again, the target keeps the
	 * point in time. */
	memset(buf, 0xc3, G);
	assert_int_equal(blk_pwrite(cbw, 2 * G, buf, G, 0), 0);
	assert_int_equal(blk_pread(tgt, 2 * G, buf, G), 0);
	assert_true(all_bytes(buf, G, 0xa1));
	/* Nothing else reached the target. */
	assert_int_equal(blk_pread(tgt, 0, buf, 2 * G), 0);
	assert_true(all_bytes(buf, 2 * G, 0));
	blk_close(cbw);
	blk_close(src);
	blk_close(tgt);
	blk_close(small);
	free(buf);
}

/* A copy that fails: break-guest-write fails the guest's write and leaves
 * the source as it was; break-snapshot gives the target up and lets the
 * write (and every later one) go. */
static void test_cbw_errors(void **state)
{
	struct blk_node *src = test_open("driver=ram,ram-size=1M"), *tgt, *cbw;
	uint8_t buf[4096];
	struct bcopy *bc;

	(void)state;
	memset(buf, 0xa1, sizeof(buf));
	assert_int_equal(blk_pwrite(src, 0, buf, sizeof(buf), 0), 0);
	ram_cfg.fail_op = BLK_OP_WRITE;
	ram_cfg.fail_ret = -EIO;
	tgt = test_open("driver=ram,ram-size=1M");
	ram_reset_config();
	cbw = open_cbw(src, tgt, "");
	memset(buf, 0xb2, sizeof(buf));
	assert_int_equal(blk_pwrite(cbw, 0, buf, sizeof(buf), 0), -EIO);
	assert_int_equal(blk_pread(src, 0, buf, sizeof(buf)), 0);
	assert_true(all_bytes(buf, sizeof(buf), 0xa1));
	bc = cbw_copy_state(cbw);
	assert_int_equal(bcopy_remaining(bc), 1u << 20); /* still to copy */
	blk_close(cbw);
	cbw = open_cbw(src, tgt, "on-cbw-error=break-snapshot");
	memset(buf, 0xc3, sizeof(buf));
	assert_int_equal(blk_pwrite(cbw, 0, buf, sizeof(buf), 0), 0);
	bc = cbw_copy_state(cbw);
	assert_true(bc->broken);
	assert_int_equal(bc->error, -EIO);
	assert_int_equal(blk_pwrite(cbw, 8192, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_pread(src, 8192, buf, sizeof(buf)), 0);
	assert_true(all_bytes(buf, sizeof(buf), 0xc3));
	blk_close(cbw);
	blk_close(src);
	blk_close(tgt);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_claim_next),
		cmocka_unit_test(test_claim_in_waits),
		cmocka_unit_test(test_write_blocking),
		RAM_TEST(test_cbw_filter),
		RAM_TEST(test_cbw_errors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
