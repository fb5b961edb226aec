/* vhost-user protocol, back-end side (QEMU docs/interop/vhost-user.rst):
 * one connection with a front-end, its messages, the guest memory table,
 * per-queue ring configuration and the inflight area. The device (e.g.
 * vhost-user-blk.c) is reached through struct vu_dev_ops and runs the
 * started queues on its own threads.
 *
 * THREADING RULE: a struct vu_dev and its messages live on the control loop
 * (normally the main loop). A struct vu_vq belongs to the control thread while
 * the queue is stopped; between ops->queue_start() and the matching
 * vu_queue_stopped() the device's thread owns vq->vr and uses the fds it was
 * given. An fd the device may be using is never closed (nor its number
 * reused) before the device says it is done with it: a running queue's kick
 * fd changes only after a stop; its call and error fds are handed over with
 * ops->queue_set_fds() and the old ones closed at vu_queue_fds_done(). The
 * memory table and the inflight mapping only change while no queue runs. */
#ifndef IOPLANE_VHOST_USER_H
#define IOPLANE_VHOST_USER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "export/vring.h"

struct loop;

enum vu_request {
	VHOST_USER_GET_FEATURES = 1,
	VHOST_USER_SET_FEATURES = 2,
	VHOST_USER_SET_OWNER = 3,
	VHOST_USER_RESET_OWNER = 4,
	VHOST_USER_SET_MEM_TABLE = 5,
	VHOST_USER_SET_LOG_BASE = 6,
	VHOST_USER_SET_LOG_FD = 7,
	VHOST_USER_SET_VRING_NUM = 8,
	VHOST_USER_SET_VRING_ADDR = 9,
	VHOST_USER_SET_VRING_BASE = 10,
	VHOST_USER_GET_VRING_BASE = 11,
	VHOST_USER_SET_VRING_KICK = 12,
	VHOST_USER_SET_VRING_CALL = 13,
	VHOST_USER_SET_VRING_ERR = 14,
	VHOST_USER_GET_PROTOCOL_FEATURES = 15,
	VHOST_USER_SET_PROTOCOL_FEATURES = 16,
	VHOST_USER_GET_QUEUE_NUM = 17,
	VHOST_USER_SET_VRING_ENABLE = 18,
	VHOST_USER_SET_BACKEND_REQ_FD = 21,
	VHOST_USER_GET_CONFIG = 24,
	VHOST_USER_SET_CONFIG = 25,
	VHOST_USER_GET_INFLIGHT_FD = 31,
	VHOST_USER_SET_INFLIGHT_FD = 32,
	VHOST_USER_RESET_DEVICE = 34,
	VHOST_USER_GET_MAX_MEM_SLOTS = 36,
	VHOST_USER_ADD_MEM_REG = 37,
	VHOST_USER_REM_MEM_REG = 38,
	VHOST_USER_MAX_REQUEST = 41,
};

#define VHOST_USER_VERSION 1u
#define VHOST_USER_VERSION_MASK 3u
#define VHOST_USER_REPLY (1u << 2)
#define VHOST_USER_NEED_REPLY (1u << 3)
#define VHOST_USER_F_PROTOCOL_FEATURES 30
#define VHOST_F_LOG_ALL 26  /* dirty logging for live migration */
#define VHOST_VRING_F_LOG 0 /* SET_VRING_ADDR: log used ring writes at addr.log */
#define VHOST_USER_VRING_IDX_MASK 0xffu
#define VHOST_USER_VRING_NOFD (1u << 8)

#define VHOST_USER_PROTOCOL_F_MQ 0
#define VHOST_USER_PROTOCOL_F_LOG_SHMFD 1
#define VHOST_USER_PROTOCOL_F_REPLY_ACK 3
#define VHOST_USER_PROTOCOL_F_BACKEND_REQ 5
#define VHOST_USER_PROTOCOL_F_CONFIG 9
#define VHOST_USER_PROTOCOL_F_INFLIGHT_SHMFD 12
#define VHOST_USER_PROTOCOL_F_RESET_DEVICE 13
#define VHOST_USER_PROTOCOL_F_CONFIGURE_MEM_SLOTS 15

#define VU_HDR_SIZE 12
#define VU_MAX_FDS 8       /* fds one message may carry (SET_MEM_TABLE) */
#define VU_MEM_TABLE_MAX 8 /* regions in one SET_MEM_TABLE */
#define VU_CONFIG_MAX 256  /* configuration space bytes */
#define VU_MAX_PAYLOAD 512 /* larger messages close the connection */
#define VU_MAX_QUEUES 256  /* the vring index has 8 bits */

struct vu_msg_hdr {
	uint32_t request;
	uint32_t flags;
	uint32_t size;
};

struct vu_vring_state {
	uint32_t index;
	uint32_t num;
};

