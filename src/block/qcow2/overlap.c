/* qcow2 metadata overlap checks (QEMU's overlap-check=cached: everything but
 * inactive L2 tables) and the reaction to a corruption found in use.
 *
 * Every host cluster that holds metadata - header, L1 table, refcount table,
 * snapshot table, bitmap directory, L2 tables of the active L1, refcount
 * blocks - is in a hash set kept up to date where tables move and L1 and
 * refcount table entries change; the snapshots' L1 tables (which never
 * change, and may be many) are sorted disjoint ranges. A data write is
 * checked against all of them with one hash lookup per cluster (and a
 * binary search when there are snapshots), on the fast path too. Messages
 * come from exact byte ranges (qc_meta_overlap), on the slow path.
 *
 * Threading: the set changes under s->lock (with s->meta held); lookups run
 * under s->lock or with s->meta held. Built at open, freed at close. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/graph.h"
#include "block/qcow2/qcow2-int.h"
#include "util/compiler.h"
#include "util/log.h"

/* ---- the set of metadata clusters ---- */

static struct qc_mslot *qc_mset_slot(struct qc_mset *m, uint64_t c)
{
	uint64_t i;

	for (i = qc_mset_hash(m, c + 1); m->v[i].key; i = (i + 1) & m->mask)
		if (m->v[i].key == c + 1)
			break;
	return &m->v[i];
}

static int qc_mset_grow(struct qc_mset *m)
{
	struct qc_mset n = {.mask = m->mask ? 2 * m->mask + 1 : 63};
	uint64_t i;

	n.shift = (unsigned)__builtin_clzll(n.mask + 1) + 1;
	n.v = calloc(n.mask + 1, sizeof(*n.v));
	if (!n.v)
		return -ENOMEM;
	for (i = 0; m->v && i <= m->mask; i++) {
		if (m->v[i].key)
			*qc_mset_slot(&n, m->v[i].key - 1) = m->v[i];
	}
	n.n = m->n;
	free(m->v);
	*m = n;
	return 0;
}

struct qc_mslot *qc_mset_lookup(struct qc_mset *m, uint64_t c)
{
	struct qc_mslot *sl;

	if (!m->n)
		return NULL;
	sl = qc_mset_slot(m, c);
	return sl->key ? sl : NULL;
}

struct qc_mslot *qc_mset_get(struct qc_mset *m, uint64_t c)
{
	struct qc_mslot *sl;

	if ((m->n + 1) * 2 > m->mask + 1 && qc_mset_grow(m))
		return NULL;
	sl = qc_mset_slot(m, c);
	if (!sl->key) {
		*sl = (struct qc_mslot){.key = c + 1};
		m->n++;
	}
	return sl;
}

static int qc_mset_add1(struct qc_mset *m, uint64_t c, unsigned kind)
{
	struct qc_mslot *sl = qc_mset_get(m, c);

	if (!sl)
		return -ENOMEM;
	if (kind == QC_OL_L2)
		sl->l2++;
	else if (kind == QC_OL_RB)
		sl->rbf += (sl->rbf & QC_MSLOT_RB) != QC_MSLOT_RB; /* saturates */
	else
		sl->rbf |= (uint32_t)kind << 24;
	return 0;
}

/* Linear probing without tombstones: the entries after a removed one move
 * back into the gap where their probe sequence allows. */
static void qc_mset_remove(struct qc_mset *m, struct qc_mslot *gap)
{
	uint64_t i = (uint64_t)(gap - m->v), j = i, h;

	*gap = (struct qc_mslot){0};
	m->n--;
	for (;;) {
		j = (j + 1) & m->mask;
		if (!m->v[j].key)
			return;
		h = qc_mset_hash(m, m->v[j].key);
		/* Does slot i lie cyclically in [h, j)? Then the entry may move. */
		if ((j > i && (h <= i || h > j)) || (j < i && h <= i && h > j)) {
			m->v[i] = m->v[j];
			m->v[j] = (struct qc_mslot){0};
			i = j;
		}
	}
}

