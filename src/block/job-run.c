/* The job loop's side of a job: run() in a coroutine on the job's loop, its
 * pause points, sleeps and speed limit, progress, error actions, and the
 * messages that carry each of these to the main thread and back.
 *
 * Each message struct has one user at a time: msg_start goes once (and
 * again as the end's flush), msg_resume only after main heard that run()
 * parked, msg_kick only while kick_pending was clear, msg_parked, msg_error
 * and msg_ready only from run(), which waits for main's answer to the
 * first two. run()'s end is a round trip (msg_done, then a flush through
 * the job loop's queue) so that no kick sent before it is still queued
 * when main frees the job.
 *
 * THREADING RULE: functions for run() on the job loop; job_enter,
 * job_run_init/start, job_unpark_now and the loop choice on main. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block/graph.h"
#include "block/job-int.h"
#include "loop/coroutine.h"
#include "loop/iothread.h"
#include "util/log.h"

#define JOB_SLICE_NS 100000000ull /* QEMU's BLOCK_JOB_SLICE_TIME: 100 ms */

static struct loop *main_loop;
static struct loop **pool_loops;
static unsigned pool_n;
static struct iothread *own_thread; /* made when there is no pool */

#define JOB_OF(m, field) ((struct job *)((char *)(m)-offsetof(struct job, field)))

void job_set_loops(struct loop *main, struct loop **pool, unsigned npool)
{
	main_loop = main;
	pool_loops = pool;
	pool_n = npool;
}

struct loop *job_main_loop(void)
{
	return main_loop;
}

static bool node_uses_loop(struct blk_node *bs, struct loop *l)
{
	return atomic_load(&bs->loops[loop_index(l)]) == l;
}

static struct loop *(*export_loop_fn)(struct blk_node *bs);

void job_set_export_loop_fn(struct loop *(*fn)(struct blk_node *bs))
{
	export_loop_fn = fn;
}

struct loop *job_pick_loop(struct blk_node *bs)
{
	struct loop *l = bs && export_loop_fn ? export_loop_fn(bs) : NULL;

	/* The iothread of an export of the node (or of a node above it, such
	 * as an overlay's): the job's requests then share its loop. The
	 * export says so from its start; a node's loops[] only once a request
	 * came through (a client connected). */
	if (l)
		return l;
	for (unsigned i = 0; bs && i < pool_n; i++)
		if (node_uses_loop(bs, pool_loops[i]))
			return pool_loops[i];
	for (unsigned i = 0; bs && i < LOOP_MAX_THREADS; i++) {
		l = atomic_load(&bs->loops[i]);
		if (l && l != main_loop && job_loop_is_iothread(l))
			return l;
	}
	if (pool_n)
		return pool_loops[0];
	if (!own_thread && iothread_start("job-iothread", NULL, &own_thread) < 0) {
		log_err("jobs: cannot start an iothread; jobs run on the main loop");
		return main_loop;
	}
	return iothread_loop(own_thread);
}

static bool (*iothread_filter)(const struct loop *loop);

void job_set_iothread_filter(bool (*fn)(const struct loop *loop))
{
	iothread_filter = fn;
}

bool job_loop_is_iothread(const struct loop *loop)
{
	return iothread_filter && iothread_filter(loop);
}

static void job_detach_cb(void *arg)
{
	blk_graph_detach_loop(arg);
}

void job_shutdown(void)
{
	if (!own_thread)
		return;
	iothread_run_sync(own_thread, job_detach_cb, iothread_loop(own_thread));
	iothread_join(own_thread);
	own_thread = NULL;
}

/* ---- messages ------------------------------------------------------------------ */

static void final_cb(struct loop_msg *m)
{
	struct job *job = JOB_OF(m, msg_done);

	job_run_finished(job, job->run_ret);
}

static void flush_cb(struct loop_msg *m)
{
	struct job *job = JOB_OF(m, msg_start);

	job->msg_done.cb = final_cb;
	loop_send(main_loop, &job->msg_done);
}

static void done_cb(struct loop_msg *m)
{
	struct job *job = JOB_OF(m, msg_done);

	job->deferred = true; /* no more kicks from now on */
	job->msg_start.cb = flush_cb;
	loop_send(job->loop, &job->msg_start);
}

static void co_main(void *opaque)
{
	struct job *job = opaque;

	job->run_ret = job->drv->run(job);
	job->co = NULL;
	job->msg_done.cb = done_cb;
	loop_send(main_loop, &job->msg_done); /* job is main's from here on */
}

static void start_cb(struct loop_msg *m)
{
	struct job *job = JOB_OF(m, msg_start);

	job->co = coroutine_create(co_main, job);
	if (!job->co) {
		job->run_ret = -ENOMEM;
		job->msg_done.cb = done_cb;
		loop_send(main_loop, &job->msg_done);
		return;
	}
	coroutine_enter(job->co);
}

static void resume_cb(struct loop_msg *m)
{
	struct job *job = JOB_OF(m, msg_resume);

	if (job->parked)
		coroutine_enter(job->co);
}

