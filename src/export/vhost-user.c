/* vhost-user back-end: one front-end connection, its message stream and the
 * per-queue ring configuration. Every message is checked against a table
 * (payload size, fd count) before its handler runs; handlers check indexes
 * and values. A bad message gets an error reply when the front-end asked for
 * one (REPLY_ACK), otherwise the connection is closed: never the daemon.
 *
 * A message that must wait for queues to stop (GET_VRING_BASE, a memory
 * change, a ring change while it runs) stops reading the socket, asks the
 * device to stop them and is handled again once they have.
 *
 * THREADING RULE: see vhost-user.h; all of this runs on the control loop. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export/vhost-user-int.h"
#include "util/compiler.h"
#include "util/log.h"

#define VU_MSGS_PER_ROUND 64
#define VU_F_PROTOCOL (1ull << VHOST_USER_F_PROTOCOL_FEATURES)
#define VU_OUR_PF                                                                                  \
	(1ull << VHOST_USER_PROTOCOL_F_MQ | 1ull << VHOST_USER_PROTOCOL_F_LOG_SHMFD |              \
	 1ull << VHOST_USER_PROTOCOL_F_REPLY_ACK | 1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ |     \
	 1ull << VHOST_USER_PROTOCOL_F_CONFIG | 1ull << VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD |     \
	 1ull << VHOST_USER_PROTOCOL_F_RESET_DEVICE |                                              \
	 1ull << VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS)

static void vu_finalize(struct vu_dev *d);
static void vu_watch(struct vu_dev *d, bool on);

bool vu_has_pf(const struct vu_dev *d, unsigned bit)
{
	return d->protocol_features & (1ull << bit);
}

int vu_take_fd(struct vu_dev *d, unsigned i)
{
	int fd = d->fds[i];

	d->fds[i] = -1;
	return fd;
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

/* ---- queues: start and stop ------------------------------------------------ */

static bool vq_wants_run(const struct vu_dev *d, const struct vu_vq *vq)
{
	/* "If VHOST_USER_F_PROTOCOL_FEATURES has not been negotiated, the ring
	 * starts directly in the enabled state." */
	bool enabled = (d->features & VU_F_PROTOCOL) ? vq->enabled : true;

	return vq->kick_fd >= 0 && enabled && d->mem.nregions && !d->closing;
}

static int vq_start(struct vu_dev *d, unsigned idx)
{
	struct vu_vq *vq = &d->vqs[idx];
	int ret = vu_vq_setup(d, idx);

	if (ret == 0)
		ret = d->ops->queue_start(d->opaque, d, idx);
	if (ret < 0) {
		log_warn("%s: cannot start queue %u: %s", d->name, idx, strerror(-ret));
		return ret;
	}
	vq->running = true;
	d->nrunning++;
	return 0;
}

static void vq_stopped(struct vu_dev *d, struct vu_vq *vq)
{
	vq->running = false;
	vq->stopping = false;
	d->nrunning--;
}

/* True when the queue is stopped (or was not running); false when the
 * device finishes the stop later (vu_queue_stopped). */
static bool vq_stop(struct vu_dev *d, unsigned idx)
{
	struct vu_vq *vq = &d->vqs[idx];

	if (!vq->running)
		return true;
	if (vq->stopping)
		return false;
	vq->stopping = true;
	if (d->ops->queue_stop(d->opaque, d, idx) > 0) {
		d->pending++;
		return false;
	}
	vq_stopped(d, vq);
	return true;
}

/* Bring one queue to the state its configuration asks for: 0, or -errno
 * when it cannot start. A stop may finish later (vq->stopping). */
static int vq_update(struct vu_dev *d, unsigned idx)
{
	struct vu_vq *vq = &d->vqs[idx];
	bool want = vq_wants_run(d, vq);

	if (want && !vq->running)
		return vq_start(d, idx);
	if (!want && vq->running)
		vq_stop(d, idx);
	return 0;
}

bool vu_stop_all(struct vu_dev *d)
{
	unsigned i;

	if (!d->nrunning)
		return true;
	for (i = 0; i < d->num_queues; i++)
		vq_stop(d, i);
	return !d->nrunning;
}

