/* Unit tests for src/control/qmp.c and qmp-cmds.c: connections, dispatch,
 * replies in request order, events, output limits, introspection, through a
 * transport that keeps the output in memory. Replies are compared with what
 * qemu-storage-daemon 7.2 sends for the same input. Threading:
 * single-threaded. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "control/json.h"
#include "control/qmp-cmds.h"
#include "control/qmp.h"
#include "control/schema.h"

struct fake {
	struct qmp_conn s;
	char text[1 << 16]; /* everything written, for the test to read */
	size_t len;
	bool consume; /* take output as it comes (else leave it unread) */
	unsigned resumes;
};

static void fake_output(struct qmp_conn *s)
{
	struct fake *f = s->opaque;
	size_t n = s->out_len - s->out_head;

	if (!f->consume)
		return;
	if (n > sizeof(f->text) - f->len - 1)
		n = sizeof(f->text) - f->len - 1;
	memcpy(f->text + f->len, s->out + s->out_head, n);
	f->len += n;
	f->text[f->len] = '\0';
	qmp_conn_wrote(s, s->out_len - s->out_head);
}

static void fake_resume(struct qmp_conn *s)
{
	((struct fake *)s->opaque)->resumes++;
}

static const struct qmp_conn_ops fake_ops = { .output = fake_output, .resume = fake_resume };

static struct fake *fake_new(void)
{
	struct fake *f = calloc(1, sizeof(*f));

	f->consume = true;
	qmp_conn_init(&f->s, &fake_ops, f, false);
	return f;
}

static void fake_free(struct fake *f)
{
	qmp_conn_destroy(&f->s);
	free(f);
}

/* Send in; return the output since the last call, lines joined. */
static const char *talk(struct fake *f, const char *in)
{
	static char out[1 << 16];
	size_t n = qmp_conn_input(&f->s, (const uint8_t *)in, strlen(in));

	assert_int_equal(n, strlen(in));
	snprintf(out, sizeof(out), "%s", f->text);
	f->len = 0;
	f->text[0] = '\0';
	return out;
}

static struct qmp_req *held;

static void async_cmd(struct qmp_req *req, json_t *args)
{
	(void)args;
	held = req; /* answered by the test, later */
}

static const struct qapi_type echo_args = QAPI_OBJECT_TYPE(
	"EchoArgs", QAPI_MEMBERS(QAPI_REQ("text", &qapi_str),
				 QAPI_OPT_DEFAULT("times", &qapi_uint8, "1")));

static void echo_cmd(struct qmp_req *req, json_t *args)
{
	qmp_return(req, json_pack("{s:s,s:I}", "text", qapi_get_str(args, "text"), "times",
				  (json_int_t)qapi_get_uint(args, "times", 0)));
}

static const struct qmp_command test_cmds[] = {
	{ .name = "x-test-async", .fn = async_cmd },
	{ .name = "x-test-echo", .args = &echo_args, .fn = echo_cmd },
};

static int setup(void **state)
{
	static bool done;

	(void)state;
	if (!done) {
		assert_int_equal(qmp_register_builtin(), 0);
		assert_int_equal(qmp_register(&test_cmds[0]), 0);
		assert_int_equal(qmp_register(&test_cmds[1]), 0);
		done = true;
	}
	return 0;
}

#define VERSION "{\"qemu\": {\"micro\": 0, \"minor\": 2, \"major\": 7}, \"package\": \"ioplane "

static void test_greeting_and_negotiation(void **state)
{
	struct fake *f = fake_new();
	const char *out;

	(void)state;
	out = talk(f, "");
	assert_ptr_equal(strstr(out, "{\"QMP\": {\"version\": " VERSION), out);
	assert_non_null(strstr(out, "\"capabilities\": []}}\r\n"));
	assert_string_equal(talk(f, "{\"execute\":\"query-version\"}"),
			    "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"Expecting "
			    "capabilities negotiation with 'qmp_capabilities'\"}}\r\n");
	assert_string_equal(talk(f, "{\"execute\":\"nope\",\"id\":1}"),
			    "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"Expecting "
			    "capabilities negotiation with 'qmp_capabilities'\"}, \"id\": 1}\r\n");
	assert_string_equal(talk(f, "{\"execute\":\"qmp_capabilities\",\"arguments\":"
				    "{\"enable\":[\"oob\"]}}"),
			    "{\"error\": {\"class\": \"GenericError\", \"desc\": \"Capability oob "
			    "not available\"}}\r\n");
	assert_string_equal(talk(f, "{\"execute\":\"qmp_capabilities\",\"arguments\":"
				    "{\"enable\":[\"foo\"]}}"),
			    "{\"error\": {\"class\": \"GenericError\", \"desc\": \"Parameter 'null' "
			    "does not accept value 'foo'\"}}\r\n");
	assert_string_equal(talk(f, "{\"execute\":\"qmp_capabilities\"}"), "{\"return\": {}}\r\n");
	assert_string_equal(talk(f, "{\"execute\":\"qmp_capabilities\"}"),
			    "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"Capabilities "
			    "negotiation is already complete, command ignored\"}}\r\n");
	out = talk(f, "{\"execute\":\"query-version\",\"id\":[1,{\"x\":null}]}");
	assert_ptr_equal(strstr(out, "{\"return\": " VERSION), out);
	assert_non_null(strstr(out, "}, \"id\": [1, {\"x\": null}]}\r\n"));
	fake_free(f);
}

