/* Split virtqueues (virtio 1.2 section 2.7) from the device side: guest
 * memory regions and address translation, descriptor chain walking with every
 * check an untrusted driver needs, used ring updates, EVENT_IDX notification
 * decisions and inflight tracking in the vhost-user shared inflight region.
 *
 * THREADING RULE: a struct vring belongs to one thread at a time: the control
 * thread while its queue is stopped, the queue's iothread while it runs. The
 * guest memory it points into is shared with an untrusted driver that may
 * change it at any moment: every field is read once into a local. */
#ifndef IOPLANE_VRING_H
#define IOPLANE_VRING_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define VRING_DESC_F_NEXT 1
#define VRING_DESC_F_WRITE 2
#define VRING_DESC_F_INDIRECT 4
#define VRING_USED_F_NO_NOTIFY 1
#define VRING_AVAIL_F_NO_INTERRUPT 1
#define VIRTIO_RING_F_INDIRECT_DESC 28
#define VIRTIO_RING_F_EVENT_IDX 29
#define VIRTIO_F_RING_PACKED 34

/* Packed virtqueues (virtio 1.2 section 2.8). */
#define VRING_PACKED_DESC_F_AVAIL (1u << 7)
#define VRING_PACKED_DESC_F_USED (1u << 15)
#define VRING_PACKED_EVENT_ENABLE 0
#define VRING_PACKED_EVENT_DISABLE 1
#define VRING_PACKED_EVENT_DESC 2
#define VRING_PACKED_WRAP 0x8000u /* the wrap counter bit of an index */

struct vring_packed_desc {
	uint64_t addr;
	uint32_t len;
	uint16_t id;
	uint16_t flags;
};

struct vring_packed_event {
	uint16_t off_wrap;
	uint16_t flags;
};

#define VRING_MAX_SIZE 1024  /* largest queue accepted (QEMU's maximum too) */
#define VRING_MAX_REGIONS 32 /* memory slots (GET_MAX_MEM_SLOTS) */

struct vring_desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
	uint16_t next;
};

struct vring_avail {
	uint16_t flags;
	uint16_t idx;
	uint16_t ring[]; /* num entries, then used_event */
};

struct vring_used_elem {
	uint32_t id;
	uint32_t len;
};

struct vring_used {
	uint16_t flags;
	uint16_t idx;
	struct vring_used_elem ring[]; /* num entries, then avail_event */
};

/* Byte sizes of the three parts of a ring of `num` entries (with the event
 * index fields). */
static inline uint64_t vring_desc_size(unsigned num)
{
	return 16ull * num;
}
static inline uint64_t vring_avail_size(unsigned num)
{
	return 6ull + 2ull * num;
}
static inline uint64_t vring_used_size(unsigned num)
{
	return 6ull + 8ull * num;
}

/* One guest memory region mapped here: guest physical [gpa, gpa+size) is
 * front-end virtual [uva, uva+size) and host [host, host+size). */
struct vring_region {
	uint64_t gpa, uva, size;
	uint8_t *host;
	/* the mapping to undo (vhost-user.c) and its SIGBUS guard handle */
	void *map_base;
	size_t map_len;
	int guard;
};

/* Immutable while any queue using it runs. */
struct vring_mem {
	unsigned nregions;
	struct vring_region r[VRING_MAX_REGIONS];
};

/* Host pointer for [uva, uva+len) inside one region, or NULL. */
void *vring_mem_uva(const struct vring_mem *m, uint64_t uva, uint64_t len);
/* Host pointer for guest [gpa, gpa+len) inside one region, or NULL. */
void *vring_mem_gpa(const struct vring_mem *m, uint64_t gpa, uint64_t len);
/* Append guest [gpa, gpa+len) to iov (split where regions meet). Returns the
 * number of entries used, -EFAULT if some byte is not mapped, -E2BIG if more
 * than `max` entries would be needed. */
int vring_mem_map(const struct vring_mem *m, uint64_t gpa, uint32_t len, struct iovec *iov,
		  unsigned max);

/* A copy of the first region of a memory table, the one vring_map_buf()
 * maps without a call (a guest's RAM is one region, or two around the PCI
 * hole); a walk keeps it in registers. An empty table gives a region that
 * holds nothing. */
struct vring_fast_region {
	uint64_t gpa, size;
	uint8_t *host;
};

static inline struct vring_fast_region vring_fast_region(const struct vring_mem *m)
{
	if (!m->nregions)
		return (struct vring_fast_region){0, 0, NULL};
	return (struct vring_fast_region){m->r[0].gpa, m->r[0].size, m->r[0].host};
}

