/* Unit tests for src/util/opts.c: key=value lists and the number, size and
 * bool parsers. Threading: single-threaded. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "util/compiler.h"
#include "util/opts.h"

static void test_parse_basic(void **state)
{
	struct kv_opts o = { 0 };

	(void)state;
	assert_int_equal(kv_parse(&o, "file=a.img,cache=none,read-only=on", NULL), 0);
	assert_int_equal(o.n, 3);
	assert_string_equal(o.v[0].key, "file");
	assert_string_equal(o.v[0].val, "a.img");
	assert_string_equal(o.v[1].key, "cache");
	assert_string_equal(o.v[1].val, "none");
	assert_string_equal(o.v[2].key, "read-only");
	assert_string_equal(o.v[2].val, "on");
	assert_false(o.v[0].used || o.v[1].used || o.v[2].used);
	kv_free(&o);
	assert_int_equal(o.n, 0);
	assert_null(o.v);
}

static void test_parse_values(void **state)
{
	struct kv_opts o = { 0 };

	(void)state;
	/* Empty values, '=' inside a value, and a value that is only a comma. */
	assert_int_equal(kv_parse(&o, "a=,b=x=y,c=,,,d==", NULL), 0);
	assert_int_equal(o.n, 4);
	assert_string_equal(kv_get(&o, "a"), "");
	assert_string_equal(kv_get(&o, "b"), "x=y");
	assert_string_equal(kv_get(&o, "c"), ",");
	assert_string_equal(kv_get(&o, "d"), "=");
	kv_free(&o);
}

static void test_parse_escapes(void **state)
{
	static const struct {
		const char *in, *val;
	} cases[] = {
		{ "k=a,,b", "a,b" },	  { "k=,,", "," },	  { "k=,,,,", ",," },
		{ "k=a,,", "a," },	  { "k=,,a", ",a" },	  { "k=a,,,,b", "a,,b" },
		{ "k=a,,b,,c", "a,b,c" }, { "k=x,,y=z", "x,y=z" },
	};
	struct kv_opts o = { 0 };
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		assert_int_equal(kv_parse(&o, cases[i].in, NULL), 0);
		assert_int_equal(o.n, 1);
		assert_string_equal(o.v[0].key, "k");
		assert_string_equal(o.v[0].val, cases[i].val);
		kv_free(&o);
	}
	/* An escaped comma followed by a real separator. */
	assert_int_equal(kv_parse(&o, "a=1,,,b=2", NULL), 0);
	assert_int_equal(o.n, 2);
	assert_string_equal(kv_get(&o, "a"), "1,");
	assert_string_equal(kv_get(&o, "b"), "2");
	kv_free(&o);
}

static void test_parse_implied(void **state)
{
	struct kv_opts o = { 0 };

	(void)state;
	assert_int_equal(kv_parse(&o, "disk.img,cache=none", "file"), 0);
	assert_int_equal(o.n, 2);
	assert_string_equal(o.v[0].key, "file");
	assert_string_equal(kv_get(&o, "file"), "disk.img");
	assert_string_equal(kv_get(&o, "cache"), "none");
	kv_free(&o);

	/* ",," before any '=' keeps the element implied. */
	assert_int_equal(kv_parse(&o, "a,,b=c,x=1", "file"), 0);
	assert_int_equal(o.n, 2);
	assert_string_equal(kv_get(&o, "file"), "a,b=c");
	kv_free(&o);

	assert_int_equal(kv_parse(&o, ",,lead", "file"), 0);
	assert_string_equal(kv_get(&o, "file"), ",lead");
	kv_free(&o);

	/* An implied key does not stop explicit keys in the first place. */
	assert_int_equal(kv_parse(&o, "size=1G", "file"), 0);
	assert_null(kv_get(&o, "file"));
	assert_string_equal(kv_get(&o, "size"), "1G");
	kv_free(&o);

	/* Only the first element may be implied, and only with a key. */
	assert_int_equal(kv_parse(&o, "disk.img", NULL), -EINVAL);
	assert_int_equal(kv_parse(&o, "cache=none,disk.img", "file"), -EINVAL);
	assert_int_equal(kv_parse(&o, "a.img,b.img", "file"), -EINVAL);
	/* Implied and explicit spelling of the same key collide. */
	assert_int_equal(kv_parse(&o, "a.img,file=b.img", "file"), -EINVAL);
	assert_int_equal(o.n, 0);
	kv_free(&o);
}

