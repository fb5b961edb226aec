/* Unit tests for the alignment slow path: bounce buffers, read-modify-write
 * checked against a shadow copy (sequential and concurrent with random
 * completion order), serialisation of overlapping writes, misaligned
 * write-zeroes and discard, errors. The RAM driver counts every request that
 * reaches it misaligned. Threading: one loop on the test thread. */
#include "blk-test-ram.h"
#include "block/block-int.h"

#define DEV_SIZE (256u << 10)

static bool in_submit;
static uint64_t rng = 88172645463325252ull;

static void fill_random(uint8_t *p, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t)ram_rand(&rng);
}

/* null with request-alignment: misaligned requests work, counted once each. */
static void test_null_request_alignment(void **state)
{
	struct blk_node *bs = test_open("driver=null,size=1M,read-zeroes=on,request-alignment=4096");
	static uint8_t buf[20000];
	struct blk_stats st;
	unsigned i;

	(void)state;
	assert_int_equal(bs->align, 4096);
	assert_non_null(bs->track);
	for (i = 0; i < 50; i++) {
		uint64_t off = ram_rand(&rng) % ((1 << 20) - sizeof(buf));
		uint64_t len = 1 + ram_rand(&rng) % sizeof(buf);

		memset(buf, 0xee, sizeof(buf));
		assert_int_equal(blk_pwrite(bs, off, buf, len, i % 5 ? 0 : BLK_F_FUA), 0);
		assert_int_equal(blk_pread(bs, off, buf + 1, len), 0);
		assert_int_equal(buf[1], 0);
		assert_int_equal(buf[len], 0);
		assert_int_equal(buf[len + 1], 0xee);
	}
	blk_get_stats(bs, &st);
	assert_int_equal(st.op[BLK_OP_WRITE].ops, 50);
	assert_int_equal(st.op[BLK_OP_READ].ops, 50);
	assert_int_equal(st.op[BLK_OP_FLUSH].ops, 0);
	assert_int_equal(st.in_flight, 0);
	blk_close(bs);
}

static void check_shadow(struct blk_node *bs, struct ram_dev *d, const uint8_t *shadow)
{
	static uint8_t r[DEV_SIZE + 1];
	unsigned i;

	assert_memory_equal(d->ram.data, shadow, DEV_SIZE);
	for (i = 0; i < 20; i++) {
		uint64_t off = ram_rand(&rng) % DEV_SIZE;
		uint64_t len = 1 + ram_rand(&rng) % (DEV_SIZE - off);
		unsigned m = (unsigned)(ram_rand(&rng) % 2);

		assert_int_equal(blk_pread(bs, off, r + m, len), 0);
		assert_memory_equal(r + m, shadow + off, len);
	}
	assert_int_equal(d->misaligned, 0);
}

