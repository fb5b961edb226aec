/* Block exports at runtime (see qmp-export.h): the export list, the NBD
 * server of nbd-server-start, and the commands. Messages are qsd 7.2's.
 *
 * An export being removed stays in the list, shutting-down, until its
 * server says nothing refers to it any more (its requests in flight have
 * finished); then BLOCK_EXPORT_DELETED is sent, its reference to the node
 * is dropped and it is freed. Permissions an export took stay with the
 * node after it is gone (one set per node, not per user, for now).
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "block/block.h"
#include "block/dirty-bitmap.h"
#include "block/graph.h"
#include "block/job.h"
#include "control/monitor-opts.h"
#include "control/qmp-export-int.h"
#include "control/qmp-object.h"
#include "control/qmp.h"
#include "export/nbd-proto.h"
#include "export/vhost-user-blk.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/tls.h"
#include "util/service.h"

static const char *const type_names[] = {"nbd", "vhost-user-blk", "vhost-user-scsi"};

/* A stopped nbd-server-start server, freed once its clients are gone. */
struct old_srv {
	struct old_srv *next;
	struct nbd_server *s;
};

struct qmp_export_env qexp_env;
static struct qexp *exports; /* newest first, as qsd lists them */
static struct nbd_server *qmp_srv;
static struct old_srv *old_srvs;
static unsigned pool_next; /* vhost-user-blk queue 0 of successive exports */

struct qexp *qexp_find(const char *id)
{
	struct qexp *x;

	for (x = exports; x; x = x->next)
		if (!strcmp(x->id, id))
			return x;
	return NULL;
}

unsigned qmp_export_count(void)
{
	unsigned n = 0;

	for (struct qexp *x = exports; x; x = x->next)
		n++;
	return n;
}

/* The chain below an export's node is short; the bound only guards a loop. */
#define QEXP_CHAIN_MAX 256

static bool qexp_reaches(struct blk_node *n, const struct blk_node *bs)
{
	for (unsigned i = 0; n && i < QEXP_CHAIN_MAX; i++) {
		struct blk_node *b = blk_child(n, BLK_ROLE_BACKING);

		if (n == bs)
			return true;
		n = b ? b : n->next;
	}
	return false;
}

struct loop *qmp_export_loop(struct blk_node *bs)
{
	struct qexp *x, *found = NULL;

	/* exports is newest first: the oldest match is the last one. */
	for (x = exports; x; x = x->next)
		if (x->nheld && !x->shutting_down && qexp_reaches(x->bs, bs))
			found = x;
	return found ? found->held[0] : NULL;
}

/* ---- pieces shared by both types ---------------------------------------- */

void qmp_export_make_id(const char *want, const char *prefix, char *out, size_t len)
{
	unsigned i;

	if (want && strlen(want) < len && qapi_id_wellformed(want) && !qexp_find(want)) {
		snprintf(out, len, "%s", want);
		return;
	}
	for (i = 0;; i++) {
		snprintf(out, len, "%s%u", prefix, i);
		if (!qexp_find(out))
			return;
	}
}

static void put_loops(struct qexp *x)
{
	for (unsigned i = 0; i < x->nheld; i++)
		qmp_iothread_put(x->held[i]);
	free(x->held);
	x->held = NULL;
	x->nheld = 0;
}

/* iothread=ID or iothreads=[...]: a use of each. */
static int take_loops(const json_t *args, struct qexp *x, char *err, size_t errlen)
{
	const char *one = qapi_get_str(args, "iothread");
	json_t *list = qapi_get(args, "iothreads"), *v;
	size_t i, n = one ? 1 : json_array_size(list);

	if (one && list) {
		snprintf(err, errlen, "give iothread or iothreads, not both");
		return -EINVAL;
	}
	if (list && !n) {
		snprintf(err, errlen, "iothreads: the list is empty");
		return -EINVAL;
	}
	if (!n)
		return 0;
	x->held = calloc(n, sizeof(*x->held));
	if (!x->held)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		v = one ? NULL : json_array_get(list, i);
		x->held[i] = qmp_iothread_get(one ? one : json_string_value(v), err, errlen);
		if (!x->held[i]) {
			put_loops(x);
			return -ENOENT;
		}
		x->nheld++;
	}
	return 0;
}

