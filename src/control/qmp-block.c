/* blockdev-add, blockdev-del and block_resize, with qemu-storage-daemon
 * 7.2's arguments, replies and messages. BlockdevOptions become the block
 * layer's key=value options, one node at a time: children given inline are
 * opened first (and are the parent's alone), children given by node-name
 * take a reference. The root node is the monitor's (graph.h) until
 * blockdev-del. The block layer itself knows nothing of JSON.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "block/graph.h"
#include "control/qmp-bitmap.h"
#include "control/qmp-block.h"
#include "block/job.h"
#include "control/qmp-snapshot.h"
#include "control/qmp-transaction.h"
#include "control/qmp.h"
#include "util/opts.h"

/* ---- schema (QEMU's qapi/block-core.json, the drivers ioplane has) ---------- */

/* "null" and "host_device" are ioplane's name for null-co and what its
 * file driver opens as well. */
static const struct qapi_type bd_driver =
	QAPI_ENUM_TYPE("BlockdevDriver", "file", "host_device", "nbd", "null-co", "null", "qcow2",
		       "raw", "rbd", "throttle", "copy-before-write");
static const struct qapi_type bd_discard =
	QAPI_ENUM_TYPE("BlockdevDiscardOptions", "ignore", "unmap");
static const struct qapi_type bd_detect_zeroes =
	QAPI_ENUM_TYPE("BlockdevDetectZeroesOptions", "off", "on", "unmap");
static const struct qapi_type bd_cache =
	QAPI_OBJECT_TYPE("BlockdevCacheOptions", QAPI_MEMBERS(QAPI_OPT("direct", &qapi_bool),
							      QAPI_OPT("no-flush", &qapi_bool)));
static const struct qapi_type bd_aio =
	QAPI_ENUM_TYPE("BlockdevAioOptions", "threads", "native", "io_uring");
static const struct qapi_type on_off_auto = QAPI_ENUM_TYPE("OnOffAuto", "auto", "on", "off");

static const struct qapi_type bd_ref =
	QAPI_ALTERNATE_TYPE("BlockdevRef", &qmp_blockdev_options, &qapi_str);
static const struct qapi_type bd_ref_or_null =
	QAPI_ALTERNATE_TYPE("BlockdevRefOrNull", &qmp_blockdev_options, &qapi_str, &qapi_null);

static const struct qapi_type bd_file = QAPI_OBJECT_TYPE(
	"BlockdevOptionsFile",
	QAPI_MEMBERS(QAPI_REQ("filename", &qapi_str), QAPI_OPT("locking", &on_off_auto),
		     QAPI_OPT("aio", &bd_aio), QAPI_OPT("aio-max-batch", &qapi_int)));
static const struct qapi_type bd_null =
	QAPI_OBJECT_TYPE("BlockdevOptionsNull", QAPI_MEMBERS(QAPI_OPT("size", &qapi_int),
							     QAPI_OPT("latency-ns", &qapi_uint64),
							     QAPI_OPT("read-zeroes", &qapi_bool)));
static const struct qapi_type bd_raw = QAPI_OBJECT_TYPE(
	"BlockdevOptionsRaw", QAPI_MEMBERS(QAPI_REQ("file", &bd_ref), QAPI_OPT("offset", &qapi_int),
					   QAPI_OPT("size", &qapi_int)));
static const struct qapi_type bd_qcow2 = QAPI_OBJECT_TYPE(
	"BlockdevOptionsQcow2",
	QAPI_MEMBERS(QAPI_REQ("file", &bd_ref), QAPI_OPT("backing", &bd_ref_or_null),
		     QAPI_OPT("data-file", &bd_ref), QAPI_OPT("l2-cache-size", &qapi_int)));

static const struct qapi_type bd_throttle = QAPI_OBJECT_TYPE(
	"BlockdevOptionsThrottle",
	QAPI_MEMBERS(QAPI_REQ("throttle-group", &qapi_str), QAPI_REQ("file", &bd_ref)));

static const struct qapi_type bd_bitmap_ref = QAPI_OBJECT_TYPE(
	"BlockDirtyBitmap", QAPI_MEMBERS(QAPI_REQ("node", &qapi_str), QAPI_REQ("name", &qapi_str)));
static const struct qapi_type bd_cbw_error =
	QAPI_ENUM_TYPE("OnCbwError", "break-guest-write", "break-snapshot");
