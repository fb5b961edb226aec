/* blockdev-backup: a point-in-time copy of a node pushed to a target
 * through a copy-before-write filter (cbw.c) put above the source in its
 * place for every user before the job starts: a guest write to a range not
 * copied yet first copies the old data out, and run() copies the rest in
 * the background through the same copy state. sync=full copies everything,
 * top what the source's own layer holds, bitmap (incremental) what a dirty
 * bitmap has; none copies only what guest writes would overwrite, until
 * cancelled (fleecing). With a bitmap, bitmap-mode says what it becomes:
 * on-success: the writes since the start if the job succeeded; always: also
 * when it failed, keeping what was not copied; never: unchanged (it keeps
 * recording all along).
 *
 * THREADING RULE: the QMP handler, prepare, commit, abort, clean on the main
 * thread; run() and the copies' completions on the job loop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-copy.h"
#include "block/cbw.h"
#include "block/dirty-bitmap.h"
#include "block/graph.h"
#include "block/job.h"
#include "control/qmp-job.h"
#include "control/qmp.h"
#include "control/schema.h"
#include "job/chain.h"
#include "job/copy-pool.h"
#include "job/mirror.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/opts.h"

#define BACKUP_MAX_OPS COPY_POOL_MAX
#define BACKUP_OPS_DEFAULT 8
#define BACKUP_CHUNK_DEFAULT (1u << 20)
#define BACKUP_CHUNK_MAX (64u << 20)
#define BACKUP_IDLE_NS 100000000ull /* sync=none: look for a cancel every 100 ms */
#define BACKUP_RETRY_NS 1000000ull
#define BACKUP_STATUS_MAX (64ull << 20)

enum backup_sync { BACKUP_SYNC_TOP, BACKUP_SYNC_FULL, BACKUP_SYNC_NONE, BACKUP_SYNC_BITMAP };
enum backup_bm_mode { BACKUP_BM_ON_SUCCESS, BACKUP_BM_NEVER, BACKUP_BM_ALWAYS };

struct backup_job {
	struct job job;
	/* Immutable once started. */
	struct blk_node *source, *target, *filter;
	struct bcopy *bc; /* the filter's */
	enum backup_sync sync;
	/* The user's bitmap (busy meanwhile), its record of the writes since
	 * the start (main frees it), and what bitmap-mode says. */
	struct blk_dirty_bitmap *bm, *succ;
	enum backup_bm_mode bm_mode;
	/* Job loop. */
	struct copy_pool pool;
	uint64_t total;
};

/* ---- job loop ---------------------------------------------------------------- */

/* sync=top: what the source's own layer does not hold is not copied. */
static int backup_skip_unallocated(struct backup_job *s)
{
	uint64_t size = s->source->size, n;

	for (uint64_t off = 0; off < size; off += n) {
		uint64_t want = size - off > BACKUP_STATUS_MAX ? BACKUP_STATUS_MAX : size - off;
		bool alloc;
		int ret = job_allocated_above(s->source, chain_backing(s->source), off, want,
					      &alloc, &n);

		if (ret)
			return ret;
		if (!alloc)
			bcopy_skip(s->bc, off, n);
	}
	return 0;
}

/* One round: 1 to go on, 0 done, -errno. */
static int backup_round(struct backup_job *s, uint64_t *cursor)
{
	struct job *job = &s->job;
	uint64_t left;
	int ret = copy_pool_errors(&s->pool);

	if (ret)
		return ret;
	if (job_cancelled(job))
		return -ECANCELED;
	if (s->bc->broken)
		return s->bc->error ? s->bc->error : -EIO;
	if (s->sync == BACKUP_SYNC_NONE) {
		job_sleep(job, BACKUP_IDLE_NS);
		return 1;
	}
	left = bcopy_remaining(s->bc);
	atomic_store(&job->progress_current, s->total > left ? s->total - left : 0);
	if (left == 0 && s->pool.nbusy == 0 && !bcopy_busy(s->bc))
		return 0;
	copy_pool_step(&s->pool, cursor,
		       atomic_load(&s->source->quiesce) || atomic_load(&s->target->quiesce),
		       BACKUP_RETRY_NS);
	return 1;
}

static int backup_run(struct job *job)
{
	struct backup_job *s = (struct backup_job *)job;
	uint64_t cursor = 0;
	int ret = s->sync == BACKUP_SYNC_TOP ? backup_skip_unallocated(s) : 0;

	s->total = bcopy_remaining(s->bc);
	job_progress_set_total(job, s->total);
	while (ret == 0) {
		ret = backup_round(s, &cursor);
		if (ret != 1)
			break;
		ret = 0;
		job_pause_point(job);
	}
	while (s->pool.nbusy)
		copy_pool_wait(&s->pool);
	if (ret == 0) /* what was copied is on the target's disk before success */
		ret = copy_pool_flush(&s->pool);
	return ret;
}

