/* The process-wide thread pool: a mutex-protected FIFO of jobs, workers made on
 * demand that spin briefly and then sleep on a condvar, and per-loop completion
 * delivery (a lock-free stack, a poll handler and a kick message).
 *
 * Threading: tp_submit() and tp_loop_cleanup() run on the submitting loop's
 * thread; fn runs on a worker; done runs on the submitting loop's thread from
 * its poll handler or kick message, never from inside tp_submit(). */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loop/loop.h"
#include "loop/thread-pool.h"
#include "util/clock.h"
#include "util/compiler.h"
#include "util/log.h"
#include "util/trace.h"

#define TP_MAX_WORKERS_DEFAULT 64
#define TP_SPIN_NS_DEFAULT 20000
#define TP_IDLE_EXIT_S 10

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ volatile("yield" ::: "memory");
#endif
}

/* Per-loop completion state.
 *
 * How a finished job reaches its loop: the worker pushes it on `head`. The
 * first push after a drain is responsible for the loop noticing; it sends
 * `kick` with loop_send(), unless a kick is already queued. loop_send()
 * writes the loop's eventfd only when the loop may be sleeping (it keeps the
 * "notify me" state that we cannot see from here, and re-checks its messages
 * after arming it), so a polling or running loop costs no system call: the
 * poll handler or the kick's callback drains the stack. */
struct tp_loop {
	/* Written by workers, read by the loop thread. `notifiers` counts
	 * workers between their push and the end of their kick, so that cleanup
	 * does not free this under them. `kick_queued`: set by the worker that
	 * sends `kick`, cleared by its callback before it drains. */
	alignas(64) _Atomic(struct tp_work *) head;
	atomic_int notifiers;
	atomic_bool kick_queued;
	struct loop_msg kick;
	/* Loop thread only. */
	alignas(64) struct loop *loop;
	struct loop_poll poll;
	bool poll_on;      /* poll handler registered (while jobs are in flight) */
	unsigned inflight; /* submitted, done() not yet run */
};

/* The pool. Fields marked (lock) are protected by `lock`. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_once_t once;
	struct tp_work *head, **tail; /* (lock) the job queue */
	unsigned queued;              /* (lock) jobs in the queue */
	unsigned workers;             /* (lock) live worker threads */
	unsigned sleeping;            /* (lock) workers in cond_wait not yet signalled */
	unsigned tokens;              /* (lock) signals sent and not yet consumed */
	unsigned max_workers;         /* (lock) */
	uint64_t submitted;           /* (lock) */
	uint64_t worker_wakeups;      /* (lock) */
	/* Idle workers that will look at the queue again without being signalled
	 * (spinning, signalled, just spawned, or finishing a job). Incremented
	 * anywhere; decremented only under the lock by the worker itself after it
	 * checked the queue, so a submitter holding the lock never undercounts
	 * the workers that will still see its job. */
	atomic_uint awake;
	atomic_uint pending; /* mirror of `queued` for spinning workers */
	atomic_uint_fast64_t spin_ns;
	atomic_uint_fast64_t completed, loop_wakeups, reaped_polling;
} tp = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.once = PTHREAD_ONCE_INIT,
	.tail = &tp.head,
	.max_workers = TP_MAX_WORKERS_DEFAULT,
	.spin_ns = TP_SPIN_NS_DEFAULT,
};

/* ---- settings and statistics ---------------------------------------------- */

void tp_set_max_workers(unsigned n)
{
	pthread_mutex_lock(&tp.lock);
	tp.max_workers = n ? n : 1;
	pthread_mutex_unlock(&tp.lock);
}

void tp_set_spin_ns(uint64_t ns)
{
	atomic_store(&tp.spin_ns, ns);
}

