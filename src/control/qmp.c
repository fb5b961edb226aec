/* QMP connections, dispatch, replies and events (see qmp.h).
 *
 * A connection runs its client's commands one at a time, in the order they
 * came: while a request is pending (its handler answers later) no more
 * input is taken, so replies keep request order, as QEMU's are without
 * out-of-band execution (which ioplane does not offer). Requests are checked
 * as QEMU checks them, with its messages: the shape of the request, then
 * capabilities negotiation, the command's existence, then its arguments
 * against the schema.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "control/qmp.h"
#include "control/schema.h"

struct qmp_req {
	struct qmp_conn *s; /* NULL once the connection is gone */
	json_t *id;         /* NULL: none */
	json_t *args;
};

/* The tables and the connection list: main thread only, like everything here. */
static struct {
	const struct qmp_command **cmds;
	size_t ncmds, cmd_cap;
	const struct qmp_event_info **events;
	size_t nevents, event_cap;
	struct qmp_conn *connections;
} qmp;

static int table_add(const void ***tab, size_t *n, size_t *cap, const void *item)
{
	const void **t;

	if (*n == *cap) {
		*cap = *cap ? *cap * 2 : 32;
		t = realloc((void *)*tab, *cap * sizeof(*t));
		if (!t)
			return -ENOMEM;
		*tab = t;
	}
	(*tab)[(*n)++] = item;
	return 0;
}

const struct qmp_command *qmp_find_command(const char *name)
{
	size_t i;

	for (i = 0; i < qmp.ncmds; i++)
		if (!strcmp(qmp.cmds[i]->name, name))
			return qmp.cmds[i];
	return NULL;
}

int qmp_register(const struct qmp_command *cmd)
{
	if (qmp_find_command(cmd->name))
		return -EEXIST;
	return table_add((const void ***)&qmp.cmds, &qmp.ncmds, &qmp.cmd_cap, cmd);
}

int qmp_register_event(const struct qmp_event_info *ev)
{
	size_t i;

	for (i = 0; i < qmp.nevents; i++)
		if (!strcmp(qmp.events[i]->name, ev->name))
			return -EEXIST;
	return table_add((const void ***)&qmp.events, &qmp.nevents, &qmp.event_cap, ev);
}

const struct qmp_command *qmp_command_at(size_t i)
{
	return i < qmp.ncmds ? qmp.cmds[i] : NULL;
}

const struct qmp_event_info *qmp_event_at(size_t i)
{
	return i < qmp.nevents ? qmp.events[i] : NULL;
}

/* ---- output ------------------------------------------------------------- */

static int out_append(const char *buf, size_t size, void *opaque)
{
	struct qmp_conn *s = opaque;
	size_t cap;
	char *b;

	if (s->out_head && s->out_head == s->out_len)
		s->out_head = s->out_len = 0;
	if (s->out_len + size > s->out_cap && s->out_head) { /* reuse the written part first */
		memmove(s->out, s->out + s->out_head, s->out_len - s->out_head);
		s->out_len -= s->out_head;
		s->out_head = 0;
	}
	if (s->out_len + size > s->out_cap) {
		for (cap = s->out_cap ? s->out_cap : 4096; cap < s->out_len + size; cap *= 2)
			;
		b = realloc(s->out, cap);
		if (!b)
			return -1;
		s->out = b;
		s->out_cap = cap;
	}
	memcpy(s->out + s->out_len, buf, size);
	s->out_len += size;
	return 0;
}

/* Queue msg (stolen) as one line. A client whose unread output passes
 * QMP_OUT_MAX is cut off: it is not reading, and memory is not free. */
static void conn_send(struct qmp_conn *s, json_t *msg)
{
	size_t flags = JSON_ENSURE_ASCII | (s->pretty ? JSON_INDENT(4) : 0);
	size_t unwritten = s->out_len - s->out_head;

	if (!msg || s->overflow) {
		json_decref(msg);
		return;
	}
	if (json_dump_callback(msg, out_append, s, flags) < 0 || out_append("\r\n", 2, s) < 0 ||
	    s->out_len - s->out_head > QMP_OUT_MAX) {
		s->out_len = s->out_head + unwritten; /* drop the partial line */
		s->overflow = true;
	}
	json_decref(msg);
	s->ops->output(s);
}

