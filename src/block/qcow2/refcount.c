/* qcow2 refcounts: entries of every width (1..64 bits), cluster allocation,
 * new refcount blocks and refcount table growth, growing the image file, and
 * deferred decrements (a reference is dropped on disk only after the metadata
 * that stopped using the cluster is durable, and a freed cluster is reused
 * only after writes that may still target it are done).
 *
 * Threading: everything here runs with s->meta held, except qc_wr_begin/end
 * (s->lock / atomics) which data writes use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"
#include "util/log.h"
#include "util/trace.h"

/* ---- raw entries in a slice ---- */

uint64_t qc_rc_get_raw(const struct qc_state *s, const uint8_t *p, uint64_t idx)
{
	unsigned bits = 1u << s->rc_order, shift;

	switch (s->rc_order) {
	case 3:
		return p[idx];
	case 4:
		return qc_rd16(p + idx * 2);
	case 5:
		return qc_rd32(p + idx * 4);
	case 6:
		return qc_rd64(p + idx * 8);
	default: /* sub-byte: bit 0 is the least significant bit */
		shift = (unsigned)((idx * bits) & 7);
		return (p[idx * bits / 8] >> shift) & ((1u << bits) - 1);
	}
}

void qc_rc_set_raw(const struct qc_state *s, uint8_t *p, uint64_t idx, uint64_t v)
{
	unsigned bits = 1u << s->rc_order, shift, mask;

	switch (s->rc_order) {
	case 3:
		p[idx] = (uint8_t)v;
		return;
	case 4:
		qc_wr16(p + idx * 2, (uint16_t)v);
		return;
	case 5:
		qc_wr32(p + idx * 4, (uint32_t)v);
		return;
	case 6:
		qc_wr64(p + idx * 8, v);
		return;
	default:
		shift = (unsigned)((idx * bits) & 7);
		mask = ((1u << bits) - 1) << shift;
		p[idx * bits / 8] = (uint8_t)((p[idx * bits / 8] & ~mask) | ((v << shift) & mask));
	}
}

/* ---- table and blocks ---- */

/* Why refcount table entry e cannot be followed (NULL: it can). */
static const char *qc_rct_problem(const struct qc_state *s, uint64_t e)
{
	if (e & QC_RCT_RESERVED)
		return "has reserved bits set";
	if (e & (s->cluster_size - 1))
		return "is not cluster aligned";
	if (e >= qc_align_up(s->file->size, s->cluster_size))
		return "is past the end of the file";
	if (e && e < s->cluster_size)
		return "is the header";
	return NULL;
}

int qc_rc_init(struct qc_state *s, char *err, size_t errlen)
{
	uint64_t bytes = s->rct_size * 8, i;
	uint8_t *buf = qc_alloc_buf(bytes);
	const char *why;
	int ret;

	s->rct = calloc(s->rct_size, 8);
	s->rct_dirty = calloc(s->rct_size / 512 + 1, 1);
	if (!buf || !s->rct || !s->rct_dirty) {
		free(buf);
		return -ENOMEM;
	}
	ret = qc_co_pread_clamped(s->file, s->rct_offset, buf, bytes);
	for (i = 0; ret == 0 && i < s->rct_size; i++) {
		uint64_t e = qc_rd64(buf + i * 8);

		why = qc_rct_problem(s, e);
		if (why) {
			snprintf(err, errlen,
				 "qcow2: refcount block offset 0x%llx (refcount table "
				 "entry %llu) %s",
				 (unsigned long long)e, (unsigned long long)i, why);
			ret = -EINVAL;
		}
		s->rct[i] = e;
		if (e)
			s->rct_used = i + 1;
	}
	free(buf);
	return ret;
}

/* A refcount block must not be any of the tables (checked at each use: the
 * tables move when they grow, and the comparisons cost nothing), nor, to be
 * written, any other metadata (which). */
static int qc_rb_check(struct qc_state *s, uint64_t ti, unsigned which)
{
	char what[96];

	if (!qc_meta_overlap(s, which, s->rct[ti], s->cluster_size, what, sizeof(what)))
		return 0;
	return qc_corrupt(s,
			  "refcount block offset 0x%llx (refcount table entry %llu) overlaps "
			  "the %s",
			  (unsigned long long)s->rct[ti], (unsigned long long)ti, what);
}

