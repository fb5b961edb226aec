/* `ioplane img map [-f FMT] [--output=human|json] [--start-offset=N]
 * [--max-length=N] FILE`: where the data of each range of the virtual disk
 * lives, walking the backing chain, printed like qemu-img map. Ranges with
 * the same properties (and contiguous host offsets) are merged.
 *
 * Threading: main thread only. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block.h"
#include "block/qcow2/qcow2.h"
#include "cmd/cmd.h"
#include "cmd/img-int.h"
#include "loop/loop.h"
#include "util/path.h"

/* One layer of the chain: its node and the names qemu-img shows for it. */
struct map_layer {
	struct blk_node *bs;
	char *file;      /* the image file */
	char *data_file; /* qcow2 external data file (offsets point there), or NULL */
	/* qcow2 whose clusters look preallocated: data ranges are zero where the
	 * file under them is a hole, as QEMU finds (map_zero_under). */
	bool prealloc;
};

#define MAP_MAX_DEPTH 64

struct map_entry {
	uint64_t start, length, offset;
	int depth;
	bool present, zero, data, has_offset;
	const char *file; /* with has_offset */
};

struct map_args {
	struct img_args c;
	const char *file;
	uint64_t start, max_len;
	bool has_max;
};

/* QEMU's test for metadata preallocation: clusters with a refcount are
 * more than the file's allocated clusters by 1/9 (or 2). It then asks the
 * file what lies under data clusters; otherwise it takes them as data. */
static bool map_prealloc(struct blk_node *bs, const char *file)
{
	int64_t real = img_allocated_size(file);
	uint64_t cs = qcow2_cluster_size(bs), rc, thr, count = 0;

	if (real < 0 || !cs)
		return false;
	rc = (uint64_t)real / cs;
	thr = rc * 10 / 9 > rc + 2 ? rc * 10 / 9 : rc + 2;
	return !qcow2_count_refcounted(bs, thr, &count) && count >= thr;
}

static int map_layers(struct blk_node *bs, const char *file, struct map_layer *v, int *n)
{
	struct qcow2_info q;
	char *name = strdup(file);
	int ret = 0;

	for (*n = 0; bs && !ret; bs = qcow2_backing(bs)) {
		if (!name || *n == MAP_MAX_DEPTH) {
			ret = name ? -ELOOP : -ENOMEM;
			break;
		}
		v[*n] = (struct map_layer){.bs = bs, .file = name};
		name = NULL;
		if (!qcow2_is(bs) || (ret = qcow2_get_info(bs, &q)))
			break;
		if (q.data_file && !(v[*n].data_file = strdup(q.data_file)))
			ret = -ENOMEM;
		v[*n].prealloc = map_prealloc(bs, v[*n].file);
		/* A backing file given as an option has no name in the header. */
		name = path_relative(v[*n].file, q.backing_file ? q.backing_file : "");
		qcow2_info_free(&q);
		(*n)++;
	}
	if (bs && *n < MAP_MAX_DEPTH && v[*n].bs == bs)
		(*n)++; /* the raw layer (or one that failed) that ended the walk */
	free(name);
	return ret;
}

static void map_layers_free(struct map_layer *v, int n)
{
	for (int i = 0; i < n; i++) {
		free(v[i].file);
		free(v[i].data_file);
	}
}

/* Data at host offset host, *len bytes: zero where the node holding it has a
 * hole or ends (read as zeroes), *len cut where that changes. Errors are
 * ignored: this only adds what QEMU adds. */
static void map_zero_under(struct blk_node *bs, uint64_t host, uint64_t *len, uint32_t *st)
{
	struct blk_node *dn = blk_child(bs, BLK_ROLE_DATA_FILE);
	uint64_t size, n, h, want;
	uint32_t fst;

	dn = dn ? dn : blk_child(bs, BLK_ROLE_FILE);
	if (!dn)
		return;
	size = blk_size(dn);
	if (host >= size) {
		*st |= BLK_STATUS_ZERO;
		return;
	}
	want = *len < size - host ? *len : size - host;
	if (img_block_status(dn, host, want, &fst, &n, &h))
		return;
	if ((fst & BLK_STATUS_ZERO) && host + n == size) {
		*st |= BLK_STATUS_ZERO; /* a hole up to the end: zero to the end of the range */
		return;
	}
	*len = n;
	*st |= fst & BLK_STATUS_ZERO;
}

