/* raw format driver: the child's bytes as they are, optionally a window
 * (offset=, size=) of them. Requests pass straight through with the offset
 * moved by the window start.
 *
 * A raw image whose format was probed (x-probed=on, set by the tools that
 * probe) refuses, as QEMU does, a write that would give its first 512 bytes
 * another format's signature: the next probe would take the image for that
 * format, and a guest could then point a qcow2 backing file at any host file.
 *
 * Threading: the state is read-only after open; no per-request state. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-driver.h"
#include "util/compiler.h"
#include "util/iov.h"
#include "util/opts.h"

#define RAW_PROBE_BYTES 512

struct raw_state {
	uint64_t offset;
	bool window; /* offset or size restrict the child */
	bool fixed;  /* size= given: the window cannot grow */
	bool probed; /* x-probed=on: guard sector 0 */
};

static int raw_window(struct blk_node *bs, uint64_t off, uint64_t size, bool has_size, char *err,
		      size_t errlen)
{
	const struct blk_node *child = bs->next;
	uint64_t al = child->align;

	if (off > child->size) {
		/* QEMU's messages (blockdev-add), also its double space */
		snprintf(err, errlen,
			 "Offset (%llu) cannot be greater than size of the containing file (%llu)",
			 (unsigned long long)off, (unsigned long long)child->size);
		return -EINVAL;
	}
	if (!has_size)
		size = child->size - off;
	if (size > child->size - off) {
		snprintf(err, errlen,
			 "The sum of offset (%llu) and size (%llu) has to be smaller or equal to "
			 "the  actual size of the containing file (%llu)",
			 (unsigned long long)off, (unsigned long long)size,
			 (unsigned long long)child->size);
		return -EINVAL;
	}
	if ((off | (has_size ? size : 0)) & (al - 1)) {
		snprintf(err, errlen, "raw: offset and size must be multiples of %llu",
			 (unsigned long long)al);
		return -EINVAL;
	}
	bs->size = size;
	return 0;
}

/* Whole sectors only, so that the guard sees every byte of sector 0 a write
 * leaves behind (the core turns smaller writes into read-modify-write). */
static void raw_set_probed(struct blk_node *bs, struct raw_state *s)
{
	s->probed = true;
	if (bs->align < RAW_PROBE_BYTES)
		bs->align = RAW_PROBE_BYTES;
}

static int raw_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	struct raw_state *s;
	uint64_t off = 0, size = 0;
	bool has_size = kv_get(opts, "size") != NULL, probed = false;
	int ret;

	if (kv_get_size(opts, "offset", &off) || kv_get_size(opts, "size", &size) ||
	    kv_get_bool(opts, "x-probed", &probed)) {
		snprintf(err, errlen, "raw: bad offset, size or x-probed");
		return -EINVAL;
	}
	ret = raw_window(bs, off, size, has_size, err, errlen);
	if (ret)
		return ret;
	s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	s->offset = off;
	s->window = off != 0 || bs->size != bs->next->size;
	s->fixed = has_size;
	bs->opaque = s;
	bs->align = bs->next->align;
	bs->mem_align = bs->next->mem_align;
	bs->max_transfer = bs->next->max_transfer;
	if (probed)
		raw_set_probed(bs, s);
	return 0;
}

static void raw_close(struct blk_node *bs)
{
	free(bs->opaque);
	bs->opaque = NULL;
}

/* The first sector as the write leaves it: the request covers it whole. */
static int raw_check_sector0(const struct blk_request *req)
{
	uint8_t buf[RAW_PROBE_BYTES];

	if (req->len < RAW_PROBE_BYTES ||
	    iov_to_buf(req->iov, req->iovcnt, 0, buf, sizeof(buf)) != sizeof(buf))
		return -EPERM; /* alignment makes this impossible; refuse, never guess */
	if (strcmp(blk_probe_buf(buf, sizeof(buf), NULL, 0, NULL), "raw"))
		return -EPERM;
	return 0;
}

static int raw_submit(struct blk_node *bs, struct blk_request *req)
{
	const struct raw_state *s = bs->opaque;

	if (unlikely(s->probed) && req->op == BLK_OP_WRITE && req->offset < RAW_PROBE_BYTES) {
		int ret = raw_check_sector0(req);

		if (ret)
			return ret;
	}
	if (!s->offset)
		return blk_forward(bs, req);
	return blk_forward_shift(bs, req, s->offset);
}

/* As QEMU's raw: a window with a size cannot grow or shrink; one with only
 * an offset takes the child along (offset + size). */
static int raw_truncate(struct blk_node *bs, uint64_t size)
{
	const struct raw_state *s = bs->opaque;
	int ret;

	if (s->fixed || size > UINT64_MAX - s->offset)
		return -ENOTSUP;
	ret = blk_truncate(bs->next, s->offset + size);
	if (ret == 0)
		bs->size = bs->next->size - s->offset;
	return ret;
}

static bool raw_can_discard(struct blk_node *bs)
{
	return bs->next->has_discard;
}
static bool raw_can_write_zeroes(struct blk_node *bs)
{
	return bs->next->has_write_zeroes;
}
static bool raw_can_fua(struct blk_node *bs)
{
	return bs->next->has_fua;
}
static bool raw_can_block_status(struct blk_node *bs)
{
	return bs->next->has_block_status;
}
static bool raw_can_multi_conn(struct blk_node *bs)
{
	return blk_can_multi_conn(bs->next);
}

/* The whole child passes permissions through; a window is guest data in a
 * part of the file, which must keep its size (QEMU's data role, without
 * the write and resize the users do not need). */
static unsigned raw_child_perms(struct blk_node *bs, uint32_t perm, uint32_t shared,
				struct blk_perm_req *out)
{
	const struct raw_state *s = bs->opaque;
	const uint32_t wr = BLK_PERM_WRITE | BLK_PERM_RESIZE;

	out[0] = (struct blk_perm_req){bs->next, perm, shared};
	if (s && s->window) {
		blk_perm_storage(bs, false, true, perm, shared, &out[0]);
		out[0].perm = (out[0].perm & ~wr) | (perm & wr);
	}
	return 1;
}

const struct blk_driver blk_drv_raw = {
	.name = "raw",
	.is_format = true,
	.open = raw_open,
	.close = raw_close,
	.submit = raw_submit,
	.truncate = raw_truncate,
	.can_discard = raw_can_discard,
	.can_write_zeroes = raw_can_write_zeroes,
	.can_fua = raw_can_fua,
	.can_block_status = raw_can_block_status,
	.can_multi_conn = raw_can_multi_conn,
	.child_perms = raw_child_perms,
};
