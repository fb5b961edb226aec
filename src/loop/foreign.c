/* Completions from foreign threads (foreign.h): the loop's message list for
 * delivery, a poll handler while some are expected.
 *
 * Threading: init/expect/done/fini on the loop's thread; post from any. */
#include <sched.h>
#include <stdbool.h>

#include "loop/foreign.h"
#include "util/clock.h"

/* The loop's polling looks at its message list after every poll handler:
 * this one only lends the CPU to the thread that will post (on a small
 * machine the scheduler tends to put it next to its waker, as with the
 * thread pool's workers). */
static bool loop_foreign_poll(struct loop_poll *p)
{
	(void)p;
	sched_yield();
	return false;
}

void loop_foreign_init(struct loop_foreign *f, struct loop *loop, bool polled)
{
	f->loop = loop;
	f->polled = polled;
	f->poll.poll = loop_foreign_poll;
	f->poll.sleep = NULL;
	f->expected = 0;
}

void loop_foreign_expect(struct loop_foreign *f)
{
	if (f->expected++ == 0 && f->polled)
		loop_poll_add(f->loop, &f->poll);
}

void loop_foreign_done(struct loop_foreign *f)
{
	if (--f->expected == 0 && f->polled)
		loop_poll_del(f->loop, &f->poll);
}

void loop_foreign_post(struct loop *loop, struct loop_msg *m)
{
	loop_hint_event(loop, clock_mono_ns());
	loop_send(loop, m);
}

void loop_foreign_fini(struct loop_foreign *f)
{
	if (f->expected && f->polled)
		loop_poll_del(f->loop, &f->poll);
	f->expected = 0;
}
