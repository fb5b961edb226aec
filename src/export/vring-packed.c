/* Packed virtqueue (virtio 1.2 section 2.8), device side, behind the vring.h
 * API (vring.c dispatches here when vr->packed). One descriptor ring holds
 * what the driver makes available and what the device marks used, told apart
 * by the AVAIL/USED flag bits against a wrap counter on each side. The driver
 * is as untrusted as with split rings: a chain is bounded by the ring size, an
 * indirect table must be the whole chain and lie in guest memory, buffer ids
 * are checked, and every field is read once.
 *
 * THREADING RULE: see vring.h; one thread at a time per struct vring. */
#include <errno.h>
#include <string.h>

#include "export/vring.h"

#define barrier() __atomic_signal_fence(__ATOMIC_SEQ_CST)

static inline uint16_t load16(const uint16_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}

static inline void store16(uint16_t *p, uint16_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}

#define AVAIL_USED (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED)

/* The AVAIL/USED bits of a descriptor available to a device whose avail wrap
 * counter is wrap: AVAIL matches the counter, USED does not. */
static inline uint16_t avail_bits(bool wrap)
{
	return wrap ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED;
}

int vring_packed_start(struct vring *vr)
{
	if (vr->last_avail >= vr->num || vr->used_idx >= vr->num)
		return -EINVAL;
	vr->inflight = NULL; /* the inflight area has a split layout only */
	vr->batch = 0;
	vr->pk_slots = 0;
	vr->inuse = 0;
	vr->signalled_valid = false;
	vr->notify_off = false;
	memset(vr->pk_ndesc, 0, sizeof(vr->pk_ndesc));
	store16(&vr->device_event->flags, VRING_PACKED_EVENT_ENABLE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return 0;
}

bool vring_packed_avail_pending(const struct vring *vr)
{
	return (__atomic_load_n(&vr->pdesc[vr->last_avail].flags, __ATOMIC_ACQUIRE) & AVAIL_USED) ==
	       avail_bits(vr->avail_wrap);
}

/* An indirect table of packed descriptors, which are all buffers of the
 * chain; it must be the chain's only descriptor (first and last). */
static int walk_indirect(const struct vring *vr, uint64_t addr, uint32_t len, bool alone,
			 struct vring_chain *c)
{
	const struct vring_fast_region f = vring_fast_region(vr->mem);
	const struct vring_packed_desc *t;
	struct vring_packed_desc e;
	struct vring_desc d;
	unsigned i, tnum;
	int ret;

	if (!vr->indirect || !alone || !len || len % sizeof(*t) ||
	    len / sizeof(*t) > VRING_MAX_SIZE)
		return -EINVAL;
	t = vring_mem_gpa(vr->mem, addr, len);
	if (!t)
		return -EFAULT;
	tnum = len / sizeof(*t);
	for (i = 0; i < tnum; i++) {
		memcpy(&e, &t[i], sizeof(e));
		barrier();
		if (e.flags & VRING_DESC_F_INDIRECT)
			return -EINVAL;
		d = (struct vring_desc){e.addr, e.len, e.flags & VRING_DESC_F_WRITE, 0};
		ret = vring_walk_buffer(vr, &f, &d, c);
		if (ret < 0)
			return ret;
	}
	return 0;
}

/* A descriptor is copied once and only the copy is used: the driver may
 * change the ring under us. The ring's fields are locals, so the calls below
 * do not make the compiler reload them for every descriptor; availability is
 * one comparison of the AVAIL/USED bits against what the wrap counter wants. */
enum vring_pop_result vring_packed_pop(struct vring *vr, struct vring_chain *c)
{
	const struct vring_fast_region f = vring_fast_region(vr->mem);
	const struct vring_packed_desc *ring = vr->pdesc;
	unsigned num = vr->num, slot = vr->last_avail, n = 0;
	bool wrap = vr->avail_wrap;
	uint16_t want = avail_bits(wrap), flags, id;
	struct vring_packed_desc d;
	struct vring_desc b;
	int ret;

	if ((__atomic_load_n(&ring[slot].flags, __ATOMIC_ACQUIRE) & AVAIL_USED) != want)
		return VRING_POP_EMPTY;
	c->nout = c->nin = 0;
	c->out_len = c->in_len = 0;
	for (;;) {
		memcpy(&d, &ring[slot], sizeof(d));
		barrier(); /* from here on only the copy is used */
		flags = d.flags;
		/* The head's flags made the chain available; the rest must be too.
		 * More descriptors than the ring holds: the driver lies. */
		if ((flags & AVAIL_USED) != want || ++n > num) {
			c->err = n > num ? -ELOOP : -EINVAL;
			return VRING_POP_BROKEN;
		}
		if (++slot == num) {
			slot = 0;
			wrap = !wrap;
			want ^= AVAIL_USED;
		}
		if (flags & VRING_DESC_F_INDIRECT) {
			ret = walk_indirect(vr, d.addr, d.len,
					    n == 1 && !(flags & VRING_DESC_F_NEXT), c);
		} else {
			b = (struct vring_desc){d.addr, d.len, flags & VRING_DESC_F_WRITE, 0};
			ret = vring_walk_buffer(vr, &f, &b, c);
		}
		if (ret < 0) {
			c->err = ret;
			return VRING_POP_BROKEN;
		}
		if (!(flags & VRING_DESC_F_NEXT))
			break;
	}
	/* The id is the last descriptor's; the driver cannot have more buffers
	 * out than the ring has slots. */
	id = d.id;
	if (id >= num || vr->inuse >= num) {
		c->err = -EINVAL;
		return VRING_POP_BROKEN;
	}
	c->head = id;
	vr->pk_ndesc[id] = (uint16_t)n;
	vr->last_avail = (uint16_t)slot;
	vr->avail_wrap = wrap;
	vr->inuse++;
	return VRING_POP_CHAIN;
}

/* Marks a used slot in the dirty log (live migration only). */
static void log_slot(struct vring *vr, struct vring_packed_desc *d)
{
	struct iovec slot = {d, sizeof(*d)};

	vring_log_iov(vr, &slot, 1);
}

/* The used entry goes where the next used slot is; its flags, stored last,
 * make it visible. It skips as many slots as the buffer took. The dirty log
 * comes last, so that the common case makes no call. */
void vring_packed_push(struct vring *vr, uint16_t id, uint32_t len)
{
	unsigned used = vr->used_idx, n;
	struct vring_packed_desc *d = &vr->pdesc[used];

	/* Ids the ring never gave out have no count (0): they take one slot. */
	n = id < VRING_MAX_SIZE && vr->pk_ndesc[id] ? vr->pk_ndesc[id] : 1;
	__atomic_store_n(&d->id, id, __ATOMIC_RELAXED);
	__atomic_store_n(&d->len, len, __ATOMIC_RELAXED);
	__atomic_store_n(&d->flags, vr->used_wrap ? AVAIL_USED : 0, __ATOMIC_RELEASE);
	used += n;
	if (used >= vr->num) {
		used -= vr->num;
		vr->used_wrap = !vr->used_wrap;
	}
	vr->used_idx = (uint16_t)used;
	vr->pk_slots = (uint16_t)(vr->pk_slots + n);
	vr->batch++;
	vr->inuse--;
	if (vr->log)
		log_slot(vr, d);
}

/* Does the driver want a notification for what was pushed since the last
 * one? Its event suppression area says: always, never, or (EVENT_IDX) once
 * the used slot passes the one it names, with its wrap counter. The window is
 * the slots written since the last decision, counted: comparing slot numbers
 * would see every lap as a pass, and call a polling driver that left a stale
 * event behind once per lap of the ring. */
bool vring_packed_flush(struct vring *vr)
{
	struct vring_packed_event e;
	uint16_t slots = vr->pk_slots;
	bool valid = vr->signalled_valid;
	int off;

	if (!vr->batch)
		return false;
	vr->batch = 0;
	vr->pk_slots = 0;
	/* Our used entries before we read the driver's wishes. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	e.off_wrap = load16(&vr->driver_event->off_wrap);
	e.flags = load16(&vr->driver_event->flags);
	vr->signalled_valid = true;
	if (e.flags == VRING_PACKED_EVENT_DISABLE)
		return false;
	if (e.flags != VRING_PACKED_EVENT_DESC || !vr->event_idx || !valid || slots >= vr->num)
		return true;
	/* The event's slot in the lap the used index is in (negative: the lap
	 * before); the window is the slots [used_idx - slots, used_idx). */
	off = e.off_wrap & 0x7fff;
	if (!!(e.off_wrap & VRING_PACKED_WRAP) != vr->used_wrap)
		off -= vr->num;
	return vring_need_event((uint16_t)off, vr->used_idx, (uint16_t)(vr->used_idx - slots));
}

void vring_packed_notify(struct vring *vr, bool on)
{
	store16(&vr->device_event->flags,
		on ? VRING_PACKED_EVENT_ENABLE : VRING_PACKED_EVENT_DISABLE);
}
