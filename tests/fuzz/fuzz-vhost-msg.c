/* libFuzzer target for the vhost-user back-end: one input is a front-end's
 * message stream, served by a 4-queue vhost-user-blk export on a null image
 * (vu_fuzz_one in src/export/vhost-user-fuzz.c attaches the fds each message
 * type carries). Seeds: tests/fuzz/corpus-vhost-msg/ (gen-vhost-corpus.py).
 * Threading: the caller's thread runs the export's loop. */
#include "export/vhost-user.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	vu_fuzz_one(data, size);
	return 0;
}
