/* Block core: driver registry, request validation, the submit and completion
 * paths, the core's emulations (FUA, write-zeroes, block-status) and small
 * helpers (request pools, aligned buffers, synchronous I/O).
 *
 * Threading: blk_submit() and every completion run on the submitting loop's
 * thread (req->loop), which owns the request's core fields. The driver table
 * is written at start-up on the main thread and only read afterwards. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-int.h"
#include "util/trace.h"
#include "block/dirty-bitmap.h"

/* ---- driver registry ---- */

uint64_t blk_ns_mult = 1ull << 32; /* until the built-in drivers are registered */

#define BLK_MAX_DRIVERS 32

static const struct blk_driver *blk_drivers[BLK_MAX_DRIVERS]; /* start-up only */
static unsigned blk_ndrivers;

const struct blk_driver *blk_find_driver(const char *name)
{
	unsigned i;

	for (i = 0; i < blk_ndrivers; i++)
		if (strcmp(blk_drivers[i]->name, name) == 0)
			return blk_drivers[i];
	return NULL;
}

int blk_register_driver(const struct blk_driver *drv)
{
	if (blk_find_driver(drv->name))
		return -EEXIST;
	if (blk_ndrivers == BLK_MAX_DRIVERS)
		return -ENOSPC;
	blk_drivers[blk_ndrivers++] = drv;
	return 0;
}

void blk_register_builtin_drivers(void)
{
	static const struct blk_driver *const builtin[] = {
		&blk_drv_null, &blk_drv_raw, &blk_drv_file, &blk_drv_qcow2,      &blk_drv_throttle,
		&blk_drv_nbd,  &blk_drv_rbd, &blk_drv_cbw,  &blk_drv_mirror_top,
	};
	static bool done;
	size_t i;

	if (done)
		return;
	done = true;
	clock_init();
	blk_ns_mult = (uint64_t)(clock_ns_per_tick * 4294967296.0);
	for (i = 0; i < ARRAY_SIZE(builtin); i++)
		blk_register_driver(builtin[i]);
}

/* ---- validation ---- */

/* Flags each operation accepts. */
static const uint32_t blk_op_flags[BLK_OP__COUNT] = {
	[BLK_OP_WRITE] = BLK_F_FUA,
	[BLK_OP_WRITE_ZEROES] = BLK_F_FUA | BLK_F_MAY_UNMAP | BLK_F_NO_FALLBACK,
	[BLK_OP_BLOCK_STATUS] = BLK_F_ALLOC_ONLY,
};

/* -EINVAL when offset + len wraps or passes the end of the node. */
static inline int blk_check_range(const struct blk_node *bs, const struct blk_request *req)
{
	uint64_t end = req->offset + req->len;

	return end < req->offset || end > bs->size ? -EINVAL : 0;
}

/* Who executes a request that passed the checks. */
enum blk_route {
	BLK_ROUTE_DRIVER, /* the driver (through the alignment path if needed) */
	BLK_ROUTE_CORE,   /* the core first: it answers or emulates (blk_submit_slow) */
};

/* Writes, write-zeroes and discards dirty the bitmaps of the node; as in
 * QEMU, not a discard that does nothing (discard=ignore, or a node that
 * cannot). Marked at submission, by the checks, once the request's range is
 * known to be good (one that fails later only marks more than it wrote): a
 * bitmap read after this request was acknowledged shows it. Reads never
 * look at the bitmaps. Writes mark inline in blk_check_rw(); this is for
 * write-zeroes and discards. */
static inline void blk_dirty_mark_write(struct blk_node *bs, const struct blk_request *req)
{
	/* Inline, but reading the request afresh: so that the compiler does not
	 * keep its fields in registers across the checks for this branch, at
	 * the cost of the path without bitmaps. */
	__asm__ volatile("" ::: "memory");
	blk_dirty_mark(bs, req->offset, req->len);
}

static void __attribute__((noinline))
blk_dirty_mark_other(struct blk_node *bs, const struct blk_request *req)
{
	if (req->op == BLK_OP_WRITE_ZEROES ||
	    (req->op == BLK_OP_DISCARD && bs->has_discard && !bs->discard_ignore))
		blk_dirty_mark(bs, req->offset, req->len);
}

void blk_dirty_mark_forward(struct blk_node *child, const struct blk_request *req)
{
	if (req->op == BLK_OP_READ || req->op >= BLK_OP_BLOCK_STATUS ||
	    req->offset >= child->size || !req->len)
		return;
	if (req->op == BLK_OP_WRITE)
		blk_dirty_mark(child, req->offset, req->len);
	else
		blk_dirty_mark_other(child, req);
}

