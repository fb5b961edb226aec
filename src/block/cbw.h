/* The copy-before-write and mirror-top filters (cbw.c, mirror-top.c), the
 * side of the jobs that use them: their copy state and mode.
 * Threading: main thread, before or while the filter serves (the state's
 * own lock protects it, block-copy.h). */
#ifndef IOPLANE_BLOCK_CBW_H
#define IOPLANE_BLOCK_CBW_H

#include <stdbool.h>

#include "block/block-copy.h"
#include "block/block.h"

/* The copy state of a copy-before-write node (a backup job copies the
 * rest through it), or NULL if bs is not one. */
struct bcopy *cbw_copy_state(struct blk_node *bs);
/* Every write through the copy-before-write node bs is also recorded in
 * succ (a backup's bitmap successor), from now on. Before bs serves. */
struct blk_dirty_bitmap;
void cbw_set_successor(struct blk_node *bs, struct blk_dirty_bitmap *succ);

/* A mirror-top node (driver "mirror_top" as QEMU names it, on `file` = the source) records
 * every write in bc once it is done (bcopy_mark); write_blocking: a write
 * goes to source and bc->target before it is acknowledged, waiting for any
 * copy in flight over it. Set before the node serves; bc outlives it. */
void mirror_top_attach(struct blk_node *bs, struct bcopy *bc, bool write_blocking);
/* Switch write-blocking on or off (block-job-change; drained). */
void mirror_top_set_blocking(struct blk_node *bs, bool write_blocking);

#endif
