/* Unit tests for the device side of split virtqueues (vring.c) and the
 * virtio-blk request handler (virtio-blk.c): hostile descriptor chains
 * (loops, addresses outside guest memory, too long, indirect misuse, bad
 * placement of header and status), overflow-safe sector math, used ring and
 * EVENT_IDX decisions, and inflight tracking and recovery. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "block/block.h"
#include "export/virtio-blk.h"
#include "export/vring.h"
#include "loop/loop.h"
#include "util/opts.h"

#define GPA_BASE 0x100000ull /* guest address of our memory: not 0, to catch mix-ups */
#define MEM_SIZE (1u << 20)
#define NUM 16
#define DESC_OFF 0x0
#define AVAIL_OFF 0x1000
#define USED_OFF 0x2000
#define DATA_OFF 0x10000

struct fx {
	uint8_t *mem;
	struct vring_mem m;
	struct vring vr;
	struct iovec iov[8];
	struct vring_chain c;
	struct vring_inflight *inflight;
};

static struct fx *fx_new(void)
{
	struct fx *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	f->mem = aligned_alloc(4096, MEM_SIZE);
	assert_non_null(f->mem);
	memset(f->mem, 0, MEM_SIZE);
	f->m.nregions = 1;
	f->m.r[0] = (struct vring_region){
		.gpa = GPA_BASE, .uva = 0x7000000, .size = MEM_SIZE, .host = f->mem};
	f->vr.num = NUM;
	f->vr.desc = (struct vring_desc *)(f->mem + DESC_OFF);
	f->vr.avail = (struct vring_avail *)(f->mem + AVAIL_OFF);
	f->vr.used = (struct vring_used *)(f->mem + USED_OFF);
	f->vr.mem = &f->m;
	f->c.iov = f->iov;
	f->c.max_iov = 8;
	return f;
}

static int setup(void **state)
{
	*state = fx_new();
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	free(f->inflight);
	free(f->mem);
	free(f);
	return 0;
}

static void set_desc(struct fx *f, unsigned i, uint64_t gpa, uint32_t len, uint16_t flags,
		     uint16_t next)
{
	f->vr.desc[i] = (struct vring_desc){gpa, len, flags, next};
}

/* Make head available as the next avail entry. */
static void offer(struct fx *f, uint16_t head)
{
	uint16_t idx = f->vr.avail->idx;

	f->vr.avail->ring[idx % NUM] = head;
	f->vr.avail->idx = (uint16_t)(idx + 1);
}

/* vring_pop() as 1 (a chain taken), 0 (none) or the -errno of a broken one. */
static int pop(struct fx *f)
{
	switch (vring_pop(&f->vr, &f->c)) {
	case VRING_POP_CHAIN:
		return 1;
	case VRING_POP_EMPTY:
		return 0;
	case VRING_POP_BROKEN:
		assert_true(f->c.err < 0);
		return f->c.err;
	}
	fail();
	return 0;
}

/* ---- chain walking ------------------------------------------------------------------ */

static void test_valid_chain(void **state)
{
	struct fx *f = *state;

	assert_int_equal(vring_start(&f->vr), 0);
	set_desc(f, 0, GPA_BASE + DATA_OFF, 16, VRING_DESC_F_NEXT, 1);
	set_desc(f, 1, GPA_BASE + DATA_OFF + 512, 512, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 2);
	set_desc(f, 2, GPA_BASE + DATA_OFF + 4096, 1, VRING_DESC_F_WRITE, 0);
	offer(f, 0);
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.head, 0);
	assert_int_equal(f->c.nout, 1);
	assert_int_equal(f->c.nin, 2);
	assert_int_equal(f->c.out_len, 16);
	assert_int_equal(f->c.in_len, 513);
	assert_ptr_equal(f->iov[0].iov_base, f->mem + DATA_OFF);
	assert_ptr_equal(f->iov[2].iov_base, f->mem + DATA_OFF + 4096);
	assert_int_equal(pop(f), 0); /* nothing more */
}

