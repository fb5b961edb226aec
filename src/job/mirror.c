/* The mirror job (blockdev-mirror, and active block-commit, which is a
 * mirror of the active layer into its base): a mirror-top filter goes above
 * the source in its place for every user (exports), and records each guest
 * write in the job's copy state (block-copy.h) once it is done; run()
 * copies whatever the state says, up to max_ops ranges in flight, until
 * nothing is left (READY), and keeps copying what the guest dirties.
 * job-complete, or a soft cancel when READY, ends run(); prepare then
 * drains the filter and the target, copies what is still dirty, flushes the
 * target and - for a complete - puts the target in the filter's place: every
 * user switches at once. In write-blocking mode a guest write reaches the
 * target before it is acknowledged (mirror-top.c).
 *
 * THREADING RULE: the QMP handlers, complete, soft_cancel, prepare, clean on
 * the main thread; run() and the copies' completions on the job loop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-copy.h"
#include "block/cbw.h"
#include "block/dirty-bitmap.h"
#include "block/graph.h"
#include "block/job.h"
#include "job/chain.h"
#include "job/copy-pool.h"
#include "job/mirror.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/opts.h"

#define MIRROR_MAX_OPS 16               /* QEMU's MAX_IN_FLIGHT */
#define MIRROR_CHUNK (1u << 20)         /* bytes per copy, at most */
#define MIRROR_BUF_DEFAULT (16u << 20)  /* QEMU's default buf-size */
#define MIRROR_IDLE_NS 5000000ull       /* READY and clean: look again after 5 ms */
#define MIRROR_RETRY_NS 1000000ull      /* drained, or all ranges busy: 1 ms */
#define MIRROR_STATUS_MAX (64ull << 20) /* bytes asked of block status at a time */

enum mirror_sync { MIRROR_SYNC_FULL, MIRROR_SYNC_TOP, MIRROR_SYNC_NONE };

struct mirror_job {
	struct job job;
	/* Immutable once started. */
	struct blk_node *source, *target, *base; /* base: active commit's (target) */
	enum mirror_sync sync;
	bool write_blocking;
	uint32_t chunk;
	struct mirror_pre *pre; /* the copy state and the filter */
	struct bcopy *bc;       /* &pre->bc */
	/* Job loop. */
	struct copy_pool pool;
	bool ready;
	/* Main writes, the job loop reads. */
	atomic_bool should_complete;
	bool soft; /* main: a soft cancel, no switch-over */
	/* Main. */
	bool switched; /* the target took the filter's place */
	bool base_made_rw;
	struct chain_perm tperm; /* what the job holds of the target */
};

/* ---- job loop ---------------------------------------------------------------- */

/* What the copy starts with: sync=full everything (active commit: what
 * the chain above base holds), top what the source's own layer holds,
 * none nothing. */
static int mirror_init_todo(struct mirror_job *s)
{
	struct blk_node *above = s->base ? s->base : chain_backing(s->source);
	uint64_t size = s->source->size, n;

	if (s->sync == MIRROR_SYNC_NONE)
		return 0;
	if (s->sync == MIRROR_SYNC_FULL && !s->base) {
		bcopy_mark(s->bc, 0, size);
		return 0;
	}
	for (uint64_t off = 0; off < size; off += n) {
		uint64_t want = size - off > MIRROR_STATUS_MAX ? MIRROR_STATUS_MAX : size - off;
		bool alloc;
		int ret = job_allocated_above(s->source, above, off, want, &alloc, &n);

		if (ret)
			return ret;
		if (alloc)
			bcopy_mark(s->bc, off, n);
		job_pause_point(&s->job);
		if (job_cancelled(&s->job))
			return -ECANCELED;
	}
	return 0;
}

static bool mirror_quiesced(struct mirror_job *s)
{
	return atomic_load(&s->source->quiesce) || atomic_load(&s->target->quiesce);
}

