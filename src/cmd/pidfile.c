/* The locked pidfile of `ioplane serve`, and --daemonize (see pidfile.h).
 *
 * Threading: main thread only. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd/pidfile.h"

#define PIDFILE_TRIES 10

static int lock_whole(int fd)
{
	struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};

	if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
		return 0;
	return errno == EACCES ? -EAGAIN : -errno;
}

/* What the holder wrote (its process ID, normally), for the message. */
static void describe_holder(int fd, char *buf, size_t len)
{
	ssize_t n = pread(fd, buf, len - 1, 0);
	size_t i;

	n = n < 0 ? 0 : n;
	buf[n] = 0;
	for (i = 0; buf[i]; i++)
		if (buf[i] < '0' || buf[i] > '9')
			break;
	buf[i] = 0;
}

/* Open and lock; 1 when the file at path was replaced meanwhile (retry). */
static int lock_once(struct pidfile *pf, const char *path, char *err, size_t errlen)
{
	struct stat fst, pst;
	char holder[24];
	int fd, ret;

	/* O_NONBLOCK: a FIFO at the path must not hold the daemon up. */
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
	if (fd < 0) {
		ret = -errno;
		snprintf(err, errlen, "--pidfile %s: %s", path, strerror(-ret));
		return ret;
	}
	/* Nor may a FIFO or a device there be truncated, written, or removed
	 * at exit (as pidfile_release() would). */
	if (fstat(fd, &fst) < 0 || !S_ISREG(fst.st_mode)) {
		snprintf(err, errlen, "--pidfile %s: not a regular file", path);
		close(fd);
		return -EINVAL;
	}
	ret = lock_whole(fd);
	if (ret == -EAGAIN) {
		describe_holder(fd, holder, sizeof(holder));
		snprintf(err, errlen, "--pidfile %s: locked by another running instance%s%s%s",
			 path, holder[0] ? " (process " : "", holder, holder[0] ? ")" : "");
	} else if (ret < 0) {
		snprintf(err, errlen, "--pidfile %s: cannot lock: %s", path, strerror(-ret));
	} else if (fstat(fd, &fst) < 0 || stat(path, &pst) < 0 || fst.st_dev != pst.st_dev ||
		   fst.st_ino != pst.st_ino) {
		ret = 1; /* its owner removed it between our open and lock */
	}
	if (ret) {
		close(fd);
		return ret;
	}
	pf->fd = fd;
	pf->dev = fst.st_dev;
	pf->ino = fst.st_ino;
	return 0;
}

int pidfile_lock(struct pidfile *pf, const char *path, char *err, size_t errlen)
{
	int i, ret = 1;

	pf->fd = -1;
	for (i = 0; i < PIDFILE_TRIES && ret == 1; i++)
		ret = lock_once(pf, path, err, errlen);
	if (ret == 1) {
		snprintf(err, errlen, "--pidfile %s: keeps being replaced", path);
		return -EBUSY;
	}
	if (ret < 0)
		return ret;
	pf->path = strdup(path);
	if (!pf->path || ftruncate(pf->fd, 0) < 0) {
		ret = pf->path ? -errno : -ENOMEM;
		snprintf(err, errlen, "--pidfile %s: %s", path, strerror(-ret));
		pidfile_release(pf);
		return ret;
	}
	return 0;
}

int pidfile_write(struct pidfile *pf, char *err, size_t errlen)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());

	if (pwrite(pf->fd, buf, (size_t)n, 0) != n) {
		snprintf(err, errlen, "--pidfile %s: %s", pf->path, strerror(errno ? errno : EIO));
		return -EIO;
	}
	return 0;
}

void pidfile_release(struct pidfile *pf)
{
	struct stat st;

	if (pf->fd < 0)
		return;
	/* Still holding the lock: nobody else can have taken this file over,
	 * but someone may have put another file at the path. */
	if (pf->path && stat(pf->path, &st) == 0 && st.st_dev == pf->dev && st.st_ino == pf->ino)
		unlink(pf->path);
	close(pf->fd);
	pf->fd = -1;
	free(pf->path);
	pf->path = NULL;
}

/* ---- --daemonize ------------------------------------------------------- */

static void daemon_parent(int fd, pid_t child)
{
	char c = 1;
	ssize_t n;
	int st;

	do
		n = read(fd, &c, 1);
	while (n < 0 && errno == EINTR);
	if (n == 1 && c == 0)
		_exit(0);
	/* The child failed before it was ready: it said why on stderr. */
	while (waitpid(child, &st, 0) < 0 && errno == EINTR)
		;
	_exit(1);
}

int daemon_start(void)
{
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0) {
		fprintf(stderr, "ioplane serve: --daemonize: %s\n", strerror(errno));
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "ioplane serve: --daemonize: fork: %s\n", strerror(errno));
		close(p[0]);
		close(p[1]);
		return -1;
	}
	if (pid > 0) {
		close(p[1]);
		daemon_parent(p[0], pid);
	}
	close(p[0]);
	setsid();
	return p[1];
}

void daemon_ready(int fd, bool keep_stderr)
{
	char c = 0;
	int null;

	if (fd < 0)
		return;
	null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (null >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		if (!keep_stderr)
			dup2(null, STDERR_FILENO);
		close(null);
	}
	while (write(fd, &c, 1) < 0 && errno == EINTR)
		;
	close(fd);
}
