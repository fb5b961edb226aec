/* The locked pidfile of `ioplane serve` (see pidfile.h).
 *
 * Threading: main thread only. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
	if (fd < 0) {
		ret = -errno;
		snprintf(err, errlen, "--pidfile %s: %s", path, strerror(-ret));
		return ret;
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
