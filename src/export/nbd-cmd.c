/* NBD commands: one table entry per command says how a validated request
 * starts, what each of its block-layer completions does and how its reply is
 * built (nbd_cmds[], indexed by the command type). READ, WRITE, FLUSH, TRIM,
 * WRITE_ZEROES and CACHE live here, BLOCK_STATUS in nbd-status.c.
 *
 * A large structured READ first asks where the zeroes are (block-status
 * queries, one at a time) and sends them as OFFSET_HOLE chunks, skipping the
 * read when the whole range is zero. Small reads (the common 4 KiB case) and
 * simple-reply reads go straight to the block layer: a status query would
 * cost more than it saves.
 *
 * Threading: runs on the connection's loop. */
#include <errno.h>

#include "export/nbd-int.h"
#include "util/iov.h"

/* r->stage of a READ */
enum {
	READ_DATA = 0, /* reading the data */
	READ_SCAN,     /* block-status queries for the zero extents */
};

/* r->stage of a TRIM */
enum {
	TRIM_DISCARD = 0,
	TRIM_FLUSH, /* FUA: the block layer has no FUA for a discard */
};

int nbd_req_scan_next(struct nbd_req *r)
{
	r->scans++;
	return nbd_req_submit(r, BLK_OP_BLOCK_STATUS, 0, r->offset + r->done, r->len - r->done);
}

static void submit_or_fail(struct nbd_req *r, uint8_t op, uint32_t flags)
{
	int ret = nbd_req_submit(r, op, flags, r->offset, r->len);

	if (ret < 0)
		nbd_req_fail(r, nbd_errno_to_nbd(ret), NULL);
}

/* The completion of a one-step command. */
static void cmd_blk_done(struct nbd_req *r, int ret)
{
	if (ret < 0) {
		nbd_req_io_failed(r, ret);
		return;
	}
	if (nbd_cmds[r->type].write && !(r->flags & NBD_CMD_FLAG_FUA))
		r->conn->dirty = true;
	nbd_req_finish(r);
}

/* Success without payload: a simple reply, or a NONE chunk once extended
 * headers forbid simple replies. */
static void ok_reply(struct nbd_req *r)
{
	size_t n;

	if (r->conn->extended)
		n = nbd_put_chunk_hdr(r, r->hdr, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0);
	else
		n = nbd_put_simple_hdr(r, r->hdr, 0);
	nbd_req_add_iov(r, r->hdr, n);
}

/* ---- NBD_CMD_READ ------------------------------------------------------- */

static void read_data(struct nbd_req *r)
{
	int ret;

	r->stage = READ_DATA;
	ret = nbd_req_submit(r, BLK_OP_READ, 0, r->offset, r->len);
	if (ret < 0)
		nbd_req_fail(r, nbd_errno_to_nbd(ret), NULL);
}

