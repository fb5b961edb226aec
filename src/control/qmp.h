/* QMP: the command table, one client's protocol state (a connection, without
 * its transport), request dispatch, replies and events.
 *
 * Other modules add commands with qmp_register() and events with
 * qmp_event_emit(); docs/control.md is the guide.
 *
 * THREADING RULE: main thread only - every function here, every handler, and
 * every connection. A handler must never block: work that waits (a drain on the
 * iothreads, a slow open) answers later through its struct qmp_req. An
 * iothread that has something to report sends a message to the main loop
 * (loop_send), which then calls qmp_event_emit(). */
#ifndef IOPLANE_CONTROL_QMP_H
#define IOPLANE_CONTROL_QMP_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "control/json.h"

struct qapi_type;
struct qmp_req;
struct qmp_conn;

/* args: the validated "arguments" (an object, never NULL; owned by the
 * request until the reply). The handler answers exactly once, now or later,
 * with qmp_return() or qmp_error(). */
typedef void (*qmp_handler_fn)(struct qmp_req *req, json_t *args);

struct qmp_command {
	const char *name;
	const struct qapi_type *args; /* an object type; NULL: takes no arguments */
	const struct qapi_type *ret;  /* what it returns (query-qmp-schema); NULL: {} */
	qmp_handler_fn fn;
	unsigned flags;
	/* QAPI features the command declares (query-qmp-schema), NULL-ended;
	 * NULL: none. */
	const char *const *features;
};

/* The one command allowed before capabilities negotiation (qmp_capabilities). */
#define QMP_CMD_NEGOTIATION 1u

struct qmp_event_info {
	const char *name;
	const struct qapi_type *data; /* an object type; NULL: no data */
};

/* Error classes, as QEMU names them. */
#define QMP_ERR_GENERIC "GenericError"
#define QMP_ERR_COMMAND_NOT_FOUND "CommandNotFound"
#define QMP_ERR_DEVICE_NOT_FOUND "DeviceNotFound"
#define QMP_ERR_DEVICE_NOT_ACTIVE "DeviceNotActive"

/* Add a command or an event (kept by pointer: static storage). -EEXIST if
 * the name is taken, -ENOMEM. */
int qmp_register(const struct qmp_command *cmd);
int qmp_register_event(const struct qmp_event_info *ev);
const struct qmp_command *qmp_find_command(const char *name);
/* Every registered command / event, in registration order; NULL past the end. */
const struct qmp_command *qmp_command_at(size_t i);
const struct qmp_event_info *qmp_event_at(size_t i);

/* Answer a request; ret (stolen) is the "return" value, NULL for {}. */
void qmp_return(struct qmp_req *req, json_t *ret);
void qmp_error(struct qmp_req *req, const char *cls, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* The connection a request came from (NULL once its client has gone: the
 * reply is then dropped). */
struct qmp_conn *qmp_req_conn(const struct qmp_req *req);

/* Send event name with data (stolen; NULL: none) to every connection that has
 * finished capabilities negotiation. */
void qmp_event_emit(const char *name, json_t *data);

/* ---- connections (for transports: monitor.c, the fuzz target) ---------------- */

/* Output is bounded: a client may leave up to QMP_OUT_PAUSE bytes unread
 * before its input is no longer processed (its own replies stop), and a
 * client that lets events pile up past QMP_OUT_MAX is dropped. */
#define QMP_OUT_PAUSE (256u << 10)
#define QMP_OUT_MAX (8u << 20)

struct qmp_conn_ops {
	/* New output in s->out (write it when you can). */
	void (*output)(struct qmp_conn *s);
	/* A request that answered later is done: input may be fed again. */
	void (*resume)(struct qmp_conn *s);
};

struct qmp_conn {
	const struct qmp_conn_ops *ops;
	void *opaque; /* the transport's */
	bool pretty;  /* indented output (--monitor pretty=on) */
	/* Output not yet written: out[out_head .. out_len). The transport
	 * consumes it with qmp_conn_wrote(). */
	char *out;
	size_t out_head, out_len, out_cap;
	/* Set when the connection must end: after a fatal input error (once its
	 * error reply is written) or an output overflow (at once). */
	bool closing, overflow;
	/* Private to qmp.c (negotiated: also qmp_capabilities in qmp-cmds.c). */
	struct json_split split;
	bool negotiated, in_dispatch;
	struct qmp_req *pending; /* the request being executed, if any */
	struct qmp_conn *next;
};

/* Start a connection: queues the greeting. pretty: indented output. */
void qmp_conn_init(struct qmp_conn *s, const struct qmp_conn_ops *ops, void *opaque, bool pretty);
/* End it; a pending request's reply will be dropped. */
void qmp_conn_destroy(struct qmp_conn *s);
/* Feed client bytes: runs every complete command in order and returns how
 * many bytes were consumed - fewer than len when a request is pending, the
 * output is backed up (qmp_conn_can_input() says when to go on) or the
 * connection is closing. */
size_t qmp_conn_input(struct qmp_conn *s, const uint8_t *data, size_t len);
bool qmp_conn_can_input(const struct qmp_conn *s);
/* The transport wrote n bytes of the output. */
void qmp_conn_wrote(struct qmp_conn *s, size_t n);

/* What query-version and the greeting report (qmp-cmds.c). */
json_t *qmp_version_info(void);

#endif
