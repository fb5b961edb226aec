/* libFuzzer target for virtqueue processing over fuzzed guest memory: the
 * input is a ring configuration byte pair followed by the guest memory
 * itself (descriptor table, rings, indirect tables, request headers) and an
 * optional inflight area. Every chain the ring offers is walked and handed
 * to the virtio-blk handler on a null image; completions go to the used ring.
 * Seeds: tests/fuzz/corpus-vring/ (gen-vhost-corpus.py).
 *
 * Input: [0] log2 of the queue size (mod 5: 1..16 entries), [1] flags (bit 0
 * EVENT_IDX, bit 1 INDIRECT_DESC, bit 2 inflight area, bit 3 read-only disk,
 * bit 4 packed ring, bits 5-7 its first avail and used slot, wrap 1), then
 * FUZZ_MEM bytes of guest memory (guest address 0, two regions that meet at
 * FUZZ_SPLIT; split: desc at 0, avail at 0x400, used at 0x800; packed:
 * descriptors at 0, driver area at 0x400, device area at 0x800), then the
 * inflight area. Short inputs are zero-padded.
 * Threading: single-threaded; the loop and image are made once and kept. */
#include <stdlib.h>
#include <string.h>

#include "block/block.h"
#include "export/virtio-blk.h"
#include "export/vring.h"
#define FUZZ_NULL_IMAGE
#include "fuzz.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/opts.h"

#define FUZZ_MEM 0x4000u
#define FUZZ_SPLIT 0x3000u /* where the second memory region starts */
#define MAX_CHAINS 64

struct freq {
	struct vblk_req r; /* first */
	struct iovec iov[VBLK_MAX_IOV];
	uint16_t head;
	bool done;
};

static struct loop *fz_loop;
static struct blk_node *fz_bs;

static void fz_done(struct vblk_req *r)
{
	((struct freq *)r)->done = true;
}

/* One chain: parse, run to completion, put it on the used ring. */
static void fz_chain(struct vring *vr, struct vblk_dev *d, struct freq *q,
		     const struct vring_chain *c)
{
	enum vblk_submit_result ret;
	int i;

	memset(&q->r, 0, sizeof(q->r));
	q->r.dev = d;
	q->r.iov = q->iov;
	q->r.nout = c->nout;
	q->r.nin = c->nin;
	q->r.out_len = c->out_len;
	q->r.in_len = c->in_len;
	q->r.done = fz_done;
	q->done = false;
	ret = vblk_req_submit(&q->r);
	for (i = 0; ret == VBLK_SUBMITTED && !q->done && i < 1000; i++)
		loop_run_once(fz_loop, false);
	if (ret != VBLK_BROKEN)
		vring_push(vr, c->head, q->r.used_len);
}

static void fz_run(struct vring *vr, struct vblk_dev *d)
{
	static struct freq q;
	struct vring_chain c = {.iov = q.iov, .max_iov = VBLK_MAX_IOV};
	uint16_t heads[16];
	unsigned i, n;

	n = vring_inflight_heads(vr, heads, 16);
	for (i = 0; i < n; i++)
		if (vring_walk(vr, heads[i], &c) == 0)
			fz_chain(vr, d, &q, &c);
	for (i = 0; i < MAX_CHAINS && vring_pop(vr, &c) == VRING_POP_CHAIN; i++) {
		fz_chain(vr, d, &q, &c);
		if (i % 4 == 3)
			vring_flush(vr);
	}
	vring_flush(vr);
	vring_enable_notify(vr);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static uint8_t *mem, *infl;
	struct vblk_dev_opts o = {.writable = true, .num_queues = 1, .serial = "fuzz"};
	struct vring_mem m = {.nregions = 2};
	struct vring vr = {0};
	struct vblk_dev d;
	char err[64];
	size_t n;

	if (!fz_loop && fuzz_null_image(&fz_loop, &fz_bs) < 0)
		return 0;
	if (!mem) {
		mem = aligned_alloc(4096, FUZZ_MEM);
		infl = aligned_alloc(64, (size_t)vring_inflight_size(16));
		if (!mem || !infl)
			return 0;
	}
	if (size < 2)
		return 0;
	memset(mem, 0, FUZZ_MEM);
	n = size - 2 < FUZZ_MEM ? size - 2 : FUZZ_MEM;
	memcpy(mem, data + 2, n);
	m.r[0] = (struct vring_region){.gpa = 0, .uva = 0, .size = FUZZ_SPLIT, .host = mem};
	m.r[1] = (struct vring_region){.gpa = FUZZ_SPLIT, .uva = FUZZ_SPLIT,
				       .size = FUZZ_MEM - FUZZ_SPLIT, .host = mem + FUZZ_SPLIT};
	vr.num = (uint16_t)(1u << (data[0] % 5));
	if (data[1] & 0x10) {
		vr.packed = true;
		vr.pdesc = (struct vring_packed_desc *)mem;
		vr.driver_event = (struct vring_packed_event *)(mem + 0x400);
		vr.device_event = (struct vring_packed_event *)(mem + 0x800);
		vring_set_base(&vr, (((data[1] >> 5) & (vr.num - 1u)) | VRING_PACKED_WRAP) * 0x10001u);
	} else {
		vr.desc = (struct vring_desc *)mem;
		vr.avail = (struct vring_avail *)(mem + 0x400);
		vr.used = (struct vring_used *)(mem + 0x800);
	}
	vr.mem = &m;
	vr.event_idx = data[1] & 1;
	vr.indirect = data[1] & 2;
	if (data[1] & 4) {
		size_t isz = (size_t)vring_inflight_size(vr.num), rest = size - 2 - n;

		memset(infl, 0, isz);
		memcpy(infl, data + 2 + n, rest < isz ? rest : isz);
		vr.inflight = (struct vring_inflight *)infl;
	}
	o.writable = !(data[1] & 8);
	if (vblk_dev_init(&d, fz_bs, &o, err, sizeof(err)) == 0 && vring_start(&vr) == 0)
		fz_run(&vr, &d);
	return 0;
}
