/* vhost-user guest memory, the dirty log, the inflight area and the rings' addresses
 * (vu_vq_setup): SET_MEM_TABLE, ADD_MEM_REG,
 * REM_MEM_REG, GET_MAX_MEM_SLOTS, GET_INFLIGHT_FD, SET_INFLIGHT_FD. Regions
 * are mapped whole (from file offset 0, so that hugetlbfs alignment holds)
 * after checking that the file really is that large (touching a mapping past
 * the end of its file would kill the daemon with SIGBUS) and not on FUSE.
 * The front-end may still shrink the file later, so every memory region is
 * also guarded (mapguard.h; without a free guard slot it is refused), and
 * the inflight area too while slots last: a fault then reads zero pages and
 * sets d->mem_faulted, which stops the device's queues.
 *
 * THREADING RULE: control loop only; mappings change only while no queue of
 * the connection runs (every handler here stops them first). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "export/vhost-user-int.h"
#include "util/log.h"
#include "util/mapguard.h"

#define VU_INFLIGHT_MAX (64ull << 20)
/* A log of 1 GiB covers 32 TiB of guest memory. */
#define VU_LOG_MAX (1ull << 30)

/* The file behind fd holds at least `len` bytes (regular files only), and
 * touching its pages never waits for another process: on FUSE a page fault
 * in our mapping waits for the file system's server, which the front-end
 * may run, and stop; the queue's iothread would hang with every client on it. */
static int fd_covers(int fd, uint64_t len)
{
	struct statfs sfs;
	struct stat st;

	if (fstat(fd, &st) < 0 || fstatfs(fd, &sfs) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || st.st_size < 0 || (uint64_t)st.st_size < len)
		return -EINVAL;
	if (sfs.f_type == FUSE_SUPER_MAGIC) {
		log_warn("vhost-user: refusing guest memory in a file on FUSE");
		return -EPERM;
	}
	return 0;
}

static int region_map(const struct vu_mem_region *in, int fd, struct vring_region *out,
		      atomic_int *faulted)
{
	uint64_t len;
	void *p;
	int ret;

	if (!in->size || in->size > UINT64_MAX - in->gpa || in->size > UINT64_MAX - in->uva ||
	    in->mmap_offset > UINT64_MAX - in->size)
		return -EINVAL;
	len = in->mmap_offset + in->size;
	if (len > SIZE_MAX)
		return -EINVAL;
	ret = fd_covers(fd, len);
	if (ret < 0)
		return ret;
	p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	out->gpa = in->gpa;
	out->uva = in->uva;
	out->size = in->size;
	out->host = (uint8_t *)p + in->mmap_offset;
	out->map_base = p;
	out->map_len = (size_t)len;
	/* The front-end can still shrink the file: fault to zero pages. */
	out->guard = mapguard_add(p, (size_t)len, faulted);
	if (out->guard < 0) {
		ret = out->guard;
		out->guard = 0;
		munmap(p, (size_t)len);
		return ret;
	}
	return 0;
}

static void region_unmap(struct vring_region *r)
{
	mapguard_del(r->guard);
	if (r->map_base)
		munmap(r->map_base, r->map_len);
	memset(r, 0, sizeof(*r));
}

static bool ranges_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	return a < b + blen && b < a + alen; /* no wrap: checked in region_map */
}

/* A new region must not overlap any other in guest or front-end space. */
static bool region_overlaps(const struct vring_mem *m, const struct vring_region *r)
{
	unsigned i;

	for (i = 0; i < m->nregions; i++)
		if (ranges_overlap(r->gpa, r->size, m->r[i].gpa, m->r[i].size) ||
		    ranges_overlap(r->uva, r->size, m->r[i].uva, m->r[i].size))
			return true;
	return false;
}

static int mem_add(struct vring_mem *m, const struct vu_mem_region *in, int fd, atomic_int *faulted)
{
	struct vring_region r;
	int ret;

	if (m->nregions == VRING_MAX_REGIONS)
		return -ENOSPC;
	ret = region_map(in, fd, &r, faulted);
	if (ret < 0)
		return ret;
	if (region_overlaps(m, &r)) {
		region_unmap(&r);
		return -EINVAL;
	}
	m->r[m->nregions++] = r;
	return 0;
}