static const struct qapi_type bd_cbw = QAPI_OBJECT_TYPE(
	"BlockdevOptionsCbw",
	QAPI_MEMBERS(QAPI_REQ("file", &bd_ref), QAPI_REQ("target", &bd_ref),
		     QAPI_OPT("bitmap", &bd_bitmap_ref), QAPI_OPT("on-cbw-error", &bd_cbw_error)));

const struct qapi_type qmp_blockdev_options = QAPI_UNION_TYPE(
	"BlockdevOptions",
	QAPI_MEMBERS(QAPI_REQ("driver", &bd_driver), QAPI_OPT("node-name", &qapi_str),
		     QAPI_OPT("discard", &bd_discard), QAPI_OPT("cache", &bd_cache),
		     QAPI_OPT("read-only", &qapi_bool), QAPI_OPT("auto-read-only", &qapi_bool),
		     QAPI_OPT("force-share", &qapi_bool),
		     QAPI_OPT("detect-zeroes", &bd_detect_zeroes)),
	"driver", {"file", &bd_file}, {"host_device", &bd_file}, {"null-co", &bd_null},
	{"null", &bd_null}, {"qcow2", &bd_qcow2}, {"raw", &bd_raw}, {"rbd", &qmp_bd_rbd},
	{"nbd", &qmp_bd_nbd}, {"throttle", &bd_throttle}, {"copy-before-write", &bd_cbw});

static const struct qapi_type del_args =
	QAPI_OBJECT_TYPE("q_obj_blockdev-del-arg", QAPI_MEMBERS(QAPI_REQ("node-name", &qapi_str)));
static const struct qapi_type resize_args =
	QAPI_OBJECT_TYPE("q_obj_block_resize-arg", QAPI_MEMBERS(QAPI_OPT("device", &qapi_str),
								QAPI_OPT("node-name", &qapi_str),
								QAPI_REQ("size", &qapi_int)));

/* ---- BlockdevOptions to key=value ------------------------------------------ */

/* Drivers above a `file` child: formats, and the filters. */
static bool has_file_child(const char *drv)
{
	return !strcmp(drv, "raw") || !strcmp(drv, "qcow2") || !strcmp(drv, "throttle") ||
	       !strcmp(drv, "copy-before-write");
}

/* The block layer's name for a driver. */
static const char *blk_driver_name(const char *drv)
{
	if (!strcmp(drv, "null-co"))
		return "null";
	if (!strcmp(drv, "host_device"))
		return "file";
	return drv;
}

static int kv_bool(struct kv_opts *kv, const json_t *o, const char *member, const char *key)
{
	json_t *v = qapi_get(o, member);

	return v ? kv_set(kv, key, json_is_true(v) ? "on" : "off") : 0;
}

static int kv_str(struct kv_opts *kv, const json_t *o, const char *member, const char *key)
{
	const char *v = qapi_get_str(o, member);

	return v ? kv_set(kv, key, v) : 0;
}

static int kv_int(struct kv_opts *kv, const json_t *o, const char *member, const char *key)
{
	char buf[32];

	if (!qapi_has(o, member))
		return 0;
	snprintf(buf, sizeof(buf), "%llu", (unsigned long long)qapi_get_uint(o, member, 0));
	return kv_set(kv, key, buf);
}

/* Options every node takes. */
static int kv_common(struct kv_opts *kv, const json_t *o)
{
	json_t *cache = qapi_get(o, "cache");
	int ret = kv_bool(kv, o, "read-only", "read-only");

	if (!ret)
		ret = kv_bool(kv, o, "force-share", "force-share");
	if (!ret)
		ret = kv_str(kv, o, "discard", "discard");
	if (!ret)
		ret = kv_str(kv, o, "detect-zeroes", "detect-zeroes");
	if (!ret && cache)
		ret = kv_bool(kv, cache, "no-flush", "no-flush");
	return ret;
}

