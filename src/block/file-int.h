/* Internal interface of the `file` protocol driver (file.c) and its three
 * engines: io_uring (file-uring.c), linux-aio (file-aio.c), thread pool
 * (file-threads.c); file locking (file-lock.c). The helpers for image files
 * that others use are in file.h.
 *
 * Threading: struct file_state is written only by open/truncate/close on the
 * main thread while no request is in flight; requests only read it (except
 * the zero_range_ok/punch_ok hints, see below). Per-loop engine state lives in
 * bs->thread_state[loop_index()] and is owned by that loop's thread. */
#ifndef IOPLANE_FILE_INT_H
#define IOPLANE_FILE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "block/block-driver.h"
#include "block/file.h"

enum file_aio {
	FILE_AIO_URING = 0,
	FILE_AIO_NATIVE,
	FILE_AIO_THREADS,
};

struct file_state {
	int fd;
	bool is_blk; /* block device (else regular file) */
	bool direct; /* cache=none: O_DIRECT */
	enum file_aio aio;
	/* The node's aio-max-batch; 0: none given (file_max_batch). */
	unsigned max_batch;
	/* Cleared (by any worker, relaxed atomics) once FALLOC_FL_ZERO_RANGE
	 * reports EOPNOTSUPP, so later write-zeroes skip straight to the
	 * fallback. A stale read only costs one failed fallocate. */
	bool zero_range_ok;
	bool punch_ok; /* same, for FALLOC_FL_PUNCH_HOLE */
	/* Image locks (file-lock.c), main thread: use_lock from locking=;
	 * perm/shared as committed; lk_perm/lk_unshared: the bits whose bytes
	 * (100+bit, 200+bit) this fd locks now. */
	bool use_lock;
	uint32_t perm, shared, lk_perm, lk_unshared;
	const char *path; /* for messages; owned by the node (file.c) */
};

static inline struct file_state *file_state(struct blk_node *bs)
{
	return (struct file_state *)bs->opaque;
}

/* Requests per submit call at most on loop (0: a whole round): as QEMU, the
 * smaller of the node's and the iothread's aio-max-batch where given, else
 * the engine's default. */
unsigned file_max_batch(struct blk_node *bs, const struct loop *loop);

/* The request that owns a driver context living in req->drv. */
#define file_req_of(ctx) blk_req_from_drv(ctx)

/* Engine counters, per loop, owned by that loop's thread. They exist so that
 * tests and `bench` can check batching (one submit call per round). For
 * io_uring a "batch" is the SQEs prepared in one round, which the loop hands
 * to the kernel in the io_uring_enter that ends the round (more than one only
 * if the SQ fills up: the loop then submits early). */
struct file_engine_stats {
	uint64_t submit_calls; /* native: io_submit calls; io_uring: batches (rounds with SQEs) */
	uint64_t submitted;    /* iocbs accepted by io_submit / SQEs prepared */
	uint64_t last_batch;   /* size of the most recent batch */
	uint64_t max_batch;
	uint64_t resubmits;  /* continuations: short transfer, IOV_MAX chunk, -EAGAIN */
	uint64_t eagain;     /* -EAGAIN/-EINTR results (and io_submit -EAGAIN) */
	uint64_t queued_max; /* native: most requests waiting for room in the context */
	uint64_t in_flight;  /* requests currently owned by the engine */
};

/* Common head of every engine's per-loop state. */
struct file_thread {
	struct file_engine_stats stats;
	struct loop *loop;
	struct blk_node *bs;
};

/* Stats of this node's engine on `loop`; -ENOENT if the loop has not used the
 * node yet. Call on the loop's thread. */
int file_get_engine_stats(struct blk_node *bs, struct loop *loop, struct file_engine_stats *out);

/* Position inside a read/write request: the part already transferred is
 * tracked as (element index, offset in element) so that the submitter's
 * iovec array is never copied. */
struct file_rw {
	uint64_t pos;  /* file offset of the next byte */
	uint64_t left; /* bytes still to transfer */
	int idx;       /* current iovec element */
	int err;       /* -errno once file_rw_advance said FILE_RW_FAILED */
	size_t off;    /* bytes already done in iov[idx] */
};

void file_rw_init(struct file_rw *rw, const struct blk_request *req);

/* The next piece to transfer: `single` (buf, len) when the current element
 * is partly done after a short transfer, or when only one element is left;
 * otherwise up to IOV_MAX whole elements (iov, cnt). A single piece is
 * capped at what Linux moves in one call; the rest is a continuation. */
struct file_piece {
	const struct iovec *iov;
	int cnt;
	void *buf;
	size_t len;
	bool single; /* use buf/len (plain read/write) rather than iov/cnt */
};

void file_rw_piece(const struct file_rw *rw, const struct blk_request *req, struct file_piece *p);

/* What is left of a read or write after one transfer (file_rw_advance). */
enum file_rw_next {
	FILE_RW_DONE,   /* finished successfully */
	FILE_RW_AGAIN,  /* submit the rest: short transfer, next IOV_MAX chunk, -EAGAIN/-EINTR */
	FILE_RW_FAILED, /* finished with an error: rw->err */
};

/* Account for one completed transfer of `res` (bytes or -errno). A read
 * that returns 0 (end of file) zero-fills what is left and is done. */
enum file_rw_next file_rw_advance(struct file_rw *rw, struct blk_request *req, ssize_t res);

/* Thread-pool helpers shared by all engines (file.c): flush, discard,
 * write-zeroes and block-status run as blocking work on the pool. */
int file_submit_misc(struct blk_node *bs, struct blk_request *req);

/* Locks (file-lock.c). 0 if OFD locks work on fd, else -errno. */
int file_lock_probe(int fd);
/* Drop every image lock of s now. Closing the fd would too, but only once
 * the open file is released: io_uring may keep a reference to it for a
 * while after the last request completed (a DEFER_TASKRUN ring frees a
 * request an io-wq worker finished only when it is next entered). */
void file_unlock_all(struct file_state *s);
/* Take on fd (another open file of the same image) the lock bytes s->fd
 * holds, so that fd can replace it with no moment unlocked. 0 or -errno. */
int file_lock_copy(struct file_state *s, int fd);
/* The driver's set_perm. */
int file_set_perm(struct blk_node *bs, enum blk_perm_step step, uint32_t perm, uint32_t shared,
		  char *err, size_t errlen);

/* Engines. submit() gets READ and WRITE (file_submit answers empty ones);
 * io_uring's gets FLUSH too, which the others leave to file_submit_misc. */
int file_uring_check(char *err, size_t errlen); /* can this machine run it? */
int file_uring_submit(struct blk_node *bs, struct blk_request *req);
void file_uring_detach(struct blk_node *bs, struct file_thread *t);

#define FILE_AIO_DEPTH 128 /* native: requests in the kernel per loop and node */
/* Default aio-max-batch of the native engine. On a virtio disk, 4 KiB random
 * reads at depth 64 gave 5-6% more IOPS with io_submit calls of 4 than of 16
 * (median of 12 alternating pairs, 11 won): requests reach the device while
 * the rest of the batch is still being prepared. 2 and 8 were both slower
 * than 4. The io_uring engine keeps a whole round per io_uring_enter by
 * default: there the gain was 2% and it costs a system call per 4 requests
 * on every path, page-cache reads included. */
#define FILE_AIO_MAX_BATCH_NATIVE 4
int file_aio_check(char *err, size_t errlen);
int file_aio_submit(struct blk_node *bs, struct blk_request *req);
void file_aio_detach(struct blk_node *bs, struct file_thread *t);

int file_threads_submit(struct blk_node *bs, struct blk_request *req);

#endif
