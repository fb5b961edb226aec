/* `ioplane bench`: a block-layer benchmark taking qemu-img bench's options
 * with the same meaning, plus --random/--seed, --poll-max-ns, and IOPS,
 * bandwidth and latency percentiles from our own per-request timestamps.
 *
 * Threading: everything runs on the calling thread, which gets its own loop;
 * each completion callback submits the next request from completion context.
 * All of struct bench is owned by that thread. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block.h"
#include "block/dirty-bitmap.h"
#include "cmd/bench-vhost.h"
#include "cmd/cmd.h"
#include "cmd/img-int.h"
#include "loop/loop.h"
#include "util/clock.h"
#include "util/hist.h"
#include "util/opts.h"

#define BENCH_PROG "ioplane bench"

enum bench_cache { CACHE_NONE, CACHE_WRITEBACK, CACHE_WRITETHROUGH, CACHE_DIRECTSYNC, CACHE_UNSAFE };

struct bench_opts {
	uint64_t count, depth, bufsize, step, offset, flush_interval, seed;
	uint64_t dirty_bitmaps; /* enabled in-memory bitmaps on the node (write cost) */
	int64_t poll_max_ns;
	const char *fmt, *aio, *target;
	enum bench_cache cache;
	uint8_t pattern;
	bool write, quiet, drain, random, seeded, image_opts, force_share;
};

struct bench_req {
	struct blk_request req; /* first: completion callbacks cast back */
	struct iovec iov;
	uint64_t start; /* clock_ticks() at submission */
};

struct bench {
	/* Hot: touched by every request. */
	struct blk_node *bs;
	uint64_t to_submit; /* requests not yet submitted */
	uint64_t in_flight;
	uint64_t offset;    /* next sequential offset */
	uint64_t step;
	uint64_t wrap;      /* image_size - bufsize, or 0 when the image is smaller */
	bool random;
	uint64_t rng;       /* xorshift64 state */
	uint64_t rand_base, rand_blocks, bufsize;
	uint64_t lat_sum;   /* ticks */
	uint64_t *hist;     /* HIST_BUCKETS counters */

	/* Cold. */
	int err;             /* first failure, -errno */
	bool err_is_flush;
	bool drain, unsafe;  /* flush behaviour */
	uint64_t flush_interval;
	unsigned flushes;    /* flushes in flight */
	uint64_t end_ns;     /* when the last data request completed */
	struct blk_req_pool flush_pool;
	struct bench_req *reqs;
	uint64_t nreqs;
	void *buf;
	struct loop_defer start;
};

/* ---- the per-request path ---- */

/* Sequential offsets exactly as qemu-img bench moves them, with a division
 * only when the offset wraps. */
static inline uint64_t bench_seq_offset(struct bench *b)
{
	uint64_t off = b->offset, next = off + b->step;

	if (__builtin_expect(next >= b->wrap, 0))
		next = b->wrap ? next % b->wrap : 0;
	b->offset = next;
	return off;
}

/* xorshift64, mapped onto [0, rand_blocks) by a multiply, not a division. */
static inline uint64_t bench_rand_offset(struct bench *b)
{
	uint64_t x = b->rng;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	b->rng = x;
	return b->rand_base + (uint64_t)(((unsigned __int128)x * b->rand_blocks) >> 64) * b->bufsize;
}

static void bench_fail(struct bench *b, int ret, bool flush)
{
	if (!b->err) {
		b->err = ret;
		b->err_is_flush = flush;
	}
	b->to_submit = 0;
}

static void bench_submit(struct bench *b, struct bench_req *r)
{
	int ret;

	r->req.offset = b->random ? bench_rand_offset(b) : bench_seq_offset(b);
	r->start = clock_ticks();
	ret = blk_submit(b->bs, &r->req);
	if (__builtin_expect(ret < 0, 0)) {
		bench_fail(b, ret, false);
		return;
	}
	b->to_submit--;
	b->in_flight++;
}

static inline void bench_account(struct bench *b, struct bench_req *r)
{
	uint64_t lat = clock_ticks() - r->start;

	b->lat_sum += lat;
	b->hist[hist_bucket(lat)]++;
	b->in_flight--;
}

