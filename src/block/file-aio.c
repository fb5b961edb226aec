/* `file` engine native (linux-aio). One io_context per loop. Requests are
 * queued during the round and sent from the loop's flush hook, in io_submit
 * calls of at most aio-max-batch requests (the node's or the iothread's,
 * FILE_AIO_MAX_BATCH_NATIVE by default, see file.h for why not one call
 * for all); what does not fit in the context (FILE_AIO_DEPTH in flight)
 * or what the kernel refuses with -EAGAIN stays queued and goes when
 * completions free room. Completions are reaped from the AIO ring in user
 * space, by a poll handler while the loop busy-polls and by an eventfd
 * handler when it slept.
 *
 * Threading: everything runs on the request's loop; the per-loop state
 * (context, queue, counters) is owned by that loop's thread. */
#include <assert.h>
#include <errno.h>
#include <libaio.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "block/file-int.h"
#include "util/compiler.h"
#include "util/log.h"

#define FILE_AIO_REAP 16 /* events copied out of the ring at a time */
#define FILE_AIO_RETRY_NS 1000000ull

/* The completion ring the kernel maps at the io_context_t address (fs/aio.c,
 * stable ABI that libaio also reads). */
#define FILE_AIO_RING_MAGIC 0xa10a10a1u
struct file_aio_ring {
	unsigned id, nr, head, tail;
	unsigned magic, compat_features, incompat_features, header_length;
	struct io_event io_events[];
};

struct file_aio_req;

struct file_aio_thread {
	struct file_thread t;
	io_context_t ctx;
	int efd;
	struct loop_fd fdh;
	struct loop_poll poll;
	struct loop_flush flush;
	struct loop_timer retry;   /* -EAGAIN with nothing in flight */
	struct file_aio_req *head; /* waiting for io_submit, FIFO */
	struct file_aio_req **tailp;
	unsigned queued;
	unsigned in_kernel;
	unsigned max_batch; /* file_max_batch at creation */
};

struct file_aio_req {
	struct iocb iocb;
	struct file_rw rw;
	struct file_aio_req *next;
	struct file_aio_thread *th;
};

_Static_assert(sizeof(struct file_aio_req) <= BLK_DRV_CTX_SIZE, "file_aio_req too big");

int file_aio_check(char *err, size_t errlen)
{
	io_context_t ctx = 0;
	int ret = io_setup(1, &ctx);

	if (ret < 0) {
		snprintf(err, errlen, "file: linux-aio is not available (%s); use aio=threads",
			 strerror(-ret));
		return ret;
	}
	io_destroy(ctx);
	return 0;
}

static void file_aio_prep(struct file_aio_req *a, struct blk_request *req, int fd)
{
	struct file_piece p;
	bool rd = req->op == BLK_OP_READ;
	long long pos = (long long)a->rw.pos;

	file_rw_piece(&a->rw, req, &p);
	if (p.single && rd)
		io_prep_pread(&a->iocb, fd, p.buf, p.len, pos);
	else if (p.single)
		io_prep_pwrite(&a->iocb, fd, p.buf, p.len, pos);
	else if (rd)
		io_prep_preadv(&a->iocb, fd, p.iov, p.cnt, pos);
	else
		io_prep_pwritev(&a->iocb, fd, p.iov, p.cnt, pos);
	if (!rd && (req->flags & BLK_F_FUA))
		a->iocb.aio_rw_flags = RWF_DSYNC;
	io_set_eventfd(&a->iocb, a->th->efd);
	a->iocb.data = a;
}

static void file_aio_enqueue(struct file_aio_thread *th, struct file_aio_req *a)
{
	a->next = NULL;
	*th->tailp = a;
	th->tailp = &a->next;
	if (++th->queued > th->t.stats.queued_max)
		th->t.stats.queued_max = th->queued;
	loop_request_flush(th->t.loop, &th->flush);
}

static struct file_aio_req *file_aio_pop(struct file_aio_thread *th)
{
	struct file_aio_req *a = th->head;