int vu_start_ready(struct vu_dev *d)
{
	unsigned i;
	int ret;

	for (i = 0; i < d->num_queues; i++) {
		ret = vq_update(d, i);
		if (ret < 0)
			return ret;
	}
	return 0;
}

static void vq_init_fds(struct vu_vq *vq)
{
	vq->kick_fd = vq->call_fd = vq->err_fd = vq->retired_fd = -1;
}

static void vq_reset(struct vu_vq *vq)
{
	close_fd(&vq->kick_fd);
	close_fd(&vq->call_fd);
	close_fd(&vq->err_fd);
	close_fd(&vq->retired_fd);
	memset(vq, 0, sizeof(*vq));
	vq_init_fds(vq);
}

/* ---- per-queue messages ------------------------------------------------------ */

/* Handlers return 0 or -errno. One that must wait for queues to stop (or
 * for a device to take new fds) returns vu_msg_wait(): the socket is not read
 * meanwhile, and the message is handled again (or d->resume runs) once
 * `pending` is back at 0. */
int vu_msg_wait(struct vu_dev *d)
{
	d->busy = true;
	return 0;
}

/* The message's queue changes from `set` on (SET_VRING_NUM/ADDR/BASE): stop
 * it first (waiting if that takes time), apply, start it again if it may. */
static int msg_set_vring(struct vu_dev *d, uint32_t index,
			 void (*set)(struct vu_vq *vq, const void *msg), const void *msg)
{
	if (index >= d->num_queues)
		return -EINVAL;
	if (!vq_stop(d, index))
		return vu_msg_wait(d);
	set(&d->vqs[index], msg);
	return vq_update(d, index);
}

static void set_num(struct vu_vq *vq, const void *msg)
{
	vq->vr.num = (uint16_t)((const struct vu_vring_state *)msg)->num;
}

static void set_base(struct vu_vq *vq, const void *msg)
{
	vq->base = ((const struct vu_vring_state *)msg)->num;
	vq->base_set = true;
}

static void set_addr(struct vu_vq *vq, const void *msg)
{
	const struct vu_vring_addr *a = msg;

	vq->desc_uva = a->desc;
	vq->avail_uva = a->avail;
	vq->used_uva = a->used;
	vq->log_gpa = a->log;
	vq->log_used = a->flags & (1u << VHOST_VRING_F_LOG);
	vq->have_addr = true;
}

static int h_set_vring_num(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_vring_state s;

	(void)rep;
	memcpy(&s, d->payload, sizeof(s));
	/* virtio 1.2 2.7: a split queue's size is a power of 2. Checked before
	 * anything stops: a bad message leaves a running queue alone. */
	if (!s.num || s.num > VRING_MAX_SIZE || (s.num & (s.num - 1)))
		return -EINVAL;
	return msg_set_vring(d, s.index, set_num, &s);
}

static int h_set_vring_addr(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_vring_addr a;

	(void)rep;
	memcpy(&a, d->payload, sizeof(a));
	return msg_set_vring(d, a.index, set_addr, &a);
}

static int h_set_vring_base(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_vring_state s;

	(void)rep;
	memcpy(&s, d->payload, sizeof(s));
	/* Split: an avail index. Packed: two slots with their wrap counters,
	 * checked against the ring size at start. */
	if (s.num > 0xffff && !(d->features & (1ull << VIRTIO_F_RING_PACKED)))
		return -EINVAL;
	return msg_set_vring(d, s.index, set_base, &s);
}

static int h_get_vring_base(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_vring_state s;
	struct vu_vq *vq;

	memcpy(&s, d->payload, sizeof(s));
	if (s.index >= d->num_queues)
		return -EINVAL;
	if (!vq_stop(d, s.index))
		return vu_msg_wait(d);
	vq = &d->vqs[s.index];
	/* The ring is stopped until the next SET_VRING_KICK. */
	s.num = vq->base_set ? vq->base : vring_get_base(&vq->vr);
	close_fd(&vq->kick_fd);
	close_fd(&vq->call_fd);
	memcpy(rep->payload, &s, sizeof(s));
	rep->size = sizeof(s);
	return 0;
}

/* The message carries "the eventfd". Another kind of fd (a pipe, a socket,
 * a file on FUSE) could block the thread that reads or writes it: its type is
 * checked, not trusted. Without /proc: an anonymous inode (eventfd, timerfd,
 * signalfd, ...), none of which blocks a write or a RWF_NOWAIT read. */
