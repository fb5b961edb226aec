/* iothreads: named threads, each running its own loop until stopped.
 * Threading: created and joined from the main thread. */
#ifndef IOPLANE_IOTHREAD_H
#define IOPLANE_IOTHREAD_H

#include <stdint.h>
#include <sys/types.h>

#include "loop/loop.h"

struct iothread;

int iothread_start(const char *name, const struct loop_opts *opts, struct iothread **out);
struct loop *iothread_loop(struct iothread *t);
const char *iothread_name(const struct iothread *t);
/* The thread's kernel thread id (QMP's query-iothreads "thread-id"). */
pid_t iothread_tid(const struct iothread *t);
/* CPU time the thread has used so far (user + system, ns; 0 if unknown):
 * its busy time, polling included. Any thread; costs the iothread nothing. */
uint64_t iothread_cpu_ns(const struct iothread *t);
/* Stop the loop (loop_stop), join the thread, free it. */
void iothread_join(struct iothread *t);

/* Run fn(arg) on the iothread and wait for it to finish (setup/teardown only). */
void iothread_run_sync(struct iothread *t, void (*fn)(void *), void *arg);

#endif
