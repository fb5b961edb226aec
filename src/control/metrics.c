/* The --metrics HTTP server: GET /metrics answers 200 with the text format
 * (metrics-text.c), any other path 404, any other method 405. Connections
 * persist as HTTP/1.1 says (Prometheus keeps its connection between scrapes):
 * a scrape then costs one wake-up, a recv and a send, no accept or close.
 * `Connection: close`, HTTP/1.0 without keep-alive, a request with a body or
 * an error status close after the reply. Hostile or slow clients are bounded:
 * at most METRICS_MAX_CLIENTS at once (a new one pushes out the oldest), a
 * request of at most METRICS_REQUEST_MAX bytes (431 beyond),
 * METRICS_CLIENT_TIMEOUT_NS from accept (or from a request's first byte) to
 * the last byte of its reply, METRICS_IDLE_TIMEOUT_NS between requests.
 * Nothing blocks: a reader that stops reading only holds its reply.
 *
 * THREADING RULE: main thread only; everything runs on the main loop. */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "control/metrics.h"
#include "loop/loop.h"
#include "util/log.h"

struct mclient {
	struct mclient *next, **pprev;
	struct metrics_server *m;
	struct loop_fd h;
	struct loop_timer timeout;
	char req[METRICS_REQUEST_MAX]; /* NUL-terminated at req_len */
	size_t req_len;
	size_t hdr_len;  /* the current request's length, up to its blank line */
	struct mbuf out; /* the reply, once the request is complete */
	size_t out_off;
	bool keep; /* the connection stays open after this reply */
	bool idle; /* between requests: METRICS_IDLE_TIMEOUT_NS applies */
	/* The reply went out before the whole request was read (431): the
	 * rest is read and dropped until the client closes, so that closing
	 * with unread input (a reset) does not destroy the reply in flight. */
	bool linger, draining;
};

struct metrics_server {
	struct loop *loop;
	struct loop_fd listen_h;
	struct mclient *clients;
	unsigned nclients;
	uint64_t evicted; /* clients dropped to make room for a new one */
	struct mbuf body; /* the text of the last scrape: its room is kept for the next */
};

static void client_free(struct mclient *c)
{
	struct metrics_server *m = c->m;

	loop_fd_del(m->loop, &c->h);
	close(c->h.fd);
	if (loop_timer_armed(&c->timeout))
		loop_timer_cancel(m->loop, &c->timeout);
	*c->pprev = c->next;
	if (c->next)
		c->next->pprev = c->pprev;
	m->nclients--;
	mbuf_free(&c->out);
	free(c);
}

static void client_timeout(struct loop_timer *t)
{
	struct mclient *c = (struct mclient *)((char *)t - offsetof(struct mclient, timeout));

	if (!c->idle)
		log_debug("metrics: dropping a client that took too long");
	client_free(c);
}

static void client_rearm(struct mclient *c, bool idle)
{
	if (loop_timer_armed(&c->timeout))
		loop_timer_cancel(c->m->loop, &c->timeout);
	c->idle = idle;
	loop_timer_arm(c->m->loop, &c->timeout,
		       loop_now_ns() +
			       (idle ? METRICS_IDLE_TIMEOUT_NS : METRICS_CLIENT_TIMEOUT_NS));
}

static void reply(struct mclient *c, const char *status, const char *type, const char *body,
		  size_t blen)
{
	mbuf_printf(&c->out,
		    "HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
		    "Connection: %s\r\n\r\n",
		    status, type, blen, c->keep ? "keep-alive" : "close");
	mbuf_put(&c->out, body, blen);
}

static void reply_text(struct mclient *c, const char *status)
{
	char body[64];
	int n = snprintf(body, sizeof(body), "%s\n", status);

	reply(c, status, "text/plain; charset=utf-8", body, (size_t)n);
}

/* Whether the header named name (with its colon) is among the header lines of
 * the request, and its value in *val (up to the line's end). */
static bool header(const struct mclient *c, const char *name, const char **val)
{
	size_t nlen = strlen(name);
	const char *p = memchr(c->req, '\n', c->hdr_len), *end = c->req + c->hdr_len;

	while (p && (size_t)(end - ++p) > nlen) {
		if (!strncasecmp(p, name, nlen)) {
			*val = p + nlen;
			return true;
		}
		p = memchr(p, '\n', (size_t)(end - p));
	}
	return false;
}