/* Read and write, the hot path: 0 and *route (the core's work: zero length,
 * FUA emulation), or -errno. The iovec sum cannot wrap: every partial sum is
 * compared with len, which is at most the size. */
static inline int blk_check_rw(struct blk_node *bs, const struct blk_request *req,
			       enum blk_route *route)
{
	uint64_t sum = 0;
	int i;

	if (unlikely(blk_check_range(bs, req) || req->iovcnt < 0))
		return -EINVAL;
	for (i = 0; i < req->iovcnt; i++) {
		sum += req->iov[i].iov_len;
		if (unlikely(sum > req->len))
			return -EINVAL;
	}
	if (unlikely(sum != req->len))
		return -EINVAL;
	if (req->op == BLK_OP_WRITE) {
		if (unlikely(bs->dirty_bitmaps != NULL))
			blk_dirty_mark_write(bs, req);
		if (unlikely(bs->write_slow)) {
			if (bs->read_only)
				return -EROFS;
			if (req->flags & ~BLK_F_FUA)
				return -EINVAL;
			*route = BLK_ROUTE_CORE; /* detect-zeroes */
			return 0;
		}
		if (unlikely(req->flags)) {
			if (req->flags & ~BLK_F_FUA)
				return -EINVAL;
			*route = bs->has_fua ? BLK_ROUTE_DRIVER : BLK_ROUTE_CORE;
			return 0;
		}
	} else if (unlikely(req->flags)) {
		return -EINVAL;
	}
	*route = unlikely(req->len == 0) ? BLK_ROUTE_CORE : BLK_ROUTE_DRIVER;
	return 0;
}

/* Every other operation: 0 and *route, or -errno, as blk_check_rw(). */
static int blk_check_other(struct blk_node *bs, struct blk_request *req, enum blk_route *route)
{
	if (req->op >= BLK_OP__COUNT || (req->flags & ~blk_op_flags[req->op]))
		return -EINVAL;
	*route = BLK_ROUTE_CORE;
	switch (req->op) {
	case BLK_OP_FLUSH:
		*route = bs->no_flush ? BLK_ROUTE_CORE : BLK_ROUTE_DRIVER;
		return 0;
	case BLK_OP_BLOCK_STATUS:
		if (req->len == 0 || req->offset >= bs->size)
			return -EINVAL;
		if (req->len > bs->size - req->offset)
			req->len = bs->size - req->offset;
		if (bs->has_block_status)
			*route = BLK_ROUTE_DRIVER;
		return 0;
	default: /* discard, write-zeroes */
		if (blk_check_range(bs, req))
			return -EINVAL;
		if (bs->read_only)
			return -EROFS;
		if (req->op == BLK_OP_WRITE_ZEROES && !bs->has_write_zeroes &&
		    (req->flags & BLK_F_NO_FALLBACK))
			return -ENOTSUP;
		if (unlikely(bs->dirty_bitmaps != NULL))
			blk_dirty_mark_other(bs, req);
		return 0;
	}
}

/* ---- write-zeroes fallback: zero-buffer writes of up to 1 MiB ---- */

#define BLK_ZERO_CHUNK (1u << 20)
/* Never written; in .bss so it costs no file size and maps the zero page. */
static uint8_t blk_zero_buf[BLK_ZERO_CHUNK] __attribute__((aligned(4096)));

struct blk_wz_state {
	struct blk_request child;
	struct iovec iov;
	uint64_t end;
};

static void blk_top_done(struct blk_request *req, int ret);
static void blk_wz_done(struct blk_request *c, int ret);

/* Submit the chunk after the child's current one; chunk ends are aligned so
 * that only the first and last chunk may need a read-modify-write. */
static int blk_wz_next(struct blk_wz_state *w)
{
	struct blk_request *c = &w->child, *p = c->core.parent;
	struct blk_node *bs = p->core.node;
	uint64_t pos = c->offset + c->len, n = w->end - pos;

	if (n > BLK_ZERO_CHUNK) {
		uint64_t stop = (pos + BLK_ZERO_CHUNK) & ~(uint64_t)(bs->align - 1);

		n = stop > pos ? stop - pos : BLK_ZERO_CHUNK;
	}
	blk_child_init(c, p);
	c->op = BLK_OP_WRITE;
	c->flags = bs->has_fua ? (p->flags & BLK_F_FUA) : 0;
	c->offset = pos;
	c->len = n;
	w->iov.iov_base = blk_zero_buf;
	w->iov.iov_len = n;
	c->iov = &w->iov;
	c->iovcnt = 1;
	c->cb = blk_wz_done;
	return blk_exec(bs, c);
}