/* Key of the slice holding cluster c's refcount and its index there. */
static uint64_t qc_rc_key(const struct qc_state *s, uint64_t c, uint64_t *idx)
{
	unsigned per_slice_bits = s->rbc.slice_bits + 3 - s->rc_order;
	uint64_t in_block = c & ((1ull << s->rb_bits) - 1);
	uint64_t slice = in_block >> per_slice_bits;

	*idx = in_block & ((1ull << per_slice_bits) - 1);
	return s->rct[c >> s->rb_bits] + (slice << s->rbc.slice_bits);
}

int qc_rc_get(struct qc_state *s, uint64_t c, uint64_t *rc)
{
	uint64_t ti = c >> s->rb_bits, idx, key;
	struct qc_slot *sl;
	int ret;

	*rc = 0;
	if (ti >= s->rct_size || !s->rct[ti])
		return 0;
	ret = qc_rb_check(s, ti, QC_OL_FIXED);
	if (ret)
		return ret;
	key = qc_rc_key(s, c, &idx);
	sl = qc_cache_get(s, &s->rbc, key, false, &ret);
	if (sl)
		*rc = qc_rc_get_raw(s, sl->data, idx);
	return ret;
}

static int qc_rct_grow(struct qc_state *s, uint64_t ti);

/* Create the missing refcount block ti inside its own range (every cluster
 * there is free, its refcounts being zero), describing itself. The block is
 * durable before the table entry that points to it. */
static int qc_rb_create(struct qc_state *s, uint64_t ti, uint64_t r)
{
	uint64_t roff;
	uint8_t *buf;
	char what[96];
	int ret;

	if (ti >= s->rct_size)
		return qc_rct_grow(s, ti);
	if ((r >> s->rb_bits) != ti)
		r = ti << s->rb_bits;
	/* A hostile image may lack the block for the header or the tables. */
	while (qc_overlaps_fixed(s, r << s->cluster_bits, s->cluster_size))
		r++;
	if ((r >> s->rb_bits) != ti)
		return qc_corrupt(s, "no room for refcount block %llu: its range is all tables",
				  (unsigned long long)ti);
	roff = r << s->cluster_bits;
	/* Its refcount is zero (no block counts it): it must be unused. */
	if (qc_meta_overlap(s, QC_OL_ALL, roff, s->cluster_size, what, sizeof(what)))
		return qc_corrupt(s,
				  "new refcount block at 0x%llx would overwrite the %s, whose "
				  "refcount is zero",
				  (unsigned long long)roff, what);
	ret = qc_grow_file(s, s->file, roff + s->cluster_size);
	if (ret)
		return ret;
	pthread_mutex_lock(&s->lock);
	ret = qc_mset_add(s, roff, s->cluster_size, QC_OL_RB);
	pthread_mutex_unlock(&s->lock);
	if (ret)
		return ret;
	buf = qc_alloc_buf(s->cluster_size);
	if (!buf)
		return -ENOMEM;
	memset(buf, 0, s->cluster_size);
	qc_rc_set_raw(s, buf, r & ((1ull << s->rb_bits) - 1), 1);
	ret = qc_co_pwrite(s->file, roff, buf, s->cluster_size);
	free(buf);
	if (ret)
		return ret;
	/* The table entry goes out at writeback, after a flush that makes
	 * this block durable and before any L2 entry that needs it. */
	s->rct[ti] = roff;
	if (ti >= s->rct_used)
		s->rct_used = ti + 1;
	s->rct_dirty[ti / QC_TABLE_CHUNK] = 1;
	s->metadata_changed = true;
	if (roff + s->cluster_size > s->alloc_end)
		s->alloc_end = roff + s->cluster_size;
	if (roff + s->cluster_size > s->fresh_from)
		s->fresh_from = roff + s->cluster_size;
	return 0;
}

