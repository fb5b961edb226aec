/* `ioplane img`: the helpers every subcommand uses (img-int.h). The
 * subcommands themselves live in img-create.c (create, resize), img-info.c
 * (info, check), img-map.c, img-convert.c and img-compare.c.
 *
 * Threading: main thread only; one loop bound to it per command run. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
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
	struct loop_opts lo = { .backend = LOOP_BACKEND_AUTO, .poll_max_ns = -1 };
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

int img_check_cache(const char *cache)
{
	static const char *const ok[] = { "none", "writeback", "writethrough", "directsync",
					  "unsafe", "off", "on" };
	size_t i;

	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		if (!strcmp(cache, ok[i]))
			return 0;
	img_err("Invalid cache option: %s", cache);
	return -EINVAL;
}

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

int img_open(const char *path, const struct img_open_opts *o, struct blk_node **out,
	     const char **fmt_out)
{
	const char *fmt = o->fmt;
	bool probed = !fmt && strncmp(path, "null:", 5);
	char extra[128], err[512] = "";
	int ret;

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

/* ---- command line ---- */

int img_parse_output(const char *arg, enum img_output *out)
{
	if (!strcmp(arg, "human")) {
		*out = IMG_OUT_HUMAN;
	} else if (!strcmp(arg, "json")) {
		*out = IMG_OUT_JSON;
	} else {
		img_err("--output must be used with human or json as argument.");
		return -EINVAL;
	}
	return 0;
}

int img_parse_size(const char *arg, uint64_t *out)
{
	int ret = arg[0] == '-' ? -EINVAL : parse_size(arg, out);

	if (ret == -ERANGE || (!ret && *out > (uint64_t)INT64_MAX)) {
		img_err("Image size must be less than 8 EiB!");
		return -EINVAL;
	}
	if (ret) {
		img_err("Invalid image size specified. You may use k, M, G, T, P or E suffixes "
			"for kilobytes, megabytes, gigabytes, terabytes, petabytes and exabytes.");
		return -EINVAL;
	}
	return 0;
}

void img_getopt_reset(void)
{
	optind = 0; /* glibc: full re-initialisation, argv[0] is the subcommand */
	opterr = 0;
}

void img_bad_opt(const char *cmd, int c, char **argv)
{
	const char *arg = argv[optind - 1];

	fflush(stdout);
	if (c == ':')
		fprintf(stderr, "%s %s: option '%s' requires an argument", IMG_PROG, cmd, arg);
	else if (optopt && strncmp(arg, "--", 2))
		fprintf(stderr, "%s %s: invalid option -- '%c'", IMG_PROG, cmd, optopt);
	else
		fprintf(stderr, "%s %s: unrecognized option '%s'", IMG_PROG, cmd, arg);
	fprintf(stderr, " (try '%s %s --help')\n", IMG_PROG, cmd);
}

/* ---- output ---- */

void img_size_str(uint64_t v, char *buf, size_t n)
{
	static const char *const suffix[] = { "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei" };

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

void img_json_str(FILE *f, const char *s)
{
	const unsigned char *p = (const unsigned char *)s;

	fputc('"', f);
	for (; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(f, "\\%c", *p);
		else if (*p == '\n')
			fputs("\\n", f);
		else if (*p == '\t')
			fputs("\\t", f);
		else if (*p < 0x20 || *p == 0x7f)
			fprintf(f, "\\u%04x", *p);
		else
			fputc(*p, f);
	}
	fputc('"', f);
}

void img_indent(FILE *f, int level)
{
	for (int i = 0; i < level; i++)
		fputs("    ", f);
}

char *img_path_relative(const char *image, const char *name)
{
	const char *slash = strrchr(image, '/');
	size_t dl;
	char *p;

	if (name[0] == '/' || !slash)
		return strdup(name);
	dl = (size_t)(slash - image) + 1;
	p = malloc(dl + strlen(name) + 1);
	if (p) {
		memcpy(p, image, dl);
		memcpy(p + dl, name, strlen(name) + 1);
	}
	return p;
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

int img_block_status(struct blk_node *bs, uint64_t off, uint64_t len, uint32_t *status,
		     uint64_t *n, uint64_t *host)
{
	struct blk_request req = { .op = BLK_OP_BLOCK_STATUS, .offset = off, .len = len };
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
