/* NBD server: exports, listening sockets (unix, TCP), accepting on the main
 * loop and handing each connection to the least busy loop, and the drain at
 * shutdown.
 *
 * Threading: everything here runs on the main thread except the message
 * callbacks (slot_*_cb, accept_msg_cb), which run on the target loop, and
 * nbd_server_conn_gone(), which runs on a connection's loop. Counters shared
 * between them are atomic. */
#include <errno.h>
#include <netdb.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include "block/dirty-bitmap.h"
#include "export/nbd-int.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/unix-listener.h"

#define ACCEPT_BATCH 64

struct accept_msg {
	struct loop_msg m;
	struct nbd_server *srv;
	struct nbd_slot *slot;
	int fd;
};

static void drained_cb(struct loop_msg *m)
{
	struct nbd_server *s = container_of(m, struct nbd_server, drained_msg);

	if (s->drained_cb)
		s->drained_cb(s->drained_opaque);
}

/* Drained: no connection left, and no loop still holds one of our messages
 * (so that the server may be freed once the callback ran). */
static void maybe_drained(struct nbd_server *s)
{
	if (!atomic_load(&s->draining) || atomic_load(&s->nconns) || atomic_load(&s->pending_msgs))
		return;
	if (!atomic_exchange(&s->drained_sent, true))
		loop_send(s->main_loop, &s->drained_msg);
}

static struct nbd_slot *slot_for(struct nbd_server *s, struct loop *loop)
{
	struct nbd_slot *slot = &s->slots[loop_index(loop)];

	slot->srv = s;
	atomic_store(&slot->loop, loop);
	return slot;
}

int nbd_server_new(const struct nbd_server_config *cfg, struct nbd_server **out)
{
	struct nbd_server *s = calloc(1, sizeof(*s));
	unsigned i, n = cfg->nloops ? cfg->nloops : 1;

	if (!s)
		return -ENOMEM;
	s->loops = calloc(n, sizeof(*s->loops));
	if (!s->loops) {
		free(s);
		return -ENOMEM;
	}
	for (i = 0; i < n; i++)
		s->loops[i] = cfg->nloops ? cfg->loops[i] : cfg->main_loop;
	s->nloops = n;
	s->main_loop = cfg->main_loop;
	s->max_connections = cfg->max_connections;
	s->budget = cfg->budget;
	if ((cfg->tls_creds && !(s->tls_creds = strdup(cfg->tls_creds))) ||
	    (cfg->tls_authz && !(s->tls_authz = strdup(cfg->tls_authz)))) {
		free(s->tls_creds);
		free(s->loops);
		free(s);
		return -ENOMEM;
	}
	s->drained_msg.cb = drained_cb;
	pthread_mutex_init(&s->exports_lock, NULL);
	for (i = 0; i < n; i++)
		slot_for(s, s->loops[i]);
	*out = s;
	return 0;
}

/* ---- exports ------------------------------------------------------------ */

void nbd_exports_lock(struct nbd_server *s)
{
	pthread_mutex_lock(&s->exports_lock);
}

void nbd_exports_unlock(struct nbd_server *s)
{
	pthread_mutex_unlock(&s->exports_lock);
}

struct nbd_export *nbd_export_find(struct nbd_server *s, const char *name, size_t len)
{
	struct nbd_export *e;

	nbd_exports_lock(s);
	for (e = s->exports; e; e = e->next)
		if (strlen(e->name) == len && !memcmp(e->name, name, len))
			break;
	/* The empty name asks for the default export: the first one. */
	if (!e && len == 0)
		e = s->exports;
	if (e)
		atomic_fetch_add(&e->refs, 1);
	nbd_exports_unlock(s);
	return e;
}

static void export_free(struct nbd_export *e)
{
	free(e->loops);
	for (unsigned i = 0; i < e->nbitmaps; i++)
		e->bitmaps[i]->busy--;
	free(e->name);
	free(e->description);
	free(e);
}

static void export_gone_cb(struct loop_msg *m)
{
	struct nbd_export *e = container_of(m, struct nbd_export, gone_msg);

	if (e->gone_cb)
		e->gone_cb(e->gone_opaque);
	export_free(e);
}