static void read_start(struct nbd_req *r)
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
	    nbd_export_node(c->exp)->has_block_status) {
		r->stage = READ_SCAN;
		if (nbd_req_scan_next(r) == 0)
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
	return r->done >= r->len || r->scans >= NBD_MAX_SCANS;
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
		if (nbd_req_scan_next(r) == 0)
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

static void read_blk_done(struct nbd_req *r, int ret)
{
	if (r->stage == READ_SCAN)
		read_scan_done(r, ret);
	else if (ret < 0)
		nbd_req_io_failed(r, ret);
	else
		nbd_req_finish(r);
}

static void put_data_chunk(struct nbd_req *r, size_t *h, uint64_t off, uint64_t len, bool last)
{
	uint8_t *p = r->hdr + *h;
	size_t n = nbd_put_chunk_hdr(r, p, last ? NBD_REPLY_FLAG_DONE : 0,
				     NBD_REPLY_TYPE_OFFSET_DATA, 8 + len);

	nbd_put64(p + n, r->offset + off);
	*h += n + 8;
	nbd_req_add_iov(r, p, n + 8);
	nbd_req_add_iov(r, (uint8_t *)r->buf + off, (size_t)len);
}

static void put_hole_chunk(struct nbd_req *r, size_t *h, uint64_t off, uint64_t len, bool last)
{
	uint8_t *p = r->hdr + *h;
	size_t n = nbd_put_chunk_hdr(r, p, last ? NBD_REPLY_FLAG_DONE : 0,
				     NBD_REPLY_TYPE_OFFSET_HOLE, 12);

	nbd_put64(p + n, r->offset + off);
	nbd_put32(p + n + 8, (uint32_t)len);
	*h += n + 12;
	nbd_req_add_iov(r, p, n + 12);
}

static void simple_read_reply(struct nbd_req *r)
{
	nbd_req_add_iov(r, r->hdr, nbd_put_simple_hdr(r, r->hdr, 0));
	if (r->len)
		nbd_req_add_iov(r, r->buf, (size_t)r->len);
}

static void read_reply(struct nbd_req *r)
{
	struct nbd_conn *c = r->conn;
	uint64_t off = 0;
	size_t h = 0;
	unsigned i;
	bool any_data = r->nexts == 0;

	if (!c->structured && !c->extended) {
		simple_read_reply(r);
		return;
	}
	if (r->len == 0) {
		nbd_req_add_iov(
			r, r->hdr,
			nbd_put_chunk_hdr(r, r->hdr, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0));
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

/* ---- NBD_CMD_WRITE, WRITE_ZEROES ---------------------------------------- */

static void write_start(struct nbd_req *r)
{
	uint32_t f = r->flags & NBD_CMD_FLAG_FUA ? BLK_F_FUA : 0;

	if (r->len == 0) { /* unspecified by the spec: a successful no-op */
		nbd_req_finish(r);
		return;
	}
	/* A branch when off; a scan of the payload when configured. */
	if (r->conn->exp->detect_zeroes && iov_is_zero(&r->data_iov, 1)) {
		if (r->conn->exp->detect_zeroes == NBD_DETECT_ZEROES_UNMAP)
			f |= BLK_F_MAY_UNMAP;
		submit_or_fail(r, BLK_OP_WRITE_ZEROES, f);
		return;
	}
	submit_or_fail(r, BLK_OP_WRITE, f);
}

static void write_zeroes_start(struct nbd_req *r)
{
	uint32_t f = 0;

	if (r->flags & NBD_CMD_FLAG_FUA)
		f |= BLK_F_FUA;
	if (!(r->flags & NBD_CMD_FLAG_NO_HOLE))
		f |= BLK_F_MAY_UNMAP;
	if (r->flags & NBD_CMD_FLAG_FAST_ZERO)
		f |= BLK_F_NO_FALLBACK;
	submit_or_fail(r, BLK_OP_WRITE_ZEROES, f);
}

/* ---- NBD_CMD_FLUSH, TRIM, CACHE ----------------------------------------- */

static void flush_start(struct nbd_req *r)
{
	r->offset = r->len = 0; /* reserved fields */
	submit_or_fail(r, BLK_OP_FLUSH, 0);
}

static void trim_start(struct nbd_req *r)
{
	r->stage = TRIM_DISCARD;
	submit_or_fail(r, BLK_OP_DISCARD, 0);
}

static void trim_blk_done(struct nbd_req *r, int ret)
{
	if (ret == 0 && r->stage == TRIM_DISCARD && (r->flags & NBD_CMD_FLAG_FUA)) {
		r->stage = TRIM_FLUSH;
		ret = nbd_req_submit(r, BLK_OP_FLUSH, 0, 0, 0);
		if (ret < 0)
			nbd_req_fail(r, nbd_errno_to_nbd(ret), NULL);
		return;
	}
	cmd_blk_done(r, ret);
}

/* A hint; the spec allows it to do nothing. */
static void cache_start(struct nbd_req *r)
{
	nbd_req_finish(r);
}

/* ---- the table ---------------------------------------------------------- */

const struct nbd_cmd nbd_cmds[NBD_CMD_COUNT] = {
	[NBD_CMD_READ] = {read_start, read_blk_done, read_reply, false},
	[NBD_CMD_WRITE] = {write_start, cmd_blk_done, ok_reply, true},
	[NBD_CMD_FLUSH] = {flush_start, cmd_blk_done, ok_reply, false},
	[NBD_CMD_TRIM] = {trim_start, trim_blk_done, ok_reply, true},
	[NBD_CMD_CACHE] = {cache_start, cmd_blk_done, ok_reply, false},
	[NBD_CMD_WRITE_ZEROES] = {write_zeroes_start, cmd_blk_done, ok_reply, true},
	[NBD_CMD_BLOCK_STATUS] = {nbd_status_start, nbd_status_blk_done, nbd_status_reply, false},
	/* NBD_CMD_DISC is no request: the parser ends the connection's input. */
};
