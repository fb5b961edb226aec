/* Unit tests for the raw format driver: windows onto a RAM child, window
 * checks, pass-through of capabilities and truncate, raw over null.
 * Threading: one loop on the test thread. */
#include "blk-test-ram.h"

static void fill(uint8_t *p, size_t n, unsigned seed)
{
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 31 + seed);
}

static void test_window_io(void **state)
{
	struct blk_node *bs = test_open("driver=ram,ram-size=1M,format=raw,offset=64K,size=256K");
	struct ram_dev *d = ram_last;
	static uint8_t w[8192], r[8192];
	struct test_req t;
	unsigned n;

	(void)state;
	assert_string_equal(bs->drv->name, "raw");
	assert_int_equal(blk_size(bs), 256 << 10);
	fill(w, sizeof(w), 1);
	/* start of the window lands at child offset 64K */
	assert_int_equal(blk_pwrite(bs, 0, w, 4096, 0), 0);
	assert_memory_equal(d->ram.data + (64 << 10), w, 4096);
	assert_int_equal(d->log[0].off, 64 << 10);
	/* last bytes of the window */
	fill(w, sizeof(w), 2);
	assert_int_equal(blk_pwrite(bs, (256 << 10) - 8192, w, 8192, 0), 0);
	assert_memory_equal(d->ram.data + (320 << 10) - 8192, w, 8192);
	assert_int_equal(d->ram.data[320 << 10], 0); /* nothing past the window */
	/* reads come from the right place; the request's offset is restored */
	fill(d->ram.data + (64 << 10) + 1000, 3000, 3);
	test_req_init(&t, BLK_OP_READ, 1000, r, 3000, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_memory_equal(r, d->ram.data + (64 << 10) + 1000, 3000);
	assert_int_equal(t.req.offset, 1000);
	/* other ops are moved too */
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 4096, NULL, 4096, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(d->log[d->nlog - 1].off, (64 << 10) + 4096);
	assert_int_equal(t.req.offset, 4096);
	test_req_init(&t, BLK_OP_DISCARD, 8192, NULL, 4096, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(d->log[d->nlog - 1].off, (64 << 10) + 8192);
	/* block-status is clamped at the window's end */
	test_req_init(&t, BLK_OP_BLOCK_STATUS, (256 << 10) - 512, NULL, 1 << 20, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(t.req.status_len, 512);
	assert_int_equal(d->log[d->nlog - 1].off, (320 << 10) - 512);
	/* out of the window: rejected, the child never sees it */
	n = d->nlog;
	assert_int_equal(blk_pwrite(bs, (256 << 10) - 512, w, 1024, 0), -EINVAL);
	assert_int_equal(blk_pread(bs, 256 << 10, r, 1), -EINVAL);
	assert_int_equal(d->nlog, n);
	assert_int_equal(blk_truncate(bs, 128 << 10), -ENOTSUP);
	blk_close(bs);
}

/* A failing child request comes back with its offset restored. */
static void test_error_restores_offset(void **state)
{
	struct blk_node *bs;
	static uint8_t buf[4096];
	struct test_req t;

	(void)state;
	ram_cfg.fail_op = BLK_OP_READ;
	ram_cfg.fail_ret = -EIO;
	bs = test_open("driver=ram,ram-size=1M,format=raw,offset=4096");
	assert_int_equal(blk_size(bs), (1 << 20) - 4096);
	test_req_init(&t, BLK_OP_READ, 512, buf, 512, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), -EIO);
	assert_int_equal(t.req.offset, 512);
	assert_int_equal(ram_last->log[0].off, 4096 + 512);
	blk_close(bs);
}

static void test_window_checks(void **state)
{
	char err[256];

	(void)state;
	assert_int_equal(test_open_fail("driver=ram,ram-size=1M,format=raw,offset=2M", err,
					sizeof(err)), -EINVAL);
	assert_int_equal(test_open_fail("driver=ram,ram-size=1M,format=raw,offset=512K,size=768K",
					err, sizeof(err)), -EINVAL);
	assert_int_equal(test_open_fail("driver=ram,ram-size=1M,format=raw,size=2M", err,
					sizeof(err)), -EINVAL);
	assert_int_equal(test_open_fail("driver=ram,ram-size=1M,format=raw,offset=x", err,
					sizeof(err)), -EINVAL);
	ram_cfg.align = 4096;
	assert_int_equal(test_open_fail("driver=ram,ram-size=1M,format=raw,offset=512", err,
					sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "4096"));
	assert_int_equal(test_open_fail("driver=ram,ram-size=1M,format=raw,size=1000", err,
					sizeof(err)), -EINVAL);
	/* edge windows: empty at the end, the whole child */
	blk_close(test_open("driver=ram,ram-size=1M,format=raw,offset=1M,size=0"));
	blk_close(test_open("driver=ram,ram-size=1M,format=raw,offset=0,size=1M"));
}

static void test_passthrough(void **state)
{
	struct blk_node *bs;

	(void)state;
	ram_cfg.no_discard = true;
	ram_cfg.no_fua = true;
	ram_cfg.align = 512;
	ram_cfg.mem_align = 4096;
	bs = test_open("driver=ram,ram-size=1M,format=raw");
	assert_false(blk_can_discard(bs));
	assert_false(blk_can_fua(bs));
	assert_true(blk_can_write_zeroes(bs));
	assert_false(blk_can_multi_conn(bs));
	assert_int_equal(bs->align, 512);
	assert_int_equal(bs->mem_align, 4096);
	/* no window: truncate goes to the child */
	assert_int_equal(blk_truncate(bs, 2 << 20), 0);
	assert_int_equal(blk_size(bs), 2 << 20);
	assert_int_equal(blk_size(bs->next), 2 << 20);
	blk_close(bs);

	bs = test_open("driver=null,size=1M,format=raw");
	assert_true(blk_can_multi_conn(bs));
	assert_int_equal(blk_size(bs), 1 << 20);
	blk_close(bs);
}

/* Alignment inherited from the child is handled at the raw node, and the
 * misaligned pieces land at the right child offsets. */
static void test_window_align(void **state)
{
	struct blk_node *bs;
	struct ram_dev *d;
	static uint8_t w[5000], r[5000];

	(void)state;
	ram_cfg.align = 4096;
	bs = test_open("driver=ram,ram-size=1M,format=raw,offset=8K,size=64K");
	d = ram_last;
	memset(d->ram.data, 0x11, 1 << 20);
	fill(w, sizeof(w), 9);
	assert_int_equal(blk_pwrite(bs, 3000, w, sizeof(w), 0), 0);
	assert_memory_equal(d->ram.data + 8192 + 3000, w, sizeof(w));
	assert_int_equal(d->ram.data[8192 + 2999], 0x11);
	assert_int_equal(d->ram.data[8192 + 8000], 0x11);
	assert_int_equal(d->misaligned, 0);
	assert_int_equal(blk_pread(bs, 3000, r, sizeof(r)), 0);
	assert_memory_equal(r, w, sizeof(w));
	blk_close(bs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		RAM_TEST(test_window_io),
		RAM_TEST(test_error_restores_offset),
		RAM_TEST(test_window_checks),
		RAM_TEST(test_passthrough),
		RAM_TEST(test_window_align),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
