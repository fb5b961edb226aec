/* Inside the job framework: what job.c (main thread) and job-run.c (the
 * job loop's side and the messages between them) give each other.
 *
 * THREADING RULE: as each function says; see job.h. */
#ifndef IOPLANE_BLOCK_JOB_INT_H
#define IOPLANE_BLOCK_JOB_INT_H

#include "block/job.h"

/* main: the state machine (JOB_STATUS_CHANGE); a transition the table
 * forbids is logged and not made. */
void job_state_set(struct job *job, enum job_status to);
/* "block job 'ID'": the user description of the job's node references. */
void job_user_desc(const struct job *job, char *buf, size_t len);

/* job-run.c, main: set up the messages and timer; send the start. */
void job_run_init(struct job *job);
void job_run_start(struct job *job);
/* main: let a parked run() go on (it yielded at a pause point or an error
 * action). */
void job_unpark_now(struct job *job);

/* job.c, main, on the job loop's messages. */
void job_run_finished(struct job *job, int ret);
void job_parked(struct job *job);
void job_unpark(struct job *job);
void job_error_arrived(struct job *job);
void job_ready_arrived(struct job *job);

#endif
