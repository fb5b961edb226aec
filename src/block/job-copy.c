/* The bounded copy of a job: ranges of one node read and written to another
 * in chunks, at most max_inflight chunks (and their buffers) at a time, at
 * the job's speed, with the job's error actions; and the allocation walk
 * of a backing chain that stream and commit copy by.
 *
 * With a write guard (stream), each chunk is locked against guest writes
 * from before its read until after its write, and is sent with
 * blk_submit_child so that a drain of the node, which waits for the guest
 * writes the lock holds back, never holds the chunk back in turn; a new
 * chunk waits for such a drain to end before it takes its lock.
 *
 * With flush_every, the file under dst that holds the data is flushed each
 * time that many bytes more were written (flush-behind), one flush at a time.
 *
 * THREADING RULE: job loop only (the job's coroutine and the completions of
 * its requests, which run on that loop). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block/job.h"
#include "loop/coroutine.h"

#define COPY_QUIESCE_POLL_NS 1000000ull /* a drain is looked at again every 1 ms */

struct copy_chunk {
	struct job_copy *c;
	struct blk_request req;
	struct iovec iov;
	void *buf;
	uint64_t off, len;
	int err;
	bool err_read, locked;
	struct copy_chunk *next; /* free or failed list */
};

struct job_copy {
	struct job *job;
	struct blk_node *src, *dst;
	struct job_copy_opts o;
	struct copy_chunk *chunks, *free, *failed;
	unsigned inflight;
	int error;    /* first reported error */
	bool waiting; /* the coroutine waits for a chunk to finish */
	/* Flush-behind (o.flush_every): bytes written since the last flush
	 * went out, and that flush, at most one in flight. */
	uint64_t unflushed;
	bool flushing;
	struct blk_request flush_req;
};

static uint64_t max_u64(uint64_t a, uint64_t b)
{
	return a > b ? a : b;
}

int job_copy_new(struct job *job, struct blk_node *src, struct blk_node *dst,
		 const struct job_copy_opts *o, struct job_copy **out)
{
	struct job_copy *c = calloc(1, sizeof(*c));
	uint64_t align = max_u64(max_u64(src->align, dst->align), 512);

	if (!c)
		return -ENOMEM;
	c->job = job;
	c->src = src;
	c->dst = dst;
	c->o = *o;
	if (!c->o.chunk)
		c->o.chunk = JOB_COPY_CHUNK_DEFAULT;
	c->o.chunk = (c->o.chunk + align - 1) / align * align;
	if (!c->o.max_inflight)
		c->o.max_inflight = JOB_COPY_INFLIGHT_DEFAULT;
	c->chunks = calloc(c->o.max_inflight, sizeof(*c->chunks));
	for (unsigned i = 0; c->chunks && i < c->o.max_inflight; i++) {
		struct copy_chunk *ch = &c->chunks[i];

		ch->c = c;
		ch->buf = blk_alloc_buf(src->mem_align > dst->mem_align ? src : dst, c->o.chunk);
		if (!ch->buf)
			break;
		ch->next = c->free;
		c->free = ch;
	}
	if (!c->chunks || !c->free || (c->free - c->chunks) + 1 != (long)c->o.max_inflight) {
		job_copy_free(c);
		return -ENOMEM;
	}
	*out = c;
	return 0;
}

void job_copy_free(struct job_copy *c)
{
	if (!c)
		return;
	for (unsigned i = 0; c->chunks && i < c->o.max_inflight; i++)
		free(c->chunks[i].buf);
	free(c->chunks);
	free(c);
}

unsigned job_copy_inflight(const struct job_copy *c)
{
	return c->inflight;
}

static void copy_wake(struct job_copy *c)
{
	if (c->waiting) {
		c->waiting = false;
		coroutine_enter(c->job->co);
	}
}

static void chunk_unlock(struct copy_chunk *ch)
{
	if (ch->locked) {
		ch->locked = false;
		job_guard_unlock(ch->c->o.guard, ch->off, ch->len);
	}
}