/* ---- main: the end ---------------------------------------------------------------- */

static bool backup_filter_remove(struct blk_node *f, struct blk_node *source);

/* The user's bitmap after a success (on-success, always) is the record
 * of the writes since the start. */
static void backup_commit(struct job *job)
{
	struct backup_job *s = (struct backup_job *)job;

	if (!s->bm || s->bm_mode == BACKUP_BM_NEVER)
		return;
	blk_dirty_bitmap_reset_all(s->bm);
	blk_dirty_bitmap_merge(s->bm, s->succ);
}

/* ... after a failure (always): those writes and what was not copied. */
static void backup_abort(struct job *job)
{
	struct backup_job *s = (struct backup_job *)job;

	if (!s->bm || s->bm_mode != BACKUP_BM_ALWAYS)
		return;
	blk_dirty_bitmap_reset_all(s->bm);
	blk_dirty_bitmap_merge(s->bm, s->succ);
	blk_dirty_bitmap_merge(s->bm, s->bc->todo);
}

/* The filter leaves (its users go back to the source), the bitmap is
 * free again. */
static void backup_clean(struct job *job)
{
	struct backup_job *s = (struct backup_job *)job;

	if (s->filter && backup_filter_remove(s->filter, s->source))
		s->filter = NULL;
	if (s->bm && s->bm->busy)
		s->bm->busy--;
	s->bm = NULL;
	if (!s->filter) { /* else the filter still records into it */
		blk_dirty_bitmap_free(s->succ);
		s->succ = NULL;
	}
}

static void backup_free(struct job *job)
{
	struct backup_job *s = (struct backup_job *)job;

	copy_pool_free(&s->pool);
}

static const struct job_driver backup_driver = {
	.type = "backup",
	.size = sizeof(struct backup_job),
	.run = backup_run,
	.commit = backup_commit,
	.abort = backup_abort,
	.clean = backup_clean,
	.free = backup_free,
};

/* ---- blockdev-backup --------------------------------------------------------------- */

static const struct qapi_type sync_mode =
	QAPI_ENUM_TYPE("MirrorSyncMode", "top", "full", "none", "incremental", "bitmap");
static const struct qapi_type bm_mode =
	QAPI_ENUM_TYPE("BitmapSyncMode", "on-success", "never", "always");
static const struct qapi_type perf_opts =
	QAPI_OBJECT_TYPE("BackupPerf", QAPI_MEMBERS(QAPI_OPT("use-copy-range", &qapi_bool),
						    QAPI_OPT("max-workers", &qapi_int),
						    QAPI_OPT("max-chunk", &qapi_int)));

static const struct qapi_type backup_args = QAPI_OBJECT_TYPE(
	"BlockdevBackup",
	QAPI_MEMBERS(QAPI_OPT("job-id", &qapi_str), QAPI_REQ("device", &qapi_str),
		     QAPI_REQ("sync", &sync_mode), QAPI_OPT("speed", &qapi_int),
		     QAPI_OPT("bitmap", &qapi_str), QAPI_OPT("bitmap-mode", &bm_mode),
		     QAPI_OPT("compress", &qapi_bool),
		     QAPI_OPT("on-source-error", &qmp_blockdev_on_error),
		     QAPI_OPT("on-target-error", &qmp_blockdev_on_error),
		     QAPI_OPT("auto-finalize", &qapi_bool), QAPI_OPT("auto-dismiss", &qapi_bool),
		     QAPI_OPT("filter-node-name", &qapi_str),
		     QAPI_OPT_UNSTABLE("x-perf", &perf_opts), QAPI_REQ("target", &qapi_str)));

struct backup_req {
	struct blk_node *source, *target;
	struct blk_dirty_bitmap *bm;
	enum backup_sync sync;
	enum backup_bm_mode mode;
	uint32_t chunk;
	unsigned ops;
};