static void blk_wz_done(struct blk_request *c, int ret)
{
	struct blk_wz_state *w = container_of(c, struct blk_wz_state, child);
	struct blk_request *p = c->core.parent;

	if (ret == 0 && c->offset + c->len < w->end) {
		ret = blk_wz_next(w);
		if (ret == 0)
			return;
	}
	free(w);
	blk_top_done(p, ret);
}

/* Start the fallback for a write-zeroes request; 0 or -errno (nothing started). */
static int blk_wz_fallback(struct blk_request *req)
{
	struct blk_wz_state *w;
	int ret;

	if (req->flags & BLK_F_NO_FALLBACK)
		return -ENOTSUP;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->child.core.parent = req;
	w->child.offset = req->offset;
	w->end = req->offset + req->len;
	ret = blk_wz_next(w);
	if (ret)
		free(w);
	return ret;
}

/* ---- submission ---- */

int blk_exec(struct blk_node *bs, struct blk_request *req)
{
	if (blk_needs_align(bs))
		return blk_align_submit(bs, req);
	return bs->drv->submit(bs, req);
}

void blk_child_init(struct blk_request *c, struct blk_request *p)
{
	c->core.node = p->core.node;
	c->loop = p->loop;
	c->core.st = NULL;
	c->core.flags = BLK_CORE_INTERNAL;
	c->core.parent = p;
	c->core.slow = NULL;
	c->opaque = NULL;
}

static bool blk_iov_is_zero(const struct blk_request *req)
{
	for (int i = 0; i < req->iovcnt; i++) {
		const unsigned char *p = req->iov[i].iov_base;
		size_t n = req->iov[i].iov_len;

		if (n && (p[0] || memcmp(p, p + 1, n - 1)))
			return false;
	}
	return true;
}

/* detect-zeroes: a write of zeroes goes on as a write-zeroes; the
 * submitter gets its op and flags back on completion (BLK_CORE_OP_SAVED). */
static void blk_detect_zeroes(struct blk_node *bs, struct blk_request *req)
{
	if (!bs->detect_zeroes || req->len == 0 || !blk_iov_is_zero(req))
		return;
	req->core.flags |= BLK_CORE_OP_SAVED;
	req->core.saved_op = req->op;
	req->core.saved_flags = (uint8_t)req->flags;
	req->op = BLK_OP_WRITE_ZEROES;
	if (bs->detect_zeroes == BLK_DETECT_ZEROES_UNMAP && !bs->discard_ignore)
		req->flags |= BLK_F_MAY_UNMAP;
}

/* Requests the core answers or emulates (BLK_ROUTE_CORE). */
static int blk_submit_slow(struct blk_node *bs, struct blk_request *req)
{
	if ((req->flags & BLK_F_FUA) && !bs->has_fua)
		req->core.flags |= BLK_CORE_FUA_EMUL;
	if (req->op == BLK_OP_WRITE)
		blk_detect_zeroes(bs, req);
	switch (req->op) {
	case BLK_OP_FLUSH: /* no-flush=on */
		goto done;
	case BLK_OP_BLOCK_STATUS:
		req->status = BLK_STATUS_DATA | BLK_STATUS_ALLOCATED;
		req->status_len = req->len;
		goto done;
	case BLK_OP_DISCARD:
		if (req->len == 0 || !bs->has_discard || bs->discard_ignore)
			goto done;
		break;
	case BLK_OP_WRITE_ZEROES:
		if (req->len == 0)
			goto done;
		if (!bs->has_write_zeroes)
			return blk_wz_fallback(req);
		if (!(req->flags & BLK_F_NO_FALLBACK))
			req->core.flags |= BLK_CORE_WZ_RETRY;
		break;
	default: /* read, write */
		if (req->len == 0)
			goto done;
		break;
	}
	return blk_exec(bs, req);
done:
	req->core.flags = 0;
	blk_complete_deferred(req, 0);
	return 0;
}

/* blk_submit() past the drain gate. Always inlined into its two callers,
 * so that the fast path stays one function. */
static inline __attribute__((always_inline)) int submit_checked(struct blk_node *bs,
								struct blk_request *req, bool gated)
{
	struct loop *loop = loop_current();
	enum blk_route route;
	struct blk_stats *st;
	int ret;

