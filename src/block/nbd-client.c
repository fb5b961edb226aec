/* Protocol driver `nbd`: a client of a remote NBD server (libnbd), with
 * QEMU's options (server.*, export, reconnect-delay) and nbd://, nbd+unix://
 * file names. Each connection is a libnbd handle driven by one loop through
 * libnbd's asynchronous API (its fd, direction and notify calls); no thread
 * of libnbd's own. Requests of a loop without a connection of its own go to
 * one that has, by message, and come back the same way. This file: the
 * connections and the request path; libnbd's loading, the options and open
 * are in nbd-client-open.c.
 *
 * Threading: open/close on the main thread; a connection (struct nbdc_conn,
 * the loop's thread_state) is owned by its loop's thread; the connection
 * slots of the node are protected by nbdc_state.lock. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "block/nbd-client-int.h"
#include "util/compiler.h"
#include "util/log.h"

struct nbdc_req;

struct nbdc_queue {
	struct nbdc_req *head, **tail;
};

enum nbdc_cstate { NBDC_DOWN, NBDC_CONNECTING, NBDC_READY };

/* A loop's state: a connection, or (target != NULL) the loop to forward to.
 * Owned by `loop`'s thread. */
struct nbdc_conn {
	struct blk_node *bs;
	struct loop *loop;
	struct loop *target;
	int slot;
	struct nbd_handle *h;
	struct loop_fd fdh;
	bool fd_on;
	enum nbdc_cstate st;
	/* Reconnection: until deadline_ns requests wait for a connection;
	 * past it (failing) each attempt is made on demand and requests fail
	 * with EIO when it does. */
	uint64_t deadline_ns, backoff_ns;
	bool failing;
	bool lost; /* since the connection was lost: log when it is back */
	struct loop_timer timer;
	struct nbdc_queue waiting; /* not on the wire: waiting for a connection */
	struct nbdc_queue done;    /* answered by libnbd, not finished yet */
	struct loop_flush flush;   /* end of round: finish and re-arm the fd */
	uint64_t inflight;         /* issued to libnbd, not reaped */
};

/* Per-request context in req->drv. */
struct nbdc_req {
	struct loop_msg msg; /* forwarding to the connection's loop and back */
	struct nbdc_req *next;
	struct blk_node *bs;
	struct nbdc_conn *conn; /* the connection it is issued on */
	int err;
	unsigned pieces; /* libnbd commands not answered yet (+1 while issuing) */
};

_Static_assert(sizeof(struct nbdc_req) <= BLK_DRV_CTX_SIZE, "nbdc_req too big");

static void nbdc_q_init(struct nbdc_queue *q)
{
	q->head = NULL;
	q->tail = &q->head;
}

static void nbdc_q_push(struct nbdc_queue *q, struct nbdc_req *r)
{
	r->next = NULL;
	*q->tail = r;
	q->tail = &r->next;
}

static struct nbdc_req *nbdc_q_pop(struct nbdc_queue *q)
{
	struct nbdc_req *r = q->head;

	if (r && !(q->head = r->next))
		q->tail = &q->head;
	return r;
}

static int nbdc_errno(void)
{
	int e = nbdc_nl.nbd_get_errno();

	return e > 0 ? -e : -EIO;
}

/* ---- finishing requests ---------------------------------------------------- */

static void nbdc_fwd_done(struct loop_msg *m)
{
	struct nbdc_req *r = container_of(m, struct nbdc_req, msg);

	blk_complete(blk_req_from_drv(r), r->err);
}

/* Completion context (never inside a submit): back to the request's loop. */
static void nbdc_finish(struct nbdc_conn *c, struct nbdc_req *r, int ret)
{
	struct blk_request *req = blk_req_from_drv(r);

	if (ret == -EOPNOTSUPP)
		ret = -ENOTSUP;
	if (req->loop == c->loop) {
		blk_complete(req, ret);
		return;
	}
	r->err = ret;
	r->msg.cb = nbdc_fwd_done;
	loop_send(req->loop, &r->msg);
}

static void nbdc_fail_waiting(struct nbdc_conn *c, int ret)
{
	struct nbdc_req *r;

	while ((r = nbdc_q_pop(&c->waiting)))
		nbdc_finish(c, r, ret);
}

/* libnbd's callbacks: only bookkeeping, the request finishes later
 * (nbdc_reap), outside libnbd's calls. */