struct loop *nbd_export_pick_loop(struct nbd_export *e, struct loop *cur)
{
	struct loop *to;

	if (!e->nloops)
		return NULL;
	to = e->loops[atomic_fetch_add(&e->rr, 1) % e->nloops];
	return to == cur ? NULL : to;
}

void nbd_server_forget_loop(struct nbd_server *s, struct loop *loop)
{
	struct nbd_slot *slot = &s->slots[loop_index(loop)];

	for (unsigned i = 0; i < s->nloops; i++)
		if (s->loops[i] == loop)
			return; /* the server's own: it outlives the server */
	if (atomic_load(&slot->loop) == loop && !atomic_load(&slot->nconns))
		atomic_store(&slot->loop, NULL);
}

void nbd_export_put(struct nbd_export *e)
{
	if (e && atomic_fetch_sub(&e->refs, 1) == 1)
		loop_send(e->srv->main_loop, &e->gone_msg);
}

unsigned nbd_export_users(const struct nbd_export *e)
{
	return atomic_load(&e->refs) - 1; /* the list's */
}

uint16_t nbd_export_tflags(const struct nbd_export *e, bool structured)
{
	uint16_t f =
		NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH | NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_CACHE;

	if (e->writable)
		f |= NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES | NBD_FLAG_SEND_FAST_ZERO;
	else
		f |= NBD_FLAG_READ_ONLY;
	/* DF only means something with structured replies (spec: MUST be clear
	 * without them). */
	if (structured)
		f |= NBD_FLAG_SEND_DF;
	/* Safe when nobody writes, or when a flush on one connection covers the
	 * writes of all (blk_can_multi_conn). */
	if (!e->writable || blk_can_multi_conn(nbd_export_node(e)))
		f |= NBD_FLAG_CAN_MULTI_CONN;
	return f;
}

static char *dup_or_null(const char *s)
{
	return s ? strdup(s) : NULL;
}

static struct nbd_export *export_new(struct nbd_server *s, const struct nbd_export_config *ec)
{
	struct nbd_export *e = calloc(1, sizeof(*e));

	if (!e || !(e->name = strdup(ec->name)) ||
	    (ec->description && !(e->description = dup_or_null(ec->description)))) {
		if (e)
			free(e->name);
		free(e);
		return NULL;
	}
	if (ec->nloops && !(e->loops = calloc(ec->nloops, sizeof(*e->loops)))) {
		free(e->name);
		free(e->description);
		free(e);
		return NULL;
	}
	for (unsigned i = 0; i < ec->nloops; i++)
		e->loops[i] = slot_for(s, ec->loops[i])->loop;
	e->nloops = ec->nloops;
	e->bs = ec->bs;
	e->writable = ec->writable;
	e->detect_zeroes = ec->detect_zeroes;
	e->alloc_depth = ec->alloc_depth;
	for (unsigned i = 0; i < ec->nbitmaps && i < NBD_MAX_EXPORT_BITMAPS; i++) {
		e->bitmaps[e->nbitmaps++] = ec->bitmaps[i];
		ec->bitmaps[i]->busy++;
	}
	e->srv = s;
	e->gone_msg.cb = export_gone_cb;
	atomic_init(&e->refs, 1);
	return e;
}

void nbd_export_set_node(struct nbd_export *e, struct blk_node *bs)
{
	/* Read by the connections' threads, which see it by the time the
	 * drain that covers the change lets them submit again. */
	__atomic_store_n(&e->bs, bs, __ATOMIC_RELEASE);
}

int nbd_server_export_add(struct nbd_server *s, const struct nbd_export_config *ec,
			  struct nbd_export **out, char *err, size_t errlen)
{
	struct nbd_export *e, **tail;
	size_t len = strlen(ec->name);

