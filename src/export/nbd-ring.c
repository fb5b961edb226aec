/* An NBD connection's socket I/O in transmission through its loop's
 * io_uring, on loops that wait in it (loop_uring_waits(): the io_uring
 * backend with DEFER_TASKRUN, Linux 6.1 or later). Elsewhere, and in the
 * handshake, the socket is a loop fd handler with recv and sendmsg calls
 * (nbd-conn.c).
 *
 * The receive is one RECV into the input buffer (RECVMSG when a write's
 * payload is pending: into its buffer, then the input buffer), with
 * POLL_FIRST (the next request is as a rule not there yet), armed again
 * after each completion: a request arrives in the loop's wait as a
 * completion that already holds its bytes, where the fd handler took a
 * readiness event there and then a recv call.
 *
 * The round's replies go out as one SENDMSG with MSG_DONTWAIT, queued by
 * the flush hook for the loop's next io_uring_enter, which waits too. With
 * MSG_DONTWAIT a full socket ends it at once (EAGAIN or a short send)
 * instead of leaving it to wait for room, so it always completes within
 * that call, and the wait asks for one completion more
 * (loop_uring_inline_sqe): the send costs no call of its own. With
 * MSG_WAITALL a short send counts as failed, so the NOP linked behind it
 * completes too and ends the wait: the fd handler then waits for EPOLLOUT,
 * as with sendmsg. Where the connection needs the send's completion to go
 * on (input blocked, draining, more output than one send), it is a plain
 * peer SQE, whose completion ends the wait. The queue stays put until the
 * send completes; replies finished meanwhile are appended and go next.
 *
 * rbuf and cur's buffer stay put while the receive runs: input is parsed
 * (and rbuf compacted) only from its completion, or after in_blocked, under
 * which it is not armed; a cur dropped meanwhile waits in cur_held. The
 * receive holds a reference to the connection; closing shuts the socket
 * down so that it ends.
 *
 * The receive may be polled for (loop_uring_peer_poll_sqe: the loop
 * busy-polls before it sleeps, as adaptive polling decides) while the
 * client sends one request at a time and waits for each reply. Where the
 * client runs on another CPU, our sleep and wake-up cost more than polling
 * the gap (on a 2-vCPU virtual machine: about as much CPU time, and half
 * the round trips per second); where it runs on ours, the scheduler's hand
 * over is cheap and polling only adds system calls and holds the client
 * back. Which of the two it is cannot be seen from here, so it is measured:
 * the time from one single-request receive to the next (the client's round
 * trip), RING_RUN of them the way in use, then RING_PROBE the other way;
 * the faster way is kept. A receive that holds several requests (the
 * client does not wait for us) ends polling: polling would take such
 * requests in one at a time, two system calls each.
 *
 * A client that does not wait for each reply (a queue depth above one)
 * still sends its requests one at a time, and a loop quicker than the
 * client takes each alone: a round, its receive and its send per request,
 * which is most of the CPU time a request costs. Such a connection's
 * receive may be held back for RING_HOLD_NS (a timeout linked before it,
 * loop_uring_delay_link()) so that the requests sent meanwhile come in one
 * round and their replies go out in one send (4 KiB reads at depth 64 on
 * a 2-vCPU machine: 2.5 to 3 requests a round instead of about one, half
 * the CPU time per request, and more requests per second, as the client
 * too handles them in batches). A client with few requests in flight waits
 * for those held, so the hold is tried only after a receive held several
 * requests, and kept while it costs no throughput: the rate of requests,
 * RING_HOLD_PROBE of them the other way after each run the way in use
 * (hold_run, from RING_HOLD_RUN, doubling while holding loses).
 *
 * Threading: runs on the connection's loop. */
#include <errno.h>
#include <liburing.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "export/nbd-int.h"
#include "util/compiler.h"

/* Round trips timed the way in use, then the other way (see above). */
#define RING_RUN 112
#define RING_PROBE 16
/* A longer gap is the client pausing, not a round trip. */
#define RING_GAP_MAX_NS 1000000u
/* Holding the receive back (see above): for how long, and the requests
 * received the way in use (at first: the run doubles while holding loses,
 * up to RING_HOLD_RUN_MAX), then the other way. Holding is kept unless
 * its rate of requests is RING_HOLD_SLOWER percent below the other's (it
 * costs fewer rounds). */
#define RING_HOLD_NS 50000
#define RING_HOLD_RUN 1024u
#define RING_HOLD_RUN_MAX (1024u * 64)
#define RING_HOLD_PROBE 128u
#define RING_HOLD_SLOWER 10u

static void ring_recv_done(struct loop_uring_op *op, int res, uint32_t cqe_flags);
static void ring_send_done(struct loop_uring_op *op, int res, uint32_t cqe_flags);

