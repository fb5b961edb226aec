/* Thread pool for blocking work (file I/O with the `threads` engine, fsync,
 * fallocate, SEEK_DATA). One pool per process; workers are created on demand up
 * to a maximum. A finished job is handed back to the loop that submitted it:
 * pushed on that loop's lock-free completion list, reaped by a poll handler
 * while the loop polls, or after a kick message (loop_send, which writes the
 * loop's eventfd only when the loop may be sleeping).
 *
 * Threading: tp_submit() is called from a loop thread; fn runs on a worker;
 * done runs on the submitting loop's thread. */
#ifndef IOPLANE_THREAD_POOL_H
#define IOPLANE_THREAD_POOL_H

#include <stdint.h>

struct loop;

struct tp_work {
	int (*fn)(struct tp_work *w);             /* worker thread; returns 0/-errno */
	void (*done)(struct tp_work *w, int ret); /* submitting loop's thread */
	/* private */
	struct tp_work *next;
	struct loop *loop;
	struct tp_loop *tpl; /* the submitting loop's pool state */
	int ret;
};

/* Submit work. Never calls done() from inside tp_submit(). */
void tp_submit(struct loop *loop, struct tp_work *w);

/* Pool-wide settings; call before the first submission. */
void tp_set_max_workers(unsigned n); /* default 64 */
void tp_set_spin_ns(uint64_t ns);    /* idle workers spin this long before sleeping */

/* Called by loop_free(): waits for the loop's jobs in flight (running their
 * done() callbacks) and frees its pool state, which the first tp_submit() on
 * that loop set up. */
void tp_loop_cleanup(struct loop *loop);

struct tp_stats {
	uint64_t submitted, completed;
	uint64_t worker_wakeups; /* condvar signals to sleeping workers */
	uint64_t loop_wakeups;   /* kicks sent to loops (loop_send); a kick writes
				  * the loop's eventfd only if the loop may be
				  * sleeping: loop_stats.wakeups_sent counts those */
	uint64_t reaped_polling; /* completions reaped by the loop's poll handler */
	unsigned workers;
};
void tp_get_stats(struct tp_stats *out);

#endif
