/* NBD transmission phase: request parsing and validation, the request pool,
 * submission to the block layer, and the reply headers (simple, structured or
 * extended) and error replies. What each command does is its entry in the
 * command table (nbd-cmd.c).
 *
 * Requests are parsed straight out of the connection's input buffer, as many
 * as it holds, and submitted as they are parsed: everything received in one
 * loop round reaches the block layer in that round and its engine submits it
 * as one batch. Each request comes from a per-connection pool with its own
 * buffer, kept between uses (no allocation per request once warm).
 *
 * Validation (docs/nbd.md lists each rule with its spec clause): bad magic
 * and oversized payloads end the connection; everything else gets an error
 * reply, with the payload of a refused write read and dropped so the stream
 * stays in sync.
 *
 * Threading: runs on the connection's loop. */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "export/nbd-int.h"
#include "util/log.h"
#include "util/trace.h"

/* ---- request pool ------------------------------------------------------- */

static bool can_take(const struct nbd_conn *c)
{
	return (c->nfree || c->nreqs < NBD_CONN_MAX_REQS) && c->busy_bytes < NBD_CONN_MAX_BYTES;
}

struct nbd_req *nbd_req_take(struct nbd_conn *c)
{
	struct nbd_req *r;

	if (c->nfree) {
		r = c->free_reqs[--c->nfree];
		c->kept_bytes -= r->buf_cap;
	} else {
		if (c->nreqs >= NBD_CONN_MAX_REQS)
			return NULL;
		if (!c->free_reqs) {
			c->free_reqs = malloc(sizeof(*c->free_reqs) * NBD_CONN_MAX_REQS);
			if (!c->free_reqs)
				return NULL;
		}
		r = calloc(1, sizeof(*r));
		if (!r)
			return NULL;
		r->conn = c;
		r->all_next = c->all_reqs;
		c->all_reqs = r;
		c->nreqs++;
	}
	r->error = 0;
	r->msg = NULL;
	r->stage = 0;
	r->internal = false;
	r->flags = 0;
	r->len = 0;
	r->acct = 0;
	r->mem = 0;
	c->busy++;
	nbd_conn_get(c);
	return r;
}

void nbd_req_release(struct nbd_req *r)
{
	struct nbd_conn *c = r->conn;

	/* Idle buffers are not in the daemon-wide budget: keep only small ones,
	 * and only so many per connection. */
	if (r->buf_cap > NBD_KEEP_BUF || c->kept_bytes + r->buf_cap > NBD_CONN_KEEP_BYTES) {
		free(r->buf);
		r->buf = NULL;
		r->buf_cap = 0;
	}
	c->kept_bytes += r->buf_cap;
	if (r->mem) {
		nbd_budget_put(c->srv->budget, r->mem);
		r->mem = 0;
	}
	c->busy_bytes -= r->acct;
	c->free_reqs[c->nfree++] = r;
	c->busy--;
	nbd_conn_request_done(c);
	nbd_conn_put(c);
}

void nbd_req_free_all(struct nbd_conn *c)
{
	struct nbd_req *r;

	while ((r = c->all_reqs)) {
		c->all_reqs = r->all_next;
		free(r->buf);
		free(r);
	}
	free(c->free_reqs);
	c->free_reqs = NULL;
	c->nfree = c->nreqs = 0;
}

/* Give the request a buffer of at least len bytes (aligned for the node). */
int nbd_req_buf(struct nbd_req *r, size_t len)
{
	struct nbd_conn *c = r->conn;

	if (r->buf_cap < len) {
		size_t cap = (len + 4095) & ~(size_t)4095;

		free(r->buf);
		r->buf_cap = 0;
		r->buf = blk_alloc_buf(nbd_export_node(c->exp), cap);
		if (!r->buf)
			return -ENOMEM;
		r->buf_cap = cap;
	}
	r->acct = len;
	c->busy_bytes += len;
	r->data_iov.iov_base = r->buf;
	r->data_iov.iov_len = len;
	return 0;
}

/* ---- replies ------------------------------------------------------------ */

uint32_t nbd_errno_to_nbd(int err)
{
	switch (err < 0 ? -err : err) {
	case EPERM:
	case EROFS:
		return NBD_EPERM;
	case ENOMEM:
		return NBD_ENOMEM;
	case EINVAL:
		return NBD_EINVAL;
	case ENOSPC:
	case EDQUOT:
	case EFBIG:
		return NBD_ENOSPC;
	case EOVERFLOW:
		return NBD_EOVERFLOW;
	case ENOTSUP:
		return NBD_ENOTSUP;
	case ESHUTDOWN:
		return NBD_ESHUTDOWN;
	default:
		return NBD_EIO;
	}
}