/* Random misaligned writes one at a time, from misaligned memory. */
static void test_rmw_sequential(void **state)
{
	static uint8_t shadow[DEV_SIZE], w[20000 + 7];
	struct blk_node *bs;
	struct ram_dev *d;
	unsigned i;

	(void)state;
	ram_cfg.align = 4096;
	ram_cfg.mem_align = 512;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	fill_random(d->ram.data, DEV_SIZE);
	memcpy(shadow, d->ram.data, DEV_SIZE);
	for (i = 0; i < 500; i++) {
		uint64_t len = 1 + ram_rand(&rng) % 20000;
		uint64_t off = ram_rand(&rng) % (DEV_SIZE - len + 1);
		unsigned m = (unsigned)(ram_rand(&rng) % 8);

		if (i % 10 == 0) { /* aligned ones too */
			off &= ~4095ull;
			len = (len + 4095) & ~4095ull;
			len = len > 16384 ? 16384 : len;
		}
		fill_random(w + m, len);
		assert_int_equal(blk_pwrite(bs, off, w + m, len, 0), 0);
		memcpy(shadow + off, w + m, len);
		if (i % 100 == 99)
			check_shadow(bs, d, shadow);
	}
	check_shadow(bs, d, shadow);
	assert_int_equal(blk_track_waits(bs), 0);
	blk_close(bs);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* Batches of concurrent writes with disjoint byte ranges that share blocks,
 * completed by the "device" in random order: without serialisation one RMW
 * would write back stale bytes of another. */
static void test_rmw_concurrent(void **state)
{
	static uint8_t shadow[DEV_SIZE], bufs[16][8 * 4096 + 8];
	struct test_req t[16];
	struct blk_node *bs;
	struct ram_dev *d;
	unsigned b, i, done;

	ram_cfg.align = 4096;
	ram_cfg.hold = true;
	ram_cfg.random_order = true;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	fill_random(d->ram.data, DEV_SIZE);
	memcpy(shadow, d->ram.data, DEV_SIZE);
	for (b = 0; b < 100; b++) {
		uint64_t cut[32], base = (ram_rand(&rng) % (DEV_SIZE / 4096 - 8)) * 4096;

		for (i = 0; i < 32; i++) /* 32 sorted cut points in 8 blocks */
			cut[i] = base + ram_rand(&rng) % (8 * 4096 + 1);
		qsort(cut, 32, sizeof(cut[0]), cmp_u64);
		done = 0;
		for (i = 0; i < 16; i++) { /* [cut 2i, cut 2i+1) are disjoint */
			uint64_t off = cut[2 * i], len = cut[2 * i + 1] - off;
			uint8_t *buf = bufs[i] + i % 8;

			if (len == 0) {
				t[i].calls = 1;
				done++;
				continue;
			}
			fill_random(buf, len);
			memcpy(shadow + off, buf, len);
			test_req_init(&t[i], BLK_OP_WRITE, off, buf, len, 0, &done);
			assert_int_equal(test_submit(bs, &t[i], &in_submit), 0);
		}
		ram_pump(d, *state, &done, 16);
		for (i = 0; i < 16; i++)
			assert_int_equal(t[i].calls, 1);
		assert_memory_equal(d->ram.data, shadow, DEV_SIZE);
	}
	assert_int_equal(d->misaligned, 0);
	assert_true(blk_track_waits(bs) > 0);
	assert_true(d->max_pending > 1);
	blk_close(bs);
}

/* The overlap tests' data: A (100 bytes of 0xaa), B and C (a block of 0xbb,
 * of 0xcc). */
static uint8_t ov_a[100], ov_b[4096], ov_c[4096];

/* A 256 KiB RAM node with 4096-byte blocks whose device holds every request
 * until the test pumps it; the overlap buffers filled. */
static struct blk_node *open_held(struct ram_dev **d)
{
	struct blk_node *bs;

	memset(ov_a, 0xaa, sizeof(ov_a));
	memset(ov_b, 0xbb, sizeof(ov_b));
	memset(ov_c, 0xcc, sizeof(ov_c));
	ram_cfg.align = 4096;
	ram_cfg.hold = true;
	bs = test_open("driver=ram,ram-size=256K");
	*d = ram_last;
	return bs;
}

/* Make t a request counted in *done and submit it: the core must take it. */
static void submit_ok(struct blk_node *bs, struct test_req *t, uint8_t op, uint64_t off,
		      void *buf, uint64_t len, unsigned *done)
{
	test_req_init(t, op, off, buf, len, 0, done);
	assert_int_equal(test_submit(bs, t, &in_submit), 0);
}

/* A misaligned write A, then an aligned write B over A's block: B must not
 * reach the device until A's read-modify-write is done. */
static void test_overlap_rmw_first(void **state)
{
	struct test_req ta, tb, tc;
	struct blk_node *bs;
	struct ram_dev *d;
	unsigned done = 0;

	bs = open_held(&d);
	submit_ok(bs, &ta, BLK_OP_WRITE, 100, ov_a, 100, &done);
	submit_ok(bs, &tb, BLK_OP_WRITE, 0, ov_b, 4096, &done);
	submit_ok(bs, &tc, BLK_OP_WRITE, 8192, ov_b, 4096, &done);
	/* A's read and C (no overlap) are at the device, B waits */
	assert_int_equal(d->npending, 2);
	assert_int_equal(d->pending[0]->op, BLK_OP_READ);
	assert_ptr_equal(d->pending[1], &tc.req);
	assert_int_equal(blk_track_waits(bs), 1);
	ram_pump(d, *state, &done, 3);
	assert_int_equal(d->nlog, 4);
	assert_int_equal(d->log[0].op, BLK_OP_READ);
	assert_int_equal(d->log[2].op, BLK_OP_WRITE); /* A's write-back */
	assert_int_equal(d->log[2].off, 0);
	assert_int_equal(d->log[3].op, BLK_OP_WRITE); /* then B */
	assert_int_equal(d->log[3].off, 0);
	assert_true(all_bytes(d->ram.data, 4096, 0xbb));
	assert_true(tb.order > ta.order);
	blk_close(bs);
}

/* An aligned write B in flight, then a misaligned write A over it: A's RMW
 * waits for B, so B's bytes survive around A's. Reads do not wait. */
static void test_overlap_aligned_first(void **state)
{
	static uint8_t r[4096];
	struct test_req ta, tb, tr;
	struct blk_node *bs;
	struct ram_dev *d;
	unsigned done = 0;

	bs = open_held(&d);
	submit_ok(bs, &tb, BLK_OP_WRITE, 0, ov_b, 4096, &done);
	submit_ok(bs, &ta, BLK_OP_WRITE, 3000, ov_a, 100, &done);
	submit_ok(bs, &tr, BLK_OP_READ, 0, r, 4096, &done);
	assert_int_equal(d->npending, 2); /* B and the read; A waits */
	assert_ptr_equal(d->pending[0], &tb.req);
	assert_ptr_equal(d->pending[1], &tr.req);
	ram_pump(d, *state, &done, 3);
	assert_true(all_bytes(d->ram.data, 3000, 0xbb));
	assert_true(all_bytes(d->ram.data + 3000, 100, 0xaa));
	assert_true(all_bytes(d->ram.data + 3100, 996, 0xbb));
	assert_int_equal(ta.ret, 0);
	assert_int_equal(d->misaligned, 0);
	blk_close(bs);
}

/* The overlap list keeps counts of serialising and waiting requests so that
 * plain writes skip the list walk: after an RMW is done, overlapping aligned
 * writes go straight to the device together, and an RMW that comes after
 * them still waits for both. */
static void test_overlap_counts(void **state)
{
	struct test_req ta, tb, tc, td;
	struct blk_node *bs;
	struct ram_dev *d;
	unsigned done = 0;

	bs = open_held(&d);
	/* An RMW alone, done. */
	submit_ok(bs, &ta, BLK_OP_WRITE, 100, ov_a, 100, &done);
	ram_pump(d, *state, &done, 1);
	assert_int_equal(blk_track_waits(bs), 0);
	/* Two overlapping aligned writes: neither waits for the other. */
	done = 0;
	submit_ok(bs, &tb, BLK_OP_WRITE, 0, ov_b, 4096, &done);
	submit_ok(bs, &tc, BLK_OP_WRITE, 0, ov_c, 4096, &done);
	assert_int_equal(d->npending, 2);
	assert_int_equal(blk_track_waits(bs), 0);
	/* An RMW over them waits until both are done. */
	submit_ok(bs, &td, BLK_OP_WRITE, 200, ov_a, 50, &done);
	assert_int_equal(d->npending, 2);
	assert_int_equal(blk_track_waits(bs), 1);
	ram_pump(d, *state, &done, 3);
	assert_int_equal(td.ret, 0);
	assert_true(td.order > tb.order && td.order > tc.order);
	assert_true(all_bytes(d->ram.data + 200, 50, 0xaa));
	assert_true(all_bytes(d->ram.data + 250, 4096 - 250, d->ram.data[4095]));
	assert_int_equal(d->misaligned, 0);
	blk_close(bs);
}

/* Only mem_align: bounce buffers, no RMW, no tracking; aligned buffers pass. */
static void test_mem_align(void **state)
{
	static uint8_t w[8192 + 512] __attribute__((aligned(4096))), r[8192 + 512];
	struct test_req t;
	struct blk_node *bs;
	struct ram_dev *d;
	unsigned done = 0;

	ram_cfg.mem_align = 512;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	assert_null(bs->track);
	fill_random(w, sizeof(w));
	assert_int_equal(blk_pwrite(bs, 1, w + 1, 8000, 0), 0);
	assert_memory_equal(d->ram.data + 1, w + 1, 8000);
	assert_int_equal(blk_pread(bs, 1, r + 3, 8000), 0);
	assert_memory_equal(r + 3, w + 1, 8000);
	assert_int_equal(d->misaligned, 0);
	blk_close(bs);

	ram_cfg.hold = true;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	test_req_init(&t, BLK_OP_WRITE, 0, w, 4096, 0, &done);
	assert_int_equal(test_submit(bs, &t, &in_submit), 0);
	assert_ptr_equal(d->pending[0], &t.req); /* no copy */
	ram_pump(d, *state, &done, 1);
	blk_close(bs);
}

/* Aligned addresses but a segment length that is not a multiple of align:
 * O_DIRECT would refuse it, so it is bounced. */
static void test_segment_lengths(void **state)
{
	static uint8_t w[8192] __attribute__((aligned(4096))), r[8192] __attribute__((aligned(4096)));
	struct iovec iov[3] = { { w, 2048 }, { w + 2048, 2048 }, { w + 4096, 4096 } };
	struct blk_request req = { .op = BLK_OP_WRITE, .offset = 8192, .len = 8192, .iov = iov,
				   .iovcnt = 3 };
	struct blk_node *bs;
	struct ram_dev *d;

	(void)state;
	ram_cfg.align = 4096;
	ram_cfg.mem_align = 512;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	fill_random(w, sizeof(w));
	assert_int_equal(blk_do_sync(bs, &req), 0);
	assert_memory_equal(d->ram.data + 8192, w, 8192);
	req.op = BLK_OP_READ;
	iov[0].iov_base = r;
	iov[1].iov_base = r + 2048;
	iov[2].iov_base = r + 4096;
	assert_int_equal(blk_do_sync(bs, &req), 0);
	assert_memory_equal(r, w, 8192);
	assert_int_equal(d->misaligned, 0);
	assert_int_equal(d->nlog, 2);
	blk_close(bs);
}

#define THR_SLOTS 32
#define THR_SLOT 250
#define THR_ROUNDS 30

struct thr {
	pthread_t tid;
	struct blk_node *bs;
	unsigned id;
	int err;
	unsigned bad_calls;
	struct test_req t[THR_SLOTS];
	uint8_t buf[THR_SLOTS][THR_SLOT];
};

static uint8_t thr_byte(unsigned id, unsigned k, unsigned r, unsigned i)
{
	return (uint8_t)(id * 97 + k * 13 + r * 7 + i);
}

/* Thread i owns the 250-byte slots 2k+i: both threads' RMWs share blocks. */
static void *thr_main(void *arg)
{
	struct thr *th = arg;
	struct loop_opts o = { 0 };
	struct loop *loop;
	unsigned r, k, i, done;

	if (loop_new(&o, &loop)) {
		th->err = -1;
		return NULL;
	}
	loop_bind_current(loop);
	for (r = 0; r < THR_ROUNDS && !th->err; r++) {
		done = 0;
		for (k = 0; k < THR_SLOTS; k++) {
			for (i = 0; i < THR_SLOT; i++)
				th->buf[k][i] = thr_byte(th->id, k, r, i);
			test_req_init(&th->t[k], BLK_OP_WRITE, (2 * k + th->id) * THR_SLOT, th->buf[k],
				      THR_SLOT, 0, &done);
			if (blk_submit(th->bs, &th->t[k].req))
				th->err = -2;
		}
		if (ram_pump_nocheck(NULL, loop, &done, THR_SLOTS) != THR_SLOTS)
			th->err = -3;
		for (k = 0; k < THR_SLOTS; k++)
			th->bad_calls += th->t[k].calls != 1 || th->t[k].ret != 0;
	}
	loop_bind_current(NULL);
	loop_free(loop);
	return NULL;
}

/* Two loops on two threads do read-modify-writes in the same blocks: the
 * overlap list is shared under its lock and waiters are woken across threads. */
static void test_two_threads(void **state)
{
	static struct thr th[2];
	struct blk_node *bs;
	struct ram_dev *d;
	unsigned id, k, i;

	ram_cfg.align = 4096;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	loop_bind_current(NULL);
	for (id = 0; id < 2; id++) {
		memset(&th[id], 0, sizeof(th[id]));
		th[id].bs = bs;
		th[id].id = id;
		assert_int_equal(pthread_create(&th[id].tid, NULL, thr_main, &th[id]), 0);
	}
	for (id = 0; id < 2; id++) {
		pthread_join(th[id].tid, NULL);
		assert_int_equal(th[id].err, 0);
		assert_int_equal(th[id].bad_calls, 0);
	}
	loop_bind_current(*state);
	for (id = 0; id < 2; id++)
		for (k = 0; k < THR_SLOTS; k++)
			for (i = 0; i < THR_SLOT; i++)
				assert_int_equal(d->ram.data[(2 * k + id) * THR_SLOT + i],
						 thr_byte(id, k, THR_ROUNDS - 1, i));
	assert_int_equal(d->misaligned, 0);
	assert_true(blk_track_waits(bs) > 0);
	blk_close(bs);
}

static void test_wz_misaligned(void **state)
{
	struct blk_node *bs;
	struct ram_dev *d;
	struct test_req t;

	(void)state;
	ram_cfg.align = 4096;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	memset(d->ram.data, 0xab, DEV_SIZE);
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 1000, NULL, 19000, BLK_F_FUA, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_true(all_bytes(d->ram.data, 1000, 0xab));
	assert_true(all_bytes(d->ram.data + 1000, 19000, 0));
	assert_true(all_bytes(d->ram.data + 20000, DEV_SIZE - 20000, 0xab));
	assert_int_equal(d->nlog, 5);
	assert_int_equal(d->log[3].op, BLK_OP_WRITE_ZEROES);
	assert_int_equal(d->log[3].off, 4096);
	assert_int_equal(d->log[3].len, 12288);
	assert_int_equal(d->log[3].flags, BLK_F_FUA);
	assert_int_equal(d->log[4].flags, BLK_F_FUA);
	/* inside one block */
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 40000, NULL, 10, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_true(all_bytes(d->ram.data + 39990, 10, 0xab));
	assert_true(all_bytes(d->ram.data + 40000, 10, 0));
	assert_true(all_bytes(d->ram.data + 40010, 10, 0xab));
	/* aligned head, misaligned tail */
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 65536, NULL, 5000, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_true(all_bytes(d->ram.data + 65536, 5000, 0));
	assert_true(all_bytes(d->ram.data + 70536, 100, 0xab));
	assert_int_equal(d->misaligned, 0);
	blk_close(bs);

	/* no driver support: zero writes, through the RMW path */
	ram_cfg.no_wz = true;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	memset(d->ram.data, 0xab, DEV_SIZE);
	test_req_init(&t, BLK_OP_WRITE_ZEROES, 1000, NULL, 19000, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_true(all_bytes(d->ram.data, 1000, 0xab));
	assert_true(all_bytes(d->ram.data + 1000, 19000, 0));
	assert_true(all_bytes(d->ram.data + 20000, DEV_SIZE - 20000, 0xab));
	assert_int_equal(d->ops[BLK_OP_WRITE_ZEROES], 0);
	assert_int_equal(d->misaligned, 0);
	blk_close(bs);
}

static void test_discard_misaligned(void **state)
{
	struct blk_node *bs;
	struct ram_dev *d;
	struct test_req t;

	(void)state;
	ram_cfg.align = 4096;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	test_req_init(&t, BLK_OP_DISCARD, 100, NULL, 100, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(d->nlog, 0);
	test_req_init(&t, BLK_OP_DISCARD, 100, NULL, 9000, 0, NULL);
	assert_int_equal(blk_do_sync(bs, &t.req), 0);
	assert_int_equal(d->nlog, 1);
	assert_int_equal(d->log[0].off, 4096);
	assert_int_equal(d->log[0].len, 4096);
	assert_int_equal(t.req.offset, 100);
	assert_int_equal(t.req.len, 9000);
	blk_close(bs);
}

/* Errors in either phase fail the request once and leave no tracked request
 * behind (blk_close asserts the overlap list is empty). */
static void test_rmw_errors(void **state)
{
	static uint8_t w[100], r[100], big[4096] __attribute__((aligned(4096)));
	struct blk_node *bs;
	struct ram_dev *d;

	(void)state;
	ram_cfg.align = 4096;
	ram_cfg.fail_op = BLK_OP_READ;
	ram_cfg.fail_ret = -EIO;
	bs = test_open("driver=ram,ram-size=256K");
	d = ram_last;
	assert_int_equal(blk_pwrite(bs, 10, w, sizeof(w), 0), -EIO);
	assert_int_equal(d->ops[BLK_OP_WRITE], 0);
	assert_int_equal(blk_pread(bs, 10, r, sizeof(r)), -EIO);
	d->cfg.fail_op = BLK_OP_WRITE;
	d->cfg.fail_ret = -ENOSPC;
	assert_int_equal(blk_pwrite(bs, 10, w, sizeof(w), 0), -ENOSPC);
	d->cfg.fail_op = -1;
	assert_int_equal(blk_pwrite(bs, 10, w, sizeof(w), 0), 0);
	/* refused synchronously: first step (error returned), later step
	 * (callback), an aligned tracked write (error returned) */
	d->cfg.reject_op = BLK_OP_READ;
	d->cfg.reject_ret = -EAGAIN;
	assert_int_equal(blk_pwrite(bs, 10, w, sizeof(w), 0), -EAGAIN);
	d->cfg.reject_op = BLK_OP_WRITE;
	assert_int_equal(blk_pwrite(bs, 10, w, sizeof(w), 0), -EAGAIN);
	assert_int_equal(blk_pwrite(bs, 4096, r, 0, 0), 0);
	assert_int_equal(blk_pwrite(bs, 4096, big, 4096, 0), -EAGAIN);
	d->cfg.reject_op = -1;
	assert_int_equal(blk_pwrite(bs, 10, w, sizeof(w), 0), 0);
	blk_close(bs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		RAM_TEST(test_null_request_alignment),
		RAM_TEST(test_rmw_sequential),
		RAM_TEST(test_rmw_concurrent),
		RAM_TEST(test_overlap_rmw_first),
		RAM_TEST(test_overlap_aligned_first),
		RAM_TEST(test_overlap_counts),
		RAM_TEST(test_mem_align),
		RAM_TEST(test_segment_lengths),
		RAM_TEST(test_two_threads),
		RAM_TEST(test_wz_misaligned),
		RAM_TEST(test_discard_misaligned),
		RAM_TEST(test_rmw_errors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
