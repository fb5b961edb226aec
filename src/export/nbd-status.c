/* NBD_CMD_BLOCK_STATUS (base:allocation): block-layer block-status queries
 * from the offset on, one at a time, turned into descriptors (merging equal
 * neighbours). Its entry in the command table (nbd-cmd.c) points here.
 *
 * Threading: runs on the connection's loop. */
#include <errno.h>
#include <string.h>

#include "export/nbd-int.h"
#include "util/log.h"

static uint32_t blk_to_state(uint32_t status)
{
	uint32_t f = 0;

	if (!(status & BLK_STATUS_DATA))
		f |= NBD_STATE_HOLE;
	if (status & BLK_STATUS_ZERO)
		f |= NBD_STATE_ZERO;
	return f;
}

/* Descriptors are kept in r->buf as struct nbd_extent and converted to the
 * wire format in place when the reply is built. */
void nbd_status_start(struct nbd_req *r)
{
	r->nexts = 0;
	r->done = 0;
	r->scans = 0;
	if (nbd_req_buf(r, NBD_STATUS_EXTENTS * sizeof(struct nbd_extent)) < 0) {
		nbd_req_fail(r, NBD_ENOMEM, "out of memory");
		return;
	}
	if (nbd_req_scan_next(r) < 0)
		nbd_req_fail(r, NBD_EIO, "block status failed");
}

void nbd_status_blk_done(struct nbd_req *r, int ret)
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
	    r->nexts == NBD_STATUS_EXTENTS || r->scans >= NBD_MAX_SCANS || nbd_req_scan_next(r) < 0)
		nbd_req_finish(r);
}

void nbd_status_reply(struct nbd_req *r)
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
	nbd_req_add_iov(r, r->hdr, n);
	nbd_req_add_iov(r, r->buf, dlen);
}
