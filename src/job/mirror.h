/* The mirror job (mirror.c) as its commands start it: blockdev-mirror
 * (mirror-qmp.c) and active block-commit (commit.c).
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_JOB_MIRROR_H
#define IOPLANE_JOB_MIRROR_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block/block-copy.h"
#include "block/job.h"

struct qmp_req;

struct mirror_params {
	struct blk_node *source, *target;
	int sync; /* 0 full, 1 top, 2 none */
	bool write_blocking, commit;
	uint32_t granularity; /* 0: the target's default */
	uint64_t buf_size;    /* 0: 16 MiB */
	enum job_error_policy on_source_error, on_target_error;
	const char *filter_node_name;
};

/* What is made before the job (mirror.c): the copy state and the
 * mirror-top filter above the source, in its place for every user. */
struct mirror_pre {
	struct bcopy bc;
	struct blk_node *filter;
	uint32_t gran;
};
int mirror_pre_new(const struct mirror_params *p, struct mirror_pre **out, char *err,
		   size_t errlen);
/* Take the filter out and free (NULL: nothing). */
void mirror_pre_free(struct mirror_pre *pre);

/* The job driver: type "mirror", or "commit" for an active commit. */
const struct job_driver *mirror_driver_for(bool commit);
/* A job made with job_create(mirror_driver_for(...)) takes pre (its to
 * free from now on), claims the nodes and takes the target. 0, or -errno
 * with a message (then mirror_setup_undo() and job_early_fail()). */
int mirror_setup(struct job *job, const struct mirror_params *p, struct mirror_pre *pre, char *err,
		 size_t errlen);
void mirror_setup_undo(struct job *job);

/* block-commit whose top is the active layer: a mirror of top into base
 * (args: block-commit's; checked by commit.c). Answers req. */
void qmp_active_commit(struct qmp_req *req, json_t *args, struct blk_node *top,
		       struct blk_node *base);
int qmp_mirror_register(void);
/* blockdev-backup (backup.c). */
int qmp_backup_register(void);

#endif
