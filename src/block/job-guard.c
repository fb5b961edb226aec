/* The write guard of a job (driver "x-job-guard", not for blockdev-add): a
 * filter node that a job puts above the node it copies into while guest
 * writes go there too (stream). Guest writes, write-zeroes and discards
 * that overlap a range the job has locked wait until it is unlocked; a
 * lock waits for the overlapping guest writes already in flight. Reads,
 * flushes and block status pass as they are. While no job range is locked
 * a write costs a lock, an allocation and a list entry.
 *
 * THREADING RULE: guest requests run on their own loops, the locks on the
 * job loop; struct job_guard's lists are protected by its mutex. Insert and
 * remove on the main thread. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-driver.h"
#include "block/graph.h"
#include "block/job.h"
#include "loop/coroutine.h"
#include "util/opts.h"

#define GUARD_MAX_LOCKS 64

struct guard_write {
	struct loop_msg msg; /* resubmission on the writer's loop */
	struct blk_request child;
	struct blk_request *parent;
	struct job_guard *g;
	uint64_t off, end;
	struct guard_write *prev, *next; /* in flight or waiting */
};

struct job_guard {
	struct blk_node *node, *below;
	pthread_mutex_t lock;
	/* Protected by lock: */
	struct {
		uint64_t off, end;
	} locks[GUARD_MAX_LOCKS];
	unsigned nlocks;
	struct guard_write *inflight;               /* doubly linked */
	struct guard_write *waiting, *waiting_tail; /* FIFO, singly linked */
	bool job_waiting;                           /* job_guard_lock() waits */
	uint64_t wait_off, wait_end;
	/* The waiting lock's coroutine and loop (job loop). */
	struct coroutine *co;
	struct loop *job_loop;
	struct loop_msg wake;
};

static bool overlaps(uint64_t a, uint64_t ae, uint64_t b, uint64_t be)
{
	return a < be && b < ae;
}

static bool locked_range(const struct job_guard *g, uint64_t off, uint64_t end)
{
	for (unsigned i = 0; i < g->nlocks; i++)
		if (overlaps(off, end, g->locks[i].off, g->locks[i].end))
			return true;
	return false;
}

static bool write_in_flight(const struct job_guard *g, uint64_t off, uint64_t end)
{
	for (const struct guard_write *w = g->inflight; w; w = w->next)
		if (overlaps(off, end, w->off, w->end))
			return true;
	return false;
}

static void inflight_add(struct job_guard *g, struct guard_write *w)
{
	w->prev = NULL;
	w->next = g->inflight;
	if (g->inflight)
		g->inflight->prev = w;
	g->inflight = w;
}

/* Under the lock: remove w, and wake a lock that waited for it. */
static void inflight_del(struct job_guard *g, struct guard_write *w)
{
	if (w->prev)
		w->prev->next = w->next;
	else
		g->inflight = w->next;
	if (w->next)
		w->next->prev = w->prev;
	if (g->job_waiting && !write_in_flight(g, g->wait_off, g->wait_end)) {
		g->job_waiting = false;
		loop_send(g->job_loop, &g->wake);
	}
}

static void guard_child_cb(struct blk_request *req, int ret)
{
	struct guard_write *w = req->opaque;
	struct job_guard *g = w->g;
	struct blk_request *parent = w->parent;

	pthread_mutex_lock(&g->lock);
	inflight_del(g, w);
	pthread_mutex_unlock(&g->lock);
	free(w);
	blk_complete(parent, ret);
}

static int guard_send(struct guard_write *w)
{
	struct job_guard *g = w->g;
	int ret = blk_submit_child(g->below, &w->child);

	if (ret) {
		pthread_mutex_lock(&g->lock);
		inflight_del(g, w);
		pthread_mutex_unlock(&g->lock);
	}
	return ret;
}

static void guard_resubmit_cb(struct loop_msg *m)
{
	struct guard_write *w = (struct guard_write *)m;
	struct blk_request *parent = w->parent;
	int ret = guard_send(w);

	if (ret) {
		free(w);
		blk_complete(parent, ret);
	}
}

static int guard_submit(struct blk_node *bs, struct blk_request *req)
{
	struct job_guard *g = bs->opaque;
	struct guard_write *w;
	bool wait;
	int ret;

	if (req->op != BLK_OP_WRITE && req->op != BLK_OP_WRITE_ZEROES && req->op != BLK_OP_DISCARD)
		return blk_forward(bs, req);
	w = malloc(sizeof(*w));
	if (!w)
		return -ENOMEM;
	*w = (struct guard_write){
		.parent = req, .g = g, .off = req->offset, .end = req->offset + req->len};
	w->child = (struct blk_request){.op = req->op,
					.flags = req->flags,
					.offset = req->offset,
					.len = req->len,
					.iov = req->iov,
					.iovcnt = req->iovcnt,
					.cb = guard_child_cb,
					.opaque = w};
	w->msg.cb = guard_resubmit_cb;
	pthread_mutex_lock(&g->lock);
	wait = locked_range(g, w->off, w->end);
	if (wait) {
		if (g->waiting_tail)
			g->waiting_tail->next = w;
		else
			g->waiting = w;
		g->waiting_tail = w;
	} else {
		inflight_add(g, w);
	}
	pthread_mutex_unlock(&g->lock);
	if (wait)
		return 0;
	ret = guard_send(w);
	if (ret)
		free(w);
	return ret;
}

static void guard_wake_cb(struct loop_msg *m)
{
	struct job_guard *g = (struct job_guard *)((char *)m - offsetof(struct job_guard, wake));

	coroutine_enter(g->co);
}

