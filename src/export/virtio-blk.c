/* virtio-blk requests (virtio 1.2 section 5.2.6) on top of the block layer.
 * The transport hands over a walked chain; the header is the first 16
 * readable bytes, the status the last writable byte, wherever the driver put
 * the descriptor boundaries ("The device MUST NOT make assumptions about the
 * particular arrangement of descriptors"). Data stays in guest memory.
 *
 * THREADING RULE: see virtio-blk.h; requests run on the submitting loop. */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "export/virtio-blk.h"
#include "util/iov.h"

#define VBLK_SIZE_MAX (1u << 20)
/* One segment per discard/write-zeroes request, up to 2 GiB. */
#define VBLK_MAX_DISCARD_SECTORS (1u << 22)

/* ---- device --------------------------------------------------------------- */

int vblk_dev_init(struct vblk_dev *d, struct blk_node *bs, const struct vblk_dev_opts *o, char *err,
		  size_t errlen)
{
	uint32_t lbs = o->logical_block_size ? o->logical_block_size : 512;

	memset(d, 0, sizeof(*d));
	if (lbs != 512 && lbs != 4096) {
		snprintf(err, errlen, "logical-block-size must be 512 or 4096");
		return -EINVAL;
	}
	if (o->writable && bs->read_only) {
		snprintf(err, errlen, "writable=on but the image is read-only");
		return -EROFS;
	}
	d->bs = bs;
	d->lbs = lbs;
	/* Whole logical blocks only: the tail of an odd-sized image is hidden. */
	d->sectors = bs->size / lbs * (lbs / VIRTIO_BLK_SECTOR);
	d->read_only = !o->writable;
	d->writeback = 1;
	d->num_queues = o->num_queues ? o->num_queues : 1;
	if (o->serial) /* at most 20 bytes, not NUL-terminated when 20 long */
		memcpy(d->serial, o->serial, strnlen(o->serial, sizeof(d->serial)));
	return 0;
}

uint64_t vblk_dev_features(const struct vblk_dev *d)
{
	uint64_t f = 1ull << VIRTIO_F_VERSION_1 | 1ull << VIRTIO_RING_F_INDIRECT_DESC |
		     1ull << VIRTIO_RING_F_EVENT_IDX | 1ull << VIRTIO_BLK_F_SIZE_MAX |
		     1ull << VIRTIO_BLK_F_SEG_MAX | 1ull << VIRTIO_BLK_F_BLK_SIZE |
		     1ull << VIRTIO_BLK_F_TOPOLOGY | 1ull << VIRTIO_BLK_F_FLUSH |
		     1ull << VIRTIO_BLK_F_CONFIG_WCE | 1ull << VIRTIO_BLK_F_MQ;

	if (d->read_only)
		f |= 1ull << VIRTIO_BLK_F_RO;
	else
		f |= 1ull << VIRTIO_BLK_F_DISCARD | 1ull << VIRTIO_BLK_F_WRITE_ZEROES;
	return f;
}

void vblk_dev_set_node(struct vblk_dev *d, struct blk_node *bs)
{
	__atomic_store_n(&d->bs, bs, __ATOMIC_RELEASE);
}

void vblk_dev_resized(struct vblk_dev *d)
{
	__atomic_store_n(&d->sectors, d->bs->size / d->lbs * (d->lbs / VIRTIO_BLK_SECTOR),
			 __ATOMIC_RELAXED);
}

void vblk_dev_config(const struct vblk_dev *d, struct virtio_blk_config *c)
{
	uint32_t align = d->lbs / VIRTIO_BLK_SECTOR;

	memset(c, 0, sizeof(*c));
	c->capacity = htole64(__atomic_load_n(&d->sectors, __ATOMIC_RELAXED));
	c->size_max = htole32(VBLK_SIZE_MAX);
	c->seg_max = htole32(VBLK_SEG_MAX);
	c->blk_size = htole32(d->lbs);
	c->min_io_size = htole16(1);
	c->writeback = __atomic_load_n(&d->writeback, __ATOMIC_RELAXED);
	c->num_queues = htole16((uint16_t)d->num_queues);
	c->max_discard_sectors = htole32(VBLK_MAX_DISCARD_SECTORS);
	c->max_discard_seg = htole32(1);
	c->discard_sector_alignment = htole32(align);
	c->max_write_zeroes_sectors = htole32(VBLK_MAX_DISCARD_SECTORS);
	c->max_write_zeroes_seg = htole32(1);
	c->write_zeroes_may_unmap = 1;
}

