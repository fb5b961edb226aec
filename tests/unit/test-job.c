/* Unit tests for the job framework: QEMU's transition and verb tables,
 * the names QMP uses, and the life of a job with a test driver run by a
 * real iothread - completion, pause and resume, cancel, manual finalize
 * and dismiss, a failing prepare, and the "stop" error action - checked
 * through the events and the order of the driver's hooks; and the write
 * guard: a lock waits for the guest writes in flight, an overlapping guest
 * write waits for the unlock, others pass; and a "stop" with chunks in
 * flight pauses the job once they are back.
 * Threading: the test is the main thread; run() runs on one iothread. */
#include <stdatomic.h>
#include <string.h>

#include "blk-test-ram.h"
#include "block/graph.h"
#include "block/job.h"
#include "loop/iothread.h"

#define WAIT_ROUNDS 20000 /* x loop rounds of at most 1 ms (the main loop's timer) */

/* ---- tables ---------------------------------------------------------------------- */

static void test_transition_table(void **state)
{
	/* QEMU's JobSTT, rows from, columns to: U C R P Y S W D X E N. */
	static const char *const rows[JOB_STATUS__COUNT] = {
		"01000000000", "00100000101", "00011010100", "00100000000",
		"00000110100", "00001000000", "00000001100", "00000000110",
		"00000000110", "00000000001", "00000000000",
	};

	(void)state;
	for (int f = 0; f < JOB_STATUS__COUNT; f++)
		for (int t = 0; t < JOB_STATUS__COUNT; t++)
			assert_int_equal(job_transition_allowed(f, t), rows[f][t] == '1');
	/* A few read as rules. */
	assert_false(job_transition_allowed(JOB_STATUS_PAUSED, JOB_STATUS_ABORTING));
	assert_true(job_transition_allowed(JOB_STATUS_CREATED, JOB_STATUS_NULL));
	assert_false(job_transition_allowed(JOB_STATUS_CONCLUDED, JOB_STATUS_RUNNING));
	assert_false(job_transition_allowed(JOB_STATUS__COUNT, JOB_STATUS_NULL));
	assert_false(job_transition_allowed(JOB_STATUS_NULL, (enum job_status) - 1));
}

static void test_verb_table(void **state)
{
	static const char *const rows[JOB_VERB__COUNT] = {
		"01111111000", "01111100000", "01111100000", "01111100000",
		"00001100000", "00000001000", "00000000010", "01111100000",
	};

	(void)state;
	for (int v = 0; v < JOB_VERB__COUNT; v++)
		for (int s = 0; s < JOB_STATUS__COUNT; s++)
			assert_int_equal(job_verb_allowed(v, s), rows[v][s] == '1');
	assert_false(job_verb_allowed(JOB_VERB__COUNT, JOB_STATUS_RUNNING));
}

static void test_names(void **state)
{
	enum job_error_policy p;

	(void)state;
	assert_string_equal(job_status_name(JOB_STATUS_STANDBY), "standby");
	assert_string_equal(job_status_name(JOB_STATUS_NULL), "null");
	assert_null(job_status_name(JOB_STATUS__COUNT));
	assert_string_equal(job_verb_name(JOB_VERB_SET_SPEED), "set-speed");
	assert_string_equal(job_action_name(JOB_ACTION_STOP), "stop");
	assert_int_equal(job_error_policy_parse("enospc", &p), 0);
	assert_int_equal(p, JOB_ERR_ENOSPC);
	assert_int_equal(job_error_policy_parse("bogus", &p), -EINVAL);
	assert_int_equal(job_error_policy_parse(NULL, &p), -EINVAL);
}

/* ---- a test job ------------------------------------------------------------------- */

struct tjob {
	struct job job;
	atomic_bool finish;   /* main asks run() to return 0 */
	atomic_int steps;     /* run()'s loop rounds */
	bool stop_once;       /* run() takes one "stop" error action */
	atomic_int stop_seen; /* ... and saw it return */
	int prepare_ret;
	char hooks[16]; /* p(repare) c(ommit) a(bort) l(clean), in order */
};

static struct {
	enum job_status seen[64];
	unsigned n;
	unsigned completed, cancelled, pending, errors;
	bool last_read; /* the last error's operation */
	char last_error[128];
} ev;

