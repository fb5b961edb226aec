/* Unit tests for libraries loaded when first needed (util/dynlib.h) and the
 * secret table (util/secret.h): entry points filled from a real library,
 * the message for a missing library or symbol (kept for later callers), and
 * base64 in both directions. Threading: the test thread. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <cmocka.h>

#include "util/dynlib.h"
#include "util/secret.h"

static struct {
	__typeof__(zlibVersion) *zlibVersion;
	__typeof__(crc32) *crc32;
} zt;

static void test_load(void **state)
{
	static const struct dynlib_sym syms[] = {DYNLIB_SYM(zt, zlibVersion),
						 DYNLIB_SYM(zt, crc32)};
	static const char *const so[] = {"libz.so.1", NULL};
	struct dynlib lib = {.pkg = "zlib1g", .sonames = so, .syms = syms, .nsyms = 2};
	char err[256] = "";

	(void)state;
	assert_int_equal(dynlib_load(&lib, "zlib", err, sizeof(err)), 0);
	assert_string_equal(zt.zlibVersion(), zlibVersion());
	assert_int_equal(zt.crc32(0, (const Bytef *)"abc", 3), crc32(0, (const Bytef *)"abc", 3));
	assert_int_equal(dynlib_load(&lib, "zlib", err, sizeof(err)), 0); /* once */
}

static void test_missing(void **state)
{
	static void (*fn)(void);
	static const struct dynlib_sym syms[] = {{"zlibVersion", &fn}};
	static const char *const none[] = {"libioplane-none.so.9", NULL};
	static const struct dynlib_sym nosym[] = {{"no_such_function_here", &fn}};
	static const char *const so[] = {"libz.so.1", NULL};
	struct dynlib a = {.pkg = "libnone9", .sonames = none, .syms = syms, .nsyms = 1};
	struct dynlib b = {.pkg = "zlib1g", .sonames = so, .syms = nosym, .nsyms = 1};
	char err[256] = "";

	(void)state;
	assert_int_equal(dynlib_load(&a, "none", err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "none support needs libnone9 (dlopen: "));
	assert_non_null(strstr(err, "libioplane-none.so.9"));
	memset(err, 0, sizeof(err));
	assert_int_equal(dynlib_load(&a, "none", err, sizeof(err)), -ENOENT); /* remembered */
	assert_non_null(strstr(err, "needs libnone9"));
	assert_int_equal(dynlib_load(&b, "zlib", err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "no symbol no_such_function_here"));
	assert_null(fn);
}

static void test_secret(void **state)
{
	unsigned char out[16];
	char *b64 = NULL;

	(void)state;
	assert_int_equal(secret_add("s", "hello", 5), 0);
	assert_int_equal(secret_add("s", "x", 1), -EEXIST);
	assert_true(secret_exists("s"));
	assert_int_equal(secret_get_base64("s", &b64), 0);
	assert_string_equal(b64, "aGVsbG8=");
	free(b64);
	assert_int_equal(secret_get_base64("none", &b64), -ENOENT);
	assert_int_equal(secret_base64_decode("aGVsbG8=", 8, out), 5);
	assert_memory_equal(out, "hello", 5);
	assert_int_equal(secret_base64_decode("aGk=", 4, out), 2);
	assert_int_equal(secret_base64_decode("aGVsbG8h", 8, out), 6);
	assert_int_equal(secret_base64_decode("aGVsbG8", 7, out), -EINVAL);
	assert_int_equal(secret_base64_decode("a=Vs", 4, out), -EINVAL);
	assert_int_equal(secret_base64_decode("aG=k", 4, out), -EINVAL);
	assert_int_equal(secret_base64_decode("aGVs\nG8=", 8, out), -EINVAL);
	assert_int_equal(secret_del("s"), 0);
	assert_int_equal(secret_del("s"), -ENOENT);
	secret_free_all();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_load),
		cmocka_unit_test(test_missing),
		cmocka_unit_test(test_secret),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
