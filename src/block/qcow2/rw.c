/* qcow2 request paths that may wait, run in a coroutine per request: reads
 * of clusters whose L2 slice is not cached or that need the backing file or
 * decompression, allocating writes (with COW), write-zeroes, discard,
 * block-status and compressed writes.
 *
 * An allocating write: under meta, look up the entry, register the guest
 * clusters as being allocated (others touching them wait), allocate host
 * clusters (refcounts in the cache); without locks, write the data together
 * with the COW of the untouched parts; under meta again, link the L2 entries
 * and drop the old entries' references (deferred, see refcount.c).
 *
 * Threading: see qcow2-int.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"
#include "util/iov.h"

#define QC_MAX_RUN 512 /* clusters allocated at once by one write */

/* ---- reads ---- */

static int qc_read_compressed(struct qc_state *s, uint64_t e, uint64_t coff, uint64_t len,
			      const struct iovec *iov, int iovcnt, size_t iov_off)
{
	uint64_t off, clen;
	uint8_t *in, *out;
	int ret;

	qc_comp_desc(s, e, &off, &clen);
	in = malloc(clen);
	out = malloc(s->cluster_size);
	ret = in && out ? 0 : -ENOMEM;
	if (!ret)
		ret = qc_co_pread_clamped(s->file, off, in, clen);
	if (!ret)
		ret = qc_decompress(s->comp_type, in, clen, out, s->cluster_size);
	if (!ret)
		iov_from_buf(iov, iovcnt, iov_off, out + coff, len);
	free(in);
	free(out);
	return ret;
}

/* A data cluster the file ends inside of reads as zeroes past the end, as
 * in every qcow2 reader (the entry check keeps the cluster's start inside). */
static int qc_read_data(struct qc_state *s, uint64_t host, uint64_t len, const struct iovec *iov,
			int iovcnt, size_t iov_off)
{
	uint64_t size = s->data->size, in = host >= size ? 0 : size - host;

	if (in > len)
		in = len;
	if (in < len)
		iov_memset(iov, iovcnt, iov_off + in, 0, len - in);
	return in ? qc_co_rw_iov(s->data, BLK_OP_READ, host, in, iov, iovcnt, iov_off) : 0;
}

int qc_read_entry(struct qc_state *s, uint64_t gc, uint64_t e, uint64_t bm, uint64_t coff,
		  uint64_t len, const struct iovec *iov, int iovcnt, size_t iov_off)
{
	uint64_t n;
	int ret = 0;

	while (len && ret == 0) {
		n = len;
		switch (qc_classify(s, e, bm, coff, &n)) {
		case QC_NORMAL:
			ret = qc_read_data(s, (e & QC_OFFSET_MASK) + coff, n, iov, iovcnt, iov_off);
			break;
		case QC_ZERO:
			iov_memset(iov, iovcnt, iov_off, 0, n);
			break;
		case QC_UNALLOC:
			ret = qc_backing_read(s, (gc << s->cluster_bits) + coff, n, iov, iovcnt,
					      iov_off);
			break;
		case QC_COMPRESSED:
			ret = qc_read_compressed(s, e, coff, n, iov, iovcnt, iov_off);
			break;
		}
		coff += n;
		iov_off += n;
		len -= n;
	}
	return ret;
}

/* The entry of gc, waiting first for an allocation in flight on it unless
 * the entry is plain data (then the old data is a valid answer). */
static int qc_lookup_settled(struct qc_state *s, uint64_t gc, uint64_t *e, uint64_t *bm)
{
	int ret;

	qc_co_lock(s, &s->meta);
	do {
		ret = qc_l2_get(s, gc, e, bm);
		if (ret)
			break;
		ret = qc_entry_check(s, gc, *e, *bm, QC_OL_FIXED);
	} while (ret == 0 && qc_alloc_wait(s, gc, 1));
	qc_co_unlock(s, &s->meta);
	return ret;
}

