/* Private parts of the NBD server shared by nbd-server.c (server, listeners,
 * accept), nbd-conn.c (connection lifetime and socket I/O), nbd-handshake.c
 * (option haggling), nbd-transmit.c (transmission: parsing, validation, the
 * request pool, replies) and nbd-cmd.c / nbd-status.c (the commands).
 *
 * Threading: a struct nbd_conn and its requests are owned by conn->loop's
 * thread. struct nbd_server fields are written on the main thread before
 * listening and read-only afterwards, except those marked atomic; a struct
 * nbd_slot's list belongs to that slot's loop thread. */
#ifndef IOPLANE_NBD_INT_H
#define IOPLANE_NBD_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <linux/time_types.h>

#include "util/gnutls-dl.h"

#include "block/block.h"
#include "export/nbd-proto.h"
#include "export/nbd-server.h"
#include "loop/loop.h"
#include "util/log.h"

/* ---- tunables ---------------------------------------------------------- */

#define NBD_RBUF_SIZE (256u << 10)     /* socket input buffer in transmission */
#define NBD_HS_RBUF_SIZE (68u << 10)   /* ... in the handshake (the largest option fits) */
#define NBD_MAX_OPT_DATA (64u << 10)   /* larger options: NBD_REP_ERR_TOO_BIG */
#define NBD_HBUF_HIGH (1u << 20)       /* unsent handshake replies: stop reading */
#define NBD_CONN_MAX_REQS 128          /* requests in flight per connection */
#define NBD_CONN_MAX_BYTES (64u << 20) /* buffer bytes in flight per connection */
#define NBD_KEEP_BUF (1u << 20)        /* larger buffers are freed after use */
#define NBD_CONN_KEEP_BYTES (8u << 20) /* idle buffers a connection keeps, at most */
#define NBD_SEND_IOV 1024              /* iovecs per sendmsg */
#define NBD_HANDSHAKE_NS (30ull * 1000000000ull)
#define NBD_SPARSE_READ_MIN (64u << 10) /* reads this large look for holes first */
#define NBD_READ_EXTENTS 8              /* content chunks per sparse read */
#define NBD_STATUS_EXTENTS 64           /* descriptors per block-status reply */
/* Descriptors per qemu:dirty-bitmap chunk, at most: read from memory, so a
 * reply covers what was asked (a backup client walks the disk in few round
 * trips); 1 MiB on the wire at most, as QEMU sends. */
#define NBD_STATUS_BITMAP_EXTENTS 65536
/* Metadata contexts: bit i of a connection's selection is context id i + 1. */
#define NBD_META_ID_ALLOC 1   /* base:allocation */
#define NBD_META_ID_DEPTH 2   /* qemu:allocation-depth */
#define NBD_META_ID_BITMAP0 3 /* qemu:dirty-bitmap: of the export's first bitmap */
#define NBD_META_ALLOC (1u << 0)
#define NBD_META_DEPTH (1u << 1)
#define NBD_META_BITMAP(i) (1u << (2 + (i)))

/* ---- server ------------------------------------------------------------ */

/* An export. name .. detect_zeroes are immutable. The server's list holds
 * one reference until the export is removed, and so does each connection
 * whose exp or meta_exp points to it; the last put sends gone_msg to the
 * main loop, which frees it (nbd-server.c). */
struct nbd_export {
	struct nbd_export *next; /* protected by srv->exports_lock */
	char *name;
	char *description; /* NULL: none */
	/* Written by the main thread when the node is replaced (under a drain),
	 * read by the connections' threads (nbd_export_node()). */
	struct blk_node *bs;
	bool writable;
	enum nbd_detect_zeroes detect_zeroes;
	struct blk_dirty_bitmap *bitmaps[NBD_MAX_EXPORT_BITMAPS]; /* busy while here */
	unsigned nbitmaps;
	bool alloc_depth;
	struct nbd_server *srv;
	struct loop **loops; /* nbd_export_config's (owned copy of the array) */
	unsigned nloops;
	atomic_uint rr;      /* round-robin over loops, any connection's thread */
	atomic_bool removed; /* nbd_server_export_del ran (before its kill messages) */
	atomic_uint refs;
	struct loop_msg gone_msg;
	void (*gone_cb)(void *opaque); /* main thread: set when it is removed */
	void *gone_opaque;
};

