/* External snapshots, live: blockdev-snapshot-sync (the overlay created and
 * opened here) and blockdev-snapshot (an overlay made with blockdev-add),
 * as QMP commands and as transaction actions, with qemu-storage-daemon
 * 7.2's arguments, checks and messages.
 *
 * prepare drains the node (until clean: every action of a transaction sees
 * one point in time), flushes it, creates and opens the overlay with the
 * node as its backing file, and puts the overlay in the node's place for
 * every user (blk_replace_node: exports switch with their connections
 * open; requests held by the drain go to the overlay). The old node becomes
 * a read-only backing file, as in QEMU. abort undoes it; commit has
 * nothing left to do.
 *
 * Crash safety: the overlay's file is complete and names its backing file
 * before any write goes to it, and the old node's metadata is flushed
 * first, so a kill at any moment leaves either the old image alone in use
 * or a valid chain.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "block/file.h"
#include "block/graph.h"
#include "block/job.h"
#include "block/qcow2/qcow2.h"
#include "control/qmp-snapshot.h"
#include "control/qmp-transaction.h"
#include "control/qmp.h"
#include "control/schema.h"
#include "util/log.h"
#include "util/opts.h"

static const struct qapi_type new_image_mode =
	QAPI_ENUM_TYPE("NewImageMode", "existing", "absolute-paths");
static const struct qapi_type snapshot_sync_args = QAPI_OBJECT_TYPE(
	"BlockdevSnapshotSync",
	QAPI_MEMBERS(QAPI_OPT("device", &qapi_str), QAPI_OPT("node-name", &qapi_str),
		     QAPI_REQ("snapshot-file", &qapi_str),
		     QAPI_OPT("snapshot-node-name", &qapi_str), QAPI_OPT("format", &qapi_str),
		     QAPI_OPT("mode", &new_image_mode)));
static const struct qapi_type snapshot_args =
	QAPI_OBJECT_TYPE("BlockdevSnapshot",
			 QAPI_MEMBERS(QAPI_REQ("node", &qapi_str), QAPI_REQ("overlay", &qapi_str)));

struct snap {
	struct blk_node *from, *to;
	bool drained_from, drained_to;
	bool ours;     /* we opened `to` (blockdev-snapshot-sync): our reference */
	bool attached; /* to has from as its backing file */
	bool replaced; /* to is in from's place */
	bool was_ro;   /* from was read-only before */
	bool made_ro;  /* ... and we made it so */
};

static int snap_err(struct qmp_txn_err *e, int ret, const char *fmt, const char *a, const char *b)
{
	snprintf(e->desc, sizeof(e->desc), fmt, a ? a : "", b ? b : "");
	return ret;
}

/* QEMU's bdrv_lookup_bs(): a device (no storage-daemon node is one), then a
 * node-name. */
static struct blk_node *snap_lookup(const char *device, const char *node, struct qmp_txn_err *e)
{
	struct blk_node *bs = node ? blk_graph_find(node) : NULL;

	if (!bs)
		snap_err(e, -ENOENT, "Cannot find device='%s' nor node-name='%s'", device, node);
	return bs;
}

static int snap_drain(struct blk_node *bs, bool *flag, struct qmp_txn_err *e)
{
	int ret = blk_drain_begin(bs);

	if (ret)
		return snap_err(e, ret, "Could not drain node '%s'%s", blk_node_name(bs), "");
	*flag = true;
	return 0;
}

/* The old top is flushed (to stable storage) before an overlay names it,
 * as QEMU does; a drained node takes no flush (it would be held), so this
 * comes first. Writes acknowledged meanwhile are in its file already, as
 * every acknowledged write is. */
static int snap_flush(struct snap *s, struct qmp_txn_err *e)
{
	if (!s->from->read_only && blk_flush_tree_sync(s->from))
		return snap_err(e, -EIO, "Input/output error%s%s", NULL, NULL); /* QERR_IO_ERROR */
	return 0;
}