static void test_parse_errors(void **state)
{
	static const char *const bad[] = {
		"=1",	    "a=1,=2",  ",a=1", "a=1,",	  "a=1,,,", "a=1,,,,,", ",",
		"a=1,,,,,b", "a=1,a=2", "x",   "a=1,b",	  "a",	    "a,b=1",
	};
	struct kv_opts o = { 0 };
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		if (kv_parse(&o, bad[i], NULL) != -EINVAL)
			fail_msg("kv_parse(\"%s\") did not fail with -EINVAL", bad[i]);
		assert_int_equal(o.n, 0);
	}
	assert_int_equal(kv_parse(&o, NULL, NULL), -EINVAL);
	/* Empty element at the start, even with an implied key. */
	assert_int_equal(kv_parse(&o, ",a=1", "file"), -EINVAL);
	assert_int_equal(kv_parse(&o, "", "file"), 0);
	assert_int_equal(o.n, 0);
	kv_free(&o);
}

static void test_parse_appends_and_rolls_back(void **state)
{
	struct kv_opts o = { 0 };

	(void)state;
	assert_int_equal(kv_parse(&o, "a=1", NULL), 0);
	assert_int_equal(kv_parse(&o, "b=2,c=3", NULL), 0);
	assert_int_equal(o.n, 3);
	/* A later duplicate of an existing key fails and adds nothing. */
	assert_int_equal(kv_parse(&o, "d=4,a=5", NULL), -EINVAL);
	assert_int_equal(o.n, 3);
	assert_null(kv_get(&o, "d"));
	assert_string_equal(kv_get(&o, "a"), "1");
	/* A syntax error late in the string also undoes the earlier elements. */
	assert_int_equal(kv_parse(&o, "e=5,f=6,", NULL), -EINVAL);
	assert_int_equal(o.n, 3);
	kv_free(&o);
}

static void test_parse_many(void **state)
{
	struct kv_opts o = { 0 };
	char s[4096], key[16];
	size_t len = 0;
	int i;

	(void)state;
	for (i = 0; i < 100; i++)
		len += (size_t)snprintf(s + len, sizeof(s) - len, "%sk%d=%d", i ? "," : "", i,
					i * 7);
	assert_int_equal(kv_parse(&o, s, NULL), 0);
	assert_int_equal(o.n, 100);
	for (i = 0; i < 100; i++) {
		uint64_t v = 0;

		snprintf(key, sizeof(key), "k%d", i);
		assert_int_equal(kv_get_u64(&o, key, &v), 0);
		assert_int_equal(v, (uint64_t)i * 7);
	}
	assert_null(kv_first_unused(&o));
	kv_free(&o);
}

static void test_set(void **state)
{
	struct kv_opts o = { 0 };

	(void)state;
	assert_int_equal(kv_set(&o, "a", "1"), 0);
	assert_int_equal(kv_set(&o, "b", "x,y"), 0);
	assert_int_equal(o.n, 2);
	assert_string_equal(kv_get(&o, "a"), "1");
	assert_true(o.v[0].used);
	/* Replacing keeps one entry and makes it unconsumed again. */
	assert_int_equal(kv_set(&o, "a", "2"), 0);
	assert_int_equal(o.n, 2);
	assert_false(o.v[0].used);
	assert_string_equal(kv_get(&o, "a"), "2");
	assert_int_equal(kv_set(&o, "", "v"), -EINVAL);
	assert_int_equal(kv_set(&o, NULL, "v"), -EINVAL);
	assert_int_equal(kv_set(&o, "c", NULL), -EINVAL);
	assert_int_equal(o.n, 2);
	/* kv_set after kv_parse: the parsed value is replaced. */
	assert_int_equal(kv_parse(&o, "c=3", NULL), 0);
	assert_int_equal(kv_set(&o, "c", "4"), 0);
	assert_string_equal(kv_get(&o, "c"), "4");
	assert_int_equal(o.n, 3);
	kv_free(&o);
	/* The list is reusable after kv_free. */
	assert_int_equal(kv_set(&o, "z", "0"), 0);
	assert_int_equal(o.n, 1);
	kv_free(&o);
}