/* One round of the main loop of run(): 1 to go on, 0 done, -errno. */
static int mirror_round(struct mirror_job *s, uint64_t *cursor)
{
	struct job *job = &s->job;
	uint64_t left;
	int ret = copy_pool_errors(&s->pool);

	if (ret)
		return ret;
	if (job_cancelled(job))
		return -ECANCELED;
	left = bcopy_remaining(s->bc);
	/* What is in flight is counted: its completion adds to the current. */
	job_progress_set_total(job, atomic_load(&job->progress_current) + left +
					    copy_pool_busy_bytes(&s->pool));
	if (left == 0 && s->pool.nbusy == 0) {
		if (!s->ready) {
			s->ready = true;
			job_ready(job);
		}
		if (atomic_load(&s->should_complete))
			return 0;
		job_sleep(job, MIRROR_IDLE_NS);
		return 1;
	}
	copy_pool_step(&s->pool, cursor, mirror_quiesced(s), MIRROR_RETRY_NS);
	return 1;
}

static int mirror_run(struct job *job)
{
	struct mirror_job *s = (struct mirror_job *)job;
	uint64_t cursor = 0;
	int ret = mirror_init_todo(s);

	while (ret == 0) {
		ret = mirror_round(s, &cursor);
		if (ret != 1)
			break;
		ret = 0;
		job_pause_point(job);
	}
	while (s->pool.nbusy)
		copy_pool_wait(&s->pool);
	return ret;
}

/* ---- main: the end ---------------------------------------------------------------- */

struct sync_wait {
	bool done;
	int ret;
};

static void sync_op_done(struct bcopy_op *op, int ret)
{
	struct sync_wait *w = op->opaque;

	w->ret = ret;
	w->done = true;
}

static void sync_req_done(struct blk_request *req, int ret)
{
	sync_op_done(req->opaque, ret);
}

/* Drained: copy what is still dirty, then flush the target, with child
 * requests on the control loop (a drain holds other requests). */
static int mirror_converge(struct mirror_job *s)
{
	struct sync_wait w;
	struct bcopy_op op = {.s = s->bc, .cb = sync_op_done, .opaque = &w};
	struct blk_request flush = {.op = BLK_OP_FLUSH, .cb = sync_req_done};
	struct loop *prev;
	int ret = blk_ctl_enter(&prev);
	bool entered = ret == 0;

	op.buf = entered ? blk_alloc_buf(s->target, s->chunk) : NULL;
	if (!op.buf)
		ret = -ENOMEM;
	while (!ret && bcopy_claim_next(s->bc, 0, s->chunk, &op.r)) {
		w.done = false;
		ret = bcopy_op_start(&op);
		while (!ret && !w.done)
			loop_run_once(loop_current(), true);
		ret = ret ? ret : w.ret;
	}
	if (!ret) {
		w.done = false;
		flush.opaque = (void *)&op;
		ret = blk_submit_child(s->target, &flush);
		while (!ret && !w.done)
			loop_run_once(loop_current(), true);
		ret = ret ? ret : w.ret;
	}
	free(op.buf);
	if (entered)
		blk_ctl_leave(prev);
	return ret;
}

/* Give the target back its users' permissions (the job's go). */
static void mirror_drop_perm(struct mirror_job *s)
{
	chain_perm_drop(&s->tperm);
}

static int mirror_switch(struct mirror_job *s, char *err, size_t errlen)
{
	int ret = blk_drain_begin(s->pre->filter);

	if (ret) {
		snprintf(err, errlen, "Could not drain node '%s'", blk_node_name(s->pre->filter));
		return ret;
	}
	ret = blk_drain_begin(s->target);
	if (ret) {
		blk_drain_end(s->pre->filter);
		snprintf(err, errlen, "Could not drain node '%s'", blk_node_name(s->target));
		return ret;
	}
	ret = mirror_converge(s);
	if (ret)
		snprintf(err, errlen, "Could not copy to node '%s': %s", blk_node_name(s->target),
			 strerror(-ret));
	if (!ret && !s->soft) {
		mirror_drop_perm(s);
		ret = blk_replace_node_grow(s->pre->filter, s->target, err, errlen);
		s->switched = ret == 0;
	}
	blk_drain_end(s->target);
	blk_drain_end(s->pre->filter);
	return ret;
}

