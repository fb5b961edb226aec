/* qcow2 metadata caches: L2 slices and refcount-block slices, keyed by host
 * offset, with CLOCK replacement and lazily allocated slice buffers (memory
 * grows with what the image uses, up to the configured size). Dirty slices
 * are written back in batches: at flush, on eviction, at close.
 *
 * Threading: the hash and slots are changed under s->lock; loading, dirtying
 * and writing back happen with s->meta held (see qcow2-int.h), so a meta
 * holder sees slice contents stable while it does I/O. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"
#include "util/log.h"

#define QC_WB_BATCH 64

static unsigned qc_hash(const struct qc_cache *c, uint64_t key)
{
	return (unsigned)(((key >> c->slice_bits) * 0x9e3779b97f4a7c15ull) >> 40) & c->hmask;
}

int qc_cache_init(struct qc_cache *c, const char *name, unsigned slice_bits, uint64_t bytes)
{
	uint64_t n = bytes >> slice_bits;
	unsigned h = 16;

	memset(c, 0, sizeof(*c));
	if (n < 8)
		n = 8;
	if (n > (1u << 22))
		n = 1u << 22;
	while (h < 2 * n)
		h <<= 1;
	c->name = name;
	c->slice_bits = slice_bits;
	c->nslots = (unsigned)n;
	c->hmask = h - 1;
	c->slots = calloc(n, sizeof(*c->slots));
	c->hash = calloc(h, sizeof(*c->hash));
	if (!c->slots || !c->hash) {
		qc_cache_free(c);
		return -ENOMEM;
	}
	return 0;
}

void qc_cache_free(struct qc_cache *c)
{
	unsigned i;

	for (i = 0; c->slots && i < c->nslots; i++)
		free(c->slots[i].data);
	free(c->slots);
	free(c->hash);
	c->slots = NULL;
	c->hash = NULL;
}

static struct qc_slot *qc_cache_find(struct qc_cache *c, uint64_t key)
{
	struct qc_slot *sl;

	for (sl = c->hash[qc_hash(c, key)]; sl; sl = sl->hnext)
		if (sl->key == key)
			return sl;
	return NULL;
}

uint8_t *qc_cache_peek(struct qc_cache *c, uint64_t key)
{
	struct qc_slot *sl = qc_cache_find(c, key);

	if (!sl)
		return NULL;
	sl->ref = true;
	return sl->data;
}

static void qc_cache_unhash(struct qc_cache *c, struct qc_slot *sl)
{
	struct qc_slot **pp = &c->hash[qc_hash(c, sl->key)];

	while (*pp != sl)
		pp = &(*pp)->hnext;
	*pp = sl->hnext;
	sl->hnext = NULL;
	sl->key = 0;
	if (sl->dirty) {
		sl->dirty = false;
		c->ndirty--;
	}
}

static void qc_cache_hash(struct qc_cache *c, struct qc_slot *sl, uint64_t key)
{
	unsigned h = qc_hash(c, key);

	sl->key = key;
	sl->hnext = c->hash[h];
	c->hash[h] = sl;
	sl->ref = true;
}

/* A clean slot to reuse (lock held), or NULL if every slot is dirty. */
static struct qc_slot *qc_cache_victim(struct qc_cache *c)
{
	unsigned i;

	for (i = 0; i < 2 * c->nslots; i++) {
		struct qc_slot *sl = &c->slots[c->hand];

		c->hand = c->hand + 1 == c->nslots ? 0 : c->hand + 1;
		if (!sl->key)
			return sl;
		if (sl->dirty)
			continue;
		if (sl->ref) {
			sl->ref = false;
			continue;
		}
		return sl;
	}
	return NULL;
}

static int qc_cache_make_room(struct qc_state *s, struct qc_cache *c)
{
	if (c == &s->l2c)
		return qc_metadata_writeback(s, false);
	return qc_cache_writeback(s, c);
}

/* Take a victim slot out of the hash (lock held). */
static struct qc_slot *qc_cache_take(struct qc_state *s, struct qc_cache *c, int *ret)
{
	struct qc_slot *sl;

