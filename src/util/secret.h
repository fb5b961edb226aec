/* Secrets by id: what `--object secret,id=ID,data=...|file=...` holds (QEMU's
 * secret object), for drivers that need a password or key (rbd's
 * key-secret). The bytes are kept as given, after base64 decoding when the
 * object said format=base64.
 *
 * THREADING RULE: any thread; one lock protects the table. */
#ifndef IOPLANE_UTIL_SECRET_H
#define IOPLANE_UTIL_SECRET_H

#include <stdbool.h>
#include <stddef.h>

/* Add a secret: 0, -EEXIST (the id is taken), -ENOMEM. */
int secret_add(const char *id, const void *data, size_t len);
/* Remove it: 0 or -ENOENT. */
int secret_del(const char *id);
bool secret_exists(const char *id);
/* The secret as base64 text (as librados takes a key), NUL-terminated, in a
 * new buffer the caller frees: 0, -ENOENT or -ENOMEM. */
int secret_get_base64(const char *id, char **out);
/* Decode base64 text (RFC 4648, padding required): the byte count, or
 * -EINVAL. out holds at least len / 4 * 3 bytes. */
long secret_base64_decode(const char *in, size_t len, unsigned char *out);
/* Drop every secret (at exit). */
void secret_free_all(void);

#endif
