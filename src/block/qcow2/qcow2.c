/* qcow2 format driver: the driver table, open/close, request dispatch with
 * the fast paths, flush, truncate (grow) and the tool API glue.
 *
 * Fast paths (no coroutine, one s->lock round trip): a read whose clusters
 * are plain data in one cached L2 slice and contiguous on the host is
 * forwarded to the file with its offset moved; a read of a zero or
 * unallocated (no backing) cluster is answered with zeroes; a write into
 * clusters the image owns alone (COPIED) goes to the file as a child request
 * counted in the write epoch (see refcount.c). Everything else runs in a
 * coroutine (rw.c).
 *
 * Threading: see qcow2-int.h. Open, close and truncate run on the main
 * thread with no request in flight. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "block/qcow2/qcow2-int.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/opts.h"

#define QC_L2_CACHE_DEFAULT (32ull << 20) /* 256 GiB of 64 KiB clusters */
#define QC_RB_CACHE_MIN (256ull << 10)

/* ---- per-request contexts ---- */

/* Slow request: in req->drv while the coroutine runs. */
struct qc_reqctx {
	struct qc_state *s;
};

/* Fast write: a child on the data node, from a per-thread free list. */
struct qc_fwd {
	struct blk_request child;
	struct blk_request *parent;
	struct qc_state *s;
	unsigned epoch;
	bool read;
	struct qc_fwd *next;
};

struct qc_thread {
	struct qc_fwd *free;
};

_Static_assert(sizeof(struct qc_reqctx) <= BLK_DRV_CTX_SIZE, "qc_reqctx too big");

static void *qc_thread_new(struct blk_node *bs, struct loop *loop)
{
	(void)bs;
	(void)loop;
	return calloc(1, sizeof(struct qc_thread));
}

static void qc_thread_free(struct blk_node *bs, unsigned idx)
{
	struct qc_thread *t = bs->thread_state[idx];

	if (!t)
		return;
	while (t->free) {
		struct qc_fwd *f = t->free;

		t->free = f->next;
		free(f);
	}
	free(t);
	bs->thread_state[idx] = NULL;
}

static void qc_detach_loop(struct blk_node *bs, struct loop *loop)
{
	qc_thread_free(bs, loop_index(loop));
}

/* ---- slow path: one coroutine per request ---- */

static void qc_co_entry(void *opaque)
{
	struct blk_request *req = opaque;
	struct qc_state *s = ((struct qc_reqctx *)req->drv.bytes)->s;
	int ret;

	switch (req->op) {
	case BLK_OP_READ:
		ret = qc_co_readv(s, req->offset, req->len, req->iov, req->iovcnt);
		break;
	case BLK_OP_WRITE:
		ret = qc_co_writev(s, req->offset, req->len, req->iov, req->iovcnt, req->flags);
		break;
	case BLK_OP_FLUSH:
		ret = qc_co_flush_all(s);
		break;
	case BLK_OP_DISCARD:
		ret = qc_co_zero(s, req->offset, req->len, 0, true);
		break;
	case BLK_OP_WRITE_ZEROES:
		ret = qc_co_zero(s, req->offset, req->len, req->flags, false);
		break;
	case BLK_OP_BLOCK_STATUS:
		ret = qc_co_block_status(s, req);
		break;
	default:
		ret = -EINVAL;
	}
	/* Deferred: the callback runs from the loop, not on this stack. */
	blk_complete_deferred(req, ret);
}

static int qc_submit_slow(struct qc_state *s, struct blk_request *req)
{
	struct coroutine *co;

	((struct qc_reqctx *)req->drv.bytes)->s = s;
	co = coroutine_create(qc_co_entry, req);
	if (!co)
		return -ENOMEM;
	coroutine_enter(co);
	return 0;
}

/* ---- fast paths ---- */

static bool qc_fast_data(const struct qc_state *s, uint64_t e, uint64_t bm, uint64_t coff,
			 uint64_t len)
{
	if ((e & QC_OFLAG_COMPRESSED) || !(e & QC_OFFSET_MASK))
		return false;
	if (!s->ext_l2)
		return !(e & QC_OFLAG_ZERO);
	{
		unsigned a = (unsigned)(coff >> s->sc_bits);
		unsigned b = (unsigned)((coff + len - 1) >> s->sc_bits);
		uint64_t m = ((b - a == 31) ? 0xffffffffull : ((1ull << (b - a + 1)) - 1)) << a;

		return (bm & m) == m;
	}
}

