/* Protocol driver `rbd`: a Ceph RBD image through librbd's asynchronous API,
 * with QEMU's options (pool, namespace, image, snapshot, conf, user,
 * auth-client-required) and rbd:pool/[namespace/]image[@snap][:key=value...]
 * file names. One rados_t and rbd_image_t per node, shared by every iothread
 * (librbd is thread-safe). librbd completes requests on its own threads;
 * they go back to the submitting loop through its message list
 * (loop/foreign.h). Block status (rbd_diff_iterate2, images with a valid
 * fast-diff map) runs on the thread pool, never on an iothread.
 *
 * Threading: open/close/truncate/create on the main thread; submit and
 * completions on req->loop; the per-loop poll state is that loop's. */
#include <errno.h>
#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-driver.h"
#include "block/rbd.h"
#include "loop/foreign.h"
#include "loop/thread-pool.h"
#include "util/compiler.h"
#include "util/dynlib.h"
#include "util/log.h"
#include "util/opts.h"
#include "util/secret.h"

/* ---- librbd and librados, loaded at the first open ---------------------------- */

/* Every entry point this driver calls. The headers declare them; the calls go
 * through rl so that the daemon maps librbd (and its C++ runtime, its static
 * constructors) only once an rbd node is opened. */
/* clang-format off */
#define RBD_LIB_FNS(X)                                                                      \
	X(rados_create) X(rados_conf_read_file) X(rados_conf_parse_env) X(rados_conf_set)   \
	X(rados_connect) X(rados_ioctx_create) X(rados_ioctx_set_namespace)                 \
	X(rados_ioctx_destroy) X(rados_shutdown) X(rbd_open) X(rbd_open_read_only)          \
	X(rbd_close) X(rbd_write) X(rbd_flush) X(rbd_create4) X(rbd_image_options_create)   \
	X(rbd_image_options_destroy) X(rbd_get_size) X(rbd_get_features) X(rbd_get_flags)   \
	X(rbd_resize) X(rbd_diff_iterate2) X(rbd_aio_create_completion)                     \
	X(rbd_aio_get_return_value) X(rbd_aio_release) X(rbd_aio_readv) X(rbd_aio_writev)   \
	X(rbd_aio_flush) X(rbd_aio_discard) X(rbd_aio_write_zeroes)
/* clang-format on */

#define RBD_LIB_PTR(f) __typeof__(f) *f;
#define RBD_LIB_SYM(f) DYNLIB_SYM(rl, f),

/* Filled once by rbd_lib_load, read-only afterwards (any thread). */
static struct {
	RBD_LIB_FNS(RBD_LIB_PTR)
} rl;

static const struct dynlib_sym rbd_lib_syms[] = {RBD_LIB_FNS(RBD_LIB_SYM)};
static const char *const rbd_lib_sonames[] = {"librados.so.2", "librbd.so.1", NULL};
static struct dynlib rbd_lib = {
	.pkg = "librbd1",
	.sonames = rbd_lib_sonames,
	.syms = rbd_lib_syms,
	.nsyms = sizeof(rbd_lib_syms) / sizeof(rbd_lib_syms[0]),
};

static int rbd_lib_load(char *err, size_t errlen)
{
	return dynlib_load(&rbd_lib, "rbd", err, errlen);
}

/* Where an image is and how to reach its cluster. */
struct rbd_cfg {
	char *pool, *ns, *image, *snap, *conf, *user;
	struct kv_opts pairs; /* more rados settings (key=value of the file name) */
	char desc[256];       /* pool/[ns/]image[@snap], for messages */
};

struct rbd_state {
	rados_t cluster;
	rados_ioctx_t io;
	rbd_image_t img;
	bool fast_diff;
	atomic_bool err_logged; /* the first request error is logged (any thread) */
	char desc[256];
};

/* Per-loop state: completions expected on that loop. */
struct rbd_thread {
	struct loop_foreign f;
};

/* Per-request context in req->drv. */
struct rbd_req {
	union {
		struct loop_msg msg; /* librbd's completion, back on the loop */
		struct tp_work work; /* block status on the thread pool */
	};
	struct blk_node *bs;
	struct rbd_thread *th;
	ssize_t ret;
};

