/* vhost-user-blk: a queue's eventfds. Kicks come in through the loop's
 * io_uring as completions of a multishot poll (or, on older kernels, reads)
 * of the kick eventfd, or through a loop fd handler; calls
 * and errors go out as eventfd writes that never block the iothread, even
 * when the front-end leaves a counter full (see vub_signal).
 *
 * THREADING RULE: a running queue's iothread, except vub_notifiers_init (main
 * thread, queue stopped). */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include "export/vhost-user-blk-int.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/trace.h"

static void vub_kick_done(struct loop_uring_op *op, int res, uint32_t cqe_flags);
static void vub_kick_cancel_done(struct loop_uring_op *op, int res, uint32_t cqe_flags);

static const uint64_t vub_one = 1;

/* Can an eventfd be read without blocking (FMODE_NOWAIT)? Then a read
 * through io_uring waits for a kick as a poll, not in a kernel worker.
 * Asked once. */
static pthread_once_t vub_nowait_once = PTHREAD_ONCE_INIT;

static bool vub_nowait_read;

static void vub_nowait_probe(void)
{
	uint64_t v;
	struct iovec rd = {&v, sizeof(v)};
	int fd = eventfd(0, EFD_CLOEXEC);

	if (fd < 0)
		return;
	vub_nowait_read = preadv2(fd, &rd, 1, -1, RWF_NOWAIT) < 0 && errno == EAGAIN;
	close(fd);
}

static bool vub_kick_ring_ok(struct loop *loop)
{
	if (!loop_uring_waits(loop))
		return false;
	pthread_once(&vub_nowait_once, vub_nowait_probe);
	return vub_nowait_read;
}

/* A non-blocking signal write failed: EAGAIN is a full counter (the
 * front-end has a signal pending anyway). Shared by every queue: such a
 * completion may come after its queue is gone, so it names none. */
static void vub_nowait_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	(void)op;
	(void)cqe_flags;
	if (res < 0 && res != -EAGAIN)
		log_debug("vhost-user-blk: eventfd write: %s", strerror(-res));
}

static struct loop_uring_op vub_nowait_op = {.cb = vub_nowait_done};

/* On an O_NONBLOCK eventfd (as QEMU and cloud-hypervisor make them) the
 * write cannot wait: it rides on the io_uring_enter that waits, completes
 * there, and adds no completion when it succeeds, so that the wait is not
 * cut short by it and nothing stays in flight. RWF_NOWAIT keeps it so should
 * the front-end clear O_NONBLOCK later: the write then fails (its own
 * signals are lost) instead of waiting in the kernel unseen. */
static bool vub_signal_nowait(struct vub_notifier *n)
{
	struct io_uring_sqe *sqe = loop_uring_peer_sqe(n->q->loop, &vub_nowait_op);

	if (!sqe)
		return false;
	io_uring_prep_write(sqe, n->fd, &vub_one, sizeof(vub_one), 0);
	sqe->rw_flags = RWF_NOWAIT;
	sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
	return true;
}

/* No io_uring on this loop: write() at once, which the fd's O_NONBLOCK (set
 * when the fd arrived here, see vub_notifier_prepare) keeps from waiting.
 * -EAGAIN means a full counter: the front-end has a signal pending anyway. */
static void vub_signal_sync(struct vub_notifier *n)
{
	if (write(n->fd, &vub_one, sizeof(vub_one)) < 0 && errno != EAGAIN)
		log_debug("vhost-user-blk: eventfd write: %s", strerror(errno));
}

/* Signal a call or error eventfd. The front-end may have left its counter
 * full, so that a write would wait until it reads: the write goes through
 * the loop's io_uring, where it can wait without holding the thread, and a
 * queue stop cancels it. One write at a time: a signal wanted meanwhile is
 * sent when it completes (eventfd semantics: the front-end only needs to
 * see the counter become non-zero after the used index moved). */
void vub_signal(struct vub_notifier *n)
{
	struct vub_queue *q = n->q;
	struct io_uring_sqe *sqe;

	if (n->fd < 0)
		return;
	if (n->inflight) {
		n->again = true;
		return;
	}
	if (n->nonblock && vub_signal_nowait(n))
		return;
	sqe = loop_uring_peer_sqe(q->loop, &n->op);
	if (!sqe && loop_uring(q->loop)) { /* a full submission queue: next round */
		n->again = true;
		vub_defer_again(q);
		return;
	}
	if (!sqe) {
		vub_signal_sync(n);
		return;
	}
	io_uring_prep_write(sqe, n->fd, &vub_one, sizeof(vub_one), 0);
	n->inflight = true;
	n->write_fd = n->fd;
}

static void vub_cancel(struct vub_notifier *n)
{
	if (!n->inflight || n->cancelling)
		return;
	if (loop_uring_cancel_peer(n->q->loop, &n->op, &n->cancel_op) < 0) {
		vub_defer_again(n->q); /* tries again */
		return;
	}
	n->cancelling = true;
}