static void flush_cb(struct blk_request *req, int ret)
{
	struct job_copy *c = req->opaque;

	c->flushing = false;
	/* Fatal whatever the error policy: Linux reports a failed write-back
	 * once per file, so a retried flush (or the one before the header
	 * change) could succeed with the data lost. */
	if (ret && !c->error)
		c->error = ret;
	copy_wake(c);
}

/* Where dst keeps the data the chunks write: a format node's data file or
 * the file it forwards to, else dst. Flushed there and not in dst itself:
 * a qcow2 flush holds the metadata lock while the file's write-back runs,
 * and every allocating write of the copy would wait for it. */
static struct blk_node *copy_data_node(struct blk_node *dst)
{
	struct blk_node *d = blk_child(dst, BLK_ROLE_DATA_FILE);

	return d ? d : dst->next ? dst->next : dst;
}

/* Flush-behind: once flush_every bytes were written since the last flush,
 * one goes out (never two at a time), so that the write-back of the copy
 * runs while it copies, not all of it in the flush at the job's end. */
static void copy_flush_behind(struct job_copy *c)
{
	struct blk_node *bs = copy_data_node(c->dst);
	int ret;

	if (!c->o.flush_every || c->flushing || c->error || c->unflushed < c->o.flush_every)
		return;
	c->unflushed = 0;
	c->flushing = true;
	c->flush_req = (struct blk_request){.op = BLK_OP_FLUSH, .cb = flush_cb, .opaque = c};
	ret = c->o.guard ? blk_submit_child(bs, &c->flush_req) : blk_submit(bs, &c->flush_req);
	if (ret)
		flush_cb(&c->flush_req, ret);
}

static void chunk_end(struct copy_chunk *ch, int ret, bool is_read)
{
	struct job_copy *c = ch->c;

	chunk_unlock(ch);
	c->inflight--;
	if (ret) {
		ch->err = ret;
		ch->err_read = is_read;
		ch->next = c->failed;
		c->failed = ch;
	} else {
		if (c->o.progress)
			job_progress_add(c->job, ch->len);
		c->unflushed += ch->len;
		copy_flush_behind(c);
		if (c->o.ops && c->o.ops->done)
			c->o.ops->done(c, ch->off, ch->len, 0, c->o.opaque);
		ch->next = c->free;
		c->free = ch;
	}
	copy_wake(c);
}

static int chunk_submit(struct copy_chunk *ch, struct blk_node *bs)
{
	return ch->c->o.guard ? blk_submit_child(bs, &ch->req) : blk_submit(bs, &ch->req);
}

static void chunk_write_cb(struct blk_request *req, int ret)
{
	chunk_end(req->opaque, ret, false);
}

static void chunk_write(struct copy_chunk *ch, bool zero)
{
	struct job_copy *c = ch->c;
	int ret;

	ch->req = (struct blk_request){.op = zero ? BLK_OP_WRITE_ZEROES : BLK_OP_WRITE,
				       .flags = c->o.write_flags,
				       .offset = ch->off,
				       .len = ch->len,
				       .cb = chunk_write_cb,
				       .opaque = ch};
	if (zero && c->o.zero_unmap)
		ch->req.flags |= BLK_F_MAY_UNMAP;
	if (!zero) {
		ch->iov = (struct iovec){.iov_base = ch->buf, .iov_len = ch->len};
		ch->req.iov = &ch->iov;
		ch->req.iovcnt = 1;
	}
	ret = chunk_submit(ch, c->dst);
	if (ret)
		chunk_end(ch, ret, false);
}

static void chunk_read_cb(struct blk_request *req, int ret)
{
	struct copy_chunk *ch = req->opaque;
	struct job_copy *c = ch->c;

	if (ret) {
		chunk_end(ch, ret, true);
		return;
	}
	if (c->o.ops && c->o.ops->before_write &&
	    c->o.ops->before_write(c, ch->off, ch->len, c->o.opaque)) {
		chunk_end(ch, 0, false);
		return;
	}
	chunk_write(ch, false);
}