/* A new overlay is made under a temporary name and renamed into place once
 * complete: killed in between, the daemon leaves no half-made image at
 * path (QEMU can). An existing file is overwritten in place, as QEMU does,
 * so that its lock is honoured. */
static int snap_create_file(const char *path, const struct qcow2_create_opts *o, char *msg,
			    size_t len)
{
	char tmp[4096];
	struct stat st;
	int ret;

	if (stat(path, &st) == 0 ||
	    (size_t)snprintf(tmp, sizeof(tmp), "%s.ioplane-new", path) >= sizeof(tmp))
		return qcow2_create(path, o, msg, len);
	ret = qcow2_create(tmp, o, msg, len);
	if (!ret && rename(tmp, path) != 0) {
		ret = -errno;
		snprintf(msg, len, "%s", strerror(errno));
	}
	if (ret)
		unlink(tmp);
	return ret;
}

/* Make the overlay file as qemu-img create -b OLD -F FMT would: size and
 * backing file from the old top. */
static int snap_create(struct snap *s, const char *path, struct qmp_txn_err *e)
{
	const char *drv = blk_node_driver(s->from);
	struct blk_node *file = !strcmp(drv, "qcow2") || !strcmp(drv, "raw") ? s->from->next : NULL;
	struct qcow2_create_opts o = {.size = s->from->size};
	char msg[200];
	int ret;

	o.backing_file = file ? blk_file_path(file) : NULL;
	o.backing_fmt = drv;
	if (!o.backing_file)
		return snap_err(e, -ENOTSUP, "Node '%s' is not an image in a file%s",
				blk_node_name(s->from), NULL);
	ret = snap_create_file(path, &o, msg, sizeof(msg));
	if (ret)
		return snap_err(e, ret, "Could not create '%s': %s", path, msg);
	return 0;
}

static int snap_open(struct snap *s, const char *path, const char *name, struct qmp_txn_err *e)
{
	struct kv_opts o = {0};
	char msg[200];
	int ret = kv_set(&o, "driver", "file");

	if (!ret)
		ret = kv_set(&o, "filename", path);
	if (!ret)
		ret = kv_set(&o, "format", "qcow2");
	if (!ret)
		ret = kv_set(&o, "backing", ""); /* QEMU's BDRV_O_NO_BACKING: from is it */
	if (!ret)
		ret = blk_open(&o, &s->to, msg, sizeof(msg));
	kv_free(&o);
	if (ret)
		return snap_err(e, ret, "Could not open '%s': %s", path, msg);
	s->ours = true;
	if (blk_node_set_name(s->to, name, msg, sizeof(msg)))
		return snap_err(e, -EINVAL, "%s%s", msg, NULL);
	return 0;
}

static int snap_is_node(struct blk_node *bs, void *opaque)
{
	return bs == opaque;
}

/* Both commands: the overlay takes from's place. */
static int snap_switch(struct snap *s, struct qmp_txn_err *e)
{
	char msg[256];
	int ret;

	if (blk_user_count(s->to) || blk_parent_count(s->to))
		return snap_err(e, -EBUSY, "The overlay is already in use%s%s", NULL, NULL);
	if (qcow2_backing(s->to))
		return snap_err(e, -EEXIST, "The overlay already has a backing image%s%s", NULL,
				NULL);
	if (blk_walk(s->from, snap_is_node, s->to))
		return snap_err(e, -ELOOP,
				"Making '%s' a backing child of '%s' would create a cycle",
				blk_node_name(s->from), blk_node_name(s->to));
	ret = qcow2_attach_backing(s->to, s->from, msg, sizeof(msg));
	if (ret)
		return snap_err(e, ret, "%s%s", msg, NULL);
	s->attached = true;
	ret = snap_drain(s->to, &s->drained_to, e);
	if (ret)
		return ret;
	s->was_ro = s->from->read_only;
	ret = blk_replace_node(s->from, s->to, msg, sizeof(msg));
	if (ret)
		return snap_err(e, ret, "%s%s", msg, NULL);
	s->replaced = true;
	ret = blk_set_backing_read_only(s->from, true, msg, sizeof(msg));
	if (ret)
		return snap_err(e, ret, "%s%s", msg, NULL);
	s->made_ro = !s->was_ro;
	return 0;
}

