/* Alignment slow path, for nodes with align > 1 (O_DIRECT on a 4096-byte-sector
 * disk) or mem_align > 1. Misaligned memory goes through a bounce buffer; a
 * write with misaligned offset or length becomes a read-modify-write of the
 * covering aligned range and is "serialising": it waits for every earlier
 * overlapping write, and every later overlapping write waits for it.
 *
 * Threading: a request and its alignment state belong to req->loop's thread.
 * A node's overlap list (struct blk_track) is shared by every thread using the
 * node and protected by its mutex; a waiting request is resumed by a loop
 * message to its own loop. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-int.h"
#include "util/iov.h"

#define ALIGN_DOWN(x, a) ((x) & ~((uint64_t)(a)-1))
#define ALIGN_UP(x, a) ALIGN_DOWN((x) + (a)-1, a)
#define ALIGN_MAX_STEPS 5

enum align_kind { ALIGN_READ, ALIGN_WRITE, ALIGN_WZ, ALIGN_DISCARD };

/* One I/O done by a child request. Reads and writes use the bounce buffer. */
struct align_step {
	uint8_t op;
	uint64_t off, len;
	size_t boff; /* offset in the bounce buffer */
};

struct align_req {
	struct blk_request child;
	struct blk_request *parent;
	struct blk_node *bs;
	enum align_kind kind;
	uint8_t *bounce;
	uint64_t lo;   /* device offset of bounce[0] for a read */
	unsigned step; /* the step in flight */
	unsigned nsteps;
	unsigned nreads; /* steps [0, nreads) are reads; fill before the first write */
	struct align_step steps[ALIGN_MAX_STEPS];
	struct iovec iov;
};

static void align_child_done(struct blk_request *c, int ret);

/* ---- overlap tracking ---- */

static bool track_overlap(const struct blk_request *a, const struct blk_request *b)
{
	return a->core.track_lo < b->core.track_hi && b->core.track_lo < a->core.track_hi &&
	       (a->core.serialising || b->core.serialising);
}

/* Must req wait for an earlier request? Arrival order makes waits acyclic.
 * Caller holds the track lock. */
static bool track_conflict(const struct blk_track *t, const struct blk_request *req)
{
	const struct blk_request *p;

	/* Only a serialising request conflicts, on either side. */
	if (!req->core.serialising && t->nserial == 0)
		return false;

	for (p = req->core.track_prev; p; p = p->core.track_prev)
		if (track_overlap(p, req))
			return true;
	return false;
}

static void align_free(struct align_req *a)
{
	a->parent->core.slow = NULL;
	free(a->bounce);
	free(a);
}

static int align_run(struct align_req *a);

/* Loop message: an overlapping request finished; go on unless another one
 * still overlaps. */
static void track_wake(struct loop_msg *m)
{
	struct blk_request *req = container_of(m, struct blk_request, core.wake);
	struct blk_track *t = req->core.node->track;
	bool wait;
	int ret;

	pthread_mutex_lock(&t->lock);
	wait = track_conflict(t, req);
	req->core.waiting = wait;
	t->nwaiting += wait;
	pthread_mutex_unlock(&t->lock);
	if (wait)
		return;
	if (req->core.slow)
		ret = align_run(req->core.slow);
	else
		ret = req->core.node->drv->submit(req->core.node, req);
	if (ret) {
		if (req->core.slow)
			align_free(req->core.slow);
		blk_exec_done(req, ret);
	}
}

/* Put req on the node's list covering [lo, hi); true if it must wait (it is
 * then resumed by track_wake). */
static bool track_begin(struct blk_node *bs, struct blk_request *req, uint64_t lo, uint64_t hi,
			bool serialising)
{
	struct blk_track *t = bs->track;
	bool wait;

	assert(t);
	req->core.track_lo = lo;
	req->core.track_hi = hi;
	req->core.serialising = serialising;
	req->core.track_next = NULL;
	req->core.wake.cb = track_wake;
	req->core.flags |= BLK_CORE_TRACKED;
	pthread_mutex_lock(&t->lock);
	req->core.track_prev = t->tail;
	if (t->tail)
		t->tail->core.track_next = req;
	else
		t->head = req;
	t->tail = req;
	t->nserial += serialising;
	wait = track_conflict(t, req);
	req->core.waiting = wait;
	t->waits += wait;
	t->nwaiting += wait;
	pthread_mutex_unlock(&t->lock);
	return wait;
}

void blk_untrack(struct blk_request *req)
{
	struct blk_track *t = req->core.node->track;
	struct blk_request *w;

	pthread_mutex_lock(&t->lock);
	for (w = t->nwaiting ? req->core.track_next : NULL; w; w = w->core.track_next) {
		if (w->core.waiting && track_overlap(req, w)) {
			w->core.waiting = false;
			t->nwaiting--;
			loop_send(w->loop, &w->core.wake);
		}
	}
	t->nserial -= req->core.serialising;
	if (req->core.track_prev)
		req->core.track_prev->core.track_next = req->core.track_next;
	else
		t->head = req->core.track_next;
	if (req->core.track_next)
		req->core.track_next->core.track_prev = req->core.track_prev;
	else
		t->tail = req->core.track_prev;
	pthread_mutex_unlock(&t->lock);
	req->core.flags &= ~BLK_CORE_TRACKED;
}

