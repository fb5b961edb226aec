/* The copies a mirror or backup job has in flight (copy-pool.h).
 * THREADING RULE: the job loop, but init and free (main, idle). */
#include <errno.h>
#include <stdlib.h>

#include "job/copy-pool.h"
#include "loop/coroutine.h"
#include "util/compiler.h"

/* The job loop: a copy finished; run() goes on if it waits for one. */
static void pool_wake(struct copy_pool *p)
{
	if (p->waiting) {
		p->waiting = false;
		coroutine_enter(p->job->co);
	}
}

static void pool_op_done(struct bcopy_op *op, int ret)
{
	struct copy_pool_op *o = container_of(op, struct copy_pool_op, op);
	struct copy_pool *p = o->p;

	o->busy = false;
	p->nbusy--;
	if (ret < 0) {
		o->err = ret;
		o->err_read = op->read_failed;
	} else if (p->progress) {
		job_progress_add(p->job, op->r.hi - op->r.lo);
	}
	pool_wake(p);
}

int copy_pool_init(struct copy_pool *p, struct job *job, struct bcopy *bc, struct blk_node *target,
		   unsigned ops, uint32_t chunk)
{
	p->job = job;
	p->bc = bc;
	p->chunk = chunk;
	p->max_ops = ops < 1 ? 1 : ops > COPY_POOL_MAX ? COPY_POOL_MAX : ops;
	for (unsigned i = 0; i < p->max_ops; i++) {
		struct copy_pool_op *o = &p->ops[i];

		o->p = p;
		o->op.s = bc;
		o->op.cb = pool_op_done;
		o->op.buf = blk_alloc_buf(target, chunk);
		if (!o->op.buf)
			return -ENOMEM;
	}
	return 0;
}

void copy_pool_free(struct copy_pool *p)
{
	for (unsigned i = 0; i < COPY_POOL_MAX; i++) {
		free(p->ops[i].op.buf);
		p->ops[i].op.buf = NULL;
	}
}

void copy_pool_wait(struct copy_pool *p)
{
	p->waiting = true;
	coroutine_yield();
}

void copy_pool_step(struct copy_pool *p, uint64_t *cursor, bool quiesced, uint64_t retry_ns)
{
	if (!quiesced)
		copy_pool_fill(p, cursor);
	if (p->nbusy)
		copy_pool_wait(p);
	else
		job_sleep(p->job, retry_ns);
}

uint64_t copy_pool_busy_bytes(const struct copy_pool *p)
{
	uint64_t n = 0;

	for (unsigned i = 0; i < p->max_ops; i++)
		if (p->ops[i].busy)
			n += p->ops[i].op.r.hi - p->ops[i].op.r.lo;
	return n;
}

static struct copy_pool_op *pool_free_op(struct copy_pool *p)
{
	for (unsigned i = 0; i < p->max_ops; i++)
		if (!p->ops[i].busy && !p->ops[i].err)
			return &p->ops[i];
	return NULL;
}

void copy_pool_fill(struct copy_pool *p, uint64_t *cursor)
{
	struct copy_pool_op *o;

	while ((o = pool_free_op(p))) {
		if (!bcopy_claim_next(p->bc, *cursor, p->chunk, &o->op.r) &&
		    (*cursor == 0 || !bcopy_claim_next(p->bc, 0, p->chunk, &o->op.r)))
			return;
		*cursor = o->op.r.hi;
		job_ratelimit(p->job, o->op.r.hi - o->op.r.lo);
		o->busy = true;
		p->nbusy++;
		if (bcopy_op_start(&o->op)) { /* the range is to copy again */
			o->busy = false;
			p->nbusy--;
			o->err = -EIO;
			return;
		}
	}
}

int copy_pool_errors(struct copy_pool *p)
{
	bool resumed = false;

	/* A second pass after a stop: ops that failed while the job was paused
	 * sit in slots the first pass had passed. */
	for (unsigned i = 0; i < p->max_ops || (resumed && i < 2 * p->max_ops); i++) {
		struct copy_pool_op *o = &p->ops[i % p->max_ops];
		enum job_error_policy pol = o->err_read ? p->on_source_error : p->on_target_error;
		enum job_error_action a;
		int err = o->err;

		if (!err)
			continue;
		o->err = 0;
		/* One stop covers what failed before the resume: copied again. */
		if (resumed && job_policy_action(pol, err) == JOB_ACTION_STOP)
			continue;
		/* A stop pauses the job with none of its copies in flight, as
		 * QEMU's pause waits for a job's I/O: one that fails meanwhile
		 * joins this stop, not a second one after the resume. */
		if (job_policy_action(pol, err) == JOB_ACTION_STOP)
			while (p->nbusy)
				copy_pool_wait(p);
		a = job_error_action(p->job, pol, o->err_read, err);
		if (a == JOB_ACTION_REPORT)
			return err;
		resumed |= a == JOB_ACTION_STOP;
	}
	return 0;
}

static void flush_done(struct blk_request *req, int ret)
{
	struct copy_pool *p = req->opaque;

	p->ops[0].err = ret;
	p->nbusy--;
	pool_wake(p);
}

int copy_pool_flush(struct copy_pool *p)
{
	struct blk_request req = {.op = BLK_OP_FLUSH, .cb = flush_done, .opaque = p};
	int ret;

	p->ops[0].err = 0;
	p->nbusy++;
	ret = blk_submit_child(p->bc->target, &req);
	if (ret) {
		p->nbusy--;
		return ret;
	}
	while (p->nbusy)
		copy_pool_wait(p);
	ret = p->ops[0].err;
	p->ops[0].err = 0;
	return ret;
}
