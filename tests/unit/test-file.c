/* Unit tests for the `file` protocol driver: every engine (io_uring, native,
 * threads) x cache mode (writeback, none) on a real file in /var/tmp (O_DIRECT
 * needs a disk file system; /tmp or /dev/shm may be tmpfs). Data written
 * through the driver is checked with a separate plain fd and vice versa.
 * Runs under either loop backend (IOPLANE_LOOP_BACKEND). Threading: one loop,
 * bound to the test thread. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "block/block.h"
#include "block/file-int.h"
#include "loop/loop.h"
#include "util/iov.h"
#include "util/opts.h"

#define MiB (1024u * 1024u)
#define FILE_SIZE (8 * MiB)
#define WATCHDOG_NS (10ull * 1000000000ull)

struct cfg {
	const char *aio;
	const char *cache;
};

struct fix {
	const struct cfg *cfg;
	char path[64];
	struct blk_node *bs;
};

static struct loop *g_loop;

/* ---- helpers ---- */

static bool g_watchdog_fired;

static void watchdog_cb(struct loop_timer *t)
{
	(void)t;
	g_watchdog_fired = true;
}

/* Blocking rounds until *pending is 0 or the watchdog fires; true if done. */
static bool run_rounds(const unsigned *pending)
{
	struct loop_timer wd = {.cb = watchdog_cb};

	g_watchdog_fired = false;
	loop_timer_arm(g_loop, &wd, loop_now_ns() + WATCHDOG_NS);
	while (*pending && !g_watchdog_fired)
		loop_run_once(g_loop, true);
	if (loop_timer_armed(&wd))
		loop_timer_cancel(g_loop, &wd);
	return *pending == 0;
}

/* The watchdog only turns a hang (a request that never reaches the kernel)
 * into a failure; drain after one so that teardown closes an idle node. */
static void run_until(const unsigned *pending)
{
	unsigned hung;

	if (run_rounds(pending))
		return;
	hung = *pending;
	run_rounds(pending);
	fail_msg("%u request(s) did not complete before the watchdog", hung);
}

struct treq {
	struct blk_request req;
	struct iovec iov;
	unsigned *pending;
	int calls;
	int ret;
};

static void treq_cb(struct blk_request *req, int ret)
{
	struct treq *t = req->opaque;

	t->calls++;
	t->ret = ret;
	(*t->pending)--;
}

static void treq_init(struct treq *t, uint8_t op, uint64_t off, uint64_t len, void *buf,
		      uint32_t flags, unsigned *pending)
{
	memset(t, 0, sizeof(*t));
	t->req.op = op;
	t->req.flags = flags;
	t->req.offset = off;
	t->req.len = len;
	if (buf) {
		t->iov.iov_base = buf;
		t->iov.iov_len = len;
		t->req.iov = &t->iov;
		t->req.iovcnt = 1;
	}
	t->req.cb = treq_cb;
	t->req.opaque = t;
	t->pending = pending;
}

/* Submit one request and run the loop until its callback; returns its result. */
static int do_req(struct blk_node *bs, struct treq *t)
{
	unsigned pending = 1;
	int ret;

	t->pending = &pending;
	ret = blk_submit(bs, &t->req);
	if (ret < 0)
		return ret;
	run_until(&pending);
	assert_int_equal(t->calls, 1);
	return t->ret;
}

static int io(struct blk_node *bs, uint8_t op, uint64_t off, void *buf, uint64_t len,
	      uint32_t flags)
{
	struct treq t;

	treq_init(&t, op, off, len, buf, flags, NULL);
	return do_req(bs, &t);
}

static int status(struct blk_node *bs, uint64_t off, uint64_t len, uint64_t *slen)
{
	struct treq t;
	int ret;

	treq_init(&t, BLK_OP_BLOCK_STATUS, off, len, NULL, 0, NULL);
	ret = do_req(bs, &t);
	assert_int_equal(ret, 0);
	*slen = t.req.status_len;
	return (int)t.req.status;
}

static void fill(void *buf, size_t len, unsigned seed)
{
	uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		p[i] = (uint8_t)((i * 31 + seed * 7 + (i >> 9)) | 1); /* never zero */
}

static bool all_zero(const void *buf, size_t len)
{
	const uint8_t *p = buf;

	for (size_t i = 0; i < len; i++)
		if (p[i])
			return false;
	return true;
}

