/* Unit tests for the block core: validation, completion contract, statistics,
 * core emulations (discard, write-zeroes, FUA, block-status), options,
 * registry and helpers. Threading: one loop on the test thread. */
#include "blk-test-ram.h"
#include "block/block-int.h"

static bool in_submit;

/* Submit a request expected to fail with `err`; its callback must never run. */
static void expect_fail(struct blk_node *bs, struct test_req *t, int err)
{
	assert_int_equal(test_submit(bs, t, &in_submit), err);
	loop_run_once(loop_current(), false);
	loop_run_once(loop_current(), false);
	assert_int_equal(t->calls, 0);
}

static void test_validation(void **state)
{
	struct blk_node *bs = test_open("driver=ram,ram-size=1M");
	struct blk_node *ro = test_open("driver=ram,ram-size=1M,read-only=on");
	static char buf[8192];
	struct test_req t;
	struct iovec two[2] = { { buf, 4096 }, { buf + 4096, 4096 } };

	(void)state;
	test_req_init(&t, 99, 0, NULL, 0, 0, NULL);
	expect_fail(bs, &t, -EINVAL); /* unknown op */
	test_req_init(&t, BLK_OP__COUNT, 0, NULL, 0, 0, NULL);
	expect_fail(bs, &t, -EINVAL);
	/* flags not allowed for the op */
	test_req_init(&t, BLK_OP_READ, 0, buf, 512, BLK_F_FUA, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_WRITE, 0, buf, 512, BLK_F_MAY_UNMAP, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_WRITE, 0, buf, 512, BLK_F_NO_FALLBACK, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_WRITE, 0, buf, 512, 1u << 7, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_FLUSH, 0, NULL, 0, BLK_F_FUA, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_DISCARD, 0, NULL, 512, BLK_F_MAY_UNMAP, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 0, NULL, 512, 1u << 5, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_BLOCK_STATUS, 0, NULL, 512, BLK_F_FUA, NULL);
	expect_fail(bs, &t, -EINVAL);
	/* range */
	test_req_init(&t, BLK_OP_READ, (1 << 20) - 512, buf, 1024, 0, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_WRITE, UINT64_MAX - 100, buf, 512, 0, NULL);
	expect_fail(bs, &t, -EINVAL); /* offset + len wraps */
	test_req_init(&t, BLK_OP_DISCARD, 1 << 20, NULL, 1, 0, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_WRITE_ZEROES, UINT64_MAX, NULL, 2, 0, NULL);
	expect_fail(bs, &t, -EINVAL);
	/* iovec total != len */
	test_req_init(&t, BLK_OP_READ, 0, buf, 4096, 0, NULL);
	t.req.len = 8192;
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_WRITE, 0, buf, 4096, 0, NULL);
	t.req.iov = two;
	t.req.iovcnt = 2;
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_WRITE, 0, buf, 4096, 0, NULL);
	t.req.iovcnt = -1;
	expect_fail(bs, &t, -EINVAL);
	/* block-status */
	test_req_init(&t, BLK_OP_BLOCK_STATUS, 0, NULL, 0, 0, NULL);
	expect_fail(bs, &t, -EINVAL);
	test_req_init(&t, BLK_OP_BLOCK_STATUS, 1 << 20, NULL, 512, 0, NULL);
	expect_fail(bs, &t, -EINVAL);
	/* read-only */
	test_req_init(&t, BLK_OP_WRITE, 0, buf, 512, 0, NULL);
	expect_fail(ro, &t, -EROFS);
	test_req_init(&t, BLK_OP_DISCARD, 0, NULL, 512, 0, NULL);
	expect_fail(ro, &t, -EROFS);
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 0, NULL, 512, 0, NULL);
	expect_fail(ro, &t, -EROFS);
	assert_int_equal(blk_pread(ro, 0, buf, 512), 0);
	assert_int_equal(blk_flush_sync(ro), 0);
	assert_int_equal(blk_truncate(ro, 4096), -EROFS);
	/* two iovecs adding up is fine */
	test_req_init(&t, BLK_OP_WRITE, 0, buf, 8192, 0, NULL);
	t.req.iov = two;
	t.req.iovcnt = 2;
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	blk_close(bs);
	blk_close(ro);
}

