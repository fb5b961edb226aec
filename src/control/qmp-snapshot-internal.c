/* Internal qcow2 snapshots over QMP: blockdev-snapshot-internal-sync (a
 * command and a transaction action) and
 * blockdev-snapshot-delete-internal-sync, with qemu-storage-daemon 7.2's
 * arguments, checks, messages and SnapshotInfo reply. The node is drained
 * while its snapshot is made (exports keep their connections; the requests
 * held meanwhile run once it is done); in a transaction the drain lasts
 * until every action is prepared, and abort deletes the snapshot again.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "block/graph.h"
#include "block/qcow2/qcow2.h"
#include "control/qmp-snapshot.h"
#include "control/qmp-transaction.h"
#include "control/qmp.h"
#include "control/schema.h"

static const struct qapi_type isnap_args =
	QAPI_OBJECT_TYPE("BlockdevSnapshotInternal",
			 QAPI_MEMBERS(QAPI_REQ("device", &qapi_str), QAPI_REQ("name", &qapi_str)));
static const struct qapi_type isnap_del_args =
	QAPI_OBJECT_TYPE("blockdev-snapshot-delete-internal-sync-arg",
			 QAPI_MEMBERS(QAPI_REQ("device", &qapi_str), QAPI_OPT("id", &qapi_str),
				      QAPI_OPT("name", &qapi_str)));

static const struct qapi_type snapshot_info = QAPI_OBJECT_TYPE(
	"SnapshotInfo",
	QAPI_MEMBERS(QAPI_REQ("id", &qapi_str), QAPI_REQ("name", &qapi_str),
		     QAPI_REQ("vm-state-size", &qapi_int), QAPI_REQ("date-sec", &qapi_int),
		     QAPI_REQ("date-nsec", &qapi_int), QAPI_REQ("vm-clock-sec", &qapi_int),
		     QAPI_REQ("vm-clock-nsec", &qapi_int), QAPI_OPT("icount", &qapi_int)));

struct isnap {
	struct blk_node *bs;
	bool drained;
	bool made;
	char id[32];
};

static int isnap_err(struct qmp_txn_err *e, int ret, const char *fmt, const char *a, const char *b)
{
	snprintf(e->desc, sizeof(e->desc), fmt, a, b);
	return ret;
}

/* QEMU's qmp_get_root_bs(): a node no other node uses. */
static struct blk_node *isnap_root(const char *device, struct qmp_txn_err *e)
{
	struct blk_node *bs = blk_graph_find(device);

	if (!bs) {
		isnap_err(e, -ENOENT, "Cannot find device='%s' nor node-name='%s'", device, device);
		return NULL;
	}
	if (blk_parent_count(bs)) {
		isnap_err(e, -EINVAL, "Need a root block node%s%s", "", "");
		return NULL;
	}
	return bs;
}

static int isnap_checks(struct blk_node *bs, const char *device, const char *name,
			struct qmp_txn_err *e)
{
	if (bs->read_only)
		return isnap_err(e, -EROFS, "Device '%s' is read only%s", device, "");
	if (!qcow2_is(bs))
		return isnap_err(e, -ENOTSUP,
				 "Block format '%s' used by device '%s' does not support internal "
				 "snapshots",
				 blk_node_driver(bs), device);
	if (!name[0])
		return isnap_err(e, -EINVAL, "Name is empty%s%s", "", "");
	if (qcow2_snapshot_find(bs, NULL, name) >= 0)
		return isnap_err(e, -EEXIST,
				 "Snapshot with name '%s' already exists on device '%s'", name,
				 device);
	return 0;
}

/* The time as QEMU records it: wall clock in microseconds; the virtual
 * clock of a storage daemon runs with the wall clock; no icount. */
static void isnap_params(struct qcow2_snapshot_params *p, const char *name)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	p->id = NULL;
	p->name = name;
	p->date_sec = (uint32_t)ts.tv_sec;
	p->date_nsec = (uint32_t)(ts.tv_nsec / 1000 * 1000);
	p->vm_clock_nsec = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	p->icount = UINT64_MAX;
}

static int isnap_do(json_t *args, struct isnap *st, struct qmp_txn_err *e)
{
	const char *device = qapi_get_str(args, "device"), *name = qapi_get_str(args, "name");
	struct qcow2_snapshot_params p;
	char msg[200];
	long idx;
	int ret;

	st->bs = isnap_root(device, e);
	if (!st->bs)
		return -ENOENT;
	ret = isnap_checks(st->bs, device, name, e);
	if (ret)
		return ret;
	ret = blk_drain_begin(st->bs);
	if (ret)
		return isnap_err(e, ret, "Could not drain node '%s'%s", device, "");
	st->drained = true;
	isnap_params(&p, name);
	ret = qcow2_snapshot_create(st->bs, &p, msg, sizeof(msg));
	if (ret)
		return isnap_err(e, ret, "Failed to create snapshot '%s': %s", name, msg);
	st->made = true;
	idx = qcow2_snapshot_find(st->bs, NULL, name);
	if (idx >= 0) {
		struct qcow2_info q;

		if (!qcow2_get_info(st->bs, &q)) {
			snprintf(st->id, sizeof(st->id), "%s", q.snapshots[idx].id);
			qcow2_info_free(&q);
		}
	}
	return 0;
}

static void isnap_undo(struct isnap *st)
{
	char msg[200];

	if (st->made && st->id[0] &&
	    qcow2_snapshot_delete(st->bs, st->id, NULL, NULL, msg, sizeof(msg)))
		fprintf(stderr, "ioplane: transaction abort: cannot delete snapshot %s: %s\n",
			st->id, msg);
	st->made = false;
}