int qc_rc_update(struct qc_state *s, uint64_t c, int64_t delta)
{
	uint64_t ti = c >> s->rb_bits, idx, key, v;
	struct qc_slot *sl;
	int ret;

	if (ti >= s->rct_size || !s->rct[ti]) {
		if (delta < 0)
			return -EIO; /* dropping a reference that was never counted */
		ret = qc_rb_create(s, ti, c + 1);
		if (ret)
			return ret;
	}
	ret = qc_rb_check(s, ti, QC_OL_ALL & ~QC_OL_RB);
	if (ret)
		return ret;
	key = qc_rc_key(s, c, &idx);
	sl = qc_cache_get(s, &s->rbc, key, false, &ret);
	if (!sl)
		return ret;
	v = qc_rc_get_raw(s, sl->data, idx);
	/* (uint64_t)delta wraps: v + it is v - |delta| for delta < 0. */
	if ((delta < 0 && v < 0 - (uint64_t)delta) ||
	    (delta > 0 && s->rc_max - v < (uint64_t)delta)) {
		log_err("qcow2: refcount of cluster %llu would leave its range (%llu%+lld)",
			(unsigned long long)c, (unsigned long long)v, (long long)delta);
		return delta < 0 ? -EIO : -ERANGE;
	}
	v += (uint64_t)delta;
	/* Compressed data is appended to comp_next's cluster only while that
	 * cluster is surely still ours. */
	if (delta < 0 && s->comp_next && (s->comp_next >> s->cluster_bits) == c)
		s->comp_next = 0;
	qc_rc_set_raw(s, sl->data, idx, v);
	qc_cache_mark_dirty(s, &s->rbc, sl);
	if (v == 0 && c < s->free_index)
		s->free_index = c;
	if (v && ((c + 1) << s->cluster_bits) > s->alloc_end)
		s->alloc_end = (c + 1) << s->cluster_bits;
	return 0;
}

/* Set cluster c's refcount from rc to want (64-bit refcounts: the
 * difference may not fit a delta). */
int qc_rc_set(struct qc_state *s, uint64_t c, uint64_t rc, uint64_t want)
{
	uint64_t d = rc > want ? rc - want : want - rc, step;
	int ret = 0;

	while (d && !ret) {
		step = d > INT64_MAX ? INT64_MAX : d;
		ret = qc_rc_update(s, c, rc > want ? -(int64_t)step : (int64_t)step);
		d -= step;
	}
	return ret;
}

/* Refcounts at or past alloc_end are no one's: every reference an image may
 * hold is inside the file as opened, and alloc_end follows every refcount
 * set since. A block that claims such clusters in use (garbage, a leak
 * past the end after a crash, or a hostile image whose blocks say "all in
 * use" for terabytes) would make the search for free clusters scan all it
 * claims; they count as free instead, and get refcount 1 when allocated. */
static bool qc_rc_nobody(const struct qc_state *s, uint64_t c)
{
	return (c << s->cluster_bits) >= s->alloc_end;
}

/* One reference more for a cluster being allocated. */
static int qc_rc_claim(struct qc_state *s, uint64_t c)
{
	uint64_t rc = 0;
	int ret = 0;

	if (qc_rc_nobody(s, c))
		ret = qc_rc_get(s, c, &rc);
	if (ret || !rc)
		return ret ? ret : qc_rc_update(s, c, 1);
	if (!s->rc_garbage_seen)
		log_warn("qcow2: refcounts claim clusters past the end of the image (cluster %llu: "
			 "%llu); they are taken as free",
			 (unsigned long long)c, (unsigned long long)rc);
	s->rc_garbage_seen = true;
	ret = qc_rc_set(s, c, rc, 1);
	/* rc may have been 1 already: the cluster is ours now all the same. */
	if (!ret && ((c + 1) << s->cluster_bits) > s->alloc_end)
		s->alloc_end = (c + 1) << s->cluster_bits;
	return ret;
}

/* Write the table entries changed since the last time (meta held). */
int qc_rct_write_dirty(struct qc_state *s)
{
	return qc_table_write_dirty(s, s->rct, s->rct_size, s->rct_dirty, s->rct_offset);
}

bool qc_rct_is_dirty(const struct qc_state *s)
{
	return qc_table_is_dirty(s->rct_dirty, s->rct_size);
}

/* ---- refcount table growth ---- */

/* The new table goes after everything in use, followed by the refcount
 * blocks needed to describe itself and them. */
struct qc_grow {
	uint64_t a, k, m; /* table at cluster a, k clusters; m new blocks after it */
	uint64_t new_entries;
	uint64_t *tab;
};