	th->head = a->next;
	if (!th->head)
		th->tailp = &th->head;
	th->queued--;
	return a;
}

static void file_aio_finish(struct file_aio_thread *th, struct file_aio_req *a, int ret)
{
	th->t.stats.in_flight--;
	blk_complete(file_req_of(a), ret);
}

/* One io_submit for what is queued, up to the batch limit and the room in
 * the context. Runs from the flush hook or after reaping, never inside a
 * submit call, so failing a request here completes it directly. Returns
 * false when the kernel wants us to back off. */
static bool file_aio_submit_once(struct file_aio_thread *th)
{
	struct iocb *batch[FILE_AIO_DEPTH];
	struct file_aio_req *a;
	unsigned max = th->max_batch;
	int n = 0, ret;

	if (max == 0 || max > FILE_AIO_DEPTH - th->in_kernel)
		max = FILE_AIO_DEPTH - th->in_kernel;
	for (a = th->head; a && (unsigned)n < max; a = a->next)
		batch[n++] = &a->iocb;
	if (n == 0)
		return false;
	ret = io_submit(th->ctx, n, batch);
	th->t.stats.submit_calls++;
	if (ret == -EAGAIN) {
		th->t.stats.eagain++;
		return false;
	}
	if (ret < 0) {
		/* The first iocb was refused; the others were not looked at. */
		file_aio_finish(th, file_aio_pop(th), ret);
		return true;
	}
	th->in_kernel += (unsigned)ret;
	th->t.stats.submitted += (uint64_t)ret;
	th->t.stats.last_batch = (uint64_t)ret;
	if ((uint64_t)ret > th->t.stats.max_batch)
		th->t.stats.max_batch = (uint64_t)ret;
	for (int i = 0; i < ret; i++)
		file_aio_pop(th);
	return ret == n;
}

static void file_aio_kick(struct file_aio_thread *th)
{
	while (th->head && th->in_kernel < FILE_AIO_DEPTH) {
		if (!file_aio_submit_once(th))
			break;
	}
	/* Refused with nothing in flight: no completion will call us again. */
	if (th->head && th->in_kernel == 0 && !loop_timer_armed(&th->retry))
		loop_timer_arm(th->t.loop, &th->retry, loop_now_ns() + FILE_AIO_RETRY_NS);
}

static void file_aio_flush_cb(struct loop_flush *f)
{
	file_aio_kick(container_of(f, struct file_aio_thread, flush));
}

static void file_aio_retry_cb(struct loop_timer *t)
{
	file_aio_kick(container_of(t, struct file_aio_thread, retry));
}

/* Copy events out of the ring first and publish the new head, so that a
 * completion callback that re-enters the engine sees a consistent ring. */
static int file_aio_get_events(struct file_aio_thread *th, struct io_event *ev, int max)
{
	struct file_aio_ring *r = (struct file_aio_ring *)th->ctx;
	struct timespec zero = {0, 0};
	unsigned head, tail, nr;
	int n = 0;

	if (r->magic != FILE_AIO_RING_MAGIC || r->incompat_features != 0) {
		n = io_getevents(th->ctx, 0, max, ev, &zero);
		return n < 0 ? 0 : n;
	}
	nr = r->nr;
	head = r->head;
	tail = __atomic_load_n(&r->tail, __ATOMIC_ACQUIRE);
	while (head != tail && n < max) {
		ev[n++] = r->io_events[head];
		head = (head + 1) % nr;
	}
	__atomic_store_n(&r->head, head, __ATOMIC_RELEASE);
	return n;
}

static void file_aio_event(struct file_aio_thread *th, const struct io_event *ev)
{
	struct file_aio_req *a = ev->data;
	struct blk_request *req = file_req_of(a);
	long res = (long)ev->res;
	enum file_rw_next next;

	th->in_kernel--;
	next = file_rw_advance(&a->rw, req, res);
	if (next == FILE_RW_AGAIN) {
		th->t.stats.resubmits++;
		if (res < 0)
			th->t.stats.eagain++;
		file_aio_prep(a, req, a->iocb.aio_fildes);
		file_aio_enqueue(th, a);
		return;
	}
	file_aio_finish(th, a, next == FILE_RW_DONE ? 0 : a->rw.err);
}