static void qc_mset_del1(struct qc_mset *m, uint64_t c, unsigned kind)
{
	struct qc_mslot *sl = qc_mset_lookup(m, c);

	if (!sl)
		return;
	if (kind == QC_OL_L2 && sl->l2)
		sl->l2--;
	else if (kind == QC_OL_RB && (sl->rbf & QC_MSLOT_RB) &&
		 (sl->rbf & QC_MSLOT_RB) != QC_MSLOT_RB)
		sl->rbf--;
	else if (kind != QC_OL_L2 && kind != QC_OL_RB)
		sl->rbf &= ~((uint32_t)kind << 24);
	if (!sl->l2 && !sl->rbf)
		qc_mset_remove(m, sl);
}

int qc_mset_add(struct qc_state *s, uint64_t off, uint64_t len, unsigned kind)
{
	uint64_t c;
	int ret = 0;

	for (c = off >> s->cluster_bits; !ret && len && c <= (off + len - 1) >> s->cluster_bits;
	     c++)
		ret = qc_mset_add1(&s->mset, c, kind);
	return ret;
}

void qc_mset_del(struct qc_state *s, uint64_t off, uint64_t len, unsigned kind)
{
	uint64_t c;

	for (c = off >> s->cluster_bits; len && c <= (off + len - 1) >> s->cluster_bits; c++)
		qc_mset_del1(&s->mset, c, kind);
}

/* ---- building at open ---- */

static int qc_range_cmp(const void *a, const void *b)
{
	const struct qc_range *x = a, *y = b;

	return x->start < y->start ? -1 : x->start > y->start;
}

/* The snapshots' L1 tables as sorted disjoint cluster-aligned ranges. */
static int qc_snap_ranges(struct qc_state *s)
{
	uint32_t i, n = 0;
	struct qc_range *r;

	if (!s->nsnaps)
		return 0;
	r = calloc(s->nsnaps, sizeof(*r));
	if (!r)
		return -ENOMEM;
	for (i = 0; i < s->nsnaps; i++) {
		if (!s->snaps[i].l1_size)
			continue;
		r[n].start = s->snaps[i].l1_offset;
		r[n++].end = qc_align_up(s->snaps[i].l1_offset + (uint64_t)s->snaps[i].l1_size * 8,
					 s->cluster_size);
	}
	qsort(r, n, sizeof(*r), qc_range_cmp);
	s->nsnap_l1r = 0;
	for (i = 0; i < n; i++) {
		if (s->nsnap_l1r && r[i].start <= r[s->nsnap_l1r - 1].end) {
			if (r[i].end > r[s->nsnap_l1r - 1].end)
				r[s->nsnap_l1r - 1].end = r[i].end;
		} else {
			r[s->nsnap_l1r++] = r[i];
		}
	}
	s->snap_l1r = r;
	return 0;
}

int qc_snap_ranges_reset(struct qc_state *s)
{
	free(s->snap_l1r);
	s->snap_l1r = NULL;
	s->nsnap_l1r = 0;
	return qc_snap_ranges(s);
}

/* Two refcount table entries naming one block: every refcount update there
 * would change the refcount of clusters of both ranges. Only a rebuild of
 * the refcount structures repairs that; such an image opens read-only (or
 * for check -r, which reports it). */
static int qc_rb_aliased(struct qc_state *s, uint64_t i, char *err, size_t errlen)
{
	uint64_t j;

	if (s->bs->read_only || s->repair)
		return 0;
	for (j = 0; j < i && s->rct[j] != s->rct[i];)
		j++;
	snprintf(err, errlen,
		 "qcow2: refcount table entries %llu and %llu both name the refcount "
		 "block at 0x%llx: the image is corrupt and can only be opened read-only (a "
		 "rebuild of the refcount structures, qemu-img check -r all, repairs it)",
		 (unsigned long long)j, (unsigned long long)i, (unsigned long long)s->rct[i]);
	return -EINVAL;
}

/* After the L1 table, the refcount table and the snapshots are read. Every
 * entry naming a cluster of the file counts, usable or not: a data cluster
 * that one of them names is suspect either way. Entries past the end (they
 * are refused where used) stay out, so that the set holds at most one
 * entry per cluster of the file, whatever the tables claim. */
