/* libFuzzer target for the qcow2 driver: one input is an image file. It is
 * copied into an in-memory protocol node ("fuzzram", growth capped at
 * FZ_RAM_MAX), opened as qcow2 read-write (read-only when that is refused),
 * put through a short script of reads, writes, write-zeroes, discards,
 * flushes, block-status, compressed writes and a resize, checked, and
 * closed. When the image was clean (and no two active entries share a
 * cluster), everything succeeded and nothing was repaired, the closed image
 * must reopen and check clean again (our own output must be sound).
 * Seeds: tests/fuzz/corpus-qcow2/ (gen-qcow2-corpus.sh).
 *
 * Script: the last FZ_SCRIPT bytes of the input (they are image bytes too),
 * XORed with fz_default so that zero bytes give a useful default sequence.
 * Two bytes per operation, see fz_op(); the last byte picks the options:
 * bits 0-1 L2 cache size (default, 4K, 64K), bit 2 cow-zeroing=write-zeroes,
 * bit 3 open read-only, bits 4-5 the check: 0 before the script (enables
 * the reopen oracle), 1 repair after it, 2 check after it, 3 none.
 * $FUZZ_QCOW2_VERBOSE=1 says what fails; $FUZZ_QCOW2_OUT=FILE keeps the
 * image the oracle reopens (replaying by hand).
 * Host paths: backing files are disabled (backing=), and the external data
 * file bit is cleared in our copy, so a fuzzed name never reaches the file
 * driver. The RAM node aborts on a request outside its size: the qcow2 driver
 * must never send one (fast paths bypass the core's range check).
 *
 * Threading: the caller's thread runs the loop; file growth runs on the
 * thread pool (the node's mutex covers the buffer). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blk-ram.h"
#include "block/block-driver.h"
#include "block/qcow2/qcow2.h"
#include "fuzz.h"
#include "loop/loop.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/opts.h"

#define FZ_RAM_MAX (64u << 20)
#define FZ_NOPS 16
#define FZ_SCRIPT (2 * FZ_NOPS + 1)
#define FZ_MAX_INFLIGHT 4
#define FZ_WATCHDOG_NS 8000000000ull
#define FZ_OFFSET_MASK 0x00fffffffffffe00ull

/* ---- the in-memory protocol node ---- */

/* The image of the current input (blk_open gives the driver no argument). */
static const uint8_t *fz_img;
static size_t fz_img_len;

static int fz_ram_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	struct blk_ram *r = calloc(1, sizeof(*r));

	(void)opts;
	if (!r || blk_ram_init(r, fz_img, fz_img_len)) {
		free(r);
		snprintf(err, errlen, "fuzzram: out of memory");
		return -ENOMEM;
	}
	bs->opaque = r;
	bs->size = r->size;
	return 0;
}

static void fz_ram_close(struct blk_node *bs)
{
	blk_ram_destroy(bs->opaque);
	free(bs->opaque);
}

static int fz_ram_submit(struct blk_node *bs, struct blk_request *req)
{
	struct blk_ram *r = bs->opaque;

	pthread_mutex_lock(&r->lock);
	if (!blk_ram_in_range(r, req)) {
		fprintf(stderr, "fuzzram: op %u at %llu+%llu past the end (%llu)\n", req->op,
			(unsigned long long)req->offset, (unsigned long long)req->len,
			(unsigned long long)r->size);
		abort(); /* a bug of the driver above, not of the input */
	}
	blk_ram_exec(r, req);
	pthread_mutex_unlock(&r->lock);
	blk_complete_deferred(req, 0);
	return 0;
}

static int fz_ram_truncate(struct blk_node *bs, uint64_t size)
{
	if (size > FZ_RAM_MAX)
		return -ENOSPC;
	return blk_ram_resize(bs->opaque, bs, size);
}

static bool fz_ram_true(struct blk_node *bs)
{
	(void)bs;
	return true;
}

static const struct blk_driver fz_ram_driver = {
	.name = "fuzzram",
	.open = fz_ram_open,
	.close = fz_ram_close,
	.submit = fz_ram_submit,
	.truncate = fz_ram_truncate,
	.can_discard = fz_ram_true,
	.can_write_zeroes = fz_ram_true,
};

/* ---- requests ---- */

struct fz_req {
	struct blk_request req;
	struct iovec iov;
	uint8_t *buf;
	bool busy;
};

static struct loop *fz_loop;
static unsigned fz_inflight, fz_failed;
static bool fz_verbose; /* $FUZZ_QCOW2_VERBOSE: say what fails (replaying by hand) */

