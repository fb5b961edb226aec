/* Running under a service manager, through systemd's documented protocols
 * (sd_notify(3), sd_listen_fds(3)) without libsystemd: readiness and status
 * messages to $NOTIFY_SOCKET, listening sockets passed in by socket
 * activation ($LISTEN_PID, $LISTEN_FDS, $LISTEN_FDNAMES), and the owner
 * (user=, group=) of the unix sockets the daemon creates itself.
 *
 * THREADING RULE: main thread only; svc_listen_init() before any thread. */
#ifndef IOPLANE_UTIL_SERVICE_H
#define IOPLANE_UTIL_SERVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct kv_opts;

/* Send one notification ("READY=1\nSTATUS=..."): 1 sent, 0 no $NOTIFY_SOCKET,
 * -errno on failure. */
int svc_notify(const char *msg);
/* READY=1 with a STATUS= saying what is served, and MAINPID=. */
int svc_notify_ready(unsigned nexports, unsigned niothreads);
/* svc_notify() of "STATUS=" + the formatted text (printf). */
int svc_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Take the sockets passed in when $LISTEN_PID is this process: fds 3 ..
 * 3+$LISTEN_FDS-1, named by $LISTEN_FDNAMES; the variables are then removed
 * from the environment. Returns how many, or -EINVAL (err says why). */
int svc_listen_init(char *err, size_t errlen);
/* A passed socket for a server called `name` (NULL: none) that would listen
 * on unix socket `path` (NULL: none): the first not yet taken whose name is
 * `name`, else one that is bound to `path`. The fd (non-blocking,
 * close-on-exec; the caller owns it), or -1. */
int svc_listen_take(const char *name, const char *path);
/* Log and close the passed sockets no server took. */
void svc_listen_close_unused(void);

/* --run-with user=NAME: switch to NAME's user, group and supplementary
 * groups for good (a root process only; NAME may also be a number). 0 or
 * -errno with err. */
int svc_run_as(const char *user, char *err, size_t errlen);

/* user= and group= of a unix socket: names or numbers. */
struct svc_owner {
	uid_t uid; /* (uid_t)-1: unchanged */
	gid_t gid; /* (gid_t)-1: unchanged */
};

/* Read user= and group= from o (marking them used). 0, or -EINVAL with err
 * naming the unknown user or group. */
int svc_owner_parse(struct kv_opts *o, struct svc_owner *ow, char *err, size_t errlen);
/* The same from the two strings (NULL: unchanged). */
int svc_owner_lookup(const char *user, const char *group, struct svc_owner *ow, char *err,
		     size_t errlen);
bool svc_owner_set(const struct svc_owner *ow);
/* Give the socket file at path to the owner (lchown; a path that is not a
 * socket is refused). 0 or -errno with err. */
int svc_owner_apply(const char *path, const struct svc_owner *ow, char *err, size_t errlen);

#endif
