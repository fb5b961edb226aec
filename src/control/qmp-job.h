/* QMP for block jobs: the job commands and events (qmp-job.c), and the
 * commands of each job (block-stream: qmp-stream.c, block-commit:
 * qmp-commit.c), which the jobs' modules register.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_JOB_H
#define IOPLANE_CONTROL_QMP_JOB_H

struct qapi_type;
struct blk_node;

/* BlockdevOnError, for the jobs' on-error arguments. */
extern const struct qapi_type qmp_blockdev_on_error;

/* The block-stream and block-commit commands (once each). 0 or -errno. */
int qmp_stream_register(void);
int qmp_commit_register(void);

#endif