static void test_loop(void **state)
{
	struct fx *f = *state;

	assert_int_equal(vring_start(&f->vr), 0);
	set_desc(f, 0, GPA_BASE + DATA_OFF, 16, VRING_DESC_F_NEXT, 1);
	set_desc(f, 1, GPA_BASE + DATA_OFF, 0, VRING_DESC_F_NEXT, 2);
	set_desc(f, 2, GPA_BASE + DATA_OFF, 0, VRING_DESC_F_NEXT, 1); /* back to 1 */
	offer(f, 0);
	assert_int_equal(pop(f), -ELOOP);
	/* With data in the loop, the iovec limit may trip first: still refused. */
	set_desc(f, 2, GPA_BASE + DATA_OFF, 8, VRING_DESC_F_NEXT, 0);
	assert_true(pop(f) < 0);
	assert_int_equal(f->vr.last_avail, 0);
}

/* A loop of zero-length descriptors uses no iovecs: only the count stops it. */
static void test_loop_zero_len(void **state)
{
	struct fx *f = *state;

	assert_int_equal(vring_start(&f->vr), 0);
	set_desc(f, 3, 0, 0, VRING_DESC_F_NEXT, 4);
	set_desc(f, 4, 0, 0, VRING_DESC_F_NEXT, 3);
	offer(f, 3);
	assert_int_equal(pop(f), -ELOOP);
}

static void test_out_of_region(void **state)
{
	struct fx *f = *state;

	assert_int_equal(vring_start(&f->vr), 0);
	set_desc(f, 0, GPA_BASE - 4096, 16, 0, 0); /* below */
	offer(f, 0);
	assert_int_equal(pop(f), -EFAULT);
	f->vr.last_avail = 0;
	set_desc(f, 0, GPA_BASE + MEM_SIZE - 8, 16, 0, 0); /* runs past the end */
	assert_int_equal(pop(f), -EFAULT);
	set_desc(f, 0, UINT64_MAX - 4, 16, 0, 0); /* wraps */
	assert_int_equal(pop(f), -EFAULT);
}

static void test_bad_next_and_head(void **state)
{
	struct fx *f = *state;

	assert_int_equal(vring_start(&f->vr), 0);
	set_desc(f, 0, GPA_BASE + DATA_OFF, 16, VRING_DESC_F_NEXT, NUM); /* next past table */
	offer(f, 0);
	assert_int_equal(pop(f), -EINVAL);
	f->vr.avail->ring[0] = NUM + 3; /* head past table */
	assert_int_equal(pop(f), -EINVAL);
}

static void test_avail_idx_jump(void **state)
{
	struct fx *f = *state;

	assert_int_equal(vring_start(&f->vr), 0);
	f->vr.avail->idx = NUM + 1; /* more chains than the ring holds */
	assert_int_equal(pop(f), -EINVAL);
}

static void test_too_many_segments(void **state)
{
	struct fx *f = *state;
	unsigned i;

	assert_int_equal(vring_start(&f->vr), 0);
	for (i = 0; i < 10; i++)
		set_desc(f, i, GPA_BASE + DATA_OFF + i * 512, 512, i < 9 ? VRING_DESC_F_NEXT : 0,
			 (uint16_t)(i + 1));
	offer(f, 0);
	assert_int_equal(pop(f), -E2BIG); /* 10 buffers, room for 8 */
}

static void test_readable_after_writable(void **state)
{
	struct fx *f = *state;

	assert_int_equal(vring_start(&f->vr), 0);
	set_desc(f, 0, GPA_BASE + DATA_OFF, 16, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE, 1);
	set_desc(f, 1, GPA_BASE + DATA_OFF + 16, 16, 0, 0);
	offer(f, 0);
	assert_int_equal(pop(f), -EINVAL);
}

