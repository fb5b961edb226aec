/* vhost-user-blk export: the listening socket, the device callbacks for the
 * vhost-user back-end, and the dataplane of each virtqueue.
 *
 * A running queue lives on one iothread: its kick eventfd is a loop fd
 * handler and its avail ring a poll handler (kicks stay suppressed while
 * polling finds work). Every chain found in a round becomes a block request
 * at once, so the engine submits them as one batch at the end of the round;
 * completions go to the used ring, and one flush hook per round publishes
 * them and notifies the guest at most once (EVENT_IDX honoured). Requests
 * come from a per-queue pool and their data stays in guest memory.
 *
 * The call and error eventfds belong to the front-end, which may leave their
 * counters full so that a write would wait: see vub_signal for how they are
 * written without ever blocking the iothread.
 *
 * THREADING RULE: struct vub_export is main-thread only. A struct vub_queue
 * is set up by the main thread while stopped, handed to its iothread with
 * start_msg, and handed back with stopped_msg once its last in-flight request
 * has reached the used ring and no write to a front-end fd is pending;
 * between the two only the iothread touches it, except that fds_msg brings it
 * new call/error fds (new_call_fd, new_err_fd) and fds_done_msg answers once
 * the old ones are no longer in use. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "block/graph.h"
#include "export/vhost-user-blk.h"
#include "export/vhost-user.h"
#include "loop/loop.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/unix-listener.h"

#define VUB_POOL_MAX 256 /* request slots per queue (fewer: chains wait in avail) */
#define VUB_RUN_ROUNDS 4 /* disable/process/enable cycles before deferring */

struct vub_queue;

/* A call or error eventfd of the front-end, written by the iothread through
 * its loop's io_uring with at most one write in flight. */
struct vub_notifier {
	int fd;          /* -1: none (the number is owned by vhost-user.c) */
	int write_fd;    /* the fd the write in flight goes to */
	bool inflight;   /* a write SQE not completed yet */
	bool again;      /* signal once more when it has */
	bool cancelling; /* a cancel SQE for it not completed yet */
	bool lost;       /* a write was cancelled: signal at the next start */
	struct loop_uring_op op, cancel_op;
	struct vub_queue *q;
};

struct vub_req {
	struct vblk_req vr; /* first */
	struct vub_queue *q;
	uint16_t head;
	struct iovec iov[VBLK_MAX_IOV];
};

struct vub_queue {
	/* Written by the main thread while stopped, read by the iothread. */
	struct vub_export *exp;
	struct vu_dev *dev;
	atomic_int *mem_faulted; /* the device's, set from the SIGBUS guard */
	struct vring *vr;
	unsigned idx;
	struct loop *loop;
	int new_call_fd, new_err_fd; /* also while running: read by fds_msg's handler */
	uint16_t *resubmit;          /* inflight heads to run again at start */
	unsigned nresubmit, resubmit_cap;
	struct vub_req *reqs;
	unsigned nreqs;

	/* Owned by the iothread while running (kick_h.fd and the notifiers' fd
	 * are set by the main thread at start). */
	struct loop_fd kick_h;
	struct loop_poll poll;
	struct loop_flush flush;
	struct loop_defer again;
	struct vub_notifier call, err;
	struct vub_req **free;
	unsigned nfree, inflight;
	struct log_errors io_errors; /* block-layer errors (util/log.h) */
	bool handlers_on, poll_on, stopping, starved, broken, again_queued, swapping;

	struct loop_msg start_msg, stop_msg, stopped_msg, fds_msg, fds_done_msg;
};

struct vub_export {
	char name[128];
	char *path;
	mode_t mode;
	struct loop *main_loop;
	struct unix_listener ul;
	struct loop_fd listen_h;
	bool listening, stopping;
	bool notifier; /* registered for the node's resizes */
	struct vblk_dev blk;
	struct vub_queue *queues;
	unsigned nqueues;
	struct vu_dev *conn;
	void (*stop_done)(void *opaque);
	void *stop_opaque;
	struct loop_defer done_defer;
};

