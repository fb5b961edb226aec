/* qcow2: coroutine plumbing. Wait queues and a coroutine mutex that work
 * across loops (a waiter is resumed by a message to its own loop), child I/O
 * issued from a coroutine, blocking work on the thread pool, and running a
 * coroutine to completion from synchronous code.
 *
 * Threading: everything runs on the calling loop's thread; wait queues are
 * protected by the image's s->lock. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"
#include "loop/thread-pool.h"
#include "util/iov.h"
#include "util/compiler.h"

static void qc_waiter_msg(struct loop_msg *m)
{
	struct qc_waiter *w = container_of(m, struct qc_waiter, msg);

	coroutine_enter(w->co);
}

void qc_wait(struct qc_state *s, struct qc_waitq *q)
{
	struct qc_waiter w = {.co = coroutine_self(), .loop = loop_current()};

	w.msg.cb = qc_waiter_msg;
	if (q->tail)
		q->tail->next = &w;
	else
		q->head = &w;
	q->tail = &w;
	pthread_mutex_unlock(&s->lock);
	coroutine_yield();
	pthread_mutex_lock(&s->lock);
}

static struct qc_waiter *qc_waitq_pop(struct qc_waitq *q)
{
	struct qc_waiter *w = q->head;

	if (w) {
		q->head = w->next;
		if (!q->head)
			q->tail = NULL;
	}
	return w;
}

/* The waiter's frame may be gone as soon as its message is sent. */
void qc_wake_all(struct qc_waitq *q)
{
	struct qc_waiter *w;

	while ((w = qc_waitq_pop(q)))
		loop_send(w->loop, &w->msg);
}

void qc_co_lock(struct qc_state *s, struct qc_comutex *m)
{
	pthread_mutex_lock(&s->lock);
	while (m->locked)
		qc_wait(s, &m->q);
	m->locked = true;
	pthread_mutex_unlock(&s->lock);
}

void qc_co_unlock(struct qc_state *s, struct qc_comutex *m)
{
	struct qc_waiter *w;

	pthread_mutex_lock(&s->lock);
	m->locked = false;
	w = qc_waitq_pop(&m->q);
	if (w)
		loop_send(w->loop, &w->msg);
	pthread_mutex_unlock(&s->lock);
}

/* ---- child I/O ---- */

void qc_batch_init(struct qc_batch *b)
{
	b->co = coroutine_self();
	b->pending = 0;
	b->ret = 0;
	b->waiting = false;
}

static void qc_child_done(struct blk_request *req, int ret)
{
	struct qc_child *c = container_of(req, struct qc_child, req);
	struct qc_batch *b = c->b;

	if (ret < 0 && b->ret == 0)
		b->ret = ret;
	if (--b->pending == 0 && b->waiting) {
		b->waiting = false;
		coroutine_enter(b->co);
	}
}

void qc_batch_add(struct qc_batch *b, struct qc_child *c, struct blk_node *node, uint8_t op,
		  uint64_t off, struct iovec *iov, int iovcnt, uint64_t len, uint32_t flags)
{
	int ret;

	memset(&c->req, 0, sizeof(c->req));
	c->b = b;
	c->req.op = op;
	c->req.flags = flags;
	c->req.offset = off;
	c->req.len = len;
	c->req.iov = iov;
	c->req.iovcnt = iovcnt;
	c->req.cb = qc_child_done;
	ret = blk_submit_child(node, &c->req);
	if (ret < 0) {
		if (b->ret == 0)
			b->ret = ret;
		return;
	}
	b->pending++;
}

int qc_batch_wait(struct qc_batch *b)
{
	if (b->pending) {
		b->waiting = true;
		coroutine_yield();
	}
	return b->ret;
}

static int qc_co_rw(struct blk_node *node, uint8_t op, uint64_t off, void *buf, uint64_t len,
		    uint32_t flags)
{
	struct qc_batch b;
	struct qc_child c;

	qc_batch_init(&b);
	c.iov1.iov_base = buf;
	c.iov1.iov_len = len;
	qc_batch_add(&b, &c, node, op, off, buf ? &c.iov1 : NULL, buf ? 1 : 0, len, flags);
	return qc_batch_wait(&b);
}