/* Entries the slow path would refuse (qc_entry_check) are left to it. */
static bool qc_fast_sane(const struct qc_state *s, uint64_t gc, uint64_t e, uint64_t bm)
{
	if ((e & QC_L2E_RESERVED) ||
	    (s->ext_l2 && ((e & QC_OFLAG_ZERO) || (bm & (bm >> 32) & 0xffffffffu))))
		return false;
	return !s->data_external || (e & QC_OFFSET_MASK) == gc << s->cluster_bits;
}

/* What a fast path did with a request. */
enum qc_fast {
	QC_FAST_TAKEN, /* submitted or answered; or refused, the -errno in *ret */
	QC_FAST_SLOW,  /* not one for the fast path: the coroutine path takes it */
	QC_FAST_NOMEM, /* no fast-path context could be allocated: the coroutine
			* path, which needs none, takes it */
};

/* True, with the host offset of [off, off+len), if it is plain data,
 * contiguous, in one cached slice (lock held). For writes the clusters must
 * be COPIED. The host range must lie inside the file and clear of the
 * tables (for writes: of all metadata): cached entries are whatever the
 * image says. */
static bool qc_fast_map(struct qc_state *s, uint64_t off, uint64_t len, bool write, uint64_t *host)
{
	uint64_t gc = off >> s->cluster_bits, last = (off + len - 1) >> s->cluster_bits;
	uint64_t e, bm, base, coff = qc_coff(s, off), n, first = gc;

	if (!qc_l2_peek(s, gc, &e, &bm))
		return false;
	n = last == gc ? len : s->cluster_size - coff;
	if (!qc_fast_data(s, e, bm, coff, n) || (write && !(e & QC_OFLAG_COPIED)) ||
	    !qc_fast_sane(s, gc, e, bm))
		return false;
	base = e & QC_OFFSET_MASK;
	*host = base + coff;
	n = (last - gc + 1) << s->cluster_bits;
	if ((base & (s->cluster_size - 1)) || *host + len > s->fwd_limit || *host + len < *host ||
	    (!s->data_external && qc_meta_on(s, base, n, write ? QC_OL_ALL : QC_OL_FIXED)))
		return false;
	while (++gc <= last) {
		uint64_t e2, bm2;

		n = gc == last ? qc_coff(s, off + len - 1) + 1 : s->cluster_size;
		if ((gc >> s->l2_bits) != (last >> s->l2_bits) || !qc_l2_peek(s, gc, &e2, &bm2) ||
		    !qc_fast_data(s, e2, bm2, 0, n) || (write && !(e2 & QC_OFLAG_COPIED)) ||
		    !qc_fast_sane(s, gc, e2, bm2) ||
		    (e2 & QC_OFFSET_MASK) != base + ((gc - first) << s->cluster_bits))
			return false;
	}
	return true;
}

/* Zero / unallocated without backing, one cluster, nothing allocating it. */
static bool qc_fast_zero(struct qc_state *s, uint64_t off, uint64_t len)
{
	uint64_t gc = off >> s->cluster_bits, e, bm, n = len;
	enum qc_kind k;

	if (qc_coff(s, off) + len > s->cluster_size || !qc_l2_peek(s, gc, &e, &bm))
		return false;
	k = qc_classify(s, e, bm, qc_coff(s, off), &n);
	if (n != len || (k != QC_ZERO && (k != QC_UNALLOC || s->backing)))
		return false;
	return !qc_alloc_find(s, gc, 1);
}

static void qc_fwd_done(struct blk_request *c, int ret);

/* Send req to the data node at host as a child request (f is taken from
 * the thread's free list by the caller); 0, or -errno with f given back. */
static int qc_fwd_submit(struct qc_state *s, struct qc_thread *t, struct qc_fwd *f,
			 struct blk_request *req, uint64_t host, bool read)
{
	int ret;

	memset(&f->child, 0, sizeof(f->child));
	f->parent = req;
	f->s = s;
	f->read = read;
	f->child.op = read ? BLK_OP_READ : BLK_OP_WRITE;
	f->child.offset = host;
	f->child.len = req->len;
	f->child.iov = req->iov;
	f->child.iovcnt = req->iovcnt;
	f->child.cb = qc_fwd_done;
	ret = blk_submit_child(s->data, &f->child);
	if (ret) {
		if (!read)
			qc_wr_end(s, f->epoch);
		f->next = t->free;
		t->free = f;
	}
	return ret;
}

