/* Listening unix sockets (see unix-listener.h): creation with the requested
 * mode, the probe that tells a live socket from a stale one, and removal of
 * our own socket file only. qemu-storage-daemon removes whatever is at the
 * path before it binds, which lets a second daemon take a running one's
 * socket away; here only a socket nobody accepts on is replaced.
 *
 * THREADING RULE: no shared state (fchmod, not umask, sets the mode). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/unix-listener.h"

static int path_addr(const char *path, struct sockaddr_un *sa)
{
	size_t len = strlen(path);

	if (!len)
		return -ENOENT;
	if (len >= sizeof(sa->sun_path))
		return -ENAMETOOLONG;
	memset(sa, 0, sizeof(*sa));
	sa->sun_family = AF_UNIX;
	memcpy(sa->sun_path, path, len + 1);
	return 0;
}

static bool same_file(const struct stat *st, dev_t dev, ino_t ino, const struct timespec *ctime)
{
	return st->st_dev == dev && st->st_ino == ino && st->st_ctim.tv_sec == ctime->tv_sec &&
	       st->st_ctim.tv_nsec == ctime->tv_nsec;
}

/* -ECONNREFUSED: nobody listens; 0: a server accepts (or its backlog is full,
 * -EAGAIN); -ENOENT: the file went away; else why we cannot tell. */
static int probe(const struct sockaddr_un *sa)
{
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), ret;

	if (fd < 0)
		return -errno;
	ret = connect(fd, (const struct sockaddr *)sa, sizeof(*sa)) < 0 ? -errno : 0;
	close(fd);
	/* A socket of another type that is bound and alive: in use too. */
	return ret == -EAGAIN || ret == -EPROTOTYPE ? 0 : ret;
}

/* bind() found the path taken: remove it if it is a stale socket (0: bind
 * again), else -EADDRINUSE (a server listens), -ENOTSOCK or -errno. */
static int clear_stale(const struct sockaddr_un *sa)
{
	struct stat before, after;
	int ret;

	if (lstat(sa->sun_path, &before) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(before.st_mode))
		return -ENOTSOCK;
	ret = probe(sa);
	if (ret == -ENOENT)
		return 0;
	if (ret != -ECONNREFUSED)
		return ret == 0 ? -EADDRINUSE : ret;
	/* Remove only the file that was probed, not one created since. */
	if (lstat(sa->sun_path, &after) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!same_file(&after, before.st_dev, before.st_ino, &before.st_ctim))
		return -EADDRINUSE;
	return unlink(sa->sun_path) < 0 && errno != ENOENT ? -errno : 0;
}

static int bind_path(int fd, const struct sockaddr_un *sa)
{
	int tries, ret = 0;

	for (tries = 0; tries < 2; tries++) {
		if (bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) == 0)
			return 0;
		ret = -errno;
		if (ret != -EADDRINUSE)
			return ret;
		ret = clear_stale(sa);
		if (ret < 0)
			return ret;
	}
	return -EADDRINUSE; /* taken again right after the stale file went */
}

/* The socket file is ours: note which it is and give it exactly `mode`. */
static int own_file(struct unix_listener *l, const char *path, mode_t mode)
{
	struct stat st;

	if (lstat(path, &st) < 0)
		return -errno;
	/* The umask may have taken away bits that mode asks for. */
	if ((st.st_mode & 07777) != mode && (chmod(path, mode) < 0 || lstat(path, &st) < 0))
		return -errno;
	l->dev = st.st_dev;
	l->ino = st.st_ino;
	l->ctime = st.st_ctim;
	l->path = strdup(path);
	return l->path ? 0 : -ENOMEM;
}

static void listen_error(const char *path, int ret, char *err, size_t errlen)
{
	const char *why = strerror(-ret);

	if (ret == -EADDRINUSE)
		why = "a server is already listening on it";
	else if (ret == -ENOTSOCK)
		why = "the path exists and is not a socket";
	else if (ret == -ENAMETOOLONG)
		why = "the path is too long for a unix socket";
	snprintf(err, errlen, "cannot listen on %s: %s", path, why);
}

int unix_listen(struct unix_listener *l, const char *path, mode_t mode, int backlog, char *err,
		size_t errlen)
{
	struct sockaddr_un sa;
	bool bound = false;
	int fd = -1, ret;

	*l = (struct unix_listener){.fd = -1};
	ret = path_addr(path, &sa);
	if (ret == 0 && (fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
		ret = -errno;
	/* Linux creates the file with the socket's mode less the umask, so it
	 * is never more open than asked, not even before the chmod. */
	if (ret == 0 && fchmod(fd, mode) < 0)
		ret = -errno;
	if (ret == 0)
		ret = bind_path(fd, &sa);
	bound = ret == 0;
	if (ret == 0)
		ret = own_file(l, path, mode);
	if (ret == 0 && listen(fd, backlog) < 0)
		ret = -errno;
	if (ret == 0) {
		l->fd = fd;
		return 0;
	}
	listen_error(path, ret, err, errlen);
	if (bound) /* created a moment ago by us */
		unlink(path);
	free(l->path);
	l->path = NULL;
	if (fd >= 0)
		close(fd);
	return ret;
}

void unix_listener_close(struct unix_listener *l)
{
	struct stat st;

	if (l->path && lstat(l->path, &st) == 0 && same_file(&st, l->dev, l->ino, &l->ctime))
		unlink(l->path);
	free(l->path);
	l->path = NULL;
	if (l->fd >= 0)
		close(l->fd);
	l->fd = -1;
}
