/* `throttle` filter driver: requests pass to the `file` child as they are,
 * at the rate the node's throttle group allows (throttle-group.c). Reads,
 * writes and write-zeroes are limited, as in QEMU; flush, discard and block
 * status pass at once. A request over the limit waits, in order, in its
 * iothread's queue for its direction (a waiting write does not hold reads
 * back), and a timer on that iothread lets it go when the group's buckets
 * have drained enough (looking again after 1 to 100 ms, see THR_BATCH_NS
 * and THR_RECHECK_NS): nothing is failed or dropped, and nothing spins.
 * A request waiting here counts as in flight on the node, so a drain waits
 * until the queues have emptied.
 *
 * Threading: the per-iothread queues and timer (struct thr_thread) belong to
 * that iothread; the group is shared (its lock); the node's state is
 * read-only after open. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-driver.h"
#include "block/throttle-group.h"
#include "loop/loop.h"
#include "util/compiler.h"
#include "util/opts.h"
#include "util/trace.h"

#define THR_QUEUE_MIN 64
/* A waiting queue is looked at again no sooner than this: at 20000 IOPS
 * that lets go about 20 requests per timer instead of one, and costs no
 * accuracy, since the group's buckets (a tenth of a second of the limit,
 * or of the burst rate) keep leaking meanwhile. */
#define THR_BATCH_NS 1000000ull
/* ... and no later than this, whatever the wait: limits changed at run time
 * (qom-set) reach requests already waiting within a tenth of a second. */
#define THR_RECHECK_NS 100000000ull

struct thr_wait {
	struct blk_request *req;
	uint64_t since_ns; /* when it began to wait */
};

struct thr_queue {
	struct thr_wait *ring; /* FIFO of waiting requests */
	unsigned cap, head, n;
};

struct thr_thread {
	struct blk_node *bs;
	struct loop *loop;
	struct blk_stats *st; /* the node's statistics slot for this thread */
	struct loop_timer timer;
	struct thr_queue q[2]; /* [0] reads, [1] writes and write-zeroes */
};

struct thr_state {
	struct throttle_group *group;
};

static bool thr_limited(uint8_t op)
{
	return op == BLK_OP_READ || op == BLK_OP_WRITE || op == BLK_OP_WRITE_ZEROES;
}