static void vub_run(struct vub_queue *q);

/* ---- the request path (iothread) ------------------------------------------------ */

static inline struct vub_req *pool_get(struct vub_queue *q)
{
	return q->nfree ? q->free[--q->nfree] : NULL;
}

static inline void pool_put(struct vub_queue *q, struct vub_req *r)
{
	q->free[q->nfree++] = r;
}

static void vub_handlers_off(struct vub_queue *q)
{
	if (!q->handlers_on)
		return;
	loop_fd_del(q->loop, &q->kick_h);
	if (q->poll_on)
		loop_poll_del(q->loop, &q->poll);
	q->handlers_on = q->poll_on = false;
}

static const uint64_t vub_one = 1;

static void vub_defer_again(struct vub_queue *q)
{
	if (!q->again_queued) {
		q->again_queued = true;
		loop_defer(q->loop, &q->again);
	}
}

/* No io_uring on this loop: write() at once, which the fd's O_NONBLOCK (set
 * when the fd arrived here, see vub_notifier_prepare) keeps from waiting.
 * -EAGAIN means a full counter: the front-end has a signal pending anyway. */
static void vub_signal_sync(struct vub_notifier *n)
{
	if (write(n->fd, &vub_one, sizeof(vub_one)) < 0 && errno != EAGAIN)
		log_debug("vhost-user-blk: eventfd write: %s", strerror(errno));
}

/* Signal a call or error eventfd. The front-end may have left its counter
 * full, so that a write would wait until it reads: the write goes through
 * the loop's io_uring, where it can wait without holding the thread, and a
 * queue stop cancels it. One write at a time: a signal wanted meanwhile is
 * sent when it completes (eventfd semantics: the front-end only needs to
 * see the counter become non-zero after the used index moved). */
static void vub_signal(struct vub_notifier *n)
{
	struct vub_queue *q = n->q;
	struct io_uring_sqe *sqe;

	if (n->fd < 0)
		return;
	if (n->inflight) {
		n->again = true;
		return;
	}
	sqe = loop_uring_peer_sqe(q->loop, &n->op);
	if (!sqe && loop_uring(q->loop)) { /* a full submission queue: next round */
		n->again = true;
		vub_defer_again(q);
		return;
	}
	if (!sqe) {
		vub_signal_sync(n);
		return;
	}
	io_uring_prep_write(sqe, n->fd, &vub_one, sizeof(vub_one), 0);
	n->inflight = true;
	n->write_fd = n->fd;
}

static void vub_cancel(struct vub_notifier *n)
{
	if (!n->inflight || n->cancelling)
		return;
	if (loop_uring_cancel_peer(n->q->loop, &n->op, &n->cancel_op) < 0) {
		vub_defer_again(n->q); /* tries again */
		return;
	}
	n->cancelling = true;
}

/* After a hand-over: tell the main thread once no write uses an old fd. */
static void vub_maybe_fds_done(struct vub_queue *q)
{
	if (!q->swapping)
		return;
	if ((q->call.inflight && q->call.write_fd != q->call.fd) ||
	    (q->err.inflight && q->err.write_fd != q->err.fd))
		return;
	q->swapping = false;
	loop_send(q->exp->main_loop, &q->fds_done_msg);
}

static void vub_signal_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct vub_notifier *n = container_of(op, struct vub_notifier, op);
	struct vub_queue *q = n->q;

	(void)cqe_flags;
	n->inflight = false;
	/* Cancelled: by a stop, sent again at the next start; else by a
	 * hand-over, and the new fd gets it. */
	if ((res == -ECANCELED || res == -EINTR) && q->stopping)
		n->lost = true;
	else if (res == -ECANCELED || res == -EINTR)
		n->again = true;
	else if (res < 0 && res != -EAGAIN)
		log_debug("%s: queue %u: eventfd write: %s", q->exp->name, q->idx, strerror(-res));
	vub_maybe_fds_done(q);
	if (n->again) {
		n->again = false;
		vub_signal(n);
	}
	if (q->stopping)
		loop_request_flush(q->loop, &q->flush); /* cancels it or finishes the stop */
}

