/* qcow2 header: parsing and validation of every field and header extension
 * (QEMU docs/interop/qcow2.txt, "Header" and "Header extensions"), and the
 * few in-place header updates the driver makes (feature bits, dirty bit).
 * The header cluster is never rewritten as a whole, so extensions we do not
 * know are preserved byte for byte.
 *
 * Threading: parsing runs at open (main thread, in a coroutine); updates run
 * with s->meta held. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"
#include "util/log.h"

#define HDR_V2_LEN 72
#define HDR_V3_LEN 104

static int hdr_err(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int hdr_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(err, errlen, "qcow2: ");

	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < errlen)
		vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

static void hdr_decode(struct qc_header *h, const uint8_t *p)
{
	memset(h, 0, sizeof(*h));
	h->version = qc_rd32(p + 4);
	h->backing_file_offset = qc_rd64(p + 8);
	h->backing_file_size = qc_rd32(p + 16);
	h->cluster_bits = qc_rd32(p + 20);
	h->size = qc_rd64(p + 24);
	h->crypt_method = qc_rd32(p + 32);
	h->l1_size = qc_rd32(p + 36);
	h->l1_table_offset = qc_rd64(p + 40);
	h->refcount_table_offset = qc_rd64(p + 48);
	h->refcount_table_clusters = qc_rd32(p + 56);
	h->nb_snapshots = qc_rd32(p + 60);
	h->snapshots_offset = qc_rd64(p + 64);
	if (h->version < 3) {
		h->refcount_order = 4;
		h->header_length = HDR_V2_LEN;
		return;
	}
	h->incompat = qc_rd64(p + 72);
	h->compat = qc_rd64(p + 80);
	h->autoclear = qc_rd64(p + 88);
	h->refcount_order = qc_rd32(p + 96);
	h->header_length = qc_rd32(p + 100);
}

/* Name of a feature bit from the image's feature name table, if any. */
static void hdr_feature_name(const uint8_t *tab, size_t len, unsigned type, unsigned bit, char *out,
			     size_t outlen)
{
	size_t i;

	snprintf(out, outlen, "bit %u", bit);
	for (i = 0; tab && i + 48 <= len; i += 48) {
		if (tab[i] == type && tab[i + 1] == bit) {
			snprintf(out, outlen, "%.46s", (const char *)tab + i + 2);
			return;
		}
	}
}

static int hdr_unknown_incompat(uint64_t bits, const uint8_t *tab, size_t tablen, char *err,
				size_t errlen)
{
	char names[256] = "", one[64];
	size_t n = 0;
	unsigned b;

	for (b = 0; b < 64; b++) {
		if (!(bits & (1ull << b)))
			continue;
		hdr_feature_name(tab, tablen, 0, b, one, sizeof(one));
		n += (size_t)snprintf(names + n, n < sizeof(names) ? sizeof(names) - n : 0, "%s%s",
				      n ? ", " : "", one);
		if (n >= sizeof(names))
			break;
	}
	return hdr_err(err, errlen, "unsupported incompatible feature(s): %s", names);
}

static char *hdr_string(const uint8_t *p, size_t len)
{
	char *s;

	if (memchr(p, 0, len))
		return NULL;
	s = malloc(len + 1);
	if (s) {
		memcpy(s, p, len);
		s[len] = 0;
	}
	return s;
}

struct hdr_exts {
	const uint8_t *features;
	size_t features_len;
	bool seen_fmt, seen_data, seen_bitmaps, seen_crypto;
};

static int hdr_ext_string(char **dst, bool *seen, const uint8_t *p, uint32_t len, const char *what,
			  char *err, size_t errlen)
{
	if (*seen)
		return hdr_err(err, errlen, "duplicate %s header extension", what);
	*seen = true;
	if (len == 0 || len > QC_MAX_BACKING_NAME)
		return hdr_err(err, errlen, "%s header extension has bad length %u", what, len);
	*dst = hdr_string(p, len);
	if (!*dst)
		return hdr_err(err, errlen, "%s header extension contains a NUL byte", what);
	return 0;
}

/* While the autoclear bit is set the directory is metadata: checked as QEMU
 * does, kept clear of guest data, its bitmaps loaded at open (bitmap.c) and
 * its tables and their clusters counted by the check. Without the bit the
 * extension is ignored, as in QEMU. */