static bool has_token(const char *val, const char *tok)
{
	size_t n = strlen(tok);

	for (const char *p = val; *p && *p != '\r' && *p != '\n'; p++)
		if (!strncasecmp(p, tok, n))
			return true;
	return false;
}

/* RFC 9112 9.3: HTTP/1.1 persists unless `Connection: close`; HTTP/1.0 only
 * with `Connection: keep-alive`. A body is not read, so a request that has
 * one closes the connection after the reply. */
static bool wants_keep(const struct mclient *c, bool http11)
{
	const char *v;

	if (header(c, "content-length:", &v) || header(c, "transfer-encoding:", &v))
		return false;
	if (!header(c, "connection:", &v))
		return http11;
	return has_token(v, "close") ? false : http11 || has_token(v, "keep-alive");
}

/* The request line of a complete request: "METHOD TARGET HTTP/1.x". */
static void handle_request(struct mclient *c)
{
	char *sp1 = memchr(c->req, ' ', c->hdr_len), *sp2, *eol;
	size_t tlen;

	eol = memchr(c->req, '\r', c->hdr_len);
	sp2 = sp1 && eol ? memchr(sp1 + 1, ' ', (size_t)(eol - sp1 - 1)) : NULL;
	c->keep = false;
	if (!sp1 || !sp2 || sp1 > eol || strncmp(sp2 + 1, "HTTP/1.", 7)) {
		reply_text(c, "400 Bad Request");
		return;
	}
	c->keep = wants_keep(c, sp2[8] == '1');
	if (sp1 - c->req != 3 || memcmp(c->req, "GET", 3)) {
		reply_text(c, "405 Method Not Allowed");
		return;
	}
	tlen = (size_t)(sp2 - sp1 - 1);
	/* A query string (Prometheus adds none; curl users might) is ignored. */
	if ((tlen == 8 || (tlen > 8 && sp1[9] == '?')) && !memcmp(sp1 + 1, "/metrics", 8)) {
		struct mbuf *body = &c->m->body;

		body->len = 0;
		metrics_render(body);
		if (body->oom) {
			mbuf_free(body);
			c->keep = false;
			reply_text(c, "503 Service Unavailable");
		} else {
			reply(c, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body->p,
			      body->len);
		}
		return;
	}
	reply_text(c, "404 Not Found");
}

/* The length of the request at the start of req, up to and with its blank
 * line; 0 while incomplete. */
static size_t request_end(const struct mclient *c)
{
	const char *crlf = memmem(c->req, c->req_len, "\r\n\r\n", 4);
	const char *lf = memmem(c->req, c->req_len, "\n\n", 2);

	if (crlf && (!lf || crlf < lf))
		return (size_t)(crlf - c->req) + 4;
	return lf ? (size_t)(lf - c->req) + 2 : 0;
}

static void set_events(struct mclient *c, uint32_t events)
{
	if (c->h.events != events)
		loop_fd_modify(c->m->loop, &c->h, events);
}

/* A kept-alive connection after its reply: the next request, pipelined
 * already or still to come. A pipelined one waits for the next loop round
 * (EPOLLOUT: ready at once), so that one client's queue of requests does not
 * hold the main loop. */
static void next_request(struct mclient *c)
{
	c->req_len -= c->hdr_len;
	memmove(c->req, c->req + c->hdr_len, c->req_len);
	c->req[c->req_len] = 0;
	c->hdr_len = 0;
	c->out.len = c->out_off = 0; /* the buffer is kept for the next reply */
	client_rearm(c, c->req_len == 0);
	set_events(c, request_end(c) ? EPOLLOUT : EPOLLIN);
}

static void client_write(struct mclient *c)
{
	while (c->out_off < c->out.len) {
		ssize_t n = send(c->h.fd, c->out.p + c->out_off, c->out.len - c->out_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			set_events(c, EPOLLOUT);
			return;
		}
		if (n <= 0)
			break;
		c->out_off += (size_t)n;
	}
	if (c->linger && c->out_off == c->out.len && shutdown(c->h.fd, SHUT_WR) == 0) {
		c->draining = true;
		set_events(c, EPOLLIN);
		return;
	}
	if (c->keep && c->out_off == c->out.len) {
		next_request(c);
		return;
	}
	client_free(c); /* done, or the peer went away */
}

