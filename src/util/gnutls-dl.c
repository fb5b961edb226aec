/* The GnuTLS table of gnutls-dl.h, filled at the first TLS object.
 *
 * THREADING RULE: see gnutls-dl.h. */
#define GNUTLS_DL_NO_REMAP
#include "util/gnutls-dl.h"
#include "util/dynlib.h"

struct gnutls_dl_fns gnutls_dl;

#define GNUTLS_DL_SYM(f) {#f, &gnutls_dl.f},
static const struct dynlib_sym gnutls_dl_syms[] = {
	GNUTLS_DL_FNS(GNUTLS_DL_SYM){"gnutls_free", &gnutls_dl.free_fn},
};
static const char *const gnutls_dl_sonames[] = {"libgnutls.so.30", NULL};
static struct dynlib gnutls_dl_lib = {
	.pkg = "libgnutls30",
	.sonames = gnutls_dl_sonames,
	.syms = gnutls_dl_syms,
	.nsyms = sizeof(gnutls_dl_syms) / sizeof(gnutls_dl_syms[0]),
};

int gnutls_dl_load(char *err, size_t errlen)
{
	return dynlib_load(&gnutls_dl_lib, "tls", err, errlen);
}
