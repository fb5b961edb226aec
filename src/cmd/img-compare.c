/* `ioplane img compare [-f FMT] [-F FMT] [-T CACHE] [-p] [-q] [-s] A B`:
 * do two images show the guest the same bytes? Like qemu-img compare:
 * ranges both images know read as zero are skipped, others are read and
 * compared 512 bytes at a time; an image larger than the other matches
 * if its extra part reads as zeroes (not with -s, strict).
 * Exit: 0 identical, 1 different, 2 cannot open, 3 block status failed,
 * 4 read failed.
 *
 * Threading: main thread only; synchronous requests on the command's loop. */
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

#define CMP_CHUNK (2u << 20)
#define CMP_SECTOR 512

enum { CMP_SAME = 0, CMP_DIFFER = 1, CMP_EOPEN = 2, CMP_ESTATUS = 3, CMP_EREAD = 4 };

struct cmp_args {
	struct img_args c;
	const char *fmt2, *file1, *file2, *cache;
	bool progress, strict;
};

struct cmp {
	const struct cmp_args *a;
	struct blk_node *bs1, *bs2;
	uint8_t *buf1, *buf2;
	struct img_progress prog;
	uint64_t total; /* bytes to look at, for -p */
	uint64_t seen;
};

/* Status through the backing chain: *zero if the range reads as zeroes,
 * *alloc if some layer holds it (raw layers hold everything). */
static int cmp_status(struct blk_node *bs, uint64_t off, uint64_t *len, bool *zero, bool *alloc)
{
	uint64_t host;
	uint32_t st;
	int ret;

	for (;;) {
		ret = img_block_status(bs, off, *len, &st, len, &host);
		if (ret)
			return ret;
		*zero = st & BLK_STATUS_ZERO;
		*alloc = !qcow2_is(bs) || (st & BLK_STATUS_ALLOCATED);
		if (*zero || *alloc || !qcow2_backing(bs))
			return 0;
		bs = qcow2_backing(bs);
	}
}

static void cmp_say(const struct cmp *c, const char *fmt, uint64_t v)
{
	if (c->a->c.quiet)
		return;
	printf(fmt, v);
	fflush(stdout);
}

/* Offset of the first CMP_SECTOR-block of buf (at image offset off) that
 * differs from ref (NULL: zeroes), or UINT64_MAX. */
static uint64_t cmp_first_diff(const uint8_t *buf, const uint8_t *ref, uint64_t off, uint64_t len)
{
	static const uint8_t zero[CMP_SECTOR];
	uint64_t i, k;

	for (i = 0; i < len; i += k) {
		k = len - i < CMP_SECTOR ? len - i : CMP_SECTOR;
		if (memcmp(buf + i, ref ? ref + i : zero, k))
			return off + i;
	}
	return UINT64_MAX;
}

/* One range of the common part: 0 same, CMP_* otherwise. */
static int cmp_range(struct cmp *c, uint64_t off, uint64_t *len)
{
	uint64_t n2 = *len, d;
	bool z1, z2, a1, a2;

	if (cmp_status(c->bs1, off, len, &z1, &a1) || cmp_status(c->bs2, off, &n2, &z2, &a2)) {
		img_err("Block status failed at offset %" PRIu64, off);
		return CMP_ESTATUS;
	}
	if (n2 < *len)
		*len = n2;
	if (c->a->strict && (z1 != z2 || a1 != a2)) {
		cmp_say(c, "Strict mode: Offset %" PRIu64 " block status mismatch!\n", off);
		return CMP_DIFFER;
	}
	if (z1 && z2)
		return 0;
	if (*len > CMP_CHUNK)
		*len = CMP_CHUNK;
	if (blk_pread(c->bs1, off, c->buf1, *len) || blk_pread(c->bs2, off, c->buf2, *len)) {
		img_err("Error while reading offset %" PRIu64 ": %s", off, "I/O error");
		return CMP_EREAD;
	}
	d = cmp_first_diff(c->buf1, c->buf2, off, *len);
	if (d != UINT64_MAX) {
		cmp_say(c, "Content mismatch at offset %" PRIu64 "!\n", d);
		return CMP_DIFFER;
	}
	return 0;
}

/* The part of the larger image past the end of the smaller one must read
 * as zeroes. */
static int cmp_tail(struct cmp *c, struct blk_node *bs, uint64_t off, uint64_t end)
{
	uint64_t len, d;
	bool zero, alloc;
	int ret = 0;

	for (; off < end && !ret; off += len) {
		len = end - off;
		if (cmp_status(bs, off, &len, &zero, &alloc)) {
			img_err("Block status failed at offset %" PRIu64, off);
			return CMP_ESTATUS;
		}
		if (!zero) {
			if (len > CMP_CHUNK)
				len = CMP_CHUNK;
			if (blk_pread(bs, off, c->buf1, len)) {
				img_err("Error while reading offset %" PRIu64, off);
				return CMP_EREAD;
			}
			d = cmp_first_diff(c->buf1, NULL, off, len);
			if (d != UINT64_MAX) {
				cmp_say(c, "Content mismatch at offset %" PRIu64 "!\n", d);
				ret = CMP_DIFFER;
			}
		}
		c->seen += len;
		if (!ret)
			img_progress_update(&c->prog, c->seen, c->total);
	}
	return ret;
}

