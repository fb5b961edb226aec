/* blockdev-add's remote protocol drivers, as QEMU 7.2's block-core.json has
 * them: rbd (BlockdevOptionsRbd) and nbd (BlockdevOptionsNbd, plus ioplane's
 * connections=N), and their mapping to the drivers' key=value options.
 *
 * THREADING RULE: constant tables; the mapping runs on the main thread. */
#include <stdio.h>
#include <string.h>

#include "control/qmp-block.h"
#include "control/qmp-export.h"
#include "util/opts.h"

static const struct qapi_type rbd_auth_mode = QAPI_ENUM_TYPE("RbdAuthMode", "cephx", "none");
static const struct qapi_type rbd_auth_list = QAPI_LIST_TYPE(&rbd_auth_mode);

const struct qapi_type qmp_bd_rbd =
	QAPI_OBJECT_TYPE("BlockdevOptionsRbd",
			 QAPI_MEMBERS(QAPI_REQ("pool", &qapi_str), QAPI_OPT("namespace", &qapi_str),
				      QAPI_REQ("image", &qapi_str), QAPI_OPT("conf", &qapi_str),
				      QAPI_OPT("snapshot", &qapi_str), QAPI_OPT("user", &qapi_str),
				      QAPI_OPT("auth-client-required", &rbd_auth_list),
				      QAPI_OPT("key-secret", &qapi_str)));

const struct qapi_type qmp_bd_nbd = QAPI_OBJECT_TYPE(
	"BlockdevOptionsNbd",
	QAPI_MEMBERS(QAPI_REQ("server", &qexp_socket_address), QAPI_OPT("export", &qapi_str),
		     QAPI_OPT("reconnect-delay", &qapi_uint32),
		     QAPI_OPT("open-timeout", &qapi_uint32),
		     QAPI_OPT("connections", &qapi_uint32)));

static int kv_copy(struct kv_opts *kv, const json_t *o, const char *const *keys, const char *pfx)
{
	char k[64], buf[32];
	int ret = 0;

	for (; *keys && !ret; keys++) {
		json_t *v = qapi_get(o, *keys);

		snprintf(k, sizeof(k), "%s%s", pfx, *keys);
		if (json_is_string(v))
			ret = kv_set(kv, k, json_string_value(v));
		else if (json_is_integer(v)) {
			snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(v));
			ret = kv_set(kv, k, buf);
		}
	}
	return ret;
}

/* auth-client-required: a list, as librados takes it ("cephx;none"). */
static int kv_auth(struct kv_opts *kv, const json_t *o)
{
	json_t *l = qapi_get(o, "auth-client-required"), *e;
	char buf[64] = "";
	size_t i;

	if (!l)
		return 0;
	json_array_foreach (l, i, e) {
		size_t n = strlen(buf);

		snprintf(buf + n, sizeof(buf) - n, "%s%s", n ? ";" : "", json_string_value(e));
	}
	return kv_set(kv, "auth-client-required", buf);
}

int qmp_bd_remote_kv(struct kv_opts *kv, const json_t *o, const char *drv)
{
	static const char *const rbd_keys[] = {"pool",     "namespace", "image",      "conf",
					       "snapshot", "user",      "key-secret", NULL};
	static const char *const nbd_keys[] = {"export", "reconnect-delay", "open-timeout",
					       "connections", NULL};
	static const char *const srv_keys[] = {"type", "path", "host", "port", NULL};
	json_t *cache = qapi_get(o, "cache");
	int ret = 0;

	if (!strcmp(drv, "rbd")) {
		ret = kv_copy(kv, o, rbd_keys, "") ?: kv_auth(kv, o);
		/* QEMU: librbd's cache unless cache.direct=on. */
		if (!ret && cache && qapi_has(cache, "direct"))
			ret = kv_set(kv, "cache",
				     qapi_get_bool(cache, "direct", false) ? "none" : "writeback");
	} else if (!strcmp(drv, "nbd")) {
		ret = kv_copy(kv, o, nbd_keys, "")
			      ?: kv_copy(kv, qapi_get(o, "server"), srv_keys, "server.");
	}
	return ret;
}
