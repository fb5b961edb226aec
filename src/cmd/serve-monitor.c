/* --monitor and --chardev for `ioplane serve` (see serve-monitor.h). `quit`
 * raises SIGTERM in the daemon itself: serve.c reads it from its signalfd on
 * the main loop, after quit's reply has gone out, and shuts down exactly as
 * for a signal from outside.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include "cmd/serve-monitor.h"
#include "control/monitor-opts.h"
#include "control/qmp-block.h"
#include "control/qmp-cmds.h"
#include "util/log.h"
#include "util/service.h"

#define EXIT_USAGE 1 /* a bad command line, as in qemu-storage-daemon */

static bool quit_requested;

static void serve_quit(void *opaque)
{
	(void)opaque;
	if (quit_requested)
		return; /* a second quit is not a second SIGTERM */
	quit_requested = true;
	kill(getpid(), SIGTERM);
}

int serve_monitor_opt(struct monitor_set **set, int is_chardev, const char *arg)
{
	char err[512];
	int ret;

	if (!*set && !(*set = monitor_set_new()))
		return 1;
	if (is_chardev)
		ret = monitor_set_add_chardev(*set, arg, err, sizeof(err));
	else
		ret = monitor_set_add_monitor(*set, arg, err, sizeof(err));
	if (ret == 0)
		return -1;
	fprintf(stderr, "ioplane serve: --%s %s: %s\n", is_chardev ? "chardev" : "monitor", arg,
		err);
	return ret == -EINVAL ? EXIT_USAGE : 1;
}

unsigned serve_monitor_count(const struct monitor_set *set)
{
	return monitor_set_count(set);
}

int serve_monitor_start(struct monitor_set *set, struct loop *main_loop)
{
	char err[640];
	int ret;

	if (!set)
		return -1;
	qmp_set_quit_handler(serve_quit, NULL);
	if (qmp_block_register() < 0) {
		log_err("cannot register the block commands");
		return 1;
	}
	monitor_set_take_passed(set, svc_listen_take); /* socket activation */
	ret = monitor_set_start(set, main_loop, err, sizeof(err));
	if (ret == 0)
		return -1;
	if (ret == -EINVAL) {
		fprintf(stderr, "ioplane serve: %s (try 'ioplane serve --help')\n", err);
		return EXIT_USAGE;
	}
	log_err("%s", err); /* a socket, as --nbd's listen errors are */
	return 1;
}

void serve_monitor_shutdown(struct monitor_set *set, int sig)
{
	if (!set)
		return;
	qmp_emit_shutdown(quit_requested && sig == SIGTERM ? "host-qmp-quit" : "host-signal");
	monitor_set_stop_listening(set);
}

void serve_monitor_free(struct monitor_set *set)
{
	monitor_set_free(set);
}
