/* Objects: iothreads here (--object iothread,..., object-add, object-del,
 * query-iothreads; see qmp-object.h); secrets are qmp-secret.c's,
 * throttle-group objects qmp-throttle.c's and TLS ones qmp-tls.c's, reached
 * from here. Messages are qemu-storage-daemon 7.2's; query-iothreads, which
 * qsd lacks, has QEMU's reply shape.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/qmp-object.h"
#include "control/qmp-tls.h"
#include "control/qmp-throttle.h"
#include "control/qmp.h"
#include "block/throttle-group.h"
#include "control/schema.h"
#include "loop/iothread.h"
#include "util/log.h"
#include "util/secret.h"
#include "util/tls.h"

#define POLL_MAX_NS_DEFAULT 32768 /* QEMU's and the loop's */
#define POOL_MAX 128

struct qobj {
	struct qobj *next;
	char *id;
	struct iothread *t;
	int64_t poll_max_ns, poll_grow, poll_shrink, aio_max_batch;
	unsigned users; /* exports running on it; the pool holds one use forever */
};

static struct qobj *objects;
static struct loop *pool_loops[POOL_MAX];
static void (*detach_fn)(void *arg);
static void *detach_arg;

/* ---- schema ------------------------------------------------------------- */

static const struct qapi_type object_type =
	QAPI_ENUM_TYPE("ObjectType", "iothread", "secret", "throttle-group", "tls-creds-x509",
		       "tls-creds-psk", "authz-simple", "authz-list");
static const struct qapi_type secret_format =
	QAPI_ENUM_TYPE("QCryptoSecretFormat", "raw", "base64");
static const struct qapi_type secret_props = QAPI_OBJECT_TYPE(
	"SecretProperties",
	QAPI_MEMBERS(QAPI_OPT("loaded", &qapi_bool), QAPI_OPT("format", &secret_format),
		     QAPI_OPT("keyid", &qapi_str), QAPI_OPT("iv", &qapi_str),
		     QAPI_OPT("data", &qapi_str), QAPI_OPT("file", &qapi_str)));
static const struct qapi_type iothread_props = QAPI_OBJECT_TYPE(
	"IothreadProperties",
	QAPI_MEMBERS(QAPI_OPT("poll-max-ns", &qapi_int), QAPI_OPT("poll-grow", &qapi_int),
		     QAPI_OPT("poll-shrink", &qapi_int), QAPI_OPT("aio-max-batch", &qapi_int)));
const struct qapi_type qmp_object_options = QAPI_UNION_TYPE(
	"ObjectOptions",
	QAPI_MEMBERS(QAPI_REQ("qom-type", &object_type), QAPI_REQ("id", &qapi_str)), "qom-type",
	{"iothread", &iothread_props}, {"secret", &secret_props},
	{"throttle-group", &qmp_throttle_group_props},
	{"tls-creds-x509", &qmp_tls_creds_x509_props}, {"tls-creds-psk", &qmp_tls_creds_psk_props},
	{"authz-simple", &qmp_authz_simple_props}, {"authz-list", &qmp_authz_list_props});
static const struct qapi_type object_del_args =
	QAPI_OBJECT_TYPE("q_obj_object-del-arg", QAPI_MEMBERS(QAPI_REQ("id", &qapi_str)));
static const struct qapi_type iothread_info = QAPI_OBJECT_TYPE(
	"IOThreadInfo",
	QAPI_MEMBERS(QAPI_REQ("id", &qapi_str), QAPI_REQ("thread-id", &qapi_int),
		     QAPI_REQ("poll-max-ns", &qapi_int), QAPI_REQ("poll-grow", &qapi_int),
		     QAPI_REQ("poll-shrink", &qapi_int), QAPI_REQ("aio-max-batch", &qapi_int),
		     QAPI_OPT("x-ioplane", &qapi_any)));
static const struct qapi_type iothread_info_list = QAPI_LIST_TYPE(&iothread_info);

/* ---- the objects -------------------------------------------------------- */

static struct qobj *find(const char *id)
{
	struct qobj *o;

	for (o = objects; o; o = o->next)
		if (!strcmp(o->id, id))
			return o;
	return NULL;
}

static struct qobj *find_loop(const struct loop *loop)
{
	struct qobj *o;

	for (o = objects; o; o = o->next)
		if (iothread_loop(o->t) == loop)
			return o;
	return NULL;
}

static int check_props(const json_t *args, int64_t v[4], char *err, size_t errlen)
{
	static const char *const names[4] = {"poll-max-ns", "poll-grow", "poll-shrink",
					     "aio-max-batch"};
	unsigned i;

	for (i = 0; i < 4; i++) {
		v[i] = qapi_get_int(args, names[i], i == 0 ? POLL_MAX_NS_DEFAULT : 0);
		if (v[i] < 0) {
			snprintf(err, errlen, "%s value must be in range [0, %lld]", names[i],
				 (long long)INT64_MAX);
			return -EINVAL;
		}
	}
	return 0;
}

