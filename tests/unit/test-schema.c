/* Unit tests for src/control/schema.c and schema-values.c: the validator
 * over QMP JSON and keyval input, and QEMU's scalar syntax. The test schema
 * copies the shape of members of BlockdevOptions, BlockExportOptions and
 * qmp_capabilities; every message expected here is what
 * qemu-storage-daemon 7.2 answered for the same input (QMP blockdev-add,
 * block-export-add, qmp_capabilities, or the same --blockdev / --export on
 * its command line). Threading: single-threaded. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/compiler.h"
#include "control/keyval.h"
#include "control/schema.h"


static const struct qapi_type cache = QAPI_OBJECT_TYPE(
	"BlockdevCacheOptions",
	QAPI_MEMBERS(QAPI_OPT("direct", &qapi_bool), QAPI_OPT("no-flush", &qapi_bool)));
static const struct qapi_type detect_zeroes = QAPI_ENUM_TYPE("Dz", "off", "on", "unmap");
static const struct qapi_type driver = QAPI_ENUM_TYPE("Drv", "file", "null-co", "raw", "nbd");
static const struct qapi_type cap = QAPI_ENUM_TYPE("QMPCapability", "oob");
static const struct qapi_type cap_list = QAPI_LIST_TYPE(&cap);
static const struct qapi_type str_list = QAPI_LIST_TYPE(&qapi_str);
static const struct qapi_type int_list = QAPI_LIST_TYPE(&qapi_int);
static const struct qapi_type addr_type = QAPI_ENUM_TYPE("SocketAddressType", "unix", "fd");
static const struct qapi_type addr_unix =
	QAPI_OBJECT_TYPE("UnixSocketAddress", QAPI_MEMBERS(QAPI_REQ("path", &qapi_str)));
static const struct qapi_type addr_fd =
	QAPI_OBJECT_TYPE("FdSocketAddress", QAPI_MEMBERS(QAPI_REQ("str", &qapi_str)));
static const struct qapi_type addr = QAPI_UNION_TYPE(
	"SocketAddress", QAPI_MEMBERS(QAPI_REQ("type", &addr_type)), "type", { "unix", &addr_unix },
	{ "fd", &addr_fd });

extern const struct qapi_type opts;
static const struct qapi_type blockdev_ref = QAPI_ALTERNATE_TYPE("BlockdevRef", &opts, &qapi_str);
static const struct qapi_type opts_file =
	QAPI_OBJECT_TYPE("File", QAPI_MEMBERS(QAPI_REQ("filename", &qapi_str)));
static const struct qapi_type opts_null = QAPI_OBJECT_TYPE(
	"Null", QAPI_MEMBERS(QAPI_OPT("size", &qapi_int), QAPI_OPT("latency-ns", &qapi_uint64)));
static const struct qapi_type opts_raw =
	QAPI_OBJECT_TYPE("Raw", QAPI_MEMBERS(QAPI_REQ("file", &blockdev_ref)));
const struct qapi_type opts = QAPI_UNION_TYPE(
	"BlockdevOptions",
	QAPI_MEMBERS(QAPI_REQ("driver", &driver), QAPI_OPT("node-name", &qapi_str),
		     QAPI_OPT_DEFAULT("read-only", &qapi_bool, "false"), QAPI_OPT("cache", &cache),
		     QAPI_OPT("detect-zeroes", &detect_zeroes), QAPI_OPT("num-queues", &qapi_uint16),
		     QAPI_OPT("logical-block-size", &qapi_size), QAPI_OPT("addr", &addr),
		     QAPI_OPT("enable", &cap_list), QAPI_OPT("iothreads", &str_list),
		     QAPI_OPT("nums", &int_list), QAPI_OPT("ratio", &qapi_number),
		     QAPI_OPT("small", &qapi_int8), QAPI_OPT("any", &qapi_any)),
	"driver", { "file", &opts_file }, { "null-co", &opts_null }, { "raw", &opts_raw });

/* JSON text in, error text out ("" for success). */
static void check_qmp(const char *in, const char *msg)
{
	json_t *v = json_loads(in, 0, NULL);
	char err[512] = "";
	int ret;

	if (!v)
		fail_msg("bad test JSON: %s", in);
	ret = qapi_validate(&opts, v, false, err, sizeof(err));
	if (*msg ? ret != -EINVAL || strcmp(err, msg) : ret != 0)
		fail_msg("%s: got %d '%s', want '%s'", in, ret, err, msg);
	json_decref(v);
}

