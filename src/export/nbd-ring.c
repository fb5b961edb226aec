/* An NBD connection's socket input in transmission through its loop's
 * io_uring, on loops that wait in it (loop_uring_waits(): the io_uring
 * backend with DEFER_TASKRUN, Linux 6.1 or later). Elsewhere, and in the
 * handshake, the socket is a loop fd handler with recv calls (nbd-conn.c).
 *
 * The receive is one RECVMSG into the pending write's buffer and the input
 * buffer, with POLL_FIRST (the next request is as a rule not there yet),
 * armed again after each completion: a request arrives in the loop's wait as
 * a completion that already holds its bytes, where the fd handler took a
 * readiness event there and then a recv call. Replies still go out with
 * sendmsg from the flush hook: sent through the ring, their completion
 * would end the next wait at once (a second io_uring_enter per request),
 * and bounding a wait that holds out for it takes a timeout on every wait,
 * which costs more than the call it saves.
 *
 * rbuf and cur's buffer stay put while the receive runs: input is parsed
 * (and rbuf compacted) only from its completion, or after in_blocked, under
 * which it is not armed; a cur dropped meanwhile waits in cur_held. The
 * receive holds a reference to the connection; closing shuts the socket
 * down so that it ends.
 *
 * Threading: runs on the connection's loop. */
#include <errno.h>
#include <liburing.h>
#include <stddef.h>
#include <string.h>
#include <sys/socket.h>

#include "export/nbd-int.h"
#include "util/compiler.h"

static void ring_recv_done(struct loop_uring_op *op, int res, uint32_t cqe_flags);

void nbd_ring_start(struct nbd_conn *c)
{
	c->recv_op.cb = ring_recv_done;
	c->ring = true;
}

static void ring_arm_recv(struct nbd_conn *c)
{
	struct io_uring_sqe *sqe;
	int cnt = nbd_conn_rx_iov(c, c->rx_iov);

	if (!cnt) {
		nbd_conn_close(c, "input buffer full");
		return;
	}
	sqe = loop_uring_peer_sqe(c->loop, &c->recv_op);
	if (!sqe) {
		nbd_conn_close(c, "cannot read the socket");
		return;
	}
	memset(&c->rx_msg, 0, sizeof(c->rx_msg));
	c->rx_msg.msg_iov = c->rx_iov;
	c->rx_msg.msg_iovlen = (size_t)cnt;
	io_uring_prep_recvmsg(sqe, c->fd, &c->rx_msg, 0);
	sqe->ioprio |= IORING_RECVSEND_POLL_FIRST;
	c->recv_armed = true;
	nbd_conn_get(c);
}

void nbd_ring_update(struct nbd_conn *c)
{
	if (c->state == NBD_CONN_OPEN && !c->in_blocked && !c->recv_armed) {
		ring_arm_recv(c);
	} else if (c->state != NBD_CONN_OPEN && c->recv_armed && !c->recv_cancelled) {
		/* Draining reads no more: end the receive, which may hold a
		 * dropped write's buffer (and so the connection) otherwise. */
		if (loop_uring_cancel_peer(c->loop, &c->recv_op, NULL) == 0)
			c->recv_cancelled = true;
	}
}

static void ring_recv_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct nbd_conn *c = container_of(op, struct nbd_conn, recv_op);

	(void)cqe_flags;
	c->recv_armed = c->recv_cancelled = false;
	if (c->cur_held) { /* dropped while we were receiving into it */
		nbd_req_release(c->cur_held);
		c->cur_held = NULL;
	}
	if (c->state == NBD_CONN_OPEN)
		nbd_conn_received(c, c->rx_iov, (int)c->rx_msg.msg_iovlen, res);
	nbd_conn_put(c);
}

void nbd_ring_close(struct nbd_conn *c)
{
	/* A queued receive names the fd: it must reach the kernel while the
	 * number is ours (a closed number may go to another client's socket). */
	loop_uring_submit(c->loop);
	if (c->recv_armed)
		shutdown(c->fd, SHUT_RDWR);
}
