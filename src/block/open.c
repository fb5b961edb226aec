/* Opening and closing node stacks from key=value options: a protocol node
 * (driver=file|null) and, when asked for or implied, a format node on top.
 *
 * Threading: main thread, with no request in flight on the stack. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-int.h"
#include "util/opts.h"

/* Options applied by the core to every node of the stack. */
struct open_common {
	bool read_only;
	bool discard_ignore;
	uint64_t req_align; /* 0: none asked for */
};

static int open_parse_common(struct kv_opts *opts, struct open_common *c, char *err, size_t errlen)
{
	const char *discard = kv_get(opts, "discard");

	if (kv_get_bool(opts, "read-only", &c->read_only)) {
		snprintf(err, errlen, "read-only: expected on or off");
		return -EINVAL;
	}
	if (discard && strcmp(discard, "ignore") == 0) {
		c->discard_ignore = true;
	} else if (discard && strcmp(discard, "unmap") != 0) {
		snprintf(err, errlen, "discard: expected unmap or ignore, not '%s'", discard);
		return -EINVAL;
	}
	if (kv_get_size(opts, "request-alignment", &c->req_align) ||
	    (c->req_align & (c->req_align - 1)) || c->req_align > (1u << 30)) {
		snprintf(err, errlen, "request-alignment: expected a power of two");
		return -EINVAL;
	}
	return 0;
}

static bool open_probe(bool (*probe)(struct blk_node *bs), struct blk_node *bs)
{
	return probe && probe(bs);
}

static void blk_node_free(struct blk_node *bs)
{
	blk_stats_free(bs);
	blk_track_free(bs);
	free(bs->name);
	free(bs);
}

/* Open one node on top of `next` (NULL for a protocol node). */
static int open_node(const struct blk_driver *drv, struct blk_node *next, struct kv_opts *opts,
		     const struct open_common *c, struct blk_node **out, char *err, size_t errlen)
{
	struct blk_node *bs = calloc(1, sizeof(*bs));
	int ret;

	if (!bs || !(bs->name = strdup(drv->name))) {
		free(bs);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	bs->drv = drv;
	bs->next = next;
	bs->align = 1;
	bs->mem_align = 1;
	bs->read_only = c->read_only;
	bs->discard_ignore = c->discard_ignore;
	ret = drv->open(bs, opts, err, errlen);
	if (ret) {
		blk_node_free(bs);
		return ret;
	}
	bs->align = bs->align ? bs->align : 1;
	bs->mem_align = bs->mem_align ? bs->mem_align : 1;
	bs->has_fua = open_probe(drv->can_fua, bs);
	bs->has_discard = open_probe(drv->can_discard, bs);
	bs->has_write_zeroes = open_probe(drv->can_write_zeroes, bs);
	bs->has_block_status = open_probe(drv->can_block_status, bs);
	*out = bs;
	return 0;
}

static int open_find(const char *name, bool format, const struct blk_driver **out, char *err,
		     size_t errlen)
{
	const struct blk_driver *drv = blk_find_driver(name);

	if (!drv || drv->is_format != format) {
		snprintf(err, errlen, "unknown %s '%s'", format ? "format" : "driver", name);
		return -EINVAL;
	}
	*out = drv;
	return 0;
}

/* After the drivers: request-alignment, leftover options, overlap lists. */
static int open_finish(struct blk_node *top, struct kv_opts *opts, const struct open_common *c,
		       char *err, size_t errlen)
{
	const char *unused = kv_first_unused(opts);
	struct blk_node *bs;

	if (unused) {
		snprintf(err, errlen, "unknown option '%s'", unused);
		return -EINVAL;
	}
	if (c->req_align > top->align)
		top->align = (uint32_t)c->req_align;
	for (bs = top; bs; bs = bs->next) {
		if (blk_track_init(bs)) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	}
	return 0;
}

int blk_open(struct kv_opts *opts, struct blk_node **out, char *err, size_t errlen)
{
	const struct blk_driver *pdrv, *fdrv = NULL;
	struct open_common c = {0};
	struct blk_node *proto = NULL, *top = NULL;
	const char *driver, *format;
	int ret;

	blk_register_builtin_drivers();
	ret = open_parse_common(opts, &c, err, errlen);
	if (ret)
		return ret;
	driver = kv_get(opts, "driver");
	format = kv_get(opts, "format");
	if (!driver) {
		snprintf(err, errlen, "missing option 'driver'");
		return -EINVAL;
	}
	if (!format && strcmp(driver, "file") == 0)
		format = "raw";
	ret = open_find(driver, false, &pdrv, err, errlen);
	if (!ret && format)
		ret = open_find(format, true, &fdrv, err, errlen);
	if (!ret)
		ret = open_node(pdrv, NULL, opts, &c, &proto, err, errlen);
	if (ret)
		return ret;
	top = proto;
	if (fdrv) {
		ret = open_node(fdrv, proto, opts, &c, &top, err, errlen);
		if (ret)
			goto fail;
	}
	ret = open_finish(top, opts, &c, err, errlen);
	if (ret)
		goto fail;
	*out = top;
	return 0;
fail:
	blk_close(top); /* top is proto unless the format node opened */
	return ret;
}

/* Options of a TARGET: "null:KEY=VAL,..." or a file name. */
static int open_target_opts(struct kv_opts *o, const char *target, const char *fmt,
			    const char *extra)
{
	struct kv_opts e = {0};
	size_t i;
	int ret;

	if (strncmp(target, "null:", 5) == 0) {
		ret = kv_parse(o, target + 5, NULL);
		if (!ret)
			ret = kv_set(o, "driver", "null");
	} else {
		ret = kv_set(o, "driver", "file");
		if (!ret)
			ret = kv_set(o, "filename", target);
	}
	if (!ret && fmt)
		ret = kv_set(o, "format", fmt);
	if (!ret && extra)
		ret = kv_parse(&e, extra, NULL);
	for (i = 0; !ret && i < e.n; i++)
		ret = kv_set(o, e.v[i].key, e.v[i].val);
	kv_free(&e);
	return ret;
}

int blk_open_target(const char *target, const char *fmt, const char *extra, struct blk_node **out,
		    char *err, size_t errlen)
{
	struct kv_opts o = {0};
	int ret;

	ret = open_target_opts(&o, target, fmt, extra);
	if (ret)
		snprintf(err, errlen, "%s: invalid options", target);
	else
		ret = blk_open(&o, out, err, errlen);
	kv_free(&o);
	return ret;
}

void blk_close(struct blk_node *bs)
{
	while (bs) {
		struct blk_node *next = bs->next;

		if (bs->drv->close)
			bs->drv->close(bs);
		blk_node_free(bs);
		bs = next;
	}
}

void blk_detach_loop(struct blk_node *bs, struct loop *loop)
{
	for (; bs; bs = bs->next)
		if (bs->drv->detach_loop)
			bs->drv->detach_loop(bs, loop);
}
