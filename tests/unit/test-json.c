/* Unit tests for src/control/json.c: the QMP stream splitter and the parse
 * wrapper. Error texts are qemu-storage-daemon 7.2's for the same bytes where
 * it has one. Threading: single-threaded. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "control/json.h"

/* Split in and join what comes out: messages as "M<text>", errors as
 * "E<text>", each followed by '|'. Fed one byte at a time when bytewise. */
static void split_all(const char *in, size_t len, bool bytewise, char *out, size_t outlen)
{
	struct json_split s;
	size_t off = 0, used, n;
	enum json_split_result r;

	json_split_init(&s);
	out[0] = '\0';
	while (off < len) {
		n = bytewise ? 1 : len - off;
		r = json_split_feed(&s, (const uint8_t *)in + off, n, &used);
		off += used;
		n = strlen(out);
		if (r == JSON_SPLIT_MSG)
			snprintf(out + n, outlen - n, "M%s|", s.buf);
		else if (r != JSON_SPLIT_MORE)
			snprintf(out + n, outlen - n, "%c%s|", r == JSON_SPLIT_FATAL ? 'F' : 'E',
				 s.error);
	}
	json_split_free(&s);
}

static void expect_split(const char *in, const char *want)
{
	char a[1024], b[1024];

	split_all(in, strlen(in), false, a, sizeof(a));
	split_all(in, strlen(in), true, b, sizeof(b));
	if (strcmp(a, want) || strcmp(b, want))
		fail_msg("'%s': got '%s' / bytewise '%s', want '%s'", in, a, b, want);
}

static void test_split(void **state)
{
	(void)state;
	expect_split("{\"a\":1}", "M{\"a\":1}|");
	expect_split("  {\"a\":1}\r\n{\"b\":[1,{}]} ", "M{\"a\":1}|M{\"b\":[1,{}]}|");
	expect_split("{\"a\":\"}{\\\"\"}", "M{\"a\":\"}{\\\"\"}|"); /* braces in strings */
	expect_split("[1] 2 \"x\"", "M[1]|M2|M\"x\"|");	      /* a number ends at a space */
	expect_split("1{}", "M1|M{}|");
	expect_split("]", "M]|");
	/* Single-quoted strings and \' come out as standard JSON. */
	expect_split("{'a':'b\"c\\'d'}", "M{\"a\":\"b\\\"c'd\"}|");
	expect_split("{\"a\":\"it\\'s\"}", "M{\"a\":\"it's\"}|");
	/* A control character resets: QMP's way back to a known state. */
	expect_split("{\"execute\": \x01{}", "EJSON parse error, stray '\x01'|M{}|");
	/* What follows is new input: here the opening of a string. */
	expect_split("{\"a\":\"x\x01\"}\"{}", "EJSON parse error, stray '\x01'|M\"}\"|M{}|");
	expect_split("\xff{}", "EJSON parse error, stray '\xef\xbf\xbd'|M{}|");
	/* Tabs and newlines are whitespace, UTF-8 is text. */
	expect_split("{\t\"a\":\n\"\xc3\xa9\"}", "M{\t\"a\":\n\"\xc3\xa9\"}|");
}

static void test_split_limits(void **state)
{
	size_t n = JSON_SPLIT_MAX_DEPTH + 100, i;
	char *in = malloc(2 * n + 16), out[1024];

	(void)state;
	/* Too deep: one error, the rest of the value skipped, then on. */
	for (i = 0; i < n; i++)
		in[i] = '[';
	for (i = 0; i < n; i++)
		in[n + i] = ']';
	strcpy(in + 2 * n, "{}");
	split_all(in, strlen(in), false, out, sizeof(out));
	assert_string_equal(out, "EJSON nesting depth limit exceeded|M{}|");
	/* Exactly at the limit is fine. */
	n = JSON_SPLIT_MAX_DEPTH;
	for (i = 0; i < n; i++)
		in[i] = '[', in[n + i] = ']';
	in[2 * n] = '\0';
	split_all(in, strlen(in), false, out, sizeof(out));
	assert_int_equal(out[0], 'M');
	free(in);

	/* Too many tokens: likewise. */
	n = JSON_SPLIT_MAX_TOKENS + 10;
	in = malloc(2 * n + 16);
	in[0] = '[';
	for (i = 0; i < n; i++)
		memcpy(in + 1 + 2 * i, "1,", 2);
	strcpy(in + 1 + 2 * n, "1]{}");
	split_all(in, strlen(in), false, out, sizeof(out));
	assert_string_equal(out, "EJSON token count limit exceeded|M{}|");
	free(in);

	/* Too big: fatal. */
	n = JSON_SPLIT_MAX_BYTES + 10;
	in = malloc(n + 16);
	memcpy(in, "{\"a\":\"", 6);
	memset(in + 6, 'x', n - 6);
	strcpy(in + n, "\"}");
	split_all(in, n + 2, false, out, sizeof(out));
	assert_string_equal(strtok(out, "|"), "FJSON token size limit exceeded");
	free(in);
}

static void test_parse(void **state)
{
	char err[128];
	json_t *v;

	(void)state;
	assert_null(qjson_parse("{\"a\":1,\"a\":2}", 13, err, sizeof(err)));
	assert_string_equal(err, "JSON parse error, duplicate key");
	assert_null(qjson_parse("{\"a\":\"\xc3\"}", 8, err, sizeof(err)));
	assert_string_equal(err, "JSON parse error, invalid UTF-8 sequence in string");
	assert_null(qjson_parse("{\"a\":\"\\u0000\"}", 14, err, sizeof(err)));
	assert_string_equal(err, "JSON parse error, \\u0000 in a string is not supported");
	assert_null(qjson_parse("{\"a\":1e999}", 11, err, sizeof(err)));
	assert_string_equal(err, "JSON parse error, number out of range");
	v = qjson_parse("\"x\"", 3, err, sizeof(err));
	assert_true(json_is_string(v));
	json_decref(v);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_split),
		cmocka_unit_test(test_split_limits),
		cmocka_unit_test(test_parse),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
