/* query-named-block-nodes and query-blockstats with qemu-storage-daemon
 * 7.2's reply shapes (BlockDeviceInfo, BlockStats), and the
 * BLOCK_IMAGE_CORRUPTED event. Statistics are ioplane's per-node counters
 * (block/stats.c) under QEMU's names, plus what QEMU has not under
 * "x-ioplane": requests in flight and the latency histograms.
 *
 * THREADING RULE: main thread only (the counters are read racily, which
 * only makes a sum slightly stale). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "block/graph.h"
#include "block/qcow2/qcow2.h"
#include "block/throttle-group.h"
#include "block/block.h"
#include "control/qmp-bitmap.h"
#include "control/qmp-block.h"
#include "control/qmp-snapshot.h"
#include "control/qmp.h"
#include "util/trace.h"

static const struct qapi_type named_args = QAPI_OBJECT_TYPE(
	"q_obj_query-named-block-nodes-arg", QAPI_MEMBERS(QAPI_OPT("flat", &qapi_bool)));
static const struct qapi_type stats_args = QAPI_OBJECT_TYPE(
	"q_obj_query-blockstats-arg", QAPI_MEMBERS(QAPI_OPT("query-nodes", &qapi_bool)));
static const struct qapi_type corrupted_data = QAPI_OBJECT_TYPE(
	"q_obj_BLOCK_IMAGE_CORRUPTED-arg",
	QAPI_MEMBERS(QAPI_REQ("device", &qapi_str), QAPI_OPT("node-name", &qapi_str),
		     QAPI_REQ("msg", &qapi_str), QAPI_OPT("offset", &qapi_int),
		     QAPI_OPT("size", &qapi_int), QAPI_REQ("fatal", &qapi_bool)));

/* ---- BlockDeviceInfo --------------------------------------------------------- */

/* QEMU's name of a node's driver. */
static const char *qemu_driver(const struct blk_node *bs)
{
	return !strcmp(blk_node_driver(bs), "null") ? "null-co" : blk_node_driver(bs);
}

/* The protocol node at the bottom of bs's `file` chain. */
static const struct blk_node *leaf(const struct blk_node *bs)
{
	while (bs->next)
		bs = bs->next;
	return bs;
}

static const char *node_filename(const struct blk_node *bs)
{
	const char *p = blk_file_path(leaf(bs));

	if (p)
		return p;
	return !strcmp(blk_node_driver(leaf(bs)), "null") ? "null-co://" : "";
}

static void image_qcow2(json_t *img, struct blk_node *bs)
{
	struct qcow2_info q;
	bool v3;

	if (!qcow2_is(bs) || qcow2_get_info(bs, &q))
		return;
	v3 = q.version >= 3;
	json_object_set_new(img, "cluster-size", json_integer((json_int_t)q.cluster_size));
	json_t *d = json_pack("{s:s,s:s,s:i}", "compat", v3 ? "1.1" : "0.10", "compression-type",
			      q.compression_type == QCOW2_COMPRESSION_ZSTD ? "zstd" : "zlib",
			      "refcount-bits", (int)q.refcount_bits);
	if (d && v3) {
		json_object_set_new(d, "lazy-refcounts", json_boolean(q.lazy_refcounts));
		json_object_set_new(d, "corrupt", json_boolean(q.corrupt));
		json_object_set_new(d, "extended-l2", json_boolean(q.extended_l2));
		if (q.data_file) {
			json_object_set_new(d, "data-file", json_string(q.data_file));
			json_object_set_new(d, "data-file-raw", json_boolean(q.data_file_raw));
		}
	}
	json_object_set_new(img, "format-specific",
			    json_pack("{s:s,s:o*}", "type", "qcow2", "data", d));
	if (q.backing_file)
		json_object_set_new(img, "backing-filename", json_string(q.backing_file));
	if (q.backing_format)
		json_object_set_new(img, "backing-filename-format", json_string(q.backing_format));
	if (q.nb_snapshots) {
		json_t *l = json_array();

		for (unsigned i = 0; l && i < q.nb_snapshots; i++)
			json_array_append_new(l, qmp_snapshot_info_json(&q.snapshots[i]));
		json_object_set_new(img, "snapshots", l);
	}
	qcow2_info_free(&q);
}

