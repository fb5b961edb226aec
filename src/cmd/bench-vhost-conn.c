/* The front-end half of `ioplane bench --vhost-user`: memfd guest memory,
 * the vhost-user handshake (in QEMU's order, so that any back-end that works
 * with QEMU works here), and the driver side of split virtqueues.
 *
 * THREADING RULE: single-threaded; struct vhc belongs to the caller. */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "cmd/bench-vhost.h"

#define PAGE 4096ull
#define ALIGN_UP(x, a) (((x) + (a)-1) & ~((uint64_t)(a)-1))
#define SLOT_META 256 /* header and status (blk), or header and response (scsi) */
#define SCSI_RESP_OFF 128
#define SCSI_HDR_LEN 51   /* lun, id, attributes, 32-byte CDB */
#define SCSI_RESP_LEN 108 /* 96 bytes of sense */
#define RECONNECT_WAIT_NS (30ull * 1000000000ull)

static const uint64_t vhc_want_features =
	1ull << VIRTIO_F_VERSION_1 | 1ull << VIRTIO_RING_F_EVENT_IDX |
	1ull << VHOST_USER_F_PROTOCOL_FEATURES | 1ull << VIRTIO_BLK_F_FLUSH |
	1ull << VIRTIO_BLK_F_BLK_SIZE | 1ull << VIRTIO_BLK_F_MQ | 1ull << VIRTIO_BLK_F_SEG_MAX |
	1ull << VIRTIO_BLK_F_SIZE_MAX | 1ull << VIRTIO_BLK_F_TOPOLOGY | 1ull << VIRTIO_BLK_F_RO |
	1ull << VIRTIO_BLK_F_CONFIG_WCE | 1ull << VIRTIO_BLK_F_DISCARD |
	1ull << VIRTIO_BLK_F_WRITE_ZEROES;

static const uint64_t vhc_want_scsi = 1ull << VIRTIO_F_VERSION_1 | 1ull << VIRTIO_RING_F_EVENT_IDX |
				      1ull << VHOST_USER_F_PROTOCOL_FEATURES;

bool vhc_event_idx(const struct vhc *c)
{
	return c->features & (1ull << VIRTIO_RING_F_EVENT_IDX);
}

/* ---- memory layout -------------------------------------------------------------- */

static uint16_t ring_size(unsigned nslots)
{
	unsigned n = 128; /* QEMU's default queue-size */

	while (n < 3 * nslots)
		n *= 2;
	return (uint16_t)n;
}

/* Ring, slot metadata and buffers of one queue, from *off on. */
static void queue_layout(struct vhc *c, struct vhc_queue *q, uint64_t *off, uint64_t buf_stride)
{
	unsigned s;

	q->desc_gpa = *off;
	q->avail_gpa = ALIGN_UP(q->desc_gpa + vring_desc_size(q->num), 64);
	q->used_gpa = ALIGN_UP(q->avail_gpa + vring_avail_size(q->num), 64);
	*off = ALIGN_UP(q->used_gpa + vring_used_size(q->num), 64);
	for (s = 0; s < q->nslots; s++) {
		q->slots[s].hdr_gpa = *off + s * SLOT_META;
		q->slots[s].status_gpa = q->slots[s].hdr_gpa + 16;
	}
	*off = ALIGN_UP(*off + q->nslots * SLOT_META, PAGE);
	for (s = 0; s < q->nslots; s++) {
		q->slots[s].buf_gpa = *off;
		*off += buf_stride;
	}
	(void)c;
}

static void queue_pointers(struct vhc *c, struct vhc_queue *q)
{
	unsigned s;

	q->desc = (struct vring_desc *)(c->mem + q->desc_gpa);
	q->avail = (struct vring_avail *)(c->mem + q->avail_gpa);
	q->used = (struct vring_used *)(c->mem + q->used_gpa);
	for (s = 0; s < q->nslots; s++) {
		struct vhc_slot *sl = &q->slots[s];

		sl->hdr = (struct virtio_blk_hdr *)(c->mem + sl->hdr_gpa);
		sl->meta = c->mem + sl->hdr_gpa;
		sl->status = c->mem + sl->status_gpa;
		sl->buf = c->mem + sl->buf_gpa;
		q->free[s] = q->nslots - 1 - s;
	}
	q->nfree = q->nslots;
}

