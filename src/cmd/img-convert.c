/* `ioplane img convert [-f FMT] [-O FMT] [-o OPTIONS] [-B BACKING [-F FMT]]
 * [-c] [-n] [--target-is-zero] [-m N] [-W] [-S SIZE] [-t CACHE] [-T CACHE]
 * [-p] [-q] SRC DST`: copy the virtual disk SRC into DST, like qemu-img
 * convert.
 *
 * The copy runs in -m worker coroutines on the command's loop. Each takes the
 * next range, asks the source's block status (through its backing chain; or
 * only its top layer with -B, whose backing holds the rest), and then skips
 * it (zero, on a target known to read as zero), writes zeroes, or reads and
 * writes it, finding zero blocks in the data (-S) so the output stays
 * sparse. Reads always overlap; writes are issued in order unless -W.
 *
 * Threading: main thread only; the workers are coroutines on its loop and
 * every field of struct cv is touched only from there. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block.h"
#include "block/qcow2/qcow2.h"
#include "cmd/cmd.h"
#include "cmd/img-int.h"
#include "loop/coroutine.h"
#include "loop/loop.h"
#include "util/opts.h"

#define CV_CHUNK (2u << 20) /* bytes per step: a multiple of every cluster size */
#define CV_MAX_WORKERS 64

enum cv_kind { CV_DATA, CV_ZERO, CV_SKIP };

struct cv_args {
	struct img_args c;
	const char *dst_fmt, *src, *dst, *backing, *backing_fmt, *cache, *src_cache;
	struct kv_opts o;
	uint64_t workers, sparse;
	bool in_order, progress, compress, no_create, target_zero;
};

struct cv;

struct cv_worker {
	struct cv *s;
	struct coroutine *co;
	uint8_t *buf;
	uint64_t seq;      /* order of the range it works on */
	bool waiting_turn; /* parked until s->wr_seq == seq */
	bool done;
};

struct cv {
	const struct cv_args *a;
	struct blk_node *src, *dst;
	uint64_t size;     /* bytes to copy */
	uint64_t next;     /* first byte no worker has taken */
	uint64_t seq_next; /* sequence number of the next range taken */
	uint64_t wr_seq;   /* in order: the range whose writes may go now */
	uint64_t done_bytes;
	uint64_t gran; /* zero-detection block (0: none) */
	uint64_t dst_cluster;
	bool dst_zero;    /* the target reads as zeroes where not written */
	bool dst_backing; /* the target has a backing file */
	unsigned active;
	int err;
	struct img_progress prog;
	struct cv_worker w[CV_MAX_WORKERS];
};

/* ---- request helpers for coroutines ---- */

struct cv_wait {
	struct coroutine *co;
	int ret;
	bool done, parked;
};

static void cv_io_cb(struct blk_request *req, int ret)
{
	struct cv_wait *w = req->opaque;

	w->ret = ret;
	w->done = true;
	if (w->parked)
		coroutine_enter(w->co);
}

/* Submit req and wait for it (async contract: never completes inside). */
static int cv_io(struct blk_node *bs, struct blk_request *req)
{
	struct cv_wait w = {.co = coroutine_self()};
	int ret;

	req->cb = cv_io_cb;
	req->opaque = &w;
	ret = blk_submit(bs, req);
	if (ret)
		return ret;
	while (!w.done) {
		w.parked = true;
		coroutine_yield();
		w.parked = false;
	}
	return w.ret;
}

static int cv_rw(struct blk_node *bs, uint8_t op, uint64_t off, void *buf, uint64_t len,
		 uint32_t flags)
{
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct blk_request req = {.op = op, .flags = flags, .offset = off, .len = len};

	if (op == BLK_OP_READ || op == BLK_OP_WRITE) {
		req.iov = &iov;
		req.iovcnt = 1;
	}
	return cv_io(bs, &req);
}

/* ---- what to do with a range ---- */

