/* Packed virtqueues (src/export/vring-packed.c) from the device side, against
 * a driver played by the test: chains made available with the wrap counter,
 * used entries and their skip, wrap-around, indirect tables, notification and
 * kick suppression, the saved position, and a hostile driver's chains. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "export/vring.h"

#define NUM 8
#define GPA_BASE 0x200000ull
#define MEM_SIZE (1u << 20)
#define DRV_OFF 0x1000 /* driver event suppression area */
#define DEV_OFF 0x1100 /* device event suppression area */
#define IND_OFF 0x2000 /* an indirect table */
#define DATA_OFF 0x10000

#define F_AVAIL VRING_PACKED_DESC_F_AVAIL
#define F_USED VRING_PACKED_DESC_F_USED

struct fx {
	uint8_t *mem;
	struct vring_mem m;
	struct vring vr;
	struct iovec iov[16];
	struct vring_chain c;
	unsigned drv_slot; /* the driver's next avail slot */
	bool drv_wrap;
};

static int setup(void **state)
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
	f->vr.packed = true;
	f->vr.pdesc = (struct vring_packed_desc *)f->mem;
	f->vr.driver_event = (struct vring_packed_event *)(f->mem + DRV_OFF);
	f->vr.device_event = (struct vring_packed_event *)(f->mem + DEV_OFF);
	f->vr.mem = &f->m;
	vring_set_base(&f->vr, VRING_PACKED_WRAP | VRING_PACKED_WRAP << 16); /* both at 0, wrap 1 */
	f->drv_wrap = true;
	f->c.iov = f->iov;
	f->c.max_iov = 16;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	free(f->mem);
	free(f);
	return 0;
}

/* The driver makes a chain of n descriptors (len each, the last with id)
 * available: the head's flags are written last. */
static void offer(struct fx *f, unsigned n, uint32_t len, uint16_t id, uint16_t extra)
{
	uint16_t avail = f->drv_wrap ? F_AVAIL : F_USED, head_flags = 0;
	unsigned i, head = f->drv_slot;

	for (i = 0; i < n; i++) {
		unsigned s = f->drv_slot;
		uint16_t fl = avail | extra | (i + 1 < n ? VRING_DESC_F_NEXT : 0);

		f->vr.pdesc[s] = (struct vring_packed_desc){GPA_BASE + DATA_OFF + 4096 * s, len, id,
							    i ? fl : 0};
		if (!i)
			head_flags = fl;
		if (++f->drv_slot == NUM) {
			f->drv_slot = 0;
			f->drv_wrap = !f->drv_wrap;
			avail = f->drv_wrap ? F_AVAIL : F_USED;
		}
	}
	__atomic_store_n(&f->vr.pdesc[head].flags, head_flags, __ATOMIC_RELEASE);
}

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

static void test_chain_and_used(void **state)
{
	struct fx *f = *state;
	struct vring_packed_desc *d = f->vr.pdesc;

	assert_int_equal(vring_start(&f->vr), 0);
	assert_int_equal(f->vr.device_event->flags, VRING_PACKED_EVENT_ENABLE);
	assert_int_equal(pop(f), 0);
	offer(f, 3, 512, 5, 0);
	assert_true(vring_avail_pending(&f->vr));
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.head, 5);
	assert_int_equal(f->c.nout, 3);
	assert_int_equal(f->c.out_len, 1536);
	assert_ptr_equal(f->iov[1].iov_base, f->mem + DATA_OFF + 4096);
	assert_int_equal(pop(f), 0);
	vring_push(&f->vr, 5, 77);
	/* The used entry sits in the head's slot, with both flags at wrap 1. */
	assert_int_equal(d[0].id, 5);
	assert_int_equal(d[0].len, 77);
	assert_int_equal(d[0].flags, F_AVAIL | F_USED);
	assert_true(vring_flush(&f->vr));
	/* It skipped the three slots: the next one goes to slot 3. */
	offer(f, 1, 8, 2, VRING_DESC_F_WRITE);
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.nin, 1);
	vring_push(&f->vr, 2, 8);
	assert_int_equal(d[3].id, 2);
	assert_int_equal(d[3].flags, F_AVAIL | F_USED);
	/* Ids the ring never gave out (a caller's bug) take one slot each. */
	vring_push(&f->vr, 6, 0);
	vring_push(&f->vr, VRING_MAX_SIZE + 1, 0);
	assert_int_equal(f->vr.used_idx, 6);
}

