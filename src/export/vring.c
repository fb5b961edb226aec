/* Split virtqueue, device side. Everything the driver wrote is untrusted:
 * chains are bounded, loops detected, indirect tables checked, and every
 * buffer must lie inside mapped guest memory before anything touches it.
 *
 * THREADING RULE: see vring.h; one thread at a time per struct vring. Guest
 * memory is shared with another process: ordering between our stores and the
 * driver's loads uses the barriers virtio 1.2 section 2.7.13 asks for. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "export/vring.h"

#define barrier() __atomic_signal_fence(__ATOMIC_SEQ_CST)

static inline void log_used(const struct vring *vr);

static inline uint16_t load16(const uint16_t *p)
{
	return __atomic_load_n(p, __ATOMIC_RELAXED);
}
static inline void store16(uint16_t *p, uint16_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}
static inline void store32(uint32_t *p, uint32_t v)
{
	__atomic_store_n(p, v, __ATOMIC_RELAXED);
}

/* ---- guest memory ------------------------------------------------------- */

static const struct vring_region *region_gpa(const struct vring_mem *m, uint64_t gpa)
{
	unsigned i;

	for (i = 0; i < m->nregions; i++)
		if (gpa >= m->r[i].gpa && gpa - m->r[i].gpa < m->r[i].size)
			return &m->r[i];
	return NULL;
}

void *vring_mem_uva(const struct vring_mem *m, uint64_t uva, uint64_t len)
{
	unsigned i;

	for (i = 0; i < m->nregions; i++) {
		const struct vring_region *r = &m->r[i];
		uint64_t off = uva - r->uva;

		if (uva >= r->uva && off < r->size && len <= r->size - off)
			return r->host + off;
	}
	return NULL;
}

void *vring_mem_gpa(const struct vring_mem *m, uint64_t gpa, uint64_t len)
{
	const struct vring_region *r = region_gpa(m, gpa);
	uint64_t off;

	if (!r)
		return NULL;
	off = gpa - r->gpa;
	return len <= r->size - off ? r->host + off : NULL;
}

int vring_mem_map(const struct vring_mem *m, uint64_t gpa, uint32_t len, struct iovec *iov,
		  unsigned max)
{
	unsigned n = 0;

	while (len) {
		const struct vring_region *r = region_gpa(m, gpa);
		uint64_t off, chunk;

		if (!r)
			return -EFAULT;
		if (n == max)
			return -E2BIG;
		off = gpa - r->gpa;
		chunk = r->size - off < len ? r->size - off : len;
		iov[n].iov_base = r->host + off;
		iov[n].iov_len = chunk;
		n++;
		gpa += chunk; /* regions never wrap: checked when they are added */
		len -= (uint32_t)chunk;
	}
	return (int)n;
}

/* ---- start and inflight recovery ----------------------------------------- */

static bool ring_layout_ok(const struct vring *vr)
{
	unsigned num = vr->num;

	if (!num || num > VRING_MAX_SIZE || (num & (num - 1)))
		return false;
	/* virtio 1.2 2.8.10: descriptor ring 16, event suppression areas 4. */
	if (vr->packed)
		return vr->pdesc && vr->driver_event && vr->device_event && vr->mem &&
		       !((uintptr_t)vr->pdesc & 15) && !((uintptr_t)vr->driver_event & 3) &&
		       !((uintptr_t)vr->device_event & 3);
	if (!vr->desc || !vr->avail || !vr->used || !vr->mem)
		return false;
	/* virtio 1.2 2.7: descriptor table 16, available ring 2, used ring 4. */
	return !((uintptr_t)vr->desc & 15) && !((uintptr_t)vr->avail & 1) &&
	       !((uintptr_t)vr->used & 3);
}

/* "When reconnecting": if the used index moved past what the region says,
 * the last batch was published but its inflight flags were not cleared. */
