/* Copy state of a node being copied to a target: the granules still to
 * copy, the ranges in flight, the waiters (block-copy.h), and the copy of
 * one claimed range.
 *
 * Threading: struct bcopy under its lock; an op runs on the loop that
 * started it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-copy.h"
#include "block/dirty-bitmap.h"

int bcopy_init(struct bcopy *s, uint64_t size, uint32_t gran, bool all)
{
	memset(s, 0, sizeof(*s));
	s->todo = blk_dirty_bitmap_new("", size, gran);
	if (!s->todo)
		return -ENOMEM;
	if (all)
		blk_dirty_bitmap_set(s->todo, 0, size);
	s->size = size;
	s->gran = gran;
	pthread_mutex_init(&s->lock, NULL);
	return 0;
}

void bcopy_destroy(struct bcopy *s)
{
	if (!s->todo)
		return;
	blk_dirty_bitmap_free(s->todo);
	s->todo = NULL;
	pthread_mutex_destroy(&s->lock);
}

uint64_t bcopy_remaining(struct bcopy *s)
{
	uint64_t n;

	pthread_mutex_lock(&s->lock);
	n = blk_dirty_bitmap_count(s->todo);
	pthread_mutex_unlock(&s->lock);
	return n;
}

bool bcopy_busy(struct bcopy *s)
{
	bool busy;

	pthread_mutex_lock(&s->lock);
	busy = s->inflight != NULL;
	pthread_mutex_unlock(&s->lock);
	return busy;
}

void bcopy_mark(struct bcopy *s, uint64_t off, uint64_t len)
{
	pthread_mutex_lock(&s->lock);
	blk_dirty_bitmap_set(s->todo, off, len);
	pthread_mutex_unlock(&s->lock);
}

void bcopy_skip(struct bcopy *s, uint64_t off, uint64_t len)
{
	pthread_mutex_lock(&s->lock);
	blk_dirty_bitmap_clear(s->todo, off, len);
	pthread_mutex_unlock(&s->lock);
}

/* [lo, hi) rounded out to granules, clamped to the size. */
static void gran_round(const struct bcopy *s, uint64_t off, uint64_t len, uint64_t *lo,
		       uint64_t *hi)
{
	uint64_t end = off + len;

	*lo = off & ~(uint64_t)(s->gran - 1);
	*hi = end > s->size ? s->size : end;
	*hi = (*hi + s->gran - 1) & ~(uint64_t)(s->gran - 1);
	if (*hi > s->size)
		*hi = s->size;
}

static bool overlaps_inflight(const struct bcopy *s, uint64_t lo, uint64_t hi)
{
	for (const struct bcopy_range *r = s->inflight; r; r = r->next)
		if (r->lo < hi && lo < r->hi)
			return true;
	return false;
}

/* Cut [*lo, *hi) so that it overlaps nothing in flight: false if nothing
 * is left at *lo (then *lo is where to look on). */
static bool trim_inflight(const struct bcopy *s, uint64_t *lo, uint64_t *hi)
{
	for (const struct bcopy_range *r = s->inflight; r; r = r->next) {
		if (!(r->lo < *hi && *lo < r->hi))
			continue;
		if (r->lo <= *lo) {
			*lo = r->hi;
			return false;
		}
		*hi = r->lo;
	}
	return *lo < *hi;
}

/* Claim [lo, lo+len) (todo bits set, nothing in flight over it). */
static void claim(struct bcopy *s, uint64_t lo, uint64_t len, struct bcopy_range *r)
{
	r->lo = lo;
	r->hi = lo + len > s->size ? s->size : lo + len;
	r->off = r->lo;
	r->len = r->hi - r->lo;
	r->write = false;
	blk_dirty_bitmap_clear(s->todo, r->lo, r->hi - r->lo);
	r->next = s->inflight;
	s->inflight = r;
}

/* The first claimable run in [from, end), at most max bytes: true and r. */
static bool claim_first(struct bcopy *s, uint64_t from, uint64_t end, uint64_t max,
			struct bcopy_range *r)
{
	uint64_t pos = from & ~(uint64_t)(s->gran - 1);

	max = max < s->gran ? s->gran : max & ~(uint64_t)(s->gran - 1);
	while (pos < end && !s->broken) {
		bool dirty;
		uint64_t n = blk_dirty_bitmap_extent(s->todo, pos, end - pos, &dirty);
		uint64_t lo = pos, hi = pos + (n > max ? max : n);

		if (dirty && trim_inflight(s, &lo, &hi)) {
			claim(s, lo, hi - lo, r);
			return true;
		}
		pos = dirty && lo > pos ? lo : pos + n;
	}
	return false;
}

bool bcopy_claim_next(struct bcopy *s, uint64_t from, uint64_t max, struct bcopy_range *r)
{
	bool got;

	pthread_mutex_lock(&s->lock);
	got = from < s->size && claim_first(s, from, s->size, max, r);
	pthread_mutex_unlock(&s->lock);
	return got;
}

static void add_waiter(struct bcopy *s, struct bcopy_waiter *w, uint64_t lo, uint64_t hi)
{
	w->lo = lo;
	w->hi = hi;
	w->next = s->waiters;
	s->waiters = w;
}