/* A fast read from an external data file: a child request on the data node
 * (the image node's own request cannot be shifted onto another node). */
static enum qc_fast qc_read_child(struct blk_node *bs, struct qc_state *s, struct blk_request *req,
				  uint64_t host, int *ret)
{
	struct qc_thread *t = blk_thread_state(bs, req->loop, qc_thread_new);
	struct qc_fwd *f;

	if (!t)
		return QC_FAST_NOMEM;
	f = t->free;
	if (f)
		t->free = f->next;
	else if (!(f = calloc(1, sizeof(*f))))
		return QC_FAST_NOMEM;
	*ret = qc_fwd_submit(s, t, f, req, host, true);
	return QC_FAST_TAKEN;
}

static enum qc_fast qc_read_fast(struct blk_node *bs, struct qc_state *s, struct blk_request *req,
				 int *ret)
{
	uint64_t host;
	bool hit;

	pthread_mutex_lock(&s->lock);
	hit = s->fast_fwd && qc_fast_map(s, req->offset, req->len, false, &host);
	if (!hit && qc_fast_zero(s, req->offset, req->len)) {
		pthread_mutex_unlock(&s->lock);
		iov_memset(req->iov, req->iovcnt, 0, 0, req->len);
		blk_complete_deferred(req, 0);
		*ret = 0;
		return QC_FAST_TAKEN;
	}
	pthread_mutex_unlock(&s->lock);
	if (!hit)
		return QC_FAST_SLOW;
	if (s->data_external)
		return qc_read_child(bs, s, req, host, ret);
	*ret = blk_forward_shift(bs, req, host - req->offset);
	return QC_FAST_TAKEN;
}

static void qc_fwd_done(struct blk_request *c, int ret)
{
	struct qc_fwd *f = (struct qc_fwd *)c;
	struct blk_request *p = f->parent;
	struct qc_thread *t = f->s->bs->thread_state[loop_index(p->loop)];

	if (!f->read)
		qc_wr_end(f->s, f->epoch);
	f->next = t->free;
	t->free = f;
	blk_complete(p, ret);
}

static enum qc_fast qc_write_fast(struct blk_node *bs, struct qc_state *s, struct blk_request *req,
				  int *ret)
{
	struct qc_thread *t = blk_thread_state(bs, req->loop, qc_thread_new);
	struct qc_fwd *f;
	uint64_t host;

	if (!t)
		return QC_FAST_NOMEM;
	f = t->free;
	if (!f && !(f = calloc(1, sizeof(*f))))
		return QC_FAST_NOMEM;
	pthread_mutex_lock(&s->lock);
	if (!qc_fast_map(s, req->offset, req->len, true, &host)) {
		pthread_mutex_unlock(&s->lock);
		if (f != t->free)
			free(f);
		return QC_FAST_SLOW;
	}
	qc_wr_begin(s, &f->epoch);
	pthread_mutex_unlock(&s->lock);
	if (f == t->free)
		t->free = f->next;
	*ret = qc_fwd_submit(s, t, f, req, host, false);
	return QC_FAST_TAKEN;
}

static int qc_submit(struct blk_node *bs, struct blk_request *req)
{
	struct qc_state *s = bs->opaque;
	enum qc_fast fast = QC_FAST_SLOW;
	int ret;

	/* Nothing is written once corruption was found (see qc_corrupt); a
	 * flush still makes durable what was written before, if it can. */
	if (req->op != BLK_OP_READ && req->op != BLK_OP_BLOCK_STATUS && req->op != BLK_OP_FLUSH &&
	    !bs->read_only && __atomic_load_n(&s->corrupt, __ATOMIC_ACQUIRE))
		return -EIO;
	if (req->op == BLK_OP_READ)
		fast = qc_read_fast(bs, s, req, &ret);
	else if (req->op == BLK_OP_WRITE && s->fast_write)
		fast = qc_write_fast(bs, s, req, &ret);
	if (fast == QC_FAST_TAKEN)
		return ret;
	return qc_submit_slow(s, req);
}

/* ---- flush ---- */

int qc_co_flush_all(struct qc_state *s)
{
	int ret;

	qc_co_lock(s, &s->meta);
	ret = qc_metadata_writeback(s, true);
	if (!ret && (s->dec_new.n || s->dec_wait.n) && !s->corrupt)
		ret = qc_decref_process(s);
	qc_co_unlock(s, &s->meta);
	return ret;
}

