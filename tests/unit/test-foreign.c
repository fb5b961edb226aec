/* Unit tests of completions from foreign threads (loop/foreign.h): a burst
 * of completions posted by threads the loop does not know all arrive, on the
 * loop's thread, with far fewer eventfd writes than completions, polled or
 * not, and nothing left expected. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "loop/foreign.h"

#define NTHREADS 4
#define PER_THREAD 2000

struct item {
	struct loop_msg m;
	struct loop_foreign *f;
	pthread_t poster;
};

static pthread_t loop_thread;
static unsigned received;
static bool wrong_thread;

static void item_cb(struct loop_msg *m)
{
	struct item *it = (struct item *)m;

	if (!pthread_equal(pthread_self(), loop_thread))
		wrong_thread = true;
	loop_foreign_done(it->f);
	received++;
}

struct poster {
	struct loop *loop;
	struct item *items;
	unsigned n;
};

/* A foreign thread: posts its items in bursts, pausing now and then so that
 * the loop falls asleep and needs waking. */
static void *poster_main(void *p)
{
	struct poster *a = p;

	for (unsigned i = 0; i < a->n; i++) {
		loop_foreign_post(a->loop, &a->items[i].m);
		if (i % 100 == 99)
			usleep(200);
	}
	return NULL;
}

static void run_burst(bool polled)
{
	struct item *items = calloc(NTHREADS * PER_THREAD, sizeof(*items));
	struct poster args[NTHREADS];
	pthread_t th[NTHREADS];
	struct loop_stats before, after;
	struct loop_foreign f;
	struct loop *loop;
	unsigned i, rounds = 0;

	assert_non_null(items);
	assert_int_equal(loop_new(NULL, &loop), 0);
	loop_bind_current(loop);
	loop_thread = pthread_self();
	received = 0;
	wrong_thread = false;
	loop_foreign_init(&f, loop, polled);
	for (i = 0; i < NTHREADS * PER_THREAD; i++) {
		items[i].m.cb = item_cb;
		items[i].f = &f;
		loop_foreign_expect(&f);
	}
	loop_get_stats(loop, &before);
	for (i = 0; i < NTHREADS; i++) {
		args[i] = (struct poster){loop, items + i * PER_THREAD, PER_THREAD};
		assert_int_equal(pthread_create(&th[i], NULL, poster_main, &args[i]), 0);
	}
	while (received < NTHREADS * PER_THREAD && rounds++ < 10000000)
		loop_run_once(loop, true);
	for (i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	loop_get_stats(loop, &after);
	assert_int_equal(received, NTHREADS * PER_THREAD);
	assert_false(wrong_thread);
	assert_int_equal(f.expected, 0);
	/* Far fewer wake-ups than completions: one per sleep at most, never
	 * one per completion. */
	assert_true(after.wakeups_sent - before.wakeups_sent < NTHREADS * PER_THREAD / 4);
	loop_foreign_fini(&f);
	loop_bind_current(NULL);
	loop_free(loop);
	free(items);
}

static void test_burst_unpolled(void **state)
{
	(void)state;
	run_burst(false);
}

static void test_burst_polled(void **state)
{
	(void)state;
	run_burst(true);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_burst_unpolled),
		cmocka_unit_test(test_burst_polled),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