int qc_co_readv(struct qc_state *s, uint64_t off, uint64_t len, const struct iovec *iov, int iovcnt)
{
	size_t iov_off = 0;
	uint64_t e, bm, n, gc;
	int ret = 0;

	while (len && ret == 0) {
		gc = off >> s->cluster_bits;
		n = s->cluster_size - qc_coff(s, off);
		if (n > len)
			n = len;
		ret = qc_lookup_settled(s, gc, &e, &bm);
		if (!ret)
			ret = qc_read_entry(s, gc, e, bm, qc_coff(s, off), n, iov, iovcnt, iov_off);
		off += n;
		iov_off += n;
		len -= n;
	}
	return ret;
}

/* ---- writes ---- */

/* Subcluster mask of [coff, coff+len) within a cluster. */
static uint64_t qc_sc_mask(const struct qc_state *s, uint64_t coff, uint64_t len)
{
	unsigned a = (unsigned)(coff >> s->sc_bits);
	unsigned b = (unsigned)((coff + len - 1) >> s->sc_bits);

	return (b - a == 31 ? 0xffffffffull : ((1ull << (b - a + 1)) - 1)) << a;
}

/* Can [coff, coff+len) be written in place? */
static bool qc_in_place(const struct qc_state *s, uint64_t e, uint64_t bm, uint64_t coff,
			uint64_t len)
{
	if ((e & (QC_OFLAG_COMPRESSED | QC_OFLAG_COPIED)) != QC_OFLAG_COPIED)
		return false;
	if (!s->ext_l2)
		return !(e & QC_OFLAG_ZERO) && ((e & QC_OFFSET_MASK) || s->data_external);
	return (bm & qc_sc_mask(s, coff, len)) == qc_sc_mask(s, coff, len);
}

static int qc_write_in_place(struct qc_state *s, uint64_t e, uint64_t off, uint64_t len,
			     const struct iovec *iov, int iovcnt, size_t iov_off)
{
	unsigned ep;
	int ret;

	/* The file may end inside the cluster (see qc_read_data). */
	ret = qc_grow_file(s, s->data, (e & QC_OFFSET_MASK) + qc_coff(s, off) + len);
	if (ret) {
		qc_co_unlock(s, &s->meta);
		return ret;
	}
	pthread_mutex_lock(&s->lock);
	qc_wr_begin(s, &ep);
	pthread_mutex_unlock(&s->lock);
	qc_co_unlock(s, &s->meta);
	ret = qc_co_rw_iov(s->data, BLK_OP_WRITE, (e & QC_OFFSET_MASK) + qc_coff(s, off), len, iov,
			   iovcnt, iov_off);
	qc_wr_end(s, ep);
	return ret;
}

/* A planned allocation: k clusters from gc, old entries of the first and
 * last, host range and the entries to link. */
struct qc_plan {
	uint64_t gc, k;
	uint64_t e0, bm0, e1, bm1; /* old entries: first, last cluster */
	uint64_t host;             /* host offset of cluster gc */
	bool new_host, fresh;
	struct qc_cow cow;
};

/* How many clusters after gc are also entirely unallocated and written. */
static uint64_t qc_run_len(struct qc_state *s, uint64_t gc, uint64_t end)
{
	uint64_t k = 1, e, bm, last = (end - 1) >> s->cluster_bits;

	if (s->data_external)
		return 1;
	while (gc + k <= last && k < QC_MAX_RUN && ((gc + k) >> s->l2_bits) == (gc >> s->l2_bits)) {
		if (qc_l2_get(s, gc + k, &e, &bm) || e || bm)
			break;
		pthread_mutex_lock(&s->lock);
		if (qc_alloc_find(s, gc + k, 1)) {
			pthread_mutex_unlock(&s->lock);
			break;
		}
		pthread_mutex_unlock(&s->lock);
		k++;
	}
	return k;
}

/* Guest range to (re)write in the new place: whole clusters, or the touched
 * subclusters when the other subclusters keep their meaning. */
