/* Fuzz target interface shared by the libFuzzer binaries (fuzz-*) and the corpus
 * replayers (replay-*): each fuzz-NAME.c defines LLVMFuzzerTestOneInput.
 * Threading: the caller's thread only; targets keep no per-input state between calls
 * except what they document. */
#ifndef IOPLANE_FUZZ_H
#define IOPLANE_FUZZ_H

#include <stddef.h>
#include <stdint.h>

/* Runs one input; always returns 0 (libFuzzer reserves other values). */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifdef FUZZ_NULL_IMAGE
#include "block/block.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/opts.h"

/* A loop bound to this thread and a 64 KiB null image reading zeroes, for
 * targets that run requests (made once, kept). 0 or -errno. */
static inline int fuzz_null_image(struct loop **loop, struct blk_node **bs)
{
	struct loop_opts lo = {.poll_max_ns = 0};
	struct kv_opts o = {0};
	char err[128];
	int ret;

	log_set_level(LOG_ERR);
	ret = loop_new(&lo, loop);
	if (ret < 0)
		return ret;
	loop_bind_current(*loop);
	ret = kv_parse(&o, "driver=null,size=64K,read-zeroes=on", NULL);
	if (!ret)
		ret = blk_open(&o, bs, err, sizeof(err));
	kv_free(&o);
	return ret;
}
#endif

#endif