static int hdr_ext_bitmaps(struct qc_state *s, struct hdr_exts *x, const uint8_t *p, uint32_t len,
			   char *err, size_t errlen)
{
	uint64_t size, off;

	if (x->seen_bitmaps || len != 24)
		return hdr_err(err, errlen, "bad bitmaps header extension (length %u)", len);
	x->seen_bitmaps = true;
	s->nb_bitmaps = qc_rd32(p);
	size = qc_rd64(p + 8);
	off = qc_rd64(p + 16);
	if (!(s->h.autoclear & QC_AUTOCLEAR_BITMAPS))
		return 0;
	if (s->nb_bitmaps == 0 || s->nb_bitmaps > QC_MAX_BITMAPS)
		return hdr_err(err, errlen, "bitmaps extension with %u bitmaps (1 to %u)",
			       s->nb_bitmaps, QC_MAX_BITMAPS);
	if (size == 0)
		return hdr_err(err, errlen, "bitmaps extension with an empty directory");
	/* Offset and size against the file in hdr_check_tables. */
	s->bmdir_offset = off;
	s->bmdir_bytes = size;
	return 0;
}

static int hdr_ext_one(struct qc_state *s, struct hdr_exts *x, uint32_t type, const uint8_t *p,
		       uint32_t len, char *err, size_t errlen)
{
	switch (type) {
	case QC_EXT_BACKING_FMT:
		return hdr_ext_string(&s->backing_fmt, &x->seen_fmt, p, len, "backing format", err,
				      errlen);
	case QC_EXT_DATA_FILE:
		return hdr_ext_string(&s->data_name, &x->seen_data, p, len, "data file name", err,
				      errlen);
	case QC_EXT_FEATURES:
		x->features = p;
		x->features_len = len;
		return 0;
	case QC_EXT_BITMAPS:
		return hdr_ext_bitmaps(s, x, p, len, err, errlen);
	case QC_EXT_CRYPTO:
		x->seen_crypto = true;
		return hdr_err(err, errlen, "encrypted images are not supported");
	default:
		return 0; /* unknown: ignored, and preserved since we never rewrite it */
	}
}

/* Extensions live between the header and the backing file name (or the end
 * of the first cluster). */
static int hdr_exts_parse(struct qc_state *s, const uint8_t *buf, struct hdr_exts *x, char *err,
			  size_t errlen)
{
	uint64_t pos = s->h.header_length, end = s->cluster_size;
	int ret;

	if (s->h.backing_file_offset && s->h.backing_file_offset < end)
		end = s->h.backing_file_offset;
	while (pos + 8 <= end) {
		uint32_t type = qc_rd32(buf + pos), len = qc_rd32(buf + pos + 4);

		if (type == QC_EXT_END)
			return 0;
		if (len > end - pos - 8)
			return hdr_err(err, errlen,
				       "header extension 0x%08x (length %u) "
				       "runs past the header area",
				       type, len);
		ret = hdr_ext_one(s, x, type, buf + pos + 8, len, err, errlen);
		if (ret)
			return ret;
		pos = qc_align_up(pos + 8 + len, 8);
	}
	return 0;
}

static int hdr_check_basic(const struct qc_header *h, size_t buflen, char *err, size_t errlen)
{
	if (h->version != 2 && h->version != 3)
		return hdr_err(err, errlen, "unsupported version %u", h->version);
	if (h->cluster_bits < QC_MIN_CLUSTER_BITS || h->cluster_bits > QC_MAX_CLUSTER_BITS)
		return hdr_err(err, errlen, "unsupported cluster size 2^%u (512 B to 2 MiB)",
			       h->cluster_bits);
	if (h->version == 3 &&
	    (h->header_length < HDR_V3_LEN || h->header_length % 8 ||
	     h->header_length > (1u << h->cluster_bits) || h->header_length > buflen))
		return hdr_err(err, errlen, "invalid header length %u", h->header_length);
	if (h->crypt_method)
		return hdr_err(err, errlen, "encrypted images are not supported (crypt_method %u)",
			       h->crypt_method);
	if (h->refcount_order > 6)
		return hdr_err(err, errlen, "invalid refcount order %u (at most 6)",
			       h->refcount_order);
	if (h->size > (uint64_t)INT64_MAX)
		return hdr_err(err, errlen, "virtual size %llu too large",
			       (unsigned long long)h->size);
	return 0;
}