	while (!(sl = qc_cache_victim(c))) {
		pthread_mutex_unlock(&s->lock);
		*ret = qc_cache_make_room(s, c);
		pthread_mutex_lock(&s->lock);
		if (*ret)
			return NULL;
	}
	if (sl->key)
		qc_cache_unhash(c, sl);
	if (!sl->data) {
		sl->data = qc_alloc_buf(1u << c->slice_bits);
		if (!sl->data) {
			*ret = -ENOMEM;
			return NULL;
		}
	}
	return sl;
}

struct qc_slot *qc_cache_get(struct qc_state *s, struct qc_cache *c, uint64_t key, bool fresh,
			     int *ret)
{
	struct qc_slot *sl;

	*ret = 0;
	pthread_mutex_lock(&s->lock);
	sl = qc_cache_find(c, key);
	if (sl) {
		c->hits++;
		sl->ref = true;
		pthread_mutex_unlock(&s->lock);
		return sl;
	}
	c->misses++;
	sl = qc_cache_take(s, c, ret);
	pthread_mutex_unlock(&s->lock);
	if (!sl)
		return NULL;
	/* The slot is in no hash chain: nobody else can see it. */
	if (fresh)
		memset(sl->data, 0, 1u << c->slice_bits);
	else
		*ret = qc_co_pread_clamped(s->file, key, sl->data, 1u << c->slice_bits);
	if (*ret)
		return NULL;
	pthread_mutex_lock(&s->lock);
	qc_cache_hash(c, sl, key);
	pthread_mutex_unlock(&s->lock);
	return sl;
}

void qc_cache_mark_dirty(struct qc_state *s, struct qc_cache *c, struct qc_slot *sl)
{
	pthread_mutex_lock(&s->lock);
	if (sl->key && !sl->dirty) {
		sl->dirty = true;
		c->ndirty++;
	}
	s->metadata_changed = true;
	pthread_mutex_unlock(&s->lock);
}

void qc_cache_forget(struct qc_state *s, struct qc_cache *c, uint64_t off, uint64_t len)
{
	uint64_t k;

	pthread_mutex_lock(&s->lock);
	for (k = qc_align_down(off, 1ull << c->slice_bits); k < off + len;
	     k += 1ull << c->slice_bits) {
		struct qc_slot *sl = qc_cache_find(c, k);

		if (sl)
			qc_cache_unhash(c, sl);
	}
	pthread_mutex_unlock(&s->lock);
}

/* Mark a slice dirty or clean (lock taken here). */
static void qc_cache_set_dirty(struct qc_state *s, struct qc_cache *c, struct qc_slot *sl, bool d)
{
	pthread_mutex_lock(&s->lock);
	if (sl->dirty != d) {
		sl->dirty = d;
		if (d)
			c->ndirty++;
		else
			c->ndirty--;
	}
	pthread_mutex_unlock(&s->lock);
}

/* Write every dirty slice, QC_WB_BATCH at a time in parallel. meta held, so
 * nobody changes a slice while it is written; a failed batch stays dirty. */
int qc_cache_writeback(struct qc_state *s, struct qc_cache *c)
{
	struct qc_slot *sent[QC_WB_BATCH];
	struct qc_child *ch;
	struct qc_batch b;
	unsigned i = 0, n, j;
	int ret = 0;

	if (!c->ndirty)
		return 0;
	ret = qc_file_whole(s);
	if (ret)
		return ret;
	ch = malloc(QC_WB_BATCH * sizeof(*ch));
	if (!ch)
		return -ENOMEM;
	while (i < c->nslots && ret == 0) {
		qc_batch_init(&b);
		for (n = 0; i < c->nslots && n < QC_WB_BATCH; i++) {
			struct qc_slot *sl = &c->slots[i];

			if (!sl->key || !sl->dirty)
				continue;
			ch[n].iov1.iov_base = sl->data;
			ch[n].iov1.iov_len = 1u << c->slice_bits;
			qc_batch_add(&b, &ch[n], s->file, BLK_OP_WRITE, sl->key, &ch[n].iov1, 1,
				     1u << c->slice_bits, 0);
			qc_cache_set_dirty(s, c, sl, false);
			sent[n++] = sl;
		}
		ret = qc_batch_wait(&b);
		for (j = 0; ret && j < n; j++)
			qc_cache_set_dirty(s, c, sent[j], true);
	}
	free(ch);
	if (ret)
		log_err("qcow2: writing back the %s cache failed: %s", c->name, strerror(-ret));
	return ret;
}