static unsigned clamp_u32(int64_t v)
{
	return v > (int64_t)UINT32_MAX ? UINT32_MAX : (unsigned)v;
}

static int object_new(const char *id, const int64_t v[4], bool explicit_poll, char *err,
		      size_t errlen)
{
	/* Beyond 32 bits the effect is the same (a factor saturates, a batch
	 * is capped by the engine's depth). */
	struct loop_opts lo = {.backend = LOOP_BACKEND_AUTO,
			       .poll_max_ns = explicit_poll ? v[0] : -1,
			       .poll_grow = clamp_u32(v[1]),
			       .poll_shrink = clamp_u32(v[2]),
			       .aio_max_batch = clamp_u32(v[3])};
	struct qobj *o = calloc(1, sizeof(*o));
	int ret;

	if (!o || !(o->id = strdup(id))) {
		free(o);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ret = iothread_start(id, &lo, &o->t);
	if (ret < 0) {
		snprintf(err, errlen, "Failed to create iothread '%s': %s", id, strerror(-ret));
		free(o->id);
		free(o);
		return ret;
	}
	o->poll_max_ns = v[0];
	o->poll_grow = v[1];
	o->poll_shrink = v[2];
	o->aio_max_batch = v[3];
	o->next = objects;
	objects = o;
	return 0;
}

bool qmp_object_exists(const char *id)
{
	return find(id) || throttle_group_find(id) || secret_exists(id) || tls_object_exists(id);
}

/* One namespace for every object, as QEMU's /objects. */
static int duplicate(const char *id, char *err, size_t errlen)
{
	snprintf(err, errlen, "attempt to add duplicate property '%s' to object (type 'container')",
		 id);
	return -EEXIST;
}

int qmp_object_add(const json_t *args, char *err, size_t errlen)
{
	const char *id = qapi_get_str(args, "id"), *type;
	int64_t v[4];
	int ret;

	if (!qapi_id_wellformed(id)) {
		snprintf(err, errlen, "Parameter 'id' expects an identifier");
		return -EINVAL;
	}
	type = qapi_get_str(args, "qom-type");
	/* An iothread's properties are checked before its id, as qsd does. */
	if (strcmp(type, "iothread") && qmp_object_exists(id))
		return duplicate(id, err, errlen);
	if (!strcmp(type, "throttle-group"))
		return qmp_throttle_add(args, err, errlen);
	if (!strcmp(type, "secret"))
		return qmp_secret_add(id, args, err, errlen);
	if (qmp_tls_handles(type))
		return qmp_tls_object_add(args, err, errlen);
	ret = check_props(args, v, err, errlen);
	if (ret < 0)
		return ret;
	if (qmp_object_exists(id))
		return duplicate(id, err, errlen);
	return object_new(id, v, qapi_has(args, "poll-max-ns"), err, errlen);
}

int qmp_object_add_option(const char *arg, char *err, size_t errlen)
{
	json_t *o = qapi_parse_option(&qmp_object_options, arg, "qom-type", err, errlen);
	int ret;

	if (!o)
		return -EINVAL;
	ret = qmp_object_add(o, err, errlen);
	json_decref(o);
	return ret;
}

static void object_free(struct qobj *o)
{
	if (detach_fn)
		iothread_run_sync(o->t, detach_fn, detach_arg);
	iothread_join(o->t);
	free(o->id);
	free(o);
}

int qmp_iothread_pool(unsigned n, int64_t poll_max_ns, struct loop ***loops, char *err,
		      size_t errlen)
{
	int64_t v[4] = {poll_max_ns < 0 ? POLL_MAX_NS_DEFAULT : poll_max_ns, 0, 0, 0};
	char id[32];
	unsigned i;
	int ret;

	if (n > POOL_MAX)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		snprintf(id, sizeof(id), "iothread%u", i);
		if (find(id)) {
			snprintf(err, errlen, "--iothreads: the id '%s' is taken by an --object",
				 id);
			return -EEXIST;
		}
		ret = object_new(id, v, poll_max_ns >= 0, err, errlen);
		if (ret < 0)
			return ret;
		objects->users = 1;
		pool_loops[i] = iothread_loop(objects->t);
	}
	*loops = pool_loops;
	return 0;
}

struct loop *qmp_iothread_get(const char *id, char *err, size_t errlen)
{
	struct qobj *o = find(id);

	if (!o) {
		snprintf(err, errlen, "iothread \"%s\" not found", id);
		return NULL;
	}
	o->users++;
	return iothread_loop(o->t);
}

