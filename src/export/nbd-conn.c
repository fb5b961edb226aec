/* NBD connection lifetime and socket I/O: the input buffer (one recv or
 * readv per readiness event, or a receive through the loop's io_uring in
 * transmission (nbd-ring.c); parsed for as many messages as it holds), the
 * output queue (handshake bytes, then finished requests' replies, sent with
 * one sendmsg per loop round from a flush hook), back-pressure, draining and
 * closing.
 *
 * Lifetime: refs = 1 while the socket is open + 1 per request taken from the
 * connection's pool; the connection is freed when it drops to zero (from its
 * flush hook if that is still queued), so a client that vanishes mid-request
 * leaves its requests to complete normally. Code that may drop the last
 * reference and then still touch the connection holds one of its own: the
 * socket and event callbacks, and nbd_conn_drain(), which the server's drain
 * message calls with none.
 *
 * Threading: everything here runs on conn->loop's thread. */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include "export/nbd-int.h"
#include "util/compiler.h"
#include "util/log.h"

static void conn_free(struct nbd_conn *c)
{
	if (c->pprev) {
		*c->pprev = c->next;
		if (c->next)
			c->next->pprev = c->pprev;
	}
	if (loop_timer_armed(&c->timer))
		loop_timer_cancel(c->loop, &c->timer);
	if (c->exp) {
		char who[160];

		snprintf(who, sizeof(who), "nbd: export '%s'", c->exp->name);
		log_errors_end(&c->io_errors, who);
	}
	nbd_req_free_all(c);
	nbd_tls_end(c);
	free(c->rbuf);
	free(c->hbuf);
	free(c->tx_iov);
	nbd_export_put(c->exp);
	nbd_export_put(c->meta_exp);
	nbd_server_conn_gone(c->srv, c->slot);
	free(c);
}

void nbd_conn_get(struct nbd_conn *c)
{
	c->refs++;
}

void nbd_conn_put(struct nbd_conn *c)
{
	if (--c->refs)
		return;
	/* A queued flush hook still points at us: it frees us when it runs. */
	if (c->flush.queued)
		return;
	conn_free(c);
}

/* Arm the fd for what we are waiting for; unregister it when nothing, so that
 * a hang-up we are not ready to read does not spin the loop. */
void nbd_conn_set_events(struct nbd_conn *c)
{
	uint32_t want = 0;
	int ret;

	if (c->state == NBD_CONN_CLOSED)
		return;
	if (c->ring) /* input comes through the loop's io_uring */
		nbd_ring_update(c);
	else if (c->phase == NBD_PHASE_TLS) /* the TLS handshake, once STARTTLS's ACK is out */
		want |= c->state == NBD_CONN_OPEN && c->hoff == c->hlen ? c->tls_want : 0;
	else if (c->state == NBD_CONN_OPEN && !c->in_blocked && !c->move_to)
		want |= EPOLLIN;
	if (c->out_blocked)
		want |= EPOLLOUT;
	if (want == c->events)
		return;
	if (!want) {
		loop_fd_del(c->loop, &c->fdh);
		ret = 0;
	} else if (!c->events) {
		c->fdh.events = want;
		ret = loop_fd_add(c->loop, &c->fdh);
	} else {
		ret = loop_fd_modify(c->loop, &c->fdh, want);
	}
	c->events = ret < 0 ? 0 : want;
	if (ret < 0)
		nbd_conn_close(c, "cannot watch the socket");
}

/* The connection has no request left: after a disconnect, make what the
 * client wrote durable before letting go (a flush nobody answers). */
static void conn_idle(struct nbd_conn *c)
{
	struct nbd_req *r;

	if (c->state != NBD_CONN_OPEN && c->dirty && c->exp) {
		r = nbd_req_take(c);
		if (r) {
			r->type = NBD_CMD_FLUSH;
			r->internal = true;
			c->dirty = false;
			if (nbd_req_submit(r, BLK_OP_FLUSH, 0, 0, 0) < 0)
				nbd_req_release(r);
			return;
		}
	}
	if (c->state == NBD_CONN_DRAIN && nbd_conn_out_empty(c))
		nbd_conn_close(c, NULL);
}

