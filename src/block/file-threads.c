/* `file` engine threads: each read or write is one work item on the thread
 * pool doing blocking preadv/pwritev (pwritev2 with RWF_DSYNC for FUA) until
 * the whole request is done. Flush and the other slow operations share the
 * pool code in file.c.
 *
 * Threading: submit and completion run on the request's loop; the transfer
 * runs on a pool worker and touches only its own request. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "block/file-int.h"
#include "loop/thread-pool.h"

struct file_tp_req {
	struct tp_work work; /* first: the work item is the context */
	int fd;
	struct file_rw rw;
};

_Static_assert(sizeof(struct file_tp_req) <= BLK_DRV_CTX_SIZE, "file_tp_req too big");

static ssize_t file_tp_io(struct file_tp_req *t, struct blk_request *req)
{
	struct file_piece p;
	struct iovec one;
	int flags = 0;
	ssize_t n;

	file_rw_piece(&t->rw, req, &p);
	if (p.single) {
		one.iov_base = p.buf;
		one.iov_len = p.len;
		p.iov = &one;
		p.cnt = 1;
	}
	if (req->op == BLK_OP_READ) {
		n = preadv(t->fd, p.iov, p.cnt, (off_t)t->rw.pos);
	} else {
		if (req->flags & BLK_F_FUA)
			flags = RWF_DSYNC;
		n = pwritev2(t->fd, p.iov, p.cnt, (off_t)t->rw.pos, flags);
	}
	return n < 0 ? -errno : n;
}

/* Worker: loop over short transfers, IOV_MAX chunks and EINTR. */
static int file_tp_run(struct tp_work *w)
{
	struct file_tp_req *t = (struct file_tp_req *)w;
	struct blk_request *req = file_req_of(t);
	enum file_rw_next next;

	do {
		next = file_rw_advance(&t->rw, req, file_tp_io(t, req));
	} while (next == FILE_RW_AGAIN);
	return next == FILE_RW_DONE ? 0 : t->rw.err;
}

static void file_tp_done(struct tp_work *w, int ret)
{
	blk_complete(file_req_of(w), ret);
}

int file_threads_submit(struct blk_node *bs, struct blk_request *req)
{
	struct file_tp_req *t = (struct file_tp_req *)req->drv.bytes;

	memset(&t->work, 0, sizeof(t->work));
	t->work.fn = file_tp_run;
	t->work.done = file_tp_done;
	t->fd = file_state(bs)->fd;
	file_rw_init(&t->rw, req);
	tp_submit(req->loop, &t->work);
	return 0;
}