static bool fd_is_eventfd(int fd)
{
	char path[40], link[32];
	struct stat st;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, link, sizeof(link) - 1);
	if (n >= 0) {
		link[n] = '\0';
		return !strcmp(link, "anon_inode:[eventfd]");
	}
	return fstat(fd, &st) == 0 && (st.st_mode & S_IFMT) == 0;
}

static int h_fds_handed_over(struct vu_dev *d, struct vu_reply *rep)
{
	(void)d;
	(void)rep;
	return 0;
}

/* A running queue's call or error fd: its thread may be writing the old one
 * (or about to), so it gets the new one by message and the old one is closed
 * only when the thread says it is done with it (vu_queue_fds_done). */
static int vq_hand_over(struct vu_dev *d, unsigned idx, int *slot, bool nofd)
{
	struct vu_vq *vq = &d->vqs[idx];

	if (vq->stopping)
		return vu_msg_wait(d); /* handled again once stopped */
	vq->retired_fd = *slot;        /* one at a time: the socket waits meanwhile */
	*slot = nofd ? -1 : vu_take_fd(d, 0);
	if (d->ops->queue_set_fds(d->opaque, d, idx) <= 0) {
		close_fd(&vq->retired_fd);
		return 0;
	}
	d->pending++;
	d->resume = h_fds_handed_over;
	return vu_msg_wait(d);
}

/* SET_VRING_KICK/CALL/ERR: u64 with the index in bits 0-7 and the "no fd"
 * flag in bit 8. */
static int h_set_vring_fd(struct vu_dev *d, int which)
{
	uint64_t v = d->payload[0];
	bool nofd = v & VHOST_USER_VRING_NOFD;
	unsigned idx = (unsigned)(v & VHOST_USER_VRING_IDX_MASK);
	struct vu_vq *vq;
	int *slot;

	if ((v & ~(uint64_t)(VHOST_USER_VRING_IDX_MASK | VHOST_USER_VRING_NOFD)) ||
	    d->nfds != (nofd ? 0u : 1u) || idx >= d->num_queues)
		return -EINVAL;
	/* Polling instead of kicks is not supported. */
	if (which == VHOST_USER_SET_VRING_KICK && nofd)
		return -ENOTSUP;
	if (!nofd && !fd_is_eventfd(d->fds[0])) {
		log_warn("%s: queue %u: the fd is not an eventfd", d->name, idx);
		return -EINVAL;
	}
	vq = &d->vqs[idx];
	slot = which == VHOST_USER_SET_VRING_KICK   ? &vq->kick_fd
	       : which == VHOST_USER_SET_VRING_CALL ? &vq->call_fd
						    : &vq->err_fd;
	if (which != VHOST_USER_SET_VRING_KICK && vq->running)
		return vq_hand_over(d, idx, slot, nofd);
	/* A new kick fd changes what the queue's loop watches: stop it first. */
	if (which == VHOST_USER_SET_VRING_KICK && !vq_stop(d, idx))
		return vu_msg_wait(d);
	close_fd(slot);
	if (!nofd)
		*slot = vu_take_fd(d, 0);
	return vq_update(d, idx);
}

static int h_set_vring_kick(struct vu_dev *d, struct vu_reply *rep)
{
	(void)rep;
	return h_set_vring_fd(d, VHOST_USER_SET_VRING_KICK);
}

static int h_set_vring_call(struct vu_dev *d, struct vu_reply *rep)
{
	(void)rep;
	return h_set_vring_fd(d, VHOST_USER_SET_VRING_CALL);
}

static int h_set_vring_err(struct vu_dev *d, struct vu_reply *rep)
{
	(void)rep;
	return h_set_vring_fd(d, VHOST_USER_SET_VRING_ERR);
}

static int h_set_vring_enable(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_vring_state s;
	struct vu_vq *vq;

	(void)rep;
	memcpy(&s, d->payload, sizeof(s));
	if (!(d->features & VU_F_PROTOCOL) || s.num > 1 || s.index >= d->num_queues)
		return -EINVAL;
	vq = &d->vqs[s.index];
	vq->enabled = s.num;
	/* Enabling needs no stop; disabling does, and waits for it. */
	if (vq->running && !vq_wants_run(d, vq))
		return vq_stop(d, s.index) ? 0 : vu_msg_wait(d);
	return vq_update(d, s.index);
}