/* Status of the source at off: through the chain, or (-B) its top layer. */
static int cv_status(struct cv *s, uint64_t off, uint64_t *len, enum cv_kind *kind)
{
	struct blk_node *bs = s->src;
	struct blk_request req;
	int ret;

	for (;;) {
		req = (struct blk_request){.op = BLK_OP_BLOCK_STATUS, .offset = off, .len = *len};
		ret = cv_io(bs, &req);
		if (ret)
			return ret;
		if (!req.status_len || req.status_len > *len)
			return -EIO;
		*len = req.status_len;
		if (req.status & BLK_STATUS_ZERO) {
			*kind = CV_ZERO;
			return 0;
		}
		*kind = CV_DATA;
		if (!qcow2_is(bs) || (req.status & BLK_STATUS_ALLOCATED))
			return 0;
		if (s->a->backing) { /* the target's backing file has the rest */
			*kind = CV_SKIP;
			return 0;
		}
		bs = qcow2_backing(bs);
		if (!bs)
			return 0;
	}
}

static bool cv_is_zero(const uint8_t *p, uint64_t len)
{
	const uint64_t *q = (const uint64_t *)p;
	uint64_t i;

	for (i = 0; i < len / 8; i++)
		if (q[i])
			return false;
	for (i = len & ~7ull; i < len; i++)
		if (p[i])
			return false;
	return true;
}

/* ---- writing ---- */

/* Wait until it is this range's turn to write (in-order mode). */
static void cv_wait_turn(struct cv_worker *w)
{
	struct cv *s = w->s;

	while (s->a->in_order && s->wr_seq != w->seq && !s->err) {
		w->waiting_turn = true;
		coroutine_yield();
		w->waiting_turn = false;
	}
}

static void cv_pass_turn(struct cv_worker *w)
{
	struct cv *s = w->s;
	unsigned i;

	if (!s->a->in_order)
		return;
	s->wr_seq = w->seq + 1;
	for (i = 0; i < s->a->workers; i++) {
		struct cv_worker *o = &s->w[i];

		if (o->waiting_turn && (o->seq == s->wr_seq || s->err)) {
			coroutine_enter(o->co);
			if (!s->err)
				break;
		}
	}
}

static int cv_write_zero(struct cv *s, uint64_t off, uint64_t len)
{
	if (s->dst_zero)
		return 0;
	/* Deallocating would let a backing file show through. */
	return cv_rw(s->dst, BLK_OP_WRITE_ZEROES, off, NULL, len,
		     s->dst_backing ? 0 : BLK_F_MAY_UNMAP);
}

/* Compressed writes are of whole clusters. When the source ends inside a
 * cluster of a larger target, the cluster is padded with zeroes on a new
 * target (past the source it reads as zero anyway); on an existing one (-n)
 * that part is written uncompressed, so as not to clobber what follows. */
static int cv_write_data(struct cv *s, uint64_t off, uint8_t *buf, uint64_t len)
{
	uint64_t end = off + len, cs = s->dst_cluster, dsize = blk_size(s->dst), head, top;
	int ret;

	if (!s->a->compress)
		return cv_rw(s->dst, BLK_OP_WRITE, off, buf, len, 0);
	if (end % cs == 0 || end == dsize)
		return qcow2_pwrite_compressed(s->dst, off, buf, len);
	if (!s->a->no_create) {
		top = (end + cs - 1) / cs * cs;
		top = top < dsize ? top : dsize;
		memset(buf + len, 0, top - end); /* inside the chunk buffer: see cv_take() */
		return qcow2_pwrite_compressed(s->dst, off, buf, top - off);
	}
	head = (end - off) / cs * cs;
	ret = head ? qcow2_pwrite_compressed(s->dst, off, buf, head) : 0;
	return ret ? ret : cv_rw(s->dst, BLK_OP_WRITE, off + head, buf + head, len - head, 0);
}

/* Write a data range, block by block of s->gran, zero blocks as zeroes. */
static int cv_write_buf(struct cv *s, uint64_t off, uint8_t *buf, uint64_t len)
{
	uint64_t pos = 0, run, g = s->gran;
	bool zero;
	int ret = 0;

	if (!g)
		return cv_write_data(s, off, buf, len);
	while (pos < len && !ret) {
		/* Blocks are aligned to the virtual disk, not to the range. */
		run = g - (off + pos) % g;
		if (run > len - pos)
			run = len - pos;
		zero = cv_is_zero(buf + pos, run);
		while (pos + run < len) {
			uint64_t k = len - pos - run < g ? len - pos - run : g;

			if (cv_is_zero(buf + pos + run, k) != zero)
				break;
			run += k;
		}
		if (zero)
			ret = cv_write_zero(s, off + pos, run);
		else
			ret = cv_write_data(s, off + pos, buf + pos, run);
		pos += run;
	}
	return ret;
}

/* ---- the workers ---- */