static uint64_t qc_grow_missing(struct qc_state *s, struct qc_grow *g, uint64_t m)
{
	uint64_t first = g->a >> s->rb_bits, last = (g->a + g->k + m - 1) >> s->rb_bits, n = 0, t;

	for (t = first; t <= last; t++)
		if (t >= s->rct_size || !s->rct[t])
			n++;
	return n;
}

static int qc_grow_plan(struct qc_state *s, uint64_t ti, struct qc_grow *g)
{
	uint64_t per = s->cluster_size / 8, m = 0, n;
	char what[96];

	g->new_entries = qc_align_up(ti + 1 > s->rct_size * 2 ? ti + 1 : s->rct_size * 2, per);
	if (g->new_entries * 8 > QC_MAX_RCT_BYTES)
		return -EFBIG;
	g->k = g->new_entries / per;
	g->a = qc_align_up(s->alloc_end, s->cluster_size) >> s->cluster_bits;
	while ((n = qc_grow_missing(s, g, m)) != m)
		m = n;
	g->m = m;
	if (((g->a + g->k + m) >> s->rb_bits) >= g->new_entries)
		return -EFBIG;
	if (qc_meta_overlap(s, QC_OL_ALL, g->a << s->cluster_bits, (g->k + m) << s->cluster_bits,
			    what, sizeof(what)))
		return qc_corrupt(s, "the new refcount table at 0x%llx would overwrite the %s",
				  (unsigned long long)(g->a << s->cluster_bits), what);
	g->tab = calloc(g->new_entries, 8);
	return g->tab ? 0 : -ENOMEM;
}

/* Write the new blocks (refcounts of the table and of themselves). */
static int qc_grow_write_blocks(struct qc_state *s, struct qc_grow *g)
{
	uint64_t first = g->a >> s->rb_bits, b = g->a + g->k, t, c;
	uint8_t *buf = qc_alloc_buf(s->cluster_size);
	int ret = 0;

	if (!buf)
		return -ENOMEM;
	for (t = first; ret == 0 && t <= (g->a + g->k + g->m - 1) >> s->rb_bits; t++) {
		if (t < s->rct_size && s->rct[t])
			continue;
		memset(buf, 0, s->cluster_size);
		for (c = g->a; c < g->a + g->k + g->m; c++)
			if (c >> s->rb_bits == t)
				qc_rc_set_raw(s, buf, c & ((1ull << s->rb_bits) - 1), 1);
		g->tab[t] = b << s->cluster_bits;
		pthread_mutex_lock(&s->lock);
		ret = qc_mset_add(s, b << s->cluster_bits, s->cluster_size, QC_OL_RB);
		pthread_mutex_unlock(&s->lock);
		if (!ret)
			ret = qc_co_pwrite(s->file, b << s->cluster_bits, buf, s->cluster_size);
		b++;
	}
	free(buf);
	return ret;
}

static int qc_grow_switch(struct qc_state *s, struct qc_grow *g)
{
	uint64_t off = g->a << s->cluster_bits, i, old = s->rct_offset, oldn = s->rct_size;
	uint8_t *buf = qc_alloc_buf(g->new_entries * 8), h[12], *dirty;
	int ret;

	dirty = calloc(g->new_entries / 512 + 1, 1);
	if (!buf || !dirty) {
		free(buf);
		free(dirty);
		return -ENOMEM;
	}
	for (i = 0; i < g->new_entries; i++)
		qc_wr64(buf + i * 8, g->tab[i]);
	pthread_mutex_lock(&s->lock);
	ret = qc_mset_add(s, off, g->new_entries * 8, QC_OL_RCT);
	pthread_mutex_unlock(&s->lock);
	if (!ret)
		ret = qc_co_pwrite(s->file, off, buf, g->new_entries * 8);
	free(buf);
	/* Existing blocks may count some of the new clusters: on disk too. */
	if (!ret)
		ret = qc_cache_writeback(s, &s->rbc);
	if (!ret)
		ret = qc_co_flush(s->file);
	qc_wr64(h, off);
	qc_wr32(h + 8, (uint32_t)g->k);
	if (!ret)
		ret = qc_header_write_field(s, 48, h, 12);
	if (!ret)
		ret = qc_co_flush(s->file);
	if (ret) {
		free(dirty);
		return ret;
	}
	free(s->rct);
	free(s->rct_dirty);
	s->rct_dirty = dirty;
	s->rct = g->tab;
	g->tab = NULL;
	for (s->rct_used = g->new_entries; s->rct_used && !s->rct[s->rct_used - 1];)
		s->rct_used--;
	pthread_mutex_lock(&s->lock); /* the fast paths check against the table */
	qc_mset_del(s, old, oldn * 8, QC_OL_RCT);
	s->rct_size = g->new_entries;
	s->rct_offset = off;
	pthread_mutex_unlock(&s->lock);
	s->h.refcount_table_offset = off;
	s->h.refcount_table_clusters = (uint32_t)g->k;
	/* Nothing points to the old table any more. */
	for (i = 0; i < oldn * 8 / s->cluster_size; i++)
		qc_rc_update(s, (old >> s->cluster_bits) + i, -1);
	return 0;
}