static int queue_alloc(struct vhc_queue *q, unsigned idx, unsigned nslots)
{
	q->idx = idx;
	q->nslots = nslots;
	q->kick_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	q->call_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	q->slots = calloc(nslots, sizeof(*q->slots));
	q->free = calloc(nslots, sizeof(*q->free));
	if (q->kick_fd < 0 || q->call_fd < 0 || !q->slots || !q->free)
		return -ENOMEM;
	return 0;
}

int vhc_init(struct vhc *c, unsigned nq, unsigned depth, uint32_t bufsize)
{
	uint64_t off = 0, stride = ALIGN_UP(bufsize ? bufsize : 1, PAGE);
	unsigned i, maxslots = 0;

	c->sock = c->memfd = c->inflight_fd = -1;
	c->first_req = c->scsi ? 2 : 0;
	c->nq = nq + c->first_req;
	c->depth = depth;
	c->bufsize = bufsize;
	c->q = calloc(c->nq, sizeof(*c->q));
	if (!c->q)
		return -ENOMEM;
	for (i = 0; i < c->nq; i++) {
		/* depth spread over the request queues; every queue gets a slot. */
		unsigned r = i - c->first_req;
		unsigned n = i < c->first_req ? 1 : depth / nq + (r < depth % nq);

		if (queue_alloc(&c->q[i], i, n ? n : 1) < 0)
			return -ENOMEM;
		if (c->q[i].nslots > maxslots)
			maxslots = c->q[i].nslots;
	}
	c->queue_size = ring_size(maxslots);
	if (c->queue_size > VRING_MAX_SIZE)
		return -E2BIG;
	for (i = 0; i < c->nq; i++) {
		c->q[i].num = c->queue_size;
		queue_layout(c, &c->q[i], &off, stride);
	}
	c->mem_size = ALIGN_UP(off, 2ull << 20);
	c->memfd = memfd_create("ioplane-bench-guest", MFD_CLOEXEC);
	if (c->memfd < 0 || ftruncate(c->memfd, (off_t)c->mem_size) < 0)
		return -errno;
	c->mem = mmap(NULL, c->mem_size, PROT_READ | PROT_WRITE, MAP_SHARED, c->memfd, 0);
	if (c->mem == MAP_FAILED) {
		c->mem = NULL;
		return -errno;
	}
	for (i = 0; i < c->nq; i++) {
		queue_pointers(c, &c->q[i]);
		if (c->packed)
			vhc_packed_init(&c->q[i]);
	}
	return 0;
}

void vhc_free(struct vhc *c)
{
	unsigned i;

	for (i = 0; c->q && i < c->nq; i++) {
		if (c->q[i].kick_fd >= 0)
			close(c->q[i].kick_fd);
		if (c->q[i].call_fd >= 0)
			close(c->q[i].call_fd);
		free(c->q[i].slots);
		free(c->q[i].free);
		free(c->q[i].pk_ndesc);
	}
	free(c->q);
	if (c->mem)
		munmap(c->mem, c->mem_size);
	if (c->memfd >= 0)
		close(c->memfd);
	if (c->inflight_fd >= 0)
		close(c->inflight_fd);
	if (c->sock >= 0)
		close(c->sock);
}

/* ---- messages ---------------------------------------------------------------------- */

static int vhc_reply(struct vhc *c, uint32_t req, void *p, uint32_t size, int *fd);

static int vhc_reply_u64(struct vhc *c, uint32_t req, uint64_t *v)
{
	return vhc_reply(c, req, v, sizeof(*v), NULL);
}