/* ---- device-wide messages ------------------------------------------------------ */

static int reply_u64(struct vu_reply *rep, uint64_t v)
{
	rep->payload[0] = v;
	rep->size = sizeof(v);
	return 0;
}

/* Dirty logging is done here and in vring.c for every device. */
static uint64_t offered_features(struct vu_dev *d)
{
	return d->ops->features(d->opaque) | VU_F_PROTOCOL | 1ull << VHOST_F_LOG_ALL |
	       1ull << VIRTIO_F_RING_PACKED;
}

static int h_get_features(struct vu_dev *d, struct vu_reply *rep)
{
	return reply_u64(rep, offered_features(d));
}

static int h_set_features(struct vu_dev *d, struct vu_reply *rep)
{
	uint64_t f = d->payload[0];

	(void)rep;
	if (f & ~offered_features(d))
		return -EINVAL;
	/* Rings use the features when they start: restart running ones. */
	if (f != d->features && !vu_stop_all(d))
		return vu_msg_wait(d);
	d->features = f;
	return vu_start_ready(d);
}

static int h_get_protocol_features(struct vu_dev *d, struct vu_reply *rep)
{
	(void)d;
	return reply_u64(rep, VU_OUR_PF);
}

static int h_set_protocol_features(struct vu_dev *d, struct vu_reply *rep)
{
	(void)rep;
	if (d->payload[0] & ~VU_OUR_PF)
		return -EINVAL;
	d->protocol_features = d->payload[0];
	return 0;
}

/* SET_LOG_FD: an eventfd to tell the front-end the log changed, which no
 * front-end waits for (QEMU does not send it): taken and closed. */
static int h_set_log_fd(struct vu_dev *d, struct vu_reply *rep)
{
	int fd = vu_take_fd(d, 0);

	(void)rep;
	close_fd(&fd);
	return 0;
}

/* SET_BACKEND_REQ_FD: the channel for back-end initiated messages. */
static int h_set_backend_req_fd(struct vu_dev *d, struct vu_reply *rep)
{
	struct stat st;
	int fd;

	(void)rep;
	if (!vu_has_pf(d, VHOST_USER_PROTOCOL_F_BACKEND_REQ))
		return -EINVAL;
	fd = vu_take_fd(d, 0);

	if (fstat(fd, &st) < 0 || !S_ISSOCK(st.st_mode)) {
		close(fd);
		return -EINVAL;
	}
	close_fd(&d->backend_fd);
	d->backend_fd = fd;
	return 0;
}

#define VHOST_USER_BACKEND_CONFIG_CHANGE_MSG 2

int vu_dev_config_changed(struct vu_dev *d)
{
	struct vu_msg_hdr hdr = {.request = VHOST_USER_BACKEND_CONFIG_CHANGE_MSG,
				 .flags = VHOST_USER_VERSION};
	ssize_t n;

	if (d->backend_fd < 0 || d->closing || !vu_has_pf(d, VHOST_USER_PROTOCOL_F_CONFIG))
		return -ENOTCONN;
	/* No NEED_REPLY: waiting for the front-end's answer would block. */
	do
		n = send(d->backend_fd, &hdr, sizeof(hdr), MSG_NOSIGNAL | MSG_DONTWAIT);
	while (n < 0 && errno == EINTR);
	return n == (ssize_t)sizeof(hdr) ? 0 : -EIO;
}

static int h_get_queue_num(struct vu_dev *d, struct vu_reply *rep)
{
	return reply_u64(rep, d->num_queues);
}

static int h_set_owner(struct vu_dev *d, struct vu_reply *rep)
{
	(void)d;
	(void)rep;
	return 0;
}

/* RESET_OWNER (deprecated: "disable all rings") and RESET_DEVICE ("disable
 * all rings and reset all internal device state to the initial state"). The
 * memory table stays: it describes the guest, not the device, and QEMU (whose
 * vhost-user-scsi resets the device when the guest's driver takes over from
 * the firmware's) does not send it again. */
