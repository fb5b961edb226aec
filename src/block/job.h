/* Block jobs: the framework that stream, commit, mirror and backup are built
 * on, with QEMU's job model (qapi/job.json): a state machine, pause points,
 * cancel, speed, progress, error actions and a transaction-like end
 * (prepare, then commit or abort, then clean).
 *
 * THREADING RULE: a job lives on two threads. The main thread owns its state
 * machine, its events and every graph change (job_*() calls below say
 * "main"). Its work - the driver's run() - runs in a coroutine on the job's
 * loop, the iothread of the node it works on ("job loop"). The two talk
 * through the atomic request flags and loop messages of struct job only. */
#ifndef IOPLANE_BLOCK_JOB_H
#define IOPLANE_BLOCK_JOB_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block/block.h"
#include "loop/loop.h"

/* JobStatus, in QEMU's order (the transition table is indexed by it). */
enum job_status {
	JOB_STATUS_UNDEFINED = 0,
	JOB_STATUS_CREATED,
	JOB_STATUS_RUNNING,
	JOB_STATUS_PAUSED,
	JOB_STATUS_READY,
	JOB_STATUS_STANDBY,
	JOB_STATUS_WAITING,
	JOB_STATUS_PENDING,
	JOB_STATUS_ABORTING,
	JOB_STATUS_CONCLUDED,
	JOB_STATUS_NULL,
	JOB_STATUS__COUNT,
};

/* JobVerb: what a command asks of a job; allowed only in some states. */
enum job_verb {
	JOB_VERB_CANCEL = 0,
	JOB_VERB_PAUSE,
	JOB_VERB_RESUME,
	JOB_VERB_SET_SPEED,
	JOB_VERB_COMPLETE,
	JOB_VERB_FINALIZE,
	JOB_VERB_DISMISS,
	JOB_VERB_CHANGE,
	JOB_VERB__COUNT,
};

/* BlockdevOnError (on-error, on-source-error, on-target-error). */
enum job_error_policy {
	JOB_ERR_REPORT = 0,
	JOB_ERR_IGNORE,
	JOB_ERR_ENOSPC, /* stop on ENOSPC, report anything else */
	JOB_ERR_STOP,
	JOB_ERR_AUTO, /* as the node says: report here */
	JOB_ERR__COUNT,
};

/* BlockErrorAction: what job_error_action() decided. */
enum job_error_action {
	JOB_ACTION_IGNORE = 0,
	JOB_ACTION_REPORT,
	JOB_ACTION_STOP,
};

/* The names QMP uses ("running", "cancel", "stop", "report"); NULL past the
 * end. job_error_policy_parse: -EINVAL for an unknown name. */
const char *job_status_name(enum job_status s);
const char *job_verb_name(enum job_verb v);
const char *job_action_name(enum job_error_action a);
int job_error_policy_parse(const char *name, enum job_error_policy *out);

/* QEMU's tables: may a job go from one state to another (JobSTT), may a
 * job in state s take verb v (JobVerbTable). Pure, any thread. */
bool job_transition_allowed(enum job_status from, enum job_status to);
bool job_verb_allowed(enum job_verb v, enum job_status s);

struct job;
struct coroutine;

/* A job type. Every hook but run is optional. "main": called on the main
 * thread; "job loop": in the job's coroutine on its loop. */
struct job_driver {
	const char *type; /* JobType: "stream", "commit", "mirror", "backup" */
	size_t size;      /* bytes of the driver's struct, which starts with struct job */
	/* job loop: the work. Returns 0 when done, -ECANCELED when it saw
	 * job_cancelled(), -errno on an error it reported. It calls
	 * job_pause_point() between steps and job_sleep() for the speed. */
	int (*run)(struct job *job);
	/* main: a READY job is told to finish (job-complete). The driver
	 * makes run() return. -errno with a message: refused. NULL: the
	 * job cannot be completed ("The active block job '%s' cannot be
	 * completed"). */
	int (*complete)(struct job *job, char *err, size_t errlen);
	/* main: run() is parked at a pause point / about to leave it. */
	void (*pause)(struct job *job);
	void (*resume)(struct job *job);
	/* main, after run() returned, in this order: prepare (0, or -errno
	 * and a message: the job fails), then exactly one of commit (run and
	 * prepare succeeded) or abort (failed or cancelled), then clean. */
	int (*prepare)(struct job *job, char *err, size_t errlen);
	void (*commit)(struct job *job);
	void (*abort)(struct job *job);
	void (*clean)(struct job *job);
	/* main: the speed changed (bytes per second, 0: unlimited). */
	void (*set_speed)(struct job *job, uint64_t speed);
	/* main: block-job-cancel force=false: mirror (READY) completes
	 * without switching over. Returns true when it does so (the job is
	 * then cancelled without force: job_cancelled() stays false and the
	 * driver ends run() itself); false or NULL: a forced cancel. */
	bool (*soft_cancel)(struct job *job);
	/* main: free what the driver owns beyond struct job (last). */
	void (*free)(struct job *job);
};

