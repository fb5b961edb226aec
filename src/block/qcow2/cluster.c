/* qcow2 cluster mapping: L1 table (in memory), L2 entries through the slice
 * cache, standard and extended (subcluster) entries, L2 table allocation and
 * copy-on-write of L2 tables shared with snapshots, the list of allocating
 * writes in flight, and dropping the reference an old entry held.
 *
 * Threading: lookups for the fast path run under s->lock; everything else
 * with s->meta held (see qcow2-int.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"
#include "util/log.h"

/* Key of the L2 slice holding gc's entry, and the entry's byte offset in it.
 * l1e: the L1 entry's offset bits. */
static uint64_t qc_l2_key(const struct qc_state *s, uint64_t l1e, uint64_t gc, unsigned *boff)
{
	uint64_t byte = (gc & (qc_l2_entries(s) - 1)) * s->l2_entry_bytes;
	uint64_t smask = (1ull << s->l2c.slice_bits) - 1;

	*boff = (unsigned)(byte & smask);
	return l1e + (byte & ~smask);
}

static void qc_l2_decode(const struct qc_state *s, const uint8_t *p, uint64_t *e, uint64_t *bm)
{
	*e = qc_rd64(p);
	*bm = s->ext_l2 ? qc_rd64(p + 8) : 0;
}

bool qc_l2_peek(struct qc_state *s, uint64_t gc, uint64_t *entry, uint64_t *bitmap)
{
	uint64_t l1e = s->l1[gc >> s->l2_bits] & QC_OFFSET_MASK;
	const uint8_t *d;
	unsigned boff;

	if (!l1e) {
		*entry = *bitmap = 0;
		return true;
	}
	d = qc_cache_peek(&s->l2c, qc_l2_key(s, l1e, gc, &boff));
	if (!d)
		return false;
	qc_l2_decode(s, d + boff, entry, bitmap);
	return true;
}

/* Why the L2 table offset of L1 entry e cannot be followed (NULL: it can):
 * which says what it must not overlap (reading: the fixed tables; writing:
 * any other metadata). Checked at every use: a few comparisons. */
const char *qc_l1e_problem(const struct qc_state *s, uint64_t e, unsigned which, char *buf,
			   size_t len)
{
	uint64_t off = e & QC_OFFSET_MASK;
	char what[96];

	if (e & QC_L1E_RESERVED)
		return "has reserved bits set";
	if (!off)
		return NULL;
	if (off & (s->cluster_size - 1))
		return "is not cluster aligned";
	if (off >= qc_align_up(s->file->size, s->cluster_size))
		return "is past the end of the file";
	if (!qc_meta_overlap(s, which, off, s->cluster_size, what, sizeof(what)))
		return NULL;
	snprintf(buf, len, "overlaps the %s", what);
	return buf;
}

static int qc_l1_check(struct qc_state *s, uint64_t l1i, uint64_t e, unsigned which)
{
	char buf[160];
	const char *why = qc_l1e_problem(s, e, which, buf, sizeof(buf));

	if (!why)
		return 0;
	return qc_corrupt(s, "L2 table offset 0x%llx (L1 entry %llu = 0x%llx) %s",
			  (unsigned long long)(e & QC_OFFSET_MASK), (unsigned long long)l1i,
			  (unsigned long long)e, why);
}

int qc_l2_get(struct qc_state *s, uint64_t gc, uint64_t *entry, uint64_t *bitmap)
{
	uint64_t l1i = gc >> s->l2_bits, l1e;
	struct qc_slot *sl;
	unsigned boff;
	int ret;

	*entry = *bitmap = 0;
	if (l1i >= s->l1_size)
		return 0;
	l1e = s->l1[l1i];
	if (!(l1e & QC_OFFSET_MASK))
		return 0;
	ret = qc_l1_check(s, l1i, l1e, QC_OL_FIXED);
	if (ret)
		return ret;
	sl = qc_cache_get(s, &s->l2c, qc_l2_key(s, l1e & QC_OFFSET_MASK, gc, &boff), false, &ret);
	if (!sl)
		return ret;
	qc_l2_decode(s, sl->data + boff, entry, bitmap);
	return 0;
}

