/* QMP's dirty bitmap commands (block-dirty-bitmap-add, -remove, -clear,
 * -enable, -disable, -merge) with QEMU's arguments and messages, each made
 * of transaction action ops (qmp-transaction.h), and the BlockDirtyInfo
 * list of query-named-block-nodes.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_BITMAP_H
#define IOPLANE_CONTROL_QMP_BITMAP_H

#include <jansson.h>

#include "control/qmp-transaction.h"

struct blk_node;

/* The bitmap actions, for `transaction` (qmp_txn_register). */
extern const struct qmp_txn_ops qmp_txn_bitmap_add, qmp_txn_bitmap_remove, qmp_txn_bitmap_clear,
	qmp_txn_bitmap_enable, qmp_txn_bitmap_disable, qmp_txn_bitmap_merge;

/* Add the commands (once). 0 or -errno. */
int qmp_bitmap_register(void);

/* bs's bitmaps as QEMU's BlockDirtyInfo list; NULL when it has none. */
json_t *qmp_bitmap_info_list(const struct blk_node *bs);

#endif