/* A socket the parent passed in: a decimal fd that is a listening socket.
 * Only on the command line: over QMP a number would name any fd of the
 * daemon (a monitor's socket, an image), and fd passing (getfd) is QEMU's
 * alone, as qsd says. */
static int listening_fd(const char *s, bool cmdline, char *err, size_t errlen)
{
	int acc = 0, fd;
	socklen_t len = sizeof(acc);
	struct stat st;
	char *end;
	long v;

	if (!cmdline) {
		snprintf(err, errlen, "only QEMU supports file descriptor passing");
		return -EINVAL;
	}
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < 0 || v > INT32_MAX) {
		snprintf(err, errlen, "Unable to parse FD number %s", s);
		return -EINVAL;
	}
	fd = (int)v;
	if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode) ||
	    getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) < 0 || !acc) {
		snprintf(err, errlen, "fd %d is not a listening socket", fd);
		return -EINVAL;
	}
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0 ||
	    fcntl(fd, F_SETFD, FD_CLOEXEC) < 0) {
		snprintf(err, errlen, "fd %d: %s", fd, strerror(errno));
		return -errno;
	}
	return fd;
}

/* ---- NBD ---------------------------------------------------------------- */

static int nbd_check(const json_t *args, const char *name, char *err, size_t errlen)
{
	const char *desc = qapi_get_str(args, "description");

	if (strlen(name) > NBD_MAX_STRING) {
		snprintf(err, errlen, "export name '%s' too long", name);
		return -EINVAL;
	}
	if (desc && strlen(desc) > NBD_MAX_STRING) {
		snprintf(err, errlen, "description '%s' too long", desc);
		return -EINVAL;
	}
	return 0;
}

/* The bitmap named name on bs or down its backing chain, as QEMU looks
 * for an exported bitmap. */
static struct blk_dirty_bitmap *nbd_find_bitmap(struct blk_node **bsp, const char *name)
{
	for (struct blk_node *bs = *bsp; bs; bs = blk_child(bs, BLK_ROLE_BACKING)) {
		struct blk_dirty_bitmap *bm = blk_dirty_bitmap_find(bs, name);

		if (bm) {
			*bsp = bs;
			return bm;
		}
	}
	return NULL;
}

/* bitmaps: each one found, usable, and not too many. */
static int nbd_bitmaps(const json_t *args, struct blk_node *bs, struct nbd_export_config *ec,
		       struct blk_dirty_bitmap **out, char *err, size_t errlen)
{
	json_t *list = qapi_get(args, "bitmaps"), *v;
	size_t i;

	json_array_foreach (list, i, v) {
		const char *name = json_string_value(v);
		struct blk_node *on = bs;
		struct blk_dirty_bitmap *bm = nbd_find_bitmap(&on, name);

		if (!bm) {
			snprintf(err, errlen, "Bitmap '%s' is not found", name);
			return -ENOENT;
		}
		if (bm->busy || bm->inconsistent) {
			snprintf(err, errlen,
				 bm->busy ? "Bitmap '%s' is currently in use by another operation "
					    "and cannot be used"
					  : "Bitmap '%s' is inconsistent and cannot be used",
				 name);
			return -EINVAL;
		}
		/* As QEMU: a read-only export cannot promise what an enabled
		 * bitmap of a writable node will say. */
		if (!ec->writable && !on->read_only && atomic_load(&bm->enabled)) {
			snprintf(err, errlen,
				 "Enabled bitmap '%s' incompatible with readonly export", name);
			return -EINVAL;
		}
		if (i == NBD_MAX_EXPORT_BITMAPS) {
			snprintf(err, errlen, "an NBD export has at most %u bitmaps in ioplane",
				 NBD_MAX_EXPORT_BITMAPS);
			return -EINVAL;
		}
		out[i] = bm;
	}
	ec->bitmaps = out;
	ec->nbitmaps = (unsigned)json_array_size(list);
	return 0;
}

