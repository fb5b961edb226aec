/* qcow2 persistent dirty bitmaps (the bitmaps extension, QEMU's
 * docs/interop/qcow2.txt): loaded into the node's dirty bitmaps at open,
 * marked in use on disk while the image is open read-write, written back
 * (new tables and directory, the old ones freed) at close.
 *
 * Threading: open and close, in a coroutine of the opening/closing thread,
 * meta held for the writes; nothing here runs while requests are served. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/dirty-bitmap.h"
#include "block/qcow2/qcow2-int.h"
#include "util/log.h"

#define BM_ENTRY_LEN 24
#define BM_MAX_TABLE_SIZE 0x8000000ull
#define BM_MAX_PHYS_BYTES 0x20000000ull
#define BME_RESERVED 0xff000000000001feull
#define BME_ALL_ONES 1ull

/* Bytes of the bit array of bm (whole words) and clusters it takes. */
static uint64_t bm_bytes(const struct blk_dirty_bitmap *bm)
{
	return bm->nwords * 8;
}

static uint64_t bm_clusters(const struct qc_state *s, const struct blk_dirty_bitmap *bm)
{
	return ((bm->nbits + 7) / 8 + s->cluster_size - 1) >> s->cluster_bits;
}

/* Is a table entry usable (QEMU's check_table_entry)? */
static bool bm_entry_ok(const struct qc_state *s, uint64_t e)
{
	uint64_t off = e & QC_OFFSET_MASK;

	if (e & BME_RESERVED)
		return false;
	if (!off)
		return true;
	return !(e & BME_ALL_ONES) && !(off & (s->cluster_size - 1)) &&
	       off + s->cluster_size <= qc_align_up(s->file->size, s->cluster_size);
}

/* The bitmap table of b: n = table_size entries, host endian. */
static int bm_read_table(struct qc_state *s, uint64_t toff, uint32_t tsize, uint64_t **out)
{
	uint64_t bytes = (uint64_t)tsize * 8, *t;
	int ret;

	*out = NULL;
	if (toff + bytes > qc_align_up(s->file->size, s->cluster_size))
		return -EINVAL;
	t = qc_alloc_buf(qc_align_up(bytes, 4096));
	if (!t)
		return -ENOMEM;
	ret = qc_co_pread_clamped(s->file, toff, t, qc_align_up(bytes, 512));
	for (uint32_t i = 0; !ret && i < tsize; i++) {
		t[i] = be64toh(t[i]);
		if (!bm_entry_ok(s, t[i]))
			ret = -EINVAL;
	}
	if (ret)
		free(t);
	else
		*out = t;
	return ret;
}

/* Fill bm's words from its table: bit k of the image's bitmap is bit k%8 of
 * byte k/8, which is bit k%64 of word k/64 read little endian. */
static int bm_load_data(struct qc_state *s, struct blk_dirty_bitmap *bm, const uint64_t *t,
			uint32_t tsize, uint8_t *buf)
{
	uint8_t *w = (uint8_t *)bm->words;
	uint64_t n = bm_clusters(s, bm), total = bm_bytes(bm);
	int ret = 0;

	for (uint64_t i = 0; i < n && i < tsize && !ret; i++) {
		uint64_t pos = i << s->cluster_bits, len = total - pos;
		uint64_t off = t[i] & QC_OFFSET_MASK;

		len = len < s->cluster_size ? len : s->cluster_size;
		if (off) {
			ret = qc_co_pread_clamped(s->file, off, buf, s->cluster_size);
			memcpy(w + pos, buf, len);
		} else if (t[i] & BME_ALL_ONES) {
			memset(w + pos, 0xff, len);
		}
	}
	for (uint64_t i = 0; i < bm->nwords; i++)
		bm->words[i] = le64toh(bm->words[i]);
	if (bm->nbits % 64) /* bits past the end are never set */
		bm->words[bm->nwords - 1] &= (1ull << (bm->nbits % 64)) - 1;
	return ret;
}

static int bm_load_one(struct qc_state *s, const struct qcow2_bitmap_info *b, uint8_t *buf,
		       struct blk_dirty_bitmap **out)
{
	struct blk_dirty_bitmap *bm = blk_dirty_bitmap_new(b->name, s->h.size, b->granularity);
	uint64_t *t = NULL;
	int ret = 0;