static void qc_plan_range(struct qc_state *s, struct qc_plan *p, uint64_t off, uint64_t wlen)
{
	uint64_t base = p->gc << s->cluster_bits, sc = 1ull << s->sc_bits, end = off + wlen;
	bool keep_old = p->new_host && (p->e0 & (QC_OFFSET_MASK | QC_OFLAG_COMPRESSED)) &&
			!s->data_external;

	p->cow.gstart = base;
	p->cow.gend = base + (p->k << s->cluster_bits);
	if (s->ext_l2 && !keep_old) {
		/* Subclusters: COW only inside the first and last touched ones,
		 * and not at all where they are allocated already (reused host). */
		unsigned first = (unsigned)(qc_coff(s, off) >> s->sc_bits);
		unsigned last = (unsigned)(((end - 1) & (s->cluster_size - 1)) >> s->sc_bits);

		p->cow.gstart =
			!p->new_host && (p->bm0 & (1ull << first)) ? off : qc_align_down(off, sc);
		p->cow.gend =
			!p->new_host && (p->bm1 & (1ull << last)) ? end : qc_align_up(end, sc);
	}
	p->cow.host = p->host + (p->cow.gstart - base);
	p->cow.head_entry = p->e0;
	p->cow.head_bitmap = p->bm0;
	p->cow.tail_entry = p->e1;
	p->cow.tail_bitmap = p->bm1;
	p->cow.fresh = p->fresh;
}

/* Allocate (meta held); fills p. */
static int qc_plan_alloc(struct qc_state *s, struct qc_plan *p, uint64_t end)
{
	uint64_t off0 = p->e0 & QC_OFFSET_MASK;
	int ret;

	p->k = (p->e0 || p->bm0) ? 1 : qc_run_len(s, p->gc, end);
	p->e1 = p->e0;
	p->bm1 = p->bm0;
	if (p->k > 1)
		p->e1 = p->bm1 = 0;
	if (s->data_external) {
		p->host = p->gc << s->cluster_bits;
		p->new_host = !(p->e0 & QC_OFLAG_COPIED);
		p->fresh = p->host >= s->data_fresh_from;
		return qc_grow_file(s, s->data, p->host + s->cluster_size);
	}
	/* Reuse a host cluster the image owns alone (preallocated zero
	 * cluster, or unallocated subclusters of an allocated cluster). */
	if (off0 && (p->e0 & QC_OFLAG_COPIED) && !(p->e0 & QC_OFLAG_COMPRESSED)) {
		p->host = off0;
		p->new_host = false;
		p->fresh = false;
		return qc_grow_file(s, s->data, off0 + s->cluster_size);
	}
	p->new_host = true;
	ret = qc_alloc_run(s, &p->k, &p->host, &p->fresh);
	if (!ret && p->k > 1)
		p->e1 = p->bm1 = 0;
	return ret;
}

static void qc_plan_entry(struct qc_state *s, const struct qc_plan *p, uint64_t i, uint64_t *e,
			  uint64_t *bm)
{
	uint64_t base = (p->gc + i) << s->cluster_bits, lo, hi, mask;
	uint64_t old_bm = i == 0 ? p->bm0 : (i == p->k - 1 ? p->bm1 : 0);

	*e = (p->host + (i << s->cluster_bits)) | QC_OFLAG_COPIED;
	*bm = 0;
	if (!s->ext_l2)
		return;
	lo = p->cow.gstart > base ? p->cow.gstart - base : 0;
	hi = p->cow.gend < base + s->cluster_size ? p->cow.gend - base : s->cluster_size;
	mask = qc_sc_mask(s, lo, hi - lo);
	*bm = ((old_bm | mask) & 0xffffffffull) | ((old_bm >> 32) & ~mask) << 32;
}

/* Link the new entries and drop old references (meta held). */
static int qc_plan_link(struct qc_state *s, const struct qc_plan *p)
{
	uint64_t i, e, bm;
	int ret = 0;

	for (i = 0; i < p->k && ret == 0; i++) {
		qc_plan_entry(s, p, i, &e, &bm);
		ret = qc_l2_set(s, p->gc + i, e, bm);
	}
	if (ret == 0 && p->new_host && p->k == 1 && !s->data_external)
		qc_entry_release(s, p->e0, false);
	return ret;
}

