/* qcow2 backing chain and external data file: opening them from the header
 * (backing file name + backing format extension, data file name extension)
 * or from options, and reading through the backing file.
 *
 * Formats are never probed: a backing file whose format is neither declared
 * in the image nor given with backing-format= is refused, so that a guest
 * cannot turn a raw backing file into a qcow2 image pointing at host files.
 *
 * Both are children of the qcow2 node (roles `backing`, `data-file`): the
 * core closes them after qcow2's close, and its walkers (detach, flush)
 * reach them.
 *
 * Threading: open/close on the main thread; reads in request coroutines. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "block/graph.h"
#include "block/qcow2/qcow2-int.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/opts.h"
#include "util/path.h"

static __thread unsigned qc_chain_depth;

/* The files the chains being opened on this thread use so far: each
 * image's own file, pushed while its children open, and its external data
 * file, pushed while its backing chain opens. A backing or data file that is
 * one of them would make the chain a loop, or put guest data over an image's
 * metadata: refused whatever the locking setting. */
static __thread struct qc_file_id qc_used[2 * (QC_MAX_CHAIN + 1)];
static __thread unsigned qc_nused;

bool qc_file_id(const char *path, struct qc_file_id *id)
{
	struct stat st;

	if (!path || stat(path, &st) != 0)
		return false;
	*id = (struct qc_file_id){.dev = st.st_dev, .ino = st.st_ino, .valid = true};
	return true;
}

static bool qc_used_has(const struct qc_file_id *id)
{
	for (unsigned i = 0; i < qc_nused; i++)
		if (qc_used[i].ino == id->ino && qc_used[i].dev == id->dev)
			return true;
	return false;
}

static void qc_used_push(const struct qc_file_id *id)
{
	if (id->valid && qc_nused < ARRAY_SIZE(qc_used))
		qc_used[qc_nused++] = *id;
}

/* Open path unless the chain uses it already (-ELOOP); the image's own
 * file (and its data file, for the backing chain) count as used meanwhile. */
static int qc_open_unused(struct qc_state *s, struct kv_opts *o, const char *path, bool backing,
			  struct blk_node **out, char *err, size_t errlen)
{
	struct qc_file_id self = {0}, child;
	unsigned mark = qc_nused;
	int ret;

	qc_file_id(s->image_path, &self);
	qc_used_push(&self);
	if (backing)
		qc_used_push(&s->data_id);
	if (qc_file_id(path, &child) && qc_used_has(&child)) {
		snprintf(err, errlen, "it is the image itself or one of its backing files");
		ret = -ELOOP;
	} else {
		qc_chain_depth++;
		ret = blk_open(o, out, err, errlen);
		qc_chain_depth--;
	}
	qc_nused = mark;
	return ret;
}

/* Options of the image that its backing and data files take too. */
static const char *const qc_inherited[] = {"cache",   "aio",         "aio-max-batch",
					   "locking", "force-share", "x-no-io"};

/* Open PATH as the given format, read-only unless rw, with the cache,
 * engine and locking options of the image itself. */
static int qc_open_child(struct qc_state *s, struct kv_opts *opts, const char *path,
			 const char *fmt, bool rw, struct blk_node **out, char *err, size_t errlen,
			 bool relative)
{
	struct kv_opts o = {0};
	char *full = relative ? path_relative(s->image_path, path) : strdup(path);
	int ret;

	if (!full)
		return -ENOMEM;
	ret = kv_set(&o, "driver", "file");
	if (!ret)
		ret = kv_set(&o, "filename", full);
	if (!ret && fmt)
		ret = kv_set(&o, "format", fmt);
	if (!ret)
		ret = kv_set(&o, "read-only", rw ? "off" : "on");
	for (size_t i = 0; !ret && i < ARRAY_SIZE(qc_inherited); i++) {
		const char *v = kv_get(opts, qc_inherited[i]);

		if (v)
			ret = kv_set(&o, qc_inherited[i], v);
	}
	if (!ret)
		ret = qc_open_unused(s, &o, full, relative, out, err, errlen);
	kv_free(&o);
	free(full);
	return ret;
}