static int qc_rct_grow(struct qc_state *s, uint64_t ti)
{
	struct qc_grow g = {0};
	uint64_t i, end;
	int ret;

	ret = qc_grow_plan(s, ti, &g);
	if (ret)
		goto out;
	memcpy(g.tab, s->rct, s->rct_size * 8);
	end = (g.a + g.k + g.m) << s->cluster_bits;
	ret = qc_grow_file(s, s->file, end);
	if (!ret)
		ret = qc_grow_write_blocks(s, &g);
	/* Clusters counted by blocks that already existed. */
	for (i = g.a; !ret && i < g.a + g.k + g.m; i++) {
		uint64_t t = i >> s->rb_bits;

		if (t < s->rct_size && s->rct[t])
			ret = qc_rc_claim(s, i);
	}
	if (!ret)
		ret = qc_grow_switch(s, &g);
	if (!ret) {
		if (end > s->alloc_end)
			s->alloc_end = end;
		if (end > s->fresh_from)
			s->fresh_from = end;
	}
out:
	free(g.tab);
	if (ret)
		log_err("qcow2: cannot grow the refcount table: %s", strerror(-ret));
	return ret == -EFBIG ? -ENOSPC : ret;
}

/* ---- allocation ---- */

/* Grow the file (on the thread pool: ftruncate may wait for in-flight
 * direct I/O) ahead of need, by an eighth of it (1 MiB .. 256 MiB), so that
 * data writes land inside the file: no size change, no zeroing of a gap
 * past EOF, no serialisation in the file system. The tail is cut back at
 * close. */
struct qc_trunc {
	struct blk_node *node;
	uint64_t size;
};

static int qc_trunc_run(void *arg)
{
	struct qc_trunc *t = arg;

	return t->node->drv->truncate ? t->node->drv->truncate(t->node, t->size) : -ENOTSUP;
}

int qc_grow_file(struct qc_state *s, struct blk_node *node, uint64_t need)
{
	struct qc_trunc t = {node, 0};
	uint64_t margin = need / 8, old = node->size;
	int ret;

	if (need <= node->size)
		return 0;
	if (margin < (1u << 20))
		margin = 1u << 20;
	if (margin > (256u << 20))
		margin = 256u << 20;
	t.size = qc_align_up(need + margin, s->cluster_size);
	ret = qc_co_blocking(qc_trunc_run, &t);
	if (ret == -ENOTSUP || ret == -EINVAL)
		return -ENOSPC;
	if (ret)
		return ret;
	/* ext4: allocate the new space as unwritten extents, so that data
	 * writes are overwrites that run in parallel (a write into a hole takes
	 * the inode lock exclusively). Best effort. */
	if (s->grow_alloc && node->has_write_zeroes)
		qc_co_op(node, BLK_OP_WRITE_ZEROES, old, node->size - old, BLK_F_NO_FALLBACK);
	if (node == s->file)
		s->file_size = node->size;
	if (node == s->data) {
		pthread_mutex_lock(&s->lock);
		s->fwd_limit = node->size;
		pthread_mutex_unlock(&s->lock);
	}
	return 0;
}

/* Metadata may sit in a last cluster the file ends inside of (reads pad it
 * with zeroes): before writing any, make that cluster whole. */
int qc_file_whole(struct qc_state *s)
{
	if (!(s->file->size & (s->cluster_size - 1)))
		return 0;
	return qc_grow_file(s, s->file, qc_align_up(s->file->size, s->cluster_size));
}

/* First run of n free clusters at or after s->free_index, which moves to
 * the first free cluster seen. */