static int mirror_prepare(struct job *job, char *err, size_t errlen)
{
	return mirror_switch((struct mirror_job *)job, err, errlen);
}

/* The filter leaves (main): its users - none after a switch-over - go
 * back to the source. */
static void pre_filter_remove(struct mirror_pre *pre, bool switched)
{
	struct blk_node *f = pre->filter;
	char err[256];
	int ret = 0;

	if (!f)
		return;
	if (!switched) {
		ret = blk_drain_begin(f);
		if (!ret) {
			ret = blk_replace_node(f, pre->bc.source, err, sizeof(err));
			blk_drain_end(f);
		}
	}
	if (ret) {
		log_warn("mirror: node '%s' stays: %s", blk_node_name(f), err);
		return; /* keeps serving through the filter */
	}
	blk_close(f);
	pre->filter = NULL;
}

static void mirror_filter_remove(struct mirror_job *s)
{
	pre_filter_remove(s->pre, s->switched);
}

static void mirror_clean(struct job *job)
{
	struct mirror_job *s = (struct mirror_job *)job;
	char err[256];

	mirror_filter_remove(s);
	mirror_drop_perm(s);
	if (s->base_made_rw && !s->switched &&
	    blk_set_backing_read_only(s->base, true, err, sizeof(err)))
		log_warn("commit: %s", err); /* stays writable: still correct */
	s->base_made_rw = false;
}

static int mirror_complete(struct job *job, char *err, size_t errlen)
{
	struct mirror_job *s = (struct mirror_job *)job;

	if (!s->ready) {
		snprintf(err, errlen, "The active block job '%s' cannot be completed", job->id);
		return -EBUSY;
	}
	atomic_store(&s->should_complete, true);
	job_enter(job);
	return 0;
}

/* block-job-cancel without force on a READY mirror: finish as a complete
 * would, target in step with the source, but switch nobody over. */
static bool mirror_soft_cancel(struct job *job)
{
	struct mirror_job *s = (struct mirror_job *)job;

	if (job->status != JOB_STATUS_READY)
		return false;
	s->soft = true;
	atomic_store(&s->should_complete, true);
	job_enter(job);
	return true;
}

static void mirror_free(struct job *job)
{
	struct mirror_job *s = (struct mirror_job *)job;

	copy_pool_free(&s->pool);
	mirror_pre_free(s->pre);
}

/* A mirror, and an active commit (a mirror into the base), differ only in
 * the type query-jobs shows. */
#define MIRROR_DRIVER(type_)                                                                       \
	{                                                                                          \
		.type = (type_), .size = sizeof(struct mirror_job), .run = mirror_run,             \
		.complete = mirror_complete, .prepare = mirror_prepare, .clean = mirror_clean,     \
		.soft_cancel = mirror_soft_cancel, .free = mirror_free,                            \
	}

static const struct job_driver mirror_driver = MIRROR_DRIVER("mirror");
static const struct job_driver active_commit_driver = MIRROR_DRIVER("commit");

/* ---- main: the start ---------------------------------------------------------------- */

static int mirror_bufs(struct mirror_job *s, const struct mirror_params *p)
{
	uint64_t ops = (p->buf_size ? p->buf_size : MIRROR_BUF_DEFAULT) / s->chunk;
	int ret = copy_pool_init(&s->pool, &s->job, s->bc, s->target,
				 ops > MIRROR_MAX_OPS ? MIRROR_MAX_OPS : (unsigned)ops, s->chunk);

	s->pool.progress = true;
	s->pool.on_source_error = p->on_source_error;
	s->pool.on_target_error = p->on_target_error;
	return ret;
}