/* Host address of guest [gpa, gpa+len) if it lies in f (vring_mem_map would
 * find the same region first and make it the same one iovec), else NULL. */
static inline uint8_t *vring_fast_gpa(const struct vring_fast_region *f, uint64_t gpa, uint32_t len)
{
	uint64_t off = gpa - f->gpa;

	return off < f->size && len <= f->size - off ? f->host + off : NULL;
}

/* vring_mem_map() of a buffer of len > 0 bytes, without the call when it
 * lies in f. */
static inline int vring_map_buf(const struct vring_mem *m, const struct vring_fast_region *f,
				uint64_t gpa, uint32_t len, struct iovec *iov, unsigned max)
{
	uint8_t *h = max ? vring_fast_gpa(f, gpa, len) : NULL;

	if (__builtin_expect(h != NULL, 1)) {
		iov->iov_base = h;
		iov->iov_len = len;
		return 1;
	}
	return vring_mem_map(m, gpa, len, iov, max);
}

/* Inflight region of one queue ("Inflight I/O tracking", split layout). */
struct vring_inflight_desc {
	uint8_t inflight;
	uint8_t padding[5];
	uint16_t next;
	uint64_t counter;
};

struct vring_inflight {
	uint64_t features;
	uint16_t version;
	uint16_t desc_num;
	uint16_t last_batch_head;
	uint16_t used_idx;
	struct vring_inflight_desc desc[];
};

/* Bytes one queue of `num` entries takes in the inflight area. */
static inline uint64_t vring_inflight_size(unsigned num)
{
	return (16ull + 16ull * num + 63) & ~63ull;
}

struct vring {
	/* Set up while stopped. */
	uint16_t num; /* a power of two, 1..VRING_MAX_SIZE */
	struct vring_desc *desc;
	struct vring_avail *avail;
	struct vring_used *used;
	const struct vring_mem *mem;
	bool event_idx, indirect;
	struct vring_inflight *inflight; /* NULL: no tracking */
	/* Dirty log (VHOST_F_LOG_ALL, live migration): one bit per 4 KiB guest
	 * page, shared with the front-end, which reads it while we write;
	 * NULL: not logging. The used ring is logged at log_used_gpa when
	 * log_used (VHOST_VRING_F_LOG). */
	uint8_t *log;
	uint64_t log_size, log_used_gpa;
	bool log_used;

	/* Packed layout (VIRTIO_F_RING_PACKED): desc, avail and used above are
	 * then NULL, and these are used instead. */
	bool packed;
	struct vring_packed_desc *pdesc;
	struct vring_packed_event *driver_event; /* the driver area: our notifications */
	struct vring_packed_event *device_event; /* the device area: its kicks */
	/* Runtime state. Packed: last_avail and used_idx are slot numbers,
	 * each with its wrap counter. */
	bool avail_wrap, used_wrap;
	uint16_t last_avail;     /* next avail entry to take */
	uint16_t used_idx;       /* next used entry (published by vring_flush) */
	uint16_t signalled_used; /* split: used idx when we last decided about notifying */
	bool signalled_valid;
	uint16_t batch;   /* used entries written since the last flush */
	uint16_t inuse;   /* chains taken and not yet used */
	bool notify_off;  /* kicks suppressed */
	uint64_t counter; /* inflight order counter */
	/* Packed: used slots written since the last notification decision (the
	 * EVENT_IDX window; slot numbers alone cannot tell a lap from none). */
	uint16_t pk_slots;
	/* Packed: the AVAIL/USED bits of a used entry: used_wrap's, set at
	 * start and flipped with it. */
	uint16_t pk_used_flags;
	/* Packed: descriptors each buffer id took (the used entry skips as
	 * many; 1 for an id never given out). */
	uint16_t pk_ndesc[VRING_MAX_SIZE];
};

#define VRING_LOG_PAGE 4096u

/* Mark guest [gpa, gpa+len) dirty in vr's log (pages past its end are not
 * ours to mark and are skipped). */
void vring_log_gpa(const struct vring *vr, uint64_t gpa, uint64_t len);
/* Mark the guest pages behind host iovecs (from vring_pop) dirty. */
void vring_log_iov(const struct vring *vr, const struct iovec *iov, unsigned n);

/* A walked chain: iov[0, nout) device-readable, iov[nout, nout+nin)
 * device-writable. The caller provides iov and max_iov. */
struct vring_chain {
	uint16_t head;
	unsigned nout, nin;
	uint64_t out_len, in_len;
	struct iovec *iov;
	unsigned max_iov;
	int err; /* VRING_POP_BROKEN: how the driver broke the rules (-errno) */
};