static int hdr_check_features(struct qc_state *s, const uint8_t *buf, const struct hdr_exts *x,
			      char *err, size_t errlen)
{
	struct qc_header *h = &s->h;

	if (h->incompat & ~QC_INCOMPAT_KNOWN)
		return hdr_unknown_incompat(h->incompat & ~QC_INCOMPAT_KNOWN, x->features,
					    x->features_len, err, errlen);
	if (h->header_length > HDR_V3_LEN)
		h->compression_type = buf[HDR_V3_LEN];
	if (h->incompat & QC_INCOMPAT_COMPRESSION) {
		if (h->compression_type == 0)
			return hdr_err(err, errlen,
				       "compression type bit set but the "
				       "compression_type field is zlib or absent");
	} else if (h->compression_type != 0) {
		return hdr_err(err, errlen,
			       "compression_type %u without the compression type "
			       "bit",
			       h->compression_type);
	}
	if (h->compression_type > QCOW2_COMPRESSION_ZSTD)
		return hdr_err(err, errlen, "unknown compression type %u", h->compression_type);
	if ((h->incompat & QC_INCOMPAT_EXTL2) && h->cluster_bits < 14)
		return hdr_err(err, errlen, "extended L2 entries need clusters of at least 16 KiB");
	if ((h->autoclear & QC_AUTOCLEAR_DATA_RAW) && !(h->incompat & QC_INCOMPAT_DATA_FILE))
		return hdr_err(err, errlen, "raw external data bit set without a data file");
	if ((h->incompat & QC_INCOMPAT_DATA_FILE) && h->backing_file_offset &&
	    (h->autoclear & QC_AUTOCLEAR_DATA_RAW))
		return hdr_err(err, errlen, "a raw external data file cannot have a backing file");
	if ((h->autoclear & QC_AUTOCLEAR_BITMAPS) && !x->seen_bitmaps)
		return hdr_err(err, errlen, "bitmaps bit set without the bitmaps extension");
	return 0;
}

static int hdr_check_table(uint64_t off, uint64_t bytes, uint64_t max, uint64_t csize,
			   uint64_t file_size, const char *what, char *err, size_t errlen)
{
	if (bytes > max)
		return hdr_err(err, errlen, "%s too large (%llu bytes, at most %llu)", what,
			       (unsigned long long)bytes, (unsigned long long)max);
	if (bytes == 0)
		return 0;
	if (off & (csize - 1))
		return hdr_err(err, errlen, "%s offset 0x%llx is not cluster aligned", what,
			       (unsigned long long)off);
	if (off == 0 || off > (1ull << 56) || off + bytes > qc_align_up(file_size, csize))
		return hdr_err(err, errlen,
			       "%s at 0x%llx (%llu bytes) is outside the file "
			       "(%llu bytes)",
			       what, (unsigned long long)off, (unsigned long long)bytes,
			       (unsigned long long)file_size);
	return 0;
}

static int hdr_check_tables(struct qc_state *s, uint64_t file_size, char *err, size_t errlen)
{
	const struct qc_header *h = &s->h;
	uint64_t cs = s->cluster_size, per_l1 = cs << s->l2_bits, need;
	uint64_t l1b = (uint64_t)h->l1_size * 8, rcb = (uint64_t)h->refcount_table_clusters * cs;
	int ret;

	need = h->size / per_l1 + (h->size % per_l1 != 0);
	if (h->l1_size < need)
		return hdr_err(err, errlen,
			       "L1 table too small (%u entries) for a virtual size of "
			       "%llu bytes",
			       h->l1_size, (unsigned long long)h->size);
	ret = hdr_check_table(h->l1_table_offset, l1b, QC_MAX_L1_BYTES, cs, file_size, "L1 table",
			      err, errlen);
	if (!ret && rcb == 0)
		ret = hdr_err(err, errlen, "refcount table is empty");
	if (!ret)
		ret = hdr_check_table(h->refcount_table_offset, rcb, QC_MAX_RCT_BYTES, cs,
				      file_size, "refcount table", err, errlen);
	if (!ret && h->nb_snapshots > QC_MAX_SNAPSHOTS)
		ret = hdr_err(err, errlen, "too many snapshots (%u)", h->nb_snapshots);
	if (!ret && h->nb_snapshots)
		ret = hdr_check_table(h->snapshots_offset, 40, 40, cs, file_size, "snapshot table",
				      err, errlen);
	if (!ret && s->bmdir_bytes)
		ret = hdr_check_table(s->bmdir_offset, s->bmdir_bytes, QC_MAX_BITMAP_DIR_BYTES, cs,
				      file_size, "bitmap directory", err, errlen);
	if (ret)
		return ret;
	if (qc_ranges_overlap(0, cs, h->l1_table_offset, l1b) ||
	    qc_ranges_overlap(0, cs, h->refcount_table_offset, rcb) ||
	    qc_ranges_overlap(h->l1_table_offset, l1b, h->refcount_table_offset, rcb))
		return hdr_err(err, errlen, "header, L1 table and refcount table overlap");
	return 0;
}

