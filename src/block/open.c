/* Opening and closing node stacks from key=value options: a protocol node
 * (driver=file|null|nbd|rbd) and, when asked for or implied, a format node on top;
 * the node graph (children with roles) and the walkers that go through it.
 *
 * Threading: main thread, with no request in flight on the stack, except
 * blk_detach_loop(), which runs on the loop that is going away. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-int.h"
#include "block/dirty-bitmap.h"
#include "block/graph.h"
#include "util/opts.h"

/* Options applied by the core to every node of the stack. */
struct open_common {
	bool read_only;
	bool discard_ignore;
	bool force_share;
	bool no_io;
	bool no_flush;
	uint8_t detect_zeroes;
	uint64_t req_align; /* 0: none asked for */
};

static int open_parse_detect_zeroes(struct kv_opts *opts, struct open_common *c, char *err,
				    size_t errlen)
{
	const char *dz = kv_get(opts, "detect-zeroes");

	if (!dz || !strcmp(dz, "off"))
		c->detect_zeroes = BLK_DETECT_ZEROES_OFF;
	else if (!strcmp(dz, "on"))
		c->detect_zeroes = BLK_DETECT_ZEROES_ON;
	else if (!strcmp(dz, "unmap"))
		c->detect_zeroes = BLK_DETECT_ZEROES_UNMAP;
	else {
		snprintf(err, errlen, "detect-zeroes: expected off, on or unmap, not '%s'", dz);
		return -EINVAL;
	}
	return 0;
}

