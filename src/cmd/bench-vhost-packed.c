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

#define AVAIL_USED (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED)

static inline uint16_t desc_flags(const struct vring_desc *d, uint16_t av)
{
	return (uint16_t)((d->flags & (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE)) | av);
}

static inline void put_desc(struct vring_packed_desc *p, const struct vring_desc *d, uint16_t id,
			    uint16_t av)
{
	*p = (struct vring_packed_desc){d->addr, d->len, id, desc_flags(d, av)};
}

/* Each chain is made available as soon as it is written, its head's flags
 * last with a release barrier, rather than a batch at vhc_publish as on a
 * split ring: a polling back-end then takes the first requests while the
 * rest are still being written, and the two sides work in parallel. (Holding
 * the first head of a batch back until the publish, which the in-order ring
 * would allow, made a polling back-end pay about 40% more CPU per request
 * and now and then fall asleep between rounds.) A chain that does not cross
 * the ring's end, nearly all, is written without a wrap check per
 * descriptor. */
void vhc_packed_put(struct vhc_queue *q, unsigned s, const struct vring_desc *d, unsigned n)
{
	struct vring_packed_desc *r = ring(q);
	unsigned i, head = q->pk_avail, slot = head + 1, num = q->num;
	uint16_t av = avail_flags(q->avail_wrap), head_flags = desc_flags(&d[0], av);

	r[head].addr = d[0].addr; /* its flags come last: they make the chain available */
	r[head].len = d[0].len;
	r[head].id = (uint16_t)s;
	if (head + n < num && n <= 3) { /* a slot's chain has at most three */
		if (n > 1)
			put_desc(&r[head + 1], &d[1], (uint16_t)s, av);
		if (n > 2)
			put_desc(&r[head + 2], &d[2], (uint16_t)s, av);
		slot = head + n;
	} else {
		for (i = 1; i <= n; i++) {
			if (slot == num) {
				slot = 0;
				av ^= AVAIL_USED;
			}
			if (i < n)
				put_desc(&r[slot++], &d[i], (uint16_t)s, av);
		}
	}
	__atomic_store_n(&r[head].flags, head_flags, __ATOMIC_RELEASE);
	q->pk_ndesc[s] = (uint8_t)n;
	q->pk_avail = (uint16_t)slot;
	q->avail_wrap = av == VRING_PACKED_DESC_F_AVAIL;
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

	/* Used: AVAIL and USED both equal the used wrap counter. */
	return (f & AVAIL_USED) == (q->used_wrap ? AVAIL_USED : 0);
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