	if (!bm)
		return -ENOMEM;
	bm->persistent = true;
	bm->readonly = s->read_only;
	bm->disk_table_offset = b->table_offset;
	bm->disk_table_size = b->table_size;
	bm->disk_flags = b->flags;
	bm->inconsistent = (b->flags & QCOW2_BITMAP_IN_USE) != 0;
	blk_dirty_bitmap_enable(bm, (b->flags & QCOW2_BITMAP_AUTO) && !bm->inconsistent);
	if (!bm->inconsistent) {
		ret = bm_read_table(s, b->table_offset, b->table_size, &t);
		if (!ret)
			ret = bm_load_data(s, bm, t, b->table_size, buf);
		free(t);
	}
	if (ret)
		blk_dirty_bitmap_free(bm);
	else
		*out = bm;
	return ret;
}

/* Rewrite the directory where it is with every flag as in bs's bitmaps
 * plus IN_USE (QEMU's marking at a read-write open); durable. */
static int bm_mark_in_use(struct qc_state *s, const struct qcow2_bitmap_info *b, unsigned n)
{
	uint8_t *dir = qc_alloc_buf(qc_align_up(s->bmdir_bytes, 4096));
	uint64_t pos = 0;
	int ret;

	if (!dir)
		return -ENOMEM;
	ret = qc_co_pread_clamped(s->file, s->bmdir_offset, dir, s->bmdir_bytes);
	for (unsigned i = 0; !ret && i < n; i++) {
		qc_wr32(dir + pos + 12, b[i].flags | QCOW2_BITMAP_IN_USE);
		pos += qc_align_up(BM_ENTRY_LEN + qc_rd16(dir + pos + 18), 8);
	}
	if (!ret)
		ret = qc_co_pwrite(s->file, s->bmdir_offset, dir, s->bmdir_bytes);
	if (!ret)
		ret = qc_co_flush(s->file);
	free(dir);
	return ret;
}

int qc_bitmaps_load(struct qc_state *s, char *err, size_t errlen)
{
	struct qcow2_bitmap_info *b;
	uint8_t *buf = NULL;
	unsigned n;
	int ret;

	ret = qc_bitmaps_read(s, &b, &n, err, errlen);
	if (ret || !n)
		return ret;
	buf = qc_alloc_buf(s->cluster_size);
	ret = buf ? 0 : -ENOMEM;
	for (unsigned i = 0; i < n && !ret; i++) {
		struct blk_dirty_bitmap *bm = NULL;

		ret = bm_load_one(s, &b[i], buf, &bm);
		if (!ret)
			blk_dirty_bitmap_link(s->bs, bm);
		else if (ret == -EINVAL)
			snprintf(err, errlen, "qcow2: bitmap '%s' has a bad bitmap table",
				 b[i].name);
	}
	if (!ret && !s->read_only)
		ret = bm_mark_in_use(s, b, n);
	if (!ret)
		s->bm_owned = !s->read_only;
	free(buf);
	qcow2_bitmaps_free(b, n);
	if (ret)
		blk_dirty_bitmaps_free(s->bs);
	return ret;
}

/* ---- store at close ---- */

/* Allocate n clusters and write len bytes of buf (padded with zeroes to
 * the cluster) there; *off. */
static int bm_write_new(struct qc_state *s, const void *buf, uint64_t len, uint64_t *off)
{
	uint64_t n = qc_align_up(len, s->cluster_size) >> s->cluster_bits;
	uint8_t *p = qc_alloc_buf(n << s->cluster_bits);
	bool fresh;
	int ret;

	if (!p)
		return -ENOMEM;
	memset(p, 0, n << s->cluster_bits);
	memcpy(p, buf, len);
	ret = qc_alloc_clusters(s, n, off, &fresh);
	if (!ret)
		ret = qc_co_pwrite(s->file, *off, p, n << s->cluster_bits);
	free(p);
	return ret;
}

static bool bm_zero(const uint8_t *p, uint64_t len)
{
	return !len || (!p[0] && !memcmp(p, p + 1, len - 1));
}

