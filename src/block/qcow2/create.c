/* qcow2 image creation, written with plain pwrite (no loop needed):
 *
 *   cluster 0           header, extensions, backing file name
 *   1 .. T              refcount table
 *   T+1 .. T+B          refcount blocks (every cluster up to the end is used)
 *   then                L1 table
 *   then (prealloc)     L2 tables, then data clusters in guest order
 *
 * Threading: caller's thread; touches only the new files. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "block/file.h"
#include "block/qcow2/qcow2-int.h"
#include "util/compiler.h"
#include "util/opts.h"
#include "util/path.h"

#define CR_HDR_LEN 112

struct cr_layout {
	uint64_t cs;
	unsigned cbits, l2_bits, rb_bits;
	uint64_t l1_size, l1_clusters;
	uint64_t rct_clusters, nrb;
	uint64_t nl2, ndata; /* preallocated L2 tables and data clusters */
	uint64_t rct_at, rb_at, l1_at, l2_at, data_at, end; /* cluster indexes */
};

static int cr_err(char *err, size_t n, int ret, const char *msg, const char *arg)
{
	snprintf(err, n, "qcow2 create: %s%s%s", msg, arg ? ": " : "", arg ? arg : "");
	return ret;
}

static int cr_check(const struct qcow2_create_opts *o, char *err, size_t n)
{
	uint64_t cs = o->cluster_size ? o->cluster_size : 65536;
	unsigned rb = o->refcount_bits ? o->refcount_bits : 16;
	bool v3 = o->compat != 2;

	if (cs < 512 || cs > (2u << 20) || (cs & (cs - 1)))
		return cr_err(err, n, -EINVAL,
			      "cluster size must be a power of two, 512 B to 2 MiB", NULL);
	if (rb > 64 || (rb & (rb - 1)) || (!v3 && rb != 16))
		return cr_err(err, n, -EINVAL,
			      "refcount_bits must be a power of two up to 64 "
			      "(16 with compat=0.10)",
			      NULL);
	if (!v3 && (o->extended_l2 || o->lazy_refcounts || o->data_file ||
		    o->compression_type != QCOW2_COMPRESSION_ZLIB))
		return cr_err(err, n, -EINVAL,
			      "extended_l2, lazy_refcounts, data_file and zstd "
			      "need compat=1.1",
			      NULL);
	if (o->extended_l2 && cs < 16384)
		return cr_err(err, n, -EINVAL, "extended_l2 needs a cluster size of 16 KiB or more",
			      NULL);
	if (o->backing_file && !o->backing_fmt)
		return cr_err(err, n, -EINVAL, "a backing file needs its format (backing_fmt)",
			      NULL);
	if (o->backing_fmt && strcmp(o->backing_fmt, "raw") && strcmp(o->backing_fmt, "qcow2"))
		return cr_err(err, n, -EINVAL, "unsupported backing format", o->backing_fmt);
	if (o->data_file_raw && !o->data_file)
		return cr_err(err, n, -EINVAL, "data_file_raw needs data_file", NULL);
	if (o->data_file_raw && o->backing_file)
		return cr_err(err, n, -EINVAL, "data_file_raw cannot have a backing file", NULL);
	if (o->size > (uint64_t)INT64_MAX)
		return cr_err(err, n, -EINVAL, "size too large", NULL);
	if (o->prealloc != QCOW2_PREALLOC_OFF && o->backing_file)
		return cr_err(err, n, -EINVAL, "preallocation would hide the backing file", NULL);
	return 0;
}

/* No size given: the backing file's (opened read-only, format as declared). */
static int cr_backing_size(const char *image, const struct qcow2_create_opts *o, uint64_t *size,
			   char *err, size_t n)
{
	char *p = path_relative(image, o->backing_file), sub[256] = "";
	struct blk_node *bs = NULL;
	int ret;

	if (!p)
		return -ENOMEM;
	/* Only the size is read: share everything, as qemu-img does. */
	ret = blk_open_target(p, o->backing_fmt, "read-only=on,force-share=on", &bs, sub,
			      sizeof(sub));
	free(p);
	if (ret)
		return cr_err(err, n, ret, "cannot open the backing file to get its size", sub);
	*size = blk_size(bs);
	blk_close(bs);
	return 0;
}