/* After a hand-over: tell the main thread once no write uses an old fd. */
void vub_maybe_fds_done(struct vub_queue *q)
{
	if (!q->swapping)
		return;
	if ((q->call.inflight && q->call.write_fd != q->call.fd) ||
	    (q->err.inflight && q->err.write_fd != q->err.fd))
		return;
	q->swapping = false;
	/* Queued writes to an old fd reach the kernel before it may close it. */
	loop_uring_submit(q->loop);
	loop_send(q->exp->main_loop, &q->fds_done_msg);
}

static void vub_signal_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct vub_notifier *n = container_of(op, struct vub_notifier, op);
	struct vub_queue *q = n->q;

	(void)cqe_flags;
	n->inflight = false;
	/* Cancelled: by a stop, sent again at the next start; else by a
	 * hand-over, and the new fd gets it. */
	if ((res == -ECANCELED || res == -EINTR) && q->stopping)
		n->lost = true;
	else if (res == -ECANCELED || res == -EINTR)
		n->again = true;
	else if (res < 0 && res != -EAGAIN)
		log_debug("%s: queue %u: eventfd write: %s", q->exp->name, q->idx, strerror(-res));
	vub_maybe_fds_done(q);
	if (n->again) {
		n->again = false;
		vub_signal(n);
	}
	if (q->stopping)
		loop_request_flush(q->loop, &q->flush); /* cancels it or finishes the stop */
}

static void vub_cancel_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct vub_notifier *n = container_of(op, struct vub_notifier, cancel_op);

	(void)res;
	(void)cqe_flags;
	n->cancelling = false;
	if (n->q->stopping)
		loop_request_flush(n->q->loop, &n->q->flush);
}

bool vub_notifier_busy(const struct vub_notifier *n)
{
	return n->inflight || n->cancelling;
}

/* Cancel the writes that hold up a stop (any) or a hand-over (to an old fd). */
void vub_cancel_writes(struct vub_queue *q)
{
	if (q->call.inflight && (q->stopping || q->call.write_fd != q->call.fd))
		vub_cancel(&q->call);
	if (q->err.inflight && (q->stopping || q->err.write_fd != q->err.fd))
		vub_cancel(&q->err);
	if (q->stopping)
		vub_kick_cancel(q);
}

void vub_signal_retry(struct vub_notifier *n)
{
	if (n->again && !n->inflight) {
		n->again = false;
		vub_signal(n);
	}
}

/* A notifier's fd arrived. With io_uring: may it be written as
 * vub_signal_nowait does? Without, the write is a plain write(): the fd must
 * not block it. O_NONBLOCK is a flag of the file description, which the
 * front-end shares, so it is set only then, where there is no other way to
 * write it. */
void vub_notifier_prepare(struct vub_notifier *n)
{
	struct io_uring *ring = loop_uring(n->q->loop);
	int fl;

	n->nonblock = false;
	if (n->fd < 0)
		return;
	fl = fcntl(n->fd, F_GETFL);
	if (ring) {
		n->nonblock = fl >= 0 && (fl & O_NONBLOCK) && loop_uring_waits(n->q->loop) &&
			      (ring->features & IORING_FEAT_CQE_SKIP);
		return;
	}
	if (fl >= 0 && !(fl & O_NONBLOCK))
		fcntl(n->fd, F_SETFL, fl | O_NONBLOCK);
}

/* Call the driver; the write rides on the io_uring_enter the loop makes
 * anyway (no system call of its own). */
void vub_notify(struct vub_queue *q)
{
	IOPLANE_TRACE(vu_call, q->exp->name, q->idx);
	vub_signal(&q->call);
}

static void vub_kicked(struct vub_queue *q)
{
	IOPLANE_TRACE(vu_kick, q->exp->name, q->idx);
	/* Poll only queues the driver has used: polling hundreds of idle queues
	 * (and spinning while a front-end sets them up) helps nobody. */
	if (!q->poll_on) {
		loop_poll_add(q->loop, &q->poll);
		q->poll_on = true;
	}
	vub_run(q);
}

static void vub_kick_cb(struct loop_fd *h, uint32_t revents)
{
	struct vub_queue *q = container_of(h, struct vub_queue, kick_h);
	uint64_t v;
	struct iovec iov = {&v, sizeof(v)};

	(void)revents;
	/* RWF_NOWAIT: the front-end may read its kick eventfd itself, and a
	 * plain read() would then wait for its next kick. */
	if (preadv2(h->fd, &iov, 1, -1, RWF_NOWAIT) < 0 && errno != EAGAIN)
		log_debug("%s: queue %u: kick read: %s", q->exp->name, q->idx, strerror(errno));
	vub_kicked(q);
}

