/* `ioplane img snapshot`: qemu-img snapshot's command line. -l lists the
 * internal snapshots of a qcow2 image in qemu-img's table; -c, -a and -d
 * (create, apply, delete) are refused: ioplane does not change snapshot
 * tables yet.
 *
 * Threading: main thread only (one loop, bound for the command's run). */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "block/qcow2/qcow2.h"
#include "cmd/cmd.h"
#include "cmd/img-int.h"

struct snap_args {
	struct img_args c;
	int action; /* 'l', 'c', 'a', 'd' */
	const char *name;
};

static void snap_usage(FILE *f)
{
	fprintf(f, "Usage: ioplane img snapshot [--image-opts] [-q] [-U]\n"
		   "         [-l | -a SNAPSHOT | -c SNAPSHOT | -d SNAPSHOT] FILE\n");
}

static int snap_opt(void *ctx, int key, const char *arg)
{
	struct snap_args *a = ctx;

	if (a->action) {
		img_err("Cannot mix '-l', '-a', '-c', '-d'");
		return -EINVAL;
	}
	a->action = key;
	a->name = arg;
	return 0;
}

static const struct img_opt snap_opts[] = {
	{'l', NULL, false}, {'c', NULL, true}, {'a', NULL, true}, {'d', NULL, true}, {0},
};

static const struct img_cmd snap_cmd = {
	.name = "snapshot",
	.common = IMG_C_QUIET | IMG_C_FORCE_SHARE | IMG_C_IMAGE_OPTS, /* no -f, as qemu-img */
	.opts = snap_opts,
	.opt = snap_opt,
	.usage = snap_usage,
	.min_files = 1,
	.max_files = 1,
	.files_err = "Expecting one image file name",
};

/* qemu-img prints nothing for an image without snapshots. */
static int snap_list(struct blk_node *bs, const char *file)
{
	struct qcow2_info q;

	if (!qcow2_is(bs))
		return 0;
	if (qcow2_get_info(bs, &q)) {
		img_err("%s: cannot read the snapshot table", file);
		return -EIO;
	}
	if (q.nb_snapshots)
		img_print_snapshots(&q);
	qcow2_info_free(&q);
	return 0;
}

int cmd_img_snapshot(int argc, char **argv)
{
	struct snap_args a = {0};
	struct img_open_opts oo = {0};
	struct blk_node *bs = NULL;
	struct loop *loop = NULL;
	int ret = img_parse_args(&snap_cmd, argc, argv, &a, &a.c);

	if (ret)
		return ret > 0 ? 0 : 1;
	if (a.action && a.action != 'l') {
		img_err("snapshot -%c: creating, applying and deleting internal snapshots is not "
			"supported by ioplane yet (qemu-img snapshot does it)",
			a.action);
		return 1;
	}
	img_open_opts_from(&oo, &a.c);
	oo.flags |= IMG_OPEN_NO_BACKING; /* as qemu-img: the table is the image's own */
	ret = img_loop_start(&loop);
	if (!ret)
		ret = img_open(a.c.files[0], &oo, &bs, NULL);
	if (!ret)
		ret = snap_list(bs, a.c.files[0]);
	img_loop_end(loop, bs);
	return ret ? 1 : 0;
}