/* Give L1 entry l1i a table of its own: a new zeroed one, or a copy of the
 * shared one (which then loses the active image's reference). The table is
 * written before the L1 entry changes in memory; the L1 entry reaches the
 * disk after the tables at writeback. */
static int qc_l2_alloc(struct qc_state *s, uint64_t l1i, uint64_t old)
{
	uint64_t new;
	uint8_t *buf;
	bool fresh;
	int ret;

	buf = qc_alloc_buf(s->cluster_size);
	if (!buf)
		return -ENOMEM;
	ret = qc_alloc_clusters(s, 1, &new, &fresh);
	if (ret)
		goto out;
	if (old) {
		ret = qc_cache_writeback(s, &s->l2c); /* the copy must see cached entries */
		if (!ret)
			ret = qc_co_pread_clamped(s->file, old, buf, s->cluster_size);
	} else {
		memset(buf, 0, s->cluster_size);
	}
	if (!ret)
		ret = qc_co_pwrite(s->file, new, buf, s->cluster_size);
	if (ret) {
		qc_rc_update(s, new >> s->cluster_bits, -1);
		goto out;
	}
	pthread_mutex_lock(&s->lock);
	ret = qc_mset_add(s, new, s->cluster_size, QC_OL_L2);
	if (!ret) {
		if (old)
			qc_mset_del(s, old, s->cluster_size, QC_OL_L2);
		s->l1[l1i] = new | QC_OFLAG_COPIED;
		s->l1_dirty[l1i / QC_TABLE_CHUNK] = 1;
		s->metadata_changed = true;
	}
	pthread_mutex_unlock(&s->lock);
	if (ret) {
		qc_rc_update(s, new >> s->cluster_bits, -1);
		goto out;
	}
	if (old)
		qc_decref_add(s, old, 1, false);
out:
	free(buf);
	return ret;
}

int qc_l2_set(struct qc_state *s, uint64_t gc, uint64_t entry, uint64_t bitmap)
{
	uint64_t l1i = gc >> s->l2_bits, l1e;
	struct qc_slot *sl;
	unsigned boff;
	int ret;

	if (l1i >= s->l1_size)
		return -EIO;
	l1e = s->l1[l1i];
	/* The table is about to be written: it must be no other metadata. */
	ret = qc_l1_check(s, l1i, l1e, QC_OL_ALL & ~QC_OL_L2);
	if (!ret && (!(l1e & QC_OFFSET_MASK) || !(l1e & QC_OFLAG_COPIED)))
		ret = qc_l2_alloc(s, l1i, l1e & QC_OFFSET_MASK);
	if (ret)
		return ret;
	l1e = s->l1[l1i] & QC_OFFSET_MASK;
	sl = qc_cache_get(s, &s->l2c, qc_l2_key(s, l1e, gc, &boff), false, &ret);
	if (!sl)
		return ret;
	pthread_mutex_lock(&s->lock);
	qc_wr64(sl->data + boff, entry);
	if (s->ext_l2)
		qc_wr64(sl->data + boff + 8, bitmap);
	pthread_mutex_unlock(&s->lock);
	qc_cache_mark_dirty(s, &s->l2c, sl);
	return 0;
}

/* Rewrite entry idx of the L2 table at l2off in place (check repair of
 * COPIED flags: no copy-on-write of the table). meta held. */
int qc_l2_patch(struct qc_state *s, uint64_t l2off, uint64_t idx, uint64_t entry)
{
	uint64_t byte = idx * s->l2_entry_bytes, smask = (1ull << s->l2c.slice_bits) - 1;
	struct qc_slot *sl;
	int ret;

	sl = qc_cache_get(s, &s->l2c, l2off + (byte & ~smask), false, &ret);
	if (!sl)
		return ret;
	pthread_mutex_lock(&s->lock);
	qc_wr64(sl->data + (byte & smask), entry);
	pthread_mutex_unlock(&s->lock);
	qc_cache_mark_dirty(s, &s->l2c, sl);
	return 0;
}

/* ---- classification ---- */

static bool qc_std_allocated(const struct qc_state *s, uint64_t e)
{
	return (e & QC_OFFSET_MASK) || (s->data_external && (e & QC_OFLAG_COPIED));
}

static enum qc_kind qc_sc_kind(uint64_t bm, unsigned sc)
{
	if (bm & (1ull << sc))
		return QC_NORMAL;
	if (bm & (1ull << (sc + 32)))
		return QC_ZERO;
	return QC_UNALLOC;
}

