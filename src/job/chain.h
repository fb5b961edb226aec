/* What stream and commit share: finding nodes of a backing chain as QEMU's
 * block-stream and block-commit name them, the argument errors they give,
 * and putting a new backing link into an overlay's header and graph.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_JOB_CHAIN_H
#define IOPLANE_JOB_CHAIN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block/job.h"

struct blk_node;
struct qmp_req;

/* The backing child of bs (NULL: none). */
struct blk_node *chain_backing(struct blk_node *bs);
/* Is `n` in bs's backing chain, below bs? */
bool chain_contains(struct blk_node *bs, struct blk_node *n);
/* The node of bs's chain (bs included) whose image file is `filename`
 * (QEMU's bdrv_find_backing_image: the name, or the same file), or NULL. */
struct blk_node *chain_find_image(struct blk_node *bs, const char *filename);
/* QEMU's bdrv_lookup_bs(): "Cannot find device='%s' nor node-name='%s'". */
struct blk_node *chain_lookup(const char *device, const char *node, char *err, size_t errlen);
/* The image file of bs's bottom node ("" if none). */
const char *chain_filename(struct blk_node *bs);
/* Is any node from top down to (not including) end held by a job?
 * -EBUSY with QEMU's message. */
int chain_busy(struct blk_node *top, struct blk_node *end, char *err, size_t errlen);
/* overlay's header and graph now have `base` (NULL: nothing) as backing
 * file, named backing_file (NULL: base's own file name) with base's
 * format; the nodes in between leave the chain. Flushes overlay first so
 * that what a job copied into it is on disk before the header drops the
 * old chain. Main thread; drains overlay. 0 or -errno with a message. */
int chain_relink(struct blk_node *overlay, struct blk_node *base, const char *backing_file,
		 char *err, size_t errlen);

/* The permissions a job adds to a node's users' (user_perm/user_shared
 * hold every user of a node together): taken at set-up, given back at the
 * end. When users came or went meanwhile (an export added to the node),
 * the end keeps what is held rather than drop what a new user may need. */
struct chain_perm {
	struct blk_node *bs;
	uint32_t perm, shared; /* the users' before */
	unsigned users;        /* blk_user_count() once taken */
	bool taken;
};
/* Main thread. 0, or -errno with the permission conflict's message. */
int chain_perm_take(struct chain_perm *p, struct blk_node *bs, uint32_t add, uint32_t unshare,
		    char *err, size_t errlen);
void chain_perm_drop(struct chain_perm *p);

/* block-commit's base before the copy (main thread, before the job blocks
 * it): writable (*made_rw says it was read-only), and grown to size when
 * smaller, as QEMU grows it; a larger base keeps its size. 0 or -errno
 * with the message. */
int chain_base_prepare(struct blk_node *top, struct blk_node *base, bool *made_rw, char *err,
		       size_t errlen);

/* ---- what the two jobs share ----------------------------------------------- */

/* run()'s walk over [0, size) (job loop): range() handles the stretch at off
 * and says how long it was (*n >= 1), with a pause point and the cancel
 * check before each; then the copy's chunks in flight finish and c is
 * freed. 0 or the first error. */
typedef int chain_range_fn(struct job *job, struct job_copy *c, uint64_t off, uint64_t *n);
int chain_run(struct job *job, struct job_copy *c, uint64_t size, chain_range_fn *range);

/* The job options block-stream and block-commit take (job-id: "" when
 * absent, which qsd refuses as an invalid id; speed, auto-finalize,
 * auto-dismiss) for a job on bs. */
void chain_job_opts(json_t *a, struct blk_node *bs, struct job_opts *o);
/* After job_create: speed (qsd checks it only now: the job is made and
 * fails), on-error and backing-file (a copy, the caller's to free).
 * 0 or -errno with qsd's message. */
int chain_job_args(json_t *a, enum job_error_policy *on_error, char **backing_file, char *err,
		   size_t errlen);
/* The command's end: ret 0 starts the job and answers {}; otherwise the
 * job's clean hook undoes the set-up, the job fails early and err is the
 * answer. */
void chain_job_answer(struct qmp_req *req, struct job *job, int ret, const char *err);

#endif