void mirror_pre_free(struct mirror_pre *pre)
{
	if (!pre)
		return;
	pre_filter_remove(pre, false);
	if (pre->filter) { /* still serving through it: its state stays */
		log_warn("mirror: copy state kept for node '%s'", blk_node_name(pre->filter));
		return;
	}
	bcopy_destroy(&pre->bc);
	free(pre);
}

static int pre_filter_insert(struct mirror_pre *pre, const struct mirror_params *p, char *err,
			     size_t errlen)
{
	struct kv_opts o = {0};
	struct blk_node *f, *src = p->source;
	int ret;

	blk_ref(src, NULL); /* the filter's `file` link takes it over */
	ret = blk_open_node("mirror_top", src, NULL, 0, &o, &f, err, errlen);
	kv_free(&o);
	if (ret)
		return ret;
	if (p->filter_node_name && blk_node_set_name(f, p->filter_node_name, err, errlen)) {
		blk_close(f);
		return -EINVAL;
	}
	mirror_top_attach(f, &pre->bc, p->write_blocking);
	ret = blk_drain_begin(src);
	if (ret) {
		snprintf(err, errlen, "Could not drain node '%s'", blk_node_name(src));
	} else {
		ret = blk_replace_node(src, f, err, errlen);
		blk_drain_end(src);
	}
	if (ret) {
		blk_close(f);
		return ret;
	}
	pre->filter = f;
	return 0;
}

/* Before the job exists, so that the references it takes stay on the
 * source: the filter's insertion moves every user of the source. */
int mirror_pre_new(const struct mirror_params *p, struct mirror_pre **out, char *err, size_t errlen)
{
	struct mirror_pre *pre = calloc(1, sizeof(*pre));
	int ret;

	if (!pre) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	pre->gran = p->granularity ? p->granularity : blk_dirty_bitmap_default_gran(p->target);
	if (bcopy_init(&pre->bc, p->source->size, pre->gran, false)) {
		free(pre);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	pre->bc.source = p->source;
	pre->bc.target = p->target;
	ret = pre_filter_insert(pre, p, err, errlen);
	if (ret) {
		mirror_pre_free(pre);
		return ret;
	}
	*out = pre;
	return 0;
}

/* The target is the job's to write: nobody else (another process, a
 * writable export) may write it meanwhile. */
static int mirror_take_target(struct mirror_job *s, char *err, size_t errlen)
{
	return chain_perm_take(&s->tperm, s->target, BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE,
			       BLK_PERM_WRITE | BLK_PERM_RESIZE, err, errlen);
}

int mirror_setup(struct job *job, const struct mirror_params *p, struct mirror_pre *pre, char *err,
		 size_t errlen)
{
	struct mirror_job *s = (struct mirror_job *)job;
	int ret;

	s->pre = pre;
	s->bc = &pre->bc;
	s->source = p->source;
	s->target = p->target;
	s->base = p->commit ? p->target : NULL;
	s->sync = (enum mirror_sync)p->sync;
	s->write_blocking = p->write_blocking;
	s->chunk = pre->gran > MIRROR_CHUNK ? pre->gran : MIRROR_CHUNK;
	ret = mirror_bufs(s, p);
	if (ret) {
		snprintf(err, errlen, "out of memory");
		return ret;
	}
	ret = job_block_node(job, s->source, err, errlen);
	/* Active commit: a writable base, grown to the top's size. */
	if (!ret && s->base)
		ret = chain_base_prepare(s->source, s->base, &s->base_made_rw, err, errlen);
	if (!ret) /* the job's to write: others may only read it */
		ret = job_block_node_shared(job, s->target,
					    BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE_UNCHANGED,
					    "target", err, errlen);
	if (!ret)
		ret = mirror_take_target(s, err, errlen);
	if (!ret)
		job_progress_set_total(job, s->source->size);
	return ret;
}

const struct job_driver *mirror_driver_for(bool commit)
{
	return commit ? &active_commit_driver : &mirror_driver;
}

void mirror_setup_undo(struct job *job)
{
	mirror_clean(job);
}