_Static_assert(sizeof(struct rbd_req) <= BLK_DRV_CTX_SIZE, "rbd_req too big");

/* ---- the file name and options ---------------------------------------------- */

/* Copy the next field of s up to one of the stop characters, removing the
 * backslash escapes; *s moves past it. */
static char *rbd_field(const char **s, const char *stops)
{
	const char *p = *s;
	char *out = malloc(strlen(p) + 1), *o = out;

	if (!out)
		return NULL;
	while (*p && !strchr(stops, *p)) {
		if (*p == '\\' && p[1])
			p++;
		*o++ = *p++;
	}
	*o = 0;
	*s = p;
	return out;
}

static void rbd_take(char **dst, char **src)
{
	free(*dst);
	*dst = *src;
	*src = NULL;
}

/* ":key=value:key=value": id and conf are ours, the rest rados settings. */
static int rbd_parse_pairs(struct rbd_cfg *c, const char *p)
{
	int ret = 0;

	while (*p == ':' && !ret) {
		char *k, *v = NULL;

		p++;
		k = rbd_field(&p, "=:");
		if (k && *p == '=') {
			p++;
			v = rbd_field(&p, ":");
		}
		if (!k || !v || !*k)
			ret = -EINVAL;
		else if (!strcmp(k, "id") || !strcmp(k, "conf"))
			rbd_take(!strcmp(k, "id") ? &c->user : &c->conf, &v);
		else
			ret = kv_set(&c->pairs, k, v);
		free(k);
		free(v);
	}
	return ret ? ret : (*p ? -EINVAL : 0);
}

/* rbd:pool/[namespace/]image[@snapshot][:key=value...] (QEMU's syntax). */
static int rbd_parse_name(struct rbd_cfg *c, const char *name)
{
	const char *p = name + 4;
	char *a, *b = NULL;

	if (strncmp(name, "rbd:", 4) || !(a = rbd_field(&p, "/@:")))
		return -EINVAL;
	if (*p != '/') {
		free(a);
		return -EINVAL;
	}
	p++;
	b = rbd_field(&p, "/@:");
	if (b && *p == '/') {
		p++;
		c->ns = b;
		b = rbd_field(&p, "@:");
	}
	c->pool = a;
	c->image = b;
	if (*p == '@') {
		p++;
		c->snap = rbd_field(&p, ":");
	}
	if (!c->pool || !c->image || !*c->pool || !*c->image)
		return -EINVAL;
	return rbd_parse_pairs(c, p);
}

static int rbd_dup_opt(struct kv_opts *opts, const char *key, char **dst)
{
	const char *v = kv_get(opts, key);

	if (!v)
		return 0;
	free(*dst);
	*dst = strdup(v);
	return *dst ? 0 : -ENOMEM;
}

/* key-secret=ID: the secret object's value is the cephx key (QEMU passes
 * it base64-encoded as rados' "key" setting, and so do we). */
static int rbd_key_secret(struct rbd_cfg *c, const char *id, char *err, size_t errlen)
{
	char *key = NULL;
	int ret;

	if (!id)
		return 0;
	ret = secret_get_base64(id, &key);
	if (ret == -ENOENT)
		snprintf(err, errlen, "rbd: key-secret: No secret with id '%s'", id);
	else if (!ret && (ret = kv_set(&c->pairs, "key", key)))
		snprintf(err, errlen, "rbd: out of memory");
	if (key) {
		explicit_bzero(key, strlen(key));
		free(key);
	}
	return ret;
}

