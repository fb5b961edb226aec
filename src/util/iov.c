/* iovec helpers: size, copies to and from flat buffers at an offset, slicing,
 * alignment and zero checks. Zero-length entries are allowed anywhere and a
 * negative count is treated as empty. Threading: pure functions. */
#include <string.h>

#include "util/iov.h"

size_t iov_size(const struct iovec *iov, int cnt)
{
	size_t sum = 0;
	int i;

	for (i = 0; i < cnt; i++)
		sum += iov[i].iov_len;
	return sum;
}

/* Find the entry holding byte `*off`, rewriting *off to the offset inside it.
 * Returns cnt when off is at or past the end. */
static int iov_seek(const struct iovec *iov, int cnt, size_t *off)
{
	int i;

	for (i = 0; i < cnt; i++) {
		if (*off < iov[i].iov_len)
			break;
		*off -= iov[i].iov_len;
	}
	return i;
}

size_t iov_to_buf(const struct iovec *iov, int cnt, size_t off, void *buf, size_t len)
{
	size_t done = 0, n;
	int i;

	for (i = iov_seek(iov, cnt, &off); i < cnt && done < len; i++, off = 0) {
		n = iov[i].iov_len - off;
		if (n > len - done)
			n = len - done;
		if (n == 0)
			continue; /* empty entry: its base may be NULL */
		memcpy((char *)buf + done, (char *)iov[i].iov_base + off, n);
		done += n;
	}
	return done;
}

size_t iov_from_buf(const struct iovec *iov, int cnt, size_t off, const void *buf, size_t len)
{
	size_t done = 0, n;
	int i;

	for (i = iov_seek(iov, cnt, &off); i < cnt && done < len; i++, off = 0) {
		n = iov[i].iov_len - off;
		if (n > len - done)
			n = len - done;
		if (n == 0)
			continue; /* empty entry: its base may be NULL */
		memcpy((char *)iov[i].iov_base + off, (const char *)buf + done, n);
		done += n;
	}
	return done;
}

size_t iov_memset(const struct iovec *iov, int cnt, size_t off, int c, size_t len)
{
	size_t done = 0, n;
	int i;

	for (i = iov_seek(iov, cnt, &off); i < cnt && done < len; i++, off = 0) {
		n = iov[i].iov_len - off;
		if (n > len - done)
			n = len - done;
		if (n == 0)
			continue; /* empty entry: its base may be NULL */
		memset((char *)iov[i].iov_base + off, c, n);
		done += n;
	}
	return done;
}

/* Also -1 when [off, off+len) reaches past the end of src: a short slice would
 * silently turn into a short I/O. Zero-length source entries are skipped. */
int iov_slice(struct iovec *dst, int dst_cap, const struct iovec *src, int cnt, size_t off,
	      size_t len)
{
	int i, n = 0;
	size_t take;

	for (i = iov_seek(src, cnt, &off); i < cnt && len > 0; i++, off = 0) {
		if (src[i].iov_len == 0)
			continue;
		if (n >= dst_cap)
			return -1;
		take = src[i].iov_len - off;
		if (take > len)
			take = len;
		dst[n].iov_base = (char *)src[i].iov_base + off;
		dst[n].iov_len = take;
		n++;
		len -= take;
	}
	return len > 0 ? -1 : n;
}

/* align 0 or 1 accepts everything. */
int iov_is_aligned(const struct iovec *iov, int cnt, size_t align)
{
	int i;

	if (align <= 1)
		return 1;
	for (i = 0; i < cnt; i++) {
		if ((uintptr_t)iov[i].iov_base % align || iov[i].iov_len % align)
			return 0;
	}
	return 1;
}

#define IOV_ZERO_HEAD 16

/* Once the first 16 bytes are known zero, comparing the buffer with itself
 * shifted by 16 proves the rest zero by induction, at libc memcmp speed. */
static int iov_buf_is_zero(const unsigned char *p, size_t len)
{
	size_t i, head = len < IOV_ZERO_HEAD ? len : IOV_ZERO_HEAD;

	for (i = 0; i < head; i++) {
		if (p[i])
			return 0;
	}
	if (len <= IOV_ZERO_HEAD)
		return 1;
	return memcmp(p, p + IOV_ZERO_HEAD, len - IOV_ZERO_HEAD) == 0;
}

int iov_is_zero(const struct iovec *iov, int cnt)
{
	int i;

	for (i = 0; i < cnt; i++) {
		if (!iov_buf_is_zero(iov[i].iov_base, iov[i].iov_len))
			return 0;
	}
	return 1;
}
