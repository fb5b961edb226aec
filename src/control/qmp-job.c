/* QMP for block jobs, with qemu-storage-daemon 7.2's arguments, replies,
 * messages and events: query-jobs, query-block-jobs, job-pause, job-resume,
 * job-cancel, job-complete, job-finalize, job-dismiss, the block-job-*
 * forms that name a job by "device" (its id), block-job-set-speed, and the
 * events JOB_STATUS_CHANGE, BLOCK_JOB_READY, BLOCK_JOB_PENDING,
 * BLOCK_JOB_COMPLETED, BLOCK_JOB_CANCELLED and BLOCK_JOB_ERROR. The jobs
 * themselves are registered by their modules (qmp-stream.c, ...).
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "block/job.h"
#include "control/qmp-export.h"
#include "control/qmp-job.h"
#include "job/mirror.h"
#include "control/qmp-object.h"
#include "control/qmp.h"
#include "control/schema.h"

static const struct qapi_type job_status_type =
	QAPI_ENUM_TYPE("JobStatus", "undefined", "created", "running", "paused", "ready", "standby",
		       "waiting", "pending", "aborting", "concluded", "null");
static const struct qapi_type job_type_type =
	QAPI_ENUM_TYPE("JobType", "commit", "stream", "mirror", "backup", "create", "amend",
		       "snapshot-load", "snapshot-save", "snapshot-delete");
const struct qapi_type qmp_blockdev_on_error =
	QAPI_ENUM_TYPE("BlockdevOnError", "report", "ignore", "enospc", "stop", "auto");
static const struct qapi_type io_status_type =
	QAPI_ENUM_TYPE("BlockDeviceIoStatus", "ok", "failed", "nospace");
static const struct qapi_type error_action_type =
	QAPI_ENUM_TYPE("BlockErrorAction", "ignore", "report", "stop");
static const struct qapi_type io_op_type = QAPI_ENUM_TYPE("IoOperationType", "read", "write");

static const struct qapi_type job_info = QAPI_OBJECT_TYPE(
	"JobInfo",
	QAPI_MEMBERS(QAPI_REQ("id", &qapi_str), QAPI_REQ("type", &job_type_type),
		     QAPI_REQ("status", &job_status_type), QAPI_REQ("current-progress", &qapi_int),
		     QAPI_REQ("total-progress", &qapi_int), QAPI_OPT("error", &qapi_str)));
static const struct qapi_type job_info_list = QAPI_LIST_TYPE(&job_info);
static const struct qapi_type block_job_info = QAPI_OBJECT_TYPE(
	"BlockJobInfo",
	QAPI_MEMBERS(QAPI_REQ("type", &qapi_str), QAPI_REQ("device", &qapi_str),
		     QAPI_REQ("len", &qapi_int), QAPI_REQ("offset", &qapi_int),
		     QAPI_REQ("busy", &qapi_bool), QAPI_REQ("paused", &qapi_bool),
		     QAPI_REQ("speed", &qapi_int), QAPI_REQ("io-status", &io_status_type),
		     QAPI_REQ("ready", &qapi_bool), QAPI_REQ("status", &job_status_type),
		     QAPI_REQ("auto-finalize", &qapi_bool), QAPI_REQ("auto-dismiss", &qapi_bool),
		     QAPI_OPT("error", &qapi_str)));
static const struct qapi_type block_job_info_list = QAPI_LIST_TYPE(&block_job_info);

static const struct qapi_type id_args =
	QAPI_OBJECT_TYPE("q_obj_job-pause-arg", QAPI_MEMBERS(QAPI_REQ("id", &qapi_str)));
static const struct qapi_type device_args =
	QAPI_OBJECT_TYPE("q_obj_block-job-pause-arg", QAPI_MEMBERS(QAPI_REQ("device", &qapi_str)));
static const struct qapi_type cancel_args =
	QAPI_OBJECT_TYPE("q_obj_block-job-cancel-arg", QAPI_MEMBERS(QAPI_REQ("device", &qapi_str),
								    QAPI_OPT("force", &qapi_bool)));
static const struct qapi_type speed_args =
	QAPI_OBJECT_TYPE("q_obj_block-job-set-speed-arg",
			 QAPI_MEMBERS(QAPI_REQ("device", &qapi_str), QAPI_REQ("speed", &qapi_int)));

/* ---- replies ---------------------------------------------------------------------- */

