/* Completions that arrive on threads ioplane does not run (a library's own
 * threads: librbd's). They come back to the submitting loop the way the
 * thread pool's do: pushed on the loop's one lock-free message list
 * (loop_send, which writes the loop's eventfd only when the loop may be
 * sleeping and nobody has woken it since: at most one wake-up per sleep,
 * none while it runs or polls), stamped for adaptive polling, and, when the
 * source asks for it, the loop busy-polls for them while any is expected
 * instead of sleeping at once. A source whose completions take a network
 * round trip (librbd: hundreds of microseconds) does not ask: spinning for
 * them only takes the CPU from the library's threads that produce them
 * (bench/compare-remote.sh row 1 ran 20% slower with polling on two CPUs).
 *
 * Threading: struct loop_foreign belongs to its loop's thread;
 * loop_foreign_post() is called from any thread. */
#ifndef IOPLANE_LOOP_FOREIGN_H
#define IOPLANE_LOOP_FOREIGN_H

#include "loop/loop.h"

struct loop_foreign {
	struct loop *loop;
	struct loop_poll poll;
	unsigned expected; /* posts still to come; loop thread only */
	bool polled;       /* poll while any is expected */
};

void loop_foreign_init(struct loop_foreign *f, struct loop *loop, bool polled);
/* Loop thread: one more completion will be posted (after the foreign call
 * that will post it was accepted). */
void loop_foreign_expect(struct loop_foreign *f);
/* Loop thread, from the posted message's callback: it came. */
void loop_foreign_done(struct loop_foreign *f);
/* Any thread: hand m to loop (its callback runs there). */
void loop_foreign_post(struct loop *loop, struct loop_msg *m);
/* Loop thread, nothing expected any more: stop polling. */
void loop_foreign_fini(struct loop_foreign *f);

#endif
