/* Unit tests for src/block/dirty-bitmap.c: the bit arithmetic (ranges,
 * extents, merges across granularities, counts) and marking from several
 * threads at once, and that writes through blk_submit mark the bitmaps of
 * the node. Threading: the marking test runs four threads. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "block/block.h"
#include "block/dirty-bitmap.h"
#include "loop/loop.h"
#include "util/opts.h"

static void test_set_extent(void **state)
{
	struct blk_dirty_bitmap *bm = blk_dirty_bitmap_new("a", 1000000, 4096);
	bool dirty;

	(void)state;
	assert_non_null(bm);
	assert_int_equal(bm->nbits, (1000000 + 4095) / 4096);
	blk_dirty_bitmap_set(bm, 5000, 1);          /* bit 1 */
	blk_dirty_bitmap_set(bm, 4096 * 64 - 1, 2); /* bits 63, 64: across words */
	assert_true(blk_dirty_bitmap_bit(bm, 1));
	assert_false(blk_dirty_bitmap_bit(bm, 0));
	assert_true(blk_dirty_bitmap_bit(bm, 63) && blk_dirty_bitmap_bit(bm, 64));
	assert_false(blk_dirty_bitmap_bit(bm, 65));
	assert_int_equal(blk_dirty_bitmap_count(bm), 3 * 4096);
	assert_int_equal(blk_dirty_bitmap_extent(bm, 0, 1000000, &dirty), 4096);
	assert_false(dirty);
	assert_int_equal(blk_dirty_bitmap_extent(bm, 4096, 1000000, &dirty), 4096);
	assert_true(dirty);
	assert_int_equal(blk_dirty_bitmap_extent(bm, 8192, 1000000, &dirty), 61 * 4096);
	assert_false(dirty);
	assert_int_equal(blk_dirty_bitmap_extent(bm, 63 * 4096, 1000000, &dirty), 2 * 4096);
	assert_true(dirty);
	/* A run is cut at len, and at the end of the node. */
	assert_int_equal(blk_dirty_bitmap_extent(bm, 65 * 4096, 100, &dirty), 100);
	assert_int_equal(blk_dirty_bitmap_extent(bm, 65 * 4096, 1u << 30, &dirty),
			 1000000 - 65 * 4096);
	/* The whole node; past the end nothing is set. */
	blk_dirty_bitmap_set(bm, 0, 1u << 30);
	assert_int_equal(blk_dirty_bitmap_count(bm), bm->nbits * 4096);
	assert_int_equal(blk_dirty_bitmap_extent(bm, 0, 1000000, &dirty), 1000000);
	assert_true(dirty);
	/* Clearing: the granules touched, across words, within one word. */
	blk_dirty_bitmap_clear(bm, 62 * 4096 + 1, 70 * 4096);
	assert_true(blk_dirty_bitmap_bit(bm, 61));
	assert_false(blk_dirty_bitmap_bit(bm, 62) || blk_dirty_bitmap_bit(bm, 100) ||
		     blk_dirty_bitmap_bit(bm, 132));
	assert_true(blk_dirty_bitmap_bit(bm, 133));
	blk_dirty_bitmap_clear(bm, 4096, 1);
	assert_false(blk_dirty_bitmap_bit(bm, 1));
	assert_true(blk_dirty_bitmap_bit(bm, 0) && blk_dirty_bitmap_bit(bm, 2));
	assert_int_equal(blk_dirty_bitmap_count(bm), (bm->nbits - 72) * 4096);
	blk_dirty_bitmap_reset_all(bm);
	assert_int_equal(blk_dirty_bitmap_count(bm), 0);
	blk_dirty_bitmap_free(bm);
}