static void test_wz_no_fallback(void **state)
{
	struct blk_node *bs;
	struct test_req t;

	(void)state;
	ram_cfg.no_wz = true;
	bs = test_open("driver=ram,ram-size=1M");
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 0, NULL, 4096, BLK_F_NO_FALLBACK, NULL);
	expect_fail(bs, &t, -ENOTSUP);
	assert_int_equal(ram_last->nlog, 0);
	blk_close(bs);
}

static void test_block_status_clamp(void **state)
{
	struct blk_node *bs = test_open("driver=ram,ram-size=1M");
	struct test_req t;

	(void)state;
	test_req_init(&t, BLK_OP_BLOCK_STATUS, (1 << 20) - 100, NULL, 1000, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(t.req.len, 100);
	assert_int_equal(t.req.status_len, 100);
	assert_int_equal(ram_last->log[0].len, 100);
	blk_close(bs);
}

/* Zero-length requests succeed, later, without the driver. */
static void test_zero_length(void **state)
{
	struct blk_node *bs = test_open("driver=ram,ram-size=1M");
	static const uint8_t ops[] = { BLK_OP_READ, BLK_OP_WRITE, BLK_OP_DISCARD,
				       BLK_OP_WRITE_ZEROES };
	struct test_req t[4];
	unsigned done = 0, i;
	char buf[1];

	for (i = 0; i < 4; i++) {
		test_req_init(&t[i], ops[i], 4096, buf, 0, 0, &done);
		assert_int_equal(test_submit(bs, &t[i], &in_submit), 0);
	}
	assert_int_equal(done, 0);
	ram_pump(NULL, *state, &done, 4);
	for (i = 0; i < 4; i++) {
		assert_int_equal(t[i].calls, 1);
		assert_int_equal(t[i].ret, 0);
		assert_false(t[i].saw_in_submit);
	}
	assert_int_equal(ram_last->nlog, 0);
	blk_close(bs);
}

/* Every request completes exactly once, never inside blk_submit(), in order
 * for a driver that completes at the end of the round. */
static void test_exactly_once(void **state)
{
	struct blk_node *bs = test_open("driver=null,size=1G");
	static char buf[64][512];
	struct test_req t[64];
	unsigned done = 0, i, r;

	for (r = 0; r < 3; r++) {
		done = 0;
		for (i = 0; i < 64; i++) {
			test_req_init(&t[i], i % 2 ? BLK_OP_WRITE : BLK_OP_READ, i * 512ull,
				      buf[i], 512, 0, &done);
			assert_int_equal(test_submit(bs, &t[i], &in_submit), 0);
		}
		assert_int_equal(done, 0);
		ram_pump(NULL, *state, &done, 64);
		for (i = 0; i < 20; i++)
			loop_run_once(*state, false);
		for (i = 0; i < 64; i++) {
			assert_int_equal(t[i].calls, 1);
			assert_int_equal(t[i].ret, 0);
			assert_false(t[i].saw_in_submit);
			assert_int_equal(t[i].order, i);
		}
	}
	blk_close(bs);
}

static uint64_t hist_sum(const struct blk_op_stats *o)
{
	uint64_t n = 0;
	unsigned i;

	for (i = 0; i < BLK_HIST_BUCKETS; i++)
		n += o->hist[i];
	return n;
}

static void test_stats(void **state)
{
	struct blk_node *bs;
	struct blk_stats st;
	static char buf[8192];
	struct test_req t[3];
	unsigned done = 0, i;

	ram_cfg.hold = true;
	bs = test_open("driver=ram,ram-size=1M");
	for (i = 0; i < 3; i++) {
		test_req_init(&t[i], BLK_OP_READ, 0, buf, 4096, 0, &done);
		assert_int_equal(blk_submit(bs, &t[i].req), 0);
	}
	blk_get_stats(bs, &st);
	assert_int_equal(st.in_flight, 3);
	assert_int_equal(st.op[BLK_OP_READ].ops, 0);
	ram_pump(ram_last, *state, &done, 3);
	blk_get_stats(bs, &st);
	assert_int_equal(st.in_flight, 0);
	assert_int_equal(st.op[BLK_OP_READ].ops, 3);
	assert_int_equal(st.op[BLK_OP_READ].bytes, 3 * 4096);
	assert_int_equal(st.op[BLK_OP_READ].errors, 0);
	assert_int_equal(hist_sum(&st.op[BLK_OP_READ]), 3);

	/* errors: counted, no bytes */
	ram_last->cfg.fail_op = BLK_OP_WRITE;
	ram_last->cfg.fail_ret = -EIO;
	ram_last->cfg.hold = false;
	assert_int_equal(blk_pwrite(bs, 0, buf, 8192, 0), -EIO);
	assert_int_equal(blk_flush_sync(bs), 0);
	blk_get_stats(bs, &st);
	assert_int_equal(st.op[BLK_OP_WRITE].ops, 1);
	assert_int_equal(st.op[BLK_OP_WRITE].errors, 1);
	assert_int_equal(st.op[BLK_OP_WRITE].bytes, 0);
	assert_int_equal(hist_sum(&st.op[BLK_OP_WRITE]), 1);
	assert_int_equal(st.op[BLK_OP_FLUSH].ops, 1);
	assert_int_equal(st.op[BLK_OP_READ].ops, 3);
	assert_int_equal(st.op[BLK_OP_DISCARD].ops, 0);
	/* rejected requests are not counted */
	test_req_init(&t[0], BLK_OP_READ, 1 << 20, buf, 512, 0, NULL);
	assert_int_equal(blk_submit(bs, &t[0].req), -EINVAL);
	blk_get_stats(bs, &st);
	assert_int_equal(st.op[BLK_OP_READ].ops, 3);
	blk_close(bs);
}

static void test_hist_and_names(void **state)
{
	(void)state;
	assert_int_equal(blk_hist_bucket(0), 0);
	assert_int_equal(blk_hist_bucket(1), 0);
	assert_int_equal(blk_hist_bucket(2), 1);
	assert_int_equal(blk_hist_bucket(1023), 9);
	assert_int_equal(blk_hist_bucket(1024), 10);
	assert_int_equal(blk_hist_bucket(30000), 14);
	assert_int_equal(blk_hist_bucket(UINT64_MAX), BLK_HIST_BUCKETS - 1);
	assert_string_equal(blk_op_name(BLK_OP_READ), "read");
	assert_string_equal(blk_op_name(BLK_OP_WRITE), "write");
	assert_string_equal(blk_op_name(BLK_OP_FLUSH), "flush");
	assert_string_equal(blk_op_name(BLK_OP_DISCARD), "discard");
	assert_string_equal(blk_op_name(BLK_OP_WRITE_ZEROES), "write-zeroes");
	assert_string_equal(blk_op_name(BLK_OP_BLOCK_STATUS), "block-status");
	assert_string_equal(blk_op_name((enum blk_op)42), "unknown");
}

static void test_discard(void **state)
{
	struct blk_node *bs;
	struct test_req t;

	(void)state;
	/* driver without discard: success, driver untouched */
	ram_cfg.no_discard = true;
	bs = test_open("driver=ram,ram-size=1M");
	test_req_init(&t, BLK_OP_DISCARD, 0, NULL, 4096, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(ram_last->nlog, 0);
	assert_false(blk_can_discard(bs));
	blk_close(bs);
	/* discard=ignore */
	ram_reset_config();
	bs = test_open("driver=ram,ram-size=1M,discard=ignore");
	assert_false(blk_can_discard(bs));
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(ram_last->nlog, 0);
	blk_close(bs);
	/* discard=unmap reaches the driver */
	bs = test_open("driver=ram,ram-size=1M,discard=unmap");
	assert_true(blk_can_discard(bs));
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(ram_last->ops[BLK_OP_DISCARD], 1);
	blk_close(bs);
}

static void test_wz_fallback(void **state)
{
	struct blk_node *bs;
	struct blk_stats st;
	struct test_req t;
	uint64_t len = 3 * 1024 * 1024 + 4096;

	(void)state;
	ram_cfg.no_wz = true;
	bs = test_open("driver=ram,ram-size=4M");
	assert_false(blk_can_write_zeroes(bs));
	memset(ram_last->ram.data, 0xab, 4 << 20);
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 4096, NULL, len, BLK_F_MAY_UNMAP, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(ram_last->ops[BLK_OP_WRITE_ZEROES], 0);
	assert_int_equal(ram_last->ops[BLK_OP_WRITE], 4); /* 1 MiB chunks */
	assert_true(all_bytes(ram_last->ram.data + 4096, len, 0));
	assert_true(all_bytes(ram_last->ram.data, 4096, 0xab));
	assert_true(all_bytes(ram_last->ram.data + 4096 + len, (4 << 20) - 4096 - len, 0xab));
	assert_int_equal(t.req.offset, 4096);
	assert_int_equal(t.req.len, len);
	blk_get_stats(bs, &st);
	assert_int_equal(st.op[BLK_OP_WRITE_ZEROES].ops, 1);
	assert_int_equal(st.op[BLK_OP_WRITE_ZEROES].bytes, len);
	assert_int_equal(st.op[BLK_OP_WRITE].ops, 0);
	/* a failing chunk fails the request once */
	ram_last->cfg.fail_op = BLK_OP_WRITE;
	ram_last->cfg.fail_ret = -ENOSPC;
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 0, NULL, len, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), -ENOSPC);
	blk_close(bs);

	/* driver that has write-zeroes but fails it with -ENOTSUP */
	ram_reset_config();
	ram_cfg.fail_op = BLK_OP_WRITE_ZEROES;
	ram_cfg.fail_ret = -ENOTSUP;
	bs = test_open("driver=ram,ram-size=1M");
	memset(ram_last->ram.data, 0xab, 1 << 20);
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 512, NULL, 1000, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(ram_last->ops[BLK_OP_WRITE_ZEROES], 1);
	assert_int_equal(ram_last->ops[BLK_OP_WRITE], 1);
	assert_true(all_bytes(ram_last->ram.data + 512, 1000, 0));
	assert_true(all_bytes(ram_last->ram.data + 1512, 512, 0xab));
	/* ... unless NO_FALLBACK */
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 512, NULL, 1000, BLK_F_NO_FALLBACK, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), -ENOTSUP);
	assert_int_equal(ram_last->ops[BLK_OP_WRITE], 1);
	blk_close(bs);
}

