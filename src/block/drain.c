/* Drain: the main thread quiesces a node, the nodes below it and the nodes
 * above it, while every other node keeps serving.
 *
 * Begin: the main thread raises bs->quiesce on every node of the set
 * (seq_cst), then sends a message to each loop that ever submitted to one
 * of them (bs->loops). From then on blk_submit() on those nodes holds
 * requests on a list of the submitting thread. The message runs on the
 * loop's thread after any submit that missed the raised counter; there it
 * waits (re-checking on a short timer) until the thread's in-flight count
 * on the set, kept in its own statistics slots, is zero, and acknowledges.
 * The main thread waits for every acknowledgement. A thread that submits
 * to a node for the first time stores itself in bs->loops before it reads
 * bs->quiesce, the main thread raises quiesce before it reads bs->loops:
 * one of them sees the other. End: the counters drop, and every loop of
 * the set gets a message that resubmits its held requests.
 *
 * Threading: begin and end on the main thread; the messages, timers and
 * held lists on each loop's own thread; struct drain's ack fields under
 * its mutex. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-int.h"
#include "block/graph.h"

#define DRAIN_MAX_NODES 256
#define DRAIN_RECHECK_NS 20000 /* in-flight requests: look again after 20 us */

struct drain;

/* What one loop does for a drain. */
struct drain_slot {
	struct loop_msg msg;
	struct loop_timer timer;
	struct drain *d;
	struct loop *loop;
};

struct drain {
	struct drain *prev; /* main thread: the drains in progress, newest first */
	struct blk_node *bs;
	struct blk_node *nodes[DRAIN_MAX_NODES];
	unsigned n;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned pending;  /* protected by lock: loops that have not acknowledged */
	atomic_uint users; /* main thread + resume messages not run yet */
	struct drain_slot slot[LOOP_MAX_THREADS];
};

/* Requests held by drains, on this thread, oldest first (core.track_next). */
static __thread struct blk_request *held_head, *held_tail;
static struct drain *drains; /* main thread */

/* Append req to the FIFO list head/tail (linked through core.track_next). */
static void held_append(struct blk_request **head, struct blk_request **tail,
			struct blk_request *req)
{
	req->core.track_next = NULL;
	if (*tail)
		(*tail)->core.track_next = req;
	else
		*head = req;
	*tail = req;
}

static void drain_put(struct drain *d)
{
	if (atomic_fetch_sub(&d->users, 1) == 1) {
		pthread_mutex_destroy(&d->lock);
		pthread_cond_destroy(&d->cond);
		free(d);
	}
}

/* ---- the submitting thread ---------------------------------------------- */

int blk_drain_hold(struct blk_node *bs, struct blk_request *req)
{
	struct loop *loop = loop_current();
	unsigned idx = loop_index(loop);

	/* Make sure drain_end() will tell this loop, then look again. */
	if (atomic_load(&bs->loops[idx]) != loop)
		atomic_store(&bs->loops[idx], loop);
	if (!atomic_load(&bs->quiesce))
		return blk_submit_child(bs, req);
	req->loop = loop;
	req->core.node = bs;
	held_append(&held_head, &held_tail, req);
	return 0;
}

static uint64_t slot_in_flight(struct drain *d, unsigned idx)
{
	uint64_t n = 0;

	for (unsigned i = 0; i < d->n; i++) {
		struct blk_stats *st = d->nodes[i]->stats[idx];

		n += st ? st->in_flight : 0;
	}
	return n;
}

static void slot_ack(struct drain *d)
{
	pthread_mutex_lock(&d->lock);
	if (--d->pending == 0)
		pthread_cond_signal(&d->cond);
	pthread_mutex_unlock(&d->lock);
}

static void slot_check(struct drain_slot *s)
{
	if (slot_in_flight(s->d, loop_index(s->loop))) {
		loop_timer_arm(s->loop, &s->timer, loop_now_ns() + DRAIN_RECHECK_NS);
		return;
	}
	slot_ack(s->d);
}

static void slot_timer_cb(struct loop_timer *t)
{
	slot_check(container_of(t, struct drain_slot, timer));
}

static void slot_begin_cb(struct loop_msg *m)
{
	slot_check(container_of(m, struct drain_slot, msg));
}

/* Resubmit the requests of `loop` (the current one) held on this thread
 * whose node no drain holds any longer; keep the others in order. */
