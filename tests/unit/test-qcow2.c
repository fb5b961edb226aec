/* Unit tests for the qcow2 driver against qemu-img as the reference: images
 * made by qemu-img with a matrix of options read back identical to
 * `qemu-img convert -O raw`; images written by ioplane (and made by
 * qcow2_create) pass `qemu-img check` and `qemu-img compare`; hostile
 * headers are refused. Tests needing qemu-img skip with a message when it
 * is missing. Threading: one loop on the test thread. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "block/block.h"
#include "block/qcow2/qcow2-int.h"
#include "block/qcow2/qcow2.h"
#include "loop/iothread.h"
#include "loop/loop.h"
#include "util/iov.h"

static char dir[200];
static struct loop *loop;
static bool have_qemu;

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static int sh(const char *fmt, ...)
{
	char cmd[2048];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *path(const char *name)
{
	static char p[8][256];
	static unsigned i;

	i = (i + 1) % 8;
	snprintf(p[i], sizeof(p[i]), "%s/%s", dir, name);
	return p[i];
}

static int group_setup(void **state)
{
	struct loop_opts lo = { .poll_max_ns = 0 };

	(void)state;
	/* QCOW2_TEST_DIR: run on another file system (XFS on a loop device...). */
	snprintf(dir, sizeof(dir), "%s/ioplane-qcow2-XXXXXX",
		 getenv("QCOW2_TEST_DIR") ? getenv("QCOW2_TEST_DIR") : "/tmp");
	if (!mkdtemp(dir))
		return -1;
	if (loop_new(&lo, &loop))
		return -1;
	loop_bind_current(loop);
	have_qemu = sh("qemu-img --version >/dev/null 2>&1") == 0 &&
		    sh("qemu-io --version >/dev/null 2>&1") == 0;
	if (!have_qemu)
		print_message("qemu-img/qemu-io not found: interop tests are skipped\n");
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	if (!getenv("QCOW2_TEST_KEEP"))
		sh("rm -rf %s", dir);
	loop_bind_current(NULL);
	loop_free(loop);
	return 0;
}

#define NEED_QEMU()                                                      \
	do {                                                             \
		if (!have_qemu) {                                        \
			print_message("skipped: qemu-img not installed\n"); \
			skip();                                          \
		}                                                        \
	} while (0)

static struct blk_node *open_img(const char *p, const char *extra, int *ret, char *err, size_t n)
{
	struct blk_node *bs = NULL;

	*ret = blk_open_target(p, "qcow2", extra, &bs, err, n);
	return bs;
}

static struct blk_node *open_ok(const char *p, const char *extra)
{
	char err[512] = "";
	int ret;
	struct blk_node *bs = open_img(p, extra, &ret, err, sizeof(err));

	if (ret)
		print_message("open %s: %s\n", p, err);
	assert_int_equal(ret, 0);
	return bs;
}

static uint8_t *read_file(const char *p, uint64_t *len)
{
	struct stat st;
	uint8_t *b;
	FILE *f = fopen(p, "rb");

	assert_non_null(f);
	assert_int_equal(fstat(fileno(f), &st), 0);
	b = malloc((size_t)st.st_size + 1);
	assert_non_null(b);
	assert_int_equal(fread(b, 1, (size_t)st.st_size, f), (size_t)st.st_size);
	fclose(f);
	*len = (uint64_t)st.st_size;
	return b;
}

/* Read the whole image through ioplane in odd-sized pieces and compare with
 * qemu-img's raw conversion. */
static void compare_with_qemu(const char *img, const char *extra)
{
	uint64_t len, off, n;
	uint8_t *want, *got;
	struct blk_node *bs;

	assert_int_equal(sh("qemu-img convert -O raw %s %s", img, path("ref.raw")), 0);
	want = read_file(path("ref.raw"), &len);
	bs = open_ok(img, extra);
	assert_int_equal(blk_size(bs), len);
	got = malloc(len + 1);
	assert_non_null(got);
	for (off = 0; off < len; off += n) {
		n = (off / 4096) % 3 == 0 ? 4096 : 3 * 65536 + 8192;
		if (n > len - off)
			n = len - off;
		assert_int_equal(blk_pread(bs, off, got + off, n), 0);
	}
	if (memcmp(want, got, len)) {
		for (off = 0; off < len && want[off] == got[off]; off++)
			;
		print_message("%s: first difference at %llu\n", img, (unsigned long long)off);
	}
	assert_memory_equal(want, got, len);
	/* Our own check agrees with qemu-img's (which found these clean). */
	if (!extra || !strstr(extra, "read-only")) {
		struct qcow2_check_result r;

		assert_int_equal(qcow2_check(bs, 0, &r), 0);
		if (r.corruptions + r.leaks)
			print_message("%s: check: %s\n", img, r.first_error);
		assert_int_equal(r.corruptions + r.leaks + r.check_errors, 0);
	}
	blk_close(bs);
	free(want);
	free(got);
}

/* qemu-io writes of patterns, zeroes and discards. */
static void qemu_fill(const char *img, const char *fmt)
{
	assert_int_equal(sh("qemu-io -f %s -c 'write -P 0x11 0 70k' -c 'write -P 0x22 1M 4k' "
			    "-c 'write -P 0x33 3M 1M' -c 'write -z 3200k 64k' "
			    "-c 'write -P 0x44 5000k 3k' -c 'discard 3M 64k' %s >/dev/null",
			    fmt, img), 0);
}

static void test_read_matrix(void **state)
{
	static const char *const opts[] = {
		"cluster_size=65536",
		"cluster_size=512",
		"cluster_size=4096,refcount_bits=1",
		"cluster_size=2M",
		"compat=0.10",
		"refcount_bits=64",
		"refcount_bits=2,cluster_size=16k",
		"extended_l2=on",
		"extended_l2=on,cluster_size=2M",
		"lazy_refcounts=on",
		"preallocation=metadata",
		"preallocation=falloc,cluster_size=128k",
		"preallocation=full,extended_l2=on",
	};
	size_t i;

	(void)state;
	NEED_QEMU();
	for (i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
		assert_int_equal(sh("qemu-img create -q -f qcow2 -o %s %s 8M", opts[i],
				    path("m.qcow2")), 0);
		qemu_fill(path("m.qcow2"), "qcow2");
		compare_with_qemu(path("m.qcow2"), NULL);
	}
}

static void test_read_compressed(void **state)
{
	static const char *const ct[] = { "zlib", "zstd" };
	size_t i;

	(void)state;
	NEED_QEMU();
	for (i = 0; i < 2; i++) {
		assert_int_equal(sh("qemu-img create -q -f raw %s 8M", path("c.raw")), 0);
		qemu_fill(path("c.raw"), "raw");
		/* Text compresses; the pattern fill does too. */
		assert_int_equal(sh("qemu-img convert -c -O qcow2 -o compression_type=%s %s %s",
				    ct[i], path("c.raw"), path("c.qcow2")), 0);
		compare_with_qemu(path("c.qcow2"), NULL);
	}
}

static void test_read_backing(void **state)
{
	(void)state;
	NEED_QEMU();
	/* raw <- qcow2 <- qcow2 (smaller backing, larger top) */
	assert_int_equal(sh("qemu-img create -q -f raw %s 4M", path("b0.raw")), 0);
	assert_int_equal(sh("qemu-io -f raw -c 'write -P 0x55 0 4M' %s >/dev/null",
			    path("b0.raw")), 0);
	assert_int_equal(sh("qemu-img create -q -f qcow2 -b b0.raw -F raw %s 6M",
			    path("b1.qcow2")), 0);
	assert_int_equal(sh("qemu-io -c 'write -P 0x66 60k 8k' -c 'write -z 1M 64k' %s >/dev/null",
			    path("b1.qcow2")), 0);
	assert_int_equal(sh("qemu-img create -q -f qcow2 -o extended_l2=on -b b1.qcow2 -F qcow2 "
			    "%s 8M", path("b2.qcow2")), 0);
	assert_int_equal(sh("qemu-io -c 'write -P 0x77 100k 3k' -c 'write -P 0x78 5M 4k' "
			    "%s >/dev/null", path("b2.qcow2")), 0);
	compare_with_qemu(path("b2.qcow2"), NULL);
}

static void test_backing_needs_format(void **state)
{
	struct qcow2_create_opts o = { .size = 1u << 20, .backing_file = "nb.raw",
				       .backing_fmt = "raw" };
	uint8_t ext[4] = { 0x12, 0x34, 0x56, 0x78 };
	char err[512] = "";
	int fd, ret;

	(void)state;
	fd = open(path("nb.raw"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 1 << 20), 0);
	close(fd);
	assert_int_equal(qcow2_create(path("nb.qcow2"), &o, err, sizeof(err)), 0);
	blk_close(open_ok(path("nb.qcow2"), NULL));
	/* Turn the backing format extension (the first one, right after the
	 * 112-byte header) into an unknown one: no declared format now. */
	fd = open(path("nb.qcow2"), O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, ext, 4, 112), 4);
	close(fd);
	assert_null(open_img(path("nb.qcow2"), NULL, &ret, err, sizeof(err)));
	assert_int_equal(ret, -EINVAL);
	assert_non_null(strstr(err, "never probed"));
	/* Given explicitly, it opens. */
	blk_close(open_ok(path("nb.qcow2"), "backing-format=raw"));
}

static void test_read_snapshot_image(void **state)
{
	(void)state;
	NEED_QEMU();
	assert_int_equal(sh("qemu-img create -q -f qcow2 %s 4M", path("s.qcow2")), 0);
	assert_int_equal(sh("qemu-io -c 'write -P 0x12 0 1M' %s >/dev/null", path("s.qcow2")), 0);
	assert_int_equal(sh("qemu-img snapshot -c snap1 %s", path("s.qcow2")), 0);
	assert_int_equal(sh("qemu-io -c 'write -P 0x13 64k 64k' %s >/dev/null", path("s.qcow2")), 0);
	compare_with_qemu(path("s.qcow2"), NULL);
}

/* ---- writes ---- */

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return rng_state;
}

static void write_file(const char *p, const uint8_t *b, uint64_t len)
{
	FILE *f = fopen(p, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(b, 1, len, f), len);
	fclose(f);
}

static void qemu_check_clean(const char *img)
{
	int st = sh("qemu-img check -q %s", img);

	if (st)
		sh("qemu-img check %s | head -20", img);
	assert_int_equal(st, 0);
}

static int do_req(struct blk_node *bs, uint8_t op, uint64_t off, uint64_t len, uint32_t flags)
{
	struct blk_request req = { .op = op, .offset = off, .len = len, .flags = flags };

	return blk_do_sync(bs, &req);
}