int bcopy_claim_in(struct bcopy *s, uint64_t off, uint64_t len, uint64_t max, struct bcopy_range *r,
		   struct bcopy_waiter *w)
{
	uint64_t lo, hi;
	int ret = 0;

	if (!len || off >= s->size)
		return 0;
	gran_round(s, off, len, &lo, &hi);
	pthread_mutex_lock(&s->lock);
	if (overlaps_inflight(s, lo, hi)) {
		add_waiter(s, w, lo, hi);
		ret = -EAGAIN;
	} else if (claim_first(s, lo, hi, max, r)) {
		ret = 1;
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

int bcopy_write_begin(struct bcopy *s, uint64_t off, uint64_t len, struct bcopy_range *r,
		      struct bcopy_waiter *w)
{
	uint64_t lo, hi;
	int ret = 0;

	gran_round(s, off, len, &lo, &hi);
	pthread_mutex_lock(&s->lock);
	if (overlaps_inflight(s, lo, hi)) {
		add_waiter(s, w, lo, hi);
		ret = -EAGAIN;
	} else {
		*r = (struct bcopy_range){
			.lo = lo, .hi = hi, .off = off, .len = len, .write = true};
		r->next = s->inflight;
		s->inflight = r;
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

/* The granules [off, off+len) covers wholly, or the tail to the size. */
static void clear_covered(struct bcopy *s, uint64_t off, uint64_t len)
{
	uint64_t lo = (off + s->gran - 1) & ~(uint64_t)(s->gran - 1);
	uint64_t end = off + len, hi = end & ~(uint64_t)(s->gran - 1);

	if (end >= s->size)
		hi = s->size;
	if (lo < hi)
		blk_dirty_bitmap_clear(s->todo, lo, hi - lo);
}

/* Take the waiters overlapping [lo, hi) (all: hi == UINT64_MAX) off the list. */
static struct bcopy_waiter *take_waiters(struct bcopy *s, uint64_t lo, uint64_t hi)
{
	struct bcopy_waiter **pp = &s->waiters, *out = NULL, *w;

	while ((w = *pp)) {
		if (w->lo < hi && lo < w->hi) {
			*pp = w->next;
			w->next = out;
			out = w;
		} else {
			pp = &w->next;
		}
	}
	return out;
}

static void wake_list(struct bcopy_waiter *w)
{
	while (w) {
		struct bcopy_waiter *next = w->next;

		w->next = NULL;
		w->wake(w);
		w = next;
	}
}

void bcopy_end(struct bcopy *s, struct bcopy_range *r, int ret)
{
	struct bcopy_range **pp;
	struct bcopy_waiter *w;

	pthread_mutex_lock(&s->lock);
	for (pp = &s->inflight; *pp && *pp != r; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = r->next;
	if (r->write && ret == 0)
		clear_covered(s, r->off, r->len);
	else if (!r->write && ret < 0 && !s->broken)
		blk_dirty_bitmap_set(s->todo, r->lo, r->hi - r->lo);
	if (ret < 0 && !r->write && !s->error)
		s->error = ret;
	w = take_waiters(s, r->lo, r->hi);
	pthread_mutex_unlock(&s->lock);
	wake_list(w);
}

void bcopy_wake_all(struct bcopy *s)
{
	struct bcopy_waiter *w;

	pthread_mutex_lock(&s->lock);
	w = take_waiters(s, 0, UINT64_MAX);
	pthread_mutex_unlock(&s->lock);
	wake_list(w);
}

/* ---- one op: read the range from source, write it to target ---- */

static bool buf_is_zero(const void *buf, size_t n)
{
	const unsigned char *p = buf;

	return !n || (!p[0] && !memcmp(p, p + 1, n - 1));
}

static void op_finish(struct bcopy_op *op, int ret)
{
	bcopy_end(op->s, &op->r, ret);
	op->cb(op, ret);
}

static void op_written(struct blk_request *req, int ret)
{
	op_finish(req->opaque, ret);
}

static void op_read(struct blk_request *req, int ret)
{
	struct bcopy_op *op = req->opaque;
	uint64_t len = op->r.hi - op->r.lo;

	op->read_failed = ret < 0;
	if (ret == 0) {
		op->zero = buf_is_zero(op->buf, len);
		op->req = (struct blk_request){
			.op = op->zero ? BLK_OP_WRITE_ZEROES : BLK_OP_WRITE,
			.offset = op->r.lo,
			.len = len,
			.iov = op->zero ? NULL : &op->iov,
			.iovcnt = op->zero ? 0 : 1,
			.cb = op_written,
			.opaque = op,
		};
		ret = blk_submit_child(op->s->target, &op->req);
		if (ret == 0)
			return;
	}
	op_finish(op, ret);
}

int bcopy_op_start(struct bcopy_op *op)
{
	uint64_t len = op->r.hi - op->r.lo;
	int ret;

	op->zero = false;
	op->read_failed = false;
	op->iov = (struct iovec){.iov_base = op->buf, .iov_len = len};
	op->req = (struct blk_request){
		.op = BLK_OP_READ,
		.offset = op->r.lo,
		.len = len,
		.iov = &op->iov,
		.iovcnt = 1,
		.cb = op_read,
		.opaque = op,
	};
	ret = blk_submit_child(op->s->source, &op->req);
	if (ret)
		bcopy_end(op->s, &op->r, ret);
	return ret;
}