static void resume_held(struct loop *loop)
{
	struct blk_request *req = held_head, *keep_head = NULL, *keep_tail = NULL;

	held_head = held_tail = NULL;
	while (req) {
		struct blk_request *next = req->core.track_next;
		struct blk_node *bs = req->core.node;
		int ret;

		if (req->loop != loop || atomic_load(&bs->quiesce)) {
			held_append(&keep_head, &keep_tail, req);
		} else if ((ret = blk_submit(bs, req)) < 0) {
			req->cb(req, ret); /* blk_submit() said 0 when it held it */
		}
		req = next;
	}
	/* Held again while resubmitting (a drain that began meanwhile) went
	 * onto the fresh list: the kept ones go first. */
	if (keep_head) {
		keep_tail->core.track_next = held_head;
		if (!held_head)
			held_tail = keep_tail;
		held_head = keep_head;
	}
}

static void slot_resume_cb(struct loop_msg *m)
{
	struct drain_slot *s = container_of(m, struct drain_slot, msg);

	resume_held(s->loop);
	drain_put(s->d);
}

/* ---- the main thread ------------------------------------------------------- */

static bool drain_has(const struct drain *d, const struct blk_node *bs)
{
	for (unsigned i = 0; i < d->n; i++)
		if (d->nodes[i] == bs)
			return true;
	return false;
}

static int drain_add(struct drain *d, struct blk_node *bs)
{
	if (drain_has(d, bs))
		return 0;
	if (d->n == DRAIN_MAX_NODES)
		return -ELOOP;
	d->nodes[d->n++] = bs;
	return 0;
}

static int drain_add_below(struct blk_node *bs, void *opaque)
{
	return drain_add(opaque, bs);
}

/* Every node above bs (they forward into it), but not their other children. */
static int drain_collect_up(struct drain *d, struct blk_node *bs, unsigned depth)
{
	struct blk_node *p[BLK_MAX_CHILDREN * 4];
	unsigned n = blk_parents(bs, p, ARRAY_SIZE(p));
	int ret = 0;

	if (n > ARRAY_SIZE(p) || depth > DRAIN_MAX_NODES)
		return -E2BIG;
	for (unsigned i = 0; i < n && !ret; i++) {
		if (drain_has(d, p[i]))
			continue;
		ret = drain_add(d, p[i]);
		if (!ret)
			ret = drain_collect_up(d, p[i], depth + 1);
	}
	return ret;
}

/* bs, its subtree, and every node above it. */
static int drain_collect(struct drain *d, struct blk_node *bs)
{
	int ret = blk_walk(bs, drain_add_below, d);

	return ret ? ret : drain_collect_up(d, bs, 0);
}

/* Send cb to each loop of the set but the caller's and the control loop
 * (blk_ctl_enter: it runs only inside synchronous work on this thread,
 * which has nothing in flight or held once it returns); returns how many. */
static unsigned drain_send(struct drain *d, void (*cb)(struct loop_msg *m), bool skip_self)
{
	struct loop *self = loop_current(), *ctl = blk_ctl_loop();
	/* The loop a control callback blocks (blk_ctl_outer) cannot answer;
	 * it submits nothing meanwhile, and what it submitted before (an open
	 * at start-up) has finished. It still gets the resume message. */
	struct loop *outer = skip_self ? blk_ctl_outer() : NULL;
	bool seen[LOOP_MAX_THREADS] = {false};
	unsigned sent = 0;

	for (unsigned i = 0; i < d->n; i++)
		for (unsigned idx = 0; idx < LOOP_MAX_THREADS; idx++) {
			struct loop *l = atomic_load(&d->nodes[i]->loops[idx]);

			if (!l || seen[idx] || l == self || l == ctl || l == outer)
				continue;
			seen[idx] = true;
			d->slot[idx] = (struct drain_slot){
				.msg.cb = cb, .timer.cb = slot_timer_cb, .d = d, .loop = l};
			if (!skip_self)
				atomic_fetch_add(&d->users, 1);
			else
				sent++;
			loop_send(l, &d->slot[idx].msg);
		}
	return sent;
}

static struct drain *drain_new(struct blk_node *bs)
{
	struct drain *d = calloc(1, sizeof(*d));

