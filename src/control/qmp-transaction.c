/* QMP `transaction` (qapi/transaction.json) on the registered actions: the
 * TransactionAction union is built from the registry as actions register,
 * so that validation gives QEMU's messages and introspection lists them.
 * Every action prepares in order; the first failure aborts the prepared ones
 * in reverse order; then every prepared one is cleaned.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/graph.h"
#include "control/qmp-transaction.h"
#include "control/qmp.h"
#include "control/schema.h"

#define TXN_MAX_TYPES 32
#define TXN_MAX_ACTIONS 256

static const struct qmp_txn_ops *txn_ops[TXN_MAX_TYPES];
static unsigned txn_ntypes;

/* The union, filled in as actions register (the tables stay NULL-ended). */
static const char *txn_kind_values[TXN_MAX_TYPES + 1];
static struct qapi_member txn_wrap_members[TXN_MAX_TYPES][2];
static struct qapi_type txn_wraps[TXN_MAX_TYPES];
static struct qapi_variant txn_variants[TXN_MAX_TYPES + 1];
static char txn_wrap_names[TXN_MAX_TYPES][64];

static const struct qapi_type txn_kind = {
	.name = "TransactionActionKind", .kind = QAPI_ENUM, .values = txn_kind_values};
static const struct qapi_type txn_action = {.name = "TransactionAction",
					    .kind = QAPI_OBJECT,
					    .members = QAPI_MEMBERS(QAPI_REQ("type", &txn_kind)),
					    .tag = "type",
					    .variants = txn_variants};
static const struct qapi_type txn_action_list = QAPI_LIST_TYPE(&txn_action);
static const struct qapi_type txn_completion =
	QAPI_ENUM_TYPE("ActionCompletionMode", "individual", "grouped");
static const struct qapi_type txn_props = QAPI_OBJECT_TYPE(
	"TransactionProperties",
	QAPI_MEMBERS(QAPI_OPT_DEFAULT("completion-mode", &txn_completion, "\"individual\"")));
static const struct qapi_type txn_args = QAPI_OBJECT_TYPE(
	"q_obj_transaction-arg",
	QAPI_MEMBERS(QAPI_REQ("actions", &txn_action_list), QAPI_OPT("properties", &txn_props)));

static const struct qmp_txn_ops *txn_find(const char *type)
{
	for (unsigned i = 0; i < txn_ntypes; i++)
		if (!strcmp(txn_ops[i]->type, type))
			return txn_ops[i];
	return NULL;
}

int qmp_txn_register(const struct qmp_txn_ops *ops)
{
	unsigned i = txn_ntypes;

	if (txn_find(ops->type))
		return -EEXIST;
	if (i == TXN_MAX_TYPES)
		return -ENOMEM;
	/* QEMU's wrapper of a simple union branch: {"data": the arguments}. */
	snprintf(txn_wrap_names[i], sizeof(txn_wrap_names[i]), "%sWrapper", ops->type);
	txn_wrap_members[i][0] = (struct qapi_member)QAPI_REQ("data", ops->data);
	txn_wraps[i] = (struct qapi_type)QAPI_OBJECT_TYPE(txn_wrap_names[i], txn_wrap_members[i]);
	txn_variants[i] = (struct qapi_variant){.tag = ops->type, .type = &txn_wraps[i]};
	txn_kind_values[i] = ops->type;
	txn_ops[i] = ops;
	txn_ntypes++;
	return 0;
}

int qmp_txn_run_one(const struct qmp_txn_ops *ops, json_t *data, struct qmp_txn_err *err)
{
	void *state = NULL;
	int ret = ops->prepare(data, &state, err);

	if (ret)
		return ret;
	ops->commit(state);
	ops->clean(state);
	return 0;
}

struct txn_step {
	const struct qmp_txn_ops *ops;
	void *state;
};

/* Prepare each action in order; on a failure abort the prepared ones,
 * newest first. Then clean every prepared one, in order. */
static int txn_run(json_t *actions, struct qmp_txn_err *err)
{
	size_t n = json_array_size(actions), done = 0;
	struct txn_step *steps = calloc(n ? n : 1, sizeof(*steps));
	int ret = 0;

	if (!steps) {
		snprintf(err->desc, sizeof(err->desc), "out of memory");
		return -ENOMEM;
	}
	for (; done < n && !ret; done++) {
		json_t *a = json_array_get(actions, done);

		steps[done].ops = txn_find(qapi_get_str(a, "type"));
		ret = steps[done].ops->prepare(qapi_get(a, "data"), &steps[done].state, err);
		if (ret)
			break;
	}
	if (ret)
		for (size_t i = done; i-- > 0;)
			steps[i].ops->abort(steps[i].state);
	else
		for (size_t i = 0; i < done; i++)
			steps[i].ops->commit(steps[i].state);
	for (size_t i = 0; i < done; i++)
		steps[i].ops->clean(steps[i].state);
	free(steps);
	return ret;
}

static void qmp_transaction(struct qmp_req *req, json_t *args)
{
	json_t *actions = qapi_get(args, "actions"), *props = qapi_get(args, "properties");
	struct qmp_txn_err err = {.cls = QMP_ERR_GENERIC};
	struct loop *prev;
	int ret;

	/* QEMU: grouped completion is for actions that start jobs (backups);
	 * any other action refuses it, even in an otherwise empty list. */
	if (props && !strcmp(qapi_get_str(props, "completion-mode"), "grouped") &&
	    json_array_size(actions)) {
		qmp_error(req, QMP_ERR_GENERIC,
			  "Action '%s' does not support Transaction property completion-mode = "
			  "grouped",
			  qapi_get_str(json_array_get(actions, 0), "type"));
		return;
	}
	if (json_array_size(actions) > TXN_MAX_ACTIONS) {
		qmp_error(req, QMP_ERR_GENERIC, "A transaction takes at most %d actions",
			  TXN_MAX_ACTIONS);
		return;
	}
	/* Actions drain nodes and open images: from a control section, as
	 * their stand-alone commands do (blk_ctl_enter nests). */
	if (blk_ctl_enter(&prev)) {
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
		return;
	}
	ret = txn_run(actions, &err);
	blk_ctl_leave(prev);
	if (ret)
		qmp_error(req, err.cls ? err.cls : QMP_ERR_GENERIC, "%s", err.desc);
	else
		qmp_return(req, NULL);
}

static const struct qmp_command txn_cmd = {
	.name = "transaction", .args = &txn_args, .fn = qmp_transaction};

int qmp_txn_register_command(void)
{
	return qmp_register(&txn_cmd);
}
