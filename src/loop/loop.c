/* The event loop core: dispatch rounds, deferred work, timers, poll handlers,
 * flush hooks and cross-thread messages. The fd monitor is a backend
 * (loop-uring.c or loop-epoll.c); registered fds are in loop-fd.c, the ring's
 * SQEs for the I/O engines and the dispatch of its completions in loop-io.c.
 *
 * A round: wait (or busy-poll) for events and dispatch them; run due timers;
 * run messages; run the work deferred so far; run flush hooks. The next wait
 * submits the I/O queued during the round together with the wait.
 *
 * Threading: a loop belongs to the thread that runs it; only loop_send() and
 * loop_stop() may be called from other threads. */
#include <errno.h>
#include <sched.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "loop/loop-int.h"
#include "loop/thread-pool.h"
#include "util/log.h"
#include "util/trace.h"

static __thread struct loop *current_loop;
/* Indices of live loops: reused once a loop is freed, so that iothreads
 * created and deleted at runtime never give two live loops one index (and
 * so one slot of every per-thread table). Protected by index_lock. */
static pthread_mutex_t index_lock = PTHREAD_MUTEX_INITIALIZER;
static bool index_used[LOOP_MAX_THREADS];

static int index_get(unsigned *out)
{
	int ret = -EAGAIN;

	pthread_mutex_lock(&index_lock);
	for (unsigned i = 0; i < LOOP_MAX_THREADS; i++) {
		if (!index_used[i]) {
			index_used[i] = true;
			*out = i;
			ret = 0;
			break;
		}
	}
	pthread_mutex_unlock(&index_lock);
	return ret;
}

static void index_put(unsigned i)
{
	pthread_mutex_lock(&index_lock);
	index_used[i] = false;
	pthread_mutex_unlock(&index_lock);
}

/* After this many consecutive rounds that did not block, the epoll backend
 * checks its fds once without blocking (a round that never sleeps would
 * otherwise starve them, and checking every round costs a system call). */
#define BUSY_FD_CHECK_ROUNDS 16

uint64_t loop_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

struct loop *loop_current(void)
{
	return current_loop;
}
void loop_bind_current(struct loop *loop)
{
	current_loop = loop;
}
enum loop_backend loop_backend(const struct loop *loop)
{
	return loop->backend;
}
unsigned loop_index(const struct loop *loop)
{
	return loop->index;
}
void *loop_tp_state(struct loop *loop)
{
	return loop->tp_state;
}
void loop_set_tp_state(struct loop *loop, void *state)
{
	loop->tp_state = state;
}
bool loop_stopping(const struct loop *loop)
{
	return atomic_load(&loop->stop);
}
struct io_uring *loop_uring(struct loop *loop)
{
	return loop->have_ring ? &loop->ring : NULL;
}

const char *loop_backend_name(const struct loop *loop)
{
	return loop->backend == LOOP_BACKEND_URING ? "io_uring" : "epoll";
}

/* ---- options ---------------------------------------------------------- */

static enum loop_backend backend_from_env(void)
{
	const char *s = getenv("IOPLANE_LOOP_BACKEND");

	if (!s || !*s || !strcmp(s, "auto"))
		return LOOP_BACKEND_AUTO;
	if (!strcmp(s, "uring") || !strcmp(s, "io_uring"))
		return LOOP_BACKEND_URING;
	if (!strcmp(s, "epoll"))
		return LOOP_BACKEND_EPOLL;
	log_warn("IOPLANE_LOOP_BACKEND=%s not understood (uring|epoll|auto); using auto", s);
	return LOOP_BACKEND_AUTO;
}

static int64_t poll_max_from_env(void)
{
	const char *s = getenv("IOPLANE_POLL_MAX_NS");
	char *end;
	long long v;

	if (!s || !*s)
		return LOOP_POLL_MAX_NS_DEFAULT;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno || *end || v < 0) {
		log_warn("IOPLANE_POLL_MAX_NS=%s is not a number of ns; using default", s);
		return LOOP_POLL_MAX_NS_DEFAULT;
	}
	return v;
}

/* ---- creation ----------------------------------------------------------- */

static void efd_cb(struct loop_fd *h, uint32_t revents);

static int loop_init_backend(struct loop *loop, enum loop_backend want)
{
	int ret;

	if (want != LOOP_BACKEND_EPOLL) {
		loop->backend = LOOP_BACKEND_URING;
		ret = loop_uring_init(loop);
		if (ret == 0 || want == LOOP_BACKEND_URING)
			return ret;
		log_debug("io_uring unavailable (%s); event loop falls back to epoll",
			  strerror(-ret));
	}
	loop->backend = LOOP_BACKEND_EPOLL;
	return loop_epoll_init(loop);
}