/* Random writes, write-zeroes and discards against a model. */
static void random_workload(struct blk_node *bs, uint8_t *model, uint64_t size, unsigned n,
			    uint64_t cs)
{
	uint8_t *buf = malloc(3 * cs + 8192);
	unsigned i;

	assert_non_null(buf);
	for (i = 0; i < n; i++) {
		uint64_t r = rnd(), off, len;
		unsigned kind = (unsigned)(r % 10);

		len = 1 + rnd() % (kind < 2 ? 3 * cs : cs + 4096);
		off = rnd() % size;
		if (rnd() % 2) {
			off &= ~511ull;
			len = (len + 511) & ~511ull;
		}
		if (off + len > size)
			len = size - off;
		if (kind < 7) {
			memset(buf, (int)(r >> 24) | 1, len);
			buf[0] = (uint8_t)i;
			assert_int_equal(blk_pwrite(bs, off, buf, len, 0), 0);
			memcpy(model + off, buf, len);
		} else if (kind < 9) {
			assert_int_equal(do_req(bs, BLK_OP_WRITE_ZEROES, off, len,
						kind == 8 ? BLK_F_MAY_UNMAP : 0), 0);
			memset(model + off, 0, len);
		} else {
			/* Discard: content unspecified; re-zero the model after
			 * writing zeroes ourselves to keep it exact. */
			off &= ~(cs - 1);
			len = cs;
			if (off + len > size)
				continue;
			assert_int_equal(do_req(bs, BLK_OP_DISCARD, off, len, 0), 0);
			assert_int_equal(do_req(bs, BLK_OP_WRITE_ZEROES, off, len, 0), 0);
			memset(model + off, 0, len);
		}
		if (i % 37 == 0)
			assert_int_equal(blk_flush_sync(bs), 0);
	}
	free(buf);
}

static void verify_model(struct blk_node *bs, const uint8_t *model, uint64_t size)
{
	uint8_t *got = malloc(size);

	assert_non_null(got);
	assert_int_equal(blk_pread(bs, 0, got, size), 0);
	assert_memory_equal(got, model, size);
	free(got);
}

static void write_and_check(const char *img, uint64_t size, uint64_t cs, const char *extra,
			    const uint8_t *base)
{
	uint8_t *model = calloc(1, size);
	struct blk_node *bs;

	assert_non_null(model);
	if (base)
		memcpy(model, base, size);
	bs = open_ok(img, extra);
	random_workload(bs, model, size, 300, cs);
	verify_model(bs, model, size);
	blk_close(bs);
	qemu_check_clean(img);
	write_file(path("model.raw"), model, size);
	assert_int_equal(sh("qemu-img compare -q %s %s", path("model.raw"), img), 0);
	/* and read back by ourselves after reopening */
	bs = open_ok(img, extra);
	verify_model(bs, model, size);
	blk_close(bs);
	free(model);
}

static void test_write_qemu_images(void **state)
{
	static const struct { const char *o; uint64_t cs; } m[] = {
		{ "cluster_size=65536", 65536 },
		{ "cluster_size=512", 512 },
		{ "cluster_size=4096,refcount_bits=1", 4096 },
		{ "compat=0.10", 65536 },
		{ "refcount_bits=64,cluster_size=16k", 16384 },
		{ "extended_l2=on", 65536 },
		{ "extended_l2=on,cluster_size=16k", 16384 },
		{ "lazy_refcounts=on", 65536 },
		{ "preallocation=metadata,cluster_size=8k", 8192 },
		{ "cluster_size=2M", 2u << 20 },
	};
	size_t i;

	(void)state;
	NEED_QEMU();
	for (i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
		assert_int_equal(sh("qemu-img create -q -f qcow2 -o %s %s 12M", m[i].o,
				    path("w.qcow2")), 0);
		write_and_check(path("w.qcow2"), 12u << 20, m[i].cs, NULL, NULL);
	}
}

/* O_DIRECT: requests and metadata go through the alignment path when
 * clusters are smaller than the device's block. */
static void test_write_direct(void **state)
{
	static const char *const eng[] = { "cache=none,aio=native", "cache=none,aio=io_uring",
					   "cache=none,aio=threads" };
	static const uint32_t cs[] = { 65536, 512, 16384 };
	struct qcow2_create_opts o = { .size = 6u << 20 };
	char err[256];
	size_t i;

	(void)state;
	NEED_QEMU();
	for (i = 0; i < 3; i++) {
		o.cluster_size = cs[i];
		o.extended_l2 = cs[i] == 16384;
		assert_int_equal(qcow2_create(path("d.qcow2"), &o, err, sizeof(err)), 0);
		write_and_check(path("d.qcow2"), 6u << 20, cs[i], eng[i], NULL);
		compare_with_qemu(path("d.qcow2"), eng[i]);
	}
}

static void test_write_backing_cow(void **state)
{
	uint64_t len;
	uint8_t *base;

	(void)state;
	NEED_QEMU();
	assert_int_equal(sh("qemu-img create -q -f raw %s 6M", path("bb.raw")), 0);
	assert_int_equal(sh("qemu-io -f raw -c 'write -P 0x5a 0 5M' %s >/dev/null",
			    path("bb.raw")), 0);
	base = read_file(path("bb.raw"), &len);
	assert_int_equal(sh("qemu-img create -q -f qcow2 -b bb.raw -F raw %s 6M",
			    path("bt.qcow2")), 0);
	write_and_check(path("bt.qcow2"), 6u << 20, 65536, NULL, base);
	assert_int_equal(sh("qemu-img create -q -f qcow2 -o extended_l2=on -b bb.raw -F raw "
			    "%s 6M", path("bx.qcow2")), 0);
	write_and_check(path("bx.qcow2"), 6u << 20, 65536, NULL, base);
	free(base);
}

/* Writes into clusters shared with an internal snapshot copy them: the
 * snapshot still reads as before. */
static void test_write_snapshot_cow(void **state)
{
	uint8_t buf[8192];
	struct blk_node *bs;
	uint64_t len;
	uint8_t *snap;

	(void)state;
	NEED_QEMU();
	assert_int_equal(sh("qemu-img create -q -f qcow2 %s 4M", path("sc.qcow2")), 0);
	assert_int_equal(sh("qemu-io -c 'write -P 0x21 0 2M' -c 'write -c -P 0x22 2M 64k' "
			    "%s >/dev/null", path("sc.qcow2")), 0);
	assert_int_equal(sh("qemu-img snapshot -c s1 %s", path("sc.qcow2")), 0);
	assert_int_equal(sh("qemu-img convert -O raw %s %s", path("sc.qcow2"), path("s1.raw")), 0);
	bs = open_ok(path("sc.qcow2"), NULL);
	memset(buf, 0x31, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 4096, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_pwrite(bs, (2u << 20) + 100, buf, 500, 0), 0);
	assert_int_equal(do_req(bs, BLK_OP_DISCARD, 1u << 20, 65536, 0), 0);
	blk_close(bs);
	qemu_check_clean(path("sc.qcow2"));
	assert_int_equal(sh("qemu-img convert -l snapshot.name=s1 -O raw %s %s",
			    path("sc.qcow2"), path("s1b.raw")), 0);
	assert_int_equal(sh("cmp -s %s %s", path("s1.raw"), path("s1b.raw")), 0);
	snap = read_file(path("s1.raw"), &len);
	compare_with_qemu(path("sc.qcow2"), NULL);
	free(snap);
}

/* Many writes in flight, overlapping the same clusters. */
struct cw {
	struct blk_request req;
	struct iovec iov;
	uint8_t *buf;
	int ret;
	bool done;
};

static void cw_cb(struct blk_request *req, int ret)
{
	struct cw *c = (struct cw *)req;

	c->ret = ret;
	c->done = true;
}