void nbd_ring_start(struct nbd_conn *c)
{
	c->recv_op.cb = ring_recv_done;
	c->send_op.cb = ring_send_done;
	if (!c->tx_iov)
		c->tx_iov = malloc(NBD_SEND_IOV * sizeof(*c->tx_iov));
	c->ring = true;
}

/* The n iovecs gathered hold all of the output. */
static bool ring_gathered_all(const struct nbd_conn *c, int n)
{
	const struct nbd_req *r;
	int k = c->hoff < c->hlen;

	for (r = c->outq; r && k <= n; r = r->next)
		k += r->riovcnt;
	return k == n;
}

/* The loop's wait may go on past the send's completion only while what the
 * connection needs next is a request: it receives, and this send holds all
 * there is to send. Otherwise (input blocked until replies are released,
 * draining, more output queued) the completion itself must end the wait. */
static bool ring_send_may_wait(const struct nbd_conn *c, int n)
{
	return c->state == NBD_CONN_OPEN && c->recv_armed && ring_gathered_all(c, n);
}

bool nbd_ring_send(struct nbd_conn *c)
{
	struct io_uring_sqe *sqe;
	size_t total;
	bool wait_on;
	int n;

	if (c->send_armed || c->state == NBD_CONN_CLOSED || c->out_blocked)
		return true; /* sent when that send completes, or on EPOLLOUT */
	if (!c->tx_iov)
		return false;
	n = nbd_conn_gather(c, c->tx_iov, &total);
	if (!n)
		return true;
	/* MSG_DONTWAIT: a full socket fails the send with EAGAIN instead of
	 * leaving it to wait, so it completes within the submission. */
	wait_on = ring_send_may_wait(c, n);
	sqe = wait_on ? loop_uring_inline_sqe(c->loop, &c->send_op)
		      : loop_uring_peer_sqe(c->loop, &c->send_op);
	if (!sqe)
		return false;
	memset(&c->tx_msg, 0, sizeof(c->tx_msg));
	c->tx_msg.msg_iov = c->tx_iov;
	c->tx_msg.msg_iovlen = (size_t)n;
	/* MSG_WAITALL: a short send counts as failed, so the linked NOP tells
	 * the wait; the CQE still says how much went out. */
	io_uring_prep_sendmsg(sqe, c->fd, &c->tx_msg, MSG_NOSIGNAL | MSG_DONTWAIT | MSG_WAITALL);
	if (wait_on)
		loop_uring_inline_link(c->loop, sqe);
	c->tx_total = total;
	c->send_armed = true;
	nbd_conn_get(c);
	return true;
}

static void ring_send_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct nbd_conn *c = container_of(op, struct nbd_conn, send_op);

	(void)cqe_flags;
	c->send_armed = false;
	/* Replies queued meanwhile, or beyond NBD_SEND_IOV: the flush sends them. */
	if (c->state != NBD_CONN_CLOSED && nbd_conn_sent(c, res, c->tx_total) &&
	    !nbd_conn_out_empty(c))
		nbd_conn_kick(c);
	nbd_conn_set_events(c);
	nbd_conn_put(c);
}

static void ring_arm_recv(struct nbd_conn *c)
{
	struct io_uring_sqe *sqe;
	int cnt = nbd_conn_rx_iov(c, c->rx_iov);

	if (!cnt) {
		nbd_conn_close(c, "input buffer full");
		return;
	}
	/* Not a write's payload: the client sends that without waiting. */
	c->rx_held = false;
	if (c->rx_hold && cnt == 1) {
		c->hold_ts.tv_sec = 0;
		c->hold_ts.tv_nsec = RING_HOLD_NS;
		c->rx_held = loop_uring_delay_link(c->loop, &c->hold_ts);
	}
	sqe = c->rx_poll && !c->rx_held ? loop_uring_peer_poll_sqe(c->loop, &c->recv_op)
					: loop_uring_peer_sqe(c->loop, &c->recv_op);
	if (!sqe) {
		nbd_conn_close(c, "cannot read the socket");
		return;
	}
	memset(&c->rx_msg, 0, sizeof(c->rx_msg));
	c->rx_msg.msg_iov = c->rx_iov;
	c->rx_msg.msg_iovlen = (size_t)cnt;
	/* No write payload pending: one buffer, and RECV spares the kernel
	 * copying in and checking a msghdr and its iovec on every arm. */
	if (cnt == 1)
		io_uring_prep_recv(sqe, c->fd, c->rx_iov[0].iov_base, c->rx_iov[0].iov_len, 0);
	else
		io_uring_prep_recvmsg(sqe, c->fd, &c->rx_msg, 0);
	if (!c->rx_held) /* when held, the requests are there as a rule */
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
		/* A receive still behind its hold is found through that. */
		if (c->rx_held)
			loop_uring_cancel_delay(c->loop, &c->hold_ts);
	}
}