	assert(loop);
	if (likely(req->op <= BLK_OP_WRITE))
		ret = blk_check_rw(bs, req, &route);
	else
		ret = blk_check_other(bs, req, &route);
	if (unlikely(ret < 0))
		return ret;
	st = bs->stats[loop_index(loop)];
	if (unlikely(!st)) {
		/* This thread's first request to bs: it now tells drains
		 * about itself (bs->loops), then looks again (drain.c). */
		st = blk_stats_slot(bs, loop);
		if (!st)
			return -ENOMEM;
		if (gated && atomic_load(&bs->quiesce))
			return blk_drain_hold(bs, req);
	}
	req->core.node = bs;
	req->loop = loop;
	req->core.st = st;
	req->core.flags = 0;
	req->core.start_tsc = clock_ticks();
	IOPLANE_TRACE(blk_submit, bs, req);
	if (unlikely(route == BLK_ROUTE_CORE))
		ret = blk_submit_slow(bs, req);
	else if (unlikely(blk_needs_align(bs)))
		ret = blk_align_submit(bs, req);
	else
		ret = bs->drv->submit(bs, req);
	if (likely(ret == 0))
		st->in_flight++;
	return ret;
}

/* The drain gate costs one relaxed load and a branch never taken outside
 * a drain. */
int blk_submit(struct blk_node *bs, struct blk_request *req)
{
	if (unlikely(atomic_load_explicit(&bs->quiesce, memory_order_relaxed)))
		return blk_drain_hold(bs, req);
	return submit_checked(bs, req, true);
}

int blk_submit_child(struct blk_node *bs, struct blk_request *req)
{
	return submit_checked(bs, req, false);
}

int blk_forward_shift(struct blk_node *bs, struct blk_request *req, uint64_t delta)
{
	int ret;

	if (!(req->core.flags & BLK_CORE_SHIFTED)) {
		req->core.shift = 0;
		req->core.flags |= BLK_CORE_SHIFTED;
	}
	req->offset += delta;
	req->core.shift += delta;
	ret = blk_forward(bs, req);
	if (ret) {
		req->offset -= delta;
		req->core.shift -= delta;
	}
	return ret;
}

/* ---- completion ---- */

/* A top-level request finished its data phase: retry write-zeroes with
 * writes, emulate FUA with a flush, then account and call back. */
static void blk_top_done(struct blk_request *req, int ret)
{
	struct blk_node *bs = req->core.node;

	if (ret == -ENOTSUP && (req->core.flags & BLK_CORE_WZ_RETRY)) {
		req->core.flags &= ~BLK_CORE_WZ_RETRY;
		ret = blk_wz_fallback(req);
		if (ret == 0)
			return;
	}
	if (ret == 0 && (req->core.flags & BLK_CORE_FUA_EMUL)) {
		if (!(req->core.flags & BLK_CORE_OP_SAVED)) {
			req->core.saved_op = req->op;
			req->core.saved_flags = (uint8_t)req->flags;
		}
		req->core.flags = (req->core.flags & ~BLK_CORE_FUA_EMUL) | BLK_CORE_OP_SAVED;
		req->op = BLK_OP_FLUSH;
		ret = bs->drv->submit(bs, req);
		if (ret == 0)
			return;
	}
	if (req->core.flags & BLK_CORE_OP_SAVED) {
		req->op = req->core.saved_op;
		req->flags = req->core.saved_flags;
		req->core.flags &= ~BLK_CORE_OP_SAVED;
	}
	blk_stats_account(req, ret);
	IOPLANE_TRACE(blk_complete, req, ret);
	req->cb(req, ret);
}

void blk_exec_done(struct blk_request *req, int ret)
{
	if (req->core.flags & BLK_CORE_TRACKED)
		blk_untrack(req);
	if (req->core.flags & BLK_CORE_INTERNAL) {
		req->cb(req, ret);
		return;
	}
	blk_top_done(req, ret);
}

static void blk_complete_slow(struct blk_request *req, int ret)
{
	if (req->core.flags & BLK_CORE_SHIFTED) {
		req->offset -= req->core.shift;
		req->core.flags &= ~BLK_CORE_SHIFTED;
	}
	blk_exec_done(req, ret);
}

void blk_complete(struct blk_request *req, int ret)
{
	if (unlikely(req->core.flags)) {
		blk_complete_slow(req, ret);
		return;
	}
	blk_stats_account(req, ret);
	IOPLANE_TRACE(blk_complete, req, ret);
	req->cb(req, ret);
}

static void blk_defer_cb(struct loop_defer *d)
{
	struct blk_request *req = container_of(d, struct blk_request, core.defer);

	blk_complete(req, req->core.ret);
}

void blk_complete_deferred(struct blk_request *req, int ret)
{
	req->core.ret = ret;
	req->core.defer.cb = blk_defer_cb;
	loop_defer(req->loop, &req->core.defer);
}

/* ---- capabilities, truncate ---- */

