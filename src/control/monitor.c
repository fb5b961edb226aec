/* The monitor's sockets (see monitor.h): accepting, reading into each
 * client's connection, writing its output, and the life cycle of a client.
 *
 * A client is read only while its connection takes input: not while a request
 * is pending, nor while it has QMP_OUT_PAUSE bytes unread; the kernel's
 * socket buffer then fills and the client waits, the daemon does not. While
 * it waits for nothing its fd is off the loop, so that a hang-up cannot
 * make the loop spin. A client is freed only from its fd callback or its
 * kick (a timer due at once, which unlike deferred work can be cancelled),
 * never from inside the connection's callbacks: a handler may be running.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/compiler.h"
#include "control/monitor.h"
#include "control/qmp-cmds.h"
#include "control/qmp.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/unix-listener.h"

#define CLIENT_IN_BUF (64u << 10)

struct mon_client {
	struct qmp_conn s;
	struct monitor *mon;
	struct loop_fd h;
	struct loop_timer kick; /* due now: resumes input, or frees a dead client */
	bool eof;               /* the client will send no more */
	bool dead;              /* to be freed: socket error, overflow, or done */
	size_t in_head, in_len;
	struct mon_client *next;
	uint8_t in[CLIENT_IN_BUF];
};

struct monitor {
	struct loop *loop;
	struct unix_listener l; /* l.fd: listening socket, -1 if none */
	struct loop_fd lh;
	bool pretty;
	unsigned nclients;
	struct mon_client *clients;
};

static void client_update(struct mon_client *c);

static void client_free(struct mon_client *c)
{
	struct mon_client **p;

	for (p = &c->mon->clients; *p; p = &(*p)->next) {
		if (*p == c) {
			*p = c->next;
			break;
		}
	}
	c->mon->nclients--;
	if (loop_timer_armed(&c->kick))
		loop_timer_cancel(c->mon->loop, &c->kick);
	loop_fd_del(c->mon->loop, &c->h);
	close(c->h.fd);
	qmp_conn_destroy(&c->s);
	free(c);
}

static void client_kick_cb(struct loop_timer *t)
{
	struct mon_client *c = container_of(t, struct mon_client, kick);

	if (c->dead)
		client_free(c);
	else
		client_update(c);
}

static void client_kick(struct mon_client *c)
{
	if (!loop_timer_armed(&c->kick))
		loop_timer_arm(c->mon->loop, &c->kick, loop_now_ns());
}

/* Wait for ev (0: nothing, and the fd leaves the loop). */
static void client_watch(struct mon_client *c, uint32_t ev)
{
	if (!ev) {
		loop_fd_del(c->mon->loop, &c->h);
		c->h.events = 0;
	} else if (!c->h.armed) {
		c->h.events = ev;
		if (loop_fd_add(c->mon->loop, &c->h) < 0)
			c->dead = true;
	} else if (ev != c->h.events && loop_fd_modify(c->mon->loop, &c->h, ev) < 0) {
		c->dead = true;
	}
}

/* Write what the socket takes now. */
static void client_flush(struct mon_client *c)
{
	struct qmp_conn *s = &c->s;
	ssize_t n;

	while (!c->dead && s->out_len > s->out_head) {
		n = send(c->h.fd, s->out + s->out_head, s->out_len - s->out_head,
			 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			qmp_conn_wrote(s, (size_t)n);
		} else if (n < 0 && errno == EINTR) {
			continue;
		} else {
			if (n < 0 && errno != EAGAIN)
				c->dead = true; /* the peer is gone */
			break;
		}
	}
}

static void conn_output(struct qmp_conn *s)
{
	struct mon_client *c = s->opaque;

	if (s->overflow && !c->dead) {
		log_warn("QMP client dropped: more than %u bytes of output left unread",
			 QMP_OUT_MAX);
		c->dead = true;
	}
	client_flush(c);
	client_kick(c); /* re-arms the fd, or frees the client, after this callback */
}

static void conn_resume(struct qmp_conn *s)
{
	client_kick(s->opaque);
}

static const struct qmp_conn_ops client_ops = {
	.output = conn_output,
	.resume = conn_resume,
};

/* Feed buffered input to the connection while it takes it. */
static void client_process(struct mon_client *c)
{
	size_t used;

	while (!c->dead && c->in_len > c->in_head && qmp_conn_can_input(&c->s)) {
		used = qmp_conn_input(&c->s, c->in + c->in_head, c->in_len - c->in_head);
		c->in_head += used;
		if (!used)
			break;
	}
	if (c->in_head == c->in_len)
		c->in_head = c->in_len = 0;
}

static void client_read(struct mon_client *c)
{
	ssize_t n;

	if (c->in_len)
		return; /* the connection has not taken the last read yet */
	n = recv(c->h.fd, c->in, sizeof(c->in), MSG_DONTWAIT);
	if (n > 0)
		c->in_len = (size_t)n;
	else if (n == 0)
		c->eof = true;
	else if (errno != EAGAIN && errno != EINTR)
		c->dead = true;
}