static int reset(struct vu_dev *d, bool device)
{
	unsigned i;

	if (!vu_stop_all(d))
		return vu_msg_wait(d);
	for (i = 0; i < d->num_queues; i++)
		vq_reset(&d->vqs[i]);
	if (device) {
		d->features = 0;
		vu_inflight_unmap(d);
		vu_log_unmap(d);
	}
	return 0;
}

static int h_reset_owner(struct vu_dev *d, struct vu_reply *rep)
{
	(void)rep;
	return reset(d, false);
}

static int h_reset_device(struct vu_dev *d, struct vu_reply *rep)
{
	(void)rep;
	if (!vu_has_pf(d, VHOST_USER_PROTOCOL_F_RESET_DEVICE))
		return -EINVAL;
	return reset(d, true);
}

/* GET_CONFIG: "vhost-user back-end's payload size MUST match the front-end's
 * request ... zero length of payload to indicate an error". */
static int h_get_config(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_config_msg c;

	memcpy(&c, d->payload, sizeof(c));
	rep->size = 0;
	if (d->hdr.size != sizeof(c) + c.size || c.size > VU_CONFIG_MAX ||
	    c.offset > VU_CONFIG_MAX - c.size)
		return 0;
	memcpy(rep->payload, &c, sizeof(c));
	memset((uint8_t *)rep->payload + sizeof(c), 0, c.size);
	d->ops->get_config(d->opaque, (uint8_t *)rep->payload + sizeof(c), c.offset, c.size);
	rep->size = (uint32_t)sizeof(c) + c.size;
	return 0;
}

static int h_set_config(struct vu_dev *d, struct vu_reply *rep)
{
	struct vu_config_msg c;

	(void)rep;
	memcpy(&c, d->payload, sizeof(c));
	if (d->hdr.size < sizeof(c) || d->hdr.size != sizeof(c) + c.size ||
	    c.size > VU_CONFIG_MAX || c.offset > VU_CONFIG_MAX - c.size || c.flags > 1)
		return -EINVAL;
	return d->ops->set_config(d->opaque, (uint8_t *)d->payload + sizeof(c), c.offset, c.size);
}

/* ---- the message table ------------------------------------------------------ */

#define VAR (-1)

struct vu_handler {
	vu_handler_fn *fn;
	int16_t size; /* payload bytes, or VAR: the handler checks */
	int8_t nfds;  /* fds carried, or VAR */
	int8_t reply; /* the message has a reply: 1 always, a PF_ bit + 2 when negotiated */
	const char *name;
};

#define REPLY_IF(pf) ((int8_t)((pf) + 2))

static bool has_reply(const struct vu_dev *d, const struct vu_handler *h)
{
	return h && (h->reply == 1 || (h->reply >= 2 && vu_has_pf(d, (unsigned)h->reply - 2)));
}

