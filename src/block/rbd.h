/* The rbd protocol driver's helper for `ioplane img create` on an rbd:
 * target. Threading: main thread (it blocks while it talks to the cluster). */
#ifndef IOPLANE_BLOCK_RBD_H
#define IOPLANE_BLOCK_RBD_H

#include <stddef.h>
#include <stdint.h>

/* Create the RBD image NAME ("rbd:pool/[namespace/]image[:key=value...]")
 * of size bytes with the cluster's default features, its first len bytes
 * head (a format's metadata; len 0: none): 0, or -errno and a message in err. */
int blk_rbd_create(const char *name, uint64_t size, const void *head, size_t len, char *err,
		   size_t errlen);

#endif