/* Both commands: find the node, flush it, drain it. */
static int snap_begin(struct snap *s, const char *device, const char *node, struct qmp_txn_err *e)
{
	int ret;

	s->from = snap_lookup(device, node, e);
	if (!s->from)
		return -ENOENT;
	/* A job's node stays where the job expects it (QEMU's op blocker). */
	ret = job_node_busy(s->from, e->desc, sizeof(e->desc));
	if (ret)
		return ret;
	ret = snap_flush(s, e);
	return ret ? ret : snap_drain(s->from, &s->drained_from, e);
}

static int sync_prepare(json_t *args, struct snap *s, struct qmp_txn_err *e)
{
	const char *node = qapi_get_str(args, "node-name"),
		   *file = qapi_get_str(args, "snapshot-file");
	const char *name = qapi_get_str(args, "snapshot-node-name");
	const char *fmt = qapi_get_str(args, "format");
	bool create;
	int ret;

	ret = snap_begin(s, qapi_get_str(args, "device"), node, e);
	if (ret)
		return ret;
	if (node && !name)
		return snap_err(e, -EINVAL, "New overlay node-name missing%s%s", NULL, NULL);
	if (name && blk_graph_find(name))
		return snap_err(e, -EEXIST, "New overlay node-name already in use%s%s", NULL, NULL);
	create = !qapi_has(args, "mode") || !strcmp(qapi_get_str(args, "mode"), "absolute-paths");
	if (fmt && !strcmp(fmt, "raw")) /* QEMU's bdrv_img_create(), or its open's check */
		return snap_err(e, -ENOTSUP,
				create ? "Backing file not supported for file format '%s'%s"
				       : "The overlay does not support backing images%.0s%s",
				fmt, NULL);
	if (fmt && strcmp(fmt, "qcow2"))
		return snap_err(e, -ENOTSUP, "Format '%s' cannot be an overlay in ioplane%s", fmt,
				NULL);
	if (create)
		ret = snap_create(s, file, e);
	if (!ret)
		ret = snap_open(s, file, name, e);
	return ret ? ret : snap_switch(s, e);
}

static int plain_prepare(json_t *args, struct snap *s, struct qmp_txn_err *e)
{
	const char *node = qapi_get_str(args, "node"), *overlay = qapi_get_str(args, "overlay");
	int ret;

	ret = snap_begin(s, node, node, e);
	if (ret)
		return ret;
	s->to = snap_lookup(overlay, overlay, e);
	if (!s->to)
		return -ENOENT;
	if (!qcow2_is(s->to))
		return snap_err(e, -ENOTSUP, "The overlay does not support backing images%s%s",
				NULL, NULL);
	return snap_switch(s, e);
}

static void snap_undo(struct snap *s)
{
	char msg[256];

	/* The backing link first: from is no longer under to, and takes its
	 * users back with nothing in its way. */
	if (s->attached)
		qcow2_detach_backing(s->to);
	s->attached = false;
	if (s->made_ro)
		blk_set_backing_read_only(s->from, false, msg, sizeof(msg));
	s->made_ro = false;
	if (s->replaced) {
		/* Back to what was held a moment ago: cannot conflict. */
		if (blk_replace_node(s->to, s->from, msg, sizeof(msg)))
			log_warn("snapshot abort: %s", msg);
		s->replaced = false;
	}
}

static void snap_clean_state(struct snap *s)
{
	if (s->drained_to)
		blk_drain_end(s->to);
	if (s->drained_from)
		blk_drain_end(s->from);
	/* The overlay now lives by its users' references, as in QEMU: with
	 * none it closes. */
	if (s->ours)
		blk_close(s->to);
	free(s);
}