/* Completion without --flush-interval: the request slot is reused at once. */
static void bench_rw_done(struct blk_request *req, int ret)
{
	struct bench_req *r = (struct bench_req *)req;
	struct bench *b = req->opaque;

	bench_account(b, r);
	if (__builtin_expect(ret < 0, 0))
		bench_fail(b, ret, false);
	else if (b->to_submit)
		bench_submit(b, r);
}

/* ---- flushes (--flush-interval), qemu-img bench's rules ---- */

/* Submit every free slot (all are free after a drain). */
static void bench_fill(struct bench *b)
{
	uint64_t i;

	for (i = 0; i < b->nreqs && b->to_submit && !b->err; i++)
		bench_submit(b, &b->reqs[i]);
}

static void bench_flush_done(struct blk_request *req, int ret)
{
	struct bench *b = req->opaque;

	b->flushes--;
	blk_req_put(&b->flush_pool, req);
	if (ret < 0)
		bench_fail(b, ret, true);
	else if (b->drain)
		bench_fill(b);
}

static void bench_flush(struct bench *b)
{
	struct blk_request *fr;
	int ret;

	if (b->unsafe) { /* cache=unsafe: flushes are no-ops */
		if (b->drain)
			bench_fill(b);
		return;
	}
	/* Without drain, flushes can pile up (qemu-img sends one per completion
	 * at the tail); past the pool's size (flush_slots()) one is folded into
	 * those still running rather than queued without bound. */
	fr = blk_req_get(&b->flush_pool);
	if (!fr)
		return;
	memset(fr, 0, sizeof(*fr));
	fr->op = BLK_OP_FLUSH;
	fr->cb = bench_flush_done;
	fr->opaque = b;
	ret = blk_submit(b->bs, fr);
	if (ret < 0) {
		blk_req_put(&b->flush_pool, fr);
		bench_fail(b, ret, true);
		return;
	}
	b->flushes++;
}

/* Completion with --flush-interval: when the number of requests not yet
 * submitted is a multiple of the interval, flush (after draining the queue
 * unless --no-drain). */
static void bench_rw_done_flush(struct blk_request *req, int ret)
{
	struct bench_req *r = (struct bench_req *)req;
	struct bench *b = req->opaque;

	bench_account(b, r);
	if (!b->in_flight && !b->to_submit && !b->end_ns)
		b->end_ns = clock_mono_ns();
	if (ret < 0) {
		bench_fail(b, ret, false);
		return;
	}
	if (b->to_submit % b->flush_interval == 0) {
		if (!b->in_flight || !b->drain)
			bench_flush(b);
		if (b->drain)
			return;
	}
	if (b->to_submit && !b->err)
		bench_submit(b, r);
}

/* ---- option parsing ---- */

static void bench_usage(FILE *f)
{
	fprintf(f,
		"Usage: ioplane bench [-c count] [-d depth] [-f fmt] [--flush-interval=N]\n"
		"         [-i io_uring|native|threads] [-n] [--no-drain] [-o offset]\n"
		"         [--pattern=BYTE] [-q] [-s buffer_size] [-S step_size] [-t cache] [-w]\n"
		"         [--random [--seed=N]] [--poll-max-ns=NS] [--image-opts] TARGET\n"
		"\n"
		"TARGET: a file or block device, an NBD export (nbd://HOST[:PORT]/EXPORT,\n"
		"        nbd+unix:///EXPORT?socket=PATH), or null:size=SIZE[,latency-ns=NS]\n"
		"        [,read-zeroes=on][,mode=threads]\n"
		"-f: raw or qcow2; without it a file's format is probed as qemu-img bench does\n"
		"--image-opts: TARGET is an option list, as serve --image takes it, e.g.\n"
		"        driver=file,filename=IMG,format=qcow2,data-file=null:size=SIZE\n"
		"        (qcow2 metadata from IMG, its external data file replaced by null)\n"
		"Defaults: -c 75000 -d 64 -s 4096 -S buffer_size -o 0 -t writeback -i io_uring\n"
		"-t: none|writeback|writethrough|directsync|unsafe   -n: same as -i native\n"
		"--random: uniform random offsets aligned to buffer_size from offset on\n"
		"--poll-max-ns: the loop's adaptive polling limit (0: no polling)\n"
		"--x-dirty-bitmaps=N: N enabled dirty bitmaps (64 KiB granularity) on the\n"
		"        node, marked by every write (to measure what tracking costs)\n"
		"ioplane bench --vhost-user SOCKET [--num-queues N] ...: drive a vhost-user-blk\n"
		"        back-end instead (ioplane bench --vhost-user x --help)\n");
}

