/* `ioplane img snapshot`: qemu-img snapshot's command line and messages.
 * -l lists the internal snapshots of a qcow2 image in qemu-img's table; -c
 * creates one (the next free id, the name given, the time now), -a reverts
 * the image to one (found by id, else by name), -d deletes one (found by
 * name, as qemu-img 7.2 finds it).
 *
 * Threading: main thread only (one loop, bound for the command's run). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

static int snap_create(struct blk_node *bs, const char *name)
{
	struct qcow2_snapshot_params p = {.name = name};
	struct timespec ts;
	char msg[256];
	int ret;

	clock_gettime(CLOCK_REALTIME, &ts);
	p.date_sec = (uint32_t)ts.tv_sec;
	p.date_nsec = (uint32_t)(ts.tv_nsec / 1000 * 1000); /* microseconds, as QEMU */
	p.icount = 0;                                       /* qemu-img records 0 */
	ret = qcow2_snapshot_create(bs, &p, msg, sizeof(msg));
	if (ret)
		img_err("Could not create snapshot '%s': %d (%s)", name, ret, strerror(-ret));
	return ret;
}

static int snap_apply(struct blk_node *bs, const char *name)
{
	char msg[256] = "";
	int ret = qcow2_snapshot_goto(bs, name, msg, sizeof(msg));

	if (ret)
		img_err("Could not apply snapshot '%s': Failed to load snapshot: %s", name,
			strerror(-ret));
	return ret;
}

static int snap_delete(struct blk_node *bs, const char *name)
{
	struct qcow2_snapshot_info out = {0};
	char msg[256];
	int ret;

	if (qcow2_snapshot_find(bs, NULL, name) < 0) {
		img_err("Could not delete snapshot '%s': snapshot not found", name);
		return -ENOENT;
	}
	ret = qcow2_snapshot_delete(bs, NULL, name, &out, msg, sizeof(msg));
	if (ret)
		img_err("Could not delete snapshot '%s': Failed to delete snapshot: %s", name, msg);
	free(out.id);
	free(out.name);
	return ret;
}

static int snap_run(struct snap_args *a, struct blk_node *bs, const char *file)
{
	switch (a->action) {
	case 'c':
		return snap_create(bs, a->name);
	case 'a':
		return snap_apply(bs, a->name);
	case 'd':
		return snap_delete(bs, a->name);
	default:
		return snap_list(bs, file);
	}
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
	img_open_opts_from(&oo, &a.c);
	oo.flags |= IMG_OPEN_NO_BACKING; /* as qemu-img: the table is the image's own */
	if (a.action && a.action != 'l')
		oo.flags |= IMG_OPEN_RW;
	ret = img_loop_start(&loop);
	if (!ret)
		ret = img_open(a.c.files[0], &oo, &bs, NULL);
	if (!ret)
		ret = snap_run(&a, bs, a.c.files[0]);
	img_loop_end(loop, bs);
	return ret ? 1 : 0;
}