static void fz_req_done(struct blk_request *req, int ret)
{
	struct fz_req *q = req->opaque;

	free(q->buf);
	q->buf = NULL;
	q->busy = false;
	fz_inflight--;
	if (ret)
		fz_failed++;
	if (ret && fz_verbose)
		fprintf(stderr, "fuzz-qcow2: %s at %llu+%llu: %s\n", blk_op_name(req->op),
			(unsigned long long)req->offset, (unsigned long long)req->len,
			strerror(-ret));
}

static void fz_watchdog(struct loop_timer *t)
{
	(void)t;
	fprintf(stderr, "fuzz-qcow2: %u request(s) never completed\n", fz_inflight);
	abort(); /* a lost completion: a driver bug */
}

/* Run the loop until at most `max` requests are in flight. */
static void fz_drain(unsigned max)
{
	struct loop_timer wd = { .cb = fz_watchdog };

	if (fz_inflight <= max)
		return;
	loop_timer_arm(fz_loop, &wd, loop_now_ns() + FZ_WATCHDOG_NS);
	while (fz_inflight > max)
		loop_run_once(fz_loop, true);
	loop_timer_cancel(fz_loop, &wd);
}

static void fz_submit(struct blk_node *bs, struct fz_req *q, uint8_t op, uint64_t off,
		      uint64_t len, uint32_t flags, uint8_t fill)
{
	memset(&q->req, 0, sizeof(q->req));
	q->req.op = op;
	q->req.offset = off;
	q->req.len = len;
	q->req.flags = flags;
	q->req.cb = fz_req_done;
	q->req.opaque = q;
	if (op == BLK_OP_READ || op == BLK_OP_WRITE) {
		q->buf = malloc(len);
		if (!q->buf) {
			fz_failed++;
			return;
		}
		memset(q->buf, fill, len);
		q->iov.iov_base = q->buf;
		q->iov.iov_len = len;
		q->req.iov = &q->iov;
		q->req.iovcnt = 1;
	}
	q->busy = true;
	fz_inflight++;
	if (blk_submit(bs, &q->req) < 0)
		fz_req_done(&q->req, -EIO);
}

/* ---- the script ---- */

/* A default sequence: write, read back, zero, discard, flush... */
static const uint8_t fz_default[FZ_SCRIPT] = {
	0x11, 0x01, 0x10, 0x01, 0x29, 0x43, 0x21, 0x85, 0x33, 0x02, 0x04, 0x03,
	0xb3, 0x44, 0x05, 0x00, 0x16, 0x00, 0x1f, 0x07, 0x47, 0x08, 0x09, 0xc4,
	0x30, 0x05, 0x52, 0x46, 0x85, 0x01, 0x20, 0x81, 0x00,
};

struct fz_geo {
	uint64_t size, cs;
};

static uint64_t fz_len(const struct fz_geo *g, unsigned cls)
{
	static const uint64_t fixed[] = { 512, 4096, 0, 0, 0, 65536, 0, 1u << 20 };

	switch (cls) {
	case 2:
		return g->cs;
	case 3:
		return 2 * g->cs + 512;
	case 4:
		return g->cs / 2 + 512;
	case 6:
		return 3 * g->cs;
	default:
		return fixed[cls];
	}
}

static uint64_t fz_off(const struct fz_geo *g, uint8_t b)
{
	uint64_t idx = b & 0x3f, l2span = g->cs * (g->cs / 8);

	switch (b >> 6) {
	case 0:
		return idx * g->cs;
	case 1:
		return idx * g->cs + g->cs / 2 + (idx & 1 ? 7 : 512);
	case 2:
		return idx * g->cs * 61;
	default:
		return idx * (l2span / 4) + (idx & 1) * 4096;
	}
}

/* Whole clusters only; -EEXIST (the cluster is allocated) is expected. */
static void fz_compressed(struct blk_node *bs, const struct fz_geo *g, uint64_t off, unsigned i)
{
	uint64_t len;
	uint8_t *buf;
	int ret;

	fz_drain(0);
	off -= off % g->cs;
	len = g->size - off < g->cs ? g->size - off : g->cs;
	buf = calloc(1, len);
	if (!buf)
		return;
	memset(buf, 0x40 + (int)i, len / 3);
	ret = qcow2_pwrite_compressed(bs, off, buf, len);
	if (ret && ret != -EEXIST)
		fz_failed++;
	free(buf);
}