static int thr_push(struct thr_queue *q, struct blk_request *req, uint64_t now)
{
	if (q->n == q->cap) {
		unsigned cap = q->cap ? 2 * q->cap : THR_QUEUE_MIN;
		struct thr_wait *r = malloc(cap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		for (unsigned i = 0; i < q->n; i++)
			r[i] = q->ring[(q->head + i) % q->cap];
		free(q->ring);
		q->ring = r;
		q->cap = cap;
		q->head = 0;
	}
	q->ring[(q->head + q->n) % q->cap] = (struct thr_wait){.req = req, .since_ns = now};
	q->n++;
	return 0;
}

/* The oldest request leaves the queue; its wait is counted. */
static void thr_pop(struct thr_thread *t, struct thr_queue *q, uint64_t now)
{
	struct thr_wait *w = &q->ring[q->head];

	IOPLANE_TRACE(throttle_wait_end, t->bs->name, w->req, now - w->since_ns);
	t->st->throttle_waits++;
	t->st->throttle_wait_ns += now > w->since_ns ? now - w->since_ns : 0;
	q->head = (q->head + 1) % q->cap;
	q->n--;
}

static uint64_t thr_deadline(uint64_t now, uint64_t wait)
{
	if (wait < THR_BATCH_NS)
		return now + THR_BATCH_NS;
	return now + (wait > THR_RECHECK_NS ? THR_RECHECK_NS : wait);
}

/* Let go what the group allows now, oldest first per direction; arm the
 * timer for the earliest request that must still wait. */
static void thr_release(struct thr_thread *t)
{
	struct thr_state *s = t->bs->opaque;
	uint64_t now = loop_now_ns(), next = 0;

	for (int w = 0; w < 2; w++) {
		struct thr_queue *q = &t->q[w];

		while (q->n) {
			struct blk_request *req = q->ring[q->head].req;
			uint64_t wait = throttle_group_admit(s->group, w, req->len, now);
			int ret;

			if (wait) {
				wait = thr_deadline(now, wait);
				next = next && next < wait ? next : wait;
				break;
			}
			thr_pop(t, q, now);
			ret = blk_forward(t->bs, req);
			if (ret)
				blk_complete(req, ret);
		}
	}
	if (next)
		loop_timer_arm(t->loop, &t->timer, next);
}

static void thr_timer_cb(struct loop_timer *timer)
{
	thr_release(container_of(timer, struct thr_thread, timer));
}

static void *thr_thread_new(struct blk_node *bs, struct loop *loop)
{
	struct thr_thread *t = calloc(1, sizeof(*t));

	if (!t)
		return NULL;
	t->st = blk_stats_slot(bs, loop);
	if (!t->st) {
		free(t);
		return NULL;
	}
	t->bs = bs;
	t->loop = loop;
	t->timer.cb = thr_timer_cb;
	return t;
}

static int thr_submit(struct blk_node *bs, struct blk_request *req)
{
	struct thr_state *s = bs->opaque;
	struct thr_thread *t;
	bool w = req->op != BLK_OP_READ;
	uint64_t wait, now;

	if (!thr_limited(req->op))
		return blk_forward(bs, req);
	t = blk_thread_state(bs, req->loop, thr_thread_new);
	if (!t)
		return -ENOMEM;
	now = loop_now_ns();
	if (!t->q[w].n) {
		wait = throttle_group_admit(s->group, w, req->len, now);
		if (!wait)
			return blk_forward(bs, req);
		wait = thr_deadline(now, wait);
		if (!loop_timer_armed(&t->timer) || t->timer.deadline_ns > wait)
			loop_timer_arm(t->loop, &t->timer, wait);
	}
	IOPLANE_TRACE(throttle_wait_begin, bs->name, req, w);
	return thr_push(&t->q[w], req, now);
}

static void thr_thread_free(struct thr_thread *t)
{
	if (!t)
		return;
	if (loop_timer_armed(&t->timer))
		loop_timer_cancel(t->loop, &t->timer);
	free(t->q[0].ring);
	free(t->q[1].ring);
	free(t);
}

static void thr_detach_loop(struct blk_node *bs, struct loop *loop)
{
	struct thr_thread **slot = (struct thr_thread **)&bs->thread_state[loop_index(loop)];

	thr_thread_free(*slot);
	*slot = NULL;
}

static int thr_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	const char *id = kv_get(opts, "throttle-group");
	struct throttle_group *g;
	struct thr_state *s;

	if (!id) {
		snprintf(err, errlen, "Parameter 'throttle-group' is missing");
		return -EINVAL;
	}
	g = throttle_group_find(id);
	if (!g) {
		snprintf(err, errlen, "Throttle group '%s' does not exist", id);
		return -ENOENT;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->group = g;
	g->users++;
	bs->opaque = s;
	bs->size = bs->next->size;
	bs->align = bs->next->align;
	bs->mem_align = bs->next->mem_align;
	return 0;
}

static void thr_close(struct blk_node *bs)
{
	struct thr_state *s = bs->opaque;

	for (unsigned i = 0; i < LOOP_MAX_THREADS; i++) {
		thr_thread_free(bs->thread_state[i]);
		bs->thread_state[i] = NULL;
	}
	if (s)
		s->group->users--;
	free(s);
}

const char *throttle_node_group(const struct blk_node *bs)
{
	const struct thr_state *s = bs->opaque;

	return bs->drv == &blk_drv_throttle && s ? s->group->id : NULL;
}

static int thr_truncate(struct blk_node *bs, uint64_t size)
{
	int ret = blk_truncate(bs->next, size);

	if (!ret)
		bs->size = bs->next->size;
	return ret;
}

static bool thr_can_discard(struct blk_node *bs)
{
	return bs->next->has_discard;
}
static bool thr_can_wz(struct blk_node *bs)
{
	return bs->next->has_write_zeroes;
}
static bool thr_can_fua(struct blk_node *bs)
{
	return bs->next->has_fua;
}
static bool thr_can_bs(struct blk_node *bs)
{
	return bs->next->has_block_status;
}
static bool thr_can_mc(struct blk_node *bs)
{
	return blk_children_can_multi_conn(bs);
}

const struct blk_driver blk_drv_throttle = {
	.name = "throttle",
	.is_format = true,
	.open = thr_open,
	.close = thr_close,
	.submit = thr_submit,
	.truncate = thr_truncate,
	.detach_loop = thr_detach_loop,
	.can_discard = thr_can_discard,
	.can_write_zeroes = thr_can_wz,
	.can_fua = thr_can_fua,
	.can_block_status = thr_can_bs,
	.can_multi_conn = thr_can_mc,
};