static int cr_plan(const struct qcow2_create_opts *o, uint64_t size, struct cr_layout *l)
{
	unsigned rb = o->refcount_bits ? o->refcount_bits : 16, order = (unsigned)__builtin_ctz(rb);
	uint64_t per_l1, fixed, used, nrb = 1, rct = 1, prev;

	l->cs = o->cluster_size ? o->cluster_size : 65536;
	l->cbits = (unsigned)__builtin_ctzll(l->cs);
	l->l2_bits = l->cbits - (o->extended_l2 ? 4 : 3);
	l->rb_bits = l->cbits + 3 - order;
	per_l1 = l->cs << l->l2_bits;
	l->l1_size = (size + per_l1 - 1) / per_l1;
	if (l->l1_size * 8 > QC_MAX_L1_BYTES)
		return -EFBIG;
	l->l1_clusters = l->l1_size ? qc_align_up(l->l1_size * 8, l->cs) >> l->cbits : 1;
	if (o->prealloc != QCOW2_PREALLOC_OFF) {
		l->ndata = (size + l->cs - 1) >> l->cbits;
		l->nl2 = l->l1_size;
		if (o->data_file)
			l->ndata = 0;
	}
	fixed = 1 + l->l1_clusters + l->nl2 + l->ndata;
	do {
		prev = nrb + rct;
		used = fixed + nrb + rct;
		nrb = (used + (1ull << l->rb_bits) - 1) >> l->rb_bits;
		rct = qc_align_up(nrb * 8, l->cs) >> l->cbits;
	} while (nrb + rct != prev);
	if (rct * l->cs > QC_MAX_RCT_BYTES)
		return -EFBIG;
	l->rct_clusters = rct;
	l->nrb = nrb;
	l->rct_at = 1;
	l->rb_at = 1 + rct;
	l->l1_at = l->rb_at + nrb;
	l->l2_at = l->l1_at + l->l1_clusters;
	l->data_at = l->l2_at + l->nl2;
	l->end = l->data_at + l->ndata;
	return 0;
}

static size_t cr_ext(uint8_t *p, uint32_t type, const void *data, uint32_t len)
{
	qc_wr32(p, type);
	qc_wr32(p + 4, len);
	memcpy(p + 8, data, len);
	return 8 + qc_align_up(len, 8);
}

/* Feature name table: lets other tools name what they do not know. */
static size_t cr_features(uint8_t *p)
{
	static const struct {
		uint8_t type, bit;
		const char *name;
	} f[] = {
		{0, 0, "dirty bit"},
		{0, 1, "corrupt bit"},
		{0, 2, "external data file"},
		{0, 3, "compression type"},
		{0, 4, "extended L2 entries"},
		{1, 0, "lazy refcounts"},
		{2, 0, "bitmaps"},
		{2, 1, "raw external data"},
	};
	uint8_t t[8 * 48];
	size_t i;

	memset(t, 0, sizeof(t));
	for (i = 0; i < 8; i++) {
		t[i * 48] = f[i].type;
		t[i * 48 + 1] = f[i].bit;
		memcpy(t + i * 48 + 2, f[i].name, strlen(f[i].name));
	}
	return cr_ext(p, QC_EXT_FEATURES, t, sizeof(t));
}