/* A chunk split by source status into ranges of one kind each. */
#define CV_MAX_RANGES 16
struct cv_plan {
	uint64_t off, len;
	unsigned n;
	struct {
		uint64_t off, len;
		enum cv_kind kind;
	} r[CV_MAX_RANGES];
};

static void cv_plan_add(struct cv_plan *p, uint64_t off, uint64_t len, enum cv_kind kind)
{
	if (p->n && p->r[p->n - 1].kind == kind) {
		p->r[p->n - 1].len += len;
		return;
	}
	p->r[p->n].off = off;
	p->r[p->n].len = len;
	p->r[p->n].kind = kind;
	p->n++;
}

/* Split [p->off, p->off + p->len) by source status. Past CV_MAX_RANGES, the
 * rest is data (read through the chain: right, if not minimal); so is a
 * mixed chunk for compressed output, which writes whole clusters. */
static int cv_plan_make(struct cv *s, struct cv_plan *p)
{
	uint64_t off = p->off, end = p->off + p->len, len;
	enum cv_kind kind;
	int ret;

	p->n = 0;
	while (off < end) {
		len = end - off;
		if (p->n == CV_MAX_RANGES - 1) {
			cv_plan_add(p, off, len, CV_DATA);
			break;
		}
		ret = cv_status(s, off, &len, &kind);
		if (ret)
			return ret;
		cv_plan_add(p, off, len, kind);
		off += len;
	}
	if (s->a->compress && p->n > 1) {
		p->n = 0;
		cv_plan_add(p, p->off, p->len, CV_DATA);
	}
	return 0;
}

/* Take the next chunk; the order of the chunks is the order they are taken
 * in, before any waiting. A chunk never crosses a CV_CHUNK boundary, a
 * multiple of every cluster size: the cluster holding its end lies inside
 * the worker's buffer. */
static void cv_take(struct cv_worker *w, struct cv_plan *p)
{
	struct cv *s = w->s;

	p->off = s->next;
	p->len = CV_CHUNK - p->off % CV_CHUNK;
	if (p->len > s->size - p->off)
		p->len = s->size - p->off;
	s->next += p->len;
	w->seq = s->seq_next++;
}

static int cv_one(struct cv_worker *w, struct cv_plan *p)
{
	struct cv *s = w->s;
	unsigned i;
	int ret = cv_plan_make(s, p);

	for (i = 0; i < p->n && !ret; i++)
		if (p->r[i].kind == CV_DATA)
			ret = cv_rw(s->src, BLK_OP_READ, p->r[i].off,
				    w->buf + (p->r[i].off - p->off), p->r[i].len, 0);
	cv_wait_turn(w);
	if (!ret && s->err)
		ret = -ECANCELED;
	for (i = 0; i < p->n && !ret; i++) {
		if (p->r[i].kind == CV_DATA)
			ret = cv_write_buf(s, p->r[i].off, w->buf + (p->r[i].off - p->off),
					   p->r[i].len);
		else if (p->r[i].kind == CV_ZERO)
			ret = cv_write_zero(s, p->r[i].off, p->r[i].len);
	}
	return ret;
}

static void cv_worker_fn(void *opaque)
{
	struct cv_worker *w = opaque;
	struct cv *s = w->s;
	struct cv_plan p;
	int ret;

	while (!s->err && s->next < s->size) {
		cv_take(w, &p);
		ret = cv_one(w, &p);
		if (ret && !s->err)
			s->err = ret;
		s->done_bytes += p.len;
		img_progress_update(&s->prog, s->done_bytes, s->size);
		cv_pass_turn(w);
	}
	w->done = true;
	s->active--;
}

static int cv_copy(struct cv *s, struct loop *loop)
{
	unsigned i, n = (unsigned)s->a->workers;

	for (i = 0; i < n; i++) {
		s->w[i].s = s;
		s->w[i].buf = blk_alloc_buf(s->dst, CV_CHUNK);
		s->w[i].co = s->w[i].buf ? coroutine_create(cv_worker_fn, &s->w[i]) : NULL;
		if (!s->w[i].co)
			return -ENOMEM;
	}
	img_progress_init(&s->prog, s->a->progress);
	s->active = n;
	for (i = 0; i < n; i++)
		coroutine_enter(s->w[i].co);
	while (s->active)
		loop_run_once(loop, true);
	if (!s->err)
		img_progress_end(&s->prog);
	return s->err;
}

