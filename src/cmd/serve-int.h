/* What serve.c and serve-signals.c share: the daemon's state.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CMD_SERVE_INT_H
#define IOPLANE_CMD_SERVE_INT_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "cmd/pidfile.h"
#include "export/nbd-server.h"
#include "loop/loop.h"
#include "util/opts.h"
#include "util/service.h"

struct blk_node;
struct monitor_set;
struct serve_metrics;
struct serve_qsd;

struct serve_image {
	char *id;
	struct blk_node *bs;
	enum nbd_detect_zeroes dz;
};

/* One --nbd: an export on a listening address. */
struct serve_nbd {
	struct kv_opts o;
	char *addr; /* "unix:PATH" or "tcp:HOST:PORT": exports at one address share a server */
	struct serve_image *img;
	struct nbd_server *srv;
	struct svc_owner owner; /* user=, group= of a unix socket */
};

struct serve {
	unsigned niothreads, max_conns;
	uint64_t request_memory;   /* --max-request-memory */
	struct nbd_budget *budget; /* shared by the NBD servers */
	int64_t poll_max_ns;       /* iothreads' adaptive polling limit (-1: default) */
	const char *pidfile;
	bool daemonize;    /* --daemonize */
	int ready_fd;      /* the child of --daemonize tells its parent here */
	struct pidfile pf; /* locked from start-up to exit */
	char **image_args, **nbd_args, **vhost_args;
	unsigned nimages, nnbd, nvhost;
	struct serve_qsd *qsd;         /* --object, --export, --nbd-server (serve-qsd.c) */
	struct monitor_set *monitors;  /* --monitor, --chardev (serve-monitor.c) */
	struct serve_metrics *metrics; /* --metrics (serve-metrics.c) */
	struct serve_image *images;
	struct serve_nbd *nbds;
	struct loop **loops; /* the --iothreads pool (qmp-object.c owns it) */
	unsigned nthreads;
	struct loop *main_loop;
	struct nbd_server **servers;
	unsigned nservers, draining;
	const char *log_file;      /* --log-file: reopened on SIGHUP */
	const char *run_with_user; /* --run-with user=: privileges dropped once listening */
	struct loop_fd sig_h;
	struct loop_timer drain_timer;
	bool stopping;
	/* Exports are being freed and images flushed: blk_flush_sync() runs
	 * the main loop, whose signal handler must then leave them alone. */
	bool tearing_down;
	char err[512];
};

/* ---- serve-signals.c ---- */

/* Block the daemon's signals (before any thread starts: every thread
 * inherits the mask); SIGPIPE is ignored. */
void serve_block_signals(sigset_t *set);
/* Read them from a signalfd on the main loop: -1 to go on, or an exit status. */
int serve_setup_signals(struct serve *sv, const sigset_t *set);
void serve_close_signals(struct serve *sv);

#endif
