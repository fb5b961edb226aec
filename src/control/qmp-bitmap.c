/* The dirty bitmap commands of qemu-storage-daemon 7.2 (qapi/block-core.json
 * and block/monitor/bitmap-qmp-cmds.c's messages), each written as
 * transaction ops: prepare checks, drains the node and makes the change;
 * abort undoes it; clean ends the drain. A stand-alone command is its ops
 * run alone.
 *
 * THREADING RULE: main thread only; bitmaps change while their node is
 * drained (dirty-bitmap.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/dirty-bitmap.h"
#include "block/graph.h"
#include "block/qcow2/qcow2.h"
#include "control/qmp-bitmap.h"
#include "control/qmp.h"
#include "control/schema.h"

static const struct qapi_type bm_args = QAPI_OBJECT_TYPE(
	"BlockDirtyBitmap", QAPI_MEMBERS(QAPI_REQ("node", &qapi_str), QAPI_REQ("name", &qapi_str)));
static const struct qapi_type bm_add_args = QAPI_OBJECT_TYPE(
	"BlockDirtyBitmapAdd",
	QAPI_MEMBERS(QAPI_REQ("node", &qapi_str), QAPI_REQ("name", &qapi_str),
		     QAPI_OPT("granularity", &qapi_uint32), QAPI_OPT("persistent", &qapi_bool),
		     QAPI_OPT("disabled", &qapi_bool)));
static const struct qapi_type bm_or_str =
	QAPI_ALTERNATE_TYPE("BlockDirtyBitmapOrStr", &qapi_str, &bm_args);
static const struct qapi_type bm_or_str_list = QAPI_LIST_TYPE(&bm_or_str);
static const struct qapi_type bm_merge_args =
	QAPI_OBJECT_TYPE("BlockDirtyBitmapMerge",
			 QAPI_MEMBERS(QAPI_REQ("node", &qapi_str), QAPI_REQ("target", &qapi_str),
				      QAPI_REQ("bitmaps", &bm_or_str_list)));

/* What a prepared action keeps until clean. */
struct bm_state {
	struct blk_node *bs;
	struct blk_dirty_bitmap *bm;
	uint64_t *backup; /* clear, merge: the words before */
	bool was_enabled;
	bool drained;
};

static int bm_fail(struct qmp_txn_err *err, const char *fmt, const char *arg)
{
	err->cls = QMP_ERR_GENERIC;
	snprintf(err->desc, sizeof(err->desc), fmt, arg);
	return -EINVAL;
}

/* QEMU's block_dirty_bitmap_lookup. */
static struct blk_dirty_bitmap *bm_lookup(const char *node, const char *name, struct blk_node **bsp,
					  struct qmp_txn_err *err)
{
	struct blk_node *bs = blk_graph_find(node);
	struct blk_dirty_bitmap *bm = bs ? blk_dirty_bitmap_find(bs, name) : NULL;

	if (!bs)
		bm_fail(err, "Node '%s' not found", node);
	else if (!bm)
		bm_fail(err, "Dirty bitmap '%s' not found", name);
	if (bsp)
		*bsp = bs;
	return bm;
}

#define BM_BUSY 1u
#define BM_RO 2u
#define BM_INCONSISTENT 4u
#define BM_DEFAULT (BM_BUSY | BM_RO | BM_INCONSISTENT)

/* QEMU's bdrv_dirty_bitmap_check. */
static int bm_check(const struct blk_dirty_bitmap *bm, unsigned flags, struct qmp_txn_err *err)
{
	if ((flags & BM_BUSY) && bm->busy)
		return bm_fail(err,
			       "Bitmap '%s' is currently in use by another operation and cannot "
			       "be used",
			       bm->name);
	if ((flags & BM_RO) && bm->readonly)
		return bm_fail(err, "Bitmap '%s' is readonly and cannot be modified", bm->name);
	if ((flags & BM_INCONSISTENT) && bm->inconsistent)
		return bm_fail(err, "Bitmap '%s' is inconsistent and cannot be used", bm->name);
	return 0;
}

/* A new state for bs, the node drained. */
static int bm_state_new(struct blk_node *bs, struct blk_dirty_bitmap *bm, void **state,
			struct qmp_txn_err *err)
{
	struct bm_state *st = calloc(1, sizeof(*st));

	if (!st || blk_drain_begin(bs)) {
		free(st);
		return bm_fail(err, "%s", "out of memory");
	}
	st->bs = bs;
	st->bm = bm;
	st->drained = true;
	*state = st;
	return 0;
}