static int add_nbd(const json_t *args, struct qexp *x, struct blk_node *bs,
		   enum nbd_detect_zeroes dz, char *err, size_t errlen)
{
	const char *name = qapi_get_str(args, "name");
	struct nbd_export_config ec = {.bs = bs, .detect_zeroes = dz};
	struct blk_dirty_bitmap *bitmaps[NBD_MAX_EXPORT_BITMAPS];
	int ret;

	ec.name = name ? name : x->node;
	ec.description = qapi_get_str(args, "description");
	ec.writable = qapi_get_bool(args, "writable", false);
	ec.loops = x->held; /* its connections run there (round-robin) */
	ec.nloops = x->nheld;
	ec.alloc_depth = qapi_get_bool(args, "allocation-depth", false);
	ret = nbd_check(args, ec.name, err, errlen);
	if (!ret) /* after writable= is known */
		ret = nbd_bitmaps(args, bs, &ec, bitmaps, err, errlen);
	if (ret < 0)
		return ret;
	ret = nbd_server_export_add(x->srv, &ec, &x->nexp, err, errlen);
	if (ret == -EEXIST)
		snprintf(err, errlen, "NBD server already has export named '%s'", ec.name);
	return ret;
}

/* ---- vhost-user-blk ----------------------------------------------------- */

static int vub_check(const json_t *args, const char *id, struct vub_export_config *cfg, char *err,
		     size_t errlen)
{
	uint64_t lbs = qapi_get_uint(args, "logical-block-size", 512);
	int64_t nq = qapi_get_int(args, "num-queues", 1);

	if (nq == 0) {
		snprintf(err, errlen, "num-queues must be greater than 0");
		return -EINVAL;
	}
	if (lbs & (lbs - 1) || !lbs) {
		snprintf(err, errlen,
			 "Property %s.logical-block-size doesn't take value '%" PRIu64
			 "', it's not a power of 2",
			 id, lbs);
		return -EINVAL;
	}
	if (lbs != 512 && lbs != 4096) {
		snprintf(err, errlen, "logical-block-size must be 512 or 4096 for ioplane");
		return -EINVAL;
	}
	cfg->blk.serial = qapi_get_str(args, "serial");
	if (cfg->blk.serial && strlen(cfg->blk.serial) > VIRTIO_BLK_ID_BYTES) {
		snprintf(err, errlen, "serial has at most %u characters", VIRTIO_BLK_ID_BYTES);
		return -EINVAL;
	}
	cfg->blk.num_queues = (unsigned)nq;
	cfg->blk.logical_block_size = (uint32_t)lbs;
	cfg->blk.writable = qapi_get_bool(args, "writable", false);
	return 0;
}

/* addr: a unix path, or a listening fd; returns the fd, or 0 for a path. */
static int vub_addr(const json_t *addr, bool cmdline, struct vub_export_config *cfg, char *err,
		    size_t errlen)
{
	const char *type = qapi_get_str(addr, "type");

	if (!strcmp(type, "unix")) {
		/* --export: a socket the service manager passed in for the path. */
		int fd = cmdline ? svc_listen_take(NULL, qapi_get_str(addr, "path")) : -1;

		cfg->path = fd >= 0 ? NULL : qapi_get_str(addr, "path");
		return fd >= 0 ? fd : 0;
	}
	if (!strcmp(type, "fd"))
		return listening_fd(qapi_get_str(addr, "str"), cmdline, err, errlen);
	snprintf(err, errlen, "Only socket address types 'unix' and 'fd' are supported");
	return -EINVAL;
}