int blk_track_init(struct blk_node *bs)
{
	struct blk_track *t;

	if (bs->align <= 1 || bs->track)
		return 0;
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	pthread_mutex_init(&t->lock, NULL);
	bs->track = t;
	return 0;
}

void blk_track_free(struct blk_node *bs)
{
	struct blk_track *t = bs->track;

	if (!t)
		return;
	assert(!t->head);
	pthread_mutex_destroy(&t->lock);
	free(t);
	bs->track = NULL;
}

uint64_t blk_track_waits(struct blk_node *bs)
{
	struct blk_track *t = bs->track;
	uint64_t n;

	if (!t)
		return 0;
	pthread_mutex_lock(&t->lock);
	n = t->waits;
	pthread_mutex_unlock(&t->lock);
	return n;
}

/* ---- step machine ---- */

static void align_add(struct align_req *a, uint8_t op, uint64_t off, uint64_t len, size_t boff)
{
	assert(a->nsteps < ALIGN_MAX_STEPS);
	a->steps[a->nsteps++] = (struct align_step){.op = op, .off = off, .len = len, .boff = boff};
}

/* Put the request's data (or zeroes) into the bounce areas of the write steps,
 * over the blocks read so far. */
static void align_fill(struct align_req *a)
{
	struct blk_request *p = a->parent;
	uint64_t end = p->offset + p->len;
	unsigned i;

	for (i = a->nreads; i < a->nsteps; i++) {
		struct align_step *s = &a->steps[i];
		uint64_t lo = s->off > p->offset ? s->off : p->offset;
		uint64_t hi = s->off + s->len < end ? s->off + s->len : end;
		uint8_t *dst = a->bounce + s->boff + (lo - s->off);

		if (s->op != BLK_OP_WRITE || hi <= lo)
			continue;
		if (a->kind == ALIGN_WRITE)
			iov_to_buf(p->iov, p->iovcnt, lo - p->offset, dst, hi - lo);
		else
			memset(dst, 0, hi - lo);
	}
}

/* Submit step a->step to the driver. */
static int align_run(struct align_req *a)
{
	struct align_step *s = &a->steps[a->step];
	struct blk_request *c = &a->child, *p = a->parent;

	if (a->step == a->nreads && a->kind != ALIGN_READ)
		align_fill(a);
	blk_child_init(c, p);
	c->op = s->op;
	c->offset = s->off;
	c->len = s->len;
	c->iov = NULL;
	c->iovcnt = 0;
	c->cb = align_child_done;
	if (s->op == BLK_OP_READ || s->op == BLK_OP_WRITE) {
		a->iov.iov_base = a->bounce + s->boff;
		a->iov.iov_len = s->len;
		c->iov = &a->iov;
		c->iovcnt = 1;
	}
	if (s->op == BLK_OP_WRITE_ZEROES)
		c->flags = p->flags;
	else
		c->flags = s->op == BLK_OP_WRITE ? (p->flags & BLK_F_FUA) : 0;
	return a->bs->drv->submit(a->bs, c);
}

static void align_child_done(struct blk_request *c, int ret)
{
	struct align_req *a = container_of(c, struct align_req, child);
	struct blk_request *p = a->parent;

	if (ret == 0 && ++a->step < a->nsteps) {
		ret = align_run(a);
		if (ret == 0)
			return;
	}
	if (ret == 0 && a->kind == ALIGN_READ)
		iov_from_buf(p->iov, p->iovcnt, 0, a->bounce + (p->offset - a->lo), p->len);
	align_free(a);
	blk_exec_done(p, ret);
}

static struct align_req *align_new(struct blk_node *bs, struct blk_request *req,
				   enum align_kind kind, size_t bounce_len)
{
	struct align_req *a = calloc(1, sizeof(*a));

	if (!a)
		return NULL;
	if (bounce_len) {
		a->bounce = blk_alloc_buf(bs, bounce_len);
		if (!a->bounce) {
			free(a);
			return NULL;
		}
	}
	a->bs = bs;
	a->parent = req;
	a->kind = kind;
	req->core.slow = a;
	return a;
}

/* Run the steps, first waiting for overlapping requests when tracked. */
static int align_start(struct align_req *a, bool track, bool serialising, uint64_t lo, uint64_t hi)
{
	struct blk_request *req = a->parent;
	int ret;

	if (track && track_begin(a->bs, req, lo, hi, serialising))
		return 0;
	ret = align_run(a);
	if (ret) {
		if (req->core.flags & BLK_CORE_TRACKED)
			blk_untrack(req);
		align_free(a);
	}
	return ret;
}

/* ---- request kinds ---- */