int loop_new(const struct loop_opts *opts, struct loop **out)
{
	/* No options: the defaults, adaptive polling included. */
	struct loop_opts dflt = {.backend = LOOP_BACKEND_AUTO, .poll_max_ns = -1};
	enum loop_backend want;
	struct loop *loop;
	int ret;

	if (!opts)
		opts = &dflt;
	loop = calloc(1, sizeof(*loop));
	if (!loop)
		return -ENOMEM;
	ret = index_get(&loop->index);
	if (ret < 0) {
		free(loop);
		return ret;
	}
	loop->defer_tail = &loop->defer_head;
	loop->poll_max_ns = opts->poll_max_ns < 0 ? poll_max_from_env() : opts->poll_max_ns;
	loop->poll_grow = opts->poll_grow;
	loop->poll_shrink = opts->poll_shrink;
	loop->aio_max_batch = opts->aio_max_batch;
	loop->epfd = -1;
	loop->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (loop->efd < 0) {
		ret = -errno;
		goto fail;
	}
	want = opts->backend != LOOP_BACKEND_AUTO ? opts->backend : backend_from_env();
	ret = loop_init_backend(loop, want);
	if (ret < 0)
		goto fail;
	loop->efd_h = (struct loop_fd){.fd = loop->efd, .events = EPOLLIN, .cb = efd_cb};
	ret = loop_fd_add(loop, &loop->efd_h);
	if (ret < 0)
		goto fail_backend;
	*out = loop;
	return 0;

fail_backend:
	if (loop->backend == LOOP_BACKEND_URING)
		loop_uring_fini(loop);
	else
		loop_epoll_fini(loop);
fail:
	if (loop->efd >= 0)
		close(loop->efd);
	index_put(loop->index);
	free(loop);
	return ret;
}

void loop_free(struct loop *loop)
{
	if (!loop)
		return;
	tp_loop_cleanup(loop);
	/* Run what is still queued so that nobody waits forever on it. */
	loop_run_once(loop, false);
	loop_fd_del(loop, &loop->efd_h);
	if (loop->backend == LOOP_BACKEND_URING)
		loop_uring_fini(loop);
	else
		loop_epoll_fini(loop);
	close(loop->efd);
	free(loop->heap);
	free(loop->slots);
	if (current_loop == loop)
		current_loop = NULL;
	index_put(loop->index);
	free(loop);
}

/* ---- deferred work and flush hooks -------------------------------------- */

void loop_defer(struct loop *loop, struct loop_defer *d)
{
	d->next = NULL;
	*loop->defer_tail = d;
	loop->defer_tail = &d->next;
}

static bool run_defers(struct loop *loop)
{
	struct loop_defer *d = loop->defer_head;

	if (!d)
		return false;
	/* Take the list as it is now: work deferred by these callbacks runs at the
	 * end of the next round, after that round has looked for events. */
	loop->defer_head = NULL;
	loop->defer_tail = &loop->defer_head;
	while (d) {
		struct loop_defer *next = d->next;

		d->cb(d);
		d = next;
	}
	return true;
}

void loop_request_flush(struct loop *loop, struct loop_flush *f)
{
	if (f->queued)
		return;
	f->queued = true;
	f->next = loop->flush_head;
	loop->flush_head = f;
}

static void run_flushes(struct loop *loop)
{
	while (loop->flush_head) {
		struct loop_flush *f = loop->flush_head;

		loop->flush_head = f->next;
		f->queued = false;
		f->cb(f);
	}
}

/* ---- timers: binary min-heap on deadline --------------------------------- */

static void heap_set(struct loop *loop, unsigned i, struct loop_timer *t)
{
	loop->heap[i] = t;
	t->heap_idx = i;
}

static void heap_up(struct loop *loop, unsigned i)
{
	struct loop_timer *t = loop->heap[i];

	while (i > 1 && loop->heap[i / 2]->deadline_ns > t->deadline_ns) {
		heap_set(loop, i, loop->heap[i / 2]);
		i /= 2;
	}
	heap_set(loop, i, t);
}

static void heap_down(struct loop *loop, unsigned i)
{
	struct loop_timer *t = loop->heap[i];
	unsigned n = loop->heap_n;

	for (;;) {
		unsigned c = 2 * i;

		if (c > n)
			break;
		if (c + 1 <= n && loop->heap[c + 1]->deadline_ns < loop->heap[c]->deadline_ns)
			c++;
		if (loop->heap[c]->deadline_ns >= t->deadline_ns)
			break;
		heap_set(loop, i, loop->heap[c]);
		i = c;
	}
	heap_set(loop, i, t);
}

