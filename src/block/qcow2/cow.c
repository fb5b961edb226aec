/* qcow2 copy-on-write of the untouched parts of newly allocated clusters,
 * and the zeroing strategy.
 *
 * When a write allocates a cluster (or subclusters), the parts it does not
 * cover must read as before: from the old cluster, the backing file, or
 * zeroes. Data from elsewhere is read and written together with the guest
 * data in one vectored write. Zeroes are where the strategy matters:
 *
 *   case                                   what we do
 *   host range known zero ("fresh")        nothing: write the guest data only
 *   ext4 (auto), cow-zeroing=write-zeroes  write-zeroes of the range
 *                                          (FALLOC_FL_ZERO_RANGE: unwritten
 *                                          extents, no data moved), then data
 *   XFS, others, cow-zeroing=buffers       one write: zero buffers + data
 *   ext4 where ZERO_RANGE fails            buffers (the file driver latches
 *                                          EOPNOTSUPP)
 *
 * Why: on ext4 ZERO_RANGE costs a metadata update, far less than writing
 * 60 KiB of zeroes per 4 KiB write. On XFS fallocate() waits for all direct
 * I/O in flight on the file (an I/O barrier): with 64 requests in flight a
 * reported 4 KiB first-write workload lost up to 88% of its throughput, so
 * zero buffers, which run in parallel, win there. The file system is taken
 * from statfs() at open; cow-zeroing= overrides it.
 *
 * auto does not time anything at open, by choice:
 * - What sinks write-zeroes on XFS is not its own cost but that it drains
 *   the direct I/O in flight: a probe would need many requests in flight
 *   (tens of ms of writes into the image at every open), and a few ms of
 *   timing on a shared host cannot tell two strategies apart whose cost
 *   at depth 1 differs by less than the noise.
 * - Zeroing happens only when a write allocates host space that is not
 *   fresh (reused after discards, or below the file size at open); images
 *   that grow never zero. Buffers, the choice for unknown file systems and
 *   block devices (statfs says devtmpfs), cost bandwidth in proportion to
 *   the zeroed range and run in parallel: never the XFS collapse.
 * - Where ZERO_RANGE is missing (ext2/3 files without extents carry ext4's
 *   magic; tmpfs, ZFS, ...) the file driver learns it from the first
 *   EOPNOTSUPP and fails later calls without a system call; qc_cow_wz then
 *   writes buffers. A wrong guess costs one failed fallocate().
 * So the evidence used is the file system type plus that answer.
 *
 * Best of all is not to zero: every cluster allocated past the file size seen
 * at open, and never used since, reads as zero, so the common case - an image
 * filling up - writes only guest data. The file is grown ahead of allocation
 * (ftruncate in steps of 1/8 of its size, 1 MiB .. 256 MiB; on ext4 and XFS
 * the new space is also allocated as unwritten extents with one ZERO_RANGE per
 * step), so data writes never extend the file: no zeroing past EOF ever
 * happens (the case where it would have to be serialised against overlapping
 * writes cannot arise), and no write lands past EOF, which XFS serialises to
 * zero the gap and ext4 completes synchronously. Writes into a cluster being
 * allocated join the allocation (rw.c) instead of waiting for it. On XFS
 * images get a 1 MiB extent size hint at create.
 *
 * Measured with bench/compare-qcow2.sh (a 2-CPU virtual machine with a
 * virtio disk, ext4 mounted with discard, XFS on a loop device; 8 GiB image,
 * first 4 KiB write into every 64 KiB step, 75,000 requests, depth 64,
 * O_DIRECT; ioplane's default engine io_uring, qemu-img 7.2 bench -n; median
 * of 5; raw: the faster tool writing a raw file the same way):
 *   ext4, 64 KiB clusters:  qemu-img 7.27 s   ioplane 0.66 s
 *   ext4, 2 MiB clusters:   qemu-img 0.79 s   ioplane 0.60 s (raw: 0.56 s)
 *   XFS (loop), 64 KiB:     qemu-img 11.2 s   ioplane 1.12 s
 *   XFS (loop), 2 MiB:      qemu-img 1.31 s   ioplane 0.96 s (raw: 1.03 s)
 *
 * Threading: runs in the request's coroutine without locks (the clusters
 * belong to the allocating request until it links them). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>

#include "block/qcow2/qcow2-int.h"
#include "util/iov.h"
#include "util/trace.h"

#define QC_XFS_MAGIC 0x58465342
#define QC_EXT4_MAGIC 0xEF53
#define QC_TMPFS_MAGIC 0x01021994
#define QC_BTRFS_MAGIC 0x9123683E

static enum qc_cow_mode qc_cow_auto(struct qc_state *s)
{
	struct statfs st;

	snprintf(s->fs_name, sizeof(s->fs_name), "unknown");
	if (!s->image_path || statfs(s->image_path, &st) != 0)
		return QC_COW_BUFFERS;
	switch ((unsigned long)st.f_type) {
	case QC_XFS_MAGIC:
		snprintf(s->fs_name, sizeof(s->fs_name), "xfs");
		s->grow_alloc = true;
		return QC_COW_BUFFERS;
	case QC_EXT4_MAGIC:
		snprintf(s->fs_name, sizeof(s->fs_name), "ext4");
		s->grow_alloc = true;
		return QC_COW_WRITE_ZEROES;
	case QC_TMPFS_MAGIC:
		snprintf(s->fs_name, sizeof(s->fs_name), "tmpfs");
		return QC_COW_BUFFERS;
	case QC_BTRFS_MAGIC:
		snprintf(s->fs_name, sizeof(s->fs_name), "btrfs");
		return QC_COW_BUFFERS;
	default:
		return QC_COW_BUFFERS;
	}
}

int qc_cow_open(struct qc_state *s, const char *mode, char *err, size_t errlen)
{
	void *z;

	if (!mode || !strcmp(mode, "auto")) {
		s->cow_mode = qc_cow_auto(s);
	} else if (!strcmp(mode, "write-zeroes")) {
		s->cow_mode = QC_COW_WRITE_ZEROES;
	} else if (!strcmp(mode, "buffers")) {
		s->cow_mode = QC_COW_BUFFERS;
	} else {
		snprintf(err, errlen,
			 "qcow2: cow-zeroing must be auto, write-zeroes or buffers, "
			 "not '%s'",
			 mode);
		return -EINVAL;
	}
	if (s->cow_mode == QC_COW_WRITE_ZEROES && !s->data->has_write_zeroes)
		s->cow_mode = QC_COW_BUFFERS;
	/* Anonymous memory never written: every page is the shared zero page. */
	z = mmap(NULL, s->cluster_size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (z == MAP_FAILED)
		return -ENOMEM;
	s->zero_buf = z;
	return 0;
}

