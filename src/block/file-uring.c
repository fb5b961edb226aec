/* `file` engine io_uring: reads, writes and flushes go to the loop's own ring
 * (no ring per node). SQEs prepared during a round are submitted by the loop
 * in the one io_uring_enter that ends the round, or every aio-max-batch SQEs
 * when that is set; completions arrive as
 * loop_uring_op callbacks. Continuations (short transfers, -EAGAIN, requests
 * with more than IOV_MAX elements) are prepared from the completion callback.
 *
 * Threading: everything runs on the request's loop; per-loop state (batch
 * counter and statistics) is owned by that loop's thread. */
#include <assert.h>
#include <errno.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/file-int.h"
#include "util/compiler.h"
#include "util/log.h"

struct file_uring_thread {
	struct file_thread t;
	struct loop_flush flush; /* end of round: close the batch count */
	uint64_t batch;          /* SQEs prepared in this round */
	unsigned max_batch;      /* file_max_batch at creation; 0: the round */
};

struct file_uring_req {
	struct loop_uring_op op; /* sqe->user_data */
	struct file_uring_thread *th;
	int fd;
	struct file_rw rw;
};

_Static_assert(sizeof(struct file_uring_req) <= BLK_DRV_CTX_SIZE, "file_uring_req too big");

int file_uring_check(char *err, size_t errlen)
{
	static const int ops[] = {IORING_OP_READV, IORING_OP_WRITEV, IORING_OP_READ,
				  IORING_OP_WRITE, IORING_OP_FSYNC};
	struct io_uring_probe *probe = io_uring_get_probe();
	int ret = 0;

	if (!probe) {
		snprintf(err, errlen,
			 "file: io_uring cannot be set up on this machine; "
			 "use aio=native or aio=threads");
		return -ENOTSUP;
	}
	for (size_t i = 0; i < ARRAY_SIZE(ops); i++) {
		if (!io_uring_opcode_supported(probe, ops[i])) {
			snprintf(err, errlen,
				 "file: this kernel's io_uring lacks opcode %d; "
				 "use aio=native or aio=threads",
				 ops[i]);
			ret = -ENOTSUP;
			break;
		}
	}
	io_uring_free_probe(probe);
	return ret;
}

/* Account for the batch that is being submitted. */
static void file_uring_close_batch(struct file_uring_thread *th)
{
	struct file_engine_stats *st = &th->t.stats;

	if (th->batch == 0)
		return;
	st->submit_calls++;
	st->submitted += th->batch;
	st->last_batch = th->batch;
	if (th->batch > st->max_batch)
		st->max_batch = th->batch;
	th->batch = 0;
}

static void file_uring_flush_cb(struct loop_flush *f)
{
	file_uring_close_batch(container_of(f, struct file_uring_thread, flush));
}

static void *file_uring_ctor(struct blk_node *bs, struct loop *loop)
{
	struct file_uring_thread *th = calloc(1, sizeof(*th));

	if (!th)
		return NULL;
	th->t.loop = loop;
	th->t.bs = bs;
	th->flush.cb = file_uring_flush_cb;
	th->max_batch = file_max_batch(bs, loop);
	return th;
}

void file_uring_detach(struct blk_node *bs, struct file_thread *t)
{
	struct file_uring_thread *th = (struct file_uring_thread *)t;

	(void)bs;
	assert(!th->flush.queued); /* rounds always end with the flush hooks */
	free(th);
}

static void file_uring_prep_rw(struct io_uring_sqe *sqe, struct file_uring_req *u,
			       struct blk_request *req)
{
	struct file_piece p;
	bool rd = req->op == BLK_OP_READ;

	file_rw_piece(&u->rw, req, &p);
	if (p.single && rd)
		io_uring_prep_read(sqe, u->fd, p.buf, (unsigned)p.len, u->rw.pos);
	else if (p.single)
		io_uring_prep_write(sqe, u->fd, p.buf, (unsigned)p.len, u->rw.pos);
	else if (rd)
		io_uring_prep_readv(sqe, u->fd, p.iov, (unsigned)p.cnt, u->rw.pos);
	else
		io_uring_prep_writev(sqe, u->fd, p.iov, (unsigned)p.cnt, u->rw.pos);
	if (!rd && (req->flags & BLK_F_FUA))
		sqe->rw_flags = RWF_DSYNC;
}

/* Prepare the request's next SQE; the loop submits it with the round. */
static int file_uring_queue(struct file_uring_req *u, struct blk_request *req)
{
	struct file_uring_thread *th = u->th;
	struct io_uring_sqe *sqe = loop_uring_sqe(req->loop);

	if (!sqe)
		return -EIO; /* the ring existed when we checked: should not happen */
	if (req->op == BLK_OP_FLUSH)
		io_uring_prep_fsync(sqe, u->fd, IORING_FSYNC_DATASYNC);
	else
		file_uring_prep_rw(sqe, u, req);
	io_uring_sqe_set_data(sqe, &u->op);
	if (th->batch++ == 0)
		loop_request_flush(th->t.loop, &th->flush);
	if (th->batch == th->max_batch) {
		file_uring_close_batch(th);
		loop_uring_submit(th->t.loop);
	}
	return 0;
}

static void file_uring_finish(struct file_uring_req *u, struct blk_request *req, int ret)
{
	u->th->t.stats.in_flight--;
	blk_complete(req, ret);
}

/* A flush: again on -EAGAIN/-EINTR, else done or failed (rw->err). */
static enum file_rw_next file_uring_flush_next(struct file_rw *rw, int res)
{
	if (res == -EAGAIN || res == -EINTR)
		return FILE_RW_AGAIN;
	rw->err = res;
	return res < 0 ? FILE_RW_FAILED : FILE_RW_DONE;
}

static void file_uring_done(struct loop_uring_op *op, int res, uint32_t cqe_flags)
{
	struct file_uring_req *u = (struct file_uring_req *)op;
	struct blk_request *req = file_req_of(u);
	enum file_rw_next next;
	int ret;

	(void)cqe_flags;
	if (req->op == BLK_OP_FLUSH)
		next = file_uring_flush_next(&u->rw, res);
	else
		next = file_rw_advance(&u->rw, req, res);
	if (next == FILE_RW_AGAIN) {
		u->th->t.stats.resubmits++;
		if (res < 0)
			u->th->t.stats.eagain++;
		ret = file_uring_queue(u, req);
		if (ret == 0)
			return;
		u->rw.err = ret;
		next = FILE_RW_FAILED;
	}
	file_uring_finish(u, req, next == FILE_RW_DONE ? 0 : u->rw.err);
}

int file_uring_submit(struct blk_node *bs, struct blk_request *req)
{
	struct file_uring_req *u = (struct file_uring_req *)req->drv.bytes;
	struct file_uring_thread *th;
	int ret;

	/* Only if this loop could not get a ring at all (open checked that
	 * io_uring works here): do the I/O on the thread pool instead. */
	if (!loop_uring(req->loop))
		return req->op == BLK_OP_FLUSH ? file_submit_misc(bs, req)
					       : file_threads_submit(bs, req);
	th = blk_thread_state(bs, req->loop, file_uring_ctor);
	if (!th)
		return -ENOMEM;
	u->op.cb = file_uring_done;
	u->th = th;
	u->fd = file_state(bs)->fd;
	if (req->op != BLK_OP_FLUSH)
		file_rw_init(&u->rw, req);
	ret = file_uring_queue(u, req);
	if (ret == 0)
		th->t.stats.in_flight++;
	return ret;
}