void vu_mem_unmap_all(struct vring_mem *m)
{
	unsigned i;

	for (i = 0; i < m->nregions; i++)
		region_unmap(&m->r[i]);
	m->nregions = 0;
}

int vu_h_set_mem_table(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_mem_table t = {0};
	struct vring_mem m = {0};
	unsigned i;
	int ret;

	(void)rep;
	if (d->hdr.size < 8 || d->hdr.size > sizeof(t))
		return -EINVAL;
	memcpy(&t, d->payload, d->hdr.size);
	/* "The size and ordering of the fds matches the number and ordering
	 * of memory regions." */
	if (t.nregions > VU_MEM_TABLE_MAX || d->hdr.size != 8 + t.nregions * sizeof(t.r[0]) ||
	    d->nfds != t.nregions)
		return -EINVAL;
	if (!vu_stop_all(d))
		return vu_msg_wait(d);
	for (i = 0; i < t.nregions; i++) {
		ret = mem_add(&m, &t.r[i], d->fds[i], &d->mem_faulted);
		if (ret < 0) {
			vu_mem_unmap_all(&m);
			return ret;
		}
	}
	vu_mem_unmap_all(&d->mem);
	d->mem = m;
	return vu_start_ready(d);
}

static int find_region(const struct vring_mem *m, const struct vu_mem_region *in)
{
	unsigned i;

	for (i = 0; i < m->nregions; i++)
		if (m->r[i].gpa == in->gpa && m->r[i].uva == in->uva && m->r[i].size == in->size)
			return (int)i;
	return -1;
}

int vu_h_add_mem_reg(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_mem_single s;
	int ret;

	(void)rep;
	if (!vu_has_pf(d, VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS))
		return -EINVAL;
	memcpy(&s, d->payload, sizeof(s));
	if (find_region(&d->mem, &s.r) >= 0)
		return 0; /* already there */
	if (!vu_stop_all(d))
		return vu_msg_wait(d);
	ret = mem_add(&d->mem, &s.r, d->fds[0], &d->mem_faulted);
	return ret < 0 ? ret : vu_start_ready(d);
}

int vu_h_rem_mem_reg(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_mem_single s;
	int i;

	(void)rep;
	/* "the back-end MAY accept messages with one file descriptor ...
	 * MUST close it without using it otherwise" (msg_reset closes it). */
	if (!vu_has_pf(d, VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS) || d->nfds > 1)
		return -EINVAL;
	memcpy(&s, d->payload, sizeof(s));
	i = find_region(&d->mem, &s.r);
	if (i < 0)
		return -ENOENT;
	if (!vu_stop_all(d))
		return vu_msg_wait(d);
	region_unmap(&d->mem.r[i]);
	d->mem.r[i] = d->mem.r[--d->mem.nregions];
	memset(&d->mem.r[d->mem.nregions], 0, sizeof(d->mem.r[0]));
	return vu_start_ready(d);
}

int vu_h_get_max_mem_slots(struct vu_dev *d, struct vu_reply *rep)
{
	(void)d;
	rep->payload[0] = VRING_MAX_REGIONS;
	rep->size = sizeof(uint64_t);
	return 0;
}

/* ---- inflight area ------------------------------------------------------------ */

void vu_inflight_unmap(struct vu_dev *d)
{
	mapguard_del(d->inflight_guard);
	d->inflight_guard = 0;
	if (d->inflight)
		munmap(d->inflight, d->inflight_len);
	d->inflight = NULL;
	d->inflight_len = 0;
	d->inflight_nq = d->inflight_qsize = 0;
}

struct vring_inflight *vu_inflight_queue(struct vu_dev *d, unsigned idx, unsigned num)
{
	if (!d->inflight || idx >= d->inflight_nq || num != d->inflight_qsize)
		return NULL;
	return (struct vring_inflight *)(d->inflight + idx * vring_inflight_size(num));
}