int qc_co_pread(struct blk_node *node, uint64_t off, void *buf, uint64_t len)
{
	return qc_co_rw(node, BLK_OP_READ, off, buf, len, 0);
}

/* Bytes past the node's end read as zeroes (tables in a partly written last
 * cluster). */
int qc_co_pread_clamped(struct blk_node *node, uint64_t off, void *buf, uint64_t len)
{
	uint64_t n = off >= node->size ? 0 : node->size - off;

	if (n > len)
		n = len;
	if (n < len)
		memset((char *)buf + n, 0, len - n);
	return n ? qc_co_pread(node, off, buf, n) : 0;
}

int qc_co_pwrite(struct blk_node *node, uint64_t off, const void *buf, uint64_t len)
{
	return qc_co_rw(node, BLK_OP_WRITE, off, (void *)buf, len, 0);
}

int qc_co_op(struct blk_node *node, uint8_t op, uint64_t off, uint64_t len, uint32_t flags)
{
	return qc_co_rw(node, op, off, NULL, len, flags);
}

int qc_co_flush(struct blk_node *node)
{
	return qc_co_rw(node, BLK_OP_FLUSH, 0, NULL, 0, 0);
}

/* One child read or write of [off, off+len) of node, with iov[iov_off..]. */
int qc_co_rw_iov(struct blk_node *node, uint8_t op, uint64_t off, uint64_t len,
		 const struct iovec *iov, int iovcnt, size_t iov_off)
{
	struct iovec small[16], *v = small;
	int cap = iovcnt > 16 ? iovcnt : 16, k, ret;
	struct qc_batch b;
	struct qc_child c;

	if (cap > 16) {
		v = malloc((size_t)cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
	}
	k = iov_slice(v, cap, iov, iovcnt, iov_off, len);
	if (k < 0) {
		ret = -EINVAL;
	} else {
		qc_batch_init(&b);
		qc_batch_add(&b, &c, node, op, off, v, k, len, 0);
		ret = qc_batch_wait(&b);
	}
	if (v != small)
		free(v);
	return ret;
}

/* ---- blocking work ---- */

struct qc_blocking {
	struct tp_work w;
	int (*fn)(void *arg);
	void *arg;
	struct coroutine *co;
	int ret;
};

static int qc_blocking_run(struct tp_work *w)
{
	struct qc_blocking *b = container_of(w, struct qc_blocking, w);

	return b->fn(b->arg);
}

static void qc_blocking_done(struct tp_work *w, int ret)
{
	struct qc_blocking *b = container_of(w, struct qc_blocking, w);

	b->ret = ret;
	coroutine_enter(b->co);
}

int qc_co_blocking(int (*fn)(void *arg), void *arg)
{
	struct qc_blocking b = {.fn = fn, .arg = arg, .co = coroutine_self()};

	b.w.fn = qc_blocking_run;
	b.w.done = qc_blocking_done;
	tp_submit(loop_current(), &b.w);
	coroutine_yield();
	return b.ret;
}

/* ---- synchronous entry ---- */

struct qc_sync {
	int (*fn)(void *arg);
	void *arg;
	int ret;
	bool done;
};

static void qc_sync_co(void *opaque)
{
	struct qc_sync *y = opaque;

	y->ret = y->fn(y->arg);
	y->done = true;
}

int qc_run_sync(int (*fn)(void *arg), void *arg)
{
	struct qc_sync y = {.fn = fn, .arg = arg};
	struct loop *loop = loop_current();
	struct coroutine *co;

	if (coroutine_in())
		return fn(arg);
	/* Like blk_do_sync: the caller's thread must run a loop. */
	if (!loop)
		return -EINVAL;
	co = coroutine_create(qc_sync_co, &y);
	if (!co)
		return -ENOMEM;
	coroutine_enter(co);
	while (!y.done)
		loop_run_once(loop, true);
	return y.ret;
}

void *qc_alloc_buf(size_t len)
{
	return blk_alloc_buf(NULL, len);
}
