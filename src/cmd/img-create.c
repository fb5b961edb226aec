/* `ioplane img create` and `ioplane img resize`, with qemu-img's options:
 *   create [-q] [-f raw|qcow2] [-o OPTIONS] [-b BACKING [-F FMT]] [-u] FILE [SIZE]
 *   resize [-q] [-f FMT] [--shrink] FILE [+|-]SIZE
 * qcow2 images are made by the driver (qcow2_create); raw ones here.
 *
 * Threading: main thread only. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "block/block.h"
#include "block/qcow2/qcow2.h"
#include "block/rbd.h"
#include "cmd/cmd.h"
#include "cmd/img-int.h"
#include "loop/loop.h"
#include "util/opts.h"
#include "util/path.h"

struct create_args {
	struct img_args c;
	const char *fmt, *file, *size_arg, *backing, *backing_fmt;
	struct kv_opts o; /* every -o, in order (values outlive the create opts) */
	bool quiet, unsafe;
};

static void create_usage(FILE *f)
{
	fprintf(f, "Usage: ioplane img create [-q] [-f raw|qcow2] [-o OPTIONS] [-b BACKING_FILE\n"
		   "         [-F BACKING_FMT]] [-u] FILE [SIZE]\n\n"
		   "qcow2 options (-o KEY=VALUE,...): cluster_size=512..2M, compat=0.10|1.1,\n"
		   "  extended_l2=on|off, lazy_refcounts=on|off, refcount_bits=1..64,\n"
		   "  preallocation=off|metadata|falloc|full, backing_file=, backing_fmt=,\n"
		   "  compression_type=zlib|zstd, data_file=, data_file_raw=on|off\n"
		   "raw options: preallocation=off|falloc|full\n"
		   "SIZE: bytes, or with a k, M, G, T, P or E suffix; optional with a backing\n"
		   "file (its size is used)\n");
}

static int create_parse_opt(void *ctx, int key, const char *arg)
{
	struct create_args *a = ctx;

	switch (key) {
	case 'b':
		a->backing = arg;
		return 0;
	case 'F':
		a->backing_fmt = arg;
		return 0;
	case 'u':
		a->unsafe = true;
		return 0;
	default: /* -o */
		if (!strcmp(arg, "help") || !strcmp(arg, "?")) {
			create_usage(stdout);
			return 1;
		}
		if (kv_parse(&a->o, arg, NULL)) {
			img_err("Invalid option list: %s", arg);
			return -EINVAL;
		}
		return 0;
	}
}

static const struct img_opt create_opts[] = {
	{'o', NULL, true}, {'b', NULL, true}, {'F', NULL, true}, {'u', NULL, false}, {0},
};

static const struct img_cmd create_cmd = {
	.name = "create",
	.common = IMG_C_FORMAT | IMG_C_QUIET,
	.opts = create_opts,
	.opt = create_parse_opt,
	.usage = create_usage,
	.min_files = 1,
	.max_files = 2,
	.files_err = "Expecting image file name and optional size",
};

/* 0: go on; 1: help shown; <0: bad command line (message printed). */
static int create_parse(int argc, char **argv, struct create_args *a)
{
	int ret = img_parse_args(&create_cmd, argc, argv, a, &a->c);

	if (ret)
		return ret;
	a->fmt = a->c.fmt;
	a->quiet = a->c.quiet;
	a->file = a->c.files[0];
	a->size_arg = a->c.nfiles > 1 ? a->c.files[1] : NULL;
	return 0;
}

/* Like qemu-img, images are made a whole number of 512-byte sectors (the
 * "Formatting" line shows the size asked for). */
static uint64_t create_size_round(uint64_t size)
{
	return (size + 511) & ~511ull;
}

/* ---- raw ---- */

static int raw_prealloc(int fd, const char *mode, uint64_t size)
{
	static const char zero[65536];
	uint64_t off = 0;

	if (!mode || !strcmp(mode, "off"))
		return 0;
	if (!strcmp(mode, "falloc"))
		return size && fallocate(fd, 0, 0, (off_t)size) ? -errno : 0;
	while (off < size) {
		size_t k = size - off < sizeof(zero) ? (size_t)(size - off) : sizeof(zero);
		ssize_t r = pwrite(fd, zero, k, (off_t)off);

		if (r < 0)
			return -errno;
		off += (uint64_t)r;
	}
	return 0;
}

