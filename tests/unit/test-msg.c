/* Unit tests of cross-thread messages: FIFO per sender, no lost wake-up under a
 * multi-thread stress, and no eventfd write when the target is running or the
 * sender is the target's own thread. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmocka.h>

#include "loop/loop.h"

struct msg {
	struct loop_msg m;
	int sender;
	int seq;
};

struct target {
	struct loop *loop;
	atomic_int received;
	int last_seq[8];
	bool order_ok;
};

static struct target *cur;

static void msg_cb(struct loop_msg *m)
{
	struct msg *x = (struct msg *)m;

	if (x->seq != cur->last_seq[x->sender] + 1)
		cur->order_ok = false;
	cur->last_seq[x->sender] = x->seq;
	atomic_fetch_add(&cur->received, 1);
	free(x);
}

struct sender_arg {
	struct loop *target;
	int id, count, burst_pause_every;
};

static void *sender_main(void *p)
{
	struct sender_arg *a = p;
	int i;

	for (i = 1; i <= a->count; i++) {
		struct msg *x = malloc(sizeof(*x));

		x->m.cb = msg_cb;
		x->sender = a->id;
		x->seq = i;
		loop_send(a->target, &x->m);
		/* Pauses let the target fall asleep so that wake-ups are needed. */
		if (a->burst_pause_every && i % a->burst_pause_every == 0)
			usleep(50);
	}
	return NULL;
}

static void *target_main(void *p)
{
	struct target *t = p;
	int i;

	loop_bind_current(t->loop);
	for (i = 0; i < 8; i++)
		t->last_seq[i] = 0;
	while (!loop_stopping(t->loop))
		loop_run_once(t->loop, true);
	return NULL;
}

/* 4 senders x 50k messages to a loop that sleeps whenever its queue is empty. */
static void test_stress_no_lost_wakeup(void **state)
{
	enum { SENDERS = 4, COUNT = 50000 };
	struct loop_opts o = {.poll_max_ns = 0};
	struct target t = {.order_ok = true};
	struct sender_arg a[SENDERS];
	pthread_t th, s[SENDERS];
	struct loop_stats st;
	uint64_t deadline;
	int i;

	(void)state;
	assert_int_equal(loop_new(&o, &t.loop), 0);
	cur = &t;
	assert_int_equal(pthread_create(&th, NULL, target_main, &t), 0);
	for (i = 0; i < SENDERS; i++) {
		a[i] = (struct sender_arg){.target = t.loop, .id = i, .count = COUNT,
					   .burst_pause_every = 1000};
		assert_int_equal(pthread_create(&s[i], NULL, sender_main, &a[i]), 0);
	}
	for (i = 0; i < SENDERS; i++)
		pthread_join(s[i], NULL);
	/* Every message arrives without anybody else poking the loop. */
	deadline = loop_now_ns() + 20ull * 1000000000;
	while (atomic_load(&t.received) < SENDERS * COUNT && loop_now_ns() < deadline)
		usleep(1000);
	assert_int_equal(atomic_load(&t.received), SENDERS * COUNT);
	assert_true(t.order_ok);
	loop_stop(t.loop);
	pthread_join(th, NULL);
	loop_get_stats(t.loop, &st);
	/* Wake-ups only for a sleeping loop: at most one eventfd write per sleep
	 * (plus the one for loop_stop), far fewer than messages. */
	assert_true(st.wakeups_sent <= st.sleeps + 1);
	assert_true(st.wakeups_sent < (uint64_t)SENDERS * COUNT / 10);
	assert_int_equal(st.msgs, (uint64_t)SENDERS * COUNT);
	loop_free(t.loop);
}

/* A target that never sleeps (always has deferred work) gets no eventfd write. */
struct busy {
	struct loop_defer d;
	struct loop *loop;
};

static void busy_cb(struct loop_defer *d)
{
	struct busy *b = (struct busy *)d;

	/* Keep the loop busy until every message has arrived. */
	if (atomic_load(&cur->received) < 100000)
		loop_defer(b->loop, &b->d);
}

static void *busy_main(void *p)
{
	struct busy *b = p;

	loop_bind_current(b->loop);
	loop_defer(b->loop, &b->d);
	while (atomic_load(&cur->received) < 100000)
		loop_run_once(b->loop, true);
	return NULL;
}

static void test_running_target_not_woken(void **state)
{
	struct loop_opts o = {.poll_max_ns = 0};
	struct target t = {.order_ok = true};
	struct busy b = {.d.cb = busy_cb};
	struct sender_arg a;
	pthread_t th, s;
	struct loop_stats st;

	(void)state;
	assert_int_equal(loop_new(&o, &t.loop), 0);
	cur = &t;
	b.loop = t.loop;
	assert_int_equal(pthread_create(&th, NULL, busy_main, &b), 0);
	a = (struct sender_arg){.target = t.loop, .id = 0, .count = 100000};
	assert_int_equal(pthread_create(&s, NULL, sender_main, &a), 0);
	pthread_join(s, NULL);
	pthread_join(th, NULL);
	loop_get_stats(t.loop, &st);
	assert_int_equal(atomic_load(&t.received), 100000);
	assert_true(t.order_ok);
	assert_int_equal(st.sleeps, 0);
	assert_int_equal(st.wakeups_sent, 0);
	loop_free(t.loop);
}

/* Messages sent by a loop to itself never write the eventfd. */
static void test_self_send_no_wakeup(void **state)
{
	struct target t = {.order_ok = true};
	struct loop_stats st;
	int i;

	(void)state;
	assert_int_equal(loop_new(NULL, &t.loop), 0);
	loop_bind_current(t.loop);
	cur = &t;
	for (i = 1; i <= 1000; i++) {
		struct msg *x = malloc(sizeof(*x));

		x->m.cb = msg_cb;
		x->sender = 0;
		x->seq = i;
		loop_send(t.loop, &x->m);
	}
	loop_run_once(t.loop, true);
	loop_get_stats(t.loop, &st);
	assert_int_equal(atomic_load(&t.received), 1000);
	assert_int_equal(st.wakeups_sent, 0);
	loop_free(t.loop);
}

/* loop_stop from another thread wakes a sleeping loop. */
static void test_stop_wakes(void **state)
{
	struct target t = {.order_ok = true};
	pthread_t th;

	(void)state;
	assert_int_equal(loop_new(NULL, &t.loop), 0);
	cur = &t;
	assert_int_equal(pthread_create(&th, NULL, target_main, &t), 0);
	usleep(20000);
	loop_stop(t.loop);
	pthread_join(th, NULL);
	assert_true(loop_stopping(t.loop));
	loop_free(t.loop);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_stress_no_lost_wakeup),
		cmocka_unit_test(test_running_target_not_woken),
		cmocka_unit_test(test_self_send_no_wakeup),
		cmocka_unit_test(test_stop_wakes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
