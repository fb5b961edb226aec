/* qcow2 internal snapshots: create, apply (revert to) and delete, in the
 * order QEMU uses, so that a crash at any moment leaves at worst leaked
 * clusters:
 *   create: L1 copy written and its refcount durable; every cluster the
 *           active L1 references gets one reference more, COPIED flags
 *           cleared (refcount blocks, L2 and L1 tables written, then
 *           flushed); then a new snapshot table and the header switched to
 *           it.
 *   delete: the table without the entry and the header first; then the
 *           snapshot's references dropped, its L1 freed, COPIED set again
 *           where the active image is alone.
 *   apply:  references of the snapshot's tables incremented and durable,
 *           a copy of its L1 written in new clusters and the header switched
 *           to it (one 12-byte write); then the old active state's
 *           references dropped.
 * Between the refcount and the COPIED updates the two disagree; on version 3
 * images the dirty bit is set meanwhile, so an open after a crash repairs it
 * (QEMU and ioplane both do).
 *
 * Threading: the public functions are synchronous (qcow2.h): main thread or
 * a loop thread, no request in flight on the node. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"
#include "block/qcow2/snapshot-int.h"

struct qso_ctx {
	struct qc_state *s;
	const struct qcow2_snapshot_params *p;
	long idx;
	struct qcow2_snapshot_info *out;
	char *err;
	size_t errlen;
};

static int qso_err(struct qso_ctx *c, int ret, const char *fmt, const char *arg)
{
	snprintf(c->err, c->errlen, fmt, arg);
	return ret;
}

/* Everything in the caches on disk and deferred frees done (as at close). */
static int qso_settle(struct qc_state *s)
{
	int ret = qc_metadata_writeback(s, true);

	for (int i = 0; i < 2 && !ret && (s->dec_new.n || s->dec_wait.n); i++) {
		ret = qc_decref_process(s);
		if (!ret)
			ret = qc_metadata_writeback(s, true);
	}
	return ret;
}

static int qso_begin(struct qso_ctx *c)
{
	struct qc_state *s = c->s;

	if (s->read_only || s->bs->read_only)
		return qso_err(c, -EROFS, "%s", "the image is read-only");
	if (s->corrupt)
		return qso_err(c, -EIO, "%s", "the image is marked corrupt");
	if (s->data_external)
		return qso_err(c, -ENOTSUP, "%s",
			       "internal snapshots are not supported with an external data file");
	return qso_settle(s);
}

/* The dirty bit covers the moments when refcounts and COPIED disagree. */
static int qso_dirty(struct qc_state *s)
{
	return qc_header_mark_dirty(s);
}

/* After a walk: refcount blocks, L2 tables and L1 written back-to-back,
 * then one flush. Which of them reaches the disk first does not matter
 * (before the header names a new state, a mismatch is a flag check -r
 * fixes and never a shared cluster written in place), so no flush stands
 * between them: a kill lands between their writes only in a window of a
 * few system calls. New refcount blocks are durable before the refcount
 * table names them, as always. */
static int qso_meta_out(struct qc_state *s)
{
	int ret = qc_cache_writeback(s, &s->rbc);

	if (!ret && qc_rct_is_dirty(s)) {
		ret = qc_co_flush(s->file);
		if (!ret)
			ret = qc_rct_write_dirty(s);
	}
	if (!ret)
		ret = qc_cache_writeback(s, &s->l2c);
	if (!ret && qc_table_is_dirty(s->l1_dirty, s->l1_size))
		ret = qc_l1_write_dirty(s);
	return ret ? ret : qc_co_flush(s->file);
}

static int qso_end(struct qc_state *s, int ret)
{
	if (!ret)
		ret = qso_meta_out(s);
	if (!ret && !s->lazy && s->hdr_dirty_set)
		ret = qc_header_mark_clean(s);
	return ret;
}

/* A walk over the active L1 that fails half-way (a refcount at its
 * maximum) is undone: the references it counted are dropped again and
 * COPIED made to agree, so that nothing changed (QEMU leaks them). */
static int qso_walk_active(struct qc_state *s, int delta)
{
	struct qc_walk w = {.delta = delta, .fix = true, .limit = UINT64_MAX};
	int ret = qc_snap_walk_w(s, s->l1, s->l1_size, &w);

	if (ret && ret != -EIO) {
		struct qc_walk u = {.delta = -delta, .limit = w.done};

		if (!qc_snap_walk_w(s, s->l1, s->l1_size, &u))
			qc_snap_walk(s, s->l1, s->l1_size, 0, true);
	}
	return ret;
}