static void bm_commit_nothing(void *state)
{
	(void)state;
}

static void bm_clean(void *state)
{
	struct bm_state *st = state;

	if (st->drained)
		blk_drain_end(st->bs);
	free(st->backup);
	free(st);
}

/* ---- add ---- */

static int bm_add_check(struct blk_node *bs, const char *name, uint32_t gran, bool persistent,
			struct qmp_txn_err *err)
{
	char why[sizeof(err->desc)];

	if (gran < BLK_BITMAP_MIN_GRAN || (gran & (gran - 1)))
		return bm_fail(err, "%s", "Granularity must be power of 2 and at least 512");
	if (persistent && !qcow2_is(bs))
		return bm_fail(err, "Can't store persistent bitmaps to %s: Operation not supported",
			       blk_node_name(bs));
	if (persistent && qcow2_bitmap_can_store(bs, name, gran, why, sizeof(why)))
		return bm_fail(err, "%s", why);
	if (blk_dirty_bitmap_find(bs, name))
		return bm_fail(err, "Bitmap already exists: %s", name);
	if (strlen(name) > BLK_BITMAP_MAX_NAME)
		return bm_fail(err, "Bitmap name too long: %s", name);
	return 0;
}

static int bm_add_prepare(json_t *data, void **state, struct qmp_txn_err *err)
{
	const char *node = qapi_get_str(data, "node"), *name = qapi_get_str(data, "name");
	struct blk_node *bs;
	struct blk_dirty_bitmap *bm;
	uint32_t gran;

	if (!name[0])
		return bm_fail(err, "%s", "Bitmap name cannot be empty");
	bs = blk_graph_find(node);
	if (!bs) {
		err->cls = QMP_ERR_GENERIC;
		snprintf(err->desc, sizeof(err->desc), "Cannot find device='%s' nor node-name='%s'",
			 node, node);
		return -ENODEV;
	}
	gran = (uint32_t)qapi_get_uint(data, "granularity", blk_dirty_bitmap_default_gran(bs));
	if (bm_add_check(bs, name, gran, qapi_get_bool(data, "persistent", false), err))
		return -EINVAL;
	bm = blk_dirty_bitmap_new(name, blk_size(bs), gran);
	if (!bm || bm_state_new(bs, bm, state, err)) {
		blk_dirty_bitmap_free(bm);
		return bm_fail(err, "%s", "out of memory");
	}
	bm->persistent = qapi_get_bool(data, "persistent", false);
	blk_dirty_bitmap_enable(bm, !qapi_get_bool(data, "disabled", false));
	blk_dirty_bitmap_link(bs, bm);
	return 0;
}

static void bm_add_abort(void *state)
{
	struct bm_state *st = state;

	blk_dirty_bitmap_unlink(st->bs, st->bm);
	blk_dirty_bitmap_free(st->bm);
}

/* ---- remove ---- */

static int bm_remove_prepare(json_t *data, void **state, struct qmp_txn_err *err)
{
	struct blk_node *bs;
	struct blk_dirty_bitmap *bm =
		bm_lookup(qapi_get_str(data, "node"), qapi_get_str(data, "name"), &bs, err);

	if (!bm || bm_check(bm, BM_BUSY | BM_RO, err) || bm_state_new(bs, bm, state, err))
		return -EINVAL;
	blk_dirty_bitmap_unlink(bs, bm);
	return 0;
}

/* A persistent bitmap leaves the image when the image is next written
 * back (its close), which frees its clusters. */
static void bm_remove_commit(void *state)
{
	struct bm_state *st = state;

	blk_dirty_bitmap_free(st->bm);
}

static void bm_remove_abort(void *state)
{
	struct bm_state *st = state;

	blk_dirty_bitmap_link(st->bs, st->bm);
}

/* ---- clear and merge: the target's words are kept for abort ---- */

static int bm_backup(struct bm_state *st, struct qmp_txn_err *err)
{
	struct blk_dirty_bitmap *bm = st->bm;

	st->backup = malloc((bm->nwords ? bm->nwords : 1) * sizeof(uint64_t));
	if (!st->backup)
		return bm_fail(err, "%s", "out of memory");
	for (uint64_t i = 0; i < bm->nwords; i++)
		st->backup[i] = atomic_load(&bm->words[i]);
	return 0;
}

static void bm_restore(void *state)
{
	struct bm_state *st = state;

	for (uint64_t i = 0; i < st->bm->nwords; i++)
		atomic_store(&st->bm->words[i], st->backup[i]);
}

