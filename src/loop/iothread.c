/* iothreads: a named thread that creates its own loop, runs it until
 * loop_stop(), then frees it (and its coroutine pool) on the same thread.
 *
 * Threading: iothread_start/join/run_sync are called from a thread that is
 * not the iothread (normally the main thread); `loop` is written by the
 * iothread before it posts `started` and read by others only after that. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loop/coroutine.h"
#include "loop/iothread.h"
#include "util/compiler.h"
#include "util/log.h"

struct iothread {
	pthread_t tid;
	char name[64];
	struct loop_opts opts;
	struct loop *loop;
	pid_t ktid;    /* the kernel thread id, valid after `started` */
	int start_ret; /* loop_new's result, valid after `started` */
	sem_t started;
	/* Posted by iothread_join() once it no longer touches the loop:
	 * loop_stop() may still be writing the loop's eventfd after the thread
	 * has seen the stop flag, so the loop is freed only after this. */
	sem_t released;
};

struct iothread_sync {
	struct loop_msg msg;
	void (*fn)(void *);
	void *arg;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool done; /* (lock) */
};

static void sem_wait_intr(sem_t *s)
{
	while (sem_wait(s) < 0 && errno == EINTR)
		;
}

/* What the loop did, for whoever tunes polling (IOPLANE_LOG=debug). */
static void iothread_log_stats(const char *name, struct loop *loop)
{
	struct loop_stats st;

	loop_get_stats(loop, &st);
	log_debug("%s: %" PRIu64 " rounds, %" PRIu64 " sleeps, %" PRIu64 " io_uring_enter, "
		  "%" PRIu64 " wake-ups sent to it, polling %" PRIu64 " hits %" PRIu64 " misses, "
		  "poll time %" PRIu64 " ns",
		  name, st.rounds, st.sleeps, st.submits, st.wakeups_sent, st.poll_hits,
		  st.poll_misses, st.poll_ns);
}

static void *iothread_main(void *arg)
{
	struct iothread *t = arg;
	char comm[16]; /* the kernel keeps 15 characters */
	struct loop *loop;

	snprintf(comm, sizeof(comm), "%.15s", t->name);
	pthread_setname_np(pthread_self(), comm);
	t->ktid = gettid();
	t->start_ret = loop_new(&t->opts, &loop);
	if (t->start_ret == 0) {
		loop_bind_current(loop);
		t->loop = loop;
	}
	sem_post(&t->started);
	if (t->start_ret < 0)
		return NULL;
	loop_run(loop);
	iothread_log_stats(t->name, loop);
	sem_wait_intr(&t->released);
	loop_free(loop);
	coroutine_pool_cleanup();
	return NULL;
}

int iothread_start(const char *name, const struct loop_opts *opts, struct iothread **out)
{
	struct iothread *t = calloc(1, sizeof(*t));
	pthread_attr_t attr;
	sigset_t all;
	int ret;

	if (!t)
		return -ENOMEM;
	snprintf(t->name, sizeof(t->name), "%s", name ? name : "iothread");
	if (opts)
		t->opts = *opts;
	else
		t->opts = (struct loop_opts){.backend = LOOP_BACKEND_AUTO, .poll_max_ns = -1};
	sem_init(&t->started, 0, 0);
	sem_init(&t->released, 0, 0);
	ret = -pthread_attr_init(&attr);
	if (ret < 0)
		goto fail;
	/* Signals go to the main thread, not to a loop that may be polling. */
	loop_thread_sigmask(&all);
	pthread_attr_setsigmask_np(&attr, &all);
	ret = -pthread_create(&t->tid, &attr, iothread_main, t);
	pthread_attr_destroy(&attr);
	if (ret < 0)
		goto fail;
	sem_wait_intr(&t->started);
	ret = t->start_ret;
	if (ret < 0) {
		pthread_join(t->tid, NULL);
		goto fail;
	}
	*out = t;
	return 0;

fail:
	sem_destroy(&t->started);
	sem_destroy(&t->released);
	free(t);
	return ret;
}

struct loop *iothread_loop(struct iothread *t)
{
	return t->loop;
}

const char *iothread_name(const struct iothread *t)
{
	return t->name;
}

uint64_t iothread_cpu_ns(const struct iothread *t)
{
	struct timespec ts;
	clockid_t cid;

	if (pthread_getcpuclockid(t->tid, &cid) || clock_gettime(cid, &ts) < 0)
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

pid_t iothread_tid(const struct iothread *t)
{
	return t->ktid;
}

void iothread_join(struct iothread *t)
{
	if (!t)
		return;
	loop_stop(t->loop);
	sem_post(&t->released);
	pthread_join(t->tid, NULL);
	sem_destroy(&t->started);
	sem_destroy(&t->released);
	free(t);
}

static void iothread_sync_cb(struct loop_msg *m)
{
	struct iothread_sync *s = container_of(m, struct iothread_sync, msg);

	s->fn(s->arg);
	/* The waiter frees `s` once it sees done, which it can only do after
	 * we unlock: nothing touches `s` after that. */
	pthread_mutex_lock(&s->lock);
	s->done = true;
	pthread_cond_signal(&s->cond);
	pthread_mutex_unlock(&s->lock);
}

void iothread_run_sync(struct iothread *t, void (*fn)(void *), void *arg)
{
	struct iothread_sync s = {.msg.cb = iothread_sync_cb, .fn = fn, .arg = arg};

	if (loop_current() == t->loop) {
		fn(arg); /* waiting for ourselves would never end */
		return;
	}
	pthread_mutex_init(&s.lock, NULL);
	pthread_cond_init(&s.cond, NULL);
	loop_send(t->loop, &s.msg);
	pthread_mutex_lock(&s.lock);
	while (!s.done)
		pthread_cond_wait(&s.cond, &s.lock);
	pthread_mutex_unlock(&s.lock);
	pthread_cond_destroy(&s.cond);
	pthread_mutex_destroy(&s.lock);
}