static void qc_plan_unwind(struct qc_state *s, const struct qc_plan *p)
{
	uint64_t i;

	if (!p->new_host || s->data_external)
		return;
	for (i = 0; i < p->k; i++)
		qc_rc_update(s, (p->host >> s->cluster_bits) + i, -1);
}

/* Write into clusters another request is allocating (see struct qc_alloc). */
static int qc_write_joined(struct qc_state *s, struct qc_alloc *a, uint64_t host, uint64_t len,
			   const struct iovec *iov, int iovcnt, size_t iov_off)
{
	int ret, ret2;

	qc_co_unlock(s, &s->meta);
	ret = qc_co_rw_iov(s->data, BLK_OP_WRITE, host, len, iov, iovcnt, iov_off);
	ret2 = qc_alloc_join_finish(s, a);
	return ret ? ret : ret2;
}

/* The entry of gc once no allocation is in flight on it; may instead join
 * one (*joined, with meta released and the write done). */
static int qc_write_lookup(struct qc_state *s, struct qc_plan *p, uint64_t off, uint64_t n,
			   const struct iovec *iov, int iovcnt, size_t iov_off, bool *joined)
{
	struct qc_alloc *a;
	uint64_t host;
	int ret;

	*joined = false;
	for (;;) {
		ret = qc_l2_get(s, p->gc, &p->e0, &p->bm0);
		if (!ret)
			ret = qc_entry_check(s, p->gc, p->e0, p->bm0, QC_OL_ALL);
		if (ret)
			return ret;
		a = qc_alloc_try_join(s, p->gc, off, &host);
		if (a) {
			*joined = true;
			return qc_write_joined(s, a, host, n, iov, iovcnt, iov_off);
		}
		if (!qc_alloc_wait(s, p->gc, 1))
			return 0;
	}
}

/* Allocate, write with COW, link (meta held on entry, released on return). */
static int qc_write_alloc(struct qc_state *s, struct qc_plan *p, uint64_t off, uint64_t wlen,
			  const struct iovec *iov, int iovcnt, size_t iov_off)
{
	struct qc_alloc a;
	int ret;

	qc_plan_range(s, p, off, wlen);
	a.host = p->host;
	a.joinable = !s->ext_l2 && qc_cow_data_only(s, &p->cow, off, wlen);
	qc_alloc_register(s, &a, p->gc, p->k);
	qc_co_unlock(s, &s->meta);

	ret = qc_cow_write(s, &p->cow, off, wlen, iov, iovcnt, iov_off);

	qc_co_lock(s, &s->meta);
	if (!ret)
		ret = qc_plan_link(s, p);
	qc_alloc_unregister(s, &a, ret);
	if (ret) {
		/* Joiners may still write into the clusters: free them after. */
		qc_co_unlock(s, &s->meta);
		qc_alloc_drain(s, &a);
		qc_co_lock(s, &s->meta);
		qc_plan_unwind(s, p);
	}
	qc_co_unlock(s, &s->meta);
	qc_alloc_drain(s, &a);
	return ret;
}

/* One step of a write starting at off: returns bytes done or -errno. */
static int64_t qc_write_step(struct qc_state *s, uint64_t off, uint64_t end,
			     const struct iovec *iov, int iovcnt, size_t iov_off)
{
	struct qc_plan p = {.gc = off >> s->cluster_bits};
	uint64_t n = s->cluster_size - qc_coff(s, off), wlen;
	bool joined;
	int ret;

	if (n > end - off)
		n = end - off;
	qc_co_lock(s, &s->meta);
	ret = qc_write_lookup(s, &p, off, n, iov, iovcnt, iov_off, &joined);
	if (joined)
		return ret ? ret : (int64_t)n;
	if (ret)
		goto fail_meta;
	if (qc_in_place(s, p.e0, p.bm0, qc_coff(s, off), n)) {
		ret = qc_write_in_place(s, p.e0, off, n, iov, iovcnt, iov_off);
		return ret ? ret : (int64_t)n;
	}
	ret = qc_plan_alloc(s, &p, end);
	if (ret)
		goto fail_meta;
	wlen = ((p.gc + p.k) << s->cluster_bits) - off;
	if (wlen > end - off)
		wlen = end - off;
	ret = qc_write_alloc(s, &p, off, wlen, iov, iovcnt, iov_off);
	return ret ? ret : (int64_t)wlen;
fail_meta:
	qc_co_unlock(s, &s->meta);
	return ret;
}