/* ---- create ---- */

/* QEMU's: one more than the largest number an id starts with. */
static char *qso_next_id(const struct qc_state *s)
{
	unsigned long long max = 0, v;
	char buf[24];

	for (uint32_t i = 0; i < s->nsnaps; i++) {
		v = strtoull(s->snaps[i].id, NULL, 10);
		if (v > max)
			max = v;
	}
	snprintf(buf, sizeof(buf), "%llu", max + 1);
	return strdup(buf);
}

/* The L1 copy, in new clusters, durable with its refcounts. */
static int qso_l1_copy(struct qc_state *s, const uint64_t *l1, uint32_t n, uint64_t *off)
{
	uint64_t bytes = qc_align_up((uint64_t)n * 8, s->cluster_size);
	uint8_t *buf;
	bool fresh;
	int ret;

	*off = 0;
	if (!n)
		return 0;
	buf = qc_alloc_buf(bytes);
	if (!buf)
		return -ENOMEM;
	memset(buf, 0, bytes);
	for (uint32_t i = 0; i < n; i++)
		qc_wr64(buf + (uint64_t)i * 8, l1[i] & ~QC_OFLAG_COPIED);
	ret = qc_alloc_clusters(s, bytes >> s->cluster_bits, off, &fresh);
	if (!ret)
		ret = qc_co_pwrite(s->file, *off, buf, bytes);
	free(buf);
	if (!ret)
		ret = qc_co_flush(s->file);
	return ret ? ret : qc_snap_rc_durable(s);
}

static int qso_new_entry(struct qso_ctx *c, struct qc_snapshot *sn)
{
	const struct qcow2_snapshot_params *p = c->p;
	struct qc_state *s = c->s;

	memset(sn, 0, sizeof(*sn));
	sn->id = p->id ? strdup(p->id) : qso_next_id(s);
	sn->name = strdup(p->name);
	if (!sn->id || !sn->name)
		return -ENOMEM;
	for (uint32_t i = 0; i < s->nsnaps; i++)
		if (!strcmp(s->snaps[i].id, sn->id))
			return qso_err(c, -EEXIST, "a snapshot with id '%s' exists", sn->id);
	sn->l1_size = s->l1_size;
	sn->date_sec = p->date_sec;
	sn->date_nsec = p->date_nsec;
	sn->vm_clock_nsec = p->vm_clock_nsec;
	sn->icount = p->icount;
	sn->disk_size = s->h.size;
	return 0;
}

static int qso_create_co(void *arg)
{
	struct qso_ctx *c = arg;
	struct qc_state *s = c->s;
	struct qc_snapshot *v = NULL, sn = {0};
	int ret;

	qc_co_lock(s, &s->meta);
	ret = qso_begin(c);
	if (!ret && s->nsnaps >= QC_MAX_SNAPSHOTS)
		ret = qso_err(c, -EFBIG, "%s", "too many snapshots");
	/* QEMU fails the same way, having leaked a cluster. */
	if (!ret && s->rc_max < 2)
		ret = qso_err(c, -EINVAL, "%s", "1-bit refcounts cannot count a snapshot");
	if (!ret)
		ret = qso_new_entry(c, &sn);
	if (!ret)
		ret = qso_l1_copy(s, s->l1, s->l1_size, &sn.l1_offset);
	if (!ret)
		ret = qso_dirty(s);
	if (!ret)
		ret = qso_walk_active(s, 1);
	if (!ret)
		ret = qso_meta_out(s);
	if (!ret && !(v = calloc(s->nsnaps + 1, sizeof(*v))))
		ret = -ENOMEM;
	if (!ret) {
		if (s->nsnaps)
			memcpy(v, s->snaps, s->nsnaps * sizeof(*v));
		v[s->nsnaps] = sn;
		ret = qc_snap_table_write(s, v, s->nsnaps + 1);
	}
	if (!ret) {
		ret = qc_snap_list_set(s, v, s->nsnaps + 1);
		v = NULL;
		sn.id = sn.name = NULL;
	} else if (sn.l1_offset && !s->corrupt) { /* not in a table: no longer needed */
		qc_snap_free_clusters(s, sn.l1_offset, (uint64_t)sn.l1_size * 8);
		qso_end(s, 0);
	}
	ret = qso_end(s, ret);
	qc_co_unlock(s, &s->meta);
	free(v);
	free(sn.id);
	free(sn.name);
	return ret;
}