size_t nbd_put_chunk_hdr(struct nbd_req *r, uint8_t *p, uint16_t flags, uint16_t type, uint64_t len)
{
	IOPLANE_TRACE(nbd_reply, r->conn->exp->name, r->cookie, r->error, type, flags & 1);
	if (r->conn->extended) {
		nbd_put32(p, NBD_EXTENDED_REPLY_MAGIC);
		nbd_put16(p + 4, flags);
		nbd_put16(p + 6, type);
		nbd_put64(p + 8, r->cookie);
		nbd_put64(p + 16, r->offset); /* spec: MUST match the request */
		nbd_put64(p + 24, len);
		return sizeof(struct nbd_extended_reply);
	}
	nbd_put32(p, NBD_STRUCTURED_REPLY_MAGIC);
	nbd_put16(p + 4, flags);
	nbd_put16(p + 6, type);
	nbd_put64(p + 8, r->cookie);
	nbd_put32(p + 16, (uint32_t)len);
	return sizeof(struct nbd_structured_reply);
}

size_t nbd_put_simple_hdr(struct nbd_req *r, uint8_t *p, uint32_t err)
{
	IOPLANE_TRACE(nbd_reply, r->conn->exp->name, r->cookie, err, 0, 1);
	nbd_put32(p, NBD_SIMPLE_REPLY_MAGIC);
	nbd_put32(p + 4, err);
	nbd_put64(p + 8, r->cookie);
	return sizeof(struct nbd_simple_reply);
}

void nbd_req_add_iov(struct nbd_req *r, void *base, size_t len)
{
	r->riov[r->riovcnt].iov_base = base;
	r->riov[r->riovcnt++].iov_len = len;
}

/* An error: a simple reply, or an NBD_REPLY_TYPE_ERROR chunk with a message
 * once structured replies are on (which the spec prefers, and requires for
 * NBD_CMD_READ). */
static void build_error_reply(struct nbd_req *r)
{
	struct nbd_conn *c = r->conn;
	size_t mlen = r->msg ? strlen(r->msg) : 0, n;

	if (!c->structured && !c->extended) {
		nbd_req_add_iov(r, r->hdr, nbd_put_simple_hdr(r, r->hdr, r->error));
		return;
	}
	n = nbd_put_chunk_hdr(r, r->hdr, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_ERROR, 6 + mlen);
	nbd_put32(r->hdr + n, r->error);
	nbd_put16(r->hdr + n + 4, (uint16_t)mlen);
	nbd_req_add_iov(r, r->hdr, n + 6);
	if (mlen)
		nbd_req_add_iov(r, (void *)r->msg, mlen);
}

void nbd_req_finish(struct nbd_req *r)
{
	struct nbd_conn *c = r->conn;

	if (r->internal || c->state == NBD_CONN_CLOSED) {
		nbd_req_release(r);
		return;
	}
	r->riovcnt = 0;
	if (r->error)
		build_error_reply(r);
	else
		nbd_cmds[r->type].reply(r);
	nbd_conn_queue_reply(c, r);
}

void nbd_req_fail(struct nbd_req *r, uint32_t err, const char *msg)
{
	r->error = err;
	r->msg = msg;
	nbd_req_finish(r);
}

/* ---- block layer -------------------------------------------------------- */

void nbd_req_io_failed(struct nbd_req *r, int ret)
{
	struct nbd_conn *c = r->conn;

	/* FAST_ZERO's -ENOTSUP is an answer, not a failure. */
	if (!(ret == -ENOTSUP && (r->flags & NBD_CMD_FLAG_FAST_ZERO)) &&
	    log_errors_take(&c->io_errors))
		log_warn("nbd: export '%s': %s at offset %llu, length %llu failed: %s",
			 c->exp->name, blk_op_name((enum blk_op)r->blk.op),
			 (unsigned long long)r->blk.offset, (unsigned long long)r->blk.len,
			 strerror(-ret));
	nbd_req_fail(r, nbd_errno_to_nbd(ret), NULL);
}

static void req_blk_cb(struct blk_request *blk, int ret)
{
	struct nbd_req *r = blk->opaque;

	nbd_cmds[r->type].blk_done(r, ret);
}

int nbd_req_submit(struct nbd_req *r, uint8_t op, uint32_t flags, uint64_t off, uint64_t len)
{
	return nbd_req_submit_to(r, nbd_export_node(r->conn->exp), op, flags, off, len);
}