static const struct vu_handler handlers[VHOST_USER_MAX_REQUEST] = {
	[VHOST_USER_GET_FEATURES] = {h_get_features, 0, 0, true, "GET_FEATURES"},
	[VHOST_USER_SET_FEATURES] = {h_set_features, 8, 0, false, "SET_FEATURES"},
	[VHOST_USER_SET_OWNER] = {h_set_owner, 0, 0, false, "SET_OWNER"},
	[VHOST_USER_RESET_OWNER] = {h_reset_owner, 0, 0, false, "RESET_OWNER"},
	[VHOST_USER_SET_MEM_TABLE] = {vu_h_set_mem_table, VAR, VAR, false, "SET_MEM_TABLE"},
	[VHOST_USER_SET_LOG_BASE] = {vu_h_set_log_base, 16, 1,
				     REPLY_IF(VHOST_USER_PROTOCOL_F_LOG_SHMFD), "SET_LOG_BASE"},
	[VHOST_USER_SET_LOG_FD] = {h_set_log_fd, 0, 1, false, "SET_LOG_FD"},
	[VHOST_USER_SET_VRING_NUM] = {h_set_vring_num, 8, 0, false, "SET_VRING_NUM"},
	[VHOST_USER_SET_VRING_ADDR] = {h_set_vring_addr, 40, 0, false, "SET_VRING_ADDR"},
	[VHOST_USER_SET_VRING_BASE] = {h_set_vring_base, 8, 0, false, "SET_VRING_BASE"},
	[VHOST_USER_GET_VRING_BASE] = {h_get_vring_base, 8, 0, true, "GET_VRING_BASE"},
	[VHOST_USER_SET_VRING_KICK] = {h_set_vring_kick, 8, VAR, false, "SET_VRING_KICK"},
	[VHOST_USER_SET_VRING_CALL] = {h_set_vring_call, 8, VAR, false, "SET_VRING_CALL"},
	[VHOST_USER_SET_VRING_ERR] = {h_set_vring_err, 8, VAR, false, "SET_VRING_ERR"},
	[VHOST_USER_GET_PROTOCOL_FEATURES] = {h_get_protocol_features, 0, 0, true,
					      "GET_PROTOCOL_FEATURES"},
	[VHOST_USER_SET_PROTOCOL_FEATURES] = {h_set_protocol_features, 8, 0, false,
					      "SET_PROTOCOL_FEATURES"},
	[VHOST_USER_GET_QUEUE_NUM] = {h_get_queue_num, 0, 0, true, "GET_QUEUE_NUM"},
	[VHOST_USER_SET_VRING_ENABLE] = {h_set_vring_enable, 8, 0, false, "SET_VRING_ENABLE"},
	[VHOST_USER_SET_BACKEND_REQ_FD] = {h_set_backend_req_fd, 0, 1, false, "SET_BACKEND_REQ_FD"},
	[VHOST_USER_GET_CONFIG] = {h_get_config, VAR, 0, true, "GET_CONFIG"},
	[VHOST_USER_SET_CONFIG] = {h_set_config, VAR, 0, false, "SET_CONFIG"},
	[VHOST_USER_GET_INFLIGHT_FD] = {vu_h_get_inflight_fd, VAR, 0, true, "GET_INFLIGHT_FD"},
	[VHOST_USER_SET_INFLIGHT_FD] = {vu_h_set_inflight_fd, VAR, 1, false, "SET_INFLIGHT_FD"},
	[VHOST_USER_RESET_DEVICE] = {h_reset_device, 0, 0, false, "RESET_DEVICE"},
	[VHOST_USER_GET_MAX_MEM_SLOTS] = {vu_h_get_max_mem_slots, 0, 0, true, "GET_MAX_MEM_SLOTS"},
	[VHOST_USER_ADD_MEM_REG] = {vu_h_add_mem_reg, 40, 1, false, "ADD_MEM_REG"},
	[VHOST_USER_REM_MEM_REG] = {vu_h_rem_mem_reg, 40, VAR, false, "REM_MEM_REG"},
};

static const struct vu_handler *msg_handler(const struct vu_dev *d)
{
	uint32_t r = d->hdr.request;

	return r < VHOST_USER_MAX_REQUEST && handlers[r].fn ? &handlers[r] : NULL;
}

/* ---- sending -------------------------------------------------------------------- */

static int vu_send(struct vu_dev *d, const struct vu_reply *rep)
{
	struct vu_msg_hdr hdr = {.request = d->hdr.request,
				 .flags = VHOST_USER_VERSION | VHOST_USER_REPLY,
				 .size = rep->size};
	struct iovec iov[2] = {{&hdr, sizeof(hdr)}, {(void *)rep->payload, rep->size}};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	ssize_t n;

	if (rep->fd >= 0) {
		struct cmsghdr *cm;

		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &rep->fd, sizeof(int));
	}
	do {
		n = sendmsg(d->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
	} while (n < 0 && errno == EINTR);
	/* Replies are small and front-ends wait for them: a full socket
	 * buffer means a front-end that does not read. */
	return n == (ssize_t)(sizeof(hdr) + rep->size) ? 0 : -EIO;
}

/* ---- receiving ------------------------------------------------------------------ */

static int take_cmsg_fds(struct vu_dev *d, struct msghdr *mh)
{
	struct cmsghdr *cm;
	int ret = 0;

	for (cm = CMSG_FIRSTHDR(mh); cm; cm = CMSG_NXTHDR(mh, cm)) {
		size_t i, n;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (i = 0; i < n; i++) {
			int fd;

			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
			if (d->nfds < VU_MAX_FDS) {
				d->fds[d->nfds++] = fd;
			} else {
				close(fd);
				ret = -EMSGSIZE;
			}
		}
	}
	if (mh->msg_flags & MSG_CTRUNC)
		ret = -EMSGSIZE;
	return ret;
}

