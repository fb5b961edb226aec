/* The metrics endpoint of `ioplane serve` (--metrics): an HTTP/1.1 server
 * answering GET /metrics with the Prometheus text exposition format 0.0.4,
 * made from the counters the dataplane keeps anyway (read without locks,
 * as query-blockstats reads them), so scraping costs the iothreads nothing.
 *
 * THREADING RULE: main thread only; the server runs on the main loop. */
#ifndef IOPLANE_CONTROL_METRICS_H
#define IOPLANE_CONTROL_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct loop;
struct metrics_server;

/* A growing text buffer; `oom` is set (and the text dropped) when it cannot grow. */
struct mbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

void mbuf_printf(struct mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void mbuf_free(struct mbuf *b);

/* Append len bytes. */
void mbuf_put(struct mbuf *b, const void *p, size_t len);

/* Append every metric family (metrics-text.c). */
void metrics_render(struct mbuf *b);

/* Serve on an already listening socket (ownership passes, also on failure). */
int metrics_server_start(struct loop *main_loop, int listen_fd, struct metrics_server **out);
/* Close the listener and every client; the unix socket file is the caller's. */
void metrics_server_free(struct metrics_server *m);

/* Limits, for the tests and the docs. */
#define METRICS_MAX_CLIENTS 32
#define METRICS_REQUEST_MAX 8192                 /* request line and headers */
#define METRICS_CLIENT_TIMEOUT_NS 10000000000ull /* 10 s for a request and its reply */
#define METRICS_IDLE_TIMEOUT_NS 120000000000ull  /* a kept-alive connection's idle time */

#endif