/* The export's node, on a connection's thread. */
static inline struct blk_node *nbd_export_node(const struct nbd_export *e)
{
	return __atomic_load_n(&e->bs, __ATOMIC_RELAXED);
}

struct nbd_conn;

/* Per-loop bookkeeping: the connections living on one loop. */
struct nbd_slot {
	struct nbd_server *srv;
	_Atomic(struct loop *) loop;
	atomic_uint nconns;
	struct nbd_conn *conns; /* owned by the loop's thread */
	struct loop_msg drain_msg, abort_msg;
	atomic_bool drain_pending, abort_pending; /* message queued, not yet run */
};

struct nbd_listener {
	struct nbd_listener *next;
	struct loop_fd h;
	struct nbd_server *srv;
	struct unix_listener *unix_l; /* NULL for TCP; its file is removed on close */
};

/* See nbd-budget.c. */
struct nbd_budget {
	pthread_mutex_t lock;
	uint64_t limit;                /* immutable */
	uint64_t used;                 /* protected by lock: bytes granted */
	uint64_t peak, waits;          /* protected by lock */
	struct nbd_conn *head, **tail; /* protected by lock: waiting, FIFO */
};

/* Reserve need bytes for c's next request: true when granted now; else c is
 * queued and its mem_msg is sent to its loop once they are (c's loop). */
bool nbd_budget_get(struct nbd_budget *b, struct nbd_conn *c, uint64_t need);
/* Give n bytes back and grant waiting connections (any thread). */
void nbd_budget_put(struct nbd_budget *b, uint64_t n);
/* Take c off the queue: false if it was not on it (already granted). */
bool nbd_budget_cancel(struct nbd_budget *b, struct nbd_conn *c);

struct nbd_server {
	struct loop *main_loop;
	struct nbd_budget *budget; /* NULL: no daemon-wide bound */
	struct loop **loops;
	unsigned nloops;
	unsigned max_connections;
	char *tls_creds, *tls_authz; /* object ids; NULL: no TLS, no authz */
	/* Changed by the main thread at any time, read by the connections'
	 * loops in the handshake; both under exports_lock. */
	pthread_mutex_t exports_lock;
	struct nbd_export *exports;
	struct nbd_listener *listeners;
	struct nbd_slot slots[LOOP_MAX_THREADS];

	atomic_uint nconns;
	atomic_uint tls_conns[2]; /* TLS connections by record layer: GnuTLS, kernel */
	atomic_uint pending_msgs; /* drain/abort messages not yet run by their loop */
	atomic_bool draining;
	atomic_bool drained_sent;
	struct loop_msg drained_msg; /* to main_loop when the last one closes */
	void (*drained_cb)(void *opaque);
	void *drained_opaque;
	uint64_t accepted, refused; /* main thread */
};

/* The export a client names, with a reference the caller gives back with
 * nbd_export_put() (any thread); NULL: none. */
struct nbd_export *nbd_export_find(struct nbd_server *s, const char *name, size_t len);
void nbd_export_put(struct nbd_export *e);
/* Hold the export list still while walking srv->exports (NBD_OPT_LIST). */
void nbd_exports_lock(struct nbd_server *s);
void nbd_exports_unlock(struct nbd_server *s);
/* The loop a connection that chose e should run on; NULL: where it is. */
struct loop *nbd_export_pick_loop(struct nbd_export *e, struct loop *cur);
/* Transmission flags of an export for a connection with these options. */
uint16_t nbd_export_tflags(const struct nbd_export *e, bool structured);
/* Called by a connection when it is freed (its thread). */
void nbd_server_conn_gone(struct nbd_server *s, struct nbd_slot *slot);

/* ---- requests ---------------------------------------------------------- */