/* ---- open ---- */

struct qc_open_ctx {
	struct qc_state *s;
	char *err;
	size_t errlen;
};

static int qc_open_co(void *arg)
{
	struct qc_open_ctx *o = arg;
	struct qc_state *s = o->s;
	int ret;

	ret = qc_header_read(s, o->err, o->errlen);
	if (!ret)
		ret = qc_l1_read(s, o->err, o->errlen);
	if (!ret)
		ret = qc_rc_init(s, o->err, o->errlen);
	if (!ret)
		ret = qc_snapshots_read(s, o->err, o->errlen);
	if (!ret)
		ret = qc_meta_build(s, o->err, o->errlen);
	if (ret && ret != -EINVAL && !o->err[0])
		snprintf(o->err, o->errlen, "qcow2: cannot read metadata: %s", strerror(-ret));
	return ret;
}

/* repair=on is honoured only in a process that asked for it (img check -r):
 * main thread, set before any open. */
static bool qc_repair_allowed;

void qcow2_allow_repair_open(void)
{
	qc_repair_allowed = true;
}

static int qc_parse_repair(struct qc_state *s, struct kv_opts *opts, char *err, size_t errlen)
{
	if (kv_get_bool(opts, "repair", &s->repair)) {
		snprintf(err, errlen, "qcow2: repair: expected on or off");
		return -EINVAL;
	}
	if (s->repair && !qc_repair_allowed) {
		snprintf(err, errlen, "qcow2: repair=on is reserved for 'ioplane img check -r'");
		return -EINVAL;
	}
	return 0;
}

static int qc_parse_opts(struct qc_state *s, struct kv_opts *opts, char *err, size_t errlen)
{
	uint64_t l2 = QC_L2_CACHE_DEFAULT;
	const char *fn = kv_get(opts, "filename");

	if (kv_get_size(opts, "l2-cache-size", &l2) || l2 > (1ull << 32)) {
		snprintf(err, errlen, "qcow2: bad l2-cache-size");
		return -EINVAL;
	}
	if (fn && !(s->image_path = strdup(fn)))
		return -ENOMEM;
	if (qc_parse_repair(s, opts, err, errlen))
		return -EINVAL;
	s->cache_l2_bytes = l2; /* capped by what the image needs, see qc_caches_init */
	return 0;
}

static int qc_caches_init(struct qc_state *s)
{
	unsigned sb = s->cluster_bits < 12 ? s->cluster_bits : 12;
	uint64_t need = (uint64_t)s->l1_size << s->cluster_bits, l2 = s->cache_l2_bytes;
	uint64_t rb;
	int ret;

	if (l2 > need)
		l2 = need;
	rb = l2 / 4 > QC_RB_CACHE_MIN ? l2 / 4 : QC_RB_CACHE_MIN;
	ret = qc_cache_init(&s->l2c, "L2", sb, l2);
	if (!ret)
		ret = qc_cache_init(&s->rbc, "refcount", sb, rb);
	return ret;
}

/* A dirty image (lazy refcounts, not closed cleanly) has refcounts that may
 * be wrong: repair them when writable (qcow2_check clears the dirty bit once
 * the image checks clean), else go on read-only. Opened for repair, the
 * check is left to the tool, which reports what it fixes (as QEMU does with
 * BDRV_O_CHECK). */
static int qc_open_dirty(struct qc_state *s, char *err, size_t errlen)
{
	struct qcow2_check_result r;
	int ret;

	if (!(s->h.incompat & QC_INCOMPAT_DIRTY) || (s->repair && !s->bs->read_only))
		return 0;
	if (s->bs->read_only) {
		log_warn("qcow2: image was not closed cleanly (dirty bit set); refcounts may be "
			 "inaccurate, opening read-only");
		return 0;
	}
	log_warn("qcow2: image was not closed cleanly (dirty bit set): repairing refcounts");
	ret = qcow2_check(s->bs, QCOW2_FIX_LEAKS | QCOW2_FIX_ERRORS, &r);
	if (!ret && (r.corruptions || r.check_errors || (s->h.incompat & QC_INCOMPAT_DIRTY)))
		ret = -EIO;
	if (ret)
		snprintf(err, errlen,
			 "qcow2: repairing the dirty image failed (%s); use "
			 "read-only=on or check -r all",
			 r.first_error[0] ? r.first_error : strerror(-ret));
	return ret;
}

