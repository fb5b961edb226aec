/* `ioplane serve --monitor ... --chardev ...`: the QMP monitors' hooks for
 * serve.c (parse, start with the daemon, SHUTDOWN at shutdown, free), kept
 * out of serve.c as serve-vhost.c is.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_SERVE_MONITOR_H
#define IOPLANE_SERVE_MONITOR_H

struct loop;
struct monitor_set;

/* Check one --monitor / --chardev argument as it is parsed (*set is made on
 * first use). -1 to go on, else the exit status (2: bad command line). */
int serve_monitor_opt(struct monitor_set **set, int is_chardev, const char *arg);
unsigned serve_monitor_count(const struct monitor_set *set);
/* Start every monitor on the main loop; `quit` then shuts the daemon down
 * the way SIGTERM does. -1 or the exit status. */
int serve_monitor_start(struct monitor_set *set, struct loop *main_loop);
/* Shutdown began (sig: its signal, SIGTERM also for `quit`): send SHUTDOWN
 * to the clients, accept no new ones; those connected are served until
 * serve_monitor_free(). */
void serve_monitor_shutdown(struct monitor_set *set, int sig);
void serve_monitor_free(struct monitor_set *set);

#endif
