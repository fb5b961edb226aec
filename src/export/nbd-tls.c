/* NBD over TLS: the session a STARTTLS sets up, its handshake driven by the
 * connection's fd handler without blocking the loop, the check of the
 * client's certificate or PSK identity against the server's authz object,
 * and then the record layer for every byte of the connection.
 *
 * The record layer is GnuTLS's, on the connection's loop: gnutls_record_recv
 * into the same input buffer (and pending write's buffer) a plain recv
 * fills, so parsing is unchanged; replies are copied from the output queue
 * into tls_obuf (large READ data is not) and made into records of up to
 * 16 KiB. After the handshake GnuTLS's transport is ours: it pulls
 * ciphertext from tls_ibuf, which one recv fills, and pushes records into
 * tls_cbuf, which one send empties, so a round of requests and replies costs
 * a recv and a send as without TLS, not two calls per record. The io_uring receive
 * (nbd-ring.c) stays off for these connections: it would hand us ciphertext.
 * When GnuTLS moves the keys into the kernel (kTLS, logged per connection),
 * the same calls go through the kernel's record layer.
 *
 * Threading: runs on the connection's loop. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "export/nbd-int.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/tls.h"

#define NBD_TLS_OBUF (64u << 10)   /* small plaintext pieces staged for GnuTLS */
#define NBD_TLS_READS 64           /* records read per readiness event, at most */
#define NBD_TLS_DIRECT (16u << 10) /* output pieces this large are sent without a copy */
#define NBD_TLS_IBUF (64u << 10)   /* ciphertext read at once */
#define NBD_TLS_CBUF (256u << 10)  /* records made, sent at once */
#define NBD_TLS_RECORD (16u << 10) /* a record's plaintext at most: what one send takes */
#define NBD_TLS_HOLD 3             /* rounds replies may wait for more (tls_hold) */
/* tls_linger: how long replies wait for the client's next requests, how
 * many (or how many bytes) end the wait, the requests that must come in
 * meanwhile for the next wait, and the most sends skipped after one where
 * fewer did. */
#define NBD_TLS_LINGER_NS 50000
#define NBD_TLS_LINGER_REPLIES 16
#define NBD_TLS_LINGER_BYTES NBD_TLS_OBUF
#define NBD_TLS_LINGER_GAIN 2
#define NBD_TLS_LINGER_SKIP_MAX 1024

int nbd_tls_start(struct nbd_conn *c)
{
	char err[256];
	int ret;

	c->tls_creds = tls_creds_get(c->srv->tls_creds);
	if (!c->tls_creds) {
		log_warn("nbd: TLS client %s: no TLS credentials with id '%s'", c->peer,
			 c->srv->tls_creds);
		return -ENOENT;
	}
	c->tls_obuf = malloc(NBD_TLS_OBUF);
	ret = c->tls_obuf ? tls_session_new(c->tls_creds, c->fd, &c->tls, err, sizeof(err))
			  : -ENOMEM;
	if (ret < 0) {
		log_warn("nbd: TLS client %s: %s", c->peer, ret == -ENOMEM ? "out of memory" : err);
		nbd_tls_end(c); /* the client may ask again */
		return ret;
	}
	c->tls_want = EPOLLIN;
	c->phase = NBD_PHASE_TLS;
	return 0;
}

/* GnuTLS's transport after the handshake (tls_ibuf, tls_cbuf). The end of
 * the socket's input is not GnuTLS's to see: without a close_notify before
 * it, GnuTLS would call it a premature termination and invalidate the
 * session, and the replies to the requests already read could not be sent;
 * it gets "try again" and tls_eof says the rest. */
static ssize_t tls_pull(gnutls_transport_ptr_t p, void *data, size_t len)
{
	struct nbd_conn *c = p;
	ssize_t n;

	if (c->tls_ipos == c->tls_iend) {
		n = c->tls_eof ? 0 : recv(c->fd, c->tls_ibuf, NBD_TLS_IBUF, MSG_DONTWAIT);
		if (n <= 0) {
			c->tls_eof = n == 0;
			gnutls_transport_set_errno(c->tls, n < 0 ? errno : EAGAIN);
			return -1;
		}
		c->tls_ipos = 0;
		c->tls_iend = (size_t)n;
	}
	if (len > c->tls_iend - c->tls_ipos)
		len = c->tls_iend - c->tls_ipos;
	memcpy(data, c->tls_ibuf + c->tls_ipos, len);
	c->tls_ipos += len;
	return (ssize_t)len;
}