static void test_region_split(void **state)
{
	struct fx *f = *state;

	/* Two regions, contiguous in guest space, apart in host memory. */
	f->m.r[0].size = MEM_SIZE / 2;
	f->m.r[1] = (struct vring_region){.gpa = GPA_BASE + MEM_SIZE / 2,
					  .uva = 0x9000000,
					  .size = MEM_SIZE / 2,
					  .host = f->mem + MEM_SIZE / 2};
	f->m.nregions = 2;
	assert_int_equal(vring_start(&f->vr), 0);
	set_desc(f, 0, GPA_BASE + MEM_SIZE / 2 - 100, 200, 0, 0);
	offer(f, 0);
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.nout, 2);
	assert_int_equal(f->iov[0].iov_len, 100);
	assert_int_equal(f->iov[1].iov_len, 100);
}

/* ---- indirect descriptors ------------------------------------------------------------ */

static struct vring_desc *indirect_table(struct fx *f)
{
	return (struct vring_desc *)(f->mem + 0x8000);
}

static void test_indirect(void **state)
{
	struct fx *f = *state;
	struct vring_desc *t = indirect_table(f);

	f->vr.indirect = true;
	assert_int_equal(vring_start(&f->vr), 0);
	t[0] = (struct vring_desc){GPA_BASE + DATA_OFF, 16, VRING_DESC_F_NEXT, 1};
	t[1] = (struct vring_desc){GPA_BASE + DATA_OFF + 16, 1, VRING_DESC_F_WRITE, 0};
	set_desc(f, 5, GPA_BASE + 0x8000, 2 * sizeof(*t), VRING_DESC_F_INDIRECT, 0);
	offer(f, 5);
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.head, 5);
	assert_int_equal(f->c.nout, 1);
	assert_int_equal(f->c.nin, 1);
}

static void test_indirect_rules(void **state)
{
	struct fx *f = *state;
	struct vring_desc *t = indirect_table(f);

	assert_int_equal(vring_start(&f->vr), 0);
	t[0] = (struct vring_desc){GPA_BASE + DATA_OFF, 16, 0, 0};
	set_desc(f, 0, GPA_BASE + 0x8000, sizeof(*t), VRING_DESC_F_INDIRECT, 0);
	offer(f, 0);
	assert_int_equal(pop(f), -EINVAL); /* not negotiated */
	f->vr.indirect = true;
	set_desc(f, 0, GPA_BASE + 0x8000, sizeof(*t), VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT, 1);
	assert_int_equal(pop(f), -EINVAL); /* INDIRECT with NEXT */
	set_desc(f, 0, GPA_BASE + 0x8000, 24, VRING_DESC_F_INDIRECT, 0);
	assert_int_equal(pop(f), -EINVAL); /* not a multiple of 16 */
	set_desc(f, 0, GPA_BASE + 0x8000, 0, VRING_DESC_F_INDIRECT, 0);
	assert_int_equal(pop(f), -EINVAL); /* empty */
	set_desc(f, 0, GPA_BASE + MEM_SIZE - 16, 32, VRING_DESC_F_INDIRECT, 0);
	assert_int_equal(pop(f), -EFAULT); /* table outside memory */
	t[0] = (struct vring_desc){GPA_BASE + 0x8000, 16, VRING_DESC_F_INDIRECT, 0};
	set_desc(f, 0, GPA_BASE + 0x8000, sizeof(*t), VRING_DESC_F_INDIRECT, 0);
	assert_int_equal(pop(f), -EINVAL); /* indirect in indirect */
	t[0] = (struct vring_desc){GPA_BASE + DATA_OFF, 16, VRING_DESC_F_NEXT, 0};
	assert_int_equal(pop(f), -ELOOP); /* loop inside the table */
	t[0] = (struct vring_desc){GPA_BASE + DATA_OFF, 16, VRING_DESC_F_NEXT, 7};
	assert_int_equal(pop(f), -EINVAL); /* next past the table */
	set_desc(f, 0, GPA_BASE + DATA_OFF, 16, VRING_DESC_F_NEXT, 1);
	set_desc(f, 1, GPA_BASE + 0x8000, sizeof(*t), VRING_DESC_F_INDIRECT, 0);
	assert_int_equal(pop(f), -EINVAL);     /* indirect not at the head */
	assert_int_equal(f->vr.last_avail, 0); /* nothing was taken */
}