static void inflight_fix_last_batch(struct vring *vr, uint16_t used_idx)
{
	struct vring_inflight *in = vr->inflight;
	uint16_t n = (uint16_t)(used_idx - load16(&in->used_idx));
	uint16_t i = load16(&in->last_batch_head);

	if (n > vr->num)
		n = vr->num; /* the front-end's region is untrusted too */
	while (n-- && i < vr->num) {
		in->desc[i].inflight = 0;
		i = load16(&in->desc[i].next);
	}
	store16(&in->used_idx, used_idx);
}

static void inflight_start(struct vring *vr, uint16_t used_idx)
{
	struct vring_inflight *in = vr->inflight;
	uint64_t max = 0;
	unsigned i, inuse = 0;

	if (!in->version) { /* a fresh region */
		memset(in->desc, 0, sizeof(in->desc[0]) * vr->num);
		in->features = 0;
		in->desc_num = vr->num;
		in->last_batch_head = 0;
		in->used_idx = used_idx;
		in->version = 1;
		vr->counter = 1;
		return;
	}
	inflight_fix_last_batch(vr, used_idx);
	for (i = 0; i < vr->num; i++) {
		if (in->desc[i].inflight != 1) {
			in->desc[i].inflight = 0;
			continue;
		}
		inuse++;
		if (in->desc[i].counter > max)
			max = in->desc[i].counter;
	}
	vr->counter = max + 1;
	vr->inuse = (uint16_t)inuse;
	/* Everything taken before the crash is either used or still inflight. */
	vr->last_avail = (uint16_t)(used_idx + inuse);
}

int vring_start(struct vring *vr)
{
	uint16_t used_idx;

	if (!ring_layout_ok(vr))
		return -EINVAL;
	if (vr->packed)
		return vring_packed_start(vr);
	if (vr->inflight && (vr->inflight->version && vr->inflight->desc_num != vr->num))
		return -EINVAL;
	used_idx = load16(&vr->used->idx);
	vr->used_idx = used_idx;
	vr->batch = 0;
	vr->inuse = 0;
	vr->signalled_valid = false;
	vr->notify_off = false;
	if (vr->inflight)
		inflight_start(vr, used_idx);
	if (vr->event_idx)
		store16((uint16_t *)&vr->used->ring[vr->num], vr->last_avail);
	else
		store16(&vr->used->flags, 0);
	log_used(vr);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return 0;
}

struct inflight_ent {
	uint64_t counter;
	uint16_t head;
};

static int inflight_cmp(const void *a, const void *b)
{
	const struct inflight_ent *x = a, *y = b;

	return x->counter < y->counter ? -1 : x->counter > y->counter;
}

unsigned vring_inflight_heads(const struct vring *vr, uint16_t *heads, unsigned max)
{
	struct inflight_ent *e;
	unsigned i, n = 0;

	if (!vr->inflight || !vr->inuse)
		return 0;
	e = calloc(vr->num, sizeof(*e));
	if (!e)
		return 0;
	/* A snapshot, so that the sort sees consistent values. */
	for (i = 0; i < vr->num; i++) {
		if (vr->inflight->desc[i].inflight == 1) {
			e[n].counter = vr->inflight->desc[i].counter;
			e[n++].head = (uint16_t)i;
		}
	}
	qsort(e, n, sizeof(*e), inflight_cmp);
	if (n > max)
		n = max;
	for (i = 0; i < n; i++)
		heads[i] = e[i].head;
	free(e);
	return n;
}

/* ---- taking chains ------------------------------------------------------ */

static void read_desc(const struct vring_desc *p, struct vring_desc *d)
{
	memcpy(d, p, sizeof(*d));
	barrier(); /* from here on only the copy is used */
}

/* Switch the walk to an indirect table (virtio 1.2 2.7.5.3). */
static int walk_indirect(const struct vring *vr, const struct vring_desc *d, unsigned count,
			 const struct vring_desc **table, unsigned *tnum)
{
	/* "The driver MUST NOT set the VIRTQ_DESC_F_INDIRECT flag within an
	 * indirect descriptor" and "MUST NOT set both VIRTQ_DESC_F_INDIRECT and
	 * VIRTQ_DESC_F_NEXT"; we also want it to be the whole chain. */
	if (!vr->indirect || count || (d->flags & VRING_DESC_F_NEXT))
		return -EINVAL;
	if (!d->len || d->len % sizeof(struct vring_desc) ||
	    d->len / sizeof(struct vring_desc) > VRING_MAX_SIZE)
		return -EINVAL;
	*table = vring_mem_gpa(vr->mem, d->addr, d->len);
	if (!*table)
		return -EFAULT;
	*tnum = d->len / sizeof(struct vring_desc);
	return 0;
}