static json_t *jobinfo(const struct job *j)
{
	json_t *o = json_pack("{s:s,s:s,s:s,s:I,s:I}", "id", j->id, "type", j->drv->type, "status",
			      job_status_name(j->status), "current-progress",
			      (json_int_t)atomic_load(&j->progress_current), "total-progress",
			      (json_int_t)atomic_load(&j->progress_total));

	if (o && j->ret && j->error)
		json_object_set_new(o, "error", json_string(j->error));
	return o;
}

static json_t *blockjobinfo(const struct job *j)
{
	json_t *o =
		json_pack("{s:s,s:s,s:I,s:I,s:b,s:b,s:I,s:s,s:b,s:s,s:b,s:b}", "type", j->drv->type,
			  "device", j->id, "len", (json_int_t)atomic_load(&j->progress_total),
			  "offset", (json_int_t)atomic_load(&j->progress_current), "busy",
			  (int)(atomic_load(&j->busy) && !j->main_parked), "paused",
			  (int)(j->pause_count > 0), "speed", (json_int_t)atomic_load(&j->speed),
			  "io-status", j->io_status, "ready",
			  (int)(j->status == JOB_STATUS_READY || j->status == JOB_STATUS_STANDBY),
			  "status", job_status_name(j->status), "auto-finalize",
			  (int)j->auto_finalize, "auto-dismiss", (int)j->auto_dismiss);

	if (o && j->ret && j->error)
		json_object_set_new(o, "error", json_string(j->error));
	return o;
}

static void query_jobs(struct qmp_req *req, json_t *args)
{
	json_t *list = json_array();

	(void)args;
	for (struct job *j = job_next(NULL); j && list; j = job_next(j))
		json_array_append_new(list, jobinfo(j));
	qmp_return(req, list);
}

static void query_block_jobs(struct qmp_req *req, json_t *args)
{
	json_t *list = json_array();

	(void)args;
	for (struct job *j = job_next(NULL); j && list; j = job_next(j))
		json_array_append_new(list, blockjobinfo(j));
	qmp_return(req, list);
}

/* ---- commands ------------------------------------------------------------------------ */

static struct job *find_job(struct qmp_req *req, json_t *args)
{
	struct job *j = job_find(qapi_get_str(args, "id"));

	if (!j)
		qmp_error(req, QMP_ERR_GENERIC, "Job not found");
	return j;
}

static struct job *find_block_job(struct qmp_req *req, json_t *args, const char *key)
{
	const char *id = qapi_get_str(args, key);
	struct job *j = job_find(id);

	if (!j)
		qmp_error(req, QMP_ERR_DEVICE_NOT_ACTIVE, "Block job '%s' not found", id);
	return j;
}

static void answer(struct qmp_req *req, int ret, const char *err)
{
	if (ret)
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
	else
		qmp_return(req, NULL);
}

enum job_cmd { CMD_PAUSE, CMD_RESUME, CMD_CANCEL, CMD_COMPLETE, CMD_FINALIZE, CMD_DISMISS };

static int job_cmd_apply(struct job *j, enum job_cmd c, char *err, size_t len)
{
	switch (c) {
	case CMD_PAUSE:
		return job_user_pause(j, err, len);
	case CMD_RESUME:
		return job_user_resume(j, err, len);
	case CMD_CANCEL:
		return job_user_cancel(j, true, err, len);
	case CMD_COMPLETE:
		return job_user_complete(j, err, len);
	case CMD_FINALIZE:
		return job_user_finalize(j, err, len);
	default:
		return job_user_dismiss(j, err, len);
	}
}

static void run_cmd(struct qmp_req *req, json_t *args, enum job_cmd c, bool block, const char *key)
{
	char err[512] = "";
	struct job *j = block ? find_block_job(req, args, key) : find_job(req, args);

	if (j)
		answer(req, job_cmd_apply(j, c, err, sizeof(err)), err);
}