static void test_wrap(void **state)
{
	struct fx *f = *state;
	unsigned i;

	assert_int_equal(vring_start(&f->vr), 0);
	/* Three rounds of the ring, 3 slots per chain: wraps mid-chain too. */
	for (i = 0; i < 8; i++) {
		offer(f, 3, 16, (uint16_t)(i % NUM), 0);
		assert_int_equal(pop(f), 1);
		assert_int_equal(f->c.nout, 3);
		vring_push(&f->vr, (uint16_t)(i % NUM), 0);
		assert_int_equal(pop(f), 0);
	}
	/* 24 slots taken and used: both sides at slot 0, wrap counters flipped 3 times. */
	assert_int_equal(f->vr.last_avail, 0);
	assert_false(f->vr.avail_wrap);
	assert_int_equal(f->vr.used_idx, 0);
	assert_false(f->vr.used_wrap);
	assert_int_equal(vring_get_base(&f->vr), 0);
	/* The third round's used entries carry its wrap counter, 1 again; the
	 * second round's (chain 3 at slot 9 = 1) carried 0, since overwritten. */
	assert_int_equal(f->vr.pdesc[5].flags, F_AVAIL | F_USED);
	assert_int_equal(f->vr.pdesc[5].id, 7);
	/* The position comes back as it was saved. */
	vring_set_base(&f->vr, 3 | VRING_PACKED_WRAP | 6u << 16);
	assert_int_equal(f->vr.last_avail, 3);
	assert_true(f->vr.avail_wrap);
	assert_int_equal(f->vr.used_idx, 6);
	assert_false(f->vr.used_wrap);
	assert_int_equal(vring_get_base(&f->vr), 3 | VRING_PACKED_WRAP | 6u << 16);
	vring_set_base(&f->vr, NUM); /* a slot past the ring: refused at start */
	assert_int_equal(vring_start(&f->vr), -EINVAL);
}

static void test_indirect(void **state)
{
	struct fx *f = *state;
	struct vring_packed_desc *t = (struct vring_packed_desc *)(f->mem + IND_OFF);

	f->vr.indirect = true;
	assert_int_equal(vring_start(&f->vr), 0);
	t[0] = (struct vring_packed_desc){GPA_BASE + DATA_OFF, 16, 0, 0};
	t[1] = (struct vring_packed_desc){GPA_BASE + DATA_OFF + 4096, 4096, 0, VRING_DESC_F_WRITE};
	t[2] = (struct vring_packed_desc){GPA_BASE + DATA_OFF + 8192, 1, 0, VRING_DESC_F_WRITE};
	f->vr.pdesc[0] = (struct vring_packed_desc){GPA_BASE + IND_OFF, 3 * 16, 4, 0};
	__atomic_store_n(&f->vr.pdesc[0].flags, F_AVAIL | VRING_DESC_F_INDIRECT, __ATOMIC_RELEASE);
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.head, 4);
	assert_int_equal(f->c.nout, 1);
	assert_int_equal(f->c.nin, 2);
	assert_int_equal(f->c.in_len, 4097);
	vring_push(&f->vr, 4, 4097);
	assert_int_equal(f->vr.used_idx, 1); /* an indirect chain takes one slot */
}