int nbd_req_submit_to(struct nbd_req *r, struct blk_node *bs, uint8_t op, uint32_t flags,
		      uint64_t off, uint64_t len)
{
	struct blk_request *b = &r->blk;

	memset(b, 0, offsetof(struct blk_request, drv));
	b->op = op;
	b->flags = flags;
	b->offset = off;
	b->len = len;
	if (op == BLK_OP_READ || op == BLK_OP_WRITE) {
		b->iov = &r->data_iov;
		b->iovcnt = 1;
	}
	b->cb = req_blk_cb;
	b->opaque = r;
	if (op == BLK_OP_FLUSH)
		r->conn->dirty = false;
	return blk_submit(bs, b);
}

/* ---- parsing and validation --------------------------------------------- */

static uint16_t allowed_flags(const struct nbd_conn *c, uint16_t type)
{
	uint16_t f = NBD_CMD_FLAG_FUA; /* spec: accepted on every command */

	switch (type) {
	case NBD_CMD_READ:
		return f | (c->tflags & NBD_FLAG_SEND_DF ? NBD_CMD_FLAG_DF : 0);
	case NBD_CMD_WRITE:
		return f | (c->extended ? NBD_CMD_FLAG_PAYLOAD_LEN : 0);
	case NBD_CMD_WRITE_ZEROES:
		return f | NBD_CMD_FLAG_NO_HOLE |
		       (c->tflags & NBD_FLAG_SEND_FAST_ZERO ? NBD_CMD_FLAG_FAST_ZERO : 0);
	case NBD_CMD_BLOCK_STATUS:
		return f | NBD_CMD_FLAG_REQ_ONE;
	default:
		return f;
	}
}

static bool known_command(uint16_t type)
{
	return type < NBD_CMD_COUNT && nbd_cmds[type].start;
}

static uint32_t refuse(const char **msg, const char *why, uint32_t err)
{
	*msg = why;
	return err;
}

/* Returns the NBD error for a request that must be refused, or 0. */
static uint32_t validate(struct nbd_conn *c, struct nbd_req *r, const char **msg)
{
	uint64_t size = blk_size(nbd_export_node(c->exp));
	bool sr = c->structured || c->extended;

	*msg = NULL;
	if (!known_command(r->type))
		return refuse(msg, "unknown command", NBD_EINVAL);
	if (r->flags & ~allowed_flags(c, r->type))
		return refuse(msg, "flag not valid for this command", NBD_EINVAL);
	if (c->extended && r->type == NBD_CMD_WRITE && !(r->flags & NBD_CMD_FLAG_PAYLOAD_LEN))
		return refuse(msg, "write without NBD_CMD_FLAG_PAYLOAD_LEN", NBD_EINVAL);
	if (nbd_cmds[r->type].write && !c->exp->writable)
		return refuse(msg, "export is read-only", NBD_EPERM);
	/* FLUSH's offset and length are reserved: not checked. */
	if (r->type != NBD_CMD_FLUSH && (r->offset > size || r->len > size - r->offset))
		return refuse(msg, "request beyond the end of the export",
			      r->type == NBD_CMD_WRITE || r->type == NBD_CMD_WRITE_ZEROES
				      ? NBD_ENOSPC
				      : NBD_EINVAL);
	if (r->type == NBD_CMD_READ && r->len > NBD_MAX_REQUEST)
		return refuse(msg, "read larger than the maximum payload",
			      sr ? NBD_EOVERFLOW : NBD_EINVAL);
	if (r->type == NBD_CMD_BLOCK_STATUS && !c->meta)
		return refuse(msg, "no metadata context selected", NBD_EINVAL);
	if (r->type == NBD_CMD_BLOCK_STATUS && r->len == 0)
		return refuse(msg, "block status of zero bytes", NBD_EINVAL);
	return 0;
}

/* Copy buffered payload into the write being received; submit it once
 * complete. Returns false while more is needed. */
static bool payload_input(struct nbd_conn *c)
{
	struct nbd_req *r = c->cur;
	size_t avail = c->rend - c->rpos;
	uint64_t need = r->len - c->cur_have;
	size_t k = need < avail ? (size_t)need : avail;

	memcpy((uint8_t *)r->buf + c->cur_have, c->rbuf + c->rpos, k);
	c->rpos += k;
	c->cur_have += k;
	if (c->cur_have < r->len)
		return false;
	c->cur = NULL;
	nbd_cmds[r->type].start(r);
	return true;
}

