/* iovec helpers. Threading: pure functions. */
#ifndef IOPLANE_IOV_H
#define IOPLANE_IOV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

size_t iov_size(const struct iovec *iov, int cnt);
/* Copy between a flat buffer and an iovec starting at byte `off` of the iovec. */
size_t iov_to_buf(const struct iovec *iov, int cnt, size_t off, void *buf, size_t len);
size_t iov_from_buf(const struct iovec *iov, int cnt, size_t off, const void *buf, size_t len);
size_t iov_memset(const struct iovec *iov, int cnt, size_t off, int c, size_t len);
/* Build in dst (capacity dst_cap) the slice [off, off+len) of src; returns the
 * number of entries or -1 if dst is too small. */
int iov_slice(struct iovec *dst, int dst_cap, const struct iovec *src, int cnt, size_t off,
	      size_t len);
/* True if every base and length is a multiple of align. */
bool iov_is_aligned(const struct iovec *iov, int cnt, size_t align);
/* True if the whole iovec reads as zero bytes. */
bool iov_is_zero(const struct iovec *iov, int cnt);

#endif