static bool vub_kick_arm(struct vub_queue *q)
{
	struct io_uring_sqe *sqe = loop_uring_peer_sqe(q->loop, &q->kick.op);

	if (!sqe)
		return false;
	if (q->kick.multishot)
		io_uring_prep_poll_multishot(sqe, q->kick_h.fd, POLLIN);
	else
		io_uring_prep_read(sqe, q->kick_h.fd, &q->kick.val, sizeof(q->kick.val), 0);
	q->kick.armed = true;
	return true;
}

/* May kicks be taken as a multishot poll? IORING_POLL_ADD_MULTI came in 5.13;
 * IORING_FEAT_CQE_SKIP (5.17) is the nearest feature bit that implies it. */
static bool vub_kick_multishot_ok(struct loop *loop)
{
	struct io_uring *ring = loop_uring(loop);

	return ring && loop_uring_waits(loop) && (ring->features & IORING_FEAT_CQE_SKIP);
}

/* Kicks through the ring when this loop can, else the fd handler. */
int vub_kick_start(struct vub_queue *q)
{
	q->kick_h.events = EPOLLIN;
	q->kick_h.cb = vub_kick_cb;
	q->kick.op.cb = vub_kick_done;
	q->kick.cancel_op.cb = vub_kick_cancel_done;
	q->kick.multishot = vub_kick_multishot_ok(q->loop);
	q->kick.ring = (q->kick.multishot || vub_kick_ring_ok(q->loop)) && vub_kick_arm(q);
	return q->kick.ring ? 0 : loop_fd_add(q->loop, &q->kick_h);
}

/* A multishot poll's completion: a kick, unless it is the last one (no
 * IORING_CQE_F_MORE: cancelled, or ended by the kernel, e.g. after a
 * completion queue overflow). */
static void vub_kick_poll_done(struct vub_queue *q, int res, uint32_t cqe_flags)
{
	if (cqe_flags & IORING_CQE_F_MORE) {
		if (q->handlers_on)
			vub_kicked(q);
		else
			vub_kick_cancel(q); /* broken: kicks are ignored from now on */
		return;
	}
	q->kick.armed = false;
	if (!q->handlers_on) {
		loop_request_flush(q->loop, &q->flush); /* may finish a stop */
		return;
	}
	if (res < 0 && res != -ECANCELED)
		log_debug("%s: queue %u: kick poll: %s", q->exp->name, q->idx, strerror(-res));
	/* Armed again; a poll that fails at once, or no SQE: the fd handler. */
	if (res < 0 || !vub_kick_arm(q)) {
		q->kick.ring = false;
		if (loop_fd_add(q->loop, &q->kick_h) < 0) {
			vub_broken(q, -EBADF);
			return;
		}
	}
	vub_kicked(q); /* an ended poll may have lost a kick: look */
}

static void vub_kick_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct vub_queue *q = container_of(op, struct vub_queue, kick.op);

	if (q->kick.multishot) {
		vub_kick_poll_done(q, res, cqe_flags);
		return;
	}
	q->kick.armed = false;
	if (!q->handlers_on) {                          /* stopped or broken: not armed again */
		loop_request_flush(q->loop, &q->flush); /* may finish a stop */
		return;
	}
	if (res < 0 && res != -EAGAIN && res != -EINTR)
		log_debug("%s: queue %u: kick read: %s", q->exp->name, q->idx, strerror(-res));
	/* A read that keeps failing, or no SQE: the fd handler takes over. */
	if ((res < 0 && res != -EAGAIN && res != -EINTR) || !vub_kick_arm(q)) {
		q->kick.ring = false;
		if (loop_fd_add(q->loop, &q->kick_h) < 0) {
			vub_broken(q, -EBADF);
			return;
		}
	}
	vub_kicked(q);
}

static void vub_kick_cancel_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct vub_queue *q = container_of(op, struct vub_queue, kick.cancel_op);

	(void)res;
	(void)cqe_flags;
	q->kick.cancelling = false;
	loop_request_flush(q->loop, &q->flush);
}

void vub_notifier_swap(struct vub_notifier *n, int fd)
{
	if (fd == n->fd)
		return;
	n->fd = fd;
	vub_notifier_prepare(n);
	/* The old fd's write may wait forever (cancelled below); the new fd
	 * gets the signal when it is over. */
	if (n->inflight)
		n->again = true;
}

/* A stop: the kick read in flight (if any) ends before the queue is handed
 * back, since its buffer and completion live in the queue. */
void vub_kick_cancel(struct vub_queue *q)
{
	if (!q->kick.armed || q->kick.cancelling)
		return;
	if (loop_uring_cancel_peer(q->loop, &q->kick.op, &q->kick.cancel_op) < 0) {
		vub_defer_again(q); /* tries again */
		return;
	}
	q->kick.cancelling = true;
}

void vub_notifiers_init(struct vub_queue *q)
{
	q->call = q->err = (struct vub_notifier){.fd = -1, .q = q};
	q->call.op.cb = q->err.op.cb = vub_signal_done;
	q->call.cancel_op.cb = q->err.cancel_op.cb = vub_cancel_done;
}