static void wake_co(struct job *job)
{
	if (job->sleeping) {
		loop_timer_cancel(job->loop, &job->sleep_timer);
		coroutine_enter(job->co);
	}
}

static void kick_cb(struct loop_msg *m)
{
	struct job *job = JOB_OF(m, msg_kick);

	atomic_store(&job->kick_pending, false);
	wake_co(job);
}

static void sleep_timer_cb(struct loop_timer *t)
{
	struct job *job = (struct job *)((char *)t - offsetof(struct job, sleep_timer));

	if (job->sleeping)
		coroutine_enter(job->co);
}

static void parked_cb(struct loop_msg *m)
{
	job_parked(JOB_OF(m, msg_parked));
}

static void error_cb(struct loop_msg *m)
{
	job_error_arrived(JOB_OF(m, msg_error));
}

static void ready_cb(struct loop_msg *m)
{
	job_ready_arrived(JOB_OF(m, msg_ready));
}

void job_run_init(struct job *job)
{
	job->sleep_timer.cb = sleep_timer_cb;
	job->msg_resume.cb = resume_cb;
	job->msg_kick.cb = kick_cb;
	job->msg_parked.cb = parked_cb;
	job->msg_error.cb = error_cb;
	job->msg_ready.cb = ready_cb;
}

void job_run_start(struct job *job)
{
	job->msg_start.cb = start_cb;
	loop_send(job->loop, &job->msg_start);
}

void job_unpark_now(struct job *job)
{
	loop_send(job->loop, &job->msg_resume);
}

void job_enter(struct job *job)
{
	if (!job->started || job->deferred)
		return;
	if (!atomic_exchange(&job->kick_pending, true))
		loop_send(job->loop, &job->msg_kick);
}

/* ---- for run() ------------------------------------------------------------------- */

bool job_cancelled(struct job *job)
{
	return atomic_load(&job->cancel_req);
}

/* Tell main through m and wait for its msg_resume. */
static void park(struct job *job, struct loop_msg *m)
{
	job->parked = true;
	loop_send(main_loop, m);
	coroutine_yield();
	job->parked = false;
}

void job_pause_point(struct job *job)
{
	if (atomic_load(&job->pause_req) && !atomic_load(&job->cancel_req))
		park(job, &job->msg_parked);
}

void job_sleep(struct job *job, uint64_t ns)
{
	if (atomic_load(&job->cancel_req))
		return;
	if (ns && !atomic_load(&job->pause_req)) {
		job->sleeping = true;
		atomic_store(&job->busy, false);
		loop_timer_arm(job->loop, &job->sleep_timer, loop_now_ns() + ns);
		coroutine_yield();
		job->sleeping = false;
		atomic_store(&job->busy, true);
	}
	job_pause_point(job);
}

void job_ratelimit(struct job *job, uint64_t n)
{
	uint64_t speed = atomic_load(&job->speed), now = loop_now_ns();

	if (!speed) {
		job->slice_start_ns = 0;
		return;
	}
	/* slice_start_ns: when what was dispatched so far is paid for. One
	 * slice of credit, as QEMU's ratelimit allows a slice's quota at once. */
	if (job->slice_start_ns < now)
		job->slice_start_ns = now;
	job->slice_start_ns += (uint64_t)((double)n * 1e9 / (double)speed);
	while (!job_cancelled(job) && job->slice_start_ns > now + JOB_SLICE_NS) {
		job_sleep(job, job->slice_start_ns - now - JOB_SLICE_NS);
		now = loop_now_ns();
		speed = atomic_load(&job->speed);
		if (!speed) { /* unlimited now */
			job->slice_start_ns = 0;
			break;
		}
	}
}

void job_progress_add(struct job *job, uint64_t done)
{
	atomic_fetch_add(&job->progress_current, done);
}

void job_progress_set_total(struct job *job, uint64_t total)
{
	atomic_store(&job->progress_total, total);
}

void job_progress_add_total(struct job *job, uint64_t more)
{
	atomic_fetch_add(&job->progress_total, more);
}

void job_ready(struct job *job)
{
	loop_send(main_loop, &job->msg_ready);
}

enum job_error_action job_policy_action(enum job_error_policy p, int err)
{
	switch (p) {
	case JOB_ERR_IGNORE:
		return JOB_ACTION_IGNORE;
	case JOB_ERR_STOP:
		return JOB_ACTION_STOP;
	case JOB_ERR_ENOSPC:
		return err == -ENOSPC ? JOB_ACTION_STOP : JOB_ACTION_REPORT;
	default:
		return JOB_ACTION_REPORT;
	}
}

enum job_error_action job_error_action(struct job *job, enum job_error_policy policy, bool is_read,
				       int err)
{
	enum job_error_action a = job_policy_action(policy, err);

	job->err_is_read = is_read;
	job->err_action = a;
	job->err_errno = err;
	/* Main sends BLOCK_JOB_ERROR; for "stop" it answers at job-resume. */
	park(job, &job->msg_error);
	return a;
}
