/* block-stream: the data of the backing chain above base is copied into
 * the top node, then top's header and graph name base as its backing file
 * (none when streaming the whole chain) and the nodes in between leave.
 *
 * The copy is copy-on-read through a write guard above top (job-guard.c):
 * each chunk of top not allocated in top is locked against guest writes,
 * read through top (what the guest sees) and written back into top, so a
 * guest write is never undone. The header changes only after the copy is
 * flushed: killed at any moment, top and the old chain stay a valid chain
 * holding every acknowledged write.
 *
 * THREADING RULE: the QMP handler, prepare and clean on the main thread;
 * run() on the job loop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/graph.h"
#include "block/job.h"
#include "block/qcow2/qcow2.h"
#include "control/qmp-job.h"
#include "control/qmp.h"
#include "control/schema.h"
#include "job/chain.h"

#define STREAM_STATUS_MAX (64ull << 20)  /* bytes asked of block status at a time */
#define STREAM_FLUSH_EVERY (64ull << 20) /* the copy's flush-behind (job_copy_opts) */

struct stream_job {
	struct job job;
	/* Immutable once started. base stays below top (NULL: nothing). */
	struct blk_node *top, *base;
	char *backing_file; /* for the header; NULL: base's file name */
	enum job_error_policy on_error;
	struct job_guard *guard; /* main: inserted at start, removed in clean */
	struct chain_perm perm;  /* main: write on top */
};

/* Job loop: copy what the chain between top and base has and top has not. */
static int stream_range(struct job *job, struct job_copy *c, uint64_t off, uint64_t *pnum)
{
	struct stream_job *s = (struct stream_job *)job;
	struct blk_node *below = chain_backing(s->top);
	uint64_t want =
		s->top->size - off > STREAM_STATUS_MAX ? STREAM_STATUS_MAX : s->top->size - off;
	bool in_top, in_chain = false;
	int ret = job_allocated_above(s->top, below, off, want, &in_top, pnum);

	if (!ret && !in_top && below)
		ret = job_allocated_above(below, s->base, off, *pnum, &in_chain, pnum);
	if (ret)
		return ret;
	if (!in_chain) {
		job_progress_add(job, *pnum);
		return 0;
	}
	return job_copy_range(c, off, *pnum);
}

static int stream_run(struct job *job)
{
	struct stream_job *s = (struct stream_job *)job;
	struct job_copy_opts o = {.progress = true,
				  .on_source_error = s->on_error,
				  .on_target_error = s->on_error,
				  .guard = s->guard,
				  .flush_every = STREAM_FLUSH_EVERY};
	struct job_copy *c;
	int ret = job_copy_new(job, s->top, s->top, &o, &c);

	return ret ? ret : chain_run(job, c, s->top->size, stream_range);
}

static int stream_prepare(struct job *job, char *err, size_t errlen)
{
	struct stream_job *s = (struct stream_job *)job;

	return chain_relink(s->top, s->base, s->backing_file, err, errlen);
}

static void stream_clean(struct job *job)
{
	struct stream_job *s = (struct stream_job *)job;

	chain_perm_drop(&s->perm);
	if (s->guard)
		job_guard_remove(s->guard);
	s->guard = NULL;
}

static void stream_free(struct job *job)
{
	free(((struct stream_job *)job)->backing_file);
}

static const struct job_driver stream_driver = {
	.type = "stream",
	.size = sizeof(struct stream_job),
	.run = stream_run,
	.prepare = stream_prepare,
	.clean = stream_clean,
	.free = stream_free,
};

/* ---- block-stream ------------------------------------------------------------------ */

static const struct qapi_type stream_args = QAPI_OBJECT_TYPE(
	"q_obj_block-stream-arg",
	QAPI_MEMBERS(QAPI_OPT("job-id", &qapi_str), QAPI_REQ("device", &qapi_str),
		     QAPI_OPT("base", &qapi_str), QAPI_OPT("base-node", &qapi_str),
		     QAPI_OPT("backing-file", &qapi_str), QAPI_OPT("bottom", &qapi_str),
		     QAPI_OPT("speed", &qapi_int), QAPI_OPT("on-error", &qmp_blockdev_on_error),
		     QAPI_OPT("filter-node-name", &qapi_str), QAPI_OPT("auto-finalize", &qapi_bool),
		     QAPI_OPT("auto-dismiss", &qapi_bool)));