/* Read the file with a plain fd, bypassing the driver. */
static void raw_read(struct fix *f, uint64_t off, void *buf, size_t len)
{
	int fd = open(f->path, O_RDONLY);

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, buf, len, (off_t)off), (ssize_t)len);
	close(fd);
}

static void raw_write(struct fix *f, uint64_t off, const void *buf, size_t len)
{
	int fd = open(f->path, O_WRONLY);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, buf, len, (off_t)off), (ssize_t)len);
	assert_int_equal(fsync(fd), 0);
	close(fd);
}

static uint64_t raw_blocks(struct fix *f)
{
	struct stat st;

	assert_int_equal(stat(f->path, &st), 0);
	return (uint64_t)st.st_blocks;
}

static int open_node(struct fix *f, const char *extra, struct blk_node **bs, char *err,
		     size_t errlen)
{
	struct kv_opts o = {0};
	char s[256];
	int ret;

	snprintf(s, sizeof(s), "driver=file,filename=%s,cache=%s,aio=%s%s%s", f->path,
		 f->cfg->cache, f->cfg->aio, extra ? "," : "", extra ? extra : "");
	assert_int_equal(kv_parse(&o, s, NULL), 0);
	ret = blk_open(&o, bs, err, errlen);
	kv_free(&o);
	return ret;
}

static int setup(void **state)
{
	struct fix *f = calloc(1, sizeof(*f));
	char err[256] = "";
	int fd;

	assert_non_null(f);
	f->cfg = *state;
	snprintf(f->path, sizeof(f->path), "/var/tmp/ioplane-test-file-XXXXXX");
	fd = mkstemp(f->path);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, FILE_SIZE), 0);
	close(fd);
	if (open_node(f, NULL, &f->bs, err, sizeof(err)) != 0)
		fail_msg("open %s/%s: %s", f->cfg->aio, f->cfg->cache, err);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fix *f = *state;

	if (f->bs)
		blk_close(f->bs);
	unlink(f->path);
	free(f);
	return 0;
}

/* driver=file opens a raw format node on top: the file node is below it. */
static struct blk_node *proto_of(struct blk_node *bs)
{
	return bs->next ? bs->next : bs;
}

static struct blk_node *proto(struct fix *f)
{
	return proto_of(f->bs);
}

static bool has_engine_stats(struct fix *f)
{
	return strcmp(f->cfg->aio, "threads") != 0;
}

static struct file_engine_stats engine_stats(struct fix *f)
{
	struct file_engine_stats st = {0};

	/* -ENOENT: the loop has not used the node yet (all zero). */
	if (has_engine_stats(f) && file_get_engine_stats(proto(f), g_loop, &st) != 0)
		memset(&st, 0, sizeof(st));
	return st;
}

/* ---- tests ---- */

static void test_probe(void **state)
{
	struct fix *f = *state;
	bool direct = !strcmp(f->cfg->cache, "none");

	struct blk_node *p = proto(f);

	assert_string_equal(p->drv->name, "file");
	assert_int_equal(blk_size(f->bs), FILE_SIZE);
	assert_int_equal(blk_size(p), FILE_SIZE);
	if (direct) {
		assert_true(p->align >= 512 && p->align <= 4096);
		assert_true(p->mem_align >= 1 && p->mem_align <= 4096);
	} else {
		assert_int_equal(p->align, 1);
	}
	assert_true(p->max_transfer >= MiB);
	assert_true(blk_can_fua(p));
	assert_true(blk_can_write_zeroes(f->bs));
	assert_true(blk_can_multi_conn(f->bs));
}

/* Patterns at several offsets, plain and FUA, then flush; checked through
 * the driver and through a plain fd. */
