/* Unit tests for the file name helpers (util/path.h): how a backing file
 * name is taken relative to its image. Threading: the test thread. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "util/path.h"

static void expect_relative(const char *base, const char *name, const char *want)
{
	char *p = path_relative(base, name);

	assert_non_null(p);
	assert_string_equal(p, want);
	free(p);
}

static void test_relative(void **state)
{
	(void)state;
	expect_relative("/var/lib/img/top.qcow2", "base.raw", "/var/lib/img/base.raw");
	expect_relative("img/top.qcow2", "sub/base.raw", "img/sub/base.raw");
	expect_relative("/top.qcow2", "base.raw", "/base.raw");
	expect_relative("dir/", "base.raw", "dir/base.raw");
}

/* An absolute name, or an image without a directory part, stays as it is. */
static void test_unchanged(void **state)
{
	(void)state;
	expect_relative("/var/lib/img/top.qcow2", "/srv/base.raw", "/srv/base.raw");
	expect_relative("top.qcow2", "base.raw", "base.raw");
	expect_relative(NULL, "base.raw", "base.raw");
	expect_relative("/var/lib/img/top.qcow2", "", "/var/lib/img/");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_relative),
		cmocka_unit_test(test_unchanged),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
