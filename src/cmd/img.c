/* `ioplane img`: the helpers every subcommand uses (img-int.h). The
 * subcommands themselves live in img-create.c (create, resize), img-info.c
 * (info, check), img-map.c, img-convert.c and img-compare.c.
 *
 * Threading: main thread only; one loop bound to it per command run. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "block/block.h"
#include "block/qcow2/qcow2.h"
#include "cmd/img-int.h"
#include "loop/loop.h"
#include "util/opts.h"

void img_err(const char *fmt, ...)
{
	char line[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	fflush(stdout);
	fprintf(stderr, "%s: %s\n", IMG_PROG, line);
}

/* ---- loop ---- */

int img_loop_start(struct loop **out)
{
	struct loop_opts lo = {.backend = LOOP_BACKEND_AUTO, .poll_max_ns = -1};
	int ret = loop_new(&lo, out);

	if (ret < 0) {
		img_err("cannot create the event loop: %s", strerror(-ret));
		return ret;
	}
	loop_bind_current(*out);
	return 0;
}

/* Close bs (may be NULL) while the loop still runs: format drivers write
 * their metadata back at close. */
void img_loop_end(struct loop *loop, struct blk_node *bs)
{
	if (bs) {
		blk_detach_loop(bs, loop);
		blk_close(bs);
	}
	if (loop) {
		loop_bind_current(NULL);
		loop_free(loop);
	}
}

/* ---- opening ---- */

/* qemu-img's cache modes onto the file driver's two. */
static const char *img_cache_opt(const char *cache)
{
	if (!cache)
		return NULL;
	if (!strcmp(cache, "none") || !strcmp(cache, "directsync") || !strcmp(cache, "off"))
		return "none";
	return "writeback";
}

static void img_extra(char *buf, size_t n, const char *path, const char *fmt, bool probed,
		      const struct img_open_opts *o)
{
	const char *cache = img_cache_opt(o->cache);
	size_t len;

	snprintf(buf, n, "read-only=%s%s%s%s", (o->flags & IMG_OPEN_RW) ? "off" : "on",
		 probed && fmt && !strcmp(fmt, "raw") ? ",x-probed=on" : "",
		 (o->flags & IMG_OPEN_FORCE_SHARE) ? ",force-share=on" : "",
		 (o->flags & IMG_OPEN_NO_IO) ? ",x-no-io=on" : "");
	len = strlen(buf);
	if (cache && strncmp(path, "null:", 5))
		snprintf(buf + len, n - len, ",cache=%s", cache);
	len = strlen(buf);
	if ((o->flags & IMG_OPEN_NO_BACKING) && fmt && !strcmp(fmt, "qcow2"))
		snprintf(buf + len, n - len, ",backing=");
	len = strlen(buf);
	if ((o->flags & IMG_OPEN_REPAIR) && (o->flags & IMG_OPEN_RW) && fmt &&
	    !strcmp(fmt, "qcow2")) {
		qcow2_allow_repair_open();
		snprintf(buf + len, n - len, ",repair=on");
	}
}

/* The permissions qemu-img's open of the same kind takes. */
static int img_lock(struct blk_node *bs, unsigned flags, char *err, size_t errlen)
{
	uint32_t perm = (flags & IMG_OPEN_NO_IO) ? 0 : BLK_PERM_CONSISTENT_READ;
	uint32_t shared = BLK_PERM_ALL;

	if (flags & IMG_OPEN_RW)
		perm |= BLK_PERM_WRITE | ((flags & IMG_OPEN_RESIZE) ? BLK_PERM_RESIZE : 0);
	if (flags & IMG_OPEN_NO_SHARE)
		shared = BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE_UNCHANGED;
	return blk_set_perm(bs, perm, shared, err, errlen);
}

void img_open_opts_from(struct img_open_opts *o, const struct img_args *a)
{
	*o = (struct img_open_opts){
		.fmt = a->fmt,
		.flags = (a->force_share ? IMG_OPEN_FORCE_SHARE : 0) |
			 (a->image_opts ? IMG_OPEN_IMAGE_OPTS : 0),
	};
}

