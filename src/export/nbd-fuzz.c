/* Fuzz entry point for the NBD server: one input is one client's byte stream,
 * written into a socketpair whose other end is served like an accepted
 * connection, on a loop run by the caller's thread. The loop, the null nodes
 * and the server are created on the first call and kept.
 *
 * Threading: single-threaded; the caller's thread runs the loop. */
#include <errno.h>
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "export/nbd-server.h"
#include "block/block.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/opts.h"

/* Loop rounds one input may take before its connection is dropped: far more
 * than any input needs (each round parses everything received). */
#define FUZZ_MAX_ROUNDS 200000
#define FUZZ_ABORT_ROUNDS 1000

static struct {
	struct loop *loop;
	struct nbd_server *srv, *tls_srv; /* tls_srv: FORCEDTLS, credentials absent */
	struct blk_node *ro, *rw;
	bool ready, failed;
} fz;

static int fuzz_open(const char *spec, struct blk_node **out)
{
	struct kv_opts o = {0};
	char err[256];
	int ret = kv_parse(&o, spec, NULL);

	if (!ret)
		ret = blk_open(&o, out, err, sizeof(err));
	kv_free(&o);
	return ret;
}

static int fuzz_init(void)
{
	struct loop_opts lo = {.poll_max_ns = 0};
	struct nbd_server_config cfg = {0};
	struct nbd_export_config ro = {.name = "null", .description = "fuzz, read-only"};
	struct nbd_export_config rw = {.name = "rw", .writable = true};
	char err[256];
	int ret;

	log_set_level(LOG_ERR);
	ret = loop_new(&lo, &fz.loop);
	if (ret < 0)
		return ret;
	loop_bind_current(fz.loop);
	ret = fuzz_open("driver=null,size=64M,read-zeroes=on", &fz.ro);
	if (!ret)
		ret = fuzz_open("driver=null,size=1M,read-zeroes=on", &fz.rw);
	if (ret < 0)
		return ret;
	cfg.main_loop = fz.loop;
	ret = nbd_server_new(&cfg, &fz.srv);
	ro.bs = fz.ro;
	rw.bs = fz.rw;
	if (!ret)
		ret = nbd_server_add_export(fz.srv, &ro, err, sizeof(err));
	if (!ret)
		ret = nbd_server_add_export(fz.srv, &rw, err, sizeof(err));
	/* STARTTLS then finds no credentials: the TLS handshake is not fuzzed,
	 * everything around it is. */
	cfg.tls_creds = "fuzz-tls";
	if (!ret)
		ret = nbd_server_new(&cfg, &fz.tls_srv);
	if (!ret)
		ret = nbd_server_add_export(fz.tls_srv, &ro, err, sizeof(err));
	return ret;
}

/* Feed what the socket takes; half-close when all is written. */
static bool fuzz_feed(int fd, const uint8_t *data, size_t len, size_t *off)
{
	ssize_t n = 0;

	if (*off < len)
		n = send(fd, data + *off, len - *off, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (n > 0)
		*off += (size_t)n;
	if (*off == len || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		shutdown(fd, SHUT_WR);
		return true;
	}
	return false;
}

static void fuzz_drain_replies(int fd)
{
	static uint8_t sink[65536];

	while (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
		;
}

static int fuzz_run(bool tls, const uint8_t *data, size_t len)
{
	struct nbd_server *srv;
	bool fed = false;
	size_t off = 0;
	int sv[2], i;

	if (!fz.ready && !fz.failed) {
		fz.failed = fuzz_init() < 0;
		fz.ready = !fz.failed;
	}
	if (!fz.ready)
		return 0;
	srv = tls ? fz.tls_srv : fz.srv;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		return 0;
	if (nbd_server_attach_fd(srv, fz.loop, sv[0]) < 0) {
		close(sv[1]);
		return 0;
	}
	for (i = 0; i < FUZZ_MAX_ROUNDS && nbd_server_connections(srv); i++) {
		if (!fed)
			fed = fuzz_feed(sv[1], data, len, &off);
		fuzz_drain_replies(sv[1]);
		loop_run_once(fz.loop, false);
	}
	if (nbd_server_connections(srv)) {
		log_err("nbd fuzz: connection still open after %d rounds", FUZZ_MAX_ROUNDS);
		nbd_server_abort(srv);
		for (i = 0; i < FUZZ_ABORT_ROUNDS && nbd_server_connections(srv); i++)
			loop_run_once(fz.loop, false);
	}
	close(sv[1]);
	return 0;
}

int nbd_fuzz_one(const uint8_t *data, size_t len)
{
	return fuzz_run(false, data, len);
}

int nbd_fuzz_tls_one(const uint8_t *data, size_t len)
{
	return fuzz_run(true, data, len);
}