static void test_rw(void **state)
{
	static const uint64_t offs[] = {0, 131072, 3 * MiB + 8192, 5 * MiB, FILE_SIZE - 65536};
	struct fix *f = *state;
	size_t len = 65536;
	uint8_t *buf = blk_alloc_buf(f->bs, len), *chk = malloc(len);

	assert_non_null(buf);
	assert_non_null(chk);
	for (unsigned i = 0; i < 5; i++) {
		fill(buf, len, i);
		assert_int_equal(io(f->bs, BLK_OP_WRITE, offs[i], buf, len, i & 1 ? BLK_F_FUA : 0),
				 0);
	}
	assert_int_equal(io(f->bs, BLK_OP_FLUSH, 0, NULL, 0, 0), 0);
	for (unsigned i = 0; i < 5; i++) {
		fill(chk, len, i);
		memset(buf, 0, len);
		assert_int_equal(io(f->bs, BLK_OP_READ, offs[i], buf, len, 0), 0);
		assert_memory_equal(buf, chk, len);
		raw_read(f, offs[i], buf, len);
		assert_memory_equal(buf, chk, len);
	}
	/* Data written behind the driver's back reads back through it. */
	fill(chk, len, 99);
	raw_write(f, MiB, chk, len);
	assert_int_equal(io(f->bs, BLK_OP_READ, MiB, buf, len, 0), 0);
	assert_memory_equal(buf, chk, len);
	free(buf);
	free(chk);
}

static void write_data(struct fix *f, uint64_t off, size_t len, unsigned seed)
{
	uint8_t *buf = blk_alloc_buf(f->bs, len);

	assert_non_null(buf);
	fill(buf, len, seed);
	assert_int_equal(io(f->bs, BLK_OP_WRITE, off, buf, len, 0), 0);
	free(buf);
}

static void check_zero(struct fix *f, uint64_t off, size_t len)
{
	uint8_t *buf = blk_alloc_buf(f->bs, len);

	assert_non_null(buf);
	memset(buf, 0xaa, len);
	assert_int_equal(io(f->bs, BLK_OP_READ, off, buf, len, 0), 0);
	assert_true(all_zero(buf, len));
	raw_read(f, off, buf, len);
	assert_true(all_zero(buf, len));
	free(buf);
}

static void test_discard(void **state)
{
	struct fix *f = *state;
	uint64_t slen, before;

	write_data(f, 0, 2 * MiB, 1);
	assert_int_equal(io(f->bs, BLK_OP_FLUSH, 0, NULL, 0, 0), 0);
	before = raw_blocks(f);
	assert_int_equal(io(f->bs, BLK_OP_DISCARD, 512 * 1024, NULL, MiB, 0), 0);
	assert_true(raw_blocks(f) < before);
	assert_int_equal(status(f->bs, 512 * 1024, MiB, &slen), BLK_STATUS_ZERO);
	assert_int_equal(slen, MiB);
	assert_int_equal(status(f->bs, 0, MiB, &slen), BLK_STATUS_DATA | BLK_STATUS_ALLOCATED);
	assert_int_equal(slen, 512 * 1024);
	check_zero(f, 512 * 1024, MiB);
}

/* MAY_UNMAP: the range becomes a hole. Without it: zeroes, blocks kept. */
static void test_write_zeroes(void **state)
{
	struct fix *f = *state;
	uint64_t slen, before;

	write_data(f, 0, 4 * MiB, 2);
	assert_int_equal(io(f->bs, BLK_OP_FLUSH, 0, NULL, 0, 0), 0);
	before = raw_blocks(f);
	assert_int_equal(
		io(f->bs, BLK_OP_WRITE_ZEROES, MiB, NULL, MiB, BLK_F_MAY_UNMAP | BLK_F_NO_FALLBACK),
		0);
	assert_true(raw_blocks(f) < before);
	assert_int_equal(status(f->bs, MiB, MiB, &slen), BLK_STATUS_ZERO);
	assert_int_equal(slen, MiB);
	check_zero(f, MiB, MiB);

	before = raw_blocks(f);
	assert_int_equal(
		io(f->bs, BLK_OP_WRITE_ZEROES, 2 * MiB, NULL, MiB, BLK_F_NO_FALLBACK | BLK_F_FUA),
		0);
	assert_true(raw_blocks(f) >= before);
	check_zero(f, 2 * MiB, MiB);
	/* Neighbours untouched. */
	assert_int_equal(status(f->bs, 0, MiB, &slen), BLK_STATUS_DATA | BLK_STATUS_ALLOCATED);
	assert_int_equal(slen, MiB);
}

