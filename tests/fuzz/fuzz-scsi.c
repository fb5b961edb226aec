/* libFuzzer target for SCSI command handling: the CDB decoder (scsi.c), the
 * UNMAP parameter list, and whole virtio-scsi chains (virtio-scsi.c) of the
 * control, event and request queues, cut into iovecs where the input says,
 * run on a null image until they complete. Checks that an answer never
 * claims more bytes than the chain can take.
 * Seeds: tests/fuzz/corpus-scsi/ (gen-scsi-corpus.py).
 *
 * Input: [0] flags (bit 0 read-only, 1 write cache, 2 discard, 3 4096-byte
 * blocks, 4 no LUN 0), [1] queue (mod 3: control, event, request), [2] low
 * nibble: readable iovecs - 1 (mod 8), high: writable - 1 (mod 8), [3..18]
 * the iovec lengths (n * 16 + 1), then the chain's bytes from the start of
 * the first readable iovec (header, CDB at 19, data-out). Short inputs are
 * zero-padded. Threading: single-threaded; the loop and image are kept. */
#include <stdlib.h>
#include <string.h>

#include "block/block.h"
#include "export/scsi.h"
#include "export/virtio-scsi.h"
#define FUZZ_NULL_IMAGE
#include "fuzz.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/opts.h"

#define FZ_BUF (64u << 10)
#define FZ_HDR 19

static struct loop *fz_loop;
static struct blk_node *fz_bs;
static struct vscsi_dev fz_dev;
static struct vscsi_req fz_req;
static struct iovec fz_iov[16];
static uint8_t fz_buf[FZ_BUF];
static bool fz_done_flag;

static void fz_done(struct vblk_req *r)
{
	(void)r;
	fz_done_flag = true;
}

/* The decoder alone, on the CDB bytes and the rest as UNMAP parameters. */
static void fz_decode(uint8_t flags, const uint8_t *p, size_t len)
{
	static uint8_t out[SCSI_EMUL_MAX];
	struct scsi_lu lu = {.blocks = 128,
			     .block_size = flags & 8 ? 4096 : 512,
			     .read_only = flags & 1,
			     .write_cache = flags & 2,
			     .discard = flags & 4,
			     .serial = "fuzz"};
	uint16_t luns[] = {0, 1, 300};
	struct scsi_extent x[SCSI_UNMAP_MAX];
	struct scsi_cmd c;
	size_t cdb = len < 32 ? len : 32;

	scsi_decode(flags & 16 ? NULL : &lu, luns, 3, p, cdb, out, &c);
	if (c.kind == SCSI_DATA && c.len > SCSI_EMUL_MAX)
		abort();
	if ((c.kind == SCSI_READ || c.kind == SCSI_WRITE) && c.lba + c.nblocks > lu.blocks)
		abort();
	scsi_unmap_list(&lu, p + cdb, len - cdb, x, &c);
}

/* Cut fz_buf into iovecs as the input says; the lengths of each part. */
static void fz_chain(const uint8_t *data)
{
	unsigned nout = (data[2] & 7) + 1, nin = (data[2] >> 4 & 7) + 1, i;
	size_t off = 0;

	memset(&fz_req, 0, sizeof(fz_req));
	for (i = 0; i < nout + nin; i++) {
		size_t l = (size_t)data[3 + i] * 16 + 1;

		fz_iov[i] = (struct iovec){fz_buf + off, l};
		off += l;
		if (i < nout)
			fz_req.v.out_len += l;
		else
			fz_req.v.in_len += l;
	}
	fz_req.v.iov = fz_iov;
	fz_req.v.nout = nout;
	fz_req.v.nin = nin;
	fz_req.v.done = fz_done;
	fz_req.dev = &fz_dev;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t in[3 + 16] = {0};
	enum vblk_submit_result ret;
	uint64_t in_len;
	int i;

	if (!fz_loop && fuzz_null_image(&fz_loop, &fz_bs) < 0)
		return 0;
	memcpy(in, data, size < sizeof(in) ? size : sizeof(in));
	memset(fz_buf, 0, FZ_BUF);
	if (size > sizeof(in))
		memcpy(fz_buf, data + sizeof(in), size - sizeof(in) < FZ_BUF ? size - sizeof(in)
									: FZ_BUF);
	if (size > sizeof(in) + FZ_HDR)
		fz_decode(in[0], data + sizeof(in) + FZ_HDR, size - sizeof(in) - FZ_HDR);
	vscsi_dev_init(&fz_dev, 1, !(in[0] & 1), in[0] & 2);
	if (!(in[0] & 16))
		vscsi_lun_add(&fz_dev, 0, fz_bs, "fuzz");
	fz_chain(in);
	in_len = fz_req.v.in_len;
	fz_done_flag = false;
	ret = vscsi_req_submit(&fz_req, in[1] % 3);
	if (in[1] % 3 == VSCSI_EVENT_Q && ret == VBLK_SUBMITTED) {
		vscsi_event_post(&fz_dev, VIRTIO_SCSI_T_TRANSPORT_RESET, 0, 1);
		vscsi_events_deliver(&fz_dev);
		vscsi_events_flush(&fz_dev);
	}
	for (i = 0; ret == VBLK_SUBMITTED && !fz_done_flag && i < 1000; i++) {
		loop_run_once(fz_loop, false);
		if (in[1] % 3 == VSCSI_CTRL_Q && vscsi_tmf_retry(&fz_req))
			break;
	}
	if (ret != VBLK_BROKEN && fz_req.v.used_len > in_len)
		abort(); /* more than the driver gave room for */
	if (!(in[0] & 16)) {
		vscsi_lun_remove(&fz_dev, 0);
		vscsi_lun_release(&fz_dev, 0);
	}
	vscsi_dev_destroy(&fz_dev);
	return 0;
}