static void vub_cancel_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct vub_notifier *n = container_of(op, struct vub_notifier, cancel_op);

	(void)res;
	(void)cqe_flags;
	n->cancelling = false;
	if (n->q->stopping)
		loop_request_flush(n->q->loop, &n->q->flush);
}

static bool vub_notifier_busy(const struct vub_notifier *n)
{
	return n->inflight || n->cancelling;
}

/* Cancel the writes that hold up a stop (any) or a hand-over (to an old fd). */
static void vub_cancel_writes(struct vub_queue *q)
{
	if (q->call.inflight && (q->stopping || q->call.write_fd != q->call.fd))
		vub_cancel(&q->call);
	if (q->err.inflight && (q->stopping || q->err.write_fd != q->err.fd))
		vub_cancel(&q->err);
}

static void vub_signal_retry(struct vub_notifier *n)
{
	if (n->again && !n->inflight) {
		n->again = false;
		vub_signal(n);
	}
}

/* Without io_uring the write is a plain write(): the fd must not block it.
 * O_NONBLOCK is a flag of the file description, which the front-end shares,
 * so it is set only here, where there is no other way to write it. */
static void vub_notifier_prepare(struct vub_notifier *n)
{
	int fl;

	if (n->fd < 0 || loop_uring(n->q->loop))
		return;
	fl = fcntl(n->fd, F_GETFL);
	if (fl >= 0 && !(fl & O_NONBLOCK))
		fcntl(n->fd, F_SETFL, fl | O_NONBLOCK);
}

/* Call the driver; the write rides on the io_uring_enter the loop makes
 * anyway (no system call of its own). */
static void vub_notify(struct vub_queue *q)
{
	vub_signal(&q->call);
}

/* The driver broke the virtqueue rules: stop looking at this queue (device
 * needs reset); requests in flight still complete. Other queues go on. */
static void vub_broken(struct vub_queue *q, int err)
{
	if (q->broken)
		return;
	/* A chain that reads as garbage because the memory went away. */
	if (atomic_load_explicit(q->mem_faulted, memory_order_relaxed))
		err = -EFAULT;
	if (err == -EFAULT)
		log_err("%s: queue %u: the front-end shrank guest memory under us: queue stopped",
			q->exp->name, q->idx);
	else
		log_warn("%s: queue %u: bad descriptor chain (%s): queue stopped", q->exp->name,
			 q->idx, strerror(-err));
	q->broken = true;
	vub_handlers_off(q);
	vub_signal(&q->err);
}

static void vub_req_done(struct vblk_req *vr)
{
	struct vub_req *r = (struct vub_req *)vr;
	struct vub_queue *q = r->q;

	if (vr->error < 0 && log_errors_take(&q->io_errors))
		log_warn("%s: queue %u: %s at offset %llu, length %llu failed: %s", q->exp->name,
			 q->idx, blk_op_name((enum blk_op)vr->breq.op),
			 (unsigned long long)vr->breq.offset, (unsigned long long)vr->breq.len,
			 strerror(-vr->error));
	vring_push(q->vr, r->head, vr->used_len);
	pool_put(q, r);
	q->inflight--;
	loop_request_flush(q->loop, &q->flush);
}

static void vub_start_req(struct vub_queue *q, struct vub_req *r, const struct vring_chain *c)
{
	enum vblk_submit_result ret;

	r->q = q;
	r->head = c->head;
	r->vr.dev = &q->exp->blk;
	r->vr.iov = r->iov;
	r->vr.nout = c->nout;
	r->vr.nin = c->nin;
	r->vr.out_len = c->out_len;
	r->vr.in_len = c->in_len;
	r->vr.done = vub_req_done;
	q->inflight++;
	ret = vblk_req_submit(&r->vr);
	if (ret == VBLK_FINISHED) {
		vub_req_done(&r->vr);
	} else if (ret == VBLK_BROKEN) {
		q->inflight--;
		pool_put(q, r);
		vub_broken(q, -EINVAL);
	}
}