static json_t *keyval_checked(const char *in, const char *msg)
{
	char err[512] = "";
	json_t *v = qapi_parse_option(&opts, in, "driver", err, sizeof(err));

	if (*msg ? v || strcmp(err, msg) : !v)
		fail_msg("%s: got '%s', want '%s'", in, v ? "(valid)" : err, msg);
	return v;
}

static void check_keyval(const char *in, const char *msg)
{
	json_decref(keyval_checked(in, msg));
}

static void test_qmp_errors(void **state)
{
	static const struct {
		const char *in, *msg;
	} cases[] = {
		{ "{}", "Parameter 'driver' is missing" },
		{ "{\"driver\":5}", "Invalid parameter type for 'driver', expected: string" },
		{ "{\"driver\":\"bogus\"}", "Parameter 'driver' does not accept value 'bogus'" },
		{ "{\"driver\":\"null-co\",\"x\":1}", "Parameter 'x' is unexpected" },
		{ "{\"driver\":\"file\"}", "Parameter 'filename' is missing" },
		{ "{\"driver\":\"null-co\",\"node-name\":5}",
		  "Invalid parameter type for 'node-name', expected: string" },
		{ "{\"driver\":\"null-co\",\"read-only\":\"on\"}",
		  "Invalid parameter type for 'read-only', expected: boolean" },
		{ "{\"driver\":\"null-co\",\"read-only\":null}",
		  "Invalid parameter type for 'read-only', expected: boolean" },
		{ "{\"driver\":\"null-co\",\"cache\":{\"direct\":1}}",
		  "Invalid parameter type for 'cache.direct', expected: boolean" },
		{ "{\"driver\":\"null-co\",\"cache\":{\"bogus\":1}}", "Parameter 'cache.bogus' is unexpected" },
		{ "{\"driver\":\"null-co\",\"cache\":[]}",
		  "Invalid parameter type for 'cache', expected: object" },
		{ "{\"driver\":\"null-co\",\"detect-zeroes\":\"bogus\"}",
		  "Parameter 'detect-zeroes' does not accept value 'bogus'" },
		{ "{\"driver\":\"null-co\",\"detect-zeroes\":1}",
		  "Invalid parameter type for 'detect-zeroes', expected: string" },
		{ "{\"driver\":\"null-co\",\"size\":1.0}",
		  "Invalid parameter type for 'size', expected: integer" },
		{ "{\"driver\":\"null-co\",\"size\":\"1\"}",
		  "Invalid parameter type for 'size', expected: integer" },
		{ "{\"driver\":\"null-co\",\"latency-ns\":\"1\"}", "Parameter 'latency-ns' expects uint64" },
		{ "{\"driver\":\"null-co\",\"latency-ns\":1.5}", "Parameter 'latency-ns' expects uint64" },
		{ "{\"driver\":\"null-co\",\"num-queues\":-1}", "Parameter 'num-queues' expects uint16_t" },
		{ "{\"driver\":\"null-co\",\"num-queues\":70000}",
		  "Parameter 'num-queues' expects uint16_t" },
		{ "{\"driver\":\"null-co\",\"num-queues\":\"a\"}", "Parameter 'num-queues' expects uint64" },
		{ "{\"driver\":\"null-co\",\"logical-block-size\":\"4k\"}",
		  "Parameter 'logical-block-size' expects uint64" },
		{ "{\"driver\":\"null-co\",\"small\":128}", "Parameter 'small' expects int8_t" },
		{ "{\"driver\":\"null-co\",\"addr\":{}}", "Parameter 'addr.type' is missing" },
		{ "{\"driver\":\"null-co\",\"addr\":{\"type\":\"unix\"}}", "Parameter 'addr.path' is missing" },
		{ "{\"driver\":\"null-co\",\"addr\":{\"type\":\"bogus\"}}",
		  "Parameter 'type' does not accept value 'bogus'" },
		{ "{\"driver\":\"null-co\",\"addr\":5}", "Invalid parameter type for 'addr', expected: object" },
		{ "{\"driver\":\"null-co\",\"addr\":{\"type\":\"fd\",\"str\":\"3\",\"path\":\"x\"}}",
		  "Parameter 'addr.path' is unexpected" },
		{ "{\"driver\":\"null-co\",\"enable\":[\"foo\"]}",
		  "Parameter 'null' does not accept value 'foo'" },
		{ "{\"driver\":\"null-co\",\"enable\":[1]}",
		  "Invalid parameter type for 'enable[0]', expected: string" },
		{ "{\"driver\":\"null-co\",\"enable\":\"oob\"}",
		  "Invalid parameter type for 'enable', expected: array" },
		{ "{\"driver\":\"null-co\",\"enable\":null}",
		  "Invalid parameter type for 'enable', expected: array" },
		{ "{\"driver\":\"null-co\",\"ratio\":\"x\"}", "Invalid parameter type for 'ratio', expected: number" },
		{ "{\"driver\":\"raw\",\"file\":5}", "Invalid parameter type for 'file', expected: BlockdevRef" },
		{ "{\"driver\":\"raw\",\"file\":{\"driver\":\"file\"}}", "Parameter 'file.filename' is missing" },
		{ "{\"driver\":\"raw\",\"file\":{\"driver\":\"null-co\",\"cache\":{\"x\":1}}}",
		  "Parameter 'file.cache.x' is unexpected" },
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++)
		check_qmp(cases[i].in, cases[i].msg);
}

