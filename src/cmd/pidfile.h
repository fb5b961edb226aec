/* `ioplane serve --pidfile`: a pidfile locked for the daemon's whole life, so
 * that a second instance on the same file is refused instead of overwriting
 * it, and so that only the instance that wrote it removes it.
 *
 * Threading: main thread only. */
#ifndef IOPLANE_PIDFILE_H
#define IOPLANE_PIDFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct pidfile {
	int fd;        /* -1: none; holds the lock while open */
	dev_t dev;     /* the locked file, to recognise it at exit */
	ino_t ino;
	char *path;
};

/* Create or open PATH and take an exclusive lock on it (an open file
 * description lock, which also conflicts with the POSIX locks QEMU takes on
 * its pidfiles); then empty it. -EAGAIN: another process holds the lock, and
 * the file is left as it was. err gets a human message. */
int pidfile_lock(struct pidfile *pf, const char *path, char *err, size_t errlen);
/* Write the process ID into the locked file. */
int pidfile_write(struct pidfile *pf, char *err, size_t errlen);
/* Remove the file if it is still the one we locked, then drop the lock. */
void pidfile_release(struct pidfile *pf);

/* --daemonize, as qemu-storage-daemon's: fork; the parent waits until the
 * child says it is ready (then exits 0) or the child fails first (then
 * exits 1: the child's messages went to the shared stderr). In the child
 * (a new session) this returns the fd to pass to daemon_ready(); -1 and a
 * message on stderr if the fork itself fails. Before any thread starts. */
int daemon_start(void);
/* Serving: release the parent, and send stdin, stdout and (unless
 * keep_stderr: a --log-file) stderr to /dev/null. */
void daemon_ready(int fd, bool keep_stderr);

#endif