int qc_co_writev(struct qc_state *s, uint64_t off, uint64_t len, const struct iovec *iov,
		 int iovcnt, uint32_t flags)
{
	uint64_t end = off + len;
	size_t iov_off = 0;
	int64_t n;

	(void)flags;
	while (off < end) {
		n = qc_write_step(s, off, end, iov, iovcnt, iov_off);
		if (n < 0)
			return (int)n;
		off += (uint64_t)n;
		iov_off += (size_t)n;
	}
	return 0;
}

/* ---- write-zeroes and discard ---- */

/* New entry for a cluster that must read as zero (or be discarded). Returns
 * false when the format cannot express it (version 2 with data beneath). */
static bool qc_zero_entry(struct qc_state *s, uint64_t e, uint64_t bm, bool unmap, bool discard,
			  uint64_t *ne, uint64_t *nbm)
{
	bool keep = !unmap && (e & QC_OFLAG_COPIED) && !(e & QC_OFLAG_COMPRESSED) &&
		    ((e & QC_OFFSET_MASK) || s->data_external);

	(void)bm;
	*ne = keep ? (e & (QC_OFFSET_MASK | QC_OFLAG_COPIED)) : 0;
	*nbm = 0;
	if (discard && !s->backing && !keep)
		return true; /* unallocated reads as zero */
	if (s->ext_l2) {
		*nbm = 0xffffffffull << 32;
		return true;
	}
	if (s->h.version < 3)
		return !s->backing && !keep;
	*ne |= QC_OFLAG_ZERO;
	return true;
}

/* Zero (or discard) guest cluster gc in its L2 entry: 0 or -errno; *buffers
 * when the format cannot express it and zero buffers must be written. */
static int qc_zero_cluster(struct qc_state *s, uint64_t gc, uint32_t flags, bool discard,
			   bool *buffers)
{
	uint64_t e, bm, ne, nbm;
	bool unmap = discard || (flags & BLK_F_MAY_UNMAP);
	int ret;

	*buffers = false;
	qc_co_lock(s, &s->meta);
	do {
		ret = qc_l2_get(s, gc, &e, &bm);
		if (!ret)
			ret = qc_entry_check(s, gc, e, bm, QC_OL_ALL);
	} while (ret == 0 && qc_alloc_wait(s, gc, 1));
	if (ret)
		goto out;
	if (s->data_raw && !discard) /* the raw data file must hold the zeroes too */
		ret = qc_grow_file(s, s->data, (gc + 1) << s->cluster_bits);
	if (s->data_raw && !discard && !ret)
		ret = qc_co_op(s->data, BLK_OP_WRITE_ZEROES, gc << s->cluster_bits, s->cluster_size,
			       0);
	if (ret)
		goto out;
	if (!qc_zero_entry(s, e, bm, unmap, discard, &ne, &nbm)) {
		*buffers = !discard;
		goto out;
	}
	if (ne == e && nbm == bm)
		goto out;
	ret = qc_l2_set(s, gc, ne, nbm);
	if (!ret && (ne & QC_OFFSET_MASK) != (e & QC_OFFSET_MASK))
		qc_entry_release(s, e, true);
	if (!ret && s->data_external && unmap && (e & QC_OFLAG_COPIED) && !s->data_raw)
		qc_co_op(s->data, BLK_OP_DISCARD, gc << s->cluster_bits, s->cluster_size, 0);
out:
	qc_co_unlock(s, &s->meta);
	return ret;
}

static int qc_zero_buffers(struct qc_state *s, uint64_t off, uint64_t len)
{
	while (len) {
		uint64_t n = len < s->cluster_size ? len : s->cluster_size;
		struct iovec v = {s->zero_buf, n};
		int ret = qc_co_writev(s, off, n, &v, 1, 0);

		if (ret)
			return ret;
		off += n;
		len -= n;
	}
	return 0;
}