/* Does guest range [goff, goff+len) of one cluster read as zero under its
 * old entry? */
static bool qc_reads_zero(struct qc_state *s, uint64_t e, uint64_t bm, uint64_t goff, uint64_t len)
{
	uint64_t coff = qc_coff(s, goff), n;

	while (len) {
		n = len;
		switch (qc_classify(s, e, bm, coff, &n)) {
		case QC_ZERO:
			break;
		case QC_UNALLOC:
			if (s->backing && goff < s->backing_size)
				return false;
			break;
		default:
			return false;
		}
		coff += n;
		goff += n;
		len -= n;
	}
	return true;
}

/* Old content of [goff, goff+len) (within one cluster) into buf. */
static int qc_cow_read(struct qc_state *s, uint64_t e, uint64_t bm, uint64_t goff, uint64_t len,
		       uint8_t *buf)
{
	struct iovec v = {buf, len};

	return qc_read_entry(s, goff >> s->cluster_bits, e, bm, qc_coff(s, goff), len, &v, 1, 0);
}

struct qc_cow_part {
	uint64_t len;
	bool zero;
	uint8_t *buf; /* old content when not zero */
};

static int qc_cow_prepare(struct qc_state *s, uint64_t e, uint64_t bm, uint64_t goff,
			  struct qc_cow_part *p)
{
	p->buf = NULL;
	p->zero = p->len == 0 || qc_reads_zero(s, e, bm, goff, p->len);
	if (p->zero)
		return 0;
	p->buf = qc_alloc_buf(p->len);
	if (!p->buf)
		return -ENOMEM;
	return qc_cow_read(s, e, bm, goff, p->len, p->buf);
}