static void nbdc_piece_done(struct nbdc_req *r)
{
	if (--r->pieces == 0)
		nbdc_q_push(&r->conn->done, r);
}

static int nbdc_cmd_cb(void *opaque, int *error)
{
	struct nbdc_req *r = opaque;

	if (*error && !r->err)
		r->err = -*error;
	nbdc_piece_done(r);
	return 1; /* retire the command */
}

/* base:allocation, one extent (REQ_ONE): the status of its first entry. */
static int nbdc_extent_cb(void *opaque, const char *ctx, uint64_t off, uint32_t *e, size_t n,
			  int *error)
{
	struct blk_request *req = blk_req_from_drv(opaque);

	(void)off;
	(void)error;
	if (strcmp(ctx, LIBNBD_CONTEXT_BASE_ALLOCATION) || n < 2 || e[0] == 0)
		return 0;
	req->status = (e[1] & LIBNBD_STATE_HOLE ? 0 : BLK_STATUS_DATA | BLK_STATUS_ALLOCATED) |
		      (e[1] & LIBNBD_STATE_ZERO ? BLK_STATUS_ZERO : 0);
	req->status_len = e[0] < req->len ? e[0] : req->len;
	return 0;
}

/* ---- issuing ------------------------------------------------------------ */

static int nbdc_piece(struct nbdc_req *r, int64_t cookie)
{
	if (cookie >= 0)
		return 0;
	r->pieces--;
	return nbdc_errno();
}

static nbd_completion_callback nbdc_cb_of(struct nbdc_req *r)
{
	r->pieces++;
	return (nbd_completion_callback){.callback = nbdc_cmd_cb, .user_data = r};
}

/* Reads and writes: one command per iovec element and NBDC_MAX_IO. */
static int nbdc_send_rw(struct nbdc_conn *c, struct nbdc_req *r, struct blk_request *req)
{
	const struct nbdc_state *s = nbdc_state(c->bs);
	uint32_t fl = (req->flags & BLK_F_FUA) ? LIBNBD_CMD_FLAG_FUA : 0;
	uint64_t off = req->offset;
	int i, ret = 0;

	for (i = 0; i < req->iovcnt && !ret; i++) {
		char *p = req->iov[i].iov_base;
		size_t left = req->iov[i].iov_len;

		while (left && !ret) {
			size_t n = left < s->max_io ? left : s->max_io;

			if (req->op == BLK_OP_READ)
				ret = nbdc_piece(r, nbdc_nl.nbd_aio_pread(c->h, p, n, off,
									  nbdc_cb_of(r), 0));
			else
				ret = nbdc_piece(r, nbdc_nl.nbd_aio_pwrite(c->h, p, n, off,
									   nbdc_cb_of(r), fl));
			p += n;
			off += n;
			left -= n;
		}
	}
	return ret;
}

/* Trim and write-zeroes: commands of at most NBDC_MAX_ZERO bytes. */
static int nbdc_send_range(struct nbdc_conn *c, struct nbdc_req *r, struct blk_request *req,
			   uint32_t fl)
{
	uint64_t off = req->offset, end = req->offset + req->len;
	int ret = 0;

	while (off < end && !ret) {
		uint64_t n = end - off < NBDC_MAX_ZERO ? end - off : NBDC_MAX_ZERO;

		if (req->op == BLK_OP_DISCARD)
			ret = nbdc_piece(r, nbdc_nl.nbd_aio_trim(c->h, n, off, nbdc_cb_of(r), 0));
		else
			ret = nbdc_piece(r, nbdc_nl.nbd_aio_zero(c->h, n, off, nbdc_cb_of(r), fl));
		off += n;
	}
	return ret;
}

static uint32_t nbdc_zero_flags(const struct blk_request *req)
{
	return (req->flags & BLK_F_MAY_UNMAP ? 0 : LIBNBD_CMD_FLAG_NO_HOLE) |
	       (req->flags & BLK_F_FUA ? LIBNBD_CMD_FLAG_FUA : 0) |
	       (req->flags & BLK_F_NO_FALLBACK ? LIBNBD_CMD_FLAG_FAST_ZERO : 0);
}