static int raw_opts(const struct img_create *c, const char **pre, uint32_t *hint, bool *hint_given)
{
	size_t i;

	for (i = 0; c->o && i < c->o->n; i++) {
		const char *k = c->o->v[i].key, *v = c->o->v[i].val;

		if (!strcmp(k, "preallocation")) {
			*pre = v;
		} else if (!strcmp(k, "extent_size_hint")) {
			uint64_t h;

			/* As qemu-img: a size, at most 4 GiB - 1 (XFS keeps it in
			 * 32 bits); 0 sets no hint. */
			if (img_parse_size_param(c->file, k, v, &h))
				return -EINVAL;
			if (h > UINT32_MAX) {
				img_err("%s: Extent size hint is too large", c->file);
				return -EINVAL;
			}
			*hint = (uint32_t)h;
			*hint_given = true;
		} else if (strcmp(k, "size")) {
			img_err("Invalid parameter '%s' for format raw", k);
			return -EINVAL;
		}
	}
	if (*pre && strcmp(*pre, "off") && strcmp(*pre, "falloc") && strcmp(*pre, "full")) {
		img_err("Invalid preallocation mode: '%s' (raw: off, falloc or full)", *pre);
		return -EINVAL;
	}
	return 0;
}

/* ---- rbd: targets ---- */

static bool create_on_rbd(const struct img_create *c)
{
	const char *r = blk_target_remote(c->file);

	return r && !strcmp(r, "rbd");
}

static int create_rbd(const struct img_create *c, uint64_t size, const void *head, size_t len)
{
	char err[512];
	int ret = blk_rbd_create(c->file, size, head, len, err, sizeof(err));

	if (ret)
		img_err("%s", err);
	return ret;
}

/* qcow2 on RBD: the image made in a local temporary file, copied into a new
 * RBD image of the same size (qcow2 grows it by resizing, as QEMU's does). */
static int create_qcow2_rbd(const struct img_create *c, const struct qcow2_create_opts *q)
{
	char tmp[] = "/tmp/ioplane-create.XXXXXX", err[256] = "";
	struct stat st;
	void *buf = NULL;
	int fd = mkstemp(tmp), ret = fd < 0 ? -errno : 0;

	if (!ret && (ret = qcow2_create(tmp, q, err, sizeof(err))))
		img_err("%s: %s", c->file, err[0] ? err : strerror(-ret));
	if (!ret && fstat(fd, &st) != 0)
		ret = -errno;
	if (!ret && !(buf = malloc((size_t)st.st_size + 1)))
		ret = -ENOMEM;
	if (!ret && pread(fd, buf, (size_t)st.st_size, 0) != st.st_size)
		ret = -EIO;
	if (!ret)
		ret = create_rbd(c, (uint64_t)st.st_size, buf, (size_t)st.st_size);
	else if (fd < 0 || ret == -EIO || ret == -ENOMEM)
		img_err("%s: Could not create image: %s", c->file, strerror(-ret));
	free(buf);
	if (fd >= 0) {
		close(fd);
		unlink(tmp);
	}
	return ret;
}

static int create_raw(const struct img_create *c)
{
	const char *pre = NULL;
	uint32_t hint = BLK_EXTENT_HINT_DEFAULT;
	bool hint_given = false;
	char err[384];
	int fd, ret = raw_opts(c, &pre, &hint, &hint_given);

	if (ret)
		return ret;
	if (c->backing) {
		img_err("Format raw does not support backing files");
		return -EINVAL;
	}
	if (!c->quiet) {
		printf("Formatting '%s', fmt=raw size=%" PRIu64 "%s%s", c->file, c->size,
		       pre ? " preallocation=" : "", pre ? pre : "");
		if (hint_given)
			printf(" extent_size_hint=%" PRIu32, hint);
		printf("\n");
	}
	if (create_on_rbd(c) && pre && strcmp(pre, "off")) {
		img_err("%s: preallocation=%s is not supported on RBD", c->file, pre);
		return -ENOTSUP;
	}
	if (create_on_rbd(c))
		return create_rbd(c, create_size_round(c->size), NULL, 0);
	fd = blk_file_create(c->file, BLK_CREATE_PERM, BLK_CREATE_SHARED, err, sizeof(err));
	if (fd < 0) {
		img_err("Could not create '%s': %s", c->file, err);
		return fd;
	}
	/* The hint must be set while the file has no extents; best effort,
	 * like qemu-img (a file system that refuses it still gets an image). */
	if (hint)
		blk_file_extent_hint(fd, hint);
	if (ftruncate(fd, (off_t)create_size_round(c->size)) != 0)
		ret = -errno;
	if (!ret)
		ret = raw_prealloc(fd, pre, create_size_round(c->size));
	if (!ret && fsync(fd) != 0)
		ret = -errno;
	close(fd);
	if (ret)
		img_err("%s: Could not create image: %s", c->file, strerror(-ret));
	return ret;
}