static int hdr_check_backing(struct qc_state *s, const uint8_t *buf, char *err, size_t errlen)
{
	const struct qc_header *h = &s->h;

	if (!h->backing_file_offset)
		return 0;
	if (h->backing_file_size == 0 || h->backing_file_size > QC_MAX_BACKING_NAME)
		return hdr_err(err, errlen, "backing file name length %u is invalid",
			       h->backing_file_size);
	/* Compared without adding: the offset is any 64-bit value. */
	if (h->backing_file_offset < h->header_length || h->backing_file_offset > s->cluster_size ||
	    h->backing_file_size > s->cluster_size - h->backing_file_offset)
		return hdr_err(err, errlen,
			       "backing file name at 0x%llx is outside the header "
			       "cluster",
			       (unsigned long long)h->backing_file_offset);
	s->backing_name = hdr_string(buf + h->backing_file_offset, h->backing_file_size);
	if (!s->backing_name)
		return hdr_err(err, errlen, "backing file name contains a NUL byte");
	return 0;
}

static void hdr_geometry(struct qc_state *s)
{
	const struct qc_header *h = &s->h;

	s->cluster_bits = h->cluster_bits;
	s->cluster_size = 1ull << h->cluster_bits;
	s->ext_l2 = (h->incompat & QC_INCOMPAT_EXTL2) != 0;
	s->l2_entry_bytes = s->ext_l2 ? 16 : 8;
	s->l2_bits = h->cluster_bits - (s->ext_l2 ? 4 : 3);
	s->sc_bits = s->ext_l2 ? h->cluster_bits - 5 : h->cluster_bits;
	s->rc_order = h->refcount_order;
	s->rb_bits = h->cluster_bits + 3 - h->refcount_order;
	s->rc_max = h->refcount_order == 6 ? UINT64_MAX : (1ull << (1u << h->refcount_order)) - 1;
	s->comp_type = h->compression_type;
	s->lazy = (h->compat & QC_COMPAT_LAZY) != 0;
	s->corrupt = (h->incompat & QC_INCOMPAT_CORRUPT) != 0;
	s->data_raw = (h->autoclear & QC_AUTOCLEAR_DATA_RAW) != 0;
	s->l1_size = h->l1_size;
	s->l1_offset = h->l1_table_offset;
	s->rct_offset = h->refcount_table_offset;
	s->rct_size = ((uint64_t)h->refcount_table_clusters << h->cluster_bits) / 8;
	s->open_incompat = h->incompat;
}

int qc_header_parse(struct qc_state *s, const uint8_t *buf, size_t len, uint64_t file_size,
		    char *err, size_t errlen)
{
	struct hdr_exts x = {0};
	int ret;

	if (len < HDR_V2_LEN || qc_rd32(buf) != QC_MAGIC)
		return hdr_err(err, errlen, "not a qcow2 image (bad magic)");
	hdr_decode(&s->h, buf);
	ret = hdr_check_basic(&s->h, len, err, errlen);
	if (ret)
		return ret;
	if (s->h.version == 3 && len < HDR_V3_LEN)
		return hdr_err(err, errlen, "truncated header");
	if (len < (1ull << s->h.cluster_bits))
		return hdr_err(err, errlen, "header cluster truncated");
	hdr_geometry(s);
	ret = hdr_exts_parse(s, buf, &x, err, errlen);
	if (!ret)
		ret = hdr_check_features(s, buf, &x, err, errlen);
	if (!ret) {
		hdr_geometry(s); /* compression type is known now */
		ret = hdr_check_tables(s, file_size, err, errlen);
	}
	if (!ret)
		ret = hdr_check_backing(s, buf, err, errlen);
	if (!ret && (s->h.incompat & QC_INCOMPAT_DATA_FILE) && s->h.nb_snapshots)
		ret = hdr_err(err, errlen, "internal snapshots with an external data file");
	return ret;
}