/* detect-zeroes: a write of zeroes reaches the driver as a write-zeroes
 * (unmap: that may deallocate, unless discard=ignore), any other write as
 * a write; FUA still holds; the submitter gets its request back as it was,
 * and the statistics count a write. */
static void test_detect_zeroes(void **state)
{
	struct blk_node *bs = test_open("driver=ram,ram-size=1M,detect-zeroes=unmap");
	struct blk_node *on = test_open("driver=ram,ram-size=1M,detect-zeroes=on");
	static char zero[8192], data[4096] = {1};
	struct blk_stats st;
	struct test_req t;

	(void)state;
	test_req_init(&t, BLK_OP_WRITE, 4096, zero, sizeof(zero), BLK_F_FUA, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(t.req.op, BLK_OP_WRITE);
	assert_int_equal(t.req.flags, BLK_F_FUA);
	assert_int_equal(ram_last->nlog, 0); /* ram_last is `on` */
	blk_get_stats(bs, &st);
	assert_int_equal(st.op[BLK_OP_WRITE].ops, 1);
	assert_int_equal(st.op[BLK_OP_WRITE_ZEROES].ops, 0);
	assert_int_equal(blk_pwrite(on, 0, zero, 4096, 0), 0);
	assert_int_equal(blk_pwrite(on, 0, data, 4096, 0), 0);
	assert_int_equal(ram_last->nlog, 2);
	assert_int_equal(ram_last->log[0].op, BLK_OP_WRITE_ZEROES);
	assert_int_equal(ram_last->log[0].flags & BLK_F_MAY_UNMAP, 0);
	assert_int_equal(ram_last->log[1].op, BLK_OP_WRITE);
	blk_close(on);
	blk_close(bs);
	bs = test_open("driver=ram,ram-size=1M,detect-zeroes=unmap");
	assert_int_equal(blk_pwrite(bs, 0, zero, 4096, BLK_F_FUA), 0);
	assert_int_equal(ram_last->log[0].op, BLK_OP_WRITE_ZEROES);
	assert_int_equal(ram_last->log[0].flags, BLK_F_MAY_UNMAP | BLK_F_FUA);
	blk_close(bs);
}

static void test_fua(void **state)
{
	struct blk_node *bs;
	static char buf[4096];
	struct test_req t;

	(void)state;
	ram_cfg.no_fua = true;
	bs = test_open("driver=ram,ram-size=1M");
	assert_false(blk_can_fua(bs));
	assert_int_equal(blk_pwrite(bs, 8192, buf, 4096, BLK_F_FUA), 0);
	assert_int_equal(ram_last->nlog, 2);
	assert_int_equal(ram_last->log[0].op, BLK_OP_WRITE);
	assert_int_equal(ram_last->log[1].op, BLK_OP_FLUSH);
	/* write-zeroes with FUA too; the request comes back as it went */
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 0, NULL, 4096, BLK_F_FUA, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(ram_last->nlog, 4);
	assert_int_equal(ram_last->log[2].op, BLK_OP_WRITE_ZEROES);
	assert_int_equal(ram_last->log[3].op, BLK_OP_FLUSH);
	assert_int_equal(t.req.op, BLK_OP_WRITE_ZEROES);
	/* a failed write is not flushed */
	ram_last->cfg.fail_op = BLK_OP_WRITE;
	ram_last->cfg.fail_ret = -EIO;
	assert_int_equal(blk_pwrite(bs, 0, buf, 4096, BLK_F_FUA), -EIO);
	assert_int_equal(ram_last->nlog, 5);
	/* a failed flush fails the write */
	ram_last->cfg.fail_op = BLK_OP_FLUSH;
	assert_int_equal(blk_pwrite(bs, 0, buf, 4096, BLK_F_FUA), -EIO);
	blk_close(bs);

	ram_reset_config();
	bs = test_open("driver=ram,ram-size=1M");
	assert_true(blk_can_fua(bs));
	assert_int_equal(blk_pwrite(bs, 0, buf, 4096, BLK_F_FUA), 0);
	assert_int_equal(ram_last->nlog, 1);
	assert_int_equal(ram_last->log[0].flags, BLK_F_FUA);
	blk_close(bs);
}

/* A driver refusing a request synchronously: blk_submit() returns its error
 * and no callback runs; when the core's own later step is refused, the
 * callback gets the error. */
static void test_driver_rejects(void **state)
{
	struct blk_node *bs;
	static char buf[4096];
	struct test_req t;
	struct blk_stats st;

	ram_cfg.reject_op = BLK_OP_READ;
	ram_cfg.reject_ret = -EAGAIN;
	bs = test_open("driver=ram,ram-size=4M");
	test_req_init(&t, BLK_OP_READ, 0, buf, 4096, 0, NULL);
	expect_fail(bs, &t, -EAGAIN);
	blk_get_stats(bs, &st);
	assert_int_equal(st.in_flight, 0);
	assert_int_equal(st.op[BLK_OP_READ].ops, 0);
	blk_close(bs);

	ram_reset_config();
	ram_cfg.reject_op = BLK_OP_WRITE;
	ram_cfg.reject_ret = -ENOMEM;
	ram_cfg.no_wz = true;
	bs = test_open("driver=ram,ram-size=4M");
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 0, NULL, 4096, 0, NULL);
	expect_fail(bs, &t, -ENOMEM); /* first fallback chunk */
	blk_close(bs);

	ram_reset_config();
	ram_cfg.reject_op = BLK_OP_FLUSH;
	ram_cfg.reject_ret = -EIO;
	ram_cfg.no_fua = true;
	bs = test_open("driver=ram,ram-size=4M");
	test_req_init(&t, BLK_OP_WRITE, 0, buf, 4096, BLK_F_FUA, NULL);
	assert_int_equal(test_submit(bs, &t, &in_submit), 0);
	ram_pump(NULL, *state, &t.calls, 1);
	assert_int_equal(t.ret, -EIO);
	assert_false(t.saw_in_submit);
	assert_int_equal(t.req.op, BLK_OP_WRITE);
	blk_get_stats(bs, &st);
	assert_int_equal(st.op[BLK_OP_WRITE].errors, 1);
	assert_int_equal(st.in_flight, 0);
	blk_close(bs);
}