static int cr_header(const struct qcow2_create_opts *o, const struct cr_layout *l, uint64_t size,
		     uint8_t *h, char *err, size_t n)
{
	bool v3 = o->compat != 2;
	uint64_t incompat = 0, pos;
	size_t bl = o->backing_file ? strlen(o->backing_file) : 0;

	qc_wr32(h, QC_MAGIC);
	qc_wr32(h + 4, v3 ? 3 : 2);
	qc_wr32(h + 20, l->cbits);
	qc_wr64(h + 24, size);
	qc_wr32(h + 36, (uint32_t)l->l1_size);
	qc_wr64(h + 40, l->l1_at << l->cbits);
	qc_wr64(h + 48, l->rct_at << l->cbits);
	qc_wr32(h + 56, (uint32_t)l->rct_clusters);
	pos = v3 ? CR_HDR_LEN : 72;
	if (v3) {
		if (o->data_file)
			incompat |= QC_INCOMPAT_DATA_FILE;
		if (o->compression_type == QCOW2_COMPRESSION_ZSTD)
			incompat |= QC_INCOMPAT_COMPRESSION;
		if (o->extended_l2)
			incompat |= QC_INCOMPAT_EXTL2;
		qc_wr64(h + 72, incompat);
		qc_wr64(h + 80, o->lazy_refcounts ? QC_COMPAT_LAZY : 0);
		qc_wr64(h + 88, o->data_file_raw ? QC_AUTOCLEAR_DATA_RAW : 0);
		qc_wr32(h + 96, (uint32_t)__builtin_ctz(o->refcount_bits ? o->refcount_bits : 16));
		qc_wr32(h + 100, CR_HDR_LEN);
		h[104] = (uint8_t)o->compression_type;
	}
	if (o->backing_fmt && o->backing_file)
		pos += cr_ext(h + pos, QC_EXT_BACKING_FMT, o->backing_fmt,
			      (uint32_t)strlen(o->backing_fmt));
	if (o->data_file)
		pos += cr_ext(h + pos, QC_EXT_DATA_FILE, o->data_file,
			      (uint32_t)strlen(o->data_file));
	if (v3)
		pos += cr_features(h + pos);
	pos += 8; /* end of extensions */
	if (bl) {
		if (bl > QC_MAX_BACKING_NAME || pos + bl > l->cs)
			return cr_err(err, n, -EINVAL, "backing file name too long", NULL);
		qc_wr64(h + 8, pos);
		qc_wr32(h + 16, (uint32_t)bl);
		memcpy(h + pos, o->backing_file, bl);
	}
	return 0;
}

static int cr_pwrite(int fd, const void *buf, size_t len, uint64_t off)
{
	while (len) {
		ssize_t r = pwrite(fd, buf, len, (off_t)off);

		if (r < 0)
			return -errno;
		buf = (const char *)buf + r;
		len -= (size_t)r;
		off += (uint64_t)r;
	}
	return 0;
}

/* Refcount table, blocks, L1 and L2 tables, one cluster at a time. */
static int cr_tables(int fd, const struct qcow2_create_opts *o, const struct cr_layout *l,
		     uint8_t *c)
{
	uint64_t i, j, per_rb = 1ull << l->rb_bits, ents = 1ull << l->l2_bits, gc;
	struct qc_state rs = {
		.rc_order = (unsigned)__builtin_ctz(o->refcount_bits ? o->refcount_bits : 16)};
	int ret = 0;

	for (i = 0; i < l->rct_clusters && !ret; i++) {
		memset(c, 0, l->cs);
		for (j = 0; j < l->cs / 8 && i * (l->cs / 8) + j < l->nrb; j++)
			qc_wr64(c + j * 8, (l->rb_at + i * (l->cs / 8) + j) << l->cbits);
		ret = cr_pwrite(fd, c, l->cs, (l->rct_at + i) << l->cbits);
	}
	for (i = 0; i < l->nrb && !ret; i++) {
		memset(c, 0, l->cs);
		for (j = 0; j < per_rb && i * per_rb + j < l->end; j++)
			qc_rc_set_raw(&rs, c, j, 1);
		ret = cr_pwrite(fd, c, l->cs, (l->rb_at + i) << l->cbits);
	}
	for (i = 0; i < l->l1_clusters && !ret; i++) {
		memset(c, 0, l->cs);
		for (j = 0; l->nl2 && j < l->cs / 8 && i * (l->cs / 8) + j < l->l1_size; j++)
			qc_wr64(c + j * 8,
				((l->l2_at + i * (l->cs / 8) + j) << l->cbits) | QC_OFLAG_COPIED);
		ret = cr_pwrite(fd, c, l->cs, (l->l1_at + i) << l->cbits);
	}
	for (i = 0; i < l->nl2 && !ret; i++) {
		memset(c, 0, l->cs);
		for (j = 0; j < ents; j++) {
			gc = i * ents + j;
			if (gc << l->cbits >= o->size)
				break;
			qc_wr64(c + j * (o->extended_l2 ? 16 : 8),
				(o->data_file ? gc << l->cbits : (l->data_at + gc) << l->cbits) |
					QC_OFLAG_COPIED);
			if (o->extended_l2)
				qc_wr64(c + j * 16 + 8, 0xffffffffull);
		}
		ret = cr_pwrite(fd, c, l->cs, (l->l2_at + i) << l->cbits);
	}
	return ret;
}

