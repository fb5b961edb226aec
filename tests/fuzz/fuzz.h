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

#endif
