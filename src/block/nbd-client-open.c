/* Opening an `nbd` node: libnbd's loading, new handles, QEMU's options and
 * nbd:// file names, the blocking connect at open and what the server offers.
 * Threading: open on the main thread; nbdc_handle_new() and
 * nbdc_start_connect() also on a connection's loop, when it reconnects. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block/nbd-client-int.h"
#include "util/dynlib.h"
#include "util/log.h"
#include "util/opts.h"

struct nbdc_lib_fns nbdc_nl;

#define NBDC_LIB_SYM(f) DYNLIB_SYM(nbdc_nl, f),

static const struct dynlib_sym nbdc_lib_syms[] = {NBDC_LIB_FNS(NBDC_LIB_SYM)};
static const char *const nbdc_lib_sonames[] = {"libnbd.so.0", NULL};
static struct dynlib nbdc_lib = {
	.pkg = "libnbd0",
	.sonames = nbdc_lib_sonames,
	.syms = nbdc_lib_syms,
	.nsyms = sizeof(nbdc_lib_syms) / sizeof(nbdc_lib_syms[0]),
};

/* ---- handles ------------------------------------------------------------ */

struct nbd_handle *nbdc_handle_new(const struct nbdc_state *s)
{
	struct nbd_handle *h = nbdc_nl.nbd_create();

	if (!h)
		return NULL;
	if ((!s->uri && nbdc_nl.nbd_set_export_name(h, s->export) < 0) ||
	    nbdc_nl.nbd_add_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) < 0) {
		nbdc_nl.nbd_close(h);
		return NULL;
	}
	return h;
}

int nbdc_start_connect(const struct nbdc_state *s, struct nbd_handle *h)
{
	if (s->uri)
		return nbdc_nl.nbd_aio_connect_uri(h, s->uri);
	if (s->path)
		return nbdc_nl.nbd_aio_connect_unix(h, s->path);
	return nbdc_nl.nbd_aio_connect_tcp(h, s->host, s->port);
}

/* ---- options and open ---------------------------------------------------------- */

static int nbdc_dup(char **dst, const char *src)
{
	if (!src)
		return 0;
	*dst = strdup(src);
	return *dst ? 0 : -ENOMEM;
}

/* filename=nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH. */
static int nbdc_parse_uri(struct nbdc_state *s, struct kv_opts *opts, const char *uri, char *err,
			  size_t errlen)
{
	if (strncmp(uri, "nbd://", 6) && strncmp(uri, "nbd+unix://", 11)) {
		snprintf(err, errlen,
			 "nbd: '%s': expected nbd://HOST[:PORT]/EXPORT or "
			 "nbd+unix:///EXPORT?socket=PATH",
			 uri);
		return -EINVAL;
	}
	if (kv_get(opts, "server.type") || kv_get(opts, "export")) {
		snprintf(err, errlen, "nbd: give a file name or server.*/export, not both");
		return -EINVAL;
	}
	snprintf(s->desc, sizeof(s->desc), "%s", uri);
	return nbdc_dup(&s->uri, uri);
}

static int nbdc_parse_server(struct nbdc_state *s, struct kv_opts *opts, char *err, size_t errlen)
{
	const char *type = kv_get(opts, "server.type"), *path = kv_get(opts, "server.path");
	const char *host = kv_get(opts, "server.host"), *port = kv_get(opts, "server.port");
	const char *exp = kv_get(opts, "export");
	uint64_t pn = 10809;

	if (type && !strcmp(type, "unix") && path && *path && !host && !port) {
		snprintf(s->desc, sizeof(s->desc), "unix:%s", path);
		return nbdc_dup(&s->path, path) ?: nbdc_dup(&s->export, exp ? exp : "");
	}
	if (!type || strcmp(type, "inet") || !host || !*host || path ||
	    (port && (parse_u64(port, &pn) || pn == 0 || pn > 65535))) {
		snprintf(err, errlen,
			 "nbd: expected server.type=unix,server.path=PATH or "
			 "server.type=inet,server.host=HOST[,server.port=PORT]");
		return -EINVAL;
	}
	snprintf(s->desc, sizeof(s->desc), "%s:%s", host, port ? port : "10809");
	return nbdc_dup(&s->host, host) ?: nbdc_dup(&s->port, port ? port : "10809")
					  ?: nbdc_dup(&s->export, exp ? exp : "");
}