/* QEMU's bitmap rules for sync and bitmap-mode. */
static int backup_bitmap(json_t *a, struct backup_req *r, char *err, size_t errlen)
{
	const char *name = qapi_get_str(a, "bitmap");
	int sync = qapi_get_enum(a, "sync", &sync_mode, 1);

	r->mode = (enum backup_bm_mode)qapi_get_enum(a, "bitmap-mode", &bm_mode, 0);
	if (sync == 3) { /* incremental: bitmap with on-success */
		if (qapi_has(a, "bitmap-mode") && r->mode != BACKUP_BM_ON_SUCCESS) {
			snprintf(err, errlen,
				 "Bitmap sync mode must be 'on-success' when using "
				 "sync mode 'incremental'");
			return -EINVAL;
		}
		sync = 4;
	}
	r->sync = sync == 4 ? BACKUP_SYNC_BITMAP : (enum backup_sync)sync;
	if (!name) {
		if (sync == 4) {
			snprintf(err, errlen, "must provide a valid bitmap name for '%s' sync mode",
				 qapi_get_str(a, "sync"));
			return -EINVAL;
		}
		if (qapi_has(a, "bitmap-mode")) {
			snprintf(err, errlen, "Cannot specify bitmap sync mode without a bitmap");
			return -EINVAL;
		}
		return 0;
	}
	r->bm = blk_dirty_bitmap_find(r->source, name);
	if (!r->bm) {
		snprintf(err, errlen, "Bitmap '%s' could not be found", name);
		return -ENOENT;
	}
	if (r->bm->busy || r->bm->readonly || r->bm->inconsistent) {
		snprintf(err, errlen,
			 "Bitmap '%s' is currently in use by another operation and "
			 "cannot be used",
			 name);
		return -EBUSY;
	}
	if (sync == 2) {
		snprintf(err, errlen, "Cannot specify bitmap with sync mode 'none'");
		return -EINVAL;
	}
	if (!qapi_has(a, "bitmap-mode") && sync != 4) {
		snprintf(err, errlen, "Bitmap sync mode must be given when providing a bitmap");
		return -EINVAL;
	}
	return 0;
}

static int backup_check(json_t *a, struct backup_req *r, char *err, size_t errlen)
{
	const char *dev = qapi_get_str(a, "device"), *tgt = qapi_get_str(a, "target");
	json_t *perf = qapi_get(a, "x-perf");
	int64_t workers = perf ? qapi_get_int(perf, "max-workers", BACKUP_OPS_DEFAULT) : 0;
	int64_t chunk = perf ? qapi_get_int(perf, "max-chunk", 0) : 0;

	if (!(r->source = chain_lookup(dev, dev, err, errlen)) ||
	    !(r->target = chain_lookup(tgt, tgt, err, errlen)))
		return -ENOENT;
	if (qapi_get_int(a, "speed", 0) < 0) {
		snprintf(err, errlen, "Parameter 'speed' expects a non-negative value");
		return -EINVAL;
	}
	if (perf && (workers < 1 || chunk < 0)) {
		snprintf(err, errlen, "max-workers must be greater than zero");
		return -EINVAL;
	}
	if (qapi_get_bool(a, "compress", false)) {
		snprintf(err, errlen, "Compression is not supported for this drive %s",
			 blk_node_name(r->target));
		return -ENOTSUP;
	}
	if (r->source == r->target) {
		snprintf(err, errlen, "Source and target cannot be the same");
		return -EINVAL;
	}
	if (r->target->size != r->source->size) {
		snprintf(err, errlen, "Source and target image have different sizes");
		return -EINVAL;
	}
	r->ops = workers ? (unsigned)(workers > BACKUP_MAX_OPS ? BACKUP_MAX_OPS : workers)
			 : BACKUP_OPS_DEFAULT;
	r->chunk = chunk ? (uint32_t)(chunk > BACKUP_CHUNK_MAX ? BACKUP_CHUNK_MAX : chunk)
			 : BACKUP_CHUNK_DEFAULT;
	return backup_bitmap(a, r, err, errlen);
}

/* The filter out of the way again (main): false if it had to stay. */
static bool backup_filter_remove(struct blk_node *f, struct blk_node *source)
{
	char err[256];
	int ret = blk_drain_begin(f);

	if (!ret) {
		ret = blk_replace_node(f, source, err, sizeof(err));
		blk_drain_end(f);
	} else {
		snprintf(err, sizeof(err), "could not drain it");
	}
	if (ret) {
		log_warn("backup: node '%s' stays: %s", blk_node_name(f), err);
		return false;
	}
	blk_close(f);
	return true;
}