void tp_get_stats(struct tp_stats *out)
{
	pthread_mutex_lock(&tp.lock);
	out->submitted = tp.submitted;
	out->worker_wakeups = tp.worker_wakeups;
	out->workers = tp.workers;
	pthread_mutex_unlock(&tp.lock);
	out->completed = atomic_load(&tp.completed);
	out->loop_wakeups = atomic_load(&tp.loop_wakeups);
	out->reaped_polling = atomic_load(&tp.reaped_polling);
}

/* ---- completion delivery: loop side ---------------------------------------- */

/* Run the done() callbacks of every finished job, oldest first. */
static unsigned tp_drain(struct tp_loop *s)
{
	struct tp_work *w, *rev = NULL;
	unsigned n = 0;

	if (!atomic_load_explicit(&s->head, memory_order_relaxed))
		return 0;
	w = atomic_exchange(&s->head, NULL);
	while (w) {
		struct tp_work *next = w->next;

		w->next = rev;
		rev = w;
		w = next;
	}
	while (rev) {
		struct tp_work *next = rev->next;

		s->inflight--;
		n++;
		rev->done(rev, rev->ret); /* may free rev or submit again */
		rev = next;
	}
	atomic_fetch_add_explicit(&tp.completed, n, memory_order_relaxed);
	/* Nothing left to wait for: stop making the loop poll on our account. */
	if (!s->inflight && s->poll_on) {
		loop_poll_del(s->loop, &s->poll);
		s->poll_on = false;
	}
	return n;
}

static bool tp_poll_cb(struct loop_poll *p)
{
	struct tp_loop *s = container_of(p, struct tp_loop, poll);
	unsigned n = tp_drain(s);

	if (n) {
		atomic_fetch_add_explicit(&tp.reaped_polling, n, memory_order_relaxed);
		return true;
	}
	/* The job we poll for needs a CPU, and on a small machine the worker
	 * running it may be queued behind this polling loop on the same one
	 * (the scheduler tends to place a woken worker next to its waker).
	 * Let it run; when nothing else is runnable this returns at once. */
	sched_yield();
	return false;
}

static void tp_kick_cb(struct loop_msg *m)
{
	struct tp_loop *s = container_of(m, struct tp_loop, kick);

	/* Clear before draining: a worker that still sees it set has pushed
	 * before this drain. */
	atomic_store(&s->kick_queued, false);
	tp_drain(s);
}

static int tp_loop_setup(struct loop *loop, struct tp_loop **out)
{
	struct tp_loop *s = calloc(1, sizeof(*s));

	if (!s)
		return -ENOMEM;
	s->loop = loop;
	s->poll.poll = tp_poll_cb;
	s->kick.cb = tp_kick_cb;
	loop_set_tp_state(loop, s);
	*out = s;
	return 0;
}

/* Wait for the jobs still in flight (running their done() callbacks), then
 * free the loop's state. Blocks for as long as the slowest job takes. */
void tp_loop_cleanup(struct loop *loop)
{
	struct tp_loop *s = loop_tp_state(loop);
	struct timespec pause = {.tv_nsec = 100000};

	if (!s)
		return;
	while (s->inflight) { /* each job still to finish will kick us */
		bool stopping = loop_stopping(loop);

		loop_run_once(loop, !stopping);
		if (stopping) /* rounds no longer block: do not spin hard */
			nanosleep(&pause, NULL);
	}
	/* A worker may still be inside tp_notify() after its push was reaped;
	 * it wakes nobody when it leaves, so wait without blocking. */
	while (atomic_load(&s->notifiers))
		sched_yield();
	/* Its kick may be queued: run it before `kick` goes away. */
	while (atomic_load(&s->kick_queued))
		loop_run_once(loop, false);
	if (s->poll_on)
		loop_poll_del(loop, &s->poll);
	loop_set_tp_state(loop, NULL);
	free(s);
}

/* ---- completion delivery: worker side ------------------------------------ */