static void test_merge_granularities(void **state)
{
	struct blk_dirty_bitmap *fine = blk_dirty_bitmap_new("f", 1 << 20, 512);
	struct blk_dirty_bitmap *coarse = blk_dirty_bitmap_new("c", 1 << 20, 65536);
	struct blk_dirty_bitmap *same = blk_dirty_bitmap_new("s", 1 << 20, 512);
	bool dirty;

	(void)state;
	blk_dirty_bitmap_set(fine, 70000, 512); /* in the second 64 KiB */
	blk_dirty_bitmap_set(fine, 900000, 1);  /* in the 14th */
	blk_dirty_bitmap_merge(coarse, fine);
	assert_int_equal(blk_dirty_bitmap_count(coarse), 2 * 65536);
	assert_true(blk_dirty_bitmap_bit(coarse, 1) && blk_dirty_bitmap_bit(coarse, 13));
	/* Coarse into fine: every 512-byte bit under the 64 KiB ones. */
	blk_dirty_bitmap_merge(same, coarse);
	assert_int_equal(blk_dirty_bitmap_count(same), 2 * 65536);
	assert_int_equal(blk_dirty_bitmap_extent(same, 65536, 1 << 20, &dirty), 65536);
	assert_true(dirty);
	/* Same granularity: word by word. */
	blk_dirty_bitmap_reset_all(coarse);
	blk_dirty_bitmap_merge(fine, same);
	assert_int_equal(blk_dirty_bitmap_count(fine), 2 * 65536);
	blk_dirty_bitmap_free(fine);
	blk_dirty_bitmap_free(coarse);
	blk_dirty_bitmap_free(same);
}

struct marker {
	struct blk_dirty_bitmap *bm;
	unsigned id;
};

/* Each thread sets every fourth bit, in words every thread writes to. */
static void *mark_thread(void *arg)
{
	struct marker *m = arg;

	for (uint64_t b = m->id; b < m->bm->nbits; b += 4)
		blk_dirty_bitmap_set(m->bm, b * 512, 512);
	return NULL;
}

