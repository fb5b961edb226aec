/* throttle-group objects over QMP and --object: their properties as QEMU
 * has them (the "limits" struct, and the older x-iops-total ... spellings,
 * settable only while the object is made), object-add / object-del through
 * qmp-object.c, and qom-get / qom-set; qemu-storage-daemon 7.2's messages.
 * The groups themselves are block/throttle-group.c's.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "block/throttle-group.h"
#include "control/qmp-object.h"
#include "control/qmp-throttle.h"
#include "control/qmp.h"
#include "control/schema.h"

#define LIMIT_MEMBERS(p)                                                                           \
	QAPI_OPT(p "iops-total", &qapi_int), QAPI_OPT(p "iops-total-max", &qapi_int),              \
		QAPI_OPT(p "iops-total-max-length", &qapi_int),                                    \
		QAPI_OPT(p "iops-read", &qapi_int), QAPI_OPT(p "iops-read-max", &qapi_int),        \
		QAPI_OPT(p "iops-read-max-length", &qapi_int),                                     \
		QAPI_OPT(p "iops-write", &qapi_int), QAPI_OPT(p "iops-write-max", &qapi_int),      \
		QAPI_OPT(p "iops-write-max-length", &qapi_int),                                    \
		QAPI_OPT(p "bps-total", &qapi_int), QAPI_OPT(p "bps-total-max", &qapi_int),        \
		QAPI_OPT(p "bps-total-max-length", &qapi_int), QAPI_OPT(p "bps-read", &qapi_int),  \
		QAPI_OPT(p "bps-read-max", &qapi_int),                                             \
		QAPI_OPT(p "bps-read-max-length", &qapi_int), QAPI_OPT(p "bps-write", &qapi_int),  \
		QAPI_OPT(p "bps-write-max", &qapi_int),                                            \
		QAPI_OPT(p "bps-write-max-length", &qapi_int), QAPI_OPT(p "iops-size", &qapi_int)

static const struct qapi_type throttle_limits =
	QAPI_OBJECT_TYPE("ThrottleLimits", QAPI_MEMBERS(LIMIT_MEMBERS("")));
const struct qapi_type qmp_throttle_group_props =
	QAPI_OBJECT_TYPE("ThrottleGroupProperties",
			 QAPI_MEMBERS(QAPI_OPT("limits", &throttle_limits), LIMIT_MEMBERS("x-")));
/* qom-set's value for "limits", checked as object-add checks it. */
static const struct qapi_type limits_holder =
	QAPI_OBJECT_TYPE("q_obj_limits", QAPI_MEMBERS(QAPI_REQ("limits", &throttle_limits)));

static const char *const suffix[3] = {"", "-max", "-max-length"};

static uint64_t *field(struct throttle_config *cfg, int b, int k)
{
	struct throttle_limit *l = &cfg->b[b];

	return k == 0 ? &l->avg : k == 1 ? &l->max : &l->burst_length;
}

/* One property of props (prefix "" in limits, "x-" on the object) into
 * *to: 0, 1 when absent, or -EINVAL with QEMU's message. */
static int apply_one(const json_t *props, const char *prefix, const char *key, const char *sfx,
		     uint64_t *to, char *err, size_t errlen)
{
	char name[64];
	int64_t v;

	snprintf(name, sizeof(name), "%s%s%s", prefix, key, sfx);
	if (!qapi_has(props, name))
		return 1;
	v = qapi_get_int(props, name, 0);
	if (*prefix && v < 0) {
		snprintf(err, errlen, "Property values cannot be negative");
		return -EINVAL;
	}
	if (!strcmp(sfx, "-max-length") && v > (int64_t)UINT_MAX) {
		/* QEMU's words, its missing space in the x- spelling too. */
		snprintf(err, errlen, "%s value must be in the%srange [0, %u]", name,
			 *prefix ? "" : " ", UINT_MAX);
		return -EINVAL;
	}
	/* QEMU keeps a length in an unsigned int and the rest in doubles
	 * or uint64: a negative value is then out of range. */
	*to = !strcmp(sfx, "-max-length") ? (uint64_t)(unsigned)v : (uint64_t)v;
	return 0;
}

static int apply(struct throttle_config *cfg, const json_t *props, const char *prefix, char *err,
		 size_t errlen)
{
	int ret;

	for (int b = 0; b < THR__COUNT; b++)
		for (int k = 0; k < 3; k++) {
			ret = apply_one(props, prefix, throttle_bucket_key(b), suffix[k],
					field(cfg, b, k), err, errlen);
			if (ret < 0)
				return ret;
		}
	ret = apply_one(props, prefix, "iops-size", "", &cfg->op_size, err, errlen);
	return ret < 0 ? ret : 0;
}

int qmp_throttle_add(const json_t *args, char *err, size_t errlen)
{
	struct throttle_config cfg = {0};
	json_t *limits = qapi_get(args, "limits");
	int ret;

	for (int b = 0; b < THR__COUNT; b++)
		cfg.b[b].burst_length = 1;
	ret = apply(&cfg, args, "x-", err, errlen);
	if (!ret && limits)
		ret = apply(&cfg, limits, "", err, errlen);
	if (!ret)
		ret = throttle_group_add(qapi_get_str(args, "id"), &cfg, err, errlen);
	return ret;
}

/* ---- qom-get / qom-set --------------------------------------------------- */

static json_t *limits_json(struct throttle_config *cfg)
{
	json_t *o = json_object();
	char name[64];

	for (int b = 0; o && b < THR__COUNT; b++)
		for (int k = 0; k < 3; k++) {
			snprintf(name, sizeof(name), "%s%s", throttle_bucket_key(b), suffix[k]);
			json_object_set_new(o, name, json_integer((json_int_t)*field(cfg, b, k)));
		}
	if (o)
		json_object_set_new(o, "iops-size", json_integer((json_int_t)cfg->op_size));
	return o;
}

