/* Copy state of a node being copied to a target (copy-before-write, backup,
 * mirror): which granules still have to be copied (`todo`), which ranges
 * are being worked on (in flight: a copy, or a guest write that goes to
 * both nodes), and who waits for one of them. A range is claimed before it
 * is worked on, so two copies of a granule are never in flight at once and
 * a target write never overtakes another one of the same granule.
 *
 * Threading: any thread; every field of struct bcopy is protected by its
 * lock. Wake callbacks run outside the lock, on the thread that ended the
 * range waited for. */
#ifndef IOPLANE_BLOCK_COPY_H
#define IOPLANE_BLOCK_COPY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "block/block.h"

struct blk_dirty_bitmap;

/* A range in flight: lives in its user's operation. */
struct bcopy_range {
	struct bcopy_range *next;
	uint64_t lo, hi;   /* granule-aligned, hi clamped to the size */
	uint64_t off, len; /* a write's own range (write: true) */
	bool write;        /* a guest write to source and target, not a copy */
};

/* One that waits for the ranges in flight over [lo, hi) to end. */
struct bcopy_waiter {
	struct bcopy_waiter *next;
	uint64_t lo, hi;
	void (*wake)(struct bcopy_waiter *w); /* once, then it is off the list */
};

struct bcopy {
	pthread_mutex_t lock;
	struct blk_dirty_bitmap *todo; /* bit set: the granule must be copied */
	uint64_t size;
	uint32_t gran;
	struct bcopy_range *inflight;
	struct bcopy_waiter *waiters;
	/* copy-before-write with on-cbw-error=break-snapshot after a failed
	 * copy: nothing is copied any more, guest writes go on. */
	bool broken;
	int error; /* the first failed copy's -errno (0: none) */
	/* Where ops read and write (set by the user, not changed while an op
	 * runs). */
	struct blk_node *source, *target;
};

/* size bytes in granules of gran (a power of two >= 512); all: every
 * granule to copy, else none. 0 or -ENOMEM. */
int bcopy_init(struct bcopy *s, uint64_t size, uint32_t gran, bool all);
void bcopy_destroy(struct bcopy *s);
/* Bytes still to copy (whole granules), and whether anything is in flight. */
uint64_t bcopy_remaining(struct bcopy *s);
bool bcopy_busy(struct bcopy *s);
/* Mark [off, off+len) to copy (again): a mirror's guest write once it is
 * done, a bitmap's ranges at start. */
void bcopy_mark(struct bcopy *s, uint64_t off, uint64_t len);
/* Take [off, off+len) off the copy list without copying it (sync=top:
 * what the top does not hold). */
void bcopy_skip(struct bcopy *s, uint64_t off, uint64_t len);

/* Background copy: claim the first run of granules to copy at or after
 * `from`, at most max bytes, that no range in flight overlaps: true and r
 * in flight; false when there is none (look again from 0, or later). */
bool bcopy_claim_next(struct bcopy *s, uint64_t from, uint64_t max, struct bcopy_range *r);
/* A guest write to [off, off+len) must first have the old data copied
 * (copy-before-write): 1 and r claimed (at most max bytes of it: copy it,
 * end it, ask again); 0 when nothing in the range is left to copy and
 * nothing is in flight over it (the write may go); -EAGAIN when a range in
 * flight overlaps: w is queued and woken once one ends (ask again). */
int bcopy_claim_in(struct bcopy *s, uint64_t off, uint64_t len, uint64_t max, struct bcopy_range *r,
		   struct bcopy_waiter *w);
/* A mirror's write-blocking guest write: 0 and r in flight over the
 * write's granules (background copies keep off them), or -EAGAIN and w
 * queued, as above. */
int bcopy_write_begin(struct bcopy *s, uint64_t off, uint64_t len, struct bcopy_range *r,
		      struct bcopy_waiter *w);
/* r is done with result ret. A failed copy's granules are to copy again
 * (unless broken); a write that reached both nodes clears the granules it
 * covers wholly. Wakes the waiters r overlaps. */
void bcopy_end(struct bcopy *s, struct bcopy_range *r, int ret);
/* Wake every waiter (the copy is being torn down, or broken). */
void bcopy_wake_all(struct bcopy *s);

/* ---- the copy of one claimed range: read source, write target ---- */

struct bcopy_op {
	struct bcopy *s;
	struct bcopy_range r; /* claimed by the owner before bcopy_op_start */
	struct blk_request req;
	struct iovec iov;
	void *buf;        /* owner's, at least r.hi - r.lo bytes, aligned (blk_alloc_buf) */
	bool zero;        /* set by the op: the data read were zeroes (written as such) */
	bool read_failed; /* set by the op: the failure was the source's */
	void (*cb)(struct bcopy_op *op, int ret); /* after bcopy_end */
	void *opaque;
};

/* Start the copy on the current loop (requests go as a driver's children
 * do: a drain does not hold them, it waits for them). 0, or -errno (the
 * range ended with that error, cb not called). */
int bcopy_op_start(struct bcopy_op *op);

#endif