static void parse_header(struct nbd_conn *c, struct nbd_req *r, const uint8_t *p)
{
	r->flags = nbd_get16(p + 4);
	r->type = nbd_get16(p + 6);
	r->cookie = nbd_get64(p + 8);
	r->offset = nbd_get64(p + 16);
	r->len = c->extended ? nbd_get64(p + 24) : nbd_get32(p + 24);
	IOPLANE_TRACE(nbd_request, c->exp->name, r->cookie, r->type, r->offset, r->len);
}

static int one_request(struct nbd_conn *c)
{
	const uint8_t *p = c->rbuf + c->rpos;
	uint64_t payload = 0;
	struct nbd_req *r;
	const char *msg;
	uint32_t err;

	if (nbd_get32(p) != (c->extended ? NBD_EXTENDED_REQUEST_MAGIC : NBD_REQUEST_MAGIC))
		return -EPROTO; /* cannot resynchronise: hard disconnect */
	c->rpos += c->extended ? sizeof(struct nbd_request_ext) : sizeof(struct nbd_request);
	if (nbd_get16(p + 6) == NBD_CMD_DISC) {
		nbd_conn_drain(c); /* answer what is in flight, then close */
		return 0;
	}
	r = nbd_req_take(c);
	if (!r)
		return -ENOMEM;
	r->mem = c->mem_grant; /* reserved by mem_admit() for this header */
	c->mem_grant = 0;
	parse_header(c, r, p);
	c->nrequests++;
	if (c->extended ? (r->flags & NBD_CMD_FLAG_PAYLOAD_LEN) : r->type == NBD_CMD_WRITE)
		payload = r->len;
	/* Spec: a payload past the maximum may be treated as an attack. */
	if (payload > NBD_MAX_REQUEST) {
		nbd_req_release(r);
		return -EPROTO;
	}
	err = validate(c, r, &msg);
	if (!err && payload && nbd_req_buf(r, payload) < 0)
		err = refuse(&msg, "out of memory", NBD_ENOMEM);
	if (err) {
		c->skip = payload; /* keep the stream in sync */
		nbd_req_fail(r, err, msg);
		return 0;
	}
	if (payload) {
		c->cur = r;
		c->cur_have = 0;
		payload_input(c);
		return 0;
	}
	nbd_cmds[r->type].start(r);
	return 0;
}

/* Buffer bytes the request whose header is at p will hold: a READ's data or
 * a WRITE's payload. Oversized ones are refused and hold nothing, and a bad
 * magic ends the connection without waiting for memory first. */
static uint64_t request_mem(const struct nbd_conn *c, const uint8_t *p)
{
	uint16_t flags = nbd_get16(p + 4), type = nbd_get16(p + 6);
	uint64_t len = c->extended ? nbd_get64(p + 24) : nbd_get32(p + 24);
	bool payload = c->extended ? flags & NBD_CMD_FLAG_PAYLOAD_LEN : type == NBD_CMD_WRITE;

	if (nbd_get32(p) != (c->extended ? NBD_EXTENDED_REQUEST_MAGIC : NBD_REQUEST_MAGIC))
		return 0;
	if (len > NBD_MAX_REQUEST || !(payload || type == NBD_CMD_READ))
		return 0;
	return len;
}

/* Reserve the daemon-wide memory of the next request; false: wait for the
 * grant (the connection stops reading meanwhile). */
static bool mem_admit(struct nbd_conn *c)
{
	struct nbd_budget *b = c->srv->budget;
	uint64_t need;

	if (!b || c->mem_grant)
		return true;
	if (c->mem_waiting)
		return false;
	need = request_mem(c, c->rbuf + c->rpos);
	if (!need)
		return true;
	if (nbd_budget_get(b, c, need)) {
		c->mem_grant = need;
		return true;
	}
	c->mem_waiting = true;
	nbd_conn_get(c); /* for the grant message */
	return false;
}

int nbd_transmit_input(struct nbd_conn *c)
{
	size_t hdr = c->extended ? sizeof(struct nbd_request_ext) : sizeof(struct nbd_request);
	int ret = 0;

	while (!ret && c->state == NBD_CONN_OPEN) {
		if (c->cur) {
			if (!payload_input(c))
				break;
			continue;
		}
		if (!nbd_conn_skip_input(c))
			break;
		if (c->rend - c->rpos < hdr)
			break;
		if (!can_take(c) || !mem_admit(c)) {
			c->in_blocked = true;
			break;
		}
		ret = one_request(c);
	}
	return ret;
}
