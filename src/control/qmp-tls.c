/* tls-creds-x509, tls-creds-psk, authz-simple and authz-list objects (see
 * qmp-tls.h): their QAPI schema (qapi/crypto.json and qapi/authz.json's
 * names) and their creation. Deletion is tls_object_del().
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "control/qmp-tls.h"
#include "control/schema.h"
#include "util/tls.h"

static const struct qapi_type endpoint_type =
	QAPI_ENUM_TYPE("QCryptoTLSCredsEndpoint", "client", "server");
const struct qapi_type qmp_tls_creds_x509_props = QAPI_OBJECT_TYPE(
	"TlsCredsX509Properties",
	QAPI_MEMBERS(QAPI_OPT("verify-peer", &qapi_bool), QAPI_OPT("dir", &qapi_str),
		     QAPI_OPT("endpoint", &endpoint_type), QAPI_OPT("priority", &qapi_str),
		     QAPI_OPT("sanity-check", &qapi_bool), QAPI_OPT("passwordid", &qapi_str)));
const struct qapi_type qmp_tls_creds_psk_props = QAPI_OBJECT_TYPE(
	"TlsCredsPskProperties",
	QAPI_MEMBERS(QAPI_OPT("verify-peer", &qapi_bool), QAPI_OPT("dir", &qapi_str),
		     QAPI_OPT("endpoint", &endpoint_type), QAPI_OPT("priority", &qapi_str),
		     QAPI_OPT("username", &qapi_str)));
const struct qapi_type qmp_authz_simple_props =
	QAPI_OBJECT_TYPE("AuthZSimpleProperties", QAPI_MEMBERS(QAPI_REQ("identity", &qapi_str)));
static const struct qapi_type policy_type = QAPI_ENUM_TYPE("QAuthZListPolicy", "deny", "allow");
static const struct qapi_type format_type = QAPI_ENUM_TYPE("QAuthZListFormat", "exact", "glob");
static const struct qapi_type rule_type =
	QAPI_OBJECT_TYPE("QAuthZListRule", QAPI_MEMBERS(QAPI_REQ("match", &qapi_str),
							QAPI_REQ("policy", &policy_type),
							QAPI_OPT("format", &format_type)));
static const struct qapi_type rule_list = QAPI_LIST_TYPE(&rule_type);
const struct qapi_type qmp_authz_list_props =
	QAPI_OBJECT_TYPE("AuthZListProperties", QAPI_MEMBERS(QAPI_OPT("policy", &policy_type),
							     QAPI_OPT("rules", &rule_list)));

bool qmp_tls_handles(const char *t)
{
	return !strcmp(t, "tls-creds-x509") || !strcmp(t, "tls-creds-psk") ||
	       !strcmp(t, "authz-simple") || !strcmp(t, "authz-list");
}

static int creds_add(const json_t *args, bool psk, char *err, size_t errlen)
{
	struct tls_creds_config cfg = {
		.id = qapi_get_str(args, "id"),
		.dir = qapi_get_str(args, "dir"),
		.psk = psk,
		/* QEMU's default endpoint is the client. */
		.server = qapi_get_enum(args, "endpoint", &endpoint_type, 0) == 1,
		.verify_peer = qapi_get_bool(args, "verify-peer", true),
		.sanity_check = qapi_get_bool(args, "sanity-check", true),
		.priority = qapi_get_str(args, "priority"),
		.username = qapi_get_str(args, "username"),
	};

	if (qapi_has(args, "passwordid")) {
		snprintf(err, errlen, "passwordid: encrypted private keys are not supported");
		return -ENOTSUP;
	}
	if (!cfg.dir) {
		/* QEMU's words when dir is missing. */
		snprintf(err, errlen, "Missing 'dir' property value");
		return -EINVAL;
	}
	return tls_creds_add(&cfg, err, errlen);
}

static int authz_list_add(const json_t *args, char *err, size_t errlen)
{
	json_t *rules = qapi_get(args, "rules"), *r;
	size_t n = json_array_size(rules), i;
	struct tls_authz_rule *v = calloc(n ? n : 1, sizeof(*v));
	int ret;

	if (!v) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	json_array_foreach (rules, i, r) {
		v[i].match = qapi_get_str(r, "match");
		v[i].allow = qapi_get_enum(r, "policy", &policy_type, 0) == 1;
		v[i].glob = qapi_get_enum(r, "format", &format_type, 0) == 1;
	}
	ret = tls_authz_add_list(qapi_get_str(args, "id"),
				 qapi_get_enum(args, "policy", &policy_type, 0) == 1, v, n, err,
				 errlen);
	free(v);
	return ret;
}

int qmp_tls_object_add(const json_t *args, char *err, size_t errlen)
{
	const char *t = qapi_get_str(args, "qom-type");

	if (!strcmp(t, "tls-creds-x509"))
		return creds_add(args, false, err, errlen);
	if (!strcmp(t, "tls-creds-psk"))
		return creds_add(args, true, err, errlen);
	if (!strcmp(t, "authz-simple"))
		return tls_authz_add_simple(qapi_get_str(args, "id"),
					    qapi_get_str(args, "identity"), err, errlen);
	return authz_list_add(args, err, errlen);
}