/* ---- used ring and notifications -------------------------------------------------------- */

static void test_used_and_notify(void **state)
{
	struct fx *f = *state;
	uint16_t *used_event = &f->vr.avail->ring[NUM];

	assert_int_equal(vring_start(&f->vr), 0);
	vring_push(&f->vr, 3, 100);
	assert_int_equal(f->vr.used->idx, 0); /* not visible before the flush */
	assert_true(vring_flush(&f->vr));
	assert_int_equal(f->vr.used->idx, 1);
	assert_int_equal(f->vr.used->ring[0].id, 3);
	assert_int_equal(f->vr.used->ring[0].len, 100);
	assert_false(vring_flush(&f->vr)); /* nothing new: no notification */
	f->vr.avail->flags = VRING_AVAIL_F_NO_INTERRUPT;
	vring_push(&f->vr, 4, 1);
	assert_false(vring_flush(&f->vr));

	/* EVENT_IDX: notify only when used_event is crossed. */
	f->vr.event_idx = true;
	f->vr.avail->flags = 0;
	assert_int_equal(vring_start(&f->vr), 0);
	*used_event = 5;
	vring_push(&f->vr, 1, 1);
	assert_true(vring_flush(&f->vr)); /* the first decision always notifies */
	vring_push(&f->vr, 2, 1);
	assert_false(vring_flush(&f->vr)); /* used 3 -> 4: event 5 not crossed */
	vring_push(&f->vr, 3, 1);
	vring_push(&f->vr, 5, 1);
	assert_true(vring_flush(&f->vr)); /* 4 -> 6 crosses 5 */
}

/* ---- dirty log ------------------------------------------------------------------------ */

static bool logged(const uint8_t *log, uint64_t page)
{
	return log[page / 8] & (1u << (page % 8));
}

static unsigned logged_count(const uint8_t *log, size_t size)
{
	unsigned n = 0;
	size_t i;

	for (i = 0; i < size * 8; i++)
		n += logged(log, i);
	return n;
}

static void test_dirty_log(void **state)
{
	struct fx *f = *state;
	uint8_t log[64] = {0}; /* 512 pages: 2 MiB of guest memory */
	uint64_t used_gpa = GPA_BASE + USED_OFF;
	struct iovec iov;

	/* No log: nothing is touched (and nothing crashes). */
	vring_log_gpa(&f->vr, GPA_BASE, 4096);
	f->vr.log = log;
	f->vr.log_size = sizeof(log);
	vring_log_gpa(&f->vr, 8191, 2); /* straddles pages 1 and 2 */
	assert_true(logged(log, 1) && logged(log, 2));
	assert_int_equal(logged_count(log, sizeof(log)), 2);
	vring_log_gpa(&f->vr, 511 * 4096, 3 * 4096); /* runs past the log: clipped */
	assert_true(logged(log, 511));
	vring_log_gpa(&f->vr, UINT64_MAX - 10, 100); /* wraps: ignored */
	vring_log_gpa(&f->vr, 100 * 4096, 0);        /* empty */
	assert_int_equal(logged_count(log, sizeof(log)), 3);

	/* Host addresses back to guest pages, through the region they are in. */
	memset(log, 0, sizeof(log));
	iov = (struct iovec){f->mem + DATA_OFF + 4000, 200};
	vring_log_iov(&f->vr, &iov, 1);
	assert_true(logged(log, (GPA_BASE + DATA_OFF) / 4096));
	assert_true(logged(log, (GPA_BASE + DATA_OFF) / 4096 + 1));
	assert_int_equal(logged_count(log, sizeof(log)), 2);

	/* The used ring, on flush and on notification changes, when asked to. */
	memset(log, 0, sizeof(log));
	assert_int_equal(vring_start(&f->vr), 0);
	vring_push(&f->vr, 0, 1);
	assert_true(vring_flush(&f->vr));
	assert_int_equal(logged_count(log, sizeof(log)), 0); /* no VHOST_VRING_F_LOG */
	f->vr.log_used = true;
	f->vr.log_used_gpa = used_gpa;
	vring_push(&f->vr, 1, 1);
	vring_flush(&f->vr);
	assert_true(logged(log, used_gpa / 4096));
	memset(log, 0, sizeof(log));
	vring_disable_notify(&f->vr);
	assert_true(logged(log, used_gpa / 4096));
}