/* Turn every available chain into a request. */
static void vub_process(struct vub_queue *q)
{
	struct vring_chain c;
	struct vub_req *r;
	enum vring_pop_result ret;

	while (!q->broken) {
		r = pool_get(q);
		if (!r) {
			q->starved = true; /* a completion brings us back */
			return;
		}
		c.iov = r->iov;
		c.max_iov = VBLK_MAX_IOV;
		ret = vring_pop(q->vr, &c);
		if (ret != VRING_POP_CHAIN) {
			pool_put(q, r);
			if (ret == VRING_POP_BROKEN)
				vub_broken(q, c.err);
			break;
		}
		q->poll.idle = false;
		vub_start_req(q, r, &c);
	}
	/* After the rings were read: a fault while reading them shows here. */
	if (atomic_load_explicit(q->mem_faulted, memory_order_relaxed))
		vub_broken(q, -EFAULT);
}

static void vub_again_cb(struct loop_defer *d)
{
	struct vub_queue *q = container_of(d, struct vub_queue, again);

	q->again_queued = false;
	vub_signal_retry(&q->call); /* after a full submission queue */
	vub_signal_retry(&q->err);
	vub_cancel_writes(q);
	if (q->handlers_on)
		vub_run(q);
	else
		loop_request_flush(q->loop, &q->flush); /* may finish a stop */
}

/* Process with kicks suppressed, then re-enable them and look again. */
static void vub_run(struct vub_queue *q)
{
	unsigned i;

	for (i = 0; i < VUB_RUN_ROUNDS; i++) {
		vring_disable_notify(q->vr);
		vub_process(q);
		if (q->broken || q->starved || !vring_enable_notify(q->vr))
			return;
	}
	/* A driver adding as fast as we take: let other handlers run first. */
	vub_defer_again(q);
}

static void vub_kick_cb(struct loop_fd *h, uint32_t revents)
{
	struct vub_queue *q = container_of(h, struct vub_queue, kick_h);
	uint64_t v;
	struct iovec iov = {&v, sizeof(v)};

	(void)revents;
	/* RWF_NOWAIT: the front-end may read its kick eventfd itself, and a
	 * plain read() would then wait for its next kick. */
	if (preadv2(h->fd, &iov, 1, -1, RWF_NOWAIT) < 0 && errno != EAGAIN)
		log_debug("%s: queue %u: kick read: %s", q->exp->name, q->idx, strerror(errno));
	/* Poll only queues the driver has used: polling hundreds of idle queues
	 * (and spinning while a front-end sets them up) helps nobody. */
	if (!q->poll_on) {
		loop_poll_add(q->loop, &q->poll);
		q->poll_on = true;
	}
	vub_run(q);
}

/* Polling: kicks stay off from the first poll that finds work until the loop
 * is about to sleep (vub_sleep_cb), so that a driver adding requests while we
 * poll never pays for a kick, nor we for reading it. */
static bool vub_poll_cb(struct loop_poll *p)
{
	struct vub_queue *q = container_of(p, struct vub_queue, poll);

	if (q->broken || q->starved || !vring_avail_pending(q->vr))
		return false;
	vring_disable_notify(q->vr);
	vub_process(q);
	return true;
}

static bool vub_sleep_cb(struct loop_poll *p)
{
	struct vub_queue *q = container_of(p, struct vub_queue, poll);

	/* A starved queue restarts when its requests complete. */
	if (q->broken || q->starved || !q->vr->notify_off || !vring_enable_notify(q->vr))
		return false;
	vring_disable_notify(q->vr);
	vub_process(q);
	return true;
}

static void vub_finish_stop(struct vub_queue *q)
{
	char who[160];

	snprintf(who, sizeof(who), "%s: queue %u", q->exp->name, q->idx);
	log_errors_end(&q->io_errors, who);
	q->stopping = false;
	/* The kick fd's poll requests reach the kernel before the main thread
	 * may close the fd and its number is given to another file. */
	loop_uring_submit(q->loop);
	loop_send(q->exp->main_loop, &q->stopped_msg);
}

