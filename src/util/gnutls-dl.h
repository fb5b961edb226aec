/* GnuTLS, loaded when the first TLS object is made (dlopen): a daemon that
 * serves no TLS does not map libgnutls and the libraries it pulls in (about
 * 2.6 MiB of RSS). Include this instead of <gnutls/gnutls.h>: every GnuTLS
 * call below it goes through the table gnutls_dl_load() fills.
 *
 * THREADING RULE: gnutls_dl_load from the main thread (dynlib serialises it);
 * the table is read-only once it returned 0, and no call happens before. */
#ifndef IOPLANE_UTIL_GNUTLS_DL_H
#define IOPLANE_UTIL_GNUTLS_DL_H
#include <gnutls/gnutls.h>
#include <gnutls/socket.h>
#include <gnutls/x509.h>
#include <stddef.h>

/* clang-format off */
#define GNUTLS_DL_FNS(X) \
	X(gnutls_alert_send) X(gnutls_bye) X(gnutls_certificate_allocate_credentials) X(gnutls_certificate_free_credentials) \
	X(gnutls_certificate_get_peers) X(gnutls_certificate_server_set_request) X(gnutls_certificate_set_dh_params) \
	X(gnutls_certificate_set_known_dh_params) X(gnutls_certificate_set_x509_crl_file) X(gnutls_certificate_set_x509_key_file) \
	X(gnutls_certificate_set_x509_trust_file) X(gnutls_certificate_verification_status_print) X(gnutls_certificate_verify_peers2) \
	X(gnutls_credentials_set) X(gnutls_deinit) X(gnutls_dh_params_deinit) \
	X(gnutls_dh_params_import_pkcs3) X(gnutls_dh_params_init) X(gnutls_error_is_fatal) \
	X(gnutls_handshake) X(gnutls_handshake_set_timeout) X(gnutls_init) \
	X(gnutls_load_file) X(gnutls_priority_set_direct) X(gnutls_psk_allocate_server_credentials) \
	X(gnutls_psk_free_server_credentials) X(gnutls_psk_server_get_username) X(gnutls_psk_set_server_credentials_file) \
	X(gnutls_psk_set_server_known_dh_params) X(gnutls_record_check_pending) X(gnutls_record_get_direction) \
	X(gnutls_record_recv) X(gnutls_record_send) X(gnutls_session_get_desc) \
	X(gnutls_set_default_priority) X(gnutls_set_default_priority_append) X(gnutls_strerror) \
	X(gnutls_transport_is_ktls_enabled) X(gnutls_transport_set_errno) X(gnutls_transport_set_int2) \
	X(gnutls_transport_set_ptr) X(gnutls_transport_set_pull_function) X(gnutls_transport_set_push_function) \
	X(gnutls_x509_crt_deinit) X(gnutls_x509_crt_get_activation_time) X(gnutls_x509_crt_get_dn) \
	X(gnutls_x509_crt_get_expiration_time) X(gnutls_x509_crt_import) X(gnutls_x509_crt_init)
/* clang-format on */

#define GNUTLS_DL_PTR(f) __typeof__(f) *f;
struct gnutls_dl_fns {
	GNUTLS_DL_FNS(GNUTLS_DL_PTR)
	gnutls_free_function *free_fn; /* the library's gnutls_free variable */
};
extern struct gnutls_dl_fns gnutls_dl;

/* Load libgnutls and fill the table: 0, or -ENOENT and "tls support needs
 * libgnutls30 (dlopen: ...)" in err. */
int gnutls_dl_load(char *err, size_t errlen);

/* Every call below goes through the table (gnutls-dl.c itself names the
 * table's members, so it asks for no remapping). */
