/* Unit tests for src/control/keyval.c: qemu-storage-daemon's KEY=VALUE
 * syntax. Every error text here is what qemu-storage-daemon 7.2 prints for
 * the same argument (--blockdev, --nbd-server), checked by running it.
 * Threading: single-threaded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/compiler.h"
#include "control/keyval.h"


static char *dump(json_t *v)
{
	return json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
}

static void expect_ok(const char *in, const char *implied, const char *json)
{
	char err[256] = "", *got;
	json_t *v = keyval_parse(in, implied, NULL, err, sizeof(err));

	if (!v)
		fail_msg("'%s': %s", in, err);
	got = dump(v);
	if (strcmp(got, json))
		fail_msg("'%s': got %s, want %s", in, got, json);
	free(got);
	json_decref(v);
}

static void expect_err(const char *in, const char *implied, const char *msg)
{
	char err[256] = "";
	json_t *v = keyval_parse(in, implied, NULL, err, sizeof(err));

	if (v) {
		char *got = dump(v);

		fail_msg("'%s': parsed as %s, want error '%s'", in, got, msg);
	}
	if (strcmp(err, msg))
		fail_msg("'%s': got '%s', want '%s'", in, err, msg);
}

static void test_values(void **state)
{
	static const struct {
		const char *in, *implied, *json;
	} cases[] = {
		{ "", NULL, "{}" },
		{ "a=b", NULL, "{\"a\":\"b\"}" },
		{ "a=b,", NULL, "{\"a\":\"b\"}" },
		{ "a=", NULL, "{\"a\":\"\"}" },
		{ "a=b,,c", NULL, "{\"a\":\"b,c\"}" },
		{ "a=b,,", NULL, "{\"a\":\"b,\"}" },
		{ "a=b,,,c=d", NULL, "{\"a\":\"b,\",\"c\":\"d\"}" },
		{ "x=a=b", NULL, "{\"x\":\"a=b\"}" },
		{ "a=1,a=2", NULL, "{\"a\":\"2\"}" }, /* the last one wins */
		{ "a-b=1,A_c=2", NULL, "{\"A_c\":\"2\",\"a-b\":\"1\"}" },
		{ "__com.x_a=1", NULL, "{\"__com.x_a\":\"1\"}" },
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++)
		expect_ok(cases[i].in, cases[i].implied, cases[i].json);
}

static void test_nesting(void **state)
{
	(void)state;
	expect_ok("file.driver=file,file.filename=a.img", NULL,
		  "{\"file\":{\"driver\":\"file\",\"filename\":\"a.img\"}}");
	expect_ok("a.b.c=1,a.b.d=2,a.e=3", NULL, "{\"a\":{\"b\":{\"c\":\"1\",\"d\":\"2\"},\"e\":\"3\"}}");
	expect_ok("iothreads.0=a,iothreads.1=b", NULL, "{\"iothreads\":[\"a\",\"b\"]}");
	expect_ok("l.1=y,l.0=x", NULL, "{\"l\":[\"x\",\"y\"]}"); /* any order, no gaps */
	expect_ok("l.0.b=1,l.0.c=2,l.1.b=3", NULL, "{\"l\":[{\"b\":\"1\",\"c\":\"2\"},{\"b\":\"3\"}]}");
	expect_ok("l.0.0=a,l.0.1=b", NULL, "{\"l\":[[\"a\",\"b\"]]}");
	expect_ok("l.00=1", NULL, "{\"l\":[\"1\"]}");
}

static void test_implied(void **state)
{
	(void)state;
	expect_ok("null-co,node-name=a", "driver", "{\"driver\":\"null-co\",\"node-name\":\"a\"}");
	expect_ok("driver=file", "driver", "{\"driver\":\"file\"}");
	expect_ok("m", "chardev", "{\"chardev\":\"m\"}");
	expect_ok("a.b", "driver", "{\"driver\":\"a.b\"}");
	/* Only the first element may omit its key. */
	expect_err("node-name=a,null-co", "driver", "Expected '=' after parameter 'null-co'");
	expect_err(",null-co", "driver", "Invalid parameter ''");
	/* An implied value ends at the first comma: ",," is no escape there. */
	expect_err("null,,co,node-name=a", "driver", "Invalid parameter ''");
}

static void test_errors(void **state)
{
	static const struct {
		const char *in, *msg;
	} cases[] = {
		{ "=1", "Invalid parameter ''" },
		{ "a..b=1", "Invalid parameter 'a..b'" },
		{ ".a=1", "Invalid parameter '.a'" },
		{ "a.=1", "Invalid parameter 'a.'" },
		{ "1=1", "Invalid parameter '1'" },
		{ "a:b=1", "Invalid parameter 'a:b'" },
		{ "_a=1", "Invalid parameter '_a'" },
		{ "a", "Expected '=' after parameter 'a'" },
		{ "a.b", "Expected '=' after parameter 'a.b'" },
		{ "a.b=1,a=2", "Parameters 'a.*' used inconsistently" },
		{ "a=2,a.b=1", "Parameters 'a.*' used inconsistently" },
		{ "a.0=1,a.b=2", "Parameters 'a.*' used inconsistently" },
		{ "b.x.0=1,b.x.y=2", "Parameters 'b.x.*' used inconsistently" },
		{ "a.1=1", "Parameter 'a.0' missing" },
		{ "a.0=1,a.2=1", "Parameter 'a.1' missing" },
		{ "a.99999999999999999999=1", "Parameter 'a.0' missing" },
		{ "b.l.1=1", "Parameter 'b.l.0' missing" },
		{ "help", "Help is not available for this option" },
		{ "a=1,?", "Help is not available for this option" },
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++)
		expect_err(cases[i].in, NULL, cases[i].msg);
}

