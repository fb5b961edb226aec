/* The job framework's main-thread side: the registry, the state machine and
 * its events, the user's commands (pause, resume, cancel, complete,
 * finalize, dismiss, speed), node blockers, and the end of a job (prepare,
 * commit or abort, clean, conclude, dismiss), as QEMU's job.c has them. A
 * job here is always a transaction of its own.
 *
 * THREADING RULE: main thread only; the job loop's side is job-run.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-driver.h"
#include "block/graph.h"
#include "block/job-int.h"
#include "util/log.h"

static struct job *jobs_head;
static const struct job_event_ops *events;

void job_set_event_ops(const struct job_event_ops *ops)
{
	events = ops;
}

#define JOB_EVENT(name, ...)                                                                       \
	do {                                                                                       \
		if (events && events->name)                                                        \
			events->name(__VA_ARGS__);                                                 \
	} while (0)

void job_state_set(struct job *job, enum job_status to)
{
	enum job_status from = job->status;

	if (!job_transition_allowed(from, to)) {
		log_err("job '%s': transition %s -> %s not allowed", job->id, job_status_name(from),
			job_status_name(to));
		return;
	}
	job->status = to;
	if (from != to)
		JOB_EVENT(status, job);
}

struct job *job_find(const char *id)
{
	for (struct job *j = jobs_head; j && id; j = j->next)
		if (!strcmp(j->id, id))
			return j;
	return NULL;
}

struct job *job_next(struct job *prev)
{
	return prev ? prev->next : jobs_head;
}

static bool job_id_wellformed(const char *id)
{
	if (!((id[0] >= 'a' && id[0] <= 'z') || (id[0] >= 'A' && id[0] <= 'Z')))
		return false;
	for (const char *p = id; *p; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		      (*p >= '0' && *p <= '9') || *p == '-' || *p == '.' || *p == '_'))
			return false;
	return strlen(id) < JOB_ID_MAX;
}

static int job_check_id(const char *id, char *err, size_t errlen)
{
	if (!id) {
		snprintf(err, errlen, "An explicit job ID is required");
		return -EINVAL;
	}
	if (!job_id_wellformed(id)) {
		snprintf(err, errlen, "Invalid job ID '%s'", id);
		return -EINVAL;
	}
	if (job_find(id)) {
		snprintf(err, errlen, "Job ID '%s' already in use", id);
		return -EEXIST;
	}
	return 0;
}

void job_user_desc(const struct job *job, char *buf, size_t len)
{
	snprintf(buf, len, "block job '%s'", job->id);
}

int job_create(const struct job_driver *drv, const struct job_opts *o, struct job **out, char *err,
	       size_t errlen)
{
	const char *id = o->id ? o->id : (o->bs ? blk_node_name(o->bs) : NULL);
	char desc[JOB_ID_MAX + 16];
	struct job *job, **tail;
	int ret = job_check_id(id, err, errlen);

	if (ret)
		return ret;
	job = calloc(1, drv->size > sizeof(*job) ? drv->size : sizeof(*job));
	if (!job) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	job->drv = drv;
	snprintf(job->id, sizeof(job->id), "%s", id);
	job->bs = o->bs;
	job->loop = o->loop ? o->loop : job_pick_loop(o->bs);
	job->auto_finalize = o->auto_finalize;
	job->auto_dismiss = o->auto_dismiss;
	job->io_status = "ok";
	atomic_store(&job->speed, o->speed);
	job_run_init(job);
	if (job->bs) {
		job_user_desc(job, desc, sizeof(desc));
		blk_ref(job->bs, desc);
	}
	for (tail = &jobs_head; *tail; tail = &(*tail)->next)
		;
	*tail = job;
	job_state_set(job, JOB_STATUS_CREATED);
	*out = job;
	return 0;
}

void job_start(struct job *job)
{
	job->started = true;
	atomic_store(&job->busy, true);
	job_state_set(job, JOB_STATUS_RUNNING);
	if (job->pause_count)
		atomic_store(&job->pause_req, true);
	job_run_start(job);
}

static void job_unblock_all(struct job *job)
{
	char desc[JOB_ID_MAX + 16];

	job_user_desc(job, desc, sizeof(desc));
	for (unsigned i = 0; i < job->nblocked; i++)
		blk_unref(job->blocked[i], desc);
	free(job->blocked);
	free(job->blocked_shared);
	free(job->blocked_role);
	job->blocked = NULL;
	job->blocked_shared = NULL;
	job->blocked_role = NULL;
	job->nblocked = 0;
}

static void job_free(struct job *job)
{
	char desc[JOB_ID_MAX + 16];

	for (struct job **p = &jobs_head; *p; p = &(*p)->next)
		if (*p == job) {
			*p = job->next;
			break;
		}
	job_unblock_all(job);
	if (job->drv->free)
		job->drv->free(job);
	if (job->bs) {
		job_user_desc(job, desc, sizeof(desc));
		blk_unref(job->bs, desc);
	}
	free(job->error);
	free(job);
}

/* CONCLUDED (or CREATED, never started) -> NULL, and gone. */
static void job_do_dismiss(struct job *job)
{
	job_state_set(job, JOB_STATUS_NULL);
	job_free(job);
}

