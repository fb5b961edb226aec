/* --vhost-user-blk for `ioplane serve`: parse each export's options and
 * create it with block-export-add's function (qmp-export.c), which also
 * stops and frees it. Queues of successive exports continue the round-robin
 * over the iothreads, so that queue 0 of every export does not land on the
 * same thread.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/serve-vhost.h"
#include "control/qmp-export.h"
#include "export/vhost-user-blk.h"
#include "util/log.h"
#include "util/opts.h"
#include "util/service.h"

#define EXIT_USAGE 1 /* a bad command line, as in qemu-storage-daemon */

static int vhost_usage(const char *what, const char *arg)
{
	fprintf(stderr, "ioplane serve: --vhost-user-blk: %s '%s' (try 'ioplane serve --help')\n",
		what, arg);
	return EXIT_USAGE;
}

static unsigned default_queues(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	/* Guests expect one queue per vCPU; this host's CPU count is the guess. */
	return n < 1 ? 1 : n > 256 ? 256 : (unsigned)n;
}

/* Fill cfg from one argument; -1 or an exit status. */
static int vhost_parse(struct kv_opts *o, const char *arg, struct vub_export_config *cfg,
		       struct svc_owner *owner, struct blk_node *(*find)(void *, const char *),
		       void *ctx)
{
	char err[256];
	uint64_t nq = default_queues(), lbs = 512;
	const char *id, *unused;

	if (kv_parse(o, arg, NULL) < 0)
		return vhost_usage("expected KEY=VALUE,..., not", arg);
	cfg->path = kv_get(o, "unix");
	id = kv_get(o, "image");
	if (!cfg->path || !*cfg->path || !id)
		return vhost_usage("unix=PATH and image=ID are required in", arg);
	cfg->bs = find(ctx, id);
	if (!cfg->bs)
		return vhost_usage("no --image with ID", id);
	if (kv_get_u64(o, "num-queues", &nq) < 0 || !nq || nq > 256)
		return vhost_usage("num-queues must be 1..256 in", arg);
	if (kv_get_u64(o, "logical-block-size", &lbs) < 0 || (lbs != 512 && lbs != 4096))
		return vhost_usage("logical-block-size must be 512 or 4096 in", arg);
	if (kv_get_bool(o, "writable", &cfg->blk.writable) < 0)
		return vhost_usage("writable must be on or off in", arg);
	cfg->blk.serial = kv_get(o, "serial");
	if (cfg->blk.serial && strlen(cfg->blk.serial) > VIRTIO_BLK_ID_BYTES)
		return vhost_usage("serial has at most 20 characters:", cfg->blk.serial);
	kv_get(o, "id");
	if (svc_owner_parse(o, owner, err, sizeof(err)) < 0)
		return vhost_usage(err, "");
	if (kv_get(o, "mode") && parse_octal_mode(kv_get(o, "mode"), &cfg->mode) < 0)
		return vhost_usage("mode must be octal permissions like 0660, not",
				   kv_get(o, "mode"));
	unused = kv_first_unused(o);
	if (unused)
		return vhost_usage("unknown option", unused);
	cfg->blk.num_queues = (unsigned)nq;
	cfg->blk.logical_block_size = (uint32_t)lbs;
	return -1;
}

/* addr: the unix path, or a socket the service manager passed in whose name
 * is the export's id or which is bound to that path. */
static json_t *vhost_args(struct kv_opts *o, const struct vub_export_config *cfg, int *passed)
{
	const char *img = kv_get(o, "image"), *given = kv_get(o, "id");
	char id[128], fd[16];
	json_t *a, *addr;

	if (given)
		snprintf(id, sizeof(id), "%s", given);
	else
		qmp_export_make_id(img, "vhost", id, sizeof(id));
	*passed = svc_listen_take(id, cfg->path);
	snprintf(fd, sizeof(fd), "%d", *passed);
	addr = *passed >= 0 ? json_pack("{s:s,s:s}", "type", "fd", "str", fd)
			    : json_pack("{s:s,s:s}", "type", "unix", "path", cfg->path);
	a = json_pack("{s:s,s:s,s:s,s:o,s:i,s:I,s:b}", "type", "vhost-user-blk", "id", id,
		      "node-name", img, "addr", addr, "num-queues", (int)cfg->blk.num_queues,
		      "logical-block-size", (json_int_t)cfg->blk.logical_block_size, "writable",
		      cfg->blk.writable);
	if (a && cfg->blk.serial)
		json_object_set_new(a, "serial", json_string(cfg->blk.serial));
	return a;
}

/* Through block-export-add's own function. */
static int vhost_start_one(const char *arg, struct blk_node *(*find)(void *, const char *),
			   void *ctx)
{
	struct vub_export_config cfg = {0};
	struct qmp_export_extra x = {0};
	struct svc_owner owner;
	struct kv_opts o = {0};
	json_t *args = NULL;
	char err[512];
	int passed = -1, ret = vhost_parse(&o, arg, &cfg, &owner, find, ctx);

	if (ret < 0) {
		x.mode = cfg.mode;
		args = vhost_args(&o, &cfg, &passed);
		x.cmdline = passed >= 0;
		ret = args ? qmp_export_add(args, &x, err, sizeof(err)) : -ENOMEM;
		if (ret == 0 && passed < 0 && svc_owner_apply(cfg.path, &owner, err, sizeof(err)))
			ret = -EPERM;
		if (ret < 0 && passed >= 0)
			close(passed);
		if (ret < 0 &&
		    (!strncmp(err, "cannot listen on", 16) || !strncmp(err, "cannot give", 11))) {
			log_err("%s", err); /* a socket, counted as --nbd's */
			ret = 1;
		} else if (ret < 0) {
			fprintf(stderr, "ioplane serve: --vhost-user-blk %s: %s\n", cfg.path, err);
			ret = EXIT_USAGE;
		} else {
			ret = -1;
		}
	}
	json_decref(args);
	kv_free(&o);
	return ret;
}

int serve_vhost_start(char **args, unsigned n,
		      struct blk_node *(*find_image)(void *ctx, const char *id), void *ctx)
{
	unsigned i;
	int ret;

	for (i = 0; i < n; i++) {
		ret = vhost_start_one(args[i], find_image, ctx);
		if (ret >= 0)
			return ret;
	}
	return -1;
}