/* data [0,64K) hole [64K,1M) data [1M,1M+64K) hole to EOF */
static void test_block_status(void **state)
{
	struct fix *f = *state;
	const uint32_t data = BLK_STATUS_DATA | BLK_STATUS_ALLOCATED;
	uint64_t slen;

	write_data(f, 0, 65536, 3);
	write_data(f, MiB, 65536, 4);
	assert_int_equal(status(f->bs, 0, FILE_SIZE, &slen), data);
	assert_int_equal(slen, 65536);
	assert_int_equal(status(f->bs, 65536, FILE_SIZE - 65536, &slen), BLK_STATUS_ZERO);
	assert_int_equal(slen, MiB - 65536);
	assert_int_equal(status(f->bs, MiB, 4096, &slen), data);
	assert_int_equal(slen, 4096);
	assert_int_equal(status(f->bs, MiB + 4096, FILE_SIZE, &slen), data);
	assert_int_equal(slen, 65536 - 4096);
	assert_int_equal(status(f->bs, MiB + 65536, FILE_SIZE - MiB - 65536, &slen),
			 BLK_STATUS_ZERO);
	assert_int_equal(slen, FILE_SIZE - MiB - 65536);
}

/* 2000 iovec elements (> IOV_MAX) in a scrambled order: the engine must
 * chunk them and keep element order. */
#define NVEC 2000
static void test_iov_max(void **state)
{
	struct fix *f = *state;
	size_t el = 512, total;
	struct iovec *iov = calloc(NVEC, sizeof(*iov));
	uint8_t *buf, *chk;
	struct file_engine_stats st0 = engine_stats(f), st1;
	struct treq t;

	if (f->bs->align > el)
		el = f->bs->align;
	if (f->bs->mem_align > el)
		el = f->bs->mem_align;
	total = el * NVEC;
	buf = blk_alloc_buf(f->bs, total);
	chk = malloc(total);
	assert_non_null(iov);
	assert_non_null(buf);
	assert_non_null(chk);
	fill(buf, total, 5);
	for (unsigned i = 0; i < NVEC; i++) {
		iov[i].iov_base = buf + (size_t)((i * 7) % NVEC) * el;
		iov[i].iov_len = el;
	}
	treq_init(&t, BLK_OP_WRITE, MiB, total, NULL, 0, NULL);
	t.req.iov = iov;
	t.req.iovcnt = NVEC;
	assert_int_equal(do_req(f->bs, &t), 0);
	raw_read(f, MiB, chk, total);
	for (unsigned i = 0; i < NVEC; i++)
		assert_memory_equal(chk + (size_t)i * el, iov[i].iov_base, el);

	/* Read back into another order. */
	memset(buf, 0, total);
	for (unsigned i = 0; i < NVEC; i++)
		iov[i].iov_base = buf + (size_t)((i * 13) % NVEC) * el;
	treq_init(&t, BLK_OP_READ, MiB, total, NULL, 0, NULL);
	t.req.iov = iov;
	t.req.iovcnt = NVEC;
	assert_int_equal(do_req(f->bs, &t), 0);
	for (unsigned i = 0; i < NVEC; i++)
		assert_memory_equal(chk + (size_t)i * el, iov[i].iov_base, el);
	if (has_engine_stats(f)) {
		st1 = engine_stats(f);
		assert_true(st1.resubmits >= st0.resubmits + 2); /* one more chunk each */
	}
	free(iov);
	free(buf);
	free(chk);
}

/* The file shrinks behind the node's back: a read crossing EOF comes back
 * short and the rest must read as zeroes; a read past EOF is all zeroes. */
static void test_short_read_eof(void **state)
{
	struct fix *f = *state;
	const size_t len = 16384;
	const uint64_t eof = FILE_SIZE - 4096 - 1000;
	uint8_t *buf = blk_alloc_buf(f->bs, len), *chk = malloc(len);
	struct file_engine_stats st0, st1;

	assert_non_null(buf);
	assert_non_null(chk);
	write_data(f, FILE_SIZE - len, len, 6);
	assert_int_equal(io(f->bs, BLK_OP_FLUSH, 0, NULL, 0, 0), 0);
	assert_int_equal(truncate(f->path, (off_t)eof), 0);

	st0 = engine_stats(f);
	memset(buf, 0xaa, len);
	assert_int_equal(io(f->bs, BLK_OP_READ, FILE_SIZE - len, buf, len, 0), 0);
	fill(chk, len, 6);
	memset(chk + (eof - (FILE_SIZE - len)), 0, FILE_SIZE - eof);
	assert_memory_equal(buf, chk, len);
	if (has_engine_stats(f)) {
		st1 = engine_stats(f);
		assert_true(st1.resubmits > st0.resubmits);
	}
	memset(buf, 0xaa, 4096);
	assert_int_equal(io(f->bs, BLK_OP_READ, FILE_SIZE - 4096, buf, 4096, 0), 0);
	assert_true(all_zero(buf, 4096));
	free(buf);
	free(chk);
}