static void ev_status(struct job *j)
{
	if (ev.n < 64)
		ev.seen[ev.n++] = j->status;
}
static void ev_completed(struct job *j)
{
	ev.completed++;
	snprintf(ev.last_error, sizeof(ev.last_error), "%s", j->ret && j->error ? j->error : "");
}
static void ev_cancelled(struct job *j)
{
	(void)j;
	ev.cancelled++;
}
static void ev_pending(struct job *j)
{
	(void)j;
	ev.pending++;
}
static void ev_error(struct job *j, bool is_read, enum job_error_action a)
{
	(void)j;
	ev.last_read = is_read;
	assert_int_equal(a, JOB_ACTION_STOP);
	ev.errors++;
}
static const struct job_event_ops test_events = {.status = ev_status,
						 .completed = ev_completed,
						 .cancelled = ev_cancelled,
						 .pending = ev_pending,
						 .error = ev_error};

static int t_run(struct job *job)
{
	struct tjob *t = (struct tjob *)job;

	job_progress_set_total(job, 1000);
	for (unsigned i = 0; i < 100000; i++) {
		if (job_cancelled(job))
			return -ECANCELED;
		if (atomic_load(&t->finish))
			return 0;
		if (t->stop_once && i == 3) {
			t->stop_once = false;
			if (job_error_action(job, JOB_ERR_STOP, true, -EIO) == JOB_ACTION_STOP)
				atomic_fetch_add(&t->stop_seen, 1);
		}
		job_progress_add(job, 1);
		atomic_fetch_add(&t->steps, 1);
		job_sleep(job, 1000000);
	}
	return -ETIMEDOUT;
}

static void hook(struct job *job, char c)
{
	struct tjob *t = (struct tjob *)job;
	size_t n = strlen(t->hooks);

	if (n + 1 < sizeof(t->hooks))
		t->hooks[n] = c;
}
static int t_prepare(struct job *job, char *err, size_t errlen)
{
	hook(job, 'p');
	if (((struct tjob *)job)->prepare_ret)
		snprintf(err, errlen, "prepare failed on purpose");
	return ((struct tjob *)job)->prepare_ret;
}
static void t_commit(struct job *job)
{
	hook(job, 'c');
}
static void t_abort(struct job *job)
{
	hook(job, 'a');
}
static void t_clean(struct job *job)
{
	hook(job, 'l');
}

static char freed_hooks[16];
static void t_free(struct job *job)
{
	memcpy(freed_hooks, ((struct tjob *)job)->hooks, sizeof(freed_hooks));
}

static const struct job_driver tdrv = {.type = "stream",
				       .size = sizeof(struct tjob),
				       .run = t_run,
				       .prepare = t_prepare,
				       .commit = t_commit,
				       .abort = t_abort,
				       .clean = t_clean,
				       .free = t_free};

struct env {
	struct loop *main;
	struct iothread *t;
	struct loop *tl;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	e->main = test_loop_new();
	assert_int_equal(iothread_start("job-test", NULL, &e->t), 0);
	e->tl = iothread_loop(e->t);
	job_set_loops(e->main, &e->tl, 1);
	job_set_event_ops(&test_events);
	memset(&ev, 0, sizeof(ev));
	memset(freed_hooks, 0, sizeof(freed_hooks));
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	job_cancel_all_sync();
	iothread_join(e->t);
	test_loop_free(e->main);
	free(e);
	return 0;
}

/* Run the main loop until cond(arg) holds (bounded). */
static void wait_for(struct env *e, bool (*cond)(void *), void *arg)
{

	for (unsigned i = 0; i < WAIT_ROUNDS && !cond(arg); i++) {
		loop_run_once(e->main, false);
		usleep(500);
	}
	assert_true(cond(arg));
}

static bool gone(void *id)
{
	return job_find(id) == NULL;
}
static enum job_status want;
static bool in_state(void *j)
{
	return ((struct job *)j)->status == want;
}
static bool stepped(void *j)
{
	return atomic_load(&((struct tjob *)j)->steps) >= 5;
}