void qmp_iothread_put(struct loop *loop)
{
	struct qobj *o = find_loop(loop);

	if (o && o->users)
		o->users--;
}

const char *qmp_iothread_id(const struct loop *loop)
{
	struct qobj *o = find_loop(loop);

	return o ? o->id : NULL;
}

void qmp_objects_set_detach(void (*fn)(void *arg), void *arg)
{
	detach_fn = fn;
	detach_arg = arg;
}

void qmp_objects_free(void)
{
	struct qobj *o;

	while ((o = objects)) {
		objects = o->next;
		object_free(o);
	}
	secret_free_all();
	tls_objects_free();
}

/* ---- commands ----------------------------------------------------------- */

static void object_add_cmd(struct qmp_req *req, json_t *args)
{
	char err[256];

	if (qmp_object_add(args, err, sizeof(err)) < 0)
		qmp_error(req, QMP_ERR_GENERIC, "%s", err);
	else
		qmp_return(req, NULL);
}

static void object_del_cmd(struct qmp_req *req, json_t *args)
{
	const char *id = qapi_get_str(args, "id");
	struct qobj **pp, *o;

	char err[256];

	for (pp = &objects; (o = *pp) && strcmp(o->id, id); pp = &o->next)
		;
	/* TLS objects: users keep theirs; new users find the next one. */
	if (!o && (secret_del(id) == 0 || tls_object_del(id) == 0)) {
		qmp_return(req, NULL);
		return;
	}
	if (!o) {
		/* A throttle group in use by a throttle node stays. */
		if (throttle_group_del(id, err, sizeof(err)) < 0)
			qmp_error(req, QMP_ERR_GENERIC, "%s", err);
		else
			qmp_return(req, NULL);
		return;
	}
	/* qsd 7.2 deletes an iothread that a block node still runs on. */
	if (o->users) {
		qmp_error(req, QMP_ERR_GENERIC, "object '%s' is in use, can not be deleted", id);
		return;
	}
	*pp = o->next;
	object_free(o);
	qmp_return(req, NULL);
}

void qmp_iothreads_foreach(void (*fn)(void *ctx, const char *id, struct iothread *t), void *ctx)
{
	struct qobj *list[POOL_MAX * 2], *o;
	unsigned n = 0;

	/* objects is newest first. */
	for (o = objects; o && n < sizeof(list) / sizeof(list[0]); o = o->next)
		list[n++] = o;
	while (n--)
		fn(ctx, list[n]->id, list[n]->t);
}

/* What the loop counted (read racily: the iothread writes them), beside
 * QEMU's members, as the metrics endpoint reports them. */
static json_t *iothread_extra(struct iothread *t)
{
	struct loop_stats st;

	loop_get_stats(iothread_loop(t), &st);
	return json_pack("{s:I,s:I,s:I,s:I,s:I,s:I}", "rounds", (json_int_t)st.rounds, "sleeps",
			 (json_int_t)st.sleeps, "poll-hits", (json_int_t)st.poll_hits,
			 "poll-misses", (json_int_t)st.poll_misses, "poll-ns",
			 (json_int_t)st.poll_ns, "busy-ns", (json_int_t)iothread_cpu_ns(t));
}

static void query_iothreads(struct qmp_req *req, json_t *args)
{
	json_t *list = json_array();
	struct qobj *o;

	(void)args;
	for (o = objects; list && o; o = o->next)
		json_array_insert_new(
			list, 0,
			json_pack("{s:s,s:i,s:I,s:I,s:I,s:I,s:o*}", "id", o->id, "thread-id",
				  (int)iothread_tid(o->t), "poll-max-ns",
				  (json_int_t)o->poll_max_ns, "poll-grow", (json_int_t)o->poll_grow,
				  "poll-shrink", (json_int_t)o->poll_shrink, "aio-max-batch",
				  (json_int_t)o->aio_max_batch, "x-ioplane", iothread_extra(o->t)));
	if (!list) {
		qmp_error(req, QMP_ERR_GENERIC, "out of memory");
		return;
	}
	qmp_return(req, list);
}

static const struct qmp_command object_cmds[] = {
	{.name = "object-add", .args = &qmp_object_options, .fn = object_add_cmd},
	{.name = "object-del", .args = &object_del_args, .fn = object_del_cmd},
	{.name = "query-iothreads", .ret = &iothread_info_list, .fn = query_iothreads},
};

int qmp_object_register(void)
{
	size_t i;
	int ret;

	for (i = 0; i < sizeof(object_cmds) / sizeof(object_cmds[0]); i++) {
		ret = qmp_register(&object_cmds[i]);
		if (ret < 0 && ret != -EEXIST)
			return ret;
	}
	return qmp_throttle_register();
}