void nbd_conn_request_done(struct nbd_conn *c)
{
	if (c->busy == 0 && c->state != NBD_CONN_OPEN)
		conn_idle(c);
	else if (c->in_blocked)
		loop_request_flush(c->loop, &c->flush); /* unblock after this round's send */
}

/* Leave the budget's queue and give back a grant not yet used. */
static void conn_mem_cancel(struct nbd_conn *c)
{
	struct nbd_budget *b = c->srv->budget;

	if (!b)
		return;
	/* Not found: granted meanwhile, and conn_mem_granted() will see that
	 * the connection no longer reads. */
	if (c->mem_waiting && nbd_budget_cancel(b, c)) {
		c->mem_waiting = false;
		nbd_conn_put(c);
	}
	nbd_budget_put(b, c->mem_grant);
	c->mem_grant = 0;
}

static void conn_mem_granted(struct loop_msg *m)
{
	struct nbd_conn *c = container_of(m, struct nbd_conn, mem_msg);

	c->mem_waiting = false;
	c->mem_grant = c->mem_need;
	if (c->state != NBD_CONN_OPEN) {
		nbd_budget_put(c->srv->budget, c->mem_grant);
		c->mem_grant = 0;
	} else {
		nbd_conn_unblock(c);
	}
	nbd_conn_put(c);
}

/* Drop the write whose payload is being received (drain, close); while the
 * ring's receive may still write into its buffer, keep it until then. */
static void conn_drop_cur(struct nbd_conn *c)
{
	struct nbd_req *r = c->cur;

	if (!r)
		return;
	c->cur = NULL;
	if (c->recv_armed)
		c->cur_held = r;
	else
		nbd_req_release(r);
}

void nbd_conn_close(struct nbd_conn *c, const char *why)
{
	struct nbd_req *r;

	if (c->state == NBD_CONN_CLOSED)
		return;
	if (why)
		log_info("nbd: closing connection from %s (%s)", c->peer, why);
	if (c->events)
		loop_fd_del(c->loop, &c->fdh);
	c->events = 0;
	c->state = NBD_CONN_CLOSED;
	if (c->ring)
		nbd_ring_close(c);
	nbd_tls_bye(c);
	close(c->fd);
	c->fd = -1;
	if (loop_timer_armed(&c->timer))
		loop_timer_cancel(c->loop, &c->timer);
	c->hoff = c->hlen = 0;
	c->tls_ooff = c->tls_olen = 0;
	c->tls_again = c->tls_direct = false;
	c->tls_ipos = c->tls_iend = c->tls_coff = c->tls_clen = 0;
	conn_mem_cancel(c);
	conn_drop_cur(c);
	while ((r = c->outq)) {
		c->outq = r->next;
		nbd_req_release(r);
	}
	c->outq_tail = &c->outq;
	nbd_tls_linger_stop(c); /* the socket's reference is still ours */
	if (c->busy == 0)
		conn_idle(c);
	nbd_conn_put(c);
}

void nbd_conn_drain(struct nbd_conn *c)
{
	if (c->state != NBD_CONN_OPEN)
		return;
	if (c->phase != NBD_PHASE_TRANSMISSION) {
		nbd_conn_close(c, NULL);
		return;
	}
	/* Releasing the half-received write may close the connection and drop
	 * the socket's reference, and the drain message that calls us holds
	 * none: keep the connection alive until we are done with it. */
	nbd_conn_get(c);
	c->state = NBD_CONN_DRAIN;
	conn_mem_cancel(c);
	conn_drop_cur(c); /* its payload will never arrive */
	nbd_conn_set_events(c);
	if (c->busy == 0)
		conn_idle(c);
	nbd_conn_put(c);
}

/* ---- output ------------------------------------------------------------- */

bool nbd_conn_out_empty(const struct nbd_conn *c)
{
	return c->hoff == c->hlen && !c->outq && c->tls_ooff == c->tls_olen && !c->tls_again &&
	       c->tls_coff == c->tls_clen;
}