enum qc_kind qc_classify(const struct qc_state *s, uint64_t e, uint64_t bm, uint64_t coff,
			 uint64_t *len)
{
	unsigned sc, last;
	enum qc_kind k;

	if (*len > s->cluster_size - coff)
		*len = s->cluster_size - coff;
	if (e & QC_OFLAG_COMPRESSED)
		return QC_COMPRESSED;
	if (!s->ext_l2) {
		if (e & QC_OFLAG_ZERO)
			return QC_ZERO;
		return qc_std_allocated(s, e) ? QC_NORMAL : QC_UNALLOC;
	}
	sc = (unsigned)(coff >> s->sc_bits);
	last = (unsigned)((coff + *len - 1) >> s->sc_bits);
	k = qc_sc_kind(bm, sc);
	while (sc < last && qc_sc_kind(bm, sc + 1) == k)
		sc++;
	if (sc < last)
		*len = ((uint64_t)(sc + 1) << s->sc_bits) - coff;
	return k;
}

static const char *qc_comp_problem(const struct qc_state *s, uint64_t e, uint64_t bm,
				   unsigned which, char *buf, size_t len)
{
	uint64_t off, clen;
	char what[96];

	if (s->data_external)
		return "is compressed, with an external data file";
	if (s->ext_l2 && bm)
		return "is compressed but has a subcluster bitmap";
	qc_comp_desc(s, e, &off, &clen);
	/* The last sector may run past the end of the file, not its cluster. */
	if (off >= s->file->size || off + clen > qc_align_up(s->file->size, s->cluster_size))
		snprintf(buf, len,
			 "has compressed data at 0x%llx (%llu bytes) past the end of the "
			 "file (%llu bytes)",
			 (unsigned long long)off, (unsigned long long)clen,
			 (unsigned long long)s->file->size);
	else if (qc_meta_overlap(s, which, off, clen, what, sizeof(what)))
		snprintf(buf, len, "has compressed data at 0x%llx that overlaps the %s",
			 (unsigned long long)off, what);
	else
		return NULL;
	return buf;
}

/* Why entry e of guest cluster gc cannot be used (NULL: it can): entries a
 * hostile image could use to make us touch the wrong place. which: the
 * metadata its data must not overlap (QC_OL_FIXED to read it, QC_OL_ALL to
 * write, zero or discard it). */
const char *qc_entry_problem(const struct qc_state *s, uint64_t gc, uint64_t e, uint64_t bm,
			     unsigned which, char *buf, size_t len)
{
	uint64_t off = e & QC_OFFSET_MASK;
	char what[96];

	if (e & QC_OFLAG_COMPRESSED)
		return qc_comp_problem(s, e, bm, which, buf, len);
	if (e & QC_L2E_RESERVED)
		return "has reserved bits set";
	if (off & (s->cluster_size - 1))
		return "has a data offset that is not cluster aligned";
	if (s->ext_l2 && (e & QC_OFLAG_ZERO))
		return "has bit 0 (reserved with extended L2 entries) set";
	if (s->ext_l2 && (bm & (bm >> 32) & 0xffffffffu))
		return "has subclusters marked both allocated and zero";
	if (s->ext_l2 && (bm & 0xffffffffu) && !qc_std_allocated(s, e))
		return "has allocated subclusters but no data cluster";
	if (s->data_external)
		return qc_std_allocated(s, e) && off != (gc << s->cluster_bits)
			       ? "is not at its guest offset in the external data file"
			       : NULL;
	if (!off)
		return NULL;
	if (off >= qc_align_up(s->file->size, s->cluster_size))
		snprintf(buf, len, "has data at 0x%llx, past the end of the file (%llu bytes)",
			 (unsigned long long)off, (unsigned long long)s->file->size);
	else if (qc_meta_overlap(s, which, off, s->cluster_size, what, sizeof(what)))
		snprintf(buf, len, "has data at 0x%llx that overlaps the %s",
			 (unsigned long long)off, what);
	else
		return NULL;
	return buf;
}