/* Options common to every job (job-id, auto-finalize, auto-dismiss, speed,
 * and the node it works on). */
struct job_opts {
	const char *id;      /* NULL: the node's name (QEMU: the device's) */
	struct blk_node *bs; /* the node the job works on (query-block-jobs' device) */
	uint64_t speed;      /* bytes per second, 0: unlimited */
	bool auto_finalize;  /* default true */
	bool auto_dismiss;   /* default true */
	/* Where run() goes: NULL picks job_pick_loop(bs). */
	struct loop *loop;
};

/* Defaults of a job_opts: auto-finalize and auto-dismiss on. */
#define JOB_OPTS_INIT                                                                              \
	{                                                                                          \
		.auto_finalize = true, .auto_dismiss = true                                        \
	}

#define JOB_ID_MAX 128

struct job {
	const struct job_driver *drv;     /* immutable */
	char id[JOB_ID_MAX];              /* immutable */
	struct blk_node *bs;              /* immutable; the job holds a reference */
	struct loop *loop;                /* immutable: where run() runs */
	bool auto_finalize, auto_dismiss; /* immutable */

	/* ---- main thread ---- */
	enum job_status status;
	unsigned pause_count;   /* pauses asked for (user and internal); > 0: pause */
	bool user_paused;       /* job-pause, or an error action "stop" */
	bool cancelled;         /* job-cancel was asked */
	bool force_cancel;      /* ... with force (or on a job not READY) */
	bool started, deferred; /* run() entered; run() returned */
	int ret;                /* run()'s result, then prepare's */
	char *error;            /* human error of a failed job (query-jobs' "error") */
	struct job *next;       /* the registry (job.c) */
	/* Error of the last I/O error action, for query-block-jobs' io-status:
	 * "ok", "failed", "nospace". */
	const char *io_status;
	/* run() is parked (msg_parked or msg_error arrived, no msg_resume sent
	 * yet); the state it had before PAUSED/STANDBY. */
	bool main_parked, parked_for_error;
	enum job_status parked_from;
	/* Nodes claimed with job_block_node (job.c), each with a reference,
	 * what the job shares of each (BLK_PERM_*) and the role it names in
	 * a conflict (NULL: "root" of an unnamed block device, QEMU's words
	 * for a job's own BlockBackend). */
	struct blk_node **blocked;
	uint32_t *blocked_shared;
	const char **blocked_role;
	unsigned nblocked;

	/* ---- shared: written by one side, read by the other ---- */
	/* Main asks, the job loop looks at its pause points. */
	atomic_bool pause_req, cancel_req;
	/* Main writes (block-job-set-speed), the job loop reads. */
	_Atomic uint64_t speed;
	/* The job loop writes, main reads (query-jobs, events). */
	_Atomic uint64_t progress_current, progress_total;
	atomic_bool busy; /* run() is not parked at a pause point or sleeping */