static int kv_driver(struct kv_opts *kv, const json_t *o, const char *drv)
{
	json_t *cache = qapi_get(o, "cache");
	int ret = 0;

	if (!strcmp(drv, "file") || !strcmp(drv, "host_device")) {
		ret = kv_str(kv, o, "filename", "filename");
		if (!ret && cache && qapi_has(cache, "direct"))
			ret = kv_set(kv, "cache",
				     qapi_get_bool(cache, "direct", false) ? "none" : "writeback");
		if (!ret)
			ret = kv_str(kv, o, "aio", "aio");
		if (!ret)
			ret = kv_str(kv, o, "locking", "locking");
		if (!ret)
			ret = kv_int(kv, o, "aio-max-batch", "aio-max-batch");
	} else if (!strcmp(drv, "null-co") || !strcmp(drv, "null")) {
		/* QEMU's null-co is 1 GiB unless told. */
		ret = qapi_has(o, "size") ? kv_int(kv, o, "size", "size")
					  : kv_set(kv, "size", "1G");
		if (!ret)
			ret = kv_int(kv, o, "latency-ns", "latency-ns");
		if (!ret)
			ret = kv_bool(kv, o, "read-zeroes", "read-zeroes");
	} else if (!strcmp(drv, "raw")) {
		ret = kv_int(kv, o, "offset", "offset");
		if (!ret)
			ret = kv_int(kv, o, "size", "size");
	} else if (!strcmp(drv, "qcow2")) {
		ret = kv_int(kv, o, "l2-cache-size", "l2-cache-size");
	} else if (!strcmp(drv, "throttle")) {
		ret = kv_str(kv, o, "throttle-group", "throttle-group");
	} else if (!strcmp(drv, "copy-before-write")) {
		ret = kv_str(kv, o, "on-cbw-error", "on-cbw-error");
		if (!ret && qapi_has(o, "bitmap"))
			ret = kv_str(kv, qapi_get(o, "bitmap"), "node", "bitmap.node");
		if (!ret && qapi_has(o, "bitmap"))
			ret = kv_str(kv, qapi_get(o, "bitmap"), "name", "bitmap.name");
	} else {
		ret = qmp_bd_remote_kv(kv, o, drv);
	}
	return ret;
}

/* ---- opening --------------------------------------------------------------- */

/* Sandbox (the fuzz target): nodes that touch no file and never wait. */
static bool sandbox;

void qmp_block_sandbox(void)
{
	sandbox = true;
}

static int bd_sandbox_check(const json_t *o, const char *drv, char *err, size_t errlen)
{
	if (!sandbox)
		return 0;
	if (strcmp(drv, "null-co") && strcmp(drv, "null") && strcmp(drv, "raw")) {
		snprintf(err, errlen, "Parameter 'driver' does not accept value '%s'", drv);
		return -EPERM;
	}
	if (qapi_has(o, "latency-ns")) {
		snprintf(err, errlen, "Parameter 'latency-ns' is unexpected");
		return -EPERM;
	}
	return 0;
}

static int bd_open(json_t *o, const json_t *parent, struct blk_node **out, char *err,
		   size_t errlen);

/* A child: a node-name (a new reference) or options (a new node). */
static int bd_child(json_t *ref, const json_t *parent, struct blk_node **out, char *err,
		    size_t errlen)
{
	const char *name = json_string_value(ref);

	if (json_is_object(ref))
		return bd_open(ref, parent, out, err, errlen);
	*out = blk_graph_find(name);
	if (!*out) {
		snprintf(err, errlen, "Cannot find device='%s' nor node-name='%s'", name, name);
		return -ENOENT;
	}
	blk_ref(*out, NULL); /* the parent link takes it over */
	return 0;
}

/* What a child opened inline inherits from its parent when it does not say
 * (QEMU's bdrv_inherited_options). Returns a new reference. */
static json_t *bd_inherit(json_t *o, const json_t *parent)
{
	static const char *const keys[] = {"read-only", "auto-read-only", "force-share", "discard"};
	json_t *c = json_copy(o), *pc = parent ? qapi_get(parent, "cache") : NULL, *cc;

	if (!c || !parent)
		return c;
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (!qapi_has(c, keys[i]) && qapi_has(parent, keys[i]))
			json_object_set(c, keys[i], qapi_get(parent, keys[i]));
	if (pc) {
		cc = qapi_has(c, "cache") ? json_copy(qapi_get(c, "cache")) : json_object();
		json_object_update_missing(cc, pc);
		json_object_set_new(c, "cache", cc);
	}
	return c;
}

struct bd_children {
	struct blk_node *file;
	struct blk_child extra[2];
	unsigned n;
};

static void bd_children_drop(struct bd_children *ch)
{
	blk_unref(ch->file, NULL);
	for (unsigned i = 0; i < ch->n; i++)
		blk_unref(ch->extra[i].node, NULL);
	ch->file = NULL;
	ch->n = 0;
}

static int bd_extra(struct bd_children *ch, const char *role, json_t *o, const json_t *parent,
		    char *err, size_t errlen)
{
	struct blk_node *c;
	int ret = bd_child(o, parent, &c, err, errlen);

	if (!ret)
		ch->extra[ch->n++] = (struct blk_child){.role = role, .node = c};
	return ret;
}