/* ---- the transaction ops ---------------------------------------------------- */

typedef int (*snap_prepare_fn)(json_t *args, struct snap *s, struct qmp_txn_err *e);

static void snap_abort(void *state);
static void snap_clean(void *state);

static int snap_prepare_with(snap_prepare_fn fn, json_t *args, void **state, struct qmp_txn_err *e)
{
	struct snap *s = calloc(1, sizeof(*s));
	struct loop *prev;
	int ret;

	if (!s || blk_ctl_enter(&prev)) {
		free(s);
		return snap_err(e, -ENOMEM, "out of memory%s%s", NULL, NULL);
	}
	ret = fn(args, s, e);
	blk_ctl_leave(prev);
	*state = s;
	if (ret) {
		snap_abort(s);
		snap_clean(s);
		*state = NULL;
	}
	return ret;
}

static int sync_prepare_op(json_t *args, void **state, struct qmp_txn_err *e)
{
	return snap_prepare_with(sync_prepare, args, state, e);
}

static int plain_prepare_op(json_t *args, void **state, struct qmp_txn_err *e)
{
	return snap_prepare_with(plain_prepare, args, state, e);
}

static void snap_commit(void *state)
{
	(void)state; /* prepare did it all */
}

/* Run fn on the state inside a control section (it drains, flushes and
 * closes). The section's loop exists once prepare ran, so entering cannot
 * fail then. */
static void snap_in_ctl(void (*fn)(struct snap *s), void *state, const char *what)
{
	struct loop *prev;

	if (blk_ctl_enter(&prev)) {
		log_err("snapshot %s: out of memory", what);
		return;
	}
	fn(state);
	blk_ctl_leave(prev);
}

static void snap_abort(void *state)
{
	snap_in_ctl(snap_undo, state, "abort");
}

static void snap_clean(void *state)
{
	snap_in_ctl(snap_clean_state, state, "clean");
}

static const struct qmp_txn_ops sync_ops = {.type = "blockdev-snapshot-sync",
					    .data = &snapshot_sync_args,
					    .prepare = sync_prepare_op,
					    .commit = snap_commit,
					    .abort = snap_abort,
					    .clean = snap_clean};
static const struct qmp_txn_ops plain_ops = {.type = "blockdev-snapshot",
					     .data = &snapshot_args,
					     .prepare = plain_prepare_op,
					     .commit = snap_commit,
					     .abort = snap_abort,
					     .clean = snap_clean};

static void run_cmd(struct qmp_req *req, const struct qmp_txn_ops *ops, json_t *args)
{
	struct qmp_txn_err e = {.cls = QMP_ERR_GENERIC};

	if (qmp_txn_run_one(ops, args, &e))
		qmp_error(req, e.cls, "%s", e.desc);
	else
		qmp_return(req, NULL);
}

static void blockdev_snapshot_sync(struct qmp_req *req, json_t *args)
{
	run_cmd(req, &sync_ops, args);
}

static void blockdev_snapshot(struct qmp_req *req, json_t *args)
{
	run_cmd(req, &plain_ops, args);
}

static const struct qmp_command snap_cmds[] = {
	{.name = "blockdev-snapshot-sync",
	 .args = &snapshot_sync_args,
	 .fn = blockdev_snapshot_sync},
	/* The overlay needs no read permission of its own: reads of what it
	 * does not allocate go to its backing file, which it gets here. */
	{.name = "blockdev-snapshot",
	 .args = &snapshot_args,
	 .fn = blockdev_snapshot,
	 .features = (const char *const[]){"allow-write-only-overlay", NULL}},
};

int qmp_snapshot_register(void)
{
	int ret = qmp_txn_register(&sync_ops);

	if (!ret)
		ret = qmp_txn_register(&plain_ops);
	for (size_t i = 0; i < sizeof(snap_cmds) / sizeof(snap_cmds[0]) && !ret; i++)
		ret = qmp_register(&snap_cmds[i]);
	return ret;
}
