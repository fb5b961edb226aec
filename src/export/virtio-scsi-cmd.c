/* virtio-scsi command requests: the header read, the CDB decoded by scsi.c,
 * emulated answers copied to data-in, and block commands run on the block
 * layer with the data in guest memory (the chain's iovecs trimmed in place
 * to the data-out or data-in part). The response goes to the front of the
 * writable part when the command is done.
 *
 * THREADING RULE: a request belongs to the thread of its queue. */
#include <endian.h>
#include <errno.h>
#include <string.h>

#include "export/virtio-scsi.h"
#include "util/compiler.h"
#include "util/iov.h"

#define HDR_FIXED 19  /* lun[8], id, task_attr, prio, crn */
#define RESP_FIXED 12 /* sense_len, resid, status_qualifier, status, response */
#define UNMAP_PARAM_MAX (8 + 16 * SCSI_UNMAP_MAX)
#define ASC_SPACE_ALLOC_FAILED 0x2707

/* The header nearly always sits in one descriptor: copied at once then,
 * else through the iovec walk. */
static inline void chain_read(const struct iovec *iov, unsigned cnt, void *buf, size_t len)
{
	if (cnt && iov[0].iov_len >= len)
		memcpy(buf, iov[0].iov_base, len);
	else
		iov_to_buf(iov, (int)cnt, 0, buf, len);
}

/* The response's fixed part: sense_len, resid, status qualifier (0),
 * status, response. The fields are read before p is written (p may be
 * anything to the compiler). */
static inline void resp_fixed(const struct vscsi_req *r, uint8_t *p)
{
	uint32_t sense_len = htole32(r->sense_len), resid = htole32(r->resid);
	uint8_t status = r->status, response = r->response;

	memcpy(p, &sense_len, 4);
	memcpy(p + 4, &resid, 4);
	p[8] = p[9] = 0;
	p[10] = status;
	p[11] = response;
}

/* With sense, or the response's buffer cut short: built here and copied. */
static void respond_copy(const struct vscsi_req *r)
{
	uint8_t resp[RESP_FIXED + SCSI_SENSE_LEN];

	resp_fixed(r, resp);
	if (r->sense_len)
		scsi_sense_fixed(resp + RESP_FIXED, r->key, r->asc);
	iov_from_buf(r->v.iov + r->v.nout, (int)r->v.nin, 0, resp, RESP_FIXED + r->sense_len);
}

/* Write the response (to the front of the writable part) and drop the LUN.
 * Sense bytes past sense_len are left alone: the driver reads none of them. */
static inline void respond(struct vscsi_req *r, uint32_t data_len)
{
	const struct iovec *in = r->v.iov + r->v.nout;

	if (r->saved.iov_base) /* the data-in slice cut into the response's iovec */
		r->v.iov[r->saved_idx] = r->saved;
	/* No sense, and the response in a buffer of its own (what drivers
	 * send): written in place. */
	if (likely(!r->sense_len && r->v.nin && in->iov_len >= RESP_FIXED))
		resp_fixed(r, in->iov_base);
	else
		respond_copy(r);
	r->v.used_len = r->resp_size + data_len;
	vscsi_lun_put(r->lun);
	r->lun = NULL;
}

static enum vblk_submit_result finish_check(struct vscsi_req *r, uint8_t key, uint16_t asc)
{
	r->status = SCSI_STATUS_CHECK_CONDITION;
	r->key = key;
	r->asc = asc;
	r->sense_len = r->resp_size - RESP_FIXED < SCSI_SENSE_LEN
			       ? (uint8_t)(r->resp_size - RESP_FIXED)
			       : SCSI_SENSE_LEN;
	respond(r, 0);
	return VBLK_FINISHED;
}

static enum vblk_submit_result finish_response(struct vscsi_req *r, uint8_t response)
{
	r->response = response;
	respond(r, 0);
	return VBLK_FINISHED;
}

/* Cut iov[first, first+cnt) in place to the bytes [skip, skip+len); the
 * entry split at skip is saved when save. Returns the first entry of the
 * slice and its count in *n; -1 if the iovecs hold fewer bytes. */
