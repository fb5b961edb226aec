/* TLS credentials and authorisation objects (see tls.h), and the GnuTLS
 * server sessions made from them. File names and messages are QEMU's.
 *
 * Threading: the registry (objects, and every object's refs) is protected
 * by reg_lock; an object's other fields are immutable once registered. */
#include <errno.h>
#include <fnmatch.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/tls.h"

struct tls_obj {
	struct tls_obj *next; /* protected by reg_lock */
	char *id;
	unsigned refs; /* protected by reg_lock: the registry's + users' */
};

struct tls_creds {
	struct tls_obj o;
	bool psk, server, verify_peer;
	char *priority; /* NULL: the system default */
	gnutls_certificate_credentials_t x509;
	gnutls_psk_server_credentials_t psk_cred;
	gnutls_dh_params_t dh;
};

struct tls_authz {
	struct tls_obj o;
	bool allow_default;
	size_t nrules;
	struct tls_authz_rule *rules; /* match strings owned here */
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tls_obj *creds_list, *authz_list; /* protected by reg_lock */

/* ---- the registry --------------------------------------------------------- */

static struct tls_obj *find_in(struct tls_obj *o, const char *id)
{
	for (; o; o = o->next)
		if (!strcmp(o->id, id))
			return o;
	return NULL;
}

bool tls_object_exists(const char *id)
{
	bool r;

	pthread_mutex_lock(&reg_lock);
	r = find_in(creds_list, id) || find_in(authz_list, id);
	pthread_mutex_unlock(&reg_lock);
	return r;
}

static void creds_free(struct tls_creds *c)
{
	if (c->x509)
		gnutls_certificate_free_credentials(c->x509);
	if (c->psk_cred)
		gnutls_psk_free_server_credentials(c->psk_cred);
	if (c->dh)
		gnutls_dh_params_deinit(c->dh);
	free(c->priority);
	free(c->o.id);
	free(c);
}

static void authz_free(struct tls_authz *a)
{
	for (size_t i = 0; i < a->nrules; i++)
		free((char *)a->rules[i].match);
	free(a->rules);
	free(a->o.id);
	free(a);
}

/* Drop a reference; true when it was the last (the caller frees). */
static bool obj_unref(struct tls_obj *o)
{
	bool last;

	pthread_mutex_lock(&reg_lock);
	last = --o->refs == 0;
	pthread_mutex_unlock(&reg_lock);
	return last;
}

void tls_creds_put(struct tls_creds *c)
{
	if (c && obj_unref(&c->o))
		creds_free(c);
}

void tls_authz_put(struct tls_authz *a)
{
	if (a && obj_unref(&a->o))
		authz_free(a);
}

/* A reference to the object with that id on *list, or NULL. */
static struct tls_obj *obj_get(struct tls_obj *const *list, const char *id)
{
	struct tls_obj *o;

	pthread_mutex_lock(&reg_lock);
	o = find_in(*list, id);
	if (o)
		o->refs++;
	pthread_mutex_unlock(&reg_lock);
	return o;
}

struct tls_creds *tls_creds_get(const char *id)
{
	return (struct tls_creds *)obj_get(&creds_list, id); /* o is its first member */
}

struct tls_authz *tls_authz_get(const char *id)
{
	return (struct tls_authz *)obj_get(&authz_list, id);
}

/* Unlink id from a list whose objects start with their struct tls_obj. */
static struct tls_obj *unlink_obj(struct tls_obj **pp, const char *id)
{
	struct tls_obj *o;

