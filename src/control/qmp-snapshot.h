/* QMP snapshots: blockdev-snapshot-sync, blockdev-snapshot (external, live)
 * and the internal qcow2 ones, as commands and as transaction actions.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_SNAPSHOT_H
#define IOPLANE_CONTROL_QMP_SNAPSHOT_H

/* Add the commands and the transaction actions (once). 0 or -errno. */
int qmp_snapshot_register(void);

#endif