static const char *img_kv_peek(const struct kv_opts *o, const char *key)
{
	for (size_t i = 0; i < o->n; i++)
		if (!strcmp(o->v[i].key, key))
			return o->v[i].val;
	return NULL;
}

/* --image-opts: spec's keys, and those of the flags it does not give. */
static int img_open_spec(const char *spec, const struct img_open_opts *oo, struct blk_node **out,
			 const char **fmt, char *err, size_t errlen)
{
	struct kv_opts o = {0}, e = {0};
	const char *f, *drv;
	char extra[128];
	int ret = kv_parse(&o, spec, NULL);

	f = img_kv_peek(&o, "format");
	drv = img_kv_peek(&o, "driver");
	*fmt = f && !strcmp(f, "qcow2") ? "qcow2" : "raw";
	img_extra(extra, sizeof(extra), drv && !strcmp(drv, "null") ? "null:" : spec, *fmt, false,
		  oo);
	if (!ret)
		ret = kv_parse(&e, extra, NULL);
	for (size_t i = 0; !ret && i < e.n; i++)
		if (!img_kv_peek(&o, e.v[i].key))
			ret = kv_set(&o, e.v[i].key, e.v[i].val);
	if (ret)
		snprintf(err, errlen, "invalid option list");
	else
		ret = blk_open(&o, out, err, errlen);
	kv_free(&o);
	kv_free(&e);
	return ret;
}

int img_open(const char *path, const struct img_open_opts *o, struct blk_node **out,
	     const char **fmt_out)
{
	const char *fmt = o->fmt;
	bool spec = o->flags & IMG_OPEN_IMAGE_OPTS;
	bool probed = !fmt && !spec && strncmp(path, "null:", 5);
	char extra[128], err[512] = "";
	int ret;

	if (spec) {
		ret = img_open_spec(path, o, out, &fmt, err, sizeof(err));
		goto opened;
	}
	if (probed) {
		ret = blk_probe_format(path, &fmt, err, sizeof(err));
		if (ret) {
			img_err("Could not open '%s': %s", path, err);
			return ret;
		}
	} else if (fmt && !blk_format_supported(fmt)) {
		img_err("Unknown driver '%s'", fmt);
		return -EINVAL;
	}
	img_extra(extra, sizeof(extra), path, fmt, probed, o);
	ret = blk_open_target(path, fmt, extra, out, err, sizeof(err));
opened:
	if (!ret && (ret = img_lock(*out, o->flags, err, sizeof(err)))) {
		blk_close(*out);
		*out = NULL;
	}
	if (ret) {
		img_err("Could not open '%s': %s", path, err[0] ? err : strerror(-ret));
		return ret;
	}
	if (probed && !strcmp(fmt, "raw"))
		blk_probe_warn(*out, path);
	if (fmt_out)
		*fmt_out = fmt ? fmt : "raw";
	return 0;
}

/* ---- output ---- */

void img_size_str(uint64_t v, char *buf, size_t n)
{
	static const char *const suffix[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"};

	/* Switch to the next unit once the number would reach 1000, so that it
	 * always prints with at most three digits before the point. */
	double x = (double)v * 1.024;
	int e = 0, i;

	while (x >= 1.0) { /* frexp() without libm */
		x /= 2;
		e++;
	}
	i = (e - 1) / 10;
	if (i < 0)
		i = 0;
	if (i > 6)
		i = 6;
	snprintf(buf, n, "%0.3g %sB", (double)v / (double)(1ull << (i * 10)), suffix[i]);
}

/* One code point of the (modified) UTF-8 at p, as QEMU's JSON writer decodes
 * it: -1 for a byte or sequence that is not one (overlong but the 2-byte
 * NUL, a surrogate, a noncharacter, past U+10FFFF, a missing continuation
 * byte), which it replaces with U+FFFD. *end moves past what was read. */
static long img_utf8_cp(const unsigned char *p, const unsigned char **end)
{
	static const long min_cp[5] = {0x80, 0x800, 0x10000, 0x200000, 0x4000000};
	unsigned len = 0, i, mask;
	long cp;

	*end = p + 1;
	if (*p < 0x80)
		return *p;
	if (*p >= 0xfe || !(*p & 0x40))
		return -1; /* 0xfe, 0xff, or a continuation byte */
	for (mask = 0x80; *p & mask; mask >>= 1)
		len++;
	cp = *p & (mask - 1);
	for (i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80) {
			*end = p + i;
			return -1;
		}
		cp = (cp << 6) | (p[i] & 0x3f);
	}
	*end = p + len;
	if (cp > 0x10ffff || (cp >= 0xfdd0 && cp <= 0xfdef) || (cp & 0xfffe) == 0xfffe ||
	    (cp >= 0xd800 && cp <= 0xdfff))
		return -1;
	if (cp < min_cp[len - 2] && !(cp == 0 && len == 2))
		return -1;
	return cp;
}

