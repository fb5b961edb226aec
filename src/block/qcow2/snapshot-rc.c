/* qcow2 internal snapshots: the reference walk (what QEMU calls updating the
 * snapshot refcounts) and the snapshot table writer.
 *
 * Threading: a coroutine holding s->meta, the node drained (no request in
 * flight: the tables change under the fast path's feet otherwise). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"
#include "block/qcow2/snapshot-int.h"

/* One refcount change of the walk: 1 once the limit is reached (stop). */
static int qsr_update(struct qc_state *s, struct qc_walk *w, uint64_t c)
{
	int ret;

	if (w->done == w->limit)
		return 1;
	ret = qc_rc_update(s, c, w->delta);
	if (!ret)
		w->done++;
	return ret;
}

/* Add delta to the refcounts of the clusters one L2 entry names (data and
 * compressed clusters; none with an external data file, whose clusters
 * have no refcount). */
static int qsr_entry_refs(struct qc_state *s, struct qc_walk *w, uint64_t e)
{
	uint64_t off, len, c, last;
	int ret = 0;

	if (!w->delta || s->data_external)
		return 0;
	if (e & QC_OFLAG_COMPRESSED) {
		qc_comp_desc(s, e, &off, &len);
		last = (off + len - 1) >> s->cluster_bits;
		for (c = off >> s->cluster_bits; c <= last && !ret; c++)
			ret = qsr_update(s, w, c);
		return ret;
	}
	off = e & QC_OFFSET_MASK;
	return off ? qsr_update(s, w, off >> s->cluster_bits) : 0;
}

/* The entry with COPIED exactly when the cluster it names has refcount 1. */
static int qsr_fix_copied(struct qc_state *s, uint64_t e, uint64_t *ne)
{
	uint64_t off = e & QC_OFFSET_MASK, rc = 0;
	int ret;

	*ne = e;
	if ((e & QC_OFLAG_COMPRESSED) || !off || s->data_external)
		return 0;
	ret = qc_rc_get(s, off >> s->cluster_bits, &rc);
	if (!ret)
		*ne = rc == 1 ? e | QC_OFLAG_COPIED : e & ~QC_OFLAG_COPIED;
	return ret;
}

/* One slice of an L2 table (first guest cluster gc0). */
static int qsr_slice(struct qc_state *s, uint64_t key, uint64_t gc0, struct qc_walk *w)
{
	unsigned n = (1u << s->l2c.slice_bits) / s->l2_entry_bytes, i;
	uint64_t e, bm, ne;
	struct qc_slot *sl;
	int ret;

	sl = qc_cache_get(s, &s->l2c, key, false, &ret);
	if (!sl)
		return ret;
	for (i = 0; i < n && !ret; i++) {
		uint8_t *p = sl->data + (size_t)i * s->l2_entry_bytes;

		e = qc_rd64(p);
		bm = s->ext_l2 ? qc_rd64(p + 8) : 0;
		if (!e)
			continue;
		ret = qc_entry_check(s, gc0 + i, e, bm, QC_OL_FIXED);
		if (!ret)
			ret = qsr_entry_refs(s, w, e);
		if (!ret && w->fix)
			ret = qsr_fix_copied(s, e, &ne);
		if (!ret && w->fix && ne != e) {
			pthread_mutex_lock(&s->lock);
			qc_wr64(p, ne);
			pthread_mutex_unlock(&s->lock);
			qc_cache_mark_dirty(s, &s->l2c, sl);
		}
	}
	return ret;
}

static int qsr_l2(struct qc_state *s, uint64_t l1i, uint64_t l2off, struct qc_walk *w)
{
	uint64_t per = 1ull << (s->l2c.slice_bits - (s->l2_entry_bytes == 16 ? 4 : 3));
	uint64_t nslices = s->cluster_size >> s->l2c.slice_bits, j;
	int ret = 0;

	for (j = 0; j < nslices && !ret; j++)
		ret = qsr_slice(s, l2off + (j << s->l2c.slice_bits), (l1i << s->l2_bits) + j * per,
				w);
	return ret;
}