static int slice_walk(struct vscsi_req *r, unsigned first, unsigned cnt, uint64_t skip,
		      uint64_t len, bool save, unsigned *n)
{
	struct iovec *iov = r->v.iov;
	unsigned i = first, end = first + cnt, start;

	while (i < end && skip >= iov[i].iov_len)
		skip -= iov[i++].iov_len;
	if (i == end)
		return len ? -1 : (int)(*n = 0);
	if (save && skip) {
		r->saved = iov[i];
		r->saved_idx = i;
	}
	iov[i].iov_base = (char *)iov[i].iov_base + skip;
	iov[i].iov_len -= skip;
	for (start = i; i < end && len > iov[i].iov_len; i++)
		len -= iov[i].iov_len;
	if (i == end)
		return -1;
	iov[i].iov_len = len;
	*n = i + 1 - start;
	return (int)start;
}

/* slice_walk(), inline for what drivers send: the header or response in a
 * buffer of its own, the data in one buffer after it. Nothing to cut. */
static inline int slice(struct vscsi_req *r, unsigned first, unsigned cnt, uint64_t skip,
			uint64_t len, bool save, unsigned *n)
{
	const struct iovec *iov = r->v.iov + first;

	if (cnt == 2 && iov[0].iov_len == skip && iov[1].iov_len == len) {
		*n = 1;
		return (int)first + 1;
	}
	return slice_walk(r, first, cnt, skip, len, save, n);
}

static uint16_t error_asc(const struct vscsi_req *r, int ret)
{
	if (ret == -ENOSPC)
		return ASC_SPACE_ALLOC_FAILED;
	return r->v.breq.op == BLK_OP_READ ? SCSI_ASC_UNRECOVERED_READ : SCSI_ASC_WRITE_ERROR;
}

static int submit_ext(struct vscsi_req *r);

/* An UNMAP range finished with *ret: true when the next one is on its way,
 * else false with *ret what the command ends with. Only UNMAP looks at
 * next_ext: one that failed leaves ranges there. */
static bool unmap_next(struct vscsi_req *r, int *ret)
{
	if (*ret == -ENOTSUP)
		*ret = 0; /* UNMAP is a hint */
	while (*ret == 0 && r->next_ext < r->next_ext_end) {
		*ret = submit_ext(r);
		if (*ret == 0)
			return true;
		if (*ret == -ENOTSUP || *ret == 1)
			*ret = 0;
	}
	return false;
}

/* Data-in only for a READ: the slot's last command may have been one. */
static void cmd_complete(struct blk_request *breq, int ret)
{
	struct vscsi_req *r = (struct vscsi_req *)breq;

	if (unlikely(breq->op == BLK_OP_DISCARD) && unmap_next(r, &ret))
		return;
	if (unlikely(ret < 0)) {
		r->v.error = ret;
		finish_check(r, ret == -ENOSPC ? SCSI_SENSE_DATA_PROTECT : SCSI_SENSE_MEDIUM_ERROR,
			     error_asc(r, ret));
	} else {
		r->v.error = 0;
		r->status = SCSI_STATUS_GOOD;
		respond(r, breq->op == BLK_OP_READ ? (uint32_t)breq->len : 0);
	}
	r->v.done(&r->v);
}

static int submit(struct vscsi_req *r, uint8_t op, uint32_t flags, uint64_t off, uint64_t len)
{
	struct blk_request *b = &r->v.breq;

	b->op = op;
	b->flags = flags;
	b->offset = off;
	b->len = len;
	b->cb = cmd_complete;
	b->opaque = r;
	return blk_submit(__atomic_load_n(&r->lun->bs, __ATOMIC_ACQUIRE), b);
}

/* The next UNMAP range that is not empty; 1 when none is left. */
static int submit_ext(struct vscsi_req *r)
{
	const struct scsi_extent *x;
	uint32_t bs = r->lun->lu.block_size;

	while (r->next_ext < r->next_ext_end && !r->ext[r->next_ext].nblocks)
		r->next_ext++;
	if (r->next_ext == r->next_ext_end)
		return 1;
	x = &r->ext[r->next_ext++];

	r->v.breq.iov = NULL;
	r->v.breq.iovcnt = 0;
	return submit(r, BLK_OP_DISCARD, 0, x->lba * bs, (uint64_t)x->nblocks * bs);
}

/* blk_submit() refused at once, or (1) there was nothing to submit: answer
 * now (done is not called). */
static enum vblk_submit_result refused(struct vscsi_req *r, int ret)
{
	if (ret == 1 || (ret == -ENOTSUP && r->v.breq.op == BLK_OP_DISCARD)) {
		r->status = SCSI_STATUS_GOOD;
		respond(r, 0);
		return VBLK_FINISHED;
	}
	r->v.error = ret;
	return finish_check(r, SCSI_SENSE_MEDIUM_ERROR, error_asc(r, ret));
}