/* End of round: publish the used entries, notify once. */
static void vub_flush_cb(struct loop_flush *f)
{
	struct vub_queue *q = container_of(f, struct vub_queue, flush);

	if (vring_flush(q->vr)) {
		vub_notify(q);
		/* The driver waits for this interrupt: its next request comes
		 * after its wake-up, later than polling would pay for. */
		q->poll.idle = true;
	}
	if (q->starved && q->handlers_on) {
		q->starved = false;
		vub_run(q);
		return; /* vub_run's completions requested another flush */
	}
	if (!q->stopping)
		return;
	/* A write the front-end's full counter holds up would hold the stop. */
	vub_cancel_writes(q);
	if (!q->inflight && !vub_notifier_busy(&q->call) && !vub_notifier_busy(&q->err) &&
	    !q->swapping && !q->again_queued && !q->flush.queued)
		vub_finish_stop(q);
}

/* ---- start and stop (messages between main thread and iothread) ---------------- */

static void vub_resubmit(struct vub_queue *q)
{
	struct vring_chain c;
	unsigned i;

	for (i = 0; i < q->nresubmit && !q->broken; i++) {
		struct vub_req *r = pool_get(q);
		int ret;

		if (!r) /* more inflight heads than slots: the rest wait */
			break;
		c.iov = r->iov;
		c.max_iov = VBLK_MAX_IOV;
		ret = vring_walk(q->vr, q->resubmit[i], &c);
		if (ret < 0) {
			pool_put(q, r);
			vub_broken(q, ret);
			return;
		}
		vub_start_req(q, r, &c);
	}
	if (q->nresubmit)
		log_info("%s: queue %u: resubmitted %u inflight request(s)", q->exp->name, q->idx,
			 i);
}

static void vub_start_cb(struct loop_msg *m)
{
	struct vub_queue *q = container_of(m, struct vub_queue, start_msg);

	q->kick_h.events = EPOLLIN;
	q->kick_h.cb = vub_kick_cb;
	q->poll.poll = vub_poll_cb;
	q->poll.sleep = vub_sleep_cb;
	q->flush.cb = vub_flush_cb;
	q->again.cb = vub_again_cb;
	vub_notifier_prepare(&q->call);
	vub_notifier_prepare(&q->err);
	if (q->call.lost) { /* a signal of the last run was cancelled */
		q->call.lost = false;
		vub_signal(&q->call);
	}
	if (loop_fd_add(q->loop, &q->kick_h) < 0) {
		vub_broken(q, -EBADF);
		return;
	}
	q->handlers_on = true;
	vub_resubmit(q);
	vub_run(q);
}

static void vub_stop_cb(struct loop_msg *m)
{
	struct vub_queue *q = container_of(m, struct vub_queue, stop_msg);

	vub_handlers_off(q);
	q->stopping = true;
	/* The flush hook finishes the stop once nothing is in flight. */
	loop_request_flush(q->loop, &q->flush);
}

static void vub_stopped_cb(struct loop_msg *m)
{
	struct vub_queue *q = container_of(m, struct vub_queue, stopped_msg);

	vu_queue_stopped(q->dev, q->idx);
}

static void vub_notifier_swap(struct vub_notifier *n, int fd)
{
	if (fd == n->fd)
		return;
	n->fd = fd;
	vub_notifier_prepare(n);
	/* The old fd's write may wait forever (cancelled below); the new fd
	 * gets the signal when it is over. */
	if (n->inflight)
		n->again = true;
}

/* New call/error fds for a running queue (vhost-user.c keeps the old ones
 * open until fds_done_msg says no write uses them any more). */
static void vub_fds_cb(struct loop_msg *m)
{
	struct vub_queue *q = container_of(m, struct vub_queue, fds_msg);

	q->swapping = true;
	vub_notifier_swap(&q->call, q->new_call_fd);
	vub_notifier_swap(&q->err, q->new_err_fd);
	vub_cancel_writes(q);
	vub_maybe_fds_done(q);
}