int vring_walk(const struct vring *vr, uint16_t head, struct vring_chain *c)
{
	const struct vring_fast_region f = vring_fast_region(vr->mem);
	const struct vring_desc *table = vr->desc;
	unsigned tnum = vr->num, count = 0, i = head;
	bool indirect = false;
	struct vring_desc d;
	int ret;

	c->head = head;
	c->nout = c->nin = 0;
	c->out_len = c->in_len = 0;
	if (head >= vr->num)
		return -EINVAL;
	for (;;) {
		read_desc(&table[i], &d);
		if (d.flags & VRING_DESC_F_INDIRECT) {
			if (indirect)
				return -EINVAL;
			ret = walk_indirect(vr, &d, count, &table, &tnum);
			if (ret < 0)
				return ret;
			indirect = true;
			i = 0;
			continue;
		}
		/* More descriptors than the table holds: the chain loops. */
		if (++count > tnum)
			return -ELOOP;
		ret = vring_walk_buffer(vr, &f, &d, c);
		if (ret < 0)
			return ret;
		if (!(d.flags & VRING_DESC_F_NEXT))
			return 0;
		if (d.next >= tnum)
			return -EINVAL;
		i = d.next;
	}
}

enum vring_pop_result vring_split_pop(struct vring *vr, struct vring_chain *c)
{
	uint16_t avail_idx, head;

	avail_idx = __atomic_load_n(&vr->avail->idx, __ATOMIC_ACQUIRE);
	if (avail_idx == vr->last_avail)
		return VRING_POP_EMPTY;
	/* The driver cannot have more chains out than the ring has entries. */
	if ((uint16_t)(avail_idx - vr->used_idx) > vr->num) {
		c->err = -EINVAL;
		return VRING_POP_BROKEN;
	}
	head = load16(&vr->avail->ring[vr->last_avail & (vr->num - 1)]);
	c->err = vring_walk(vr, head, c);
	if (c->err < 0)
		return VRING_POP_BROKEN;
	vr->last_avail++;
	vr->inuse++;
	if (vr->inflight) {
		vr->inflight->desc[head].counter = vr->counter++;
		vr->inflight->desc[head].inflight = 1;
	}
	return VRING_POP_CHAIN;
}

/* ---- dirty log ------------------------------------------------------------ */

void vring_log_gpa(const struct vring *vr, uint64_t gpa, uint64_t len)
{
	uint64_t page, last;

	if (!vr->log || !len || len > UINT64_MAX - gpa)
		return;
	last = (gpa + len - 1) / VRING_LOG_PAGE;
	for (page = gpa / VRING_LOG_PAGE; page <= last && page / 8 < vr->log_size; page++)
		__atomic_fetch_or(&vr->log[page / 8], (uint8_t)(1u << (page % 8)),
				  __ATOMIC_RELAXED);
}

/* An iovec from vring_mem_map() lies inside one region. */
void vring_log_iov(const struct vring *vr, const struct iovec *iov, unsigned n)
{
	const struct vring_mem *m = vr->mem;
	unsigned i, j;

	for (i = 0; i < n; i++) {
		const uint8_t *p = iov[i].iov_base;

		for (j = 0; j < m->nregions; j++) {
			const struct vring_region *r = &m->r[j];

			if (p >= r->host && (uint64_t)(p - r->host) < r->size) {
				vring_log_gpa(vr, r->gpa + (uint64_t)(p - r->host), iov[i].iov_len);
				break;
			}
		}
	}
}

static inline void log_used(const struct vring *vr)
{
	if (vr->log && vr->log_used)
		vring_log_gpa(vr, vr->log_used_gpa, vring_used_size(vr->num));
}