static int heap_grow(struct loop *loop)
{
	unsigned cap = loop->heap_cap ? loop->heap_cap * 2 : 64;
	struct loop_timer **h = realloc(loop->heap, sizeof(*h) * (cap + 1));

	if (!h)
		return -ENOMEM;
	loop->heap = h;
	loop->heap_cap = cap;
	return 0;
}

void loop_timer_arm(struct loop *loop, struct loop_timer *t, uint64_t deadline_ns)
{
	if (t->heap_idx) {
		uint64_t old = t->deadline_ns;

		t->deadline_ns = deadline_ns;
		if (deadline_ns < old)
			heap_up(loop, t->heap_idx);
		else
			heap_down(loop, t->heap_idx);
		return;
	}
	if (loop->heap_n == loop->heap_cap && heap_grow(loop) < 0) {
		/* Out of memory for a timer slot: an invariant we cannot keep. */
		log_err("loop: cannot grow the timer heap");
		abort();
	}
	t->deadline_ns = deadline_ns;
	heap_set(loop, ++loop->heap_n, t);
	heap_up(loop, loop->heap_n);
}

void loop_timer_cancel(struct loop *loop, struct loop_timer *t)
{
	unsigned i = t->heap_idx;
	struct loop_timer *last;

	if (!i)
		return;
	t->heap_idx = 0;
	last = loop->heap[loop->heap_n--];
	if (last == t)
		return;
	heap_set(loop, i, last);
	heap_up(loop, i);
	heap_down(loop, last->heap_idx);
}

static void run_timers(struct loop *loop)
{
	uint64_t now;

	if (!loop->heap_n)
		return;
	now = loop_now_ns();
	while (loop->heap_n && loop->heap[1]->deadline_ns <= now) {
		struct loop_timer *t = loop->heap[1];

		loop_timer_cancel(loop, t);
		t->cb(t);
	}
}

/* Time until the next timer: -1 when none. */
static int64_t timer_timeout_ns(struct loop *loop)
{
	uint64_t now;

	if (!loop->heap_n)
		return -1;
	now = loop_now_ns();
	return loop->heap[1]->deadline_ns > now ? (int64_t)(loop->heap[1]->deadline_ns - now) : 0;
}

/* ---- poll handlers ------------------------------------------------------ */

void loop_poll_add(struct loop *loop, struct loop_poll *p)
{
	p->next = loop->polls;
	if (p->next)
		p->next->pprev = &p->next;
	p->pprev = &loop->polls;
	loop->polls = p;
	loop->npolls++;
}

void loop_poll_del(struct loop *loop, struct loop_poll *p)
{
	if (!p->pprev)
		return;
	*p->pprev = p->next;
	if (p->next)
		p->next->pprev = p->pprev;
	p->pprev = NULL;
	p->next = NULL;
	loop->npolls--;
}

void loop_set_poll_max_ns(struct loop *loop, int64_t ns)
{
	loop->poll_max_ns = ns < 0 ? LOOP_POLL_MAX_NS_DEFAULT : ns;
	if (loop->poll_ns > (uint64_t)loop->poll_max_ns)
		loop->poll_ns = (uint64_t)loop->poll_max_ns;
}

void loop_set_aio_max_batch(struct loop *loop, unsigned n)
{
	loop->aio_max_batch = n;
}

unsigned loop_aio_max_batch(const struct loop *loop)
{
	return loop->aio_max_batch;
}

/* ---- cross-thread messages ---------------------------------------------- */

static void wake(struct loop *target)
{
	static const uint64_t one = 1;

	/* Only when the target may be sleeping and nobody has written yet. */
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load(&target->notify_me))
		return;
	if (atomic_exchange(&target->notified, true))
		return;
	atomic_fetch_add_explicit(&target->wakeups_sent, 1, memory_order_relaxed);
	if (write(target->efd, &one, sizeof(one)) < 0 && errno != EAGAIN)
		log_err("loop: eventfd write failed: %s", strerror(errno));
}

void loop_send(struct loop *target, struct loop_msg *m)
{
	struct loop_msg *old = atomic_load_explicit(&target->msg_head, memory_order_relaxed);

	do {
		m->next = old;
	} while (!atomic_compare_exchange_weak_explicit(
		&target->msg_head, &old, m, memory_order_release, memory_order_relaxed));
	if (current_loop != target)
		wake(target);
}

