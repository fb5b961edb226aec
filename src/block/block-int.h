/* Block core internals shared by block.c, align.c, stats.c, open.c and
 * perm.c; not for drivers. Threading: as block.h; a request's core state
 * (req->core) is touched only by the thread of req->loop, the overlap list
 * only under its mutex (struct blk_track). */
#ifndef IOPLANE_BLOCK_INT_H
#define IOPLANE_BLOCK_INT_H

#include <pthread.h>

#include "block/block-driver.h"
#include "util/clock.h"
#include "util/compiler.h"

/* req->core.flags bits. All zero for a request on the fast path. */
#define BLK_CORE_INTERNAL (1u << 0) /* core child request: completion goes straight to cb */
#define BLK_CORE_TRACKED (1u << 1)  /* on the node's overlap list */
#define BLK_CORE_SHIFTED (1u << 2)  /* offset moved by blk_forward_shift() */
#define BLK_CORE_FUA_EMUL (1u << 3) /* flush once the write is done */
#define BLK_CORE_OP_SAVED (1u << 4) /* op replaced (by that flush): restore saved_op */
#define BLK_CORE_WZ_RETRY (1u << 5) /* write-zeroes: write zero buffers on -ENOTSUP */

/* Overlap list of a node with align > 1, in arrival order. */
struct blk_track {
	pthread_mutex_t lock;
	struct blk_request *head, *tail; /* protected by lock */
	uint64_t waits;                  /* protected by lock: times a request had to wait */
	/* Protected by lock: serialising requests on the list, and requests
	 * waiting for an earlier one. While both are zero, a plain write can
	 * neither conflict nor have anyone to wake: no list walk. */
	unsigned nserial, nwaiting;
};

/* block.c */
/* Execute a checked request: alignment path when the node needs it, else the
 * driver. Same contract as the driver's submit. */
int blk_exec(struct blk_node *bs, struct blk_request *req);
/* A request executed by blk_exec() is finished (completion context). */
void blk_exec_done(struct blk_request *req, int ret);
/* Make c an internal child of p (fields other than op/flags/range/iov/cb). */
void blk_child_init(struct blk_request *c, struct blk_request *p);

/* open.c: blk_detach_loop() for bs alone. */
void blk_detach_node(struct blk_node *bs, struct loop *loop);
/* open.c: the driver's close(), then free bs (its children lose a parent). */
void blk_node_destroy(struct blk_node *bs);

/* graph.c: a new node joins the registry with a generated node-name and
 * one reference (its opener's); a freed one leaves it. */
int blk_graph_register(struct blk_node *bs);
void blk_graph_unregister(struct blk_node *bs);
/* The control loop of blk_ctl_enter() (NULL: none made yet). */
struct loop *blk_ctl_loop(void);
/* Inside blk_ctl_enter(): the loop of this same thread it left (the main
 * loop, blocked in the callback that entered: it cannot answer a message
 * now); otherwise NULL. */
struct loop *blk_ctl_outer(void);

/* drain.c: blk_submit() found the node drained: hold the request until
 * the drain ends (0), or submit it if the drain ended meanwhile. */
int blk_drain_hold(struct blk_node *bs, struct blk_request *req);
/* drain.c: requests of any thread held for from (by a drain) resume on to
 * (blk_replace_node, with every user moved to `to` already). Main thread;
 * waits for every thread that ever submitted to from. */
void blk_drain_retarget(struct blk_node *from, struct blk_node *to);

/* perm.c: recompute and apply the permissions of the stack below root bs
 * from its users' (after a child was added or opened). Same results as
 * blk_set_perm. */
int blk_perm_refresh(struct blk_node *bs, char *err, size_t errlen);

/* align.c */
static inline bool blk_needs_align(const struct blk_node *bs)
{
	return (bs->align | bs->mem_align) > 1;
}
int blk_align_submit(struct blk_node *bs, struct blk_request *req);
void blk_untrack(struct blk_request *req);
int blk_track_init(struct blk_node *bs);
void blk_track_free(struct blk_node *bs);
uint64_t blk_track_waits(struct blk_node *bs); /* for tests */

/* stats.c */
void blk_stats_free(struct blk_node *bs);

static inline unsigned blk_hist_bucket(uint64_t ns)
{
	unsigned b = 63 - (unsigned)__builtin_clzll(ns | 1);

	return b < BLK_HIST_BUCKETS ? b : BLK_HIST_BUCKETS - 1;
}

/* clock_ns_per_tick in 32.32 fixed point (set with the built-in drivers), so
 * that the per-request conversion is one multiplication. */
extern uint64_t blk_ns_mult;

static inline uint64_t blk_ticks_to_ns(uint64_t ticks)
{
	return (uint64_t)(((unsigned __int128)ticks * blk_ns_mult) >> 32);
}

/* Count a finished request: a few instructions and one timestamp. */
static inline void blk_stats_account(struct blk_request *req, int ret)
{
	struct blk_stats *st = req->core.st;
	struct blk_op_stats *o = &st->op[req->op];
	int64_t ticks = (int64_t)(clock_ticks() - req->core.start_tsc);
	uint64_t ns = blk_ticks_to_ns(ticks > 0 ? (uint64_t)ticks : 0);

	o->ops++;
	if (likely(ret >= 0))
		o->bytes += req->len;
	else
		o->errors++;
	o->total_ns += ns;
	o->hist[blk_hist_bucket(ns)]++;
	st->in_flight--;
}

#endif