static int add_vub(const json_t *args, struct qexp *x, struct blk_node *bs,
		   const struct qmp_export_extra *xt, char *err, size_t errlen)
{
	struct vub_export_config cfg = {.bs = bs, .main_loop = qexp_env.main_loop};
	int fd, ret = vub_check(args, x->id, &cfg, err, errlen);

	if (ret < 0 ||
	    (fd = vub_addr(qapi_get(args, "addr"), xt && xt->cmdline, &cfg, err, errlen)) < 0)
		return ret < 0 ? ret : fd;
	cfg.mode = xt ? xt->mode : 0;
	cfg.loops = x->nheld ? x->held : qexp_env.loops;
	cfg.nloops = x->nheld ? x->nheld : qexp_env.nloops;
	cfg.first_loop = x->nheld ? 0 : pool_next;
	cfg.scsi = x->type == QEXP_VUS;
	cfg.write_cache = !qapi_get_bool(args, "writethrough", false);
	cfg.id = x->id;
	ret = vub_export_start(&cfg, &x->vub, err, errlen);
	if (ret == 0 && cfg.scsi)
		ret = qexp_scsi_luns(args, x, err, errlen);
	if (ret < 0) {
		if (x->vub)
			vub_export_free(x->vub);
		x->vub = NULL;
		return ret;
	}
	ret = fd ? vub_export_listen_fd(x->vub, fd, err, errlen)
		 : vub_export_listen(x->vub, err, errlen);
	if (ret < 0) {
		vub_export_free(x->vub);
		x->vub = NULL;
		return ret;
	}
	if (!x->nheld)
		pool_next += vub_export_queues(x->vub);
	return 0;
}

/* ---- adding ------------------------------------------------------------- */

/* What every export of the node needs, as qsd takes it: consistent read,
 * write when writable; NBD does not share resize. */
static int take_perm(const json_t *args, struct qexp *x, struct blk_node *bs, char *err,
		     size_t errlen)
{
	bool w = qapi_get_bool(args, "writable", false);
	uint32_t perm = bs->user_perm | BLK_PERM_CONSISTENT_READ | (w ? BLK_PERM_WRITE : 0);
	uint32_t shared = bs->user_shared & (x->type == QEXP_NBD ? ~BLK_PERM_RESIZE : BLK_PERM_ALL);

	if (w && bs->read_only) {
		snprintf(err, errlen, "Cannot export read-only node as writable");
		return -EROFS;
	}
	/* A job's nodes: what the job does not share (a commit's base is
	 * written by nobody else). */
	if (job_node_perm_check(bs, BLK_PERM_CONSISTENT_READ | (w ? BLK_PERM_WRITE : 0), err,
				errlen))
		return -EPERM;
	/* A user of this process that keeps writers out (a block job's
	 * target, a copy-before-write target) wins, as in QEMU. */
	if (w && (!(bs->user_shared & BLK_PERM_WRITE) || !(bs->shared & BLK_PERM_WRITE))) {
		snprintf(err, errlen,
			 "Permission conflict on node '%s': permissions 'write' are both required "
			 "by block export '%s' and unshared by another user of the node",
			 blk_node_name(bs), x->id);
		return -EPERM;
	}
	if (perm == bs->user_perm && shared == bs->user_shared)
		return 0;
	return blk_set_perm(bs, perm, shared, err, errlen);
}

static int qexp_check(const json_t *args, struct qexp *x, struct nbd_server *srv, char *err,
		      size_t errlen)
{
	if (qexp_find(x->id)) {
		snprintf(err, errlen, "Block export id '%s' is already in use", x->id);
		return -EEXIST;
	}
	if (!qapi_id_wellformed(x->id)) {
		snprintf(err, errlen, "Invalid block export id");
		return -EINVAL;
	}
	if (x->type != QEXP_VUS && qapi_get_bool(args, "writethrough", false)) {
		snprintf(err, errlen, "writethrough=on is not supported by ioplane");
		return -ENOTSUP;
	}
	if (x->type == QEXP_NBD && !srv) {
		snprintf(err, errlen, "NBD server not running");
		return -ENOTCONN;
	}
	return 0;
}

static void user_name(const struct qexp *x, char *buf, size_t len)
{
	snprintf(buf, len, "block export '%s'", x->id);
}

/* The node was replaced (a snapshot, a job's switch-over): the export
 * serves the new one, by its node-name, as QEMU's BlockBackend moves. */
static void qexp_replaced(struct blk_node *from, struct blk_node *to, void *opaque)
{
	struct qexp *x = opaque;
	char *name = strdup(blk_node_name(to));

	(void)from;
	x->bs = to;
	if (name) {
		free(x->node);
		x->node = name;
	}
	if (x->nexp)
		nbd_export_set_node(x->nexp, to);
	if (x->vub)
		vub_export_set_node(x->vub, to);
}

