/* libFuzzer target for the NBD server: one input is the byte stream of one client
 * connection, fed through the handshake and transmission phases (nbd_fuzz_one in
 * src/export/nbd-fuzz.c serves it with a read-only 64 MiB export "null" and a
 * writable 1 MiB export "rw"). Seeds: tests/fuzz/corpus-nbd/ (gen-nbd-corpus.py).
 * Threading: the caller's thread runs the server's loop. */
#include "export/nbd-server.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	nbd_fuzz_one(data, size);
	return 0;
}