#define NBD_REQ_IOV (2 * NBD_READ_EXTENTS + 2)
#define NBD_REQ_HDR (NBD_READ_EXTENTS * 48)

struct nbd_extent {
	uint64_t len;
	uint32_t flags; /* NBD_STATE_* */
};

struct nbd_req {
	struct blk_request blk; /* blk.opaque = this */
	struct nbd_conn *conn;
	struct nbd_req *next;     /* reply queue */
	struct nbd_req *all_next; /* every request of the connection */

	uint64_t cookie, offset, len; /* len: effect or payload length */
	uint16_t type, flags;
	uint32_t error;  /* NBD_E*, 0: success */
	uint64_t mem;    /* bytes of the daemon-wide budget held until released */
	const char *msg; /* error message for structured replies (static) */
	uint8_t stage;   /* step of a command of several (READ's scan, TRIM + FUA) */
	bool internal;   /* the flush of a connection whose client left: no reply */

	void *buf;
	size_t buf_cap;
	struct iovec data_iov;
	uint64_t acct;  /* bytes counted in conn->busy_bytes */
	uint64_t done;  /* bytes covered so far (status scans) */
	unsigned nexts; /* extents used */
	unsigned scans; /* block-status queries made */
	unsigned bmcap; /* room of each qemu:dirty-bitmap area, in extents */
	/* BLOCK_STATUS of qemu:allocation-depth (nbd-status.c): the layer
	 * being asked about [offset + ddone, ...) and its depth (1: the top). */
	uint64_t ddone;
	unsigned dnexts;
	struct blk_node *dnode;
	uint32_t ddepth;
	struct nbd_extent ext[NBD_READ_EXTENTS];

	/* The reply, built when the request finishes. */
	struct iovec riov[NBD_REQ_IOV];
	int riovcnt;
	uint8_t hdr[NBD_REQ_HDR];
};

/* ---- connections ------------------------------------------------------- */

/* A connection's states, all in one place (docs/nbd.md draws the protocol
 * side of them):
 *
 *   phase   CLIENT_FLAGS --4 bytes--> OPTIONS --EXPORT_NAME/GO--> TRANSMISSION
 *           (nbd-handshake.c; 30 s deadline: c->timer)       (nbd-transmit.c)
 *                      OPTIONS --STARTTLS--> TLS --handshake--> OPTIONS
 *                      (nbd-tls.c: the deadline covers the TLS handshake)
 *
 *   state   OPEN --NBD_CMD_DISC, EOF, server drain (transmission)--> DRAIN
 *           OPEN, DRAIN --protocol violation, socket error, drain before
 *                         transmission, DRAIN with nothing left--> CLOSED
 *
 *   OPEN: reading and writing. DRAIN: nothing more is read (the payload of
 *   a half-received write is dropped with it); requests in flight are
 *   answered, the last answer sent closes (conn_idle, after a flush if
 *   writes were made). CLOSED: the socket is closed; requests in flight
 *   complete and their replies are dropped; the connection is freed with its
 *   last reference.
 *
 *   Reading pauses, while OPEN, when in_blocked (no free request, too many
 *   bytes in flight, or a handshake reply backlog over NBD_HBUF_HIGH; a
 *   finished request or a send lifts it) or mem_waiting (the daemon-wide budget has
 *   not granted the next request's memory; the grant message lifts it), and
 *   writing pauses when out_blocked (the socket is full: EPOLLOUT lifts
 *   it). In transmission with c->ring, recv_armed says a receive is in the
 *   kernel (nbd-ring.c). */
enum nbd_phase {
	NBD_PHASE_CLIENT_FLAGS = 0,
	NBD_PHASE_OPTIONS,
	NBD_PHASE_TLS, /* STARTTLS acknowledged: the TLS handshake (nbd-tls.c) */
	NBD_PHASE_TRANSMISSION,
};

enum nbd_conn_state {
	NBD_CONN_OPEN = 0, /* reading and writing */
	NBD_CONN_DRAIN,    /* no more reading; close when every request is answered */
	NBD_CONN_CLOSED,   /* socket closed; requests still in flight are dropped */
};