/* Make a node just opened a child of the qcow2 node (closed on failure). */
static int qc_adopt(struct qc_state *s, const char *role, struct blk_node **node, char *err,
		    size_t errlen)
{
	int ret = blk_add_child(s->bs, role, *node);

	if (ret) {
		blk_close(*node);
		*node = NULL;
		snprintf(err, errlen, "qcow2: too many children");
	}
	return ret;
}

int qc_backing_open(struct qc_state *s, struct kv_opts *opts, char *err, size_t errlen)
{
	const char *name = kv_get(opts, "backing"), *fmt = kv_get(opts, "backing-format");
	struct blk_node *given = blk_child(s->bs, BLK_ROLE_BACKING);
	char sub[256];
	int ret;

	if (given) { /* blockdev-add's backing: a node */
		s->backing = given;
		s->backing_size = given->size;
		return 0;
	}
	if (!name)
		name = s->backing_name;
	if (!fmt)
		fmt = s->backing_fmt;
	if (!name || !*name)
		return 0;
	if (!fmt) {
		snprintf(err, errlen,
			 "qcow2: backing file '%s' has no declared format (formats are "
			 "never probed); give it with backing-format=raw|qcow2",
			 name);
		return -EINVAL;
	}
	if (strcmp(fmt, "raw") && strcmp(fmt, "qcow2")) {
		snprintf(err, errlen, "qcow2: unsupported backing format '%s'", fmt);
		return -ENOTSUP;
	}
	if (qc_chain_depth >= QC_MAX_CHAIN) {
		snprintf(err, errlen, "qcow2: backing chain longer than %d (a loop?)",
			 QC_MAX_CHAIN);
		return -ELOOP;
	}
	ret = qc_open_child(s, opts, name, fmt, false, &s->backing, sub, sizeof(sub), true);
	if (ret == -ELOOP && qc_chain_depth == 0) {
		struct qc_file_id b;
		char *full = path_relative(s->image_path, name);
		bool data = full && qc_file_id(full, &b) && s->data_id.valid &&
			    b.dev == s->data_id.dev && b.ino == s->data_id.ino;

		free(full);
		snprintf(err, errlen, "qcow2: backing file '%s' %s", name,
			 data ? "is the image's data file too" : "creates an infinite loop");
		return ret;
	}
	if (ret) {
		snprintf(err, errlen, "qcow2: cannot open backing file '%s': %s", name, sub);
		return ret;
	}
	ret = qc_adopt(s, BLK_ROLE_BACKING, &s->backing, err, errlen);
	if (ret)
		return ret;
	s->backing_size = s->backing->size;
	return 0;
}

int qc_data_open(struct qc_state *s, struct kv_opts *opts, char *err, size_t errlen)
{
	const char *name = kv_get(opts, "data-file");
	struct blk_node *given = blk_child(s->bs, BLK_ROLE_DATA_FILE);
	char sub[256];
	int ret;

	if (!(s->h.incompat & QC_INCOMPAT_DATA_FILE)) {
		s->data = s->file;
		return name || given ? (snprintf(err, errlen,
						 "qcow2: data-file given but the image has no "
						 "external data file"),
					-EINVAL)
				     : 0;
	}
	if (given) { /* blockdev-add's data-file: a node */
		s->data = given;
		goto adopted;
	}
	if (!name)
		name = s->data_name;
	if (!name) {
		snprintf(err, errlen,
			 "qcow2: the image uses an external data file but names none; "
			 "give it with data-file=PATH");
		return -EINVAL;
	}
	/* As QEMU does: the name is used as it is, not relative to the image.
	 * data-file=null:size=SIZE[,,...] (from the option, never from the
	 * header) puts the null driver under the metadata, for benchmarks. */
	if (name != s->data_name && !strncmp(name, "null:", 5))
		ret = blk_open_target(name, NULL, s->bs->read_only ? "read-only=on" : NULL,
				      &s->data, sub, sizeof(sub));
	else
		ret = qc_open_child(s, opts, name, NULL, !s->bs->read_only, &s->data, sub,
				    sizeof(sub), false);
	if (ret) {
		snprintf(err, errlen, "qcow2: cannot open data file '%s': %s", name, sub);
		return ret;
	}
	ret = qc_adopt(s, BLK_ROLE_DATA_FILE, &s->data, err, errlen);
	if (ret)
		return ret;
adopted:
	s->data_external = true;
	qc_file_id(name, &s->data_id);
	s->data_size = s->data->size;
	s->data_fresh_from = qc_align_up(s->data->size, s->cluster_size);
	return 0;
}

