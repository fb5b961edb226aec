/* TLS objects of `ioplane serve` for --object and QMP object-add/object-del:
 * tls-creds-x509, tls-creds-psk, authz-simple, authz-list (util/tls.h holds
 * them). qmp-object.c calls in here for these qom-types.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_TLS_H
#define IOPLANE_CONTROL_QMP_TLS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct qapi_type;

/* The ObjectOptions branches, by qom-type. */
extern const struct qapi_type qmp_tls_creds_x509_props, qmp_tls_creds_psk_props,
	qmp_authz_simple_props, qmp_authz_list_props;

/* Is qom-type one of ours? */
bool qmp_tls_handles(const char *qom_type);
/* Add the object validated args describe; 0 or -errno with qsd's message. */
int qmp_tls_object_add(const json_t *args, char *err, size_t errlen);

#endif