static void test_hostile(void **state)
{
	struct fx *f = *state;
	struct vring_packed_desc *t = (struct vring_packed_desc *)(f->mem + IND_OFF);
	unsigned i;

	f->vr.indirect = true;
	/* Every slot says NEXT, at the right wrap: longer than the ring. */
	assert_int_equal(vring_start(&f->vr), 0);
	for (i = 0; i < NUM; i++)
		f->vr.pdesc[i] = (struct vring_packed_desc){GPA_BASE + DATA_OFF, 0, 0,
							    F_AVAIL | VRING_DESC_F_NEXT};
	assert_true(pop(f) < 0);
	/* A follow-on descriptor that is not available. */
	memset(f->vr.pdesc, 0, 16 * NUM);
	assert_int_equal(vring_start(&f->vr), 0);
	f->vr.pdesc[1] = (struct vring_packed_desc){GPA_BASE + DATA_OFF, 16, 1, 0};
	f->vr.pdesc[0] =
		(struct vring_packed_desc){GPA_BASE + DATA_OFF, 16, 0, F_AVAIL | VRING_DESC_F_NEXT};
	assert_int_equal(pop(f), -EINVAL);
	/* A buffer id past the ring. */
	f->vr.pdesc[0] = (struct vring_packed_desc){GPA_BASE + DATA_OFF, 16, NUM, F_AVAIL};
	assert_int_equal(pop(f), -EINVAL);
	/* Outside guest memory. */
	f->vr.pdesc[0] = (struct vring_packed_desc){GPA_BASE + MEM_SIZE, 16, 0, F_AVAIL};
	assert_int_equal(pop(f), -EFAULT);
	/* Indirect: with NEXT, nested, an empty or ragged table, outside memory. */
	t[0] = (struct vring_packed_desc){GPA_BASE + IND_OFF, 16, 0, VRING_DESC_F_INDIRECT};
	f->vr.pdesc[0] = (struct vring_packed_desc){GPA_BASE + IND_OFF, 16, 0,
						    F_AVAIL | VRING_DESC_F_INDIRECT};
	assert_int_equal(pop(f), -EINVAL);
	f->vr.pdesc[0].flags = F_AVAIL | VRING_DESC_F_INDIRECT | VRING_DESC_F_NEXT;
	assert_int_equal(pop(f), -EINVAL);
	f->vr.pdesc[0] = (struct vring_packed_desc){GPA_BASE + IND_OFF, 0, 0,
						    F_AVAIL | VRING_DESC_F_INDIRECT};
	assert_int_equal(pop(f), -EINVAL);
	f->vr.pdesc[0].len = 17;
	assert_int_equal(pop(f), -EINVAL);
	f->vr.pdesc[0] = (struct vring_packed_desc){GPA_BASE + MEM_SIZE - 8, 16, 0,
						    F_AVAIL | VRING_DESC_F_INDIRECT};
	assert_int_equal(pop(f), -EFAULT);
	/* Without the feature an indirect descriptor is refused. */
	f->vr.indirect = false;
	t[0] = (struct vring_packed_desc){GPA_BASE + DATA_OFF, 16, 0, 0};
	f->vr.pdesc[0] = (struct vring_packed_desc){GPA_BASE + IND_OFF, 16, 0,
						    F_AVAIL | VRING_DESC_F_INDIRECT};
	assert_int_equal(pop(f), -EINVAL);
	/* Nothing was taken by any of them. */
	assert_int_equal(f->vr.last_avail, 0);
	assert_int_equal(f->vr.inuse, 0);
	/* More buffers out than the ring has slots. */
	f->vr.inuse = NUM;
	f->vr.pdesc[0] = (struct vring_packed_desc){GPA_BASE + DATA_OFF, 16, 0, F_AVAIL};
	assert_int_equal(pop(f), -EINVAL);
}