int qc_entry_check(struct qc_state *s, uint64_t gc, uint64_t e, uint64_t bm, unsigned which)
{
	char buf[192];
	const char *why = qc_entry_problem(s, gc, e, bm, which, buf, sizeof(buf));

	if (!why)
		return 0;
	return qc_corrupt(s, "L2 entry 0x%llx (bitmap 0x%llx) of guest cluster %llu %s",
			  (unsigned long long)e, (unsigned long long)bm, (unsigned long long)gc,
			  why);
}

/* ---- allocations in flight ---- */

struct qc_alloc *qc_alloc_find(struct qc_state *s, uint64_t gc, uint64_t n)
{
	struct qc_alloc *a;

	for (a = s->allocs; a; a = a->next)
		if (gc < a->gc + a->n && a->gc < gc + n)
			return a;
	return NULL;
}

void qc_alloc_register(struct qc_state *s, struct qc_alloc *a, uint64_t gc, uint64_t n)
{
	a->gc = gc;
	a->n = n;
	a->waiters.head = a->waiters.tail = NULL;
	a->drain.head = a->drain.tail = NULL;
	a->linked = false;
	a->link_ret = 0;
	a->joiners = 0;
	pthread_mutex_lock(&s->lock);
	a->next = s->allocs;
	s->allocs = a;
	pthread_mutex_unlock(&s->lock);
}

void qc_alloc_unregister(struct qc_state *s, struct qc_alloc *a, int ret)
{
	struct qc_alloc **pp;

	pthread_mutex_lock(&s->lock);
	for (pp = &s->allocs; *pp; pp = &(*pp)->next) {
		if (*pp == a) {
			*pp = a->next;
			break;
		}
	}
	a->linked = true;
	a->link_ret = ret;
	qc_wake_all(&a->waiters);
	pthread_mutex_unlock(&s->lock);
}

/* The allocation lives on its coroutine's stack: keep it until the last
 * joiner has looked at it. */
void qc_alloc_drain(struct qc_state *s, struct qc_alloc *a)
{
	pthread_mutex_lock(&s->lock);
	while (a->joiners)
		qc_wait(s, &a->drain);
	pthread_mutex_unlock(&s->lock);
}

struct qc_alloc *qc_alloc_try_join(struct qc_state *s, uint64_t gc, uint64_t off, uint64_t *host)
{
	struct qc_alloc *a;

	pthread_mutex_lock(&s->lock);
	a = qc_alloc_find(s, gc, 1);
	if (a && a->joinable && !a->linked) {
		a->joiners++;
		*host = a->host + (off - (a->gc << s->cluster_bits));
	} else {
		a = NULL;
	}
	pthread_mutex_unlock(&s->lock);
	return a;
}

int qc_alloc_join_finish(struct qc_state *s, struct qc_alloc *a)
{
	int ret;

	pthread_mutex_lock(&s->lock);
	while (!a->linked)
		qc_wait(s, &a->waiters);
	ret = a->link_ret;
	if (--a->joiners == 0)
		qc_wake_all(&a->drain);
	pthread_mutex_unlock(&s->lock);
	return ret;
}

bool qc_alloc_wait(struct qc_state *s, uint64_t gc, uint64_t n)
{
	struct qc_alloc *a;
	struct qc_waiter *w;

	pthread_mutex_lock(&s->lock);
	a = qc_alloc_find(s, gc, n);
	if (!a) {
		pthread_mutex_unlock(&s->lock);
		return false;
	}
	/* Give meta up while waiting (the allocator needs it to finish). */
	s->meta.locked = false;
	w = s->meta.q.head;
	if (w) {
		s->meta.q.head = w->next;
		if (!s->meta.q.head)
			s->meta.q.tail = NULL;
		loop_send(w->loop, &w->msg);
	}
	qc_wait(s, &a->waiters);
	pthread_mutex_unlock(&s->lock);
	qc_co_lock(s, &s->meta);
	return true;
}

void qc_entry_release(struct qc_state *s, uint64_t e, bool discard)
{
	uint64_t off, len;

	if (e & QC_OFLAG_COMPRESSED) {
		qc_comp_desc(s, e, &off, &len);
		qc_decref_add(s, qc_align_down(off, s->cluster_size),
			      ((off + len - 1) >> s->cluster_bits) - (off >> s->cluster_bits) + 1,
			      false);
		return;
	}
	off = e & QC_OFFSET_MASK;
	if (off && !s->data_external)
		qc_decref_add(s, off, 1, discard);
}