/* The children of a format node, in QEMU's order: file, backing, data-file. */
static int bd_children(json_t *o, const char *drv, struct kv_opts *kv, struct bd_children *ch,
		       char *err, size_t errlen)
{
	json_t *backing = qapi_get(o, "backing"), *data = qapi_get(o, "data-file");
	const char *path;
	int ret = bd_child(qapi_get(o, "file"), o, &ch->file, err, errlen);

	if (!ret && !strcmp(drv, "copy-before-write"))
		return bd_extra(ch, BLK_ROLE_TARGET, qapi_get(o, "target"), o, err, errlen);
	if (ret || strcmp(drv, "qcow2"))
		return ret;
	/* qcow2 finds a relative backing file name next to its image. */
	path = blk_file_path(ch->file);
	if (path)
		ret = kv_set(kv, "filename", path);
	if (!ret && json_is_null(backing))
		ret = kv_set(kv, "backing", ""); /* none, whatever the image says */
	else if (!ret && backing)
		ret = bd_extra(ch, BLK_ROLE_BACKING, backing, o, err, errlen);
	if (!ret && data)
		ret = bd_extra(ch, BLK_ROLE_DATA_FILE, data, o, err, errlen);
	return ret;
}

/* QEMU's words for a file that does not open. */
static void bd_open_error(const json_t *o, int ret, char *err, size_t errlen)
{
	const char *fn = qapi_get_str(o, "filename");

	if (fn && strstr(err, "cannot open '") && ret != -EBUSY)
		snprintf(err, errlen, "Could not open '%s': %s", fn, strerror(-ret));
}

static int bd_open_node(json_t *o, const char *drv, struct kv_opts *kv, struct bd_children *ch,
			struct blk_node **out, char *err, size_t errlen)
{
	bool ro = qapi_get_bool(o, "read-only", false);
	int ret;

	ret = blk_open_node(blk_driver_name(drv), ch->file, ch->extra, ch->n, kv, out, err, errlen);
	ch->file = NULL;
	ch->n = 0;
	/* auto-read-only: a file that cannot be written is opened read-only. */
	if ((ret == -EACCES || ret == -EROFS || ret == -EPERM) && !has_file_child(drv) && !ro &&
	    qapi_get_bool(o, "auto-read-only", false)) {
		kv_set(kv, "read-only", "on");
		ret = blk_open_node(blk_driver_name(drv), NULL, NULL, 0, kv, out, err, errlen);
	}
	if (ret)
		bd_open_error(o, ret, err, errlen);
	return ret;
}

static int bd_open(json_t *given, const json_t *parent, struct blk_node **out, char *err,
		   size_t errlen)
{
	json_t *o = bd_inherit(given, parent);
	const char *drv = qapi_get_str(o, "driver"), *name = qapi_get_str(o, "node-name");
	struct bd_children ch = {0};
	struct kv_opts kv = {0};
	int ret = bd_sandbox_check(o, drv, err, errlen);

	if (!ret && name)
		ret = blk_node_name_check(name, err, errlen);
	if (!ret && (kv_common(&kv, o) || kv_driver(&kv, o, drv))) {
		snprintf(err, errlen, "out of memory");
		ret = -ENOMEM;
	}
	if (!ret && has_file_child(drv))
		ret = bd_children(o, drv, &kv, &ch, err, errlen);
	if (!ret)
		ret = bd_open_node(o, drv, &kv, &ch, out, err, errlen);
	bd_children_drop(&ch);
	kv_free(&kv);
	/* A child may have taken the name meanwhile: QEMU's message too. */
	if (!ret && (ret = blk_node_set_name(*out, name, err, errlen)))
		blk_close(*out);
	json_decref(o);
	return ret;
}

int qmp_blockdev_add(json_t *opts, char *err, size_t errlen)
{
	struct blk_node *bs;
	int ret;

	if (!qapi_has(opts, "node-name")) {
		snprintf(err, errlen, "'node-name' must be specified for the root node");
		return -EINVAL;
	}
	ret = bd_open(opts, NULL, &bs, err, errlen);
	if (!ret)
		blk_graph_own(bs);
	return ret;
}

/* ---- commands -------------------------------------------------------------- */

