/* `copy-before-write` filter driver, as QEMU's: reads pass to the `file`
 * child; a write, write-zeroes or discard to a range whose old data has not
 * been copied to the `target` child yet first copies it there (granule by
 * granule, block-copy.h), so the target keeps the point in time at which
 * the filter was inserted. A backup job copies the rest in the background
 * through the same state (cbw_copy_state). Options: bitmap.node/bitmap.name
 * (only the bitmap's dirty granules are copied), on-cbw-error=
 * break-guest-write (the guest write fails) | break-snapshot (the target is
 * given up, guest writes go on).
 *
 * Threading: requests run on their submitter's loop; the copy state has its
 * own lock; a waiting write resumes on its own loop (a message). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-copy.h"
#include "block/block-driver.h"
#include "block/cbw.h"
#include "block/dirty-bitmap.h"
#include "block/graph.h"
#include "block/qcow2/qcow2.h"
#include "util/compiler.h"
#include "util/opts.h"

#define CBW_CHUNK (1u << 20) /* at most this much old data copied at a time */
#define CBW_MIN_GRAN 65536u  /* QEMU's block-copy cluster size */

struct cbw_state {
	struct bcopy bc;
	bool break_snapshot; /* on-cbw-error=break-snapshot */
	/* A backup's record of the writes since it began (cbw_set_successor;
	 * set before the node serves). */
	struct blk_dirty_bitmap *succ;
};

/* A guest write held until the old data under it is copied. */
struct cbw_write {
	struct blk_node *bs;
	struct blk_request *req;
	struct bcopy_op op;
	size_t cap; /* bytes of op.buf */
	struct bcopy_waiter w;
	struct loop_msg msg;
};

static bool cbw_modifies(uint8_t op)
{
	return op == BLK_OP_WRITE || op == BLK_OP_WRITE_ZEROES || op == BLK_OP_DISCARD;
}

static void cbw_step(struct cbw_write *cw);

static void cbw_write_free(struct cbw_write *cw)
{
	free(cw->op.buf);
	free(cw);
}

/* The old data is safe (or given up): the write goes on. */
static void cbw_go(struct cbw_write *cw, int ret)
{
	struct blk_request *req = cw->req;
	struct blk_node *bs = cw->bs;

	cbw_write_free(cw);
	if (ret == 0)
		ret = blk_forward(bs, req);
	if (ret)
		blk_complete(req, ret);
}

static void cbw_break(struct cbw_state *s)
{
	pthread_mutex_lock(&s->bc.lock);
	s->bc.broken = true;
	pthread_mutex_unlock(&s->bc.lock);
	bcopy_wake_all(&s->bc);
}

static void cbw_copied(struct bcopy_op *op, int ret)
{
	struct cbw_write *cw = op->opaque;
	struct cbw_state *s = cw->bs->opaque;

	if (ret < 0 && s->break_snapshot) {
		cbw_break(s);
	} else if (ret < 0) {
		cbw_go(cw, ret);
		return;
	}
	cbw_step(cw);
}

static void cbw_resume(struct loop_msg *m)
{
	cbw_step(container_of(m, struct cbw_write, msg));
}

/* Woken by the thread that ended an overlapping copy: go on on the
 * write's own loop. */
static void cbw_wake(struct bcopy_waiter *w)
{
	struct cbw_write *cw = container_of(w, struct cbw_write, w);

	cw->msg.cb = cbw_resume;
	loop_send(cw->req->loop, &cw->msg);
}

/* Copy the next claimed run, wait, or let the write go (completion
 * context). */
/* Copy the claimed range, with a buffer of its size (a guest write claims
 * a granule or a few: no 1 MiB buffer per write). 0, or -errno with the
 * range ended. */
