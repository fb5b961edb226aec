/* NBD_CMD_BLOCK_STATUS for the contexts a connection selected, one reply
 * chunk each: base:allocation (block-layer block-status queries from the
 * offset on, one at a time, merging equal neighbours), then
 * qemu:allocation-depth (the same queries down the backing chain: 1 for
 * the top layer, 0 for nowhere), then each qemu:dirty-bitmap:NAME (read
 * from the bitmap, no I/O). Its entry in the command table (nbd-cmd.c)
 * points here.
 *
 * Threading: runs on the connection's loop; the exported bitmaps are busy
 * (no command changes them) and their bits are read atomically. */
#include <errno.h>
#include <string.h>

#include "block/dirty-bitmap.h"
#include "block/qcow2/qcow2.h"
#include "export/nbd-int.h"
#include "util/log.h"

/* r->buf holds one area of struct nbd_extent per context: 0 base:allocation
 * and 1 allocation depth of NBD_STATUS_EXTENTS each, then 2 + i bitmap i of
 * r->bmcap; each is converted to the wire format in place when the reply is
 * built. */
#define STATUS_AREA (NBD_STATUS_EXTENTS * sizeof(struct nbd_extent))

#define STAGE_BASE 0
#define STAGE_DEPTH 1

static struct nbd_extent *area(struct nbd_req *r, unsigned i)
{
	size_t off = i < 2 ? i * STATUS_AREA
			   : 2 * STATUS_AREA + (i - 2) * r->bmcap * sizeof(struct nbd_extent);

	return (struct nbd_extent *)((uint8_t *)r->buf + off);
}

/* Room for every extent a selected bitmap can have in the request: one per
 * granule it touches, (len >> gran_bits) + 2 at most; 1 for REQ_ONE. */
static unsigned bitmap_cap(const struct nbd_req *r)
{
	const struct nbd_export *x = r->conn->exp;
	uint64_t cap = 1;

	if (r->flags & NBD_CMD_FLAG_REQ_ONE)
		return 1;
	for (unsigned i = 0; i < x->nbitmaps; i++) {
		uint64_t c = (r->len >> x->bitmaps[i]->gran_bits) + 2;

		if ((r->conn->meta & NBD_META_BITMAP(i)) && c > cap)
			cap = c;
	}
	return cap < NBD_STATUS_BITMAP_EXTENTS ? (unsigned)cap : NBD_STATUS_BITMAP_EXTENTS;
}

static uint32_t blk_to_state(uint32_t status)
{
	uint32_t f = 0;

	if (!(status & BLK_STATUS_DATA))
		f |= NBD_STATE_HOLE;
	if (status & BLK_STATUS_ZERO)
		f |= NBD_STATE_ZERO;
	return f;
}

/* Append (len, f) to an area of *n extents, merging with the last. */
static void ext_add(struct nbd_extent *e, unsigned *n, uint64_t len, uint32_t f)
{
	if (*n && e[*n - 1].flags == f)
		e[*n - 1].len += len;
	else
		e[(*n)++] = (struct nbd_extent){len, f};
}

static bool status_full(const struct nbd_req *r, unsigned n, uint64_t done)
{
	return (r->flags & NBD_CMD_FLAG_REQ_ONE) || done >= r->len || n == NBD_STATUS_EXTENTS ||
	       r->scans >= NBD_MAX_SCANS;
}

/* ---- qemu:allocation-depth ---- */

static int depth_submit(struct nbd_req *r, uint64_t len)
{
	r->scans++;
	return nbd_req_submit_to(r, r->dnode, BLK_OP_BLOCK_STATUS, 0, r->offset + r->ddone, len);
}

static void depth_start(struct nbd_req *r)
{
	r->stage = STAGE_DEPTH;
	r->scans = 0;
	r->dnode = nbd_export_node(r->conn->exp);
	r->ddepth = 1;
	if (depth_submit(r, r->len) < 0)
		nbd_req_fail(r, NBD_EIO, "block status failed");
}

/* Does this layer hold [the start of] the range itself? As QEMU: data or
 * zeroes of a layer that cannot have a backing file do. */
static bool layer_allocated(struct blk_node *bs, uint32_t status)
{
	if (status & BLK_STATUS_ALLOCATED)
		return true;
	return !qcow2_is(bs) && !blk_child(bs, BLK_ROLE_BACKING) &&
	       (status & (BLK_STATUS_DATA | BLK_STATUS_ZERO));
}

/* The next layer down for [pos, pos + *len): 0 and a request made, or 1
 * when there is none (the range is allocated nowhere). */
static int depth_descend(struct nbd_req *r, uint64_t *len)
{
	struct blk_node *b = blk_child(r->dnode, BLK_ROLE_BACKING);
	uint64_t pos = r->offset + r->ddone;

	if (!b || pos >= blk_size(b))
		return 1;
	if (*len > blk_size(b) - pos)
		*len = blk_size(b) - pos;
	r->dnode = b;
	r->ddepth++;
	return depth_submit(r, *len) < 0 ? -1 : 0;
}

static void depth_done(struct nbd_req *r, int ret)
{
	struct nbd_extent *e = area(r, 1);
	uint64_t len = r->blk.status_len;
	int d;

	if (ret < 0 || len == 0) {
		nbd_req_fail(r, ret < 0 ? nbd_errno_to_nbd(ret) : NBD_EIO, "block status failed");
		return;
	}
	if (len > r->len - r->ddone)
		len = r->len - r->ddone;
	if (!layer_allocated(r->dnode, r->blk.status)) {
		d = depth_descend(r, &len);
		if (d == 0)
			return;
		if (d < 0) {
			nbd_req_fail(r, NBD_EIO, "block status failed");
			return;
		}
		r->ddepth = 0;
	}
	ext_add(e, &r->dnexts, len, r->ddepth);
	r->ddone += len;
	r->dnode = nbd_export_node(r->conn->exp);
	r->ddepth = 1;
	if (status_full(r, r->dnexts, r->ddone) || depth_submit(r, r->len - r->ddone) < 0)
		nbd_req_finish(r);
}