static void vub_fds_done_cb(struct loop_msg *m)
{
	struct vub_queue *q = container_of(m, struct vub_queue, fds_done_msg);

	vu_queue_fds_done(q->dev, q->idx);
}

static int vub_pool_alloc(struct vub_queue *q, unsigned num)
{
	unsigned n = num < VUB_POOL_MAX ? num : VUB_POOL_MAX, i;

	if (q->nreqs != n) {
		free(q->reqs);
		free(q->free);
		q->nreqs = 0;
		q->reqs = calloc(n, sizeof(*q->reqs));
		q->free = calloc(n, sizeof(*q->free));
		if (!q->reqs || !q->free)
			return -ENOMEM;
		q->nreqs = n;
	}
	if (q->resubmit_cap < num) {
		free(q->resubmit);
		q->resubmit_cap = 0;
		q->resubmit = calloc(num, sizeof(*q->resubmit));
		if (!q->resubmit)
			return -ENOMEM;
		q->resubmit_cap = num;
	}
	/* Only the pointer array is touched here: a slot's pages are first
	 * touched when it is used (start-up cost stays small with many queues). */
	for (i = 0; i < n; i++)
		q->free[i] = &q->reqs[n - 1 - i];
	q->nfree = n;
	return 0;
}

static int vub_queue_start(void *opaque, struct vu_dev *dev, unsigned idx)
{
	struct vub_export *e = opaque;
	struct vub_queue *q = &e->queues[idx];
	struct vu_vq *vq = vu_dev_vq(dev, idx);
	int ret = vub_pool_alloc(q, vq->vr.num);

	if (ret < 0)
		return ret;
	q->dev = dev;
	q->mem_faulted = vu_dev_mem_faulted(dev);
	q->vr = &vq->vr;
	q->call.fd = vq->call_fd;
	q->err.fd = vq->err_fd;
	q->call.again = q->err.again = false;
	q->kick_h.fd = vq->kick_fd;
	q->inflight = 0;
	q->broken = q->starved = q->stopping = q->again_queued = q->swapping = false;
	q->nresubmit = vring_inflight_heads(q->vr, q->resubmit, q->resubmit_cap);
	loop_send(q->loop, &q->start_msg);
	return 0;
}

static int vub_queue_stop(void *opaque, struct vu_dev *dev, unsigned idx)
{
	struct vub_export *e = opaque;

	(void)dev;
	loop_send(e->queues[idx].loop, &e->queues[idx].stop_msg);
	return 1;
}

static int vub_queue_set_fds(void *opaque, struct vu_dev *dev, unsigned idx)
{
	struct vub_export *e = opaque;
	struct vub_queue *q = &e->queues[idx];
	struct vu_vq *vq = vu_dev_vq(dev, idx);

	q->new_call_fd = vq->call_fd;
	q->new_err_fd = vq->err_fd;
	loop_send(q->loop, &q->fds_msg);
	return 1;
}

/* ---- device callbacks (main thread) ---------------------------------------------- */

static uint64_t vub_features(void *opaque)
{
	struct vub_export *e = opaque;

	return vblk_dev_features(&e->blk);
}

static void vub_get_config(void *opaque, uint8_t *buf, uint32_t off, uint32_t len)
{
	struct vub_export *e = opaque;
	struct virtio_blk_config c;

	vblk_dev_config(&e->blk, &c);
	if (off >= sizeof(c))
		return;
	memcpy(buf, (uint8_t *)&c + off, len < sizeof(c) - off ? len : sizeof(c) - off);
}

static int vub_set_config(void *opaque, const uint8_t *buf, uint32_t off, uint32_t len)
{
	struct vub_export *e = opaque;

	return vblk_dev_set_config(&e->blk, off, buf, len);
}

static void vub_listen_watch(struct vub_export *e, bool on);