int qc_co_zero(struct qc_state *s, uint64_t off, uint64_t len, uint32_t flags, bool discard)
{
	uint64_t end = off + len, a = qc_align_up(off, s->cluster_size);
	uint64_t b = qc_align_down(end, s->cluster_size);
	bool buffers;
	int ret = 0;

	/* Cluster fragments at either end: discard ignores them (advisory),
	 * write-zeroes writes zeroes. The last cluster of the disk counts as
	 * whole when the request reaches the end. */
	if (end == s->h.size)
		b = qc_align_up(end, s->cluster_size);
	if (a >= b) {
		return discard ? 0 : qc_zero_buffers(s, off, len);
	}
	if (!discard && off < a)
		ret = qc_zero_buffers(s, off, a - off);
	for (uint64_t c = a; ret == 0 && c < b; c += s->cluster_size) {
		uint64_t ce = c + s->cluster_size > end ? end : c + s->cluster_size;

		ret = qc_zero_cluster(s, c >> s->cluster_bits, flags, discard, &buffers);
		if (ret == 0 && buffers)
			ret = qc_zero_buffers(s, c, ce - c);
	}
	if (ret == 0 && !discard && b < end)
		ret = qc_zero_buffers(s, b, end - b);
	return ret;
}

/* ---- block status ---- */

/* Does a range of kind k keep a host cluster? As in QEMU's block status: plain
 * data, a zero cluster that kept its host cluster (zero flag with an offset)
 * and, with subclusters, zero or unallocated subclusters of an allocated
 * cluster do; compressed clusters (no plain host range) and clusters without
 * a host cluster do not. */
static bool qc_status_has_host(const struct qc_state *s, enum qc_kind k, uint64_t e)
{
	if (k == QC_COMPRESSED)
		return false;
	if (k == QC_NORMAL)
		return true;
	if (s->ext_l2)
		return (e & QC_OFFSET_MASK) || (s->data_external && (e & QC_OFLAG_COPIED));
	return k == QC_ZERO && (e & QC_OFFSET_MASK);
}

static uint32_t qc_status_of(struct qc_state *s, enum qc_kind k, uint64_t e, uint64_t goff)
{
	uint32_t host = qc_status_has_host(s, k, e) ? BLK_STATUS_OFFSET_VALID : 0;

	switch (k) {
	case QC_NORMAL:
		return BLK_STATUS_DATA | BLK_STATUS_ALLOCATED | host;
	case QC_COMPRESSED:
		return BLK_STATUS_DATA | BLK_STATUS_ALLOCATED;
	case QC_ZERO:
		return BLK_STATUS_ZERO | BLK_STATUS_ALLOCATED | host;
	default:
		return (s->backing && goff < s->backing_size ? BLK_STATUS_DATA : BLK_STATUS_ZERO) |
		       host;
	}
}

/* Kind and entry of [off, off + *n), *n shrunk to a run of one kind; *table:
 * an L2 table was looked at. A range without one (a zero L1 entry) is one
 * run to the end of that table's range, or to the cluster where the
 * backing file ends, without I/O: a map of a mostly empty 2 PiB disk would
 * otherwise take 2^35 steps. */
static int qc_status_step(struct qc_state *s, uint64_t off, uint64_t *n, uint64_t *e,
			  enum qc_kind *k, bool *table)
{
	uint64_t gc = off >> s->cluster_bits, l1i = gc >> s->l2_bits, bm, lim;
	uint64_t bend = qc_align_up(s->backing_size, s->cluster_size);
	int ret;

	*table = l1i < s->l1_size && (s->l1[l1i] & QC_OFFSET_MASK);
	if (!*table) {
		lim = (l1i + 1) << (s->l2_bits + s->cluster_bits);
		if (s->backing && off < bend && bend < lim)
			lim = bend;
		if (*n > lim - off)
			*n = lim - off;
		*e = 0;
		*k = QC_UNALLOC;
		return 0;
	}
	ret = qc_l2_get(s, gc, e, &bm);
	if (!ret)
		*k = qc_classify(s, *e, bm, qc_coff(s, off), n);
	return ret;
}