/* ---- tables kept whole in memory (L1, refcount table) ---- */

bool qc_table_is_dirty(const uint8_t *dirty, uint64_t n)
{
	uint64_t i;

	for (i = 0; dirty && i < (n + QC_TABLE_CHUNK - 1) / QC_TABLE_CHUNK; i++)
		if (dirty[i])
			return true;
	return false;
}

/* A chunk is copied under s->lock (the fast paths read the L1 table under
 * it) and written without; a chunk that fails to write stays dirty. */
int qc_table_write_dirty(struct qc_state *s, const uint64_t *tab, uint64_t n, uint8_t *dirty,
			 uint64_t off)
{
	uint64_t nchunks = (n + QC_TABLE_CHUNK - 1) / QC_TABLE_CHUNK, i, j, k;
	uint8_t *buf;
	int ret = qc_file_whole(s);

	if (ret)
		return ret;
	buf = qc_alloc_buf(QC_TABLE_CHUNK * 8);
	if (!buf)
		return -ENOMEM;
	for (i = 0; i < nchunks && ret == 0; i++) {
		if (!dirty[i])
			continue;
		k = n - i * QC_TABLE_CHUNK < QC_TABLE_CHUNK ? n - i * QC_TABLE_CHUNK
							    : QC_TABLE_CHUNK;
		pthread_mutex_lock(&s->lock);
		for (j = 0; j < k; j++)
			qc_wr64(buf + j * 8, tab[i * QC_TABLE_CHUNK + j]);
		dirty[i] = 0;
		pthread_mutex_unlock(&s->lock);
		ret = qc_co_pwrite(s->file, off + i * QC_TABLE_CHUNK * 8, buf, k * 8);
		if (ret)
			dirty[i] = 1;
	}
	free(buf);
	return ret;
}

static int qc_flush_files(struct qc_state *s)
{
	int ret = 0;

	if (s->data_external)
		ret = qc_co_flush(s->data);
	if (!ret)
		ret = qc_co_flush(s->file);
	return ret;
}

/* Ordering that keeps the image consistent after a crash at any point:
 * refcounts (and guest data, e.g. COW copies) are on disk before the L2
 * entries that use them, and L2 tables before the L1 entries that point to
 * them. With lazy refcounts the dirty bit replaces the first step. */
int qc_metadata_writeback(struct qc_state *s, bool data_too)
{
	bool l1_dirty = qc_table_is_dirty(s->l1_dirty, s->l1_size);
	bool l2_dirty = s->l2c.ndirty != 0, rct_dirty = qc_rct_is_dirty(s);
	int ret = 0;

	if (!l1_dirty && !l2_dirty && !s->rbc.ndirty && !rct_dirty)
		return data_too ? qc_flush_files(s) : 0;
	/* A corrupt image gets no metadata built on what was found wrong: what
	 * is not on disk yet cannot be made durable. */
	if (s->corrupt && !s->bs->read_only)
		return -EIO;
	if (s->lazy)
		ret = qc_header_mark_dirty(s);
	/* Lazy refcounts: refcount blocks go out only at eviction and close. */
	if (!ret && (!s->lazy || !data_too))
		ret = qc_cache_writeback(s, &s->rbc);
	/* New refcount blocks are on disk before the table points to them. */
	if (!ret && rct_dirty) {
		ret = qc_co_flush(s->file);
		if (!ret)
			ret = qc_rct_write_dirty(s);
	}
	if (!ret && (l1_dirty || l2_dirty))
		ret = qc_flush_files(s);
	if (!ret)
		ret = qc_cache_writeback(s, &s->l2c);
	if (!ret && l1_dirty) {
		ret = qc_co_flush(s->file);
		if (!ret)
			ret = qc_l1_write_dirty(s);
	}
	/* The data file too when it was not flushed above (only refcounts
	 * were dirty): a flush of the node covers every file under it. */
	if (!ret)
		ret = data_too && !l1_dirty && !l2_dirty ? qc_flush_files(s) : qc_co_flush(s->file);
	return ret;
}
