/* block-commit of an intermediate top (below the active layer): what top
 * and the nodes between it and base hold is copied into base, then the
 * overlay above top names base as its backing file (header and graph) and
 * top and the nodes in between leave. base, a read-only backing file
 * until then, is written through for the job and made read-only again at
 * its end, as QEMU reopens it.
 *
 * Guest writes go to the active layer, never into top..base, which nobody
 * else may write meanwhile (the job takes write on base and shares no
 * write on the chain): the copy needs no guard. Killed at any moment, the
 * old chain stays valid and the overlay's data wins over what base took:
 * base only ever receives what reads through top already returned.
 *
 * Active commit (top is the active layer) is a mirror of top into base
 * (mirror.c), job type "commit" as in QEMU.
 *
 * THREADING RULE: the QMP handler, prepare, clean on the main thread;
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
#include "job/mirror.h"
#include "util/log.h"

#define COMMIT_STATUS_MAX (64ull << 20)

struct commit_job {
	struct job job;
	/* Immutable once started. */
	struct blk_node *top, *base, *overlay;
	char *backing_file;
	enum job_error_policy on_error;
	bool base_made_rw;      /* main: base was read-only before */
	struct chain_perm perm; /* main: write on base, shared with nobody */
};

static int commit_range(struct job *job, struct job_copy *c, uint64_t off, uint64_t *n)
{
	struct commit_job *s = (struct commit_job *)job;
	uint64_t size = s->top->size;
	uint64_t want = size - off > COMMIT_STATUS_MAX ? COMMIT_STATUS_MAX : size - off;
	bool alloc;
	int ret = job_allocated_above(s->top, s->base, off, want, &alloc, n);

	if (ret || alloc)
		return ret ? ret : job_copy_range(c, off, *n);
	job_progress_add(job, *n);
	return 0;
}

static int commit_run(struct job *job)
{
	struct commit_job *s = (struct commit_job *)job;
	struct job_copy_opts o = {.progress = true,
				  .detect_zeroes = true,
				  .on_source_error = s->on_error,
				  .on_target_error = s->on_error};
	struct job_copy *c;
	int ret = job_copy_new(job, s->top, s->base, &o, &c);

	return ret ? ret : chain_run(job, c, s->top->size, commit_range);
}

static int commit_prepare(struct job *job, char *err, size_t errlen)
{
	struct commit_job *s = (struct commit_job *)job;
	int ret = blk_flush_tree_sync(s->base);

	if (ret) {
		snprintf(err, errlen, "Could not flush node '%s': %s", blk_node_name(s->base),
			 strerror(-ret));
		return ret;
	}
	return chain_relink(s->overlay, s->base, s->backing_file, err, errlen);
}

static void commit_clean(struct job *job)
{
	struct commit_job *s = (struct commit_job *)job;
	char err[256];

	chain_perm_drop(&s->perm);
	if (s->base_made_rw && blk_set_backing_read_only(s->base, true, err, sizeof(err)))
		log_warn("commit: %s", err); /* stays writable: still correct */
	s->base_made_rw = false;
}

static void commit_free(struct job *job)
{
	free(((struct commit_job *)job)->backing_file);
}

static const struct job_driver commit_driver = {
	.type = "commit",
	.size = sizeof(struct commit_job),
	.run = commit_run,
	.prepare = commit_prepare,
	.clean = commit_clean,
	.free = commit_free,
};

/* ---- block-commit ------------------------------------------------------------------ */

static const struct qapi_type commit_args = QAPI_OBJECT_TYPE(
	"q_obj_block-commit-arg",
	QAPI_MEMBERS(QAPI_OPT("job-id", &qapi_str), QAPI_REQ("device", &qapi_str),
		     QAPI_OPT("base-node", &qapi_str), QAPI_OPT("base", &qapi_str),
		     QAPI_OPT("top-node", &qapi_str), QAPI_OPT("top", &qapi_str),
		     QAPI_OPT("backing-file", &qapi_str), QAPI_OPT("speed", &qapi_int),
		     QAPI_OPT("on-error", &qmp_blockdev_on_error),
		     QAPI_OPT("filter-node-name", &qapi_str), QAPI_OPT("auto-finalize", &qapi_bool),
		     QAPI_OPT("auto-dismiss", &qapi_bool)));

struct commit_req {
	struct blk_node *bs, *top, *base;
	const char *cls; /* the error's class */
};

static int commit_top(json_t *a, struct commit_req *r, char *err, size_t errlen)
{
	const char *tn = qapi_get_str(a, "top-node"), *t = qapi_get_str(a, "top");

	r->top = r->bs;
	if (tn && t) {
		snprintf(err, errlen, "'top-node' and 'top' are mutually exclusive");
		return -EINVAL;
	}
	if (tn) {
		r->top = chain_lookup(NULL, tn, err, errlen);
		if (!r->top)
			return -ENOENT;
		if (r->top != r->bs && !chain_contains(r->bs, r->top)) {
			snprintf(err, errlen, "'%s' is not in this backing file chain", tn);
			return -EINVAL;
		}
	} else if (t) {
		r->top = chain_find_image(r->bs, t);
	}
	if (!r->top) {
		snprintf(err, errlen, "Top image file %s not found", t ? t : "NULL");
		return -ENOENT;
	}
	return 0;
}