	if (!d)
		return NULL;
	d->bs = bs;
	atomic_init(&d->users, 1);
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
	if (drain_collect(d, bs)) {
		drain_put(d);
		return NULL;
	}
	return d;
}

int blk_drain_begin(struct blk_node *bs)
{
	struct drain *d = drain_new(bs);
	struct loop *self = loop_current();
	unsigned sent;

	if (!d)
		return -ENOMEM;
	for (unsigned i = 0; i < d->n; i++)
		atomic_fetch_add(&d->nodes[i]->quiesce, 1);
	pthread_mutex_lock(&d->lock);
	d->pending = UINT32_MAX; /* no acknowledgement counts before all are sent */
	pthread_mutex_unlock(&d->lock);
	sent = drain_send(d, slot_begin_cb, true);
	pthread_mutex_lock(&d->lock);
	d->pending -= UINT32_MAX - sent;
	pthread_mutex_unlock(&d->lock);
	/* Requests the main thread itself has in flight (tools, tests) finish
	 * on its own loop. */
	while (self && slot_in_flight(d, loop_index(self)))
		loop_run_once(self, true);
	pthread_mutex_lock(&d->lock);
	while (d->pending)
		pthread_cond_wait(&d->cond, &d->lock);
	pthread_mutex_unlock(&d->lock);
	d->prev = drains;
	drains = d;
	return 0;
}

void blk_drain_end(struct blk_node *bs)
{
	struct drain **pp, *d;

	for (pp = &drains; (d = *pp) && d->bs != bs; pp = &d->prev)
		;
	if (!d)
		return;
	*pp = d->prev;
	for (unsigned i = 0; i < d->n; i++)
		atomic_fetch_sub(&d->nodes[i]->quiesce, 1);
	/* Every loop; the caller's own held requests go on at once. */
	drain_send(d, slot_resume_cb, false);
	if (loop_current())
		resume_held(loop_current());
	drain_put(d);
}

bool blk_drained(const struct blk_node *bs)
{
	return atomic_load(&bs->quiesce) != 0;
}

/* ---- retargeting held requests (blk_replace_node) ------------------------ */

struct retarget {
	struct blk_node *from, *to;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned pending; /* protected by lock */
	struct retarget_slot {
		struct loop_msg msg;
		struct retarget *r;
	} slot[LOOP_MAX_THREADS];
};

/* This thread's held requests for from go to `to` when they resume. */
static void retarget_held(struct blk_node *from, struct blk_node *to)
{
	for (struct blk_request *req = held_head; req; req = req->core.track_next)
		if (req->core.node == from)
			req->core.node = to;
}

static void retarget_cb(struct loop_msg *m)
{
	struct retarget_slot *s = container_of(m, struct retarget_slot, msg);
	struct retarget *r = s->r;

	retarget_held(r->from, r->to);
	pthread_mutex_lock(&r->lock);
	if (--r->pending == 0)
		pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

/* Only threads that ever submitted to from can hold requests for it
 * (blk_drain_hold() records them in from->loops first). The callers made
 * every user submit to `to` before this: a thread reads the new node once
 * it has run our message, so nothing is held for from afterwards. */
void blk_drain_retarget(struct blk_node *from, struct blk_node *to)
{
	static struct retarget rt; /* main thread, one at a time */
	struct retarget *r = &rt;
	struct loop *self = loop_current(), *ctl = blk_ctl_loop(), *outer = blk_ctl_outer();

	memset(r, 0, sizeof(*r));
	r->from = from;
	r->to = to;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	pthread_mutex_lock(&r->lock);
	for (unsigned idx = 0; idx < LOOP_MAX_THREADS; idx++) {
		struct loop *l = atomic_load(&from->loops[idx]);

		if (!l)
			continue;
		/* The requests it holds are to's now: a later drain or retarget
		 * of `to` must ask that loop too. */
		if (atomic_load(&to->loops[idx]) != l)
			atomic_store(&to->loops[idx], l);
		if (l == self || l == ctl || l == outer) /* this thread's: below */
			continue;
		r->slot[idx] = (struct retarget_slot){.msg.cb = retarget_cb, .r = r};
		r->pending++;
		loop_send(l, &r->slot[idx].msg);
	}
	while (r->pending)
		pthread_cond_wait(&r->cond, &r->lock);
	pthread_mutex_unlock(&r->lock);
	retarget_held(from, to); /* the caller's own thread */
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->cond);
}