static int cr_prealloc_data(int fd, enum qcow2_prealloc p, uint64_t off, uint64_t len)
{
	static const uint8_t zero[65536];
	int ret = 0;

	if (ftruncate(fd, (off_t)(off + len)) != 0)
		return -errno;
	if (p == QCOW2_PREALLOC_FALLOC && len && fallocate(fd, 0, (off_t)off, (off_t)len) != 0)
		return -errno;
	if (p != QCOW2_PREALLOC_FULL)
		return 0;
	while (len && !ret) {
		size_t k = len < sizeof(zero) ? (size_t)len : sizeof(zero);

		ret = cr_pwrite(fd, zero, k, off);
		off += k;
		len -= k;
	}
	return ret;
}

static int cr_data_file(const char *image, const struct qcow2_create_opts *o, char *err, size_t n)
{
	/* Like QEMU, a relative data file name is taken as it is (relative to
	 * the working directory), unlike a backing file name. */
	enum qcow2_prealloc p =
		o->prealloc == QCOW2_PREALLOC_OFF ? QCOW2_PREALLOC_METADATA : o->prealloc;
	char sub[384];
	int fd, ret;

	(void)image;
	fd = blk_file_create(o->data_file, BLK_CREATE_PERM, BLK_CREATE_SHARED, sub, sizeof(sub));
	if (fd < 0)
		return cr_err(err, n, fd, "cannot create data file", sub);
	ret = cr_prealloc_data(fd, p, 0, o->size);
	if (!ret && fsync(fd) != 0)
		ret = -errno;
	close(fd);
	return ret ? cr_err(err, n, ret, "cannot write data file", strerror(-ret)) : 0;
}

static int cr_write(int fd, const struct qcow2_create_opts *o, const struct cr_layout *l,
		    uint8_t *c, char *err, size_t n)
{
	int ret;

	memset(c, 0, l->cs);
	ret = cr_header(o, l, o->size, c, err, n);
	if (ret)
		return ret;
	ret = cr_pwrite(fd, c, l->cs, 0);
	if (!ret)
		ret = cr_tables(fd, o, l, c);
	if (!ret && l->ndata)
		ret = cr_prealloc_data(fd, o->prealloc, l->data_at << l->cbits,
				       l->ndata << l->cbits);
	if (!ret && fsync(fd) != 0)
		ret = -errno;
	return ret ? cr_err(err, n, ret, "cannot write the image", strerror(-ret)) : 0;
}

int qcow2_create(const char *path, const struct qcow2_create_opts *o, char *err, size_t errlen)
{
	struct qcow2_create_opts oo = *o;
	struct cr_layout l = {0};
	uint8_t *c = NULL;
	char sub[384];
	int fd, ret;

	ret = cr_check(o, err, errlen);
	if (!ret && !o->size && o->backing_file)
		ret = cr_backing_size(path, o, &oo.size, err, errlen);
	if (ret)
		return ret;
	o = &oo;
	ret = cr_plan(o, o->size, &l);
	if (ret)
		return cr_err(err, errlen, ret, "virtual size too large for this cluster size",
			      NULL);
	/* The image first: if it is in use, nothing is touched. Locked as QEMU
	 * creates it and then opens it to write the qcow2 structures. */
	fd = blk_file_create(path, BLK_CREATE_PERM | BLK_PERM_CONSISTENT_READ,
			     BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE_UNCHANGED, sub, sizeof(sub));
	if (fd < 0)
		return cr_err(err, errlen, fd, "cannot create", sub);
	if (o->data_file) {
		ret = cr_data_file(path, o, err, errlen);
		if (ret) {
			close(fd);
			return ret;
		}
	}
	if (!o->no_extent_hint)
		blk_file_extent_hint(fd, BLK_EXTENT_HINT_DEFAULT); /* best effort: XFS only */
	c = qc_alloc_buf(l.cs);
	ret = c ? cr_write(fd, o, &l, c, err, errlen) : -ENOMEM;
	free(c);
	close(fd);
	return ret;
}

