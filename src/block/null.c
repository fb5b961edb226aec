/* null protocol driver: a device of a given size that stores nothing, for
 * benchmarks and tests. Reads leave the buffer untouched unless read-zeroes=on.
 * A request completes at the end of the round, after latency-ns on a loop
 * timer (mode=timer), or on the thread pool holding a worker busy for
 * latency-ns (mode=threads, a model of a synchronous device).
 *
 * Threading: the node's state is read-only after open; a request's context
 * (timer or pool job) lives in req->drv and belongs to its loop's thread,
 * or to the worker while the job runs. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-driver.h"
#include "loop/thread-pool.h"
#include "util/clock.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/opts.h"

struct null_state {
	uint64_t latency_ns;
	bool read_zeroes;
	bool threads;
};

/* Per-request context in req->drv: one of the two, by mode. */
struct null_job {
	struct tp_work work;
	struct blk_request *req;
	uint64_t latency_ns;
	bool read_zeroes;
};

_Static_assert(sizeof(struct null_job) <= BLK_DRV_CTX_SIZE, "null job too big");
_Static_assert(sizeof(struct loop_timer) <= BLK_DRV_CTX_SIZE, "null timer too big");

static int null_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	struct null_state *s;
	const char *mode = kv_get(opts, "mode");
	uint64_t size = 0, lat = 0;
	bool rz = false;

	if (!kv_get(opts, "size")) {
		snprintf(err, errlen, "null: option size=SIZE is required");
		return -EINVAL;
	}
	if (kv_get_size(opts, "size", &size)) {
		snprintf(err, errlen, "null: bad size '%s' (bytes, or a K, M, G, T, P or E suffix)",
			 kv_get(opts, "size"));
		return -EINVAL;
	}
	if (kv_get_bool(opts, "read-zeroes", &rz) || kv_get_u64(opts, "latency-ns", &lat)) {
		snprintf(err, errlen, "null: bad read-zeroes or latency-ns");
		return -EINVAL;
	}
	if (mode && strcmp(mode, "timer") != 0 && strcmp(mode, "threads") != 0) {
		snprintf(err, errlen, "null: mode must be timer or threads, not '%s'", mode);
		return -EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->latency_ns = lat;
	s->read_zeroes = rz;
	s->threads = mode && strcmp(mode, "threads") == 0;
	bs->opaque = s;
	bs->size = size;
	return 0;
}

static void null_close(struct blk_node *bs)
{
	free(bs->opaque);
	bs->opaque = NULL;
}

/* The request's effect on its buffers and result fields. */
static void null_execute(struct blk_request *req, bool read_zeroes)
{
	if (req->op == BLK_OP_READ && read_zeroes)
		iov_memset(req->iov, req->iovcnt, 0, 0, req->len);
	if (req->op == BLK_OP_BLOCK_STATUS) {
		req->status =
			BLK_STATUS_ALLOCATED | (read_zeroes ? BLK_STATUS_ZERO : BLK_STATUS_DATA);
		req->status_len = req->len;
	}
}

static void null_timer_cb(struct loop_timer *t)
{
	blk_complete(blk_req_from_drv(t), 0);
}

static inline void null_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* Worker thread: busy-wait, since a sleep would overshoot the latency. */
static int null_job_fn(struct tp_work *w)
{
	struct null_job *j = (struct null_job *)w;
	uint64_t end = clock_mono_ns() + j->latency_ns;

	null_execute(j->req, j->read_zeroes);
	while (j->latency_ns && clock_mono_ns() < end)
		null_cpu_relax();
	return 0;
}

static void null_job_done(struct tp_work *w, int ret)
{
	struct null_job *j = (struct null_job *)w;

	blk_complete(j->req, ret);
}

static int null_submit_threads(const struct null_state *s, struct blk_request *req)
{
	struct null_job *j = (struct null_job *)req->drv.bytes;

	memset(&j->work, 0, sizeof(j->work));
	j->work.fn = null_job_fn;
	j->work.done = null_job_done;
	j->req = req;
	j->latency_ns = s->latency_ns;
	j->read_zeroes = s->read_zeroes;
	tp_submit(req->loop, &j->work);
	return 0;
}

/* Latency or thread-pool completion. */
static int null_submit_slow(const struct null_state *s, struct blk_request *req)
{
	struct loop_timer *t;

	if (s->threads)
		return null_submit_threads(s, req);
	null_execute(req, s->read_zeroes);
	t = (struct loop_timer *)req->drv.bytes;
	t->heap_idx = 0;
	t->cb = null_timer_cb;
	loop_timer_arm(req->loop, t, loop_now_ns() + s->latency_ns);
	return 0;
}

static int null_submit(struct blk_node *bs, struct blk_request *req)
{
	const struct null_state *s = bs->opaque;

	if (unlikely(s->threads || s->latency_ns))
		return null_submit_slow(s, req);
	if (s->read_zeroes || req->op == BLK_OP_BLOCK_STATUS)
		null_execute(req, s->read_zeroes);
	blk_complete_deferred(req, 0);
	return 0;
}

static int null_truncate(struct blk_node *bs, uint64_t size)
{
	bs->size = size;
	return 0;
}

static bool null_can(struct blk_node *bs)
{
	(void)bs;
	return true;
}

const struct blk_driver blk_drv_null = {
	.name = "null",
	.open = null_open,
	.close = null_close,
	.submit = null_submit,
	.truncate = null_truncate,
	.can_discard = null_can,
	.can_write_zeroes = null_can,
	.can_fua = null_can,
	.can_block_status = null_can,
	.can_multi_conn = null_can,
};
