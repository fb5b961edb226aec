/* The driver side of packed virtqueues (virtio 1.2 section 2.8) for `ioplane
 * bench --vhost-user --packed`: chains written into the descriptor ring with
 * the head's flags last, used entries found by their flags against the used
 * wrap counter, kicks as the device's event area says, and (EVENT_IDX) a call
 * asked for at the next used slot only when about to sleep, as split rings
 * do with used_event; calls disabled while polling.
 *
 * THREADING RULE: single-threaded; a queue belongs to the caller. */
#include <stdlib.h>
#include <string.h>

#include "cmd/bench-vhost.h"

static struct vring_packed_desc *ring(const struct vhc_queue *q)
{
	return (struct vring_packed_desc *)q->desc;
}

static struct vring_packed_event *driver_event(const struct vhc_queue *q)
{
	return (struct vring_packed_event *)q->avail;
}

static struct vring_packed_event *device_event(const struct vhc_queue *q)
{
	return (struct vring_packed_event *)q->used;
}

void vhc_packed_init(struct vhc_queue *q)
{
	q->packed = true;
	q->avail_wrap = q->used_wrap = true;
	q->pk_avail = q->pk_used = 0;
	memset(ring(q), 0, 16ull * q->num);
	memset(driver_event(q), 0, sizeof(struct vring_packed_event));
	q->pk_event_flags = VRING_PACKED_EVENT_ENABLE;
	free(q->pk_ndesc);
	q->pk_ndesc = calloc(q->nslots, 1);
}

static uint16_t avail_flags(bool wrap)
{
	return wrap ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED;
}

void vhc_packed_put(struct vhc_queue *q, unsigned s, const struct vring_desc *d)
{
	unsigned i = 0, n = 0, slot = q->pk_avail;
	bool wrap = q->avail_wrap;
	uint16_t head_flags = 0;

	for (;;) {
		const struct vring_desc *e = &d[i];
		struct vring_packed_desc *p = &ring(q)[slot];
		uint16_t f = (uint16_t)((e->flags & (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE)) |
					avail_flags(wrap));

		p->addr = e->addr;
		p->len = e->len;
		p->id = (uint16_t)s;
		if (n == 0)
			head_flags = f; /* stored last: it makes the chain available */
		else
			p->flags = f;
		n++;
		if (++slot == q->num) {
			slot = 0;
			wrap = !wrap;
		}
		if (!(e->flags & VRING_DESC_F_NEXT) || n == 3)
			break;
		i = e->next - 3 * s;
	}
	__atomic_store_n(&ring(q)[q->pk_avail].flags, head_flags, __ATOMIC_RELEASE);
	q->pk_ndesc[s] = (uint8_t)n;
	q->pk_avail = (uint16_t)slot;
	q->avail_wrap = wrap;
}

bool vhc_packed_kick_wanted(const struct vhc_queue *q)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return __atomic_load_n(&device_event(q)->flags, __ATOMIC_RELAXED) !=
	       VRING_PACKED_EVENT_DISABLE;
}

bool vhc_packed_pending(const struct vhc_queue *q)
{
	uint16_t f = __atomic_load_n(&ring(q)[q->pk_used].flags, __ATOMIC_ACQUIRE);

	return !!(f & VRING_PACKED_DESC_F_AVAIL) == q->used_wrap &&
	       !!(f & VRING_PACKED_DESC_F_USED) == q->used_wrap;
}

static void set_event(struct vhc_queue *q, uint16_t flags)
{
	if (q->pk_event_flags != flags)
		__atomic_store_n(&driver_event(q)->flags, flags, __ATOMIC_RELAXED);
	q->pk_event_flags = flags;
}

/* About to sleep: ask for a call (EVENT_IDX: at the next used slot), then
 * look once more. True when something came meanwhile. */
static bool arm_call(struct vhc_queue *q, bool event_idx)
{
	if (event_idx)
		__atomic_store_n(&driver_event(q)->off_wrap,
				 (uint16_t)(q->pk_used | (q->used_wrap ? VRING_PACKED_WRAP : 0)),
				 __ATOMIC_RELAXED);
	set_event(q, event_idx ? VRING_PACKED_EVENT_DESC : VRING_PACKED_EVENT_ENABLE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return vhc_packed_pending(q);
}

/* A polling caller wants no calls: the event area says DISABLE, as Linux's
 * virtqueue_disable_cb writes for a packed ring (an event left at a slot
 * would be passed again every other lap of the ring). */
int vhc_packed_next_used(struct vhc_queue *q, bool arm, bool event_idx)
{
	uint16_t id;
	unsigned n;

	if (!arm)
		set_event(q, VRING_PACKED_EVENT_DISABLE);
	if (!vhc_packed_pending(q) && (!arm || !arm_call(q, event_idx)))
		return -1;
	id = ring(q)[q->pk_used].id;
	if (id >= q->nslots || !q->slots[id].busy || !q->pk_ndesc[id])
		return -2; /* the back-end returned something we never gave */
	q->slots[id].busy = false;
	n = q->pk_ndesc[id];
	q->pk_used = (uint16_t)(q->pk_used + n);
	if (q->pk_used >= q->num) {
		q->pk_used = (uint16_t)(q->pk_used - q->num);
		q->used_wrap = !q->used_wrap;
	}
	return id;
}