static int qc_cow_writev(struct qc_state *s, const struct qc_cow *c, const struct qc_cow_part *h,
			 const struct qc_cow_part *t, bool zero_parts, const struct iovec *iov,
			 int iovcnt, size_t iov_off, uint64_t len)
{
	struct iovec small[18], *v = small;
	uint64_t off = c->host, total = 0;
	int n = 0, k, cap = iovcnt + 2, ret;

	if (cap > 18) {
		v = malloc((size_t)cap * sizeof(*v));
		if (!v)
			return -ENOMEM;
	}
	if (h->len && (zero_parts || !h->zero)) {
		v[n++] = (struct iovec){h->zero ? s->zero_buf : h->buf, h->len};
		total += h->len;
	} else {
		off += h->len;
	}
	k = iov_slice(v + n, cap - n, iov, iovcnt, iov_off, len);
	if (k < 0) {
		ret = -EINVAL;
		goto out;
	}
	n += k;
	total += len;
	if (t->len && (zero_parts || !t->zero)) {
		v[n++] = (struct iovec){t->zero ? s->zero_buf : t->buf, t->len};
		total += t->len;
	}
	{
		struct qc_batch b;
		struct qc_child ch;

		qc_batch_init(&b);
		qc_batch_add(&b, &ch, s->data, BLK_OP_WRITE, off, v, n, total, 0);
		ret = qc_batch_wait(&b);
	}
out:
	if (v != small)
		free(v);
	return ret;
}

/* Zero the parts that need it with write-zeroes; false if buffers must do. */
static bool qc_cow_wz(struct qc_state *s, const struct qc_cow *c, const struct qc_cow_part *h,
		      const struct qc_cow_part *t)
{
	if (c->fresh || (!h->len && !t->len))
		return true;
	if (s->cow_mode != QC_COW_WRITE_ZEROES || !h->zero || !t->zero)
		return false;
	return qc_co_op(s->data, BLK_OP_WRITE_ZEROES, c->host, c->gend - c->gstart,
			BLK_F_NO_FALLBACK) == 0;
}

bool qc_cow_data_only(struct qc_state *s, const struct qc_cow *c, uint64_t off, uint64_t len)
{
	return c->fresh &&
	       qc_reads_zero(s, c->head_entry, c->head_bitmap, c->gstart, off - c->gstart) &&
	       qc_reads_zero(s, c->tail_entry, c->tail_bitmap, off + len, c->gend - off - len);
}

int qc_cow_write(struct qc_state *s, const struct qc_cow *c, uint64_t off, uint64_t len,
		 const struct iovec *iov, int iovcnt, size_t iov_off)
{
	struct qc_cow_part h = {.len = off - c->gstart}, t = {.len = c->gend - off - len};
	bool zeroed;
	int ret;

	IOPLANE_TRACE(qcow2_cow_begin, s, c->gstart, c->gend, off, len);
	ret = qc_cow_prepare(s, c->head_entry, c->head_bitmap, c->gstart, &h);
	if (!ret)
		ret = qc_cow_prepare(s, c->tail_entry, c->tail_bitmap, off + len, &t);
	if (ret)
		goto out;
	zeroed = h.zero && t.zero && qc_cow_wz(s, c, &h, &t);
	ret = qc_cow_writev(s, c, &h, &t, !zeroed, iov, iovcnt, iov_off, len);
out:
	IOPLANE_TRACE(qcow2_cow_end, s, c->gstart, ret);
	free(h.buf);
	free(t.buf);
	return ret;
}