/* Hand a finished job to its loop (see struct tp_loop). */
static void tp_notify(struct tp_work *w)
{
	struct tp_loop *s = w->tpl;
	struct loop *loop = w->loop;
	struct tp_work *old;

	atomic_fetch_add(&s->notifiers, 1);
	/* Tell adaptive polling when the completion really arrived: a sleeping
	 * loop wakes up later than that, and judging by its wake-up time alone
	 * it would never learn to poll long enough for a slow device. */
	loop_hint_event(loop, clock_mono_ns());
	old = atomic_load_explicit(&s->head, memory_order_relaxed);
	do {
		w->next = old;
	} while (!atomic_compare_exchange_weak(&s->head, &old, w));
	/* w may be gone now (done() ran); only s is ours until notifiers drops.
	 * A later push rides on the first one's kick: the drain that kick
	 * causes takes every job pushed before it. */
	if (!old && !atomic_exchange(&s->kick_queued, true)) {
		atomic_fetch_add_explicit(&tp.loop_wakeups, 1, memory_order_relaxed);
		loop_send(loop, &s->kick);
	}
	atomic_fetch_sub(&s->notifiers, 1);
}

/* ---- workers ----------------------------------------------------------------- */

static void tp_init_once(void)
{
	pthread_condattr_t attr;

	pthread_condattr_init(&attr);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	pthread_cond_init(&tp.cond, &attr);
	pthread_condattr_destroy(&attr);
}

static struct tp_work *tp_dequeue_locked(void)
{
	struct tp_work *w = tp.head;

	if (!w)
		return NULL;
	tp.head = w->next;
	if (!tp.head)
		tp.tail = &tp.head;
	tp.queued--;
	atomic_store_explicit(&tp.pending, tp.queued, memory_order_relaxed);
	return w;
}

/* Called with the lock held, counted in `awake`, queue empty. Spin, then
 * sleep. Returns true when the worker should exit (idle too long); it has
 * then left every count. */
static bool tp_idle_locked(const struct timespec *exit_at)
{
	uint64_t spin = atomic_load_explicit(&tp.spin_ns, memory_order_relaxed);

	if (spin) {
		uint64_t end = clock_mono_ns() + spin;

		pthread_mutex_unlock(&tp.lock);
		while (!atomic_load_explicit(&tp.pending, memory_order_relaxed) &&
		       clock_mono_ns() < end) {
			cpu_relax();
			sched_yield(); /* the same reason as in tp_poll_cb() */
		}
		pthread_mutex_lock(&tp.lock);
		if (tp.queued)
			return false;
	}
	atomic_fetch_sub(&tp.awake, 1);
	tp.sleeping++;
	while (!tp.tokens) {
		if (pthread_cond_timedwait(&tp.cond, &tp.lock, exit_at) == ETIMEDOUT &&
		    !tp.tokens) {
			tp.sleeping--;
			tp.workers--;
			return true;
		}
	}
	tp.tokens--; /* the submitter moved us from `sleeping` to `awake` */
	return false;
}

static void tp_exit_deadline(struct timespec *ts)
{
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += TP_IDLE_EXIT_S;
}

static void *tp_worker_main(void *arg)
{
	struct timespec exit_at;
	struct tp_work *w;

	(void)arg;
	pthread_setname_np(pthread_self(), "tp-worker");
	pthread_mutex_lock(&tp.lock);
	tp_exit_deadline(&exit_at);
	for (;;) {
		w = tp_dequeue_locked();
		if (!w) {
			if (tp_idle_locked(&exit_at))
				break;
			continue;
		}
		atomic_fetch_sub(&tp.awake, 1);
		pthread_mutex_unlock(&tp.lock);
		IOPLANE_TRACE(tp_job_start, w);
		w->ret = w->fn(w);
		IOPLANE_TRACE(tp_job_finish, w, w->ret);
		/* Count ourselves awake before the loop can see the completion, so
		 * that a resubmission from done() does not wake another worker. */
		atomic_fetch_add(&tp.awake, 1);
		tp_notify(w);
		pthread_mutex_lock(&tp.lock);
		tp_exit_deadline(&exit_at);
	}
	pthread_mutex_unlock(&tp.lock);
	return NULL;
}