/* Values are text: bytes that are not UTF-8 get an error of their own, and a
 * bad implied key (a caller's bug) an error too, nothing leaked. */
static void test_bad_text(void **state)
{
	(void)state;
	expect_err("file,filename=a\xff" "b", "driver", "Parameter 'filename' is not valid UTF-8");
	expect_err("\xc3,x=1", "driver", "Parameter 'driver' is not valid UTF-8");
	expect_err("a.b=\xed\xa0\x80", NULL, "Parameter 'a.b' is not valid UTF-8");
	expect_ok("a=\xc3\xa9", NULL, "{\"a\":\"\xc3\xa9\"}");
	expect_err("x", "1bad", "Invalid parameter '1bad'");
}

static void test_lengths(void **state)
{
	char key[200], in[400], msg[400];

	(void)state;
	memset(key, 'a', 127);
	key[127] = '\0';
	snprintf(in, sizeof(in), "%s=1", key);
	snprintf(msg, sizeof(msg), "{\"%s\":\"1\"}", key);
	expect_ok(in, NULL, msg);
	strcat(key, "a"); /* 128 */
	snprintf(in, sizeof(in), "%s=1", key);
	snprintf(msg, sizeof(msg), "Parameter '%s' is too long", key);
	expect_err(in, NULL, msg);
	snprintf(in, sizeof(in), "cache.%s=1", key);
	snprintf(msg, sizeof(msg), "Parameter fragment '%s' is too long", key);
	expect_err(in, NULL, msg);
}

static void test_deep(void **state)
{
	size_t n = 1100, i;
	char *in = malloc(2 * n + 3), err[256];
	json_t *v;

	(void)state;
	for (i = 0; i < n; i++)
		memcpy(in + 2 * i, "a.", 2);
	memcpy(in + 2 * n, "a=", 3);
	v = keyval_parse(in, NULL, NULL, err, sizeof(err));
	assert_null(v);
	assert_string_equal(err, "Parameter nested more than 1024 levels deep");
	free(in);
}

static void test_help(void **state)
{
	char err[64];
	bool help = false;
	json_t *v = keyval_parse("help", "qom-type", &help, err, sizeof(err));

	(void)state;
	assert_non_null(v);
	assert_true(help);
	assert_int_equal(json_object_size(v), 0);
	json_decref(v);
	help = false;
	v = keyval_parse("iothread,?", "qom-type", &help, err, sizeof(err));
	assert_true(help);
	assert_string_equal(json_string_value(json_object_get(v, "qom-type")), "iothread");
	json_decref(v);
}

static void test_json_form(void **state)
{
	char err[128];
	bool is_json;
	json_t *v;

	(void)state;
	v = keyval_or_json("{\"type\":\"nbd\",\"writable\":true}", "type", &is_json, err,
			   sizeof(err));
	assert_non_null(v);
	assert_true(is_json);
	assert_true(json_is_true(json_object_get(v, "writable")));
	json_decref(v);
	v = keyval_or_json("nbd,writable=on", "type", &is_json, err, sizeof(err));
	assert_false(is_json);
	assert_string_equal(json_string_value(json_object_get(v, "writable")), "on");
	json_decref(v);
	/* Not JSON unless the very first character is '{' (as in QEMU). */
	v = keyval_or_json(" {\"type\":\"nbd\"}", "type", &is_json, err, sizeof(err));
	assert_false(is_json);
	json_decref(v);
	assert_null(keyval_or_json("{\"type\":\"nbd\"} x", "type", &is_json, err, sizeof(err)));
	assert_string_equal(err, "Expecting at most one JSON value");
	assert_null(keyval_or_json("{\"type\":\"nbd\"", "type", &is_json, err, sizeof(err)));
	assert_string_equal(err, "JSON parse error, premature EOI");
	assert_null(keyval_or_json("{\"a\":1,\"a\":2}", "type", &is_json, err, sizeof(err)));
	assert_string_equal(err, "JSON parse error, duplicate key");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_values),	cmocka_unit_test(test_nesting),
		cmocka_unit_test(test_implied), cmocka_unit_test(test_errors),
		cmocka_unit_test(test_bad_text), cmocka_unit_test(test_lengths),
		cmocka_unit_test(test_deep),
		cmocka_unit_test(test_help),	cmocka_unit_test(test_json_form),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