static void test_block_status_emulated(void **state)
{
	struct blk_node *bs;
	struct test_req t;

	(void)state;
	ram_cfg.no_block_status = true;
	bs = test_open("driver=ram,ram-size=1M");
	test_req_init(&t, BLK_OP_BLOCK_STATUS, 4096, NULL, 65536, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(t.req.status, BLK_STATUS_DATA | BLK_STATUS_ALLOCATED);
	assert_int_equal(t.req.status_len, 65536);
	assert_int_equal(ram_last->nlog, 0);
	blk_close(bs);
}

static void test_sync_helpers(void **state)
{
	struct blk_node *bs = test_open("driver=ram,ram-size=1M");
	uint8_t *w = blk_alloc_buf(bs, 65536), *r = blk_alloc_buf(bs, 65536);
	unsigned i;

	(void)state;
	for (i = 0; i < 65536; i++)
		w[i] = (uint8_t)(i * 7 + 3);
	assert_int_equal(blk_pwrite(bs, 12345, w, 65536, 0), 0);
	assert_int_equal(blk_pread(bs, 12345, r, 65536), 0);
	assert_memory_equal(w, r, 65536);
	assert_memory_equal(ram_last->ram.data + 12345, w, 65536);
	assert_int_equal(blk_pread(bs, 1 << 20, r, 1), -EINVAL);
	free(w);
	free(r);
	blk_close(bs);
}

static void test_alloc_buf(void **state)
{
	struct blk_node *bs;
	void *p;

	(void)state;
	ram_cfg.mem_align = 8192;
	bs = test_open("driver=ram,ram-size=1M");
	p = blk_alloc_buf(bs, 100);
	assert_non_null(p);
	assert_int_equal((uintptr_t)p % 8192, 0);
	free(p);
	p = blk_alloc_buf(NULL, 0);
	assert_non_null(p);
	assert_int_equal((uintptr_t)p % 4096, 0);
	free(p);
	blk_close(bs);
}

static void test_req_pool(void **state)
{
	struct blk_req_pool p;
	struct blk_request *r[8];
	unsigned i, j;

	(void)state;
	assert_int_equal(blk_req_pool_init(&p, 8), 0);
	for (i = 0; i < 8; i++) {
		r[i] = blk_req_get(&p);
		assert_non_null(r[i]);
		assert_true(r[i] >= p.reqs && r[i] < p.reqs + 8);
		for (j = 0; j < i; j++)
			assert_ptr_not_equal(r[i], r[j]);
	}
	assert_null(blk_req_get(&p));
	blk_req_put(&p, r[3]);
	assert_ptr_equal(blk_req_get(&p), r[3]);
	blk_req_pool_destroy(&p);
	assert_null(p.reqs);
}

static unsigned ctor_calls;

static void *ctor(struct blk_node *bs, struct loop *loop)
{
	(void)bs;
	ctor_calls++;
	return loop;
}

static void test_thread_state(void **state)
{
	struct blk_node *bs = test_open("driver=null,size=1M");

	assert_ptr_equal(blk_thread_state(bs, *state, ctor), *state);
	assert_ptr_equal(blk_thread_state(bs, *state, ctor), *state);
	assert_int_equal(ctor_calls, 1);
	bs->thread_state[loop_index(*state)] = NULL; /* not ours to free */
	blk_close(bs);
}

static void test_open_errors(void **state)
{
	char err[256];

	(void)state;
	assert_int_equal(test_open_fail("driver=null,size=1M,bogus=1", err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "unknown option 'bogus'");
	assert_int_equal(test_open_fail("size=1M", err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "driver"));
	assert_int_equal(test_open_fail("driver=nope", err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "nope"));
	assert_int_equal(test_open_fail("driver=raw,size=1M", err, sizeof(err)), -EINVAL);
	assert_int_equal(test_open_fail("driver=null,size=1M,format=null", err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(test_open_fail("driver=null,size=1M,format=qcow9", err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(test_open_fail("driver=null,size=1M,read-only=maybe", err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(test_open_fail("driver=null,size=1M,discard=sometimes", err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(
		test_open_fail("driver=null,size=1M,request-alignment=3000", err, sizeof(err)),
		-EINVAL);
	/* a format's leftovers are reported too */
	assert_int_equal(test_open_fail("driver=null,size=1M,format=raw,x=y", err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "unknown option 'x'");
	assert_int_not_equal(
		test_open_fail("driver=file,filename=/nonexistent/ioplane-x", err, sizeof(err)), 0);
}

static void test_open_options(void **state)
{
	struct blk_node *bs;
	char err[256];

	(void)state;
	bs = test_open("driver=null,size=1M");
	assert_null(bs->next);
	assert_string_equal(bs->drv->name, "null");
	assert_int_equal(blk_size(bs), 1 << 20);
	assert_false(bs->read_only);
	blk_close(bs);
	bs = test_open("driver=null,size=1M,format=raw,read-only=on,discard=ignore,"
		       "request-alignment=4K");
	assert_string_equal(bs->drv->name, "raw");
	assert_string_equal(bs->next->drv->name, "null");
	assert_true(bs->read_only && bs->next->read_only);
	assert_true(bs->discard_ignore);
	assert_int_equal(bs->align, 4096);
	assert_int_equal(bs->next->align, 1);
	assert_int_equal(blk_size(bs), 1 << 20);
	blk_close(bs);

	assert_int_equal(blk_open_target("null:size=1G,latency-ns=30000", NULL, NULL, &bs, err,
					 sizeof(err)), 0);
	assert_string_equal(bs->drv->name, "null");
	assert_int_equal(blk_size(bs), 1ull << 30);
	blk_close(bs);
	assert_int_equal(blk_open_target("null:size=1G", "raw", "read-only=on", &bs, err,
					 sizeof(err)), 0);
	assert_string_equal(bs->drv->name, "raw");
	assert_true(bs->read_only);
	blk_close(bs);
	bs = NULL;
	assert_int_equal(blk_open_target("null:size=1G", NULL, "cache=none", &bs, err,
					 sizeof(err)), -EINVAL);
	assert_string_equal(err, "unknown option 'cache'");
	assert_null(bs);
	assert_int_not_equal(blk_open_target("null:size=1G,,", NULL, NULL, &bs, err,
					     sizeof(err)), 0);
}

static void test_registry(void **state)
{
	static const struct blk_driver dup = { .name = "null" };

	(void)state;
	blk_register_builtin_drivers();
	assert_ptr_equal(blk_find_driver("null"), &blk_drv_null);
	assert_ptr_equal(blk_find_driver("raw"), &blk_drv_raw);
	assert_ptr_equal(blk_find_driver("file"), &blk_drv_file);
	assert_non_null(blk_find_driver("ram"));
	assert_null(blk_find_driver("nope"));
	assert_int_equal(blk_register_driver(&dup), -EEXIST);
}

static void test_truncate(void **state)
{
	struct blk_node *bs = test_open("driver=null,size=1M");

	(void)state;
	assert_int_equal(blk_truncate(bs, 2 << 20), 0);
	assert_int_equal(blk_size(bs), 2 << 20);
	blk_close(bs);
	bs = test_open("driver=ram,ram-size=1M");
	assert_int_equal(blk_truncate(bs, 8192), 0);
	assert_int_equal(blk_size(bs), 8192);
	blk_close(bs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		RAM_TEST(test_validation),
		RAM_TEST(test_wz_no_fallback),
		RAM_TEST(test_block_status_clamp),
		RAM_TEST(test_zero_length),
		RAM_TEST(test_exactly_once),
		RAM_TEST(test_stats),
		RAM_TEST(test_hist_and_names),
		RAM_TEST(test_discard),
		RAM_TEST(test_wz_fallback),
		RAM_TEST(test_fua),
		RAM_TEST(test_driver_rejects),
		RAM_TEST(test_block_status_emulated),
		RAM_TEST(test_sync_helpers),
		RAM_TEST(test_alloc_buf),
		RAM_TEST(test_req_pool),
		RAM_TEST(test_thread_state),
		RAM_TEST(test_open_errors),
		RAM_TEST(test_open_options),
		RAM_TEST(test_registry),
		RAM_TEST(test_truncate),
		RAM_TEST(test_detect_zeroes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