#define JOB_CMD(fn, c, block, key)                                                                 \
	static void fn(struct qmp_req *req, json_t *args)                                          \
	{                                                                                          \
		run_cmd(req, args, c, block, key);                                                 \
	}
JOB_CMD(cmd_job_pause, CMD_PAUSE, false, "id")
JOB_CMD(cmd_job_resume, CMD_RESUME, false, "id")
JOB_CMD(cmd_job_cancel, CMD_CANCEL, false, "id")
JOB_CMD(cmd_job_complete, CMD_COMPLETE, false, "id")
JOB_CMD(cmd_job_finalize, CMD_FINALIZE, false, "id")
JOB_CMD(cmd_job_dismiss, CMD_DISMISS, false, "id")
JOB_CMD(cmd_bj_pause, CMD_PAUSE, true, "device")
JOB_CMD(cmd_bj_resume, CMD_RESUME, true, "device")
JOB_CMD(cmd_bj_complete, CMD_COMPLETE, true, "device")
JOB_CMD(cmd_bj_finalize, CMD_FINALIZE, true, "id")
JOB_CMD(cmd_bj_dismiss, CMD_DISMISS, true, "id")

static void cmd_bj_cancel(struct qmp_req *req, json_t *args)
{
	bool force = qapi_get_bool(args, "force", false);
	char err[512] = "";
	struct job *j = find_block_job(req, args, "device");

	if (!j)
		return;
	if (j->user_paused && !force) {
		qmp_error(req, QMP_ERR_GENERIC, "The block job for device '%s' is currently paused",
			  j->id);
		return;
	}
	answer(req, job_user_cancel(j, force, err, sizeof(err)), err);
}

static void cmd_bj_set_speed(struct qmp_req *req, json_t *args)
{
	char err[512] = "";
	struct job *j = find_block_job(req, args, "device");

	if (j)
		answer(req, job_set_speed(j, qapi_get_int(args, "speed", 0), err, sizeof(err)),
		       err);
}

static const struct qmp_command job_cmds[] = {
	{.name = "query-jobs", .ret = &job_info_list, .fn = query_jobs},
	{.name = "query-block-jobs", .ret = &block_job_info_list, .fn = query_block_jobs},
	{.name = "job-pause", .args = &id_args, .fn = cmd_job_pause},
	{.name = "job-resume", .args = &id_args, .fn = cmd_job_resume},
	{.name = "job-cancel", .args = &id_args, .fn = cmd_job_cancel},
	{.name = "job-complete", .args = &id_args, .fn = cmd_job_complete},
	{.name = "job-finalize", .args = &id_args, .fn = cmd_job_finalize},
	{.name = "job-dismiss", .args = &id_args, .fn = cmd_job_dismiss},
	{.name = "block-job-set-speed", .args = &speed_args, .fn = cmd_bj_set_speed},
	{.name = "block-job-cancel", .args = &cancel_args, .fn = cmd_bj_cancel},
	{.name = "block-job-pause", .args = &device_args, .fn = cmd_bj_pause},
	{.name = "block-job-resume", .args = &device_args, .fn = cmd_bj_resume},
	{.name = "block-job-complete", .args = &device_args, .fn = cmd_bj_complete},
	{.name = "block-job-finalize", .args = &id_args, .fn = cmd_bj_finalize},
	{.name = "block-job-dismiss", .args = &id_args, .fn = cmd_bj_dismiss},
};

/* ---- events ---------------------------------------------------------------------------- */

static const struct qapi_type status_change_data = QAPI_OBJECT_TYPE(
	"q_obj_JOB_STATUS_CHANGE-arg",
	QAPI_MEMBERS(QAPI_REQ("id", &qapi_str), QAPI_REQ("status", &job_status_type)));
static const struct qapi_type job_event_data = QAPI_OBJECT_TYPE(
	"q_obj_BLOCK_JOB_COMPLETED-arg",
	QAPI_MEMBERS(QAPI_REQ("type", &job_type_type), QAPI_REQ("device", &qapi_str),
		     QAPI_REQ("len", &qapi_int), QAPI_REQ("offset", &qapi_int),
		     QAPI_REQ("speed", &qapi_int), QAPI_OPT("error", &qapi_str)));