static void test_notify(void **state)
{
	struct fx *f = *state;
	struct vring_packed_event *drv = f->vr.driver_event;

	assert_int_equal(vring_start(&f->vr), 0);
	assert_false(vring_flush(&f->vr)); /* nothing pushed */
	offer(f, 1, 16, 0, 0);
	assert_int_equal(pop(f), 1);
	vring_push(&f->vr, 0, 0);
	assert_true(vring_flush(&f->vr)); /* ENABLE */
	drv->flags = VRING_PACKED_EVENT_DISABLE;
	offer(f, 1, 16, 1, 0);
	assert_int_equal(pop(f), 1);
	vring_push(&f->vr, 1, 0);
	assert_false(vring_flush(&f->vr));
	/* DESC (EVENT_IDX): only once the used slot passes off_wrap. */
	f->vr.event_idx = true;
	drv->flags = VRING_PACKED_EVENT_DESC;
	drv->off_wrap = 4 | VRING_PACKED_WRAP;
	offer(f, 1, 16, 2, 0);
	assert_int_equal(pop(f), 1);
	vring_push(&f->vr, 2, 0); /* used slot 2 -> 3: 4 not passed */
	assert_false(vring_flush(&f->vr));
	offer(f, 2, 16, 3, 0);
	assert_int_equal(pop(f), 1);
	vring_push(&f->vr, 3, 0); /* 3 -> 5 passes 4 */
	assert_true(vring_flush(&f->vr));
	/* Kick suppression is the device area's flags. */
	vring_disable_notify(&f->vr);
	assert_int_equal(f->vr.device_event->flags, VRING_PACKED_EVENT_DISABLE);
	assert_false(vring_enable_notify(&f->vr));
	assert_int_equal(f->vr.device_event->flags, VRING_PACKED_EVENT_ENABLE);
	offer(f, 1, 16, 4, 0);
	vring_disable_notify(&f->vr);
	assert_true(vring_enable_notify(&f->vr)); /* a chain came meanwhile */
}

/* One chain of n slots made available, taken and used; what the flush that
 * ends the round decides. */
static bool use(struct fx *f, unsigned n, uint16_t id)
{
	offer(f, n, 16, id, 0);
	assert_int_equal(pop(f), 1);
	vring_push(&f->vr, id, 0);
	return vring_flush(&f->vr);
}

/* A driver that asked for a call at one slot and then polls, leaving the
 * event behind: the used index lapping the ring is no pass, only reaching
 * that slot (with its wrap counter) is. */
static void test_notify_stale_event(void **state)
{
	struct fx *f = *state;
	struct vring_packed_event *drv = f->vr.driver_event;
	unsigned lap;

	f->vr.event_idx = true;
	assert_int_equal(vring_start(&f->vr), 0);
	drv->flags = VRING_PACKED_EVENT_DESC;
	drv->off_wrap = 2 | VRING_PACKED_WRAP;
	assert_true(use(f, 1, 0));  /* the first decision after start */
	assert_false(use(f, 1, 1)); /* slot 1 */
	assert_true(use(f, 1, 2));  /* slot 2: the event */
	/* Slots 3-4, 5-6, 7-0 (the used wrap counter flips: the event is a lap
	 * behind), 1-2 (slot 2 of this lap has the other counter), 3-4, 5-6,
	 * 7-0 (flips back): no call. */
	for (lap = 0; lap < 7; lap++)
		assert_false(use(f, 2, (uint16_t)(3 + lap % 5)));
	assert_int_equal(f->vr.used_idx, 1);
	assert_true(f->vr.used_wrap);
	assert_true(use(f, 2, 0)); /* slots 1-2: the event again */
	/* More than a lap since the last decision: every event is passed. */
	drv->off_wrap = 6 | VRING_PACKED_WRAP;
	f->vr.pk_slots = NUM;
	f->vr.batch = 1;
	assert_true(vring_flush(&f->vr));
}

/* Descriptor s of a hand-made chain, available to a device whose avail wrap
 * counter is `wrap` there. */