int nbd_conn_hbuf_append(struct nbd_conn *c, const void *p, size_t len)
{
	if (c->hlen + len > c->hcap) {
		size_t cap = c->hcap ? c->hcap : 4096;
		uint8_t *nb;

		while (cap < c->hlen + len)
			cap *= 2;
		nb = realloc(c->hbuf, cap);
		if (!nb)
			return -ENOMEM;
		c->hbuf = nb;
		c->hcap = cap;
	}
	memcpy(c->hbuf + c->hlen, p, len);
	c->hlen += len;
	return 0;
}

void nbd_conn_kick(struct nbd_conn *c)
{
	loop_request_flush(c->loop, &c->flush);
}

void nbd_conn_queue_reply(struct nbd_conn *c, struct nbd_req *r)
{
	if (c->state == NBD_CONN_CLOSED) {
		nbd_req_release(r);
		return;
	}
	r->next = NULL;
	*c->outq_tail = r;
	c->outq_tail = &r->next;
	loop_request_flush(c->loop, &c->flush);
}

/* Build the iovec of everything queued (up to NBD_SEND_IOV entries). */
int nbd_conn_gather(struct nbd_conn *c, struct iovec *iov, size_t *total)
{
	struct nbd_req *r;
	int n = 0;

	*total = 0;
	if (c->hoff < c->hlen) {
		iov[n].iov_base = c->hbuf + c->hoff;
		iov[n].iov_len = c->hlen - c->hoff;
		*total += iov[n++].iov_len;
	}
	for (r = c->outq; r; r = r->next) {
		int i;

		if (n + r->riovcnt > NBD_SEND_IOV)
			break;
		for (i = 0; i < r->riovcnt; i++) {
			iov[n] = r->riov[i];
			*total += iov[n++].iov_len;
		}
	}
	return n;
}

/* Skip n sent bytes of a request's reply; true when all of it is sent. */
static bool req_advance(struct nbd_req *r, size_t *n)
{
	int i = 0;

	while (i < r->riovcnt && *n >= r->riov[i].iov_len) {
		*n -= r->riov[i].iov_len;
		i++;
	}
	if (i == r->riovcnt)
		return true;
	r->riov[i].iov_base = (char *)r->riov[i].iov_base + *n;
	r->riov[i].iov_len -= *n;
	*n = 0;
	memmove(r->riov, r->riov + i, sizeof(r->riov[0]) * (size_t)(r->riovcnt - i));
	r->riovcnt -= i;
	return false;
}

void nbd_conn_consume(struct nbd_conn *c, size_t n)
{
	struct nbd_req *r;
	size_t k;

	if (c->hoff < c->hlen) {
		k = c->hlen - c->hoff < n ? c->hlen - c->hoff : n;
		c->hoff += k;
		n -= k;
		if (c->hoff == c->hlen)
			c->hoff = c->hlen = 0;
	}
	while (n && (r = c->outq)) {
		if (!req_advance(r, &n))
			break;
		c->outq = r->next;
		if (!c->outq)
			c->outq_tail = &c->outq;
		nbd_req_release(r);
	}
}

bool nbd_conn_sent(struct nbd_conn *c, ssize_t res, size_t total)
{
	if (res == -EINTR)
		return true;
	if (res < 0 && res != -EAGAIN) {
		nbd_conn_close(c, res == -EPIPE || res == -ECONNRESET ? "client went away"
								      : "send failed");
		return false;
	}
	if (res > 0)
		nbd_conn_consume(c, (size_t)res);
	/* A short send means the socket is full: wait for room. */
	if (res < 0 || (size_t)res < total) {
		c->out_blocked = true;
		return false;
	}
	return true;
}

static void conn_send(struct nbd_conn *c)
{
	static __thread struct iovec iov[NBD_SEND_IOV];
	struct msghdr mh;
	size_t total;
	ssize_t sent;

	if (c->tls_on) {
		nbd_tls_send(c);
		return;
	}
	if (c->ring && nbd_ring_send(c)) {
		nbd_conn_set_events(c);
		return;
	}
	while (c->state != NBD_CONN_CLOSED && !c->out_blocked) {
		memset(&mh, 0, sizeof(mh));
		mh.msg_iov = iov;
		mh.msg_iovlen = (size_t)nbd_conn_gather(c, iov, &total);
		if (!mh.msg_iovlen)
			break;
		sent = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (!nbd_conn_sent(c, sent < 0 ? -errno : sent, total))
			break;
	}
	nbd_conn_set_events(c);
}