static void test_kick_suppression(void **state)
{
	struct fx *f = *state;
	uint16_t *avail_event = (uint16_t *)&f->vr.used->ring[NUM];

	assert_int_equal(vring_start(&f->vr), 0);
	vring_disable_notify(&f->vr);
	assert_int_equal(f->vr.used->flags, VRING_USED_F_NO_NOTIFY);
	assert_false(vring_enable_notify(&f->vr));
	assert_int_equal(f->vr.used->flags, 0);
	offer(f, 0);
	vring_disable_notify(&f->vr);
	assert_true(vring_enable_notify(&f->vr)); /* a chain arrived meanwhile */

	f->vr.event_idx = true;
	assert_int_equal(vring_start(&f->vr), 0);
	f->vr.last_avail = 1;
	assert_false(vring_enable_notify(&f->vr));
	assert_int_equal(*avail_event, 1);
}

/* ---- inflight tracking ----------------------------------------------------------------- */

static struct vring_inflight *make_inflight(struct fx *f)
{
	f->inflight = calloc(1, vring_inflight_size(NUM));
	assert_non_null(f->inflight);
	f->vr.inflight = f->inflight;
	return f->inflight;
}

static void test_inflight_track(void **state)
{
	struct fx *f = *state;
	struct vring_inflight *in = make_inflight(f);

	assert_int_equal(vring_start(&f->vr), 0);
	assert_int_equal(in->version, 1);
	assert_int_equal(in->desc_num, NUM);
	set_desc(f, 2, GPA_BASE + DATA_OFF, 16, 0, 0);
	set_desc(f, 6, GPA_BASE + DATA_OFF, 16, 0, 0);
	offer(f, 2);
	offer(f, 6);
	assert_int_equal(pop(f), 1);
	assert_int_equal(pop(f), 1);
	assert_int_equal(in->desc[2].inflight, 1);
	assert_int_equal(in->desc[6].inflight, 1);
	assert_true(in->desc[2].counter < in->desc[6].counter);
	vring_push(&f->vr, 6, 1);
	vring_flush(&f->vr);
	assert_int_equal(in->desc[6].inflight, 0);
	assert_int_equal(in->desc[2].inflight, 1);
	assert_int_equal(in->used_idx, 1);
}

/* A back-end died between publishing a batch and clearing its flags: the
 * restart must not run those requests again, and must run the others in
 * the order they were taken. */
static void test_inflight_recover(void **state)
{
	struct fx *f = *state;
	struct vring_inflight *in = make_inflight(f);
	uint16_t heads[NUM];

	in->version = 1;
	in->desc_num = NUM;
	in->desc[9] = (struct vring_inflight_desc){.inflight = 1, .counter = 30};
	in->desc[4] = (struct vring_inflight_desc){.inflight = 1, .counter = 10};
	in->desc[7] = (struct vring_inflight_desc){.inflight = 1, .counter = 20};
	in->desc[1] = (struct vring_inflight_desc){.inflight = 1, .counter = 5, .next = 9};
	in->last_batch_head = 1; /* batch {1} published: used idx 3, region says 2 */
	in->used_idx = 2;
	f->vr.used->idx = 3;
	f->vr.last_avail = 0; /* what a front-end sends after a crash is not trusted */
	assert_int_equal(vring_start(&f->vr), 0);
	assert_int_equal(in->desc[1].inflight, 0);
	assert_int_equal(in->used_idx, 3);
	assert_int_equal(f->vr.inuse, 3);
	assert_int_equal(f->vr.last_avail, 6);
	assert_int_equal(vring_inflight_heads(&f->vr, heads, NUM), 3);
	assert_int_equal(heads[0], 4);
	assert_int_equal(heads[1], 7);
	assert_int_equal(heads[2], 9);
	assert_true(f->vr.counter > 30);
}