	/* ---- job loop only ---- */
	struct coroutine *co;
	struct loop_timer sleep_timer;
	bool parked; /* yielded at a pause point, until main resumes it */
	/* Rate limit (job_ratelimit): when the bytes dispatched so far are
	 * paid for at the current speed; slice_bytes: unused, 0. */
	uint64_t slice_start_ns, slice_bytes;
	int run_ret; /* run()'s result: job loop writes it before msg_done */
	/* Messages (each has one user at a time; see job.c). */
	struct loop_msg msg_start, msg_resume;           /* main -> job loop */
	struct loop_msg msg_kick;                        /* main -> job loop: ends a job_sleep() */
	atomic_bool kick_pending;                        /* msg_kick is on its way */
	bool sleeping;                                   /* job loop: in job_sleep() */
	struct loop_msg msg_parked, msg_ready, msg_done; /* job loop -> main */
	struct loop_msg msg_error;                       /* job loop -> main (BLOCK_JOB_ERROR) */
	/* The error action that msg_error carries (job loop writes it before the
	 * send, main reads it after). */
	bool err_is_read;
	enum job_error_action err_action;
	int err_errno;
};

/* ---- creating and finding (main) ---------------------------------------- */

/* Make a job of driver drv in state CREATED (JOB_STATUS_CHANGE "created"):
 * checks the id (QEMU's "Invalid job ID '%s'", "Job ID '%s' already in
 * use", "An explicit job ID is required for this node"), takes a
 * reference to o->bs as "block job 'ID'". 0 and *out, or -errno with
 * QEMU's message. The driver fills its part of *out, then calls
 * job_start(); on its own failure before that, job_early_fail(). */
int job_create(const struct job_driver *drv, const struct job_opts *o, struct job **out, char *err,
	       size_t errlen);
/* CREATED -> RUNNING, run() entered on the job loop. */
void job_start(struct job *job);
/* A job never started: gone without events beyond "created" -> "null". */
void job_early_fail(struct job *job);

/* The job with that id (NULL: none), and iteration in creation order. */
struct job *job_find(const char *id);
struct job *job_next(struct job *prev);
/* The loop of the iothread that serves bs (an export's, whether or not it
 * has clients yet), else the first iothread of the pool (job_set_loops),
 * else an iothread of the jobs' own. */
struct loop *job_pick_loop(struct blk_node *bs);
/* The daemon's main loop and iothread pool (start-up). */
void job_set_loops(struct loop *main, struct loop **pool, unsigned npool);
struct loop *job_main_loop(void);
/* Which loops are iothreads the daemon made (the monitor's objects), so that
 * a job follows an export placed on one. NULL: only the pool counts. */
void job_set_iothread_filter(bool (*fn)(const struct loop *loop));
/* The iothread of an export whose node is bs or has bs below it (NULL:
 * none), so that a job follows an export that has no client yet. Main. */
void job_set_export_loop_fn(struct loop *(*fn)(struct blk_node *bs));
bool job_loop_is_iothread(const struct loop *loop);
/* Daemon exit, after job_cancel_all_sync(): stop the jobs' own iothread (the
 * one made when there is no pool). */
void job_shutdown(void);

/* Who hears of a job's events (QMP: qmp-job.c). Main thread; any hook may be
 * NULL. status: JOB_STATUS_CHANGE (the new job->status); pending:
 * BLOCK_JOB_PENDING (manual finalize only); error: BLOCK_JOB_ERROR. */
struct job_event_ops {
	void (*status)(struct job *job);
	void (*ready)(struct job *job);
	void (*pending)(struct job *job);
	void (*completed)(struct job *job); /* error: job->error when job->ret */
	void (*cancelled)(struct job *job);
	void (*error)(struct job *job, bool is_read, enum job_error_action action);
};
void job_set_event_ops(const struct job_event_ops *ops);

/* ---- node blockers (main) ----------------------------------------------- */

/* A job claims a node for the duration of the job (its top, base,
 * intermediates, target): another job, a snapshot or a removal of it is
 * refused with QEMU's message "Node '%s' is busy: block device is in use
 * by block job: %s" (the job type). Released by the framework at the end.
 * -ENOMEM, or -EBUSY with the message when another job holds it. */
int job_block_node(struct job *job, struct blk_node *bs, char *err, size_t errlen);
/* The same, sharing only `shared` of bs (BLK_PERM_*) with other users:
 * users that hold more (an export that writes a commit's base) are refused
 * now (-EPERM) and later (job_node_perm_check), with QEMU's "Permission
 * conflict on node ..." message. role: the role QEMU names ("intermediate
 * node"), static; NULL: the job's own access to the node. */
int job_block_node_shared(struct job *job, struct blk_node *bs, uint32_t shared, const char *role,
			  char *err, size_t errlen);
