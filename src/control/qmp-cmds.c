/* The commands every QMP monitor has: qmp_capabilities, query-version,
 * query-commands, quit (query-qmp-schema is in introspect.c), and the
 * SHUTDOWN event.
 *
 * Version: ioplane implements qemu-storage-daemon 7.2's QMP, and tools that
 * read the greeting or query-version decide what they may send by QEMU's
 * version, so that is what the "qemu" triple says; "package" names ioplane
 * and its own version.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "control/qmp.h"
#include "control/qmp-cmds.h"
#include "control/schema.h"
#include "ioplane-version.h"

static void (*quit_fn)(void *opaque);
static void *quit_opaque;

/* ---- schema ------------------------------------------------------------- */

static const struct qapi_type qmp_capability = QAPI_ENUM_TYPE("QMPCapability", "oob");
static const struct qapi_type qmp_capability_list = QAPI_LIST_TYPE(&qmp_capability);
static const struct qapi_type qmp_capabilities_args = QAPI_OBJECT_TYPE(
	"q_obj_qmp_capabilities-arg", QAPI_MEMBERS(QAPI_OPT("enable", &qmp_capability_list)));

static const struct qapi_type version_triple = QAPI_OBJECT_TYPE(
	"VersionTriple", QAPI_MEMBERS(QAPI_REQ("major", &qapi_int), QAPI_REQ("minor", &qapi_int),
				      QAPI_REQ("micro", &qapi_int)));
static const struct qapi_type version_info =
	QAPI_OBJECT_TYPE("VersionInfo", QAPI_MEMBERS(QAPI_REQ("qemu", &version_triple),
						     QAPI_REQ("package", &qapi_str)));

static const struct qapi_type command_info =
	QAPI_OBJECT_TYPE("CommandInfo", QAPI_MEMBERS(QAPI_REQ("name", &qapi_str)));
static const struct qapi_type command_info_list = QAPI_LIST_TYPE(&command_info);

static const struct qapi_type shutdown_cause =
	QAPI_ENUM_TYPE("ShutdownCause", "none", "host-error", "host-qmp-quit",
		       "host-qmp-system-reset", "host-signal", "host-ui", "guest-shutdown",
		       "guest-reset", "guest-panic", "subsystem-reset", "snapshot-load");
static const struct qapi_type shutdown_data =
	QAPI_OBJECT_TYPE("q_obj_SHUTDOWN-arg", QAPI_MEMBERS(QAPI_REQ("guest", &qapi_bool),
							    QAPI_REQ("reason", &shutdown_cause)));

/* ---- handlers ----------------------------------------------------------- */

json_t *qmp_version_info(void)
{
	return json_pack("{s:{s:i,s:i,s:i},s:s}", "qemu", "micro", QMP_QEMU_MICRO, "minor",
			 QMP_QEMU_MINOR, "major", QMP_QEMU_MAJOR, "package",
			 "ioplane " IOPLANE_VERSION);
}

static void qmp_capabilities(struct qmp_req *req, json_t *args)
{
	struct qmp_conn *s = qmp_req_conn(req);
	json_t *enable = qapi_get(args, "enable"), *cap;
	char unavailable[256] = "";
	size_t i, n;

	if (s->negotiated) {
		qmp_error(req, QMP_ERR_COMMAND_NOT_FOUND,
			  "Capabilities negotiation is already complete, command ignored");
		return;
	}
	/* The greeting offers none, so any capability asked for is unavailable. */
	json_array_foreach (enable, i, cap) {
		n = strlen(unavailable);
		snprintf(unavailable + n, sizeof(unavailable) - n, "%s%s", n ? ", " : "",
			 json_string_value(cap));
	}
	if (*unavailable) {
		qmp_error(req, QMP_ERR_GENERIC, "Capability %s not available", unavailable);
		return;
	}
	s->negotiated = true;
	qmp_return(req, NULL);
}

static void query_version(struct qmp_req *req, json_t *args)
{
	(void)args;
	qmp_return(req, qmp_version_info());
}

static void query_commands(struct qmp_req *req, json_t *args)
{
	const struct qmp_command *cmd;
	json_t *list = json_array();
	size_t i;

	(void)args;
	for (i = 0; list && (cmd = qmp_command_at(i)); i++)
		json_array_append_new(list, json_pack("{s:s}", "name", cmd->name));
	if (!list) {
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
		return;
	}
	qmp_return(req, list);
}

static void quit(struct qmp_req *req, json_t *args)
{
	(void)args;
	/* The reply goes out first; the daemon then shuts down as on SIGTERM. */
	qmp_return(req, NULL);
	if (quit_fn)
		quit_fn(quit_opaque);
}

/* ---- registration ------------------------------------------------------- */

static const struct qmp_command builtin_cmds[] = {
	{.name = "qmp_capabilities",
	 .args = &qmp_capabilities_args,
	 .fn = qmp_capabilities,
	 .flags = QMP_CMD_NEGOTIATION},
	{.name = "query-version", .ret = &version_info, .fn = query_version},
	{.name = "query-commands", .ret = &command_info_list, .fn = query_commands},
	{.name = "quit", .fn = quit},
};

static const struct qmp_event_info shutdown_event = {.name = "SHUTDOWN", .data = &shutdown_data};

int qmp_register_builtin(void)
{
	static bool done;
	size_t i;
	int ret;

	if (done)
		return 0;
	for (i = 0; i < sizeof(builtin_cmds) / sizeof(builtin_cmds[0]); i++) {
		ret = qmp_register(&builtin_cmds[i]);
		if (ret < 0)
			return ret;
	}
	ret = qmp_register_event(&shutdown_event);
	if (ret == 0)
		ret = qmp_register_introspection();
	done = ret == 0;
	return ret;
}

void qmp_set_quit_handler(void (*fn)(void *opaque), void *opaque)
{
	quit_fn = fn;
	quit_opaque = opaque;
}

void qmp_emit_shutdown(const char *reason)
{
	qmp_event_emit("SHUTDOWN", json_pack("{s:b,s:s}", "guest", 0, "reason", reason));
}
