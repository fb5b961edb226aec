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

#define AVAIL_USED VHC_PK_AVAIL_USED

bool vhc_packed_kick_wanted(const struct vhc_queue *q)
{
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return __atomic_load_n(&device_event(q)->flags, __ATOMIC_RELAXED) !=
	       VRING_PACKED_EVENT_DISABLE;
}

static inline bool used_pending(const struct vhc_queue *q)
{
	uint16_t f = __atomic_load_n(&ring(q)[q->pk_used].flags, __ATOMIC_ACQUIRE);

	/* Used: AVAIL and USED both equal the used wrap counter. */
	return (f & AVAIL_USED) == (q->used_wrap ? AVAIL_USED : 0);
}

bool vhc_packed_pending(const struct vhc_queue *q)
{
	return used_pending(q);
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
	return used_pending(q);
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
	if (!used_pending(q) && (!arm || !arm_call(q, event_idx)))
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