static void test_bad_requests(void **state)
{
	static const struct {
		const char *in, *out;
	} cases[] = {
		{ "[]", "QMP input must be a JSON object" },
		{ "\"x\" ", "QMP input must be a JSON object" },
		{ "{\"foo\":1}", "QMP input member 'foo' is unexpected" },
		{ "{\"exec-oob\":\"query-version\"}", "QMP input member 'exec-oob' is unexpected" },
		{ "{\"execute\":1}", "QMP input member 'execute' must be a string" },
		{ "{\"execute\":\"query-version\",\"arguments\":[]}",
		  "QMP input member 'arguments' must be an object" },
		{ "{}", "QMP input lacks member 'execute'" },
		{ "{\"execute\":\"query-version\",\"arguments\":{\"a\":1}}",
		  "Parameter 'a' is unexpected" },
		{ "{\"execute\":\"x-test-echo\"}", "Parameter 'text' is missing" },
		{ "{\"execute\":\"x-test-echo\",\"arguments\":{\"text\":1}}",
		  "Invalid parameter type for 'text', expected: string" },
		{ "{\"execute\":\"query-version\",}", "JSON parse error, " },
		{ "{\"a\":1,\"a\":2}", "JSON parse error, duplicate key" },
	};
	struct fake *f = fake_new();
	char want[512];
	const char *out;
	size_t i;

	(void)state;
	talk(f, "{\"execute\":\"qmp_capabilities\"}");
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		out = talk(f, cases[i].in);
		snprintf(want, sizeof(want), "{\"error\": {\"class\": \"GenericError\", \"desc\": \"%s",
			 cases[i].out);
		if (strncmp(out, want, strlen(want)))
			fail_msg("%s: got %s", cases[i].in, out);
	}
	assert_string_equal(talk(f, "{\"execute\":\"nope\"}"),
			    "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"The command "
			    "nope has not been found\"}}\r\n");
	/* The request's id comes back with an error about the request. */
	assert_string_equal(talk(f, "{\"execute\":\"query-version\",\"id\":\"i\",\"control\":{}}"),
			    "{\"error\": {\"class\": \"GenericError\", \"desc\": \"QMP input member "
			    "'control' is unexpected\"}, \"id\": \"i\"}\r\n");
	/* Defaults reach the handler; single quotes are QMP too. */
	assert_string_equal(talk(f, "{'execute':'x-test-echo','arguments':{'text':'a\"b'}}"),
			    "{\"return\": {\"text\": \"a\\\"b\", \"times\": 1}}\r\n");
	fake_free(f);
}

/* Error texts quote the client's input and are cut at a size: cut in the middle
 * of a UTF-8 sequence they must still be sent (jansson refuses such strings). */
static void test_utf8_cut(void **state)
{
	struct fake *f = fake_new();
	char in[4096], *p;
	const char *out;
	int i;

	(void)state;
	talk(f, "{\"execute\":\"qmp_capabilities\"}");
	p = in + snprintf(in, sizeof(in), "{\"execute\":\"a");
	for (i = 0; i < 300; i++)
		p += snprintf(p, 3, "\xc3\xa9");
	snprintf(p, 3, "\"}");
	out = talk(f, in);
	assert_ptr_equal(strstr(out, "{\"error\": {\"class\": \"CommandNotFound\", \"desc\": \"The "
				     "command a\\u00E9"), out);
	p = in + snprintf(in, sizeof(in), "{\"execute\":\"qmp_capabilities\",\"arguments\":"
					  "{\"enable\":[\"");
	for (i = 0; i < 1000; i++)
		p += snprintf(p, 3, "\xc3\xa9");
	snprintf(p, 5, "\"]}}");
	out = talk(f, in);
	assert_ptr_equal(strstr(out, "{\"error\": {\"class\": \"GenericError\", \"desc\": \"Parameter "
				     "'null' does not accept value '\\u00E9"), out);
	fake_free(f);
}