/* A raw layer: the file itself, at the same offset; past its end, up to
 * the whole 512-byte sector QEMU sizes it to, zeroes. */
static int map_raw_status(struct blk_node *bs, uint64_t off, uint64_t *len, uint32_t *st)
{
	uint64_t host;
	int ret = 0;

	if (off >= blk_size(bs)) {
		*st = BLK_STATUS_ZERO;
		if (*len > img_size(bs) - off)
			*len = img_size(bs) - off;
	} else {
		ret = img_block_status(bs, off, *len, st, len, &host);
	}
	*st |= BLK_STATUS_ALLOCATED | BLK_STATUS_OFFSET_VALID;
	return ret;
}

/* A qcow2 layer reads [off, +*len) as zeroes past the end of its backing
 * file: QEMU, whose raw backing file ends on a whole sector, reads the
 * rest of that sector from the backing file. */
static bool map_in_padding(const struct map_layer *v, int d, int n, uint64_t off, uint64_t *len)
{
	struct blk_node *bk = d + 1 < n ? v[d + 1].bs : NULL;

	if (!bk || off < blk_size(bk) || off >= img_size(bk))
		return false;
	if (*len > img_size(bk) - off)
		*len = img_size(bk) - off;
	return true;
}

/* Status of [off, off+len) down the chain: stop at the first layer that
 * has the range (or knows it reads as zero), as qemu-img map does. */
static int map_status(const struct map_layer *v, int n, uint64_t off, uint64_t len,
		      struct map_entry *e)
{
	uint32_t st = 0;
	uint64_t host = off;
	int d, ret;

	for (d = 0; d < n; d++) {
		if (!qcow2_is(v[d].bs)) {
			ret = map_raw_status(v[d].bs, off, &len, &st);
			host = off;
			break;
		}
		ret = img_block_status(v[d].bs, off, len, &st, &len, &host);
		if (ret || (st & BLK_STATUS_ALLOCATED) || d + 1 == n)
			break;
		if ((st & BLK_STATUS_ZERO) && !map_in_padding(v, d, n, off, &len))
			break;
	}
	if (ret)
		return ret;
	if (d == n)
		d = n - 1;
	if (v[d].prealloc && (st & BLK_STATUS_DATA) && (st & BLK_STATUS_OFFSET_VALID) &&
	    !(st & BLK_STATUS_ZERO))
		map_zero_under(v[d].bs, host, &len, &st);
	*e = (struct map_entry){
		.start = off,
		.length = len,
		.depth = d,
		.present = st & BLK_STATUS_ALLOCATED,
		.zero = st & BLK_STATUS_ZERO,
		.data = st & BLK_STATUS_DATA,
		.has_offset = st & BLK_STATUS_OFFSET_VALID,
		.offset = host,
		.file = v[d].data_file ? v[d].data_file : v[d].file,
	};
	return 0;
}

static bool map_mergeable(const struct map_entry *a, const struct map_entry *b)
{
	if (a->zero != b->zero || a->data != b->data || a->depth != b->depth ||
	    a->present != b->present || a->has_offset != b->has_offset)
		return false;
	if (a->has_offset && (strcmp(a->file, b->file) || a->offset + a->length != b->offset))
		return false;
	return true;
}

/* Print e; `next` (NULL at the end) may be adjusted for the human form,
 * which does not tell zero ranges from holes. */
