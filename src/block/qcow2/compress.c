/* qcow2 compressed clusters: zlib (raw deflate, 4 KiB window) and zstd
 * (one frame). Decompression stops once a whole cluster has been produced:
 * the stored data is rounded up to sectors and may be followed by junk.
 *
 * Threading: pure functions (the library streams live on the stack/heap of
 * the call). */
#include <errno.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

#include "block/qcow2/qcow2-int.h"

#define QC_ZLIB_WBITS (-12)

static int qc_inflate(const void *src, size_t srclen, void *dst, size_t dstlen)
{
	z_stream z;
	int ret;

	memset(&z, 0, sizeof(z));
	if (inflateInit2(&z, QC_ZLIB_WBITS) != Z_OK)
		return -ENOMEM;
	z.next_in = (Bytef *)src;
	z.avail_in = (uInt)srclen;
	z.next_out = dst;
	z.avail_out = (uInt)dstlen;
	ret = inflate(&z, Z_FINISH);
	inflateEnd(&z);
	if ((ret == Z_STREAM_END || ret == Z_BUF_ERROR) && z.avail_out == 0)
		return 0;
	return -EIO;
}

static int qc_zstd_decompress(const void *src, size_t srclen, void *dst, size_t dstlen)
{
	ZSTD_inBuffer in = {src, srclen, 0};
	ZSTD_outBuffer out = {dst, dstlen, 0};
	ZSTD_DCtx *d = ZSTD_createDCtx();
	size_t r = 1;

	if (!d)
		return -ENOMEM;
	while (out.pos < out.size && in.pos < in.size) {
		r = ZSTD_decompressStream(d, &out, &in);
		if (ZSTD_isError(r) || (r == 0 && out.pos < out.size))
			break;
	}
	ZSTD_freeDCtx(d);
	return out.pos == out.size && !ZSTD_isError(r) ? 0 : -EIO;
}

int qc_decompress(int type, const void *src, size_t srclen, void *dst, size_t dstlen)
{
	if (type == QCOW2_COMPRESSION_ZSTD)
		return qc_zstd_decompress(src, srclen, dst, dstlen);
	return qc_inflate(src, srclen, dst, dstlen);
}

static long qc_deflate(const void *src, size_t srclen, void *dst, size_t dstlen)
{
	z_stream z;
	long n;
	int ret;

	memset(&z, 0, sizeof(z));
	if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, QC_ZLIB_WBITS, 9,
			 Z_DEFAULT_STRATEGY) != Z_OK)
		return -ENOMEM;
	z.next_in = (Bytef *)src;
	z.avail_in = (uInt)srclen;
	z.next_out = dst;
	z.avail_out = (uInt)dstlen;
	ret = deflate(&z, Z_FINISH);
	n = ret == Z_STREAM_END ? (long)(dstlen - z.avail_out) : 0;
	deflateEnd(&z);
	return n;
}

long qc_compress(int type, const void *src, size_t srclen, void *dst, size_t dstlen)
{
	size_t r;

	if (type != QCOW2_COMPRESSION_ZSTD)
		return qc_deflate(src, srclen, dst, dstlen);
	r = ZSTD_compress(dst, dstlen, src, srclen, 1);
	return ZSTD_isError(r) ? 0 : (long)r;
}