struct nbd_conn {
	struct nbd_server *srv;
	struct nbd_slot *slot;
	struct nbd_conn *next, **pprev; /* slot->conns */
	struct loop *loop;
	int fd;
	unsigned refs; /* 1 while the socket is open + 1 per request taken */
	enum nbd_conn_state state;
	enum nbd_phase phase;

	struct loop_fd fdh;
	uint32_t events;  /* what fdh is armed for (0: not registered) */
	bool in_blocked;  /* input paused: out of requests or reply backlog */
	bool out_blocked; /* socket full: waiting for EPOLLOUT */
	bool in_parse;    /* re-entrance guard for nbd_conn_parse */
	bool mem_waiting; /* input paused until the budget grants mem_need */
	struct loop_flush flush;
	struct loop_timer timer; /* handshake deadline */

	/* Input: bytes [rpos, rend) of rbuf are received and not yet parsed. */
	uint8_t *rbuf;
	size_t rpos, rend, rcap;
	struct nbd_req *cur; /* write whose payload is being received */
	uint64_t cur_have;
	uint64_t skip; /* bytes to read and drop: option data, refused payload */

	/* Daemon-wide request memory (srv->budget). mem_grant: bytes granted
	 * for the request header at rpos, not yet taken. mem_queued, mem_next,
	 * mem_need: protected by the budget's lock. */
	uint64_t mem_grant, mem_need;
	bool mem_queued;
	struct nbd_conn *mem_next;
	struct loop_msg mem_msg; /* the grant; holds a reference while pending */

	/* Output: handshake bytes [hoff, hlen) of hbuf, then the reply queue. */
	uint8_t *hbuf;
	size_t hoff, hlen, hcap;
	struct nbd_req *outq, **outq_tail;

	/* Negotiated in the handshake. */
	bool no_zeroes, structured, extended;
	uint32_t meta;               /* contexts selected (NBD_META_*) ... */
	struct nbd_export *meta_exp; /* ... for this export */
	struct nbd_export *exp;      /* transmission: the export */
	uint16_t tflags;
	/* The export's loop, when not this one: the connection stops reading
	 * and moves there at the end of the round (nbd-conn.c, conn_move). */
	struct loop *move_to;
	struct loop_msg move_msg;

	/* Socket input through the loop's io_uring (nbd-ring.c), in
	 * transmission on a loop where loop_uring_waits(): the fd handler then
	 * only waits for room to send. At most one receive is in flight
	 * (recv_armed), into rbuf and cur's buffer, which therefore do not move
	 * or go while it runs; it holds a reference. */
	bool ring;
	bool recv_armed, recv_cancelled;
	struct nbd_req *cur_held; /* a dropped cur whose buffer the receive still uses */
	/* Whether the receive is polled for (loop_uring_peer_poll_sqe), chosen
	 * by nbd-ring.c from the client's round trips measured both ways:
	 * rx_last_ns is when the last receive completed, rx_sum_ns and rx_n
	 * sum the round trips of the current phase (a probe of the other way
	 * while rx_probe), rx_mean_ns is the mean of the way in use. */
	bool rx_poll, rx_probe;
	uint8_t rx_n;
	uint32_t rx_mean_ns;
	uint64_t rx_last_ns, rx_sum_ns;
	/* Whether the receive is held back by RING_HOLD_NS first (rx_hold),
	 * so that a pipelining client's requests gather and go in one round,
	 * chosen by nbd-ring.c from the rate of requests measured both ways:
	 * hold_n requests since hold_t0 in the current phase (a probe of the
	 * other way while hold_probe), hold_mean_ns per request the way in
	 * use; hold_seen: a receive of this phase held several requests;
	 * hold_run: the run phase's length (grows while holding loses).
	 * rx_held: the receive in flight waits behind hold_ts. */
	bool rx_hold, rx_held, hold_probe, hold_seen;
	uint32_t hold_n, hold_run;
	uint64_t hold_t0, hold_mean_ns;
	struct __kernel_timespec hold_ts;
	struct loop_uring_op recv_op;
	struct msghdr rx_msg;
	struct iovec rx_iov[2];
	/* Replies go out as one SENDMSG with MSG_DONTWAIT in the io_uring_enter
	 * that waits (loop_uring_inline_sqe); at most one at a time (send_armed,
	 * holding a reference), over tx_iov (NBD_SEND_IOV entries, NULL: sendmsg
	 * calls instead). The queue it covers is consumed when it completes. */
	bool send_armed;
	struct loop_uring_op send_op;
	struct msghdr tx_msg;
	struct iovec *tx_iov;
	size_t tx_total;