	if (len > NBD_MAX_STRING || (ec->description && strlen(ec->description) > NBD_MAX_STRING)) {
		snprintf(err, errlen, "export name or description longer than %u bytes",
			 NBD_MAX_STRING);
		return -EINVAL;
	}
	if (ec->writable && ec->bs->read_only) {
		snprintf(err, errlen, "export '%s' is writable but its image is read-only",
			 ec->name);
		return -EROFS;
	}
	e = export_new(s, ec);
	if (!e) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	nbd_exports_lock(s);
	for (tail = &s->exports; *tail; tail = &(*tail)->next)
		if (!strcmp((*tail)->name, ec->name))
			break;
	if (!*tail)
		*tail = e; /* published: clients may find it from here on */
	nbd_exports_unlock(s);
	if (*tail != e) {
		snprintf(err, errlen, "export name '%s' used twice", ec->name);
		export_free(e);
		return -EEXIST;
	}
	if (out)
		*out = e;
	return 0;
}

int nbd_server_add_export(struct nbd_server *s, const struct nbd_export_config *ec, char *err,
			  size_t errlen)
{
	return nbd_server_export_add(s, ec, NULL, err, errlen);
}

/* ---- accepting ---------------------------------------------------------- */

static void accept_msg_cb(struct loop_msg *m)
{
	struct accept_msg *am = container_of(m, struct accept_msg, m);
	struct nbd_slot *slot = am->slot;

	if (atomic_load(&am->srv->draining)) {
		close(am->fd);
		nbd_server_conn_gone(am->srv, slot);
	} else {
		nbd_conn_new(am->srv, slot, atomic_load(&slot->loop), am->fd);
	}
	free(am);
}

/* The loop with the fewest connections (spreads clients over iothreads). */
static struct nbd_slot *pick_slot(struct nbd_server *s)
{
	struct nbd_slot *best = NULL;
	unsigned i, n, best_n = 0;

	for (i = 0; i < s->nloops; i++) {
		struct nbd_slot *slot = &s->slots[loop_index(s->loops[i])];

		n = atomic_load(&slot->nconns);
		if (!best || n < best_n) {
			best = slot;
			best_n = n;
		}
	}
	return best;
}

static void dispatch_fd(struct nbd_server *s, int fd)
{
	struct nbd_slot *slot;
	struct accept_msg *am;

	if (atomic_load(&s->draining)) {
		close(fd);
		return;
	}
	if (s->max_connections && atomic_load(&s->nconns) >= s->max_connections) {
		if (s->refused++ % 100 == 0)
			log_warn("nbd: refusing a connection: --max-connections=%u reached",
				 s->max_connections);
		close(fd);
		return;
	}
	am = malloc(sizeof(*am));
	if (!am) {
		close(fd);
		return;
	}
	slot = pick_slot(s);
	atomic_fetch_add(&s->nconns, 1);
	atomic_fetch_add(&slot->nconns, 1);
	s->accepted++;
	*am = (struct accept_msg){.m.cb = accept_msg_cb, .srv = s, .slot = slot, .fd = fd};
	loop_send(atomic_load(&slot->loop), &am->m);
}

static void listener_cb(struct loop_fd *h, uint32_t revents)
{
	struct nbd_listener *l = container_of(h, struct nbd_listener, h);
	int i, fd;

	(void)revents;
	for (i = 0; i < ACCEPT_BATCH; i++) {
		fd = accept4(h->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNABORTED)
				log_warn("nbd: accept: %s", strerror(errno));
			break;
		}
		dispatch_fd(l->srv, fd);
	}
}

int nbd_server_attach_fd(struct nbd_server *s, struct loop *loop, int fd)
{
	struct nbd_slot *slot = slot_for(s, loop);

	atomic_fetch_add(&s->nconns, 1);
	atomic_fetch_add(&slot->nconns, 1);
	return nbd_conn_new(s, slot, loop, fd);
}

void nbd_server_conn_gone(struct nbd_server *s, struct nbd_slot *slot)
{
	atomic_fetch_sub(&slot->nconns, 1);
	atomic_fetch_sub(&s->nconns, 1);
	maybe_drained(s);
}

unsigned nbd_server_connections(const struct nbd_server *s)
{
	return atomic_load(&s->nconns);
}

void nbd_server_tls_counts(const struct nbd_server *s, unsigned *gnutls, unsigned *kernel)
{
	*gnutls = atomic_load(&s->tls_conns[0]);
	*kernel = atomic_load(&s->tls_conns[1]);
}

void nbd_server_tls_ids(const struct nbd_server *s, const char **creds, const char **authz)
{
	*creds = s->tls_creds;
	*authz = s->tls_authz;
}