static bool conn_can_unblock(struct nbd_conn *c)
{
	if (c->phase != NBD_PHASE_TRANSMISSION)
		return c->hlen - c->hoff < NBD_HBUF_HIGH;
	return !c->mem_waiting && (c->nfree || c->nreqs < NBD_CONN_MAX_REQS) &&
	       c->busy_bytes < NBD_CONN_MAX_BYTES;
}

void nbd_conn_unblock(struct nbd_conn *c)
{
	if (!c->in_blocked || c->state != NBD_CONN_OPEN || !conn_can_unblock(c))
		return;
	c->in_blocked = false;
	nbd_conn_parse(c);
	/* Records GnuTLS decrypted already: no socket event will tell. */
	if (nbd_tls_pending(c))
		nbd_tls_read(c);
}

/* ---- moving to the export's loop ------------------------------------------ */

/* On the new loop: the connection is this loop's from here on. A drain or an
 * export removal that ran while it was between loops missed it: act now. */
static void conn_moved(struct loop_msg *m)
{
	struct nbd_conn *c = container_of(m, struct nbd_conn, move_msg);
	struct nbd_slot *slot = c->slot;

	c->next = slot->conns;
	if (c->next)
		c->next->pprev = &c->next;
	c->pprev = &slot->conns;
	slot->conns = c;
	nbd_conn_get(c);
	if (atomic_load(&c->exp->removed)) {
		nbd_conn_close(c, "export removed");
	} else if (atomic_load(&c->srv->draining)) {
		nbd_conn_drain(c);
	} else {
		if (loop_uring_waits(c->loop) && !c->tls_on) /* the ring would get ciphertext */
			nbd_ring_start(c);
		nbd_conn_kick(c);       /* what is left of the handshake's reply */
		nbd_conn_parse(c);      /* requests the client sent right after GO */
		if (nbd_tls_pending(c)) /* records GnuTLS decrypted on the old loop */
			nbd_tls_read(c);
	}
	nbd_conn_put(c);
}

/* On the old loop, at the end of a round, with nothing of the connection
 * left in this loop (fd handler, timer, flush, receive, budget grant). */
static void conn_move(struct nbd_conn *c)
{
	struct nbd_server *s = c->srv;
	struct nbd_slot *to = &s->slots[loop_index(c->move_to)];

	assert(!c->ring && !c->mem_queued && !loop_timer_armed(&c->timer) &&
	       !loop_timer_armed(&c->tls_linger));
	if (c->events)
		loop_fd_del(c->loop, &c->fdh);
	c->events = 0;
	*c->pprev = c->next;
	if (c->next)
		c->next->pprev = c->pprev;
	c->pprev = NULL;
	c->next = NULL;
	atomic_fetch_add(&to->nconns, 1);
	atomic_fetch_sub(&c->slot->nconns, 1);
	c->slot = to;
	c->loop = c->move_to;
	c->move_to = NULL;
	c->move_msg.cb = conn_moved;
	loop_send(c->loop, &c->move_msg);
}

static void conn_flush_cb(struct loop_flush *f)
{
	struct nbd_conn *c = container_of(f, struct nbd_conn, flush);

	if (!c->refs) {
		conn_free(c);
		return;
	}
	nbd_conn_get(c);
	conn_send(c);
	nbd_tls_handshake(c); /* after STARTTLS's ACK went out */
	nbd_conn_unblock(c);
	if (!c->in_blocked && nbd_tls_pending(c)) /* nbd_tls_read() stopped at its bound */
		nbd_tls_read(c);
	if (c->state == NBD_CONN_DRAIN && c->busy == 0)
		conn_idle(c);
	/* Only the socket's reference and ours: nothing else holds it here. */
	if (c->move_to && c->state == NBD_CONN_OPEN && c->refs == 2 && !c->flush.queued) {
		c->refs--;
		conn_move(c);
		return;
	}
	nbd_conn_put(c);
}