	/* TLS (nbd-tls.c). tls: the session from STARTTLS on; tls_on once its
	 * handshake succeeded: every byte then goes through it (never the
	 * ring). Output is copied into tls_obuf, bytes [tls_ooff, tls_olen) not
	 * yet taken by GnuTLS (large pieces go from the queue itself); tls_again:
	 * a record send must be called again. */
	gnutls_session_t tls;
	struct tls_creds *tls_creds;
	bool tls_on, tls_again, tls_reading;
	bool tls_direct;   /* the record in GnuTLS is queue bytes, not tls_obuf's */
	bool tls_refused;  /* an option got NBD_REP_ERR_TLS_REQD (logged once) */
	int tls_layer;     /* -1, or the srv->tls_conns counter it holds */
	uint32_t tls_want; /* handshake: EPOLLIN or EPOLLOUT */
	uint8_t *tls_obuf;
	size_t tls_ooff, tls_olen;
	/* After the handshake GnuTLS reads and writes through these: received
	 * ciphertext [tls_ipos, tls_iend) of tls_ibuf, and records made
	 * [tls_coff, tls_clen) of tls_cbuf not yet sent, so that one recv and
	 * one send carry many records. */
	uint8_t *tls_ibuf, *tls_cbuf;
	size_t tls_ipos, tls_iend, tls_coff, tls_clen;
	bool tls_eof; /* the socket's input ended (GnuTLS is told "try again") */
	/* Replies held for the next round (nbd-tls.c, tls_hold): tls_hold is
	 * queued, holding a reference; tls_holds rounds in a row so far. */
	struct loop_defer tls_hold;
	bool tls_hold_queued;
	unsigned tls_holds;
	/* Replies lingering for the client's next requests (nbd-tls.c,
	 * tls_linger): tls_linger is armed, holding a reference, since
	 * nrequests was tls_linger_from; tls_lingered: it ran out, send now;
	 * tls_linger_skip sends go out without one after a linger too few
	 * requests came in, tls_linger_backoff the next such count. */
	struct loop_timer tls_linger;
	uint64_t tls_linger_from;
	bool tls_lingered;
	unsigned tls_linger_skip, tls_linger_backoff;
	char peer[64]; /* the client's address, for the log */

	/* Transmission. */
	struct nbd_req *all_reqs, **free_reqs;
	unsigned nreqs, nfree;
	unsigned busy;       /* requests taken, not yet answered */
	uint64_t busy_bytes; /* their buffer bytes */
	uint64_t kept_bytes; /* buffers kept by idle requests of the pool */
	bool dirty;          /* a write finished since the last flush */
	uint64_t nrequests;
	struct log_errors io_errors; /* block-layer errors (util/log.h) */
};

/* nbd-conn.c */
int nbd_conn_new(struct nbd_server *s, struct nbd_slot *slot, struct loop *loop, int fd);
/* Entering transmission: the input buffer grows to NBD_RBUF_SIZE, and the
 * socket input moves to the loop's io_uring where it can (nbd-ring.c). */
