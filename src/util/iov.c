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

enum iov_dir { IOV_TO_BUF, IOV_FROM_BUF, IOV_FILL };

/* The one walk behind the copies: len bytes from byte `off` of the iovec,
 * each piece copied to buf, from buf, or filled with c. */
static size_t iov_walk(const struct iovec *iov, int cnt, size_t off, void *buf, int c, size_t len,
		       enum iov_dir dir)
{
	size_t done = 0, n;
	int i;

	for (i = iov_seek(iov, cnt, &off); i < cnt && done < len; i++, off = 0) {
		char *p = (char *)iov[i].iov_base + off;

		n = iov[i].iov_len - off;
		if (n > len - done)
			n = len - done;
		if (n == 0)
			continue; /* empty entry: its base may be NULL */
		if (dir == IOV_TO_BUF)
			memcpy((char *)buf + done, p, n);
		else if (dir == IOV_FROM_BUF)
			memcpy(p, (const char *)buf + done, n);
		else
			memset(p, c, n);
		done += n;
	}
	return done;
}

size_t iov_to_buf(const struct iovec *iov, int cnt, size_t off, void *buf, size_t len)
{
	return iov_walk(iov, cnt, off, buf, 0, len, IOV_TO_BUF);
}

size_t iov_from_buf(const struct iovec *iov, int cnt, size_t off, const void *buf, size_t len)
{
	return iov_walk(iov, cnt, off, (void *)buf, 0, len, IOV_FROM_BUF);
}

size_t iov_memset(const struct iovec *iov, int cnt, size_t off, int c, size_t len)
{
	return iov_walk(iov, cnt, off, NULL, c, len, IOV_FILL);
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
bool iov_is_aligned(const struct iovec *iov, int cnt, size_t align)
{
	int i;

	if (align <= 1)
		return true;
	for (i = 0; i < cnt; i++) {
		if ((uintptr_t)iov[i].iov_base % align || iov[i].iov_len % align)
			return false;
	}
	return true;
}

#define IOV_ZERO_HEAD 16

/* Once the first 16 bytes are known zero, comparing the buffer with itself
 * shifted by 16 proves the rest zero by induction, at libc memcmp speed. */
static bool iov_buf_is_zero(const unsigned char *p, size_t len)
{
	size_t i, head = len < IOV_ZERO_HEAD ? len : IOV_ZERO_HEAD;

	for (i = 0; i < head; i++) {
		if (p[i])
			return false;
	}
	if (len <= IOV_ZERO_HEAD)
		return true;
	return memcmp(p, p + IOV_ZERO_HEAD, len - IOV_ZERO_HEAD) == 0;
}

bool iov_is_zero(const struct iovec *iov, int cnt)
{
	int i;

	for (i = 0; i < cnt; i++) {
		if (!iov_buf_is_zero(iov[i].iov_base, iov[i].iov_len))
			return false;
	}
	return true;
}