static int bm_clear_prepare(json_t *data, void **state, struct qmp_txn_err *err)
{
	struct blk_node *bs;
	struct blk_dirty_bitmap *bm =
		bm_lookup(qapi_get_str(data, "node"), qapi_get_str(data, "name"), &bs, err);

	if (!bm || bm_check(bm, BM_DEFAULT, err) || bm_state_new(bs, bm, state, err))
		return -EINVAL;
	if (bm_backup(*state, err)) {
		bm_clean(*state);
		return -ENOMEM;
	}
	blk_dirty_bitmap_reset_all(bm);
	return 0;
}

/* One source of a merge: a name on the target's node, or {node, name}. */
static const struct blk_dirty_bitmap *bm_merge_src(struct blk_node *bs, json_t *v,
						   const struct blk_dirty_bitmap *dst,
						   struct qmp_txn_err *err)
{
	const struct blk_dirty_bitmap *src;

	if (json_is_string(v)) {
		src = blk_dirty_bitmap_find(bs, json_string_value(v));
		if (!src)
			bm_fail(err, "Dirty bitmap '%s' not found", json_string_value(v));
	} else {
		src = bm_lookup(qapi_get_str(v, "node"), qapi_get_str(v, "name"), NULL, err);
	}
	if (!src || bm_check(src, BM_INCONSISTENT, err))
		return NULL;
	if (src->size != dst->size) {
		err->cls = QMP_ERR_GENERIC;
		snprintf(err->desc, sizeof(err->desc),
			 "Bitmaps are of different sizes (destination size is %llu, source size "
			 "is %llu) and can't be merged",
			 (unsigned long long)dst->size, (unsigned long long)src->size);
		return NULL;
	}
	return src;
}

static int bm_merge_prepare(json_t *data, void **state, struct qmp_txn_err *err)
{
	json_t *list = qapi_get(data, "bitmaps"), *v;
	struct blk_node *bs;
	struct blk_dirty_bitmap *dst =
		bm_lookup(qapi_get_str(data, "node"), qapi_get_str(data, "target"), &bs, err);
	size_t i;

	if (!dst || bm_check(dst, BM_DEFAULT, err))
		return -EINVAL;
	json_array_foreach (list, i, v)
		if (!bm_merge_src(bs, v, dst, err))
			return -EINVAL;
	if (bm_state_new(bs, dst, state, err))
		return -ENOMEM;
	if (bm_backup(*state, err)) {
		bm_clean(*state);
		return -ENOMEM;
	}
	json_array_foreach (list, i, v)
		blk_dirty_bitmap_merge(dst, bm_merge_src(bs, v, dst, err));
	return 0;
}

/* ---- enable, disable ---- */

static int bm_set_enabled(json_t *data, void **state, struct qmp_txn_err *err, bool on)
{
	struct blk_node *bs;
	struct blk_dirty_bitmap *bm =
		bm_lookup(qapi_get_str(data, "node"), qapi_get_str(data, "name"), &bs, err);
	struct bm_state *st;

	if (!bm || bm_check(bm, BM_BUSY | BM_INCONSISTENT, err) || bm_state_new(bs, bm, state, err))
		return -EINVAL;
	st = *state;
	st->was_enabled = blk_dirty_bitmap_enable(bm, on);
	return 0;
}

static int bm_enable_prepare(json_t *data, void **state, struct qmp_txn_err *err)
{
	return bm_set_enabled(data, state, err, true);
}

static int bm_disable_prepare(json_t *data, void **state, struct qmp_txn_err *err)
{
	return bm_set_enabled(data, state, err, false);
}

static void bm_enabled_abort(void *state)
{
	struct bm_state *st = state;

	blk_dirty_bitmap_enable(st->bm, st->was_enabled);
}

/* ---- the ops, the commands ---- */

const struct qmp_txn_ops qmp_txn_bitmap_add = {
	"block-dirty-bitmap-add", &bm_add_args, bm_add_prepare,
	bm_commit_nothing,        bm_add_abort, bm_clean};
const struct qmp_txn_ops qmp_txn_bitmap_remove = {"block-dirty-bitmap-remove",
						  &bm_args,
						  bm_remove_prepare,
						  bm_remove_commit,
						  bm_remove_abort,
						  bm_clean};
const struct qmp_txn_ops qmp_txn_bitmap_clear = {
	"block-dirty-bitmap-clear", &bm_args,   bm_clear_prepare,
	bm_commit_nothing,          bm_restore, bm_clean};
const struct qmp_txn_ops qmp_txn_bitmap_enable = {
	"block-dirty-bitmap-enable", &bm_args,         bm_enable_prepare,
	bm_commit_nothing,           bm_enabled_abort, bm_clean};