static void test_concurrent_writes(void **state)
{
	enum { N = 96, SZ = 4 << 20 };
	static struct cw c[N];
	uint8_t *model = calloc(1, SZ);
	struct qcow2_create_opts o = { .size = SZ, .cluster_size = 65536 };
	struct blk_node *bs;
	char err[256];
	unsigned i, done;

	(void)state;
	assert_int_equal(qcow2_create(path("cc.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("cc.qcow2"), NULL);
	/* Each request writes a distinct 4 KiB block; neighbours share
	 * clusters, so allocations of the same cluster race. */
	for (i = 0; i < N; i++) {
		uint64_t off = ((uint64_t)(i % 24) << 16) + ((uint64_t)(i / 24) << 12) + 512 * (i & 1);

		c[i].buf = malloc(4096);
		memset(c[i].buf, (int)i + 1, 4096);
		memcpy(model + off, c[i].buf, 4096);
		c[i].iov = (struct iovec){ c[i].buf, 4096 };
		c[i].req = (struct blk_request){ .op = BLK_OP_WRITE, .offset = off, .len = 4096,
						 .iov = &c[i].iov, .iovcnt = 1, .cb = cw_cb };
		assert_int_equal(blk_submit(bs, &c[i].req), 0);
	}
	for (done = 0; done < N;) {
		loop_run_once(loop, true);
		for (done = 0, i = 0; i < N; i++)
			done += c[i].done;
	}
	for (i = 0; i < N; i++) {
		assert_int_equal(c[i].ret, 0);
		free(c[i].buf);
	}
	verify_model(bs, model, SZ);
	blk_close(bs);
	if (have_qemu) {
		qemu_check_clean(path("cc.qcow2"));
		write_file(path("ccm.raw"), model, SZ);
		assert_int_equal(sh("qemu-img compare -q %s %s", path("ccm.raw"), path("cc.qcow2")), 0);
	}
	free(model);
}

/* Two iothreads write into the same clusters at once: allocations, waits
 * and merges cross loops. */
enum { MT_PER = 256, MT_SZ = 8 << 20 };

struct mt_ctx {
	struct blk_node *bs;
	struct cw *c;
	unsigned id;
	int done; /* atomic */
};

static void mt_cb(struct blk_request *req, int ret)
{
	struct cw *c = (struct cw *)req;
	struct mt_ctx *m = req->opaque;

	c->ret = ret;
	__atomic_add_fetch(&m->done, 1, __ATOMIC_RELEASE);
}

static uint64_t mt_off(unsigned id, unsigned i)
{
	/* 16 KiB pieces; thread 0 takes even ones, thread 1 odd ones. */
	return ((uint64_t)(i * 2 + id) * 16384 * 7) % MT_SZ / 16384 * 16384;
}

static void mt_submit(void *arg)
{
	struct mt_ctx *m = arg;
	unsigned i;

	for (i = 0; i < MT_PER; i++) {
		struct cw *c = &m->c[i];

		c->iov = (struct iovec){ c->buf, 16384 };
		c->req = (struct blk_request){ .op = BLK_OP_WRITE, .offset = mt_off(m->id, i),
					       .len = 16384, .iov = &c->iov, .iovcnt = 1,
					       .cb = mt_cb, .opaque = m };
		c->ret = blk_submit(m->bs, &c->req);
		if (c->ret)
			__atomic_add_fetch(&m->done, 1, __ATOMIC_RELEASE);
	}
}

static void mt_detach(void *arg)
{
	struct mt_ctx *m = arg;

	blk_detach_loop(m->bs, loop_current());
}

static void test_multi_loop(void **state)
{
	struct qcow2_create_opts o = { .size = MT_SZ, .cluster_size = 65536 };
	struct iothread *t[2];
	struct mt_ctx m[2];
	uint8_t *model = calloc(1, MT_SZ);
	struct blk_node *bs;
	char err[256];
	unsigned i, k;

	(void)state;
	assert_int_equal(qcow2_create(path("mt.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("mt.qcow2"), NULL);
	for (k = 0; k < 2; k++) {
		m[k] = (struct mt_ctx){ .bs = bs, .id = k, .c = calloc(MT_PER, sizeof(struct cw)) };
		for (i = 0; i < MT_PER; i++) {
			m[k].c[i].buf = malloc(16384);
			memset(m[k].c[i].buf, (int)(k * MT_PER + i) % 251 + 1, 16384);
		}
		assert_int_equal(iothread_start(k ? "qc1" : "qc0", NULL, &t[k]), 0);
	}
	/* Later writes to the same place win in the model: submit order per
	 * thread is kept, and the two threads never write the same bytes. */
	for (k = 0; k < 2; k++)
		for (i = 0; i < MT_PER; i++)
			memcpy(model + mt_off(k, i), m[k].c[i].buf, 16384);
	for (k = 0; k < 2; k++)
		iothread_run_sync(t[k], mt_submit, &m[k]);
	for (i = 0; i < 20000 && (__atomic_load_n(&m[0].done, __ATOMIC_ACQUIRE) < MT_PER ||
				  __atomic_load_n(&m[1].done, __ATOMIC_ACQUIRE) < MT_PER); i++)
		usleep(1000);
	for (k = 0; k < 2; k++) {
		assert_int_equal(m[k].done, MT_PER);
		iothread_run_sync(t[k], mt_detach, &m[k]);
		iothread_join(t[k]);
		for (i = 0; i < MT_PER; i++) {
			assert_int_equal(m[k].c[i].ret, 0);
			free(m[k].c[i].buf);
		}
		free(m[k].c);
	}
	verify_model(bs, model, MT_SZ);
	blk_close(bs);
	if (have_qemu)
		qemu_check_clean(path("mt.qcow2"));
	free(model);
}

/* ---- create ---- */

static char data_path[300];

static void test_create_options(void **state)
{
	snprintf(data_path, sizeof(data_path), "%s", path("cr.data"));
	const struct qcow2_create_opts m[] = {
		{ .size = 10u << 20 },
		{ .size = 10u << 20, .cluster_size = 512 },
		{ .size = 10u << 20, .cluster_size = 2u << 20 },
		{ .size = 10u << 20, .compat = 2 },
		{ .size = 10u << 20, .refcount_bits = 1, .cluster_size = 4096 },
		{ .size = 10u << 20, .refcount_bits = 64 },
		{ .size = 10u << 20, .extended_l2 = true },
		{ .size = 10u << 20, .lazy_refcounts = true },
		{ .size = 10u << 20, .compression_type = QCOW2_COMPRESSION_ZSTD },
		{ .size = 10u << 20, .prealloc = QCOW2_PREALLOC_METADATA },
		{ .size = 10u << 20, .prealloc = QCOW2_PREALLOC_FALLOC, .cluster_size = 8192 },
		{ .size = 10u << 20, .prealloc = QCOW2_PREALLOC_FULL, .extended_l2 = true },
		{ .size = 10u << 20, .data_file = data_path },
		{ .size = 10u << 20, .data_file = data_path, .data_file_raw = true },
	};
	struct qcow2_info info;
	struct blk_node *bs;
	char err[256];
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
		assert_int_equal(qcow2_create(path("cr.qcow2"), &m[i], err, sizeof(err)), 0);
		if (have_qemu)
			qemu_check_clean(path("cr.qcow2"));
		bs = open_ok(path("cr.qcow2"), NULL);
		assert_int_equal(blk_size(bs), 10u << 20);
		assert_int_equal(qcow2_get_info(bs, &info), 0);
		assert_int_equal(info.cluster_size, m[i].cluster_size ? m[i].cluster_size : 65536);
		assert_int_equal(info.version, m[i].compat == 2 ? 2 : 3);
		assert_int_equal(info.extended_l2, m[i].extended_l2);
		assert_int_equal(info.lazy_refcounts, m[i].lazy_refcounts);
		assert_int_equal(info.refcount_bits, m[i].refcount_bits ? m[i].refcount_bits : 16);
		assert_int_equal(info.compression_type, m[i].compression_type);
		assert_int_equal(info.data_file != NULL, m[i].data_file != NULL);
		qcow2_info_free(&info);
		blk_close(bs);
		if (have_qemu)
			write_and_check(path("cr.qcow2"), 10u << 20,
					m[i].cluster_size ? m[i].cluster_size : 65536, NULL, NULL);
	}
}

static void test_create_backing(void **state)
{
	struct qcow2_create_opts o = { .size = 2u << 20 };
	struct qcow2_create_opts t = { .size = 3u << 20, .backing_file = "cb0.qcow2",
				       .backing_fmt = "qcow2" };
	uint8_t buf[4096], got[4096];
	struct qcow2_info info;
	struct blk_node *bs;
	char err[256];

	(void)state;
	assert_int_equal(qcow2_create(path("cb0.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("cb0.qcow2"), NULL);
	memset(buf, 0x6b, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 8192, buf, sizeof(buf), 0), 0);
	blk_close(bs);
	assert_int_equal(qcow2_create(path("cb1.qcow2"), &t, err, sizeof(err)), 0);
	bs = open_ok(path("cb1.qcow2"), NULL);
	assert_int_equal(qcow2_get_info(bs, &info), 0);
	assert_string_equal(info.backing_file, "cb0.qcow2");
	assert_string_equal(info.backing_format, "qcow2");
	qcow2_info_free(&info);
	assert_int_equal(blk_pread(bs, 8192, got, sizeof(got)), 0);
	assert_memory_equal(got, buf, sizeof(buf));
	blk_close(bs);
	if (have_qemu) {
		qemu_check_clean(path("cb1.qcow2"));
		assert_int_equal(sh("qemu-img info %s | grep -q 'backing file format: qcow2'",
				    path("cb1.qcow2")), 0);
	}
	/* Size from the backing file when none is given. */
	t.size = 0;
	t.backing_file = "cb1.qcow2";
	assert_int_equal(qcow2_create(path("cb2.qcow2"), &t, err, sizeof(err)), 0);
	bs = open_ok(path("cb2.qcow2"), NULL);
	assert_int_equal(blk_size(bs), 3u << 20);
	assert_int_equal(blk_pread(bs, 8192, got, sizeof(got)), 0);
	assert_memory_equal(got, buf, sizeof(buf));
	blk_close(bs);
	t.backing_fmt = NULL;
	assert_int_equal(qcow2_create(path("cb3.qcow2"), &t, err, sizeof(err)), -EINVAL);
}

static void test_compressed_write(void **state)
{
	enum { SZ = 1 << 20 };
	struct qcow2_create_opts o = { .size = SZ, .compression_type = QCOW2_COMPRESSION_ZSTD };
	uint8_t *b = malloc(SZ);
	struct blk_node *bs;
	struct qcow2_check_result r;
	char err[256];
	unsigned i;

	(void)state;
	for (i = 0; i < SZ; i++)
		b[i] = (uint8_t)((i / 100) % 7);
	for (int t = 0; t < 2; t++) {
		o.compression_type = t ? QCOW2_COMPRESSION_ZSTD : QCOW2_COMPRESSION_ZLIB;
		assert_int_equal(qcow2_create(path("cw.qcow2"), &o, err, sizeof(err)), 0);
		bs = open_ok(path("cw.qcow2"), NULL);
		assert_int_equal(qcow2_pwrite_compressed(bs, 0, b, SZ), 0);
		verify_model(bs, b, SZ);
		assert_int_equal(qcow2_check(bs, 0, &r), 0);
		assert_int_equal(r.corruptions + r.leaks, 0);
		assert_int_equal(r.compressed_clusters, SZ / 65536);
		blk_close(bs);
		if (have_qemu) {
			qemu_check_clean(path("cw.qcow2"));
			write_file(path("cwm.raw"), b, SZ);
			assert_int_equal(sh("qemu-img compare -q %s %s", path("cwm.raw"),
					    path("cw.qcow2")), 0);
		}
	}
	free(b);
}

static void test_resize(void **state)
{
	struct qcow2_create_opts o = { .size = 1u << 20, .cluster_size = 512 };
	uint8_t buf[4096], got[4096];
	struct blk_node *bs;
	char err[256];

	(void)state;
	assert_int_equal(qcow2_create(path("rs.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("rs.qcow2"), NULL);
	memset(buf, 0x42, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 4096, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_truncate(bs, 64u << 20), 0);
	assert_int_equal(blk_size(bs), 64u << 20);
	assert_int_equal(blk_pwrite(bs, (60u << 20) + 1, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_truncate(bs, 1u << 20), -ENOTSUP);
	blk_close(bs);
	bs = open_ok(path("rs.qcow2"), NULL);
	assert_int_equal(blk_size(bs), 64u << 20);
	assert_int_equal(blk_pread(bs, (60u << 20) + 1, got, sizeof(got)), 0);
	assert_memory_equal(got, buf, sizeof(buf));
	assert_int_equal(blk_pread(bs, 4096, got, sizeof(got)), 0);
	assert_memory_equal(got, buf, sizeof(buf));
	blk_close(bs);
	if (have_qemu)
		qemu_check_clean(path("rs.qcow2"));
}

/* Many refcount blocks and a refcount table that must grow (512-byte
 * clusters cover little per block). */
static void test_refcount_growth(void **state)
{
	struct qcow2_create_opts o = { .size = 64u << 20, .cluster_size = 512, .refcount_bits = 64 };
	uint8_t *b = malloc(1 << 20);
	struct blk_node *bs;
	char err[256];
	unsigned i;

	(void)state;
	assert_int_equal(qcow2_create(path("rg.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("rg.qcow2"), NULL);
	for (i = 0; i < 24; i++) {
		memset(b, (int)i + 1, 1 << 20);
		assert_int_equal(blk_pwrite(bs, (uint64_t)i << 20, b, 1 << 20, 0), 0);
	}
	{
		struct qcow2_check_result r;

		/* Dense: data clusters plus a few percent of metadata. */
		assert_int_equal(qcow2_check(bs, 0, &r), 0);
		assert_int_equal(r.leaks + r.corruptions, 0);
		assert_int_equal(r.allocated_clusters, 24u << 11);
		assert_true(r.image_end_offset < (24u << 20) * 11 / 10);
	}
	assert_int_equal(blk_pread(bs, 7u << 20, b, 1 << 20), 0);
	assert_int_equal(b[12345], 8);
	blk_close(bs);
	if (have_qemu)
		qemu_check_clean(path("rg.qcow2"));
	free(b);
}

/* Overwrite the refcount of cluster 0 (the header) in image P by hand: the
 * first refcount table entry, at 64 KiB, points at a block of 16-bit
 * entries. */
static void set_header_refcount(const char *p, uint16_t val)
{
	uint8_t e[8], be[2] = { (uint8_t)(val >> 8), (uint8_t)val };
	uint64_t rb = 0;
	int fd = open(p, O_RDWR);

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, e, 8, 65536), 8);
	for (int i = 0; i < 8; i++)
		rb = rb << 8 | e[i];
	assert_int_equal(pwrite(fd, be, 2, (off_t)rb), 2);
	close(fd);
}

/* Repair with FLAGS: one leak (or one corruption) fixed, then the image
 * checks clean here and in QEMU. Closes BS. */
static void repair_one(struct blk_node *bs, const char *img, int flags, bool leak)
{
	struct qcow2_check_result r;

	assert_int_equal(qcow2_check(bs, flags, &r), 0);
	assert_int_equal(leak ? r.leaks_fixed : r.corruptions_fixed, 1);
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.leaks + r.corruptions, 0);
	blk_close(bs);
	if (have_qemu)
		qemu_check_clean(img);
}

static void test_check_and_leaks(void **state)
{
	struct qcow2_create_opts o = { .size = 4u << 20 };
	struct qcow2_check_result r;
	uint8_t buf[65536];
	struct blk_node *bs;
	char err[256];
	int fd;

	(void)state;
	assert_int_equal(qcow2_create(path("ck.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("ck.qcow2"), NULL);
	memset(buf, 1, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 0, buf, sizeof(buf), 0), 0);
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.corruptions + r.leaks, 0);
	assert_int_equal(r.allocated_clusters, 1);
	assert_int_equal(r.total_clusters, 64);
	blk_close(bs);
	/* Make a leak: the header's refcount 2 (a leak of one). */
	set_header_refcount(path("ck.qcow2"), 2);
	bs = open_ok(path("ck.qcow2"), NULL);
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.leaks, 1);
	repair_one(bs, path("ck.qcow2"), QCOW2_FIX_LEAKS, true);
	/* The header's refcount 0: only a repair of errors may touch that;
	 * FIX_LEAKS alone fails as QEMU's does (a refcount rebuild). */
	set_header_refcount(path("ck.qcow2"), 0);
	bs = open_ok(path("ck.qcow2"), NULL);
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.corruptions, 1);
	assert_int_equal(qcow2_check(bs, QCOW2_FIX_LEAKS, &r), -EIO);
	assert_int_equal(r.check_errors, 1);
	assert_non_null(strstr(r.first_error, "rebuild"));
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.corruptions, 1); /* untouched */
	repair_one(bs, path("ck.qcow2"), QCOW2_FIX_LEAKS | QCOW2_FIX_ERRORS, false);
	/* A wrong COPIED flag: clear it in the data cluster's L2 entry. */
	fd = open(path("ck.qcow2"), O_RDWR);
	assert_true(fd >= 0);
	{
		uint8_t e[8];
		uint64_t l1, l2;

		assert_int_equal(pread(fd, e, 8, 40), 8);
		l1 = ((uint64_t)e[4] << 24) | ((uint64_t)e[5] << 16) | ((uint64_t)e[6] << 8) | e[7];
		assert_int_equal(pread(fd, e, 8, (off_t)l1), 8);
		l2 = (((uint64_t)e[1] << 48) | ((uint64_t)e[2] << 40) | ((uint64_t)e[3] << 32) |
		      ((uint64_t)e[4] << 24) | ((uint64_t)e[5] << 16) | ((uint64_t)e[6] << 8)) &
		     ~511ull;
		assert_int_equal(pread(fd, e, 8, (off_t)l2), 8);
		assert_true(e[0] & 0x80);
		e[0] &= 0x7f;
		assert_int_equal(pwrite(fd, e, 8, (off_t)l2), 8);
	}
	close(fd);
	bs = open_ok(path("ck.qcow2"), NULL);
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.corruptions, 1);
	assert_non_null(strstr(r.first_error, "COPIED"));
	assert_int_equal(qcow2_check(bs, QCOW2_FIX_ERRORS, &r), 0);
	assert_int_equal(r.corruptions_fixed, 1);
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.leaks + r.corruptions, 0);
	blk_close(bs);
	if (have_qemu)
		qemu_check_clean(path("ck.qcow2"));
}

/* A lazy-refcounts image left dirty by a crash: opened read-only it reads;
 * opened writable its refcounts are rebuilt and the dirty bit cleared. */
static void test_dirty_repair(void **state)
{
	struct qcow2_info info;
	struct blk_node *bs;

	(void)state;
	NEED_QEMU();
	assert_int_equal(sh("qemu-img create -q -f qcow2 -o lazy_refcounts=on %s 4M",
			    path("dz.qcow2")), 0);
	assert_int_equal(sh("qemu-io -c 'write -P 0x3c 0 1M' -c 'write -P 0x3d 2M 64k' "
			    "-c 'sigraise 9' %s >/dev/null 2>&1; true", path("dz.qcow2")), 0);
	if (sh("qemu-img info %s 2>/dev/null | grep -q 'corrupt: false'", path("dz.qcow2")) != 0 ||
	    sh("qemu-img check -q %s >/dev/null 2>&1", path("dz.qcow2")) == 0) {
		print_message("could not make a dirty image; skipping\n");
		return;
	}
	bs = open_ok(path("dz.qcow2"), "read-only=on");
	assert_int_equal(qcow2_get_info(bs, &info), 0);
	assert_true(info.dirty);
	qcow2_info_free(&info);
	blk_close(bs);
	compare_with_qemu(path("dz.qcow2"), "read-only=on");
	bs = open_ok(path("dz.qcow2"), NULL);
	blk_close(bs);
	qemu_check_clean(path("dz.qcow2"));
	bs = open_ok(path("dz.qcow2"), "read-only=on");
	assert_int_equal(qcow2_get_info(bs, &info), 0);
	assert_false(info.dirty);
	qcow2_info_free(&info);
	blk_close(bs);
	compare_with_qemu(path("dz.qcow2"), NULL);
}

static uint32_t bstat(struct blk_node *bs, uint64_t off, uint64_t len, uint64_t *n,
		      uint64_t *host)
{
	struct blk_request req = { .op = BLK_OP_BLOCK_STATUS, .offset = off, .len = len };

	assert_int_equal(blk_do_sync(bs, &req), 0);
	*n = req.status_len;
	*host = req.status_offset;
	return req.status;
}

/* Block status of zero clusters: with their host cluster kept (write-zeroes
 * without unmap on data) the host offset is reported, as QEMU does; a zero
 * cluster without one and a data cluster as before. */
static void test_block_status_zero_offset(void **state)
{
	struct qcow2_create_opts o = { .size = 1u << 20 };
	static uint8_t buf[131072];
	struct blk_node *bs;
	uint64_t host, h, n;
	char err[256];

	(void)state;
	assert_int_equal(qcow2_create(path("bz.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("bz.qcow2"), NULL);
	memset(buf, 7, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 0, buf, sizeof(buf), 0), 0);
	bstat(bs, 0, 65536, &n, &host);
	assert_int_equal(do_req(bs, BLK_OP_WRITE_ZEROES, 0, 65536, 0), 0);
	assert_int_equal(do_req(bs, BLK_OP_WRITE_ZEROES, 512u << 10, 65536, 0), 0);
	assert_int_equal(bstat(bs, 0, 1u << 20, &n, &h),
			 BLK_STATUS_ZERO | BLK_STATUS_ALLOCATED | BLK_STATUS_OFFSET_VALID);
	assert_int_equal(n, 65536);
	assert_int_equal(h, host);
	assert_int_equal(bstat(bs, 65536, 65536, &n, &h),
			 BLK_STATUS_DATA | BLK_STATUS_ALLOCATED | BLK_STATUS_OFFSET_VALID);
	assert_int_equal(h, host + 65536);
	assert_int_equal(bstat(bs, 512u << 10, 65536, &n, &h),
			 BLK_STATUS_ZERO | BLK_STATUS_ALLOCATED);
	blk_close(bs);
	if (have_qemu)
		assert_int_equal(sh("qemu-img map --output=json %s | grep -q "
				    "'\"start\": 0, .*\"zero\": true, .*\"offset\": %llu}'",
				    path("bz.qcow2"), (unsigned long long)host), 0);
}

/* Block status with BLK_F_ALLOC_ONLY (a job's walk of a chain): clusters
 * allocated in reverse order on the host, data and zero alike, are one
 * allocated run; without the flag each is its own run (the host offset
 * breaks it), as before. */
static void test_block_status_alloc_only(void **state)
{
	struct qcow2_create_opts o = { .size = 1u << 20 };
	static uint8_t buf[65536];
	struct blk_request req = { .op = BLK_OP_BLOCK_STATUS, .flags = BLK_F_ALLOC_ONLY };
	struct blk_node *bs;
	uint64_t host, n;
	char err[256];

	(void)state;
	assert_int_equal(qcow2_create(path("ba.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("ba.qcow2"), NULL);
	memset(buf, 9, sizeof(buf));
	for (int c = 3; c >= 0; c--)
		assert_int_equal(blk_pwrite(bs, (uint64_t)c << 16, buf, sizeof(buf), 0), 0);
	assert_int_equal(do_req(bs, BLK_OP_WRITE_ZEROES, 4u << 16, 65536, 0), 0);
	assert_int_equal(bstat(bs, 0, 1u << 20, &n, &host),
			 BLK_STATUS_DATA | BLK_STATUS_ALLOCATED | BLK_STATUS_OFFSET_VALID);
	assert_int_equal(n, 65536);
	req.offset = 0;
	req.len = 1u << 20;
	assert_int_equal(blk_do_sync(bs, &req), 0);
	assert_int_equal(req.status, BLK_STATUS_ALLOCATED);
	assert_int_equal(req.status_len, 5u << 16);
	req.offset = 5u << 16;
	req.len = (1u << 20) - req.offset;
	assert_int_equal(blk_do_sync(bs, &req), 0);
	assert_int_equal(req.status, 0);
	assert_int_equal(req.status_len, req.len);
	blk_close(bs);
}

static void set_incompat_bits(const char *p, uint8_t bits)
{
	int fd = open(p, O_RDWR);
	uint8_t b;

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, 79), 1);
	b |= bits;
	assert_int_equal(pwrite(fd, &b, 1, 79), 1);
	close(fd);
}

/* An image marked corrupt: refused read-write, and repair=on refused until
 * the process allows it; opened for repair, writes stay refused until
 * qcow2_check finds the image clean and clears the bit. */
static void test_repair_corrupt_bit(void **state)
{
	struct qcow2_create_opts o = { .size = 1u << 20 };
	struct qcow2_check_result r;
	struct qcow2_info info;
	static uint8_t buf[65536];
	struct blk_node *bs;
	char err[256];
	int ret;

	(void)state;
	assert_int_equal(qcow2_create(path("rc.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("rc.qcow2"), NULL);
	memset(buf, 9, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 0, buf, sizeof(buf), 0), 0);
	blk_close(bs);
	set_incompat_bits(path("rc.qcow2"), 2);
	assert_null(open_img(path("rc.qcow2"), NULL, &ret, err, sizeof(err)));
	assert_int_equal(ret, -EROFS);
	assert_null(open_img(path("rc.qcow2"), "repair=on", &ret, err, sizeof(err)));
	assert_int_equal(ret, -EINVAL);
	qcow2_allow_repair_open();
	bs = open_ok(path("rc.qcow2"), "repair=on");
	assert_int_equal(blk_pwrite(bs, 0, buf, 512, 0), -EIO);
	assert_int_equal(qcow2_check(bs, QCOW2_FIX_LEAKS, &r), 0);
	assert_int_equal(r.corruptions + r.leaks + r.check_errors, 0);
	assert_int_equal(qcow2_get_info(bs, &info), 0);
	assert_false(info.corrupt);
	assert_int_equal(info.incompatible_features & 3, 0);
	qcow2_info_free(&info);
	assert_int_equal(blk_pwrite(bs, 65536, buf, sizeof(buf), 0), 0);
	blk_close(bs);
	bs = open_ok(path("rc.qcow2"), NULL);
	assert_int_equal(blk_pread(bs, 65536, buf, sizeof(buf)), 0);
	assert_int_equal(buf[0], 9);
	blk_close(bs);
	if (have_qemu)
		qemu_check_clean(path("rc.qcow2"));
}

/* ---- crash consistency ----
 * A child process (this binary with --crash-child) writes unique 4 KiB slots
 * with flushes in between and is killed with SIGKILL at a random moment; it
 * reports through a pipe the last write covered by a completed flush. Then:
 * qemu-img check finds no corruption (leaks allowed, repaired with -r leaks)
 * and every flushed write reads back intact. */
enum { CR_SLOTS = 2048, CR_SLOT = 4096 };

static uint64_t cr_slot(uint64_t seed, unsigned i)
{
	return (i * 1237ull + seed * 7) % CR_SLOTS; /* 1237 is odd: a permutation */
}

static void cr_fill(uint8_t *b, unsigned i)
{
	memset(b, (int)(i % 250) + 1, CR_SLOT);
	memcpy(b, &i, sizeof(i));
}

static void *cr_killer(void *arg)
{
	usleep((useconds_t)(uintptr_t)arg);
	kill(getpid(), SIGKILL);
	return NULL;
}

static int crash_child(const char *img, uint64_t seed, int fd)
{
	struct loop_opts lo = { .poll_max_ns = 0 };
	uint8_t b[CR_SLOT];
	struct blk_node *bs;
	struct loop *l;
	pthread_t t;
	char err[256];
	unsigned i;

	if (loop_new(&lo, &l))
		return 1;
	loop_bind_current(l);
	if (blk_open_target(img, "qcow2", "cache=none", &bs, err, sizeof(err)))
		return 1;
	rng_state ^= seed * 0x9e3779b97f4a7c15ull;
	pthread_create(&t, NULL, cr_killer, (void *)(uintptr_t)(20000 + rnd() % 200000));
	for (i = 1; i < CR_SLOTS; i++) {
		cr_fill(b, i);
		if (blk_pwrite(bs, cr_slot(seed, i) * CR_SLOT, b, CR_SLOT, 0))
			return 1;
		if (i % 5 == 0 && rnd() % 3 == 0 &&
		    do_req(bs, BLK_OP_WRITE_ZEROES, cr_slot(seed, i - 1) * CR_SLOT, CR_SLOT, 0))
			return 1;
		if (i % 9 == 0) {
			if (blk_flush_sync(bs))
				return 1;
			if (write(fd, &i, sizeof(i)) != sizeof(i))
				return 1;
		}
	}
	pause();
	return 0;
}

/* A process killed with I/O in flight keeps its image locks until that I/O
 * ends (its open file lives that long): wait, 10 s at most. */
static void wait_unlocked(const char *p)
{
	int fd = open(p, O_RDONLY);

	assert_true(fd >= 0);
	for (int i = 0; i < 1000; i++) {
		bool held = false;

		for (int b = 100; b < 204 && !held; b = b == 103 ? 200 : b + 1) {
			struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = b,
					    .l_len = 1 };

			assert_int_equal(fcntl(fd, F_OFD_GETLK, &fl), 0);
			held = fl.l_type != F_UNLCK;
		}
		if (!held)
			break;
		usleep(10000);
	}
	close(fd);
}

static void test_crash_consistency(void **state)
{
	struct qcow2_create_opts o = { .size = CR_SLOTS * CR_SLOT, .cluster_size = 4096 };
	uint8_t b[CR_SLOT], want[CR_SLOT];
	unsigned seed, last, v, i;
	char err[256], sd[32], fds[16];
	struct blk_node *bs;
	int p[2], st;
	pid_t pid;

	(void)state;
	NEED_QEMU();
	for (seed = 1; seed <= 20; seed++) {
		o.lazy_refcounts = seed % 4 == 0;
		o.cluster_size = seed % 3 ? 4096 : 65536;
		assert_int_equal(qcow2_create(path("cr.qcow2"), &o, err, sizeof(err)), 0);
		assert_int_equal(pipe(p), 0);
		snprintf(sd, sizeof(sd), "%u", seed);
		snprintf(fds, sizeof(fds), "%d", p[1]);
		pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			close(p[0]);
			execl("/proc/self/exe", "test-qcow2", "--crash-child", path("cr.qcow2"), sd,
			      fds, (char *)NULL);
			_exit(127);
		}
		close(p[1]);
		last = 0;
		while (read(p[0], &v, sizeof(v)) == sizeof(v))
			last = v;
		close(p[0]);
		assert_int_equal(waitpid(pid, &st, 0), pid);
		assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
		wait_unlocked(path("cr.qcow2"));
		if (getenv("QCOW2_TEST_VERBOSE"))
			print_message("seed %u: killed after flushed write %u\n", seed, last);
		/* 0 clean, 3 leaks only; 2 would be corruption. A lazy-refcounts
		 * image is dirty instead: opening it writable repairs it. */
		st = o.lazy_refcounts ? 0 : sh("qemu-img check -q %s >/dev/null 2>&1",
						 path("cr.qcow2"));
		if (st != 0 && st != 3)
			sh("qemu-img check %s | head", path("cr.qcow2"));
		assert_true(st == 0 || st == 3);
		if (st == 3)
			assert_int_equal(sh("qemu-img check -q -r leaks %s >/dev/null 2>&1",
					    path("cr.qcow2")), 0);
		bs = open_ok(path("cr.qcow2"), NULL);
		for (i = 1; i <= last; i++) {
			/* Write i+1 may have been followed by a write-zeroes of
			 * slot i (flushed or not, it may have reached the disk). */
			bool zeroed = (i + 1) % 5 == 0;

			assert_int_equal(blk_pread(bs, cr_slot(seed, i) * CR_SLOT, b, CR_SLOT), 0);
			cr_fill(want, i);
			if (zeroed && b[100] == 0)
				continue;
			assert_memory_equal(b, want, CR_SLOT);
		}
		blk_close(bs);
		qemu_check_clean(path("cr.qcow2"));
	}
}

/* ---- hostile images ---- */

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}

static void test_hostile_headers(void **state)
{
	struct qcow2_create_opts o = { .size = 1u << 20 };
	static const struct {
		unsigned off, len;
		uint64_t val;
		const char *msg;
	} cases[] = {
		{ 0, 4, 0x12345678, "magic" },
		{ 4, 4, 4, "version" },
		{ 20, 4, 8, "cluster size" },
		{ 20, 4, 30, "cluster size" },
		{ 32, 4, 1, "encrypt" },
		{ 36, 4, 0, "L1 table too small" },
		{ 36, 4, 0x10000000, "L1 table" },
		{ 40, 8, 0x10001, "aligned" },
		{ 40, 8, 1ull << 40, "outside" },
		{ 48, 8, 0, "refcount table" },
		{ 56, 4, 0x100000, "refcount table" },
		{ 56, 4, 0, "empty" },
		{ 72, 8, 1ull << 20, "incompatible" },
		{ 96, 4, 7, "refcount order" },
		{ 100, 4, 100, "header length" },
		{ 24, 8, 1ull << 63, "size" },
		{ 60, 4, 100000, "snapshots" },
		{ 16, 4, 5000, "backing" },
		{ 72, 8, 1ull << 3, "compression" },
		{ 72, 8, 1ull << 4, "extended L2" },
		{ 88, 8, 2, "raw external" },
	};
	uint8_t h[112], orig[112];
	char err[512];
	size_t i;
	int fd, ret;

	(void)state;
	o.cluster_size = 4096;
	assert_int_equal(qcow2_create(path("h.qcow2"), &o, err, sizeof(err)), 0);
	fd = open(path("h.qcow2"), O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, orig, sizeof(orig), 0), sizeof(orig));
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		memcpy(h, orig, sizeof(h));
		if (cases[i].len == 4)
			put32(h + cases[i].off, (uint32_t)cases[i].val);
		else
			put64(h + cases[i].off, cases[i].val);
		if (cases[i].off == 16)
			put64(h + 8, 4000);
		assert_int_equal(pwrite(fd, h, sizeof(h), 0), sizeof(h));
		err[0] = 0;
		assert_null(open_img(path("h.qcow2"), NULL, &ret, err, sizeof(err)));
		if (ret != -EINVAL || !strcasestr(err, cases[i].msg))
			print_message("case %zu: ret %d, '%s'\n", i, ret, err);
		assert_true(ret < 0);
		assert_non_null(strcasestr(err, cases[i].msg));
	}
	/* A backing file name offset that wraps past 2^64 with its length
	 * (the name would be read from before the header buffer). */
	memcpy(h, orig, sizeof(h));
	put64(h + 8, ~0ull - 99);
	put32(h + 16, 200);
	assert_int_equal(pwrite(fd, h, sizeof(h), 0), sizeof(h));
	assert_null(open_img(path("h.qcow2"), NULL, &ret, err, sizeof(err)));
	assert_int_equal(ret, -EINVAL);
	assert_non_null(strstr(err, "backing file name at 0xffffffffffffff9c is outside the header"));
	/* Bad L1 entries and L2 entries give I/O errors, not crashes. */
	assert_int_equal(pwrite(fd, orig, sizeof(orig), 0), sizeof(orig));
	close(fd);
	blk_close(open_ok(path("h.qcow2"), NULL));
}

/* Random corruption of a small image: open may fail, I/O may fail, nothing
 * crashes (run under ASan for the real value). */
static void test_hostile_fuzz(void **state)
{
	struct qcow2_create_opts o = { .size = 2u << 20, .cluster_size = 4096 };
	uint8_t *img, buf[8192];
	uint64_t len;
	char err[512];
	unsigned i, j;
	int ret;

	(void)state;
	assert_int_equal(qcow2_create(path("f.qcow2"), &o, err, sizeof(err)), 0);
	{
		struct blk_node *bs = open_ok(path("f.qcow2"), NULL);

		memset(buf, 7, sizeof(buf));
		for (i = 0; i < 16; i++)
			assert_int_equal(blk_pwrite(bs, i * 70000, buf, sizeof(buf), 0), 0);
		blk_close(bs);
	}
	img = read_file(path("f.qcow2"), &len);
	for (i = 0; i < 200; i++) {
		uint8_t *m = malloc(len);
		struct blk_node *bs;

		memcpy(m, img, len);
		for (j = 0; j < 1 + rnd() % 8; j++)
			m[rnd() % (i % 2 ? len : 512)] ^= (uint8_t)(1u << (rnd() % 8));
		write_file(path("fz.qcow2"), m, len);
		bs = open_img(path("fz.qcow2"), NULL, &ret, err, sizeof(err));
		if (bs) {
			for (j = 0; j < 8; j++) {
				uint64_t off = rnd() % ((2u << 20) - sizeof(buf));

				if (j % 2)
					blk_pwrite(bs, off, buf, 1 + rnd() % sizeof(buf), 0);
				else
					blk_pread(bs, off, buf, sizeof(buf));
			}
			do_req(bs, BLK_OP_DISCARD, 0, 65536, 0);
			blk_close(bs);
		}
		free(m);
	}
	free(img);
}

/* ---- corruption found in use: overlaps, offsets, sizes ---- */

static uint64_t get64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

static uint64_t file64(int fd, uint64_t off)
{
	uint8_t b[8];

	assert_int_equal(pread(fd, b, 8, (off_t)off), 8);
	return get64(b);
}

static void file_put64(int fd, uint64_t off, uint64_t v)
{
	uint8_t b[8];

	put64(b, v);
	assert_int_equal(pwrite(fd, b, 8, (off_t)off), 8);
}

/* Capture what the driver logs (it writes to fd 2). */
static int cap_saved = -1;

static void capture_start(void)
{
	int fd = open(path("stderr.log"), O_CREAT | O_TRUNC | O_RDWR, 0600);

	assert_true(fd >= 0);
	fflush(stderr);
	cap_saved = dup(2);
	assert_true(cap_saved >= 0);
	assert_true(dup2(fd, 2) == 2);
	close(fd);
}

static char *capture_end(void)
{
	static char buf[4096];
	FILE *f;
	size_t n;

	fflush(stderr);
	assert_true(dup2(cap_saved, 2) == 2);
	close(cap_saved);
	f = fopen(path("stderr.log"), "r");
	assert_non_null(f);
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return buf;
}

/* A 4 KiB-cluster image with guest clusters 0 and 1 written (one L2 table);
 * returns its layout. */
struct co_img {
	uint64_t l1, rct, rb, l2, d0;
	uint8_t *bytes;     /* as written */
	uint8_t *cur;       /* as patched */
	uint64_t len;
};

/* Layout and bytes of co.qcow2 as it is now. */
static void co_reload(struct co_img *m)
{
	int fd = open(path("co.qcow2"), O_RDONLY);

	assert_true(fd >= 0);
	m->l1 = file64(fd, 40);
	m->rct = file64(fd, 48);
	m->rb = file64(fd, m->rct);
	m->l2 = file64(fd, m->l1) & 0x00fffffffffffe00ull;
	m->d0 = file64(fd, m->l2);
	close(fd);
	free(m->bytes);
	free(m->cur);
	m->bytes = read_file(path("co.qcow2"), &m->len);
	m->cur = malloc(m->len);
	assert_non_null(m->cur);
	memcpy(m->cur, m->bytes, m->len);
}

static void co_make(struct co_img *m, bool compressed)
{
	struct qcow2_create_opts o = { .size = 1u << 20, .cluster_size = 4096 };
	uint8_t buf[8192];
	struct blk_node *bs;
	char err[256];

	assert_int_equal(qcow2_create(path("co.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("co.qcow2"), NULL);
	memset(buf, 0x5a, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 4096, buf, 4096, 0), 0);
	if (compressed)
		assert_int_equal(qcow2_pwrite_compressed(bs, 0, buf, 4096), 0);
	else
		assert_int_equal(blk_pwrite(bs, 0, buf, 4096, 0), 0);
	blk_close(bs);
	co_reload(m);
}

/* Restore the image and patch one 64-bit big-endian field. */
static void co_patch(struct co_img *m, uint64_t off, uint64_t val)
{
	int fd;

	write_file(path("co.qcow2"), m->bytes, m->len);
	fd = open(path("co.qcow2"), O_RDWR);
	assert_true(fd >= 0);
	file_put64(fd, off, val);
	close(fd);
	memcpy(m->cur, m->bytes, m->len);
	put64(m->cur + off, val);
}

/* Bytes [off, off+len) of the image are as in m (nothing wrote there). */
static void co_unchanged(const struct co_img *m, uint64_t off, uint64_t len)
{
	uint64_t n;
	uint8_t *now = read_file(path("co.qcow2"), &n);

	assert_true(n >= off + len);
	assert_memory_equal(now + off, m->cur + off, len);
	free(now);
}

/* The image is marked corrupt on disk: read-write open is refused, a
 * read-only one works. */
static void co_marked_corrupt(void)
{
	char err[512] = "";
	int ret, fd = open(path("co.qcow2"), O_RDONLY);

	assert_true(fd >= 0);
	assert_true(file64(fd, 72) & 2);
	close(fd);
	assert_null(open_img(path("co.qcow2"), NULL, &ret, err, sizeof(err)));
	assert_non_null(strstr(err, "marked corrupt"));
	blk_close(open_ok(path("co.qcow2"), "read-only=on"));
}

/* Open, run one request on guest cluster `gc` (after reading guest cluster
 * 2 so that the L2 slice is cached and the fast paths are tried), expect
 * -EIO and a log line with every string in want. */
static void co_expect(bool write, uint64_t gc, const char *const *want)
{
	struct blk_node *bs = open_ok(path("co.qcow2"), NULL);
	uint8_t buf[4096];
	const char *txt;

	memset(buf, 0x77, sizeof(buf));
	capture_start();
	blk_pread(bs, 2 * 4096, buf, sizeof(buf));
	if (write)
		assert_int_equal(blk_pwrite(bs, gc * 4096, buf, sizeof(buf), 0), -EIO);
	else
		assert_int_equal(blk_pread(bs, gc * 4096, buf, sizeof(buf)), -EIO);
	/* Nothing more is written once corruption was found. */
	assert_int_equal(blk_pwrite(bs, 1 * 4096, buf, sizeof(buf), 0), -EIO);
	blk_close(bs);
	txt = capture_end();
	for (; *want; want++) {
		if (!strstr(txt, *want))
			print_message("missing '%s' in: %s\n", *want, txt ? txt : "");
		assert_non_null(strstr(txt, *want));
	}
}

static void test_corrupt_l2_offset(void **state)
{
	struct co_img m = { 0 };
	char l1s[64], rcts[64];

	(void)state;
	co_make(&m, false);
	snprintf(l1s, sizeof(l1s), "overlaps the L1 table at 0x%llx", (unsigned long long)m.l1);
	snprintf(rcts, sizeof(rcts), "overlaps the refcount table at 0x%llx",
		 (unsigned long long)m.rct);
	{
		const char *w[] = { "image is corrupt: L2 table offset", "(L1 entry 0", l1s, NULL };

		co_patch(&m, m.l1, m.l1 | (1ull << 63));
		co_expect(false, 0, w);
		co_unchanged(&m, m.l1, 4096);
		co_marked_corrupt();
	}
	{
		const char *w[] = { "(L1 entry 0", rcts, NULL };

		co_patch(&m, m.l1, m.rct | (1ull << 63));
		co_expect(true, 0, w);
		co_unchanged(&m, m.rct, 4096);
		co_marked_corrupt();
	}
	{
		const char *w[] = { "L2 table offset 0x800 ", "not cluster aligned", NULL };

		co_patch(&m, m.l1, 0x800 | (1ull << 63));
		co_expect(false, 0, w);
		co_unchanged(&m, 104, 4096 - 104); /* all but the feature bits */
		co_marked_corrupt();
	}
	{
		const char *w[] = { "L2 table offset 0x40000000 ", "past the end of the file",
				    NULL };

		co_patch(&m, m.l1, (1ull << 30) | (1ull << 63));
		co_expect(true, 0, w);
		co_marked_corrupt();
	}
	free(m.bytes);
	free(m.cur);
}

static void test_corrupt_refcount_block(void **state)
{
	struct co_img m = { 0 };
	char want[128];
	const char *w[] = { want, NULL };

	(void)state;
	co_make(&m, false);
	/* Block 0 is the L1 table / the refcount table: an allocation (a write
	 * to unallocated guest cluster 5) reads it first. */
	snprintf(want, sizeof(want), "refcount block offset 0x%llx (refcount table entry 0) "
		 "overlaps the L1 table at 0x%llx", (unsigned long long)m.l1,
		 (unsigned long long)m.l1);
	co_patch(&m, m.rct, m.l1);
	co_expect(true, 5, w);
	co_unchanged(&m, m.l1, 4096);
	co_marked_corrupt();
	snprintf(want, sizeof(want), "refcount block offset 0x%llx (refcount table entry 0) "
		 "overlaps the refcount table", (unsigned long long)m.rct);
	co_patch(&m, m.rct, m.rct);
	co_expect(true, 5, w);
	co_unchanged(&m, m.rct + 8, 4096 - 8);
	co_marked_corrupt();
	/* Misaligned or outside the file: refused at open. */
	{
		static const struct {
			uint64_t val;
			const char *msg;
		} bad[] = {
			{ 0x2200, "refcount block offset 0x2200 (refcount table entry 0) is not "
				  "cluster aligned" },
			{ 1ull << 30, "refcount block offset 0x40000000 (refcount table entry "
				      "0) is past the end of the file" },
		};
		char err[512];
		int ret;

		for (unsigned i = 0; i < 2; i++) {
			co_patch(&m, m.rct, bad[i].val);
			assert_null(open_img(path("co.qcow2"), NULL, &ret, err, sizeof(err)));
			assert_int_equal(ret, -EINVAL);
			if (!strstr(err, bad[i].msg))
				print_message("got '%s'\n", err);
			assert_non_null(strstr(err, bad[i].msg));
		}
	}
	free(m.bytes);
	free(m.cur);
}

/* Refcounts (16-bit) that call an L2 table or a refcount block free: the
 * allocator must not hand the cluster out. */
static void test_corrupt_alloc_overlap(void **state)
{
	struct co_img m = { 0 };
	char want[160];
	const char *w[] = { "about to be allocated", want, NULL };

	(void)state;
	co_make(&m, false);
	/* Refcount of the L2 table's cluster: 2 bytes in the block. */
	{
		uint64_t at = m.rb + (m.l2 / 4096) * 2, word = at & ~7ull;
		uint64_t cur = get64(m.bytes + word), sh = (6 - (at - word)) * 8;

		co_patch(&m, word, cur & ~(0xffffull << sh));
	}
	snprintf(want, sizeof(want), "hold the L2 table at 0x%llx (L1 entry 0)",
		 (unsigned long long)m.l2);
	co_expect(true, 5, w);
	co_unchanged(&m, m.l2, 4096);
	co_marked_corrupt();
	{
		uint64_t at = m.rb + (m.rb / 4096) * 2, word = at & ~7ull;
		uint64_t cur = get64(m.bytes + word), sh = (6 - (at - word)) * 8;

		co_patch(&m, word, cur & ~(0xffffull << sh));
	}
	snprintf(want, sizeof(want), "hold the refcount block at 0x%llx (refcount table entry 0)",
		 (unsigned long long)m.rb);
	co_expect(true, 5, w);
	co_unchanged(&m, m.rb + 16, 4096 - 16);
	free(m.bytes);
	free(m.cur);
}

/* Data clusters pointing at metadata or past the end of the file, read and
 * written through the fast paths (the slice is cached) and the slow ones. */
static void test_corrupt_data_cluster(void **state)
{
	struct co_img m = { 0 };
	char want[128];
	const char *w[] = { "L2 entry", "of guest cluster 0", want, NULL };

	(void)state;
	co_make(&m, false);
	snprintf(want, sizeof(want), "has data at 0x%llx that overlaps the L1 table",
		 (unsigned long long)m.l1);
	co_patch(&m, m.l2, m.l1 | (1ull << 63));
	co_expect(true, 0, w);
	co_unchanged(&m, m.l1, 4096);
	co_marked_corrupt();
	co_patch(&m, m.l2, m.rct | (1ull << 63));
	snprintf(want, sizeof(want), "overlaps the refcount table");
	co_expect(false, 0, w);
	snprintf(want, sizeof(want), "has data at 0x40000000, past the end of the file");
	co_patch(&m, m.l2, (1ull << 30) | (1ull << 63));
	co_expect(false, 0, w);
	co_patch(&m, m.l2, m.d0 | 0x100);
	snprintf(want, sizeof(want), "reserved bits");
	co_expect(true, 0, w);
	free(m.bytes);
	free(m.cur);
}

/* Compressed descriptors whose data runs past the end of the file or sits
 * on a table. 4 KiB clusters: offset in bits 0-57, sectors - 1 in 58-61. */
static void test_corrupt_compressed(void **state)
{
	struct co_img m = { 0 };
	char want[128];
	const char *w[] = { "of guest cluster 0 has compressed data", want, NULL };
	uint64_t off, desc;

	(void)state;
	co_make(&m, true);
	assert_true(m.d0 & (1ull << 62));
	off = m.d0 & ((1ull << 58) - 1);
	/* As written, it reads back. */
	{
		struct blk_node *bs = open_ok(path("co.qcow2"), NULL);
		uint8_t buf[4096], want0[4096];

		memset(want0, 0x5a, sizeof(want0));
		assert_int_equal(blk_pread(bs, 0, buf, sizeof(buf)), 0);
		assert_memory_equal(buf, want0, sizeof(buf));
		blk_close(bs);
	}
	desc = (1ull << 62) | (15ull << 58) | off;
	co_patch(&m, m.l2, desc);
	snprintf(want, sizeof(want), "at 0x%llx (%llu bytes) past the end of the file",
		 (unsigned long long)off, 16ull * 512 - (off & 511));
	co_expect(false, 0, w);
	co_marked_corrupt();
	co_patch(&m, m.l2, (1ull << 62) | (1ull << 40));
	snprintf(want, sizeof(want), "at 0x10000000000 ");
	co_expect(false, 0, w);
	co_patch(&m, m.l2, (1ull << 62) | m.l1);
	snprintf(want, sizeof(want), "that overlaps the L1 table");
	co_expect(false, 0, w);
	free(m.bytes);
	free(m.cur);
}

/* ---- guest data never lands on metadata ---- */

/* The set of metadata clusters against a model: random references added
 * and dropped (L2, refcount block, a fixed kind) on keys that collide and
 * wrap around the table, through growth and backward-shift deletion. */
static void test_meta_set(void **state)
{
	enum { N = 600 };
	static uint32_t l2[N], rb[N];
	static uint8_t fx[N];
	struct qc_state *s = calloc(1, sizeof(*s));
	uint64_t i, k, used;

	(void)state;
	assert_non_null(s);
	s->cluster_bits = 9;
	assert_int_equal(qc_mset_add(s, 0, 1, QC_OL_HEADER), 0); /* never empty */
	for (i = 0; i < 300000; i++) {
		uint64_t c = rnd() % N, op = rnd() % 6, cl = 1 + c * 64; /* spread, collide */

		if (op < 2 && qc_mset_add(s, cl << 9, 512, QC_OL_L2) == 0)
			l2[c]++;
		else if (op == 2 && qc_mset_add(s, cl << 9, 512, QC_OL_RB) == 0)
			rb[c]++;
		else if (op == 3 && qc_mset_add(s, cl << 9, 512, QC_OL_L1) == 0)
			fx[c] = 1;
		else if (op == 4 && l2[c])
			qc_mset_del(s, cl << 9, 512, QC_OL_L2), l2[c]--;
		else if (op == 5 && (rnd() & 1))
			qc_mset_del(s, cl << 9, 512, QC_OL_L1), fx[c] = 0;
		else if (op == 5 && rb[c])
			qc_mset_del(s, cl << 9, 512, QC_OL_RB), rb[c]--;
		if (i % 1000 && rnd() % 8)
			continue;
		for (k = 0, used = 1; k < N; k++) {
			unsigned want = (l2[k] ? QC_OL_L2 : 0) | (rb[k] ? QC_OL_RB : 0) |
					(fx[k] ? QC_OL_L1 : 0);

			assert_int_equal(qc_meta_kinds(s, 1 + k * 64), want);
			assert_int_equal(qc_meta_kinds(s, 2 + k * 64), 0);
			used += want != 0;
		}
		assert_int_equal(s->mset.n, used);
		assert_int_equal(qc_meta_kinds(s, 0), QC_OL_HEADER);
	}
	qc_meta_free(s);
	free(s);
}


/* L1 entries naming clusters past the end of the file (refused where used)
 * take no room in the set: it holds at most a slot per cluster of the file
 * however many entries the tables have. */
static void test_meta_set_bounded(void **state)
{
	struct co_img m = { 0 };
	struct blk_node *bs;
	uint8_t b4[4];
	int fd;

	(void)state;
	co_make(&m, false);
	fd = open(path("co.qcow2"), O_RDWR);
	assert_true(fd >= 0);
	for (uint64_t i = 1; i < 512; i++)
		file_put64(fd, m.l1 + 8 * i, (1ull << 40) + i * 4096);
	put32(b4, 512);
	assert_int_equal(pwrite(fd, b4, 4, 36), 4); /* l1_size: the whole cluster */
	close(fd);
	bs = open_ok(path("co.qcow2"), "read-only=on");
	assert_true(((struct qc_state *)bs->opaque)->mset.n <= m.len / 4096);
	blk_close(bs);
	free(m.bytes);
	free(m.cur);
}

/* Data cluster of guest cluster 0 on an L2 table, a refcount block (also
 * as a zero cluster that kept its host cluster, and discarded): reads may
 * return the bytes (QEMU checks writes only), writes, write-zeroes and
 * discards fail with EIO, mark the image corrupt, and change nothing. */
static void test_overlap_data_write(void **state)
{
	struct co_img m = { 0 };
	char want[160], rbs[96];
	const char *w[] = { "L2 entry", "of guest cluster 0 has data at", want, NULL };
	uint8_t buf[4096];
	struct blk_node *bs;
	int fd;

	(void)state;
	co_make(&m, false);
	snprintf(rbs, sizeof(rbs), "overlaps the refcount block at 0x%llx (refcount table entry 0)",
		 (unsigned long long)m.rb);
	snprintf(want, sizeof(want), "0x%llx that overlaps the L2 table at 0x%llx (L1 entry 0)",
		 (unsigned long long)m.l2, (unsigned long long)m.l2);
	co_patch(&m, m.l2, m.l2 | (1ull << 63));
	bs = open_ok(path("co.qcow2"), NULL);
	assert_int_equal(blk_pread(bs, 0, buf, sizeof(buf)), 0);
	assert_memory_equal(buf, m.cur + m.l2, sizeof(buf));
	blk_close(bs);
	fd = open(path("co.qcow2"), O_RDONLY);
	assert_false(file64(fd, 72) & 2);
	close(fd);
	co_expect(true, 0, w);
	co_unchanged(&m, m.l2, 4096);
	co_marked_corrupt();
	snprintf(want, sizeof(want), "%s", rbs);
	co_patch(&m, m.l2, m.rb | (1ull << 63));
	co_expect(true, 0, w);
	co_unchanged(&m, m.rb, 4096);
	co_marked_corrupt();
	/* A zero cluster that kept its host cluster: the write reuses it. */
	co_patch(&m, m.l2, m.rb | (1ull << 63) | 1);
	co_expect(true, 0, w);
	co_unchanged(&m, m.rb, 4096);
	co_marked_corrupt();
	/* Discard and write-zeroes drop or keep the cluster: refused too (a
	 * discard would free the block and punch it). */
	for (int op = 0; op < 2; op++) {
		co_patch(&m, m.l2, m.rb | (1ull << 63));
		bs = open_ok(path("co.qcow2"), NULL);
		capture_start();
		assert_int_equal(do_req(bs, op ? BLK_OP_WRITE_ZEROES : BLK_OP_DISCARD, 0, 4096, 0),
				 -EIO);
		/* Nothing was left unwritten: a flush succeeds. */
		assert_int_equal(blk_flush_sync(bs), 0);
		blk_close(bs);
		assert_non_null(strstr(capture_end(), rbs));
		co_unchanged(&m, m.rb, 4096);
		co_marked_corrupt();
	}
	/* Metadata not yet written when the corruption is found stays so, and
	 * a flush says that it could not make it durable. */
	co_patch(&m, m.l2, m.rb | (1ull << 63));
	bs = open_ok(path("co.qcow2"), NULL);
	memset(buf, 0x42, sizeof(buf));
	capture_start();
	assert_int_equal(blk_pwrite(bs, 5 * 4096, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_pwrite(bs, 0, buf, sizeof(buf), 0), -EIO);
	assert_int_equal(blk_flush_sync(bs), -EIO);
	blk_close(bs);
	assert_non_null(strstr(capture_end(), rbs));
	co_unchanged(&m, m.l2, 4096);
	co_unchanged(&m, m.rb, 4096);
	co_marked_corrupt();
	free(m.bytes);
	free(m.cur);
}

/* The reverse: metadata written where other metadata is. An L1 entry that
 * names a refcount block (the "L2 table" would take an entry, the block a
 * refcount), a refcount table entry that names an L2 table (a refcount
 * would be written into it). */
static void test_overlap_metadata_write(void **state)
{
	struct co_img m = { 0 };
	char want[192];
	const char *w[] = { want, NULL };

	(void)state;
	co_make(&m, false);
	/* Write-zeroes of guest cluster 3 changes its entry only: the L2 side. */
	snprintf(want, sizeof(want), "L2 table offset 0x%llx (L1 entry 0 = 0x%llx) overlaps the "
		 "refcount block at 0x%llx (refcount table entry 0)", (unsigned long long)m.rb,
		 (unsigned long long)(m.rb | (1ull << 63)), (unsigned long long)m.rb);
	co_patch(&m, m.l1, m.rb | (1ull << 63));
	{
		struct blk_node *bs = open_ok(path("co.qcow2"), NULL);

		capture_start();
		assert_int_equal(do_req(bs, BLK_OP_WRITE_ZEROES, 3 * 4096, 4096, 0), -EIO);
		blk_close(bs);
		assert_non_null(strstr(capture_end(), want));
	}
	co_unchanged(&m, m.rb, 4096);
	co_marked_corrupt();
	/* A write allocates first: the refcount side. */
	snprintf(want, sizeof(want), "refcount block offset 0x%llx (refcount table entry 0) "
		 "overlaps the L2 table at 0x%llx (L1 entry 0)", (unsigned long long)m.rb,
		 (unsigned long long)m.rb);
	co_patch(&m, m.l1, m.rb | (1ull << 63));
	co_expect(true, 3, w);
	co_unchanged(&m, m.rb, 4096);
	co_marked_corrupt();
	/* The L2 table is a refcount block: discarding guest cluster 0 would
	 * write its entry there, and a refcount (the data cluster's) later. */
	snprintf(want, sizeof(want), "L2 table offset 0x%llx (L1 entry 0 = 0x%llx) overlaps the "
		 "refcount block at 0x%llx (refcount table entry 0)", (unsigned long long)m.l2,
		 (unsigned long long)(m.l2 | (1ull << 63)), (unsigned long long)m.l2);
	co_patch(&m, m.rct, m.l2);
	{
		struct blk_node *bs = open_ok(path("co.qcow2"), NULL);

		capture_start();
		assert_int_equal(do_req(bs, BLK_OP_DISCARD, 0, 4096, 0), -EIO);
		blk_close(bs);
		assert_non_null(strstr(capture_end(), want));
	}
	co_unchanged(&m, m.l2, 4096);
	co_marked_corrupt();
	free(m.bytes);
	free(m.cur);
}

/* First header extension of type t in image p: offset of its data, or 0. */
static uint64_t find_ext(const char *p, uint32_t t)
{
	uint8_t h[4096];
	uint64_t pos;
	FILE *f = fopen(p, "rb");

	assert_non_null(f);
	assert_int_equal(fread(h, 1, sizeof(h), f), sizeof(h));
	fclose(f);
	for (pos = get64(h + 96) & 0xffffffffu; pos + 8 <= sizeof(h);) {
		uint32_t type = (uint32_t)(get64(h + pos) >> 32), len = (uint32_t)get64(h + pos);

		if (type == t)
			return pos + 8;
		if (!type)
			return 0;
		pos += 8 + (len + 7) / 8 * 8;
	}
	return 0;
}

/* Data on the L1 table of an internal snapshot, and on the bitmap
 * directory (qemu-img makes both). */
static void test_overlap_snapshot_bitmap(void **state)
{
	struct co_img m = { 0 };
	char want[160];
	const char *w[] = { "of guest cluster 0 has data at", want, NULL };
	uint8_t buf[4096];
	uint64_t snl1, dir, ext;
	struct blk_node *bs;
	int fd;

	(void)state;
	NEED_QEMU();
	co_make(&m, false);
	assert_int_equal(sh("qemu-img snapshot -c s1 %s", path("co.qcow2")), 0);
	/* Give the active image its own L2 table and cluster 0 again. */
	bs = open_ok(path("co.qcow2"), NULL);
	memset(buf, 0x6b, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 0, buf, sizeof(buf), 0), 0);
	blk_close(bs);
	co_reload(&m);
	fd = open(path("co.qcow2"), O_RDONLY);
	snl1 = file64(fd, file64(fd, 64));
	close(fd);
	snprintf(want, sizeof(want), "overlaps the L1 table of snapshot 1 at 0x%llx",
		 (unsigned long long)snl1);
	co_patch(&m, m.l2, snl1 | (1ull << 63));
	co_expect(true, 0, w);
	co_unchanged(&m, snl1, 4096);
	co_marked_corrupt();
	co_make(&m, false);
	assert_int_equal(sh("qemu-img bitmap --add %s b0", path("co.qcow2")), 0);
	co_reload(&m);
	ext = find_ext(path("co.qcow2"), 0x23852875);
	assert_true(ext);
	dir = get64(m.bytes + ext + 16);
	snprintf(want, sizeof(want), "overlaps the bitmap directory at 0x%llx",
		 (unsigned long long)dir);
	co_patch(&m, m.l2, dir | (1ull << 63));
	co_expect(true, 0, w);
	/* The read-write open marked the bitmap in use (as QEMU does); nothing
	 * else changed there. */
	m.cur[dir + 15] |= 1;
	co_unchanged(&m, dir, get64(m.bytes + ext + 8)); /* the file may end inside */
	free(m.bytes);
	free(m.cur);
}

/* ---- work bounded by the file ---- */

/* 64 refcount blocks that say every cluster is in use (1-bit refcounts: 32
 * Mi clusters, 2 TiB): the first allocation takes the first cluster past
 * the end of the file at once instead of scanning all they claim (counted:
 * refcount slices looked up), and the image stays consistent. */
static void test_alloc_bounded(void **state)
{
	struct qcow2_create_opts o = { .size = 1ull << 30, .cluster_size = 65536,
				       .refcount_bits = 1 };
	uint8_t *ones = malloc(65536), buf[4096], got[4096];
	struct qcow2_check_result r;
	struct qc_state *s;
	struct blk_node *bs;
	uint64_t len, rct, looked;
	struct stat st;
	char err[256];
	int fd;

	(void)state;
	assert_non_null(ones);
	assert_int_equal(qcow2_create(path("ab.qcow2"), &o, err, sizeof(err)), 0);
	fd = open(path("ab.qcow2"), O_RDWR);
	assert_true(fd >= 0 && fstat(fd, &st) == 0);
	len = ((uint64_t)st.st_size + 65535) & ~65535ull;
	rct = file64(fd, 48);
	memset(ones, 0xff, 65536);
	for (unsigned i = 0; i < 64; i++) {
		assert_int_equal(pwrite(fd, ones, 65536, (off_t)(len + i * 65536ull)), 65536);
		file_put64(fd, rct + 8 * i, len + i * 65536ull);
	}
	close(fd);
	bs = open_ok(path("ab.qcow2"), NULL);
	s = bs->opaque;
	looked = s->rbc.hits + s->rbc.misses;
	memset(buf, 0x3e, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 0, buf, sizeof(buf), 0), 0);
	looked = s->rbc.hits + s->rbc.misses - looked;
	if (looked > 10000)
		print_message("%llu refcount lookups\n", (unsigned long long)looked);
	assert_true(looked <= 10000);
	assert_int_equal(blk_pread(bs, 0, got, sizeof(got)), 0);
	assert_memory_equal(got, buf, sizeof(buf));
	assert_int_equal(blk_flush_sync(bs), 0);
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.corruptions + r.check_errors, 0);
	blk_close(bs);
	free(ones);
}

/* A file that ends inside its last cluster, an L2 table (readers pad it with
 * zeroes): writes through that table, and a data cluster the file ends
 * inside of, work and leave a clean image. */
static void test_partial_last_cluster(void **state)
{
	struct qcow2_create_opts o = { .size = 1u << 20, .cluster_size = 4096 };
	uint8_t buf[4096], got[4096];
	struct qcow2_check_result r;
	struct blk_node *bs;
	uint64_t l2;
	char err[256];
	int fd;

	(void)state;
	assert_int_equal(qcow2_create(path("pl.qcow2"), &o, err, sizeof(err)), 0);
	bs = open_ok(path("pl.qcow2"), NULL);
	assert_int_equal(do_req(bs, BLK_OP_WRITE_ZEROES, 0, 4096, 0), 0);
	blk_close(bs);
	fd = open(path("pl.qcow2"), O_RDWR);
	assert_true(fd >= 0);
	l2 = file64(fd, file64(fd, 40)) & 0x00fffffffffffe00ull;
	assert_int_equal(ftruncate(fd, (off_t)l2 + 8), 0);
	close(fd);
	bs = open_ok(path("pl.qcow2"), NULL);
	memset(buf, 0x3c, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 8192, buf, sizeof(buf), 0), 0);
	assert_int_equal(blk_flush_sync(bs), 0);
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.corruptions + r.leaks + r.check_errors, 0);
	blk_close(bs);
	/* Now cut into the data cluster: its tail reads as zeroes, and a
	 * write there makes the file whole again. */
	fd = open(path("pl.qcow2"), O_RDWR);
	assert_int_equal(ftruncate(fd, (off_t)(file64(fd, l2 + 16) & 0xfffffffffe00ull) + 1024), 0);
	close(fd);
	bs = open_ok(path("pl.qcow2"), NULL);
	assert_int_equal(blk_pread(bs, 8192, got, sizeof(got)), 0);
	assert_memory_equal(got, buf, 1024);
	memset(buf, 0, sizeof(buf));
	assert_memory_equal(got + 1024, buf, sizeof(got) - 1024);
	memset(buf, 0x3d, sizeof(buf));
	assert_int_equal(blk_pwrite(bs, 8192 + 2048, buf, 2048, 0), 0);
	assert_int_equal(blk_pread(bs, 8192, got, sizeof(got)), 0);
	assert_memory_equal(got + 2048, buf, 2048);
	assert_int_equal(qcow2_check(bs, 0, &r), 0);
	assert_int_equal(r.corruptions + r.leaks + r.check_errors, 0);
	blk_close(bs);
	if (have_qemu)
		qemu_check_clean(path("pl.qcow2"));
}

/* Header extensions and snapshot tables with sizes that do not fit. */
static void test_hostile_sizes(void **state)
{
	struct co_img m = { 0 };
	char err[512];
	uint8_t *c;
	int ret, fd;

	(void)state;
	co_make(&m, false);
	/* The feature name table (at 0x70) claims 64 KiB. */
	co_patch(&m, 0x70, 0x6803f85700010000ull);
	assert_null(open_img(path("co.qcow2"), NULL, &ret, err, sizeof(err)));
	assert_int_equal(ret, -EINVAL);
	assert_non_null(strstr(err, "runs past the header area"));
	/* 1000 snapshots in a table at the last cluster: 73 fit. */
	c = calloc(1, 4096);
	for (unsigned i = 0; i + 56 <= 4096; i += 56)
		put32(c + i + 36, 16); /* extra data size */
	write_file(path("co.qcow2"), m.bytes, m.len);
	fd = open(path("co.qcow2"), O_RDWR);
	assert_int_equal(pwrite(fd, c, 4096, (off_t)m.len), 4096);
	put32(c, 1000);
	put64(c + 4, m.len);
	assert_int_equal(pwrite(fd, c, 12, 60), 12);
	close(fd);
	assert_null(open_img(path("co.qcow2"), NULL, &ret, err, sizeof(err)));
	assert_non_null(strstr(err, "snapshot table"));
	assert_non_null(strstr(err, "past the end of the file"));
	/* One snapshot whose L1 table is the refcount table. */
	fd = open(path("co.qcow2"), O_RDWR);
	put32(c, 1);
	assert_int_equal(pwrite(fd, c, 4, 60), 4);
	put64(c, m.rct);
	put32(c + 8, 16);
	assert_int_equal(pwrite(fd, c, 12, (off_t)m.len), 12);
	close(fd);
	assert_null(open_img(path("co.qcow2"), NULL, &ret, err, sizeof(err)));
	assert_non_null(strstr(err, "snapshot"));
	assert_non_null(strstr(err, "overlaps the refcount table"));
	/* A snapshot L1 table over the limit (32 MiB). */
	fd = open(path("co.qcow2"), O_RDWR);
	put32(c, (32u << 20) / 8 + 1);
	assert_int_equal(pwrite(fd, c, 4, (off_t)m.len + 8), 4);
	close(fd);
	assert_null(open_img(path("co.qcow2"), NULL, &ret, err, sizeof(err)));
	assert_non_null(strstr(err, "too large"));
	free(c);
	free(m.bytes);
	free(m.cur);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_read_matrix),
		cmocka_unit_test(test_read_compressed),
		cmocka_unit_test(test_read_backing),
		cmocka_unit_test(test_backing_needs_format),
		cmocka_unit_test(test_read_snapshot_image),
		cmocka_unit_test(test_write_qemu_images),
		cmocka_unit_test(test_write_direct),
		cmocka_unit_test(test_write_backing_cow),
		cmocka_unit_test(test_write_snapshot_cow),
		cmocka_unit_test(test_concurrent_writes),
		cmocka_unit_test(test_multi_loop),
		cmocka_unit_test(test_create_options),
		cmocka_unit_test(test_create_backing),
		cmocka_unit_test(test_compressed_write),
		cmocka_unit_test(test_resize),
		cmocka_unit_test(test_refcount_growth),
		cmocka_unit_test(test_check_and_leaks),
		cmocka_unit_test(test_dirty_repair),
		cmocka_unit_test(test_block_status_zero_offset),
		cmocka_unit_test(test_block_status_alloc_only),
		cmocka_unit_test(test_repair_corrupt_bit),
		cmocka_unit_test(test_crash_consistency),
		cmocka_unit_test(test_hostile_headers),
		cmocka_unit_test(test_hostile_fuzz),
		cmocka_unit_test(test_corrupt_l2_offset),
		cmocka_unit_test(test_corrupt_refcount_block),
		cmocka_unit_test(test_corrupt_alloc_overlap),
		cmocka_unit_test(test_corrupt_data_cluster),
		cmocka_unit_test(test_corrupt_compressed),
		cmocka_unit_test(test_meta_set),
		cmocka_unit_test(test_meta_set_bounded),
		cmocka_unit_test(test_overlap_data_write),
		cmocka_unit_test(test_overlap_metadata_write),
		cmocka_unit_test(test_overlap_snapshot_bitmap),
		cmocka_unit_test(test_alloc_bounded),
		cmocka_unit_test(test_partial_last_cluster),
		cmocka_unit_test(test_hostile_sizes),
	};

	if (argc == 5 && !strcmp(argv[1], "--crash-child"))
		return crash_child(argv[2], strtoull(argv[3], NULL, 10), (int)strtol(argv[4], NULL, 10));
	if (getenv("QCOW2_TEST_FILTER"))
		cmocka_set_test_filter(getenv("QCOW2_TEST_FILTER"));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