static int qc_clear_autoclear(void *arg)
{
	struct qc_state *s = arg;

	return qc_header_write_features(s, s->h.incompat, s->h.autoclear & QC_AUTOCLEAR_KNOWN);
}

static int qc_open_rw_checks(struct qc_state *s, char *err, size_t errlen)
{
	int ret = 0;

	if (s->bs->read_only)
		return 0;
	/* Opened for repair, writes stay refused (s->corrupt) until
	 * qcow2_check leaves the image consistent. */
	if (s->corrupt && !s->repair) {
		snprintf(err, errlen,
			 "qcow2: image is marked corrupt; it can only be opened "
			 "read-only (repair it with 'ioplane img check -r all')");
		return -EROFS;
	}
	/* Autoclear bits of features this writer does not maintain go; a
	 * repair (img check -r) writes no guest data and keeps them all. */
	if ((s->h.autoclear & ~QC_AUTOCLEAR_KNOWN) && !s->repair)
		ret = qc_run_sync(qc_clear_autoclear, s);
	if (ret)
		snprintf(err, errlen, "qcow2: cannot update the header: %s", strerror(-ret));
	return ret;
}

static int qc_bitmaps_load_co(void *arg)
{
	struct qc_open_ctx *o = arg;

	return qc_bitmaps_load(o->s, o->err, o->errlen);
}

/* The persistent bitmaps become the node's (not for a repair, which
 * leaves them as they are, nor on an image found corrupt). */
static int qc_open_bitmaps(struct qc_state *s, char *err, size_t errlen)
{
	struct qc_open_ctx o = {s, err, errlen};
	int ret;

	if (s->repair || s->corrupt || !s->bmdir_bytes)
		return 0;
	ret = qc_run_sync(qc_bitmaps_load_co, &o);
	if (ret && !err[0])
		snprintf(err, errlen, "qcow2: cannot load the dirty bitmaps: %s", strerror(-ret));
	return ret;
}

static void qc_state_free(struct qc_state *s)
{
	qc_backing_close(s);
	qc_snapshots_free(s);
	qc_meta_free(s);
	qc_cache_free(&s->l2c);
	qc_cache_free(&s->rbc);
	qc_header_free(s);
	if (s->zero_buf)
		munmap(s->zero_buf, s->cluster_size);
	free(s->l1);
	free(s->l1_dirty);
	free(s->rct);
	free(s->rct_dirty);
	free(s->dec_new.v);
	free(s->dec_wait.v);
	free(s->image_path);
	pthread_mutex_destroy(&s->lock);
	free(s);
}

static void qc_open_geometry(struct blk_node *bs, struct qc_state *s)
{
	bs->size = s->h.size;
	bs->align = s->file->align > s->data->align ? s->file->align : s->data->align;
	bs->mem_align =
		s->file->mem_align > s->data->mem_align ? s->file->mem_align : s->data->mem_align;
	s->file_size = s->open_file_size = s->file->size;
	s->fwd_limit = s->data->size;
	s->fresh_from = s->alloc_end = qc_align_up(s->file->size, s->cluster_size);
	s->fast_fwd = s->cluster_size >= s->data->align;
	s->fast_write = s->cluster_size >= s->data->align;
	s->read_only = bs->read_only;
}

static int qcow2_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	struct qc_state *s = calloc(1, sizeof(*s));
	struct qc_open_ctx o = {s, err, errlen};
	const char *cow = kv_get(opts, "cow-zeroing");
	int ret;

	if (!s)
		return -ENOMEM;
	err[0] = 0;
	pthread_mutex_init(&s->lock, NULL);
	s->bs = bs;
	s->file = bs->next;
	bs->opaque = s;
	ret = qc_parse_opts(s, opts, err, errlen);
	if (!ret)
		ret = qc_run_sync(qc_open_co, &o);
	if (!ret)
		ret = qc_data_open(s, opts, err, errlen);
	if (!ret)
		ret = qc_backing_open(s, opts, err, errlen);
	if (!ret)
		ret = qc_caches_init(s);
	if (!ret)
		ret = qc_cow_open(s, cow, err, errlen);
	if (ret)
		goto fail;
	qc_open_geometry(bs, s);
	ret = qc_open_rw_checks(s, err, errlen);
	if (!ret)
		ret = qc_open_dirty(s, err, errlen);
	if (!ret)
		ret = qc_open_bitmaps(s, err, errlen);
	if (ret)
		goto fail;
	return 0;
