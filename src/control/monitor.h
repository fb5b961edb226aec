/* A QMP monitor: a listening unix socket (or a socket passed in by a parent)
 * whose clients each get a QMP connection. Several clients at once, each with
 * bounded input and output; a client that stops reading is dropped, and
 * never blocks the daemon or another client.
 *
 * THREADING RULE: main thread only; sockets are non-blocking and run on the
 * main loop. */
#ifndef IOPLANE_CONTROL_MONITOR_H
#define IOPLANE_CONTROL_MONITOR_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct loop;
struct monitor;

#define MONITOR_MAX_CLIENTS 16 /* per monitor; more are closed at once */

struct monitor_config {
	const char *path; /* listen here, with permissions `mode`; or */
	mode_t mode;
	int fd;      /* a socket from the parent (-1: none): listening or connected */
	bool pretty; /* indented JSON output */
};

/* Start listening (or serving the passed connection). On failure -errno and
 * err says why; a passed fd is then left open. */
int monitor_start(struct loop *main_loop, const struct monitor_config *cfg, struct monitor **out,
		  char *err, size_t errlen);
/* Accept no more clients; those connected stay. */
void monitor_stop_listening(struct monitor *m);
/* Write what can be written without waiting, close every client and the
 * socket (its file too, if we made it). */
void monitor_free(struct monitor *m);
unsigned monitor_client_count(const struct monitor *m);

/* Check that fd is a stream socket we may use: 0, or -EBADF / -ENOTSOCK /
 * -EPROTOTYPE. *listening tells whether it accepts connections. */
int monitor_check_fd(int fd, bool *listening);

#endif
