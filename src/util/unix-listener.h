/* Listening unix sockets for every server of the daemon (NBD, vhost-user, the
 * monitor), with one set of rules: a path where a server listens is never
 * taken over; a stale socket file (connect() is refused) is replaced; a
 * file of any other kind at the path is refused and left alone; on close
 * the file is removed only if it is still the socket this process created.
 *
 * THREADING RULE: none shared; a struct unix_listener belongs to its caller. */
#ifndef IOPLANE_UTIL_UNIX_LISTENER_H
#define IOPLANE_UTIL_UNIX_LISTENER_H

#include <stddef.h>
#include <sys/types.h>
#include <time.h>

struct unix_listener {
	int fd;     /* listening, non-blocking, close-on-exec; -1: none */
	char *path; /* NULL: none */
	/* The socket file bind() created, the one close removes. */
	dev_t dev;
	ino_t ino;
	struct timespec ctime; /* tells it from a new file that got its inode */
};

/* Listen on path with permissions `mode` (never more open than that, also
 * while it is being created). On failure err gets "cannot listen on PATH:
 * REASON" and the result is -errno: -EADDRINUSE (a server listens there),
 * -ENOTSOCK (something else is at the path), or bind()'s and listen()'s. */
int unix_listen(struct unix_listener *l, const char *path, mode_t mode, int backlog, char *err,
		size_t errlen);
/* Close the socket and remove its file if it is still ours (idempotent). */
void unix_listener_close(struct unix_listener *l);

#endif
