/* virtio-blk device model (virtio 1.2 section 5.2), independent of the
 * transport: feature bits, configuration space, and a request handler that
 * takes a chain's iovecs (already mapped into guest memory) and turns it into
 * a block-layer request without copying the data.
 *
 * THREADING RULE: a struct vblk_dev is set up on the control thread; its
 * fields are read-only afterwards except `writeback`, which the control
 * thread changes (SET_CONFIG) and iothreads read with relaxed atomics. A
 * struct vblk_req belongs to the thread that submitted it. */
#ifndef IOPLANE_VIRTIO_BLK_H
#define IOPLANE_VIRTIO_BLK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "block/block.h"
#include "export/vring.h"

/* Feature bits */
#define VIRTIO_BLK_F_SIZE_MAX 1
#define VIRTIO_BLK_F_SEG_MAX 2
#define VIRTIO_BLK_F_RO 5
#define VIRTIO_BLK_F_BLK_SIZE 6
#define VIRTIO_BLK_F_FLUSH 9
#define VIRTIO_BLK_F_TOPOLOGY 10
#define VIRTIO_BLK_F_CONFIG_WCE 11
#define VIRTIO_BLK_F_MQ 12
#define VIRTIO_BLK_F_DISCARD 13
#define VIRTIO_BLK_F_WRITE_ZEROES 14
#define VIRTIO_F_VERSION_1 32

/* Request types and status values */
#define VIRTIO_BLK_T_IN 0
#define VIRTIO_BLK_T_OUT 1
#define VIRTIO_BLK_T_FLUSH 4
#define VIRTIO_BLK_T_GET_ID 8
#define VIRTIO_BLK_T_DISCARD 11
#define VIRTIO_BLK_T_WRITE_ZEROES 13
#define VIRTIO_BLK_S_OK 0
#define VIRTIO_BLK_S_IOERR 1
#define VIRTIO_BLK_S_UNSUPP 2
#define VIRTIO_BLK_WZ_F_UNMAP 1u
#define VIRTIO_BLK_ID_BYTES 20
#define VIRTIO_BLK_SECTOR 512u

/* Segments advertised in seg_max; a chain may carry two more (header and
 * status) plus a few where a buffer crosses a memory region boundary. */
#define VBLK_SEG_MAX 126
#define VBLK_MAX_IOV (VBLK_SEG_MAX + 6)

struct virtio_blk_hdr {
	uint32_t type;
	uint32_t ioprio;
	uint64_t sector;
};

struct virtio_blk_discard_wz {
	uint64_t sector;
	uint32_t num_sectors;
	uint32_t flags;
};

struct virtio_blk_config {
	uint64_t capacity;
	uint32_t size_max;
	uint32_t seg_max;
	uint16_t cylinders;
	uint8_t heads;
	uint8_t sectors;
	uint32_t blk_size;
	uint8_t physical_block_exp;
	uint8_t alignment_offset;
	uint16_t min_io_size;
	uint32_t opt_io_size;
	uint8_t writeback;
	uint8_t unused0;
	uint16_t num_queues;
	uint32_t max_discard_sectors;
	uint32_t max_discard_seg;
	uint32_t discard_sector_alignment;
	uint32_t max_write_zeroes_sectors;
	uint32_t max_write_zeroes_seg;
	uint8_t write_zeroes_may_unmap;
	uint8_t unused1[3];
} __attribute__((packed));

#define VBLK_CONFIG_WRITEBACK_OFF 32

struct vblk_dev_opts {
	bool writable;
	uint32_t logical_block_size; /* 512 or 4096; 0: 512 */
	const char *serial;          /* NULL: none */
	unsigned num_queues;
};

struct vblk_dev {
	/* Written by the main thread when the node is replaced (under a drain),
	 * read by the queues' threads (relaxed atomics). */
	struct blk_node *bs;
	/* Capacity in 512-byte sectors, a multiple of lbs: written by the main
	 * thread on a resize, read by the queues' threads (relaxed atomics). */
	uint64_t sectors;
	uint32_t lbs;
	bool read_only;
	uint8_t writeback; /* 1: write-back cache; 0: writes are FUA */
	unsigned num_queues;
	char serial[VIRTIO_BLK_ID_BYTES];
};

int vblk_dev_init(struct vblk_dev *d, struct blk_node *bs, const struct vblk_dev_opts *o, char *err,
		  size_t errlen);
uint64_t vblk_dev_features(const struct vblk_dev *d);
void vblk_dev_config(const struct vblk_dev *d, struct virtio_blk_config *cfg);
/* The node was resized: the capacity follows (main thread). */
void vblk_dev_resized(struct vblk_dev *d);
/* The node was replaced by bs of the same size (blk_replace_node, main
 * thread, both drained): requests go there from now on. */
void vblk_dev_set_node(struct vblk_dev *d, struct blk_node *bs);
/* A driver write to the configuration space: only `writeback` is writable.
 * -EINVAL for anything else. */
int vblk_dev_set_config(struct vblk_dev *d, uint32_t off, const uint8_t *buf, uint32_t len);

struct vblk_req {
	struct blk_request breq; /* first: the completion casts back */
	struct vblk_dev *dev;
	/* The chain: iov[0, nout) readable, iov[nout, nout+nin) writable. The
	 * handler trims these entries in place to the data part. */
	struct iovec *iov;
	unsigned nout, nin;
	uint64_t out_len, in_len;
	/* Set by the handler. */
	uint8_t *status;
	uint32_t used_len;
	int error; /* the block layer's -errno for a failed request, else 0 */
	void (*done)(struct vblk_req *r); /* after the status byte is written */
};

/* What vblk_req_submit() did with the request. */
enum vblk_submit_result {
	VBLK_SUBMITTED, /* r->done runs later */
	VBLK_FINISHED,  /* now: status written, used_len set, done not called */
	VBLK_BROKEN,    /* the chain has no room for a header or status byte:
			 * the driver is broken */
};

/* Handle one request. */
enum vblk_submit_result vblk_req_submit(struct vblk_req *r);

#endif