static void cv_free(struct cv *s)
{
	for (unsigned i = 0; i < CV_MAX_WORKERS; i++)
		free(s->w[i].buf);
}

/* ---- set-up ---- */

static int cv_create_target(const struct cv_args *a, uint64_t size)
{
	struct img_create c = {
		.fmt = a->dst_fmt,
		.file = a->dst,
		.backing = a->backing,
		.backing_fmt = a->backing_fmt,
		.o = (struct kv_opts *)&a->o,
		.size = size,
		.quiet = true,
	};

	return img_create_image(&c);
}

static int cv_open(struct cv *s, const struct cv_args *a)
{
	/* As qemu-img: the source must not change under the copy (unless -U). */
	struct img_open_opts so;
	struct img_open_opts dopt = {.fmt = a->dst_fmt, .flags = IMG_OPEN_RW, .cache = a->cache};
	int ret;

	img_open_opts_from(&so, &a->c);
	so.cache = a->src_cache;
	so.flags |= a->c.force_share ? 0 : IMG_OPEN_NO_SHARE;
	ret = img_open(a->src, &so, &s->src, NULL);
	if (ret)
		return ret;
	s->size = blk_size(s->src);
	if (!a->no_create && cv_create_target(a, s->size))
		return -EIO;
	ret = img_open(a->dst, &dopt, &s->dst, NULL);
	if (ret)
		return ret;
	if (blk_size(s->dst) < s->size) {
		img_err("Target '%s' is smaller than the source (%" PRIu64 " < %" PRIu64 " bytes)",
			a->dst, blk_size(s->dst), s->size);
		return -EINVAL;
	}
	if (a->compress && !qcow2_is(s->dst)) {
		img_err("Compression not supported for this file format");
		return -ENOTSUP;
	}
	s->dst_backing = qcow2_backing(s->dst) != NULL;
	s->dst_zero = a->target_zero || (!a->no_create && !s->dst_backing);
	s->dst_cluster = qcow2_cluster_size(s->dst);
	s->gran = a->compress ? s->dst_cluster : a->sparse;
	if (s->gran && s->dst_cluster > s->gran)
		s->gran = s->dst_cluster;
	return 0;
}

static int cv_run(const struct cv_args *a)
{
	struct cv *s = calloc(1, sizeof(*s));
	struct loop *loop = NULL;
	int ret;

	if (!s)
		return -ENOMEM;
	s->a = a;
	ret = img_loop_start(&loop);
	if (!ret)
		ret = cv_open(s, a);
	if (!ret) {
		ret = cv_copy(s, loop);
		if (ret)
			img_err("error while converting: %s", strerror(-ret));
	}
	if (!ret && (!a->cache || strcmp(a->cache, "unsafe"))) {
		ret = blk_flush_sync(s->dst);
		if (ret)
			img_err("error while flushing '%s': %s", a->dst, strerror(-ret));
	}
	cv_free(s);
	if (s->src) {
		blk_detach_loop(s->src, loop);
		blk_close(s->src);
	}
	img_loop_end(loop, s->dst);
	free(s);
	return ret;
}

/* ---- command line ---- */

static void cv_usage(FILE *f)
{
	fprintf(f,
		"Usage: ioplane img convert [-f FMT] [-O raw|qcow2] [-o OPTIONS] [-B BACKING\n"
		"         [-F BACKING_FMT]] [-c] [-n] [--target-is-zero] [-m N] [-W] [-S SIZE]\n"
		"         [-t CACHE] [-T SRC_CACHE] [-p] [-q] [-U] [--image-opts] SRC DST\n\n"
		"  -m N   requests in flight (1..%d, default 8)   -W  writes in any order\n"
		"  -S N   zero blocks of N bytes (default 4k) are not written (0: off)\n"
		"  -c     compressed clusters (qcow2)   -n  DST exists, do not create it\n"
		"  -B     DST gets this backing file; only SRC's own clusters are copied\n",
		CV_MAX_WORKERS);
}

enum { OPT_TARGET_ZERO = IMG_OPT_LOCAL };

static int cv_opt_num(const char *arg, struct cv_args *a)
{
	if (parse_u64(arg, &a->workers) || a->workers < 1 || a->workers > CV_MAX_WORKERS) {
		img_err("Invalid number of coroutines. Allowed number of coroutines is between 1 "
			"and %d",
			CV_MAX_WORKERS);
		return -EINVAL;
	}
	return 0;
}