static void test_async_order(void **state)
{
	const char *in = "{\"execute\":\"x-test-async\",\"id\":1}{\"execute\":\"x-test-echo\","
			 "\"arguments\":{\"text\":\"t\"},\"id\":2}";
	struct fake *f = fake_new();
	size_t n;

	(void)state;
	talk(f, "{\"execute\":\"qmp_capabilities\"}");
	/* The second command waits behind the first, which answers later. */
	n = qmp_conn_input(&f->s, (const uint8_t *)in, strlen(in));
	assert_true(n < strlen(in));
	assert_non_null(held);
	assert_false(qmp_conn_can_input(&f->s));
	assert_int_equal(f->len, 0);
	assert_int_equal(qmp_conn_input(&f->s, (const uint8_t *)in + n, strlen(in) - n), 0);
	qmp_return(held, json_string("late"));
	held = NULL;
	assert_int_equal(f->resumes, 1);
	assert_string_equal(f->text, "{\"return\": \"late\", \"id\": 1}\r\n");
	f->len = 0;
	assert_string_equal(talk(f, in + n), "{\"return\": {\"text\": \"t\", \"times\": 1}, "
					      "\"id\": 2}\r\n");
	/* A client that leaves while its request runs: the answer is dropped. */
	talk(f, "{\"execute\":\"x-test-async\"}");
	assert_non_null(held);
	fake_free(f);
	qmp_error(held, QMP_ERR_GENERIC, "nobody hears this");
	held = NULL;
}

static void test_events(void **state)
{
	struct fake *a = fake_new(), *b = fake_new();

	(void)state;
	talk(a, "{\"execute\":\"qmp_capabilities\"}");
	talk(b, "");
	qmp_emit_shutdown("host-qmp-quit");
	/* Only negotiated clients get events. */
	assert_string_equal(talk(b, ""), "");
	assert_true(!strncmp(talk(a, ""), "{\"timestamp\": {\"seconds\": ", 26));
	qmp_emit_shutdown("host-signal");
	assert_non_null(strstr(talk(a, ""), "\"event\": \"SHUTDOWN\", \"data\": {\"guest\": false, "
					    "\"reason\": \"host-signal\"}}\r\n"));
	fake_free(a);
	fake_free(b);
}

static void test_output_bound(void **state)
{
	struct fake *f = fake_new();
	unsigned i;

	(void)state;
	talk(f, "{\"execute\":\"qmp_capabilities\"}");
	f->consume = false; /* a client that reads nothing */
	assert_true(qmp_conn_can_input(&f->s));
	for (i = 0; i < 100000 && !f->s.overflow; i++)
		qmp_emit_shutdown("host-signal");
	assert_true(f->s.overflow);
	assert_true(f->s.out_len - f->s.out_head <= QMP_OUT_MAX);
	assert_false(qmp_conn_can_input(&f->s));
	fake_free(f);
}

static void test_oversized(void **state)
{
	size_t n = JSON_SPLIT_MAX_BYTES + 1000;
	struct fake *f = fake_new();
	char *in = malloc(n + 1);

	(void)state;
	talk(f, "{\"execute\":\"qmp_capabilities\"}");
	memset(in, ' ', n);
	in[n] = '\0';
	memcpy(in, "{\"execute\":\"query-version\",\"id\":\"", 33);
	assert_true(qmp_conn_input(&f->s, (const uint8_t *)in, n) < n);
	assert_true(f->s.closing);
	assert_string_equal(f->text, "{\"error\": {\"class\": \"GenericError\", \"desc\": \"JSON "
				     "token size limit exceeded\"}}\r\n");
	free(in);
	fake_free(f);
}

/* Every type a SchemaInfo names is described in the same answer. */
static void test_schema(void **state)
{
	struct fake *f = fake_new();
	json_t *r, *list, *e, *names = json_object();
	const char *out, *key;
	size_t i;

	(void)state;
	talk(f, "{\"execute\":\"qmp_capabilities\"}");
	out = talk(f, "{\"execute\":\"query-qmp-schema\"}");
	r = json_loads(out, 0, NULL);
	list = json_object_get(r, "return");
	assert_true(json_array_size(list) > 20);
	json_array_foreach(list, i, e)
		json_object_set_new(names, json_string_value(json_object_get(e, "name")), json_true());
	json_array_foreach(list, i, e) {
		const char *refs[] = { "arg-type", "ret-type", "element-type" };
		size_t k;

		for (k = 0; k < 3; k++) {
			key = json_string_value(json_object_get(e, refs[k]));
			if (key && !json_object_get(names, key))
				fail_msg("%s names an undescribed type %s",
					 json_string_value(json_object_get(e, "name")), key);
		}
	}
	assert_non_null(json_object_get(names, "query-qmp-schema"));
	assert_non_null(json_object_get(names, "SHUTDOWN"));
	assert_non_null(json_object_get(names, "x-test-echo"));
	json_decref(names);
	json_decref(r);
	fake_free(f);
}

static void test_register(void **state)
{
	(void)state;
	assert_int_equal(qmp_register(&test_cmds[0]), -EEXIST);
	assert_ptr_equal(qmp_find_command("x-test-echo"), &test_cmds[1]);
	assert_null(qmp_find_command("x-none"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_greeting_and_negotiation, setup),
		cmocka_unit_test_setup(test_bad_requests, setup),
		cmocka_unit_test_setup(test_utf8_cut, setup),
		cmocka_unit_test_setup(test_async_order, setup),
		cmocka_unit_test_setup(test_events, setup),
		cmocka_unit_test_setup(test_output_bound, setup),
		cmocka_unit_test_setup(test_oversized, setup),
		cmocka_unit_test_setup(test_schema, setup),
		cmocka_unit_test_setup(test_register, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