int nbd_conn_enter_transmission(struct nbd_conn *c);
void nbd_conn_get(struct nbd_conn *c);
void nbd_conn_put(struct nbd_conn *c);
/* Stop reading; close once every request has been answered. */
void nbd_conn_drain(struct nbd_conn *c);
/* Close the socket now; requests in flight finish without replies. */
void nbd_conn_close(struct nbd_conn *c, const char *why);
int nbd_conn_hbuf_append(struct nbd_conn *c, const void *p, size_t len);
/* Queue a finished request's reply (riov) and schedule the round's send. */
void nbd_conn_queue_reply(struct nbd_conn *c, struct nbd_req *r);
void nbd_conn_kick(struct nbd_conn *c); /* schedule a send of hbuf */
/* Input may continue (requests or output space became free). */
void nbd_conn_unblock(struct nbd_conn *c);
/* A request was released (c->busy went down). */
void nbd_conn_request_done(struct nbd_conn *c);
void nbd_conn_parse(struct nbd_conn *c);
/* Drop buffered input bytes that c->skip says are unwanted (an option's data
 * refused in the handshake, a refused write's payload in transmission): true
 * once none are left to drop, false while more must arrive. */
bool nbd_conn_skip_input(struct nbd_conn *c);

/* What the socket may receive into next: the rest of cur's buffer, then
 * rbuf's free end (returns the count; 0: rbuf is full, which cannot happen).
 * A receive into it ended with n bytes, 0 (the client closed its side) or
 * -errno; the input is parsed. */
int nbd_conn_rx_iov(struct nbd_conn *c, struct iovec *iov);
void nbd_conn_received(struct nbd_conn *c, const struct iovec *iov, int cnt, ssize_t n);

/* Arm the socket for what the connection waits for now. */
void nbd_conn_set_events(struct nbd_conn *c);
/* The output queued (hbuf, then replies) as an iovec of at most NBD_SEND_IOV
 * entries, and taking n bytes of it as sent. */
int nbd_conn_gather(struct nbd_conn *c, struct iovec *iov, size_t *total);
void nbd_conn_consume(struct nbd_conn *c, size_t n);
/* A send of total bytes of it ended with res (bytes, or -errno): consume
 * them. False when the connection closed or must wait for room. */
bool nbd_conn_sent(struct nbd_conn *c, ssize_t res, size_t total);
/* Nothing is left to send. */
bool nbd_conn_out_empty(const struct nbd_conn *c);

/* nbd-tls.c. STARTTLS was acknowledged (the ACK is in hbuf): set up the
 * session; the handshake runs once the ACK is sent. 0 or -errno (close). */
int nbd_tls_start(struct nbd_conn *c);
/* Drive the handshake (from the fd handler and the flush hook). */
void nbd_tls_handshake(struct nbd_conn *c);
/* After the handshake, the record layer: read what is there (socket and
 * GnuTLS's buffer) into the input, and send what is queued. */
void nbd_tls_read(struct nbd_conn *c);
void nbd_tls_send(struct nbd_conn *c);
/* Input GnuTLS holds that no socket event will announce. */
bool nbd_tls_pending(const struct nbd_conn *c);
/* The socket is about to close: when everything was sent, tell the client
 * with a TLS close_notify (best effort, never waits). */
void nbd_tls_bye(struct nbd_conn *c);
/* The socket closes: replies lingering are dropped with it. */
void nbd_tls_linger_stop(struct nbd_conn *c);
/* The connection is freed: end the session. */
void nbd_tls_end(struct nbd_conn *c);

/* nbd-ring.c */
void nbd_ring_start(struct nbd_conn *c);
/* conn_set_events' part for the ring: receive while input is wanted, cancel
 * the receive when draining. */
void nbd_ring_update(struct nbd_conn *c);
/* Queue the output for the loop's next io_uring_enter, unless one send is
 * queued already. False when it cannot (no SQE): send it yourself. */
bool nbd_ring_send(struct nbd_conn *c);
/* Before the socket is closed: a queued receive goes to the kernel, and one
 * in flight ends (shutdown), completing with its reference. */
void nbd_ring_close(struct nbd_conn *c);

/* nbd-handshake.c: consume options from rbuf. Returns 0, or -errno when the
 * connection must be closed. */
