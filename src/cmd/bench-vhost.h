/* `ioplane bench --vhost-user PATH`: a vhost-user-blk or (--scsi)
 * vhost-user-scsi front-end that drives a back-end (ioplane serve,
 * qemu-storage-daemon) without a VM. The guest memory is one memfd shared
 * with the back-end; each queue's request slots use three fixed descriptors
 * (blk: header, data, status; scsi: header, data-out or response, response
 * or data-in).
 *
 * THREADING RULE: single-threaded; everything belongs to the caller. */
#ifndef IOPLANE_BENCH_VHOST_H
#define IOPLANE_BENCH_VHOST_H

#include <stdbool.h>
#include <stdint.h>

#include "export/vhost-user.h"
#include "export/virtio-blk.h"

/* bench.c hands the whole command line over when it sees --vhost-user. */
int cmd_bench_vhost(int argc, char **argv);

struct vhc_slot {
	uint64_t start;             /* clock_ticks() at submission */
	uint64_t offset;            /* bytes */
	struct virtio_blk_hdr *hdr; /* the slot's request header (blk) */
	uint8_t *meta;              /* the same bytes (scsi: header, response at +128) */
	uint8_t *status;
	uint8_t *buf;
	uint64_t hdr_gpa, status_gpa, buf_gpa;
	uint32_t len;
	bool busy;
};

struct vhc_queue {
	unsigned idx;
	uint16_t num;
	uint64_t desc_gpa, avail_gpa, used_gpa;
	struct vring_desc *desc;
	struct vring_avail *avail;
	struct vring_used *used;
	uint16_t avail_idx;  /* next avail entry we write */
	uint16_t kicked_idx; /* avail idx at the last publish */
	uint16_t last_used;
	int kick_fd, call_fd;
	/* Packed layout: the descriptor ring at desc_gpa, the driver event
	 * area at avail_gpa, the device event area at used_gpa. */
	bool packed;
	bool avail_wrap, used_wrap;
	uint16_t pk_avail, pk_used; /* next slot to make available, to find used */
	uint8_t *pk_ndesc;          /* descriptors each request slot took */
	uint16_t pk_event_flags;    /* what we last wrote to the driver event area */
	struct vhc_slot *slots;
	unsigned nslots;
	unsigned *free;
	unsigned nfree;
};

struct vhc {
	const char *path;
	int sock;
	int memfd;
	uint8_t *mem;
	uint64_t mem_size;
	uint64_t features, pf; /* negotiated */
	bool want_inflight;
	bool scsi;          /* virtio-scsi: queues 0 and 1 are control and event */
	bool packed;        /* VIRTIO_F_RING_PACKED */
	unsigned first_req; /* the first request queue: 0, or 2 for scsi */
	int inflight_fd;
	uint64_t inflight_size;
	uint16_t queue_size;
	unsigned nq;
	struct vhc_queue *q;
	struct virtio_blk_config cfg;
	uint64_t capacity; /* bytes */
	uint32_t bufsize;
	unsigned depth;
};

/* Lay out memory for nq queues with `depth` slots in all of bufsize bytes. */
int vhc_init(struct vhc *c, unsigned nq, unsigned depth, uint32_t bufsize);
void vhc_free(struct vhc *c);
/* Connect and negotiate everything; rings start. reconnect: resume rings
 * that already hold requests (inflight area, bases from the used rings). */
int vhc_connect(struct vhc *c, bool reconnect);
/* Stop the rings (GET_VRING_BASE) and close. */
int vhc_disconnect(struct vhc *c);
/* Put a request on slot s of q (not visible until vhc_publish). */
void vhc_submit(struct vhc *c, struct vhc_queue *q, unsigned s, uint32_t type, uint64_t offset,
		uint32_t len);
/* Make queued requests visible and kick if the back-end wants it. */
void vhc_publish(struct vhc_queue *q, bool event_idx);
/* Next completed slot, or -1. arm: about to sleep, so when empty ask for a call
 * (EVENT_IDX: at the next used entry) and look once more; else the caller
 * polls (packed: calls are disabled, as a polling guest driver does). */