/* {"error": {"class": cls, "desc": desc}}; desc may quote a client's input,
 * cut at a size limit: never refused for being cut in mid-character. */
static json_t *error_msg(const char *cls, const char *desc)
{
	return json_pack("{s:{s:s,s:o}}", "error", "class", cls, "desc", qjson_string_lossy(desc));
}

static void send_error(struct qmp_conn *s, json_t *id, const char *cls, const char *desc)
{
	json_t *msg = error_msg(cls, desc);

	if (msg && id)
		json_object_set(msg, "id", id);
	conn_send(s, msg);
}

void qmp_conn_wrote(struct qmp_conn *s, size_t n)
{
	s->out_head += n;
	if (s->out_head == s->out_len)
		s->out_head = s->out_len = 0;
}

/* ---- replies ------------------------------------------------------------ */

static void req_finish(struct qmp_req *req, json_t *msg)
{
	struct qmp_conn *s = req->s;

	if (s && msg && req->id)
		json_object_set(msg, "id", req->id);
	if (s) {
		conn_send(s, msg);
		s->pending = NULL;
		if (!s->in_dispatch)
			s->ops->resume(s);
	} else {
		json_decref(msg);
	}
	json_decref(req->id);
	json_decref(req->args);
	free(req);
}

void qmp_return(struct qmp_req *req, json_t *ret)
{
	json_t *msg = json_object();

	if (msg)
		json_object_set_new(msg, "return", ret ? ret : json_object());
	else
		json_decref(ret);
	req_finish(req, msg);
}