static inline enum vblk_submit_result started(struct vscsi_req *r, int ret)
{
	return likely(ret == 0) ? VBLK_SUBMITTED : refused(r, ret);
}

static enum vblk_submit_result do_io(struct vscsi_req *r, const struct scsi_cmd *c,
				     uint32_t hdr_len)
{
	uint64_t bytes = (uint64_t)c->nblocks * r->lun->lu.block_size;
	uint64_t off = c->lba * r->lun->lu.block_size;
	bool reading = c->kind == SCSI_READ;
	unsigned n;
	int first;

	if (!bytes) {
		r->status = SCSI_STATUS_GOOD;
		respond(r, 0);
		return VBLK_FINISHED;
	}
	if (reading) {
		r->resid = (uint32_t)(r->v.in_len - r->resp_size - bytes);
		first = bytes > r->v.in_len - r->resp_size
				? -1
				: slice(r, r->v.nout, r->v.nin, r->resp_size, bytes, true, &n);
	} else {
		r->resid = (uint32_t)(r->v.out_len - hdr_len - bytes);
		first = bytes > r->v.out_len - hdr_len
				? -1
				: slice(r, 0, r->v.nout, hdr_len, bytes, false, &n);
	}
	if (first < 0) { /* the driver's buffer is smaller than the CDB says */
		r->resid = 0;
		return finish_response(r, VIRTIO_SCSI_S_OVERRUN);
	}
	r->v.breq.iov = r->v.iov + first;
	r->v.breq.iovcnt = (int)n;
	return started(r, submit(r, reading ? BLK_OP_READ : BLK_OP_WRITE,
				 c->fua && !reading ? BLK_F_FUA : 0, off, bytes));
}

/* WRITE SAME 16: zeroes only (what Linux and Windows send); the block of
 * data-out is checked, NDOB has none. */
static enum vblk_submit_result do_write_same(struct vscsi_req *r, const struct scsi_cmd *c,
					     uint32_t hdr_len)
{
	uint32_t bs = r->lun->lu.block_size;
	uint8_t blk[4096];

	if (!c->ndob) {
		if (r->v.out_len - hdr_len < bs)
			return finish_response(r, VIRTIO_SCSI_S_OVERRUN);
		iov_to_buf(r->v.iov, (int)r->v.nout, hdr_len, blk, bs);
		for (uint32_t i = 0; i < bs; i++)
			if (blk[i])
				return finish_check(r, SCSI_SENSE_ILLEGAL_REQUEST,
						    SCSI_ASC_INVALID_FIELD_CDB);
	}
	r->v.breq.iov = NULL;
	r->v.breq.iovcnt = 0;
	return started(r, submit(r, BLK_OP_WRITE_ZEROES,
				 (c->unmap && r->lun->lu.discard ? BLK_F_MAY_UNMAP : 0) |
					 (c->fua ? BLK_F_FUA : 0),
				 c->lba * bs, (uint64_t)c->nblocks * bs));
}

static enum vblk_submit_result do_unmap(struct vscsi_req *r, const struct scsi_cmd *c,
					uint32_t hdr_len)
{
	uint8_t p[UNMAP_PARAM_MAX];
	struct scsi_cmd err;
	int n;

	if (c->len > r->v.out_len - hdr_len)
		return finish_check(r, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_PARAM_LIST_LENGTH);
	iov_to_buf(r->v.iov, (int)r->v.nout, hdr_len, p, c->len < sizeof(p) ? c->len : sizeof(p));
	n = scsi_unmap_list(&r->lun->lu, p, c->len, r->ext, &err);
	if (n < 0)
		return finish_check(r, err.key, err.asc);
	r->next_ext = 0;
	r->next_ext_end = (unsigned)n;
	return started(r, submit_ext(r));
}

/* Emulated: data-in from buf, cut to the driver's buffer. */
static enum vblk_submit_result do_data(struct vscsi_req *r, const uint8_t *buf, uint32_t len)
{
	uint64_t room = r->v.in_len - r->resp_size;
	uint32_t n = len < room ? len : (uint32_t)room;