static int cbw_copy_start(struct cbw_write *cw)
{
	size_t len = cw->op.r.hi - cw->op.r.lo;

	if (len > cw->cap) {
		free(cw->op.buf);
		cw->op.buf = blk_alloc_buf(cw->bs, len);
		cw->cap = cw->op.buf ? len : 0;
		if (!cw->op.buf) {
			bcopy_end(cw->op.s, &cw->op.r, -ENOMEM);
			return -ENOMEM;
		}
	}
	return bcopy_op_start(&cw->op);
}

static void cbw_step(struct cbw_write *cw)
{
	struct cbw_state *s = cw->bs->opaque;
	struct blk_request *req = cw->req;
	int ret = bcopy_claim_in(&s->bc, req->offset, req->len, CBW_CHUNK, &cw->op.r, &cw->w);

	if (ret == -EAGAIN)
		return;
	if (ret == 0) {
		cbw_go(cw, 0);
		return;
	}
	ret = cbw_copy_start(cw);
	if (ret)
		cbw_copied(&cw->op, ret);
}

static struct cbw_write *cbw_write_new(struct blk_node *bs, struct blk_request *req)
{
	struct cbw_state *s = bs->opaque;
	struct cbw_write *cw = calloc(1, sizeof(*cw));

	if (!cw)
		return NULL;
	cw->bs = bs;
	cw->req = req;
	cw->op.s = &s->bc;
	cw->op.cb = cbw_copied;
	cw->op.opaque = cw;
	cw->w.wake = cbw_wake;
	return cw;
}

/* First look from the submit call: nothing to copy, a wait, or a copy
 * started (the completion then goes on from there). */
static int cbw_intercept(struct blk_node *bs, struct blk_request *req)
{
	struct cbw_state *s = bs->opaque;
	struct cbw_write *cw;
	int ret;

	if (!s->bc.broken && !bcopy_remaining(&s->bc) && !bcopy_busy(&s->bc))
		return blk_forward(bs, req);
	cw = cbw_write_new(bs, req);
	if (!cw)
		return -ENOMEM;
	ret = bcopy_claim_in(&s->bc, req->offset, req->len, CBW_CHUNK, &cw->op.r, &cw->w);
	if (ret == -EAGAIN)
		return 0;
	if (ret == 0) {
		cbw_write_free(cw);
		return blk_forward(bs, req);
	}
	ret = cbw_copy_start(cw);
	if (ret == 0)
		return 0;
	if (s->break_snapshot) {
		cbw_break(s);
		cbw_write_free(cw);
		return blk_forward(bs, req);
	}
	cbw_write_free(cw);
	return ret;
}

/* The backup's record of the writes (the source's own bitmaps are marked
 * by blk_forward). */
static void cbw_mark(struct blk_node *bs, const struct blk_request *req)
{
	struct cbw_state *s = bs->opaque;

	if (s->succ && req->len && req->offset < bs->size)
		blk_dirty_bitmap_set(s->succ, req->offset, req->len);
}

static int cbw_submit(struct blk_node *bs, struct blk_request *req)
{
	if (!cbw_modifies(req->op))
		return blk_forward(bs, req);
	cbw_mark(bs, req);
	return cbw_intercept(bs, req);
}

void cbw_set_successor(struct blk_node *bs, struct blk_dirty_bitmap *succ)
{
	struct cbw_state *s = bs->opaque;

	s->succ = succ;
}

/* ---- open ---- */

static int cbw_parse_error(struct cbw_state *s, struct kv_opts *opts, char *err, size_t errlen)
{
	const char *v = kv_get(opts, "on-cbw-error");

	if (!v || !strcmp(v, "break-guest-write"))
		return 0;
	if (!strcmp(v, "break-snapshot")) {
		s->break_snapshot = true;
		return 0;
	}
	snprintf(err, errlen, "Parameter 'on-cbw-error' does not accept value '%s'", v);
	return -EINVAL;
}