/* Read the first cluster (a short file is padded with zeroes) and parse it. */
int qc_header_read(struct qc_state *s, char *err, size_t errlen)
{
	uint64_t fsize = s->file->size, cs;
	uint8_t *buf;
	int ret;

	buf = qc_alloc_buf(4096);
	if (!buf)
		return -ENOMEM;
	memset(buf, 0, 4096);
	ret = qc_co_pread_clamped(s->file, 0, buf, 4096);
	if (ret < 0 || fsize < HDR_V2_LEN || qc_rd32(buf) != QC_MAGIC) {
		free(buf);
		if (ret < 0)
			return hdr_err(err, errlen, "cannot read the header: %s", strerror(-ret));
		return hdr_err(err, errlen, "not a qcow2 image (bad magic)");
	}
	cs = qc_rd32(buf + 20) <= QC_MAX_CLUSTER_BITS && qc_rd32(buf + 20) >= QC_MIN_CLUSTER_BITS
		     ? 1ull << qc_rd32(buf + 20)
		     : 4096;
	if (cs > 4096) {
		free(buf);
		buf = qc_alloc_buf(cs);
		if (!buf)
			return -ENOMEM;
		memset(buf, 0, cs);
		ret = qc_co_pread_clamped(s->file, 0, buf, cs);
		if (ret < 0) {
			free(buf);
			return hdr_err(err, errlen, "cannot read the header: %s", strerror(-ret));
		}
	}
	ret = qc_header_parse(s, buf, cs, fsize, err, errlen);
	if (ret) {
		free(buf);
		return ret;
	}
	s->hdr_cluster = buf;
	return 0;
}

void qc_header_free(struct qc_state *s)
{
	free(s->hdr_cluster);
	free(s->backing_name);
	free(s->backing_fmt);
	free(s->data_name);
	s->hdr_cluster = NULL;
	s->backing_name = s->backing_fmt = s->data_name = NULL;
}

/* ---- updates ---- */

int qc_header_write_field(struct qc_state *s, unsigned off, const void *val, unsigned len)
{
	int ret = qc_file_whole(s);

	if (!ret)
		ret = qc_co_pwrite(s->file, off, val, len);
	if (ret == 0 && s->hdr_cluster)
		memcpy(s->hdr_cluster + off, val, len);
	return ret;
}

/* Write incompatible and autoclear features (bytes 72-95 minus compat) and
 * make them durable. */
int qc_header_write_features(struct qc_state *s, uint64_t incompat, uint64_t autoclear)
{
	uint8_t b[8];
	int ret;

	if (s->h.version < 3)
		return 0;
	qc_wr64(b, incompat);
	ret = qc_header_write_field(s, 72, b, 8);
	if (!ret && autoclear != s->h.autoclear) {
		qc_wr64(b, autoclear);
		ret = qc_header_write_field(s, 88, b, 8);
	}
	if (!ret)
		ret = qc_co_flush(s->file);
	if (!ret) {
		s->h.incompat = incompat;
		s->h.autoclear = autoclear;
	}
	return ret;
}

/* Lazy refcounts: the dirty bit is on disk before any metadata that relies
 * on it. */
int qc_header_mark_dirty(struct qc_state *s)
{
	int ret;

	if (s->hdr_dirty_set || s->h.version < 3)
		return 0;
	ret = qc_header_write_features(s, s->h.incompat | QC_INCOMPAT_DIRTY, s->h.autoclear);
	if (!ret)
		s->hdr_dirty_set = true;
	return ret;
}

int qc_header_mark_clean(struct qc_state *s)
{
	int ret;

	if (!(s->h.incompat & QC_INCOMPAT_DIRTY))
		return 0;
	ret = qc_header_write_features(s, s->h.incompat & ~QC_INCOMPAT_DIRTY, s->h.autoclear);
	if (!ret)
		s->hdr_dirty_set = false;
	return ret;
}

/* The extension area [header_length, end) without the bitmaps extension,
 * then (count > 0) a new one: into out (end - header_length bytes, zeroed).
 * -ENOSPC if it does not fit. */