/* Grow the node: the new region reads as zeroes, is a hole, and is writable. */
static void test_grow(void **state)
{
	struct fix *f = *state;
	uint64_t slen;

	assert_int_equal(blk_truncate(f->bs, FILE_SIZE + 4 * MiB), 0);
	assert_int_equal(blk_size(f->bs), FILE_SIZE + 4 * MiB);
	check_zero(f, FILE_SIZE, 4 * MiB);
	assert_int_equal(status(f->bs, FILE_SIZE, 4 * MiB, &slen), BLK_STATUS_ZERO);
	assert_int_equal(slen, 4 * MiB);
	write_data(f, FILE_SIZE + MiB, 65536, 7);
	assert_int_equal(status(f->bs, FILE_SIZE + MiB, 65536, &slen),
			 BLK_STATUS_DATA | BLK_STATUS_ALLOCATED);
}

/* Many more requests than the native context holds: all complete once. */
#define NREQ 1024
static void submit_all(struct fix *f, struct treq *t, uint8_t op, uint8_t *buf, unsigned *pending)
{
	for (unsigned i = 0; i < NREQ; i++) {
		treq_init(&t[i], op, (uint64_t)i * 4096, 4096, buf + (size_t)i * 4096, 0, pending);
		(*pending)++;
		assert_int_equal(blk_submit(f->bs, &t[i].req), 0);
	}
}

static void test_many_in_flight(void **state)
{
	struct fix *f = *state;
	struct treq *t = calloc(NREQ, sizeof(*t));
	uint8_t *buf = blk_alloc_buf(f->bs, (size_t)NREQ * 4096), *chk = malloc(NREQ * 4096);
	struct file_engine_stats st0 = engine_stats(f), st1;
	unsigned pending = 0;

	assert_non_null(t);
	assert_non_null(buf);
	assert_non_null(chk);
	fill(buf, (size_t)NREQ * 4096, 8);
	memcpy(chk, buf, (size_t)NREQ * 4096);
	submit_all(f, t, BLK_OP_WRITE, buf, &pending);
	run_until(&pending);
	for (unsigned i = 0; i < NREQ; i++) {
		assert_int_equal(t[i].calls, 1);
		assert_int_equal(t[i].ret, 0);
	}
	memset(buf, 0, (size_t)NREQ * 4096);
	submit_all(f, t, BLK_OP_READ, buf, &pending);
	run_until(&pending);
	for (unsigned i = 0; i < NREQ; i++) {
		assert_int_equal(t[i].calls, 1);
		assert_int_equal(t[i].ret, 0);
	}
	assert_memory_equal(buf, chk, (size_t)NREQ * 4096);
	if (!strcmp(f->cfg->aio, "native")) {
		st1 = engine_stats(f);
		assert_true(st1.queued_max >= NREQ);          /* queued past the context */
		assert_true(st1.max_batch <= FILE_AIO_DEPTH); /* never more in the kernel */
		assert_true(st1.submit_calls - st0.submit_calls >= 2 * NREQ / FILE_AIO_DEPTH);
		assert_int_equal(st1.in_flight, 0);
	}
	free(t);
	free(buf);
	free(chk);
}

/* 32 reads queued in one round on node BS; returns the engine's statistics
 * before (*st0) and after. */
static struct file_engine_stats read_32(struct fix *f, struct blk_node *bs,
					struct file_engine_stats *st0)
{
	struct treq t[32];
	uint8_t *buf = blk_alloc_buf(bs, 32 * 4096);
	struct file_engine_stats st1 = {0};
	unsigned pending = 0;

	assert_non_null(buf);
	/* Make sure the per-loop engine state exists before measuring. */
	assert_int_equal(io(bs, BLK_OP_READ, 0, buf, 4096, 0), 0);
	if (has_engine_stats(f))
		assert_int_equal(file_get_engine_stats(proto_of(bs), g_loop, st0), 0);
	for (unsigned i = 0; i < 32; i++) {
		treq_init(&t[i], BLK_OP_READ, (uint64_t)i * 65536, 4096, buf + i * 4096, 0,
			  &pending);
		pending++;
		assert_int_equal(blk_submit(bs, &t[i].req), 0);
		assert_int_equal(t[i].calls, 0); /* never completed inside submit */
	}
	run_until(&pending);
	for (unsigned i = 0; i < 32; i++) {
		assert_int_equal(t[i].calls, 1);
		assert_int_equal(t[i].ret, 0);
	}
	if (has_engine_stats(f))
		assert_int_equal(file_get_engine_stats(proto_of(bs), g_loop, &st1), 0);
	free(buf);
	return st1;
}