/* The value of property prop of g, or NULL when g has none. */
static json_t *group_prop(struct throttle_group *g, const char *prop)
{
	struct throttle_config cfg;
	json_t *all, *v;

	pthread_mutex_lock(&g->lock);
	cfg = g->cfg;
	pthread_mutex_unlock(&g->lock);
	if (!strcmp(prop, "type"))
		return json_string("throttle-group");
	all = limits_json(&cfg);
	if (!strcmp(prop, "limits") || !all)
		return all;
	v = strncmp(prop, "x-", 2) ? NULL : json_incref(json_object_get(all, prop + 2));
	json_decref(all);
	return v;
}

/* QEMU's object paths for what object-add made: "ID" or "/objects/ID". */
static const char *path_id(const char *path)
{
	return strncmp(path, "/objects/", 9) ? path : path + 9;
}

int qmp_throttle_qom_get(const char *path, const char *prop, json_t **out, char *err, size_t errlen)
{
	struct throttle_group *g = throttle_group_find(path_id(path));

	if (!g)
		return -ENOENT;
	*out = group_prop(g, prop);
	if (!*out) {
		snprintf(err, errlen, "Property 'throttle-group.%s' not found", prop);
		return -EINVAL;
	}
	return 0;
}

static int set_limits(struct throttle_group *g, json_t *value, char *err, size_t errlen)
{
	json_t *holder = json_pack("{s:O}", "limits", value);
	struct throttle_config cfg;
	int ret;

	if (!holder) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ret = qapi_validate(&limits_holder, holder, false, err, errlen);
	pthread_mutex_lock(&g->lock);
	cfg = g->cfg;
	pthread_mutex_unlock(&g->lock);
	/* What the value leaves out keeps its current setting, as in QEMU. */
	if (!ret)
		ret = apply(&cfg, qapi_get(holder, "limits"), "", err, errlen);
	if (!ret)
		ret = throttle_group_set(g, &cfg, err, errlen);
	json_decref(holder);
	return ret;
}

int qmp_throttle_qom_set(const char *path, const char *prop, json_t *value, char *err,
			 size_t errlen)
{
	struct throttle_group *g = throttle_group_find(path_id(path));
	json_t *cur;

	if (!g)
		return -ENOENT;
	if (!strcmp(prop, "limits"))
		return set_limits(g, value, err, errlen);
	cur = group_prop(g, prop);
	if (!cur)
		snprintf(err, errlen, "Property 'throttle-group.%s' not found", prop);
	else if (!strcmp(prop, "type"))
		snprintf(err, errlen, "Insufficient permission to perform this operation");
	else
		snprintf(err, errlen, "Property cannot be set after initialization");
	json_decref(cur);
	return -EINVAL;
}

/* ---- commands ----------------------------------------------------------- */

static const struct qapi_type qom_get_args =
	QAPI_OBJECT_TYPE("q_obj_qom-get-arg", QAPI_MEMBERS(QAPI_REQ("path", &qapi_str),
							   QAPI_REQ("property", &qapi_str)));
static const struct qapi_type qom_set_args =
	QAPI_OBJECT_TYPE("q_obj_qom-set-arg",
			 QAPI_MEMBERS(QAPI_REQ("path", &qapi_str), QAPI_REQ("property", &qapi_str),
				      QAPI_REQ("value", &qapi_any)));

/* A path that names no throttle group: QEMU's reply for no object at all;
 * an iothread's properties are read with query-iothreads and not set at
 * run time (QEMU sets its poll-* ones): say so rather than not finding it. */
static void not_a_group(struct qmp_req *req, const char *path)
{
	if (qmp_object_exists(path_id(path)))
		qmp_error(
			req, QMP_ERR_GENERIC,
			"object '%s' is an iothread: qom-get and qom-set are for throttle groups; "
			"see query-iothreads",
			path_id(path));
	else
		qmp_error(req, QMP_ERR_DEVICE_NOT_FOUND, "Device '%s' not found", path);
}

static void qom_get_cmd(struct qmp_req *req, json_t *args)
{
	const char *path = qapi_get_str(args, "path");
	json_t *v = NULL;
	char err[256];
	int ret = qmp_throttle_qom_get(path, qapi_get_str(args, "property"), &v, err, sizeof(err));

	if (ret == -ENOENT)
		not_a_group(req, path);
	else if (ret)
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
	else
		qmp_return(req, v);
}

static void qom_set_cmd(struct qmp_req *req, json_t *args)
{
	const char *path = qapi_get_str(args, "path");
	char err[256];
	int ret = qmp_throttle_qom_set(path, qapi_get_str(args, "property"),
				       qapi_get(args, "value"), err, sizeof(err));

	if (ret == -ENOENT)
		not_a_group(req, path);
	else if (ret)
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
	else
		qmp_return(req, NULL);
}

static const struct qmp_command qom_cmds[] = {
	{.name = "qom-get", .args = &qom_get_args, .ret = &qapi_any, .fn = qom_get_cmd},
	{.name = "qom-set", .args = &qom_set_args, .fn = qom_set_cmd},
};

int qmp_throttle_register(void)
{
	int ret;

	for (size_t i = 0; i < sizeof(qom_cmds) / sizeof(qom_cmds[0]); i++) {
		ret = qmp_register(&qom_cmds[i]);
		if (ret < 0 && ret != -EEXIST)
			return ret;
	}
	return 0;
}