static ssize_t tls_push(gnutls_transport_ptr_t p, const void *data, size_t len)
{
	struct nbd_conn *c = p;

	if (len > NBD_TLS_CBUF - c->tls_clen) {
		gnutls_transport_set_errno(c->tls, EAGAIN); /* send what is there first */
		return -1;
	}
	memcpy(c->tls_cbuf + c->tls_clen, data, len);
	c->tls_clen += len;
	return (ssize_t)len;
}

static int tls_own_transport(struct nbd_conn *c)
{
	c->tls_ibuf = malloc(NBD_TLS_IBUF);
	c->tls_cbuf = malloc(NBD_TLS_CBUF);
	if (!c->tls_ibuf || !c->tls_cbuf)
		return -ENOMEM;
	gnutls_transport_set_ptr(c->tls, c);
	gnutls_transport_set_pull_function(c->tls, tls_pull);
	gnutls_transport_set_push_function(c->tls, tls_push);
	return 0;
}

/* The handshake is done: is this client allowed in? */
static int tls_admit(struct nbd_conn *c)
{
	char id[1024], err[1280];
	struct tls_authz *az = NULL;
	char *desc;
	int ret;

	if (c->srv->tls_authz && !(az = tls_authz_get(c->srv->tls_authz))) {
		log_warn("nbd: TLS client %s refused: Cannot find QAuthZ object '%s'", c->peer,
			 c->srv->tls_authz);
		return -EACCES;
	}
	ret = tls_session_check(c->tls, c->tls_creds, az, id, sizeof(id), err, sizeof(err));
	tls_authz_put(az);
	if (ret < 0) {
		log_warn("nbd: TLS client %s refused: %s", c->peer, err);
		return ret;
	}
	/* Both directions in the kernel, or it is GnuTLS's loop doing the work. */
	c->tls_layer = gnutls_transport_is_ktls_enabled(c->tls) == GNUTLS_KTLS_DUPLEX;
	atomic_fetch_add(&c->srv->tls_conns[c->tls_layer], 1);
	desc = gnutls_session_get_desc(c->tls);
	log_info("nbd: TLS client %s%s%s: %s, record layer: %s", c->peer, id[0] ? " " : "", id,
		 desc ? desc : "?", tls_session_record_layer(c->tls));
	gnutls_free(desc);
	return 0;
}

void nbd_tls_handshake(struct nbd_conn *c)
{
	int ret, i;

	if (c->state != NBD_CONN_OPEN || c->phase != NBD_PHASE_TLS || !nbd_conn_out_empty(c))
		return; /* the STARTTLS reply goes out in plaintext first */
	for (i = 0; i < 8; i++) {
		ret = gnutls_handshake(c->tls);
		if (ret >= 0 || gnutls_error_is_fatal(ret) || ret == GNUTLS_E_AGAIN)
			break;
	}
	if (ret == GNUTLS_E_AGAIN || (ret < 0 && !gnutls_error_is_fatal(ret))) {
		c->tls_want = gnutls_record_get_direction(c->tls) ? EPOLLOUT : EPOLLIN;
		nbd_conn_set_events(c);
		return;
	}
	if (ret < 0) {
		log_warn("nbd: TLS handshake with %s failed: %s", c->peer, gnutls_strerror(ret));
		nbd_conn_close(c, NULL);
		return;
	}
	if (tls_admit(c) < 0 || tls_own_transport(c) < 0) {
		nbd_conn_close(c, NULL);
		return;
	}
	c->tls_on = true;
	c->phase = NBD_PHASE_OPTIONS;
	nbd_conn_set_events(c);
	if (nbd_tls_pending(c))
		nbd_tls_read(c);
}

bool nbd_tls_pending(const struct nbd_conn *c)
{
	return c->tls_on && c->state == NBD_CONN_OPEN &&
	       (c->tls_ipos < c->tls_iend || gnutls_record_check_pending(c->tls) > 0);
}

/* TLS 1.2: the client sent a ClientHello to renegotiate. Its identity was
 * checked once, after the first handshake (tls_admit), so there is no new
 * one: "no_renegotiation ... sent by the server in response to a client
 * hello after initial handshaking" (RFC 5246, 7.2.2), then the end, for
 * "a server receiving this error code can only initiate a new handshake or
 * terminate the session" (GnuTLS, gnutls_record_recv). */