static const struct qapi_type pending_data =
	QAPI_OBJECT_TYPE("q_obj_BLOCK_JOB_PENDING-arg",
			 QAPI_MEMBERS(QAPI_REQ("type", &job_type_type), QAPI_REQ("id", &qapi_str)));
static const struct qapi_type error_data = QAPI_OBJECT_TYPE(
	"q_obj_BLOCK_JOB_ERROR-arg",
	QAPI_MEMBERS(QAPI_REQ("device", &qapi_str), QAPI_REQ("operation", &io_op_type),
		     QAPI_REQ("action", &error_action_type)));

static const struct qmp_event_info job_events[] = {
	{.name = "JOB_STATUS_CHANGE", .data = &status_change_data},
	{.name = "BLOCK_JOB_COMPLETED", .data = &job_event_data},
	{.name = "BLOCK_JOB_CANCELLED", .data = &job_event_data},
	{.name = "BLOCK_JOB_READY", .data = &job_event_data},
	{.name = "BLOCK_JOB_PENDING", .data = &pending_data},
	{.name = "BLOCK_JOB_ERROR", .data = &error_data},
};

static void ev_status(struct job *j)
{
	qmp_event_emit("JOB_STATUS_CHANGE",
		       json_pack("{s:s,s:s}", "id", j->id, "status", job_status_name(j->status)));
}

static json_t *ev_common(const struct job *j)
{
	return json_pack("{s:s,s:s,s:I,s:I,s:I}", "type", j->drv->type, "device", j->id, "len",
			 (json_int_t)atomic_load(&j->progress_total), "offset",
			 (json_int_t)atomic_load(&j->progress_current), "speed",
			 (json_int_t)atomic_load(&j->speed));
}

static void ev_ready(struct job *j)
{
	qmp_event_emit("BLOCK_JOB_READY", ev_common(j));
}

static void ev_pending(struct job *j)
{
	qmp_event_emit("BLOCK_JOB_PENDING",
		       json_pack("{s:s,s:s}", "type", j->drv->type, "id", j->id));
}

static void ev_completed(struct job *j)
{
	json_t *d = ev_common(j);

	if (d && j->ret && j->error)
		json_object_set_new(d, "error", json_string(j->error));
	qmp_event_emit("BLOCK_JOB_COMPLETED", d);
}

static void ev_cancelled(struct job *j)
{
	qmp_event_emit("BLOCK_JOB_CANCELLED", ev_common(j));
}

static void ev_error(struct job *j, bool is_read, enum job_error_action a)
{
	qmp_event_emit("BLOCK_JOB_ERROR",
		       json_pack("{s:s,s:s,s:s}", "device", j->id, "operation",
				 is_read ? "read" : "write", "action", job_action_name(a)));
}

static const struct job_event_ops qmp_job_events = {
	.status = ev_status,
	.ready = ev_ready,
	.pending = ev_pending,
	.completed = ev_completed,
	.cancelled = ev_cancelled,
	.error = ev_error,
};

static bool is_iothread(const struct loop *loop)
{
	return qmp_iothread_id(loop) != NULL;
}

int qmp_job_register(void)
{
	static bool done;
	int ret = 0;

	if (done)
		return 0;
	for (size_t i = 0; i < sizeof(job_cmds) / sizeof(job_cmds[0]) && !ret; i++)
		ret = qmp_register(&job_cmds[i]);
	for (size_t i = 0; i < sizeof(job_events) / sizeof(job_events[0]) && !ret; i++)
		ret = qmp_register_event(&job_events[i]);
	if (!ret)
		ret = qmp_stream_register();
	if (!ret)
		ret = qmp_commit_register();
	if (!ret)
		ret = qmp_mirror_register();
	if (!ret)
		ret = qmp_backup_register();
	job_set_event_ops(&qmp_job_events);
	job_set_iothread_filter(is_iothread);
	job_set_export_loop_fn(qmp_export_loop);
	done = ret == 0;
	return ret;
}