int nbd_handshake_start(struct nbd_conn *c);
int nbd_handshake_input(struct nbd_conn *c);

/* nbd-transmit.c: consume requests from rbuf; same return convention. */
int nbd_transmit_input(struct nbd_conn *c);
struct nbd_req *nbd_req_take(struct nbd_conn *c);
void nbd_req_release(struct nbd_req *r);
void nbd_req_free_all(struct nbd_conn *c);
/* Finish a request: build its reply and queue it (or drop it if closed). */
void nbd_req_finish(struct nbd_req *r);
void nbd_req_fail(struct nbd_req *r, uint32_t err, const char *msg);
/* A block-layer error: log it (the first few per connection) and fail. */
void nbd_req_io_failed(struct nbd_req *r, int ret);
int nbd_req_buf(struct nbd_req *r, size_t len);
uint32_t nbd_errno_to_nbd(int err);
int nbd_req_submit(struct nbd_req *r, uint8_t op, uint32_t flags, uint64_t off, uint64_t len);

/* Append one entry to the request's reply iovec. */
void nbd_req_add_iov(struct nbd_req *r, void *base, size_t len);

/* ---- commands (nbd-cmd.c; BLOCK_STATUS in nbd-status.c) ----------------
 * One entry per command type, NULL for unknown types (and NBD_CMD_DISC,
 * which ends the input instead of becoming a request):
 *   start     the request is valid (a write's payload is in r->buf): submit
 *             it to the block layer, or finish or fail it;
 *   blk_done  one of its block-layer requests completed (0 or -errno); a
 *             command of several steps keeps its step in r->stage;
 *   reply     build the success reply in r->riov (errors have one builder
 *             for every command, in nbd-transmit.c).
 * Every path ends in nbd_req_finish() or nbd_req_fail() exactly once. */
#define NBD_CMD_COUNT (NBD_CMD_BLOCK_STATUS + 1)
#define NBD_MAX_SCANS 256 /* block-status queries one request may make */

struct nbd_cmd {
	void (*start)(struct nbd_req *r);
	void (*blk_done)(struct nbd_req *r, int ret);
	void (*reply)(struct nbd_req *r);
	bool write; /* changes the image: refused on a read-only export */
};

extern const struct nbd_cmd nbd_cmds[NBD_CMD_COUNT];
/* The next block-status query of a READ scan or a BLOCK_STATUS request:
 * from r->offset + r->done to the end of the request. */
int nbd_req_scan_next(struct nbd_req *r);
/* nbd_req_submit() to another node (a backing layer of the export's). */
int nbd_req_submit_to(struct nbd_req *r, struct blk_node *bs, uint8_t op, uint32_t flags,
		      uint64_t off, uint64_t len);
void nbd_status_start(struct nbd_req *r);
void nbd_status_blk_done(struct nbd_req *r, int ret);
void nbd_status_reply(struct nbd_req *r);
/* Reply headers (structured or extended as negotiated; simple). */
size_t nbd_put_chunk_hdr(struct nbd_req *r, uint8_t *p, uint16_t flags, uint16_t type,
			 uint64_t len);
size_t nbd_put_simple_hdr(struct nbd_req *r, uint8_t *p, uint32_t err);

/* Big-endian stores/loads on unaligned bytes. */
static inline void nbd_put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}
static inline void nbd_put32(uint8_t *p, uint32_t v)
{
	nbd_put16(p, (uint16_t)(v >> 16));
	nbd_put16(p + 2, (uint16_t)v);
}
static inline void nbd_put64(uint8_t *p, uint64_t v)
{
	nbd_put32(p, (uint32_t)(v >> 32));
	nbd_put32(p + 4, (uint32_t)v);
}
static inline uint16_t nbd_get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}
static inline uint32_t nbd_get32(const uint8_t *p)
{
	return (uint32_t)nbd_get16(p) << 16 | nbd_get16(p + 2);
}
static inline uint64_t nbd_get64(const uint8_t *p)
{
	return (uint64_t)nbd_get32(p) << 32 | nbd_get32(p + 4);
}

#endif