/* 32 reads queued in one round reach the kernel together: in one submit call
 * with io_uring, in calls of FILE_AIO_MAX_BATCH_NATIVE with native. */
static void test_batch(void **state)
{
	struct fix *f = *state;
	struct file_engine_stats st0 = {0}, st1 = read_32(f, f->bs, &st0);
	bool native = !strcmp(f->cfg->aio, "native");
	unsigned per_call = native ? FILE_AIO_MAX_BATCH_NATIVE : 32;

	if (has_engine_stats(f)) {
		assert_int_equal(st1.submit_calls - st0.submit_calls, 32 / per_call);
		assert_int_equal(st1.last_batch, per_call);
		assert_int_equal(st1.max_batch, per_call);
		assert_int_equal(st1.submitted - st0.submitted, 32);
	}
}

/* aio-max-batch=5: 32 reads go in calls of 5, 5, 5, 5, 5, 5, 2; =0 is the
 * engine's default. */
static void test_max_batch(void **state)
{
	struct fix *f = *state;
	struct file_engine_stats st0 = {0}, st1;
	struct blk_node *bs = NULL;
	char err[256] = "";

	if (open_node(f, "aio-max-batch=5", &bs, err, sizeof(err)) != 0)
		fail_msg("open with aio-max-batch=5: %s", err);
	st1 = read_32(f, bs, &st0);
	if (has_engine_stats(f)) {
		assert_int_equal(st1.submit_calls - st0.submit_calls, 7);
		assert_int_equal(st1.last_batch, 2);
		assert_int_equal(st1.max_batch, 5);
		assert_int_equal(st1.submitted - st0.submitted, 32);
	}
	blk_close(bs);
	bs = NULL;
	if (open_node(f, "aio-max-batch=0", &bs, err, sizeof(err)) != 0)
		fail_msg("open with aio-max-batch=0: %s", err);
	st1 = read_32(f, bs, &st0);
	if (has_engine_stats(f))
		assert_int_equal(st1.max_batch,
				 strcmp(f->cfg->aio, "native") ? 32 : FILE_AIO_MAX_BATCH_NATIVE);
	blk_close(bs);
}

/* The iothread's aio-max-batch (the loop's): 3 alone; with the node's 5 the
 * smaller wins, as in QEMU. */
static void test_loop_max_batch(void **state)
{
	struct fix *f = *state;
	struct file_engine_stats st0 = {0}, st1;
	struct blk_node *bs = NULL;
	char err[256] = "";

	loop_set_aio_max_batch(g_loop, 3);
	for (int i = 0; i < 2; i++) {
		if (open_node(f, i ? "aio-max-batch=5" : "aio-max-batch=0", &bs, err,
			      sizeof(err)) != 0)
			fail_msg("open: %s", err);
		st1 = read_32(f, bs, &st0);
		if (has_engine_stats(f)) {
			assert_int_equal(st1.submit_calls - st0.submit_calls, 11);
			assert_int_equal(st1.max_batch, 3);
		}
		blk_close(bs);
		bs = NULL;
	}
	loop_set_aio_max_batch(g_loop, 0);
}

/* detach_loop drops the per-loop state; the next request rebuilds it. */
static void test_detach(void **state)
{
	struct fix *f = *state;
	struct file_engine_stats st;
	uint8_t *buf = blk_alloc_buf(f->bs, 4096);

	assert_non_null(buf);
	write_data(f, 0, 4096, 9);
	blk_detach_loop(f->bs, g_loop);
	assert_int_equal(file_get_engine_stats(proto(f), g_loop, &st), -ENOENT);
	assert_int_equal(io(f->bs, BLK_OP_READ, 0, buf, 4096, 0), 0);
	if (has_engine_stats(f)) {
		assert_int_equal(file_get_engine_stats(proto(f), g_loop, &st), 0);
		assert_int_equal(st.submitted, 1);
	}
	free(buf);
}

/* The continuation logic shared by the engines, driven with made-up results
 * (-EAGAIN cannot be provoked from a regular file on demand). */