static int nbdc_send_status(struct nbdc_conn *c, struct nbdc_req *r, struct blk_request *req)
{
	uint64_t n = req->len < NBDC_MAX_ZERO ? req->len : NBDC_MAX_ZERO;
	nbd_extent_callback ecb = {.callback = nbdc_extent_cb, .user_data = r};

	/* What the server does not answer for is data. */
	req->status = BLK_STATUS_DATA | BLK_STATUS_ALLOCATED;
	req->status_len = n;
	return nbdc_piece(r, nbdc_nl.nbd_aio_block_status(c->h, n, req->offset, ecb, nbdc_cb_of(r),
							  LIBNBD_CMD_FLAG_REQ_ONE));
}

static int nbdc_send_cmds(struct nbdc_conn *c, struct nbdc_req *r, struct blk_request *req)
{
	const struct nbdc_state *s = nbdc_state(c->bs);

	switch (req->op) {
	case BLK_OP_READ:
	case BLK_OP_WRITE:
		return nbdc_send_rw(c, r, req);
	case BLK_OP_FLUSH: /* a server without flush has no cache to flush */
		return s->can_flush ? nbdc_piece(r, nbdc_nl.nbd_aio_flush(c->h, nbdc_cb_of(r), 0))
				    : 0;
	case BLK_OP_DISCARD:
		return nbdc_send_range(c, r, req, 0);
	case BLK_OP_WRITE_ZEROES:
		return nbdc_send_range(c, r, req, nbdc_zero_flags(req));
	case BLK_OP_BLOCK_STATUS:
		return nbdc_send_status(c, r, req);
	default:
		return -EINVAL;
	}
}

/* Put r on the wire. Whatever happens it finishes through c->done, at the
 * end of the round at the earliest: a command that fails to go out because
 * the connection died is retried with the others. */
static void nbdc_send(struct nbdc_conn *c, struct nbdc_req *r)
{
	struct blk_request *req = blk_req_from_drv(r);
	int ret;

	r->conn = c;
	r->err = 0;
	r->pieces = 1; /* held while issuing: no answer finishes it meanwhile */
	c->inflight++;
	ret = nbdc_send_cmds(c, r, req);
	if (ret < 0 && !r->err)
		r->err = ret;
	nbdc_piece_done(r);
	loop_request_flush(c->loop, &c->flush);
}

static void nbdc_connect(struct nbdc_conn *c);

/* 0: issued or waiting for a connection; -EIO: the reconnect delay is over
 * and a new attempt failed at once. */
static int nbdc_issue(struct nbdc_conn *c, struct nbdc_req *r)
{
	if (likely(c->st == NBDC_READY)) {
		nbdc_send(c, r);
		return 0;
	}
	if (c->st == NBDC_DOWN && c->failing) {
		nbdc_connect(c); /* one attempt, which this request waits for */
		if (c->st == NBDC_DOWN)
			return -EIO;
	}
	nbdc_q_push(&c->waiting, r);
	return 0;
}

/* ---- the connection's life ------------------------------------------------ */

static void nbdc_update_fd(struct nbdc_conn *c)
{
	unsigned dir = nbdc_nl.nbd_aio_get_direction(c->h);
	uint32_t ev = (dir & LIBNBD_AIO_DIRECTION_READ ? EPOLLIN : 0) |
		      (dir & LIBNBD_AIO_DIRECTION_WRITE ? EPOLLOUT : 0);

	if (c->fd_on) {
		if (ev != c->fdh.events)
			loop_fd_modify(c->loop, &c->fdh, ev);
		return;
	}
	c->fdh.fd = nbdc_nl.nbd_aio_get_fd(c->h);
	c->fdh.events = ev;
	if (c->fdh.fd >= 0 && loop_fd_add(c->loop, &c->fdh) == 0)
		c->fd_on = true;
	else
		log_err("nbd: %s: cannot watch the connection", nbdc_state(c->bs)->desc);
}

static void nbdc_drop_handle(struct nbdc_conn *c)
{
	if (c->fd_on)
		loop_fd_del(c->loop, &c->fdh);
	c->fd_on = false;
	nbdc_nl.nbd_close(c->h);
	c->h = NULL;
}

/* No connection (lost, or an attempt failed): wait and try again until the
 * deadline, then fail what waits. */