/* ---- qcow2 ---- */

static const char *const prealloc_names[] = {"off", "metadata", "falloc", "full"};

static const char *create_opt(const struct img_create *c, const char *key)
{
	size_t i;

	for (i = 0; c->o && i < c->o->n; i++)
		if (!strcmp(c->o->v[i].key, key))
			return c->o->v[i].val;
	return NULL;
}

/* "Formatting ..." with the options in qemu-img's order. */
static void create_print_qcow2(const struct img_create *c, const struct qcow2_create_opts *q)
{
	const char *compat = create_opt(c, "compat");

	printf("Formatting '%s', fmt=qcow2 cluster_size=%u extended_l2=%s", c->file,
	       q->cluster_size ? q->cluster_size : 65536, q->extended_l2 ? "on" : "off");
	if (create_opt(c, "preallocation"))
		printf(" preallocation=%s", prealloc_names[q->prealloc]);
	printf(" compression_type=%s size=%" PRIu64,
	       q->compression_type == QCOW2_COMPRESSION_ZSTD ? "zstd" : "zlib", q->size);
	if (compat)
		printf(" compat=%s", compat);
	if (q->backing_file)
		printf(" backing_file=%s backing_fmt=%s", q->backing_file, q->backing_fmt);
	if (q->data_file)
		printf(" data_file=%s", q->data_file);
	if (q->data_file_raw)
		printf(" data_file_raw=on");
	printf(" lazy_refcounts=%s refcount_bits=%u\n", q->lazy_refcounts ? "on" : "off",
	       q->refcount_bits ? q->refcount_bits : 16);
}

static int create_qcow2_opts(const struct img_create *c, struct qcow2_create_opts *q)
{
	char err[256];
	size_t i;

	for (i = 0; c->o && i < c->o->n; i++) {
		const char *k = c->o->v[i].key, *v = c->o->v[i].val;
		char num[24];
		uint64_t n;

		/* qemu-img's forms of sizes and numbers are read here; the driver
		 * gets a decimal number. */
		if (!strcmp(k, "cluster_size") || !strcmp(k, "refcount_bits")) {
			if (!strcmp(k, "cluster_size") ? img_parse_size_param(c->file, k, v, &n)
						       : img_parse_number_param(c->file, k, v, &n))
				return -EINVAL;
			snprintf(num, sizeof(num), "%" PRIu64, n);
			v = num;
		}
		if (qcow2_create_opt(q, k, v, err, sizeof(err))) {
			img_err("%s", err);
			return -EINVAL;
		}
	}
	if (c->backing)
		q->backing_file = c->backing;
	if (c->backing_fmt)
		q->backing_fmt = c->backing_fmt;
	if (c->size > (uint64_t)INT64_MAX - 511) {
		img_err("Image size must be less than 8 EiB!");
		return -EINVAL;
	}
	if (q->backing_file && !q->backing_fmt) {
		img_err("Backing file specified without backing format (use -F raw|qcow2: "
			"formats are never probed)");
		return -EINVAL;
	}
	if (q->backing_fmt && !q->backing_file) {
		img_err("Backing format given without a backing file");
		return -EINVAL;
	}
	q->size = c->size;
	return 0;
}