fail:
	if (!err[0])
		snprintf(err, errlen, "qcow2: open failed: %s", strerror(-ret));
	qc_state_free(s);
	bs->opaque = NULL;
	return ret;
}

/* ---- close ---- */

static int qc_close_co(void *arg)
{
	struct qc_state *s = arg;
	int ret;

	qc_co_lock(s, &s->meta);
	ret = qc_bitmaps_store(s);
	if (!ret)
		ret = qc_metadata_writeback(s, true);
	/* Twice: the first pass makes the dropped references durable, the
	 * second applies them (no write is in flight now). */
	for (int i = 0; i < 2 && !ret && (s->dec_new.n || s->dec_wait.n); i++) {
		ret = qc_decref_process(s);
		if (!ret)
			ret = qc_metadata_writeback(s, true);
	}
	if (!ret && s->lazy && s->rbc.ndirty) {
		ret = qc_cache_writeback(s, &s->rbc);
		if (!ret)
			ret = qc_co_flush(s->file);
	}
	/* Opened for repair, only a clean check clears a dirty bit found at
	 * open: the refcounts may still be wrong. */
	if (!ret && s->hdr_dirty_set && !(s->repair && (s->open_incompat & QC_INCOMPAT_DIRTY)))
		ret = qc_header_mark_clean(s);
	qc_co_unlock(s, &s->meta);
	return ret;
}

/* Cut the file back to what is in use (never below its size at open). */
static void qc_close_trim(struct qc_state *s)
{
	uint64_t keep = s->alloc_end > s->open_file_size ? s->alloc_end : s->open_file_size;

	if (s->file->size > keep && s->file->drv->truncate)
		s->file->drv->truncate(s->file, keep);
}

static void qcow2_close(struct blk_node *bs)
{
	struct qc_state *s = bs->opaque;
	int ret;

	if (!s)
		return;
	/* Once corruption was found (or a repair left the image corrupt, having
	 * written what it fixed) nothing more is written: the image is read-only
	 * from then on, as in QEMU. */
	if (!s->read_only && !s->corrupt) {
		ret = qc_run_sync(qc_close_co, s);
		if (ret)
			log_err("qcow2: writing metadata at close failed: %s", strerror(-ret));
		else
			qc_close_trim(s);
	}
	for (unsigned i = 0; i < LOOP_MAX_THREADS; i++)
		qc_thread_free(bs, i);
	qc_state_free(s);
	bs->opaque = NULL;
}

/* Becoming a read-only backing file: what close would write, now. Writable
 * again (a commit's base): refused for an image that is corrupt or was
 * opened dirty, and autoclear bits this writer does not keep go first, as
 * at a writable open. */
static int qcow2_set_read_only(struct blk_node *bs, bool ro)
{
	struct qc_state *s = bs->opaque;
	int ret = 0;

	if (ro && !s->read_only && !s->corrupt)
		ret = qc_run_sync(qc_close_co, s);
	if (!ro && s->read_only) {
		if (s->corrupt || (s->h.incompat & QC_INCOMPAT_DIRTY))
			return -EUCLEAN;
		if (s->h.autoclear & ~QC_AUTOCLEAR_KNOWN) {
			s->read_only = false;
			ret = qc_run_sync(qc_clear_autoclear, s);
			s->read_only = ret ? true : false;
		}
	}
	if (!ret)
		s->read_only = ro;
	return ret;
}

/* ---- truncate (grow only) ---- */

struct qc_trunc_ctx {
	struct qc_state *s;
	uint64_t size;
};

static int qc_truncate_co(void *arg)
{
	struct qc_trunc_ctx *t = arg;
	struct qc_state *s = t->s;
	uint64_t per = s->cluster_size << s->l2_bits, need = (t->size + per - 1) / per;
	uint8_t b[8];
	int ret;

	qc_co_lock(s, &s->meta);
	ret = qc_l1_grow(s, need);
	if (!ret && s->data_external)
		ret = qc_grow_file(s, s->data, t->size);
	qc_wr64(b, t->size);
	if (!ret)
		ret = qc_header_write_field(s, 24, b, 8);
	if (!ret)
		ret = qc_co_flush(s->file);
	if (!ret)
		s->h.size = t->size;
	qc_co_unlock(s, &s->meta);
	return ret;
}