static int hdr_exts_rebuild(const struct qc_state *s, uint8_t *out, uint64_t end, unsigned count,
			    uint64_t len, uint64_t off)
{
	const uint8_t *buf = s->hdr_cluster;
	uint64_t pos = s->h.header_length, o = 0, room = end - pos;

	if (count) {
		if (room < 8 + 24 + 8)
			return -ENOSPC;
		qc_wr32(out, QC_EXT_BITMAPS);
		qc_wr32(out + 4, 24);
		qc_wr32(out + 8, count);
		qc_wr64(out + 16, len);
		qc_wr64(out + 24, off);
		o = 32;
	}
	while (pos + 8 <= end) {
		uint32_t type = qc_rd32(buf + pos), elen = qc_rd32(buf + pos + 4);
		uint64_t step = qc_align_up(8 + (uint64_t)elen, 8);

		if (type == QC_EXT_END || elen > end - pos - 8)
			break;
		if (type != QC_EXT_BITMAPS) {
			if (o + step + 8 > room)
				return -ENOSPC;
			memcpy(out + o, buf + pos, 8 + elen);
			o += step;
		}
		pos += step;
	}
	return 0; /* the end marker: zeroes */
}

/* The bitmaps extension now says count bitmaps in a directory of len bytes
 * at off (count 0: no extension), and the autoclear bit says whether it is
 * valid: the bit is set only once the extension is on disk, and cleared
 * before it goes. Durable. */
int qc_header_set_bitmaps(struct qc_state *s, unsigned count, uint64_t len, uint64_t off)
{
	uint64_t end = s->cluster_size, ac = s->h.autoclear;
	uint8_t *area;
	int ret = 0;

	if (s->h.backing_file_offset && s->h.backing_file_offset < end)
		end = s->h.backing_file_offset;
	area = calloc(1, end - s->h.header_length);
	if (!area)
		return -ENOMEM;
	if (!count && (ac & QC_AUTOCLEAR_BITMAPS))
		ret = qc_header_write_features(s, s->h.incompat, ac & ~QC_AUTOCLEAR_BITMAPS);
	if (!ret)
		ret = hdr_exts_rebuild(s, area, end, count, len, off);
	if (!ret)
		ret = qc_header_write_field(s, s->h.header_length, area, end - s->h.header_length);
	if (!ret)
		ret = qc_co_flush(s->file);
	if (!ret && count)
		ret = qc_header_write_features(s, s->h.incompat,
					       s->h.autoclear | QC_AUTOCLEAR_BITMAPS);
	free(area);
	return ret;
}

/* The extension area of a header that names the backing file `name` in
 * format `fmt` (both NULL: no backing file), into out (cs bytes, zeroed):
 * every extension but the backing format one, then that one, the end
 * marker and the name. The new backing_file_offset in *name_off. */
static int hdr_backing_area(const struct qc_state *s, uint8_t *out, uint64_t cs, const char *name,
			    const char *fmt, uint64_t *name_off)
{
	const uint8_t *buf = s->hdr_cluster;
	uint64_t end = s->h.backing_file_offset ? s->h.backing_file_offset : cs;
	uint64_t pos = s->h.header_length, o = pos, flen = fmt ? strlen(fmt) : 0;
	uint64_t nlen = name ? strlen(name) : 0;

	memcpy(out, buf, pos);
	while (pos + 8 <= end) {
		uint32_t type = qc_rd32(buf + pos), elen = qc_rd32(buf + pos + 4);
		uint64_t step = qc_align_up(8 + (uint64_t)elen, 8);

		if (type == QC_EXT_END || elen > end - pos - 8)
			break;
		if (type != QC_EXT_BACKING_FMT) {
			if (o + step > cs)
				return -ENOSPC;
			memcpy(out + o, buf + pos, 8 + elen);
			o += step;
		}
		pos += step;
	}
	if (fmt) {
		if (o + qc_align_up(8 + flen, 8) > cs)
			return -ENOSPC;
		qc_wr32(out + o, QC_EXT_BACKING_FMT);
		qc_wr32(out + o + 4, (uint32_t)flen);
		memcpy(out + o + 8, fmt, flen);
		o += qc_align_up(8 + flen, 8);
	}
	o += 8;                           /* the end marker: zeroes */
	if (o + nlen > cs || nlen > 1023) /* QEMU's limit for a backing file name */
		return -ENOSPC;
	memcpy(out + o, name ? name : "", nlen);
	*name_off = name ? o : 0;
	return 0;
}

