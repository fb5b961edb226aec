/* `mirror-top` filter driver: what a mirror job puts above its source so
 * that it sees every guest write. Reads and flushes pass to `file`. A
 * write, write-zeroes or discard goes to the source as a child request and,
 * once done, marks its range to copy again (background mode: marking after
 * the write, not before, is what keeps a copy that read the old data from
 * hiding the new). In write-blocking mode it waits for copies in flight
 * over its range, goes to the source and then the target, and is
 * acknowledged only then; a target failure leaves the range to copy.
 *
 * Threading: requests run on their submitter's loop; the copy state has its
 * own lock; the mode is set drained. */
#include <errno.h>
#include <stdlib.h>

#include "block/block-copy.h"
#include "block/block-driver.h"
#include "block/cbw.h"
#include "util/compiler.h"

struct mtop_state {
	struct bcopy *bc;    /* the job's */
	bool write_blocking; /* main thread, changed drained; read by requests */
};

/* One guest write in flight through the filter. */
struct mtop_write {
	struct blk_request *parent;
	struct blk_request child;
	struct bcopy_range r;
	struct bcopy_waiter w;
	struct loop_msg msg;
	struct mtop_state *s;
	struct blk_node *source;
	bool blocking, in_range;
};

static bool mtop_modifies(uint8_t op)
{
	return op == BLK_OP_WRITE || op == BLK_OP_WRITE_ZEROES || op == BLK_OP_DISCARD;
}

/* range_ret: whether the write reached both nodes (0), for the copy state. */
static void mtop_finish(struct mtop_write *mw, int range_ret, int ret)
{
	struct blk_request *p = mw->parent;

	if (mw->in_range)
		bcopy_end(mw->s->bc, &mw->r, range_ret);
	free(mw);
	blk_complete(p, ret);
}

static void mtop_child_init(struct mtop_write *mw, void (*cb)(struct blk_request *, int))
{
	struct blk_request *p = mw->parent;

	mw->child = (struct blk_request){
		.op = p->op,
		.flags = p->flags,
		.offset = p->offset,
		.len = p->len,
		.iov = p->iov,
		.iovcnt = p->iovcnt,
		.cb = cb,
		.opaque = mw,
	};
}

static void mtop_target_done(struct blk_request *c, int ret)
{
	struct mtop_write *mw = c->opaque;
	struct blk_request *p = mw->parent;

	/* The guest's write is on the source: it succeeds; the target copy
	 * that failed is left to the background copy. */
	if (ret < 0)
		bcopy_mark(mw->s->bc, p->offset, p->len);
	mtop_finish(mw, ret, 0);
}

static void mtop_source_done(struct blk_request *c, int ret)
{
	struct mtop_write *mw = c->opaque;
	struct blk_request *p = mw->parent;

	if (!mw->blocking || ret < 0) {
		bcopy_mark(mw->s->bc, p->offset, p->len);
		mtop_finish(mw, ret < 0 ? ret : -EAGAIN, ret);
		return;
	}
	mtop_child_init(mw, mtop_target_done);
	ret = blk_submit_child(mw->s->bc->target, &mw->child);
	if (ret)
		mtop_target_done(&mw->child, ret);
}

/* Start on the source (0), or -errno with mw freed and nothing started. */
static int mtop_start(struct mtop_write *mw)
{
	int ret;

	mtop_child_init(mw, mtop_source_done);
	ret = blk_submit_child(mw->source, &mw->child);
	if (ret) {
		if (mw->in_range)
			bcopy_end(mw->s->bc, &mw->r, ret);
		free(mw);
	}
	return ret;
}

static void mtop_resume(struct loop_msg *m)
{
	struct mtop_write *mw = container_of(m, struct mtop_write, msg);
	struct blk_request *p = mw->parent;
	int ret;

	if (bcopy_write_begin(mw->s->bc, p->offset, p->len, &mw->r, &mw->w) == -EAGAIN)
		return;
	mw->in_range = true;
	ret = mtop_start(mw);
	if (ret)
		blk_complete(p, ret);
}

static void mtop_wake(struct bcopy_waiter *w)
{
	struct mtop_write *mw = container_of(w, struct mtop_write, w);

	mw->msg.cb = mtop_resume;
	loop_send(mw->parent->loop, &mw->msg);
}

static int mtop_submit(struct blk_node *bs, struct blk_request *req)
{
	struct mtop_state *s = bs->opaque;
	struct mtop_write *mw;

	if (!mtop_modifies(req->op) || !s->bc)
		return blk_forward(bs, req);
	mw = calloc(1, sizeof(*mw));
	if (!mw)
		return -ENOMEM;
	mw->parent = req;
	mw->s = s;
	mw->source = bs->next;
	mw->blocking = s->write_blocking;
	mw->w.wake = mtop_wake;
	if (mw->blocking) {
		if (bcopy_write_begin(s->bc, req->offset, req->len, &mw->r, &mw->w) == -EAGAIN)
			return 0;
		mw->in_range = true;
	}
	return mtop_start(mw);
}

static int mtop_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	(void)opts;
	(void)err;
	(void)errlen;
	bs->opaque = calloc(1, sizeof(struct mtop_state));
	if (!bs->opaque)
		return -ENOMEM;
	bs->size = bs->next->size;
	bs->align = bs->next->align;
	bs->mem_align = bs->next->mem_align;
	return 0;
}

static void mtop_close(struct blk_node *bs)
{
	free(bs->opaque);
	bs->opaque = NULL;
}

void mirror_top_attach(struct blk_node *bs, struct bcopy *bc, bool write_blocking)
{
	struct mtop_state *s = bs->opaque;

	s->bc = bc;
	s->write_blocking = write_blocking;
}

void mirror_top_set_blocking(struct blk_node *bs, bool write_blocking)
{
	struct mtop_state *s = bs->opaque;

	s->write_blocking = write_blocking;
}

static bool mtop_can_discard(struct blk_node *bs)
{
	return bs->next->has_discard;
}
static bool mtop_can_wz(struct blk_node *bs)
{
	return bs->next->has_write_zeroes;
}
static bool mtop_can_fua(struct blk_node *bs)
{
	return bs->next->has_fua;
}
static bool mtop_can_bs(struct blk_node *bs)
{
	return bs->next->has_block_status;
}
static bool mtop_can_mc(struct blk_node *bs)
{
	return blk_children_can_multi_conn(bs);
}

const struct blk_driver blk_drv_mirror_top = {
	.name = "mirror_top", /* QEMU's name, as query-named-block-nodes shows it */
	.is_format = true,
	.open = mtop_open,
	.close = mtop_close,
	.submit = mtop_submit,
	.can_discard = mtop_can_discard,
	.can_write_zeroes = mtop_can_wz,
	.can_fua = mtop_can_fua,
	.can_block_status = mtop_can_bs,
	.can_multi_conn = mtop_can_mc,
};
