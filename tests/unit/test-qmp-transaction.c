/* Unit tests for src/control/qmp-transaction.c: `transaction` over fake
 * actions that log what runs, through a QMP connection kept in memory;
 * validation and completion-mode errors as qemu-storage-daemon 7.2 gives
 * them. Threading: single-threaded. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "control/qmp-cmds.h"
#include "control/qmp-transaction.h"
#include "control/qmp.h"
#include "control/schema.h"

static char out_text[1 << 14];
static size_t out_len;
static char events[1024]; /* "p1 p2 a2 a1 c1 ..." */

static void fake_output(struct qmp_conn *s)
{
	size_t n = s->out_len - s->out_head;

	if (n > sizeof(out_text) - out_len - 1)
		n = sizeof(out_text) - out_len - 1;
	memcpy(out_text + out_len, s->out + s->out_head, n);
	out_len += n;
	out_text[out_len] = '\0';
	qmp_conn_wrote(s, s->out_len - s->out_head);
}

static void fake_resume(struct qmp_conn *s)
{
	(void)s;
}

static const struct qmp_conn_ops fake_ops = {.output = fake_output, .resume = fake_resume};

static void log_event(const char *what, const void *state)
{
	size_t n = strlen(events);

	snprintf(events + n, sizeof(events) - n, "%s%s%ld", n ? " " : "", what,
		 (long)(intptr_t)state);
}

/* data: {"id": N, "fail": bool}; state is N. */
static int fake_prepare(json_t *data, void **state, struct qmp_txn_err *err)
{
	long id = (long)qapi_get_int(data, "id", 0);

	if (qapi_get_bool(data, "fail", false)) {
		log_event("f", (void *)(intptr_t)id);
		snprintf(err->desc, sizeof(err->desc), "action %ld failed", id);
		err->cls = QMP_ERR_DEVICE_NOT_FOUND;
		return -ENOENT;
	}
	*state = (void *)(intptr_t)id;
	log_event("p", *state);
	return 0;
}

static void fake_commit(void *state)
{
	log_event("c", state);
}

static void fake_abort(void *state)
{
	log_event("a", state);
}

static void fake_clean(void *state)
{
	log_event("x", state);
}

static const struct qapi_type fake_data = QAPI_OBJECT_TYPE(
	"FakeAction", QAPI_MEMBERS(QAPI_REQ("id", &qapi_int), QAPI_OPT("fail", &qapi_bool)));
static const struct qmp_txn_ops fake_ops_a = {.type = "x-fake",
					      .data = &fake_data,
					      .prepare = fake_prepare,
					      .commit = fake_commit,
					      .abort = fake_abort,
					      .clean = fake_clean};
static const struct qmp_txn_ops fake_ops_b = {.type = "x-fake-b",
					      .data = &fake_data,
					      .prepare = fake_prepare,
					      .commit = fake_commit,
					      .abort = fake_abort,
					      .clean = fake_clean};

static struct qmp_conn conn;

static int setup(void **state)
{
	(void)state;
	assert_int_equal(qmp_register_builtin(), 0);
	assert_int_equal(qmp_txn_register_command(), 0);
	assert_int_equal(qmp_txn_register(&fake_ops_a), 0);
	assert_int_equal(qmp_txn_register(&fake_ops_b), 0);
	qmp_conn_init(&conn, &fake_ops, NULL, false);
	qmp_conn_input(&conn, (const uint8_t *)"{\"execute\":\"qmp_capabilities\"}", 30);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	qmp_conn_destroy(&conn);
	return 0;
}

static const char *run(const char *cmd)
{
	size_t n;

	out_len = 0;
	out_text[0] = '\0';
	events[0] = '\0';
	n = qmp_conn_input(&conn, (const uint8_t *)cmd, strlen(cmd));
	assert_int_equal(n, strlen(cmd));
	return out_text;
}

#define ACT(t, d) "{\"type\":\"" t "\",\"data\":" d "}"
#define TXN(...) "{\"execute\":\"transaction\",\"arguments\":{\"actions\":[" __VA_ARGS__ "]}}"

static void test_all_commit(void **state)
{
	(void)state;
	assert_string_equal(run(TXN(ACT("x-fake", "{\"id\":1}") "," ACT("x-fake-b", "{\"id\":2}"))),
			    "{\"return\": {}}\r\n");
	assert_string_equal(events, "p1 p2 c1 c2 x1 x2");
}

/* The third fails to prepare: the first two abort, newest first, nothing
 * commits, both are cleaned; the action's error reaches the client. */
static void test_third_fails(void **state)
{
	(void)state;
	assert_string_equal(
		run(TXN(ACT("x-fake", "{\"id\":1}") "," ACT("x-fake", "{\"id\":2}") "," ACT(
			"x-fake", "{\"id\":3,\"fail\":true}") "," ACT("x-fake", "{\"id\":4}"))),
		"{\"error\": {\"class\": \"DeviceNotFound\", \"desc\": \"action 3 "
		"failed\"}}\r\n");
	assert_string_equal(events, "p1 p2 f3 a2 a1 x1 x2");
}

static void test_validation(void **state)
{
	(void)state;
	assert_string_equal(run(TXN(ACT("x-none", "{\"id\":1}"))),
			    "{\"error\": {\"class\": \"GenericError\", \"desc\": \"Parameter "
			    "'type' does not accept value 'x-none'\"}}\r\n");
	assert_string_equal(events, "");
	assert_string_equal(run(TXN(ACT("x-fake", "{\"id\":1}") "," ACT("x-fake", "{}"))),
			    "{\"error\": {\"class\": \"GenericError\", \"desc\": \"Parameter "
			    "'actions[1].data.id' is missing\"}}\r\n");
	assert_string_equal(events, "");
	assert_string_equal(run(TXN()), "{\"return\": {}}\r\n");
}

static void test_grouped(void **state)
{
	(void)state;
	assert_string_equal(
		run("{\"execute\":\"transaction\",\"arguments\":{\"actions\":[" ACT(
			"x-fake", "{\"id\":1}") "],\"properties\":{\"completion-mode\":"
						"\"grouped\"}}}"),
		"{\"error\": {\"class\": \"GenericError\", \"desc\": \"Action 'x-fake' does not "
		"support Transaction property completion-mode = grouped\"}}\r\n");
	assert_string_equal(events, "");
	assert_string_equal(run("{\"execute\":\"transaction\",\"arguments\":{\"actions\":[" ACT(
				    "x-fake", "{\"id\":1}") "],\"properties\":{\"completion-mode\":"
							    "\"individual\"}}}"),
			    "{\"return\": {}}\r\n");
}

static void test_run_one(void **state)
{
	struct qmp_txn_err err = {0};
	json_t *ok = json_pack("{s:i}", "id", 7), *bad = json_pack("{s:i,s:b}", "id", 8, "fail", 1);

	(void)state;
	events[0] = '\0';
	assert_int_equal(qmp_txn_run_one(&fake_ops_a, ok, &err), 0);
	assert_int_equal(qmp_txn_run_one(&fake_ops_a, bad, &err), -ENOENT);
	assert_string_equal(err.desc, "action 8 failed");
	assert_string_equal(events, "p7 c7 x7 f8");
	assert_int_equal(qmp_txn_register(&fake_ops_a), -EEXIST);
	json_decref(ok);
	json_decref(bad);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_all_commit), cmocka_unit_test(test_third_fails),
		cmocka_unit_test(test_validation), cmocka_unit_test(test_grouped),
		cmocka_unit_test(test_run_one),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