/* Grow the disk by up to 64 L2 tables' worth (img resize). */
static void fz_grow(struct blk_node *bs, struct fz_geo *g, uint8_t b)
{
	uint64_t add = ((uint64_t)(b & 63) + 1) * (g->cs * (g->cs / 8)) / 2;

	fz_drain(0);
	if (g->size < (1ull << 60) && blk_truncate(bs, g->size + add) == 0)
		g->size = blk_size(bs);
}

/* An internal snapshot operation (no request in flight): b bits 0-1 create,
 * apply the first, delete the first, delete the last. Failing is fine (a
 * malformed table, refcounts at their maximum); what the image then holds
 * is checked as after any other operation. */
static void fz_snap(struct blk_node *bs, uint8_t b, unsigned i)
{
	struct qcow2_snapshot_params p = { .name = "fz", .icount = UINT64_MAX };
	struct qcow2_snapshot_info sn = { 0 };
	struct qcow2_info q;
	char err[256], id[32] = "";

	fz_drain(0);
	p.date_sec = i;
	if (!qcow2_get_info(bs, &q)) {
		if (q.nb_snapshots)
			snprintf(id, sizeof(id), "%s",
				 q.snapshots[(b & 3) == 3 ? q.nb_snapshots - 1 : 0].id);
		qcow2_info_free(&q);
	}
	if ((b & 3) == 0)
		qcow2_snapshot_create(bs, &p, err, sizeof(err));
	else if ((b & 3) == 1 && id[0])
		qcow2_snapshot_goto(bs, id, err, sizeof(err));
	else if (id[0] && !qcow2_snapshot_delete(bs, id, NULL, &sn, err, sizeof(err))) {
		free(sn.id);
		free(sn.name);
	}
}

/* One operation from two script bytes:
 *   a: bits 0-2 op (read, write, write+FUA, write-zeroes, discard, flush,
 *      block-status, compressed write), bit 3 keep going without waiting,
 *      bits 4-6 length class, bit 7 MAY_UNMAP (write-zeroes), grow the
 *      disk instead of flushing, or an internal snapshot operation
 *      (fz_snap) instead of block-status;
 *   b: offset (fz_off). */
static void fz_op(struct blk_node *bs, struct fz_geo *g, struct fz_req *q, uint8_t a,
		  uint8_t b, bool rw, unsigned i)
{
	static const uint8_t ops[8] = { BLK_OP_READ, BLK_OP_WRITE, BLK_OP_WRITE,
					BLK_OP_WRITE_ZEROES, BLK_OP_DISCARD, BLK_OP_FLUSH,
					BLK_OP_BLOCK_STATUS, BLK_OP_WRITE };
	uint64_t off = fz_off(g, b) % g->size, len = fz_len(g, (a >> 4) & 7);
	uint8_t op = ops[a & 7];
	uint32_t flags = 0;

	if (len > g->size - off)
		len = g->size - off;
	if (!rw && op != BLK_OP_READ && op != BLK_OP_BLOCK_STATUS)
		op = BLK_OP_READ;
	if ((a & 7) == 2)
		flags = BLK_F_FUA;
	if (op == BLK_OP_WRITE_ZEROES && (a & 0x80))
		flags = BLK_F_MAY_UNMAP;
	if ((a & 7) == 7 && rw) {
		fz_compressed(bs, g, off, i);
		return;
	}
	if (op == BLK_OP_FLUSH && (a & 0x80) && rw) {
		fz_grow(bs, g, b);
		return;
	}
	if ((a & 7) == 6 && (a & 0x80) && rw) {
		fz_snap(bs, b, i);
		return;
	}
	fz_submit(bs, q, op, off, len, flags, (uint8_t)(0x80 + i));
	fz_drain((a & 8) ? FZ_MAX_INFLIGHT - 1 : 0);
}

static void fz_run_script(struct blk_node *bs, const uint8_t *script, bool rw)
{
	struct fz_req q[FZ_MAX_INFLIGHT] = { 0 };
	struct fz_geo g = { blk_size(bs), qcow2_cluster_size(bs) };
	unsigned i, slot = 0;

	if (!g.size || !g.cs)
		return;
	for (i = 0; i < FZ_NOPS; i++) {
		while (q[slot].busy)
			slot = (slot + 1) % FZ_MAX_INFLIGHT;
		fz_op(bs, &g, &q[slot], script[2 * i], script[2 * i + 1], rw, i);
	}
	fz_drain(0);
}

/* ---- open, check, close ---- */