void job_early_fail(struct job *job)
{
	job_do_dismiss(job);
}

/* ---- node blockers --------------------------------------------------------- */

static struct job *job_holding(const struct blk_node *bs)
{
	for (struct job *j = jobs_head; j; j = j->next)
		for (unsigned i = 0; i < j->nblocked; i++)
			if (j->blocked[i] == bs)
				return j;
	return NULL;
}

int job_node_busy(const struct blk_node *bs, char *err, size_t errlen)
{
	struct job *j = job_holding(bs);

	if (!j)
		return 0;
	snprintf(err, errlen, "Node '%s' is busy: block device is in use by block job: %s",
		 blk_node_name(bs), j->drv->type);
	return -EBUSY;
}

/* "Permission conflict on node 'N': permissions 'P' are both required by an
 * unnamed block device (uses node 'N' as 'root' child) and unshared by H." */
static int perm_conflict(const struct job *job, unsigned i, uint32_t perm, char *err, size_t errlen)
{
	const char *n = blk_node_name(job->blocked[i]), *role = job->blocked_role[i];
	char names[64], holder[256];

	blk_perm_names(perm, names, sizeof(names));
	if (role)
		snprintf(holder, sizeof(holder), "%s job '%s' (uses node '%s' as '%s' child)",
			 job->drv->type, job->id, n, role);
	else
		snprintf(holder, sizeof(holder),
			 "an unnamed block device (uses node '%s' as 'root' child)", n);
	snprintf(err, errlen,
		 "Permission conflict on node '%s': permissions '%s' are both required by an "
		 "unnamed block device (uses node '%s' as 'root' child) and unshared by %s.",
		 n, names, n, holder);
	return -EPERM;
}

int job_node_perm_check(const struct blk_node *bs, uint32_t perm, char *err, size_t errlen)
{
	for (struct job *j = jobs_head; j; j = j->next)
		for (unsigned i = 0; i < j->nblocked; i++)
			if (j->blocked[i] == bs && (perm & ~j->blocked_shared[i]))
				return perm_conflict(j, i, perm & ~j->blocked_shared[i], err,
						     errlen);
	return 0;
}

unsigned job_node_blocker_refs(const struct blk_node *bs)
{
	unsigned n = 0;

	for (struct job *j = jobs_head; j; j = j->next)
		for (unsigned i = 0; i < j->nblocked; i++)
			n += j->blocked[i] == bs;
	return n;
}

static int blocked_grow(struct job *job)
{
	unsigned n = job->nblocked + 1;
	struct blk_node **v = realloc(job->blocked, n * sizeof(*v));
	uint32_t *sh;
	const char **r;

	if (v)
		job->blocked = v;
	sh = v ? realloc(job->blocked_shared, n * sizeof(*sh)) : NULL;
	if (sh)
		job->blocked_shared = sh;
	r = sh ? realloc(job->blocked_role, n * sizeof(*r)) : NULL;
	if (r)
		job->blocked_role = r;
	return r ? 0 : -ENOMEM;
}

int job_block_node_shared(struct job *job, struct blk_node *bs, uint32_t shared, const char *role,
			  char *err, size_t errlen)
{
	char desc[JOB_ID_MAX + 16];
	unsigned i;
	int ret = job_node_busy(bs, err, errlen);

	if (ret)
		return ret;
	if (blocked_grow(job)) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	i = job->nblocked;
	job->blocked[i] = bs;
	job->blocked_shared[i] = shared & BLK_PERM_ALL;
	job->blocked_role[i] = role;
	/* Users already there that hold what the job does not share. */
	if (bs->user_perm & ~job->blocked_shared[i])
		return perm_conflict(job, i, bs->user_perm & ~job->blocked_shared[i], err, errlen);
	job->nblocked++;
	job_user_desc(job, desc, sizeof(desc));
	blk_ref(bs, desc);
	return 0;
}