int vhc_next_used(struct vhc_queue *q, bool arm, bool event_idx);
bool vhc_event_idx(const struct vhc *c);
/* The request of slot sl succeeded (blk status, scsi status and response). */
bool vhc_slot_ok(const struct vhc *c, const struct vhc_slot *sl);
/* scsi: a READ CAPACITY (16) answer in sl's buffer: sets c->capacity. */
void vhc_scsi_capacity(struct vhc *c, const struct vhc_slot *sl);

/* True when q has used entries we have not taken. */
bool vhc_used_pending(const struct vhc_queue *q);

/* ---- bench-vhost-packed.c: the driver side of packed rings ---- */
void vhc_packed_init(struct vhc_queue *q);
bool vhc_packed_kick_wanted(const struct vhc_queue *q);
int vhc_packed_next_used(struct vhc_queue *q, bool arm, bool event_idx);
bool vhc_packed_pending(const struct vhc_queue *q);

/* vhc_packed_put is inline (with its helpers): vhc_submit's descriptors then
 * go to the ring without a trip through memory, about 30 instructions less
 * per request. */
static inline uint16_t vhc_pk_avail_flags(bool wrap)
{
	return wrap ? VRING_PACKED_DESC_F_AVAIL : VRING_PACKED_DESC_F_USED;
}

#define VHC_PK_AVAIL_USED (VRING_PACKED_DESC_F_AVAIL | VRING_PACKED_DESC_F_USED)

static inline uint16_t vhc_pk_desc_flags(const struct vring_desc *d, uint16_t av)
{
	return (uint16_t)((d->flags & (VRING_DESC_F_NEXT | VRING_DESC_F_WRITE)) | av);
}

static inline void vhc_pk_put_desc(struct vring_packed_desc *p, const struct vring_desc *d,
				   uint16_t id, uint16_t av)
{
	*p = (struct vring_packed_desc){d->addr, d->len, id, vhc_pk_desc_flags(d, av)};
}

/* Make the chain d[0, n) (NEXT flags; next indices ignored) of slot s
 * available. Each chain is made available as soon as it is written, its head's flags
 * last with a release barrier, rather than a batch at vhc_publish as on a
 * split ring: a polling back-end then takes the first requests while the
 * rest are still being written, and the two sides work in parallel. (Holding
 * the first head of a batch back until the publish, which the in-order ring
 * would allow, made a polling back-end pay about 40% more CPU per request
 * and now and then fall asleep between rounds.) A chain that does not cross
 * the ring's end, nearly all, is written without a wrap check per
 * descriptor. */
static inline void vhc_packed_put(struct vhc_queue *q, unsigned s, const struct vring_desc *d,
				  unsigned n)
{
	struct vring_packed_desc *r = (struct vring_packed_desc *)q->desc;
	unsigned i, head = q->pk_avail, slot = head + 1, num = q->num;
	uint16_t av = vhc_pk_avail_flags(q->avail_wrap), head_flags = vhc_pk_desc_flags(&d[0], av);

	r[head].addr = d[0].addr; /* its flags come last: they make the chain available */
	r[head].len = d[0].len;
	r[head].id = (uint16_t)s;
	if (head + n < num && n <= 3) { /* a slot's chain has at most three */
		if (n > 1)
			vhc_pk_put_desc(&r[head + 1], &d[1], (uint16_t)s, av);
		if (n > 2)
			vhc_pk_put_desc(&r[head + 2], &d[2], (uint16_t)s, av);
		slot = head + n;
	} else {
		for (i = 1; i <= n; i++) {
			if (slot == num) {
				slot = 0;
				av ^= VHC_PK_AVAIL_USED;
			}
			if (i < n)
				vhc_pk_put_desc(&r[slot++], &d[i], (uint16_t)s, av);
		}
	}
	__atomic_store_n(&r[head].flags, head_flags, __ATOMIC_RELEASE);
	q->pk_ndesc[s] = (uint8_t)n;
	q->pk_avail = (uint16_t)slot;
	q->avail_wrap = av == VRING_PACKED_DESC_F_AVAIL;
}

#endif
