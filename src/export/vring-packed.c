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
	unsigned i;

	if (vr->last_avail >= vr->num || vr->used_idx >= vr->num)
		return -EINVAL;
	vr->inflight = NULL; /* the inflight area has a split layout only */
	vr->batch = 0;
	vr->pk_slots = 0;
	vr->inuse = 0;
	vr->signalled_valid = false;
	vr->notify_off = false;
	/* Ids the ring never gave out take one slot when used. */
	for (i = 0; i < VRING_MAX_SIZE; i++)
		vr->pk_ndesc[i] = 1;
	vr->pk_used_flags = vr->used_wrap ? AVAIL_USED : 0;
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

/* Where vring_packed_pop() is in a chain of direct descriptors. */
struct walk {
	const struct vring_packed_desc *ring, *p, *end, *head;
	bool wrap;                  /* the avail wrap counter at p */
	uint16_t expect;            /* the flags under WALK_MASK of the next descriptor */
	uint64_t len;               /* bytes of all buffers so far */
	uint64_t out;               /* of them readable (set at the first writable one) */
	unsigned nout;              /* iovecs of the readable ones (likewise) */
	struct iovec *iov;          /* the next iovec */
	unsigned left;              /* iovecs left */
	struct vring_packed_desc d; /* the copy of the descriptor at p */
};

/* A descriptor of the chain as the walk expects it: available at the wrap
 * counter, not indirect, WRITE as the ones before. */
#define WALK_MASK (AVAIL_USED | VRING_DESC_F_INDIRECT | VRING_DESC_F_WRITE)

#define WALK_SLOW 1     /* walk_chain(fast): a buffer outside the first region */
#define WALK_INDIRECT 2 /* walk_chain: an indirect descriptor at the head */

/* A descriptor that is not as the walk expected: the first writable one (the
 * rest of the chain must be writable too), a readable one after writable ones
 * (refused unless they were all empty: then nothing of theirs was taken), or
 * a broken chain. Returns 0 to go on with the descriptor, or -errno. */
static inline int walk_switch(struct walk *w, uint16_t flags, unsigned used)
{
	if ((flags & AVAIL_USED) != (w->expect & AVAIL_USED) || (flags & VRING_DESC_F_INDIRECT))
		return -EINVAL;
	if (flags & VRING_DESC_F_WRITE) {
		w->out = w->len;
		w->nout = used;
	} else if (w->len != w->out) {
		/* "The driver MUST place any device-writable descriptor elements
		 * after any device-readable descriptor elements." */
		return -EINVAL;
	}
	w->expect ^= VRING_DESC_F_WRITE;
	return 0;
}

/* A lone indirect descriptor at the head: its table is the whole chain,
 * walked into c. Returns 0 or -errno. */
static int pop_indirect(const struct vring *vr, struct vring_chain *c, struct vring_packed_desc d)
{
	c->nout = c->nin = 0;
	c->out_len = c->in_len = 0;
	return walk_indirect(vr, d.addr, d.len, !(d.flags & VRING_DESC_F_NEXT), c);
}

/* Walks the chain on from w->p, whose descriptor is in w->d; stops after the
 * last one (0) or at an error (-errno). Per descriptor it makes one
 * comparison of the flags (available at the wrap counter, not indirect,
 * WRITE as the previous one: else walk_switch) and one of the slot against
 * the end of the lap (the ring's end, then the head's slot: a chain longer
 * than the ring is refused without reading any slot twice), adds the length
 * to one sum (the 32-bit limits are checked at the end, where the sum of at
 * most VRING_MAX_SIZE lengths cannot have overflowed) and maps the buffer.
 * Inlined twice: fast, every buffer in f and no call (registers need not
 * survive one), stopping with WALK_SLOW at the first that is not, which the
 * other, through vring_mem_map(), takes on from. */