/* With BLK_F_ALLOC_ONLY only the allocated bit counts: clusters allocated
 * in any order on the host make one run, not one per cluster (a stream of a
 * top that guest writes allocated at random asks once per L2 table). */
int qc_co_block_status(struct qc_state *s, struct blk_request *req)
{
	uint64_t off = req->offset, end = off + req->len, e, n, host = 0, coff;
	uint32_t st = 0, st1, keep = req->flags & BLK_F_ALLOC_ONLY ? BLK_STATUS_ALLOCATED : ~0u;
	enum qc_kind k;
	bool table;
	int ret = 0;

	req->status_len = 0;
	qc_co_lock(s, &s->meta);
	while (off < end && ret == 0) {
		n = end - off;
		coff = qc_coff(s, off);
		ret = qc_status_step(s, off, &n, &e, &k, &table);
		if (ret)
			break;
		st1 = qc_status_of(s, k, e, off) & keep;
		if (req->status_len == 0) {
			st = st1;
			host = (e & QC_OFFSET_MASK) + coff;
			req->status_offset = host;
		} else if (st1 != st || ((st & BLK_STATUS_OFFSET_VALID) &&
					 (e & QC_OFFSET_MASK) + coff != host + req->status_len)) {
			break;
		}
		req->status_len += n;
		/* Stay within one L2 table: enough for a map, bounded work. */
		if (table && ((off + n - 1) >> (s->l2_bits + s->cluster_bits)) !=
				     ((off + n) >> (s->l2_bits + s->cluster_bits)))
			break;
		off += n;
	}
	qc_co_unlock(s, &s->meta);
	req->status = st;
	return ret;
}

/* ---- compressed writes ---- */

static int qc_write_one_compressed(struct qc_state *s, uint64_t off, const uint8_t *buf,
				   uint64_t len, uint8_t *tmp)
{
	uint64_t gc = off >> s->cluster_bits, e, bm, host = 0, nsect;
	unsigned x = 62 - (s->cluster_bits - 8);
	uint8_t *src = (uint8_t *)buf;
	long clen;
	int ret;

	if (len < s->cluster_size) {
		src = tmp + s->cluster_size;
		memcpy(src, buf, len);
		memset(src + len, 0, s->cluster_size - len);
	}
	clen = qc_compress(s->comp_type, src, s->cluster_size, tmp, s->cluster_size - 512);
	if (clen <= 0 || s->data_external) {
		struct iovec v = {(void *)buf, len};

		return clen < 0 ? (int)clen : qc_co_writev(s, off, len, &v, 1, 0);
	}
	qc_co_lock(s, &s->meta);
	ret = qc_l2_get(s, gc, &e, &bm);
	if (!ret && (e || bm))
		ret = -EEXIST;
	if (!ret)
		ret = qc_alloc_bytes(s, (uint64_t)clen, &host);
	if (!ret)
		ret = qc_co_pwrite(s->file, host, tmp, (uint64_t)clen);
	nsect = ((host + (uint64_t)clen - 1) >> 9) - (host >> 9);
	if (!ret)
		ret = qc_l2_set(s, gc, QC_OFLAG_COMPRESSED | (nsect << x) | host, 0);
	qc_co_unlock(s, &s->meta);
	return ret;
}

int qc_co_write_compressed(struct qc_state *s, uint64_t off, const void *buf, uint64_t len)
{
	uint8_t *tmp;
	int ret = 0;

	if (qc_coff(s, off) || (len % s->cluster_size && off + len != s->h.size))
		return -EINVAL;
	tmp = malloc(2 * s->cluster_size);
	if (!tmp)
		return -ENOMEM;
	while (len && ret == 0) {
		uint64_t n = len < s->cluster_size ? len : s->cluster_size;

		ret = qc_write_one_compressed(s, off, buf, n, tmp);
		off += n;
		buf = (const uint8_t *)buf + n;
		len -= n;
	}
	free(tmp);
	return ret;
}