/* Bytes of the message being received that are still missing. */
static size_t msg_missing(const struct vu_dev *d)
{
	size_t want = d->have < VU_HDR_SIZE ? VU_HDR_SIZE : VU_HDR_SIZE + d->hdr.size;

	return want - d->have;
}

/* Receive what the socket has of the current message, up to its end: 0 (a
 * whole message is in when msg_missing() is 0; else wait for more), or
 * -errno: drop the connection. */
static int vu_recv(struct vu_dev *d)
{
	union {
		char buf[CMSG_SPACE(VU_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	while (msg_missing(d)) {
		char *dst = d->have < VU_HDR_SIZE ? (char *)&d->hdr + d->have
						  : (char *)d->payload + (d->have - VU_HDR_SIZE);
		struct iovec iov = {dst, msg_missing(d)};
		struct msghdr mh = {.msg_iov = &iov,
				    .msg_iovlen = 1,
				    .msg_control = u.buf,
				    .msg_controllen = sizeof(u.buf)};
		ssize_t n;
		int ret;

		n = recvmsg(d->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : -errno;
		if (n == 0)
			return -ECONNRESET;
		ret = take_cmsg_fds(d, &mh);
		if (ret < 0)
			return ret;
		d->have += (size_t)n;
		if (d->have == VU_HDR_SIZE && d->hdr.size > VU_MAX_PAYLOAD)
			return -EMSGSIZE;
	}
	return 0;
}

static void msg_reset(struct vu_dev *d)
{
	unsigned i;

	for (i = 0; i < d->nfds; i++)
		close_fd(&d->fds[i]);
	d->nfds = 0;
	d->have = 0;
}

/* ---- handling --------------------------------------------------------------------- */

static int msg_check(const struct vu_dev *d, const struct vu_handler *h)
{
	if ((d->hdr.flags & VHOST_USER_VERSION_MASK) != VHOST_USER_VERSION ||
	    (d->hdr.flags & VHOST_USER_REPLY))
		return -EPROTO;
	if (!h)
		return -ENOSYS;
	if (h->size != VAR && d->hdr.size != (uint32_t)h->size)
		return -EINVAL;
	if (h->nfds != VAR && d->nfds != (unsigned)h->nfds)
		return -EINVAL;
	return 0;
}

/* Reply as the message requires; -errno closes the connection. */
static int msg_finish(struct vu_dev *d, const struct vu_handler *h, int ret, struct vu_reply *rep)
{
	bool ack = (d->hdr.flags & VHOST_USER_NEED_REPLY) &&
		   vu_has_pf(d, VHOST_USER_PROTOCOL_F_REPLY_ACK);
	const char *name = h ? h->name : "unknown";
	struct vu_reply r;
	int sret = 0;

	if (ret < 0)
		log_warn("%s: %s (request %u, %u bytes, %u fds): %s", d->name, name, d->hdr.request,
			 d->hdr.size, d->nfds, strerror(-ret));
	if (has_reply(d, h) && ret == 0) {
		sret = vu_send(d, rep);
	} else if (!has_reply(d, h) && ack) {
		r.fd = -1;
		reply_u64(&r, ret < 0 ? (uint64_t)-ret : 0);
		sret = vu_send(d, &r);
		ret = 0;
	}
	if (rep->fd >= 0)
		close_fd(&rep->fd);
	msg_reset(d);
	return ret < 0 ? ret : sret;
}

/* 0: done with this message, or it waits (d->busy); -errno: close. */
static int msg_handle(struct vu_dev *d)
{
	const struct vu_handler *h = msg_handler(d);
	struct vu_reply rep = {.fd = -1};
	int ret = msg_check(d, h);

	if (ret == 0) {
		log_debug("%s: %s", d->name, h->name);
		ret = h->fn(d, &rep);
	}
	if (d->busy) {
		vu_watch(d, false);
		return 0;
	}
	return msg_finish(d, h, ret, &rep);
}

static void vu_drop(struct vu_dev *d, int err)
{
	if (err != -ECONNRESET)
		log_warn("%s: closing the connection: %s", d->name, strerror(-err));
	else
		log_info("%s: front-end disconnected", d->name);
	vu_dev_close(d);
}

static void vu_read_cb(struct loop_fd *h, uint32_t revents)
{
	struct vu_dev *d = container_of(h, struct vu_dev, h);
	unsigned n;
	int ret;

	(void)revents;
	for (n = 0; n < VU_MSGS_PER_ROUND && !d->busy && !d->closing; n++) {
		ret = vu_recv(d);
		if (ret == 0 && msg_missing(d))
			return;
		if (ret == 0)
			ret = msg_handle(d);
		if (ret < 0) {
			vu_drop(d, ret);
			return;
		}
	}
}

static void vu_watch(struct vu_dev *d, bool on)
{
	if (on == d->watching)
		return;
	if (on) {
		d->h = (struct loop_fd){.fd = d->fd, .events = EPOLLIN, .cb = vu_read_cb};
		d->watching = loop_fd_add(d->loop, &d->h) == 0;
	} else {
		loop_fd_del(d->loop, &d->h);
		d->watching = false;
	}
}

/* Run the waiting message again (what it waited for is done) or, after a
 * hand-over, just finish it. */
static void vu_resume(struct vu_dev *d)
{
	const struct vu_handler *h = msg_handler(d);
	vu_handler_fn *fn = d->resume ? d->resume : h->fn;
	struct vu_reply rep = {.fd = -1};
	int ret;

	d->resume = NULL;
	d->busy = false;
	ret = fn(d, &rep);
	if (d->busy)
		return;
	ret = msg_finish(d, h, ret, &rep);
	if (ret < 0) {
		vu_drop(d, ret);
		return;
	}
	vu_watch(d, true);
}

static void vu_pending_done(struct vu_dev *d)
{
	if (--d->pending)
		return;
	if (d->closing)
		vu_finalize(d);
	else if (d->busy)
		vu_resume(d);
}

void vu_queue_stopped(struct vu_dev *d, unsigned idx)
{
	vq_stopped(d, &d->vqs[idx]);
	vu_pending_done(d);
}

void vu_queue_fds_done(struct vu_dev *d, unsigned idx)
{
	close_fd(&d->vqs[idx].retired_fd);
	vu_pending_done(d);
}

/* ---- life cycle ------------------------------------------------------------------- */

int vu_dev_new(const struct vu_dev_config *cfg, int fd, struct vu_dev **out)
{
	struct vu_dev *d = calloc(1, sizeof(*d));
	unsigned i;

	if (!d || !cfg->num_queues || cfg->num_queues > VU_MAX_QUEUES)
		goto fail;
	d->vqs = calloc(cfg->num_queues, sizeof(*d->vqs));
	if (!d->vqs)
		goto fail;
	d->loop = cfg->loop;
	d->fd = fd;
	d->backend_fd = -1;
	d->ops = cfg->ops;
	d->opaque = cfg->opaque;
	d->num_queues = cfg->num_queues;
	snprintf(d->name, sizeof(d->name), "%s", cfg->name ? cfg->name : "vhost-user");
	for (i = 0; i < d->num_queues; i++)
		vq_init_fds(&d->vqs[i]);
	vu_watch(d, true);
	if (!d->watching)
		goto fail;
	*out = d;
	return 0;
fail:
	if (d)
		free(d->vqs);
	free(d);
	close(fd);
	return -ENOMEM;
}

static void vu_finalize(struct vu_dev *d)
{
	unsigned i;

	for (i = 0; i < d->num_queues; i++)
		vq_reset(&d->vqs[i]);
	vu_mem_unmap_all(&d->mem);
	vu_inflight_unmap(d);
	vu_log_unmap(d);
	msg_reset(d);
	close_fd(&d->fd);
	close_fd(&d->backend_fd);
	d->ops->closed(d->opaque, d);
}

void vu_dev_close(struct vu_dev *d)
{
	if (d->closing)
		return;
	d->closing = true;
	vu_watch(d, false);
	if (vu_stop_all(d) && !d->pending)
		vu_finalize(d);
}

void vu_dev_free(struct vu_dev *d)
{
	if (!d)
		return;
	free(d->vqs);
	free(d);
}

struct vu_vq *vu_dev_vq(struct vu_dev *d, unsigned idx)
{
	return &d->vqs[idx];
}

atomic_int *vu_dev_mem_faulted(struct vu_dev *d)
{
	return &d->mem_faulted;
}

uint64_t vu_dev_features(const struct vu_dev *d)
{
	return d->features;
}