/* ---- delete ---- */

static int qso_delete_co(void *arg)
{
	struct qso_ctx *c = arg;
	struct qc_state *s = c->s;
	struct qc_snapshot *v, sn;
	uint64_t *l1 = NULL;
	uint32_t n = s->nsnaps - 1;
	bool moved = false;
	int ret;

	qc_co_lock(s, &s->meta);
	ret = qso_begin(c);
	sn = s->snaps[c->idx];
	if (!ret)
		ret = qc_snap_l1_load(s, &sn, sn.l1_size, &l1);
	v = calloc(n ? n : 1, sizeof(*v));
	if (!ret && !v)
		ret = -ENOMEM;
	if (!ret) {
		memcpy(v, s->snaps, (size_t)c->idx * sizeof(*v));
		memcpy(v + c->idx, s->snaps + c->idx + 1, (size_t)(n - c->idx) * sizeof(*v));
		ret = qc_snap_table_write(s, v, n);
	}
	if (!ret) {
		/* The strings live on in sn until the reply is made. */
		s->snaps[c->idx].id = s->snaps[c->idx].name = NULL;
		moved = true;
		ret = qc_snap_list_set(s, v, n);
		v = NULL;
		if (c->out) {
			c->out->id = sn.id;
			c->out->name = sn.name;
			sn.id = sn.name = NULL;
		}
	}
	if (!ret)
		ret = qso_dirty(s);
	if (!ret)
		ret = qc_snap_walk(s, l1, sn.l1_size, -1, false);
	if (!ret)
		ret = qc_snap_free_clusters(s, sn.l1_offset, (uint64_t)sn.l1_size * 8);
	if (!ret)
		ret = qc_snap_walk(s, s->l1, s->l1_size, 0, true);
	ret = qso_end(s, ret);
	qc_co_unlock(s, &s->meta);
	free(v);
	if (moved) {
		free(sn.id);
		free(sn.name);
	}
	free(l1);
	return ret;
}

/* ---- apply ---- */

/* Switch the active L1 to l1 (n entries): written in new clusters, the
 * header switched; the old table's clusters freed. */
static int qso_l1_switch(struct qc_state *s, uint64_t *l1, uint32_t n)
{
	uint64_t off = 0, oldoff = s->l1_offset, oldbytes = (uint64_t)s->l1_size * 8, i;
	uint8_t *dirty = calloc((uint64_t)n * 8 / 4096 + 2, 1), h[12];
	int ret = dirty ? qso_l1_copy(s, l1, n, &off) : -ENOMEM;

	qc_wr32(h, n);
	qc_wr64(h + 4, off);
	if (!ret)
		ret = qc_header_write_field(s, 36, h, 12);
	if (!ret)
		ret = qc_co_flush(s->file);
	if (ret) {
		free(dirty);
		return ret;
	}
	pthread_mutex_lock(&s->lock);
	qc_mset_del(s, oldoff, oldbytes, QC_OL_L1);
	for (i = 0; i < s->l1_size; i++)
		if (s->l1[i] & QC_OFFSET_MASK)
			qc_mset_del(s, s->l1[i] & QC_OFFSET_MASK, s->cluster_size, QC_OL_L2);
	ret = qc_mset_add(s, off, (uint64_t)n * 8, QC_OL_L1);
	for (i = 0; i < n && !ret; i++)
		if ((l1[i] & QC_OFFSET_MASK) &&
		    (l1[i] & QC_OFFSET_MASK) < qc_align_up(s->file->size, s->cluster_size))
			ret = qc_mset_add(s, l1[i] & QC_OFFSET_MASK, s->cluster_size, QC_OL_L2);
	free(s->l1_dirty);
	s->l1 = l1;
	s->l1_dirty = dirty;
	s->l1_size = s->h.l1_size = n;
	s->l1_offset = s->h.l1_table_offset = off;
	pthread_mutex_unlock(&s->lock);
	return ret ? ret : qc_snap_free_clusters(s, oldoff, oldbytes);
}