static int commit_base(json_t *a, struct commit_req *r, char *err, size_t errlen)
{
	const char *bn = qapi_get_str(a, "base-node"), *b = qapi_get_str(a, "base");

	if (bn && b) {
		snprintf(err, errlen, "'base-node' and 'base' are mutually exclusive");
		return -EINVAL;
	}
	if (bn) {
		r->base = chain_lookup(NULL, bn, err, errlen);
		if (!r->base)
			return -ENOENT;
		if (!chain_contains(r->top, r->base) && r->base != r->top) {
			snprintf(err, errlen, "'%s' is not in this backing file chain", bn);
			return -EINVAL;
		}
		return 0;
	}
	if (b) {
		r->base = chain_find_image(r->top, b);
		if (!r->base) {
			snprintf(err, errlen, "Can't find '%s' in the backing chain", b);
			return -ENOENT;
		}
		return 0;
	}
	/* QEMU's bdrv_find_base(): the bottom of the chain (top itself when it
	 * has no backing file, which the next check refuses). */
	for (r->base = r->top; chain_backing(r->base); r->base = chain_backing(r->base))
		;
	return 0;
}

static int commit_check(json_t *a, struct commit_req *r, char *err, size_t errlen)
{
	const char *dev = qapi_get_str(a, "device");
	int ret;

	r->cls = QMP_ERR_GENERIC;
	r->bs = blk_graph_find(dev);
	if (!r->bs) {
		r->cls = QMP_ERR_DEVICE_NOT_FOUND;
		snprintf(err, errlen, "Device '%s' not found", dev);
		return -ENOENT;
	}
	if (blk_parent_count(r->bs)) {
		snprintf(err, errlen, "Need a root block node");
		return -EINVAL;
	}
	ret = commit_top(a, r, err, errlen);
	if (!ret)
		ret = commit_base(a, r, err, errlen);
	if (!ret)
		ret = chain_busy(r->top, chain_backing(r->base), err, errlen);
	if (!ret && r->top == r->base) {
		snprintf(err, errlen, "cannot commit an image into itself");
		ret = -EINVAL;
	}
	if (!ret && r->top == r->bs && qapi_has(a, "backing-file")) {
		snprintf(err, errlen, "'backing-file' specified, but 'top' is the active layer");
		ret = -ENOTSUP;
	}
	return ret;
}

static struct blk_node *find_overlay(struct blk_node *bs, struct blk_node *top)
{
	for (struct blk_node *b = bs; b; b = chain_backing(b))
		if (chain_backing(b) == top)
			return b;
	return NULL;
}

/* The job exists: claim the chain and its overlay, make base writable. */
static int commit_setup(struct commit_job *s, json_t *a, char *err, size_t errlen)
{
	int ret = chain_job_args(a, &s->on_error, &s->backing_file, err, errlen);

	if (ret)
		return ret;
	/* QEMU's: nobody else reads the nodes that go or writes the base. */
	ret = job_block_node(&s->job, s->overlay, err, errlen);
	for (struct blk_node *b = s->top; b && b != s->base && !ret; b = chain_backing(b))
		ret = job_block_node_shared(&s->job, b, BLK_PERM_WRITE | BLK_PERM_WRITE_UNCHANGED,
					    "intermediate node", err, errlen);
	/* Before the base's blocker, which does not share resize. */
	if (!ret)
		ret = chain_base_prepare(s->top, s->base, &s->base_made_rw, err, errlen);
	if (!ret)
		ret = job_block_node_shared(&s->job, s->base,
					    BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE_UNCHANGED,
					    NULL, err, errlen);
	if (ret)
		return ret;
	job_progress_set_total(&s->job, s->top->size);
	return chain_perm_take(&s->perm, s->base, BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE,
			       BLK_PERM_WRITE, err, errlen);
}

static void cmd_block_commit(struct qmp_req *req, json_t *a)
{
	struct job_opts o;
	struct commit_req r;
	struct commit_job *s;
	struct job *job;
	char err[512] = "";
	int ret = commit_check(a, &r, err, sizeof(err));

	if (ret) {
		qmp_error(req, r.cls, "%s", err);
		return;
	}
	if (r.top == r.bs) { /* the active layer: a mirror into base (mirror.c) */
		qmp_active_commit(req, a, r.top, r.base);
		return;
	}
	chain_job_opts(a, r.top, &o);
	o.loop = job_pick_loop(r.bs);
	if (job_create(&commit_driver, &o, &job, err, sizeof(err))) {
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	s = (struct commit_job *)job;
	s->top = r.top;
	s->base = r.base;
	s->overlay = find_overlay(r.bs, r.top);
	ret = commit_setup(s, a, err, sizeof(err));
	chain_job_answer(req, job, ret, err);
}

static const struct qmp_command commit_cmd = {
	.name = "block-commit", .args = &commit_args, .fn = cmd_block_commit};

int qmp_commit_register(void)
{
	return qmp_register(&commit_cmd);
}