/* An integer option in [min, max] (decimal or 0x); message like qemu-img. */
static int bench_num(const char *arg, uint64_t min, uint64_t max, const char *what,
		     uint64_t *out)
{
	uint64_t v;

	if (parse_u64(arg, &v) || v < min || v > max) {
		fprintf(stderr, "%s: Invalid %s specified\n", BENCH_PROG, what);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

/* A size in [0, max], read as qemu-img reads one (img_strtosz: suffixes,
 * fractions, 0x), with qemu-img bench's messages. */
static int bench_size(const char *arg, uint64_t max, const char *what, uint64_t *out)
{
	bool hex_suffix = false;
	uint64_t v;
	int ret = img_strtosz_quiet(arg, &v, &hex_suffix);

	if (hex_suffix)
		fprintf(stderr, "%s: warning: Using a multiplier suffix on hex numbers is "
			"deprecated: %s\n", BENCH_PROG, arg);
	if (ret == -EINVAL) {
		fprintf(stderr,
			"%s: Invalid %s specified. You may use k, M, G, T, P or E suffixes for "
			"kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.\n",
			BENCH_PROG, what);
		return -EINVAL;
	}
	if (ret || v > max) {
		fprintf(stderr, "%s: Invalid %s specified. Must be between 0 and %" PRIu64 ".\n",
			BENCH_PROG, what, max);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

static int bench_parse_cache(const char *arg, enum bench_cache *out)
{
	static const char *const names[] = { "none", "writeback", "writethrough", "directsync",
					     "unsafe" };
	unsigned i;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (!strcmp(arg, names[i])) {
			*out = (enum bench_cache)i;
			return 0;
		}
	}
	fprintf(stderr, "%s: Invalid cache mode\n", BENCH_PROG);
	return -EINVAL;
}

static int bench_parse_aio(const char *arg, const char **out)
{
	if (strcmp(arg, "io_uring") && strcmp(arg, "native") && strcmp(arg, "threads")) {
		fprintf(stderr, "%s: Invalid aio option: %s\n", BENCH_PROG, arg);
		return -EINVAL;
	}
	*out = arg;
	return 0;
}

enum {
	OPT_FLUSH_INTERVAL = 256,
	OPT_NO_DRAIN,
	OPT_PATTERN,
	OPT_RANDOM,
	OPT_SEED,
	OPT_POLL_MAX_NS,
	OPT_IMAGE_OPTS,
	OPT_DIRTY_BITMAPS,
};

static const struct option bench_long_opts[] = {
	{ "help", no_argument, NULL, 'h' },
	{ "flush-interval", required_argument, NULL, OPT_FLUSH_INTERVAL },
	{ "no-drain", no_argument, NULL, OPT_NO_DRAIN },
	{ "pattern", required_argument, NULL, OPT_PATTERN },
	{ "force-share", no_argument, NULL, 'U' },
	{ "random", no_argument, NULL, OPT_RANDOM },
	{ "seed", required_argument, NULL, OPT_SEED },
	{ "poll-max-ns", required_argument, NULL, OPT_POLL_MAX_NS },
	{ "image-opts", no_argument, NULL, OPT_IMAGE_OPTS },
	{ "x-dirty-bitmaps", required_argument, NULL, OPT_DIRTY_BITMAPS },
	{ NULL, 0, NULL, 0 },
};

/* One option; 1: handled and stop with status 0 (--help). */
static int bench_opt(int c, const char *arg, struct bench_opts *o)
{
	uint64_t v;

	switch (c) {
	case 'c': return bench_num(arg, 0, INT_MAX, "request count", &o->count);
	case 'd': return bench_num(arg, 1, INT_MAX, "queue depth", &o->depth);
	case 'f': o->fmt = arg; return 0;
	case 'i': return bench_parse_aio(arg, &o->aio);
	case 'n': o->aio = "native"; return 0;
	case 'o': return bench_size(arg, INT64_MAX, "offset", &o->offset);
	case 'q': o->quiet = true; return 0;
	case 's': return bench_size(arg, INT_MAX, "buffer size", &o->bufsize);
	case 'S': return bench_size(arg, INT_MAX, "step_size", &o->step);
	case 't': return bench_parse_cache(arg, &o->cache);
	case 'w': o->write = true; return 0;
	case 'U': o->force_share = true; return 0;
	case 'h': bench_usage(stdout); return 1;
	case OPT_FLUSH_INTERVAL:
		return bench_num(arg, 0, INT_MAX, "flush interval", &o->flush_interval);
	case OPT_NO_DRAIN: o->drain = false; return 0;
	case OPT_PATTERN:
		if (bench_num(arg, 0, 0xff, "pattern byte", &v))
			return -EINVAL;
		o->pattern = (uint8_t)v;
		return 0;
	case OPT_RANDOM: o->random = true; return 0;
	case OPT_IMAGE_OPTS: o->image_opts = true; return 0;
	case OPT_DIRTY_BITMAPS: return bench_num(arg, 0, 64, "bitmap count", &o->dirty_bitmaps);
	case OPT_SEED: o->seeded = true; return bench_num(arg, 0, UINT64_MAX, "seed", &o->seed);
	case OPT_POLL_MAX_NS:
		if (bench_num(arg, 0, INT64_MAX, "poll-max-ns", &v))
			return -EINVAL;
		o->poll_max_ns = (int64_t)v;
		return 0;
	default:
		return -EINVAL;
	}
}

/* getopt's own messages would name argv[0] ("bench"); ours names the tool,
 * in one line. */
static void bench_bad_opt(int c, char **argv)
{
	const char *arg = argv[optind - 1];

	if (c == ':')
		fprintf(stderr, "%s: option '%s' requires an argument", BENCH_PROG, arg);
	else if (optopt && strncmp(arg, "--", 2))
		fprintf(stderr, "%s: invalid option -- '%c'", BENCH_PROG, optopt);
	else
		fprintf(stderr, "%s: unrecognized option '%s'", BENCH_PROG, arg);
	fprintf(stderr, " (try '%s --help')\n", BENCH_PROG);
}

/* Cross-option checks, in qemu-img's order and words. */
static int bench_check(const struct bench_opts *o, int nargs)
{
	if (nargs != 1) {
		fprintf(stderr, "%s: Expecting one image file name (try '%s --help')\n",
			BENCH_PROG, BENCH_PROG);
		return -EINVAL;
	}
	if (o->image_opts && o->fmt) {
		fprintf(stderr, "%s: --image-opts and --format are mutually exclusive\n",
			BENCH_PROG);
		return -EINVAL;
	}
	if (!o->write && o->flush_interval) {
		fprintf(stderr, "%s: --flush-interval is only available in write tests\n",
			BENCH_PROG);
		return -EINVAL;
	}
	if (o->flush_interval && o->flush_interval < o->depth) {
		fprintf(stderr, "%s: Flush interval can't be smaller than depth\n", BENCH_PROG);
		return -EINVAL;
	}
	return 0;
}

/* 0: run; 1: done, exit 0 (--help); <0: bad command line (message printed). */
static int bench_parse(int argc, char **argv, struct bench_opts *o)
{
	int c, ret;

	*o = (struct bench_opts){ .count = 75000, .depth = 64, .bufsize = 4096,
				  .cache = CACHE_WRITEBACK, .drain = true, .poll_max_ns = -1 };
	optind = 0; /* glibc: full re-initialisation, argv[0] is the command */
	opterr = 0;
	while ((c = getopt_long(argc, argv, ":hc:d:f:i:no:qs:S:t:wU", bench_long_opts,
				NULL)) != -1) {
		if (c == '?' || c == ':') {
			bench_bad_opt(c, argv);
			return -EINVAL;
		}
		ret = bench_opt(c, optarg, o);
		if (ret)
			return ret;
	}
	ret = bench_check(o, argc - optind);
	if (ret)
		return ret;
	o->target = argv[optind];
	return 0;
}

/* ---- set-up and tear-down ---- */

static int bench_new_loop(const struct bench_opts *o, uint64_t nreqs, struct loop **out)
{
	struct loop_opts lo = { .backend = LOOP_BACKEND_AUTO, .poll_max_ns = o->poll_max_ns };
	int ret;

	/* Room for a whole queue of SQEs in one round. */
	if (nreqs > 256)
		lo.uring_entries = nreqs >= 4096 ? 4096 : 1u << (64 - __builtin_clzll(nreqs - 1));
	ret = loop_new(&lo, out);
	if (ret < 0) {
		fprintf(stderr, "%s: cannot create the event loop: %s\n", BENCH_PROG,
			strerror(-ret));
		return ret;
	}
	loop_bind_current(*out);
	return 0;
}

/* The value of key, without marking it used (NULL: absent). */
static const char *bench_peek(const struct kv_opts *kv, const char *key)
{
	for (size_t i = 0; i < kv->n; i++)
		if (!strcmp(kv->v[i].key, key))
			return kv->v[i].val;
	return NULL;
}

/* --image-opts: TARGET is an option list for blk_open(); the options from -t,
 * -i and -w fill in only what it leaves out (cache and aio not for null). */
static int bench_open_opts(const char *target, const char *extra, const char *ro,
			   struct blk_node **out, char *err, size_t errlen)
{
	struct kv_opts o = { 0 }, e = { 0 };
	const char *drv;
	size_t i;
	int ret;

	ret = kv_parse(&o, target, NULL);
	drv = bench_peek(&o, "driver");
	if (!ret)
		ret = kv_parse(&e, drv && !strcmp(drv, "null") ? ro : extra, NULL);
	for (i = 0; !ret && i < e.n; i++)
		if (!bench_peek(&o, e.v[i].key))
			ret = kv_set(&o, e.v[i].key, e.v[i].val);
	if (ret)
		snprintf(err, errlen, "invalid options");
	else
		ret = blk_open(&o, out, err, errlen);
	kv_free(&o);
	kv_free(&e);
	return ret;
}

/* A file without -f is probed, as qemu-img bench does: qcow2 is opened as
 * qcow2 (never benchmarked, or written, as raw container bytes), a format
 * ioplane does not open is refused, and a probed raw image keeps its first
 * sector from turning into another format. */
static int bench_open_target(const struct bench_opts *o, char *extra, size_t extralen,
			     struct blk_node **out, char *err, size_t errlen)
{
	const char *fmt = o->fmt;
	size_t len = strlen(extra);
	int ret;

	if (!fmt && strncmp(o->target, "null:", 5)) {
		ret = blk_probe_format(o->target, &fmt, err, errlen);
		if (ret)
			return ret;
		if (!strcmp(fmt, "raw"))
			snprintf(extra + len, extralen - len, ",x-probed=on");
	}
	ret = blk_open_target(o->target, fmt, extra, out, err, errlen);
	if (!ret && !o->fmt && fmt && !strcmp(fmt, "raw"))
		blk_probe_warn(*out, o->target);
	return ret;
}

/* As qemu-img bench: reads, and writes with -w, sharing everything. */
static int bench_lock(const struct bench_opts *o, struct blk_node **bs, char *err, size_t errlen)
{
	uint32_t perm = BLK_PERM_CONSISTENT_READ | (o->write ? BLK_PERM_WRITE : 0);
	int ret = blk_set_perm(*bs, perm, BLK_PERM_ALL, err, errlen);

	if (ret) {
		blk_close(*bs);
		*bs = NULL;
	}
	return ret;
}

/* --x-dirty-bitmaps N: what a write costs with bitmaps to mark (freed with
 * the node). */
static int bench_add_bitmaps(const struct bench_opts *o, struct blk_node *bs, char *err,
			     size_t errlen)
{
	for (uint64_t i = 0; i < o->dirty_bitmaps; i++) {
		char name[32];
		struct blk_dirty_bitmap *bm;

		snprintf(name, sizeof(name), "bench%llu", (unsigned long long)i);
		bm = blk_dirty_bitmap_new(name, blk_size(bs), 65536);
		if (!bm) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		blk_dirty_bitmap_link(bs, bm);
	}
	return 0;
}

static int bench_open(const struct bench_opts *o, struct blk_node **out)
{
	static const char *const cache_opt[] = {
		[CACHE_NONE] = "none", [CACHE_WRITEBACK] = "writeback",
		[CACHE_WRITETHROUGH] = "writeback", [CACHE_DIRECTSYNC] = "none",
		[CACHE_UNSAFE] = "writeback",
	};
	const char *ro = o->write ? "read-only=off"
			 : o->force_share ? "read-only=on,force-share=on" : "read-only=on";
	char extra[128], err[512] = "";
	int ret;

	/* The null driver has no cache or engine to choose. */
	if (!strncmp(o->target, "null:", 5))
		snprintf(extra, sizeof(extra), "%s", ro);
	else if (blk_target_remote(o->target)) /* no engine to choose */
		snprintf(extra, sizeof(extra), "cache=%s,%s", cache_opt[o->cache], ro);
	else
		snprintf(extra, sizeof(extra), "cache=%s,aio=%s,%s", cache_opt[o->cache],
			 o->aio ? o->aio : "io_uring", ro);
	if (o->write && o->force_share) {
		snprintf(err, sizeof(err), "force-share=on can only be used with read-only images");
		ret = -EINVAL;
	} else if (o->image_opts) {
		ret = bench_open_opts(o->target, extra, ro, out, err, sizeof(err));
	} else {
		ret = bench_open_target(o, extra, sizeof(extra), out, err, sizeof(err));
	}
	if (!ret)
		ret = bench_lock(o, out, err, sizeof(err));
	if (!ret)
		ret = bench_add_bitmaps(o, *out, err, sizeof(err));
	if (ret < 0)
		fprintf(stderr, "%s: Could not open '%s': %s\n", BENCH_PROG, o->target,
			err[0] ? err : strerror(-ret));
	return ret;
}

static uint64_t splitmix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void bench_init_offsets(struct bench *b, const struct bench_opts *o)
{
	uint64_t size = blk_size(b->bs);

	b->offset = o->offset;
	b->step = o->step ? o->step : o->bufsize;
	b->wrap = size > o->bufsize ? size - o->bufsize : 0;
	b->bufsize = o->bufsize;
	b->random = o->random;
	b->rand_base = o->offset;
	b->rand_blocks = o->bufsize && size > o->offset ? (size - o->offset) / o->bufsize : 0;
	b->rng = splitmix64(o->seeded ? o->seed : 1);
	if (!b->rng) /* xorshift's one fixed point */
		b->rng = 1;
}

static void bench_init_reqs(struct bench *b, const struct bench_opts *o)
{
	uint64_t i;

	for (i = 0; i < b->nreqs; i++) {
		struct bench_req *r = &b->reqs[i];

		r->iov.iov_base = (char *)b->buf + i * o->bufsize;
		r->iov.iov_len = o->bufsize;
		r->req.op = o->write ? BLK_OP_WRITE : BLK_OP_READ;
		r->req.flags = o->write && (o->cache == CACHE_WRITETHROUGH ||
					    o->cache == CACHE_DIRECTSYNC) ? BLK_F_FUA : 0;
		r->req.len = o->bufsize;
		r->req.iov = &r->iov;
		r->req.iovcnt = 1;
		r->req.cb = o->flush_interval ? bench_rw_done_flush : bench_rw_done;
		r->req.opaque = b;
	}
}

/* Flushes that can be in flight at once: one per interval, plus one per
 * request at the tail without drain; bounded for huge counts. */
static unsigned flush_slots(const struct bench *b, const struct bench_opts *o)
{
	uint64_t n = b->nreqs + o->count / o->flush_interval + 1;

	return n > b->nreqs + 4096 ? (unsigned)b->nreqs + 4096 : (unsigned)n;
}

/* Buffers, requests and histogram, all allocated before the run. */
static int bench_setup(struct bench *b, const struct bench_opts *o, struct blk_node *bs)
{
	uint64_t buflen;

	b->bs = bs;
	b->to_submit = o->count;
	b->nreqs = o->depth < o->count ? o->depth : (o->count ? o->count : 1);
	b->drain = o->drain;
	b->unsafe = o->cache == CACHE_UNSAFE;
	b->flush_interval = o->flush_interval;
	bench_init_offsets(b, o);
	buflen = b->nreqs * o->bufsize; /* both <= INT_MAX: no overflow */
	if (buflen > SIZE_MAX / 2)
		goto nomem;
	b->buf = blk_alloc_buf(bs, buflen ? buflen : bs->mem_align);
	b->reqs = calloc(b->nreqs, sizeof(*b->reqs));
	b->hist = calloc(HIST_BUCKETS, sizeof(*b->hist));
	if (!b->buf || !b->reqs || !b->hist)
		goto nomem;
	if (o->flush_interval && blk_req_pool_init(&b->flush_pool, flush_slots(b, o)))
		goto nomem;
	memset(b->buf, o->pattern, buflen);
	bench_init_reqs(b, o);
	return 0;
nomem:
	fprintf(stderr, "%s: cannot allocate %" PRIu64 " requests of %" PRIu64 " bytes\n",
		BENCH_PROG, b->nreqs, o->bufsize);
	return -ENOMEM;
}

static void bench_teardown(struct bench *b, struct blk_node *bs, struct loop *loop)
{
	if (b->flush_pool.reqs)
		blk_req_pool_destroy(&b->flush_pool);
	free(b->hist);
	free(b->reqs);
	free(b->buf);
	if (bs) {
		blk_detach_loop(bs, loop);
		blk_close(bs);
	}
	if (loop) {
		loop_bind_current(NULL);
		loop_free(loop);
	}
}

/* ---- run and report ---- */

static void bench_print_stats(const struct bench *b, const struct bench_opts *o, double secs)
{
	hist_print_results(b->hist, b->lat_sum, o->count, o->bufsize, secs);
}

static void bench_print_header(const struct bench *b, const struct bench_opts *o)
{
	printf("Sending %d %s requests, %d bytes each, %d in parallel "
	       "(starting at offset %" PRId64 ", step size %d)\n",
	       (int)o->count, o->write ? "write" : "read", (int)o->bufsize, (int)o->depth,
	       (int64_t)o->offset, (int)b->step);
	if (o->flush_interval)
		printf("Sending flush every %d requests\n", (int)o->flush_interval);
	fflush(stdout);
}

static void bench_start(struct loop_defer *d)
{
	bench_fill((struct bench *)((char *)d - offsetof(struct bench, start)));
}

/* Returns the exit status. */
static int bench_run(struct bench *b, const struct bench_opts *o, struct loop *loop)
{
	uint64_t t0, t1;
	int ret;

	if (!o->quiet)
		bench_print_header(b, o);
	/* The first batch goes out from inside a loop round, like every later
	 * one, so that engines batching at the end of the round see it. */
	b->start.cb = bench_start;
	loop_defer(loop, &b->start);
	t0 = clock_mono_ns();
	loop_run_once(loop, false);
	while (b->in_flight || b->flushes)
		loop_run_once(loop, true);
	t1 = b->end_ns ? b->end_ns : clock_mono_ns();
	if (b->err) {
		fprintf(stderr, "%s: Failed %srequest: %s\n", BENCH_PROG,
			b->err_is_flush ? "flush " : "", strerror(-b->err));
		return 1;
	}
	/* Like qemu-img closing the image: written data reaches the disk, after
	 * the clock stopped. */
	if (o->write && o->cache != CACHE_UNSAFE) {
		ret = blk_flush_sync(b->bs);
		if (ret < 0) {
			fprintf(stderr, "%s: Failed flush request: %s\n", BENCH_PROG,
				strerror(-ret));
			return 1;
		}
	}
	if (!o->quiet) {
		printf("Run completed in %3.3f seconds.\n", (double)(t1 - t0) / 1e9);
		bench_print_stats(b, o, (double)(t1 - t0) / 1e9);
	}
	return 0;
}

int cmd_bench(int argc, char **argv)
{
	struct bench_opts o;
	struct bench b = { 0 };
	struct blk_node *bs = NULL;
	struct loop *loop = NULL;
	int ret, status = 1;

	/* A vhost-user front-end instead of a block node (bench-vhost.c). */
	for (ret = 1; ret < argc; ret++)
		if (!strncmp(argv[ret], "--vhost-user", 12))
			return cmd_bench_vhost(argc, argv);
	ret = bench_parse(argc, argv, &o);
	if (ret)
		return ret > 0 ? 0 : 1;
	if (bench_new_loop(&o, o.depth < o.count ? o.depth : o.count, &loop))
		return 1;
	if (bench_open(&o, &bs) || bench_setup(&b, &o, bs))
		goto out;
	status = bench_run(&b, &o, loop);
out:
	bench_teardown(&b, bs, loop);
	return status;
}