static int backup_filter_open(json_t *a, const struct backup_req *r, struct blk_node **out,
			      char *err, size_t errlen)
{
	struct blk_child c = {.role = BLK_ROLE_TARGET, .node = r->target};
	const char *name = qapi_get_str(a, "filter-node-name");
	struct kv_opts o = {0};
	int ret = 0;

	if (r->sync == BACKUP_SYNC_BITMAP) {
		ret = kv_set(&o, "bitmap.node", blk_node_name(r->source));
		if (!ret)
			ret = kv_set(&o, "bitmap.name", r->bm->name);
	}
	if (ret) {
		kv_free(&o);
		snprintf(err, errlen, "out of memory");
		return ret;
	}
	blk_ref(r->source, NULL); /* the filter's links take them over */
	blk_ref(r->target, NULL);
	ret = blk_open_node("copy-before-write", r->source, &c, 1, &o, out, err, errlen);
	kv_free(&o);
	if (!ret && name && blk_node_set_name(*out, name, err, errlen)) {
		blk_close(*out);
		ret = -EINVAL;
	}
	return ret;
}

/* Before the job exists (so that its references stay on the source): the
 * filter goes in; from here on the target keeps this point in time. */
static int backup_filter_insert(json_t *a, const struct backup_req *r, struct blk_node **out,
				struct blk_dirty_bitmap **succ, char *err, size_t errlen)
{
	struct blk_node *f;
	int ret;

	if (r->target->read_only) {
		snprintf(err, errlen, "Node '%s' is read only", blk_node_name(r->target));
		return -EROFS;
	}
	ret = backup_filter_open(a, r, &f, err, errlen);
	if (ret)
		return ret;
	*succ = NULL;
	if (r->bm && !(*succ = blk_dirty_bitmap_new("", r->source->size, r->bm->granularity))) {
		blk_close(f);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	cbw_set_successor(f, *succ);
	ret = blk_drain_begin(r->source);
	if (ret) {
		snprintf(err, errlen, "Could not drain node '%s'", blk_node_name(r->source));
	} else {
		ret = blk_replace_node(r->source, f, err, errlen);
		blk_drain_end(r->source);
	}
	if (ret) {
		blk_close(f);
		blk_dirty_bitmap_free(*succ);
		return ret;
	}
	*out = f;
	return 0;
}

static int backup_setup(struct backup_job *s, json_t *a, const struct backup_req *r, char *err,
			size_t errlen)
{
	int ret;

	s->source = r->source;
	s->target = r->target;
	s->bc = cbw_copy_state(s->filter);
	s->sync = r->sync;
	s->bm = r->bm;
	s->bm_mode = r->mode;
	if (s->bm)
		s->bm->busy++;
	if (copy_pool_init(&s->pool, &s->job, s->bc, s->target, r->ops,
			   r->chunk < s->bc->gran ? s->bc->gran : r->chunk)) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->pool.on_source_error = (enum job_error_policy)qapi_get_enum(
		a, "on-source-error", &qmp_blockdev_on_error, JOB_ERR_REPORT);
	s->pool.on_target_error = (enum job_error_policy)qapi_get_enum(
		a, "on-target-error", &qmp_blockdev_on_error, JOB_ERR_REPORT);
	ret = job_block_node(&s->job, s->source, err, errlen);
	if (!ret) /* the filter's: others may only read it */
		ret = job_block_node_shared(&s->job, s->target,
					    BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE_UNCHANGED,
					    "target", err, errlen);
	if (!ret)
		job_progress_set_total(&s->job, bcopy_remaining(s->bc));
	return ret;
}

static void cmd_blockdev_backup(struct qmp_req *req, json_t *a)
{
	struct job_opts o = JOB_OPTS_INIT;
	struct backup_req r = {0};
	struct blk_dirty_bitmap *succ = NULL;
	struct blk_node *f = NULL;
	struct job *job;
	char err[512] = "";
	int ret = backup_check(a, &r, err, sizeof(err));

	if (!ret)
		ret = job_node_busy(r.source, err, sizeof(err));
	if (!ret)
		ret = job_node_busy(r.target, err, sizeof(err));
	if (!ret)
		ret = backup_filter_insert(a, &r, &f, &succ, err, sizeof(err));
	if (ret) {
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	chain_job_opts(a, r.source, &o);
	o.loop = job_pick_loop(r.source);
	if (job_create(&backup_driver, &o, &job, err, sizeof(err))) {
		if (backup_filter_remove(f, r.source))
			blk_dirty_bitmap_free(succ);
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	((struct backup_job *)job)->filter = f;
	((struct backup_job *)job)->succ = succ;
	ret = backup_setup((struct backup_job *)job, a, &r, err, sizeof(err));
	if (ret) {
		backup_clean(job);
		job_early_fail(job);
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	job_start(job);
	qmp_return(req, NULL);
}

static const struct qmp_command backup_cmd = {
	.name = "blockdev-backup", .args = &backup_args, .fn = cmd_blockdev_backup};

int qmp_backup_register(void)
{
	return qmp_register(&backup_cmd);
}