int qc_snap_walk(struct qc_state *s, uint64_t *l1, uint32_t n, int delta, bool fix)
{
	struct qc_walk w = {.delta = delta, .fix = fix, .limit = UINT64_MAX};

	return qc_snap_walk_w(s, l1, n, &w);
}

int qc_snap_walk_w(struct qc_state *s, uint64_t *l1, uint32_t n, struct qc_walk *w)
{
	uint64_t off, ne, rc;
	char buf[160];
	const char *why;
	uint32_t i;
	int ret = 0;

	for (i = 0; i < n && !ret; i++) {
		off = l1[i] & QC_OFFSET_MASK;
		if (!off)
			continue;
		why = qc_l1e_problem(s, l1[i], QC_OL_FIXED, buf, sizeof(buf));
		if (why)
			return qc_corrupt(s, "L2 table offset 0x%llx (L1 entry %u) %s",
					  (unsigned long long)off, i, why);
		ret = qsr_l2(s, i, off, w);
		if (!ret && w->delta)
			ret = qsr_update(s, w, off >> s->cluster_bits);
		if (!ret && w->delta < 0 && qc_rc_get(s, off >> s->cluster_bits, &rc) == 0 && !rc)
			qc_cache_forget(s, &s->l2c, off, s->cluster_size);
		if (!ret && w->fix) {
			ret = qsr_fix_copied(s, l1[i], &ne);
			if (!ret && ne != l1[i] && l1 == s->l1) {
				pthread_mutex_lock(&s->lock);
				s->l1[i] = ne;
				s->l1_dirty[i / QC_TABLE_CHUNK] = 1;
				s->metadata_changed = true;
				pthread_mutex_unlock(&s->lock);
			}
		}
	}
	return ret > 0 ? 0 : ret;
}

int qc_snap_free_clusters(struct qc_state *s, uint64_t off, uint64_t bytes)
{
	uint64_t c, n = qc_align_up(bytes, s->cluster_size) >> s->cluster_bits;
	int ret = 0;

	for (c = 0; c < n && off && !ret; c++)
		ret = qc_rc_update(s, (off >> s->cluster_bits) + c, -1);
	return ret;
}

int qc_snap_rc_durable(struct qc_state *s)
{
	int ret = qc_cache_writeback(s, &s->rbc);

	if (!ret && qc_rct_is_dirty(s)) {
		ret = qc_co_flush(s->file);
		if (!ret)
			ret = qc_rct_write_dirty(s);
	}
	return ret ? ret : qc_co_flush(s->file);
}

/* ---- the table ---- */

#define QSR_EXTRA 24 /* vm_state_size_large, disk_size, icount */

static uint64_t qsr_entry_len(const struct qc_snapshot *sn)
{
	return qc_align_up(40 + QSR_EXTRA + sn->extra_more_len + strlen(sn->id) + strlen(sn->name),
			   8);
}

static void qsr_encode(const struct qc_snapshot *sn, uint8_t *p)
{
	size_t idl = strlen(sn->id), nml = strlen(sn->name);

	qc_wr64(p, sn->l1_offset);
	qc_wr32(p + 8, sn->l1_size);
	p[12] = (uint8_t)(idl >> 8);
	p[13] = (uint8_t)idl;
	p[14] = (uint8_t)(nml >> 8);
	p[15] = (uint8_t)nml;
	qc_wr32(p + 16, sn->date_sec);
	qc_wr32(p + 20, sn->date_nsec);
	qc_wr64(p + 24, sn->vm_clock_nsec);
	qc_wr32(p + 32, sn->vm_state_size > UINT32_MAX ? 0 : (uint32_t)sn->vm_state_size);
	qc_wr32(p + 36, QSR_EXTRA + sn->extra_more_len);
	qc_wr64(p + 40, sn->vm_state_size);
	qc_wr64(p + 48, sn->disk_size);
	qc_wr64(p + 56, sn->icount);
	if (sn->extra_more_len)
		memcpy(p + 64, sn->extra_more, sn->extra_more_len);
	p += sn->extra_more_len;
	memcpy(p + 64, sn->id, idl);
	memcpy(p + 64 + idl, sn->name, nml);
}