static int qc_find_free(struct qc_state *s, uint64_t n, uint64_t *start)
{
	uint64_t c = s->free_index, i, rc, first = UINT64_MAX;

	/* Runs start after the last run: holes before it are left to single
	 * clusters, so that filling a fragmented image stays linear. */
	if (n > 1 && s->run_hint > c)
		c = s->run_hint;
	int ret;

	for (i = 0; i < n;) {
		rc = 0;
		ret = qc_rc_nobody(s, c + i) ? 0 : qc_rc_get(s, c + i, &rc);
		if (ret)
			return ret;
		if (rc) {
			c += i + 1;
			i = 0;
			continue;
		}
		if (first == UINT64_MAX)
			first = c + i;
		i++;
	}
	if (n == 1 || s->free_index >= c)
		s->free_index = first;
	*start = c;
	return 0;
}

static bool qc_blocks_exist(struct qc_state *s, uint64_t c, uint64_t n, uint64_t *missing)
{
	uint64_t t;

	for (t = c >> s->rb_bits; t <= (c + n - 1) >> s->rb_bits; t++) {
		if (t >= s->rct_size || !s->rct[t]) {
			*missing = t;
			return false;
		}
	}
	return true;
}

/* Find n free clusters whose refcount blocks exist, creating blocks where
 * they are missing without breaking the run. Not exact: n may shrink. */
static int qc_alloc_search(struct qc_state *s, uint64_t *n, bool exact, uint64_t *start)
{
	uint64_t c, t, rs, re, r;
	unsigned tries;
	int ret;

	for (tries = 0; tries < 256; tries++) {
		ret = qc_find_free(s, *n, &c);
		if (ret)
			return ret;
		if (qc_blocks_exist(s, c, *n, &t)) {
			*start = c;
			return 0;
		}
		rs = t << s->rb_bits;
		re = rs + (1ull << s->rb_bits);
		if (!exact && rs > c) {
			*n = rs - c; /* blocks of [c, rs) exist */
			*start = c;
			return 0;
		}
		r = rs < c ? rs : (c + *n < re ? c + *n : rs);
		ret = qc_rb_create(s, t, r);
		if (ret)
			return ret;
		if (!exact && r > c && r < c + *n)
			*n = r - c;
	}
	return -ENOSPC;
}

static int qc_alloc_claim(struct qc_state *s, uint64_t n, bool exact, uint64_t *off, bool *fresh,
			  uint64_t *got)
{
	uint64_t c, i, end;
	char what[96];
	int ret;

	ret = qc_alloc_search(s, &n, exact, &c);
	if (ret)
		return ret;
	if (c == s->free_index)
		s->free_index = c + n;
	if (n > 1)
		s->run_hint = c + n;
	end = (c + n) << s->cluster_bits;
	/* QEMU's overlap check before a write, done once at allocation. */
	if (qc_meta_overlap(s, QC_OL_ALL, c << s->cluster_bits, n << s->cluster_bits, what,
			    sizeof(what)))
		return qc_corrupt(s,
				  "clusters 0x%llx+%llu about to be allocated (refcount zero) "
				  "hold the %s",
				  (unsigned long long)(c << s->cluster_bits), (unsigned long long)n,
				  what);
	ret = qc_grow_file(s, s->file, end);
	for (i = 0; ret == 0 && i < n; i++)
		ret = qc_rc_claim(s, c + i);
	if (ret)
		return ret;
	*off = c << s->cluster_bits;
	*fresh = *off >= s->fresh_from;
	if (end > s->fresh_from && *fresh)
		s->fresh_from = end;
	*got = n;
	IOPLANE_TRACE(qcow2_alloc, s, *off, n, *fresh);
	return 0;
}

int qc_alloc_clusters(struct qc_state *s, uint64_t n, uint64_t *off, bool *fresh)
{
	uint64_t got;

	return qc_alloc_claim(s, n, true, off, fresh, &got);
}

int qc_alloc_run(struct qc_state *s, uint64_t *n, uint64_t *off, bool *fresh)
{
	return qc_alloc_claim(s, *n, false, off, fresh, n);
}

/* Compressed data shares clusters: each compressed cluster adds one
 * reference to every host cluster its bytes touch. */