static void isnap_clean_state(struct isnap *st)
{
	if (st->drained)
		blk_drain_end(st->bs);
	free(st);
}

/* Run fn inside a control section (synchronous block calls need its loop). */
static void isnap_in_ctl(void (*fn)(struct isnap *st), void *state)
{
	struct loop *prev;

	if (!blk_ctl_enter(&prev)) {
		fn(state);
		blk_ctl_leave(prev);
	}
}

static void isnap_abort(void *state)
{
	isnap_in_ctl(isnap_undo, state);
}

static void isnap_clean(void *state)
{
	isnap_in_ctl(isnap_clean_state, state);
}

static void isnap_commit(void *state)
{
	(void)state; /* prepare made it */
}

static int isnap_prepare(json_t *args, void **state, struct qmp_txn_err *e)
{
	struct isnap *st = calloc(1, sizeof(*st));
	struct loop *prev;
	int ret;

	if (!st || blk_ctl_enter(&prev)) {
		free(st);
		return isnap_err(e, -ENOMEM, "out of memory%s%s", "", "");
	}
	ret = isnap_do(args, st, e);
	blk_ctl_leave(prev);
	*state = st;
	if (ret) {
		isnap_abort(st);
		isnap_clean(st);
		*state = NULL;
	}
	return ret;
}

static const struct qmp_txn_ops isnap_ops = {.type = "blockdev-snapshot-internal-sync",
					     .data = &isnap_args,
					     .prepare = isnap_prepare,
					     .commit = isnap_commit,
					     .abort = isnap_abort,
					     .clean = isnap_clean};

static void blockdev_snapshot_internal_sync(struct qmp_req *req, json_t *args)
{
	struct qmp_txn_err e = {.cls = QMP_ERR_GENERIC};

	if (qmp_txn_run_one(&isnap_ops, args, &e))
		qmp_error(req, e.cls, "%s", e.desc);
	else
		qmp_return(req, NULL);
}

/* ---- delete ---- */

json_t *qmp_snapshot_info_json(const struct qcow2_snapshot_info *sn)
{
	json_t *o = json_pack("{s:s,s:s,s:I,s:I,s:I,s:I,s:I}", "id", sn->id, "name", sn->name,
			      "vm-state-size", (json_int_t)sn->vm_state_size, "date-sec",
			      (json_int_t)sn->date_sec, "date-nsec", (json_int_t)sn->date_nsec,
			      "vm-clock-sec", (json_int_t)(sn->vm_clock_nsec / 1000000000u),
			      "vm-clock-nsec", (json_int_t)(sn->vm_clock_nsec % 1000000000u));

	if (o && sn->icount != UINT64_MAX)
		json_object_set_new(o, "icount", json_integer((json_int_t)sn->icount));
	return o;
}

static int isnap_delete(json_t *args, struct qcow2_snapshot_info *out, struct qmp_txn_err *e)
{
	const char *device = qapi_get_str(args, "device"), *id = qapi_get_str(args, "id");
	const char *name = qapi_get_str(args, "name");
	struct blk_node *bs = isnap_root(device, e);
	char msg[200];
	int ret;

	if (!bs)
		return -ENOENT;
	if (!id && !name)
		return isnap_err(e, -EINVAL, "Name or id must be provided%s%s", "", "");
	if (qcow2_snapshot_find(bs, id, name) < 0) {
		snprintf(e->desc, sizeof(e->desc),
			 "Snapshot with id '%s' and name '%s' does not exist on device '%s'",
			 id ? id : "null", name ? name : "null", device);
		return -ENOENT;
	}
	if (bs->read_only)
		return isnap_err(e, -EROFS, "Device '%s' is read only%s", device, "");
	ret = blk_drain_begin(bs);
	if (ret)
		return isnap_err(e, ret, "Could not drain node '%s'%s", device, "");
	ret = qcow2_snapshot_delete(bs, id, name, out, msg, sizeof(msg));
	blk_drain_end(bs);
	if (ret)
		isnap_err(e, ret, "Failed to delete snapshot: %s%s", msg, "");
	return ret;
}

static void blockdev_snapshot_delete_internal_sync(struct qmp_req *req, json_t *args)
{
	struct qmp_txn_err e = {.cls = QMP_ERR_GENERIC};
	struct qcow2_snapshot_info out = {0};
	struct loop *prev;
	int ret = -ENOMEM;

	if (!blk_ctl_enter(&prev)) {
		ret = isnap_delete(args, &out, &e);
		blk_ctl_leave(prev);
	} else {
		snprintf(e.desc, sizeof(e.desc), "out of memory");
	}
	if (ret)
		qmp_error(req, e.cls, "%s", e.desc);
	else
		qmp_return(req, qmp_snapshot_info_json(&out));
	free(out.id);
	free(out.name);
}

static const struct qmp_command isnap_cmds[] = {
	{.name = "blockdev-snapshot-internal-sync",
	 .args = &isnap_args,
	 .fn = blockdev_snapshot_internal_sync},
	{.name = "blockdev-snapshot-delete-internal-sync",
	 .args = &isnap_del_args,
	 .ret = &snapshot_info,
	 .fn = blockdev_snapshot_delete_internal_sync},
};

int qmp_snapshot_internal_register(void)
{
	int ret = qmp_txn_register(&isnap_ops);

	for (size_t i = 0; i < sizeof(isnap_cmds) / sizeof(isnap_cmds[0]) && !ret; i++)
		ret = qmp_register(&isnap_cmds[i]);
	return ret;
}
