/* QMP snapshots: blockdev-snapshot-sync, blockdev-snapshot (external, live)
 * and the internal qcow2 ones, as commands and as transaction actions.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_SNAPSHOT_H
#define IOPLANE_CONTROL_QMP_SNAPSHOT_H

#include <jansson.h>

struct qcow2_snapshot_info;

/* Add the commands and the transaction actions (once). 0 or -errno. */
int qmp_snapshot_register(void);
/* The internal ones (qmp-snapshot-internal.c); qmp_snapshot_register calls
 * it. */
int qmp_snapshot_internal_register(void);
/* A SnapshotInfo as QEMU replies it (new reference; NULL: out of memory). */
json_t *qmp_snapshot_info_json(const struct qcow2_snapshot_info *sn);

#endif