static void tls_refuse_renegotiation(struct nbd_conn *c)
{
	log_warn("nbd: TLS client %s asked for a renegotiation: renegotiation refused", c->peer);
	/* Our push function takes the alert (tls_cbuf has room for a record
	 * whenever no record send is pending); nbd_tls_bye sends it. */
	if (!c->tls_again)
		(void)gnutls_alert_send(c->tls, GNUTLS_AL_WARNING, GNUTLS_A_NO_RENEGOTIATION);
	nbd_conn_close(c, "TLS renegotiation refused");
}

/* One record (or what fits of it) into the input; false: stop reading. */
static bool tls_read_one(struct nbd_conn *c)
{
	struct iovec iov[2];
	int cnt = nbd_conn_rx_iov(c, iov);
	ssize_t n;

	if (!cnt) {
		nbd_conn_close(c, "input buffer full");
		return false;
	}
	n = gnutls_record_recv(c->tls, iov[0].iov_base, iov[0].iov_len);
	/* Also what GnuTLS says after a record of its own (a TLS 1.3 KeyUpdate,
	 * handled inside: with update_requested, its KeyUpdate goes out before
	 * our next record), when the records after it may already be read. */
	if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
		if (nbd_tls_pending(c))
			return true;
		if (!c->tls_eof)
			return false;
		n = 0; /* the socket ended, with no TLS close: end of input all the same */
	}
	if (n == GNUTLS_E_REHANDSHAKE) {
		tls_refuse_renegotiation(c);
		return false;
	}
	if (n < 0 && !gnutls_error_is_fatal((int)n))
		return true; /* a TLS 1.2 warning alert: ignored */
	if (n < 0) {
		log_warn("nbd: TLS error from %s: %s", c->peer, gnutls_strerror((int)n));
		nbd_conn_close(c, "TLS error");
		return false;
	}
	/* Bytes land in iov[0] first, as nbd_conn_received() counts them. */
	nbd_conn_received(c, iov, cnt, n);
	return nbd_tls_pending(c);
}

void nbd_tls_read(struct nbd_conn *c)
{
	int i;

	if (c->tls_reading || c->in_parse)
		return;
	c->tls_reading = true;
	nbd_conn_get(c);
	for (i = 0; i < NBD_TLS_READS; i++) {
		if (c->state != NBD_CONN_OPEN || c->in_blocked || c->mem_waiting ||
		    !tls_read_one(c))
			break;
	}
	c->tls_reading = false;
	/* Bytes already read from the socket: no event will come for them, so
	 * the flush hook reads on (after this round's replies go out). */
	if (i == NBD_TLS_READS && nbd_tls_pending(c))
		nbd_conn_kick(c);
	nbd_conn_set_events(c);
	nbd_conn_put(c);
}

/* Copy what is queued into tls_obuf, up to the next large piece (READ data
 * of 16 KiB or more), which goes out from where it is: *direct gets it
 * when it comes first. false when nothing is queued. */
static bool tls_fill(struct nbd_conn *c, struct iovec *direct)
{
	static __thread struct iovec iov[NBD_SEND_IOV];
	size_t total, k = 0, m;
	int cnt = nbd_conn_gather(c, iov, &total), i;

	direct->iov_len = 0;
	if (cnt && iov[0].iov_len >= NBD_TLS_DIRECT) {
		*direct = iov[0];
		return true;
	}
	for (i = 0; i < cnt && k < NBD_TLS_OBUF && iov[i].iov_len < NBD_TLS_DIRECT; i++) {
		m = iov[i].iov_len < NBD_TLS_OBUF - k ? iov[i].iov_len : NBD_TLS_OBUF - k;
		memcpy(c->tls_obuf + k, iov[i].iov_base, m);
		k += m;
	}
	c->tls_ooff = 0;
	c->tls_olen = k; /* before consuming: output is not empty yet */
	if (k)
		nbd_conn_consume(c, k);
	return k > 0;
}

/* A record of n bytes went out: from tls_obuf, or straight from the queue. */
static void tls_sent(struct nbd_conn *c, size_t n)
{
	c->tls_again = false;
	if (c->tls_direct) {
		c->tls_direct = false;
		nbd_conn_consume(c, n);
	} else {
		c->tls_ooff += n;
	}
}

static size_t tls_record_len(size_t len)
{
	return len < NBD_TLS_RECORD ? len : NBD_TLS_RECORD;
}

/* Send the records made; false when the connection closed. A short send
 * leaves the rest for EPOLLOUT. */