#ifndef GNUTLS_DL_NO_REMAP
/* clang-format off */
#define gnutls_alert_send (*gnutls_dl.gnutls_alert_send)
#define gnutls_bye (*gnutls_dl.gnutls_bye)
#define gnutls_certificate_allocate_credentials (*gnutls_dl.gnutls_certificate_allocate_credentials)
#define gnutls_certificate_free_credentials (*gnutls_dl.gnutls_certificate_free_credentials)
#define gnutls_certificate_get_peers (*gnutls_dl.gnutls_certificate_get_peers)
#define gnutls_certificate_server_set_request (*gnutls_dl.gnutls_certificate_server_set_request)
#define gnutls_certificate_set_dh_params (*gnutls_dl.gnutls_certificate_set_dh_params)
#define gnutls_certificate_set_known_dh_params (*gnutls_dl.gnutls_certificate_set_known_dh_params)
#define gnutls_certificate_set_x509_crl_file (*gnutls_dl.gnutls_certificate_set_x509_crl_file)
#define gnutls_certificate_set_x509_key_file (*gnutls_dl.gnutls_certificate_set_x509_key_file)
#define gnutls_certificate_set_x509_trust_file (*gnutls_dl.gnutls_certificate_set_x509_trust_file)
#define gnutls_certificate_verification_status_print (*gnutls_dl.gnutls_certificate_verification_status_print)
#define gnutls_certificate_verify_peers2 (*gnutls_dl.gnutls_certificate_verify_peers2)
#define gnutls_credentials_set (*gnutls_dl.gnutls_credentials_set)
#define gnutls_deinit (*gnutls_dl.gnutls_deinit)
#define gnutls_dh_params_deinit (*gnutls_dl.gnutls_dh_params_deinit)
#define gnutls_dh_params_import_pkcs3 (*gnutls_dl.gnutls_dh_params_import_pkcs3)
#define gnutls_dh_params_init (*gnutls_dl.gnutls_dh_params_init)
#define gnutls_error_is_fatal (*gnutls_dl.gnutls_error_is_fatal)
#define gnutls_handshake (*gnutls_dl.gnutls_handshake)
#define gnutls_handshake_set_timeout (*gnutls_dl.gnutls_handshake_set_timeout)
#define gnutls_init (*gnutls_dl.gnutls_init)
#define gnutls_load_file (*gnutls_dl.gnutls_load_file)
#define gnutls_priority_set_direct (*gnutls_dl.gnutls_priority_set_direct)
#define gnutls_psk_allocate_server_credentials (*gnutls_dl.gnutls_psk_allocate_server_credentials)
#define gnutls_psk_free_server_credentials (*gnutls_dl.gnutls_psk_free_server_credentials)
#define gnutls_psk_server_get_username (*gnutls_dl.gnutls_psk_server_get_username)
#define gnutls_psk_set_server_credentials_file (*gnutls_dl.gnutls_psk_set_server_credentials_file)
#define gnutls_psk_set_server_known_dh_params (*gnutls_dl.gnutls_psk_set_server_known_dh_params)
#define gnutls_record_check_pending (*gnutls_dl.gnutls_record_check_pending)
#define gnutls_record_get_direction (*gnutls_dl.gnutls_record_get_direction)
#define gnutls_record_recv (*gnutls_dl.gnutls_record_recv)
#define gnutls_record_send (*gnutls_dl.gnutls_record_send)
#define gnutls_session_get_desc (*gnutls_dl.gnutls_session_get_desc)
#define gnutls_set_default_priority (*gnutls_dl.gnutls_set_default_priority)
#define gnutls_set_default_priority_append (*gnutls_dl.gnutls_set_default_priority_append)
#define gnutls_strerror (*gnutls_dl.gnutls_strerror)
#define gnutls_transport_is_ktls_enabled (*gnutls_dl.gnutls_transport_is_ktls_enabled)
#define gnutls_transport_set_errno (*gnutls_dl.gnutls_transport_set_errno)
#define gnutls_transport_set_int2 (*gnutls_dl.gnutls_transport_set_int2)
#define gnutls_transport_set_ptr (*gnutls_dl.gnutls_transport_set_ptr)
#define gnutls_transport_set_pull_function (*gnutls_dl.gnutls_transport_set_pull_function)
#define gnutls_transport_set_push_function (*gnutls_dl.gnutls_transport_set_push_function)
#define gnutls_x509_crt_deinit (*gnutls_dl.gnutls_x509_crt_deinit)
#define gnutls_x509_crt_get_activation_time (*gnutls_dl.gnutls_x509_crt_get_activation_time)
#define gnutls_x509_crt_get_dn (*gnutls_dl.gnutls_x509_crt_get_dn)
#define gnutls_x509_crt_get_expiration_time (*gnutls_dl.gnutls_x509_crt_get_expiration_time)
#define gnutls_x509_crt_import (*gnutls_dl.gnutls_x509_crt_import)
#define gnutls_x509_crt_init (*gnutls_dl.gnutls_x509_crt_init)
/* clang-format on */
#undef gnutls_free
#define gnutls_free(a) ((*gnutls_dl.free_fn)((void *)(a)), (a) = NULL)
#endif

#endif