int qc_header_set_backing(struct qc_state *s, const char *name, const char *fmt)
{
	uint64_t cs = s->cluster_size, off = 0;
	uint8_t *area = calloc(1, cs);
	char *nn = name ? strdup(name) : NULL, *nf = fmt ? strdup(fmt) : NULL;
	int ret = !area || (name && !nn) || (fmt && !nf) ? -ENOMEM : 0;

	if (!ret)
		ret = hdr_backing_area(s, area, cs, name, fmt, &off);
	if (!ret) {
		qc_wr64(area + 8, off);
		qc_wr32(area + 16, name ? (uint32_t)strlen(name) : 0);
		/* One write of the whole header cluster, as QEMU updates it. */
		ret = qc_header_write_field(s, 0, area, (unsigned)cs);
	}
	if (!ret)
		ret = qc_co_flush(s->file);
	if (!ret) {
		s->h.backing_file_offset = off;
		s->h.backing_file_size = name ? (uint32_t)strlen(name) : 0;
		free(s->backing_name);
		free(s->backing_fmt);
		s->backing_name = nn;
		s->backing_fmt = nf;
		nn = nf = NULL;
	}
	free(nn);
	free(nf);
	free(area);
	return ret;
}

/* ---- tool API: info ---- */

static char *hdr_dup(const char *s)
{
	return s ? strdup(s) : NULL;
}

static int hdr_info_snaps(const struct qc_state *s, struct qcow2_info *info)
{
	uint32_t i;

	if (!s->nsnaps)
		return 0;
	info->snapshots = calloc(s->nsnaps, sizeof(*info->snapshots));
	if (!info->snapshots)
		return -ENOMEM;
	info->nb_snapshots = s->nsnaps;
	for (i = 0; i < s->nsnaps; i++) {
		struct qcow2_snapshot_info *d = &info->snapshots[i];
		const struct qc_snapshot *sn = &s->snaps[i];

		d->id = hdr_dup(sn->id);
		d->name = hdr_dup(sn->name);
		d->vm_state_size = sn->vm_state_size;
		d->disk_size = sn->disk_size;
		d->date_sec = sn->date_sec;
		d->date_nsec = sn->date_nsec;
		d->vm_clock_nsec = sn->vm_clock_nsec;
		d->icount = sn->icount;
		if (!d->id || !d->name)
			return -ENOMEM;
	}
	return 0;
}

int qcow2_get_info(struct blk_node *bs, struct qcow2_info *info)
{
	const struct qc_state *s;
	int ret;

	memset(info, 0, sizeof(*info));
	if (!qcow2_is(bs))
		return -EINVAL;
	s = bs->opaque;
	info->virtual_size = s->h.size;
	info->cluster_size = s->cluster_size;
	info->version = (int)s->h.version;
	info->refcount_bits = 1u << s->rc_order;
	info->extended_l2 = s->ext_l2;
	info->lazy_refcounts = s->lazy;
	info->corrupt = s->corrupt;
	info->dirty = (s->open_incompat & QC_INCOMPAT_DIRTY) != 0;
	info->compression_type = (enum qcow2_compression)s->comp_type;
	info->data_file_raw = s->data_raw;
	info->incompatible_features = s->h.incompat;
	info->compatible_features = s->h.compat;
	info->autoclear_features = s->h.autoclear;
	info->nb_bitmaps = s->nb_bitmaps;
	info->data_file = hdr_dup(s->data_name);
	info->backing_file = hdr_dup(s->backing_name);
	info->backing_format = hdr_dup(s->backing_fmt);
	ret = hdr_info_snaps(s, info);
	if (ret)
		qcow2_info_free(info);
	return ret;
}

/* ---- the bitmap directory (read: open, img info and check) ---- */

#define BM_ENTRY_LEN 24
#define BM_MAX_TABLE_SIZE 0x8000000u
#define BM_MAX_PHYS_BYTES 0x20000000u
#define BM_MIN_GRAN_BITS 9
#define BM_MAX_GRAN_BITS 31
#define BM_MAX_NAME 1023