static int create_qcow2(const struct img_create *c)
{
	struct qcow2_create_opts q = {0};
	char err[256] = "";
	int ret = create_qcow2_opts(c, &q);

	if (ret)
		return ret;
	if (!c->quiet)
		create_print_qcow2(c, &q);
	q.size = create_size_round(q.size);
	if (create_on_rbd(c))
		return create_qcow2_rbd(c, &q);
	ret = qcow2_create(c->file, &q, err, sizeof(err));
	if (ret)
		img_err("%s: %s", c->file, err[0] ? err : strerror(-ret));
	return ret;
}

int img_create_image(const struct img_create *c)
{
	if (!strcmp(c->fmt, "raw"))
		return create_raw(c);
	if (!strcmp(c->fmt, "qcow2"))
		return create_qcow2(c);
	img_err("Unknown file format '%s'", c->fmt);
	return -EINVAL;
}

/* ---- create ---- */

/* The size of the backing file, opened as its declared format; as qemu-img,
 * sharing everything (it may be in use: only its size is read). */
static int create_backing_size(const char *image, const char *backing, const char *fmt,
			       uint64_t *size)
{
	struct img_open_opts oo = {.fmt = fmt, .flags = IMG_OPEN_FORCE_SHARE};
	struct blk_node *bs = NULL;
	struct loop *loop = NULL;
	char *path = path_relative(image, backing);
	int ret = path ? img_loop_start(&loop) : -ENOMEM;

	if (!ret)
		ret = img_open(path, &oo, &bs, NULL);
	if (!ret)
		*size = blk_size(bs);
	img_loop_end(loop, bs);
	free(path);
	return ret;
}

/* The size: argument, -o size=, or the backing file's. Like qemu-img, the
 * backing file must open unless -u. */
static int create_size(struct create_args *a, uint64_t *size)
{
	const char *backing = a->backing ? a->backing : kv_get(&a->o, "backing_file");
	const char *bfmt = a->backing_fmt ? a->backing_fmt : kv_get(&a->o, "backing_fmt");
	const char *arg = a->size_arg ? a->size_arg : kv_get(&a->o, "size");
	char num[24];
	uint64_t bsize;
	int ret;

	if (a->size_arg && img_parse_size(a->size_arg, "image size", size))
		return -EINVAL;
	if (!a->size_arg && arg && img_parse_size_param(a->file, "size", arg, size))
		return -EINVAL;
	/* The drivers see the size as a number: qemu-img's forms are read here. */
	snprintf(num, sizeof(num), "%" PRIu64, *size);
	if (arg && kv_get(&a->o, "size") && kv_set(&a->o, "size", num))
		return -ENOMEM;
	if (backing && !bfmt)
		return 0; /* refused with a clear message by create_qcow2_opts() */
	if (backing && !a->unsafe) {
		ret = create_backing_size(a->file, backing, bfmt, &bsize);
		if (!ret && !arg)
			*size = bsize;
		return ret;
	}
	if (!arg) {
		img_err("%s: Image creation needs a size parameter", a->file);
		return -EINVAL;
	}
	return 0;
}

int cmd_img_create(int argc, char **argv)
{
	struct create_args a = {0};
	struct img_create c = {0};
	int ret = create_parse(argc, argv, &a);

	if (!ret && (!a.fmt || !strcmp(a.fmt, "raw")) && (a.backing || a.backing_fmt)) {
		img_err("Format raw does not support backing files");
		ret = -EINVAL;
	}
	if (!ret)
		ret = create_size(&a, &c.size);
	if (!ret) {
		c = (struct img_create){.fmt = a.fmt ? a.fmt : "raw",
					.file = a.file,
					.backing = a.backing,
					.backing_fmt = a.backing_fmt,
					.o = &a.o,
					.size = c.size,
					.quiet = a.quiet};
		ret = img_create_image(&c);
	}
	kv_free(&a.o);
	return ret < 0 ? 1 : 0;
}

/* ---- resize ---- */

static void resize_usage(FILE *f)
{
	fprintf(f, "Usage: ioplane img resize [-q] [-f FMT] [--shrink] FILE [+|-]SIZE\n\n"
		   "Grows (or with --shrink, shrinks) the virtual disk. qcow2 images only grow.\n");
}