static int exclusive(json_t *a, const char *x, const char *y, char *err, size_t errlen)
{
	if (!qapi_has(a, x) || !qapi_has(a, y))
		return 0;
	snprintf(err, errlen, "'%s' and '%s' cannot be specified at the same time", x, y);
	return -EINVAL;
}

/* base, base-node or bottom: the node that stays (NULL: none). */
static int stream_base(json_t *a, struct blk_node *top, struct blk_node **base, char *err,
		       size_t errlen)
{
	const char *b = qapi_get_str(a, "base"), *bn = qapi_get_str(a, "base-node");
	const char *bot = qapi_get_str(a, "bottom"), *dev = qapi_get_str(a, "device");
	struct blk_node *n;

	*base = NULL;
	if (b && !(*base = chain_find_image(chain_backing(top), b))) {
		snprintf(err, errlen, "Can't find '%s' in the backing chain", b);
		return -ENOENT;
	}
	if (bn || bot) {
		n = chain_lookup(NULL, bn ? bn : bot, err, errlen);
		if (!n)
			return -ENOENT;
		if (!chain_contains(top, n) && (bn || n != top)) {
			if (bn)
				snprintf(err, errlen, "Node '%s' is not a backing image of '%s'",
					 bn, dev);
			else
				snprintf(err, errlen,
					 "Node '%s' is not in a chain starting from '%s'", bot,
					 dev);
			return -EINVAL;
		}
		*base = bn ? n : chain_backing(n);
	}
	return 0;
}

static int stream_check(json_t *a, struct blk_node **top, struct blk_node **base, char *err,
			size_t errlen)
{
	int ret = exclusive(a, "base", "base-node", err, errlen);

	if (!ret)
		ret = exclusive(a, "base", "bottom", err, errlen);
	if (!ret)
		ret = exclusive(a, "base-node", "bottom", err, errlen);
	if (ret)
		return ret;
	*top = chain_lookup(qapi_get_str(a, "device"), qapi_get_str(a, "device"), err, errlen);
	if (!*top)
		return -ENOENT;
	ret = stream_base(a, *top, base, err, errlen);
	if (!ret)
		ret = chain_busy(*top, *base, err, errlen);
	if (!ret && !*base && qapi_has(a, "backing-file")) {
		snprintf(err, errlen, "backing file specified, but streaming the entire chain");
		ret = -EINVAL;
	}
	if (!ret && (!qcow2_is(*top) || (*top)->read_only)) {
		snprintf(err, errlen, "Node '%s' is %s", blk_node_name(*top),
			 qcow2_is(*top) ? "read only" : "not a qcow2 image");
		ret = -ENOTSUP;
	}
	return ret;
}

/* The job exists: claim the chain, put the guard in, take write on top. */
static int stream_setup(struct stream_job *s, json_t *a, char *err, size_t errlen)
{
	int ret = chain_job_args(a, &s->on_error, &s->backing_file, err, errlen);

	if (ret)
		return ret;
	/* QEMU's: the intermediates may be read, not written, by others. */
	ret = job_block_node(&s->job, s->top, err, errlen);
	for (struct blk_node *b = chain_backing(s->top); b && b != s->base && !ret;
	     b = chain_backing(b))
		ret = job_block_node_shared(&s->job, b,
					    BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE_UNCHANGED,
					    "intermediate node", err, errlen);
	if (!ret)
		ret = job_guard_insert(s->top, qapi_get_str(a, "filter-node-name"), &s->guard, err,
				       errlen);
	if (ret)
		return ret;
	job_progress_set_total(&s->job, s->top->size);
	return chain_perm_take(&s->perm, s->top, BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE, 0, err,
			       errlen);
}

static void cmd_block_stream(struct qmp_req *req, json_t *a)
{
	struct job_opts o;
	struct blk_node *top, *base;
	struct job *job;
	char err[512] = "";
	int ret = stream_check(a, &top, &base, err, sizeof(err));

	if (!ret) {
		chain_job_opts(a, top, &o);
		ret = job_create(&stream_driver, &o, &job, err, sizeof(err));
	}
	if (ret) {
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	((struct stream_job *)job)->top = top;
	((struct stream_job *)job)->base = base;
	ret = stream_setup((struct stream_job *)job, a, err, sizeof(err));
	chain_job_answer(req, job, ret, err);
}

static const struct qmp_command stream_cmd = {
	.name = "block-stream", .args = &stream_args, .fn = cmd_block_stream};

int qmp_stream_register(void)
{
	return qmp_register(&stream_cmd);
}