static int nbdc_parse(struct nbdc_state *s, struct kv_opts *opts, char *err, size_t errlen)
{
	const char *uri = kv_get(opts, "filename");
	uint64_t delay = 0, conns = 1, open_s = 0;
	int ret;

	ret = uri ? nbdc_parse_uri(s, opts, uri, err, errlen)
		  : nbdc_parse_server(s, opts, err, errlen);
	if (ret == -ENOMEM)
		snprintf(err, errlen, "nbd: out of memory");
	if (ret)
		return ret;
	if (kv_get_u64(opts, "reconnect-delay", &delay) || delay > NBDC_MAX_DELAY_S) {
		snprintf(err, errlen, "nbd: reconnect-delay must be 0 to %d seconds",
			 NBDC_MAX_DELAY_S);
		return -EINVAL;
	}
	if (kv_get_u64(opts, "open-timeout", &open_s) || open_s > NBDC_MAX_DELAY_S) {
		snprintf(err, errlen, "nbd: open-timeout must be 0 to %d seconds",
			 NBDC_MAX_DELAY_S);
		return -EINVAL;
	}
	if (kv_get_u64(opts, "connections", &conns) || conns < 1 || conns > NBDC_MAX_CONNS) {
		snprintf(err, errlen, "nbd: connections must be 1 to %d", NBDC_MAX_CONNS);
		return -EINVAL;
	}
	/* The server's cache is the server's business (QEMU's too). */
	if (kv_get(opts, "cache") && strcmp(kv_get(opts, "cache"), "none") &&
	    strcmp(kv_get(opts, "cache"), "writeback")) {
		snprintf(err, errlen, "nbd: cache must be 'none' or 'writeback'");
		return -EINVAL;
	}
	s->delay_ns = delay * 1000000000ull;
	s->open_ns = open_s * 1000000000ull;
	s->nconns = (unsigned)conns;
	return 0;
}

/* One attempt to connect h, until end_ns: 0, -ETIMEDOUT (the server did not
 * finish the handshake in time) or -ECONNREFUSED (it failed). */
static int nbdc_try_connect(struct nbdc_state *s, struct nbd_handle *h, uint64_t end_ns, char *err,
			    size_t errlen)
{
	int ret = nbdc_start_connect(s, h);

	while (ret >= 0 && nbdc_nl.nbd_aio_is_connecting(h)) {
		uint64_t now = loop_now_ns();

		if (now >= end_ns) {
			snprintf(err, errlen, "nbd: %s: connection timed out", s->desc);
			return -ETIMEDOUT;
		}
		ret = nbdc_nl.nbd_poll(h, (int)((end_ns - now) / 1000000 + 1));
	}
	if (ret >= 0 && nbdc_nl.nbd_aio_is_ready(h))
		return 0;
	snprintf(err, errlen, "nbd: cannot connect to %s: %s", s->desc,
		 nbdc_nl.nbd_get_error() ? nbdc_nl.nbd_get_error() : "connection closed");
	return -ECONNREFUSED;
}

/* Connect at open, blocking (as QEMU's open does): one attempt bounded by
 * NBDC_OPEN_TIMEOUT_MS, or with open-timeout (QEMU's) attempts every
 * NBDC_RETRY_MIN_NS until one succeeds or open-timeout has passed. A server
 * that accepts and never answers cannot hold the main loop longer. */
