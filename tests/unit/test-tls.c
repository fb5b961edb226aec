/* Unit tests for the TLS objects (util/tls.h): authz-simple and authz-list
 * decisions, ids shared by every kind, references that outlive a delete,
 * and a replacement under the same id. Threading: the test thread. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "util/tls.h"

static void test_authz_simple(void **state)
{
	char err[256];
	struct tls_authz *a;

	(void)state;
	assert_int_equal(tls_authz_add_simple("s", "CN=a,O=x", err, sizeof(err)), 0);
	a = tls_authz_get("s");
	assert_non_null(a);
	assert_true(tls_authz_check(a, "CN=a,O=x"));
	assert_false(tls_authz_check(a, "CN=a,O=xy"));
	assert_false(tls_authz_check(a, "CN=*"));
	assert_false(tls_authz_check(a, ""));
	tls_authz_put(a);
	assert_int_equal(tls_object_del("s"), 0);
	assert_null(tls_authz_get("s"));
}

/* The first rule that matches decides; none: the policy. */
static void test_authz_list(void **state)
{
	struct tls_authz_rule r[] = {
		{.match = "CN=bad*", .allow = false, .glob = true},
		{.match = "CN=*,O=ours", .allow = true, .glob = true},
		{.match = "alice", .allow = true, .glob = false},
	};
	char err[256];
	struct tls_authz *a;

	(void)state;
	assert_int_equal(tls_authz_add_list("l", false, r, 3, err, sizeof(err)), 0);
	a = tls_authz_get("l");
	assert_true(tls_authz_check(a, "CN=good,O=ours"));
	assert_false(tls_authz_check(a, "CN=badguy,O=ours"));
	assert_false(tls_authz_check(a, "CN=good,O=theirs"));
	assert_true(tls_authz_check(a, "alice"));
	assert_false(tls_authz_check(a, "alic*"));
	tls_authz_put(a);
	tls_object_del("l");
	assert_int_equal(tls_authz_add_list("allow", true, r, 1, err, sizeof(err)), 0);
	a = tls_authz_get("allow");
	assert_true(tls_authz_check(a, "anyone"));
	assert_false(tls_authz_check(a, "CN=bad"));
	tls_authz_put(a);
	tls_object_del("allow");
}

/* One id space for every kind, as QEMU's object tree has. */
static void test_ids(void **state)
{
	struct tls_creds_config cfg = {.id = "x", .dir = "/nonexistent", .server = false};
	char err[256];

	(void)state;
	assert_int_equal(tls_authz_add_simple("x", "a", err, sizeof(err)), 0);
	assert_int_equal(tls_creds_add(&cfg, err, sizeof(err)), -EEXIST);
	assert_string_equal(err,
			    "attempt to add duplicate property 'x' to object (type 'container')");
	assert_true(tls_object_exists("x"));
	assert_int_equal(tls_object_del("x"), 0);
	assert_false(tls_object_exists("x"));
	assert_int_equal(tls_object_del("x"), -ENOENT);
}

/* A server's files must be there, with QEMU's message. */
static void test_missing_files(void **state)
{
	struct tls_creds_config cfg = {.id = "m", .dir = "/nonexistent", .server = true};
	char err[256];

	(void)state;
	assert_int_equal(tls_creds_add(&cfg, err, sizeof(err)), -ENOENT);
	assert_string_equal(err, "Unable to access credentials /nonexistent/ca-cert.pem: No such "
				 "file or directory");
	cfg.psk = true;
	assert_int_equal(tls_creds_add(&cfg, err, sizeof(err)), -ENOENT);
	assert_string_equal(err, "Unable to access credentials /nonexistent/keys.psk: No such "
				 "file or directory");
	assert_false(tls_object_exists("m"));
}

/* A user keeps the object it holds after a delete; a new one under the
 * same id is what the next lookup finds. */
static void test_replace(void **state)
{
	struct tls_creds_config cfg = {.id = "c", .dir = "/a", .server = false};
	struct tls_creds *old, *new;
	char err[256];

	(void)state;
	assert_int_equal(tls_creds_add(&cfg, err, sizeof(err)), 0);
	old = tls_creds_get("c");
	assert_non_null(old);
	assert_int_equal(tls_object_del("c"), 0);
	assert_null(tls_creds_get("c"));
	cfg.server = false;
	assert_int_equal(tls_creds_add(&cfg, err, sizeof(err)), 0);
	new = tls_creds_get("c");
	assert_non_null(new);
	assert_ptr_not_equal(old, new);
	assert_false(tls_creds_is_server(old)); /* still readable: held */
	tls_creds_put(old);
	tls_creds_put(new);
	tls_objects_free();
	assert_false(tls_object_exists("c"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_authz_simple), cmocka_unit_test(test_authz_list),
		cmocka_unit_test(test_ids),          cmocka_unit_test(test_missing_files),
		cmocka_unit_test(test_replace),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
