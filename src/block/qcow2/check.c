/* qcow2 consistency check and repair (`img check`, and the refcount rebuild
 * of a dirty image at open). References are counted from the metadata -
 * header, active and snapshot L1 tables, L2 tables, data and compressed
 * clusters, refcount table and blocks, snapshot table - and compared with
 * the stored refcounts: stored < counted is a corruption, stored > counted
 * a leak. COPIED flags of the active tables must match refcount == 1.
 * A repair that leaves no corruption clears the dirty and corrupt bits.
 *
 * The work is bounded by the file, whatever the header and tables claim:
 * refcounts are compared for the clusters of the file only (as QEMU does),
 * an L2 table is read and walked once however many L1 entries name it (its
 * references count once per entry), the L1 table of a snapshot is walked
 * only if no metadata counted before holds its clusters, so the tables
 * walked are disjoint parts of the file.
 *
 * Threading: runs in a coroutine with s->meta held, no request in flight.
 * Memory: one 32-bit counter per host cluster of the file, refused past
 * 2^28 clusters, and a set entry per distinct L2 table. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"

#define CK_MAX_CLUSTERS (1ull << 28)

struct ck {
	struct qc_state *s;
	struct qcow2_check_result *r;
	uint32_t *refs;
	uint64_t n;         /* clusters counted */
	uint8_t *buf;       /* one cluster */
	uint64_t prev_host; /* the last data cluster of the L2 table being walked */
	int flags;
	bool fix_copied; /* repair COPIED flags (decided after the refcounts) */
	bool preview;    /* ck_compare only reports (before a repair), counts nothing */
	qcow2_check_report_fn *report; /* NULL: silent */
	void *report_opaque;
	bool rb_bad; /* a refcount block is referenced more than once */
	/* L2 tables named by the active L1 (act) and by the snapshots' (snap):
	 * l2 counts the entries naming one, rbf is the first (its L1 index). */
	struct qc_mset act, snap;
};