static int qso_goto_co(void *arg)
{
	struct qso_ctx *c = arg;
	struct qc_state *s = c->s;
	const struct qc_snapshot *sn = &s->snaps[c->idx];
	uint32_t n = sn->l1_size > s->l1_size ? sn->l1_size : s->l1_size, oldn = s->l1_size;
	uint64_t *l1 = NULL, *old = s->l1;
	int ret;

	qc_co_lock(s, &s->meta);
	ret = qso_begin(c);
	if (!ret && sn->disk_size && sn->disk_size != s->h.size)
		ret = qso_err(c, -ENOTSUP, "%s",
			      "loading snapshots with a different disk size is not supported");
	if (!ret && (uint64_t)n * 8 > QC_MAX_L1_BYTES)
		ret = -EFBIG;
	if (!ret)
		ret = qc_snap_l1_load(s, sn, n, &l1);
	if (!ret)
		ret = qso_dirty(s);
	if (!ret)
		ret = qc_snap_walk(s, l1, n, 1, false);
	if (!ret)
		ret = qc_snap_rc_durable(s);
	if (!ret)
		ret = qso_l1_switch(s, l1, n);
	if (s->l1 == l1) /* switched: the old state's references go */
		l1 = NULL;
	if (!ret && s->l1 != old)
		ret = qc_snap_walk(s, old, oldn, -1, false);
	if (s->l1 != old)
		free(old);
	if (!ret)
		ret = qc_snap_walk(s, s->l1, s->l1_size, 0, true);
	ret = qso_end(s, ret);
	qc_co_unlock(s, &s->meta);
	free(l1);
	return ret;
}

/* ---- public ---- */

long qcow2_snapshot_find(struct blk_node *bs, const char *id, const char *name)
{
	const struct qc_state *s = qcow2_is(bs) ? bs->opaque : NULL;

	for (uint32_t i = 0; s && i < s->nsnaps; i++)
		if ((id || name) && (!id || !strcmp(s->snaps[i].id, id)) &&
		    (!name || !strcmp(s->snaps[i].name, name)))
			return i;
	return -ENOENT;
}

static int qso_run(struct blk_node *bs, int (*fn)(void *), struct qso_ctx *c)
{
	int ret;

	if (!qcow2_is(bs))
		return -ENOTSUP;
	c->s = bs->opaque;
	c->err[0] = 0;
	ret = qc_run_sync(fn, c);
	if (ret && !c->err[0])
		snprintf(c->err, c->errlen, "%s", strerror(-ret));
	return ret;
}

int qcow2_snapshot_create(struct blk_node *bs, const struct qcow2_snapshot_params *p, char *err,
			  size_t errlen)
{
	struct qso_ctx c = {.p = p, .err = err, .errlen = errlen};
	int ret;

	if (qcow2_is(bs) && (strlen(p->name) > 0xffff || (p->id && strlen(p->id) > 0xffff))) {
		snprintf(err, errlen, "snapshot name or id too long");
		return -EINVAL;
	}
	ret = qso_run(bs, qso_create_co, &c);
	return ret == -ERANGE ? -EINVAL : ret; /* a refcount at its maximum: QEMU's -EINVAL */
}

int qcow2_snapshot_goto(struct blk_node *bs, const char *id_or_name, char *err, size_t errlen)
{
	struct qso_ctx c = {.err = err, .errlen = errlen};

	c.idx = qcow2_snapshot_find(bs, id_or_name, NULL);
	if (c.idx < 0)
		c.idx = qcow2_snapshot_find(bs, NULL, id_or_name);
	if (qcow2_is(bs) && c.idx < 0) {
		snprintf(err, errlen, "%s", strerror(ENOENT));
		return -ENOENT;
	}
	return qso_run(bs, qso_goto_co, &c);
}

int qcow2_snapshot_delete(struct blk_node *bs, const char *id, const char *name,
			  struct qcow2_snapshot_info *out, char *err, size_t errlen)
{
	struct qso_ctx c = {.out = out, .err = err, .errlen = errlen};
	int ret;

	c.idx = qcow2_snapshot_find(bs, id, name);
	if (qcow2_is(bs) && c.idx < 0) {
		snprintf(err, errlen, "%s", strerror(ENOENT));
		return -ENOENT;
	}
	if (out && c.idx >= 0)
		qc_snap_info(&((struct qc_state *)bs->opaque)->snaps[c.idx], out);
	ret = qso_run(bs, qso_delete_co, &c);
	if (ret && out) { /* gone from the table perhaps, but a failure all the same */
		free(out->id);
		free(out->name);
		out->id = out->name = NULL;
	}
	return ret;
}