/* 0, or -EBUSY with that message when a job holds bs. */
int job_node_busy(const struct blk_node *bs, char *err, size_t errlen);
/* May a new user of bs hold perm (BLK_PERM_*)? 0, or -EPERM with QEMU's
 * message when a job does not share it (exports check before they start). */
int job_node_perm_check(const struct blk_node *bs, uint32_t perm, char *err, size_t errlen);
/* How many references jobs hold on bs as blockers (blockdev-del tells a
 * node used by a job's own access from one it only blocks). */
unsigned job_node_blocker_refs(const struct blk_node *bs);

/* ---- commands (main): 0, or -errno with QEMU's message ------------------ */

/* The verb check: -EPERM and "Job '%s' in state '%s' cannot accept
 * command verb '%s'". */
int job_apply_verb(struct job *job, enum job_verb v, char *err, size_t errlen);
int job_user_pause(struct job *job, char *err, size_t errlen);
int job_user_resume(struct job *job, char *err, size_t errlen);
/* force: block-job-cancel force / job-cancel (always forced). */
int job_user_cancel(struct job *job, bool force, char *err, size_t errlen);
int job_user_complete(struct job *job, char *err, size_t errlen);
int job_user_finalize(struct job *job, char *err, size_t errlen);
int job_user_dismiss(struct job *job, char *err, size_t errlen);
int job_set_speed(struct job *job, int64_t speed, char *err, size_t errlen);
/* End a job_sleep() of run() early (a driver's own wake-up: mirror's
 * complete, a soft cancel). */
void job_enter(struct job *job);
/* Internal pauses (a drain of the job's nodes): nest, no user state. */
void job_pause(struct job *job);
void job_resume(struct job *job);
/* Cancel every job and wait until each reached NULL (daemon exit). */
void job_cancel_all_sync(void);

/* ---- for run() (job loop) ------------------------------------------------- */

/* Has a cancel been asked? run() then returns -ECANCELED soon. */
bool job_cancelled(struct job *job);
/* Park here if a pause is asked for (PAUSED or STANDBY), until resumed. */
void job_pause_point(struct job *job);
/* Sleep ns (0: just a pause point); a cancel or pause ends it early. */
void job_sleep(struct job *job, uint64_t ns);
/* The speed limit: account n bytes about to be copied and sleep as long
 * as speed says (QEMU's 100 ms slices). No-op at speed 0. */
void job_ratelimit(struct job *job, uint64_t n);
/* Progress (query-jobs current-progress / total-progress). */
void job_progress_add(struct job *job, uint64_t done);
void job_progress_set_total(struct job *job, uint64_t total);
void job_progress_add_total(struct job *job, uint64_t more);
/* RUNNING -> READY (BLOCK_JOB_READY): mirror, active commit. At most once
 * per job (QEMU 7.2 has no way back to RUNNING; msg_ready is not reused). */
void job_ready(struct job *job);
/* An I/O error of the job's own request: what policy says for err (-errno).
 * Sends BLOCK_JOB_ERROR (operation read/write, action); "stop" also parks
 * the job user-paused (io-status "failed"/"nospace") until job-resume, and
 * returns JOB_ACTION_STOP after the resume: the caller retries. */
enum job_error_action job_error_action(struct job *job, enum job_error_policy policy, bool is_read,
				       int err);
/* What policy says for err, without telling anyone: once a "stop" has
 * been answered, the other requests that failed before the resume are
 * retried with it (QEMU pauses once for them all). */
enum job_error_action job_policy_action(enum job_error_policy policy, int err);

/* ---- bounded copy (job loop) ---------------------------------------------- */

/* Reads ranges of src and writes them to dst at the same offsets, with at
 * most max_inflight requests of at most chunk bytes each in flight (so at
 * most chunk * max_inflight bytes of buffer), honouring the job's speed.
 * Buffers are allocated once, aligned for both nodes. */
#define JOB_COPY_CHUNK_DEFAULT (1u << 20)
#define JOB_COPY_INFLIGHT_DEFAULT 4u

struct job_copy;
struct job_guard;

/* Per-chunk hooks, on the job loop (may be NULL). before_write: after the
 * read, before the write (mirror: dirty-bitmap checks); return non-zero to
 * skip the write. done: the chunk is written (ret 0) or failed. */
