/* The copies a mirror or backup job has in flight (copy-pool.c): up to
 * max_ops ranges claimed from a copy state (block-copy.h), each copied from
 * its source to its target by an op with its own buffer, at the job's
 * speed; failures are kept for the job's error policy.
 * THREADING RULE: the job loop (run()'s coroutine and the completions);
 * init and free on the main thread while nothing is in flight. */
#ifndef IOPLANE_JOB_COPY_POOL_H
#define IOPLANE_JOB_COPY_POOL_H

#include <stdbool.h>
#include <stdint.h>

#include "block/block-copy.h"
#include "block/job.h"

#define COPY_POOL_MAX 16

struct copy_pool;

struct copy_pool_op {
	struct bcopy_op op;
	struct copy_pool *p;
	bool busy;     /* in flight */
	int err;       /* a failure the job has not looked at yet */
	bool err_read; /* ... of the source */
};

struct copy_pool {
	struct job *job;
	struct bcopy *bc;
	uint32_t chunk; /* bytes per copy, at most */
	unsigned max_ops, nbusy;
	bool waiting;  /* run() yielded for a completion */
	bool progress; /* each copy done adds to the job's progress */
	enum job_error_policy on_source_error, on_target_error;
	struct copy_pool_op ops[COPY_POOL_MAX];
};

/* ops (1..COPY_POOL_MAX) buffers of chunk bytes, aligned for target.
 * 0 or -ENOMEM (copy_pool_free then). */
int copy_pool_init(struct copy_pool *p, struct job *job, struct bcopy *bc, struct blk_node *target,
		   unsigned ops, uint32_t chunk);
void copy_pool_free(struct copy_pool *p);
/* Start copies from *cursor on (then from 0) until every op is busy or
 * nothing is claimable; *cursor moves past what was claimed. */
void copy_pool_fill(struct copy_pool *p, uint64_t *cursor);
/* Yield until an op finishes (nbusy > 0). */
void copy_pool_wait(struct copy_pool *p);
/* The tail of a copying job's round: start copies from *cursor unless a node
 * is quiesced, then yield until one finishes, or sleep retry_ns when none is
 * in flight. */
void copy_pool_step(struct copy_pool *p, uint64_t *cursor, bool quiesced, uint64_t retry_ns);
/* Bytes of the copies in flight (claimed: no longer in bcopy_remaining). */
uint64_t copy_pool_busy_bytes(const struct copy_pool *p);
/* Failed copies through the error policy: 0 (their ranges are to copy
 * again, or stopped and resumed), or the error to end the job with. A
 * stop first waits for every copy in flight: the job pauses with none, and
 * those that fail meanwhile are covered by the same stop. */
int copy_pool_errors(struct copy_pool *p);
/* Flush bc->target, waiting: 0 or -errno. Nothing else in flight. */
int copy_pool_flush(struct copy_pool *p);

#endif