struct resize_args {
	struct img_args c;
	const char *file, *size_arg;
	bool shrink;
};

enum { OPT_SHRINK = IMG_OPT_LOCAL };

static int resize_opt(void *ctx, int key, const char *arg)
{
	struct resize_args *a = ctx;

	(void)arg;
	if (key == OPT_SHRINK)
		a->shrink = true;
	return 0;
}

static const struct img_opt resize_opts[] = {
	{OPT_SHRINK, "shrink", false},
	{0},
};

static const struct img_cmd resize_cmd = {
	.name = "resize",
	.common = IMG_C_FORMAT | IMG_C_QUIET | IMG_C_FORCE_SHARE,
	.opts = resize_opts,
	.opt = resize_opt,
	.usage = resize_usage,
	.min_files = 1,
	.max_files = 1,
	.files_err = "Expecting image file name and size",
};

static bool resize_is_help(const char *arg)
{
	return !strcmp(arg, "--help") || !strcmp(arg, "-h");
}

static int resize_parse(int argc, char **argv, struct resize_args *a)
{
	int ret;

	/* The size goes last and may start with '-': take it before getopt. */
	if (argc < 3 && !(argc == 2 && resize_is_help(argv[1]))) {
		img_err("%s (try '%s resize --help')", resize_cmd.files_err, IMG_PROG);
		return -EINVAL;
	}
	if (!resize_is_help(argv[argc - 1]))
		a->size_arg = argv[--argc];
	ret = img_parse_args(&resize_cmd, argc, argv, a, &a->c);
	if (!ret)
		a->file = a->c.files[0];
	return ret;
}

static int resize_target(const struct resize_args *a, uint64_t cur, uint64_t *size)
{
	const char *s = a->size_arg;
	uint64_t v;
	int ret = img_parse_size_param(NULL, "size", s[0] == '+' || s[0] == '-' ? s + 1 : s, &v);

	if (ret)
		return ret;
	/* As qemu-img, in signed 64 bits: the result must be above 0. */
	if (v > (uint64_t)INT64_MAX || (s[0] == '+' && v > (uint64_t)INT64_MAX - cur) ||
	    (s[0] == '-' && v >= cur) || (s[0] != '+' && s[0] != '-' && !v)) {
		img_err("New image size must be positive");
		return -EINVAL;
	}
	*size = s[0] == '+' ? cur + v : s[0] == '-' ? cur - v : v;
	return 0;
}

static int resize_run(const struct resize_args *a, struct blk_node *bs, const char *fmt)
{
	uint64_t cur = blk_size(bs), size;
	int ret = resize_target(a, cur, &size);

	if (ret)
		return ret;
	if (size < cur && !a->shrink) {
		img_err("Use the --shrink option to perform a shrink operation.");
		return -EINVAL;
	}
	if (qcow2_is(bs) && size % 512) {
		img_err("The new size must be a multiple of 512");
		return -EINVAL;
	}
	ret = blk_truncate(bs, size);
	if (ret == -ENOTSUP && size < cur)
		img_err("%s images cannot be shrunk", fmt);
	else if (ret == -ENOTSUP && qcow2_is(bs))
		img_err("Can't resize an image which has snapshots");
	else if (ret)
		img_err("Failed to resize image: %s", strerror(-ret));
	else if (!a->c.quiet)
		printf("Image resized.\n");
	return ret;
}

int cmd_img_resize(int argc, char **argv)
{
	struct resize_args a = {0};
	struct img_open_opts oo = {.flags = IMG_OPEN_RW | IMG_OPEN_RESIZE};
	struct blk_node *bs = NULL;
	struct loop *loop = NULL;
	const char *fmt = NULL;
	int ret = resize_parse(argc, argv, &a);

	if (ret)
		return ret > 0 ? 0 : 1;
	oo.fmt = a.c.fmt;
	oo.flags |= a.c.force_share ? IMG_OPEN_FORCE_SHARE : 0;
	ret = img_loop_start(&loop);
	if (!ret)
		ret = img_open(a.file, &oo, &bs, &fmt);
	if (!ret)
		ret = resize_run(&a, bs, fmt);
	img_loop_end(loop, bs);
	return ret ? 1 : 0;
}
