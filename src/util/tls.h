/* TLS credentials (x509, PSK) and authorisation objects (authz-simple,
 * authz-list), named by id as qemu-storage-daemon names them, and GnuTLS
 * server sessions made from them.
 *
 * Threading: objects are added and deleted by the main thread; any thread
 * looks one up by id (under the registry's lock) and gets a reference that
 * keeps it alive after a delete. A session belongs to its caller's thread. */
#ifndef IOPLANE_UTIL_TLS_H
#define IOPLANE_UTIL_TLS_H

#include "util/gnutls-dl.h"
#include <stdbool.h>
#include <stddef.h>

struct tls_creds;
struct tls_authz;

struct tls_creds_config {
	const char *id, *dir;
	bool psk;         /* tls-creds-psk, else tls-creds-x509 */
	bool server;      /* endpoint=server */
	bool verify_peer; /* x509: ask for and check the client's certificate */
	bool sanity_check;
	const char *priority; /* NULL: GnuTLS's system default */
	const char *username; /* PSK client endpoint only */
};

/* Load the files of DIR (x509: ca-cert.pem, server-cert.pem, server-key.pem,
 * optional ca-crl.pem and dh-params.pem; PSK: keys.psk) and register the
 * object. Main thread. 0 or -errno with a message in err. */
int tls_creds_add(const struct tls_creds_config *cfg, char *err, size_t errlen);

/* authz-list rules. */
struct tls_authz_rule {
	const char *match;
	bool allow;
	bool glob; /* fnmatch() pattern, else an exact match */
};

int tls_authz_add_simple(const char *id, const char *identity, char *err, size_t errlen);
int tls_authz_add_list(const char *id, bool allow_default, const struct tls_authz_rule *rules,
		       size_t nrules, char *err, size_t errlen);

/* Any object of this module with that id. */
bool tls_object_exists(const char *id);
/* Delete it (main thread); users keep their references. -ENOENT: none. */
int tls_object_del(const char *id);
/* Every object, at the daemon's end. */
void tls_objects_free(void);

/* A reference to the object (any thread), NULL if there is none; give it back. */
struct tls_creds *tls_creds_get(const char *id);
void tls_creds_put(struct tls_creds *c);
bool tls_creds_is_server(const struct tls_creds *c);
struct tls_authz *tls_authz_get(const char *id);
void tls_authz_put(struct tls_authz *a);
/* Is identity (an x509 distinguished name or a PSK username) allowed? */
bool tls_authz_check(const struct tls_authz *a, const char *identity);

/* A non-blocking server session on fd. 0 or -errno (err: why). */
int tls_session_new(struct tls_creds *c, int fd, gnutls_session_t *out, char *err, size_t errlen);
/* After the handshake: check the client's certificate (x509 with
 * verify-peer) and authorise its identity (authz may be NULL). identity gets
 * the DN or PSK username ("" if none). 0, or -EACCES with err. */
int tls_session_check(gnutls_session_t s, const struct tls_creds *c, const struct tls_authz *authz,
		      char *identity, size_t idlen, char *err, size_t errlen);
/* Where the session's record layer runs: "kernel (kTLS)", "kernel (kTLS
 * send only)"... or "GnuTLS". */
const char *tls_session_record_layer(gnutls_session_t s);

#endif