static bool file_aio_reap(struct file_aio_thread *th)
{
	struct io_event ev[FILE_AIO_REAP];
	bool found = false;
	int n;

	/* Room was freed: send what waited (including continuations and
	 * requests submitted by the callbacks) after each chunk, not after the
	 * whole burst, for the reason loop_reap_cqes() gives. */
	do {
		n = file_aio_get_events(th, ev, FILE_AIO_REAP);
		for (int i = 0; i < n; i++)
			file_aio_event(th, &ev[i]);
		found |= n > 0;
		if (n > 0 && th->head)
			file_aio_kick(th);
	} while (n == FILE_AIO_REAP);
	return found;
}

static bool file_aio_poll_cb(struct loop_poll *p)
{
	struct file_aio_thread *th = container_of(p, struct file_aio_thread, poll);

	return th->in_kernel > 0 && file_aio_reap(th);
}

static void file_aio_fd_cb(struct loop_fd *h, uint32_t revents)
{
	struct file_aio_thread *th = container_of(h, struct file_aio_thread, fdh);
	uint64_t cnt;

	(void)revents;
	if (read(th->efd, &cnt, sizeof(cnt)) < 0 && errno != EAGAIN)
		log_warn("file: aio eventfd read: %s", strerror(errno));
	file_aio_reap(th);
}

static int file_aio_thread_init(struct file_aio_thread *th, struct loop *loop)
{
	int ret = io_setup(FILE_AIO_DEPTH, &th->ctx);

	if (ret < 0)
		return ret;
	th->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (th->efd < 0) {
		ret = -errno;
		goto fail_ctx;
	}
	th->fdh.fd = th->efd;
	th->fdh.events = EPOLLIN;
	th->fdh.cb = file_aio_fd_cb;
	ret = loop_fd_add(loop, &th->fdh);
	if (ret < 0)
		goto fail_efd;
	th->poll.poll = file_aio_poll_cb;
	loop_poll_add(loop, &th->poll);
	return 0;
fail_efd:
	close(th->efd);
fail_ctx:
	io_destroy(th->ctx);
	return ret;
}

static void *file_aio_ctor(struct blk_node *bs, struct loop *loop)
{
	struct file_aio_thread *th = calloc(1, sizeof(*th));
	int ret;

	if (!th)
		return NULL;
	th->t.loop = loop;
	th->t.bs = bs;
	th->tailp = &th->head;
	th->max_batch = file_max_batch(bs, loop);
	th->flush.cb = file_aio_flush_cb;
	th->retry.cb = file_aio_retry_cb;
	ret = file_aio_thread_init(th, loop);
	if (ret < 0) {
		log_err("file: cannot set up linux-aio for a loop: %s", strerror(-ret));
		free(th);
		return NULL;
	}
	return th;
}

void file_aio_detach(struct blk_node *bs, struct file_thread *t)
{
	struct file_aio_thread *th = (struct file_aio_thread *)t;

	(void)bs;
	assert(!th->head && th->in_kernel == 0 && !th->flush.queued);
	if (loop_timer_armed(&th->retry))
		loop_timer_cancel(th->t.loop, &th->retry);
	loop_poll_del(th->t.loop, &th->poll);
	loop_fd_del(th->t.loop, &th->fdh);
	close(th->efd);
	io_destroy(th->ctx);
	free(th);
}

int file_aio_submit(struct blk_node *bs, struct blk_request *req)
{
	struct file_aio_req *a = (struct file_aio_req *)req->drv.bytes;
	struct file_aio_thread *th = blk_thread_state(bs, req->loop, file_aio_ctor);

	if (!th)
		return -ENOMEM;
	a->th = th;
	file_rw_init(&a->rw, req);
	file_aio_prep(a, req, file_state(bs)->fd);
	file_aio_enqueue(th, a);
	th->t.stats.in_flight++;
	return 0;
}
