/* libFuzzer target for the QMP monitor's input: one input is the byte stream of one
 * client, through the splitter, jansson, the request checks, schema validation and
 * the dispatch of harmless commands - the built-in ones (quit only answers here), the
 * block-node commands on nodes that touch no file (null-co, raw; qmp_block_sandbox), and
 * test commands that echo arguments validated against a union with lists, an
 * alternate and every scalar type, parse a keyval string against it, emit an event,
 * or answer later. The first byte picks how the stream is cut into reads and whether
 * output is pretty. Every byte the connection writes must be a sequence of JSON objects,
 * each a greeting, a reply or an event. Seeds: tests/fuzz/corpus-qmp/
 * (gen-qmp-corpus.py).
 * Threading: the caller's thread; the command table is set up once. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/qmp-block.h"
#include "control/qmp-cmds.h"
#include "control/qmp.h"
#include "control/schema.h"
#include "fuzz.h"

static const struct qapi_type f_enum = QAPI_ENUM_TYPE("FuzzEnum", "a", "b", "c");
static const struct qapi_type f_enum_list = QAPI_LIST_TYPE(&f_enum);
static const struct qapi_type f_int_list = QAPI_LIST_TYPE(&qapi_int16);
static const struct qapi_type f_inner = QAPI_OBJECT_TYPE(
	"FuzzInner", QAPI_MEMBERS(QAPI_REQ("path", &qapi_str), QAPI_OPT("on", &qapi_bool)));
extern const struct qapi_type fuzz_opts;
static const struct qapi_type f_ref = QAPI_ALTERNATE_TYPE("FuzzRef", &fuzz_opts, &qapi_str);
static const struct qapi_type f_inner_list = QAPI_LIST_TYPE(&f_inner);
static const struct qapi_type f_branch_a = QAPI_OBJECT_TYPE(
	"FuzzA", QAPI_MEMBERS(QAPI_OPT("size", &qapi_size), QAPI_OPT("n", &qapi_uint32),
			      QAPI_OPT("ratio", &qapi_number)));
static const struct qapi_type f_branch_b = QAPI_OBJECT_TYPE(
	"FuzzB", QAPI_MEMBERS(QAPI_REQ("file", &f_ref), QAPI_OPT("list", &f_inner_list)));
const struct qapi_type fuzz_opts = QAPI_UNION_TYPE(
	"FuzzOpts",
	QAPI_MEMBERS(QAPI_REQ("kind", &f_enum), QAPI_OPT("name", &qapi_str),
		     QAPI_OPT_DEFAULT("flag", &qapi_bool, "false"), QAPI_OPT("i8", &qapi_int8),
		     QAPI_OPT("u64", &qapi_uint64), QAPI_OPT("ints", &f_int_list),
		     QAPI_OPT("enums", &f_enum_list), QAPI_OPT("inner", &f_inner),
		     QAPI_OPT("null", &qapi_null), QAPI_OPT("any", &qapi_any)),
	"kind", { "a", &f_branch_a }, { "b", &f_branch_b });
static const struct qapi_type f_keyval_args = QAPI_OBJECT_TYPE(
	"FuzzKeyvalArgs",
	QAPI_MEMBERS(QAPI_REQ("arg", &qapi_str), QAPI_OPT("implied", &qapi_str)));
static const struct qapi_type f_event_args =
	QAPI_OBJECT_TYPE("FuzzEventArgs", QAPI_MEMBERS(QAPI_REQ("name", &qapi_str),
						       QAPI_OPT("data", &qapi_any)));

static struct qmp_req *later; /* the request x-fuzz-later holds */

static void fuzz_args(struct qmp_req *req, json_t *args)
{
	qmp_return(req, json_incref(args));
}

static void fuzz_keyval(struct qmp_req *req, json_t *args)
{
	const char *implied = qapi_get_str(args, "implied");
	char err[512];
	json_t *o = qapi_parse_option(&fuzz_opts, qapi_get_str(args, "arg"),
				      implied ? implied : "kind", err, sizeof(err));

	if (o)
		qmp_return(req, o);
	else
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
}

static void fuzz_event(struct qmp_req *req, json_t *args)
{
	json_t *data = qapi_get(args, "data");

	qmp_event_emit(qapi_get_str(args, "name"), json_is_object(data) ? json_incref(data) : NULL);
	qmp_return(req, NULL);
}

static void fuzz_later(struct qmp_req *req, json_t *args)
{
	(void)args;
	later = req;
}

static const struct qmp_command fuzz_cmds[] = {
	{ .name = "x-fuzz-args", .args = &fuzz_opts, .ret = &fuzz_opts, .fn = fuzz_args },
	{ .name = "x-fuzz-keyval", .args = &f_keyval_args, .fn = fuzz_keyval },
	{ .name = "x-fuzz-event", .args = &f_event_args, .fn = fuzz_event },
	{ .name = "x-fuzz-later", .fn = fuzz_later },
};

static void fuzz_setup(void)
{
	static int done;
	size_t i;

	if (done)
		return;
	done = 1;
	if (qmp_register_builtin() < 0 || qmp_block_register() < 0)
		abort();
	qmp_block_sandbox();
	for (i = 0; i < sizeof(fuzz_cmds) / sizeof(fuzz_cmds[0]); i++)
		if (qmp_register(&fuzz_cmds[i]) < 0)
			abort();
}

/* What a client may receive: JSON objects, each of a known kind. */
static void check_output(const char *buf, size_t len)
{
	json_error_t e;
	size_t off = 0;
	json_t *v;

	while (off < len) {
		while (off < len && strchr(" \r\n", buf[off]))
			off++;
		if (off == len)
			break;
		v = json_loadb(buf + off, len - off, JSON_DISABLE_EOF_CHECK, &e);
		if (!v || !json_is_object(v) ||
		    (!json_object_get(v, "QMP") && !json_object_get(v, "return") &&
		     !json_object_get(v, "error") && !json_object_get(v, "event"))) {
			fprintf(stderr, "fuzz-qmp: bad output at %zu: %.200s\n", off, buf + off);
			abort();
		}
		off += e.position;
		json_decref(v);
	}
}

static void fuzz_output(struct qmp_conn *s)
{
	check_output(s->out + s->out_head, s->out_len - s->out_head);
	qmp_conn_wrote(s, s->out_len - s->out_head);
}

static void fuzz_resume(struct qmp_conn *s)
{
	(void)s;
}

static const struct qmp_conn_ops fuzz_ops = { .output = fuzz_output, .resume = fuzz_resume };

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const size_t chunks[8] = { 1, 2, 3, 7, 16, 61, 512, (size_t)-1 };
	struct qmp_conn s;
	size_t chunk, off = 1, n, used;

	fuzz_setup();
	if (!size)
		return 0;
	chunk = chunks[data[0] & 7];
	qmp_conn_init(&s, &fuzz_ops, NULL, data[0] & 8);
	while (off < size && !s.closing && !s.overflow) {
		n = size - off < chunk ? size - off : chunk;
		used = qmp_conn_input(&s, data + off, n);
		off += used;
		if (later) { /* answer it now: the connection takes input again */
			qmp_return(later, json_string("later"));
			later = NULL;
		} else if (!used) {
			break;
		}
	}
	if (later) {
		qmp_error(later, QMP_ERR_GENERIC, "done");
		later = NULL;
	}
	qmp_conn_destroy(&s);
	qmp_block_close_all(); /* each input starts with no node */
	return 0;
}