static void blockdev_add(struct qmp_req *req, json_t *args)
{
	struct loop *prev;
	char err[1024];
	int ret = blk_ctl_enter(&prev);

	if (!ret) {
		ret = qmp_blockdev_add(args, err, sizeof(err));
		blk_ctl_leave(prev);
	} else {
		snprintf(err, sizeof(err), "out of memory");
	}
	if (ret)
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
	else
		qmp_return(req, NULL);
}

static int node_close(struct blk_node *bs);

/* QEMU's checks, in its order: a user that is not a node (an export, a
 * job's own access), a job's blocker, not the monitor's, a parent. */
static void blockdev_del(struct qmp_req *req, json_t *args)
{
	const char *name = qapi_get_str(args, "node-name");
	struct blk_node *bs = blk_graph_find(name);

	char busy[256];

	if (!bs)
		qmp_error(req, QMP_ERR_GENERIC, "Failed to find node with node-name='%s'", name);
	else if (blk_user_count(bs) > job_node_blocker_refs(bs))
		qmp_error(req, QMP_ERR_GENERIC, "Node %s is in use", name);
	else if (job_node_busy(bs, busy, sizeof(busy)))
		qmp_error(req, QMP_ERR_GENERIC, "%s", busy);
	else if (!blk_graph_owned(bs))
		qmp_error(req, QMP_ERR_GENERIC, "Node %s is not owned by the monitor", name);
	else if (blk_parent_count(bs))
		qmp_error(req, QMP_ERR_GENERIC, "Block device %s is in use", name);
	else if (node_close(bs))
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
	else
		qmp_return(req, NULL);
}

/* As QEMU's close: what was written reaches the disk first. */
static int node_close(struct blk_node *bs)
{
	struct loop *prev;

	if (blk_ctl_enter(&prev))
		return -ENOMEM;
	blk_flush_tree_sync(bs);
	blk_graph_release(bs);
	blk_close(bs);
	blk_ctl_leave(prev);
	return 0;
}

void qmp_block_close_all(void)
{
	for (;;) {
		struct blk_node *bs, *last = NULL;

		/* Newest first: a node added later may use an older one. */
		for (bs = blk_graph_next(NULL); bs; bs = blk_graph_next(bs))
			if (blk_graph_owned(bs))
				last = bs;
		if (!last || node_close(last))
			break;
	}
	blk_ctl_free();
}

static void block_resize(struct qmp_req *req, json_t *args)
{
	const char *dev = qapi_get_str(args, "device"), *node = qapi_get_str(args, "node-name");
	int64_t size = qapi_get_int(args, "size", 0);
	/* No device (BlockBackend) has a name in a storage daemon. */
	struct blk_node *bs = dev ? NULL : blk_graph_find(node);
	struct loop *prev;
	char err[512];
	int ret;

	if (!bs) {
		qmp_error(req, QMP_ERR_GENERIC, "Cannot find device='%s' nor node-name='%s'",
			  dev ? dev : "", node ? node : "");
		return;
	}
	if (size < 0) {
		qmp_error(req, QMP_ERR_GENERIC, "Parameter 'size' expects a >0 size");
		return;
	}
	if (!strcmp(blk_node_driver(bs), "qcow2") && size % 512) {
		qmp_error(req, QMP_ERR_GENERIC, "The new size must be a multiple of 512");
		return;
	}
	/* A job's node keeps its size (qsd says "Device '(null)' is in use"). */
	if (job_node_busy(bs, err, sizeof(err))) {
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	if (blk_ctl_enter(&prev)) {
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
		return;
	}
	ret = blk_resize(bs, (uint64_t)size, err, sizeof(err));
	blk_ctl_leave(prev);
	if (ret)
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
	else
		qmp_return(req, NULL);
}

static const struct qmp_command block_cmds[] = {
	{.name = "blockdev-add", .args = &qmp_blockdev_options, .fn = blockdev_add},
	{.name = "blockdev-del", .args = &del_args, .fn = blockdev_del},
	{.name = "block_resize", .args = &resize_args, .fn = block_resize},
};

int qmp_block_register(void)
{
	static bool done;
	int ret = 0;

	if (done)
		return 0;
	for (size_t i = 0; i < sizeof(block_cmds) / sizeof(block_cmds[0]) && !ret; i++)
		ret = qmp_register(&block_cmds[i]);
	if (!ret)
		ret = qmp_block_query_register();
	if (!ret)
		ret = qmp_bitmap_register();
	if (!ret)
		ret = qmp_txn_register_command();
	if (!ret)
		ret = qmp_snapshot_register();
	if (!ret)
		ret = qmp_job_register();
	done = ret == 0;
	return ret;
}
