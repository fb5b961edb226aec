/* libFuzzer target for the NBD server in TLS-only mode: one input is one client's byte
 * stream against a server with tls-creds whose credentials are missing, so every option
 * before STARTTLS, STARTTLS itself (refused: NBD_REP_ERR_POLICY) and what follows are
 * fuzzed; the TLS handshake is not (nbd_fuzz_tls_one in src/export/nbd-fuzz.c). Seeds:
 * tests/fuzz/corpus-nbd-tls/. Threading: the caller's thread runs the server's loop. */
#include "export/nbd-server.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	nbd_fuzz_tls_one(data, size);
	return 0;
}