static void test_rw_advance(void **state)
{
	static char a[100], b[50], c[200];
	struct iovec iov[4] = {{a, 100}, {NULL, 0}, {b, 50}, {c, 200}};
	struct blk_request req = {
		.op = BLK_OP_READ, .offset = 1000, .len = 350, .iov = iov, .iovcnt = 4};
	struct iovec *many = calloc(NVEC, sizeof(*many));
	struct file_piece p;
	struct file_rw rw;

	(void)state;
	file_rw_init(&rw, &req);
	file_rw_piece(&rw, &req, &p);
	assert_false(p.single);
	assert_int_equal(p.cnt, 4);
	assert_int_equal(file_rw_advance(&rw, &req, -EAGAIN), FILE_RW_AGAIN);
	assert_int_equal(file_rw_advance(&rw, &req, -EINTR), FILE_RW_AGAIN);
	assert_int_equal(rw.pos, 1000);
	assert_int_equal(rw.left, 350);
	assert_int_equal(file_rw_advance(&rw, &req, 60), FILE_RW_AGAIN);
	file_rw_piece(&rw, &req, &p);
	assert_true(p.single);
	assert_ptr_equal(p.buf, a + 60);
	assert_int_equal(p.len, 40);
	assert_int_equal(file_rw_advance(&rw, &req, 40), FILE_RW_AGAIN);
	file_rw_piece(&rw, &req, &p); /* the empty element is skipped */
	assert_ptr_equal(p.iov, &iov[2]);
	assert_int_equal(p.cnt, 2);
	assert_int_equal(file_rw_advance(&rw, &req, 70), FILE_RW_AGAIN);
	assert_int_equal(rw.pos, 1170);
	file_rw_piece(&rw, &req, &p);
	assert_ptr_equal(p.buf, c + 20);
	assert_int_equal(p.len, 180);
	memset(c, 0xff, sizeof(c));
	assert_int_equal(file_rw_advance(&rw, &req, 0), FILE_RW_DONE); /* EOF: zero-fill */
	assert_int_equal((uint8_t)c[19], 0xff);
	assert_true(all_zero(c + 20, 180));
	assert_int_equal(file_rw_advance(&rw, &req, -EIO), FILE_RW_FAILED);
	assert_int_equal(rw.err, -EIO);

	req.op = BLK_OP_WRITE;
	file_rw_init(&rw, &req);
	assert_int_equal(file_rw_advance(&rw, &req, 0), FILE_RW_FAILED);
	assert_int_equal(rw.err, -ENOSPC);
	assert_int_equal(file_rw_advance(&rw, &req, 351), FILE_RW_FAILED);
	assert_int_equal(rw.err, -EIO);
	assert_int_equal(file_rw_advance(&rw, &req, 350), FILE_RW_DONE);

	assert_non_null(many);
	for (unsigned i = 0; i < NVEC; i++) {
		many[i].iov_base = a;
		many[i].iov_len = 1;
	}
	req.iov = many;
	req.iovcnt = NVEC;
	req.len = NVEC;
	file_rw_init(&rw, &req);
	file_rw_piece(&rw, &req, &p);
	assert_int_equal(p.cnt, IOV_MAX);
	assert_int_equal(file_rw_advance(&rw, &req, IOV_MAX), FILE_RW_AGAIN);
	file_rw_piece(&rw, &req, &p);
	assert_ptr_equal(p.iov, &many[IOV_MAX]);
	assert_int_equal(p.cnt, NVEC - IOV_MAX);
	free(many);
}

static int open_opts(const char *s, struct blk_node **bs, char *err, size_t errlen)
{
	struct kv_opts o = {0};
	int ret;

	assert_int_equal(kv_parse(&o, s, NULL), 0);
	ret = blk_open(&o, bs, err, errlen);
	kv_free(&o);
	return ret;
}

/* A FIFO is refused at once, read-only or not (open(2) on it used to block
 * until a writer came), and a regular file's fd is left blocking. */