int qc_meta_build(struct qc_state *s, char *err, size_t errlen)
{
	const uint64_t cs = s->cluster_size;
	uint64_t i, o;
	int ret = qc_snap_ranges(s);

	if (!ret)
		ret = qc_mset_add(s, 0, cs, QC_OL_HEADER);
	if (!ret)
		ret = qc_mset_add(s, s->l1_offset, (uint64_t)s->l1_size * 8, QC_OL_L1);
	if (!ret)
		ret = qc_mset_add(s, s->rct_offset, s->rct_size * 8, QC_OL_RCT);
	if (!ret)
		ret = qc_mset_add(s, s->snap_offset, s->snap_bytes, QC_OL_SNAPT);
	if (!ret)
		ret = qc_mset_add(s, s->bmdir_offset, s->bmdir_bytes, QC_OL_BMDIR);
	for (i = 0; !ret && i < s->l1_size; i++) {
		o = s->l1[i] & QC_OFFSET_MASK;
		if (o && o < qc_align_up(s->file->size, cs))
			ret = qc_mset_add(s, o, cs, QC_OL_L2);
	}
	for (i = 0; !ret && i < s->rct_used; i++) {
		if (!s->rct[i])
			continue;
		ret = qc_mset_add(s, s->rct[i], cs, QC_OL_RB);
		if (!ret &&
		    (qc_mset_lookup(&s->mset, s->rct[i] >> s->cluster_bits)->rbf & QC_MSLOT_RB) > 1)
			ret = qc_rb_aliased(s, i, err, errlen);
	}
	return ret;
}

void qc_mset_free(struct qc_mset *m)
{
	free(m->v);
	memset(m, 0, sizeof(*m));
}

void qc_meta_free(struct qc_state *s)
{
	qc_mset_free(&s->mset);
	free(s->snap_l1r);
	s->snap_l1r = NULL;
	s->nsnap_l1r = 0;
}

/* ---- lookups ---- */

bool qc_overlaps_fixed(const struct qc_state *s, uint64_t off, uint64_t len)
{
	return off < s->cluster_size ||
	       qc_ranges_overlap(off, len, s->l1_offset, (uint64_t)s->l1_size * 8) ||
	       qc_ranges_overlap(off, len, s->rct_offset, s->rct_size * 8) ||
	       qc_ranges_overlap(off, len, s->snap_offset, s->snap_bytes) ||
	       qc_ranges_overlap(off, len, s->bmdir_offset, s->bmdir_bytes);
}