/* ---- input -------------------------------------------------------------- */

void nbd_conn_parse(struct nbd_conn *c)
{
	int ret = 0;

	if (c->in_parse)
		return;
	/* The ring's receive writes into rbuf, which parsing moves. */
	assert(!c->recv_armed);
	c->in_parse = true;
	if (c->state == NBD_CONN_OPEN && !c->in_blocked && c->phase != NBD_PHASE_TRANSMISSION)
		ret = nbd_handshake_input(c);
	if (!ret && c->state == NBD_CONN_OPEN && !c->in_blocked &&
	    c->phase == NBD_PHASE_TRANSMISSION && !c->move_to)
		ret = nbd_transmit_input(c);
	c->in_parse = false;
	if (ret < 0) {
		nbd_conn_close(c, ret == -EPROTO ? "protocol violation" : strerror(-ret));
		return;
	}
	/* Keep the unparsed tail (a partial message) at the start. */
	if (c->rpos) {
		memmove(c->rbuf, c->rbuf + c->rpos, c->rend - c->rpos);
		c->rend -= c->rpos;
		c->rpos = 0;
	}
	nbd_conn_set_events(c);
}

bool nbd_conn_skip_input(struct nbd_conn *c)
{
	size_t avail = c->rend - c->rpos;
	size_t k = c->skip < avail ? (size_t)c->skip : avail;

	c->rpos += k;
	c->skip -= k;
	return c->skip == 0;
}

/* A connection waiting in the handshake costs a small buffer only. */
int nbd_conn_enter_transmission(struct nbd_conn *c)
{
	uint8_t *nb = realloc(c->rbuf, NBD_RBUF_SIZE);

	if (!nb)
		return -ENOMEM;
	c->rbuf = nb;
	c->rcap = NBD_RBUF_SIZE;
	if (c->move_to)
		nbd_conn_kick(c); /* the move happens in the round's flush hook */
	else if (loop_uring_waits(c->loop) && !c->tls_on) /* the ring would get ciphertext */
		nbd_ring_start(c);
	return 0;
}

/* Received payload bytes go straight to the write being received. */
int nbd_conn_rx_iov(struct nbd_conn *c, struct iovec *iov)
{
	int cnt = 0;

	if (c->cur) {
		iov[cnt].iov_base = (char *)c->cur->buf + c->cur_have;
		iov[cnt++].iov_len = c->cur->len - c->cur_have;
	}
	/* Cannot be full: every message we wait for whole fits in rbuf. */
	if (!cnt && c->rend == c->rcap)
		return 0;
	iov[cnt].iov_base = c->rbuf + c->rend;
	iov[cnt++].iov_len = c->rcap - c->rend;
	return cnt;
}

void nbd_conn_received(struct nbd_conn *c, const struct iovec *iov, int cnt, ssize_t n)
{
	if (n == 0) {
		log_debug("nbd: client closed its side");
		nbd_conn_drain(c);
		return;
	}
	if (n < 0) {
		if (n == -EAGAIN || n == -EINTR)
			nbd_conn_set_events(c); /* the ring's receive is armed again */
		else
			nbd_conn_close(c, n == -ECONNRESET ? "client went away" : "recv failed");
		return;
	}
	if (cnt == 2) {
		size_t k = (size_t)n < iov[0].iov_len ? (size_t)n : iov[0].iov_len;

		c->cur_have += k;
		c->rend += (size_t)n - k;
	} else {
		c->rend += (size_t)n;
	}
	nbd_conn_parse(c);
}

static void conn_read(struct nbd_conn *c)
{
	struct iovec iov[2];
	int cnt = nbd_conn_rx_iov(c, iov);
	ssize_t n;

	if (c->tls_on) {
		nbd_tls_read(c);
		return;
	}
	if (!cnt) {
		nbd_conn_close(c, "input buffer full");
		return;
	}
	if (cnt == 1)
		n = recv(c->fd, iov[0].iov_base, iov[0].iov_len, MSG_DONTWAIT);
	else
		n = readv(c->fd, iov, cnt);
	nbd_conn_received(c, iov, cnt, n < 0 ? -errno : n);
}