	for (; (o = *pp); pp = &o->next)
		if (!strcmp(o->id, id)) {
			*pp = o->next;
			return o;
		}
	return NULL;
}

int tls_object_del(const char *id)
{
	struct tls_obj *c, *a = NULL;

	pthread_mutex_lock(&reg_lock);
	c = unlink_obj(&creds_list, id);
	if (!c)
		a = unlink_obj(&authz_list, id);
	pthread_mutex_unlock(&reg_lock);
	if (c)
		tls_creds_put((struct tls_creds *)c);
	else if (a)
		tls_authz_put((struct tls_authz *)a);
	return c || a ? 0 : -ENOENT;
}

void tls_objects_free(void)
{
	while (creds_list)
		tls_object_del(creds_list->id);
	while (authz_list)
		tls_object_del(authz_list->id);
}

/* Register o (refs 1: the registry's) at the head of *list. */
static int obj_register(struct tls_obj **list, struct tls_obj *o, const char *id, char *err,
			size_t errlen)
{
	int ret = 0;

	o->id = strdup(id);
	if (!o->id) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	o->refs = 1;
	pthread_mutex_lock(&reg_lock);
	if (find_in(creds_list, id) || find_in(authz_list, id)) {
		snprintf(err, errlen,
			 "attempt to add duplicate property '%s' to object (type 'container')", id);
		ret = -EEXIST;
	} else {
		o->next = *list;
		*list = o;
	}
	pthread_mutex_unlock(&reg_lock);
	return ret;
}

/* ---- x509 and PSK credentials ------------------------------------------- */

static int cred_path(const char *dir, const char *name, bool required, char *path, size_t len,
		     char *err, size_t errlen)
{
	snprintf(path, len, "%s/%s", dir, name);
	if (access(path, R_OK) == 0)
		return 1;
	if (!required && errno == ENOENT)
		return 0;
	snprintf(err, errlen, "Unable to access credentials %s: %s", path, strerror(errno));
	return -errno;
}

static int gnutls_fail(int ret, const char *what, const char *path, char *err, size_t errlen)
{
	snprintf(err, errlen, "Cannot load %s %s: %s", what, path, gnutls_strerror(ret));
	return -EINVAL;
}

/* QEMU's sanity check, on the server certificate: within its dates. */
static int check_cert_dates(const char *path, char *err, size_t errlen)
{
	gnutls_datum_t d = {NULL, 0};
	gnutls_x509_crt_t crt;
	time_t now = time(NULL);
	int ret = gnutls_load_file(path, &d);

	if (ret < 0)
		return gnutls_fail(ret, "certificate", path, err, errlen);
	if (gnutls_x509_crt_init(&crt) < 0) {
		gnutls_free(d.data);
		return -ENOMEM;
	}
	ret = gnutls_x509_crt_import(crt, &d, GNUTLS_X509_FMT_PEM);
	gnutls_free(d.data);
	if (ret < 0) {
		gnutls_x509_crt_deinit(crt);
		return gnutls_fail(ret, "certificate", path, err, errlen);
	}
	if (gnutls_x509_crt_get_expiration_time(crt) < now) {
		snprintf(err, errlen, "The certificate %s has expired", path);
		ret = -EINVAL;
	} else if (gnutls_x509_crt_get_activation_time(crt) > now) {
		snprintf(err, errlen, "The certificate %s is not yet active", path);
		ret = -EINVAL;
	}
	gnutls_x509_crt_deinit(crt);
	return ret;
}

static int load_dh(struct tls_creds *c, const char *path, char *err, size_t errlen)
{
	gnutls_datum_t d = {NULL, 0};
	int ret = gnutls_load_file(path, &d);

	if (ret >= 0)
		ret = gnutls_dh_params_init(&c->dh);
	if (ret >= 0)
		ret = gnutls_dh_params_import_pkcs3(c->dh, &d, GNUTLS_X509_FMT_PEM);
	gnutls_free(d.data);
	if (ret < 0)
		return gnutls_fail(ret, "DH parameters", path, err, errlen);
	gnutls_certificate_set_dh_params(c->x509, c->dh);
	return 0;
}

static int load_x509(struct tls_creds *c, const struct tls_creds_config *cfg, char *err,
		     size_t errlen)
{
	char ca[4096], crl[4096], cert[4096], key[4096], dh[4096];
	int ret, have_crl, have_dh;

	if ((ret = cred_path(cfg->dir, "ca-cert.pem", true, ca, sizeof(ca), err, errlen)) < 0 ||
	    (have_crl = ret =
		     cred_path(cfg->dir, "ca-crl.pem", false, crl, sizeof(crl), err, errlen)) < 0 ||
	    (ret = cred_path(cfg->dir, "server-cert.pem", true, cert, sizeof(cert), err, errlen)) <
		    0 ||
	    (ret = cred_path(cfg->dir, "server-key.pem", true, key, sizeof(key), err, errlen)) <
		    0 ||
	    (have_dh = ret =
		     cred_path(cfg->dir, "dh-params.pem", false, dh, sizeof(dh), err, errlen)) < 0)
		return ret;
	if (cfg->sanity_check && (ret = check_cert_dates(cert, err, errlen)) < 0)
		return ret;
	if (gnutls_certificate_allocate_credentials(&c->x509) < 0)
		return -ENOMEM;
	ret = gnutls_certificate_set_x509_trust_file(c->x509, ca, GNUTLS_X509_FMT_PEM);
	if (ret < 0)
		return gnutls_fail(ret, "CA certificate", ca, err, errlen);
	if (have_crl) {
		ret = gnutls_certificate_set_x509_crl_file(c->x509, crl, GNUTLS_X509_FMT_PEM);
		if (ret < 0)
			return gnutls_fail(ret, "CRL", crl, err, errlen);
	}
	ret = gnutls_certificate_set_x509_key_file(c->x509, cert, key, GNUTLS_X509_FMT_PEM);
	if (ret < 0)
		return gnutls_fail(ret, "certificate", cert, err, errlen);
	if (have_dh)
		return load_dh(c, dh, err, errlen);
	gnutls_certificate_set_known_dh_params(c->x509, GNUTLS_SEC_PARAM_MEDIUM);
	return 0;
}

static int load_psk(struct tls_creds *c, const struct tls_creds_config *cfg, char *err,
		    size_t errlen)
{
	char keys[4096];
	int ret = cred_path(cfg->dir, "keys.psk", true, keys, sizeof(keys), err, errlen);

	if (ret < 0)
		return ret;
	if (gnutls_psk_allocate_server_credentials(&c->psk_cred) < 0)
		return -ENOMEM;
	ret = gnutls_psk_set_server_credentials_file(c->psk_cred, keys);
	if (ret < 0)
		return gnutls_fail(ret, "PSK keys", keys, err, errlen);
	gnutls_psk_set_server_known_dh_params(c->psk_cred, GNUTLS_SEC_PARAM_MEDIUM);
	return 0;
}

int tls_creds_add(const struct tls_creds_config *cfg, char *err, size_t errlen)
{
	struct tls_creds *c = calloc(1, sizeof(*c));
	int ret = -ENOMEM;

	if (!c)
		goto fail;
	c->psk = cfg->psk;
	c->server = cfg->server;
	c->verify_peer = cfg->verify_peer && !cfg->psk;
	if (cfg->priority && !(c->priority = strdup(cfg->priority)))
		goto fail;
	/* GnuTLS is mapped from the first credentials on (util/gnutls-dl.h). */
	if (cfg->server && (ret = gnutls_dl_load(err, errlen)) < 0)
		goto fail_msg;
	/* A client endpoint has no use in a server: kept, never loaded. */
	ret = !cfg->server ? 0
	      : cfg->psk   ? load_psk(c, cfg, err, errlen)
			   : load_x509(c, cfg, err, errlen);
	if (ret < 0)
		goto fail_msg;
	ret = obj_register(&creds_list, &c->o, cfg->id, err, errlen);
	if (ret < 0)
		goto fail_msg;
	return 0;

fail:
	snprintf(err, errlen, "out of memory");
fail_msg:
	if (c)
		creds_free(c);
	return ret;
}

bool tls_creds_is_server(const struct tls_creds *c)
{
	return c->server;
}

/* ---- authorisation ------------------------------------------------------ */

int tls_authz_add_list(const char *id, bool allow_default, const struct tls_authz_rule *rules,
		       size_t nrules, char *err, size_t errlen)
{
	struct tls_authz *a = calloc(1, sizeof(*a));
	int ret;

	if (!a || (nrules && !(a->rules = calloc(nrules, sizeof(*rules)))))
		goto nomem;
	a->allow_default = allow_default;
	for (; a->nrules < nrules; a->nrules++) {
		a->rules[a->nrules] = rules[a->nrules];
		a->rules[a->nrules].match = strdup(rules[a->nrules].match);
		if (!a->rules[a->nrules].match)
			goto nomem;
	}
	ret = obj_register(&authz_list, &a->o, id, err, errlen);
	if (ret < 0)
		authz_free(a);
	return ret;

nomem:
	snprintf(err, errlen, "out of memory");
	if (a)
		authz_free(a);
	return -ENOMEM;
}

int tls_authz_add_simple(const char *id, const char *identity, char *err, size_t errlen)
{
	struct tls_authz_rule r = {.match = identity, .allow = true, .glob = false};

	return tls_authz_add_list(id, false, &r, 1, err, errlen);
}

/* authz-list: the first rule that matches decides, else the default. */
bool tls_authz_check(const struct tls_authz *a, const char *identity)
{
	for (size_t i = 0; i < a->nrules; i++) {
		const struct tls_authz_rule *r = &a->rules[i];

		if (r->glob ? fnmatch(r->match, identity, 0) == 0 : !strcmp(r->match, identity))
			return r->allow;
	}
	return a->allow_default;
}

/* ---- sessions ----------------------------------------------------------- */

static int session_priority(gnutls_session_t s, const struct tls_creds *c)
{
	const char *errpos;

	if (c->priority)
		return gnutls_priority_set_direct(s, c->priority, &errpos);
	if (c->psk)
		return gnutls_set_default_priority_append(s, "+ECDHE-PSK:+DHE-PSK:+PSK", &errpos,
							  0);
	return gnutls_set_default_priority(s);
}

int tls_session_new(struct tls_creds *c, int fd, gnutls_session_t *out, char *err, size_t errlen)
{
	gnutls_session_t s;
	int ret = gnutls_init(&s, GNUTLS_SERVER | GNUTLS_NONBLOCK);

	if (ret < 0) {
		snprintf(err, errlen, "cannot start a TLS session: %s", gnutls_strerror(ret));
		return -ENOMEM;
	}
	ret = session_priority(s, c);
	if (ret >= 0)
		ret = c->psk ? gnutls_credentials_set(s, GNUTLS_CRD_PSK, c->psk_cred)
			     : gnutls_credentials_set(s, GNUTLS_CRD_CERTIFICATE, c->x509);
	if (ret < 0) {
		snprintf(err, errlen, "cannot set up the TLS session: %s", gnutls_strerror(ret));
		gnutls_deinit(s);
		return -EINVAL;
	}
	if (!c->psk)
		gnutls_certificate_server_set_request(s, c->verify_peer ? GNUTLS_CERT_REQUIRE
									: GNUTLS_CERT_IGNORE);
	gnutls_handshake_set_timeout(s, 0); /* the caller times the handshake */
	gnutls_transport_set_int(s, fd);
	*out = s;
	return 0;
}

/* The client's certificate: trusted by our CA, in its dates, not revoked;
 * identity gets its distinguished name. */
static int check_x509(gnutls_session_t s, char *identity, size_t idlen, char *err, size_t errlen)
{
	const gnutls_datum_t *certs;
	unsigned status = 0, n = 0;
	gnutls_x509_crt_t crt;
	gnutls_datum_t msg;
	size_t len = idlen;
	int ret = gnutls_certificate_verify_peers2(s, &status);

	if (ret < 0 || status) {
		if (ret >= 0 && gnutls_certificate_verification_status_print(
					status, GNUTLS_CRT_X509, &msg, 0) >= 0) {
			snprintf(err, errlen, "client certificate refused: %s", msg.data);
			gnutls_free(msg.data);
		} else {
			snprintf(err, errlen, "client certificate refused: %s",
				 ret < 0 ? gnutls_strerror(ret) : "not trusted");
		}
		return -EACCES;
	}
	certs = gnutls_certificate_get_peers(s, &n);
	if (!certs || !n || gnutls_x509_crt_init(&crt) < 0) {
		snprintf(err, errlen, "the client sent no certificate");
		return -EACCES;
	}
	ret = gnutls_x509_crt_import(crt, &certs[0], GNUTLS_X509_FMT_DER);
	if (ret >= 0)
		ret = gnutls_x509_crt_get_dn(crt, identity, &len);
	gnutls_x509_crt_deinit(crt);
	if (ret < 0) {
		snprintf(err, errlen, "cannot read the client's name: %s", gnutls_strerror(ret));
		return -EACCES;
	}
	return 0;
}

int tls_session_check(gnutls_session_t s, const struct tls_creds *c, const struct tls_authz *authz,
		      char *identity, size_t idlen, char *err, size_t errlen)
{
	const char *user;
	int ret;

	identity[0] = 0;
	if (c->psk) {
		user = gnutls_psk_server_get_username(s);
		snprintf(identity, idlen, "%s", user ? user : "");
	} else if (c->verify_peer) {
		ret = check_x509(s, identity, idlen, err, errlen);
		if (ret < 0)
			return ret;
	}
	/* Unlike QEMU, which skips the check without verify-peer, a client
	 * with no identity is never authorised. */
	if (authz && (!identity[0] || !tls_authz_check(authz, identity))) {
		snprintf(err, errlen, "TLS client '%s' is not authorised", identity);
		return -EACCES;
	}
	return 0;
}

const char *tls_session_record_layer(gnutls_session_t s)
{
	switch (gnutls_transport_is_ktls_enabled(s)) {
	case GNUTLS_KTLS_DUPLEX:
		return "kernel (kTLS)";
	case GNUTLS_KTLS_SEND:
		return "kernel (kTLS) for sending, GnuTLS for receiving";
	case GNUTLS_KTLS_RECV:
		return "kernel (kTLS) for receiving, GnuTLS for sending";
	default:
		return "GnuTLS";
	}
}