static void vub_done_cb(struct loop_defer *d)
{
	struct vub_export *e = container_of(d, struct vub_export, done_defer);

	if (e->stop_done)
		e->stop_done(e->stop_opaque);
}

static void vub_closed(void *opaque, struct vu_dev *dev)
{
	struct vub_export *e = opaque;

	vu_dev_free(dev);
	e->conn = NULL;
	if (e->stopping)
		loop_defer(e->main_loop, &e->done_defer);
	else
		vub_listen_watch(e, true);
}

static const struct vu_dev_ops vub_ops = {
	.features = vub_features,
	.get_config = vub_get_config,
	.set_config = vub_set_config,
	.queue_start = vub_queue_start,
	.queue_stop = vub_queue_stop,
	.queue_set_fds = vub_queue_set_fds,
	.closed = vub_closed,
};

/* blk_resize() of the node (main thread, after the drain): the capacity
 * follows, and a front-end that gave a back-end channel re-reads the
 * configuration space; the guest sees the new size without a reboot. */
void vub_export_set_node(struct vub_export *e, struct blk_node *bs)
{
	vblk_dev_set_node(&e->blk, bs);
}

static void vub_resized(struct blk_node *bs, void *opaque)
{
	struct vub_export *e = opaque;
	int ret;

	(void)bs;
	vblk_dev_resized(&e->blk);
	if (!e->conn)
		return;
	ret = vu_dev_config_changed(e->conn);
	if (ret == -ENOTCONN)
		log_info("%s: resized; the front-end gave no back-end channel to tell", e->name);
	else if (ret < 0)
		log_warn("%s: resized, but the front-end could not be told", e->name);
}

/* ---- the listening socket --------------------------------------------------------- */

int vub_export_attach_fd(struct vub_export *e, int fd)
{
	struct vu_dev_config cfg = {.loop = e->main_loop,
				    .num_queues = e->nqueues,
				    .ops = &vub_ops,
				    .opaque = e,
				    .name = e->name};
	int ret;

	if (e->conn || e->stopping) {
		close(fd);
		return -EBUSY;
	}
	ret = vu_dev_new(&cfg, fd, &e->conn);
	if (ret < 0) {
		e->conn = NULL;
		return ret;
	}
	/* One front-end at a time: the next waits in the backlog. */
	vub_listen_watch(e, false);
	return 0;
}

bool vub_export_connected(const struct vub_export *e)
{
	return e->conn != NULL;
}