static void nbdc_down(struct nbdc_conn *c)
{
	const struct nbdc_state *s = nbdc_state(c->bs);
	uint64_t now = loop_now_ns(), at;

	if (c->h)
		nbdc_drop_handle(c);
	if (c->st == NBDC_READY) {
		log_warn("nbd: %s: connection lost%s", s->desc,
			 s->delay_ns ? "; reconnecting" : "");
		c->deadline_ns = now + s->delay_ns;
		c->backoff_ns = NBDC_RETRY_MIN_NS;
		c->failing = false;
		c->lost = true;
	}
	c->st = NBDC_DOWN;
	if (c->failing || now >= c->deadline_ns) {
		c->failing = true;
		nbdc_fail_waiting(c, -EIO);
		return;
	}
	at = now + c->backoff_ns;
	loop_timer_arm(c->loop, &c->timer, at < c->deadline_ns ? at : c->deadline_ns);
	c->backoff_ns =
		c->backoff_ns * 2 < NBDC_RETRY_MAX_NS ? c->backoff_ns * 2 : NBDC_RETRY_MAX_NS;
}

static void nbdc_timer_cb(struct loop_timer *t)
{
	struct nbdc_conn *c = container_of(t, struct nbdc_conn, timer);

	if (loop_now_ns() >= c->deadline_ns) {
		log_err("nbd: %s: no connection within reconnect-delay; requests fail",
			nbdc_state(c->bs)->desc);
		c->failing = true;
		nbdc_down(c);
		return;
	}
	nbdc_connect(c);
}

static void nbdc_connect(struct nbdc_conn *c)
{
	const struct nbdc_state *s = nbdc_state(c->bs);

	c->h = nbdc_handle_new(s);
	if (!c->h || (nbdc_start_connect(s, c->h) < 0 && !nbdc_nl.nbd_aio_is_connecting(c->h))) {
		nbdc_down(c);
		return;
	}
	c->st = NBDC_CONNECTING;
	nbdc_update_fd(c);
}

/* The export must be the one open() found. */
static bool nbdc_same_export(struct nbdc_conn *c)
{
	struct blk_node *bs = c->bs;

	return nbdc_nl.nbd_get_size(c->h) == (int64_t)bs->size &&
	       (bs->read_only || nbdc_nl.nbd_is_read_only(c->h) == 0);
}

static void nbdc_connected(struct nbdc_conn *c)
{
	const struct nbdc_state *s = nbdc_state(c->bs);
	struct nbdc_queue q = c->waiting;
	struct nbdc_req *r;

	if (!nbdc_same_export(c)) {
		log_err("nbd: %s: the export changed its size or became read-only; "
			"not using it",
			s->desc);
		c->failing = true;
		nbdc_down(c);
		return;
	}
	if (c->lost)
		log_info("nbd: %s: connected again", s->desc);
	c->lost = false;
	c->st = NBDC_READY;
	c->failing = false;
	c->deadline_ns = 0;
	if (loop_timer_armed(&c->timer))
		loop_timer_cancel(c->loop, &c->timer);
	if (!q.head)
		q.tail = &q.head;
	nbdc_q_init(&c->waiting);
	while ((r = nbdc_q_pop(&q)))
		nbdc_send(c, r);
	nbdc_update_fd(c);
}

/* Finish what libnbd answered. A command that failed on a dead connection
 * is not the server's answer: it waits for the next connection. */
static void nbdc_reap(struct nbdc_conn *c, bool dead)
{
	struct nbdc_req *r;

	while ((r = nbdc_q_pop(&c->done))) {
		c->inflight--;
		if (r->err && dead)
			nbdc_q_push(&c->waiting, r);
		else
			nbdc_finish(c, r, r->err);
	}
}

static void nbdc_service(struct nbdc_conn *c)
{
	bool dead;

	if (!c->h) { /* answers of a connection already dropped: they wait, or fail */
		nbdc_reap(c, true);
		if (c->failing)
			nbdc_fail_waiting(c, -EIO);
		return;
	}
	dead = nbdc_nl.nbd_aio_is_dead(c->h) || nbdc_nl.nbd_aio_is_closed(c->h);
	nbdc_reap(c, dead);
	if (dead) {
		if (c->st == NBDC_CONNECTING)
			log_debug("nbd: %s: %s", nbdc_state(c->bs)->desc, nbdc_nl.nbd_get_error());
		nbdc_down(c);
	} else if (c->st == NBDC_CONNECTING && !nbdc_nl.nbd_aio_is_connecting(c->h)) {
		nbdc_connected(c);
	} else {
		nbdc_update_fd(c);
	}
}