/* Wait (yield) until a chunk finishes. */
static void copy_wait_one(struct job_copy *c)
{
	c->waiting = true;
	coroutine_yield();
}

/* Block status of the source for the chunk: does it read as zeroes? */
struct status_wait {
	struct job_copy *c;
	bool done;
	int ret;
};

static void status_cb(struct blk_request *req, int ret)
{
	struct status_wait *w = req->opaque;

	w->ret = ret;
	w->done = true;
	if (w->c->waiting) {
		w->c->waiting = false;
		coroutine_enter(w->c->job->co);
	}
}

static bool chunk_is_zero(struct job_copy *c, struct copy_chunk *ch)
{
	struct status_wait w = {.c = c};
	struct blk_request r = {.op = BLK_OP_BLOCK_STATUS,
				.offset = ch->off,
				.len = ch->len,
				.cb = status_cb,
				.opaque = &w};

	if (!c->o.detect_zeroes || !c->src->has_block_status || blk_submit(c->src, &r))
		return false;
	while (!w.done)
		copy_wait_one(c);
	return !w.ret && (r.status & BLK_STATUS_ZERO) && r.status_len >= ch->len;
}

/* A drain of the nodes: the chunk waits for its end (guard mode only). */
static void copy_wait_unquiesced(struct job_copy *c)
{
	for (unsigned i = 0; i < 100000 && !job_cancelled(c->job); i++) {
		if (!atomic_load(&c->src->quiesce) && !atomic_load(&c->dst->quiesce))
			return;
		job_sleep(c->job, COPY_QUIESCE_POLL_NS);
	}
}

static void chunk_start(struct job_copy *c, struct copy_chunk *ch)
{
	int ret;

	c->inflight++;
	if (c->o.guard) {
		copy_wait_unquiesced(c);
		job_guard_lock(c->o.guard, ch->off, ch->len);
		ch->locked = true;
	}
	if (chunk_is_zero(c, ch)) {
		chunk_write(ch, true);
		return;
	}
	ch->iov = (struct iovec){.iov_base = ch->buf, .iov_len = ch->len};
	ch->req = (struct blk_request){.op = BLK_OP_READ,
				       .offset = ch->off,
				       .len = ch->len,
				       .iov = &ch->iov,
				       .iovcnt = 1,
				       .cb = chunk_read_cb,
				       .opaque = ch};
	ret = chunk_submit(ch, c->src);
	if (ret)
		chunk_end(ch, ret, true);
}

/* A stop pauses the job with none of its chunks in flight, as QEMU's pause
 * waits for a job's I/O: a chunk that fails meanwhile joins c->failed and
 * this stop, not a second one after the resume. */
static enum job_error_action copy_error_action(struct job_copy *c, struct copy_chunk *ch,
					       enum job_error_policy p)
{
	if (job_policy_action(p, ch->err) == JOB_ACTION_STOP)
		while (c->inflight)
			copy_wait_one(c);
	return job_error_action(c->job, p, ch->err_read, ch->err);
}

/* The failed chunks: the error action for each. 0, or the error to report. */
static int copy_handle_failed(struct job_copy *c)
{
	struct copy_chunk *stopped = NULL; /* failed before the resume: retried */

	while (c->failed && !c->error) {
		struct copy_chunk *ch = c->failed;
		enum job_error_policy p =
			ch->err_read ? c->o.on_source_error : c->o.on_target_error;
		enum job_error_action a;

		c->failed = ch->next;
		/* One stop covers every chunk that failed before the resume. */
		if (stopped && job_policy_action(p, ch->err) == JOB_ACTION_STOP)
			a = JOB_ACTION_STOP;
		else
			a = copy_error_action(c, ch, p);
		if (a == JOB_ACTION_STOP && !job_cancelled(c->job)) {
			ch->next = stopped;
			stopped = ch;
			continue;
		}
		if (a == JOB_ACTION_REPORT)
			c->error = ch->err;
		else if (c->o.ops && c->o.ops->done)
			c->o.ops->done(c, ch->off, ch->len, ch->err, c->o.opaque);
		ch->next = c->free;
		c->free = ch;
	}
	while (stopped) { /* after the list: a retry that fails at once joins it anew */
		struct copy_chunk *ch = stopped;

		stopped = ch->next;
		if (c->error) {
			ch->next = c->free;
			c->free = ch;
		} else {
			chunk_start(c, ch);
		}
	}
	return c->error;
}

