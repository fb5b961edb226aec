/* NBD_CMD_BLOCK_STATUS (base:allocation) and hole-aware NBD_CMD_READ.
 *
 * Both walk the range with block-layer block-status queries, one at a time:
 * BLOCK_STATUS turns the answers into descriptors (merging equal neighbours);
 * a large structured READ uses them to send the zero parts as OFFSET_HOLE
 * chunks, and skips the read entirely when the whole range is zero. Small
 * reads (the common 4 KiB case) and simple-reply reads go straight to the
 * block layer: a status query would cost more than it saves.
 *
 * Threading: runs on the connection's loop. */
#include <errno.h>
#include <string.h>

#include "export/nbd-int.h"
#include "util/log.h"

enum {
	STAGE_READ = 0, /* reading the data */
	STAGE_SCAN,     /* block-status queries */
};

/* Bound on the status queries one request may make. */
#define MAX_SCANS 256

static uint32_t blk_to_state(uint32_t status)
{
	uint32_t f = 0;

	if (!(status & BLK_STATUS_DATA))
		f |= NBD_STATE_HOLE;
	if (status & BLK_STATUS_ZERO)
		f |= NBD_STATE_ZERO;
	return f;
}

static int scan_next(struct nbd_req *r)
{
	r->scans++;
	return nbd_req_submit(r, BLK_OP_BLOCK_STATUS, 0, r->offset + r->done, r->len - r->done);
}

/* ---- NBD_CMD_READ ------------------------------------------------------- */

static void read_data(struct nbd_req *r)
{
	int ret;

	r->stage = STAGE_READ;
	ret = nbd_req_submit(r, BLK_OP_READ, 0, r->offset, r->len);
	if (ret < 0)
		nbd_req_fail(r, nbd_errno_to_nbd(ret), NULL);
}

void nbd_read_start(struct nbd_req *r)
{
	struct nbd_conn *c = r->conn;

	r->nexts = 0;
	r->done = 0;
	r->scans = 0;
	if (r->len == 0) {
		nbd_req_finish(r);
		return;
	}
	if (nbd_req_buf(r, r->len) < 0) {
		nbd_req_fail(r, NBD_ENOMEM, "out of memory");
		return;
	}
	if ((c->structured || c->extended) && r->len >= NBD_SPARSE_READ_MIN &&
	    c->exp->bs->has_block_status) {
		r->stage = STAGE_SCAN;
		if (scan_next(r) == 0)
			return;
		r->nexts = 0;
	}
	read_data(r);
}

/* Record the zero/data extent just learnt; true when the scan is over. */
static bool read_scan_step(struct nbd_req *r, uint64_t len, uint32_t status)
{
	uint32_t f = status & BLK_STATUS_ZERO ? NBD_STATE_ZERO : 0;

	if (len > r->len - r->done)
		len = r->len - r->done;
	if (r->nexts && r->ext[r->nexts - 1].flags == f) {
		r->ext[r->nexts - 1].len += len;
	} else if (r->nexts < NBD_READ_EXTENTS - 1) {
		r->ext[r->nexts++] = (struct nbd_extent){len, f};
	} else {
		/* Out of chunks: the rest goes out as data. */
		r->ext[r->nexts++] = (struct nbd_extent){r->len - r->done, 0};
		r->done = r->len;
		return true;
	}
	r->done += len;
	return r->done >= r->len || r->scans >= MAX_SCANS;
}

static void read_scan_done(struct nbd_req *r, int ret)
{
	unsigned i;

	if (ret < 0 || r->blk.status_len == 0) {
		r->nexts = 0; /* no map: plain data */
		read_data(r);
		return;
	}
	if (!read_scan_step(r, r->blk.status_len, r->blk.status)) {
		if (scan_next(r) == 0)
			return;
		r->nexts = 0;
		read_data(r);
		return;
	}
	if (r->done < r->len) /* scan budget spent: the rest is data */
		r->ext[r->nexts++] = (struct nbd_extent){r->len - r->done, 0};
	for (i = 0; i < r->nexts; i++)
		if (!(r->ext[i].flags & NBD_STATE_ZERO))
			break;
	if (i < r->nexts)
		read_data(r); /* some data: read the range (holes read fast) */
	else
		nbd_req_finish(r); /* all zero: nothing to read */
}

static void put_data_chunk(struct nbd_req *r, size_t *h, uint64_t off, uint64_t len, bool last)
{
	uint8_t *p = r->hdr + *h;
	size_t n = nbd_put_chunk_hdr(r, p, last ? NBD_REPLY_FLAG_DONE : 0,
				     NBD_REPLY_TYPE_OFFSET_DATA, 8 + len);

	nbd_put64(p + n, r->offset + off);
	*h += n + 8;
	r->riov[r->riovcnt].iov_base = p;
	r->riov[r->riovcnt++].iov_len = n + 8;
	r->riov[r->riovcnt].iov_base = (uint8_t *)r->buf + off;
	r->riov[r->riovcnt++].iov_len = (size_t)len;
}

static void put_hole_chunk(struct nbd_req *r, size_t *h, uint64_t off, uint64_t len, bool last)
{
	uint8_t *p = r->hdr + *h;
	size_t n = nbd_put_chunk_hdr(r, p, last ? NBD_REPLY_FLAG_DONE : 0,
				     NBD_REPLY_TYPE_OFFSET_HOLE, 12);

	nbd_put64(p + n, r->offset + off);
	nbd_put32(p + n + 8, (uint32_t)len);
	*h += n + 12;
	r->riov[r->riovcnt].iov_base = p;
	r->riov[r->riovcnt++].iov_len = n + 12;
}