void qmp_error(struct qmp_req *req, const char *cls, const char *fmt, ...)
{
	char desc[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(desc, sizeof(desc), fmt, ap);
	va_end(ap);
	req_finish(req, error_msg(cls, desc));
}

struct qmp_conn *qmp_req_conn(const struct qmp_req *req)
{
	return req->s;
}

/* ---- events ------------------------------------------------------------- */

void qmp_event_emit(const char *name, json_t *data)
{
	struct qmp_conn *s;
	struct timeval tv;
	json_t *msg;

	if (gettimeofday(&tv, NULL) < 0)
		tv.tv_sec = tv.tv_usec = -1; /* as QMP says for a clock that fails */
	msg = json_pack("{s:{s:I,s:I},s:s}", "timestamp", "seconds", (json_int_t)tv.tv_sec,
			"microseconds", (json_int_t)tv.tv_usec, "event", name);
	if (msg && data)
		json_object_set(msg, "data", data);
	for (s = qmp.connections; msg && s; s = s->next)
		if (s->negotiated)
			conn_send(s, json_incref(msg));
	json_decref(msg);
	json_decref(data);
}

/* ---- dispatch ----------------------------------------------------------- */

/* QEMU's checks of the request object; the command name, or NULL after
 * sending the error. */
static const char *check_request(struct qmp_conn *s, json_t *msg, json_t *id, json_t **args)
{
	const char *key, *name = NULL;
	char desc[256];
	json_t *v;

	json_object_foreach (msg, key, v) {
		if (!strcmp(key, "execute")) {
			if (!json_is_string(v)) {
				send_error(s, id, QMP_ERR_GENERIC,
					   "QMP input member 'execute' must be a string");
				return NULL;
			}
			name = json_string_value(v);
		} else if (!strcmp(key, "arguments")) {
			if (!json_is_object(v)) {
				send_error(s, id, QMP_ERR_GENERIC,
					   "QMP input member 'arguments' must be an object");
				return NULL;
			}
			*args = v;
		} else if (strcmp(key, "id")) {
			/* exec-oob too: out-of-band execution is not offered. */
			snprintf(desc, sizeof(desc), "QMP input member '%s' is unexpected", key);
			send_error(s, id, QMP_ERR_GENERIC, desc);
			return NULL;
		}
	}
	if (!name)
		send_error(s, id, QMP_ERR_GENERIC, "QMP input lacks member 'execute'");
	return name;
}

static const struct qmp_command *find_allowed(struct qmp_conn *s, const char *name, json_t *id)
{
	const struct qmp_command *cmd = qmp_find_command(name);
	char desc[256];

	if (!s->negotiated && (!cmd || !(cmd->flags & QMP_CMD_NEGOTIATION))) {
		send_error(s, id, QMP_ERR_COMMAND_NOT_FOUND,
			   "Expecting capabilities negotiation with 'qmp_capabilities'");
		return NULL;
	}
	if (!cmd) {
		snprintf(desc, sizeof(desc), "The command %.200s has not been found", name);
		send_error(s, id, QMP_ERR_COMMAND_NOT_FOUND, desc);
	}
	return cmd;
}

static void dispatch(struct qmp_conn *s, json_t *msg)
{
	json_t *id = json_object_get(msg, "id"), *args = NULL;
	const struct qmp_command *cmd;
	struct qmp_req *req;
	const char *name;
	char err[512];

	name = check_request(s, msg, id, &args);
	if (!name || !(cmd = find_allowed(s, name, id)))
		return;
	args = args ? json_incref(args) : json_object();
	if (args &&
	    qapi_validate(cmd->args ? cmd->args : &qapi_empty, args, false, err, sizeof(err)) < 0) {
		send_error(s, id, QMP_ERR_GENERIC, err);
		json_decref(args);
		return;
	}
	req = calloc(1, sizeof(*req));
	if (!req || !args) {
		free(req);
		json_decref(args);
		send_error(s, id, QMP_ERR_GENERIC, "out of memory");
		return;
	}
	*req = (struct qmp_req){.s = s, .id = json_incref(id), .args = args};
	s->pending = req;
	s->in_dispatch = true;
	cmd->fn(req, args);
	s->in_dispatch = false;
}

/* One framed message: parse it and run it. */
static void handle_message(struct qmp_conn *s)
{
	char err[256];
	json_t *msg = qjson_parse(s->split.buf, s->split.len, err, sizeof(err));

	if (!msg)
		send_error(s, NULL, QMP_ERR_GENERIC, err);
	else if (!json_is_object(msg))
		send_error(s, NULL, QMP_ERR_GENERIC, "QMP input must be a JSON object");
	else
		dispatch(s, msg);
	json_decref(msg);
}

bool qmp_conn_can_input(const struct qmp_conn *s)
{
	return !s->pending && !s->closing && !s->overflow &&
	       s->out_len - s->out_head < QMP_OUT_PAUSE;
}

size_t qmp_conn_input(struct qmp_conn *s, const uint8_t *data, size_t len)
{
	enum json_split_result r;
	size_t done = 0, used;

	while (done < len && qmp_conn_can_input(s)) {
		r = json_split_feed(&s->split, data + done, len - done, &used);
		done += used;
		if (r == JSON_SPLIT_MSG) {
			handle_message(s);
		} else if (r != JSON_SPLIT_MORE) {
			send_error(s, NULL, QMP_ERR_GENERIC, s->split.error);
			s->closing = r == JSON_SPLIT_FATAL;
		}
	}
	return done;
}

/* ---- connections ----------------------------------------------------------- */

void qmp_conn_init(struct qmp_conn *s, const struct qmp_conn_ops *ops, void *opaque, bool pretty)
{
	memset(s, 0, sizeof(*s));
	s->ops = ops;
	s->opaque = opaque;
	s->pretty = pretty;
	json_split_init(&s->split);
	s->next = qmp.connections;
	qmp.connections = s;
	/* No capabilities: out-of-band execution is not offered. */
	conn_send(s, json_pack("{s:{s:o,s:[]}}", "QMP", "version", qmp_version_info(),
			       "capabilities"));
}

void qmp_conn_destroy(struct qmp_conn *s)
{
	struct qmp_conn **p;

	for (p = &qmp.connections; *p; p = &(*p)->next) {
		if (*p == s) {
			*p = s->next;
			break;
		}
	}
	if (s->pending)
		s->pending->s = NULL; /* its handler still answers; the answer is dropped */
	json_split_free(&s->split);
	free(s->out);
	s->out = NULL;
}