/* ---- base:allocation ---- */

/* The base scan is over (or not selected): the depth scan, or the reply. */
static void base_over(struct nbd_req *r)
{
	if (r->conn->meta & NBD_META_DEPTH)
		depth_start(r);
	else
		nbd_req_finish(r);
}

void nbd_status_start(struct nbd_req *r)
{
	r->nexts = r->dnexts = 0;
	r->done = r->ddone = 0;
	r->scans = 0;
	r->stage = STAGE_BASE;
	r->bmcap = bitmap_cap(r);
	if (nbd_req_buf(r, 2 * STATUS_AREA + r->conn->exp->nbitmaps * (size_t)r->bmcap *
						     sizeof(struct nbd_extent)) < 0) {
		nbd_req_fail(r, NBD_ENOMEM, "out of memory");
		return;
	}
	if (!(r->conn->meta & NBD_META_ALLOC))
		base_over(r);
	else if (nbd_req_scan_next(r) < 0)
		nbd_req_fail(r, NBD_EIO, "block status failed");
}

static void base_done(struct nbd_req *r, int ret)
{
	struct nbd_extent *e = area(r, 0);
	uint64_t len = r->blk.status_len;

	if (ret < 0 || len == 0) {
		if (r->nexts) { /* report what we know: the client asks again */
			base_over(r);
			return;
		}
		log_debug("nbd: block status failed: %s", strerror(ret < 0 ? -ret : EIO));
		nbd_req_fail(r, ret < 0 ? nbd_errno_to_nbd(ret) : NBD_EIO, "block status failed");
		return;
	}
	if (len > r->len - r->done)
		len = r->len - r->done;
	ext_add(e, &r->nexts, len, blk_to_state(r->blk.status));
	r->done += len;
	if (status_full(r, r->nexts, r->done) || nbd_req_scan_next(r) < 0)
		base_over(r);
}

void nbd_status_blk_done(struct nbd_req *r, int ret)
{
	if (r->stage == STAGE_DEPTH)
		depth_done(r, ret);
	else
		base_done(r, ret);
}

/* ---- qemu:dirty-bitmap:NAME ---- */

static unsigned bitmap_extents(struct nbd_req *r, const struct blk_dirty_bitmap *bm,
			       struct nbd_extent *e)
{
	uint64_t pos = r->offset, end = r->offset + r->len;
	unsigned n = 0;

	if (end > bm->size)
		end = bm->size;
	while (pos < end && n < r->bmcap) {
		bool dirty;
		uint64_t len = blk_dirty_bitmap_extent(bm, pos, end - pos, &dirty);

		ext_add(e, &n, len, dirty ? NBD_STATE_DIRTY : 0);
		pos += len;
		if (r->flags & NBD_CMD_FLAG_REQ_ONE)
			break;
	}
	if (!n) /* past the bitmap (the node grew): clean */
		e[n++] = (struct nbd_extent){r->len, 0};
	return n;
}

/* ---- the reply ---- */

/* One chunk of n extents of area a for context id; hdr: where its header
 * goes (returns the bytes used). */
static size_t status_chunk(struct nbd_req *r, uint8_t *hdr, unsigned a, unsigned n, uint32_t id,
			   bool last)
{
	struct nbd_conn *c = r->conn;
	struct nbd_extent *e = area(r, a);
	uint8_t *w = (uint8_t *)e;
	size_t dlen = (c->extended ? 16u : 8u) * n, h;

	for (unsigned i = 0; i < n; i++) {
		struct nbd_extent x = e[i]; /* read before the write overlaps it */

		if (c->extended) {
			nbd_put64(w + 16 * i, x.len);
			nbd_put64(w + 16 * i + 8, x.flags);
		} else {
			nbd_put32(w + 8 * i, (uint32_t)x.len);
			nbd_put32(w + 8 * i + 4, x.flags);
		}
	}
	h = nbd_put_chunk_hdr(r, hdr, last ? NBD_REPLY_FLAG_DONE : 0,
			      c->extended ? NBD_REPLY_TYPE_BLOCK_STATUS_EXT
					  : NBD_REPLY_TYPE_BLOCK_STATUS,
			      (c->extended ? 8 : 4) + dlen);
	nbd_put32(hdr + h, id);
	h += 4;
	if (c->extended) {
		nbd_put32(hdr + h, n);
		h += 4;
	}
	nbd_req_add_iov(r, hdr, h);
	nbd_req_add_iov(r, w, dlen);
	return h;
}

void nbd_status_reply(struct nbd_req *r)
{
	const struct nbd_export *x = r->conn->exp;
	uint32_t m = r->conn->meta;
	unsigned n[2 + NBD_MAX_EXPORT_BITMAPS] = {r->nexts, r->dnexts};
	uint8_t *hdr = r->hdr;
	int last = -1;

	for (unsigned i = 0; i < x->nbitmaps; i++)
		if (m & NBD_META_BITMAP(i))
			n[2 + i] = bitmap_extents(r, x->bitmaps[i], area(r, 2 + i));
	for (unsigned a = 0; a < 2 + x->nbitmaps; a++)
		if (m & (1u << a))
			last = (int)a;
	for (unsigned a = 0; a < 2 + x->nbitmaps; a++)
		if (m & (1u << a))
			hdr += status_chunk(r, hdr, a, n[a], a + 1, (int)a == last);
}