static void qexp_free(struct qexp *x)
{
	char user[160];

	if (x->bs) {
		blk_replace_notifier_del(x->bs, qexp_replaced, x);
		user_name(x, user, sizeof(user));
		blk_unref(x->bs, user);
	}
	put_loops(x);
	free(x->id);
	free(x->node);
	free(x);
}

static int qexp_build(const json_t *args, struct qexp *x, const struct qmp_export_extra *xt,
		      char *err, size_t errlen)
{
	enum nbd_detect_zeroes dz = NBD_DETECT_ZEROES_OFF;
	struct blk_node *bs =
		qexp_env.find_node ? qexp_env.find_node(qexp_env.ctx, x->node, &dz) : NULL;
	int ret;

	if (!bs) {
		snprintf(err, errlen, "Cannot find device='' nor node-name='%s'", x->node);
		return -ENOENT;
	}
	ret = take_loops(args, x, err, errlen);
	if (ret == 0)
		ret = qexp_check(args, x, x->srv, err, errlen);
	if (ret == 0)
		ret = take_perm(args, x, bs, err, errlen);
	if (ret == 0 && x->type == QEXP_NBD)
		ret = add_nbd(args, x, bs, dz, err, errlen);
	else if (ret == 0)
		ret = add_vub(args, x, bs, xt, err, errlen);
	if (ret == 0) {
		char user[160];

		ret = blk_replace_notifier_add(bs, qexp_replaced, x);
		if (ret) {
			snprintf(err, errlen, "out of memory");
			return ret;
		}
		user_name(x, user, sizeof(user));
		blk_ref(bs, user);
		x->bs = bs;
	}
	return ret;
}

