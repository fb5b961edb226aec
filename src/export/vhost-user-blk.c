/* vhost-user-blk export: the listening socket, the device callbacks for the
 * vhost-user back-end, and the dataplane of each virtqueue.
 *
 * A running queue lives on one iothread: its kick eventfd is polled (multishot)
 * or read through the loop's io_uring (or watched by a loop fd handler) and its avail ring is
 * a poll handler (kicks stay suppressed while polling finds work). Every chain found in a round
 * becomes a block request at once, so the engine submits them as one batch at the end of the round;
 * completions go to the used ring, and one flush hook per round publishes
 * them and notifies the guest at most once (EVENT_IDX honoured). Requests
 * come from a per-queue pool and their data stays in guest memory.
 *
 * The call and error eventfds belong to the front-end, which may leave their
 * counters full so that a write would wait: vhost-user-blk-signal.c writes
 * them without ever blocking the iothread.
 *
 * THREADING RULE: struct vub_export is main-thread only. A struct vub_queue
 * is set up by the main thread while stopped, handed to its iothread with
 * start_msg, and handed back with stopped_msg once its last in-flight request
 * has reached the used ring and no write to a front-end fd is pending;
 * between the two only the iothread touches it, except that fds_msg brings it
 * new call/error fds (new_call_fd, new_err_fd) and fds_done_msg answers once
 * the old ones are no longer in use. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "block/graph.h"
#include "export/vhost-user-blk-int.h"
#include "loop/loop.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/unix-listener.h"

#define VUB_POOL_MAX 256 /* request slots per queue (fewer: chains wait in avail) */
#define VUB_RUN_ROUNDS 4 /* disable/process/enable cycles before deferring */

void vub_run(struct vub_queue *q);

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
	if (!q->kick.ring)
		loop_fd_del(q->loop, &q->kick_h);
	/* else the read or poll in flight is cancelled by the stop
	 * (vub_cancel_writes) or ends at the next kick, and is not armed again. */
	if (q->poll_on)
		loop_poll_del(q->loop, &q->poll);
	q->handlers_on = q->poll_on = false;
}

void vub_defer_again(struct vub_queue *q)
{
	if (!q->again_queued) {
		q->again_queued = true;
		loop_defer(q->loop, &q->again);
	}
}

/* The driver broke the virtqueue rules: stop looking at this queue (device
 * needs reset); requests in flight still complete. Other queues go on. */
void vub_broken(struct vub_queue *q, int err)
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

void vub_req_done(struct vblk_req *vr)
{
	struct vub_req *r = (struct vub_req *)vr;
	struct vub_queue *q = r->q;

	if (vr->error < 0 && log_errors_take(&q->io_errors))
		log_warn("%s: queue %u: %s at offset %llu, length %llu failed: %s", q->exp->name,
			 q->idx, blk_op_name((enum blk_op)vr->breq.op),
			 (unsigned long long)vr->breq.offset, (unsigned long long)vr->breq.len,
			 strerror(-vr->error));
	/* Live migration: the pages the request wrote (data, status byte:
	 * virtio-blk took the status out of the writable iovecs). */
	if (unlikely(q->vr->log)) {
		struct iovec st = {vr->status, 1};

		vring_log_iov(q->vr, r->iov + vr->nout, vr->nin);
		if (vr->status)
			vring_log_iov(q->vr, &st, 1);
	}
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
	if (q->exp->scsi) {
		r->sr.dev = q->exp->scsi;
		ret = vscsi_req_submit(&r->sr, q->idx);
		if (ret == VBLK_SUBMITTED && q->idx == VSCSI_CTRL_Q)
			vus_tmf_wait(q, &r->sr);
	} else {
		ret = vblk_req_submit(&r->vr);
	}
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
void vub_run(struct vub_queue *q)
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
	    !q->kick.armed && !q->kick.cancelling && !q->swapping && !q->again_queued &&
	    !q->flush.queued)
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
	if (vub_kick_start(q) < 0) {
		vub_broken(q, -EBADF);
		return;
	}
	q->handlers_on = true;
	vub_resubmit(q);
	vub_run(q);
	if (q->exp->scsi && q->idx == VSCSI_EVENT_Q)
		vscsi_events_deliver(q->exp->scsi); /* posted while stopped */
}

static void vub_stop_cb(struct loop_msg *m)
{
	struct vub_queue *q = container_of(m, struct vub_queue, stop_msg);

	vub_handlers_off(q);
	q->stopping = true;
	if (q->exp->scsi && q->idx == VSCSI_EVENT_Q)
		vscsi_events_flush(q->exp->scsi); /* parked buffers go back empty */
	/* The flush hook finishes the stop once nothing is in flight. */
	loop_request_flush(q->loop, &q->flush);
}

static void vub_stopped_cb(struct loop_msg *m)
{
	struct vub_queue *q = container_of(m, struct vub_queue, stopped_msg);

	vu_queue_stopped(q->dev, q->idx);
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

	return e->scsi ? vscsi_dev_features(e->scsi) : vblk_dev_features(&e->blk);
}

static void vub_get_config(void *opaque, uint8_t *buf, uint32_t off, uint32_t len)
{
	struct vub_export *e = opaque;
	struct virtio_blk_config c;

	if (e->scsi) {
		vus_get_config(e, buf, off, len);
		return;
	}
	vblk_dev_config(&e->blk, &c);
	if (off >= sizeof(c))
		return;
	memcpy(buf, (uint8_t *)&c + off, len < sizeof(c) - off ? len : sizeof(c) - off);
}

static int vub_set_config(void *opaque, const uint8_t *buf, uint32_t off, uint32_t len)
{
	struct vub_export *e = opaque;

	return e->scsi ? vscsi_dev_set_config(e->scsi, off, buf, len)
		       : vblk_dev_set_config(&e->blk, off, buf, len);
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
	if (e->scsi)
		vscsi_lun_set_node(e->scsi, e->blk.bs, bs);
	vblk_dev_set_node(&e->blk, bs);
}

void vub_resized(struct blk_node *bs, void *opaque)
{
	struct vub_export *e = opaque;
	int ret;

	if (e->scsi) { /* a capacity change event on the event queue */
		vscsi_lun_resized(e->scsi, bs);
		vus_kick_events(e);
		return;
	}
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

unsigned vub_export_queues(const struct vub_export *e)
{
	return e->nqueues;
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
		vub_notifiers_init(q);
		vus_queue_init(q);
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
	snprintf(e->name, sizeof(e->name), "vhost-user-%s %s", cfg->scsi ? "scsi" : "blk",
		 cfg->path ? cfg->path : "(fd)");
	if (e->nqueues > VU_MAX_QUEUES - (cfg->scsi ? 2 : 0) || !cfg->nloops) {
		snprintf(err, errlen, "num-queues must be 1..%u",
			 VU_MAX_QUEUES - (cfg->scsi ? 2 : 0));
		ret = -EINVAL;
		goto fail;
	}
	ret = vblk_dev_init(&e->blk, cfg->bs, &cfg->blk, err, errlen);
	if (ret == 0 && cfg->scsi)
		ret = vus_init(e, cfg, err, errlen); /* control and event queues first */
	if (ret < 0)
		goto fail;
	ret = blk_resize_notifier_add(cfg->bs, vub_resized, e);
	if (ret < 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	e->notifier = true;
	e->blk.num_queues = e->scsi ? e->nqueues - 2 : e->nqueues;
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
	vus_free(e);
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