static int tp_spawn(void)
{
	pthread_attr_t attr;
	sigset_t all;
	pthread_t tid;
	int ret;

	ret = pthread_attr_init(&attr);
	if (ret)
		return -ret;
	/* Workers take no signals but the synchronous ones. */
	loop_thread_sigmask(&all);
	pthread_attr_setsigmask_np(&attr, &all);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	ret = pthread_create(&tid, &attr, tp_worker_main, NULL);
	pthread_attr_destroy(&attr);
	return -ret;
}

/* ---- submission ---------------------------------------------------------------- */

enum tp_action { TP_NONE, TP_SIGNAL, TP_SPAWN };

/* A new job is queued: make sure enough workers will look at the queue. */
static enum tp_action tp_enqueue_locked(struct tp_work *w)
{
	w->next = NULL;
	*tp.tail = w;
	tp.tail = &w->next;
	tp.queued++;
	tp.submitted++;
	atomic_store_explicit(&tp.pending, tp.queued, memory_order_relaxed);
	if (tp.queued <= atomic_load(&tp.awake))
		return TP_NONE; /* a spinning or finishing worker will take it */
	if (tp.sleeping) {
		tp.sleeping--;
		tp.tokens++;
		tp.worker_wakeups++;
		atomic_fetch_add(&tp.awake, 1);
		return TP_SIGNAL;
	}
	if (tp.workers < tp.max_workers) {
		tp.workers++;
		atomic_fetch_add(&tp.awake, 1);
		return TP_SPAWN;
	}
	return TP_NONE; /* every worker is busy; they come back to the queue */
}

/* pthread_create failed: undo the reservation and hand the job to a sleeper
 * if there is one. With no worker at all nothing would ever run, so run the
 * queue here; done() still comes later, from the loops' handlers. */
static void tp_spawn_failed(int err)
{
	bool signal = false;
	struct tp_work *w;

	log_warn("thread pool: cannot create a worker: %s", strerror(-err));
	pthread_mutex_lock(&tp.lock);
	tp.workers--;
	atomic_fetch_sub(&tp.awake, 1);
	if (tp.sleeping && tp.queued > atomic_load(&tp.awake)) {
		tp.sleeping--;
		tp.tokens++;
		tp.worker_wakeups++;
		atomic_fetch_add(&tp.awake, 1);
		signal = true;
	}
	while (!tp.workers && (w = tp_dequeue_locked())) {
		pthread_mutex_unlock(&tp.lock);
		w->ret = w->fn(w);
		tp_notify(w);
		pthread_mutex_lock(&tp.lock);
	}
	pthread_mutex_unlock(&tp.lock);
	if (signal)
		pthread_cond_signal(&tp.cond);
}

void tp_submit(struct loop *loop, struct tp_work *w)
{
	struct tp_loop *s = loop_tp_state(loop);
	enum tp_action act;
	int ret;

	if (!s) {
		ret = tp_loop_setup(loop, &s);
		if (ret < 0) {
			/* tp_submit() cannot fail by contract; without an eventfd
			 * we have no way to deliver done(). */
			log_err("thread pool: loop setup failed: %s", strerror(-ret));
			abort();
		}
	}
	pthread_once(&tp.once, tp_init_once);
	w->loop = loop;
	w->tpl = s;
	w->ret = 0;
	s->inflight++;
	if (!s->poll_on) {
		loop_poll_add(loop, &s->poll);
		s->poll_on = true;
	}
	pthread_mutex_lock(&tp.lock);
	act = tp_enqueue_locked(w);
	pthread_mutex_unlock(&tp.lock);
	if (act == TP_SIGNAL) {
		pthread_cond_signal(&tp.cond);
	} else if (act == TP_SPAWN) {
		ret = tp_spawn();
		if (ret < 0)
			tp_spawn_failed(ret);
	}
}