/* The nodes themselves are the core's to close: they are children. */
void qc_backing_close(struct qc_state *s)
{
	s->backing = NULL;
	s->data = NULL;
	s->data_external = false;
}

int qc_backing_read(struct qc_state *s, uint64_t off, uint64_t len, const struct iovec *iov,
		    int iovcnt, size_t iov_off)
{
	uint64_t n = !s->backing || off >= s->backing_size ? 0 : s->backing_size - off;

	if (n > len)
		n = len;
	if (n < len)
		iov_memset(iov, iovcnt, iov_off + n, 0, len - n);
	return n ? qc_co_rw_iov(s->backing, BLK_OP_READ, off, n, iov, iovcnt, iov_off) : 0;
}

int qcow2_attach_backing(struct blk_node *bs, struct blk_node *backing, char *err, size_t errlen)
{
	struct qc_state *s;
	int ret;

	if (!qcow2_is(bs)) {
		snprintf(err, errlen, "The overlay does not support backing images"); /* QEMU's */
		return -ENOTSUP;
	}
	s = qc_state(bs);
	if (s->backing || blk_child(bs, BLK_ROLE_BACKING)) {
		snprintf(err, errlen, "The overlay already has a backing image");
		return -EEXIST;
	}
	blk_ref(backing, NULL); /* the parent link takes it over */
	ret = blk_add_child(bs, BLK_ROLE_BACKING, backing);
	if (ret) {
		blk_unref(backing, NULL);
		snprintf(err, errlen, "qcow2: too many children");
		return ret;
	}
	s->backing = backing;
	s->backing_size = backing->size;
	ret = blk_set_perm(bs, bs->user_perm, bs->user_shared, err, errlen);
	if (ret)
		qcow2_detach_backing(bs);
	return ret;
}

void qcow2_detach_backing(struct blk_node *bs)
{
	struct qc_state *s = qc_state(bs);
	struct blk_node *b = blk_take_child(bs, BLK_ROLE_BACKING);

	s->backing = NULL;
	s->backing_size = 0;
	blk_set_perm(bs, bs->user_perm, bs->user_shared, NULL, 0); /* drops: cannot fail */
	blk_unref(b, NULL);
}

struct qc_backing_change {
	struct qc_state *s;
	const char *name, *fmt;
};

static int qc_change_backing_co(void *arg)
{
	struct qc_backing_change *c = arg;
	int ret;

	qc_co_lock(c->s, &c->s->meta);
	ret = qc_header_set_backing(c->s, c->name, c->fmt);
	qc_co_unlock(c->s, &c->s->meta);
	return ret;
}

int qcow2_change_backing_file(struct blk_node *bs, const char *name, const char *fmt, char *err,
			      size_t errlen)
{
	struct qc_backing_change c = {.name = name, .fmt = name ? fmt : NULL};
	int ret;

	if (!qcow2_is(bs)) {
		snprintf(err, errlen, "The overlay does not support backing images");
		return -ENOTSUP;
	}
	c.s = qc_state(bs);
	if (c.s->read_only || bs->read_only) {
		snprintf(err, errlen, "Node '%s' is read only", blk_node_name(bs));
		return -EROFS;
	}
	ret = qc_run_sync(qc_change_backing_co, &c);
	if (ret == -ENOSPC)
		snprintf(err, errlen,
			 "Could not change the backing file to '%s': not enough space "
			 "in the header",
			 name ? name : "");
	else if (ret)
		snprintf(err, errlen, "Could not change the backing file to '%s': %s",
			 name ? name : "", strerror(-ret));
	return ret;
}