static int qcow2_truncate(struct blk_node *bs, uint64_t size)
{
	struct qc_state *s = bs->opaque;
	struct qc_trunc_ctx t = {s, size};
	int ret;

	if (size == s->h.size)
		return 0;
	if (size < s->h.size || s->nsnaps)
		return -ENOTSUP;
	ret = qc_run_sync(qc_truncate_co, &t);
	if (!ret)
		bs->size = size;
	return ret;
}

/* ---- capabilities ---- */

static bool qc_can_true(struct blk_node *bs)
{
	(void)bs;
	return true;
}

/* A flush covers every thread's writes if it does in the image file and in
 * the data file. */
static bool qc_can_multi_conn(struct blk_node *bs)
{
	return blk_children_can_multi_conn(bs);
}

/* QEMU's roles: the image file holds metadata (and the guest data unless
 * there is an external data file), the data file guest data, the backing
 * file what the image does not allocate. Before open (no state yet) only
 * the image file is known. */
static unsigned qc_child_perms(struct blk_node *bs, uint32_t perm, uint32_t shared,
			       struct blk_perm_req *out)
{
	const struct qc_state *s = bs->opaque;
	bool ext = s && s->data_external && s->data;
	unsigned n = 0;

	out[n].child = bs->next;
	blk_perm_storage(bs, true, !ext, perm, shared, &out[n++]);
	if (ext) {
		out[n].child = s->data;
		blk_perm_storage(bs, false, true, perm, shared, &out[n++]);
	}
	if (s && s->backing) {
		out[n].child = s->backing;
		blk_perm_backing(perm, shared, &out[n++]);
	}
	return n;
}

const struct blk_driver blk_drv_qcow2 = {
	.name = "qcow2",
	.is_format = true,
	.open = qcow2_open,
	.close = qcow2_close,
	.submit = qc_submit,
	.truncate = qcow2_truncate,
	.set_read_only = qcow2_set_read_only,
	.detach_loop = qc_detach_loop,
	.can_discard = qc_can_true,
	.can_write_zeroes = qc_can_true,
	.can_block_status = qc_can_true,
	.can_multi_conn = qc_can_multi_conn,
	.child_perms = qc_child_perms,
};

/* ---- tool API ---- */

bool qcow2_is(const struct blk_node *bs)
{
	return bs && bs->drv == &blk_drv_qcow2;
}

struct blk_node *qcow2_backing(struct blk_node *bs)
{
	return qcow2_is(bs) ? qc_state(bs)->backing : NULL;
}

uint64_t qcow2_cluster_size(const struct blk_node *bs)
{
	return qcow2_is(bs) ? ((const struct qc_state *)bs->opaque)->cluster_size : 0;
}

struct qc_count_ctx {
	struct qc_state *s;
	uint64_t limit, count;
};

static int qc_count_co(void *arg)
{
	struct qc_count_ctx *c = arg;
	struct qc_state *s = c->s;
	uint64_t i, rc, end = qc_align_up(s->file->size, s->cluster_size) >> s->cluster_bits;
	int ret = 0;

	qc_co_lock(s, &s->meta);
	for (i = 0; i < end && c->count < c->limit && !ret; i++) {
		ret = qc_rc_get(s, i, &rc);
		c->count += rc != 0;
	}
	qc_co_unlock(s, &s->meta);
	return ret;
}

int qcow2_count_refcounted(struct blk_node *bs, uint64_t limit, uint64_t *count)
{
	struct qc_count_ctx c = {qcow2_is(bs) ? qc_state(bs) : NULL, limit, 0};
	int ret;

	if (!c.s)
		return -EINVAL;
	ret = qc_run_sync(qc_count_co, &c);
	*count = c.count;
	return ret;
}

struct qc_comp_ctx {
	struct qc_state *s;
	uint64_t off, len;
	const void *buf;
};

static int qc_comp_co(void *arg)
{
	struct qc_comp_ctx *c = arg;

	return qc_co_write_compressed(c->s, c->off, c->buf, c->len);
}

int qcow2_pwrite_compressed(struct blk_node *bs, uint64_t offset, const void *buf, uint64_t len)
{
	struct qc_comp_ctx c = {qc_state(bs), offset, len, buf};

	if (!qcow2_is(bs))
		return -EINVAL;
	if (bs->read_only)
		return -EROFS;
	if (offset + len > bs->size || offset + len < offset)
		return -EINVAL;
	return qc_run_sync(qc_comp_co, &c);
}