static int nbdc_connect_sync(struct nbdc_state *s, char *err, size_t errlen)
{
	uint64_t t0 = loop_now_ns();
	uint64_t end = t0 + (s->open_ns ? s->open_ns : NBDC_OPEN_TIMEOUT_MS * 1000000ull);
	int ret;

	for (;;) {
		ret = nbdc_try_connect(s, s->first, end, err, errlen);
		if (ret != -ECONNREFUSED || !s->open_ns || loop_now_ns() + NBDC_RETRY_MIN_NS >= end)
			return ret;
		nanosleep(&(struct timespec){0, (long)NBDC_RETRY_MIN_NS}, NULL);
		nbdc_nl.nbd_close(s->first);
		s->first = nbdc_handle_new(s);
		if (!s->first) {
			snprintf(err, errlen, "nbd: %s", nbdc_nl.nbd_get_error());
			return -ENOMEM;
		}
	}
}

/* What the server offers, and the node's geometry. */
static int nbdc_probe(struct blk_node *bs, struct nbdc_state *s, struct nbd_handle *h, char *err,
		      size_t errlen)
{
	int64_t size = nbdc_nl.nbd_get_size(h),
		min = nbdc_nl.nbd_get_block_size(h, LIBNBD_SIZE_MINIMUM);
	int64_t max = nbdc_nl.nbd_get_block_size(h, LIBNBD_SIZE_MAXIMUM);

	if (size < 0) {
		snprintf(err, errlen, "nbd: %s: no export size: %s", s->desc,
			 nbdc_nl.nbd_get_error());
		return -EIO;
	}
	if (!bs->read_only && nbdc_nl.nbd_is_read_only(h) == 1) {
		snprintf(err, errlen,
			 "nbd: the export of %s is read-only; open it with "
			 "read-only=on",
			 s->desc);
		return -EROFS;
	}
	bs->size = (uint64_t)size;
	if (min > 1 && min <= 65536 && !(min & (min - 1)))
		bs->align = (uint32_t)min;
	s->max_io = max > 0 && max < NBDC_MAX_IO ? (uint32_t)max : NBDC_MAX_IO;
	s->max_io = s->max_io / bs->align * bs->align;
	bs->max_transfer = s->max_io;
	s->can_flush = nbdc_nl.nbd_can_flush(h) == 1;
	s->can_trim = nbdc_nl.nbd_can_trim(h) == 1;
	s->can_zero = nbdc_nl.nbd_can_zero(h) == 1;
	s->can_fast_zero = s->can_zero && nbdc_nl.nbd_can_fast_zero(h) == 1;
	s->can_fua = nbdc_nl.nbd_can_fua(h) == 1;
	s->can_multi = nbdc_nl.nbd_can_multi_conn(h) == 1;
	s->can_status = nbdc_nl.nbd_can_meta_context(h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
	if (s->nconns > 1 && !s->can_multi) {
		log_warn("nbd: %s does not offer multi-conn: one connection, not %u", s->desc,
			 s->nconns);
		s->nconns = 1;
	}
	return 0;
}

void nbdc_state_free(struct nbdc_state *s)
{
	nbdc_nl.nbd_close(s->first);
	pthread_mutex_destroy(&s->lock);
	free(s->uri);
	free(s->path);
	free(s->host);
	free(s->port);
	free(s->export);
	free(s);
}

int nbdc_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	struct nbdc_state *s;
	int ret = dynlib_load(&nbdc_lib, "nbd", err, errlen);

	if (ret)
		return ret;
	s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "nbd: out of memory");
		return -ENOMEM;
	}
	pthread_mutex_init(&s->lock, NULL);
	ret = nbdc_parse(s, opts, err, errlen);
	if (!ret && !(s->first = nbdc_handle_new(s))) {
		snprintf(err, errlen, "nbd: %s", nbdc_nl.nbd_get_error());
		ret = -ENOMEM;
	}
	if (!ret)
		ret = nbdc_connect_sync(s, err, errlen);
	if (!ret)
		ret = nbdc_probe(bs, s, s->first, err, errlen);
	if (ret) {
		nbdc_state_free(s);
		return ret;
	}
	bs->opaque = s;
	return 0;
}