static void put(struct fx *f, unsigned s, bool wrap, uint64_t gpa, uint32_t len, uint16_t id,
		uint16_t flags)
{
	f->vr.pdesc[s] = (struct vring_packed_desc){gpa, len, id,
						    (uint16_t)(flags | (wrap ? F_AVAIL : F_USED))};
}

/* Chains that wrap in the middle, the longest the ring allows, and one
 * longer: the walk's end of lap is the ring's end, then the head's slot. */
static void test_chain_lengths(void **state)
{
	struct fx *f = *state;
	unsigned i, s;

	/* Head at slot 5: slots 5-7 at wrap 1, then 0-4 at wrap 0, NUM in all. */
	vring_set_base(&f->vr, 5 | VRING_PACKED_WRAP | (5u | VRING_PACKED_WRAP) << 16);
	assert_int_equal(vring_start(&f->vr), 0);
	for (i = 0; i < NUM; i++) {
		s = (5 + i) % NUM;
		put(f, s, s >= 5, GPA_BASE + DATA_OFF + 4096 * i, 100, 3,
		    i + 1 < NUM ? VRING_DESC_F_NEXT : 0);
	}
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.head, 3);
	assert_int_equal(f->c.nout, NUM);
	assert_int_equal(f->c.out_len, 100 * NUM);
	assert_ptr_equal(f->iov[3].iov_base, f->mem + DATA_OFF + 3 * 4096);
	/* Back at slot 5, a lap on. */
	assert_int_equal(f->vr.last_avail, 5);
	assert_false(f->vr.avail_wrap);
	vring_push(&f->vr, 3, 0);
	assert_int_equal(f->vr.used_idx, 5); /* the used entry skipped all NUM */
	assert_false(f->vr.used_wrap);
	assert_int_equal(f->vr.pdesc[5].flags, F_AVAIL | F_USED);

	/* One more: every slot of the next lap available (wrap 0 from slot 5,
	 * wrap 1 after the ring's end) and with NEXT, the head's slot too, as a
	 * driver that rewrites it under us would leave it: refused before the
	 * head is read again. */
	for (i = 0; i < NUM; i++) {
		s = (5 + i) % NUM;
		put(f, s, s < 5, GPA_BASE + DATA_OFF, 16, 0, VRING_DESC_F_NEXT);
	}
	assert_int_equal(pop(f), -ELOOP);
	assert_int_equal(f->vr.last_avail, 5);
	assert_int_equal(f->vr.inuse, 0);

	/* From slot 0 the lap ends at the ring's end. */
	vring_set_base(&f->vr, VRING_PACKED_WRAP | VRING_PACKED_WRAP << 16);
	assert_int_equal(vring_start(&f->vr), 0);
	for (i = 0; i < NUM; i++)
		put(f, i, true, GPA_BASE + DATA_OFF, 16, 1, VRING_DESC_F_NEXT);
	assert_int_equal(pop(f), -ELOOP);
	f->vr.pdesc[NUM - 1].flags = F_AVAIL;
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.nout, NUM);
	assert_int_equal(f->vr.last_avail, 0);
	assert_false(f->vr.avail_wrap);
}

/* Readable and writable buffers: the order rule, the 32-bit lengths, the
 * iovec limit, and buffers outside the first memory region (the walk maps
 * those through vring_mem_map). */