/* ---- listening ---------------------------------------------------------- */

static int add_listener(struct nbd_server *s, int fd, struct unix_listener *unix_l)
{
	struct nbd_listener *l = calloc(1, sizeof(*l));
	int ret;

	if (!l)
		return -ENOMEM;
	l->srv = s;
	l->unix_l = unix_l;
	l->h = (struct loop_fd){.fd = fd, .events = EPOLLIN, .cb = listener_cb};
	ret = loop_fd_add(s->main_loop, &l->h);
	if (ret < 0) {
		free(l);
		return ret;
	}
	l->next = s->listeners;
	s->listeners = l;
	return 0;
}

/* The socket rules (live: refused, stale: replaced, ...) are unix-listener.h's. */
int nbd_server_listen_unix(struct nbd_server *s, const char *path, mode_t mode, char *err,
			   size_t errlen)
{
	struct unix_listener *ul = malloc(sizeof(*ul));
	int ret;

	if (!ul) {
		snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(ENOMEM));
		return -ENOMEM;
	}
	ret = unix_listen(ul, path, mode, SOMAXCONN, err, errlen);
	if (ret < 0) {
		free(ul);
		return ret;
	}
	ret = add_listener(s, ul->fd, ul);
	if (ret < 0) {
		snprintf(err, errlen, "cannot listen on %s: %s", path, strerror(-ret));
		unix_listener_close(ul);
		free(ul);
	}
	return ret;
}

static int listen_addr(struct nbd_server *s, const struct addrinfo *ai)
{
	int one = 1, fd, ret;

	fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (ai->ai_family == AF_INET6)
		setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, SOMAXCONN) < 0) {
		ret = -errno;
		close(fd);
		return ret;
	}
	ret = add_listener(s, fd, NULL);
	if (ret < 0)
		close(fd);
	return ret;
}

int nbd_server_listen_tcp(struct nbd_server *s, const char *host, const char *port, char *err,
			  size_t errlen)
{
	struct addrinfo hints = {.ai_flags = AI_PASSIVE | AI_ADDRCONFIG,
				 .ai_socktype = SOCK_STREAM};
	struct addrinfo *res, *ai;
	int ret, first_err = 0, ok = 0;

	ret = getaddrinfo(host && *host ? host : NULL, port, &hints, &res);
	if (ret) {
		snprintf(err, errlen, "cannot resolve %s:%s: %s", host ? host : "", port,
			 gai_strerror(ret));
		return -EINVAL;
	}
	for (ai = res; ai; ai = ai->ai_next) {
		ret = listen_addr(s, ai);
		if (ret == 0)
			ok++;
		else if (!first_err)
			first_err = ret;
	}
	freeaddrinfo(res);
	if (!ok) {
		snprintf(err, errlen, "cannot listen on %s:%s: %s", host ? host : "", port,
			 strerror(first_err ? -first_err : EADDRNOTAVAIL));
		return first_err ? first_err : -EADDRNOTAVAIL;
	}
	return 0;
}

int nbd_server_listen_fd(struct nbd_server *s, int fd)
{
	return add_listener(s, fd, NULL);
}

void nbd_server_stop_listening(struct nbd_server *s)
{
	struct nbd_listener *l;

	while ((l = s->listeners)) {
		s->listeners = l->next;
		loop_fd_del(s->main_loop, &l->h);
		if (l->unix_l)
			unix_listener_close(l->unix_l);
		else
			close(l->h.fd);
		free(l->unix_l);
		free(l);
	}
}

/* ---- drain and abort ---------------------------------------------------- */

static void slot_drain_cb(struct loop_msg *m)
{
	struct nbd_slot *slot = container_of(m, struct nbd_slot, drain_msg);
	struct nbd_conn *c, *next;

	atomic_store(&slot->drain_pending, false);
	for (c = slot->conns; c; c = next) {
		next = c->next;
		nbd_conn_drain(c);
	}
	atomic_fetch_sub(&slot->srv->pending_msgs, 1);
	maybe_drained(slot->srv);
}