struct job_copy_ops {
	int (*before_write)(struct job_copy *c, uint64_t off, uint64_t len, void *opaque);
	void (*done)(struct job_copy *c, uint64_t off, uint64_t len, int ret, void *opaque);
};

struct job_copy_opts {
	uint64_t chunk;        /* 0: JOB_COPY_CHUNK_DEFAULT; rounded to both nodes' align */
	unsigned max_inflight; /* 0: JOB_COPY_INFLIGHT_DEFAULT */
	uint32_t write_flags;  /* BLK_F_* for the writes */
	/* Ranges the source reports as zeroes (block status) become
	 * write-zeroes (MAY_UNMAP with zero_unmap) instead of a read and a
	 * write. */
	bool detect_zeroes, zero_unmap;
	bool progress; /* add each written chunk to the job's progress */
	/* Flush dst each time this many bytes were written since the last
	 * flush (one flush in flight at a time; 0: never): a job that flushes
	 * dst at its end waits for little then. A failed flush fails the copy. */
	uint64_t flush_every;
	enum job_error_policy on_source_error, on_target_error;
	/* Lock each chunk in this guard from before its read until after its
	 * write (stream's copy-on-read into the node guest writes go to). */
	struct job_guard *guard;
	const struct job_copy_ops *ops;
	void *opaque;
};

/* 0 and *out, or -ENOMEM / -EINVAL. Job loop (or main before job_start). */
int job_copy_new(struct job *job, struct blk_node *src, struct blk_node *dst,
		 const struct job_copy_opts *o, struct job_copy **out);
/* Queue [off, off+len) (clamped to the source's size): waits (yields)
 * while max_inflight chunks are in flight, so it returns once every chunk
 * of the range is submitted. A failed chunk whose error action is "stop"
 * is retried after the resume; "report" makes this and job_copy_wait()
 * return the error, "ignore" skips it. 0 or -errno (-ECANCELED when the
 * job was cancelled meanwhile). */
int job_copy_range(struct job_copy *c, uint64_t off, uint64_t len);
/* Wait until every chunk in flight has finished: 0 or the first error. */
int job_copy_wait(struct job_copy *c);
/* Chunks in flight now (mirror's bookkeeping). */
unsigned job_copy_inflight(const struct job_copy *c);
/* Frees buffers; nothing may be in flight (job_copy_wait first). NULL: nothing. */
void job_copy_free(struct job_copy *c);

/* ---- chain helpers (job loop) ---------------------------------------------- */

/* Is [off, off+len) allocated in top or in a node of its backing chain
 * above base (base excluded; NULL: the whole chain)? *pnum: bytes from off
 * with that same answer (>= 1). 0 or -errno. */
int job_allocated_above(struct blk_node *top, struct blk_node *base, uint64_t off, uint64_t len,
			bool *allocated, uint64_t *pnum);

/* ---- write guard (stream) -------------------------------------------------- */

/* A filter node put above bs in its place for every user (exports): writes,
 * write-zeroes and discards from them wait while they overlap a range the
 * job has locked, and a lock waits for the overlapping ones in flight. So
 * that a job can read a range of bs and write it back (copy-on-read, as
 * QEMU's stream filter) without undoing a guest write. name: the node-name
 * (filter-node-name), NULL: generated. Main, bs not drained by the caller.
 * 0 and *out, or -errno with a message. */
struct job_guard;
int job_guard_insert(struct blk_node *bs, const char *name, struct job_guard **out, char *err,
		     size_t errlen);
/* Take the filter out again (main): users go back to bs. */
void job_guard_remove(struct job_guard *g);
struct blk_node *job_guard_node(struct job_guard *g);
/* Job loop (coroutine): lock [off, off+len) against guest writes, waiting for
 * those in flight; unlock lets the waiting ones go. One lock per chunk. */
void job_guard_lock(struct job_guard *g, uint64_t off, uint64_t len);
void job_guard_unlock(struct job_guard *g, uint64_t off, uint64_t len);

/* ---- QMP (main) ------------------------------------------------------------- */

/* Register query-jobs, query-block-jobs, job-*, block-job-* and the events
 * (qmp-job.c). 0 or -errno. */
int qmp_job_register(void);

#endif