/* The options of a blockdev (or those next to a file name). */
static int rbd_parse_opts(struct rbd_cfg *c, struct kv_opts *opts, char *err, size_t errlen)
{
	const char *auth = kv_get(opts, "auth-client-required");
	int ret;

	ret = rbd_key_secret(c, kv_get(opts, "key-secret"), err, errlen);
	if (ret)
		return ret;
	ret = rbd_dup_opt(opts, "pool", &c->pool) ?: rbd_dup_opt(opts, "namespace", &c->ns)
		?: rbd_dup_opt(opts, "image", &c->image) ?: rbd_dup_opt(opts, "snapshot", &c->snap)
		?: rbd_dup_opt(opts, "conf", &c->conf) ?: rbd_dup_opt(opts, "user", &c->user);
	if (!ret && kv_get(opts, "keyring"))
		ret = kv_set(&c->pairs, "keyring", kv_get(opts, "keyring"));
	if (!ret && auth)
		ret = kv_set(&c->pairs, "auth_client_required", auth);
	if (ret) {
		snprintf(err, errlen, "rbd: out of memory");
		return ret;
	}
	if (!c->pool || !c->image || !*c->pool || !*c->image) {
		snprintf(err, errlen, "rbd: options pool and image are required");
		return -EINVAL;
	}
	return 0;
}

static void rbd_cfg_free(struct rbd_cfg *c)
{
	free(c->pool);
	free(c->ns);
	free(c->image);
	free(c->snap);
	free(c->conf);
	free(c->user);
	kv_free(&c->pairs);
}

static int rbd_cfg_parse(struct rbd_cfg *c, struct kv_opts *opts, const char *name, char *err,
			 size_t errlen)
{
	int ret = name ? rbd_parse_name(c, name) : 0;

	if (ret) {
		snprintf(err, errlen,
			 "rbd: '%s': expected rbd:POOL/[NAMESPACE/]IMAGE[@SNAPSHOT]"
			 "[:KEY=VALUE...]",
			 name);
		return -EINVAL;
	}
	if (opts && (ret = rbd_parse_opts(c, opts, err, errlen)))
		return ret;
	if (!opts && !name)
		return -EINVAL;
	snprintf(c->desc, sizeof(c->desc), "%s/%s%s%s%s%s", c->pool, c->ns ? c->ns : "",
		 c->ns ? "/" : "", c->image, c->snap ? "@" : "", c->snap ? c->snap : "");
	return 0;
}

/* ---- the cluster ---------------------------------------------------------------- */

static int rbd_fail(const char *what, const struct rbd_cfg *c, int ret, char *err, size_t errlen)
{
	snprintf(err, errlen, "rbd: %s: %s: %s", c->desc, what, strerror(-ret));
	return ret;
}

/* Connect (blocking, as QEMU's open does) and open the pool's context. */
static int rbd_connect(const struct rbd_cfg *c, const char *cache, rados_t *cl, rados_ioctx_t *io,
		       char *err, size_t errlen)
{
	int ret = rl.rados_create(cl, c->user);
	size_t i;

	if (ret < 0)
		return rbd_fail("cannot set up a cluster handle", c, ret, err, errlen);
	/* Without conf=: the usual places ($CEPH_CONF, /etc/ceph); none is fine. */
	ret = rl.rados_conf_read_file(*cl, c->conf);
	if (ret < 0 && c->conf) {
		rbd_fail("cannot read the configuration file", c, ret, err, errlen);
		goto fail;
	}
	rl.rados_conf_parse_env(*cl, NULL);
	for (i = 0; i < c->pairs.n; i++) {
		ret = rl.rados_conf_set(*cl, c->pairs.v[i].key, c->pairs.v[i].val);
		if (ret < 0) {
			bool hide = !strcmp(c->pairs.v[i].key, "key"); /* a secret */

			snprintf(err, errlen, "rbd: %s: bad setting %s=%s", c->desc,
				 c->pairs.v[i].key, hide ? "(secret)" : c->pairs.v[i].val);
			goto fail;
		}
	}
	/* As QEMU maps its cache modes: librbd's cache for writeback only. */
	if (cache && (ret = rl.rados_conf_set(*cl, "rbd_cache",
					      strcmp(cache, "none") ? "true" : "false")) < 0)
		goto fail;
	ret = rl.rados_connect(*cl);
	if (ret < 0) {
		rbd_fail("cannot connect to the cluster", c, ret, err, errlen);
		goto fail;
	}
	ret = rl.rados_ioctx_create(*cl, c->pool, io);
	if (ret < 0) {
		rbd_fail("cannot open the pool", c, ret, err, errlen);
		goto fail;
	}
	rl.rados_ioctx_set_namespace(*io, c->ns ? c->ns : "");
	return 0;
fail:
	rl.rados_shutdown(*cl);
	return ret < 0 ? ret : -EINVAL;
}