static void nbdc_fd_cb(struct loop_fd *fh, uint32_t rev)
{
	struct nbdc_conn *c = container_of(fh, struct nbdc_conn, fdh);
	const uint32_t bad = EPOLLHUP | EPOLLERR;
	unsigned dir = nbdc_nl.nbd_aio_get_direction(c->h);

	if ((rev & (EPOLLIN | bad)) && (dir & LIBNBD_AIO_DIRECTION_READ))
		nbdc_nl.nbd_aio_notify_read(c->h);
	dir = nbdc_nl.nbd_aio_get_direction(c->h);
	if ((rev & (EPOLLOUT | bad)) && (dir & LIBNBD_AIO_DIRECTION_WRITE))
		nbdc_nl.nbd_aio_notify_write(c->h);
	nbdc_service(c);
}

static void nbdc_flush_cb(struct loop_flush *f)
{
	nbdc_service(container_of(f, struct nbdc_conn, flush));
}

/* ---- per-loop state: a connection slot, or a loop to forward to ---------- */

static void nbdc_conn_start(struct nbdc_conn *c, struct nbd_handle *h)
{
	c->timer.cb = nbdc_timer_cb;
	c->fdh.cb = nbdc_fd_cb;
	c->flush.cb = nbdc_flush_cb;
	c->deadline_ns = loop_now_ns() + nbdc_state(c->bs)->delay_ns;
	c->backoff_ns = NBDC_RETRY_MIN_NS;
	if (!h) {
		nbdc_connect(c);
		return;
	}
	c->h = h;
	c->st = NBDC_READY;
	c->deadline_ns = 0;
	nbdc_update_fd(c);
}

static void *nbdc_ctor(struct blk_node *bs, struct loop *loop)
{
	struct nbdc_state *s = nbdc_state(bs);
	struct nbdc_conn *c = calloc(1, sizeof(*c));
	struct nbd_handle *h = NULL;
	unsigned k;

	if (!c)
		return NULL;
	c->bs = bs;
	c->loop = loop;
	c->slot = -1;
	nbdc_q_init(&c->waiting);
	nbdc_q_init(&c->done);
	pthread_mutex_lock(&s->lock);
	for (k = 0; k < s->nconns && s->slot_loop[k]; k++)
		;
	if (k < s->nconns) {
		s->slot_loop[k] = loop;
		c->slot = (int)k;
		h = s->first;
		s->first = NULL;
	} else {
		c->target = s->slot_loop[s->rr++ % s->nconns];
	}
	pthread_mutex_unlock(&s->lock);
	if (c->slot >= 0)
		nbdc_conn_start(c, h);
	return c;
}

/* A loop without a connection forwards to one that has; when that loop has
 * given its slot up since (a job's loop that finished), this loop takes a
 * free slot itself or another owner. The loop to forward to, or NULL: issue
 * here. */
static struct loop *nbdc_forward_to(struct nbdc_conn *c)
{
	struct nbdc_state *s = nbdc_state(c->bs);
	struct nbd_handle *h = NULL;
	unsigned k, held = 0;

	pthread_mutex_lock(&s->lock);
	for (k = 0; k < s->nconns; k++) {
		if (s->slot_loop[k] == c->target) {
			pthread_mutex_unlock(&s->lock);
			return c->target;
		}
		held += s->slot_loop[k] != NULL;
	}
	if (held == s->nconns) {
		c->target = s->slot_loop[s->rr++ % s->nconns];
		pthread_mutex_unlock(&s->lock);
		return c->target;
	}
	for (k = 0; s->slot_loop[k]; k++)
		;
	s->slot_loop[k] = c->loop;
	c->slot = (int)k;
	c->target = NULL;
	h = s->first;
	s->first = NULL;
	pthread_mutex_unlock(&s->lock);
	nbdc_conn_start(c, h);
	return NULL;
}