static void test_used_tracking(void **state)
{
	struct kv_opts o = { 0 };
	bool b = false;
	uint64_t v = 0;

	(void)state;
	assert_int_equal(kv_parse(&o, "a=1,b=on,c=4K,d=x", NULL), 0);
	assert_string_equal(kv_first_unused(&o), "a");
	assert_null(kv_get(&o, "zz"));
	assert_string_equal(kv_first_unused(&o), "a");
	assert_int_equal(kv_get_u64(&o, "a", &v), 0);
	assert_int_equal(v, 1);
	assert_string_equal(kv_first_unused(&o), "b");
	assert_int_equal(kv_get_bool(&o, "b", &b), 0);
	assert_true(b);
	assert_int_equal(kv_get_size(&o, "c", &v), 0);
	assert_int_equal(v, 4096);
	assert_string_equal(kv_first_unused(&o), "d");
	/* A malformed value counts as consumed: its error is reported already. */
	assert_int_equal(kv_get_bool(&o, "d", &b), -EINVAL);
	assert_null(kv_first_unused(&o));
	kv_free(&o);
	assert_null(kv_first_unused(&o));
}

static void test_typed_getters(void **state)
{
	struct kv_opts o = { 0 };
	uint64_t v = 42;
	bool b = true;

	(void)state;
	/* Absent keys leave the default alone. */
	assert_int_equal(kv_get_u64(&o, "n", &v), 0);
	assert_int_equal(kv_get_size(&o, "n", &v), 0);
	assert_int_equal(v, 42);
	assert_int_equal(kv_get_bool(&o, "n", &b), 0);
	assert_true(b);

	assert_int_equal(kv_parse(&o, "n=4K,s=x,b=maybe,z=off,h=0x10", NULL), 0);
	assert_int_equal(kv_get_u64(&o, "n", &v), -EINVAL); /* not a plain number */
	assert_int_equal(v, 42);
	assert_int_equal(kv_get_size(&o, "n", &v), 0);
	assert_int_equal(v, 4096);
	v = 42;
	assert_int_equal(kv_get_size(&o, "s", &v), -EINVAL);
	assert_int_equal(v, 42);
	assert_int_equal(kv_get_bool(&o, "b", &b), -EINVAL);
	assert_true(b);
	assert_int_equal(kv_get_bool(&o, "z", &b), 0);
	assert_false(b);
	assert_int_equal(kv_get_u64(&o, "h", &v), 0);
	assert_int_equal(v, 16);
	kv_free(&o);
}

static void test_parse_u64(void **state)
{
	static const struct {
		const char *s;
		int ret;
		uint64_t v;
	} cases[] = {
		{ "0", 0, 0 },
		{ "1", 0, 1 },
		{ "00012", 0, 12 }, /* decimal, not octal */
		{ "18446744073709551615", 0, UINT64_MAX },
		{ "0xffffffffffffffff", 0, UINT64_MAX },
		{ "0X1F", 0, 31 },
		{ "0x0", 0, 0 },
		{ "18446744073709551616", -ERANGE, 0 },
		{ "99999999999999999999999", -ERANGE, 0 },
		{ "0x10000000000000000", -ERANGE, 0 },
		{ "", -EINVAL, 0 },
		{ "-1", -EINVAL, 0 },
		{ "+1", -EINVAL, 0 },
		{ " 1", -EINVAL, 0 },
		{ "1 ", -EINVAL, 0 },
		{ "1a", -EINVAL, 0 },
		{ "0x", -EINVAL, 0 },
		{ "0xg", -EINVAL, 0 },
		{ "x1", -EINVAL, 0 },
		{ "1K", -EINVAL, 0 },
		{ "1.0", -EINVAL, 0 },
		{ "ff", -EINVAL, 0 },
	};
	size_t i;
	uint64_t v;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		v = 12345;
		if (parse_u64(cases[i].s, &v) != cases[i].ret)
			fail_msg("parse_u64(\"%s\") != %d", cases[i].s, cases[i].ret);
		assert_int_equal(v, cases[i].ret ? 12345 : cases[i].v);
	}
	assert_int_equal(parse_u64(NULL, &v), -EINVAL);
}

