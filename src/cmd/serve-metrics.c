/* `ioplane serve --metrics unix=PATH[,mode=OCTAL][,user=U][,group=G] |
 * tcp=HOST:PORT[,public=on]`:
 * where the metrics endpoint (control/metrics.c) listens. A TCP address must
 * be a loopback one (127.0.0.0/8, ::1, localhost) unless public=on says
 * that other hosts may read the counters (they name images and exports).
 *
 * THREADING RULE: main thread only. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cmd/serve-metrics.h"
#include "control/metrics.h"
#include "util/log.h"
#include "util/opts.h"
#include "util/service.h"
#include "util/unix-listener.h"

struct serve_metrics {
	struct kv_opts o;
	struct unix_listener ul;
	struct metrics_server *srv;
	char *host, *port;
	mode_t mode;
	struct svc_owner owner; /* unix=: user=, group= */
};

static int bad(const char *fmt, const char *arg)
{
	fprintf(stderr, "ioplane serve: --metrics: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, " (try 'ioplane serve --help')\n");
	return 1;
}

static bool loopback(const char *host)
{
	struct in6_addr a6;
	struct in_addr a4;

	if (!strcmp(host, "localhost"))
		return true;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	return inet_pton(AF_INET6, host, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
}

static int parse_tcp(struct serve_metrics *m, const char *t)
{
	const char *colon = strrchr(t, ':');
	bool pub = false;
	uint64_t p;

	if (!colon || parse_u64(colon + 1, &p) < 0 || p < 1 || p > 65535)
		return bad("tcp=%s: expected HOST:PORT with a port 1..65535", t);
	if (t[0] == '[' && colon > t + 1 && colon[-1] == ']')
		m->host = strndup(t + 1, (size_t)(colon - t - 2));
	else
		m->host = strndup(t, (size_t)(colon - t));
	m->port = strdup(colon + 1);
	if (!m->host || !m->port)
		return 1;
	if (kv_get_bool(&m->o, "public", &pub) < 0)
		return bad("%s", "public must be on or off");
	if (!pub && !loopback(m->host))
		return bad("tcp=%s: not a loopback address; public=on serves the counters to "
			   "other hosts",
			   t);
	return 0;
}

int serve_metrics_parse(struct serve_metrics **out, const char *arg)
{
	struct serve_metrics *m;
	const char *u, *t, *unused;
	char err[256];
	int ret = 0;

	if (*out)
		return bad("%s", "given twice");
	m = calloc(1, sizeof(*m));
	if (!m)
		return 1;
	*out = m;
	m->ul.fd = -1;
	m->mode = 0600;
	if (kv_parse(&m->o, arg, NULL) < 0)
		return bad("'%s': expected KEY=VALUE,...", arg);
	u = kv_get(&m->o, "unix");
	t = kv_get(&m->o, "tcp");
	if (!u == !t)
		return bad("'%s': give exactly one of unix=PATH, tcp=HOST:PORT", arg);
	if (u && !*u)
		return bad("'%s': empty unix socket path", arg);
	if (t)
		ret = parse_tcp(m, t);
	if (!ret && kv_get(&m->o, "mode") &&
	    (!u || parse_octal_mode(kv_get(&m->o, "mode"), &m->mode) < 0))
		return bad("'%s': mode= takes octal permissions, with unix= only", arg);
	if (!ret && u && svc_owner_parse(&m->o, &m->owner, err, sizeof(err)) < 0)
		return bad("%s", err);
	unused = kv_first_unused(&m->o);
	if (!ret && unused)
		return bad("unknown option '%s'", unused);
	return ret;
}

static int listen_tcp(struct serve_metrics *m, char *err, size_t errlen)
{
	struct addrinfo hints = {.ai_flags = AI_PASSIVE, .ai_socktype = SOCK_STREAM};
	struct addrinfo *res;
	int fd, one = 1, ret;

	ret = getaddrinfo(m->host, m->port, &hints, &res);
	if (ret) {
		snprintf(err, errlen, "cannot resolve %s: %s", m->host, gai_strerror(ret));
		return -EINVAL;
	}
	fd = socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd >= 0)
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 64) < 0) {
		ret = -errno;
		snprintf(err, errlen, "cannot listen on %s:%s: %s", m->host, m->port,
			 strerror(errno));
		if (fd >= 0)
			close(fd);
		freeaddrinfo(res);
		return ret;
	}
	freeaddrinfo(res);
	return fd;
}

static int listen_unix(struct serve_metrics *m, const char *path, char *err, size_t errlen)
{
	int ret = unix_listen(&m->ul, path, m->mode, 64, err, errlen), fd;

	if (ret == 0)
		ret = svc_owner_apply(path, &m->owner, err, errlen);
	if (ret < 0)
		return ret;
	/* The listener keeps the path (removed at exit); the server gets a copy. */
	fd = fcntl(m->ul.fd, F_DUPFD_CLOEXEC, 0);
	if (fd < 0)
		snprintf(err, errlen, "%s", strerror(errno));
	return fd < 0 ? -errno : fd;
}

int serve_metrics_start(struct serve_metrics *m, struct loop *main_loop, int passed_fd)
{
	const char *u;
	char err[512] = "";
	int fd, ret;

	if (!m)
		return -1;
	u = kv_get(&m->o, "unix");
	if (passed_fd >= 0)
		fd = passed_fd;
	else if (u)
		fd = listen_unix(m, u, err, sizeof(err));
	else
		fd = listen_tcp(m, err, sizeof(err));
	if (fd < 0) {
		log_err("--metrics: %s", err);
		return 1;
	}
	ret = metrics_server_start(main_loop, fd, &m->srv);
	if (ret < 0) {
		log_err("--metrics: %s", strerror(-ret));
		return 1;
	}
	if (u)
		log_info("metrics on %s", u);
	else
		log_info("metrics on http://%s:%s/metrics", m->host, m->port);
	return -1;
}

const char *serve_metrics_path(struct serve_metrics *m)
{
	return m ? kv_get(&m->o, "unix") : NULL;
}

void serve_metrics_free(struct serve_metrics *m)
{
	if (!m)
		return;
	metrics_server_free(m->srv);
	unix_listener_close(&m->ul);
	kv_free(&m->o);
	free(m->host);
	free(m->port);
	free(m);
}