/* Index of the snapshot range holding a byte of [off, off+len), or -1. */
static long qc_snap_range_hit(const struct qc_state *s, uint64_t off, uint64_t len)
{
	uint32_t lo = 0, hi = s->nsnap_l1r, mid;

	while (lo < hi) { /* first range ending after off */
		mid = lo + (hi - lo) / 2;
		if (s->snap_l1r[mid].end <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < s->nsnap_l1r && s->snap_l1r[lo].start < off + len ? (long)lo : -1;
}

bool qc_snap_l1_hit(const struct qc_state *s, uint64_t off, uint64_t len)
{
	return qc_snap_range_hit(s, off, len) >= 0;
}

/* First cluster of [off, off+len) that is an L2 table or a refcount block
 * (as which asks). */
static bool qc_mset_hit(const struct qc_state *s, unsigned which, uint64_t off, uint64_t len,
			uint64_t *hit, unsigned *kind)
{
	uint64_t c, last = (off + len - 1) >> s->cluster_bits;
	unsigned k;

	for (c = off >> s->cluster_bits; c <= last; c++) {
		k = qc_meta_kinds(s, c) & which & (QC_OL_L2 | QC_OL_RB);
		if (k) {
			*kind = k & QC_OL_L2 ? QC_OL_L2 : QC_OL_RB;
			*hit = c;
			return true;
		}
	}
	return false;
}

static bool hdr_ol_tables(const struct qc_state *s, unsigned which, uint64_t off, uint64_t len,
			  char *buf, size_t buflen)
{
	const struct {
		unsigned kind;
		const char *what;
		uint64_t at, len;
	} t[] = {
		{QC_OL_HEADER, "header", 0, s->cluster_size},
		{QC_OL_L1, "L1 table", s->l1_offset, (uint64_t)s->l1_size * 8},
		{QC_OL_RCT, "refcount table", s->rct_offset, s->rct_size * 8},
		{QC_OL_SNAPT, "snapshot table", s->snap_offset, s->snap_bytes},
		{QC_OL_BMDIR, "bitmap directory", s->bmdir_offset, s->bmdir_bytes},
	};
	unsigned i;

	for (i = 0; i < ARRAY_SIZE(t); i++) {
		if ((which & t[i].kind) && qc_ranges_overlap(off, len, t[i].at, t[i].len)) {
			snprintf(buf, buflen, "%s at 0x%llx", t[i].what,
				 (unsigned long long)t[i].at);
			return true;
		}
	}
	return false;
}

/* Names what the set found (a rare path: the tables are scanned). */
static void qc_mset_describe(const struct qc_state *s, uint64_t c, unsigned kind, char *buf,
			     size_t buflen)
{
	uint64_t off = c << s->cluster_bits, i;

	if (kind == QC_OL_L2) {
		for (i = 0; i < s->l1_size && (s->l1[i] & QC_OFFSET_MASK) >> s->cluster_bits != c;)
			i++;
		snprintf(buf, buflen, "L2 table at 0x%llx (L1 entry %llu)",
			 (unsigned long long)(i < s->l1_size ? s->l1[i] & QC_OFFSET_MASK : off),
			 (unsigned long long)i);
		return;
	}
	for (i = 0; i < s->rct_used && s->rct[i] >> s->cluster_bits != c;)
		i++;
	snprintf(buf, buflen, "refcount block at 0x%llx (refcount table entry %llu)",
		 (unsigned long long)(i < s->rct_used ? s->rct[i] : off), (unsigned long long)i);
}

static void qc_snap_describe(const struct qc_state *s, uint64_t off, uint64_t len, char *buf,
			     size_t buflen)
{
	uint32_t i;

	for (i = 0; i < s->nsnaps; i++) {
		const struct qc_snapshot *sn = &s->snaps[i];

		if (qc_ranges_overlap(off, len, sn->l1_offset, (uint64_t)sn->l1_size * 8))
			break;
	}
	if (i == s->nsnaps) /* the cluster's tail past the table */
		i = 0;
	snprintf(buf, buflen, "L1 table of snapshot %.32s at 0x%llx",
		 s->snaps[i].id ? s->snaps[i].id : "?", (unsigned long long)s->snaps[i].l1_offset);
}

bool qc_meta_overlap(const struct qc_state *s, unsigned which, uint64_t off, uint64_t len,
		     char *buf, size_t buflen)
{
	uint64_t c;
	unsigned kind;
	long r;

	if (!len)
		return false;
	if (hdr_ol_tables(s, which, off, len, buf, buflen))
		return true;
	if ((which & QC_OL_SNAP_L1) && s->nsnap_l1r && (r = qc_snap_range_hit(s, off, len)) >= 0) {
		qc_snap_describe(s, off > s->snap_l1r[r].start ? off : s->snap_l1r[r].start, len,
				 buf, buflen);
		return true;
	}
	if (!(which & (QC_OL_L2 | QC_OL_RB)) || !qc_mset_hit(s, which, off, len, &c, &kind))
		return false;
	qc_mset_describe(s, c, kind, buf, buflen);
	return true;
}

/* ---- corruption found in use ---- */

/* As QEMU does: the corrupt bit is on disk (version 3, writable node) before
 * anything else is written; from then on writes and metadata updates fail,
 * so that nothing built on the inconsistency reaches the file, and close
 * writes nothing either: the image is read-only from here on. */
int qc_corrupt(struct qc_state *s, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	bool first = !s->corrupt;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	log_err("qcow2: image is corrupt: %s%s%s", msg,
		first && !s->bs->read_only && s->h.version >= 3 ? "; marked corrupt" : "",
		first && !s->bs->read_only ? "; further writes are refused" : "");
	__atomic_store_n(&s->corrupt, true, __ATOMIC_RELEASE);
	if (first) /* fatal as in QEMU: a writable image is unusable from here on */
		blk_report_corrupt(s->bs, msg, !s->bs->read_only);
	if (first && !s->bs->read_only && s->h.version >= 3 &&
	    qc_header_write_features(s, s->h.incompat | QC_INCOMPAT_CORRUPT, s->h.autoclear))
		log_err("qcow2: cannot set the corrupt bit in the header");
	return -EIO;
}
