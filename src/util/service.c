/* systemd's notification and socket-activation protocols, and socket owners
 * (see service.h). The protocols are the documented ones: a datagram of
 * newline-separated KEY=VALUE to the unix socket $NOTIFY_SOCKET names (a
 * path, or an abstract address written with a leading '@'); passed sockets
 * start at fd 3 (SD_LISTEN_FDS_START) and are ours only if $LISTEN_PID is
 * our process ID.
 *
 * THREADING RULE: main thread only (the environment is changed once, at
 * start-up, before any thread exists). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "util/log.h"
#include "util/opts.h"
#include "util/service.h"

#define LISTEN_FDS_START 3
#define LISTEN_MAX 256

struct passed {
	int fd;     /* -1 once taken */
	char *name; /* from $LISTEN_FDNAMES, "" when not named */
	char *path; /* the unix path it is bound to, or NULL */
};

static struct passed passed[LISTEN_MAX];
static unsigned npassed;

int svc_notify(const char *msg)
{
	const char *e = getenv("NOTIFY_SOCKET");
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	size_t len;
	socklen_t salen;
	int fd, ret = 1;

	if (!e || !*e)
		return 0;
	len = strlen(e);
	if ((e[0] != '/' && e[0] != '@') || len >= sizeof(sa.sun_path) || len < 2)
		return -EAFNOSUPPORT;
	memcpy(sa.sun_path, e, len);
	if (e[0] == '@')
		sa.sun_path[0] = 0; /* abstract: no terminating NUL counted */
	salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len + (e[0] == '/'));
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (sendto(fd, msg, strlen(msg), MSG_NOSIGNAL, (struct sockaddr *)&sa, salen) < 0)
		ret = -errno;
	close(fd);
	if (ret < 0)
		log_debug("NOTIFY_SOCKET %s: %s", e, strerror(-ret));
	return ret;
}

int svc_notify_ready(unsigned nexports, unsigned niothreads)
{
	char buf[256];

	snprintf(buf, sizeof(buf),
		 "READY=1\nSTATUS=serving %u export(s) with %u iothread(s)\n"
		 "MAINPID=%d",
		 nexports, niothreads, (int)getpid());
	return svc_notify(buf);
}

int svc_status(const char *fmt, ...)
{
	char buf[512];
	va_list ap;
	int n = snprintf(buf, sizeof(buf), "STATUS=");

	va_start(ap, fmt);
	vsnprintf(buf + n, sizeof(buf) - (size_t)n, fmt, ap);
	va_end(ap);
	return svc_notify(buf);
}

/* ---- socket activation ---------------------------------------------------- */

static char *bound_path(int fd)
{
	struct sockaddr_un sa;
	socklen_t len = sizeof(sa);

	memset(&sa, 0, sizeof(sa));
	if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0 || sa.sun_family != AF_UNIX ||
	    len <= offsetof(struct sockaddr_un, sun_path) || sa.sun_path[0] == 0)
		return NULL;
	sa.sun_path[sizeof(sa.sun_path) - 1] = 0;
	return strdup(sa.sun_path);
}

/* $LISTEN_FDNAMES: colon-separated, one per fd; fewer names leave the rest "". */
static int take_names(unsigned n)
{
	const char *s = getenv("LISTEN_FDNAMES");

	for (unsigned i = 0; i < n; i++) {
		size_t len = s ? strcspn(s, ":") : 0;

		passed[i].name = strndup(s ? s : "", len);
		if (!passed[i].name)
			return -ENOMEM;
		if (s)
			s = s[len] ? s + len + 1 : NULL;
	}
	return 0;
}

static int take_fds(unsigned n, char *err, size_t errlen)
{
	struct stat st;

	for (unsigned i = 0; i < n; i++) {
		int fd = LISTEN_FDS_START + (int)i;

		if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode)) {
			snprintf(err, errlen, "LISTEN_FDS: fd %d is not a socket", fd);
			return -EINVAL;
		}
		if (fcntl(fd, F_SETFD, FD_CLOEXEC) < 0 ||
		    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0) {
			snprintf(err, errlen, "LISTEN_FDS: fd %d: %s", fd, strerror(errno));
			return -EINVAL;
		}
		passed[i].fd = fd;
		passed[i].path = bound_path(fd);
	}
	return 0;
}

int svc_listen_init(char *err, size_t errlen)
{
	const char *pid = getenv("LISTEN_PID"), *fds = getenv("LISTEN_FDS");
	uint64_t p, n;
	int ret;

	if (!pid || !fds)
		return 0;
	if (parse_u64(pid, &p) < 0 || parse_u64(fds, &n) < 0) {
		snprintf(err, errlen, "LISTEN_PID=%s LISTEN_FDS=%s: not numbers", pid, fds);
		return -EINVAL;
	}
	if (p != (uint64_t)getpid())
		return 0; /* meant for another process: leave them alone */
	if (n > LISTEN_MAX) {
		snprintf(err, errlen, "LISTEN_FDS=%s: at most %u sockets", fds, LISTEN_MAX);
		return -EINVAL;
	}
	ret = take_names((unsigned)n);
	if (ret == 0)
		ret = take_fds((unsigned)n, err, errlen);
	else
		snprintf(err, errlen, "%s", strerror(-ret));
	npassed = (unsigned)n;
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	return ret < 0 ? ret : (int)n;
}