static int inflight_msg(struct vu_dev *d, struct vu_inflight_msg *m)
{
	if (d->hdr.size < VU_INFLIGHT_MSG_SIZE || d->hdr.size > sizeof(*m) ||
	    !vu_has_pf(d, VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD))
		return -EINVAL;
	memset(m, 0, sizeof(*m));
	memcpy(m, d->payload, VU_INFLIGHT_MSG_SIZE);
	if (!m->num_queues || m->num_queues > d->num_queues || !m->queue_size ||
	    m->queue_size > VRING_MAX_SIZE)
		return -EINVAL;
	return 0;
}

static void inflight_set(struct vu_dev *d, void *p, size_t len, const struct vu_inflight_msg *m)
{
	vu_inflight_unmap(d);
	d->inflight = p;
	d->inflight_len = len;
	/* Out of slots: unguarded, as the area is small and ours to size. */
	d->inflight_guard = mapguard_add(p, len, &d->mem_faulted);
	d->inflight_nq = m->num_queues;
	d->inflight_qsize = m->queue_size;
}

int vu_h_get_inflight_fd(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_inflight_msg m;
	uint64_t len;
	void *p;
	int fd, ret = inflight_msg(d, &m);

	if (ret)
		return ret;
	if (!vu_stop_all(d))
		return vu_msg_wait(d);
	len = m.num_queues * vring_inflight_size(m.queue_size);
	fd = memfd_create("ioplane-inflight", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	/* Sealed, so that the front-end cannot shrink it under our mapping. */
	if (ftruncate(fd, (off_t)len) < 0 || fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		goto fail;
	p = mmap(NULL, (size_t)len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED)
		goto fail;
	inflight_set(d, p, (size_t)len, &m);
	m.mmap_size = len;
	m.mmap_offset = 0;
	memcpy(rep->payload, &m, sizeof(m));
	rep->size = sizeof(m);
	rep->fd = fd;
	return 0;
fail:
	ret = -errno;
	close(fd);
	return ret;
}

/* Before mapping len bytes of the message's fd: it covers them (-errno if
 * not), and no ring runs (1: some stop later, wait for them). */
static int stop_to_map(struct vu_dev *d, uint64_t len)
{
	int ret = fd_covers(d->fds[0], len);

	if (ret)
		return ret;
	return vu_stop_all(d) ? 0 : 1;
}

int vu_h_set_inflight_fd(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_inflight_msg m;
	uint64_t need;
	void *p;
	int ret = inflight_msg(d, &m);

	(void)rep;
	if (ret)
		return ret;
	need = m.num_queues * vring_inflight_size(m.queue_size);
	if (m.mmap_size < need || m.mmap_size > VU_INFLIGHT_MAX || (m.mmap_offset & 4095) ||
	    m.mmap_offset > VU_INFLIGHT_MAX)
		return -EINVAL;
	ret = stop_to_map(d, m.mmap_offset + m.mmap_size);
	if (ret)
		return ret < 0 ? ret : vu_msg_wait(d);
	p = mmap(NULL, (size_t)m.mmap_size, PROT_READ | PROT_WRITE, MAP_SHARED, d->fds[0],
		 (off_t)m.mmap_offset);
	if (p == MAP_FAILED)
		return -errno;
	inflight_set(d, p, (size_t)m.mmap_size, &m);
	return vu_start_ready(d);
}

/* ---- dirty log ---------------------------------------------------------------- */

void vu_log_unmap(struct vu_dev *d)
{
	mapguard_del(d->log_guard);
	d->log_guard = 0;
	if (d->log_map)
		munmap(d->log_map, d->log_map_len);
	d->log = d->log_map = NULL;
	d->log_size = d->log_map_len = 0;
}

/* SET_LOG_BASE (LOG_SHMFD): the log the rings mark while VHOST_F_LOG_ALL is
 * on. The rings stop while it changes (a running ring may be marking the old
 * one) and start again with it. The reply QEMU waits for is a u64. */
int vu_h_set_log_base(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_log_msg m;
	uint64_t off;
	void *p;
	int ret;

	if (!vu_has_pf(d, VHOST_USER_PROTOCOL_F_LOG_SHMFD))
		return -EINVAL;
	memcpy(&m, d->payload, sizeof(m));
	if (!m.mmap_size || m.mmap_size > VU_LOG_MAX || m.mmap_offset > VU_LOG_MAX)
		return -EINVAL;
	ret = stop_to_map(d, m.mmap_offset + m.mmap_size);
	if (ret)
		return ret < 0 ? ret : vu_msg_wait(d);
	off = m.mmap_offset & ~4095ull; /* mmap wants a page-aligned offset */
	p = mmap(NULL, (size_t)(m.mmap_size + m.mmap_offset - off), PROT_READ | PROT_WRITE,
		 MAP_SHARED, d->fds[0], (off_t)off);
	if (p == MAP_FAILED)
		return -errno;
	vu_log_unmap(d);
	d->log_map = p;
	d->log_map_len = (size_t)(m.mmap_size + m.mmap_offset - off);
	d->log = (uint8_t *)p + (m.mmap_offset - off);
	d->log_size = (size_t)m.mmap_size;
	/* Shrunk under us: zero pages and broken queues, not a SIGBUS. */
	d->log_guard = mapguard_add(p, d->log_map_len, &d->mem_faulted);
	if (d->log_guard < 0) {
		d->log_guard = 0;
		vu_log_unmap(d);
		return -ENOSPC;
	}
	rep->payload[0] = 0;
	rep->size = sizeof(uint64_t);
	return vu_start_ready(d);
}

/* ---- a ring's addresses, before it starts ------------------------------------ */

static void vq_setup_common(struct vu_dev *d, struct vu_vq *vq)
{
	struct vring *vr = &vq->vr;

	vr->mem = &d->mem;
	vr->event_idx = d->features & (1ull << VIRTIO_RING_F_EVENT_IDX);
	vr->indirect = d->features & (1ull << VIRTIO_RING_F_INDIRECT_DESC);
	/* Logging: while the front-end asks for it and gave us a log. */
	vr->log = (d->features & (1ull << VHOST_F_LOG_ALL)) ? d->log : NULL;
	vr->log_size = d->log_size;
	vr->log_used = vq->log_used;
	vr->log_used_gpa = vq->log_gpa;
}

/* A packed ring: the descriptor ring, then the driver and device event
 * suppression areas where SET_VRING_ADDR puts the avail and used rings. */
static int vq_setup_packed(struct vu_dev *d, struct vu_vq *vq)
{
	struct vring *vr = &vq->vr;

	vr->desc = NULL;
	vr->avail = NULL;
	vr->used = NULL;
	vr->pdesc = vring_mem_uva(&d->mem, vq->desc_uva, 16ull * vr->num);
	vr->driver_event = vring_mem_uva(&d->mem, vq->avail_uva, 4);
	vr->device_event = vring_mem_uva(&d->mem, vq->used_uva, 4);
	if (!vr->pdesc || !vr->driver_event || !vr->device_event)
		return -EFAULT;
	vq_setup_common(d, vq);
	return vring_start(vr); /* packed: no inflight tracking */
}

int vu_vq_setup(struct vu_dev *d, unsigned idx)
{
	struct vu_vq *vq = &d->vqs[idx];
	struct vring *vr = &vq->vr;

	if (!vq->have_addr || !vr->num)
		return -EINVAL;
	vr->packed = d->features & (1ull << VIRTIO_F_RING_PACKED);
	if (vq->base_set) {
		vring_set_base(vr, vq->base);
		vq->base_set = false;
	}
	if (vr->packed)
		return vq_setup_packed(d, vq);
	vr->desc = vring_mem_uva(&d->mem, vq->desc_uva, vring_desc_size(vr->num));
	vr->avail = vring_mem_uva(&d->mem, vq->avail_uva, vring_avail_size(vr->num));
	vr->used = vring_mem_uva(&d->mem, vq->used_uva, vring_used_size(vr->num));
	if (!vr->desc || !vr->avail || !vr->used)
		return -EFAULT;
	vq_setup_common(d, vq);
	vr->inflight = vu_inflight_queue(d, idx, vr->num);
	return vring_start(vr);
}