int qmp_export_add(const json_t *args, const struct qmp_export_extra *xt, char *err, size_t errlen)
{
	struct qexp *x = calloc(1, sizeof(*x));
	int ret;

	if (!x || !(x->id = strdup(qapi_get_str(args, "id"))) ||
	    !(x->node = strdup(qapi_get_str(args, "node-name")))) {
		if (x)
			qexp_free(x);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	x->type = !strcmp(qapi_get_str(args, "type"), "nbd")               ? QEXP_NBD
		  : !strcmp(qapi_get_str(args, "type"), "vhost-user-scsi") ? QEXP_VUS
									   : QEXP_VUB;
	if (x->type == QEXP_NBD)
		x->srv = xt && xt->nbd ? xt->nbd : qmp_srv;
	/* qsd's order: the id, then the node, then the iothread. */
	ret = qexp_find(x->id) ? qexp_check(args, x, x->srv, err, errlen)
			       : qexp_build(args, x, xt, err, errlen);
	if (ret < 0) {
		qexp_free(x);
		return ret;
	}
	x->next = exports;
	exports = x;
	log_debug("export '%s' (%s) of node '%s' added", x->id, type_names[x->type], x->node);
	return 0;
}

/* ---- removing ----------------------------------------------------------- */

static void qexp_gone(void *opaque)
{
	struct qexp *x = opaque, **pp;
	void (*done)(void *) = x->stop_done;
	void *done_opaque = x->stop_opaque;

	for (pp = &exports; *pp && *pp != x; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = x->next;
	if (x->vub) {
		qexp_scsi_release(x);
		vub_export_free(x->vub);
	}
	log_debug("export '%s' removed", x->id);
	qmp_event_emit("BLOCK_EXPORT_DELETED", json_pack("{s:s}", "id", x->id));
	qexp_free(x);
	if (done)
		done(done_opaque);
}

static void qexp_remove(struct qexp *x)
{
	x->shutting_down = true;
	if (x->type == QEXP_NBD)
		nbd_server_export_del(x->srv, x->nexp, qexp_gone, x);
	else
		vub_export_stop(x->vub, qexp_gone, x);
}

static unsigned qexp_users(const struct qexp *x)
{
	return x->type == QEXP_NBD ? nbd_export_users(x->nexp) : vub_export_connected(x->vub);
}

static void export_view(const struct qexp *x, struct qmp_export_view *v)
{
	*v = (struct qmp_export_view){.id = x->id,
				      .type = type_names[x->type],
				      .node = x->node,
				      .clients = qexp_users(x)};
	if (x->vub)
		v->queues = vub_export_queues(x->vub);
}

void qmp_exports_foreach(void (*fn)(void *ctx, const struct qmp_export_view *v), void *ctx)
{
	struct qmp_export_view v;
	struct qexp *x, **all;
	size_t n = 0, i;

	for (x = exports; x; x = x->next)
		n++;
	all = calloc(n ? n : 1, sizeof(*all));
	if (!all)
		return;
	for (x = exports, i = n; x; x = x->next)
		all[--i] = x; /* the list is newest first */
	for (i = 0; i < n; i++) {
		export_view(all[i], &v);
		fn(ctx, &v);
	}
	free(all);
}

static void block_export_del(struct qmp_req *req, json_t *args)
{
	struct qexp *x = qexp_find(qapi_get_str(args, "id"));
	bool hard = qapi_has(args, "mode") && !strcmp(qapi_get_str(args, "mode"), "hard");

	if (!x) {
		qmp_error(req, QMP_ERR_GENERIC, "Export '%s' is not found",
			  qapi_get_str(args, "id"));
		return;
	}
	if (x->shutting_down) {
		qmp_error(req, QMP_ERR_GENERIC, "Export '%s' is already shutting down", x->id);
		return;
	}
	if (!hard && qexp_users(x)) {
		qmp_error(req, QMP_ERR_GENERIC, "export '%s' still in use", x->id);
		return;
	}
	qexp_remove(x);
	qmp_return(req, NULL);
}

static void block_export_add(struct qmp_req *req, json_t *args)
{
	char err[1024]; /* qmp_error's limit: a name too long is quoted, cut */

	if (qmp_export_add(args, NULL, err, sizeof(err)) < 0)
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
	else
		qmp_return(req, NULL);
}

static void query_block_exports(struct qmp_req *req, json_t *args)
{
	json_t *list = json_array();
	struct qexp *x;

	(void)args;
	for (x = exports; list && x; x = x->next)
		json_array_append_new(list, json_pack("{s:s,s:s,s:s,s:b}", "id", x->id, "type",
						      type_names[x->type], "node-name", x->node,
						      "shutting-down", x->shutting_down));
	if (!list)
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
	else
		qmp_return(req, list);
}

/* ---- the NBD server ------------------------------------------------------ */

static int nbd_listen(struct nbd_server *s, const json_t *addr, bool cmdline, char *err,
		      size_t errlen)
{
	const char *type = qapi_get_str(addr, "type");
	int fd, ret;

	/* --nbd-server: a socket the service manager passed in for the path. */
	if (!strcmp(type, "unix") && cmdline &&
	    (fd = svc_listen_take(NULL, qapi_get_str(addr, "path"))) >= 0) {
		ret = nbd_server_listen_fd(s, fd);
		if (ret < 0) {
			close(fd);
			snprintf(err, errlen, "cannot listen on the passed socket: %s",
				 strerror(-ret));
		}
		return ret;
	}
	if (!strcmp(type, "unix"))
		return nbd_server_listen_unix(s, qapi_get_str(addr, "path"), qmp_socket_mode(), err,
					      errlen);
	if (!strcmp(type, "inet"))
		return nbd_server_listen_tcp(s, qapi_get_str(addr, "host"),
					     qapi_get_str(addr, "port"), err, errlen);
	if (strcmp(type, "fd")) {
		snprintf(err, errlen, "vsock sockets are not supported by ioplane");
		return -ENOTSUP;
	}
	fd = listening_fd(qapi_get_str(addr, "str"), cmdline, err, errlen);
	if (fd < 0)
		return fd;
	ret = nbd_server_listen_fd(s, fd);
	if (ret < 0)
		snprintf(err, errlen, "cannot listen on fd %d: %s", fd, strerror(-ret));
	return ret;
}

/* tls-creds must name server credentials now; they and tls-authz are looked
 * up again by each connection. */
static int check_tls(const json_t *args, char *err, size_t errlen)
{
	const char *id = qapi_get_str(args, "tls-creds");
	struct tls_creds *c;
	struct tls_authz *a;
	bool server;

	if (!id) {
		if (!qapi_has(args, "tls-authz"))
			return 0;
		snprintf(err, errlen, "tls-authz is not supported without tls-creds");
		return -EINVAL;
	}
	c = tls_creds_get(id);
	if (!c) {
		snprintf(err, errlen, "No TLS credentials with id '%s'", id);
		return -ENOENT;
	}
	server = tls_creds_is_server(c);
	tls_creds_put(c);
	if (!server) {
		snprintf(err, errlen, "Expected TLS credentials for a server endpoint");
		return -EINVAL;
	}
	id = qapi_get_str(args, "tls-authz");
	if (id && !(a = tls_authz_get(id))) {
		snprintf(err, errlen, "Cannot find QAuthZ object '%s'", id);
		return -ENOENT;
	}
	if (id)
		tls_authz_put(a);
	return 0;
}

/* addr is SocketAddress (flat: --nbd-server) */
static int server_start(const json_t *args, const json_t *addr, bool cmdline, char *err,
			size_t errlen)
{
	struct nbd_server_config cfg = {.main_loop = qexp_env.main_loop,
					.loops = qexp_env.loops,
					.nloops = qexp_env.nloops,
					.budget = qexp_env.budget};
	int ret;

	if (qmp_srv) {
		snprintf(err, errlen, "NBD server already running");
		return -EEXIST;
	}
	ret = check_tls(args, err, errlen);
	if (ret < 0)
		return ret;
	cfg.tls_creds = qapi_get_str(args, "tls-creds");
	cfg.tls_authz = qapi_get_str(args, "tls-authz");
	cfg.max_connections =
		(unsigned)qapi_get_uint(args, "max-connections", qexp_env.nbd_max_connections);
	ret = nbd_server_new(&cfg, &qmp_srv);
	if (ret < 0) {
		snprintf(err, errlen, "%s", strerror(-ret));
		return ret;
	}
	ret = nbd_listen(qmp_srv, addr, cmdline, err, errlen);
	if (ret < 0) {
		nbd_server_free(qmp_srv);
		qmp_srv = NULL;
	}
	return ret;
}

int qmp_nbd_server_start(const json_t *args, char *err, size_t errlen)
{
	return server_start(args, qapi_get(args, "addr"), true, err, errlen);
}

static void nbd_server_start_cmd(struct qmp_req *req, json_t *args)
{
	char err[512];

	/* SocketAddressLegacy: the address is under "data". */
	json_t *addr = json_deep_copy(qapi_get(qapi_get(args, "addr"), "data"));

	if (!addr) {
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
		return;
	}
	json_object_set(addr, "type", qapi_get(qapi_get(args, "addr"), "type"));
	if (server_start(args, addr, false, err, sizeof(err)) < 0)
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
	else
		qmp_return(req, NULL);
	json_decref(addr);
}

static void old_srv_drained(void *opaque)
{
	struct old_srv *o = opaque, **pp;

	for (pp = &old_srvs; *pp && *pp != o; pp = &(*pp)->next)
		;
	if (*pp)
		*pp = o->next;
	nbd_server_free(o->s);
	free(o);
}

/* Every export of the server goes (their clients with them), then it. */
static void server_stop(void (*done)(void *opaque), void *opaque)
{
	struct old_srv *o = calloc(1, sizeof(*o));
	struct qexp *x;

	for (x = exports; x; x = x->next)
		if (x->srv == qmp_srv && !x->shutting_down)
			qexp_remove(x);
	nbd_server_stop_listening(qmp_srv);
	if (o) {
		o->s = qmp_srv;
		o->next = old_srvs;
		old_srvs = o;
	}
	if (!done && o) {
		done = old_srv_drained;
		opaque = o;
	}
	/* Without memory for o (and not at shutdown) the server is leaked. */
	nbd_server_drain(qmp_srv, done, opaque);
	qmp_srv = NULL;
}

static void nbd_server_stop_cmd(struct qmp_req *req, json_t *args)
{
	(void)args;
	if (!qmp_srv) {
		qmp_error(req, QMP_ERR_GENERIC, "NBD server not running");
		return;
	}
	server_stop(NULL, NULL);
	qmp_return(req, NULL);
}

/* ---- the daemon's life --------------------------------------------------- */

unsigned qmp_exports_stop(void (*done)(void *opaque), void *opaque)
{
	unsigned n = 0;
	struct qexp *x;

	for (x = exports; x; x = x->next) {
		if (x->type == QEXP_NBD)
			continue;
		x->stop_done = done;
		x->stop_opaque = opaque;
		if (!x->shutting_down)
			qexp_remove(x);
		n++;
	}
	if (qmp_srv) {
		server_stop(done, opaque);
		n++;
	}
	return n;
}

void qmp_exports_abort(void)
{
	for (struct old_srv *o = old_srvs; o; o = o->next)
		nbd_server_abort(o->s);
}

void qmp_exports_forget_loop(struct loop *loop)
{
	if (qmp_srv)
		nbd_server_forget_loop(qmp_srv, loop);
	for (struct old_srv *o = old_srvs; o; o = o->next)
		nbd_server_forget_loop(o->s, loop);
}

void qmp_exports_free(void)
{
	struct old_srv *o;
	struct qexp *x;

	/* What the joined iothreads sent last (an export gone) runs first. */
	if (qexp_env.main_loop)
		loop_run_once(qexp_env.main_loop, false);
	while ((x = exports)) {
		exports = x->next;
		if (x->vub) {
			qexp_scsi_release(x);
			vub_export_free(x->vub);
		}
		qexp_free(x);
	}
	while ((o = old_srvs)) {
		old_srvs = o->next;
		nbd_server_free(o->s);
		free(o);
	}
	nbd_server_free(qmp_srv);
	qmp_srv = NULL;
}

/* ioplane's: the nbd-server-start server's connections, and which record
 * layer its TLS connections use (qsd has no such query). */
static void query_nbd_server(struct qmp_req *req, json_t *args)
{
	const char *creds, *authz;
	unsigned g, k;
	json_t *r;

	(void)args;
	if (!qmp_srv) {
		qmp_error(req, QMP_ERR_GENERIC, "NBD server not running");
		return;
	}
	nbd_server_tls_counts(qmp_srv, &g, &k);
	nbd_server_tls_ids(qmp_srv, &creds, &authz);
	r = json_pack("{s:i,s:{s:i,s:i}}", "connections", (int)nbd_server_connections(qmp_srv),
		      "tls-record-layer", "gnutls", (int)g, "kernel", (int)k);
	if (r && creds)
		json_object_set_new(r, "tls-creds", json_string(creds));
	if (r && authz)
		json_object_set_new(r, "tls-authz", json_string(authz));
	if (!r)
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
	else
		qmp_return(req, r);
}

static const struct qmp_command export_cmds[] = {
	{.name = "nbd-server-start",
	 .args = &qexp_nbd_server_start_args,
	 .fn = nbd_server_start_cmd},
	{.name = "nbd-server-stop", .fn = nbd_server_stop_cmd},
	{.name = "block-export-add", .args = &qmp_block_export_options, .fn = block_export_add},
	{.name = "block-export-del", .args = &qexp_del_args, .fn = block_export_del},
	{.name = "query-block-exports", .ret = &qexp_info_list, .fn = query_block_exports},
	{.name = "x-query-nbd-server", .ret = &qexp_nbd_server_info, .fn = query_nbd_server},
};

static const struct qmp_event_info deleted_event = {.name = "BLOCK_EXPORT_DELETED",
						    .data = &qexp_deleted_data};

int qmp_export_init(const struct qmp_export_env *e)
{
	size_t i;
	int ret;

	qexp_env = *e;
	for (i = 0; i < sizeof(export_cmds) / sizeof(export_cmds[0]); i++) {
		ret = qmp_register(&export_cmds[i]);
		if (ret < 0 && ret != -EEXIST)
			return ret;
	}
	ret = qexp_scsi_init();
	if (ret == 0)
		ret = qmp_register_event(&deleted_event);
	return ret == -EEXIST ? 0 : ret;
}