/* Write a new table in new clusters, make it durable, switch the header to
 * it (count and offset: one 12-byte write), then free the old one. */
int qc_snap_table_write(struct qc_state *s, const struct qc_snapshot *v, uint32_t n)
{
	uint64_t bytes = 0, pos = 0, off = 0, old = s->snap_offset, oldb = s->snap_bytes;
	uint8_t *buf = NULL, h[12];
	bool fresh;
	uint32_t i;
	int ret = 0;

	for (i = 0; i < n; i++)
		bytes += qsr_entry_len(&v[i]);
	if (bytes > QC_MAX_SNAPSHOTS_BYTES)
		return -EFBIG;
	if (bytes) {
		buf = qc_alloc_buf(qc_align_up(bytes, s->cluster_size));
		if (!buf)
			return -ENOMEM;
		memset(buf, 0, qc_align_up(bytes, s->cluster_size));
		for (i = 0; i < n; pos += qsr_entry_len(&v[i]), i++)
			qsr_encode(&v[i], buf + pos);
		ret = qc_alloc_clusters(s, qc_align_up(bytes, s->cluster_size) >> s->cluster_bits,
					&off, &fresh);
		if (!ret)
			ret = qc_co_pwrite(s->file, off, buf, qc_align_up(bytes, s->cluster_size));
		free(buf);
	}
	if (!ret)
		ret = qc_snap_rc_durable(s); /* the table's refcounts, with the table */
	qc_wr32(h, n);
	qc_wr64(h + 4, off);
	if (!ret)
		ret = qc_header_write_field(s, 60, h, 12);
	if (!ret)
		ret = qc_co_flush(s->file);
	if (ret)
		return ret;
	pthread_mutex_lock(&s->lock);
	qc_mset_del(s, old, oldb, QC_OL_SNAPT);
	ret = qc_mset_add(s, off, bytes, QC_OL_SNAPT);
	s->snap_offset = s->h.snapshots_offset = off;
	s->snap_bytes = bytes;
	s->h.nb_snapshots = n;
	pthread_mutex_unlock(&s->lock);
	if (!ret)
		ret = qc_snap_free_clusters(s, old, oldb);
	return ret;
}

/* ---- in-memory list ---- */

int qc_snap_l1_load(struct qc_state *s, const struct qc_snapshot *sn, uint32_t size, uint64_t **out)
{
	uint64_t *l1 = calloc(size ? size : 1, 8), bytes = (uint64_t)sn->l1_size * 8, i;
	uint8_t *buf = qc_alloc_buf(bytes ? bytes : 8);
	int ret = l1 && buf ? 0 : -ENOMEM;

	if (!ret && bytes)
		ret = qc_co_pread_clamped(s->file, sn->l1_offset, buf, bytes);
	for (i = 0; !ret && i < sn->l1_size; i++) {
		l1[i] = qc_rd64(buf + i * 8) & ~QC_OFLAG_COPIED;
		if (l1[i] & QC_L1E_RESERVED)
			ret = qc_corrupt(s, "L1 entry %llu of snapshot '%s' has reserved bits set",
					 (unsigned long long)i, sn->id);
	}
	free(buf);
	if (ret)
		free(l1);
	*out = ret ? NULL : l1;
	return ret;
}

int qc_snap_list_set(struct qc_state *s, struct qc_snapshot *v, uint32_t n)
{
	struct qc_snapshot *old = s->snaps;
	uint32_t oldn = s->nsnaps, i;
	int ret;

	pthread_mutex_lock(&s->lock);
	s->snaps = v;
	s->nsnaps = n;
	ret = qc_snap_ranges_reset(s);
	pthread_mutex_unlock(&s->lock);
	for (i = 0; i < oldn; i++) {
		bool kept = false;

		for (uint32_t j = 0; j < n && !kept; j++)
			kept = v[j].id == old[i].id;
		if (!kept) {
			free(old[i].id);
			free(old[i].name);
			free(old[i].extra_more);
		}
	}
	free(old);
	return ret;
}