static int vhc_send(struct vhc *c, uint32_t req, const void *p, uint32_t size, const int *fds,
		    unsigned nfds, bool ack)
{
	bool need = ack && (c->pf & (1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK));
	struct vu_msg_hdr h = {req, VHOST_USER_VERSION | (need ? VHOST_USER_NEED_REPLY : 0), size};
	struct iovec iov[2] = {{&h, sizeof(h)}, {(void *)p, size}};
	union {
		char buf[CMSG_SPACE(VU_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	uint64_t res;
	ssize_t n;

	if (nfds) {
		struct cmsghdr *cm;

		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	n = sendmsg(c->sock, &mh, MSG_NOSIGNAL);
	if (n != (ssize_t)(sizeof(h) + size))
		return n < 0 ? -errno : -EIO;
	if (!need)
		return 0;
	return vhc_reply_u64(c, req, &res) ?: (res ? -EIO : 0);
}

/* Read a reply to `req` of exactly `size` payload bytes (an fd too if fd). */
static int vhc_reply(struct vhc *c, uint32_t req, void *p, uint32_t size, int *fd)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct vu_msg_hdr h;
	struct iovec iov = {&h, sizeof(h)};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf)};
	struct cmsghdr *cm;
	ssize_t n = recvmsg(c->sock, &mh, MSG_WAITALL | MSG_CMSG_CLOEXEC);

	if (n != (ssize_t)sizeof(h))
		return n < 0 ? -errno : -ECONNRESET;
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_type == SCM_RIGHTS && fd)
			memcpy(fd, CMSG_DATA(cm), sizeof(int));
		else if (cm->cmsg_type == SCM_RIGHTS)
			close(*(int *)CMSG_DATA(cm));
	}
	if (h.request != req || !(h.flags & VHOST_USER_REPLY) || h.size != size)
		return -EPROTO;
	if (size && recv(c->sock, p, size, MSG_WAITALL) != (ssize_t)size)
		return -ECONNRESET;
	return 0;
}

static int vhc_get_u64(struct vhc *c, uint32_t req, uint64_t *v)
{
	return vhc_send(c, req, NULL, 0, NULL, 0, false) ?: vhc_reply_u64(c, req, v);
}

static int vhc_set_u64(struct vhc *c, uint32_t req, uint64_t v)
{
	return vhc_send(c, req, &v, sizeof(v), NULL, 0, false);
}

static int vhc_state(struct vhc *c, uint32_t req, unsigned idx, unsigned num)
{
	struct vu_vring_state s = {idx, num};

	return vhc_send(c, req, &s, sizeof(s), NULL, 0, false);
}

/* ---- handshake ----------------------------------------------------------------------- */