static void test_buffers(void **state)
{
	struct fx *f = *state;
	static uint8_t second[8192];
	uint64_t big = 1ull << 40;

	f->m.nregions = 3;
	f->m.r[1] = (struct vring_region){.gpa = GPA_BASE + MEM_SIZE, .size = sizeof(second),
					  .host = second};
	/* Far away and 8 GiB: never touched, only mapped. */
	f->m.r[2] = (struct vring_region){.gpa = big, .size = 1ull << 33, .host = f->mem};
	assert_int_equal(vring_start(&f->vr), 0);

	/* Empty writable ones before a readable one took nothing: allowed. */
	put(f, 0, true, GPA_BASE + DATA_OFF, 0, 0, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE);
	put(f, 1, true, GPA_BASE + DATA_OFF, 16, 0, VRING_DESC_F_NEXT);
	put(f, 2, true, GPA_BASE + DATA_OFF, 8, 0, VRING_DESC_F_WRITE);
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.nout, 1);
	assert_int_equal(f->c.nin, 1);
	assert_int_equal(f->c.out_len, 16);
	assert_int_equal(f->c.in_len, 8);
	vring_push(&f->vr, 0, 8);
	assert_int_equal(f->vr.used_idx, 3);

	/* A readable one after a non-empty writable one: refused. */
	put(f, 3, true, GPA_BASE + DATA_OFF, 8, 1, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE);
	put(f, 4, true, GPA_BASE + DATA_OFF, 16, 1, 0);
	assert_int_equal(pop(f), -EINVAL);

	/* In the second region, and across the first two (two iovecs): then
	 * back in the first. */
	put(f, 3, true, GPA_BASE + MEM_SIZE + 16, 32, 1, VRING_DESC_F_NEXT);
	put(f, 4, true, GPA_BASE + MEM_SIZE - 16, 48, 1, VRING_DESC_F_NEXT | VRING_DESC_F_WRITE);
	put(f, 5, true, GPA_BASE + DATA_OFF, 1, 1, VRING_DESC_F_WRITE);
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.nout, 1);
	assert_int_equal(f->c.nin, 3);
	assert_ptr_equal(f->iov[0].iov_base, second + 16);
	assert_ptr_equal(f->iov[1].iov_base, f->mem + MEM_SIZE - 16);
	assert_int_equal(f->iov[1].iov_len, 16);
	assert_ptr_equal(f->iov[2].iov_base, second);
	assert_int_equal(f->iov[2].iov_len, 32);
	assert_ptr_equal(f->iov[3].iov_base, f->mem + DATA_OFF);
	assert_int_equal(f->c.in_len, 49);
	vring_push(&f->vr, 1, 0);

	/* 4 GiB readable: over the 32-bit limit (as two descriptors, each
	 * within it); 4 GiB - 1 is not. */
	put(f, 6, true, big, 0x80000000u, 2, VRING_DESC_F_NEXT);
	put(f, 7, true, big + 0x80000000u, 0x80000000u, 2, 0);
	assert_int_equal(pop(f), -EINVAL);
	f->vr.pdesc[7].len = 0x7fffffffu;
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.out_len, 0xffffffffull);
	vring_push(&f->vr, 2, 0);

	/* More iovecs than the caller has room for. */
	f->c.max_iov = 2;
	put(f, 0, false, GPA_BASE + DATA_OFF, 16, 3, VRING_DESC_F_NEXT);
	put(f, 1, false, GPA_BASE + DATA_OFF, 16, 3, VRING_DESC_F_NEXT);
	put(f, 2, false, GPA_BASE + DATA_OFF, 16, 3, 0);
	assert_int_equal(pop(f), -E2BIG);
	f->c.max_iov = 3;
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.nout, 3);

	/* An empty memory table maps nothing. */
	f->m.nregions = 0;
	put(f, 3, false, GPA_BASE + DATA_OFF, 16, 4, 0);
	assert_int_equal(pop(f), -EFAULT);
	f->vr.pdesc[3].len = 0; /* an empty buffer needs no memory */
	assert_int_equal(pop(f), 1);
	assert_int_equal(f->c.nout, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_chain_and_used, setup, teardown),
		cmocka_unit_test_setup_teardown(test_wrap, setup, teardown),
		cmocka_unit_test_setup_teardown(test_indirect, setup, teardown),
		cmocka_unit_test_setup_teardown(test_hostile, setup, teardown),
		cmocka_unit_test_setup_teardown(test_notify, setup, teardown),
		cmocka_unit_test_setup_teardown(test_notify_stale_event, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_lengths, setup, teardown),
		cmocka_unit_test_setup_teardown(test_buffers, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