static int map_print(const struct map_args *a, const struct map_entry *e, struct map_entry *next)
{
	if (a->c.out == IMG_OUT_JSON) {
		printf("{ \"start\": %" PRIu64 ", \"length\": %" PRIu64 ", \"depth\": %d, "
		       "\"present\": %s, \"zero\": %s, \"data\": %s",
		       e->start, e->length, e->depth, e->present ? "true" : "false",
		       e->zero ? "true" : "false", e->data ? "true" : "false");
		if (e->has_offset)
			printf(", \"offset\": %" PRIu64, e->offset);
		printf("}%s", next ? ",\n" : "");
		return 0;
	}
	if (e->data && !e->has_offset) {
		img_err("File contains external, encrypted or compressed clusters.");
		return -ENOTSUP;
	}
	if (e->data && !e->zero)
		printf("%#-16" PRIx64 "%#-16" PRIx64 "%#-16" PRIx64 "%s\n", e->start, e->length,
		       e->offset, e->file);
	if (next && (!next->data || next->zero)) {
		next->data = false;
		next->zero = true;
	}
	return 0;
}

static int map_run(const struct map_args *a, const struct map_layer *v, int n)
{
	uint64_t size = img_size(v[0].bs), end, off;
	struct map_entry cur = {0}, next;
	int ret = 0;

	end = a->has_max && a->max_len < size - a->start ? a->start + a->max_len : size;
	if (a->start >= end)
		end = a->start; /* nothing to map */
	printf(a->c.out == IMG_OUT_JSON ? "[" : "%-16s%-16s%-16s%s\n", "Offset", "Length",
	       "Mapped to", "File");
	cur.start = a->start;
	for (off = a->start; off < end && !ret; off += next.length) {
		ret = map_status(v, n, off, end - off, &next);
		if (ret) {
			img_err("Could not read file metadata: %s", strerror(-ret));
			break;
		}
		if (cur.length && map_mergeable(&cur, &next)) {
			cur.length += next.length;
			continue;
		}
		if (cur.length)
			ret = map_print(a, &cur, &next);
		cur = next;
	}
	/* As qemu-img: the last entry goes out even when nothing was mapped (a
	 * start at or past the end, --max-length=0): zero bytes, no flags. */
	if (!ret)
		ret = map_print(a, &cur, NULL);
	if (a->c.out == IMG_OUT_JSON)
		printf("]\n");
	return ret;
}

static void map_usage(FILE *f)
{
	fprintf(f, "Usage: ioplane img map [-f FMT | --image-opts] [--output=human|json]\n"
		   "         [--start-offset=OFFSET] [--max-length=LEN] [-U] FILE\n");
}

enum { OPT_START = IMG_OPT_LOCAL, OPT_MAXLEN };

static int map_opt(void *ctx, int key, const char *arg)
{
	struct map_args *a = ctx;

	if (key == OPT_START)
		return img_parse_size(arg, "start offset", &a->start);
	a->has_max = true;
	return img_parse_size(arg, "max length", &a->max_len);
}

static const struct img_opt map_opts[] = {
	{OPT_START, "start-offset", true},
	{OPT_MAXLEN, "max-length", true},
	{0},
};

static const struct img_cmd map_cmd = {
	.name = "map",
	.common = IMG_C_FORMAT | IMG_C_OUTPUT | IMG_C_FORCE_SHARE | IMG_C_IMAGE_OPTS,
	.opts = map_opts,
	.opt = map_opt,
	.usage = map_usage,
	.min_files = 1,
	.max_files = 1,
	.files_err = "Expecting one image file name",
};

int cmd_img_map(int argc, char **argv)
{
	struct map_args a = {0};
	struct img_open_opts oo = {0};
	struct map_layer v[MAP_MAX_DEPTH] = {{0}};
	struct blk_node *bs = NULL;
	struct loop *loop = NULL;
	int n = 0, ret = img_parse_args(&map_cmd, argc, argv, &a, &a.c);

	if (ret)
		return ret > 0 ? 0 : 1;
	a.file = a.c.files[0];
	img_open_opts_from(&oo, &a.c);
	ret = img_loop_start(&loop);
	if (!ret)
		ret = img_open(a.file, &oo, &bs, NULL);
	if (!ret) {
		ret = map_layers(bs, a.file, v, &n);
		if (ret)
			img_err("%s: %s", a.file, strerror(-ret));
	}
	if (!ret)
		ret = map_run(&a, v, n);
	map_layers_free(v, n);
	img_loop_end(loop, bs);
	return ret ? 1 : 0;
}