static int fz_open(bool ro, uint8_t cfg, struct blk_node **bs)
{
	static const char *const cache[4] = { "", ",l2-cache-size=4K", ",l2-cache-size=64K", "" };
	char spec[160], err[256];
	struct kv_opts o = { 0 };
	int ret;

	snprintf(spec, sizeof(spec), "driver=fuzzram,format=qcow2,backing=,read-only=%s%s%s",
		 ro ? "on" : "off", cache[cfg & 3],
		 (cfg & 4) ? ",cow-zeroing=write-zeroes" : "");
	err[0] = 0;
	ret = kv_parse(&o, spec, NULL);
	if (!ret)
		ret = blk_open(&o, bs, err, sizeof(err));
	kv_free(&o);
	if (ret && fz_verbose)
		fprintf(stderr, "fuzz-qcow2: open %s: %s\n", ro ? "ro" : "rw", err);
	return ret;
}

static bool fz_clean(struct blk_node *bs)
{
	struct qcow2_check_result r;

	return qcow2_check(bs, 0, &r) == 0 && !r.corruptions && !r.leaks && !r.check_errors;
}

/* ---- active clusters shared (the oracle cannot judge those) ---- */

/* A cluster used twice by the active image (two L1 entries naming one L2
 * table, two L2 entries one data cluster, a data cluster that is an L2 table
 * or a refcount block) is consistent with a refcount of 2, and a check can
 * repair a dirty image into that; a write then drops the refcount to 1 and
 * leaves the other use without the COPIED flag, which check reports as
 * QEMU's does. Found by parsing our copy of the image; bounded by its size. */
struct fz_offs {
	uint64_t *v;
	size_t n, cap;
};

static bool fz_offs_add(struct fz_offs *o, uint64_t off)
{
	if (o->n == o->cap) {
		size_t cap = o->cap ? 2 * o->cap : 256;
		uint64_t *v = realloc(o->v, cap * sizeof(*v));

		if (!v)
			return false;
		o->v = v;
		o->cap = cap;
	}
	o->v[o->n++] = off;
	return true;
}

static int fz_u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static bool fz_offs_dup(struct fz_offs *o)
{
	size_t i;

	qsort(o->v, o->n, sizeof(*o->v), fz_u64_cmp);
	for (i = 1; i < o->n; i++)
		if (o->v[i] == o->v[i - 1])
			return true;
	return false;
}

static uint64_t fz_be64(const uint8_t *p)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

/* The data offsets of the L2 table at l2 (inside the image). */
static bool fz_l2_offs(const uint8_t *img, size_t len, uint64_t l2, uint64_t cs, unsigned esz,
		       struct fz_offs *data)
{
	uint64_t i, e;

	for (i = 0; i + 8 <= cs && l2 + i + 8 <= len; i += esz) {
		e = fz_be64(img + l2 + i);
		if (!(e & (1ull << 62)) && (e & FZ_OFFSET_MASK) &&
		    !fz_offs_add(data, e & FZ_OFFSET_MASK))
			return false;
	}
	return true;
}

/* The refcount blocks (a data cluster may be one, too). */
static bool fz_rb_offs(const uint8_t *img, size_t len, struct fz_offs *o)
{
	uint64_t rct = fz_be64(img + 48), n = (fz_be64(img + 56) >> 32) << img[23], i, e;

	for (i = 0; i + 8 <= n && rct + i + 8 <= len && rct + i >= rct; i += 8) {
		e = fz_be64(img + rct + i);
		if (e && !fz_offs_add(o, e))
			return false;
	}
	return true;
}

static bool fz_shares_clusters(const uint8_t *img, size_t len)
{
	uint64_t cs, l1, n, i, off;
	struct fz_offs o = { 0 };
	unsigned esz;
	bool shared = true; /* also when unsure */

	if (len < 104 || img[20] || img[21] || img[22] || img[23] < 9 || img[23] > 21)
		return true;
	cs = 1ull << img[23];
	esz = img[7] == 3 && (img[79] & 16) ? 16 : 8;
	n = fz_be64(img + 32) & 0xffffffffu;
	l1 = fz_be64(img + 40);
	for (i = 0; i < n && l1 + 8 * i + 8 <= len && l1 + 8 * i >= l1; i++) {
		off = fz_be64(img + l1 + 8 * i) & FZ_OFFSET_MASK;
		if (off && off < len && !(off & (cs - 1)) &&
		    (!fz_offs_add(&o, off) || !fz_l2_offs(img, len, off, cs, esz, &o)))
			goto out;
	}
	if (fz_rb_offs(img, len, &o))
		shared = fz_offs_dup(&o);
out:
	free(o.v);
	return shared;
}