int qc_alloc_bytes(struct qc_state *s, uint64_t len, uint64_t *off)
{
	uint64_t pos = s->comp_next, room, rc = UINT64_MAX;
	bool fresh;
	int ret;

	room = pos ? s->cluster_size - (pos & (s->cluster_size - 1)) : 0;
	if (pos && (pos & (s->cluster_size - 1)) && len <= room) {
		ret = qc_rc_get(s, pos >> s->cluster_bits, &rc);
		if (ret)
			return ret;
	}
	/* A full refcount (always, with 1-bit refcounts): a cluster of its own. */
	if (rc < s->rc_max)
		ret = qc_rc_update(s, pos >> s->cluster_bits, 1);
	else
		ret = qc_alloc_clusters(s, 1, &pos, &fresh);
	if (ret)
		return ret;
	*off = pos;
	s->comp_next = qc_align_up(pos + len, 512);
	if (!(s->comp_next & (s->cluster_size - 1)))
		s->comp_next = 0;
	return 0;
}

/* ---- deferred decrements ---- */

void qc_decref_add(struct qc_state *s, uint64_t off, uint64_t n, bool discard)
{
	struct qc_decref_list *l = &s->dec_new;

	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 64;
		struct qc_decref *v = realloc(l->v, cap * sizeof(*v));

		if (!v) {
			/* Out of memory: the cluster leaks (check -r leaks repairs it). */
			log_warn("qcow2: out of memory, leaking %llu cluster(s)",
				 (unsigned long long)n);
			return;
		}
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = (struct qc_decref){off, n, discard};
	s->metadata_changed = true;
}

/* Punch a data cluster whose refcount dropped to zero, unless it is still
 * metadata (a refcount that was wrong): then the image is corrupt. */
static int qc_decref_discard(struct qc_state *s, uint64_t c)
{
	char what[96];

	if (qc_meta_overlap(s, QC_OL_ALL, c << s->cluster_bits, s->cluster_size, what,
			    sizeof(what)))
		return qc_corrupt(s, "cluster 0x%llx, freed, is still the %s",
				  (unsigned long long)(c << s->cluster_bits), what);
	qc_co_op(s->file, BLK_OP_DISCARD, c << s->cluster_bits, s->cluster_size, 0);
	return 0;
}

static int qc_decref_apply(struct qc_state *s)
{
	struct qc_decref_list *l = &s->dec_wait;
	uint64_t c, rc;
	size_t i;
	int ret = 0;

	for (i = 0; i < l->n && ret == 0; i++) {
		const struct qc_decref *d = &l->v[i];

		for (c = d->off >> s->cluster_bits; c < (d->off >> s->cluster_bits) + d->n; c++) {
			ret = qc_rc_update(s, c, -1);
			if (ret)
				break;
			qc_cache_forget(s, &s->l2c, c << s->cluster_bits, s->cluster_size);
			if (d->discard && qc_rc_get(s, c, &rc) == 0 && rc == 0)
				ret = qc_decref_discard(s, c);
			if (ret)
				break;
		}
	}
	l->n = 0;
	return ret;
}

int qc_decref_process(struct qc_state *s)
{
	int ret = 0;

	if (s->dec_wait.n && __atomic_load_n(&s->wr_count[s->dec_epoch & 1], __ATOMIC_ACQUIRE) == 0)
		ret = qc_decref_apply(s);
	if (ret || s->dec_wait.n || !s->dec_new.n)
		return ret;
	/* Swap: what was dropped before this writeback is now durable. */
	{
		struct qc_decref_list t = s->dec_wait;

		s->dec_wait = s->dec_new;
		s->dec_new = t;
	}
	pthread_mutex_lock(&s->lock);
	s->dec_epoch = s->wr_epoch++;
	pthread_mutex_unlock(&s->lock);
	if (__atomic_load_n(&s->wr_count[s->dec_epoch & 1], __ATOMIC_ACQUIRE) == 0)
		ret = qc_decref_apply(s);
	return ret;
}

void qc_wr_begin(struct qc_state *s, unsigned *epoch)
{
	*epoch = s->wr_epoch & 1;
	__atomic_add_fetch(&s->wr_count[*epoch], 1, __ATOMIC_RELAXED);
}

void qc_wr_end(struct qc_state *s, unsigned epoch)
{
	__atomic_sub_fetch(&s->wr_count[epoch], 1, __ATOMIC_RELEASE);
}