static void test_options_fifo(const char *file)
{
	char fifo[80], s[256], err[256];
	struct blk_node *bs = NULL;

	snprintf(fifo, sizeof(fifo), "%s.fifo", file);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	snprintf(s, sizeof(s), "driver=file,filename=%s", fifo);
	assert_int_equal(open_opts(s, &bs, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "is a FIFO"));
	snprintf(s, sizeof(s), "driver=file,filename=%s,read-only=on", fifo);
	assert_int_equal(open_opts(s, &bs, err, sizeof(err)), -EINVAL);
	assert_int_equal(blk_file_open(fifo, O_WRONLY, 0, err, sizeof(err)), -EINVAL);
	unlink(fifo);
	snprintf(s, sizeof(s), "driver=file,filename=%s", file);
	assert_int_equal(open_opts(s, &bs, err, sizeof(err)), 0);
	assert_int_equal(fcntl(file_state(bs->next)->fd, F_GETFL) & O_NONBLOCK, 0);
	blk_close(bs);
}

static void test_options(void **state)
{
	char path[64] = "/var/tmp/ioplane-test-file-XXXXXX", s[256], err[256];
	struct blk_node *bs = NULL;
	uint8_t buf[4096] = {0};
	int fd = mkstemp(path);

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, MiB), 0);
	close(fd);
	assert_int_equal(open_opts("driver=file", &bs, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "filename"));
	snprintf(s, sizeof(s), "driver=file,filename=%s,cache=bogus", path);
	assert_int_equal(open_opts(s, &bs, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "cache"));
	snprintf(s, sizeof(s), "driver=file,filename=%s,aio=bogus", path);
	assert_int_equal(open_opts(s, &bs, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "aio"));
	snprintf(s, sizeof(s), "driver=file,filename=%s,aio-max-batch=many", path);
	assert_int_equal(open_opts(s, &bs, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "aio-max-batch"));
	snprintf(s, sizeof(s), "driver=file,filename=%s,aio=native,aio-max-batch=%d", path,
		 FILE_AIO_DEPTH + 1);
	assert_int_equal(open_opts(s, &bs, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "aio-max-batch"));
	snprintf(s, sizeof(s), "driver=file,filename=%s,aio=native,aio-max-batch=%d", path,
		 FILE_AIO_DEPTH);
	assert_int_equal(open_opts(s, &bs, err, sizeof(err)), 0);
	blk_close(bs);
	assert_int_equal(
		open_opts("driver=file,filename=/var/tmp/ioplane-no/such", &bs, err, sizeof(err)),
		-ENOENT);
	assert_int_equal(open_opts("driver=file,filename=/var/tmp", &bs, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "'/var/tmp' is a directory"));
	assert_int_equal(open_opts("driver=file,filename=/dev/null", &bs, err, sizeof(err)),
			 -EINVAL);
	assert_non_null(strstr(err, "character device, not a regular file"));
	test_options_fifo(path);

	/* read-only: reads work, writes are refused. */
	snprintf(s, sizeof(s), "driver=file,filename=%s,read-only=on", path);
	assert_int_equal(open_opts(s, &bs, err, sizeof(err)), 0);
	assert_int_equal(io(bs, BLK_OP_READ, 0, buf, sizeof(buf), 0), 0);
	assert_int_equal(io(bs, BLK_OP_WRITE, 0, buf, sizeof(buf), 0), -EROFS);
	blk_close(bs);
	unlink(path);
}

/* ---- main ---- */

static const struct cfg cfgs[] = {
	{"io_uring", "writeback"}, {"io_uring", "none"},     {"native", "writeback"},
	{"native", "none"},        {"threads", "writeback"}, {"threads", "none"},
};

#define T(fn, i) cmocka_unit_test_prestate_setup_teardown(fn, setup, teardown, (void *)&cfgs[i])
#define CFG_TESTS(i)                                                                               \
	T(test_probe, i), T(test_rw, i), T(test_discard, i), T(test_write_zeroes, i),              \
		T(test_block_status, i), T(test_iov_max, i), T(test_short_read_eof, i),            \
		T(test_grow, i), T(test_many_in_flight, i), T(test_batch, i),                      \
		T(test_max_batch, i), T(test_loop_max_batch, i), T(test_detach, i)

static int group_setup(void **state)
{
	struct loop_opts opts = {0};

	(void)state;
	opts.poll_max_ns = -1;
	if (loop_new(&opts, &g_loop) != 0)
		return -1;
	loop_bind_current(g_loop);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	loop_free(g_loop);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_rw_advance),
		cmocka_unit_test(test_options),
		CFG_TESTS(0),
		CFG_TESTS(1),
		CFG_TESTS(2),
		CFG_TESTS(3),
		CFG_TESTS(4),
		CFG_TESTS(5),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