/* The first bytes of a new image (a format's metadata). */
static int rbd_write_head(rados_ioctx_t io, const struct rbd_cfg *c, const void *head, size_t len,
			  char *err, size_t errlen)
{
	rbd_image_t img;
	ssize_t n;
	int ret = rl.rbd_open(io, c->image, &img, NULL);

	if (ret < 0)
		return rbd_fail("cannot open the new image", c, ret, err, errlen);
	n = rl.rbd_write(img, 0, len, head);
	ret = n < 0 ? (int)n : (size_t)n != len ? -EIO : rl.rbd_flush(img);
	rl.rbd_close(img);
	return ret < 0 ? rbd_fail("cannot write the new image", c, ret, err, errlen) : 0;
}

int blk_rbd_create(const char *name, uint64_t size, const void *head, size_t len, char *err,
		   size_t errlen)
{
	struct rbd_cfg c = {0};
	rbd_image_options_t o;
	rados_ioctx_t io;
	rados_t cl;
	int ret;

	ret = rbd_lib_load(err, errlen) ?: rbd_cfg_parse(&c, NULL, name, err, errlen);
	if (!ret && c.snap) {
		snprintf(err, errlen, "rbd: %s: cannot create a snapshot", c.desc);
		ret = -EINVAL;
	}
	if (!ret)
		ret = rbd_connect(&c, NULL, &cl, &io, err, errlen);
	if (ret) {
		rbd_cfg_free(&c);
		return ret;
	}
	rl.rbd_image_options_create(&o); /* the cluster's default features */
	ret = rl.rbd_create4(io, c.image, size, o);
	rl.rbd_image_options_destroy(o);
	if (ret < 0)
		rbd_fail("cannot create the image", &c, ret, err, errlen);
	else if (len)
		ret = rbd_write_head(io, &c, head, len, err, errlen);
	rl.rados_ioctx_destroy(io);
	rl.rados_shutdown(cl);
	rbd_cfg_free(&c);
	return ret;
}

/* ---- requests ---------------------------------------------------------------- */

static void rbd_log_error(struct blk_node *bs, ssize_t ret)
{
	struct rbd_state *s = bs->opaque;

	if (atomic_exchange(&s->err_logged, true))
		return;
	if (ret == -ESHUTDOWN) /* Ceph's EBLOCKLISTED */
		log_err("rbd: %s: the cluster blocklisted this client; requests fail", s->desc);
	else
		log_err("rbd: %s: a request failed: %s (further errors not logged)", s->desc,
			strerror((int)-ret));
}

static void rbd_done_msg(struct loop_msg *m)
{
	struct rbd_req *r = container_of(m, struct rbd_req, msg);
	struct blk_request *req = blk_req_from_drv(r);

	loop_foreign_done(&r->th->f);
	if (r->ret < 0) {
		rbd_log_error(r->bs, r->ret);
		blk_complete(req, r->ret == -ESHUTDOWN ? -EIO : (int)r->ret);
		return;
	}
	blk_complete(req, 0);
}

/* librbd's thread. */
static void rbd_aio_cb(rbd_completion_t c, void *arg)
{
	struct rbd_req *r = arg;

	r->ret = rl.rbd_aio_get_return_value(c);
	rl.rbd_aio_release(c);
	r->msg.cb = rbd_done_msg;
	loop_foreign_post(blk_req_from_drv(r)->loop, &r->msg);
}

static void *rbd_thread_ctor(struct blk_node *bs, struct loop *loop)
{
	struct rbd_thread *th = calloc(1, sizeof(*th));

	(void)bs;
	if (th)
		loop_foreign_init(&th->f, loop, false); /* network latency: no polling */
	return th;
}