static void test_parse_size(void **state)
{
	static const struct {
		const char *s;
		int ret;
		uint64_t v;
	} cases[] = {
		{ "0", 0, 0 },
		{ "512", 0, 512 },
		{ "512B", 0, 512 },
		{ "512b", 0, 512 },
		{ "64K", 0, 64 << 10 },
		{ "64k", 0, 64 << 10 },
		{ "64KB", 0, 64 << 10 },
		{ "64KiB", 0, 64 << 10 },
		{ "64kib", 0, 64 << 10 },
		{ "64kIb", 0, 64 << 10 },
		{ "1M", 0, 1 << 20 },
		{ "1MiB", 0, 1 << 20 },
		{ "1G", 0, 1ull << 30 },
		{ "3g", 0, 3ull << 30 },
		{ "1T", 0, 1ull << 40 },
		{ "1P", 0, 1ull << 50 },
		{ "1E", 0, 1ull << 60 },
		{ "15E", 0, 15ull << 60 },
		{ "0K", 0, 0 },
		{ "1.5K", 0, 1536 },
		{ "1.5G", 0, 3ull << 29 },
		{ "1.25K", 0, 1280 },
		{ "0.5M", 0, 512 << 10 },
		{ "2.0", 0, 2 },
		{ "1.000K", 0, 1024 },
		{ "18446744073709551615", 0, UINT64_MAX },
		{ "16777215T", 0, 16777215ull << 40 },
		{ "16E", -ERANGE, 0 },
		{ "16777216T", -ERANGE, 0 },
		{ "18446744073709551616", -ERANGE, 0 },
		{ "99999999999999999999K", -ERANGE, 0 },
		{ "17179869184G", -ERANGE, 0 },
		{ "15.9999999999999999999E", -EINVAL, 0 }, /* not whole bytes */
		{ "1.00000000000000000000K", -EINVAL, 0 }, /* 20 fraction digits */
		{ "0.1K", -EINVAL, 0 }, /* 102.4 bytes */
		{ "1.5", -EINVAL, 0 },
		{ "1.", -EINVAL, 0 },
		{ "1.K", -EINVAL, 0 },
		{ ".5K", -EINVAL, 0 },
		{ "", -EINVAL, 0 },
		{ "K", -EINVAL, 0 },
		{ "-1", -EINVAL, 0 },
		{ "-1K", -EINVAL, 0 },
		{ "+1K", -EINVAL, 0 },
		{ " 1K", -EINVAL, 0 },
		{ "1 K", -EINVAL, 0 },
		{ "1K ", -EINVAL, 0 },
		{ "1X", -EINVAL, 0 },
		{ "1KK", -EINVAL, 0 },
		{ "1KBB", -EINVAL, 0 },
		{ "1Ki", -EINVAL, 0 },
		{ "1iB", -EINVAL, 0 },
		{ "1BK", -EINVAL, 0 },
		{ "0x10", -EINVAL, 0 },
		{ "1e3", -EINVAL, 0 },
		{ "1,5K", -EINVAL, 0 },
	};
	size_t i;
	uint64_t v;
	int ret;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		v = 12345;
		ret = parse_size(cases[i].s, &v);
		if (ret != cases[i].ret)
			fail_msg("parse_size(\"%s\") = %d, want %d", cases[i].s, ret, cases[i].ret);
		if (v != (cases[i].ret ? 12345 : cases[i].v))
			fail_msg("parse_size(\"%s\") gave %llu", cases[i].s, (unsigned long long)v);
	}
	assert_int_equal(parse_size(NULL, &v), -EINVAL);
}

static void test_parse_bool(void **state)
{
	static const char *const yes[] = { "on", "yes", "true", "1", "ON", "Yes", "TRUE" };
	static const char *const no[] = { "off", "no", "false", "0", "OFF", "No", "False" };
	static const char *const bad[] = { "", "2", "onn", "o", "y", "n", "enable", " on",
					   "on ", "10", "00", "-1" };
	size_t i;
	bool b;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(yes); i++) {
		b = false;
		assert_int_equal(parse_bool(yes[i], &b), 0);
		assert_true(b);
	}
	for (i = 0; i < ARRAY_SIZE(no); i++) {
		b = true;
		assert_int_equal(parse_bool(no[i], &b), 0);
		assert_false(b);
	}
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		b = true;
		if (parse_bool(bad[i], &b) != -EINVAL)
			fail_msg("parse_bool(\"%s\") accepted", bad[i]);
		assert_true(b);
	}
	assert_int_equal(parse_bool(NULL, &b), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_basic),
		cmocka_unit_test(test_parse_values),
		cmocka_unit_test(test_parse_escapes),
		cmocka_unit_test(test_parse_implied),
		cmocka_unit_test(test_parse_errors),
		cmocka_unit_test(test_parse_appends_and_rolls_back),
		cmocka_unit_test(test_parse_many),
		cmocka_unit_test(test_set),
		cmocka_unit_test(test_used_tracking),
		cmocka_unit_test(test_typed_getters),
		cmocka_unit_test(test_parse_u64),
		cmocka_unit_test(test_parse_size),
		cmocka_unit_test(test_parse_bool),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
