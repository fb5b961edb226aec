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

/* Is a descriptor with these flags available to a device whose avail wrap
 * counter is wrap? (AVAIL matches the counter, USED does not.) */
static inline bool desc_avail(uint16_t flags, bool wrap)
{
	return !!(flags & VRING_PACKED_DESC_F_AVAIL) == wrap &&
	       !!(flags & VRING_PACKED_DESC_F_USED) != wrap;
}

int vring_packed_start(struct vring *vr)
{
	if (vr->last_avail >= vr->num || vr->used_idx >= vr->num)
		return -EINVAL;
	vr->inflight = NULL; /* the inflight area has a split layout only */
	vr->batch = 0;
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
	return desc_avail(__atomic_load_n(&vr->pdesc[vr->last_avail].flags, __ATOMIC_ACQUIRE),
			  vr->avail_wrap);
}

/* One descriptor into the chain: a buffer, or (alone) an indirect table of
 * packed descriptors, which are all buffers of the chain. */
static int walk_one(const struct vring *vr, const struct vring_packed_desc *p, unsigned n,
		    bool last, struct vring_chain *c)
{
	struct vring_desc d = {p->addr, p->len, p->flags & VRING_DESC_F_WRITE, 0};
	const struct vring_packed_desc *t;
	struct vring_packed_desc e;
	unsigned i, tnum;
	int ret;

	if (!(p->flags & VRING_DESC_F_INDIRECT))
		return vring_walk_buffer(vr, &d, c);
	if (!vr->indirect || n || !last || !p->len || p->len % sizeof(*t) ||
	    p->len / sizeof(*t) > VRING_MAX_SIZE)
		return -EINVAL;
	t = vring_mem_gpa(vr->mem, p->addr, p->len);
	if (!t)
		return -EFAULT;
	tnum = p->len / sizeof(*t);
	for (i = 0; i < tnum; i++) {
		memcpy(&e, &t[i], sizeof(e));
		barrier();
		if (e.flags & VRING_DESC_F_INDIRECT)
			return -EINVAL;
		d = (struct vring_desc){e.addr, e.len, e.flags & VRING_DESC_F_WRITE, 0};
		ret = vring_walk_buffer(vr, &d, c);
		if (ret < 0)
			return ret;
	}
	return 0;
}

enum vring_pop_result vring_packed_pop(struct vring *vr, struct vring_chain *c)
{
	unsigned slot = vr->last_avail, n = 0;
	bool wrap = vr->avail_wrap, more;
	struct vring_packed_desc d;

	if (!vring_packed_avail_pending(vr))
		return VRING_POP_EMPTY;
	c->nout = c->nin = 0;
	c->out_len = c->in_len = 0;
	do {
		memcpy(&d, &vr->pdesc[slot], sizeof(d));
		barrier(); /* from here on only the copy is used */
		/* The head's flags made the chain available; the rest must be too.
		 * More descriptors than the ring holds: the driver lies. */
		if ((n && !desc_avail(d.flags, wrap)) || ++n > vr->num) {
			c->err = n > vr->num ? -ELOOP : -EINVAL;
			return VRING_POP_BROKEN;
		}
		more = d.flags & VRING_DESC_F_NEXT;
		c->err = walk_one(vr, &d, n - 1, !more, c);
		if (c->err < 0)
			return VRING_POP_BROKEN;
		if (++slot == vr->num) {
			slot = 0;
			wrap = !wrap;
		}
	} while (more);
	/* The id is the last descriptor's; the driver cannot have more buffers
	 * out than the ring has slots. */
	if (d.id >= vr->num || vr->inuse >= vr->num) {
		c->err = -EINVAL;
		return VRING_POP_BROKEN;
	}
	c->head = d.id;
	vr->pk_ndesc[d.id] = (uint16_t)n;
	vr->last_avail = (uint16_t)slot;
	vr->avail_wrap = wrap;
	vr->inuse++;
	return VRING_POP_CHAIN;
}

/* The used entry goes where the next used slot is; its flags, stored last,
 * make it visible. It skips as many slots as the buffer took. */
void vring_packed_push(struct vring *vr, uint16_t id, uint32_t len)
{
	struct vring_packed_desc *d = &vr->pdesc[vr->used_idx];
	uint16_t flags = vr->used_wrap ? VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED : 0;
	unsigned n = id < vr->num && vr->pk_ndesc[id] ? vr->pk_ndesc[id] : 1;
	struct iovec slot = {d, sizeof(*d)};

	__atomic_store_n(&d->id, id, __ATOMIC_RELAXED);
	__atomic_store_n(&d->len, len, __ATOMIC_RELAXED);
	__atomic_store_n(&d->flags, flags, __ATOMIC_RELEASE);
	if (vr->log)
		vring_log_iov(vr, &slot, 1);
	vr->used_idx = (uint16_t)(vr->used_idx + n);
	if (vr->used_idx >= vr->num) {
		vr->used_idx = (uint16_t)(vr->used_idx - vr->num);
		vr->used_wrap = !vr->used_wrap;
	}
	vr->batch++;
	vr->inuse--;
}

/* Does the driver want a notification for what was pushed since the last
 * one? Its event suppression area says: always, never, or (EVENT_IDX) once
 * the used slot passes the one it names, with its wrap counter. */
bool vring_packed_flush(struct vring *vr)
{
	struct vring_packed_event e;
	uint16_t old = vr->signalled_used;
	bool valid = vr->signalled_valid;
	int off;

	if (!vr->batch)
		return false;
	vr->batch = 0;
	/* Our used entries before we read the driver's wishes. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	e.off_wrap = load16(&vr->driver_event->off_wrap);
	e.flags = load16(&vr->driver_event->flags);
	vr->signalled_used = vr->used_idx;
	vr->signalled_valid = true;
	if (e.flags == VRING_PACKED_EVENT_DISABLE)
		return false;
	if (e.flags != VRING_PACKED_EVENT_DESC || !vr->event_idx || !valid)
		return true;
	off = e.off_wrap & 0x7fff;
	if (!!(e.off_wrap & VRING_PACKED_WRAP) != vr->used_wrap)
		off -= vr->num;
	return vring_need_event((uint16_t)off, vr->used_idx, old);
}

void vring_packed_notify(struct vring *vr, bool on)
{
	store16(&vr->device_event->flags,
		on ? VRING_PACKED_EVENT_ENABLE : VRING_PACKED_EVENT_DISABLE);
}