static int rbd_start(rbd_image_t img, struct blk_request *req, rbd_completion_t c)
{
	switch (req->op) {
	case BLK_OP_READ:
		return rl.rbd_aio_readv(img, req->iov, req->iovcnt, req->offset, c);
	case BLK_OP_WRITE:
		return rl.rbd_aio_writev(img, req->iov, req->iovcnt, req->offset, c);
	case BLK_OP_FLUSH:
		return rl.rbd_aio_flush(img, c);
	case BLK_OP_DISCARD:
		return rl.rbd_aio_discard(img, req->offset, req->len, c);
	case BLK_OP_WRITE_ZEROES: /* QEMU's mapping: keep the blocks unless MAY_UNMAP */
		return rl.rbd_aio_write_zeroes(
			img, req->offset, req->len, c,
			req->flags & BLK_F_MAY_UNMAP ? 0 : RBD_WRITE_ZEROES_FLAG_THICK_PROVISION,
			0);
	default:
		return -EINVAL;
	}
}

/* Block status: the first extent rbd_diff_iterate2 reports from offset. */
struct rbd_diff {
	uint64_t off, len;
	uint32_t status;
	uint64_t status_len;
	bool found;
};

#define RBD_DIFF_STOP (-9000)

static int rbd_diff_cb(uint64_t offs, size_t len, int exists, void *arg)
{
	struct rbd_diff *d = arg;
	uint64_t end = offs + len;

	if (end <= d->off)
		return 0;
	d->found = true;
	if (offs > d->off) { /* a hole before the first extent */
		d->status = BLK_STATUS_ZERO;
		d->status_len = offs - d->off;
	} else {
		d->status = exists ? BLK_STATUS_DATA | BLK_STATUS_ALLOCATED : BLK_STATUS_ZERO;
		d->status_len = end - d->off;
	}
	return RBD_DIFF_STOP;
}

static int rbd_status_fn(struct tp_work *w)
{
	struct rbd_req *r = container_of(w, struct rbd_req, work);
	struct blk_request *req = blk_req_from_drv(r);
	struct rbd_state *s = r->bs->opaque;
	struct rbd_diff d = {.off = req->offset, .len = req->len};
	int ret = rl.rbd_diff_iterate2(s->img, NULL, req->offset, req->len, 1, 1, rbd_diff_cb, &d);

	if (ret < 0 && ret != RBD_DIFF_STOP)
		return ret;
	req->status = d.found ? d.status : BLK_STATUS_ZERO; /* nothing: all a hole */
	req->status_len = d.found && d.status_len < req->len ? d.status_len : req->len;
	return 0;
}

static void rbd_status_done(struct tp_work *w, int ret)
{
	blk_complete(blk_req_from_drv(container_of(w, struct rbd_req, work)), ret);
}

static int rbd_submit(struct blk_node *bs, struct blk_request *req)
{
	struct rbd_req *r = (struct rbd_req *)req->drv.bytes;
	struct rbd_state *s = bs->opaque;
	rbd_completion_t c;
	int ret;

	r->bs = bs;
	if (req->op == BLK_OP_BLOCK_STATUS) {
		memset(&r->work, 0, sizeof(r->work));
		r->work.fn = rbd_status_fn;
		r->work.done = rbd_status_done;
		tp_submit(req->loop, &r->work);
		return 0;
	}
	r->th = blk_thread_state(bs, req->loop, rbd_thread_ctor);
	if (!r->th)
		return -ENOMEM;
	ret = rl.rbd_aio_create_completion(r, rbd_aio_cb, &c);
	if (ret < 0)
		return ret;
	ret = rbd_start(s->img, req, c);
	if (ret < 0) {
		rl.rbd_aio_release(c);
		return ret;
	}
	loop_foreign_expect(&r->th->f);
	return 0;
}

/* ---- open, close, resize ---------------------------------------------------------- */

