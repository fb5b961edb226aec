/* Unit tests for virtio-scsi commands (virtio-scsi-cmd.c) on a ram node,
 * without a transport: chains built in memory, one request slot used again
 * for one command after another, as a queue's pool does. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "blk-test-ram.h"
#include "export/virtio-scsi.h"

#define HDR_LEN (19 + VIRTIO_SCSI_CDB_DEFAULT)
#define RESP_LEN (12 + VIRTIO_SCSI_SENSE_DEFAULT)

struct chain {
	struct vscsi_req r;
	struct iovec iov[4];
	uint8_t hdr[HDR_LEN], resp[RESP_LEN], data[4096];
	unsigned done;
};

static void chain_done(struct vblk_req *vr)
{
	struct chain *c = (struct chain *)vr; /* r.v first */

	c->done++;
}

/* Submit cdb on LUN 0 through the slot c: data-out (dir > 0) or data-in
 * (dir < 0) of len bytes in c->data. Returns the SCSI status once done. */
static uint8_t command(struct vscsi_dev *d, struct loop *loop, struct chain *c, const uint8_t *cdb,
		       size_t cdb_len, int dir, size_t len)
{
	unsigned n = 0, nout, want = c->done + 1;

	memset(c->hdr, 0, sizeof(c->hdr));
	c->hdr[0] = 1;
	c->hdr[2] = 0x40; /* LUN 0, flat space */
	memcpy(c->hdr + 19, cdb, cdb_len);
	memset(c->resp, 0xee, sizeof(c->resp));
	c->iov[n++] = (struct iovec){c->hdr, HDR_LEN};
	if (dir > 0)
		c->iov[n++] = (struct iovec){c->data, len};
	nout = n;
	c->iov[n++] = (struct iovec){c->resp, RESP_LEN};
	if (dir < 0)
		c->iov[n++] = (struct iovec){c->data, len};
	c->r.dev = d;
	c->r.v.iov = c->iov;
	c->r.v.nout = nout;
	c->r.v.nin = n - nout;
	c->r.v.out_len = HDR_LEN + (dir > 0 ? len : 0);
	c->r.v.in_len = RESP_LEN + (dir < 0 ? len : 0);
	c->r.v.done = chain_done;
	if (vscsi_req_submit(&c->r, VSCSI_FIRST_REQ_Q) == VBLK_FINISHED)
		c->done++;
	ram_pump(NULL, loop, &c->done, want);
	return c->resp[10];
}

static const uint8_t unmap10[10] = {0x42, 0, 0, 0, 0, 0, 0, 0, 40, 0};
static const uint8_t read10[10] = {0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0};

/* Two ranges: blocks 0-7 and 8-15. */
static void unmap_list(uint8_t *p)
{
	memset(p, 0, 40);
	p[1] = 38;     /* data length */
	p[3] = 32;     /* block descriptor data length */
	p[8 + 11] = 8; /* 8 blocks at 0 */
	p[24 + 7] = 8; /* 8 blocks at 8 */
	p[24 + 11] = 8;
}

struct fixture {
	struct blk_node *bs;
	struct vscsi_dev d;
	struct chain *c;
};

static void fixture_init(struct fixture *f)
{
	f->c = calloc(1, sizeof(*f->c));
	assert_non_null(f->c);
	f->bs = test_open("driver=ram,ram-size=1M");
	assert_int_equal(vscsi_dev_init(&f->d, 1, true, true), 0);
	assert_int_equal(vscsi_lun_add(&f->d, 0, f->bs, "s"), 0);
}

static void fixture_fini(struct fixture *f)
{
	vscsi_lun_remove(&f->d, 0);
	vscsi_dev_destroy(&f->d);
	blk_close(f->bs);
	free(f->c);
}

/* An UNMAP whose first range fails leaves the rest undone: the next command
 * in the same slot must not run them (on its own LUN) nor wait for them. */
static void test_unmap_error_then_read(void **state)
{
	struct loop *loop = *state;
	struct fixture f;

	ram_cfg.fail_op = BLK_OP_DISCARD;
	ram_cfg.fail_ret = -EIO;
	fixture_init(&f);
	unmap_list(f.c->data);
	assert_int_equal(command(&f.d, loop, f.c, unmap10, sizeof(unmap10), 1, 40),
			 SCSI_STATUS_CHECK_CONDITION);
	assert_int_equal(f.c->resp[12 + 2], SCSI_SENSE_MEDIUM_ERROR);
	assert_int_equal(ram_last->ops[BLK_OP_DISCARD], 1);

	ram_last->cfg.fail_op = -1;
	assert_int_equal(command(&f.d, loop, f.c, read10, sizeof(read10), -1, 512),
			 SCSI_STATUS_GOOD);
	assert_int_equal(f.c->r.v.used_len, RESP_LEN + 512);
	assert_int_equal(ram_last->ops[BLK_OP_DISCARD], 1); /* the second range stays undone */
	assert_int_equal(ram_last->ops[BLK_OP_READ], 1);
	fixture_fini(&f);
}

/* A command without data-in after a READ in the same slot: the used length
 * is the response's alone, and a failure's sense is not a read error's. */
static void test_read_then_unmap_sync(void **state)
{
	static const uint8_t sync10[10] = {0x35};
	struct loop *loop = *state;
	struct fixture f;

	ram_cfg.fail_op = BLK_OP_FLUSH;
	ram_cfg.fail_ret = -EIO;
	fixture_init(&f);
	assert_int_equal(command(&f.d, loop, f.c, read10, sizeof(read10), -1, 512),
			 SCSI_STATUS_GOOD);
	assert_int_equal(f.c->r.v.used_len, RESP_LEN + 512);
	unmap_list(f.c->data);
	assert_int_equal(command(&f.d, loop, f.c, unmap10, sizeof(unmap10), 1, 40),
			 SCSI_STATUS_GOOD);
	assert_int_equal(ram_last->ops[BLK_OP_DISCARD], 2);
	assert_int_equal(f.c->r.v.used_len, RESP_LEN);
	assert_int_equal(command(&f.d, loop, f.c, sync10, sizeof(sync10), 0, 0),
			 SCSI_STATUS_CHECK_CONDITION);
	assert_int_equal(f.c->resp[12 + 12], SCSI_ASC_WRITE_ERROR >> 8);
	fixture_fini(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		RAM_TEST(test_unmap_error_then_read),
		RAM_TEST(test_read_then_unmap_sync),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