static void test_inflight_hostile(void **state)
{
	struct fx *f = *state;
	struct vring_inflight *in = make_inflight(f);

	in->version = 1;
	in->desc_num = NUM + 1; /* not this ring's size */
	assert_int_equal(vring_start(&f->vr), -EINVAL);
	in->desc_num = NUM;
	in->last_batch_head = 0xffff; /* garbage list: must not be followed */
	in->used_idx = 0;
	f->vr.used->idx = 0x8000;
	in->desc[0].next = 0xfff0;
	assert_int_equal(vring_start(&f->vr), 0);
}

/* ---- virtio-blk requests ------------------------------------------------------------------ */

struct blkfx {
	struct loop *loop;
	struct blk_node *bs;
	struct vblk_dev dev;
	uint8_t buf[8192];
	struct iovec iov[4];
	struct vblk_req r;
	int done;
};

static void blk_done(struct vblk_req *r)
{
	struct blkfx *b = (struct blkfx *)((char *)r - offsetof(struct blkfx, r));

	b->done++;
}

static int blk_setup(void **state)
{
	struct blkfx *b = calloc(1, sizeof(*b));
	struct vblk_dev_opts o = {.writable = true, .serial = "ioplane-serial", .num_queues = 1};
	struct kv_opts kv = {0};
	char err[128];

	assert_non_null(b);
	assert_int_equal(loop_new(NULL, &b->loop), 0);
	loop_bind_current(b->loop);
	assert_int_equal(kv_parse(&kv, "driver=null,size=1M,read-zeroes=on", NULL), 0);
	assert_int_equal(blk_open(&kv, &b->bs, err, sizeof(err)), 0);
	kv_free(&kv);
	assert_int_equal(vblk_dev_init(&b->dev, b->bs, &o, err, sizeof(err)), 0);
	*state = b;
	return 0;
}

static int blk_teardown(void **state)
{
	struct blkfx *b = *state;

	blk_detach_loop(b->bs, b->loop);
	blk_close(b->bs);
	loop_bind_current(NULL);
	loop_free(b->loop);
	free(b);
	return 0;
}

/* A request of header (16 bytes at buf), data (len at buf+512, writable
 * when `in`), status (buf+8191). */
static enum vblk_submit_result blk_req(struct blkfx *b, uint32_t type, uint64_t sector,
				       uint32_t len, bool in)
{
	struct virtio_blk_hdr h = {.type = type, .sector = sector};
	unsigned n = 0;

	memcpy(b->buf, &h, sizeof(h));
	b->buf[8191] = 0xee;
	memset(&b->r, 0, sizeof(b->r));
	b->iov[n++] = (struct iovec){b->buf, 16};
	if (len && !in)
		b->iov[n++] = (struct iovec){b->buf + 512, len};
	b->r.nout = n;
	if (len && in)
		b->iov[n++] = (struct iovec){b->buf + 512, len};
	b->iov[n++] = (struct iovec){b->buf + 8191, 1};
	b->r.nin = n - b->r.nout;
	b->r.iov = b->iov;
	b->r.out_len = 16 + (in ? 0 : len);
	b->r.in_len = 1 + (in ? len : 0);
	b->r.dev = &b->dev;
	b->r.done = blk_done;
	b->done = 0;
	return vblk_req_submit(&b->r);
}

static uint8_t blk_run(struct blkfx *b)
{
	int i;

	for (i = 0; i < 1000 && !b->done; i++)
		loop_run_once(b->loop, false);
	assert_int_equal(b->done, 1);
	return b->buf[8191];
}