static int cmp_run(struct cmp *c)
{
	uint64_t s1 = blk_size(c->bs1), s2 = blk_size(c->bs2), common = s1 < s2 ? s1 : s2;
	uint64_t off, len;
	int ret = 0;

	c->total = s1 > s2 ? s1 : s2;
	if (c->a->strict && s1 != s2) {
		cmp_say(c, "Strict mode: Image size mismatch!\n", 0);
		return CMP_DIFFER;
	}
	img_progress_init(&c->prog, c->a->progress);
	for (off = 0; off < common && !ret; off += len) {
		len = common - off;
		ret = cmp_range(c, off, &len);
		c->seen += len;
		if (!ret)
			img_progress_update(&c->prog, c->seen, c->total);
	}
	if (!ret && s1 != s2) {
		cmp_say(c, "Warning: Image size mismatch!\n", 0);
		ret = cmp_tail(c, s1 > s2 ? c->bs1 : c->bs2, common, c->total);
	}
	if (!ret) {
		img_progress_end(&c->prog);
		cmp_say(c, "Images are identical.\n", 0);
	}
	return ret;
}

/* ---- command line ---- */

static void cmp_usage(FILE *f)
{
	fprintf(f,
		"Usage: ioplane img compare [-f FMT] [-F FMT | --image-opts] [-T CACHE] [-p] [-q]\n"
		"         [-s] [-U] FILE1 FILE2\n\n"
		"Exit status: 0 identical, 1 different (or a bad command line), 2 cannot open\n"
		"an image, 3 block status failed, 4 read failed.\n");
}

static int cmp_opt(void *ctx, int key, const char *arg)
{
	struct cmp_args *a = ctx;

	switch (key) {
	case 'F':
		a->fmt2 = arg;
		return 0;
	case 'p':
		a->progress = true;
		return 0;
	case 's':
		a->strict = true;
		return 0;
	default: /* -T: checked when the images are opened, as qemu-img does */
		a->cache = arg;
		return 0;
	}
}

static const struct img_opt cmp_opts[] = {
	{'F', NULL, true}, {'T', NULL, true}, {'p', NULL, false}, {'s', NULL, false}, {0},
};

static const struct img_cmd cmp_cmd = {
	.name = "compare",
	.common = IMG_C_FORMAT | IMG_C_QUIET | IMG_C_FORCE_SHARE | IMG_C_IMAGE_OPTS,
	.opts = cmp_opts,
	.opt = cmp_opt,
	.usage = cmp_usage,
	.min_files = 2,
	.max_files = 2,
	.files_err = "Expecting two image file names",
};

static int cmp_open(struct cmp *c)
{
	struct img_open_opts o1, o2;

	if (c->a->cache && img_check_cache(c->a->cache, true))
		return CMP_EOPEN;
	img_open_opts_from(&o1, &c->a->c);
	o1.cache = c->a->cache;
	o2 = o1;
	o2.fmt = c->a->fmt2;
	if (img_open(c->a->file1, &o1, &c->bs1, NULL) || img_open(c->a->file2, &o2, &c->bs2, NULL))
		return CMP_EOPEN;
	c->buf1 = blk_alloc_buf(c->bs1->mem_align > c->bs2->mem_align ? c->bs1 : c->bs2, CMP_CHUNK);
	c->buf2 = blk_alloc_buf(c->bs1->mem_align > c->bs2->mem_align ? c->bs1 : c->bs2, CMP_CHUNK);
	if (!c->buf1 || !c->buf2) {
		img_err("out of memory");
		return CMP_EOPEN;
	}
	return 0;
}

int cmd_img_compare(int argc, char **argv)
{
	struct cmp_args a = {0};
	struct cmp c = {.a = &a};
	struct loop *loop = NULL;
	int ret = img_parse_args(&cmp_cmd, argc, argv, &a, &a.c);

	if (ret)
		return ret > 0 ? 0 : 1; /* qemu-img: a bad command line is 1 here too */
	a.file1 = a.c.files[0];
	a.file2 = a.c.files[1];
	if (a.c.quiet)
		a.progress = false;
	if (img_loop_start(&loop))
		return CMP_EOPEN;
	ret = cmp_open(&c);
	if (!ret)
		ret = cmp_run(&c);
	free(c.buf1);
	free(c.buf2);
	if (c.bs1) {
		blk_detach_loop(c.bs1, loop);
		blk_close(c.bs1);
	}
	img_loop_end(loop, c.bs2);
	return ret;
}