int svc_listen_take(const char *name, const char *path)
{
	unsigned i;

	for (i = 0; name && *name && i < npassed; i++)
		if (passed[i].fd >= 0 && !strcmp(passed[i].name, name))
			goto found;
	for (i = 0; path && i < npassed; i++)
		if (passed[i].fd >= 0 && passed[i].path && !strcmp(passed[i].path, path))
			goto found;
	return -1;
found:
	log_info("using the socket passed in as %s%s%s", *passed[i].name ? passed[i].name : "",
		 *passed[i].name && passed[i].path ? " " : "",
		 passed[i].path ? passed[i].path : "");
	{
		int fd = passed[i].fd;

		passed[i].fd = -1;
		return fd;
	}
}

void svc_listen_close_unused(void)
{
	for (unsigned i = 0; i < npassed; i++) {
		if (passed[i].fd >= 0) {
			log_warn("passed socket %d (%s%s%s) matches no server: closed",
				 passed[i].fd, passed[i].name, passed[i].path ? " " : "",
				 passed[i].path ? passed[i].path : "");
			close(passed[i].fd);
			passed[i].fd = -1;
		}
		free(passed[i].name);
		free(passed[i].path);
		passed[i].name = passed[i].path = NULL;
	}
	npassed = 0;
}

/* ---- socket owners ---------------------------------------------------------- */

static int lookup_uid(const char *s, uid_t *out)
{
	struct passwd pw, *res = NULL;
	char buf[4096];
	uint64_t v;

	if (getpwnam_r(s, &pw, buf, sizeof(buf), &res) == 0 && res) {
		*out = pw.pw_uid;
		return 0;
	}
	if (parse_u64(s, &v) == 0 && v < (uid_t)-1) {
		*out = (uid_t)v;
		return 0;
	}
	return -EINVAL;
}

static int lookup_gid(const char *s, gid_t *out)
{
	struct group gr, *res = NULL;
	char buf[4096];
	uint64_t v;

	if (getgrnam_r(s, &gr, buf, sizeof(buf), &res) == 0 && res) {
		*out = gr.gr_gid;
		return 0;
	}
	if (parse_u64(s, &v) == 0 && v < (gid_t)-1) {
		*out = (gid_t)v;
		return 0;
	}
	return -EINVAL;
}

int svc_owner_parse(struct kv_opts *o, struct svc_owner *ow, char *err, size_t errlen)
{
	return svc_owner_lookup(kv_get(o, "user"), kv_get(o, "group"), ow, err, errlen);
}

int svc_owner_lookup(const char *u, const char *g, struct svc_owner *ow, char *err, size_t errlen)
{
	ow->uid = (uid_t)-1;
	ow->gid = (gid_t)-1;
	if (u && lookup_uid(u, &ow->uid) < 0) {
		snprintf(err, errlen, "user=%s: no such user", u);
		return -EINVAL;
	}
	if (g && lookup_gid(g, &ow->gid) < 0) {
		snprintf(err, errlen, "group=%s: no such group", g);
		return -EINVAL;
	}
	return 0;
}

bool svc_owner_set(const struct svc_owner *ow)
{
	return ow->uid != (uid_t)-1 || ow->gid != (gid_t)-1;
}

int svc_owner_apply(const char *path, const struct svc_owner *ow, char *err, size_t errlen)
{
	struct stat st;

	if (!svc_owner_set(ow))
		return 0;
	/* The socket was created a moment ago with the requested mode and our
	 * owner: changing the owner only ever opens it to whom it names. */
	errno = ENOTSOCK;
	if (lstat(path, &st) < 0 || !S_ISSOCK(st.st_mode) || lchown(path, ow->uid, ow->gid) < 0) {
		int e = errno;

		snprintf(err, errlen, "cannot give %s to user %d group %d: %s", path, (int)ow->uid,
			 (int)ow->gid, strerror(e));
		return -e;
	}
	return 0;
}

/* ---- dropping privileges ------------------------------------------------------ */

int svc_run_as(const char *user, char *err, size_t errlen)
{
	struct passwd pw, *res = NULL;
	char buf[4096];
	uint64_t v;

	if (getpwnam_r(user, &pw, buf, sizeof(buf), &res) || !res) {
		if (parse_u64(user, &v) || v >= (uid_t)-1 ||
		    getpwuid_r((uid_t)v, &pw, buf, sizeof(buf), &res) || !res) {
			snprintf(err, errlen, "--run-with user=%s: no such user", user);
			return -EINVAL;
		}
	}
	/* glibc applies each of these to every thread of the process. Groups
	 * first: after setuid() they could not be changed any more. */
	if (initgroups(pw.pw_name, pw.pw_gid) < 0 || setgid(pw.pw_gid) < 0 ||
	    setuid(pw.pw_uid) < 0) {
		snprintf(err, errlen, "--run-with user=%s: %s", user, strerror(errno));
		return -errno;
	}
	if (pw.pw_uid != 0 && (setuid(0) == 0 || seteuid(0) == 0)) {
		snprintf(err, errlen, "--run-with user=%s: root could be regained", user);
		return -EPERM;
	}
	return 0;
}