void job_guard_lock(struct job_guard *g, uint64_t off, uint64_t len)
{
	bool wait;

	pthread_mutex_lock(&g->lock);
	/* Chunks in flight are at most max_inflight; past the table a lock
	 * would not be kept, so the caller's bound must stay below it. */
	if (g->nlocks < GUARD_MAX_LOCKS) {
		g->locks[g->nlocks].off = off;
		g->locks[g->nlocks].end = off + len;
		g->nlocks++;
	}
	wait = write_in_flight(g, off, off + len);
	if (wait) {
		g->job_waiting = true;
		g->wait_off = off;
		g->wait_end = off + len;
		g->co = coroutine_self();
		g->job_loop = loop_current();
	}
	pthread_mutex_unlock(&g->lock);
	if (wait)
		coroutine_yield(); /* guard_wake_cb */
}

void job_guard_unlock(struct job_guard *g, uint64_t off, uint64_t len)
{
	struct guard_write *go = NULL, **tail = &go, *w, *keep = NULL, *keep_tail = NULL;

	pthread_mutex_lock(&g->lock);
	for (unsigned i = 0; i < g->nlocks; i++)
		if (g->locks[i].off == off && g->locks[i].end == off + len) {
			g->locks[i] = g->locks[--g->nlocks];
			break;
		}
	for (w = g->waiting; w;) {
		struct guard_write *n = w->next;

		w->next = NULL;
		if (locked_range(g, w->off, w->end)) {
			if (keep_tail)
				keep_tail->next = w;
			else
				keep = w;
			keep_tail = w;
		} else {
			*tail = w;
			tail = &w->prev; /* the go list is linked through prev */
		}
		w = n;
	}
	g->waiting = keep;
	g->waiting_tail = keep_tail;
	for (w = go; w;) {
		struct guard_write *n = w->prev;

		inflight_add(g, w);
		loop_send(w->parent->loop, &w->msg);
		w = n;
	}
	pthread_mutex_unlock(&g->lock);
}

struct blk_node *job_guard_node(struct job_guard *g)
{
	return g->node;
}

/* ---- the driver ---------------------------------------------------------------- */

static int guard_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	struct job_guard *g = calloc(1, sizeof(*g));

	(void)opts;
	if (!g) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	pthread_mutex_init(&g->lock, NULL);
	g->node = bs;
	g->below = bs->next;
	g->wake.cb = guard_wake_cb;
	bs->opaque = g;
	bs->size = bs->next->size;
	bs->align = bs->next->align;
	bs->mem_align = bs->next->mem_align;
	return 0;
}

static void guard_close(struct blk_node *bs)
{
	struct job_guard *g = bs->opaque;

	if (!g)
		return;
	pthread_mutex_destroy(&g->lock);
	free(g);
	bs->opaque = NULL;
}

static bool guard_can_discard(struct blk_node *bs)
{
	return bs->next->has_discard;
}
static bool guard_can_wz(struct blk_node *bs)
{
	return bs->next->has_write_zeroes;
}
static bool guard_can_fua(struct blk_node *bs)
{
	return bs->next->has_fua;
}
static bool guard_can_bs(struct blk_node *bs)
{
	return bs->next->has_block_status;
}
static bool guard_can_mc(struct blk_node *bs)
{
	return blk_children_can_multi_conn(bs);
}

static const struct blk_driver guard_drv = {
	.name = "x-job-guard",
	.is_format = true,
	.open = guard_open,
	.close = guard_close,
	.submit = guard_submit,
	.can_discard = guard_can_discard,
	.can_write_zeroes = guard_can_wz,
	.can_fua = guard_can_fua,
	.can_block_status = guard_can_bs,
	.can_multi_conn = guard_can_mc,
};

/* ---- insert and remove (main) ---------------------------------------------------- */

static int guard_open_node(struct blk_node *bs, const char *name, struct blk_node **out, char *err,
			   size_t errlen)
{
	struct kv_opts o = {0};
	int ret;

	if (!blk_find_driver(guard_drv.name))
		blk_register_driver(&guard_drv);
	blk_ref(bs, NULL); /* the filter's `file` link takes it over */
	ret = blk_open_node(guard_drv.name, bs, NULL, 0, &o, out, err, errlen);
	kv_free(&o);
	if (!ret && name && blk_node_set_name(*out, name, err, errlen)) {
		blk_close(*out);
		ret = -EINVAL;
	}
	return ret;
}

static int guard_swap(struct blk_node *from, struct blk_node *to, char *err, size_t errlen)
{
	int ret = blk_drain_begin(from);

	if (ret) {
		snprintf(err, errlen, "Could not drain node '%s'", blk_node_name(from));
		return ret;
	}
	ret = blk_drain_begin(to);
	if (!ret) {
		ret = blk_replace_node(from, to, err, errlen);
		blk_drain_end(to);
	} else {
		snprintf(err, errlen, "Could not drain node '%s'", blk_node_name(to));
	}
	blk_drain_end(from);
	return ret;
}

int job_guard_insert(struct blk_node *bs, const char *name, struct job_guard **out, char *err,
		     size_t errlen)
{
	struct blk_node *f;
	int ret = guard_open_node(bs, name, &f, err, errlen);

	if (ret)
		return ret;
	ret = guard_swap(bs, f, err, errlen);
	if (ret) {
		blk_close(f);
		return ret;
	}
	*out = f->opaque;
	return 0;
}

void job_guard_remove(struct job_guard *g)
{
	struct blk_node *f = g->node, *bs = g->below;
	char err[256];

	if (guard_swap(f, bs, err, sizeof(err)))
		return; /* keeps serving through the filter */
	blk_close(f);
}
