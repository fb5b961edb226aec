/* blockdev-mirror, with QEMU 7.2's arguments and messages, and the start
 * of an active block-commit: both make a mirror job (mirror.c).
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "block/graph.h"
#include "block/job.h"
#include "control/qmp-job.h"
#include "control/qmp.h"
#include "control/schema.h"
#include "job/chain.h"
#include "job/mirror.h"

static const struct qapi_type sync_mode =
	QAPI_ENUM_TYPE("MirrorSyncMode", "top", "full", "none", "incremental", "bitmap");
static const struct qapi_type copy_mode =
	QAPI_ENUM_TYPE("MirrorCopyMode", "background", "write-blocking");

static const struct qapi_type mirror_args = QAPI_OBJECT_TYPE(
	"q_obj_blockdev-mirror-arg",
	QAPI_MEMBERS(QAPI_OPT("job-id", &qapi_str), QAPI_REQ("device", &qapi_str),
		     QAPI_REQ("target", &qapi_str), QAPI_OPT("replaces", &qapi_str),
		     QAPI_REQ("sync", &sync_mode), QAPI_OPT("speed", &qapi_int),
		     QAPI_OPT("granularity", &qapi_uint32), QAPI_OPT("buf-size", &qapi_int),
		     QAPI_OPT("on-source-error", &qmp_blockdev_on_error),
		     QAPI_OPT("on-target-error", &qmp_blockdev_on_error),
		     QAPI_OPT("filter-node-name", &qapi_str), QAPI_OPT("copy-mode", &copy_mode),
		     QAPI_OPT("auto-finalize", &qapi_bool), QAPI_OPT("auto-dismiss", &qapi_bool)));

/* QEMU's checks of what blockdev-mirror and block-commit share. */
static int mirror_numbers(json_t *a, struct mirror_params *p, char *err, size_t errlen)
{
	int64_t gran = qapi_get_int(a, "granularity", 0), buf = qapi_get_int(a, "buf-size", 0);

	if (qapi_get_int(a, "speed", 0) < 0) {
		snprintf(err, errlen, "Parameter 'speed' expects a non-negative value");
		return -EINVAL;
	}
	if (qapi_has(a, "granularity") && (gran < 512 || gran > (64 << 20))) {
		snprintf(err, errlen,
			 "Parameter 'granularity' expects a value in range [512B, 64MB]");
		return -EINVAL;
	}
	if (gran & (gran - 1)) {
		snprintf(err, errlen, "Parameter 'granularity' expects a power of 2");
		return -EINVAL;
	}
	if (buf < 0) {
		snprintf(err, errlen, "Parameter 'buf-size' expects a non-negative value");
		return -EINVAL;
	}
	p->granularity = (uint32_t)gran;
	p->buf_size = (uint64_t)buf;
	p->on_source_error = (enum job_error_policy)qapi_get_enum(
		a, "on-source-error", &qmp_blockdev_on_error, JOB_ERR_REPORT);
	p->on_target_error = (enum job_error_policy)qapi_get_enum(
		a, "on-target-error", &qmp_blockdev_on_error, JOB_ERR_REPORT);
	p->filter_node_name = qapi_get_str(a, "filter-node-name");
	return 0;
}

static int mirror_nodes(json_t *a, struct mirror_params *p, char *err, size_t errlen)
{
	const char *dev = qapi_get_str(a, "device"), *tgt = qapi_get_str(a, "target");
	const char *rep = qapi_get_str(a, "replaces");

	p->source = chain_lookup(dev, dev, err, errlen);
	if (!p->source)
		return -ENOENT;
	if (blk_parent_count(p->source)) {
		snprintf(err, errlen, "Need a root block node");
		return -EINVAL;
	}
	p->target = chain_lookup(tgt, tgt, err, errlen);
	if (!p->target)
		return -ENOENT;
	if (p->target == p->source) {
		snprintf(err, errlen, "Can't mirror node into itself");
		return -EINVAL;
	}
	if (rep && blk_graph_find(rep) != p->source) {
		snprintf(err, errlen, "replaces: only the source node '%s' can be replaced",
			 blk_node_name(p->source));
		return -ENOTSUP;
	}
	if (p->target->size != p->source->size) {
		snprintf(err, errlen, "Source and target image have different sizes");
		return -EINVAL;
	}
	if (p->target->read_only) {
		snprintf(err, errlen, "Node '%s' is read only", blk_node_name(p->target));
		return -EROFS;
	}
	return 0;
}

/* Make, set up and start the job; answers req. */
static void mirror_start(struct qmp_req *req, json_t *a, const struct mirror_params *p)
{
	struct job_opts o = JOB_OPTS_INIT;
	struct mirror_pre *pre;
	struct job *job;
	char err[512] = "";
	int ret = job_node_busy(p->source, err, sizeof(err));

	if (!ret)
		ret = job_node_busy(p->target, err, sizeof(err));
	if (!ret)
		ret = mirror_pre_new(p, &pre, err, sizeof(err));
	if (ret) {
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}

	chain_job_opts(a, p->source, &o);
	o.loop = job_pick_loop(p->source);
	if (job_create(mirror_driver_for(p->commit), &o, &job, err, sizeof(err))) {
		mirror_pre_free(pre);
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	ret = mirror_setup(job, p, pre, err, sizeof(err));
	if (ret) {
		mirror_setup_undo(job);
		job_early_fail(job);
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	job_start(job);
	qmp_return(req, NULL);
}

static void cmd_blockdev_mirror(struct qmp_req *req, json_t *a)
{
	struct mirror_params p = {0};
	char err[512] = "";
	int sync = qapi_get_enum(a, "sync", &sync_mode, 1);
	int ret = mirror_nodes(a, &p, err, sizeof(err));

	if (!ret)
		ret = mirror_numbers(a, &p, err, sizeof(err));
	if (!ret && sync > 2) {
		snprintf(err, sizeof(err), "Sync mode '%s' not supported", qapi_get_str(a, "sync"));
		ret = -ENOTSUP;
	}
	if (ret) {
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	/* MirrorSyncMode's order (top, full, none) to the job's. */
	p.sync = sync == 0 ? 1 : sync == 1 ? 0 : 2;
	p.write_blocking = qapi_get_enum(a, "copy-mode", &copy_mode, 0) == 1;
	mirror_start(req, a, &p);
}

void qmp_active_commit(struct qmp_req *req, json_t *args, struct blk_node *top,
		       struct blk_node *base)
{
	struct mirror_params p = {.source = top, .target = base, .sync = 0, .commit = true};
	char err[512] = "";
	int ret = mirror_numbers(args, &p, err, sizeof(err));

	p.on_source_error = p.on_target_error = (enum job_error_policy)qapi_get_enum(
		args, "on-error", &qmp_blockdev_on_error, JOB_ERR_REPORT);
	if (ret) {
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	mirror_start(req, args, &p);
}

static const struct qmp_command mirror_cmd = {
	.name = "blockdev-mirror", .args = &mirror_args, .fn = cmd_blockdev_mirror};

int qmp_mirror_register(void)
{
	return qmp_register(&mirror_cmd);
}