/* ImageInfo; with the backing chain nested unless flat. */
static json_t *image_info(struct blk_node *bs, int flat)
{
	const char *path = blk_file_path(leaf(bs));
	struct blk_node *backing = blk_child(bs, BLK_ROLE_BACKING);
	struct stat st;
	json_t *img = json_pack("{s:s,s:s,s:I,s:b}", "filename", node_filename(bs), "format",
				qemu_driver(bs), "virtual-size", (json_int_t)blk_size(bs),
				"dirty-flag", 0);

	if (!img)
		return NULL;
	if (path && stat(path, &st) == 0)
		json_object_set_new(img, "actual-size",
				    json_integer((json_int_t)st.st_blocks * 512));
	image_qcow2(img, bs);
	if (backing) {
		json_object_set_new(img, "full-backing-filename",
				    json_string(node_filename(backing)));
		if (!flat)
			json_object_set_new(img, "backing-image", image_info(backing, flat));
	}
	return img;
}

static const char *detect_zeroes_name(const struct blk_node *bs)
{
	static const char *const names[] = {"off", "on", "unmap"};

	return bs->detect_zeroes < 3 ? names[bs->detect_zeroes] : "off";
}

static unsigned backing_depth(struct blk_node *bs)
{
	unsigned n = 0;

	while ((bs = blk_child(bs, BLK_ROLE_BACKING)))
		n++;
	return n;
}

/* QEMU's description of a node by its options, for a filter node's
 * filename: {"throttle-group": ID, "driver": "throttle", "file": {...}}. */
static json_t *node_options(const struct blk_node *bs)
{
	const char *path = blk_file_path(bs), *group = throttle_node_group(bs);
	json_t *o = json_object();

	if (o && group)
		json_object_set_new(o, "throttle-group", json_string(group));
	if (o)
		json_object_set_new(o, "driver", json_string(qemu_driver(bs)));
	if (o && path && !bs->next)
		json_object_set_new(o, "filename", json_string(path));
	/* QEMU names the size a null-co node was given; 1 GiB is its default. */
	if (o && !strcmp(blk_node_driver(bs), "null") && blk_size(bs) != 1ull << 30)
		json_object_set_new(o, "size", json_integer((json_int_t)blk_size(bs)));
	if (o && bs->next)
		json_object_set_new(o, "file", node_options(bs->next));
	return o;
}

/* A throttle node as QEMU shows a filter: its child in the place of a
 * backing image, its options as its filename. */
static void filter_info(json_t *o, struct blk_node *bs, int flat)
{
	json_t *img = json_object_get(o, "image"), *opts = node_options(bs);
	char *fn = opts ? json_dumps(opts, JSON_PRESERVE_ORDER) : NULL;
	char buf[4096];
	json_t *child;

	json_decref(opts);
	if (fn) {
		snprintf(buf, sizeof(buf), "json:%s", fn);
		json_object_set_new(o, "file", json_string(buf));
		if (img)
			json_object_set_new(img, "filename", json_string(buf));
	}
	free(fn);
	child = qmp_block_node_info(bs->next, flat);
	json_object_set_new(
		o, "backing_file_depth",
		json_integer(json_integer_value(json_object_get(child, "backing_file_depth")) + 1));
	if (img && !flat)
		json_object_set(img, "backing-image", json_object_get(child, "image"));
	json_decref(child);
}