/* ---- L1 table on disk ---- */

int qc_l1_write_dirty(struct qc_state *s)
{
	return qc_table_write_dirty(s, s->l1, s->l1_size, s->l1_dirty, s->l1_offset);
}

int qc_l1_read(struct qc_state *s, char *err, size_t errlen)
{
	uint64_t bytes = (uint64_t)s->l1_size * 8, i;
	uint8_t *buf = qc_alloc_buf(bytes ? bytes : 8);
	int ret = 0;

	s->l1 = calloc(s->l1_size ? s->l1_size : 1, 8);
	s->l1_dirty = calloc((bytes + 4095) / 4096 + 1, 1);
	if (!buf || !s->l1 || !s->l1_dirty) {
		free(buf);
		return -ENOMEM;
	}
	if (bytes)
		ret = qc_co_pread_clamped(s->file, s->l1_offset, buf, bytes);
	for (i = 0; ret == 0 && i < s->l1_size; i++) {
		s->l1[i] = qc_rd64(buf + i * 8);
		if (s->l1[i] & QC_L1E_RESERVED) {
			snprintf(err, errlen, "qcow2: L1 entry %llu has reserved bits set (0x%llx)",
				 (unsigned long long)i, (unsigned long long)s->l1[i]);
			ret = -EINVAL;
		}
	}
	free(buf);
	return ret;
}

/* Resize: a bigger L1 table in new clusters; the header switches to it once
 * it is durable. No request is in flight. */
int qc_l1_grow(struct qc_state *s, uint64_t min_size)
{
	uint64_t bytes = qc_align_up(min_size * 8, s->cluster_size), off, i, oldoff = s->l1_offset;
	uint64_t oldn = qc_align_up((uint64_t)s->l1_size * 8, s->cluster_size) >> s->cluster_bits;
	uint64_t *l1 = NULL;
	uint8_t *buf = NULL, *dirty = NULL, h[12];
	bool fresh;
	int ret;

	if (min_size <= s->l1_size)
		return 0;
	if (min_size * 8 > QC_MAX_L1_BYTES)
		return -EFBIG;
	l1 = calloc(bytes / 8, 8);
	dirty = calloc(bytes / 4096 + 1, 1);
	buf = qc_alloc_buf(bytes);
	ret = l1 && dirty && buf ? 0 : -ENOMEM;
	if (!ret)
		ret = qc_alloc_clusters(s, bytes >> s->cluster_bits, &off, &fresh);
	if (!ret) {
		pthread_mutex_lock(&s->lock);
		ret = qc_mset_add(s, off, bytes, QC_OL_L1);
		pthread_mutex_unlock(&s->lock);
	}
	if (ret)
		goto out;
	memcpy(l1, s->l1, (uint64_t)s->l1_size * 8);
	memset(buf, 0, bytes);
	for (i = 0; i < s->l1_size; i++)
		qc_wr64(buf + i * 8, l1[i]);
	ret = qc_metadata_writeback(s, true); /* L2 tables the L1 points to */
	if (!ret)
		ret = qc_co_pwrite(s->file, off, buf, bytes);
	if (!ret)
		ret = qc_co_flush(s->file);
	qc_wr32(h, (uint32_t)min_size);
	qc_wr64(h + 4, off);
	if (!ret)
		ret = qc_header_write_field(s, 36, h, 12);
	if (!ret)
		ret = qc_co_flush(s->file);
	if (ret)
		goto out;
	pthread_mutex_lock(&s->lock);
	qc_mset_del(s, oldoff, (uint64_t)s->l1_size * 8, QC_OL_L1);
	free(s->l1);
	free(s->l1_dirty);
	s->l1 = l1;
	s->l1_dirty = dirty;
	s->l1_size = (uint32_t)min_size;
	s->l1_offset = off;
	pthread_mutex_unlock(&s->lock);
	l1 = NULL;
	dirty = NULL;
	s->h.l1_size = (uint32_t)min_size;
	s->h.l1_table_offset = off;
	if (oldoff)
		qc_decref_add(s, oldoff, oldn, false);
out:
	free(l1);
	free(dirty);
	free(buf);
	return ret;
}