static void ring_phase(struct nbd_conn *c, bool probe)
{
	c->rx_probe = probe;
	c->rx_n = 0;
	c->rx_sum_ns = 0;
}

static void hold_phase(struct nbd_conn *c, bool probe, uint64_t now)
{
	c->hold_probe = probe;
	c->hold_seen = false;
	c->hold_n = 0;
	c->hold_t0 = now;
}

/* The probe is over: keep the way it tried, or go back. */
static void hold_decide(struct nbd_conn *c, uint64_t mean)
{
	bool keep;

	if (c->rx_hold) /* holding: kept unless RING_HOLD_SLOWER % slower */
		keep = mean * 100 <= c->hold_mean_ns * (100 + RING_HOLD_SLOWER);
	else
		keep = mean * (100 + RING_HOLD_SLOWER) < c->hold_mean_ns * 100;
	if (keep)
		c->hold_mean_ns = mean;
	else
		c->rx_hold = !c->rx_hold;
	/* Holding lost: try it again later and later, as it costs throughput. */
	if (!c->rx_hold && c->hold_run < RING_HOLD_RUN_MAX)
		c->hold_run *= 2;
	else if (c->rx_hold)
		c->hold_run = RING_HOLD_RUN;
}

/* n requests came in a receive, gap after the one before: measure the rate
 * of requests and decide whether the next receive is held back. */
static void ring_note_hold(struct nbd_conn *c, unsigned n, uint64_t now, uint64_t gap)
{
	uint64_t mean;

	if (!c->hold_run)
		c->hold_run = RING_HOLD_RUN;
	if (gap > RING_GAP_MAX_NS) { /* the client paused: measure afresh */
		hold_phase(c, c->hold_probe, now);
		return;
	}
	c->hold_seen |= n > 1;
	c->hold_n += n;
	if (c->hold_n < (c->hold_probe ? RING_HOLD_PROBE : c->hold_run))
		return;
	mean = (now - c->hold_t0) / c->hold_n;
	if (c->hold_probe) {
		hold_decide(c, mean);
		hold_phase(c, false, now);
	} else if (c->rx_hold || c->hold_seen) { /* now try the other way */
		c->hold_mean_ns = mean;
		c->rx_hold = !c->rx_hold;
		hold_phase(c, true, now);
	} else { /* one request a receive: nothing to gather */
		hold_phase(c, false, now);
	}
}

/* A receive held n requests (0: only part of one): time the client's round
 * trip and decide whether the next receive is polled for or held back. */
static void ring_note_batch(struct nbd_conn *c, unsigned n)
{
	uint64_t now, gap;
	uint32_t mean;

	if (n == 0)
		return;
	now = loop_now_ns();
	gap = now - c->rx_last_ns;
	c->rx_last_ns = now;
	ring_note_hold(c, n, now, gap);
	if (n > 1 || c->rx_hold) {
		c->rx_poll = false;
		ring_phase(c, false);
		return;
	}
	if (gap > RING_GAP_MAX_NS)
		return;
	c->rx_sum_ns += gap;
	if (++c->rx_n < (c->rx_probe ? RING_PROBE : RING_RUN))
		return;
	mean = (uint32_t)(c->rx_sum_ns / c->rx_n);
	if (!c->rx_probe) { /* now try the other way */
		c->rx_mean_ns = mean;
		c->rx_poll = !c->rx_poll;
		ring_phase(c, true);
		return;
	}
	if (mean < c->rx_mean_ns)
		c->rx_mean_ns = mean; /* the probed way is faster: keep it */
	else
		c->rx_poll = !c->rx_poll;
	ring_phase(c, false);
}

static void ring_recv_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct nbd_conn *c = container_of(op, struct nbd_conn, recv_op);
	unsigned busy = c->busy;

	(void)cqe_flags;
	c->recv_armed = c->recv_cancelled = c->rx_held = false;
	if (c->cur_held) { /* dropped while we were receiving into it */
		nbd_req_release(c->cur_held);
		c->cur_held = NULL;
	}
	if (c->state == NBD_CONN_OPEN) {
		nbd_conn_received(c, c->rx_iov, (int)c->rx_msg.msg_iovlen, res);
		/* Requests are taken while parsing and let go only after their
		 * reply is sent, which is not before this round's flush. */
		if (c->busy > busy)
			ring_note_batch(c, c->busy - busy);
	}
	nbd_conn_put(c);
}

void nbd_ring_close(struct nbd_conn *c)
{
	/* A queued receive or send names the fd: it must reach the kernel while
	 * the number is ours (a closed number may go to another client's
	 * socket), and the send reads the replies before they are dropped. */
	loop_uring_submit(c->loop);
	if (c->recv_armed)
		shutdown(c->fd, SHUT_RDWR);
}