/* On the connection's loop: issue a request another loop sent. */
static void nbdc_fwd_run(struct loop_msg *m)
{
	struct nbdc_req *r = container_of(m, struct nbdc_req, msg);
	struct loop *loop = loop_current();
	struct nbdc_conn *c = blk_thread_state(r->bs, loop, nbdc_ctor);
	int ret;

	if (c && c->target) { /* this loop gave its slot up since: on to the owner */
		struct loop *to = nbdc_forward_to(c);

		if (to) {
			loop_send(to, &r->msg);
			return;
		}
	}
	if (!c) {
		ret = -ENOMEM;
		r->err = ret;
		r->msg.cb = nbdc_fwd_done;
		loop_send(blk_req_from_drv(r)->loop, &r->msg);
		return;
	}
	ret = nbdc_issue(c, r);
	if (ret < 0)
		nbdc_finish(c, r, ret);
}

static int nbdc_submit(struct blk_node *bs, struct blk_request *req)
{
	struct nbdc_req *r = (struct nbdc_req *)req->drv.bytes;
	struct nbdc_conn *c = blk_thread_state(bs, req->loop, nbdc_ctor);

	if (unlikely(!c))
		return -ENOMEM;
	if (req->op == BLK_OP_WRITE_ZEROES && (req->flags & BLK_F_NO_FALLBACK) &&
	    !nbdc_state(bs)->can_fast_zero)
		return -ENOTSUP;
	r->bs = bs;
	if (unlikely(c->target)) {
		struct loop *to = nbdc_forward_to(c);

		if (to) {
			r->msg.cb = nbdc_fwd_run;
			loop_send(to, &r->msg);
			return 0;
		}
	}
	return nbdc_issue(c, r);
}

/* Free a loop's state. On its loop (detach) the connection says goodbye. */
static void nbdc_conn_free(struct blk_node *bs, unsigned idx, bool on_loop)
{
	struct nbdc_state *s = nbdc_state(bs);
	struct nbdc_conn *c = bs->thread_state[idx];

	if (!c)
		return;
	bs->thread_state[idx] = NULL;
	if (c->slot >= 0) {
		if (on_loop && loop_timer_armed(&c->timer))
			loop_timer_cancel(c->loop, &c->timer);
		if (on_loop && c->fd_on)
			loop_fd_del(c->loop, &c->fdh);
		if (on_loop && c->h && nbdc_nl.nbd_aio_is_ready(c->h))
			nbdc_nl.nbd_shutdown(c->h, 0);
		nbdc_nl.nbd_close(c->h);
		pthread_mutex_lock(&s->lock);
		s->slot_loop[c->slot] = NULL;
		pthread_mutex_unlock(&s->lock);
	}
	if (c->inflight || c->waiting.head)
		log_err("nbd: %s: requests still in flight at detach", s->desc);
	free(c);
}

static void nbdc_detach_loop(struct blk_node *bs, struct loop *loop)
{
	nbdc_conn_free(bs, loop_index(loop), true);
}

/* The caller's loop still runs; the others are gone (their state cannot be
 * detached any more). */
static void nbdc_close(struct blk_node *bs)
{
	struct loop *self = loop_current();

	if (!bs->opaque)
		return;
	for (unsigned i = 0; i < LOOP_MAX_THREADS; i++)
		nbdc_conn_free(bs, i, self && loop_index(self) == i);
	nbdc_state_free(bs->opaque);
	bs->opaque = NULL;
}

/* NBD has no resize here: only the size it has. */
static int nbdc_truncate(struct blk_node *bs, uint64_t size)
{
	return size == bs->size ? 0 : -ENOTSUP;
}

static bool nbdc_can_discard(struct blk_node *bs)
{
	return nbdc_state(bs)->can_trim;
}

static bool nbdc_can_write_zeroes(struct blk_node *bs)
{
	return nbdc_state(bs)->can_zero;
}

static bool nbdc_can_fua(struct blk_node *bs)
{
	return nbdc_state(bs)->can_fua;
}

static bool nbdc_can_block_status(struct blk_node *bs)
{
	return nbdc_state(bs)->can_status;
}

static bool nbdc_can_multi_conn(struct blk_node *bs)
{
	return nbdc_state(bs)->can_multi;
}

const struct blk_driver blk_drv_nbd = {
	.name = "nbd",
	.open = nbdc_open,
	.close = nbdc_close,
	.submit = nbdc_submit,
	.truncate = nbdc_truncate,
	.detach_loop = nbdc_detach_loop,
	.can_discard = nbdc_can_discard,
	.can_write_zeroes = nbdc_can_write_zeroes,
	.can_fua = nbdc_can_fua,
	.can_block_status = nbdc_can_block_status,
	.can_multi_conn = nbdc_can_multi_conn,
};