bool blk_can_discard(struct blk_node *bs)
{
	return bs->has_discard && !bs->discard_ignore;
}

bool blk_can_write_zeroes(struct blk_node *bs)
{
	return bs->has_write_zeroes;
}

bool blk_can_fua(struct blk_node *bs)
{
	return bs->has_fua;
}

bool blk_can_multi_conn(struct blk_node *bs)
{
	return bs->drv->can_multi_conn && bs->drv->can_multi_conn(bs);
}

int blk_truncate(struct blk_node *bs, uint64_t size)
{
	int ret;

	if (bs->read_only)
		return -EROFS;
	if (!bs->drv->truncate)
		return -ENOTSUP;
	ret = bs->drv->truncate(bs, size);
	/* The node's bitmaps follow (no request in flight), as QEMU's do. */
	if (!ret)
		blk_dirty_bitmaps_resize(bs, blk_size(bs));
	return ret;
}

/* ---- helpers ---- */

void *blk_thread_state(struct blk_node *bs, struct loop *loop,
		       void *(*ctor)(struct blk_node *bs, struct loop *loop))
{
	unsigned idx = loop_index(loop);

	if (!bs->thread_state[idx])
		bs->thread_state[idx] = ctor(bs, loop);
	return bs->thread_state[idx];
}

void *blk_alloc_buf(struct blk_node *bs, size_t len)
{
	size_t align = 4096;
	void *p;

	if (bs && bs->mem_align > align)
		align = bs->mem_align;
	if (bs && bs->align > align)
		align = bs->align;
	if (posix_memalign(&p, align, len ? len : 1))
		return NULL;
	return p;
}

int blk_req_pool_init(struct blk_req_pool *p, unsigned n)
{
	unsigned i;

	memset(p, 0, sizeof(*p));
	p->reqs = calloc(n ? n : 1, sizeof(*p->reqs));
	p->free_list = calloc(n ? n : 1, sizeof(*p->free_list));
	if (!p->reqs || !p->free_list) {
		blk_req_pool_destroy(p);
		return -ENOMEM;
	}
	p->n = n;
	for (i = n; i > 0; i--)
		p->free_list[p->nfree++] = &p->reqs[i - 1];
	return 0;
}

void blk_req_pool_destroy(struct blk_req_pool *p)
{
	free(p->reqs);
	free(p->free_list);
	memset(p, 0, sizeof(*p));
}

/* ---- synchronous helpers ---- */

struct blk_sync {
	int ret;
	bool done;
};

static void blk_sync_cb(struct blk_request *req, int ret)
{
	struct blk_sync *s = req->opaque;

	s->ret = ret;
	s->done = true;
}

/* gated: held by a drain of bs like any request; else the drainer's own. */
static int blk_sync_submit(struct blk_node *bs, struct blk_request *req, bool gated)
{
	struct loop *loop = loop_current();
	struct blk_sync s = {0, false};
	int ret;

	if (!loop)
		return -EINVAL;
	req->cb = blk_sync_cb;
	req->opaque = &s;
	ret = gated ? blk_submit(bs, req) : blk_submit_child(bs, req);
	if (ret)
		return ret;
	while (!s.done)
		loop_run_once(loop, true);
	return s.ret;
}

int blk_do_sync(struct blk_node *bs, struct blk_request *req)
{
	return blk_sync_submit(bs, req, true);
}

static int blk_rw_sync(struct blk_node *bs, uint8_t op, uint64_t offset, void *buf, uint64_t len,
		       uint32_t flags)
{
	struct iovec iov = {.iov_base = buf, .iov_len = len};
	struct blk_request req = {
		.op = op,
		.flags = flags,
		.offset = offset,
		.len = len,
		.iov = &iov,
		.iovcnt = 1,
	};

	return blk_do_sync(bs, &req);
}

int blk_pread(struct blk_node *bs, uint64_t offset, void *buf, uint64_t len)
{
	return blk_rw_sync(bs, BLK_OP_READ, offset, buf, len, 0);
}

int blk_pwrite(struct blk_node *bs, uint64_t offset, const void *buf, uint64_t len, uint32_t flags)
{
	return blk_rw_sync(bs, BLK_OP_WRITE, offset, (void *)buf, len, flags);
}

int blk_flush_sync(struct blk_node *bs)
{
	struct blk_request req = {.op = BLK_OP_FLUSH};

	return blk_do_sync(bs, &req);
}

int blk_flush_sync_ungated(struct blk_node *bs)
{
	struct blk_request req = {.op = BLK_OP_FLUSH};

	return blk_sync_submit(bs, &req, false);
}