static struct tjob *make(const char *id, bool af, bool ad)
{
	struct job_opts o = JOB_OPTS_INIT;
	struct job *j;
	char err[256];

	o.id = id;
	o.auto_finalize = af;
	o.auto_dismiss = ad;
	assert_int_equal(job_create(&tdrv, &o, &j, err, sizeof(err)), 0);
	return (struct tjob *)j;
}

static void expect_states(const char *seq)
{
	char got[64] = "";

	for (unsigned i = 0; i < ev.n; i++)
		got[i] = "UCRPYSWDXEN"[ev.seen[i]];
	assert_string_equal(got, seq);
}

static void test_complete(void **state)
{
	struct env *e = *state;
	struct tjob *t = make("j0", true, true);
	char err[256];

	job_start(&t->job);
	wait_for(e, stepped, t);
	/* A stream cannot be completed; a running job not finalized. */
	assert_int_equal(job_user_complete(&t->job, err, sizeof(err)), -EPERM);
	assert_string_equal(err,
			    "Job 'j0' in state 'running' cannot accept command verb 'complete'");
	assert_int_equal(job_user_dismiss(&t->job, err, sizeof(err)), -EPERM);
	atomic_store(&t->finish, true);
	wait_for(e, gone, "j0");
	expect_states("CRWDEN");
	assert_int_equal(ev.completed, 1);
	assert_int_equal(ev.cancelled, 0);
	assert_string_equal(freed_hooks, "pcl");
}

static void test_pause_resume(void **state)
{
	struct env *e = *state;
	struct tjob *t = make("j1", true, true);
	char err[256];
	int steps;

	job_start(&t->job);
	assert_int_equal(job_user_pause(&t->job, err, sizeof(err)), 0);
	assert_int_equal(job_user_pause(&t->job, err, sizeof(err)), -EBUSY);
	assert_string_equal(err, "Job is already paused");
	want = JOB_STATUS_PAUSED;
	wait_for(e, in_state, t);
	steps = atomic_load(&t->steps);
	for (int i = 0; i < 50; i++) {
		loop_run_once(e->main, false);
		usleep(1000);
	}
	assert_int_equal(atomic_load(&t->steps), steps); /* parked: no progress */
	assert_int_equal(job_user_resume(&t->job, err, sizeof(err)), 0);
	assert_int_equal(job_user_resume(&t->job, err, sizeof(err)), -EPERM);
	assert_string_equal(err, "Can't resume a job that was not paused");
	want = JOB_STATUS_RUNNING;
	wait_for(e, in_state, t);
	wait_for(e, stepped, t);
	atomic_store(&t->finish, true);
	wait_for(e, gone, "j1");
	expect_states("CRPRWDEN");
}

static void test_cancel(void **state)
{
	struct env *e = *state;
	struct tjob *t = make("j2", true, true);
	char err[256];

	job_start(&t->job);
	wait_for(e, stepped, t);
	assert_int_equal(job_user_cancel(&t->job, true, err, sizeof(err)), 0);
	wait_for(e, gone, "j2");
	expect_states("CRXEN");
	assert_int_equal(ev.cancelled, 1);
	assert_int_equal(ev.completed, 0);
	assert_string_equal(freed_hooks, "al");
}

static void test_cancel_paused(void **state)
{
	struct env *e = *state;
	struct tjob *t = make("j3", true, true);
	char err[256];

	job_start(&t->job);
	assert_int_equal(job_user_pause(&t->job, err, sizeof(err)), 0);
	want = JOB_STATUS_PAUSED;
	wait_for(e, in_state, t);
	assert_int_equal(job_user_cancel(&t->job, true, err, sizeof(err)), 0);
	wait_for(e, gone, "j3");
	expect_states("CRPRXEN");
	assert_int_equal(ev.cancelled, 1);
}