static int open_parse_common(struct kv_opts *opts, struct open_common *c, char *err, size_t errlen)
{
	const char *discard = kv_get(opts, "discard");

	if (open_parse_detect_zeroes(opts, c, err, errlen))
		return -EINVAL;
	if (kv_get_bool(opts, "read-only", &c->read_only)) {
		snprintf(err, errlen, "read-only: expected on or off");
		return -EINVAL;
	}
	if (kv_get_bool(opts, "force-share", &c->force_share)) {
		snprintf(err, errlen, "force-share: expected on or off");
		return -EINVAL;
	}
	if (kv_get_bool(opts, "no-flush", &c->no_flush)) {
		snprintf(err, errlen, "no-flush: expected on or off");
		return -EINVAL;
	}
	if (kv_get_bool(opts, "x-no-io", &c->no_io)) {
		snprintf(err, errlen, "x-no-io: expected on or off");
		return -EINVAL;
	}
	if (c->force_share && !c->read_only) {
		snprintf(err, errlen, "force-share=on can only be used with read-only images");
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
	unsigned i;

	blk_graph_unregister(bs); /* no walker from the registry's roots comes here */
	/* Each child loses this parent (and closes if it was the last user);
	 * also the children a driver registered before its open() failed. */
	for (i = bs->nchildren; i-- > 0;) {
		struct blk_node *c = bs->children[i].node;
		bool stays = c->refcnt > 1;
		char err[256];

		c->nparents--;
		blk_unref(c, NULL);
		/* A child another user keeps needs no more what this parent
		 * needed of it; dropping permissions cannot conflict. */
		if (stays)
			blk_perm_refresh(c, err, sizeof(err));
	}
	blk_stats_free(bs);
	blk_track_free(bs);
	blk_dirty_bitmaps_free(bs);
	free(bs->name);
	free(bs);
}

static struct blk_node *node_new(const struct blk_driver *drv, struct blk_node *next,
				 const struct open_common *c)
{
	struct blk_node *bs = calloc(1, sizeof(*bs));

	if (!bs || blk_graph_register(bs)) {
		free(bs);
		return NULL;
	}
	bs->drv = drv;
	bs->align = 1;
	bs->mem_align = 1;
	bs->read_only = c->read_only;
	bs->discard_ignore = c->discard_ignore;
	bs->no_flush = c->no_flush;
	if (next)
		blk_add_child(bs, BLK_ROLE_FILE, next); /* the first child: cannot fail */
	bs->force_share = c->force_share;
	bs->no_io = c->no_io;
	bs->user_shared = bs->shared = BLK_PERM_ALL;
	return bs;
}

/* drv->open, with a format's `next` locked before it (for what the driver
 * needs while it has no users: it reads and may write `next` in open()) and
 * after it, with the children open() added (qcow2: backing, data file). */
static int open_locked(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	int ret = bs->next ? blk_perm_refresh(bs, err, errlen) : 0;

	if (ret || (ret = bs->drv->open(bs, opts, err, errlen)))
		return ret;
	ret = bs->next ? blk_perm_refresh(bs, err, errlen) : 0;
	if (ret && bs->drv->close)
		bs->drv->close(bs);
	return ret;
}

static void unref_all(const struct blk_child *v, unsigned from, unsigned n);

/* Open one node on top of `next` (NULL for a protocol node), with the
 * children in extra (references the node takes over, also on failure)
 * made its children before the driver's open(), which finds them with
 * blk_child(). On failure `next` is still the caller's. */
static int open_node(const struct blk_driver *drv, struct blk_node *next,
		     const struct blk_child *extra, unsigned nextra, struct kv_opts *opts,
		     const struct open_common *c, struct blk_node **out, char *err, size_t errlen)
{
	struct blk_node *bs = node_new(drv, next, c);
	unsigned i;
	int ret = 0;

	if (!bs) {
		unref_all(extra, 0, nextra);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (i = 0; i < nextra && !ret; i++)
		ret = blk_add_child(bs, extra[i].role, extra[i].node);
	if (ret) {
		unref_all(extra, i - 1, nextra);
		snprintf(err, errlen, "too many children");
	} else {
		ret = open_locked(bs, opts, err, errlen);
	}
	if (ret) {
		blk_take_child(bs, BLK_ROLE_FILE); /* still the caller's to close */
		blk_node_free(bs);
		return ret;
	}
	bs->align = bs->align ? bs->align : 1;
	bs->mem_align = bs->mem_align ? bs->mem_align : 1;
	bs->has_fua = open_probe(drv->can_fua, bs);
	bs->has_discard = open_probe(drv->can_discard, bs);
	bs->has_write_zeroes = open_probe(drv->can_write_zeroes, bs);
	bs->has_block_status = open_probe(drv->can_block_status, bs);
	bs->write_slow = bs->read_only;
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

static int open_track_init(struct blk_node *bs, void *opaque)
{
	(void)opaque;
	return blk_track_init(bs);
}

/* After the drivers: request-alignment, leftover options, overlap lists. */
static int open_finish(struct blk_node *top, struct kv_opts *opts, const struct open_common *c,
		       char *err, size_t errlen)
{
	const char *unused = kv_first_unused(opts);

	if (unused) {
		snprintf(err, errlen, "unknown option '%s'", unused);
		return -EINVAL;
	}
	/* On the node asked for: what its users write. */
	top->detect_zeroes = c->detect_zeroes;
	top->write_slow |= c->detect_zeroes != BLK_DETECT_ZEROES_OFF;
	if (c->req_align > top->align)
		top->align = (uint32_t)c->req_align;
	if (blk_walk(top, open_track_init, NULL)) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
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
		ret = open_node(pdrv, NULL, NULL, 0, opts, &c, &proto, err, errlen);
	if (ret)
		return ret;
	top = proto;
	if (fdrv) {
		ret = open_node(fdrv, proto, NULL, 0, opts, &c, &top, err, errlen);
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

static void unref_all(const struct blk_child *v, unsigned from, unsigned n)
{
	for (unsigned i = from; i < n; i++)
		blk_unref(v[i].node, NULL);
}

int blk_open_node(const char *driver, struct blk_node *file, const struct blk_child *extra,
		  unsigned nextra, struct kv_opts *opts, struct blk_node **out, char *err,
		  size_t errlen)
{
	const struct blk_driver *drv = NULL;
	struct open_common c = {0};
	struct blk_node *bs = NULL;
	int ret;

	blk_register_builtin_drivers();
	ret = open_parse_common(opts, &c, err, errlen);
	if (!ret)
		ret = open_find(driver, file != NULL, &drv, err, errlen);
	if (ret) {
		unref_all(extra, 0, nextra);
		blk_unref(file, NULL);
		return ret;
	}
	ret = open_node(drv, file, extra, nextra, opts, &c, &bs, err, errlen);
	if (ret) {
		blk_unref(file, NULL);
		return ret;
	}
	ret = open_finish(bs, opts, &c, err, errlen);
	if (ret) {
		blk_close(bs);
		return ret;
	}
	*out = bs;
	return 0;
}

const char *blk_target_remote(const char *target)
{
	if (!strncmp(target, "nbd://", 6) || !strncmp(target, "nbd+unix://", 11))
		return "nbd";
	if (!strncmp(target, "rbd:", 4))
		return "rbd";
	return NULL;
}

int blk_target_opts(struct kv_opts *o, const char *target)
{
	const char *remote = blk_target_remote(target);
	int ret;

	if (strncmp(target, "null:", 5) == 0) {
		ret = kv_parse(o, target + 5, NULL);
		return ret ? ret : kv_set(o, "driver", "null");
	}
	ret = kv_set(o, "driver", remote ? remote : "file");
	return ret ? ret : kv_set(o, "filename", target);
}

/* Options of a TARGET (blk_target_opts), a format and more options. */
static int open_target_opts(struct kv_opts *o, const char *target, const char *fmt,
			    const char *extra)
{
	struct kv_opts e = {0};
	size_t i;
	int ret;

	ret = blk_target_opts(o, target);
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

/* The opener's reference: the node closes when it was the last. */
void blk_close(struct blk_node *bs)
{
	blk_unref(bs, NULL);
}

void blk_node_destroy(struct blk_node *bs)
{
	if (bs->drv->close)
		bs->drv->close(bs);
	blk_node_free(bs); /* and the children */
}

/* ---- the graph ---------------------------------------------------------- */

int blk_add_child(struct blk_node *bs, const char *role, struct blk_node *child)
{
	unsigned i = bs->nchildren;

	if (i == BLK_MAX_CHILDREN)
		return -ENOSPC;
	if (!strcmp(role, BLK_ROLE_FILE)) {
		memmove(&bs->children[1], &bs->children[0], i * sizeof(bs->children[0]));
		i = 0;
		bs->next = child;
	}
	bs->children[i] = (struct blk_child){.role = role, .node = child};
	bs->nchildren++;
	child->nparents++; /* the caller's reference is the parent's now */
	return 0;
}

struct blk_node *blk_child(const struct blk_node *bs, const char *role)
{
	unsigned i;

	for (i = 0; i < bs->nchildren; i++)
		if (!strcmp(bs->children[i].role, role))
			return bs->children[i].node;
	return NULL;
}

struct blk_node *blk_take_child(struct blk_node *bs, const char *role)
{
	struct blk_node *child;
	unsigned i;

	for (i = 0; i < bs->nchildren && strcmp(bs->children[i].role, role); i++)
		;
	if (i == bs->nchildren)
		return NULL;
	child = bs->children[i].node;
	memmove(&bs->children[i], &bs->children[i + 1],
		(bs->nchildren - i - 1) * sizeof(bs->children[0]));
	bs->nchildren--;
	child->nparents--; /* and the parent's reference the caller's */
	if (bs->next == child)
		bs->next = NULL;
	return child;
}

int blk_walk(struct blk_node *bs, int (*fn)(struct blk_node *bs, void *opaque), void *opaque)
{
	unsigned i;
	int ret = fn(bs, opaque);

	for (i = 0; !ret && i < bs->nchildren; i++)
		ret = blk_walk(bs->children[i].node, fn, opaque);
	return ret;
}

static int detach_one(struct blk_node *bs, void *loop)
{
	blk_detach_node(bs, loop);
	return 0;
}

void blk_detach_node(struct blk_node *bs, struct loop *loop)
{
	struct loop *l = loop;

	/* A drain no longer asks this loop about the node. */
	atomic_compare_exchange_strong(&bs->loops[loop_index(l)], &l, NULL);
	if (bs->drv->detach_loop)
		bs->drv->detach_loop(bs, loop);
}

void blk_detach_loop(struct blk_node *bs, struct loop *loop)
{
	blk_walk(bs, detach_one, loop);
}

/* Parents first: a format node's flush writes its metadata into the
 * children, whose own flush then finds nothing left, or what it missed. */
int blk_flush_tree_sync(struct blk_node *bs)
{
	unsigned i;
	int ret, r;

	if (bs->read_only)
		return 0;
	ret = blk_flush_sync_ungated(bs);
	for (i = 0; i < bs->nchildren; i++) {
		r = blk_flush_tree_sync(bs->children[i].node);
		ret = ret < 0 ? ret : r;
	}
	return ret;
}

bool blk_children_can_multi_conn(struct blk_node *bs)
{
	unsigned i;

	for (i = 0; i < bs->nchildren; i++) {
		struct blk_node *c = bs->children[i].node;

		if (!c->read_only && !blk_can_multi_conn(c))
			return false;
	}
	return true;
}