/* Data clusters, then the table of bm: its table offset and size. */
static int bm_store_one(struct qc_state *s, struct blk_dirty_bitmap *bm, uint64_t *toff,
			uint32_t *tsize)
{
	uint64_t n = bm_clusters(s, bm), total = bm_bytes(bm), *t;
	uint8_t *le = malloc(total);
	int ret = 0;

	t = calloc(n ? n : 1, 8);
	if (!t || !le) {
		free(t);
		free(le);
		return -ENOMEM;
	}
	for (uint64_t i = 0; i < bm->nwords; i++) {
		uint64_t w = htole64(atomic_load(&bm->words[i]));

		memcpy(le + i * 8, &w, 8);
	}
	for (uint64_t i = 0; i < n && !ret; i++) {
		uint64_t pos = i << s->cluster_bits, len = total - pos, off = 0;

		len = len < s->cluster_size ? len : s->cluster_size;
		if (!bm_zero(le + pos, len))
			ret = bm_write_new(s, le + pos, len, &off);
		t[i] = htobe64(off);
	}
	if (!ret)
		ret = bm_write_new(s, t, n * 8, toff);
	*tsize = (uint32_t)n;
	free(t);
	free(le);
	return ret;
}

/* Drop the clusters of a table and the data it names (deferred). */
static void bm_free_table(struct qc_state *s, uint64_t toff, uint32_t tsize)
{
	uint64_t *t;

	if (bm_read_table(s, toff, tsize, &t))
		return; /* unreadable: leaked, as a check would report */
	for (uint32_t i = 0; i < tsize; i++)
		if (t[i] & QC_OFFSET_MASK)
			qc_decref_add(s, t[i] & QC_OFFSET_MASK, 1, false);
	qc_decref_add(s, toff, qc_align_up((uint64_t)tsize * 8, s->cluster_size) >> s->cluster_bits,
		      false);
	free(t);
}

/* One directory entry for bm at dir + *pos. */
static void bm_dir_entry(uint8_t *dir, uint64_t *pos, const struct blk_dirty_bitmap *bm,
			 uint64_t toff, uint32_t tsize, uint32_t flags)
{
	uint8_t *p = dir + *pos;
	size_t nlen = strlen(bm->name);

	qc_wr64(p, toff);
	qc_wr32(p + 8, tsize);
	qc_wr32(p + 12, flags);
	p[16] = 1; /* dirty tracking bitmap */
	p[17] = (uint8_t)bm->gran_bits;
	qc_wr16(p + 18, (uint16_t)nlen);
	qc_wr32(p + 20, 0);
	memcpy(p + BM_ENTRY_LEN, bm->name, nlen);
	*pos += qc_align_up(BM_ENTRY_LEN + nlen, 8);
}

/* Build the new directory of every persistent bitmap (the consistent ones
 * written out anew, the inconsistent ones kept as they are). */
static int bm_build_dir(struct qc_state *s, uint8_t **dir, uint64_t *len, unsigned *count)
{
	struct blk_dirty_bitmap *bm;
	uint64_t cap = 0, pos = 0;
	int ret = 0;

	for (bm = s->bs->dirty_bitmaps; bm; bm = bm->next)
		if (bm->persistent)
			cap += qc_align_up(BM_ENTRY_LEN + strlen(bm->name), 8);
	*dir = calloc(1, cap ? cap : 8);
	*count = 0;
	if (!*dir)
		return -ENOMEM;
	for (bm = s->bs->dirty_bitmaps; bm && !ret; bm = bm->next) {
		uint64_t toff = bm->disk_table_offset;
		uint32_t tsize = bm->disk_table_size, flags = bm->disk_flags;

		if (!bm->persistent)
			continue;
		if (!bm->inconsistent) {
			ret = bm_store_one(s, bm, &toff, &tsize);
			flags = atomic_load(&bm->enabled) ? QCOW2_BITMAP_AUTO : 0;
		}
		bm_dir_entry(*dir, &pos, bm, toff, tsize, flags);
		(*count)++;
	}
	*len = pos;
	return ret;
}

/* Is toff the table of an inconsistent bitmap that stays? */
static bool bm_table_kept(const struct qc_state *s, uint64_t toff)
{
	for (struct blk_dirty_bitmap *bm = s->bs->dirty_bitmaps; bm; bm = bm->next)
		if (bm->persistent && bm->inconsistent && bm->disk_table_offset == toff)
			return true;
	return false;
}