static void vub_accept_cb(struct loop_fd *h, uint32_t revents)
{
	struct vub_export *e = container_of(h, struct vub_export, listen_h);
	int fd;

	(void)revents;
	fd = accept4(e->ul.fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return;
	if (vub_export_attach_fd(e, fd) < 0)
		log_err("%s: cannot serve a new connection", e->name);
	else
		log_info("%s: front-end connected", e->name);
}

static void vub_listen_watch(struct vub_export *e, bool on)
{
	if (on == e->listening || e->ul.fd < 0)
		return;
	if (on) {
		e->listen_h =
			(struct loop_fd){.fd = e->ul.fd, .events = EPOLLIN, .cb = vub_accept_cb};
		e->listening = loop_fd_add(e->main_loop, &e->listen_h) == 0;
	} else {
		loop_fd_del(e->main_loop, &e->listen_h);
		e->listening = false;
	}
}

/* The socket rules (live: refused, stale: replaced, ...) are unix-listener.h's. */
int vub_export_listen(struct vub_export *e, char *err, size_t errlen)
{
	int ret;

	if (!e->path || e->ul.fd >= 0 || e->stopping)
		return -EINVAL;
	ret = unix_listen(&e->ul, e->path, e->mode ? e->mode : 0600, 16, err, errlen);
	if (ret < 0)
		return ret;
	vub_listen_watch(e, true);
	if (!e->listening) {
		snprintf(err, errlen, "cannot listen on %s: %s", e->path, strerror(ENOMEM));
		unix_listener_close(&e->ul);
		return -ENOMEM;
	}
	return 0;
}

int vub_export_listen_fd(struct vub_export *e, int fd, char *err, size_t errlen)
{
	if (e->ul.fd >= 0 || e->stopping)
		return -EINVAL;
	e->ul.fd = fd;
	vub_listen_watch(e, true);
	if (!e->listening) {
		snprintf(err, errlen, "cannot listen on fd %d: %s", fd, strerror(ENOMEM));
		e->ul.fd = -1;
		return -ENOMEM;
	}
	return 0;
}

/* ---- life cycle ---------------------------------------------------------------------- */

static int vub_queues_init(struct vub_export *e, const struct vub_export_config *cfg)
{
	unsigned i;

	e->queues = calloc(e->nqueues, sizeof(*e->queues));
	if (!e->queues)
		return -ENOMEM;
	for (i = 0; i < e->nqueues; i++) {
		struct vub_queue *q = &e->queues[i];

		q->exp = e;
		q->idx = i;
		q->loop = cfg->loops[(cfg->first_loop + i) % cfg->nloops];
		q->start_msg.cb = vub_start_cb;
		q->stop_msg.cb = vub_stop_cb;
		q->stopped_msg.cb = vub_stopped_cb;
		q->fds_msg.cb = vub_fds_cb;
		q->fds_done_msg.cb = vub_fds_done_cb;
		q->call = q->err = (struct vub_notifier){.fd = -1, .q = q};
		q->call.op.cb = q->err.op.cb = vub_signal_done;
		q->call.cancel_op.cb = q->err.cancel_op.cb = vub_cancel_done;
	}
	return 0;
}

int vub_export_start(const struct vub_export_config *cfg, struct vub_export **out, char *err,
		     size_t errlen)
{
	struct vub_export *e = calloc(1, sizeof(*e));
	int ret = -ENOMEM;

	if (!e)
		goto fail;
	e->ul.fd = -1;
	e->main_loop = cfg->main_loop;
	e->mode = cfg->mode;
	e->done_defer.cb = vub_done_cb;
	e->nqueues = cfg->blk.num_queues ? cfg->blk.num_queues : 1;
	snprintf(e->name, sizeof(e->name), "vhost-user-blk %s", cfg->path ? cfg->path : "(fd)");
	if (e->nqueues > VU_MAX_QUEUES || !cfg->nloops) {
		snprintf(err, errlen, "num-queues must be 1..%u", VU_MAX_QUEUES);
		ret = -EINVAL;
		goto fail;
	}
	ret = vblk_dev_init(&e->blk, cfg->bs, &cfg->blk, err, errlen);
	if (ret < 0)
		goto fail;
	ret = blk_resize_notifier_add(cfg->bs, vub_resized, e);
	if (ret < 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	e->notifier = true;
	e->blk.num_queues = e->nqueues;
	e->path = cfg->path ? strdup(cfg->path) : NULL;
	if ((cfg->path && !e->path) || vub_queues_init(e, cfg) < 0) {
		ret = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	*out = e;
	return 0;
fail:
	vub_export_free(e);
	return ret;
}

void vub_export_stop(struct vub_export *e, void (*done)(void *opaque), void *opaque)
{
	e->stopping = true;
	e->stop_done = done;
	e->stop_opaque = opaque;
	vub_listen_watch(e, false);
	unix_listener_close(&e->ul);
	if (e->conn)
		vu_dev_close(e->conn); /* vub_closed() finishes */
	else
		loop_defer(e->main_loop, &e->done_defer);
}

void vub_export_free(struct vub_export *e)
{
	unsigned i;

	if (!e)
		return;
	if (e->notifier)
		blk_resize_notifier_del(e->blk.bs, vub_resized, e);
	vub_listen_watch(e, false);
	unix_listener_close(&e->ul);
	for (i = 0; e->queues && i < e->nqueues; i++) {
		free(e->queues[i].reqs);
		free(e->queues[i].free);
		free(e->queues[i].resubmit);
	}
	free(e->queues);
	free(e->path);
	free(e);
}