/* ---- used ring ---------------------------------------------------------- */

void vring_split_push(struct vring *vr, uint16_t head, uint32_t len)
{
	struct vring_used_elem *e;

	e = &vr->used->ring[vr->used_idx & (vr->num - 1)];
	store32(&e->id, head);
	store32(&e->len, len);
	vr->used_idx++;
	vr->batch++;
	vr->inuse--;
	if (vr->inflight) {
		store16(&vr->inflight->desc[head].next, vr->inflight->last_batch_head);
		store16(&vr->inflight->last_batch_head, head);
	}
}

static void inflight_batch_done(struct vring *vr, uint16_t n)
{
	struct vring_inflight *in = vr->inflight;
	uint16_t i = load16(&in->last_batch_head);

	while (n-- && i < vr->num) {
		in->desc[i].inflight = 0;
		i = load16(&in->desc[i].next);
	}
	store16(&in->used_idx, vr->used_idx);
}

bool vring_flush(struct vring *vr)
{
	uint16_t old, event;
	bool valid;

	if (vr->packed)
		return vring_packed_flush(vr);
	if (!vr->batch)
		return false;
	/* Used entries before the index that publishes them. */
	__atomic_store_n(&vr->used->idx, vr->used_idx, __ATOMIC_RELEASE);
	if (vr->inflight)
		inflight_batch_done(vr, vr->batch);
	vr->batch = 0;
	log_used(vr);
	/* The index must be visible before we read the driver's wishes. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (!vr->event_idx)
		return !(load16(&vr->avail->flags) & VRING_AVAIL_F_NO_INTERRUPT);
	event = load16(&vr->avail->ring[vr->num]); /* used_event */
	valid = vr->signalled_valid;
	old = vr->signalled_used;
	vr->signalled_used = vr->used_idx;
	vr->signalled_valid = true;
	return !valid || vring_need_event(event, vr->used_idx, old);
}

/* ---- notification suppression -------------------------------------------- */

bool vring_avail_pending(const struct vring *vr)
{
	if (vr->packed)
		return vring_packed_avail_pending(vr);
	return load16(&vr->avail->idx) != vr->last_avail;
}

void vring_disable_notify(struct vring *vr)
{
	if (vr->notify_off)
		return;
	vr->notify_off = true;
	if (vr->packed) {
		vring_packed_notify(vr, false);
		return;
	}
	/* With EVENT_IDX, avail_event simply stays behind: no kicks. */
	if (!vr->event_idx)
		store16(&vr->used->flags, VRING_USED_F_NO_NOTIFY);
	log_used(vr);
}

bool vring_enable_notify(struct vring *vr)
{
	vr->notify_off = false;
	if (vr->packed) {
		vring_packed_notify(vr, true);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		return vring_packed_avail_pending(vr);
	}
	if (vr->event_idx)
		store16((uint16_t *)&vr->used->ring[vr->num], vr->last_avail);
	else
		store16(&vr->used->flags, 0);
	log_used(vr);
	/* Our store before the driver's index load: else a chain made available
	 * just now would wait for a kick that the driver decided not to send. */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	return vring_avail_pending(vr);
}

/* ---- saving the position ---------------------------------------------------- */

uint32_t vring_get_base(const struct vring *vr)
{
	if (!vr->packed)
		return vr->last_avail;
	return (uint32_t)(vr->last_avail | (vr->avail_wrap ? VRING_PACKED_WRAP : 0)) |
	       (uint32_t)(vr->used_idx | (vr->used_wrap ? VRING_PACKED_WRAP : 0)) << 16;
}

/* Packed slots are checked against the ring size at start (vring_packed_start). */
void vring_set_base(struct vring *vr, uint32_t base)
{
	vr->last_avail = (uint16_t)base;
	if (!vr->packed)
		return;
	vr->last_avail = base & 0x7fff;
	vr->avail_wrap = base & VRING_PACKED_WRAP;
	vr->used_idx = (base >> 16) & 0x7fff;
	vr->used_wrap = (base >> 16) & VRING_PACKED_WRAP;
}