/* ---- -o parsing ---- */

static int cr_bool(const char *v, bool *out, const char *key, char *err, size_t n)
{
	return parse_bool(v, out) ? cr_err(err, n, -EINVAL, "expected on or off for", key) : 0;
}

/* The options with a fixed set of values: -o preallocation=, compression_type=
 * and compat=. 0 or -EINVAL with a message. */
static int cr_opt_prealloc(struct qcow2_create_opts *o, const char *val, char *err, size_t n)
{
	static const char *const pre[] = {"off", "metadata", "falloc", "full"};
	unsigned i;

	for (i = 0; i < ARRAY_SIZE(pre); i++) {
		if (!strcmp(val, pre[i])) {
			o->prealloc = (enum qcow2_prealloc)i;
			return 0;
		}
	}
	return cr_err(err, n, -EINVAL, "preallocation must be off, metadata, falloc or full", NULL);
}

static int cr_opt_compression(struct qcow2_create_opts *o, const char *val, char *err, size_t n)
{
	if (strcmp(val, "zlib") && strcmp(val, "zstd"))
		return cr_err(err, n, -EINVAL, "compression_type must be zlib or zstd", NULL);
	o->compression_type =
		!strcmp(val, "zstd") ? QCOW2_COMPRESSION_ZSTD : QCOW2_COMPRESSION_ZLIB;
	return 0;
}

static int cr_opt_compat(struct qcow2_create_opts *o, const char *val, char *err, size_t n)
{
	if (!strcmp(val, "1.1") || !strcmp(val, "v3"))
		o->compat = 3;
	else if (!strcmp(val, "0.10") || !strcmp(val, "v2"))
		o->compat = 2;
	else
		return cr_err(err, n, -EINVAL, "compat must be 0.10 or 1.1", NULL);
	return 0;
}

/* Sizes: cluster_size=, refcount_bits=, size=. */
static int cr_opt_number(struct qcow2_create_opts *o, const char *key, const char *val, char *err,
			 size_t n)
{
	uint64_t v;

	if (parse_size(val, &v) || v > UINT32_MAX * (!strcmp(key, "size") ? 0xffffffffull : 1))
		return cr_err(err, n, -EINVAL, "bad number for", key);
	if (!strcmp(key, "size"))
		o->size = v;
	else if (!strcmp(key, "cluster_size"))
		o->cluster_size = (uint32_t)v;
	else
		o->refcount_bits = (uint32_t)v;
	return 0;
}

int qcow2_create_opt(struct qcow2_create_opts *o, const char *key, const char *val, char *err,
		     size_t n)
{
	if (!strcmp(key, "preallocation"))
		return cr_opt_prealloc(o, val, err, n);
	if (!strcmp(key, "compression_type"))
		return cr_opt_compression(o, val, err, n);
	if (!strcmp(key, "compat"))
		return cr_opt_compat(o, val, err, n);
	if (!strcmp(key, "cluster_size") || !strcmp(key, "refcount_bits") || !strcmp(key, "size"))
		return cr_opt_number(o, key, val, err, n);
	if (!strcmp(key, "extended_l2"))
		return cr_bool(val, &o->extended_l2, key, err, n);
	if (!strcmp(key, "lazy_refcounts"))
		return cr_bool(val, &o->lazy_refcounts, key, err, n);
	if (!strcmp(key, "data_file_raw"))
		return cr_bool(val, &o->data_file_raw, key, err, n);
	if (!strcmp(key, "backing_file"))
		o->backing_file = val;
	else if (!strcmp(key, "backing_fmt"))
		o->backing_fmt = val;
	else if (!strcmp(key, "data_file"))
		o->data_file = val;
	else
		return cr_err(err, n, -EINVAL, "unknown option", key);
	return 0;
}
