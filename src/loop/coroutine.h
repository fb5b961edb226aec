/* Coroutines: stackful, cooperative, one thread. For code that must wait in the
 * middle of its work (qcow2 metadata I/O). Switching is a register swap with no
 * system call; finished coroutines go back to a per-thread free list so that
 * creating one on the hot path costs no system call or allocation.
 *
 * Threading: a coroutine runs on the thread that created it and is resumed
 * only there (enter it from another thread through a loop message). */
#ifndef IOPLANE_COROUTINE_H
#define IOPLANE_COROUTINE_H

#include <stdbool.h>
#include <stdint.h>

struct coroutine;
typedef void coroutine_fn(void *opaque);

/* Returns NULL on allocation failure. The coroutine does not run until entered. */
struct coroutine *coroutine_create(coroutine_fn *fn, void *opaque);
/* Switch into co until it yields or finishes (a finished one is recycled). */
void coroutine_enter(struct coroutine *co);
/* From inside a coroutine: switch back to whoever entered it. */
void coroutine_yield(void);
struct coroutine *coroutine_self(void); /* NULL outside a coroutine */
bool coroutine_in(void);
/* Drop this thread's free list (thread exit). */
void coroutine_pool_cleanup(void);

/* This thread's counters, for tests and debugging. */
struct coroutine_stats {
	uint64_t created;  /* coroutines made with a fresh stack (mmap + makecontext) */
	uint64_t reused;   /* taken from the free list */
	uint64_t switches; /* context switches (enter, yield, finish) */
	unsigned pooled;   /* on the free list now */
};
void coroutine_pool_stats(struct coroutine_stats *out);

#endif