json_t *qmp_block_node_info(struct blk_node *bs, int flat)
{
	struct blk_node *backing = blk_child(bs, BLK_ROLE_BACKING);
	json_t *o = json_pack(
		"{s:s,s:s,s:b,s:s,s:i,s:b,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:{s:b,s:b,s:b}}", "file",
		node_filename(bs), "node-name", blk_node_name(bs), "ro", bs->read_only, "drv",
		qemu_driver(bs), "backing_file_depth", (int)backing_depth(bs), "encrypted", 0,
		"detect_zeroes", detect_zeroes_name(bs), "bps", 0, "bps_rd", 0, "bps_wr", 0, "iops",
		0, "iops_rd", 0, "iops_wr", 0, "write_threshold", 0, "cache", "writeback", 1,
		"direct", blk_file_direct(leaf(bs)), "no-flush", bs->no_flush);

	if (!o)
		return NULL;
	IOPLANE_TRACE(blk_node_name, bs, bs->name); /* tracers learn the names of live nodes */
	if (backing)
		json_object_set_new(o, "backing_file", json_string(node_filename(backing)));
	json_object_set_new(o, "image", image_info(bs, flat));
	if (throttle_node_group(bs) && bs->next)
		filter_info(o, bs, flat);
	if (bs->dirty_bitmaps)
		json_object_set_new(o, "dirty-bitmaps", qmp_bitmap_info_list(bs));
	return o;
}

/* Newest first, as QEMU lists them. */
static void query_named_block_nodes(struct qmp_req *req, json_t *args)
{
	int flat = qapi_get_bool(args, "flat", false);
	json_t *list = json_array();

	for (struct blk_node *bs = blk_graph_next(NULL); list && bs; bs = blk_graph_next(bs))
		json_array_insert_new(list, 0, qmp_block_node_info(bs, flat));
	if (!list)
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
	else
		qmp_return(req, list);
}

/* ---- BlockStats -------------------------------------------------------------- */

/* QEMU's accounting classes: write-zeroes counts as a write, discard as unmap. */
static void op_sum(const struct blk_stats *s, struct blk_op_stats *rd, struct blk_op_stats *wr,
		   struct blk_op_stats *fl, struct blk_op_stats *un)
{
	const struct blk_op_stats *w = &s->op[BLK_OP_WRITE], *z = &s->op[BLK_OP_WRITE_ZEROES];

	*rd = s->op[BLK_OP_READ];
	*fl = s->op[BLK_OP_FLUSH];
	*un = s->op[BLK_OP_DISCARD];
	*wr = *w;
	wr->ops += z->ops;
	wr->bytes += z->bytes;
	wr->errors += z->errors;
	wr->total_ns += z->total_ns;
}

static json_t *bins(const struct blk_op_stats *o)
{
	json_t *v = json_array();

	for (unsigned i = 0; v && i < BLK_HIST_BUCKETS; i++)
		json_array_append_new(v, json_integer((json_int_t)o->hist[i]));
	return v;
}

/* Bin i counts latencies in [2^i, 2^(i+1)) ns: "boundaries-ns" lists the
 * upper bounds (the last bin takes everything above), as QEMU's
 * BlockLatencyHistogramInfo does; one list of bins per operation. */
static json_t *histograms(const struct blk_stats *s)
{
	json_t *h = json_object(), *b = json_array();

	for (unsigned i = 1; b && i < BLK_HIST_BUCKETS; i++)
		json_array_append_new(b, json_integer((json_int_t)1 << i));
	if (h)
		json_object_set_new(h, "boundaries-ns", b);
	for (unsigned op = 0; h && op < BLK_OP__COUNT; op++)
		json_object_set_new(h, blk_op_name((enum blk_op)op), bins(&s->op[op]));
	return h;
}

