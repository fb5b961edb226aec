/* epoll backend of the event loop, for where io_uring is unavailable or not
 * wanted. When io_uring works, the loop still owns a ring for the I/O engines;
 * its fd is watched here and its queued SQEs are submitted before each wait.
 * Threading: owned by the loop's thread. */
#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "loop/loop-int.h"
#include "util/log.h"

#define MAX_EVENTS 64

int loop_ring_setup(struct loop *loop, unsigned entries, bool owner_waits);

/* Only wakes the loop: loop_epoll_wait reaps after the fd events, once per
 * round (the per-round budget of loop_reap_cqes). */
static void ring_fd_cb(struct loop_fd *h, uint32_t revents)
{
	(void)h;
	(void)revents;
}

int loop_epoll_init(struct loop *loop)
{
	int ret;

	loop->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (loop->epfd < 0)
		return -errno;
	if (loop_ring_setup(loop, 0, false) < 0)
		return 0; /* no io_uring here: the io_uring engine will refuse */
	loop->ring_h =
		(struct loop_fd){.fd = loop->ring.ring_fd, .events = EPOLLIN, .cb = ring_fd_cb};
	ret = loop_fd_add(loop, &loop->ring_h);
	if (ret < 0) {
		io_uring_queue_exit(&loop->ring);
		loop->have_ring = false;
	}
	return 0;
}

void loop_epoll_fini(struct loop *loop)
{
	if (loop->have_ring) {
		loop_fd_del(loop, &loop->ring_h);
		io_uring_queue_exit(&loop->ring);
		loop->have_ring = false;
	}
	if (loop->epfd >= 0)
		close(loop->epfd);
	loop->epfd = -1;
}

int loop_epoll_fd_arm(struct loop *loop, struct loop_fd *h, bool modify)
{
	struct epoll_event ev = {.events = h->events, .data.u64 = h->gen};

	if (epoll_ctl(loop->epfd, modify ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, h->fd, &ev) < 0)
		return -errno;
	return 0;
}

void loop_epoll_fd_disarm(struct loop *loop, struct loop_fd *h)
{
	if (epoll_ctl(loop->epfd, EPOLL_CTL_DEL, h->fd, NULL) < 0 && errno != EBADF)
		log_debug("loop: epoll_ctl DEL fd %d: %s", h->fd, strerror(errno));
}

static int epoll_wait_ns(struct loop *loop, struct epoll_event *ev, int64_t timeout_ns)
{
	static bool no_pwait2;
	struct timespec ts;
	int ret;

	if (timeout_ns < 0)
		return epoll_wait(loop->epfd, ev, MAX_EVENTS, -1);
	if (!no_pwait2) {
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		ret = epoll_pwait2(loop->epfd, ev, MAX_EVENTS, &ts, NULL);
		if (ret >= 0 || errno != ENOSYS)
			return ret;
		no_pwait2 = true;
	}
	return epoll_wait(loop->epfd, ev, MAX_EVENTS, (int)((timeout_ns + 999999) / 1000000));
}

void loop_epoll_wait(struct loop *loop, int64_t timeout_ns)
{
	struct epoll_event ev[MAX_EVENTS];
	int i, n;

	if (loop->have_ring) {
		if (io_uring_sq_ready(&loop->ring))
			loop_ring_submit(loop);
		if (io_uring_cq_ready(&loop->ring))
			timeout_ns = 0;
	}
	n = epoll_wait_ns(loop, ev, timeout_ns);
	if (n < 0) {
		if (errno != EINTR)
			log_err("loop: epoll_wait: %s", strerror(errno));
		return;
	}
	for (i = 0; i < n; i++)
		loop_dispatch_fd(loop, ev[i].data.u64, ev[i].events);
	if (loop->have_ring)
		loop_reap_cqes(loop);
}