static void conn_fd_cb(struct loop_fd *h, uint32_t revents)
{
	struct nbd_conn *c = container_of(h, struct nbd_conn, fdh);

	nbd_conn_get(c);
	if ((revents & (EPOLLOUT | EPOLLERR | EPOLLHUP)) && c->out_blocked) {
		c->out_blocked = false;
		conn_send(c);
		nbd_conn_unblock(c);
		if (c->state == NBD_CONN_DRAIN && c->busy == 0)
			conn_idle(c);
	}
	if (c->phase == NBD_PHASE_TLS) {
		nbd_tls_handshake(c);
		nbd_conn_put(c);
		return;
	}
	if ((revents & (EPOLLIN | EPOLLERR | EPOLLHUP)) && c->state == NBD_CONN_OPEN &&
	    !c->in_blocked && !c->ring)
		conn_read(c);
	nbd_conn_put(c);
}

static void conn_timer_cb(struct loop_timer *t)
{
	struct nbd_conn *c = container_of(t, struct nbd_conn, timer);

	nbd_conn_get(c);
	nbd_conn_close(c, "handshake timed out");
	nbd_conn_put(c);
}

/* "127.0.0.1:4321", "[::1]:4321" or "unix socket", for the log. */
static void conn_peer_name(struct nbd_conn *c)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char host[INET6_ADDRSTRLEN] = "?";
	const void *addr = NULL;
	unsigned port = 0;

	snprintf(c->peer, sizeof(c->peer), "unix socket");
	if (getpeername(c->fd, (struct sockaddr *)&ss, &len) < 0)
		return;
	if (ss.ss_family == AF_INET) {
		addr = &((struct sockaddr_in *)&ss)->sin_addr;
		port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
	} else if (ss.ss_family == AF_INET6) {
		addr = &((struct sockaddr_in6 *)&ss)->sin6_addr;
		port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	}
	if (!addr)
		return;
	inet_ntop(ss.ss_family, addr, host, sizeof(host));
	snprintf(c->peer, sizeof(c->peer), ss.ss_family == AF_INET6 ? "[%s]:%u" : "%s:%u", host,
		 port);
}

static void conn_tune_socket(int fd)
{
	int one = 1, sz = 4 << 20;

	/* Replies are sent whole, one sendmsg per round: no need for Nagle.
	 * Fails harmlessly on unix sockets. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof(sz));
	setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof(sz));
}

int nbd_conn_new(struct nbd_server *s, struct nbd_slot *slot, struct loop *loop, int fd)
{
	struct nbd_conn *c = calloc(1, sizeof(*c));
	int ret = -ENOMEM;

	if (!c || !(c->rbuf = malloc(NBD_HS_RBUF_SIZE)))
		goto fail;
	c->rcap = NBD_HS_RBUF_SIZE;
	c->srv = s;
	c->slot = slot;
	c->loop = loop;
	c->fd = fd;
	c->refs = 1;
	c->tls_layer = -1;
	c->outq_tail = &c->outq;
	c->fdh = (struct loop_fd){.fd = fd, .cb = conn_fd_cb};
	c->flush.cb = conn_flush_cb;
	c->mem_msg.cb = conn_mem_granted;
	c->timer.cb = conn_timer_cb;
	conn_tune_socket(fd);
	conn_peer_name(c);
	ret = nbd_handshake_start(c);
	if (ret < 0)
		goto fail;
	c->next = slot->conns;
	if (c->next)
		c->next->pprev = &c->next;
	c->pprev = &slot->conns;
	slot->conns = c;
	loop_timer_arm(loop, &c->timer, loop_now_ns() + NBD_HANDSHAKE_NS);
	/* A failure to watch the socket closes the connection: the flush hook
	 * queued first frees it then, after this function is done with it. */
	nbd_conn_kick(c);
	nbd_conn_set_events(c);
	return 0;

fail:
	if (c) {
		free(c->rbuf);
		free(c->hbuf);
	}
	free(c);
	close(fd);
	nbd_server_conn_gone(s, slot);
	return ret;
}
