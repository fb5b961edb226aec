/* Unit tests of loop timers: ordering, cancel, re-arm, many timers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "loop/loop.h"

struct tt {
	struct loop_timer t;
	int id;
	int *order;
	int *n;
	struct loop *loop;
	int rearm;
};

static void tt_cb(struct loop_timer *t)
{
	struct tt *x = (struct tt *)t;

	x->order[(*x->n)++] = x->id;
	if (x->rearm) {
		x->rearm--;
		loop_timer_arm(x->loop, &x->t, loop_now_ns() + 1000);
	}
}

static struct loop *new_loop(void)
{
	struct loop *loop;

	assert_int_equal(loop_new(NULL, &loop), 0);
	loop_bind_current(loop);
	return loop;
}

static void run_until(struct loop *loop, int *n, int want)
{
	uint64_t end = loop_now_ns() + 10ull * 1000000000;

	while (*n < want && loop_now_ns() < end)
		loop_run_once(loop, true);
}

static void test_order(void **state)
{
	struct loop *loop = new_loop();
	int order[8], n = 0, i;
	struct tt t[5];
	uint64_t base = loop_now_ns();
	static const int delay_us[5] = {500, 100, 300, 200, 400};

	(void)state;
	for (i = 0; i < 5; i++) {
		t[i] = (struct tt){.t.cb = tt_cb, .id = i, .order = order, .n = &n, .loop = loop};
		loop_timer_arm(loop, &t[i].t, base + delay_us[i] * 1000ull);
	}
	run_until(loop, &n, 5);
	assert_int_equal(n, 5);
	assert_int_equal(order[0], 1);
	assert_int_equal(order[1], 3);
	assert_int_equal(order[2], 2);
	assert_int_equal(order[3], 4);
	assert_int_equal(order[4], 0);
	for (i = 0; i < 5; i++)
		assert_false(loop_timer_armed(&t[i].t));
	loop_free(loop);
}

static void test_cancel_and_rearm(void **state)
{
	struct loop *loop = new_loop();
	int order[8], n = 0;
	struct tt a = {.t.cb = tt_cb, .id = 1}, b = {.t.cb = tt_cb, .id = 2};
	uint64_t now = loop_now_ns();

	(void)state;
	a.order = b.order = order;
	a.n = b.n = &n;
	a.loop = b.loop = loop;
	loop_timer_arm(loop, &a.t, now + 200000);
	loop_timer_arm(loop, &b.t, now + 400000);
	loop_timer_cancel(loop, &a.t);
	loop_timer_cancel(loop, &a.t); /* twice is harmless */
	assert_false(loop_timer_armed(&a.t));
	/* Moving an armed timer earlier. */
	loop_timer_arm(loop, &b.t, now + 100000);
	b.rearm = 2;
	run_until(loop, &n, 3);
	assert_int_equal(n, 3);
	assert_int_equal(order[0], 2);
	assert_int_equal(order[1], 2);
	assert_int_equal(order[2], 2);
	loop_free(loop);
}

/* Many timers in random order fire in deadline order; cancelling half of
 * them at random keeps the heap consistent. */
static void test_many_random(void **state)
{
	enum { N = 2000 };
	struct loop *loop = new_loop();
	static struct tt t[N];
	static int order[N];
	int n = 0, i, fired_expected = 0;
	uint64_t base = loop_now_ns() + 1000000;

	(void)state;
	srand(42);
	for (i = 0; i < N; i++) {
		t[i] = (struct tt){.t.cb = tt_cb, .id = i, .order = order, .n = &n, .loop = loop};
		loop_timer_arm(loop, &t[i].t, base + (uint64_t)(rand() % 5000) * 1000);
	}
	for (i = 0; i < N; i += 2 + rand() % 2)
		loop_timer_cancel(loop, &t[i].t);
	for (i = 0; i < N; i++)
		fired_expected += loop_timer_armed(&t[i].t);
	run_until(loop, &n, fired_expected);
	assert_int_equal(n, fired_expected);
	for (i = 1; i < n; i++)
		assert_true(t[order[i - 1]].t.deadline_ns <= t[order[i]].t.deadline_ns);
	loop_free(loop);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_order),
		cmocka_unit_test(test_cancel_and_rearm),
		cmocka_unit_test(test_many_random),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