/* bitmap.node/bitmap.name: only the bitmap's dirty granules are copied. */
static int cbw_parse_bitmap(struct blk_node *bs, struct cbw_state *s, struct kv_opts *opts,
			    char *err, size_t errlen)
{
	const char *node = kv_get(opts, "bitmap.node"), *name = kv_get(opts, "bitmap.name");
	struct blk_node *src;
	struct blk_dirty_bitmap *bm;

	if (!node && !name) {
		blk_dirty_bitmap_set(s->bc.todo, 0, s->bc.size);
		return 0;
	}
	src = node ? blk_graph_find(node) : NULL;
	if (!src || !name) {
		snprintf(err, errlen, "Dirty bitmap '%s' not found", name ? name : "");
		return -ENOENT;
	}
	bm = blk_dirty_bitmap_find(src, name);
	if (!bm) {
		snprintf(err, errlen, "Dirty bitmap '%s' not found", name);
		return -ENOENT;
	}
	(void)bs;
	blk_dirty_bitmap_merge(s->bc.todo, bm);
	return 0;
}

static uint32_t cbw_gran(struct blk_node *target)
{
	uint64_t cs = qcow2_cluster_size(target);

	return cs > CBW_MIN_GRAN && cs <= (1u << 26) ? (uint32_t)cs : CBW_MIN_GRAN;
}

static int cbw_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	struct blk_node *target = blk_child(bs, BLK_ROLE_TARGET);
	struct cbw_state *s;
	int ret;

	if (!target) {
		snprintf(err, errlen, "Parameter 'target' is missing");
		return -EINVAL;
	}
	if (target->size != bs->next->size) {
		snprintf(err, errlen, "Source and target sizes differ");
		return -EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s || bcopy_init(&s->bc, bs->next->size, cbw_gran(target), false)) {
		free(s);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->bc.source = bs->next;
	s->bc.target = target;
	bs->opaque = s;
	ret = cbw_parse_error(s, opts, err, errlen);
	if (!ret)
		ret = cbw_parse_bitmap(bs, s, opts, err, errlen);
	if (ret)
		return ret; /* close() frees s */
	bs->size = bs->next->size;
	bs->align = bs->next->align;
	bs->mem_align = bs->next->mem_align;
	return 0;
}

static void cbw_close(struct blk_node *bs)
{
	struct cbw_state *s = bs->opaque;

	if (!s)
		return;
	bcopy_destroy(&s->bc);
	free(s);
	bs->opaque = NULL;
}

/* The source as the users have it, minus resize (the copy state is sized);
 * the target is the filter's alone: it writes, and lets others only read. */
static unsigned cbw_child_perms(struct blk_node *bs, uint32_t perm, uint32_t shared,
				struct blk_perm_req *out)
{
	struct blk_node *target = blk_child(bs, BLK_ROLE_TARGET);
	unsigned n = 0;

	if (bs->next)
		out[n++] = (struct blk_perm_req){bs->next, perm, shared & ~BLK_PERM_RESIZE};
	if (target)
		out[n++] =
			(struct blk_perm_req){target, BLK_PERM_WRITE | BLK_PERM_CONSISTENT_READ,
					      BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE_UNCHANGED};
	return n;
}

static bool cbw_can_discard(struct blk_node *bs)
{
	return bs->next->has_discard;
}
static bool cbw_can_wz(struct blk_node *bs)
{
	return bs->next->has_write_zeroes;
}
static bool cbw_can_fua(struct blk_node *bs)
{
	return bs->next->has_fua;
}
static bool cbw_can_bs(struct blk_node *bs)
{
	return bs->next->has_block_status;
}

struct bcopy *cbw_copy_state(struct blk_node *bs)
{
	struct cbw_state *s = bs->drv == &blk_drv_cbw ? bs->opaque : NULL;

	return s ? &s->bc : NULL;
}

const struct blk_driver blk_drv_cbw = {
	.name = "copy-before-write",
	.is_format = true,
	.open = cbw_open,
	.close = cbw_close,
	.submit = cbw_submit,
	.child_perms = cbw_child_perms,
	.can_discard = cbw_can_discard,
	.can_write_zeroes = cbw_can_wz,
	.can_fua = cbw_can_fua,
	.can_block_status = cbw_can_bs,
};