int vblk_dev_set_config(struct vblk_dev *d, uint32_t off, const uint8_t *buf, uint32_t len)
{
	/* "writeback" is the one field a driver may write (CONFIG_WCE). */
	if (off != VBLK_CONFIG_WRITEBACK_OFF || len != 1 || buf[0] > 1)
		return -EINVAL;
	__atomic_store_n(&d->writeback, buf[0], __ATOMIC_RELAXED);
	return 0;
}

/* ---- request parsing -------------------------------------------------------- */

/* Drop n bytes from the front of iov[0, *cnt), moving *iov. */
static void iov_drop_front(struct iovec **iov, unsigned *cnt, size_t n)
{
	while (n && *cnt) {
		if ((*iov)->iov_len > n) {
			(*iov)->iov_base = (char *)(*iov)->iov_base + n;
			(*iov)->iov_len -= n;
			return;
		}
		n -= (*iov)->iov_len;
		(*iov)++;
		(*cnt)--;
	}
}

/* The last writable byte is the status; the writable iovecs lose it. Every
 * iovec has a non-zero length (vring_mem_map makes none of length 0). */
static void take_status(struct vblk_req *r)
{
	struct iovec *last = &r->iov[r->nout + r->nin - 1];

	r->status = (uint8_t *)last->iov_base + last->iov_len - 1;
	if (--last->iov_len == 0)
		r->nin--;
}

static enum vblk_submit_result finish(struct vblk_req *r, uint8_t status)
{
	*(volatile uint8_t *)r->status = status;
	return VBLK_FINISHED;
}

/* Sector range check without overflow: [sector, sector + bytes/512) inside
 * the disk and aligned to the logical block size. */
static bool range_ok(const struct vblk_dev *d, uint64_t sector, uint64_t bytes)
{
	uint64_t align = d->lbs / VIRTIO_BLK_SECTOR;

	uint64_t n = __atomic_load_n(&d->sectors, __ATOMIC_RELAXED); /* a resize may change it */

	if (bytes % d->lbs || sector & (align - 1))
		return false;
	return sector <= n && bytes / VIRTIO_BLK_SECTOR <= n - sector;
}

static void vblk_complete(struct blk_request *breq, int ret)
{
	struct vblk_req *r = (struct vblk_req *)breq;

	if (ret < 0)
		r->used_len = 1;
	r->error = ret < 0 ? ret : 0;
	*(volatile uint8_t *)r->status = ret < 0 ? VIRTIO_BLK_S_IOERR : VIRTIO_BLK_S_OK;
	r->done(r);
}

static enum vblk_submit_result submit(struct vblk_req *r, uint8_t op, uint32_t flags,
				      uint64_t sector, uint64_t len)
{
	int ret;

	r->breq.op = op;
	r->breq.flags = flags;
	r->breq.offset = sector * VIRTIO_BLK_SECTOR; /* < 2^64: sector <= capacity */
	r->breq.len = len;
	r->breq.cb = vblk_complete;
	r->breq.opaque = r;
	ret = blk_submit(__atomic_load_n(&r->dev->bs, __ATOMIC_RELAXED), &r->breq);
	if (ret < 0)
		return finish(r, ret == -ENOTSUP ? VIRTIO_BLK_S_UNSUPP : VIRTIO_BLK_S_IOERR);
	return VBLK_SUBMITTED;
}

static enum vblk_submit_result do_rw(struct vblk_req *r, const struct virtio_blk_hdr *h, bool write)
{
	struct vblk_dev *d = r->dev;
	struct iovec *iov = r->iov;
	unsigned cnt = r->nout;
	uint64_t len;