/* -S: qemu-img's bounds (it reads whole 512-byte sectors, at most 32768). */
static int cv_opt_sparse(const char *arg, struct cv_args *a)
{
	int ret = img_parse_size(arg, "buffer size for sparse output", &a->sparse);

	if (ret == -EINVAL)
		return ret;
	if (ret || a->sparse % 512 || a->sparse > (16u << 20)) {
		img_err("Invalid buffer size for sparse output specified. Valid sizes are "
			"multiples "
			"of 512 up to 16777216. Select 0 to disable sparse detection (fully "
			"allocates output).");
		return -EINVAL;
	}
	return 0;
}

static int cv_opt(void *ctx, int c, const char *arg)
{
	struct cv_args *a = ctx;

	switch (c) {
	case 'O':
		a->dst_fmt = arg;
		return 0;
	case 'B':
		a->backing = arg;
		return 0;
	case 'F':
		a->backing_fmt = arg;
		return 0;
	case 'c':
		a->compress = true;
		return 0;
	case 'n':
		a->no_create = true;
		return 0;
	case 'p':
		a->progress = true;
		return 0;
	case 'W':
		a->in_order = false;
		return 0;
	case 'm':
		return cv_opt_num(arg, a);
	case 'S':
		return cv_opt_sparse(arg, a);
	case 't':
		a->cache = arg;
		return img_check_cache(arg, false);
	case 'T':
		a->src_cache = arg;
		return img_check_cache(arg, true);
	case OPT_TARGET_ZERO:
		a->target_zero = true;
		return 0;
	default: /* -o */
		if (!kv_parse(&a->o, arg, NULL))
			return 0;
		img_err("Invalid option list: %s", arg);
		return -EINVAL;
	}
}

static const struct img_opt cv_opts[] = {
	{'O', NULL, true},
	{'o', NULL, true},
	{'B', NULL, true},
	{'F', NULL, true},
	{'c', NULL, false},
	{'n', NULL, false},
	{'p', NULL, false},
	{'W', NULL, false},
	{'m', NULL, true},
	{'S', NULL, true},
	{'t', NULL, true},
	{'T', NULL, true},
	{OPT_TARGET_ZERO, "target-is-zero", false},
	{0},
};

static const struct img_cmd cv_cmd = {
	.name = "convert",
	.common = IMG_C_FORMAT | IMG_C_QUIET | IMG_C_FORCE_SHARE | IMG_C_IMAGE_OPTS,
	.opts = cv_opts,
	.opt = cv_opt,
	.usage = cv_usage,
	.min_files = 2,
	.max_files = 2,
	.files_err = "Expecting one source and one target image",
};

/* Cross-option checks, in qemu-img's words where it has them. */
static int cv_check(struct cv_args *a)
{
	/* A new target is raw unless -O says otherwise (as in qemu-img); an
	 * existing one (-n) is probed rather than overwritten as raw. */
	if (!a->dst_fmt && !a->no_create)
		a->dst_fmt = "raw";
	if (a->backing && !a->backing_fmt)
		a->backing_fmt = kv_get(&a->o, "backing_fmt");
	if (a->backing && a->no_create) {
		img_err("-B makes no sense when not creating the target (-n)");
		return -EINVAL;
	}
	if (a->target_zero && !a->no_create) {
		img_err("--target-is-zero requires use of -n flag");
		return -EINVAL;
	}
	if (a->compress && a->dst_fmt && strcmp(a->dst_fmt, "qcow2")) {
		img_err("Compression not supported for this file format");
		return -EINVAL;
	}
	if (a->c.quiet)
		a->progress = false;
	return 0;
}

static int cv_parse(int argc, char **argv, struct cv_args *a)
{
	int ret;

	*a = (struct cv_args){.workers = 8, .sparse = 4096, .in_order = true};
	ret = img_parse_args(&cv_cmd, argc, argv, a, &a->c);
	if (ret)
		return ret;
	a->src = a->c.files[0];
	a->dst = a->c.files[1];
	return cv_check(a);
}

int cmd_img_convert(int argc, char **argv)
{
	struct cv_args a;
	int ret = cv_parse(argc, argv, &a);

	if (!ret)
		ret = cv_run(&a);
	kv_free(&a.o);
	return ret ? (ret > 0 ? 0 : 1) : 0;
}
