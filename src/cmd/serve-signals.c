/* Signals and shutdown of `ioplane serve`. The handled signals are blocked
 * in every thread and read from a signalfd on the main loop. SIGTERM and
 * SIGINT (and QMP quit, which raises SIGTERM) stop accepting, let the
 * requests in flight finish (10 s at most, then the clients are dropped),
 * and end the main loop; a second one drops the clients at once. SIGHUP
 * reopens the --log-file; SIGUSR1 logs the statistics; the other signals
 * that would kill the daemon without a flush are logged and ignored.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "block/block.h"
#include "block/graph.h"
#include "cmd/serve-int.h"
#include "cmd/serve-monitor.h"
#include "control/qmp-export.h"
#include "control/qmp-object.h"
#include "loop/iothread.h"
#include "util/log.h"

#define DRAIN_TIMEOUT_NS (10ull * 1000000000ull)

static void server_drained(void *opaque)
{
	struct serve *sv = opaque;

	if (--sv->draining)
		return;
	if (loop_timer_armed(&sv->drain_timer))
		loop_timer_cancel(sv->main_loop, &sv->drain_timer);
	log_info("all connections closed");
	loop_stop(sv->main_loop);
}

static void abort_all(struct serve *sv)
{
	unsigned i;

	for (i = 0; i < sv->nservers; i++)
		nbd_server_abort(sv->servers[i]);
	qmp_exports_abort();
}

static void drain_timeout(struct loop_timer *t)
{
	struct serve *sv = (struct serve *)((char *)t - offsetof(struct serve, drain_timer));

	log_warn("clients still busy after %llu s: dropping them",
		 DRAIN_TIMEOUT_NS / 1000000000ull);
	abort_all(sv);
}

static void begin_shutdown(struct serve *sv, int sig)
{
	unsigned i;

	if (sv->tearing_down) {
		log_warn("%s: already flushing and closing the images", strsignal(sig));
		return;
	}
	if (sv->stopping) {
		log_warn("%s again: dropping the remaining connections", strsignal(sig));
		abort_all(sv);
		return;
	}
	sv->stopping = true;
	log_info("%s: shutting down", strsignal(sig));
	svc_notify("STOPPING=1\nSTATUS=shutting down: finishing the requests in flight");
	serve_monitor_shutdown(sv->monitors, sig);
	for (i = 0; i < sv->nservers; i++)
		nbd_server_stop_listening(sv->servers[i]);
	sv->draining = sv->nservers;
	sv->draining += qmp_exports_stop(server_drained, sv);
	if (!sv->draining) {
		loop_stop(sv->main_loop); /* nothing to drain: monitors only */
		return;
	}
	sv->drain_timer.cb = drain_timeout;
	loop_timer_arm(sv->main_loop, &sv->drain_timer, loop_now_ns() + DRAIN_TIMEOUT_NS);
	for (i = 0; i < sv->nservers; i++)
		nbd_server_drain(sv->servers[i], server_drained, sv);
}

/* Signals whose default action ends the process without a flush, which a
 * user, a terminal or a service manager may send: never fatal. SIGHUP
 * reopens the --log-file, SIGUSR1 logs the statistics; the others are
 * logged and ignored. */
static const int ignored_signals[] = {
	SIGHUP, SIGUSR1, SIGUSR2, SIGALRM, SIGVTALRM, SIGPROF, SIGIO, SIGPWR,
};

static void reopen_log(struct serve *sv, uint32_t from)
{
	int ret = log_reopen();

	if (ret > 0)
		log_info("SIGHUP from process %u: reopened %s", from, sv->log_file);
	else if (ret < 0)
		log_err("SIGHUP: cannot reopen %s: %s (still logging to the old file)",
			sv->log_file, strerror(-ret));
	else
		log_info("SIGHUP from process %u: no --log-file to reopen; ignored", from);
}