/* What vring_pop() found. */
enum vring_pop_result {
	VRING_POP_EMPTY,  /* no chain is available */
	VRING_POP_CHAIN,  /* the next chain is taken into *c */
	VRING_POP_BROKEN, /* the driver broke the rules (c->err): the queue must
			   * stop, the device needs reset */
};

/* Checks and initialises a ring before it starts: sizes, inflight region
 * (fixes a half-written last batch, computes last_avail from it). Returns
 * -EINVAL if the layout is unusable. */
int vring_start(struct vring *vr);

/* Take the next available chain (inline below). */
static inline enum vring_pop_result vring_pop(struct vring *vr, struct vring_chain *c);
/* Walk the chain starting at `head` (pop and inflight resubmission). */
int vring_walk(const struct vring *vr, uint16_t head, struct vring_chain *c);
/* Put a finished chain on the used ring (not yet visible to the driver;
 * inline below). */
static inline void vring_push(struct vring *vr, uint16_t head, uint32_t len);
/* Make the pushed entries visible; true when the driver wants a notification. */
bool vring_flush(struct vring *vr);

/* True when the driver made chains available that we have not taken. */
bool vring_avail_pending(const struct vring *vr);
/* Kick suppression: disable while we are going to look anyway; enable
 * returns true if chains arrived meanwhile (look again). */
void vring_disable_notify(struct vring *vr);
bool vring_enable_notify(struct vring *vr);

/* Inflight chains to resubmit after a reconnect, oldest first. Returns how
 * many heads were stored (at most max). Call after vring_start. */
unsigned vring_inflight_heads(const struct vring *vr, uint16_t *heads, unsigned max);

/* The ring position to save and restore (GET/SET_VRING_BASE): split, the next
 * avail index; packed, the next avail slot and its wrap counter in bits
 * 0-15 and the next used slot and its counter in bits 16-31, as QEMU does. */
uint32_t vring_get_base(const struct vring *vr);
void vring_set_base(struct vring *vr, uint32_t base);

/* ---- internal: vring.c for vring-packed.c ---- */
/* One buffer descriptor into the chain (inline: split chains and packed
 * indirect tables walk it per descriptor); f is vring_fast_region(vr->mem). */
static inline int vring_walk_buffer(const struct vring *vr, const struct vring_fast_region *f,
				    const struct vring_desc *d, struct vring_chain *c)
{
	unsigned used = c->nout + c->nin;
	int n = 0;

	if (d->flags & VRING_DESC_F_WRITE) {
		c->in_len += d->len;
	} else {
		/* "The driver MUST place any device-writable descriptor elements
		 * after any device-readable descriptor elements." */
		if (c->nin || c->in_len)
			return -EINVAL;
		c->out_len += d->len;
	}
	/* The used length is 32 bits: so is any sane request. */
	if (c->in_len > UINT32_MAX || c->out_len > UINT32_MAX)
		return -EINVAL;
	if (d->len) {
		n = vring_map_buf(vr->mem, f, d->addr, d->len, c->iov + used, c->max_iov - used);
		if (n < 0)
			return n;
	}
	if (d->flags & VRING_DESC_F_WRITE)
		c->nin += (unsigned)n;
	else
		c->nout += (unsigned)n;
	return 0;
}

int vring_packed_start(struct vring *vr);
enum vring_pop_result vring_split_pop(struct vring *vr, struct vring_chain *c);
enum vring_pop_result vring_packed_pop(struct vring *vr, struct vring_chain *c);
void vring_split_push(struct vring *vr, uint16_t head, uint32_t len);
void vring_packed_push(struct vring *vr, uint16_t id, uint32_t len);

/* Per request, so the layout is chosen here rather than in a function of
 * its own: a call through one would cost a packed ring a second call and its
 * register saves (about 15 instructions per request). */
static inline enum vring_pop_result vring_pop(struct vring *vr, struct vring_chain *c)
{
	return vr->packed ? vring_packed_pop(vr, c) : vring_split_pop(vr, c);
}

static inline void vring_push(struct vring *vr, uint16_t head, uint32_t len)
{
	if (vr->packed)
		vring_packed_push(vr, head, len);
	else
		vring_split_push(vr, head, len);
}
bool vring_packed_flush(struct vring *vr);
bool vring_packed_avail_pending(const struct vring *vr);
void vring_packed_notify(struct vring *vr, bool on);

static inline bool vring_need_event(uint16_t event, uint16_t new_idx, uint16_t old)
{
	return (uint16_t)(new_idx - event - 1) < (uint16_t)(new_idx - old);
}

#endif