	iov_from_buf(r->v.iov + r->v.nout, (int)r->v.nin, r->resp_size, buf, n);
	r->resid = (uint32_t)(room - n);
	r->status = SCSI_STATUS_GOOD;
	respond(r, n);
	return VBLK_FINISHED;
}

/* REPORT LUNS' list, read from the table (a unit being added or removed
 * meanwhile is in it or not). */
static unsigned lun_list(struct vscsi_dev *d, uint16_t *luns)
{
	unsigned n = 0;

	for (unsigned i = 0; i < SCSI_MAX_LUNS; i++)
		if (atomic_load_explicit(&d->luns[i].present, memory_order_acquire))
			luns[n++] = (uint16_t)i;
	return n;
}

/* Emulated commands' data-in and REPORT LUNS' list: per thread, off the
 * stack of every READ and WRITE. */
static _Thread_local uint8_t emul_buf[SCSI_EMUL_MAX];
static _Thread_local uint16_t emul_luns[SCSI_MAX_LUNS];

/* Everything but READ and WRITE; out of line, so that their path does not
 * carry its frame. */
static enum vblk_submit_result __attribute__((noinline))
run(struct vscsi_req *r, const uint8_t *cdb, uint32_t cdb_size, uint32_t hdr_len)
{
	uint8_t *buf = emul_buf;
	uint16_t *luns = emul_luns;
	unsigned nluns = cdb[0] == 0xa0 ? lun_list(r->dev, luns) : 0; /* REPORT LUNS */
	struct scsi_cmd c;

	scsi_decode(r->lun ? &r->lun->lu : NULL, luns, nluns, cdb, cdb_size, buf, &c);
	switch (c.kind) {
	case SCSI_DATA:
		return do_data(r, buf, c.len);
	case SCSI_CHECK:
		return finish_check(r, c.key, c.asc);
	case SCSI_READ:
	case SCSI_WRITE:
		return do_io(r, &c, hdr_len);
	case SCSI_SYNC:
		r->v.breq.iov = NULL;
		r->v.breq.iovcnt = 0;
		return started(r, submit(r, BLK_OP_FLUSH, 0, 0, 0));
	case SCSI_WRITE_SAME:
		return do_write_same(r, &c, hdr_len);
	case SCSI_UNMAP:
		return do_unmap(r, &c, hdr_len);
	}
	return finish_check(r, SCSI_SENSE_HARDWARE_ERROR, SCSI_ASC_INTERNAL_TARGET_FAILURE);
}

enum vblk_submit_result vscsi_cmd_submit(struct vscsi_req *r)
{
	uint32_t cdb_size = atomic_load_explicit(&r->dev->cdb_size, memory_order_relaxed);
	uint32_t sense = atomic_load_explicit(&r->dev->sense_size, memory_order_relaxed);
	uint8_t hdr[HDR_FIXED + VSCSI_CDB_MAX];
	uint32_t hdr_len = HDR_FIXED + cdb_size;
	/* No command ioplane knows has a CDB longer than 16 bytes. */
	uint32_t cdb_used = cdb_size < 16 ? cdb_size : 16;
	struct scsi_cmd c;
	int lun;

	r->resp_size = RESP_FIXED + sense;
	/* Without the header and room for the response there is no answer. */
	if (r->v.out_len < hdr_len || r->v.in_len < r->resp_size)
		return VBLK_BROKEN;
	r->saved.iov_base = NULL;
	r->resid = 0;
	r->status = SCSI_STATUS_GOOD;
	r->response = VIRTIO_SCSI_S_OK;
	r->sense_len = 0;
	if (cdb_used == 16)
		chain_read(r->v.iov, r->v.nout, hdr, HDR_FIXED + 16);
	else
		chain_read(r->v.iov, r->v.nout, hdr, HDR_FIXED + cdb_used);
	lun = vscsi_lun_decode(hdr);
	if (lun < 0)
		return finish_response(r, VIRTIO_SCSI_S_BAD_TARGET);
	r->lun = vscsi_lun_get(r->dev, (unsigned)lun);
	/* READ and WRITE straight to the block layer. */
	if (scsi_decode_rw(r->lun ? &r->lun->lu : NULL, hdr + HDR_FIXED, cdb_used, &c)) {
		if (c.kind == SCSI_CHECK)
			return finish_check(r, c.key, c.asc);
		return do_io(r, &c, hdr_len);
	}
	return run(r, hdr + HDR_FIXED, cdb_used, hdr_len);
}