static int vhc_open_socket(struct vhc *c, bool retry)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timespec ts = {0, 20 * 1000000};
	unsigned tries = retry ? (unsigned)(RECONNECT_WAIT_NS / 20000000ull) : 1;

	if (strlen(c->path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, c->path, strlen(c->path) + 1);
	while (tries--) {
		c->sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (c->sock < 0)
			return -errno;
		if (connect(c->sock, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			return 0;
		close(c->sock);
		c->sock = -1;
		if (tries)
			nanosleep(&ts, NULL);
	}
	return -errno;
}

static int vhc_negotiate(struct vhc *c)
{
	uint64_t f, pf, nq,
		want_pf = 1ull << VHOST_USER_PROTOCOL_F_MQ |
			  1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK |
			  1ull << VHOST_USER_PROTOCOL_F_CONFIG;
	struct {
		uint32_t offset, size, flags;
		struct virtio_blk_config cfg;
	} __attribute__((packed)) cm = {0, sizeof(struct virtio_blk_config), 0, {0}};
	int ret;

	if (c->want_inflight)
		want_pf |= 1ull << VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD;
	ret = vhc_get_u64(c, VHOST_USER_GET_FEATURES, &f);
	if (ret || !(f & (1ull << VHOST_USER_F_PROTOCOL_FEATURES)))
		return ret ?: -EPROTO;
	ret = vhc_get_u64(c, VHOST_USER_GET_PROTOCOL_FEATURES, &pf);
	if (ret || ((pf & want_pf) != want_pf && c->want_inflight))
		return ret ?: -ENOTSUP;
	c->pf = pf & want_pf;
	ret = vhc_set_u64(c, VHOST_USER_SET_PROTOCOL_FEATURES, c->pf);
	if (!ret && (c->pf & 1ull << VHOST_USER_PROTOCOL_F_MQ))
		ret = vhc_get_u64(c, VHOST_USER_GET_QUEUE_NUM, &nq);
	else
		nq = 1;
	if (ret || nq < c->nq)
		return ret ?: -ERANGE;
	ret = vhc_send(c, VHOST_USER_SET_OWNER, NULL, 0, NULL, 0, false);
	if (!ret)
		ret = vhc_send(c, VHOST_USER_GET_CONFIG, &cm, sizeof(cm), NULL, 0, false);
	if (!ret)
		ret = vhc_reply(c, VHOST_USER_GET_CONFIG, &cm, sizeof(cm), NULL);
	if (ret)
		return ret;
	c->cfg = cm.cfg;
	c->capacity = c->cfg.capacity * 512;
	c->features = f & (c->scsi ? vhc_want_scsi : vhc_want_features);
	if (c->packed) {
		if (!(f & 1ull << VIRTIO_F_RING_PACKED))
			return -ENOTSUP;
		c->features |= 1ull << VIRTIO_F_RING_PACKED;
	}
	return vhc_set_u64(c, VHOST_USER_SET_FEATURES, c->features);
}

static int vhc_mem_table(struct vhc *c)
{
	struct vu_mem_table t = {.nregions = 1};

	t.r[0].gpa = 0;
	t.r[0].size = c->mem_size;
	t.r[0].uva = (uintptr_t)c->mem;
	t.r[0].mmap_offset = 0;
	return vhc_send(c, VHOST_USER_SET_MEM_TABLE, &t, 8 + sizeof(t.r[0]), &c->memfd, 1, true);
}

static int vhc_inflight(struct vhc *c, bool reconnect)
{
	struct vu_inflight_msg m = {0, 0, (uint16_t)c->nq, c->queue_size};
	int ret;

	if (!reconnect) {
		ret = vhc_send(c, VHOST_USER_GET_INFLIGHT_FD, &m, sizeof(m), NULL, 0, false);
		if (!ret)
			ret = vhc_reply(c, VHOST_USER_GET_INFLIGHT_FD, &m, sizeof(m),
					&c->inflight_fd);
		if (ret || c->inflight_fd < 0)
			return ret ?: -EPROTO;
		c->inflight_size = m.mmap_size;
	}
	m.mmap_size = c->inflight_size;
	m.mmap_offset = 0;
	return vhc_send(c, VHOST_USER_SET_INFLIGHT_FD, &m, sizeof(m), &c->inflight_fd, 1, false);
}

static int vhc_queue_setup(struct vhc *c, struct vhc_queue *q, bool reconnect)
{
	struct vu_vring_addr a = {
		q->idx, 0, (uintptr_t)q->desc, (uintptr_t)q->used, (uintptr_t)q->avail, 0};
	/* After a reconnect the back-end finds where it was from the used ring
	 * (and the inflight area), as QEMU does when GET_VRING_BASE failed. */
	uint32_t base = reconnect ? __atomic_load_n(&q->used->idx, __ATOMIC_ACQUIRE) : 0;
	uint64_t kick = q->idx, call = q->idx;

	if (c->packed) /* slot 0 with wrap counter 1, avail and used */
		base = VRING_PACKED_WRAP | VRING_PACKED_WRAP << 16;
	return vhc_state(c, VHOST_USER_SET_VRING_NUM, q->idx, q->num) ?:
	       vhc_state(c, VHOST_USER_SET_VRING_BASE, q->idx, base) ?:
	       vhc_send(c, VHOST_USER_SET_VRING_ADDR, &a, sizeof(a), NULL, 0, false) ?:
	       vhc_send(c, VHOST_USER_SET_VRING_KICK, &kick, 8, &q->kick_fd, 1, false) ?:
	       vhc_send(c, VHOST_USER_SET_VRING_CALL, &call, 8, &q->call_fd, 1, false);
}

int vhc_connect(struct vhc *c, bool reconnect)
{
	unsigned i;
	int ret = vhc_open_socket(c, reconnect);

	if (!ret)
		ret = vhc_negotiate(c);
	if (!ret)
		ret = vhc_mem_table(c);
	if (!ret && c->want_inflight)
		ret = vhc_inflight(c, reconnect);
	for (i = 0; !ret && i < c->nq; i++)
		ret = vhc_queue_setup(c, &c->q[i], reconnect);
	for (i = 0; !ret && i < c->nq; i++)
		ret = vhc_state(c, VHOST_USER_SET_VRING_ENABLE, i, 1);
	/* Kick every queue once: requests made available while we were away. */
	for (i = 0; !ret && reconnect && i < c->nq; i++)
		eventfd_write(c->q[i].kick_fd, 1);
	return ret;
}

int vhc_disconnect(struct vhc *c)
{
	struct vu_vring_state s;
	unsigned i;
	int ret = 0;

	for (i = 0; !ret && i < c->nq; i++) {
		ret = vhc_state(c, VHOST_USER_GET_VRING_BASE, i, 0);
		if (!ret)
			ret = vhc_reply(c, VHOST_USER_GET_VRING_BASE, &s, sizeof(s), NULL);
	}
	close(c->sock);
	c->sock = -1;
	return ret;
}

/* ---- the driver side of the rings --------------------------------------------------------- */

/* A SCSI command for a virtio-blk request type: READ/WRITE (16), SYNCHRONIZE
 * CACHE (10) for a flush, READ CAPACITY (16) for GET_ID. */
/* Into a zeroed header: the CDB bytes that are not 0. */
static void scsi_cdb(uint8_t *cdb, uint32_t type, uint64_t offset, uint32_t len)
{
	uint64_t lba = htobe64(offset / 512);
	uint32_t n = htobe32(len / 512);

	if (type == VIRTIO_BLK_T_FLUSH) {
		cdb[0] = 0x35;
		return;
	}
	if (type == VIRTIO_BLK_T_GET_ID) {
		cdb[0] = 0x9e;
		cdb[1] = 0x10;
		cdb[13] = 32;
		return;
	}
	cdb[0] = type == VIRTIO_BLK_T_OUT ? 0x8a : 0x88;
	memcpy(cdb + 2, &lba, 8);
	memcpy(cdb + 10, &n, 4);
}

/* hdr, then data-out and response, or response and data-in. */
static void scsi_descs(struct vhc_queue *q, unsigned s, uint32_t type, uint32_t len,
		       struct vring_desc *d)
{
	struct vhc_slot *sl = &q->slots[s];
	uint16_t h = (uint16_t)(3 * s);
	uint64_t resp = sl->hdr_gpa + SCSI_RESP_OFF;

	d[0] = (struct vring_desc){sl->hdr_gpa, SCSI_HDR_LEN, VRING_DESC_F_NEXT, (uint16_t)(h + 1)};
	if (type == VIRTIO_BLK_T_OUT) {
		d[1] = (struct vring_desc){sl->buf_gpa, len, VRING_DESC_F_NEXT, (uint16_t)(h + 2)};
		d[2] = (struct vring_desc){resp, SCSI_RESP_LEN, VRING_DESC_F_WRITE, 0};
	} else if (type == VIRTIO_BLK_T_FLUSH) {
		d[1] = (struct vring_desc){resp, SCSI_RESP_LEN, VRING_DESC_F_WRITE, 0};
	} else {
		d[1] = (struct vring_desc){resp, SCSI_RESP_LEN,
					   VRING_DESC_F_WRITE | VRING_DESC_F_NEXT,
					   (uint16_t)(h + 2)};
		d[2] = (struct vring_desc){sl->buf_gpa, len, VRING_DESC_F_WRITE, 0};
	}
}

static void scsi_submit(struct vhc_queue *q, unsigned s, uint32_t type, uint64_t offset,
			uint32_t len, struct vring_desc *d)
{
	uint8_t *m = q->slots[s].meta;

	memset(m, 0, SCSI_HDR_LEN);
	m[0] = 1;    /* target 0 */
	m[2] = 0x40; /* LUN 0, flat space */
	m[8] = (uint8_t)s;
	scsi_cdb(m + 19, type, offset, len);
	memset(m + SCSI_RESP_OFF, 0xff, 12);
	scsi_descs(q, s, type, type == VIRTIO_BLK_T_GET_ID ? 32 : len, d);
}

bool vhc_slot_ok(const struct vhc *c, const struct vhc_slot *sl)
{
	if (c->scsi) /* status GOOD, response OK */
		return sl->meta[SCSI_RESP_OFF + 10] == 0 && sl->meta[SCSI_RESP_OFF + 11] == 0;
	return *sl->status == VIRTIO_BLK_S_OK;
}

void vhc_scsi_capacity(struct vhc *c, const struct vhc_slot *sl)
{
	uint64_t last = 0;
	uint32_t bs = 0;

	for (int i = 0; i < 8; i++)
		last = last << 8 | sl->buf[i];
	for (int i = 8; i < 12; i++)
		bs = bs << 8 | sl->buf[i];
	c->capacity = (last + 1) * bs;
}

/* The chain is d[0, n) in order: the split ring takes it as is (the next
 * indices say the same), the packed ring ignores the indices. */
void vhc_submit(struct vhc *c, struct vhc_queue *q, unsigned s, uint32_t type, uint64_t offset,
		uint32_t len)
{
	struct vhc_slot *sl = &q->slots[s];
	struct vring_desc d[3] = {{0}};
	unsigned n = 3;

	if (c->scsi) {
		scsi_submit(q, s, type, offset, len, d);
		n = type == VIRTIO_BLK_T_FLUSH ? 2 : 3;
		goto publish;
	}
	sl->hdr->type = type;
	sl->hdr->ioprio = 0;
	sl->hdr->sector = offset / 512;
	*sl->status = 0xff;
	d[0] = (struct vring_desc){sl->hdr_gpa, 16, VRING_DESC_F_NEXT, (uint16_t)(3 * s + 1)};
	if (type == VIRTIO_BLK_T_FLUSH) {
		n = 2;
	} else {
		d[1] = (struct vring_desc){
			sl->buf_gpa, len,
			VRING_DESC_F_NEXT | (type == VIRTIO_BLK_T_OUT ? 0 : VRING_DESC_F_WRITE),
			(uint16_t)(3 * s + 2)};
	}
	d[n - 1] = (struct vring_desc){sl->status_gpa, 1, VRING_DESC_F_WRITE, 0};
publish:
	sl->offset = offset;
	sl->len = len;
	sl->busy = true;
	q->avail_idx++;
	if (c->packed) {
		vhc_packed_put(q, s, d, n);
		return;
	}
	memcpy(&q->desc[3 * s], d, sizeof(d));
	q->avail->ring[(q->avail_idx - 1) & (q->num - 1)] = (uint16_t)(3 * s);
}

void vhc_publish(struct vhc_queue *q, bool event_idx)
{
	uint16_t old = q->kicked_idx;
	bool kick;

	if (q->avail_idx == old)
		return;
	if (q->packed) {
		q->kicked_idx = q->avail_idx;
		if (vhc_packed_kick_wanted(q))
			eventfd_write(q->kick_fd, 1);
		return;
	}
	__atomic_store_n(&q->avail->idx, q->avail_idx, __ATOMIC_RELEASE);
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if (event_idx)
		kick = vring_need_event(
			__atomic_load_n((uint16_t *)&q->used->ring[q->num], __ATOMIC_RELAXED),
			q->avail_idx, old);
	else
		kick = !(__atomic_load_n(&q->used->flags, __ATOMIC_RELAXED) &
			 VRING_USED_F_NO_NOTIFY);
	q->kicked_idx = q->avail_idx;
	if (kick)
		eventfd_write(q->kick_fd, 1);
}

/* Split: a polling caller leaves used_event where it was, far behind soon, which
 * asks for one call in 2^16 entries (Linux's virtqueue_disable_cb writes 0). */
int vhc_next_used(struct vhc_queue *q, bool arm, bool event_idx)
{
	struct vring_used_elem e;
	uint16_t uidx;

	if (q->packed)
		return vhc_packed_next_used(q, arm, event_idx);
	uidx = __atomic_load_n(&q->used->idx, __ATOMIC_ACQUIRE);

	if (uidx == q->last_used) {
		if (!arm || !event_idx)
			return -1;
		/* Ask for a call at the next used entry, then look once more. */
		__atomic_store_n(&q->avail->ring[q->num], q->last_used, __ATOMIC_RELAXED);
		__atomic_thread_fence(__ATOMIC_SEQ_CST);
		uidx = __atomic_load_n(&q->used->idx, __ATOMIC_ACQUIRE);
		if (uidx == q->last_used)
			return -1;
	}
	e = q->used->ring[q->last_used & (q->num - 1)];
	q->last_used++;
	if (e.id % 3 || e.id / 3 >= q->nslots || !q->slots[e.id / 3].busy)
		return -2; /* the back-end returned something we never gave */
	q->slots[e.id / 3].busy = false;
	return (int)(e.id / 3);
}

bool vhc_used_pending(const struct vhc_queue *q)
{
	if (q->packed)
		return vhc_packed_pending(q);
	return __atomic_load_n(&q->used->idx, __ATOMIC_ACQUIRE) != q->last_used;
}