static int rbd_open_image(struct blk_node *bs, struct rbd_state *s, const struct rbd_cfg *c,
			  char *err, size_t errlen)
{
	uint64_t size = 0, features = 0, flags = 0;
	int ret;

	if (c->snap && !bs->read_only) {
		snprintf(err, errlen, "rbd: %s: a snapshot is read-only; open it with read-only=on",
			 c->desc);
		return -EINVAL;
	}
	ret = bs->read_only ? rl.rbd_open_read_only(s->io, c->image, &s->img, c->snap)
			    : rl.rbd_open(s->io, c->image, &s->img, c->snap);
	if (ret < 0)
		return rbd_fail("cannot open the image", c, ret, err, errlen);
	ret = rl.rbd_get_size(s->img, &size);
	if (ret < 0) {
		rl.rbd_close(s->img);
		return rbd_fail("cannot get the size", c, ret, err, errlen);
	}
	bs->size = size;
	if (rl.rbd_get_features(s->img, &features) == 0 && rl.rbd_get_flags(s->img, &flags) == 0)
		s->fast_diff =
			(features & RBD_FEATURE_FAST_DIFF) && !(flags & RBD_FLAG_FAST_DIFF_INVALID);
	return 0;
}

static int rbd_open_node(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	const char *cache = kv_get(opts, "cache");
	struct rbd_cfg c = {0};
	struct rbd_state *s;
	int ret;

	if (cache && strcmp(cache, "none") && strcmp(cache, "writeback")) {
		snprintf(err, errlen, "rbd: cache must be 'none' or 'writeback', not '%s'", cache);
		return -EINVAL;
	}
	ret = rbd_lib_load(err, errlen)
		      ?: rbd_cfg_parse(&c, opts, kv_get(opts, "filename"), err, errlen);
	s = ret ? NULL : calloc(1, sizeof(*s));
	if (!ret && !s)
		ret = -ENOMEM;
	if (!ret)
		ret = rbd_connect(&c, cache ? cache : "writeback", &s->cluster, &s->io, err,
				  errlen);
	if (!ret && (ret = rbd_open_image(bs, s, &c, err, errlen))) {
		rl.rados_ioctx_destroy(s->io);
		rl.rados_shutdown(s->cluster);
	}
	if (!ret) {
		snprintf(s->desc, sizeof(s->desc), "%s", c.desc);
		bs->opaque = s;
	} else {
		free(s);
	}
	rbd_cfg_free(&c);
	return ret;
}

static void rbd_free_threads(struct blk_node *bs)
{
	for (unsigned i = 0; i < LOOP_MAX_THREADS; i++) {
		free(bs->thread_state[i]);
		bs->thread_state[i] = NULL;
	}
}

static void rbd_detach_loop(struct blk_node *bs, struct loop *loop)
{
	unsigned i = loop_index(loop);
	struct rbd_thread *th = bs->thread_state[i];

	if (th)
		loop_foreign_fini(&th->f);
	free(th);
	bs->thread_state[i] = NULL;
}

static void rbd_close_node(struct blk_node *bs)
{
	struct rbd_state *s = bs->opaque;

	if (!s)
		return;
	rbd_free_threads(bs);
	rl.rbd_close(s->img);
	rl.rados_ioctx_destroy(s->io);
	rl.rados_shutdown(s->cluster);
	free(s);
	bs->opaque = NULL;
}

static int rbd_truncate(struct blk_node *bs, uint64_t size)
{
	struct rbd_state *s = bs->opaque;
	int ret = rl.rbd_resize(s->img, size);

	if (ret < 0)
		return ret;
	bs->size = size;
	return 0;
}

static bool rbd_can(struct blk_node *bs)
{
	(void)bs;
	return true;
}

static bool rbd_can_block_status(struct blk_node *bs)
{
	return ((struct rbd_state *)bs->opaque)->fast_diff;
}

const struct blk_driver blk_drv_rbd = {
	.name = "rbd",
	.open = rbd_open_node,
	.close = rbd_close_node,
	.submit = rbd_submit,
	.truncate = rbd_truncate,
	.detach_loop = rbd_detach_loop,
	.can_discard = rbd_can,
	.can_write_zeroes = rbd_can,
	.can_block_status = rbd_can_block_status,
	.can_multi_conn = rbd_can, /* one image handle: a flush covers every thread's writes */
};