	if (write) {
		if (d->read_only)
			return finish(r, VIRTIO_BLK_S_IOERR);
		iov_drop_front(&iov, &cnt, sizeof(*h));
		len = r->out_len - sizeof(*h);
	} else {
		iov += r->nout;
		cnt = r->nin;
		len = r->in_len - 1;
	}
	if (!range_ok(d, h->sector, len))
		return finish(r, VIRTIO_BLK_S_IOERR);
	if (!write)
		r->used_len = (uint32_t)len + 1;
	r->breq.iov = iov;
	r->breq.iovcnt = (int)cnt;
	return submit(r, write ? BLK_OP_WRITE : BLK_OP_READ,
		      write && !__atomic_load_n(&d->writeback, __ATOMIC_RELAXED) ? BLK_F_FUA : 0,
		      h->sector, len);
}

static enum vblk_submit_result do_get_id(struct vblk_req *r)
{
	size_t n = r->in_len - 1 < VIRTIO_BLK_ID_BYTES ? r->in_len - 1 : VIRTIO_BLK_ID_BYTES;

	iov_from_buf(r->iov + r->nout, (int)r->nin, 0, r->dev->serial, n);
	r->used_len = (uint32_t)n + 1;
	return finish(r, VIRTIO_BLK_S_OK);
}

/* DISCARD and WRITE_ZEROES carry one segment after the header (we offer
 * max_discard_seg = max_write_zeroes_seg = 1). */
static enum vblk_submit_result do_discard_wz(struct vblk_req *r, bool wz)
{
	struct virtio_blk_discard_wz seg;
	struct vblk_dev *d = r->dev;
	uint64_t sector, bytes;
	uint32_t flags, allowed = wz ? VIRTIO_BLK_WZ_F_UNMAP : 0;

	if (d->read_only || r->out_len - sizeof(struct virtio_blk_hdr) != sizeof(seg))
		return finish(r, VIRTIO_BLK_S_UNSUPP);
	iov_to_buf(r->iov, (int)r->nout, sizeof(struct virtio_blk_hdr), &seg, sizeof(seg));
	sector = le64toh(seg.sector);
	bytes = (uint64_t)le32toh(seg.num_sectors) * VIRTIO_BLK_SECTOR;
	flags = le32toh(seg.flags);
	/* "the device MUST set the status byte to VIRTIO_BLK_S_UNSUPP for
	 * discard commands if the unmap flag is set" (and unknown flags). */
	if (flags & ~allowed)
		return finish(r, VIRTIO_BLK_S_UNSUPP);
	if (le32toh(seg.num_sectors) > VBLK_MAX_DISCARD_SECTORS || !range_ok(d, sector, bytes))
		return finish(r, VIRTIO_BLK_S_IOERR);
	if (!wz)
		return submit(r, BLK_OP_DISCARD, 0, sector, bytes);
	return submit(r, BLK_OP_WRITE_ZEROES,
		      (flags & VIRTIO_BLK_WZ_F_UNMAP ? BLK_F_MAY_UNMAP : 0) |
			      (__atomic_load_n(&d->writeback, __ATOMIC_RELAXED) ? 0 : BLK_F_FUA),
		      sector, bytes);
}

enum vblk_submit_result vblk_req_submit(struct vblk_req *r)
{
	struct virtio_blk_hdr h;

	/* Without a header to read and a status byte to write there is no way
	 * to answer: the driver is broken. */
	if (r->out_len < sizeof(h) || r->in_len < 1 || !r->nin)
		return VBLK_BROKEN;
	iov_to_buf(r->iov, (int)r->nout, 0, &h, sizeof(h));
	h.type = le32toh(h.type);
	h.sector = le64toh(h.sector);
	take_status(r);
	r->used_len = 1;
	r->error = 0;
	switch (h.type) {
	case VIRTIO_BLK_T_IN:
		return do_rw(r, &h, false);
	case VIRTIO_BLK_T_OUT:
		return do_rw(r, &h, true);
	case VIRTIO_BLK_T_FLUSH:
		return submit(r, BLK_OP_FLUSH, 0, 0, 0);
	case VIRTIO_BLK_T_GET_ID:
		return do_get_id(r);
	case VIRTIO_BLK_T_DISCARD:
		return do_discard_wz(r, false);
	case VIRTIO_BLK_T_WRITE_ZEROES:
		return do_discard_wz(r, true);
	default:
		return finish(r, VIRTIO_BLK_S_UNSUPP);
	}
}
