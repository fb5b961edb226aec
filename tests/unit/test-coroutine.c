/* Unit tests for coroutines: switching, nesting, pooling, stack contents,
 * per-thread pools. Threading: each test runs on the main thread unless it
 * says otherwise. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "loop/coroutine.h"

/* ---- ping-pong ------------------------------------------------------------- */

struct pingpong {
	int turns; /* how many times the coroutine yields */
	int counter;
	int log[16];
	int nlog;
};

static void pingpong_fn(void *opaque)
{
	struct pingpong *p = opaque;
	int i;

	for (i = 0; i < p->turns; i++) {
		p->counter++;
		p->log[p->nlog++] = 100 + i;
		coroutine_yield();
	}
	p->log[p->nlog++] = 999;
}

static void test_yield_enter_pingpong(void **state)
{
	struct pingpong p = {.turns = 3};
	struct coroutine *co;
	int i;

	(void)state;
	assert_false(coroutine_in());
	assert_null(coroutine_self());
	co = coroutine_create(pingpong_fn, &p);
	assert_non_null(co);
	assert_int_equal(p.counter, 0); /* does not run until entered */
	for (i = 0; i < 3; i++) {
		coroutine_enter(co);
		assert_int_equal(p.counter, i + 1);
		p.log[p.nlog++] = i;
		assert_false(coroutine_in());
	}
	coroutine_enter(co); /* finishes */
	int want[] = {100, 0, 101, 1, 102, 2, 999};
	assert_int_equal(p.nlog, 7);
	assert_memory_equal(p.log, want, sizeof(want));
}

/* ---- nesting -------------------------------------------------------------------- */

struct nest {
	struct coroutine *a, *b;
	char log[32];
	int n;
	int self_ok;
};

static void nest_b(void *opaque)
{
	struct nest *s = opaque;

	s->self_ok += coroutine_self() == s->b;
	s->log[s->n++] = 'b';
	coroutine_yield(); /* back to a, not to the thread */
	s->self_ok += coroutine_self() == s->b;
	s->log[s->n++] = 'B';
}

static void nest_a(void *opaque)
{
	struct nest *s = opaque;

	s->self_ok += coroutine_self() == s->a;
	s->log[s->n++] = 'a';
	coroutine_enter(s->b);
	s->self_ok += coroutine_self() == s->a;
	s->log[s->n++] = '1';
	coroutine_yield(); /* back to the thread */
	s->log[s->n++] = '2';
	coroutine_enter(s->b); /* b finishes; we continue */
	s->self_ok += coroutine_self() == s->a;
	s->log[s->n++] = 'A';
}

static void test_nested_enter(void **state)
{
	struct nest s = {0};

	(void)state;
	s.a = coroutine_create(nest_a, &s);
	s.b = coroutine_create(nest_b, &s);
	assert_non_null(s.a);
	assert_non_null(s.b);
	coroutine_enter(s.a);
	s.log[s.n++] = 'm';
	assert_null(coroutine_self());
	coroutine_enter(s.a);
	s.log[s.n] = 0;
	assert_string_equal(s.log, "ab1m2BA");
	assert_int_equal(s.self_ok, 5);
}

/* ---- pooling ----------------------------------------------------------------- */

static void count_fn(void *opaque)
{
	(*(int *)opaque)++;
}

static void test_pool_reuse(void **state)
{
	struct coroutine_stats before, after;
	int runs = 0, i;

	(void)state;
	/* Warm the pool so that at least one coroutine is free. */
	coroutine_enter(coroutine_create(count_fn, &runs));
	coroutine_pool_stats(&before);
	assert_true(before.pooled >= 1);
	for (i = 0; i < 5000; i++) {
		struct coroutine *co = coroutine_create(count_fn, &runs);

		assert_non_null(co);
		coroutine_enter(co);
	}
	coroutine_pool_stats(&after);
	assert_int_equal(runs, 5001);
	assert_int_equal(after.created, before.created); /* no new stack at all */
	assert_int_equal(after.reused - before.reused, 5000);
	assert_int_equal(after.pooled, before.pooled);
}

static void yield_once_fn(void *opaque)
{
	coroutine_yield();
	(*(int *)opaque)++;
}

/* Many alive at once: each needs its own stack; the free list keeps 64. */
static void test_pool_cap(void **state)
{
	enum { N = 100 };
	struct coroutine *co[N];
	struct coroutine_stats before, mid, after;
	int runs = 0, i;

	(void)state;
	coroutine_pool_cleanup();
	coroutine_pool_stats(&before);
	assert_int_equal(before.pooled, 0);
	for (i = 0; i < N; i++) {
		co[i] = coroutine_create(yield_once_fn, &runs);
		assert_non_null(co[i]);
		coroutine_enter(co[i]);
	}
	coroutine_pool_stats(&mid);
	assert_int_equal(mid.created - before.created, N);
	for (i = 0; i < N; i++)
		coroutine_enter(co[i]);
	coroutine_pool_stats(&after);
	assert_int_equal(runs, N);
	assert_int_equal(after.pooled, 64);
	coroutine_pool_cleanup();
	coroutine_pool_stats(&after);
	assert_int_equal(after.pooled, 0);
}