static void slot_abort_cb(struct loop_msg *m)
{
	struct nbd_slot *slot = container_of(m, struct nbd_slot, abort_msg);
	struct nbd_conn *c, *next;

	atomic_store(&slot->abort_pending, false);
	for (c = slot->conns; c; c = next) {
		next = c->next;
		nbd_conn_close(c, "server shutting down");
	}
	atomic_fetch_sub(&slot->srv->pending_msgs, 1);
	maybe_drained(slot->srv);
}

static void for_each_slot(struct nbd_server *s, bool abort)
{
	unsigned i;

	for (i = 0; i < LOOP_MAX_THREADS; i++) {
		struct nbd_slot *slot = &s->slots[i];
		struct loop *loop = atomic_load(&slot->loop);

		if (!loop)
			continue;
		if (abort && !atomic_exchange(&slot->abort_pending, true)) {
			atomic_fetch_add(&s->pending_msgs, 1);
			slot->abort_msg.cb = slot_abort_cb;
			loop_send(loop, &slot->abort_msg);
		} else if (!abort && !atomic_exchange(&slot->drain_pending, true)) {
			atomic_fetch_add(&s->pending_msgs, 1);
			slot->drain_msg.cb = slot_drain_cb;
			loop_send(loop, &slot->drain_msg);
		}
	}
}

/* ---- removing one export ------------------------------------------------ */

struct kill_msg {
	struct loop_msg m;
	struct nbd_slot *slot;
	struct nbd_export *e; /* holds a reference until it ran */
};

static void slot_kill_cb(struct loop_msg *m)
{
	struct kill_msg *km = container_of(m, struct kill_msg, m);
	struct nbd_server *s = km->slot->srv;
	struct nbd_conn *c, *next;

	for (c = km->slot->conns; c; c = next) {
		next = c->next;
		if (c->exp == km->e || c->meta_exp == km->e)
			nbd_conn_close(c, "export removed");
	}
	nbd_export_put(km->e);
	free(km);
	atomic_fetch_sub(&s->pending_msgs, 1);
	maybe_drained(s);
}

void nbd_server_export_del(struct nbd_server *s, struct nbd_export *e, void (*done)(void *opaque),
			   void *opaque)
{
	struct nbd_export **pp;
	unsigned i;

	nbd_exports_lock(s);
	for (pp = &s->exports; *pp && *pp != e; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = e->next;
	nbd_exports_unlock(s);
	e->gone_cb = done;
	e->gone_opaque = opaque;
	atomic_store(&e->removed, true); /* a connection moving between loops checks it */
	/* A connection that found it before the unlink is on some slot. */
	for (i = 0; i < LOOP_MAX_THREADS; i++) {
		struct loop *loop = atomic_load(&s->slots[i].loop);
		struct kill_msg *km;

		if (!loop)
			continue;
		km = malloc(sizeof(*km));
		if (!km) {
			log_err("nbd: out of memory: clients of export '%s' stay connected",
				e->name);
			continue;
		}
		*km = (struct kill_msg){.m.cb = slot_kill_cb, .slot = &s->slots[i], .e = e};
		atomic_fetch_add(&e->refs, 1);
		atomic_fetch_add(&s->pending_msgs, 1);
		loop_send(loop, &km->m);
	}
	nbd_export_put(e); /* the list's */
}

void nbd_server_drain(struct nbd_server *s, void (*done)(void *opaque), void *opaque)
{
	s->drained_cb = done;
	s->drained_opaque = opaque;
	/* Hold off the notification until every message is out. */
	atomic_fetch_add(&s->pending_msgs, 1);
	atomic_store(&s->draining, true);
	for_each_slot(s, false);
	atomic_fetch_sub(&s->pending_msgs, 1);
	maybe_drained(s);
}

void nbd_server_abort(struct nbd_server *s)
{
	for_each_slot(s, true);
}

void nbd_server_free(struct nbd_server *s)
{
	struct nbd_export *e;

	if (!s)
		return;
	nbd_server_stop_listening(s);
	while ((e = s->exports)) {
		s->exports = e->next;
		export_free(e);
	}
	pthread_mutex_destroy(&s->exports_lock);
	free(s->tls_creds);
	free(s->tls_authz);
	free(s->loops);
	free(s);
}