static bool tls_flush(struct nbd_conn *c)
{
	ssize_t n;

	while (c->tls_coff < c->tls_clen) {
		n = send(c->fd, c->tls_cbuf + c->tls_coff, c->tls_clen - c->tls_coff,
			 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN) {
			nbd_conn_close(c, errno == EPIPE || errno == ECONNRESET ? "client went away"
										: "send failed");
			return false;
		}
		if (n < 0) {
			c->out_blocked = true;
			return true;
		}
		c->tls_coff += (size_t)n;
	}
	c->tls_coff = c->tls_clen = 0;
	return true;
}

/* Make records of what is queued into tls_cbuf, until half of it is used
 * (or it is full: tls_again). Pieces sent straight from the queue stay
 * queued until GnuTLS took them (tls_direct): it encrypts a record into
 * its own buffer, so the call again with NULL, 0 needs none of our bytes.
 * Each call gets one record's worth: when a KeyUpdate is due (the client
 * asked for one), GnuTLS copies what it is given before it sends the
 * KeyUpdate, then makes one record of it. tls_cbuf has room for both
 * whenever a call is made, so that GnuTLS never has a KeyUpdate and a
 * record half sent at once.
 * false: nothing was made, or the connection closed. */
static bool tls_make_records(struct nbd_conn *c)
{
	struct iovec d = {NULL, 0};
	bool made = false;
	ssize_t n;

	while (c->state != NBD_CONN_CLOSED && c->tls_clen < NBD_TLS_CBUF / 2) {
		if (!c->tls_again && c->tls_ooff == c->tls_olen && !tls_fill(c, &d))
			break;
		if (c->tls_again)
			n = gnutls_record_send(c->tls, NULL, 0);
		else if (d.iov_len)
			n = gnutls_record_send(c->tls, d.iov_base, tls_record_len(d.iov_len));
		else
			n = gnutls_record_send(c->tls, c->tls_obuf + c->tls_ooff,
					       tls_record_len(c->tls_olen - c->tls_ooff));
		c->tls_direct = c->tls_direct || d.iov_len;
		d.iov_len = 0;
		if (n == GNUTLS_E_AGAIN || n == GNUTLS_E_INTERRUPTED) {
			c->tls_again = true;
			return true; /* tls_cbuf is full: send it */
		}
		if (n < 0) {
			log_warn("nbd: TLS send to %s failed: %s", c->peer,
				 gnutls_strerror((int)n));
			nbd_conn_close(c, "send failed");
			return false;
		}
		tls_sent(c, (size_t)n);
		made = true;
	}
	return made;
}

static void tls_hold_cb(struct loop_defer *d)
{
	struct nbd_conn *c = container_of(d, struct nbd_conn, tls_hold);

	c->tls_hold_queued = false;
	if (c->state != NBD_CONN_CLOSED)
		nbd_conn_kick(c);
	nbd_conn_put(c);
}

/* A burst of completions is dispatched LOOP_REAP_BUDGET per round, and
 * replies sent every round would go out in as many sends, each of which
 * wakes the client for part of the burst, and it answers with as many
 * small bursts of requests. While the loop's next round is sure to find
 * work (and so will not sleep), the replies wait for it: at most
 * NBD_TLS_HOLD rounds in a row. True: held, the round after sends. */
static bool tls_hold(struct nbd_conn *c)
{
	if (c->tls_hold_queued)
		return true;
	if (c->state != NBD_CONN_OPEN || c->phase != NBD_PHASE_TRANSMISSION || c->move_to ||
	    c->out_blocked || nbd_conn_out_empty(c) || c->tls_coff < c->tls_clen ||
	    c->tls_holds >= NBD_TLS_HOLD || !loop_more_ready(c->loop)) {
		c->tls_holds = 0;
		return false;
	}
	c->tls_holds++;
	c->tls_hold_queued = true;
	c->tls_hold.cb = tls_hold_cb;
	nbd_conn_get(c);
	loop_defer(c->loop, &c->tls_hold);
	return true;
}

/* Enough is queued for records worth their cost: end the linger. */
static bool tls_linger_full(const struct nbd_conn *c)
{
	const struct nbd_req *r;
	unsigned n = 0;
	size_t bytes = c->hlen - c->hoff;
	int i;

	for (r = c->outq; r; r = r->next) {
		for (i = 0; i < r->riovcnt; i++)
			bytes += r->riov[i].iov_len;
		if (++n >= NBD_TLS_LINGER_REPLIES || bytes >= NBD_TLS_LINGER_BYTES)
			return true;
	}
	return false;
}