/* Free what the old directory named and the directory itself. */
static void bm_free_old(struct qc_state *s, const struct qcow2_bitmap_info *b, unsigned n,
			uint64_t dir_off, uint64_t dir_bytes)
{
	for (unsigned i = 0; i < n; i++)
		if (!bm_table_kept(s, b[i].table_offset))
			bm_free_table(s, b[i].table_offset, b[i].table_size);
	if (dir_bytes)
		qc_decref_add(s, dir_off,
			      qc_align_up(dir_bytes, s->cluster_size) >> s->cluster_bits, false);
}

/* Point the header at the new directory; refcounts of the new clusters
 * are on disk first. */
static int bm_switch_dir(struct qc_state *s, uint64_t off, uint64_t len, unsigned count)
{
	int ret = qc_metadata_writeback(s, false);

	if (!ret)
		ret = qc_co_flush(s->file);
	if (!ret)
		ret = qc_header_set_bitmaps(s, count, len, off);
	if (ret)
		return ret;
	pthread_mutex_lock(&s->lock);
	if (s->bmdir_bytes)
		qc_mset_del(s, s->bmdir_offset, s->bmdir_bytes, QC_OL_BMDIR);
	s->bmdir_offset = off;
	s->bmdir_bytes = len;
	s->nb_bitmaps = count;
	ret = len ? qc_mset_add(s, off, len, QC_OL_BMDIR) : 0;
	pthread_mutex_unlock(&s->lock);
	return ret;
}

static bool bm_any_persistent(const struct qc_state *s)
{
	for (struct blk_dirty_bitmap *bm = s->bs->dirty_bitmaps; bm; bm = bm->next)
		if (bm->persistent)
			return true;
	return false;
}

int qc_bitmaps_store(struct qc_state *s)
{
	struct qcow2_bitmap_info *old = NULL;
	uint64_t old_off = s->bmdir_offset, old_bytes = s->bmdir_bytes, off = 0, len = 0;
	unsigned nold = 0, count = 0;
	uint8_t *dir = NULL;
	char err[256];
	int ret;

	if (s->h.version < 3 || (!s->bm_owned && !bm_any_persistent(s)))
		return 0;
	ret = qc_bitmaps_read(s, &old, &nold, err, sizeof(err));
	if (!ret)
		ret = bm_build_dir(s, &dir, &len, &count);
	if (!ret && len)
		ret = bm_write_new(s, dir, len, &off);
	if (!ret)
		ret = bm_switch_dir(s, off, len, count);
	if (!ret)
		bm_free_old(s, old, nold, old_off, old_bytes);
	else
		log_err("qcow2: saving the dirty bitmaps failed: %s", strerror(-ret));
	qcow2_bitmaps_free(old, nold);
	free(dir);
	return ret;
}

/* ---- tool API ---- */

int qcow2_bitmap_can_store(struct blk_node *bs, const char *name, uint32_t granularity, char *err,
			   size_t errlen)
{
	struct qc_state *s = qcow2_is(bs) ? bs->opaque : NULL;
	unsigned gb = (unsigned)__builtin_ctz(granularity), n = 0;
	const char *why = NULL;
	char buf[128];

	if (!s)
		return -EINVAL;
	for (struct blk_dirty_bitmap *bm = bs->dirty_bitmaps; bm; bm = bm->next)
		n += bm->persistent;
	if (s->h.version < 3)
		why = "Cannot store dirty bitmaps in qcow2 v2 files";
	else if (gb > 31 || gb < 9)
		why = gb > 31 ? "Granularity exceeds maximum (2147483648 bytes)"
			      : "Granularity is under minimum (512 bytes)";
	else if (bs->size > (BM_MAX_PHYS_BYTES << gb) ||
		 bs->size > ((BM_MAX_TABLE_SIZE * s->cluster_size) << gb))
		why = "Too much space will be occupied by the bitmap. Use larger granularity";
	else if (strlen(name) > 1023)
		why = (snprintf(buf, sizeof(buf), "Name length exceeds maximum (%u characters)",
				1023),
		       buf);
	else if (n >= QC_MAX_BITMAPS)
		why = "Maximum number of persistent bitmaps is already reached";
	if (!why)
		return 0;
	snprintf(err, errlen, "Can't make bitmap '%s' persistent in '%s': %s", name, bs->name, why);
	return -EINVAL;
}