static void test_qmp_valid(void **state)
{
	json_t *v = json_loads("{\"driver\":\"raw\",\"file\":\"node0\",\"ratio\":2,\"any\":[1,{}],"
			       "\"latency-ns\":-1,\"enable\":[]}",
			       0, NULL);
	char err[256];

	(void)state;
	/* latency-ns is not raw's: a member of another branch is unexpected. */
	assert_int_equal(qapi_validate(&opts, v, false, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "Parameter 'latency-ns' is unexpected");
	json_object_del(v, "latency-ns");
	assert_int_equal(qapi_validate(&opts, v, false, err, sizeof(err)), 0);
	/* The default is filled in; what was given is left as it was. */
	assert_false(qapi_get_bool(v, "read-only", true));
	assert_true(qapi_has(v, "read-only"));
	assert_string_equal(qapi_get_str(v, "file"), "node0");
	assert_false(qapi_has(v, "cache"));
	json_decref(v);
	/* An unsigned member takes a negative number modulo 2^64, as QEMU does. */
	v = json_loads("{\"driver\":\"null-co\",\"latency-ns\":-1}", 0, NULL);
	assert_int_equal(qapi_validate(&opts, v, false, err, sizeof(err)), 0);
	assert_true(qapi_get_uint(v, "latency-ns", 0) == UINT64_MAX);
	assert_int_equal(qapi_get_enum(v, "driver", &driver, -1), 1);
	json_decref(v);
}

static void test_keyval_errors(void **state)
{
	static const struct {
		const char *in, *msg;
	} cases[] = {
		{ "", "Parameter 'driver' is missing" },
		{ "null-co,size=1M", "Parameter 'size' expects integer" },
		{ "null-co,size=1.5", "Parameter 'size' expects integer" },
		{ "null-co,read-only=1", "Parameter 'read-only' expects 'on' or 'off'" },
		{ "null-co,read-only=On", "Parameter 'read-only' expects 'on' or 'off'" },
		{ "null-co,read-only=", "Parameter 'read-only' expects 'on' or 'off'" },
		{ "null-co,latency-ns=abc", "Parameter 'latency-ns' expects integer" },
		{ "null-co,latency-ns=1k", "Parameter 'latency-ns' expects integer" },
		{ "null-co,detect-zeroes=bogus", "Parameter 'detect-zeroes' does not accept value 'bogus'" },
		{ "null-co,cache.direct=on,cache=x", "Parameters 'cache.*' used inconsistently" },
		{ "null-co,cache.bogus=on", "Parameter 'cache.bogus' is unexpected" },
		{ "null-co,cache.0=on", "Invalid parameter type for 'cache', expected: object" },
		{ "null-co,node-name.a=x", "Parameters 'node-name.*' are unexpected" },
		{ "null-co,x.y=1", "Parameter 'x' is unexpected" },
		{ "null-co,logical-block-size=1x", "Parameter 'logical-block-size' expects size" },
		{ "null-co,logical-block-size=-1", "Parameter 'logical-block-size' expects size" },
		{ "null-co,logical-block-size=1.5", "Parameter 'logical-block-size' expects size" },
		{ "null-co,logical-block-size=16E", "Parameter 'logical-block-size' expects size" },
		{ "null-co,logical-block-size=4kB", "Parameter 'logical-block-size' expects size" },
		{ "null-co,logical-block-size=", "Parameter 'logical-block-size' expects size" },
		{ "null-co,num-queues=-1", "Parameter 'num-queues' expects uint16_t" },
		{ "null-co,num-queues=65536", "Parameter 'num-queues' expects uint16_t" },
		{ "null-co,num-queues=", "Parameter 'num-queues' expects integer" },
		{ "null-co,num-queues=1 ", "Parameter 'num-queues' expects integer" },
		{ "null-co,addr.type=unix", "Parameter 'addr.path' is missing" },
		{ "null-co,addr.type=bogus", "Parameter 'type' does not accept value 'bogus'" },
		{ "null-co,iothreads=a", "Invalid parameter type for 'iothreads', expected: array" },
		{ "null-co,enable.0=foo", "Parameter 'null' does not accept value 'foo'" },
		{ "null-co,nums.0=1,nums.1=x", "Parameter 'nums.1' expects integer" },
		{ "null-co,ratio=x", "Invalid parameter type for 'ratio', expected: number" },
		{ "null-co,ratio=inf", "Invalid parameter type for 'ratio', expected: number" },
		{ "raw,file.driver=file", "Parameter 'file.filename' is missing" },
		{ "bogus", "Parameter 'driver' does not accept value 'bogus'" },
		{ "file", "Parameter 'filename' is missing" },
		{ "null-co,node-name=a,a", "Expected '=' after parameter 'a'" },
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++)
		check_keyval(cases[i].in, cases[i].msg);
}

static void test_keyval_typed(void **state)
{
	json_t *v;

	(void)state;
	v = keyval_checked("null-co,read-only=yes,latency-ns=0x10,num-queues= 1,"
			   "logical-block-size=4k,nums.0=-5,nums.1=010,ratio=2.5,size=+7,"
			   "iothreads.1=b,iothreads.0=a,any=str",
			   "");
	assert_true(qapi_get_bool(v, "read-only", false));
	assert_int_equal(qapi_get_uint(v, "latency-ns", 0), 16);
	assert_int_equal(qapi_get_uint(v, "num-queues", 0), 1);
	assert_int_equal(qapi_get_uint(v, "logical-block-size", 0), 4096);
	assert_int_equal(json_integer_value(json_array_get(qapi_get(v, "nums"), 0)), -5);
	assert_int_equal(json_integer_value(json_array_get(qapi_get(v, "nums"), 1)), 8);
	assert_true(qapi_get_number(v, "ratio", 0) == 2.5);
	assert_int_equal(qapi_get_int(v, "size", 0), 7);
	assert_string_equal(json_string_value(json_array_get(qapi_get(v, "iothreads"), 1)), "b");
	assert_string_equal(qapi_get_str(v, "any"), "str"); /* 'any' stays a string */
	json_decref(v);
	/* uint64 wraps a leading '-' in keyval too (QEMU's qemu_strtou64). */
	v = keyval_checked("null-co,latency-ns=-1", "");
	assert_true(qapi_get_uint(v, "latency-ns", 0) == UINT64_MAX);
	json_decref(v);
	/* An alternate picks the string branch for a plain value, the object one
	 * for dotted keys. */
	v = keyval_checked("raw,file=node0", "");
	assert_string_equal(qapi_get_str(v, "file"), "node0");
	json_decref(v);
	v = keyval_checked("raw,file.driver=null-co,file.read-only=on", "");
	assert_true(qapi_get_bool(qapi_get(v, "file"), "read-only", false));
	json_decref(v);
	/* The JSON form is checked with QMP's rules. */
	check_keyval("{\"driver\":\"null-co\",\"read-only\":\"on\"}",
		     "Invalid parameter type for 'read-only', expected: boolean");
}

static void test_sizes(void **state)
{
	static const struct {
		const char *in;
		int ret;
		uint64_t val;
	} cases[] = {
		{ "0", 0, 0 },
		{ "4096", 0, 4096 },
		{ "4096.0", 0, 4096 },
		{ "4k", 0, 4096 },
		{ "4K", 0, 4096 },
		{ "0.5k", 0, 512 },
		{ "1.5k", 0, 1536 },
		{ "2.5M", 0, 5ull << 19 },
		{ "1E", 0, 1ull << 60 },
		{ "4b", 0, 4 },
		{ "0b", 0, 0 },
		{ "5.", 0, 5 },
		{ " 4k", 0, 4096 },
		{ "+4k", 0, 4096 },
		{ "010", 0, 10 },
		{ "0x1000", 0, 4096 },
		{ "0x1000k", 0, 4ull << 20 },
		{ "18446744073709551615", 0, UINT64_MAX },
		{ "15.99E", 0, 18435214858663483136ull },
		{ "1.5", -EINVAL, 0 },
		{ "0x1.8k", -EINVAL, 0 },
		{ "4kB", -EINVAL, 0 },
		{ "4KiB", -EINVAL, 0 },
		{ "4k ", -EINVAL, 0 },
		{ "4 k", -EINVAL, 0 },
		{ "1e3", -EINVAL, 0 },
		{ "1.5e3k", -EINVAL, 0 },
		{ ".5k", -EINVAL, 0 },
		{ "0x", -EINVAL, 0 },
		{ "", -EINVAL, 0 },
		{ "-1", -EINVAL, 0 },
		{ "16E", -ERANGE, 0 },
		{ "18446744073709551616", -ERANGE, 0 },
	};
	uint64_t v;
	size_t i;
	int ret;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		v = 0;
		ret = qapi_parse_size(cases[i].in, &v);
		if (ret != cases[i].ret || (!ret && v != cases[i].val))
			fail_msg("'%s': got %d %llu, want %d %llu", cases[i].in, ret,
				 (unsigned long long)v, cases[i].ret,
				 (unsigned long long)cases[i].val);
	}
}