static void test_manual(void **state)
{
	struct env *e = *state;
	struct tjob *t = make("j4", false, false);
	char err[256];

	job_start(&t->job);
	atomic_store(&t->finish, true);
	want = JOB_STATUS_PENDING;
	wait_for(e, in_state, t);
	assert_int_equal(ev.pending, 1);
	assert_string_equal(t->hooks, "");
	assert_int_equal(job_user_dismiss(&t->job, err, sizeof(err)), -EPERM);
	assert_int_equal(job_user_finalize(&t->job, err, sizeof(err)), 0);
	assert_int_equal(t->job.status, JOB_STATUS_CONCLUDED);
	assert_string_equal(t->hooks, "pcl");
	assert_int_equal(job_user_finalize(&t->job, err, sizeof(err)), -EPERM);
	assert_string_equal(err, "Job 'j4' in state 'concluded' cannot accept command verb "
				 "'finalize'");
	assert_int_equal(job_user_dismiss(&t->job, err, sizeof(err)), 0);
	assert_null(job_find("j4"));
	expect_states("CRWDEN");
}

static void test_prepare_fails(void **state)
{
	struct env *e = *state;
	struct tjob *t = make("j5", true, true);

	t->prepare_ret = -EIO;
	job_start(&t->job);
	atomic_store(&t->finish, true);
	wait_for(e, gone, "j5");
	expect_states("CRWDXEN");
	assert_int_equal(ev.completed, 1);
	assert_string_equal(ev.last_error, "prepare failed on purpose");
	assert_string_equal(freed_hooks, "pal");
}

static void test_error_stop(void **state)
{
	struct env *e = *state;
	struct tjob *t = make("j6", true, true);
	char err[256];

	t->stop_once = true;
	job_start(&t->job);
	want = JOB_STATUS_PAUSED;
	wait_for(e, in_state, t);
	assert_int_equal(ev.errors, 1);
	assert_true(ev.last_read);
	assert_true(t->job.user_paused);
	assert_string_equal(t->job.io_status, "failed");
	assert_int_equal(atomic_load(&t->stop_seen), 0);
	assert_int_equal(job_user_resume(&t->job, err, sizeof(err)), 0);
	assert_string_equal(t->job.io_status, "ok");
	wait_for(e, stepped, t);
	assert_int_equal(atomic_load(&t->stop_seen), 1);
	atomic_store(&t->finish, true);
	wait_for(e, gone, "j6");
	expect_states("CRPRWDEN");
}