static json_t *device_stats(const struct blk_node *bs)
{
	struct blk_op_stats rd, wr, fl, un;
	struct blk_stats s;
	json_t *o;

	blk_get_stats(bs, &s);
	op_sum(&s, &rd, &wr, &fl, &un);
	o = json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "rd_bytes",
		      (json_int_t)rd.bytes, "wr_bytes", (json_int_t)wr.bytes, "unmap_bytes",
		      (json_int_t)un.bytes, "rd_operations", (json_int_t)rd.ops, "wr_operations",
		      (json_int_t)wr.ops, "flush_operations", (json_int_t)fl.ops,
		      "unmap_operations", (json_int_t)un.ops, "rd_total_time_ns",
		      (json_int_t)rd.total_ns, "wr_total_time_ns", (json_int_t)wr.total_ns,
		      "flush_total_time_ns", (json_int_t)fl.total_ns, "unmap_total_time_ns",
		      (json_int_t)un.total_ns, "failed_rd_operations", (json_int_t)rd.errors);
	if (!o)
		return NULL;
	json_object_update_new(
		o,
		json_pack("{s:I,s:I,s:I,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:b,s:b,s:[],s:{s:I,s:o*}}",
			  "failed_wr_operations", (json_int_t)wr.errors, "failed_flush_operations",
			  (json_int_t)fl.errors, "failed_unmap_operations", (json_int_t)un.errors,
			  "invalid_rd_operations", 0, "invalid_wr_operations", 0,
			  "invalid_flush_operations", 0, "invalid_unmap_operations", 0, "rd_merged",
			  0, "wr_merged", 0, "unmap_merged", 0, "wr_highest_offset", 0,
			  "account_invalid", 0, "account_failed", 0, "timed_stats", "x-ioplane",
			  "in-flight", (json_int_t)s.in_flight, "latency-histograms",
			  histograms(&s)));
	json_object_update_new(json_object_get(o, "x-ioplane"),
			       json_pack("{s:I,s:I}", "throttle-waits",
					 (json_int_t)s.throttle_waits, "throttle-wait-ns",
					 (json_int_t)s.throttle_wait_ns));
	return o;
}

/* A node's BlockStats, with its `file` child as "parent" and its backing
 * node as "backing" (QEMU's names), recursively. */
json_t *qmp_block_stats(struct blk_node *bs)
{
	struct blk_node *backing = blk_child(bs, BLK_ROLE_BACKING);
	json_t *o =
		json_pack("{s:s,s:o*}", "node-name", blk_node_name(bs), "stats", device_stats(bs));

	if (o && bs->next)
		json_object_set_new(o, "parent", qmp_block_stats(bs->next));
	if (o && backing)
		json_object_set_new(o, "backing", qmp_block_stats(backing));
	return o;
}

/* Without query-nodes QEMU lists devices (named BlockBackends), of which a
 * storage daemon has none: an empty list, as qsd gives. */
static void query_blockstats(struct qmp_req *req, json_t *args)
{
	json_t *list = json_array();

	if (qapi_get_bool(args, "query-nodes", false))
		for (struct blk_node *bs = blk_graph_next(NULL); list && bs;
		     bs = blk_graph_next(bs))
			json_array_append_new(list, qmp_block_stats(bs));
	if (!list)
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
	else
		qmp_return(req, list);
}

/* ---- the event ---------------------------------------------------------------- */

static void corrupted(const char *node_name, const char *msg, bool fatal)
{
	qmp_event_emit("BLOCK_IMAGE_CORRUPTED",
		       json_pack("{s:s,s:s,s:s,s:b}", "device", "", "node-name", node_name, "msg",
				 msg, "fatal", fatal));
}

static const struct qmp_command query_cmds[] = {
	{.name = "query-named-block-nodes", .args = &named_args, .fn = query_named_block_nodes},
	{.name = "query-blockstats", .args = &stats_args, .fn = query_blockstats},
};

static const struct qmp_event_info corrupted_event = {.name = "BLOCK_IMAGE_CORRUPTED",
						      .data = &corrupted_data};

int qmp_block_query_register(void)
{
	int ret = 0;

	for (size_t i = 0; i < sizeof(query_cmds) / sizeof(query_cmds[0]) && !ret; i++)
		ret = qmp_register(&query_cmds[i]);
	if (!ret)
		ret = qmp_register_event(&corrupted_event);
	if (!ret)
		blk_set_corrupt_handler(loop_current(), corrupted);
	return ret;
}