static void test_scalars(void **state)
{
	static const char *const on[] = { "on", "yes", "true", "y" };
	static const char *const off[] = { "off", "no", "false", "n" };
	static const char *const bad[] = { "On", "1", "0", "", "YES", "t" };
	uint64_t u;
	int64_t i;
	bool b;
	size_t k;

	(void)state;
	for (k = 0; k < 4; k++) {
		assert_int_equal(qapi_parse_bool(on[k], &b), 0);
		assert_true(b);
		assert_int_equal(qapi_parse_bool(off[k], &b), 0);
		assert_false(b);
	}
	for (k = 0; k < ARRAY_SIZE(bad); k++)
		assert_int_equal(qapi_parse_bool(bad[k], &b), -EINVAL);
	assert_int_equal(qapi_parse_int("-0x10", &i), 0);
	assert_int_equal(i, -16);
	assert_int_equal(qapi_parse_int("9223372036854775808", &i), -ERANGE);
	assert_int_equal(qapi_parse_int("1x", &i), -EINVAL);
	assert_int_equal(qapi_parse_uint("18446744073709551615", &u), 0);
	assert_true(u == UINT64_MAX);
	assert_int_equal(qapi_parse_uint("18446744073709551616", &u), -ERANGE);
	assert_int_equal(qapi_parse_uint("-2", &u), 0);
	assert_true(u == UINT64_MAX - 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_qmp_errors),    cmocka_unit_test(test_qmp_valid),
		cmocka_unit_test(test_keyval_errors), cmocka_unit_test(test_keyval_typed),
		cmocka_unit_test(test_sizes),	      cmocka_unit_test(test_scalars),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
