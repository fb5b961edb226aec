/* QMP `transaction`: a list of actions that all prepare, then all commit, or,
 * when one fails to prepare, all abort (QEMU's TransactionAction model). A
 * module describes each action type it offers with a struct qmp_txn_ops and
 * registers it; the same ops also serve the action's stand-alone command
 * (prepare, then commit or abort, then clean), so both behave alike.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_TRANSACTION_H
#define IOPLANE_CONTROL_QMP_TRANSACTION_H
#include <jansson.h>

struct qapi_type;

/* Why an action could not prepare: a QMP error class (QMP_ERR_*) and the
 * message the client gets. */
struct qmp_txn_err {
	const char *cls;
	char desc[256];
};

struct qmp_txn_ops {
	const char *type;             /* the action's name, e.g. "blockdev-snapshot-sync" */
	const struct qapi_type *data; /* the object type of its "data" */
	/* Check everything, do what can be undone, and keep what commit, abort
	 * and clean need in *state. May begin a drain of the nodes it touches
	 * (held until clean), so that every action of a transaction sees one
	 * point in time. 0, or -errno with err filled in. */
	int (*prepare)(json_t *data, void **state, struct qmp_txn_err *err);
	void (*commit)(void *state); /* cannot fail */
	void (*abort)(void *state);  /* undo prepare; cannot fail */
	void (*clean)(void *state);  /* after commit or abort: end drains, free state */
};

/* Offer an action type to `transaction` (kept by pointer: static storage).
 * -EEXIST if the type is taken, -ENOMEM. */
int qmp_txn_register(const struct qmp_txn_ops *ops);

/* Run one action alone, as its stand-alone command does: prepare, commit,
 * clean. 0, or -errno with err filled in (nothing changed). */
int qmp_txn_run_one(const struct qmp_txn_ops *ops, json_t *data, struct qmp_txn_err *err);

/* Add the `transaction` command (once, with the other commands). 0 or
 * -errno. */
int qmp_txn_register_command(void);

#endif