/* Decide what the client waits for next, or that it is done. */
static void client_update(struct mon_client *c)
{
	struct qmp_conn *s = &c->s;
	bool unwritten = s->out_len > s->out_head;
	uint32_t ev = 0;

	if (c->dead)
		goto dead;
	client_process(c);
	client_flush(c);
	unwritten = s->out_len > s->out_head;
	if (c->dead || s->overflow)
		goto dead;
	/* Done: the client has said all it will (or broke the stream), every
	 * command it sent has run and its answers are out. */
	if ((c->eof || s->closing) && !s->pending && !unwritten &&
	    (s->closing || c->in_head == c->in_len))
		goto dead;
	if (!c->eof && !s->closing && qmp_conn_can_input(s) && !c->in_len)
		ev |= EPOLLIN;
	if (unwritten)
		ev |= EPOLLOUT;
	client_watch(c, ev);
	if (!c->dead)
		return;
dead:
	c->dead = true;
	client_watch(c, 0);
	client_kick(c);
}

static void client_cb(struct loop_fd *h, uint32_t revents)
{
	struct mon_client *c = container_of(h, struct mon_client, h);

	if (revents & EPOLLOUT)
		client_flush(c);
	if (revents & (EPOLLIN | EPOLLHUP | EPOLLERR))
		client_read(c);
	client_update(c);
}

static int client_new(struct monitor *m, int fd)
{
	struct mon_client *c = calloc(1, sizeof(*c));

	if (!c)
		return -ENOMEM;
	c->mon = m;
	c->kick.cb = client_kick_cb;
	c->h = (struct loop_fd){.fd = fd, .events = EPOLLIN, .cb = client_cb};
	if (loop_fd_add(m->loop, &c->h) < 0) {
		free(c);
		return -ENOMEM;
	}
	c->next = m->clients;
	m->clients = c;
	m->nclients++;
	qmp_conn_init(&c->s, &client_ops, c, m->pretty);
	return 0;
}

static void accept_cb(struct loop_fd *h, uint32_t revents)
{
	struct monitor *m = container_of(h, struct monitor, lh);
	int fd, i;

	(void)revents;
	for (i = 0; i < 16; i++) {
		fd = accept4(h->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return;
		if (m->nclients >= MONITOR_MAX_CLIENTS) {
			log_warn("QMP monitor: %u clients connected already; closing a new one",
				 MONITOR_MAX_CLIENTS);
			close(fd);
		} else if (client_new(m, fd) < 0) {
			close(fd);
		}
	}
}

int monitor_check_fd(int fd, bool *listening)
{
	int type = 0, acc = 0;
	socklen_t len = sizeof(type);
	struct stat st;

	if (fd < 0 || fstat(fd, &st) < 0)
		return -EBADF;
	if (!S_ISSOCK(st.st_mode))
		return -ENOTSOCK;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0 || type != SOCK_STREAM)
		return -EPROTOTYPE;
	len = sizeof(acc);
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) < 0)
		return -errno;
	*listening = acc != 0;
	return 0;
}

/* A socket from the parent: listen on it, or serve it as one client. */
static int start_fd(struct monitor *m, int fd, char *err, size_t errlen)
{
	bool listening;
	int ret = monitor_check_fd(fd, &listening);

	if (ret < 0) {
		snprintf(err, errlen, "File descriptor '%d' is not a stream socket", fd);
		return ret;
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		ret = -errno;
		snprintf(err, errlen, "file descriptor %d: %s", fd, strerror(errno));
		return ret;
	}
	if (!listening) {
		ret = client_new(m, fd);
		if (ret < 0)
			snprintf(err, errlen, "out of memory");
		return ret;
	}
	m->l.fd = fd;
	return 0;
}

int monitor_start(struct loop *main_loop, const struct monitor_config *cfg, struct monitor **out,
		  char *err, size_t errlen)
{
	struct monitor *m = calloc(1, sizeof(*m));
	int ret;

	*out = NULL;
	if (!m || qmp_register_builtin() < 0) {
		free(m);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	m->loop = main_loop;
	m->pretty = cfg->pretty;
	m->l.fd = -1;
	if (cfg->path)
		ret = unix_listen(&m->l, cfg->path, cfg->mode, 16, err, errlen);
	else
		ret = start_fd(m, cfg->fd, err, errlen);
	if (ret == 0 && m->l.fd >= 0) {
		m->lh = (struct loop_fd){.fd = m->l.fd, .events = EPOLLIN, .cb = accept_cb};
		ret = loop_fd_add(main_loop, &m->lh);
		if (ret < 0)
			snprintf(err, errlen, "cannot watch the monitor socket: %s",
				 strerror(-ret));
	}
	if (ret < 0) {
		if (cfg->path)
			unix_listener_close(&m->l);
		free(m);
		return ret;
	}
	*out = m;
	return 0;
}

void monitor_stop_listening(struct monitor *m)
{
	if (!m || m->l.fd < 0)
		return;
	loop_fd_del(m->loop, &m->lh);
	if (m->l.path) {
		unix_listener_close(&m->l);
	} else {
		close(m->l.fd);
		m->l.fd = -1;
	}
}

void monitor_free(struct monitor *m)
{
	struct mon_client *c;

	if (!m)
		return;
	monitor_stop_listening(m);
	while ((c = m->clients)) {
		client_flush(c);
		client_free(c);
	}
	free(m);
}

unsigned monitor_client_count(const struct monitor *m)
{
	return m ? m->nclients : 0;
}