/* A free chunk, waiting for one; NULL on error or cancel (*ret). */
static struct copy_chunk *copy_get_chunk(struct job_copy *c, int *ret)
{
	for (;;) {
		*ret = copy_handle_failed(c);
		if (!*ret && job_cancelled(c->job))
			*ret = -ECANCELED;
		if (*ret)
			return NULL;
		if (c->free) {
			struct copy_chunk *ch = c->free;

			c->free = ch->next;
			return ch;
		}
		copy_wait_one(c);
	}
}

int job_copy_range(struct job_copy *c, uint64_t off, uint64_t len)
{
	uint64_t end = off + len > c->src->size ? c->src->size : off + len;
	int ret = 0;

	for (uint64_t pos = off; pos < end;) {
		uint64_t n = end - pos < c->o.chunk ? end - pos : c->o.chunk;
		struct copy_chunk *ch;

		job_pause_point(c->job);
		ch = copy_get_chunk(c, &ret);
		if (!ch)
			return ret;
		job_ratelimit(c->job, n);
		ch->off = pos;
		ch->len = n;
		chunk_start(c, ch);
		pos += n;
	}
	return copy_handle_failed(c);
}

int job_copy_wait(struct job_copy *c)
{
	int ret;

	for (;;) {
		while (c->inflight || c->flushing)
			copy_wait_one(c);
		ret = copy_handle_failed(c);
		if (ret || !c->inflight)
			return ret;
	}
}

/* ---- allocation in a chain ------------------------------------------------------ */

struct alloc_wait {
	struct coroutine *co;
	bool done, waiting;
	int ret;
};

static void alloc_cb(struct blk_request *req, int ret)
{
	struct alloc_wait *w = req->opaque;

	w->ret = ret;
	w->done = true;
	if (w->waiting)
		coroutine_enter(w->co);
}

/* Block status of one layer, waiting in the coroutine. */
static int layer_status(struct blk_node *bs, uint64_t off, uint64_t len, uint32_t *st,
			uint64_t *pnum)
{
	struct alloc_wait w = {.co = coroutine_self()};
	struct blk_request r = {.op = BLK_OP_BLOCK_STATUS,
				.flags = BLK_F_ALLOC_ONLY,
				.offset = off,
				.len = len,
				.cb = alloc_cb,
				.opaque = &w};
	int ret;

	if (off >= bs->size) { /* past a shorter backing file: reads zeroes */
		*st = 0;
		*pnum = len;
		return 0;
	}
	ret = blk_submit(bs, &r);
	if (ret)
		return ret;
	while (!w.done) {
		w.waiting = true;
		coroutine_yield();
		w.waiting = false;
	}
	if (w.ret)
		return w.ret;
	*st = r.status;
	*pnum = r.status_len ? r.status_len : 1;
	return 0;
}

int job_allocated_above(struct blk_node *top, struct blk_node *base, uint64_t off, uint64_t len,
			bool *allocated, uint64_t *pnum)
{
	uint64_t n = len;

	for (struct blk_node *bs = top; bs && bs != base;) {
		uint32_t st;
		uint64_t got;
		int ret = layer_status(bs, off, n, &st, &got);

		if (ret)
			return ret;
		if (st & BLK_STATUS_ALLOCATED) {
			*allocated = true;
			*pnum = got;
			return 0;
		}
		/* Unallocated here for got bytes: look below for that much. */
		n = got < n ? got : n;
		bs = blk_child(bs, BLK_ROLE_BACKING);
	}
	*allocated = false;
	*pnum = n;
	return 0;
}