static void build_simple_read_reply(struct nbd_req *r)
{
	r->riov[r->riovcnt].iov_base = r->hdr;
	r->riov[r->riovcnt++].iov_len = nbd_put_simple_hdr(r, r->hdr, 0);
	if (r->len) {
		r->riov[r->riovcnt].iov_base = r->buf;
		r->riov[r->riovcnt++].iov_len = (size_t)r->len;
	}
}

void nbd_build_read_reply(struct nbd_req *r)
{
	struct nbd_conn *c = r->conn;
	uint64_t off = 0;
	size_t h = 0;
	unsigned i;
	bool any_data = r->nexts == 0;

	if (!c->structured && !c->extended) {
		build_simple_read_reply(r);
		return;
	}
	if (r->len == 0) {
		r->riov[r->riovcnt].iov_base = r->hdr;
		r->riov[r->riovcnt++].iov_len =
			nbd_put_chunk_hdr(r, r->hdr, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0);
		return;
	}
	for (i = 0; i < r->nexts; i++)
		any_data |= !(r->ext[i].flags & NBD_STATE_ZERO);
	/* One content chunk covers it all when there is no map, or the client
	 * asked for no fragmentation (then holes travel as data), or it is all
	 * one hole. */
	if (r->nexts <= 1 || (r->flags & NBD_CMD_FLAG_DF)) {
		if (any_data)
			put_data_chunk(r, &h, 0, r->len, true);
		else
			put_hole_chunk(r, &h, 0, r->len, true);
		return;
	}
	for (i = 0; i < r->nexts; i++) {
		bool last = i == r->nexts - 1;

		if (r->ext[i].flags & NBD_STATE_ZERO)
			put_hole_chunk(r, &h, off, r->ext[i].len, last);
		else
			put_data_chunk(r, &h, off, r->ext[i].len, last);
		off += r->ext[i].len;
	}
}

/* ---- NBD_CMD_BLOCK_STATUS ----------------------------------------------- */

/* Descriptors are kept in r->buf as struct nbd_extent and converted to the
 * wire format in place when the reply is built. */
void nbd_status_start(struct nbd_req *r)
{
	r->nexts = 0;
	r->done = 0;
	r->scans = 0;
	r->stage = STAGE_SCAN;
	if (nbd_req_buf(r, NBD_STATUS_EXTENTS * sizeof(struct nbd_extent)) < 0) {
		nbd_req_fail(r, NBD_ENOMEM, "out of memory");
		return;
	}
	if (scan_next(r) < 0)
		nbd_req_fail(r, NBD_EIO, "block status failed");
}

static void status_done(struct nbd_req *r, int ret)
{
	struct nbd_extent *e = r->buf;
	uint64_t len = r->blk.status_len;
	uint32_t f = blk_to_state(r->blk.status);

	if (ret < 0 || len == 0) {
		if (r->nexts) { /* report what we know: the client asks again */
			nbd_req_finish(r);
			return;
		}
		log_debug("nbd: block status failed: %s", strerror(ret < 0 ? -ret : EIO));
		nbd_req_fail(r, ret < 0 ? nbd_errno_to_nbd(ret) : NBD_EIO, "block status failed");
		return;
	}
	if (len > r->len - r->done)
		len = r->len - r->done;
	if (r->nexts && e[r->nexts - 1].flags == f)
		e[r->nexts - 1].len += len;
	else
		e[r->nexts++] = (struct nbd_extent){len, f};
	r->done += len;
	if ((r->flags & NBD_CMD_FLAG_REQ_ONE) || r->done >= r->len ||
	    r->nexts == NBD_STATUS_EXTENTS || r->scans >= MAX_SCANS || scan_next(r) < 0)
		nbd_req_finish(r);
}

void nbd_build_status_reply(struct nbd_req *r)
{
	struct nbd_conn *c = r->conn;
	struct nbd_extent *e = r->buf;
	uint8_t *w = r->buf;
	size_t n, dlen;
	unsigned i;

	for (i = 0; i < r->nexts; i++) {
		struct nbd_extent x = e[i]; /* read before the write overlaps it */

		if (c->extended) {
			nbd_put64(w + 16 * i, x.len);
			nbd_put64(w + 16 * i + 8, x.flags);
		} else {
			nbd_put32(w + 8 * i, (uint32_t)x.len);
			nbd_put32(w + 8 * i + 4, x.flags);
		}
	}
	dlen = (c->extended ? 16u : 8u) * r->nexts;
	n = nbd_put_chunk_hdr(r, r->hdr, NBD_REPLY_FLAG_DONE,
			      c->extended ? NBD_REPLY_TYPE_BLOCK_STATUS_EXT
					  : NBD_REPLY_TYPE_BLOCK_STATUS,
			      (c->extended ? 8 : 4) + dlen);
	nbd_put32(r->hdr + n, NBD_META_ID_ALLOC);
	n += 4;
	if (c->extended) {
		nbd_put32(r->hdr + n, r->nexts);
		n += 4;
	}
	r->riov[r->riovcnt].iov_base = r->hdr;
	r->riov[r->riovcnt++].iov_len = n;
	r->riov[r->riovcnt].iov_base = r->buf;
	r->riov[r->riovcnt++].iov_len = dlen;
}

void nbd_status_blk_done(struct nbd_req *r, int ret)
{
	if (r->type == NBD_CMD_BLOCK_STATUS) {
		status_done(r, ret);
		return;
	}
	if (r->stage == STAGE_SCAN) {
		read_scan_done(r, ret);
		return;
	}
	if (ret < 0) {
		nbd_req_io_failed(r, ret);
		return;
	}
	nbd_req_finish(r);
}