struct vu_vring_addr {
	uint32_t index;
	uint32_t flags;
	uint64_t desc;
	uint64_t used;
	uint64_t avail;
	uint64_t log;
};

struct vu_mem_region {
	uint64_t gpa;
	uint64_t size;
	uint64_t uva;
	uint64_t mmap_offset;
};

struct vu_mem_table {
	uint32_t nregions;
	uint32_t padding;
	struct vu_mem_region r[VU_MEM_TABLE_MAX];
};

struct vu_mem_single {
	uint64_t padding;
	struct vu_mem_region r;
};

struct vu_config_msg {
	uint32_t offset;
	uint32_t size;
	uint32_t flags;
	uint8_t payload[];
};

/* SET_LOG_BASE's payload: the log is [mmap_offset, mmap_offset+mmap_size)
 * of the fd that comes with it. */
struct vu_log_msg {
	uint64_t mmap_size;
	uint64_t mmap_offset;
};

struct vu_inflight_msg {
	uint64_t mmap_size;
	uint64_t mmap_offset;
	uint16_t num_queues;
	uint16_t queue_size;
};
#define VU_INFLIGHT_MSG_SIZE 20 /* without the trailing padding */

struct vu_vq {
	struct vring vr;
	int kick_fd, call_fd, err_fd; /* -1: none; always eventfds */
	int retired_fd; /* call or error fd handed over, closed once the device is done */
	uint64_t desc_uva, avail_uva, used_uva;
	uint64_t log_gpa; /* where the used ring is logged, when log_used */
	bool have_addr, log_used;
	uint32_t base; /* SET_VRING_BASE's value, applied at the next start (base_set) */
	bool base_set;
	bool enabled; /* SET_VRING_ENABLE */
	bool running; /* between queue_start and the stop finishing */
	bool stopping;
};

struct vu_dev;

struct vu_dev_ops {
	uint64_t (*features)(void *opaque);
	/* Fill len bytes of configuration space from off (bounds checked). */
	void (*get_config)(void *opaque, uint8_t *buf, uint32_t off, uint32_t len);
	int (*set_config)(void *opaque, const uint8_t *buf, uint32_t off, uint32_t len);
	/* vq->vr is set up and started; run it. 0 or -errno. */
	int (*queue_start)(void *opaque, struct vu_dev *dev, unsigned idx);
	/* Stop running the queue: 0 when stopped already, 1 when the device
	 * will call vu_queue_stopped() later on the control thread (after its
	 * in-flight requests have finished and been put on the used ring). */
	int (*queue_stop)(void *opaque, struct vu_dev *dev, unsigned idx);
	/* vq->call_fd or vq->err_fd of a running queue changed: use the new
	 * ones. 0: done at once; 1: the device calls vu_queue_fds_done() on the
	 * control thread once it no longer uses the old ones. */
	int (*queue_set_fds)(void *opaque, struct vu_dev *dev, unsigned idx);
	/* The connection is gone and every queue stopped; the device may free
	 * the struct vu_dev with vu_dev_free() from here. */
	void (*closed)(void *opaque, struct vu_dev *dev);
};

struct vu_dev_config {
	struct loop *loop; /* control loop: the caller's thread */
	unsigned num_queues;
	const struct vu_dev_ops *ops;
	void *opaque;
	const char *name; /* for log messages */
};

/* Serve a connected socket (ownership of fd passes, also on failure). */
int vu_dev_new(const struct vu_dev_config *cfg, int fd, struct vu_dev **out);
/* Drop the connection: stop the queues, then ops->closed(). */
void vu_dev_close(struct vu_dev *d);
void vu_dev_free(struct vu_dev *d);
struct vu_vq *vu_dev_vq(struct vu_dev *d, unsigned idx);
uint64_t vu_dev_features(const struct vu_dev *d); /* negotiated */
/* The configuration space changed (a resize): tell the front-end with
 * VHOST_USER_BACKEND_CONFIG_CHANGE_MSG on the back-end channel, if it
 * negotiated BACKEND_REQ and CONFIG and gave the channel. 0; -ENOTCONN
 * without a channel; -EIO if the message could not be sent at once. */
int vu_dev_config_changed(struct vu_dev *d);
void vu_queue_stopped(struct vu_dev *d, unsigned idx);
void vu_queue_fds_done(struct vu_dev *d, unsigned idx);
/* Becomes non-zero (from any thread: the SIGBUS handler of util/mapguard.c)
 * when a file the front-end gave us was shrunk under our mapping, and stays
 * so for the rest of the connection; the device's queues must stop. */
atomic_int *vu_dev_mem_faulted(struct vu_dev *d);

/* Fuzz entry point: feeds data as a front-end's message stream to a
 * vhost-user-blk device on a null image. fds the messages need are made up
 * by the harness. Never crashes, leaks or hangs; returns 0. */
int vu_fuzz_one(const uint8_t *data, size_t len);

#endif