static void tls_linger_cb(struct loop_timer *t)
{
	struct nbd_conn *c = container_of(t, struct nbd_conn, tls_linger);

	/* Too few requests came in while the replies waited (a client at a
	 * small queue depth waits for them): skip the next waits, more of
	 * them each time in a row this happens. */
	if (c->nrequests - c->tls_linger_from < NBD_TLS_LINGER_GAIN) {
		c->tls_linger_backoff = !c->tls_linger_backoff ? NBD_TLS_LINGER_REPLIES
					: c->tls_linger_backoff < NBD_TLS_LINGER_SKIP_MAX
						? c->tls_linger_backoff * 2
						: NBD_TLS_LINGER_SKIP_MAX;
		c->tls_linger_skip = c->tls_linger_backoff;
	} else {
		c->tls_linger_backoff = 0;
	}
	c->tls_lingered = true;
	nbd_conn_kick(c);
	nbd_conn_put(c);
}

void nbd_tls_linger_stop(struct nbd_conn *c)
{
	if (!loop_timer_armed(&c->tls_linger))
		return;
	loop_timer_cancel(c->loop, &c->tls_linger);
	nbd_conn_put(c);
}

/* A round whose replies are a few small ones (a few 4 KiB READs) costs
 * what a round with many costs: a record or more each, a send that wakes
 * the client, a receive of its next requests. A client that keeps many
 * requests in flight but makes them more slowly than we answer (GnuTLS on its
 * side too) gets each answered in a round of its own. The replies of such
 * a round wait for more: until NBD_TLS_LINGER_REPLIES or NBD_TLS_OBUF bytes
 * are queued, or NBD_TLS_LINGER_NS passed. True: they wait. */
static bool tls_linger(struct nbd_conn *c)
{
	if (loop_timer_armed(&c->tls_linger)) {
		if (c->state == NBD_CONN_OPEN && !tls_linger_full(c))
			return true;
		c->tls_linger_backoff = 0;
		nbd_tls_linger_stop(c); /* the caller holds a reference */
		return false;
	}
	if (c->tls_lingered) {
		c->tls_lingered = false;
		return false;
	}
	if (c->state != NBD_CONN_OPEN || c->phase != NBD_PHASE_TRANSMISSION || c->move_to ||
	    c->out_blocked || nbd_conn_out_empty(c) || c->tls_coff < c->tls_clen ||
	    tls_linger_full(c))
		return false;
	if (c->tls_linger_skip) {
		c->tls_linger_skip--;
		return false;
	}
	c->tls_linger_from = c->nrequests;
	c->tls_linger.cb = tls_linger_cb;
	nbd_conn_get(c);
	loop_timer_arm(c->loop, &c->tls_linger, loop_now_ns() + NBD_TLS_LINGER_NS);
	return true;
}

void nbd_tls_send(struct nbd_conn *c)
{
	if (tls_hold(c) || tls_linger(c))
		return;
	while (c->state != NBD_CONN_CLOSED && !c->out_blocked) {
		if (!tls_flush(c))
			return;
		if (c->out_blocked || !tls_make_records(c))
			break;
	}
	/* Every record made has been through tls_flush(): sent, or waiting. */
	if (c->state != NBD_CONN_CLOSED)
		nbd_conn_set_events(c);
}

void nbd_tls_bye(struct nbd_conn *c)
{
	/* Not while output is left that is not in records yet: a close_notify
	 * after a reply cut short would say the stream is whole. */
	if (!c->tls_on || c->hoff != c->hlen || c->outq || c->tls_ooff != c->tls_olen ||
	    c->tls_again)
		return;
	/* Our push function takes the alert after the records not sent yet
	 * (a refusal's alert, tls_refuse_renegotiation); one send, whatever it
	 * does. */
	if (gnutls_bye(c->tls, GNUTLS_SHUT_WR) == 0 && c->tls_coff < c->tls_clen)
		(void)!send(c->fd, c->tls_cbuf + c->tls_coff, c->tls_clen - c->tls_coff,
			    MSG_NOSIGNAL | MSG_DONTWAIT);
	c->tls_coff = c->tls_clen = 0;
}

void nbd_tls_end(struct nbd_conn *c)
{
	if (c->tls_layer >= 0)
		atomic_fetch_sub(&c->srv->tls_conns[c->tls_layer], 1);
	c->tls_layer = -1;
	if (c->tls)
		gnutls_deinit(c->tls);
	c->tls = NULL;
	c->tls_on = false;
	tls_creds_put(c->tls_creds);
	c->tls_creds = NULL;
	free(c->tls_obuf);
	free(c->tls_ibuf);
	free(c->tls_cbuf);
	c->tls_obuf = c->tls_ibuf = c->tls_cbuf = NULL;
}