static void client_drain(struct mclient *c)
{
	ssize_t n;

	do
		n = recv(c->h.fd, c->req, sizeof(c->req), MSG_DONTWAIT);
	while (n > 0 || (n < 0 && errno == EINTR));
	if (n == 0 || errno != EAGAIN)
		client_free(c);
}

static void respond(struct mclient *c)
{
	handle_request(c);
	if (c->out.oom) {
		client_free(c);
		return;
	}
	client_write(c);
}

/* Read until the blank line that ends the headers; a body is not expected.
 * A request already in the buffer (pipelined) is answered first. */
static void client_read(struct mclient *c)
{
	ssize_t n;

	while (!(c->hdr_len = request_end(c))) {
		if (c->req_len == sizeof(c->req) - 1) {
			c->keep = false;
			reply_text(c, "431 Request Header Fields Too Large");
			c->linger = true;
			client_write(c);
			return;
		}
		n = recv(c->h.fd, c->req + c->req_len, sizeof(c->req) - c->req_len - 1,
			 MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			set_events(c, EPOLLIN);
			return;
		}
		if (n <= 0) {
			client_free(c);
			return;
		}
		if (c->idle)
			client_rearm(c, false); /* a new request: its own time limit */
		c->req_len += (size_t)n;
		c->req[c->req_len] = 0;
	}
	respond(c);
}

static void client_cb(struct loop_fd *h, uint32_t revents)
{
	struct mclient *c = (struct mclient *)((char *)h - offsetof(struct mclient, h));

	(void)revents;
	if (c->draining)
		client_drain(c);
	else if (c->out_off < c->out.len)
		client_write(c);
	else
		client_read(c);
}

/* At the limit the oldest client goes: one that has held its slot longest
 * is the slow or stuck one, and a scraper's new connection must get in. */
static void evict_oldest(struct metrics_server *m)
{
	struct mclient *c = m->clients;

	while (c->next)
		c = c->next; /* the list is newest first */
	if (!m->evicted++)
		log_warn("metrics: more than %u clients at once: dropping the oldest",
			 METRICS_MAX_CLIENTS);
	client_free(c);
}

static void client_new(struct metrics_server *m, int fd)
{
	struct mclient *c;

	if (m->nclients >= METRICS_MAX_CLIENTS)
		evict_oldest(m);
	c = calloc(1, sizeof(*c));
	if (!c) {
		close(fd);
		return;
	}
	c->m = m;
	c->h = (struct loop_fd){.fd = fd, .events = EPOLLIN, .cb = client_cb};
	if (loop_fd_add(m->loop, &c->h) < 0) {
		close(fd);
		free(c);
		return;
	}
	c->next = m->clients;
	c->pprev = &m->clients;
	if (c->next)
		c->next->pprev = &c->next;
	m->clients = c;
	m->nclients++;
	c->timeout.cb = client_timeout;
	client_rearm(c, false);
	/* The request usually came with the connection: answer it now rather
	 * than a loop round later. */
	client_read(c);
}

static void accept_cb(struct loop_fd *h, uint32_t revents)
{
	struct metrics_server *m =
		(struct metrics_server *)((char *)h - offsetof(struct metrics_server, listen_h));
	int fd;

	(void)revents;
	/* A bounded batch per wake-up: the main loop also serves QMP and NBD. */
	for (int i = 0; i < 16; i++) {
		fd = accept4(h->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("metrics: accept: %s", strerror(errno));
			return;
		}
		client_new(m, fd);
	}
}

int metrics_server_start(struct loop *main_loop, int listen_fd, struct metrics_server **out)
{
	struct metrics_server *m = calloc(1, sizeof(*m));
	int ret;

	if (!m) {
		close(listen_fd);
		return -ENOMEM;
	}
	m->loop = main_loop;
	m->listen_h = (struct loop_fd){.fd = listen_fd, .events = EPOLLIN, .cb = accept_cb};
	ret = loop_fd_add(main_loop, &m->listen_h);
	if (ret < 0) {
		close(listen_fd);
		free(m);
		return ret;
	}
	*out = m;
	return 0;
}

void metrics_server_free(struct metrics_server *m)
{
	if (!m)
		return;
	while (m->clients)
		client_free(m->clients);
	loop_fd_del(m->loop, &m->listen_h);
	close(m->listen_h.fd);
	mbuf_free(&m->body);
	free(m);
}