/* The two-character escape of c, or 0. */
static char img_json_esc(unsigned char c)
{
	switch (c) {
	case '"':
		return '"';
	case '\\':
		return '\\';
	case '\b':
		return 'b';
	case '\f':
		return 'f';
	case '\n':
		return 'n';
	case '\r':
		return 'r';
	case '\t':
		return 't';
	default:
		return 0;
	}
}

/* As qemu-img writes JSON strings: everything but printable ASCII as \uXXXX
 * (upper-case hex; a surrogate pair past U+FFFF), invalid UTF-8 as U+FFFD. */
void img_json_str(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)s, *next;
	long cp;

	fputc('"', f);
	for (; *p; p = next) {
		next = p + 1;
		if (img_json_esc(*p)) {
			fprintf(f, "\\%c", img_json_esc(*p));
			continue;
		}
		cp = img_utf8_cp(p, &next);
		if (cp < 0)
			cp = 0xfffd;
		if (cp > 0xffff)
			fprintf(f, "\\u%04lX\\u%04lX", 0xd800 + ((cp - 0x10000) >> 10),
				0xdc00 + ((cp - 0x10000) & 0x3ff));
		else if (cp < 0x20 || cp >= 0x7f)
			fprintf(f, "\\u%04lX", cp);
		else
			fputc((int)cp, f);
	}
	fputc('"', f);
}

void img_indent(FILE *f, int level)
{
	for (int i = 0; i < level; i++)
		fputs("    ", f);
}

uint64_t img_size(struct blk_node *bs)
{
	uint64_t size = blk_size(bs);

	return qcow2_is(bs) || size > UINT64_MAX - 511 ? size : (size + 511) & ~511ull;
}

int64_t img_allocated_size(const char *path)
{
	struct stat st;

	if (!path || stat(path, &st) != 0)
		return -1;
	return (int64_t)st.st_blocks * 512;
}

/* ---- progress ---- */

static void img_progress_print(double pct)
{
	printf("    (%3.2f/100%%)\r", pct);
	fflush(stdout);
}

void img_progress_init(struct img_progress *p, bool on)
{
	p->on = on;
	p->last = 0;
	if (on)
		img_progress_print(0);
}

void img_progress_update(struct img_progress *p, uint64_t done, uint64_t total)
{
	double pct = total ? 100.0 * (double)done / (double)total : 100.0;

	/* At most one line per percent: a terminal is slower than a disk. */
	if (!p->on || (pct - p->last < 1.0 && pct < 100.0) || pct == p->last)
		return;
	p->last = pct;
	img_progress_print(pct);
}

void img_progress_end(struct img_progress *p)
{
	if (!p->on)
		return;
	if (p->last != 100.0)
		img_progress_print(100.0);
	printf("\n");
	fflush(stdout);
}

/* ---- block status ---- */

int img_block_status(struct blk_node *bs, uint64_t off, uint64_t len, uint32_t *status, uint64_t *n,
		     uint64_t *host)
{
	struct blk_request req = {.op = BLK_OP_BLOCK_STATUS, .offset = off, .len = len};
	int ret = blk_do_sync(bs, &req);

	if (ret)
		return ret;
	if (!req.status_len || req.status_len > len)
		return -EIO; /* a driver broke its contract: do not loop forever */
	*status = req.status;
	*n = req.status_len;
	*host = req.status_offset;
	return 0;
}