static void ck_say(struct ck *k, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void ck_error(struct ck *k, bool leak, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void ck_vsay(struct ck *k, bool problem, const char *fmt, va_list ap)
{
	char line[sizeof(k->r->first_error)];

	vsnprintf(line, sizeof(line), fmt, ap);
	if (problem && !k->r->first_error[0])
		memcpy(k->r->first_error, line, sizeof(line));
	if (k->report)
		k->report(k->report_opaque, line);
}

/* A line of the report that is not a problem found ("Repairing ..."). */
static void ck_say(struct ck *k, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	ck_vsay(k, false, fmt, ap);
	va_end(ap);
}

/* A problem: counted, reported (in qemu-img check's words where it has
 * them: "ERROR ...", "Leaked cluster ..."), the first kept in first_error. */
static void ck_error(struct ck *k, bool leak, const char *fmt, ...)
{
	va_list ap;

	if (k->preview) {
		va_start(ap, fmt);
		ck_vsay(k, false, fmt, ap);
		va_end(ap);
		return;
	}
	if (leak)
		k->r->leaks++;
	else
		k->r->corruptions++;
	va_start(ap, fmt);
	ck_vsay(k, true, fmt, ap);
	va_end(ap);
}

/* Count w references to cluster c. As in QEMU's check, a reference more
 * than a refcount can hold (refcount_bits) is an overflow, a corruption. */
static void ck_ref1(struct ck *k, uint64_t c, uint64_t w)
{
	uint64_t max = k->s->rc_max < UINT32_MAX ? k->s->rc_max : UINT32_MAX, over;

	if (w <= max - k->refs[c]) {
		k->refs[c] += (uint32_t)w;
		return;
	}
	over = w - (max - k->refs[c]);
	k->refs[c] = (uint32_t)max;
	ck_error(k, false, "ERROR: overflow cluster offset=0x%llx",
		 (unsigned long long)(c << k->s->cluster_bits));
	k->r->corruptions += over - 1;
}

/* Count w references to every cluster of [off, off+len). */
static void ck_ref_n(struct ck *k, uint64_t off, uint64_t len, uint64_t w, const char *what)
{
	uint64_t c, last;

	if (!len)
		return;
	c = off >> k->s->cluster_bits;
	last = (off + len - 1) >> k->s->cluster_bits;
	for (; c <= last; c++) {
		if (c >= k->n) {
			ck_error(
				k, false,
				"ERROR: counting reference for region exceeding the "
				"end of the file by one cluster or more: offset 0x%llx size 0x%llx "
				"(%s)",
				(unsigned long long)off, (unsigned long long)len, what);
			return;
		}
		ck_ref1(k, c, w);
	}
}

static void ck_ref(struct ck *k, uint64_t off, uint64_t len, const char *what)
{
	ck_ref_n(k, off, len, 1, what);
}

/* Does something counted already hold a cluster of [off, off+len)? */
static bool ck_claimed(const struct ck *k, uint64_t off, uint64_t len)
{
	uint64_t c, last = (off + len - 1) >> k->s->cluster_bits;

	for (c = off >> k->s->cluster_bits; len && c <= last && c < k->n; c++)
		if (k->refs[c])
			return true;
	return false;
}

/* One L2 entry, found through w L1 entries. */
static void ck_l2_entry(struct ck *k, uint64_t gc, uint64_t e, uint64_t bm, bool active, uint64_t w)
{
	struct qc_state *s = k->s;
	uint64_t off, len;
	char buf[160];
	const char *why = qc_entry_problem(s, gc, e, bm, QC_OL_FIXED, buf, sizeof(buf));

	if (why) {
		ck_error(k, false, "ERROR L2 entry 0x%llx of guest cluster %llu %s",
			 (unsigned long long)e, (unsigned long long)gc, why);
		return;
	}
	if (e & QC_OFLAG_COMPRESSED) {
		qc_comp_desc(s, e, &off, &len);
		ck_ref_n(k, off, len, w, "compressed cluster");
		/* As QEMU: compressed clusters count as fragmented (their
		 * sectors are read again for each), and leave prev_host be. */
		if (active) {
			k->r->allocated_clusters += w;
			k->r->compressed_clusters += w;
			k->r->fragmented_clusters += w;
		}
		return;
	}
	off = e & QC_OFFSET_MASK;
	/* Offset 0 is a cluster of an external data file when COPIED says so
	 * (not with the zero flag: QEMU's ZERO_PLAIN). */
	if (!off &&
	    (!s->data_external || !(e & QC_OFLAG_COPIED) || (!s->ext_l2 && (e & QC_OFLAG_ZERO))))
		return;
	if (!s->data_external)
		ck_ref_n(k, off, s->cluster_size, w, "data cluster");
	if (active) {
		k->r->allocated_clusters += w;
		if (k->prev_host && off != k->prev_host + s->cluster_size)
			k->r->fragmented_clusters += w;
		k->prev_host = off;
	}
}

static int ck_l2(struct ck *k, uint64_t l2off, uint64_t l1i, bool active, uint64_t w)
{
	struct qc_state *s = k->s;
	uint64_t i, n = qc_l2_entries(s);
	int ret;

	ret = qc_co_pread_clamped(s->file, l2off, k->buf, s->cluster_size);
	if (ret) {
		k->r->check_errors++;
		return 0;
	}
	/* Fragmentation counts within one table, as in QEMU (which walks a
	 * table once per L1 entry naming it: w times). */
	k->prev_host = 0;
	for (i = 0; i < n; i++) {
		const uint8_t *p = k->buf + i * s->l2_entry_bytes;

		ck_l2_entry(k, (l1i << s->l2_bits) + i, qc_rd64(p), s->ext_l2 ? qc_rd64(p + 8) : 0,
			    active, w);
	}
	return 0;
}

/* The usable L2 tables of an L1 table that w snapshots (or the active image)
 * have, each reference counted, into m: how many entries name each table
 * (saturating) and the first that does. */
static int ck_l1_collect(struct ck *k, const uint64_t *l1, uint64_t size, bool active, uint64_t w,
			 struct qc_mset *m)
{
	struct qc_state *s = k->s;
	struct qc_mslot *sl;
	uint64_t i, off;
	const char *why;
	char buf[128];

	for (i = 0; i < size; i++) {
		off = l1[i] & QC_OFFSET_MASK;
		if (!off)
			continue;
		why = qc_l1e_problem(s, l1[i], QC_OL_FIXED, buf, sizeof(buf));
		if (why) {
			ck_error(k, false, "ERROR %sL1 entry %llu (0x%llx): L2 table offset %s",
				 active ? "" : "snapshot ", (unsigned long long)i,
				 (unsigned long long)l1[i], why);
			continue;
		}
		ck_ref_n(k, off, s->cluster_size, w, "L2 table");
		if (off >= (k->n << s->cluster_bits))
			continue;
		sl = qc_mset_get(m, off >> s->cluster_bits);
		if (!sl)
			return -ENOMEM;
		if (!sl->l2)
			sl->rbf = (uint32_t)i;
		sl->l2 = UINT32_MAX - sl->l2 < w ? UINT32_MAX : sl->l2 + (uint32_t)w;
	}
	return 0;
}

/* The active L1's L2 tables, in L1 order (for the fragmentation count),
 * each walked once. */
static int ck_l1(struct ck *k)
{
	struct qc_state *s = k->s;
	struct qc_mslot *sl;
	uint64_t i, off;
	int ret = ck_l1_collect(k, s->l1, s->l1_size, true, 1, &k->act);

	for (i = 0; !ret && i < s->l1_size; i++) {
		off = s->l1[i] & QC_OFFSET_MASK;
		sl = off ? qc_mset_lookup(&k->act, off >> s->cluster_bits) : NULL;
		if (sl && sl->rbf == i)
			ret = ck_l2(k, off, i, true, sl->l2);
	}
	return ret;
}

/* The L1 table that the w snapshots from sn on share (the same offset and
 * size), unless its clusters are counted already: another table's, which
 * walking again would cost as much as the file. */
static int ck_snapshot_l1(struct ck *k, const struct qc_snapshot *sn, uint64_t w)
{
	struct qc_state *s = k->s;
	uint64_t bytes = (uint64_t)sn->l1_size * 8, *l1 = NULL, j;
	uint8_t *raw = NULL;
	bool claimed = ck_claimed(k, sn->l1_offset, bytes);
	int ret;

	ck_ref_n(k, sn->l1_offset, bytes, w, "snapshot L1 table");
	if (claimed) {
		ck_error(k, false,
			 "ERROR the L1 table of snapshot %.64s at 0x%llx overlaps other "
			 "metadata",
			 sn->id, (unsigned long long)sn->l1_offset);
		return 0;
	}
	raw = malloc(bytes + 1);
	l1 = calloc((uint64_t)sn->l1_size + 1, 8);
	ret = raw && l1 ? 0 : -ENOMEM;
	if (!ret)
		ret = qc_co_pread_clamped(s->file, sn->l1_offset, raw, bytes);
	for (j = 0; !ret && j < sn->l1_size; j++)
		l1[j] = qc_rd64(raw + j * 8);
	if (!ret)
		ret = ck_l1_collect(k, l1, sn->l1_size, false, w, &k->snap);
	free(raw);
	free(l1);
	return ret;
}

static int ck_snap_cmp(const void *a, const void *b)
{
	const struct qc_snapshot *x = *(const struct qc_snapshot *const *)a;
	const struct qc_snapshot *y = *(const struct qc_snapshot *const *)b;

	if (x->l1_offset != y->l1_offset)
		return x->l1_offset < y->l1_offset ? -1 : 1;
	return x->l1_size < y->l1_size ? -1 : x->l1_size > y->l1_size;
}

/* Every L2 table the snapshots name, walked once; snapshots that share one
 * L1 table count it as often as QEMU's check does, in one walk. */
static int ck_snapshots(struct ck *k)
{
	struct qc_state *s = k->s;
	const struct qc_snapshot **v;
	uint32_t n, m;
	uint64_t i;
	int ret = 0;

	ck_ref(k, s->snap_offset, s->snap_bytes, "snapshot table");
	if (!s->nsnaps)
		return 0;
	v = calloc(s->nsnaps, sizeof(*v));
	if (!v)
		return -ENOMEM;
	for (n = 0; n < s->nsnaps; n++)
		v[n] = &s->snaps[n];
	qsort(v, s->nsnaps, sizeof(*v), ck_snap_cmp);
	for (n = 0; n < s->nsnaps && !ret; n = m) {
		for (m = n + 1; m < s->nsnaps && !ck_snap_cmp(&v[n], &v[m]);)
			m++;
		ret = ck_snapshot_l1(k, v[n], m - n);
	}
	free(v);
	for (i = 0; !ret && k->snap.v && i <= k->snap.mask; i++) {
		const struct qc_mslot sl = k->snap.v[i];

		if (sl.key)
			ret = ck_l2(k, (sl.key - 1) << s->cluster_bits, sl.rbf, false, sl.l2);
	}
	return ret;
}

static void ck_fixed_meta(struct ck *k)
{
	struct qc_state *s = k->s;

	ck_ref(k, 0, s->cluster_size, "header");
	ck_ref(k, s->l1_offset, (uint64_t)s->l1_size * 8, "L1 table");
	ck_ref(k, s->rct_offset, s->rct_size * 8, "refcount table");
}

/* ---- bitmaps: the directory, each table, the data clusters it names ---- */

#define CK_BM_RESERVED 0xff000000000001feull
#define CK_BM_OFFSET 0x00fffffffffffe00ull
#define CK_BM_ALL_ONES 1ull

/* One bitmap table, a cluster at a time; bad entries are corruptions. */
static int ck_bitmap_table(struct ck *k, const struct qcow2_bitmap_info *b)
{
	struct qc_state *s = k->s;
	uint64_t tb = (uint64_t)b->table_size * 8, pos, i, e, off, chunk;

	ck_ref(k, b->table_offset, tb, "bitmap table");
	for (pos = 0; pos < tb; pos += chunk) {
		chunk = tb - pos < s->cluster_size ? tb - pos : s->cluster_size;
		if (qc_co_pread_clamped(s->file, b->table_offset + pos, k->buf, chunk)) {
			k->r->check_errors++;
			return 0;
		}
		for (i = 0; i < chunk; i += 8) {
			e = qc_rd64(k->buf + i);
			off = e & CK_BM_OFFSET;
			if ((e & CK_BM_RESERVED) || off % s->cluster_size ||
			    ((e & CK_BM_ALL_ONES) && off))
				ck_error(k, false, "ERROR bitmap '%.64s': bad table entry 0x%llx",
					 b->name, (unsigned long long)e);
			else if (off)
				ck_ref(k, off, s->cluster_size, "bitmap data cluster");
		}
	}
	return 0;
}

/* While the autoclear bit says the bitmaps are valid, their clusters are in
 * use (QEMU counts them; without this a repair would free them). */
static int ck_bitmaps(struct ck *k)
{
	struct qc_state *s = k->s;
	struct qcow2_bitmap_info *b;
	unsigned n, i;
	char err[160];

	if (!s->bmdir_bytes)
		return 0;
	ck_ref(k, s->bmdir_offset, s->bmdir_bytes, "bitmap directory");
	if (qc_bitmaps_read(s, &b, &n, err, sizeof(err))) {
		k->r->check_errors++;
		ck_say(k, "ERROR %s", err);
		snprintf(k->r->first_error, sizeof(k->r->first_error), "%s", err);
		return -EINVAL;
	}
	for (i = 0; i < n; i++)
		ck_bitmap_table(k, &b[i]);
	qcow2_bitmaps_free(b, n);
	return 0;
}

/* Refcount blocks, last (as QEMU counts them): one that anything else
 * holds too, or that two table entries name, is a corruption that only a
 * rebuild of the refcount structures repairs. */
static void ck_refblocks(struct ck *k)
{
	struct qc_state *s = k->s;
	uint64_t i, c;

	for (i = 0; i < s->rct_size; i++) {
		if (!s->rct[i])
			continue;
		ck_ref(k, s->rct[i], s->cluster_size, "refcount block");
		c = s->rct[i] >> s->cluster_bits;
		if (c < k->n && k->refs[c] != 1) {
			k->rb_bad = true;
			ck_error(k, false, "ERROR refcount block %llu refcount=%u",
				 (unsigned long long)i, k->refs[c]);
		}
	}
}

/* Does the refcount block of table entry t overlap a fixed table? What it
 * overlaps goes to what[len]. */
static bool ck_rb_overlaps(const struct ck *k, uint64_t t, char *what, size_t len)
{
	return qc_meta_overlap(k->s, QC_OL_FIXED, k->s->rct[t], k->s->cluster_size, what, len);
}

/* A refcount block that is also a table is reported, not used. */
static bool ck_rb_bad(struct ck *k, uint64_t t)
{
	char what[96];

	if (!ck_rb_overlaps(k, t, what, sizeof(what)))
		return false;
	ck_error(k, false,
		 "ERROR refcount block 0x%llx (refcount table entry %llu) overlaps the %s",
		 (unsigned long long)k->s->rct[t], (unsigned long long)t, what);
	return true;
}

/* Compare and repair, for the clusters of the file only, as QEMU: the blocks
 * may claim refcounts far past its end (a table whose entries all name one
 * block claims them for entries x block entries clusters). */
/* Cluster c's refcount rc against want counted references: repaired where
 * the flags allow, reported as qemu-img check reports it. */
static void ck_compare_one(struct ck *k, uint64_t c, uint64_t rc, uint64_t want)
{
	bool leak = rc > want;

	if (!k->preview && (k->flags & (leak ? QCOW2_FIX_LEAKS : QCOW2_FIX_ERRORS)) &&
	    qc_rc_set(k->s, c, rc, want) == 0) {
		if (leak)
			k->r->leaks_fixed++;
		else
			k->r->corruptions_fixed++;
		ck_say(k, "Repairing cluster %llu refcount=%llu reference=%llu",
		       (unsigned long long)c, (unsigned long long)rc, (unsigned long long)want);
		return;
	}
	ck_error(k, leak, "%s cluster %llu refcount=%llu reference=%llu", leak ? "Leaked" : "ERROR",
		 (unsigned long long)c, (unsigned long long)rc, (unsigned long long)want);
}

/* Referenced clusters that no refcount block covers (refcount 0). */
static void ck_compare_uncovered(struct ck *k)
{
	struct qc_state *s = k->s;
	uint64_t c, t;

	for (c = 0; c < k->n; c++) {
		t = c >> s->rb_bits;
		if (!k->refs[c] || (t < s->rct_size && s->rct[t]))
			continue;
		k->r->image_end_offset = (c + 1) << s->cluster_bits;
		if (!k->preview && (k->flags & QCOW2_FIX_ERRORS) &&
		    qc_rc_update(s, c, k->refs[c]) == 0) {
			k->r->corruptions_fixed++;
			ck_say(k, "Repairing cluster %llu refcount=0 reference=%u",
			       (unsigned long long)c, k->refs[c]);
		} else {
			ck_error(k, false, "ERROR cluster %llu refcount=0 reference=%u",
				 (unsigned long long)c, k->refs[c]);
		}
	}
}

/* Compare and repair, for the clusters of the file only, as QEMU: the blocks
 * may claim refcounts far past its end (a table whose entries all name one
 * block claims them for entries x block entries clusters). With k->preview,
 * only report (and count nothing): QEMU reports every problem before it
 * repairs any. */
static int ck_compare(struct ck *k)
{
	struct qc_state *s = k->s;
	uint64_t c, rc, max = s->rct_size << s->rb_bits;
	int ret;

	if (max > k->n)
		max = k->n;
	for (c = 0; c < max; c++) {
		uint64_t want = k->refs[c];

		if (!s->rct[c >> s->rb_bits] || ck_rb_bad(k, c >> s->rb_bits)) {
			c |= (1ull << s->rb_bits) - 1;
			continue;
		}
		ret = qc_rc_get(s, c, &rc);
		if (ret)
			return ret;
		/* As QEMU: leaked clusters are in use too. */
		if (want || rc)
			k->r->image_end_offset = (c + 1) << s->cluster_bits;
		if (rc != want)
			ck_compare_one(k, c, rc, want);
	}
	ck_compare_uncovered(k);
	return 0;
}

/* A referenced cluster with refcount 0, or that no refcount block covers:
 * QEMU repairs that only by rebuilding the refcount structures, which only
 * -r all does; with -r leaks its check fails (exit 1) before it changes
 * anything, and so does ours, although ck_compare could fix such a cluster
 * in place. */
static int ck_needs_rebuild(struct ck *k, bool *rebuild)
{
	struct qc_state *s = k->s;
	char what[96];
	uint64_t c, rc, t;
	int ret;

	*rebuild = k->rb_bad;
	for (c = 0; !*rebuild && c < k->n; c++) {
		if (!k->refs[c])
			continue;
		t = c >> s->rb_bits;
		if (t >= s->rct_size || !s->rct[t]) {
			*rebuild = true;
			return 0;
		}
		if (ck_rb_overlaps(k, t, what, sizeof(what)))
			continue; /* a bad refcount block: reported by ck_compare */
		ret = qc_rc_get(s, c, &rc);
		if (ret)
			return ret;
		if (rc == 0) {
			*rebuild = true;
			return 0;
		}
	}
	return 0;
}

/* ---- COPIED flags of the active tables: set exactly when refcount == 1 ---- */

/* As QEMU does, the flag is compared with the stored refcount (repaired by
 * ck_compare first), so an unrepaired wrong refcount also counts as a wrong
 * flag. Refcounts that cannot be read were reported already: skipped. */
static bool ck_copied_ok(struct ck *k, uint64_t e, uint64_t off, bool data, uint64_t *rc)
{
	struct qc_state *s = k->s;
	uint64_t c = off >> s->cluster_bits, ti = c >> s->rb_bits;

	*rc = 1;
	if (data && s->data_external)
		return (e & QC_OFLAG_COPIED) != 0;
	*rc = 0;
	if (ti < s->rct_size && s->rct[ti] &&
	    (qc_meta_overlap(s, QC_OL_FIXED, s->rct[ti], s->cluster_size, NULL, 0) ||
	     qc_rc_get(s, c, rc)))
		return true;
	return !!(e & QC_OFLAG_COPIED) == (*rc == 1);
}

/* A wrong flag in entry e (L2 entry idx of a data cluster, or L1 entry idx
 * of an L2 table) of a cluster with refcount rc, in qemu-img's words. */
static void ck_copied_fix(struct ck *k, int ret, bool data, uint64_t idx, uint64_t e, uint64_t rc)
{
	bool fixed = k->fix_copied && ret == 0;
	char what[64];

	if (data)
		snprintf(what, sizeof(what), "data cluster: l2_entry=%llx", (unsigned long long)e);
	else
		snprintf(what, sizeof(what), "L2 cluster: l1_index=%llu l1_entry=%llx",
			 (unsigned long long)idx, (unsigned long long)e);
	if (fixed) {
		k->r->corruptions_fixed++;
		ck_say(k, "Repairing OFLAG_COPIED %s refcount=%llu", what, (unsigned long long)rc);
	} else {
		ck_error(k, false, "ERROR OFLAG_COPIED %s refcount=%llu", what,
			 (unsigned long long)rc);
	}
}

static void ck_copied_l2(struct ck *k, uint64_t l2off)
{
	struct qc_state *s = k->s;
	uint64_t i, e, off, rc;

	if (qc_co_pread_clamped(s->file, l2off, k->buf, s->cluster_size)) {
		k->r->check_errors++;
		return;
	}
	for (i = 0; i < qc_l2_entries(s); i++) {
		e = qc_rd64(k->buf + i * s->l2_entry_bytes);
		off = e & QC_OFFSET_MASK;
		if ((e & QC_OFLAG_COMPRESSED) || (!off && !(e & QC_OFLAG_COPIED)) ||
		    ck_copied_ok(k, e, off, true, &rc))
			continue;
		ck_copied_fix(k, k->fix_copied ? qc_l2_patch(s, l2off, i, e ^ QC_OFLAG_COPIED) : -1,
			      true, i, e, rc);
	}
}

static void ck_copied(struct ck *k)
{
	struct qc_state *s = k->s;
	struct qc_mslot *sl;
	uint64_t i, off, rc, e;
	char buf[160];

	/* -r leaks repairs the flags only when nothing else is wrong (QEMU:
	 * a wrong refcount must be repaired first). */
	k->fix_copied = (k->flags & QCOW2_FIX_ERRORS) ||
			((k->flags & QCOW2_FIX_LEAKS) && !k->r->corruptions && !k->r->leaks &&
			 !k->r->check_errors);
	for (i = 0; i < s->l1_size; i++) {
		off = s->l1[i] & QC_OFFSET_MASK;
		/* Never patch what is not surely an L2 table. */
		if (!off || qc_l1e_problem(s, s->l1[i], QC_OL_ALL & ~QC_OL_L2, buf, sizeof(buf)) ||
		    (off >> s->cluster_bits) >= k->n)
			continue;
		if (!ck_copied_ok(k, s->l1[i], off, false, &rc)) {
			e = s->l1[i];
			if (k->fix_copied) {
				pthread_mutex_lock(&s->lock);
				s->l1[i] ^= QC_OFLAG_COPIED;
				s->l1_dirty[i / QC_TABLE_CHUNK] = 1;
				pthread_mutex_unlock(&s->lock);
			}
			ck_copied_fix(k, 0, false, i, e, rc);
		}
		/* A table that several entries name is looked at once. */
		sl = qc_mset_lookup(&k->act, off >> s->cluster_bits);
		if (sl && sl->rbf == i)
			ck_copied_l2(k, off);
	}
}

/* Everything repaired on disk, refcount blocks too (lazy refcounts keep
 * them in the cache until close otherwise). */
static int ck_writeback_all(struct qc_state *s)
{
	int ret = qc_metadata_writeback(s, true);

	if (!ret && s->rbc.ndirty) {
		ret = qc_cache_writeback(s, &s->rbc);
		if (!ret)
			ret = qc_co_flush(s->file);
	}
	return ret;
}

static int ck_run(struct ck *k)
{
	struct qc_state *s = k->s;
	int ret;

	ret = qc_metadata_writeback(s, true);
	if (!ret && (s->dec_new.n || s->dec_wait.n)) {
		ret = qc_decref_process(s);
		if (!ret)
			ret = qc_decref_process(s);
		if (!ret)
			ret = qc_metadata_writeback(s, true);
	}
	if (ret)
		return ret;
	k->n = qc_align_up(s->file->size, s->cluster_size) >> s->cluster_bits;
	if (k->n > CK_MAX_CLUSTERS)
		return -EFBIG;
	k->refs = calloc(k->n + 1, sizeof(*k->refs));
	k->buf = qc_alloc_buf(s->cluster_size);
	if (!k->refs || !k->buf)
		return -ENOMEM;
	k->r->total_clusters = (s->h.size + s->cluster_size - 1) >> s->cluster_bits;
	ck_fixed_meta(k);
	ret = ck_l1(k);
	if (!ret)
		ret = ck_snapshots(k);
	if (!ret)
		ret = ck_bitmaps(k);
	if (!ret)
		ck_refblocks(k);
	if (!ret && k->flags) {
		k->preview = true;
		ret = ck_compare(k);
		k->preview = false;
	}
	if (!ret && k->flags && !(k->flags & QCOW2_FIX_ERRORS)) {
		bool rebuild;

		ret = ck_needs_rebuild(k, &rebuild);
		if (!ret && rebuild) {
			k->r->check_errors++;
			ck_say(k, "ERROR need to rebuild refcount structures");
			snprintf(k->r->first_error, sizeof(k->r->first_error),
				 "need to rebuild refcount structures");
			return -EIO;
		}
	}
	if (!ret)
		ret = ck_compare(k);
	if (!ret)
		ck_copied(k);
	if (!ret && (k->r->leaks_fixed || k->r->corruptions_fixed))
		ret = ck_writeback_all(s);
	return ret;
}

struct ck_ctx {
	struct qc_state *s;
	int flags;
	struct qcow2_check_result *r;
	qcow2_check_report_fn *report;
	void *opaque;
};

/* One pass; reports to c's hook unless silent (a repair's verification). */
static int ck_pass(const struct ck_ctx *c, int flags, struct qcow2_check_result *r, bool silent)
{
	struct ck k = {.s = c->s, .r = r, .flags = flags};
	int ret;

	if (!silent) {
		k.report = c->report;
		k.report_opaque = c->opaque;
	}
	memset(r, 0, sizeof(*r));
	ret = ck_run(&k);
	free(k.refs);
	free(k.buf);
	qc_mset_free(&k.act);
	qc_mset_free(&k.snap);
	return ret;
}

/* QEMU's qcow2_mark_clean and qcow2_mark_consistent: the repaired metadata
 * is on disk before the dirty and corrupt bits go. */
static int ck_mark_consistent(struct qc_state *s)
{
	const uint64_t bits = QC_INCOMPAT_DIRTY | QC_INCOMPAT_CORRUPT;
	int ret;

	if (!(s->h.incompat & bits))
		return 0;
	ret = ck_writeback_all(s);
	if (!ret)
		ret = qc_header_write_features(s, s->h.incompat & ~bits, s->h.autoclear);
	if (!ret)
		s->hdr_dirty_set = false;
	return ret;
}

/* Repair; the image is consistent when no corruption or check error is
 * left (leaks are harmless), and a repair that changed something is
 * verified by a second pass before the bits are cleared. A corruption found
 * on the way (qc_corrupt sets s->corrupt again) keeps them. */
static int ck_repair(struct ck_ctx *c, bool *consistent)
{
	struct qcow2_check_result v;
	int ret = ck_pass(c, c->flags, c->r, false);

	if (ret || c->r->corruptions || c->r->check_errors || c->s->corrupt)
		return ret;
	if (c->r->leaks_fixed || c->r->corruptions_fixed) {
		ret = ck_pass(c, 0, &v, true);
		if (ret || v.corruptions || v.check_errors || c->s->corrupt)
			return ret;
	}
	ret = ck_mark_consistent(c->s);
	*consistent = ret == 0;
	return ret;
}

static int ck_co(void *arg)
{
	struct ck_ctx *c = arg;
	struct qc_state *s = c->s;
	bool corrupt = s->corrupt, consistent = false;
	int ret;

	qc_co_lock(s, &s->meta);
	if (!c->flags) {
		ret = ck_pass(c, 0, c->r, false);
	} else {
		/* A corrupt image (opened with repair=on) is written by the
		 * repair only: no request is in flight during a check. */
		__atomic_store_n(&s->corrupt, false, __ATOMIC_RELEASE);
		ret = ck_repair(c, &consistent);
		if (!consistent && (corrupt || (s->h.incompat & QC_INCOMPAT_CORRUPT)))
			__atomic_store_n(&s->corrupt, true, __ATOMIC_RELEASE);
	}
	qc_co_unlock(s, &s->meta);
	return ret;
}

int qcow2_check(struct blk_node *bs, int repair_flags, struct qcow2_check_result *r)
{
	return qcow2_check_report(bs, repair_flags, r, NULL, NULL);
}

int qcow2_check_report(struct blk_node *bs, int repair_flags, struct qcow2_check_result *r,
		       qcow2_check_report_fn *report, void *opaque)
{
	struct ck_ctx c = {qcow2_is(bs) ? qc_state(bs) : NULL, repair_flags, r, report, opaque};

	memset(r, 0, sizeof(*r));
	if (!c.s)
		return -EINVAL;
	if (repair_flags && bs->read_only)
		return -EROFS;
	return qc_run_sync(ck_co, &c);
}
