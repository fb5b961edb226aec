/* An in-memory protocol node for tests and fuzz targets: the bytes of a
 * block device in a buffer, and what each operation does to them. The unit
 * tests' "ram" driver (tests/unit/blk-test-ram.h) and the qcow2 fuzz
 * target's "fuzzram" driver are built on it; each adds its own checks
 * (alignment, holding requests, failing on purpose, aborting on a request
 * past the end).
 *
 * Threading: the buffer and its size are protected by `lock`, since a node
 * may be used from several loops and truncated from a pool thread. */
#ifndef TESTS_BLK_RAM_H
#define TESTS_BLK_RAM_H

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-driver.h"
#include "util/iov.h"

#define BLK_RAM_FN static __attribute__((unused))

struct blk_ram {
	pthread_mutex_t lock;
	uint8_t *data; /* lock */
	uint64_t size; /* lock */
};

/* size bytes: a copy of img (NULL: zeroes). 0 or -ENOMEM. */
BLK_RAM_FN int blk_ram_init(struct blk_ram *r, const void *img, uint64_t size)
{
	r->data = img ? malloc(size ? size : 1) : calloc(1, size ? size : 1);
	if (!r->data)
		return -ENOMEM;
	if (img)
		memcpy(r->data, img, size);
	r->size = size;
	pthread_mutex_init(&r->lock, NULL);
	return 0;
}

BLK_RAM_FN void blk_ram_destroy(struct blk_ram *r)
{
	pthread_mutex_destroy(&r->lock);
	free(r->data);
	r->data = NULL;
}

/* Does the request stay inside the device (lock held)? Flushes always do. */
BLK_RAM_FN bool blk_ram_in_range(const struct blk_ram *r, const struct blk_request *req)
{
	uint64_t end = req->offset + req->len;

	return req->op == BLK_OP_FLUSH || (end >= req->offset && end <= r->size);
}

/* What the request does to the bytes (lock held; the range is the caller's
 * to check). Block status: everything is data. */
BLK_RAM_FN void blk_ram_exec(struct blk_ram *r, struct blk_request *req)
{
	switch (req->op) {
	case BLK_OP_READ:
		iov_from_buf(req->iov, req->iovcnt, 0, r->data + req->offset, req->len);
		break;
	case BLK_OP_WRITE:
		iov_to_buf(req->iov, req->iovcnt, 0, r->data + req->offset, req->len);
		break;
	case BLK_OP_WRITE_ZEROES:
	case BLK_OP_DISCARD:
		memset(r->data + req->offset, 0, req->len);
		break;
	case BLK_OP_BLOCK_STATUS:
		req->status = BLK_STATUS_DATA | BLK_STATUS_ALLOCATED;
		req->status_len = req->len;
		break;
	default:
		break;
	}
}

/* Grow (with zeroes) or shrink to size, and bs->size with it. 0 or -ENOMEM. */
BLK_RAM_FN int blk_ram_resize(struct blk_ram *r, struct blk_node *bs, uint64_t size)
{
	uint8_t *p;
	int ret = 0;

	pthread_mutex_lock(&r->lock);
	p = realloc(r->data, size ? size : 1);
	if (!p) {
		ret = -ENOMEM;
	} else {
		if (size > r->size)
			memset(p + r->size, 0, size - r->size);
		r->data = p;
		r->size = size;
		bs->size = size;
	}
	pthread_mutex_unlock(&r->lock);
	return ret;
}

#endif
