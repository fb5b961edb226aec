/* --vhost-user-blk for `ioplane serve`: parse each export's options, start
 * it on the iothreads, stop and free it at shutdown. Queues of successive
 * exports continue the round-robin over the iothreads, so that queue 0 of
 * every export does not land on the same thread.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/serve-vhost.h"
#include "export/vhost-user-blk.h"
#include "util/log.h"
#include "util/opts.h"

#define EXIT_USAGE 1 /* a bad command line, as in qemu-storage-daemon */

struct serve_vhost {
	unsigned n;
	struct vub_export **exps;
};

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

static int parse_mode(const char *s, mode_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 8);
	if (errno || end == s || *end || v > 0777)
		return -EINVAL;
	*out = (mode_t)v;
	return 0;
}

/* Fill cfg from one argument; -1 or an exit status. */
static int vhost_parse(struct kv_opts *o, const char *arg, struct vub_export_config *cfg,
		       struct blk_node *(*find)(void *, const char *), void *ctx)
{
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
	if (kv_get(o, "mode") && parse_mode(kv_get(o, "mode"), &cfg->mode) < 0)
		return vhost_usage("mode must be octal permissions like 0660, not", kv_get(o, "mode"));
	unused = kv_first_unused(o);
	if (unused)
		return vhost_usage("unknown option", unused);
	cfg->blk.num_queues = (unsigned)nq;
	cfg->blk.logical_block_size = (uint32_t)lbs;
	return -1;
}

static int vhost_start_one(struct serve_vhost *v, const char *arg, struct vub_export_config *cfg,
			   struct blk_node *(*find)(void *, const char *), void *ctx)
{
	struct kv_opts o = {0};
	char err[256];
	int ret = vhost_parse(&o, arg, cfg, find, ctx);

	if (ret < 0 && vub_export_start(cfg, &v->exps[v->n], err, sizeof(err)) < 0) {
		fprintf(stderr, "ioplane serve: --vhost-user-blk %s: %s\n", cfg->path, err);
		ret = EXIT_USAGE;
	}
	if (ret < 0) {
		v->n++;
		cfg->first_loop += cfg->blk.num_queues;
		/* Not a command-line error: said and counted as --nbd's are. */
		if (vub_export_listen(v->exps[v->n - 1], err, sizeof(err)) < 0) {
			log_err("%s", err);
			ret = 1;
		}
	}
	kv_free(&o); /* the export copied what it keeps */
	return ret;
}

int serve_vhost_start(char **args, unsigned n,
		      struct blk_node *(*find_image)(void *ctx, const char *id), void *ctx,
		      struct loop *main_loop, struct loop **loops, unsigned nloops,
		      struct serve_vhost **out)
{
	struct vub_export_config cfg = {.main_loop = main_loop, .loops = loops, .nloops = nloops};
	struct serve_vhost *v = calloc(1, sizeof(*v));
	unsigned i;
	int ret;

	*out = v;
	if (!v || !(v->exps = calloc(n ? n : 1, sizeof(*v->exps))))
		return 1;
	for (i = 0; i < n; i++) {
		unsigned first = cfg.first_loop;

		memset(&cfg.blk, 0, sizeof(cfg.blk));
		cfg.mode = 0;
		cfg.first_loop = first;
		ret = vhost_start_one(v, args[i], &cfg, find_image, ctx);
		if (ret >= 0)
			return ret;
	}
	return -1;
}

unsigned serve_vhost_stop(struct serve_vhost *v, void (*done)(void *opaque), void *opaque)
{
	unsigned i;

	for (i = 0; v && i < v->n; i++)
		vub_export_stop(v->exps[i], done, opaque);
	return v ? v->n : 0;
}

unsigned serve_vhost_count(const struct serve_vhost *v)
{
	return v ? v->n : 0;
}

void serve_vhost_free(struct serve_vhost *v)
{
	unsigned i;

	if (!v)
		return;
	for (i = 0; i < v->n; i++)
		vub_export_free(v->exps[i]);
	free(v->exps);
	free(v);
}
