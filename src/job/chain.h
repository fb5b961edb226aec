/* What stream and commit share: finding nodes of a backing chain as QEMU's
 * block-stream and block-commit name them, the argument errors they give,
 * and putting a new backing link into an overlay's header and graph.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_JOB_CHAIN_H
#define IOPLANE_JOB_CHAIN_H

#include <stdbool.h>
#include <stddef.h>

struct blk_node;

/* The backing child of bs (NULL: none). */
struct blk_node *chain_backing(struct blk_node *bs);
/* Is `n` in bs's backing chain, below bs? */
bool chain_contains(struct blk_node *bs, struct blk_node *n);
/* The node of bs's chain (bs included) whose image file is `filename`
 * (QEMU's bdrv_find_backing_image: the name, or the same file), or NULL. */
struct blk_node *chain_find_image(struct blk_node *bs, const char *filename);
/* QEMU's bdrv_lookup_bs(): "Cannot find device='%s' nor node-name='%s'". */
struct blk_node *chain_lookup(const char *device, const char *node, char *err, size_t errlen);
/* The image file of bs's bottom node ("" if none). */
const char *chain_filename(struct blk_node *bs);
/* Is any node from top down to (not including) end held by a job?
 * -EBUSY with QEMU's message. */
int chain_busy(struct blk_node *top, struct blk_node *end, char *err, size_t errlen);
/* overlay's header and graph now have `base` (NULL: nothing) as backing
 * file, named backing_file (NULL: base's own file name) with base's
 * format; the nodes in between leave the chain. Flushes overlay first so
 * that what a job copied into it is on disk before the header drops the
 * old chain. Main thread; drains overlay. 0 or -errno with a message. */
int chain_relink(struct blk_node *overlay, struct blk_node *base, const char *backing_file,
		 char *err, size_t errlen);

#endif