/* ---- the stack survives switches ---------------------------------------------- */

struct stackcheck {
	int rounds;
	int bad;
	uint64_t sum_seen;
};

static uint64_t fill(unsigned char *buf, size_t n, unsigned seed)
{
	uint64_t sum = 0;
	size_t i;

	for (i = 0; i < n; i++) {
		buf[i] = (unsigned char)(i * 31 + seed);
		sum += buf[i];
	}
	return sum;
}

static void stack_fn(void *opaque)
{
	struct stackcheck *s = opaque;
	unsigned char big[64 * 1024]; /* a quarter of the stack */
	volatile uint64_t local = 0x1234567890abcdefull;
	uint64_t want = fill(big, sizeof(big), 7);
	int r;

	for (r = 0; r < s->rounds; r++) {
		uint64_t sum = 0;
		size_t i;

		coroutine_yield();
		for (i = 0; i < sizeof(big); i++)
			sum += big[i];
		s->bad += sum != want || local != 0x1234567890abcdefull;
		s->sum_seen = sum;
	}
}

/* Scribble on the thread's stack between switches. */
static __attribute__((noinline)) uint64_t scribble(unsigned seed)
{
	unsigned char buf[96 * 1024];

	return fill(buf, sizeof(buf), seed) + buf[seed % sizeof(buf)];
}

static void test_stack_survives(void **state)
{
	struct stackcheck s = {.rounds = 50};
	struct coroutine *a, *b;
	volatile uint64_t sink = 0;
	int i;

	(void)state;
	a = coroutine_create(stack_fn, &s);
	b = coroutine_create(stack_fn, &s); /* a second stack next to it */
	assert_non_null(a);
	assert_non_null(b);
	for (i = 0; i <= s.rounds; i++) {
		coroutine_enter(a);
		sink += scribble((unsigned)i);
		coroutine_enter(b);
	}
	assert_int_equal(s.bad, 0);
	assert_true(s.sum_seen != 0);
	(void)sink;
}

/* ---- many switches ------------------------------------------------------------ */

static void spin_fn(void *opaque)
{
	long *n = opaque;

	for (;;) {
		(*n)++;
		coroutine_yield();
	}
}

static void test_10k_switches(void **state)
{
	struct coroutine_stats before, after;
	struct coroutine *co;
	long n = 0;
	int i;

	(void)state;
	co = coroutine_create(spin_fn, &n);
	assert_non_null(co);
	coroutine_pool_stats(&before);
	for (i = 0; i < 10000; i++)
		coroutine_enter(co);
	coroutine_pool_stats(&after);
	assert_int_equal(n, 10000);
	assert_int_equal(after.switches - before.switches, 20000);
	/* co never finishes; it stays allocated (a test-only leak of one stack). */
}

/* ---- per-thread pools ---------------------------------------------------------- */

struct thread_result {
	int runs;
	struct coroutine_stats st;
};

static void *thread_fn(void *arg)
{
	struct thread_result *r = arg;
	int i;

	for (i = 0; i < 100; i++)
		coroutine_enter(coroutine_create(count_fn, &r->runs));
	coroutine_pool_stats(&r->st);
	coroutine_pool_cleanup();
	return NULL;
}

static void test_threads_have_own_pool(void **state)
{
	struct thread_result r[2] = {{0}};
	struct coroutine_stats mine_before, mine_after;
	pthread_t tid[2];
	int i;

	(void)state;
	coroutine_pool_stats(&mine_before);
	for (i = 0; i < 2; i++)
		assert_int_equal(pthread_create(&tid[i], NULL, thread_fn, &r[i]), 0);
	for (i = 0; i < 2; i++) {
		pthread_join(tid[i], NULL);
		assert_int_equal(r[i].runs, 100);
		assert_int_equal(r[i].st.created, 1);
		assert_int_equal(r[i].st.reused, 99);
	}
	coroutine_pool_stats(&mine_after);
	assert_memory_equal(&mine_before, &mine_after, sizeof(mine_before));
}

/* ---- entering a running coroutine is a bug we catch ------------------------------ */

static struct coroutine *self_enter_co;

static void self_enter_fn(void *opaque)
{
	(void)opaque;
	coroutine_enter(self_enter_co);
}

static void test_enter_running_asserts(void **state)
{
#ifdef NDEBUG
	skip();
#endif
	int status;
	pid_t pid;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		/* Keep the expected abort quiet. */
		if (!freopen("/dev/null", "w", stderr))
			_exit(2);
		self_enter_co = coroutine_create(self_enter_fn, NULL);
		coroutine_enter(self_enter_co);
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status));
	assert_int_equal(WTERMSIG(status), SIGABRT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_yield_enter_pingpong),
		cmocka_unit_test(test_nested_enter),
		cmocka_unit_test(test_pool_reuse),
		cmocka_unit_test(test_pool_cap),
		cmocka_unit_test(test_stack_survives),
		cmocka_unit_test(test_10k_switches),
		cmocka_unit_test(test_threads_have_own_pool),
		cmocka_unit_test(test_enter_running_asserts),
	};
	int ret = cmocka_run_group_tests(tests, NULL, NULL);

	coroutine_pool_cleanup();
	return ret;
}