static void test_blk_read_write(void **state)
{
	struct blkfx *b = *state;

	assert_int_equal(blk_req(b, VIRTIO_BLK_T_IN, 8, 4096, true), VBLK_SUBMITTED);
	assert_int_equal(blk_run(b), VIRTIO_BLK_S_OK);
	assert_int_equal(b->r.used_len, 4097);
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_OUT, 8, 512, false), VBLK_SUBMITTED);
	assert_int_equal(blk_run(b), VIRTIO_BLK_S_OK);
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_FLUSH, 0, 0, false), VBLK_SUBMITTED);
	assert_int_equal(blk_run(b), VIRTIO_BLK_S_OK);
}

static void test_blk_bad_ranges(void **state)
{
	struct blkfx *b = *state;
	uint64_t last = 1024 * 1024 / 512;

	/* sector * 512 would overflow 64 bits */
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_IN, UINT64_MAX / 512 + 1, 512, true),
			 VBLK_FINISHED);
	assert_int_equal(b->buf[8191], VIRTIO_BLK_S_IOERR);
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_IN, UINT64_MAX, 512, true), VBLK_FINISHED);
	assert_int_equal(b->buf[8191], VIRTIO_BLK_S_IOERR);
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_IN, last - 1, 1024, true),
			 VBLK_FINISHED); /* past the end */
	assert_int_equal(b->buf[8191], VIRTIO_BLK_S_IOERR);
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_IN, last - 1, 512, true),
			 VBLK_SUBMITTED); /* last sector */
	assert_int_equal(blk_run(b), VIRTIO_BLK_S_OK);
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_OUT, 0, 100, false),
			 VBLK_FINISHED); /* not whole sectors */
	assert_int_equal(b->buf[8191], VIRTIO_BLK_S_IOERR);
	assert_int_equal(b->done, 0); /* synchronous answers do not call done() */
}

static void test_blk_types(void **state)
{
	struct blkfx *b = *state;
	struct virtio_blk_discard_wz seg = {.sector = 0, .num_sectors = 8, .flags = 1};

	assert_int_equal(blk_req(b, 99, 0, 0, false), VBLK_FINISHED);
	assert_int_equal(b->buf[8191], VIRTIO_BLK_S_UNSUPP);
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_GET_ID, 0, 20, true), VBLK_FINISHED);
	assert_int_equal(b->buf[8191], VIRTIO_BLK_S_OK);
	assert_memory_equal(b->buf + 512, "ioplane-serial", 14);
	assert_int_equal(b->r.used_len, 21);
	/* DISCARD must refuse the unmap flag; WRITE_ZEROES takes it. */
	memcpy(b->buf + 512, &seg, sizeof(seg));
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_DISCARD, 0, sizeof(seg), false), VBLK_FINISHED);
	assert_int_equal(b->buf[8191], VIRTIO_BLK_S_UNSUPP);
	memcpy(b->buf + 512, &seg, sizeof(seg));
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_WRITE_ZEROES, 0, sizeof(seg), false),
			 VBLK_SUBMITTED);
	assert_int_equal(blk_run(b), VIRTIO_BLK_S_OK);
	seg.flags = 0;
	seg.num_sectors = 0xffffffff; /* beyond max_discard_sectors */
	memcpy(b->buf + 512, &seg, sizeof(seg));
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_DISCARD, 0, sizeof(seg), false), VBLK_FINISHED);
	assert_int_equal(b->buf[8191], VIRTIO_BLK_S_IOERR);
}

static void test_blk_missing_header_status(void **state)
{
	struct blkfx *b = *state;

	/* blk_req() submits once (unsupported type: answered at once); then the
	 * same chain is spoiled and submitted again. */
	assert_int_equal(blk_req(b, 99, 0, 0, false), VBLK_FINISHED);
	b->r.out_len = 8; /* header cut short */
	b->iov[0].iov_len = 8;
	assert_int_equal(vblk_req_submit(&b->r), VBLK_BROKEN);
	assert_int_equal(blk_req(b, 99, 0, 0, false), VBLK_FINISHED);
	b->r.nin = 0; /* no writable status byte */
	b->r.in_len = 0;
	assert_int_equal(vblk_req_submit(&b->r), VBLK_BROKEN);
}

