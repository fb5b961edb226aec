/* vhost-user-scsi LUNs over QMP: block-export-add's luns=[{lun, node-name}]
 * and the ioplane commands x-vhost-user-scsi-lun-add {id, lun, node-name}
 * and x-vhost-user-scsi-lun-remove {id, lun}, which hot-plug a LUN (the
 * guest gets a transport reset event and rescans). Each LUN but the
 * export's node-name holds its own reference to its node.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block.h"
#include "block/graph.h"
#include "control/qmp-export-int.h"
#include "control/qmp.h"
#include "export/scsi.h"
#include "export/vhost-user-blk.h"

struct lun_gone {
	char user[192];
};

static void lun_user(const struct qexp *x, unsigned lun, char *buf, size_t len)
{
	snprintf(buf, len, "block export '%s' LUN %u", x->id, lun);
}

/* As take_perm for the export's own node: consistent read, write if writable. */
static int lun_perm(const struct qexp *x, struct blk_node *bs, char *err, size_t errlen)
{
	uint32_t perm =
		bs->user_perm | BLK_PERM_CONSISTENT_READ | (x->writable ? BLK_PERM_WRITE : 0);

	if (x->writable && bs->read_only) {
		snprintf(err, errlen, "Cannot export read-only node as writable");
		return -EROFS;
	}
	if (perm == bs->user_perm)
		return 0;
	return blk_set_perm(bs, perm, bs->user_shared, err, errlen);
}

static int lun_add(struct qexp *x, unsigned lun, const char *node, char *err, size_t errlen)
{
	enum nbd_detect_zeroes dz;
	struct blk_node *bs = qexp_env.find_node(qexp_env.ctx, node, &dz);
	char user[192];
	int ret;

	if (!bs) {
		snprintf(err, errlen, "Cannot find device='' nor node-name='%s'", node);
		return -ENOENT;
	}
	if (lun >= SCSI_MAX_LUNS) {
		snprintf(err, errlen, "lun must be 0..%u", SCSI_MAX_LUNS - 1);
		return -EINVAL;
	}
	ret = lun_perm(x, bs, err, errlen);
	if (ret == 0)
		ret = vub_export_lun_add(x->vub, lun, bs, err, errlen);
	if (ret < 0)
		return ret;
	lun_user(x, lun, user, sizeof(user));
	blk_ref(bs, user);
	x->lun_ref[lun] = true;
	return 0;
}

int qexp_scsi_luns(const json_t *args, struct qexp *x, char *err, size_t errlen)
{
	json_t *list = qapi_get(args, "luns"), *v;
	size_t i;
	int ret;

	x->writable = qapi_get_bool(args, "writable", false);
	x->lun_ref = calloc(SCSI_MAX_LUNS, sizeof(*x->lun_ref));
	if (!x->lun_ref) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	json_array_foreach (list, i, v) {
		ret = lun_add(x, (unsigned)qapi_get_uint(v, "lun", 0), qapi_get_str(v, "node-name"),
			      err, errlen);
		if (ret < 0) {
			qexp_scsi_release(x);
			return ret;
		}
	}
	return 0;
}

static void lun_gone(struct blk_node *bs, void *opaque)
{
	struct lun_gone *g = opaque;

	if (g->user[0])
		blk_unref(bs, g->user);
	free(g);
}

/* Before vub_export_free (which finishes pending removals). */
void qexp_scsi_release(struct qexp *x)
{
	char user[192];

	if (!x->lun_ref)
		return;
	for (unsigned i = 0; i < SCSI_MAX_LUNS; i++) {
		struct blk_node *bs = vub_export_lun_node(x->vub, i);

		if (!x->lun_ref[i] || !bs)
			continue;
		lun_user(x, i, user, sizeof(user));
		blk_unref(bs, user);
		x->lun_ref[i] = false;
	}
	free(x->lun_ref);
	x->lun_ref = NULL;
}

static struct qexp *scsi_export(struct qmp_req *req, const json_t *args)
{
	struct qexp *x = qexp_find(qapi_get_str(args, "id"));

	if (!x || x->shutting_down) {
		qmp_error(req, QMP_ERR_GENERIC, "Export '%s' is not found",
			  qapi_get_str(args, "id"));
		return NULL;
	}
	if (x->type != QEXP_VUS) {
		qmp_error(req, QMP_ERR_GENERIC, "Export '%s' is not a vhost-user-scsi export",
			  x->id);
		return NULL;
	}
	return x;
}

static void lun_add_cmd(struct qmp_req *req, json_t *args)
{
	struct qexp *x = scsi_export(req, args);
	char err[512];

	if (!x)
		return;
	if (lun_add(x, (unsigned)qapi_get_uint(args, "lun", 0), qapi_get_str(args, "node-name"),
		    err, sizeof(err)) < 0)
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
	else
		qmp_return(req, NULL);
}

static void lun_remove_cmd(struct qmp_req *req, json_t *args)
{
	struct qexp *x = scsi_export(req, args);
	unsigned lun = (unsigned)qapi_get_uint(args, "lun", 0);
	struct lun_gone *g;
	char err[512];

	if (!x)
		return;
	g = calloc(1, sizeof(*g));
	if (!g) {
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
		return;
	}
	if (lun < SCSI_MAX_LUNS && x->lun_ref[lun])
		lun_user(x, lun, g->user, sizeof(g->user));
	if (vub_export_lun_remove(x->vub, lun, lun_gone, g, err, sizeof(err)) < 0) {
		free(g);
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		return;
	}
	x->lun_ref[lun] = false; /* lun_gone drops it */
	qmp_return(req, NULL);
}

static const struct qmp_command scsi_cmds[] = {
	{.name = "x-vhost-user-scsi-lun-add", .args = &qexp_lun_add_args, .fn = lun_add_cmd},
	{.name = "x-vhost-user-scsi-lun-remove",
	 .args = &qexp_lun_remove_args,
	 .fn = lun_remove_cmd},
};

int qexp_scsi_init(void)
{
	for (size_t i = 0; i < sizeof(scsi_cmds) / sizeof(scsi_cmds[0]); i++) {
		int ret = qmp_register(&scsi_cmds[i]);

		if (ret < 0 && ret != -EEXIST)
			return ret;
	}
	return 0;
}