int job_block_node(struct job *job, struct blk_node *bs, char *err, size_t errlen)
{
	return job_block_node_shared(job, bs, BLK_PERM_ALL, NULL, err, errlen);
}

/* ---- the end of a job -------------------------------------------------------- */

static void job_set_error(struct job *job, const char *msg)
{
	if (job->error)
		return;
	job->error = strdup(msg && *msg ? msg : strerror(-job->ret));
}

static void job_conclude(struct job *job)
{
	job_state_set(job, JOB_STATUS_CONCLUDED);
	if (job->auto_dismiss || !job->started)
		job_do_dismiss(job);
}

/* commit or abort, clean, the event, then CONCLUDED. */
static void job_finalize_single(struct job *job)
{
	if (!job->ret && job->drv->commit)
		job->drv->commit(job);
	else if (job->ret && job->drv->abort)
		job->drv->abort(job);
	if (job->drv->clean)
		job->drv->clean(job);
	job_unblock_all(job);
	if (job->started) {
		if (job->force_cancel)
			JOB_EVENT(cancelled, job);
		else
			JOB_EVENT(completed, job);
	}
	job_conclude(job);
}

static void job_abort_now(struct job *job)
{
	if (job->status != JOB_STATUS_ABORTING)
		job_state_set(job, JOB_STATUS_ABORTING);
	job_finalize_single(job);
}

static void job_do_finalize(struct job *job)
{
	char err[512] = "";

	if (job->drv->prepare)
		job->ret = job->drv->prepare(job, err, sizeof(err));
	if (job->ret) {
		job_set_error(job, err);
		job_abort_now(job);
		return;
	}
	job_finalize_single(job);
}

void job_run_finished(struct job *job, int ret)
{
	job->deferred = true;
	atomic_store(&job->busy, false);
	/* A forced cancel fails the job even when run() got to its end; a
	 * soft one (mirror) ends it as run() says. */
	job->ret = !ret && job->force_cancel ? -ECANCELED : ret;
	if (job->ret) {
		job_set_error(job, NULL);
		job_abort_now(job);
		return;
	}
	job_state_set(job, JOB_STATUS_WAITING);
	job_state_set(job, JOB_STATUS_PENDING);
	if (!job->auto_finalize) {
		JOB_EVENT(pending, job);
		return;
	}
	job_do_finalize(job);
}

/* ---- commands ------------------------------------------------------------------- */

int job_apply_verb(struct job *job, enum job_verb v, char *err, size_t errlen)
{
	if (job_verb_allowed(v, job->status))
		return 0;
	snprintf(err, errlen, "Job '%s' in state '%s' cannot accept command verb '%s'", job->id,
		 job_status_name(job->status), job_verb_name(v));
	return -EPERM;
}

void job_pause(struct job *job)
{
	if (job->pause_count++ == 0 && job->started && !job->deferred) {
		atomic_store(&job->pause_req, true);
		job_enter(job);
	}
}

void job_resume(struct job *job)
{
	if (!job->pause_count || --job->pause_count)
		return;
	atomic_store(&job->pause_req, false);
	if (job->main_parked)
		job_unpark(job);
}

int job_user_pause(struct job *job, char *err, size_t errlen)
{
	int ret = job_apply_verb(job, JOB_VERB_PAUSE, err, errlen);

	if (ret)
		return ret;
	if (job->user_paused) {
		snprintf(err, errlen, "Job is already paused");
		return -EBUSY;
	}
	job->user_paused = true;
	job_pause(job);
	return 0;
}

int job_user_resume(struct job *job, char *err, size_t errlen)
{
	int ret;

	if (!job->user_paused || !job->pause_count) {
		snprintf(err, errlen, "Can't resume a job that was not paused");
		return -EPERM;
	}
	ret = job_apply_verb(job, JOB_VERB_RESUME, err, errlen);
	if (ret)
		return ret;
	job->io_status = "ok";
	job->user_paused = false;
	job_resume(job);
	return 0;
}

static void job_cancel(struct job *job, bool force)
{
	if (job->status == JOB_STATUS_CONCLUDED) {
		job_do_dismiss(job);
		return;
	}
	if (!force && !(job->drv->soft_cancel && job->drv->soft_cancel(job)))
		force = true;
	job->cancelled = true;
	job->force_cancel |= force;
	if (job->force_cancel)
		atomic_store(&job->cancel_req, true);
	if (job->user_paused) {
		job->user_paused = false;
		job_resume(job);
	}
	if (!job->started) {
		job->ret = -ECANCELED;
		job_set_error(job, NULL);
		job_abort_now(job);
	} else if (job->deferred) {
		if (job->status == JOB_STATUS_PENDING || job->status == JOB_STATUS_WAITING) {
			job->ret = -ECANCELED;
			job_set_error(job, NULL);
			job_abort_now(job);
		}
	} else if (job->main_parked && job->force_cancel) {
		job_unpark(job);
	} else {
		job_enter(job);
	}
}