static void test_blk_read_only(void **state)
{
	struct blkfx *b = *state;

	b->dev.read_only = true;
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_OUT, 0, 512, false), VBLK_FINISHED);
	assert_int_equal(b->buf[8191], VIRTIO_BLK_S_IOERR);
	assert_true(vblk_dev_features(&b->dev) & (1ull << VIRTIO_BLK_F_RO));
	assert_false(vblk_dev_features(&b->dev) & (1ull << VIRTIO_BLK_F_DISCARD));
}

static void test_blk_config(void **state)
{
	struct blkfx *b = *state;
	struct virtio_blk_config c;
	uint8_t zero = 0, two = 2;

	assert_int_equal(sizeof(c), 60);
	vblk_dev_config(&b->dev, &c);
	assert_int_equal(c.capacity, 2048);
	assert_true(c.seg_max >= 1 && c.size_max >= 4096);
	assert_int_equal(c.blk_size, 512);
	assert_int_equal(c.writeback, 1);
	assert_int_equal(vblk_dev_set_config(&b->dev, VBLK_CONFIG_WRITEBACK_OFF, &zero, 1), 0);
	vblk_dev_config(&b->dev, &c);
	assert_int_equal(c.writeback, 0);
	assert_int_equal(vblk_dev_set_config(&b->dev, 0, &zero, 1), -EINVAL); /* capacity */
	assert_int_equal(vblk_dev_set_config(&b->dev, VBLK_CONFIG_WRITEBACK_OFF, &two, 1), -EINVAL);
	/* writethrough: a write now carries FUA */
	assert_int_equal(blk_req(b, VIRTIO_BLK_T_OUT, 0, 512, false), VBLK_SUBMITTED);
	assert_int_equal(b->r.breq.flags, BLK_F_FUA);
	assert_int_equal(blk_run(b), VIRTIO_BLK_S_OK);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_valid_chain, setup, teardown),
		cmocka_unit_test_setup_teardown(test_loop, setup, teardown),
		cmocka_unit_test_setup_teardown(test_loop_zero_len, setup, teardown),
		cmocka_unit_test_setup_teardown(test_out_of_region, setup, teardown),
		cmocka_unit_test_setup_teardown(test_bad_next_and_head, setup, teardown),
		cmocka_unit_test_setup_teardown(test_avail_idx_jump, setup, teardown),
		cmocka_unit_test_setup_teardown(test_too_many_segments, setup, teardown),
		cmocka_unit_test_setup_teardown(test_readable_after_writable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_region_split, setup, teardown),
		cmocka_unit_test_setup_teardown(test_indirect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_indirect_rules, setup, teardown),
		cmocka_unit_test_setup_teardown(test_used_and_notify, setup, teardown),
		cmocka_unit_test_setup_teardown(test_kick_suppression, setup, teardown),
		cmocka_unit_test_setup_teardown(test_dirty_log, setup, teardown),
		cmocka_unit_test_setup_teardown(test_inflight_track, setup, teardown),
		cmocka_unit_test_setup_teardown(test_inflight_recover, setup, teardown),
		cmocka_unit_test_setup_teardown(test_inflight_hostile, setup, teardown),
		cmocka_unit_test_setup_teardown(test_blk_read_write, blk_setup, blk_teardown),
		cmocka_unit_test_setup_teardown(test_blk_bad_ranges, blk_setup, blk_teardown),
		cmocka_unit_test_setup_teardown(test_blk_types, blk_setup, blk_teardown),
		cmocka_unit_test_setup_teardown(test_blk_missing_header_status, blk_setup,
						blk_teardown),
		cmocka_unit_test_setup_teardown(test_blk_read_only, blk_setup, blk_teardown),
		cmocka_unit_test_setup_teardown(test_blk_config, blk_setup, blk_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