/* Reopen what close wrote: it must open read-write and check clean. */
static void fz_verify(const uint8_t *img, size_t len, uint8_t cfg)
{
	const char *dump = getenv("FUZZ_QCOW2_OUT"); /* keep it (replaying by hand) */
	struct blk_node *bs = NULL;
	struct qcow2_check_result r;
	FILE *f;
	int ret;

	if (dump && (f = fopen(dump, "wb"))) {
		fwrite(img, 1, len, f);
		fclose(f);
	}
	fz_img = img;
	fz_img_len = len;
	ret = fz_open(false, cfg, &bs);
	if (!ret) {
		ret = qcow2_check(bs, 0, &r);
		if (!ret && (r.corruptions || r.leaks || r.check_errors)) {
			fprintf(stderr, "fuzz-qcow2: our output checks dirty: %s\n", r.first_error);
			abort();
		}
		blk_close(bs);
	}
	if (ret) {
		fprintf(stderr, "fuzz-qcow2: our output does not reopen: %d\n", ret);
		abort();
	}
}

/* Close bs, keeping a copy of the file it leaves (NULL: out of memory). */
static uint8_t *fz_close_keep(struct blk_node *bs, size_t *len)
{
	struct blk_node *file = blk_take_child(bs, BLK_ROLE_FILE);
	struct blk_ram *r = file->opaque;
	uint8_t *copy;

	blk_close(bs);
	copy = malloc(r->size ? r->size : 1);
	if (copy)
		memcpy(copy, r->data, r->size);
	*len = r->size;
	blk_close(file);
	return copy;
}

static void fz_init(void)
{
	struct loop_opts lo = { .poll_max_ns = 0 };

	fz_verbose = getenv("FUZZ_QCOW2_VERBOSE") != NULL;
	log_set_level(LOG_ERR);
	if (loop_new(&lo, &fz_loop) < 0)
		abort();
	loop_bind_current(fz_loop);
	blk_register_builtin_drivers();
	if (blk_register_driver(&fz_ram_driver) < 0)
		abort();
}

/* Our copy of the image (the external data file bit cleared: its name would
 * be a host path) and the script from its tail. */
static uint8_t *fz_prepare(const uint8_t *data, size_t size, uint8_t *script)
{
	const uint8_t *tail = size >= FZ_SCRIPT + 512 ? data + size - FZ_SCRIPT : NULL;
	uint8_t *img = malloc(size);
	size_t i;

	for (i = 0; i < FZ_SCRIPT; i++)
		script[i] = fz_default[i] ^ (tail ? tail[i] : 0);
	if (!img)
		return NULL;
	memcpy(img, data, size);
	if (size >= 80 && img[4] == 0 && img[5] == 0 && img[6] == 0 && img[7] == 3)
		img[79] &= (uint8_t)~4;
	return img;
}

/* Check modes of cfg bits 4-5 that run after the script. */
static void fz_check_after(struct blk_node *bs, uint8_t cfg, bool rw)
{
	struct qcow2_check_result r;

	if (rw && (cfg & 0x30) == 0x10)
		qcow2_check(bs, QCOW2_FIX_LEAKS | QCOW2_FIX_ERRORS, &r);
	else if ((cfg & 0x30) == 0x20)
		qcow2_check(bs, 0, &r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t script[FZ_SCRIPT], *img, *out, cfg;
	struct blk_node *bs = NULL;
	bool rw = true, clean, oracle;
	size_t outlen;

	if (!fz_loop)
		fz_init();
	if (size < 72 || !(img = fz_prepare(data, size, script)))
		return 0;
	cfg = script[2 * FZ_NOPS];
	fz_img = img;
	fz_img_len = size;
	if ((cfg & 8) || fz_open(false, cfg, &bs)) {
		rw = false;
		if (fz_open(true, cfg, &bs)) {
			free(img);
			return 0;
		}
	}
	fz_inflight = fz_failed = 0;
	{
		struct qcow2_info info; /* img info on the image */

		if (qcow2_get_info(bs, &info) == 0)
			qcow2_info_free(&info);
	}
	clean = (cfg & 0x30) == 0 && fz_clean(bs) && !fz_shares_clusters(img, size);
	fz_run_script(bs, script, rw);
	fz_check_after(bs, cfg, rw);
	oracle = rw && clean && !fz_failed && blk_flush_sync(bs) == 0;
	if (fz_verbose)
		fprintf(stderr, "fuzz-qcow2: %s, %s, %u failed, oracle %s\n", rw ? "rw" : "ro",
			clean ? "checked clean" : "not checked clean", fz_failed,
			oracle ? "on" : "off");
	out = fz_close_keep(bs, &outlen);
	if (oracle && out)
		fz_verify(out, outlen, cfg);
	free(out);
	free(img);
	return 0;
}