/* One directory entry at p (len bytes left), checked as QEMU loads it. */
static int hdr_bitmap_one(const struct qc_state *s, const uint8_t *p, uint64_t len,
			  struct qcow2_bitmap_info *b, uint64_t *entry_len, char *err,
			  size_t errlen)
{
	uint32_t extra, tsize, flags;
	uint16_t nlen;
	uint8_t type, gbits;
	uint64_t phys;

	if (len < BM_ENTRY_LEN)
		return hdr_err(err, errlen, "broken bitmap directory");
	b->table_offset = qc_rd64(p);
	b->table_size = tsize = qc_rd32(p + 8);
	b->flags = flags = qc_rd32(p + 12);
	type = p[16];
	gbits = p[17];
	nlen = qc_rd16(p + 18);
	extra = qc_rd32(p + 20);
	*entry_len = qc_align_up((uint64_t)BM_ENTRY_LEN + extra + nlen, 8);
	if (*entry_len > len)
		return hdr_err(err, errlen, "broken bitmap directory");
	if (extra)
		return hdr_err(err, errlen, "bitmap extra data is not supported");
	phys = (uint64_t)tsize * s->cluster_size;
	if (!tsize || !b->table_offset || b->table_offset % s->cluster_size ||
	    tsize > BM_MAX_TABLE_SIZE || gbits < BM_MIN_GRAN_BITS || gbits > BM_MAX_GRAN_BITS ||
	    (flags & ~(QCOW2_BITMAP_IN_USE | QCOW2_BITMAP_AUTO)) || nlen > BM_MAX_NAME ||
	    type != 1 || phys > BM_MAX_PHYS_BYTES ||
	    (!(flags & QCOW2_BITMAP_IN_USE) && s->h.size > ((phys * 8) << gbits)))
		return hdr_err(err, errlen, "bitmap '%.*s' does not satisfy the constraints",
			       (int)nlen, (const char *)p + BM_ENTRY_LEN);
	b->granularity = 1u << gbits;
	b->name = strndup((const char *)p + BM_ENTRY_LEN, nlen);
	return b->name ? 0 : -ENOMEM;
}

int qc_bitmaps_read(struct qc_state *s, struct qcow2_bitmap_info **out, unsigned *n, char *err,
		    size_t errlen)
{
	uint64_t pos = 0, elen = 0;
	uint8_t *dir;
	int ret = 0;

	*out = NULL;
	*n = 0;
	if (!s->bmdir_bytes) /* none, or ignored: the autoclear bit is clear */
		return 0;
	dir = malloc(s->bmdir_bytes);
	*out = calloc(s->nb_bitmaps, sizeof(**out));
	if (!dir || !*out)
		ret = -ENOMEM;
	if (!ret)
		ret = qc_co_pread_clamped(s->file, s->bmdir_offset, dir, s->bmdir_bytes);
	while (!ret && pos < s->bmdir_bytes) {
		if (*n == s->nb_bitmaps) {
			ret = hdr_err(err, errlen, "more bitmaps found than the header says");
			break;
		}
		ret = hdr_bitmap_one(s, dir + pos, s->bmdir_bytes - pos, &(*out)[*n], &elen, err,
				     errlen);
		(*n) += !ret;
		pos += elen;
	}
	if (!ret && *n != s->nb_bitmaps)
		ret = hdr_err(err, errlen, "fewer bitmaps found than the header says");
	free(dir);
	if (ret) {
		qcow2_bitmaps_free(*out, *n);
		*out = NULL;
		*n = 0;
	}
	return ret;
}

struct hdr_bm_ctx {
	struct qc_state *s;
	struct qcow2_bitmap_info **out;
	unsigned *n;
	char *err;
	size_t errlen;
};

static int hdr_bitmaps_co(void *arg)
{
	struct hdr_bm_ctx *c = arg;

	return qc_bitmaps_read(c->s, c->out, c->n, c->err, c->errlen);
}

int qcow2_get_bitmaps(struct blk_node *bs, struct qcow2_bitmap_info **out, unsigned *n, char *err,
		      size_t errlen)
{
	struct hdr_bm_ctx c = {qcow2_is(bs) ? bs->opaque : NULL, out, n, err, errlen};

	*out = NULL;
	*n = 0;
	err[0] = 0;
	return c.s ? qc_run_sync(hdr_bitmaps_co, &c) : -EINVAL;
}

void qcow2_bitmaps_free(struct qcow2_bitmap_info *b, unsigned n)
{
	for (unsigned i = 0; b && i < n; i++)
		free(b[i].name);
	free(b);
}

void qcow2_info_free(struct qcow2_info *info)
{
	unsigned i;

	for (i = 0; i < info->nb_snapshots; i++) {
		free(info->snapshots[i].id);
		free(info->snapshots[i].name);
	}
	free(info->snapshots);
	free(info->data_file);
	free(info->backing_file);
	free(info->backing_format);
	memset(info, 0, sizeof(*info));
}