static void test_threads(void **state)
{
	struct blk_dirty_bitmap *bm = blk_dirty_bitmap_new("t", 64 << 20, 512);
	struct marker m[4];
	pthread_t t[4];

	(void)state;
	for (unsigned i = 0; i < 4; i++) {
		m[i] = (struct marker){bm, i};
		assert_int_equal(pthread_create(&t[i], NULL, mark_thread, &m[i]), 0);
	}
	for (unsigned i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	/* Not a bit lost to a concurrent read-modify-write. */
	assert_int_equal(blk_dirty_bitmap_count(bm), 64 << 20);
	blk_dirty_bitmap_free(bm);
}

/* Writes, write-zeroes and discards to a node mark its enabled bitmaps;
 * reads and disabled bitmaps do not. */
static void test_node_marks(void **state)
{
	struct kv_opts o = {0};
	struct blk_node *bs;
	struct blk_dirty_bitmap *on, *off, *short_bm;
	struct blk_request req;
	struct loop *loop;
	char err[256], buf[4096] = {0};

	(void)state;
	assert_int_equal(loop_new(NULL, &loop), 0);
	loop_bind_current(loop);
	assert_int_equal(kv_parse(&o, "driver=null,size=16M,read-zeroes=on", NULL), 0);
	assert_int_equal(blk_open(&o, &bs, err, sizeof(err)), 0);
	kv_free(&o);
	on = blk_dirty_bitmap_new("on", blk_size(bs), 65536);
	off = blk_dirty_bitmap_new("off", blk_size(bs), 65536);
	blk_dirty_bitmap_enable(off, false);
	blk_dirty_bitmap_link(bs, on);
	blk_dirty_bitmap_link(bs, off);
	assert_ptr_equal(blk_dirty_bitmap_find(bs, "off"), off);
	assert_int_equal(blk_pwrite(bs, 4096, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_pread(bs, 1 << 20, buf, sizeof(buf)), 0);
	memset(&req, 0, sizeof(req));
	req.op = BLK_OP_WRITE_ZEROES;
	req.offset = 2 << 20;
	req.len = 65537;
	assert_int_equal(blk_do_sync(bs, &req), 0);
	memset(&req, 0, sizeof(req));
	req.op = BLK_OP_DISCARD;
	req.offset = 8 << 20;
	req.len = 1;
	assert_int_equal(blk_do_sync(bs, &req), 0);
	assert_true(blk_dirty_bitmap_bit(on, 0));
	assert_false(blk_dirty_bitmap_bit(on, 16)); /* the read */
	assert_true(blk_dirty_bitmap_bit(on, 32) && blk_dirty_bitmap_bit(on, 33));
	assert_true(blk_dirty_bitmap_bit(on, 128));
	assert_int_equal(blk_dirty_bitmap_count(on), 4 * 65536);
	assert_int_equal(blk_dirty_bitmap_count(off), 0);
	/* Enabled again, it records; a zero-length write marks nothing; a
	 * bitmap shorter than the node takes what falls inside it. */
	blk_dirty_bitmap_enable(off, true);
	assert_int_equal(blk_pwrite(bs, 4096, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_dirty_bitmap_count(off), 65536);
	blk_dirty_mark(bs, (5 << 20) + 512, 0);
	assert_false(blk_dirty_bitmap_bit(on, 80));
	short_bm = blk_dirty_bitmap_new("short", 1 << 20, 65536);
	blk_dirty_bitmap_link(bs, short_bm);
	assert_int_equal(blk_pwrite(bs, 4 << 20, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_pwrite(bs, 65536, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_dirty_bitmap_count(short_bm), 65536);
	assert_true(blk_dirty_bitmap_bit(short_bm, 1) && blk_dirty_bitmap_bit(on, 64));
	blk_dirty_bitmap_unlink(bs, short_bm);
	blk_dirty_bitmap_free(short_bm);
	assert_int_equal(blk_dirty_bitmap_count(on), 6 * 65536);
	blk_dirty_bitmap_enable(off, false);
	/* The node grows: the bitmaps follow, the new part clean, and a write
	 * there is recorded (not clamped away). */
	assert_int_equal(blk_truncate(bs, 64 << 20), 0);
	assert_int_equal(on->nbits, 1024);
	assert_int_equal(blk_dirty_bitmap_count(on), 6 * 65536);
	blk_dirty_mark(bs, 60 << 20, 4096);
	assert_true(blk_dirty_bitmap_bit(on, 960));
	/* Shrinks: the bits past the end go. */
	assert_int_equal(blk_truncate(bs, 2 << 20), 0);
	assert_int_equal(blk_dirty_bitmap_count(on), 2 * 65536);
	blk_dirty_bitmap_unlink(bs, off);
	blk_dirty_bitmap_free(off);
	blk_close(bs); /* frees "on" */
	loop_bind_current(NULL);
	loop_free(loop);
}

/* A bitmap on a node below a format node or a filter records the writes
 * forwarded to it (as QEMU's do): a raw node over null, a throttle-free
 * forward path that skips the child's checks. */
static void test_forwarded_marks(void **state)
{
	struct kv_opts o = {0};
	struct blk_node *bs, *file;
	struct blk_dirty_bitmap *bm;
	struct loop *loop;
	char err[256], buf[4096] = {0};

	(void)state;
	assert_int_equal(loop_new(NULL, &loop), 0);
	loop_bind_current(loop);
	assert_int_equal(kv_parse(&o, "driver=null,size=16M,read-zeroes=on,format=raw", NULL), 0);
	assert_int_equal(blk_open(&o, &bs, err, sizeof(err)), 0);
	kv_free(&o);
	file = bs->next;
	assert_non_null(file);
	bm = blk_dirty_bitmap_new("below", blk_size(file), 65536);
	blk_dirty_bitmap_link(file, bm);
	assert_int_equal(blk_pwrite(bs, 3 << 20, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_pread(bs, 5 << 20, buf, sizeof(buf)), 0);
	assert_true(blk_dirty_bitmap_bit(bm, 48));
	assert_int_equal(blk_dirty_bitmap_count(bm), 65536); /* not the read */
	blk_close(bs);                                       /* frees the bitmap with its node */
	loop_bind_current(NULL);
	loop_free(loop);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_set_extent),      cmocka_unit_test(test_merge_granularities),
		cmocka_unit_test(test_threads),         cmocka_unit_test(test_node_marks),
		cmocka_unit_test(test_forwarded_marks),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
