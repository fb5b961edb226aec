/* `ioplane img bitmap`, qemu-img's:
 *   bitmap (--merge SOURCE | --add | --remove | --clear | --enable |
 *           --disable)... [-b SOURCE_FILE [-F SOURCE_FMT]] [-g GRANULARITY]
 *           [--image-opts | -f FMT] FILE BITMAP
 * The actions run in command-line order through the same code as the QMP
 * commands (qmp-bitmap.h); the bitmaps are written back when the image
 * closes.
 *
 * Threading: main thread only; one loop bound to it per run. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "block/graph.h"
#include "cmd/cmd.h"
#include "cmd/img-int.h"
#include "control/qmp-bitmap.h"

#define BM_MAX_ACTIONS 64

enum {
	OPT_ADD = IMG_OPT_LOCAL,
	OPT_REMOVE,
	OPT_CLEAR,
	OPT_ENABLE,
	OPT_DISABLE,
	OPT_MERGE,
};

struct bm_action {
	const struct qmp_txn_ops *ops;
	const char *op;  /* qemu-img's word for it */
	const char *src; /* --merge */
};

struct bm_args {
	struct img_args c;
	struct bm_action act[BM_MAX_ACTIONS];
	unsigned nact;
	const char *gran, *src_file, *src_fmt;
	bool add, merge;
};

static void bm_usage(FILE *f)
{
	fprintf(f, "Usage: ioplane img bitmap (--merge SOURCE | --add | --remove | --clear |\n"
		   "                           --enable | --disable)... [-b SOURCE_FILE [-F "
		   "SOURCE_FMT]]\n"
		   "                           [-g GRANULARITY] [--image-opts | -f FMT] FILE "
		   "BITMAP\n\n"
		   "Changes the persistent bitmap BITMAP of a qcow2 image, in the order given.\n");
}

static const struct bm_action bm_kinds[] = {
	[OPT_ADD - IMG_OPT_LOCAL] = {&qmp_txn_bitmap_add, "add", NULL},
	[OPT_REMOVE - IMG_OPT_LOCAL] = {&qmp_txn_bitmap_remove, "remove", NULL},
	[OPT_CLEAR - IMG_OPT_LOCAL] = {&qmp_txn_bitmap_clear, "clear", NULL},
	[OPT_ENABLE - IMG_OPT_LOCAL] = {&qmp_txn_bitmap_enable, "enable", NULL},
	[OPT_DISABLE - IMG_OPT_LOCAL] = {&qmp_txn_bitmap_disable, "disable", NULL},
	[OPT_MERGE - IMG_OPT_LOCAL] = {&qmp_txn_bitmap_merge, "merge", NULL},
};

static int bm_opt(void *ctx, int key, const char *arg)
{
	struct bm_args *a = ctx;

	if (key == 'g' || key == 'b' || key == 'F') {
		*(key == 'g' ? &a->gran : key == 'b' ? &a->src_file : &a->src_fmt) = arg;
		return 0;
	}
	if (a->nact == BM_MAX_ACTIONS) {
		img_err("at most %u actions", BM_MAX_ACTIONS);
		return -EINVAL;
	}
	a->act[a->nact] = bm_kinds[key - IMG_OPT_LOCAL];
	a->act[a->nact++].src = arg;
	a->add |= key == OPT_ADD;
	a->merge |= key == OPT_MERGE;
	return 0;
}

static const struct img_opt bm_opts[] = {
	{OPT_ADD, "add", false},         {OPT_REMOVE, "remove", false},
	{OPT_CLEAR, "clear", false},     {OPT_ENABLE, "enable", false},
	{OPT_DISABLE, "disable", false}, {OPT_MERGE, "merge", true},
	{'g', "granularity", true},      {'b', "source-file", true},
	{'F', "source-format", true},    {0},
};

static const struct img_cmd bm_cmd = {
	.name = "bitmap",
	.common = IMG_C_FORMAT | IMG_C_IMAGE_OPTS,
	.opts = bm_opts,
	.opt = bm_opt,
	.usage = bm_usage,
	.min_files = 2,
	.max_files = 2,
	.files_err = "Expecting filename and bitmap name",
};

/* qemu-img's checks of the combination, in its order. */
static int bm_check_args(const struct bm_args *a, uint64_t *gran)
{
	if (!a->nact)
		img_err("Need at least one of --add, --remove, --clear, --enable, --disable, or "
			"--merge");
	else if (a->gran && !a->add)
		img_err("granularity only supported with --add");
	else if (a->src_fmt && !a->src_file)
		img_err("-F only supported with -b");
	else if (a->src_file && !a->merge)
		img_err("Merge bitmap source file only supported with --merge");
	else if (a->gran && img_parse_size_param(NULL, "granularity", a->gran, gran))
		return -EINVAL;
	else
		return 0;
	return -EINVAL;
}

/* The "data" of one action, as its QMP command takes it. */
static json_t *bm_data(const struct bm_action *x, const char *node, const char *name, uint64_t gran,
		       const char *src_node)
{
	if (x->ops == &qmp_txn_bitmap_merge)
		return json_pack("{s:s,s:s,s:[{s:s,s:s}]}", "node", node, "target", name, "bitmaps",
				 "node", src_node, "name", x->src);
	if (x->ops == &qmp_txn_bitmap_add && gran)
		return json_pack("{s:s,s:s,s:I,s:b}", "node", node, "name", name, "granularity",
				 (json_int_t)gran, "persistent", 1);
	if (x->ops == &qmp_txn_bitmap_add)
		return json_pack("{s:s,s:s,s:b}", "node", node, "name", name, "persistent", 1);
	return json_pack("{s:s,s:s}", "node", node, "name", name);
}

static int bm_run_one(const struct bm_action *x, json_t *data, const char *name)
{
	struct qmp_txn_err err = {0};
	void *state = NULL;
	int ret = data ? x->ops->prepare(data, &state, &err) : -ENOMEM;

	if (!ret) {
		x->ops->commit(state);
		x->ops->clean(state);
	} else {
		img_err("Operation %s on bitmap %s failed: %s", x->op, name,
			data ? err.desc : "out of memory");
	}
	json_decref(data);
	return ret;
}

static int bm_run(const struct bm_args *a, struct blk_node *bs, struct blk_node *src, uint64_t gran)
{
	const char *name = a->c.files[1];
	int ret = 0;

	for (unsigned i = 0; i < a->nact && !ret; i++)
		ret = bm_run_one(&a->act[i],
				 bm_data(&a->act[i], blk_node_name(bs), name, gran,
					 blk_node_name(src ? src : bs)),
				 name);
	return ret;
}

int cmd_img_bitmap(int argc, char **argv)
{
	struct bm_args a = {0};
	struct img_open_opts oo = {0}, so = {0};
	struct blk_node *bs = NULL, *src = NULL;
	struct loop *loop = NULL;
	uint64_t gran = 0;
	int ret = img_parse_args(&bm_cmd, argc, argv, &a, &a.c);

	if (ret)
		return ret > 0 ? 0 : 1;
	if (bm_check_args(&a, &gran))
		return 1;
	img_open_opts_from(&oo, &a.c);
	oo.flags |= IMG_OPEN_RW;
	so.fmt = a.src_fmt;
	ret = img_loop_start(&loop);
	if (!ret)
		ret = img_open(a.c.files[0], &oo, &bs, NULL);
	if (!ret && a.src_file)
		ret = img_open(a.src_file, &so, &src, NULL);
	if (!ret)
		ret = bm_run(&a, bs, src, gran);
	if (src)
		blk_close(src);
	img_loop_end(loop, bs);
	return ret ? 1 : 0;
}