static void test_ids(void **state)
{
	struct job_opts o = JOB_OPTS_INIT;
	struct job *j, *k;
	char err[256];

	(void)state;
	o.id = "";
	assert_int_equal(job_create(&tdrv, &o, &j, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "Invalid job ID ''");
	o.id = "1abc";
	assert_int_equal(job_create(&tdrv, &o, &j, err, sizeof(err)), -EINVAL);
	o.id = "ok";
	assert_int_equal(job_create(&tdrv, &o, &j, err, sizeof(err)), 0);
	assert_int_equal(job_create(&tdrv, &o, &k, err, sizeof(err)), -EEXIST);
	assert_string_equal(err, "Job ID 'ok' already in use");
	assert_int_equal(job_set_speed(j, -1, err, sizeof(err)), -EINVAL);
	job_early_fail(j);
	assert_null(job_find("ok"));
	expect_states("CN");
}

/* ---- the write guard ---------------------------------------------------------------- */

static struct job_guard *guard;
static atomic_int guard_phase; /* run(): 1 lock asked, 2 locked, 3 may unlock, 4 unlocked */

static int g_run(struct job *job)
{
	(void)job;
	atomic_store(&guard_phase, 1);
	job_guard_lock(guard, 0, 65536);
	atomic_store(&guard_phase, 2);
	for (unsigned i = 0; i < 20000 && atomic_load(&guard_phase) != 3; i++)
		job_sleep(job, 500000);
	job_guard_unlock(guard, 0, 65536);
	atomic_store(&guard_phase, 4);
	return 0;
}

static const struct job_driver gdrv = {.type = "stream", .size = sizeof(struct job), .run = g_run};

static bool phase_is(void *want_phase)
{
	return atomic_load(&guard_phase) == *(int *)want_phase;
}

static bool req_done(void *t)
{
	return ((struct test_req *)t)->calls > 0;
}

static void test_guard(void **state)
{
	struct env *e = *state;
	struct job_opts o = JOB_OPTS_INIT;
	struct test_req inflight, held, other;
	static uint8_t a[4096], b[4096], c[4096];
	struct blk_node *bs, *f;
	struct ram_dev *d;
	struct job *j;
	char err[256];
	int ph;

	assert_int_equal(ram_register(), 0);
	ram_cfg.hold = true;
	bs = test_open("driver=ram,ram-size=1M");
	ram_reset_config();
	d = bs->opaque;
	assert_int_equal(job_guard_insert(bs, "g0", &guard, err, sizeof(err)), 0);
	f = job_guard_node(guard);
	assert_ptr_equal(f->next, bs);
	/* A guest write in flight (held by the device) when the job asks for its lock. */
	memset(a, 0x11, sizeof(a));
	test_req_init(&inflight, BLK_OP_WRITE, 4096, a, sizeof(a), 0, NULL);
	assert_int_equal(blk_submit(f, &inflight.req), 0);
	assert_int_equal(d->npending, 1);
	o.id = "g";
	assert_int_equal(job_create(&gdrv, &o, &j, err, sizeof(err)), 0);
	job_start(j);
	ph = 1;
	wait_for(e, phase_is, &ph);
	for (int i = 0; i < 50; i++) {
		loop_run_once(e->main, false);
		usleep(1000);
	}
	assert_int_equal(atomic_load(&guard_phase), 1); /* waits for the write in flight */
	assert_true(ram_complete_one(d));
	wait_for(e, req_done, &inflight);
	ph = 2;
	wait_for(e, phase_is, &ph);
	/* Locked: an overlapping write waits in the guard, another one goes on. */
	memset(b, 0x22, sizeof(b));
	memset(c, 0x33, sizeof(c));
	test_req_init(&held, BLK_OP_WRITE, 8192, b, sizeof(b), 0, NULL);
	test_req_init(&other, BLK_OP_WRITE, 131072, c, sizeof(c), 0, NULL);
	assert_int_equal(blk_submit(f, &held.req), 0);
	assert_int_equal(blk_submit(f, &other.req), 0);
	for (int i = 0; i < 50; i++) {
		loop_run_once(e->main, false);
		usleep(1000);
	}
	assert_int_equal(d->npending, 1); /* only `other` reached the device */
	assert_true(ram_complete_one(d));
	wait_for(e, req_done, &other);
	assert_int_equal(held.calls, 0);
	/* Unlocked: the held write goes to the device and completes. */
	atomic_store(&guard_phase, 3);
	ph = 4;
	wait_for(e, phase_is, &ph);
	for (unsigned i = 0; i < WAIT_ROUNDS && d->npending == 0; i++) {
		loop_run_once(e->main, false);
		usleep(500);
	}
	assert_int_equal(d->npending, 1);
	assert_true(ram_complete_one(d));
	wait_for(e, req_done, &held);
	assert_int_equal(held.ret, 0);
	assert_true(all_bytes(d->ram.data + 8192, 4096, 0x22));
	assert_true(all_bytes(d->ram.data + 4096, 4096, 0x11));
	wait_for(e, gone, "g");
	job_guard_remove(guard);
	assert_null(blk_graph_find("g0"));
	blk_close(bs);
}

/* ---- copies between devices held on the iothread ------------------------------- */

static struct blk_node *copy_src, *copy_dst;
static atomic_int copy_ret;

/* The held devices are the iothread's: looked at and completed there. */
struct on_io {
	struct ram_dev *d;
	struct blk_node *bs;
	struct test_req *t;
	unsigned n;
};

static void io_count(void *arg)
{
	struct on_io *a = arg;

	a->n = a->d->npending;
}
static void io_complete(void *arg)
{
	ram_complete_one(((struct on_io *)arg)->d);
}

static struct env *copy_env;
static unsigned pending_on_io(struct ram_dev *d)
{
	struct on_io a = {.d = d};

	iothread_run_sync(copy_env->t, io_count, &a);
	return a.n;
}

/* ---- a stop with chunks in flight ------------------------------------------------- */

/* Three 1 MiB chunks, two in flight, to a target that fails writes,
 * on-target-error stop (the copy of s_run, without the share). */
static int stop_run(struct job *job)
{
	struct job_copy_opts o = {.max_inflight = 2,
				  .on_source_error = JOB_ERR_STOP,
				  .on_target_error = JOB_ERR_STOP};
	struct job_copy *c;
	int ret = job_copy_new(job, copy_src, copy_dst, &o, &c);

	if (ret)
		return ret;
	ret = job_copy_range(c, 0, 3u << 20);
	if (!ret)
		ret = job_copy_wait(c);
	else
		job_copy_wait(c);
	job_copy_free(c);
	atomic_store(&copy_ret, ret);
	return ret;
}

static const struct job_driver stopdrv = {
	.type = "stream", .size = sizeof(struct job), .run = stop_run};

static void io_heal(void *d)
{
	((struct ram_dev *)d)->cfg.fail_op = -1;
}
static bool dst_pending_is(void *n)
{
	return pending_on_io(copy_dst->opaque) == *(unsigned *)n;
}

/* The job pauses for a stop once its chunks in flight are back, as QEMU's:
 * one that fails after the first is covered by the same stop, and the job
 * goes on after one resume (a chunk failing after the resume would stop it
 * a second time, with no one to resume it). */
static void test_stop_waits_inflight(void **state)
{
	struct env *e = *state;
	struct job_opts o = JOB_OPTS_INIT;
	struct on_io a = {0};
	struct job *j;
	char err[256];
	unsigned n = 2;

	copy_env = e;
	assert_int_equal(ram_register(), 0);
	copy_src = test_open("driver=ram,ram-size=3M");
	ram_cfg.hold = true;
	ram_cfg.fail_op = BLK_OP_WRITE;
	ram_cfg.fail_ret = -EIO;
	copy_dst = test_open("driver=ram,ram-size=3M");
	ram_reset_config();
	memset(((struct ram_dev *)copy_src->opaque)->ram.data, 0xa5, 3u << 20);
	a.d = copy_dst->opaque;
	o.id = "w";
	atomic_store(&copy_ret, 1);
	assert_int_equal(job_create(&stopdrv, &o, &j, err, sizeof(err)), 0);
	job_start(j);
	wait_for(e, dst_pending_is, &n);
	iothread_run_sync(e->t, io_complete, &a); /* the first write fails */
	for (int i = 0; i < 50; i++) {
		loop_run_once(e->main, false);
		usleep(1000);
	}
	assert_int_equal(ev.errors, 0); /* the other one is still in flight */
	assert_int_not_equal(j->status, JOB_STATUS_PAUSED);
	iothread_run_sync(e->t, io_complete, &a); /* ... and fails too */
	want = JOB_STATUS_PAUSED;
	wait_for(e, in_state, j);
	assert_int_equal(ev.errors, 1);
	assert_false(ev.last_read);
	assert_int_equal(pending_on_io(copy_dst->opaque), 0);
	iothread_run_sync(e->t, io_heal, a.d);
	assert_int_equal(job_user_resume(j, err, sizeof(err)), 0);
	wait_for(e, dst_pending_is, &n); /* both copied again */
	iothread_run_sync(e->t, io_complete, &a);
	iothread_run_sync(e->t, io_complete, &a);
	n = 1;
	wait_for(e, dst_pending_is, &n); /* then the third */
	iothread_run_sync(e->t, io_complete, &a);
	wait_for(e, gone, "w");
	assert_int_equal(atomic_load(&copy_ret), 0);
	assert_int_equal(ev.errors, 1);
	assert_true(all_bytes(((struct ram_dev *)copy_dst->opaque)->ram.data, 3u << 20, 0xa5));
	blk_close(copy_src);
	blk_close(copy_dst);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_transition_table),
		cmocka_unit_test(test_verb_table),
		cmocka_unit_test(test_names),
		cmocka_unit_test_setup_teardown(test_ids, setup, teardown),
		cmocka_unit_test_setup_teardown(test_complete, setup, teardown),
		cmocka_unit_test_setup_teardown(test_pause_resume, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cancel, setup, teardown),
		cmocka_unit_test_setup_teardown(test_cancel_paused, setup, teardown),
		cmocka_unit_test_setup_teardown(test_manual, setup, teardown),
		cmocka_unit_test_setup_teardown(test_prepare_fails, setup, teardown),
		cmocka_unit_test_setup_teardown(test_error_stop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_guard, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stop_waits_inflight, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
