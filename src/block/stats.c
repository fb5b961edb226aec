/* Per-node, per-thread request statistics: operations, bytes, errors and a
 * log2 latency histogram per operation type (counting is inline in
 * block-int.h, a few instructions per request).
 *
 * Threading: bs->stats[i] (and bs->loops[i]) is allocated and written only by the thread of the
 * loop with index i. blk_get_stats() may run on any thread: it reads the
 * counters without locks, so its sums are approximate while requests run. */
#include <stdlib.h>
#include <string.h>

#include "block/block-int.h"

struct blk_stats *blk_stats_slot(struct blk_node *bs, struct loop *loop)
{
	unsigned idx = loop_index(loop);

	if (!bs->stats[idx])
		bs->stats[idx] = calloc(1, sizeof(struct blk_stats));
	/* seq_cst, before the caller looks at bs->quiesce: a drain that
	 * began meanwhile either sees this loop or is seen (drain.c). */
	if (bs->stats[idx] && atomic_load(&bs->loops[idx]) != loop)
		atomic_store(&bs->loops[idx], loop);
	return bs->stats[idx];
}

void blk_stats_free(struct blk_node *bs)
{
	unsigned i;

	for (i = 0; i < LOOP_MAX_THREADS; i++) {
		free(bs->stats[i]);
		bs->stats[i] = NULL;
	}
}

static void blk_op_stats_add(struct blk_op_stats *to, const struct blk_op_stats *from)
{
	unsigned i;

	to->ops += from->ops;
	to->bytes += from->bytes;
	to->errors += from->errors;
	to->total_ns += from->total_ns;
	for (i = 0; i < BLK_HIST_BUCKETS; i++)
		to->hist[i] += from->hist[i];
}

void blk_get_stats(const struct blk_node *bs, struct blk_stats *out)
{
	unsigned i, op;

	memset(out, 0, sizeof(*out));
	for (i = 0; i < LOOP_MAX_THREADS; i++) {
		const struct blk_stats *s = bs->stats[i];

		if (!s)
			continue;
		for (op = 0; op < BLK_OP__COUNT; op++)
			blk_op_stats_add(&out->op[op], &s->op[op]);
		out->in_flight += s->in_flight;
		out->throttle_waits += s->throttle_waits;
		out->throttle_wait_ns += s->throttle_wait_ns;
	}
}

const char *blk_op_name(enum blk_op op)
{
	static const char *const names[BLK_OP__COUNT] = {
		[BLK_OP_READ] = "read",
		[BLK_OP_WRITE] = "write",
		[BLK_OP_FLUSH] = "flush",
		[BLK_OP_DISCARD] = "discard",
		[BLK_OP_WRITE_ZEROES] = "write-zeroes",
		[BLK_OP_BLOCK_STATUS] = "block-status",
	};

	return (unsigned)op < BLK_OP__COUNT ? names[op] : "unknown";
}
