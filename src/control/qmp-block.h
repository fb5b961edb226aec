/* QMP's block-node commands (qemu-storage-daemon's): blockdev-add,
 * blockdev-del, query-named-block-nodes, query-blockstats, block_resize,
 * and the BLOCK_IMAGE_CORRUPTED event.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_BLOCK_H
#define IOPLANE_CONTROL_QMP_BLOCK_H

#include <jansson.h>
#include <stddef.h>

#include "control/schema.h"

struct blk_node;

/* BlockdevOptions, for --blockdev: qapi_parse_option(&qmp_blockdev_options,
 * arg, "driver", ...). */
extern const struct qapi_type qmp_blockdev_options;

/* The remote protocol drivers (qmp-block-remote.c): their BlockdevOptions
 * members, and those members as the driver's key=value options. */
struct kv_opts;
extern const struct qapi_type qmp_bd_rbd, qmp_bd_nbd;
int qmp_bd_remote_kv(struct kv_opts *kv, const json_t *o, const char *drv);

/* Add the commands and the event (once). 0 or -errno. */
int qmp_block_register(void);

/* blockdev-add on validated BlockdevOptions: the node is the monitor's.
 * 0, or -errno and QEMU's message. --blockdev uses it too. */
int qmp_blockdev_add(json_t *opts, char *err, size_t errlen);

/* From now on only nodes that touch no file and never wait (null-co, raw;
 * no latency-ns): for the fuzz target. */
void qmp_block_sandbox(void);

/* At exit, after the exports: flush and close every node the monitor
 * owns (newest first). */
void qmp_block_close_all(void);

/* query-named-block-nodes / query-blockstats entries (qmp-block-query.c). */
json_t *qmp_block_node_info(struct blk_node *bs, int flat);
json_t *qmp_block_stats(struct blk_node *bs);
int qmp_block_query_register(void);

#endif