void loop_hint_event(struct loop *loop, uint64_t when_ns)
{
	atomic_store_explicit(&loop->event_hint_ns, when_ns, memory_order_relaxed);
}

void loop_stop(struct loop *loop)
{
	atomic_store(&loop->stop, true);
	if (current_loop != loop)
		wake(loop);
}

static bool msgs_pending(struct loop *loop)
{
	return atomic_load_explicit(&loop->msg_head, memory_order_relaxed) != NULL;
}

static bool run_msgs(struct loop *loop)
{
	struct loop_msg *m, *rev = NULL;

	if (!msgs_pending(loop))
		return false;
	m = atomic_exchange_explicit(&loop->msg_head, NULL, memory_order_acquire);
	while (m) { /* the stack is newest-first: reverse for FIFO */
		struct loop_msg *next = m->next;

		m->next = rev;
		rev = m;
		m = next;
	}
	while (rev) {
		struct loop_msg *next = rev->next;

		loop->stats.msgs++;
		rev->cb(rev);
		rev = next;
	}
	return true;
}

static void efd_cb(struct loop_fd *h, uint32_t revents)
{
	struct loop *loop = h->loop;
	uint64_t v;

	(void)revents;
	/* Read first, then clear `notified`: a sender that sees it still set has
	 * pushed its message before we run the messages of this round. */
	if (read(loop->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_err("loop: eventfd read failed: %s", strerror(errno));
	atomic_store(&loop->notified, false);
}

bool loop_more_ready(struct loop *loop)
{
	return loop->defer_head || (loop->have_ring && io_uring_cq_ready(&loop->ring));
}

/* ---- the round ---------------------------------------------------------- */

static bool poll_once(struct loop *loop)
{
	struct loop_poll *p, *next;
	bool progress = false;

	for (p = loop->polls; p; p = next) {
		next = p->next;
		progress |= p->poll(p);
	}
	if (loop->have_ring) {
		loop_ring_get_events(loop);
		if (io_uring_cq_ready(&loop->ring))
			progress |= loop_reap_cqes(loop);
	}
	return progress || msgs_pending(loop) || loop->defer_head || atomic_load(&loop->stop);
}

/* A sched_yield() that returns later than this gave the CPU to another task. */
#define POLL_YIELD_GAVE_NS 4000

/* While polling for a peer: the peer may be waiting for our CPU (the
 * scheduler likes to wake it where its waker runs), so let it have it. If
 * someone took it, the CPU is shared with runnable work, which spinning only
 * holds back: true, stop polling and sleep. */
static bool peer_yield_gave_cpu(struct loop *loop)
{
	uint64_t t;

	if (!loop->peers_polled)
		return false;
	t = loop_now_ns();
	sched_yield();
	return loop_now_ns() - t > POLL_YIELD_GAVE_NS;
}

/* Busy-poll for up to poll_ns. Returns true when something was found. */
static bool busy_poll(struct loop *loop, uint64_t start)
{
	uint64_t deadline = start + loop->poll_ns;

	/* Polling past the next timer would only delay it. */
	if (loop->heap_n && loop->heap[1]->deadline_ns < deadline)
		deadline = loop->heap[1]->deadline_ns;

	/* The I/O queued this round must be in the kernel before we spin on it. */
	if (loop->have_ring && io_uring_sq_ready(&loop->ring))
		loop_ring_submit(loop);
	do {
		if (poll_once(loop)) {
			loop->stats.poll_hits++;
			return true;
		}
	} while (!peer_yield_gave_cpu(loop) && loop_now_ns() < deadline);
	loop->stats.poll_misses++;
	return false;
}

/* Grow when the event came just after polling stopped; shrink when polling
 * was wasted on a long sleep. Events that come a little after the maximum
 * (up to twice it) keep the poll time: with a device whose latency is close
 * to poll-max-ns most events still arrive within it, and halving after each
 * late one would turn those into sleeps too. */
static void adapt_poll(struct loop *loop, uint64_t block_ns)
{
	uint64_t max = (uint64_t)loop->poll_max_ns;

	if (block_ns <= loop->poll_ns)
		return;
	if (block_ns > 2 * max) {
		loop->poll_ns /= loop->poll_shrink ? loop->poll_shrink : 2;
		if (loop->poll_ns < 1000)
			loop->poll_ns = 0;
	} else if (loop->poll_ns < max) {
		/* Saturating: poll-grow may be any 32-bit value. */
		uint64_t g = loop->poll_grow ? loop->poll_grow : 2;

		loop->poll_ns = !loop->poll_ns            ? 4000
				: loop->poll_ns > max / g ? max
							  : loop->poll_ns * g;
		if (loop->poll_ns > max)
			loop->poll_ns = max;
	}
}

static void backend_wait(struct loop *loop, int64_t timeout_ns)
{
	if (loop->backend == LOOP_BACKEND_URING)
		loop_uring_wait(loop, timeout_ns);
	else
		loop_epoll_wait(loop, timeout_ns);
}

/* Give poll handlers their last look before the loop sleeps. */
static bool polls_before_sleep(struct loop *loop)
{
	struct loop_poll *p, *next;
	bool found = false;

	for (p = loop->polls; p; p = next) {
		next = p->next;
		if (p->sleep)
			found |= p->sleep(p);
	}
	return found;
}

/* Some poll handler expects work soon (loop_poll.idle). */
static bool polls_expect_work(const struct loop *loop)
{
	const struct loop_poll *p;

	for (p = loop->polls; p; p = p->next)
		if (!p->idle)
			return true;
	return false;
}

static void wait_blocking(struct loop *loop)
{
	bool can_poll = loop->poll_max_ns > 0 &&
			(loop->ops_inflight || loop->peers_polled || polls_expect_work(loop));
	uint64_t start = 0;
	int64_t timeout;

	if (can_poll) {
		start = loop_now_ns();
		if (loop->poll_ns && busy_poll(loop, start))
			return;
	}
	if (loop->npolls && polls_before_sleep(loop)) {
		loop->stats.poll_hits++;
		return;
	}
	/* From here until notify_me is cleared, senders may write the eventfd
	 * (once: `notified`); count this window as a sleep. */
	loop->stats.sleeps++;
	atomic_store(&loop->notify_me, 1);
	atomic_thread_fence(memory_order_seq_cst);
	if (msgs_pending(loop) || atomic_load(&loop->stop)) {
		atomic_store(&loop->notify_me, 0);
		backend_wait(loop, 0);
		return;
	}
	timeout = timer_timeout_ns(loop);
	backend_wait(loop, timeout);
	atomic_store(&loop->notify_me, 0);
	if (can_poll) {
		uint64_t now = loop_now_ns();
		uint64_t hint =
			atomic_exchange_explicit(&loop->event_hint_ns, 0, memory_order_relaxed);

		/* An event reported to have arrived during this sleep marks its
		 * end better than our own wake-up does. */
		adapt_poll(loop, (hint > start && hint < now ? hint : now) - start);
	}
}

static void wait_nonblocking(struct loop *loop, bool busy)
{
	if (loop->backend == LOOP_BACKEND_URING) {
		/* Submitting is a system call only when something is queued. */
		if (io_uring_sq_ready(&loop->ring))
			loop_ring_submit(loop);
		loop_ring_get_events(loop);
		loop_reap_cqes(loop);
		return;
	}
	if (loop->have_ring && io_uring_sq_ready(&loop->ring))
		loop_ring_submit(loop);
	loop_reap_cqes(loop);
	if (!busy || ++loop->busy_rounds >= BUSY_FD_CHECK_ROUNDS) {
		loop->busy_rounds = 0;
		loop_epoll_wait(loop, 0);
	}
}

void loop_run_once(struct loop *loop, bool blocking)
{
	struct loop *saved = current_loop;

	current_loop = loop;
	loop->stats.rounds++;
	/* Hooks requested between rounds (a submission from outside any
	 * callback) must reach the kernel before we wait on it. */
	if (loop->flush_head)
		run_flushes(loop);
	if (blocking && !loop->defer_head && !atomic_load(&loop->stop)) {
		loop->busy_rounds = 0;
		wait_blocking(loop);
	} else {
		wait_nonblocking(loop, blocking);
	}
	IOPLANE_TRACE(loop_round, loop, loop->stats.sleeps, loop->stats.poll_hits);
	run_timers(loop);
	run_msgs(loop);
	run_defers(loop);
	run_flushes(loop);
	current_loop = saved;
}

void loop_run(struct loop *loop)
{
	while (!atomic_load(&loop->stop))
		loop_run_once(loop, true);
}

void loop_get_stats(const struct loop *loop, struct loop_stats *out)
{
	*out = loop->stats;
	out->wakeups_sent = atomic_load(&loop->wakeups_sent);
	out->poll_ns = loop->poll_ns;
	out->poll_max_ns = (uint64_t)loop->poll_max_ns;
}

void loop_thread_sigmask(sigset_t *set)
{
	sigfillset(set);
	sigdelset(set, SIGBUS);
	sigdelset(set, SIGSEGV);
	sigdelset(set, SIGFPE);
	sigdelset(set, SIGILL);
}