static inline __attribute__((always_inline)) int walk_chain(const struct vring *vr,
							    struct vring_chain *c, struct walk *w,
							    const struct vring_fast_region *f,
							    bool fast)
{
	const struct vring_packed_desc *ring_end = w->ring + vr->num;
	uint8_t *host;
	int ret;

	for (;;) {
		if ((w->d.flags & WALK_MASK) != w->expect) {
			/* The head's flags made the chain available; the rest
			 * must be too. */
			if ((w->d.flags & VRING_DESC_F_INDIRECT) && w->p == w->head)
				return WALK_INDIRECT;
			ret = walk_switch(w, w->d.flags, (unsigned)(w->iov - c->iov));
			if (ret < 0)
				return ret;
		}
		if (w->d.len) {
			host = vring_fast_gpa(f, w->d.addr, w->d.len);
			if (host && w->left) {
				w->iov->iov_base = host;
				w->iov->iov_len = w->d.len;
				ret = 1;
			} else if (fast) {
				return WALK_SLOW;
			} else {
				ret = vring_mem_map(vr->mem, w->d.addr, w->d.len, w->iov, w->left);
				if (ret < 0)
					return ret;
			}
			w->iov += ret;
			w->left -= (unsigned)ret;
		}
		w->len += w->d.len;
		w->p++;
		if (!(w->d.flags & VRING_DESC_F_NEXT))
			return 0;
		if (w->p == w->end) {
			/* More descriptors than the ring holds: the driver lies. */
			if (w->end != ring_end || w->head == w->ring)
				return -ELOOP;
			w->p = w->ring;
			w->end = w->head;
			w->wrap = !w->wrap;
			w->expect ^= AVAIL_USED;
		}
		memcpy(&w->d, w->p, sizeof(w->d));
		barrier(); /* from here on only the copy is used */
	}
}

/* Takes the chain at the next avail slot. A descriptor is copied once and
 * only the copy is used: the driver may change the ring under us. The
 * descriptor count comes from the slots at the end. */
enum vring_pop_result vring_packed_pop(struct vring *vr, struct vring_chain *c)
{
	const struct vring_fast_region f = vring_fast_region(vr->mem);
	unsigned num = vr->num, n;
	struct walk w;
	uint16_t id;
	int ret;

	w.ring = vr->pdesc;
	w.head = w.p = w.ring + vr->last_avail;
	w.wrap = vr->avail_wrap;
	w.expect = avail_bits(w.wrap);
	if ((__atomic_load_n(&w.p->flags, __ATOMIC_ACQUIRE) & AVAIL_USED) != w.expect)
		return VRING_POP_EMPTY;
	w.end = w.ring + num;
	w.len = w.out = 0;
	w.nout = 0;
	w.iov = c->iov;
	w.left = c->max_iov;
	memcpy(&w.d, w.p, sizeof(w.d));
	barrier(); /* from here on only the copy is used */
	ret = walk_chain(vr, c, &w, &f, true);
	if (ret == WALK_SLOW)
		ret = walk_chain(vr, c, &w, &f, false);
	if (ret == WALK_INDIRECT) {
		ret = pop_indirect(vr, c, w.d);
		if (ret < 0)
			goto broken;
		/* As if its buffers had been direct; it has no NEXT. */
		w.len = c->out_len + c->in_len;
		w.out = c->out_len;
		w.nout = c->nout;
		w.expect |= VRING_DESC_F_WRITE; /* out and nout are final */
		w.iov += c->nout + c->nin;
		w.p++;
	}
	if (ret < 0)
		goto broken;
	if (w.p == w.ring + num) {
		w.p = w.ring;
		w.wrap = !w.wrap;
	}
	if (!(w.expect & VRING_DESC_F_WRITE)) {
		w.out = w.len;
		w.nout = (unsigned)(w.iov - c->iov);
	}
	/* The used length is 32 bits: so is any sane request. The id is the
	 * last descriptor's; the driver cannot have more buffers out than the
	 * ring has slots. */
	id = w.d.id;
	if (((w.out | (w.len - w.out)) >> 32) || id >= num || vr->inuse >= num) {
		ret = -EINVAL;
		goto broken;
	}
	c->head = id;
	c->nout = w.nout;
	c->nin = (unsigned)(w.iov - c->iov) - w.nout;
	c->out_len = w.out;
	c->in_len = w.len - w.out;
	n = (unsigned)(w.p - w.head) + (w.wrap != vr->avail_wrap ? num : 0);
	vr->pk_ndesc[id] = (uint16_t)n;
	vr->last_avail = (uint16_t)(w.p - w.ring);
	vr->avail_wrap = w.wrap;
	vr->inuse++;
	return VRING_POP_CHAIN;
broken:
	c->err = ret;
	return VRING_POP_BROKEN;
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

	n = id < VRING_MAX_SIZE ? vr->pk_ndesc[id] : 1;
	__atomic_store_n(&d->id, id, __ATOMIC_RELAXED);
	__atomic_store_n(&d->len, len, __ATOMIC_RELAXED);
	__atomic_store_n(&d->flags, vr->pk_used_flags, __ATOMIC_RELEASE);
	used += n;
	if (used >= vr->num) {
		used -= vr->num;
		vr->used_wrap = !vr->used_wrap;
		vr->pk_used_flags ^= AVAIL_USED;
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