int job_user_cancel(struct job *job, bool force, char *err, size_t errlen)
{
	int ret = job_apply_verb(job, JOB_VERB_CANCEL, err, errlen);

	if (!ret)
		job_cancel(job, force);
	return ret;
}

int job_user_complete(struct job *job, char *err, size_t errlen)
{
	int ret = job_apply_verb(job, JOB_VERB_COMPLETE, err, errlen);

	if (ret)
		return ret;
	if (job->cancelled || !job->drv->complete) {
		snprintf(err, errlen, "The active block job '%s' cannot be completed", job->id);
		return -ENOTSUP;
	}
	return job->drv->complete(job, err, errlen);
}

int job_user_finalize(struct job *job, char *err, size_t errlen)
{
	int ret = job_apply_verb(job, JOB_VERB_FINALIZE, err, errlen);

	if (!ret)
		job_do_finalize(job);
	return ret;
}

int job_user_dismiss(struct job *job, char *err, size_t errlen)
{
	int ret = job_apply_verb(job, JOB_VERB_DISMISS, err, errlen);

	if (!ret)
		job_do_dismiss(job);
	return ret;
}

int job_set_speed(struct job *job, int64_t speed, char *err, size_t errlen)
{
	int ret = job_apply_verb(job, JOB_VERB_SET_SPEED, err, errlen);

	if (ret)
		return ret;
	if (speed < 0) {
		snprintf(err, errlen, "Parameter 'speed' expects a non-negative value");
		return -EINVAL;
	}
	atomic_store(&job->speed, (uint64_t)speed);
	if (job->drv->set_speed)
		job->drv->set_speed(job, (uint64_t)speed);
	/* A job asleep for the old speed looks again. */
	job_enter(job);
	return 0;
}

void job_cancel_all_sync(void)
{
	struct loop *main = job_main_loop();

	for (struct job *j = jobs_head, *n; j; j = n) {
		n = j->next;
		if (j->status == JOB_STATUS_CONCLUDED)
			job_do_dismiss(j);
		else if (j->status != JOB_STATUS_ABORTING)
			job_cancel(j, true);
	}
	/* The runs end with messages to this loop; bounded by the jobs'
	 * requests in flight, each of which finishes. */
	while (jobs_head && main) {
		for (struct job *j = jobs_head, *n; j; j = n) {
			n = j->next;
			if (j->status == JOB_STATUS_CONCLUDED)
				job_do_dismiss(j);
			else if (j->status == JOB_STATUS_PENDING)
				job_cancel(j, true);
		}
		if (jobs_head)
			loop_run_once(main, true);
	}
}

/* ---- messages from the job loop ----------------------------------------------- */

void job_parked(struct job *job)
{
	if (!job->pause_count || job->force_cancel) {
		job_unpark_now(job);
		return;
	}
	job->main_parked = true;
	job->parked_from = job->status;
	job_state_set(job,
		      job->status == JOB_STATUS_READY ? JOB_STATUS_STANDBY : JOB_STATUS_PAUSED);
	atomic_store(&job->busy, false);
	if (job->drv->pause)
		job->drv->pause(job);
}

void job_unpark(struct job *job)
{
	job->main_parked = false;
	job->parked_for_error = false;
	if (job->status == JOB_STATUS_PAUSED || job->status == JOB_STATUS_STANDBY)
		job_state_set(job, job->parked_from);
	if (job->drv->resume)
		job->drv->resume(job);
	atomic_store(&job->busy, true);
	job_unpark_now(job);
}

void job_error_arrived(struct job *job)
{
	JOB_EVENT(error, job, job->err_is_read, job->err_action);
	if (job->err_action != JOB_ACTION_STOP || job->force_cancel) {
		job_unpark_now(job);
		return;
	}
	job->io_status = job->err_errno == -ENOSPC ? "nospace" : "failed";
	job->user_paused = true;
	job->pause_count++;
	atomic_store(&job->pause_req, true);
	job->parked_for_error = true;
	job_parked(job);
}

void job_ready_arrived(struct job *job)
{
	if (job->status != JOB_STATUS_RUNNING)
		return;
	job_state_set(job, JOB_STATUS_READY);
	JOB_EVENT(ready, job);
}