/* Read or write through a bounce buffer covering [lo, hi). */
static int align_rw(struct blk_node *bs, struct blk_request *req, bool off_ok)
{
	uint32_t al = bs->align;
	uint64_t end = req->offset + req->len;
	uint64_t lo = ALIGN_DOWN(req->offset, al), hi = ALIGN_UP(end, al);
	bool head = req->offset != lo, tail = end != hi;
	struct align_req *a;

	a = align_new(bs, req, req->op == BLK_OP_READ ? ALIGN_READ : ALIGN_WRITE, hi - lo);
	if (!a)
		return -ENOMEM;
	a->lo = lo;
	if (req->op == BLK_OP_READ) {
		align_add(a, BLK_OP_READ, lo, hi - lo, 0);
		a->nreads = 1;
		return align_start(a, false, false, 0, 0);
	}
	if (head)
		align_add(a, BLK_OP_READ, lo, al, 0);
	if (tail && !(head && hi - al == lo))
		align_add(a, BLK_OP_READ, hi - al, al, hi - al - lo);
	a->nreads = a->nsteps;
	align_add(a, BLK_OP_WRITE, lo, hi - lo, 0);
	return align_start(a, al > 1, !off_ok, lo, hi);
}

/* Misaligned write-zeroes: read-modify-write of the partial head and tail
 * blocks (bounce[0, al) and bounce[al, 2 al)), write-zeroes in between. */
static int align_wz(struct blk_node *bs, struct blk_request *req)
{
	uint32_t al = bs->align;
	uint64_t end = req->offset + req->len;
	uint64_t lo = ALIGN_DOWN(req->offset, al), hi = ALIGN_UP(end, al);
	bool head = req->offset != lo, tail = end != hi;
	uint64_t mid_lo = head ? lo + al : lo, mid_hi = tail ? hi - al : hi;
	struct align_req *a;

	a = align_new(bs, req, ALIGN_WZ, 2 * (size_t)al);
	if (!a)
		return -ENOMEM;
	if (hi - lo == al) {
		align_add(a, BLK_OP_READ, lo, al, 0);
		a->nreads = 1;
		align_add(a, BLK_OP_WRITE, lo, al, 0);
		return align_start(a, true, true, lo, hi);
	}
	if (head)
		align_add(a, BLK_OP_READ, lo, al, 0);
	if (tail)
		align_add(a, BLK_OP_READ, hi - al, al, al);
	a->nreads = a->nsteps;
	if (head)
		align_add(a, BLK_OP_WRITE, lo, al, 0);
	if (mid_hi > mid_lo)
		align_add(a, BLK_OP_WRITE_ZEROES, mid_lo, mid_hi - mid_lo, 0);
	if (tail)
		align_add(a, BLK_OP_WRITE, hi - al, al, al);
	return align_start(a, true, true, lo, hi);
}

/* Misaligned discard: discard is advisory, so only the aligned inside goes down. */
static int align_discard(struct blk_node *bs, struct blk_request *req)
{
	uint64_t lo = ALIGN_UP(req->offset, bs->align);
	uint64_t hi = ALIGN_DOWN(req->offset + req->len, bs->align);
	struct align_req *a;

	if (hi <= lo) {
		blk_complete_deferred(req, 0);
		return 0;
	}
	a = align_new(bs, req, ALIGN_DISCARD, 0);
	if (!a)
		return -ENOMEM;
	align_add(a, BLK_OP_DISCARD, lo, hi - lo, 0);
	a->nreads = 0;
	return align_start(a, true, false, lo, hi);
}

/* Aligned request straight to the driver; writes are tracked when align > 1. */
static int align_direct(struct blk_node *bs, struct blk_request *req, bool track)
{
	int ret;

	req->core.slow = NULL;
	if (track && bs->align > 1 &&
	    track_begin(bs, req, req->offset, req->offset + req->len, false))
		return 0;
	ret = bs->drv->submit(bs, req);
	if (ret && (req->core.flags & BLK_CORE_TRACKED))
		blk_untrack(req);
	return ret;
}

/* Linux O_DIRECT rule: each buffer address a multiple of the DMA alignment
 * (mem_align), each segment length a multiple of the logical block (align). */
static bool align_mem_ok(const struct blk_node *bs, const struct blk_request *req)
{
	uintptr_t amask = bs->mem_align - 1, lmask = bs->align - 1;
	int i;

	for (i = 0; i < req->iovcnt; i++)
		if (((uintptr_t)req->iov[i].iov_base & amask) || (req->iov[i].iov_len & lmask))
			return false;
	return true;
}

int blk_align_submit(struct blk_node *bs, struct blk_request *req)
{
	bool off_ok = ((req->offset | req->len) & (bs->align - 1)) == 0;

	switch (req->op) {
	case BLK_OP_READ:
		if (off_ok && align_mem_ok(bs, req))
			return bs->drv->submit(bs, req);
		return align_rw(bs, req, off_ok);
	case BLK_OP_WRITE:
		if (off_ok && align_mem_ok(bs, req))
			return align_direct(bs, req, true);
		return align_rw(bs, req, off_ok);
	case BLK_OP_WRITE_ZEROES:
		return off_ok ? align_direct(bs, req, true) : align_wz(bs, req);
	case BLK_OP_DISCARD:
		return off_ok ? align_direct(bs, req, true) : align_discard(bs, req);
	default:
		return align_direct(bs, req, false);
	}
}