static void dump_node(const struct blk_node *bs)
{
	static const enum blk_op ops[] = {BLK_OP_READ, BLK_OP_WRITE, BLK_OP_FLUSH, BLK_OP_DISCARD,
					  BLK_OP_WRITE_ZEROES};
	char line[512];
	struct blk_stats st;
	size_t n = 0;

	blk_get_stats(bs, &st);
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]) && n < sizeof(line); i++) {
		const struct blk_op_stats *o = &st.op[ops[i]];
		int m = snprintf(line + n, sizeof(line) - n,
				 "%s %" PRIu64 " ops %" PRIu64 " bytes %" PRIu64 " errors%s",
				 blk_op_name(ops[i]), o->ops, o->bytes, o->errors,
				 i + 1 < sizeof(ops) / sizeof(ops[0]) ? ", " : "");

		n += m > 0 ? (size_t)m : 0;
	}
	log_info("stats: node %s: %s; %" PRIu64 " in flight", blk_node_name(bs), line,
		 st.in_flight);
}

static void dump_iothread(void *ctx, const char *id, struct iothread *t)
{
	struct loop_stats st;

	(void)ctx;
	loop_get_stats(iothread_loop(t), &st);
	log_info("stats: iothread %s: %" PRIu64 " rounds, %" PRIu64 " sleeps, polling %" PRIu64
		 " hits %" PRIu64 " misses, %.3f s CPU",
		 id, st.rounds, st.sleeps, st.poll_hits, st.poll_misses,
		 (double)iothread_cpu_ns(t) / 1e9);
}

/* SIGUSR1: the counters --metrics and query-blockstats report, in the log. */
static void dump_stats(uint32_t from)
{
	log_info("stats: SIGUSR1 from process %u: %u export(s)", from, qmp_export_count());
	for (struct blk_node *bs = blk_graph_next(NULL); bs; bs = blk_graph_next(bs))
		dump_node(bs);
	qmp_iothreads_foreach(dump_iothread, NULL);
}

static void signal_cb(struct loop_fd *h, uint32_t revents)
{
	struct serve *sv = (struct serve *)((char *)h - offsetof(struct serve, sig_h));
	struct signalfd_siginfo si;

	(void)revents;
	while (read(h->fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		int sig = (int)si.ssi_signo;

		if (sig == SIGTERM || sig == SIGINT)
			begin_shutdown(sv, sig);
		else if (sig == SIGHUP)
			reopen_log(sv, si.ssi_pid);
		else if (sig == SIGUSR1)
			dump_stats(si.ssi_pid);
		else
			log_info("%s (signal %d from process %u): ignored", strsignal(sig), sig,
				 si.ssi_pid);
	}
}

void serve_block_signals(sigset_t *set)
{
	size_t i;

	sigemptyset(set);
	sigaddset(set, SIGTERM);
	sigaddset(set, SIGINT);
	for (i = 0; i < sizeof(ignored_signals) / sizeof(ignored_signals[0]); i++)
		sigaddset(set, ignored_signals[i]);
	/* Before any thread starts, so that every thread inherits the mask. */
	pthread_sigmask(SIG_BLOCK, set, NULL);
	/* Sockets are written with MSG_NOSIGNAL; this covers every other fd. */
	signal(SIGPIPE, SIG_IGN);
}

int serve_setup_signals(struct serve *sv, const sigset_t *set)
{
	int fd = signalfd(-1, set, SFD_NONBLOCK | SFD_CLOEXEC);

	if (fd < 0) {
		log_err("signalfd: %s", strerror(errno));
		return 1;
	}
	sv->sig_h = (struct loop_fd){.fd = fd, .events = EPOLLIN, .cb = signal_cb};
	if (loop_fd_add(sv->main_loop, &sv->sig_h) < 0) {
		close(fd);
		sv->sig_h.fd = -1;
		return 1;
	}
	return -1;
}

void serve_close_signals(struct serve *sv)
{
	if (sv->sig_h.fd > 0) {
		loop_fd_del(sv->main_loop, &sv->sig_h);
		close(sv->sig_h.fd);
		sv->sig_h.fd = -1;
	}
}