const struct qmp_txn_ops qmp_txn_bitmap_disable = {"block-dirty-bitmap-disable",
						   &bm_args,
						   bm_disable_prepare,
						   bm_commit_nothing,
						   bm_enabled_abort,
						   bm_clean};
const struct qmp_txn_ops qmp_txn_bitmap_merge = {
	"block-dirty-bitmap-merge", &bm_merge_args, bm_merge_prepare,
	bm_commit_nothing,          bm_restore,     bm_clean};

/* An action alone: prepare, commit, clean (as qmp_txn_run_one does). */
static void bm_run(struct qmp_req *req, json_t *args, const struct qmp_txn_ops *ops)
{
	struct qmp_txn_err err = {QMP_ERR_GENERIC, ""};
	struct loop *prev;
	void *state = NULL;
	int ret;

	if (blk_ctl_enter(&prev)) {
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
		return;
	}
	ret = ops->prepare(args, &state, &err);
	if (!ret) {
		ops->commit(state);
		ops->clean(state);
	}
	blk_ctl_leave(prev);
	if (ret)
		qmp_error(req, err.cls, "%s", err.desc);
	else
		qmp_return(req, NULL);
}

#define BM_CMD(fn, ops)                                                                            \
	static void fn(struct qmp_req *req, json_t *args)                                          \
	{                                                                                          \
		bm_run(req, args, &(ops));                                                         \
	}
BM_CMD(cmd_add, qmp_txn_bitmap_add)
BM_CMD(cmd_remove, qmp_txn_bitmap_remove)
BM_CMD(cmd_clear, qmp_txn_bitmap_clear)
BM_CMD(cmd_enable, qmp_txn_bitmap_enable)
BM_CMD(cmd_disable, qmp_txn_bitmap_disable)
BM_CMD(cmd_merge, qmp_txn_bitmap_merge)

static const struct qmp_command bm_cmds[] = {
	{.name = "block-dirty-bitmap-add", .args = &bm_add_args, .fn = cmd_add},
	{.name = "block-dirty-bitmap-remove", .args = &bm_args, .fn = cmd_remove},
	{.name = "block-dirty-bitmap-clear", .args = &bm_args, .fn = cmd_clear},
	{.name = "block-dirty-bitmap-enable", .args = &bm_args, .fn = cmd_enable},
	{.name = "block-dirty-bitmap-disable", .args = &bm_args, .fn = cmd_disable},
	{.name = "block-dirty-bitmap-merge", .args = &bm_merge_args, .fn = cmd_merge},
};

static const struct qmp_txn_ops *const bm_txn[] = {
	&qmp_txn_bitmap_add,    &qmp_txn_bitmap_remove,  &qmp_txn_bitmap_clear,
	&qmp_txn_bitmap_enable, &qmp_txn_bitmap_disable, &qmp_txn_bitmap_merge,
};

int qmp_bitmap_register(void)
{
	static bool done;
	int ret = 0;

	if (done)
		return 0;
	for (size_t i = 0; i < sizeof(bm_cmds) / sizeof(bm_cmds[0]) && !ret; i++)
		ret = qmp_register(&bm_cmds[i]);
	/* The same ops are transaction actions. */
	for (size_t i = 0; i < sizeof(bm_txn) / sizeof(bm_txn[0]) && !ret; i++)
		ret = qmp_txn_register(bm_txn[i]);
	done = ret == 0;
	return ret;
}

/* QEMU's BlockDirtyInfo. */
static json_t *bm_info(const struct blk_dirty_bitmap *bm)
{
	json_t *o = json_pack("{s:s,s:b,s:b,s:b,s:I,s:I}", "name", bm->name, "recording",
			      (int)atomic_load(&bm->enabled), "persistent", bm->persistent, "busy",
			      bm->busy != 0, "count", (json_int_t)blk_dirty_bitmap_count(bm),
			      "granularity", (json_int_t)bm->granularity);

	if (o && bm->inconsistent)
		json_object_set_new(o, "inconsistent", json_true());
	return o;
}

json_t *qmp_bitmap_info_list(const struct blk_node *bs)
{
	json_t *list;

	if (!bs->dirty_bitmaps)
		return NULL;
	list = json_array();
	/* Newest first, as QEMU lists them. */
	for (const struct blk_dirty_bitmap *bm = bs->dirty_bitmaps; list && bm; bm = bm->next)
		json_array_insert_new(list, 0, bm_info(bm));
	return list;
}
