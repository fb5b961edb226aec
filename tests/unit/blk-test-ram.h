/* Test helpers for block-layer unit tests: a RAM-backed protocol driver
 * ("ram", on tests/lib/blk-ram.h) that checks every request it gets is
 * aligned, logs what it executes, can hold requests and complete them in
 * random order, and can fail one operation type; plus loop set-up and the
 * set-up and tear-down every test group of these tests shares.
 * Threading: one loop thread. */
#ifndef BLK_TEST_RAM_H
#define BLK_TEST_RAM_H

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "blk-ram.h"
#include "block/block-driver.h"
#include "loop/loop.h"
#include "util/iov.h"
#include "util/opts.h"

#define RAM_FN static __attribute__((unused))
#define RAM_MAX_PENDING 1024
#define RAM_MAX_LOG 4096

/* Set by the test before blk_open(driver=ram,...). */
struct ram_config {
	uint32_t align, mem_align;
	bool no_fua, no_discard, no_wz, no_block_status;
	bool hold;  /* keep requests until ram_pump() */
	bool lifo;  /* ram_pump order when not random */
	bool random_order;
	int fail_op; /* -1: none; this op completes with fail_ret */
	int fail_ret;
	int reject_op; /* -1: none; submit() of this op returns reject_ret */
	int reject_ret;
};

struct ram_log {
	uint8_t op;
	uint32_t flags;
	uint64_t off, len;
};

struct ram_dev {
	struct blk_ram ram; /* data, size, lock (the device may be used from several loops) */
	struct ram_config cfg;
	struct blk_request *pending[RAM_MAX_PENDING];
	unsigned npending, max_pending;
	unsigned ops[BLK_OP__COUNT];
	unsigned misaligned; /* requests that broke align or mem_align */
	struct ram_log log[RAM_MAX_LOG];
	unsigned nlog;
	uint64_t rng;
};

static struct ram_config ram_cfg = { .fail_op = -1, .reject_op = -1 };
static struct ram_dev *ram_last; /* the last opened device */

RAM_FN void ram_reset_config(void)
{
	memset(&ram_cfg, 0, sizeof(ram_cfg));
	ram_cfg.fail_op = -1;
	ram_cfg.reject_op = -1;
}

RAM_FN uint64_t ram_rand(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static int ram_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	struct ram_dev *d;
	uint64_t size = 0;

	if (kv_get_size(opts, "ram-size", &size) || size == 0) {
		snprintf(err, errlen, "ram: ram-size required");
		return -EINVAL;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	if (blk_ram_init(&d->ram, NULL, size)) {
		free(d);
		return -ENOMEM;
	}
	d->cfg = ram_cfg;
	d->rng = 0x9e3779b97f4a7c15ull;
	bs->opaque = d;
	bs->size = size;
	bs->align = d->cfg.align ? d->cfg.align : 1;
	bs->mem_align = d->cfg.mem_align ? d->cfg.mem_align : 1;
	ram_last = d;
	return 0;
}

static void ram_close(struct blk_node *bs)
{
	struct ram_dev *d = bs->opaque;

	if (ram_last == d)
		ram_last = NULL;
	blk_ram_destroy(&d->ram);
	free(d);
}

static int ram_execute_locked(struct ram_dev *d, struct blk_request *req)
{
	if (d->nlog < RAM_MAX_LOG)
		d->log[d->nlog++] = (struct ram_log){ req->op, req->flags, req->offset, req->len };
	d->ops[req->op]++;
	if ((int)req->op == d->cfg.fail_op)
		return d->cfg.fail_ret;
	blk_ram_exec(&d->ram, req);
	return 0;
}

static int ram_execute(struct ram_dev *d, struct blk_request *req)
{
	int ret;

	pthread_mutex_lock(&d->ram.lock);
	ret = ram_execute_locked(d, req);
	pthread_mutex_unlock(&d->ram.lock);
	return ret;
}

static void ram_check(struct blk_node *bs, struct ram_dev *d, struct blk_request *req)
{
	if (!blk_ram_in_range(&d->ram, req))
		d->misaligned += 1000; /* out of range: never acceptable */
	if (req->op == BLK_OP_FLUSH || req->op == BLK_OP_BLOCK_STATUS)
		return;
	if ((req->offset | req->len) % bs->align)
		d->misaligned++;
	if (req->op != BLK_OP_READ && req->op != BLK_OP_WRITE)
		return;
	/* Linux O_DIRECT rules: buffer addresses to mem_align, segment lengths
	 * to align. */
	for (int i = 0; i < req->iovcnt; i++)
		if ((uintptr_t)req->iov[i].iov_base % bs->mem_align || req->iov[i].iov_len % bs->align)
			d->misaligned++;
}

static int ram_submit(struct blk_node *bs, struct blk_request *req)
{
	struct ram_dev *d = bs->opaque;

	pthread_mutex_lock(&d->ram.lock);
	ram_check(bs, d, req);
	pthread_mutex_unlock(&d->ram.lock);
	if ((int)req->op == d->cfg.reject_op)
		return d->cfg.reject_ret;
	if (d->cfg.hold) {
		if (d->npending == RAM_MAX_PENDING)
			return -EAGAIN;
		d->pending[d->npending++] = req;
		if (d->npending > d->max_pending)
			d->max_pending = d->npending;
		return 0;
	}
	blk_complete_deferred(req, ram_execute(d, req));
	return 0;
}

static int ram_truncate(struct blk_node *bs, uint64_t size)
{
	return blk_ram_resize(&((struct ram_dev *)bs->opaque)->ram, bs, size);
}

static bool ram_can_fua(struct blk_node *bs) { return !((struct ram_dev *)bs->opaque)->cfg.no_fua; }
static bool ram_can_discard(struct blk_node *bs)
{
	return !((struct ram_dev *)bs->opaque)->cfg.no_discard;
}
static bool ram_can_wz(struct blk_node *bs) { return !((struct ram_dev *)bs->opaque)->cfg.no_wz; }
static bool ram_can_bs(struct blk_node *bs)
{
	return !((struct ram_dev *)bs->opaque)->cfg.no_block_status;
}

static const struct blk_driver ram_driver = {
	.name = "ram",
	.open = ram_open,
	.close = ram_close,
	.submit = ram_submit,
	.truncate = ram_truncate,
	.can_fua = ram_can_fua,
	.can_discard = ram_can_discard,
	.can_write_zeroes = ram_can_wz,
	.can_block_status = ram_can_bs,
};

/* Execute and complete one held request (random, FIFO or LIFO). */
RAM_FN bool ram_complete_one(struct ram_dev *d)
{
	struct blk_request *req;
	unsigned i;

	if (!d->npending)
		return false;
	if (d->cfg.random_order)
		i = (unsigned)(ram_rand(&d->rng) % d->npending);
	else
		i = d->cfg.lifo ? d->npending - 1 : 0;
	req = d->pending[i];
	memmove(&d->pending[i], &d->pending[i + 1], (d->npending - i - 1) * sizeof(req));
	d->npending--;
	blk_complete(req, ram_execute(d, req));
	return true;
}

struct ram_watchdog {
	struct loop_timer t;
	bool fired;
};

static void ram_watchdog_cb(struct loop_timer *t)
{
	((struct ram_watchdog *)t)->fired = true;
}

/* Run held requests and the loop until *count reaches target; bounded by a
 * 20 s watchdog timer so that a lost completion fails instead of hanging.
 * Returns *count; no cmocka assert, so usable on any thread. */
RAM_FN unsigned ram_pump_nocheck(struct ram_dev *d, struct loop *loop, const unsigned *count,
				 unsigned target)
{
	struct ram_watchdog wd = { .t = { .cb = ram_watchdog_cb } };

	loop_timer_arm(loop, &wd.t, loop_now_ns() + 20000000000ull);
	while (*count < target && !wd.fired) {
		if (!d || !ram_complete_one(d))
			loop_run_once(loop, true);
	}
	if (loop_timer_armed(&wd.t))
		loop_timer_cancel(loop, &wd.t);
	return *count;
}

RAM_FN void ram_pump(struct ram_dev *d, struct loop *loop, const unsigned *count, unsigned target)
{
	assert_int_equal(ram_pump_nocheck(d, loop, count, target), target);
}

RAM_FN int ram_register(void)
{
	int ret;

	blk_register_builtin_drivers();
	ret = blk_register_driver(&ram_driver);
	return ret == -EEXIST ? 0 : ret;
}

RAM_FN struct blk_node *test_open(const char *s)
{
	struct kv_opts o = { 0 };
	struct blk_node *bs = NULL;
	char err[256] = "";
	int ret;

	assert_int_equal(kv_parse(&o, s, NULL), 0);
	ret = blk_open(&o, &bs, err, sizeof(err));
	if (ret)
		fprintf(stderr, "open '%s': %s\n", s, err);
	assert_int_equal(ret, 0);
	kv_free(&o);
	return bs;
}

/* blk_open() expected to fail; returns the error and copies the message. */
RAM_FN int test_open_fail(const char *s, char *err, size_t errlen)
{
	struct kv_opts o = { 0 };
	struct blk_node *bs = NULL;
	int ret;

	assert_int_equal(kv_parse(&o, s, NULL), 0);
	ret = blk_open(&o, &bs, err, errlen);
	assert_null(bs);
	kv_free(&o);
	return ret;
}

RAM_FN struct loop *test_loop_new(void)
{
	struct loop_opts opts = { .backend = LOOP_BACKEND_AUTO, .poll_max_ns = 0 };
	struct loop *loop = NULL;

	assert_int_equal(loop_new(&opts, &loop), 0);
	loop_bind_current(loop);
	return loop;
}

RAM_FN void test_loop_free(struct loop *loop)
{
	loop_bind_current(NULL);
	loop_free(loop);
}

/* Set-up and tear-down of each test: the ram driver registered (with the
 * built-in ones), its configuration reset, a bound loop in *state. */
RAM_FN int ram_test_setup(void **state)
{
	assert_int_equal(ram_register(), 0);
	ram_reset_config();
	*state = test_loop_new();
	return 0;
}

RAM_FN int ram_test_teardown(void **state)
{
	test_loop_free(*state);
	return 0;
}

#define RAM_TEST(fn) cmocka_unit_test_setup_teardown(fn, ram_test_setup, ram_test_teardown)

/* Are all n bytes at p equal to v? */
RAM_FN bool all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
	size_t i;

	for (i = 0; i < n; i++)
		if (p[i] != v)
			return false;
	return true;
}

/* A request with a completion counter. */
struct test_req {
	struct blk_request req;
	struct iovec iov;
	unsigned calls;
	int ret;
	unsigned *done; /* shared counter, may be NULL */
	unsigned order; /* value of *done when this one completed */
	bool *in_submit; /* set while the test is inside blk_submit() */
	bool saw_in_submit;
};

RAM_FN void test_req_cb(struct blk_request *req, int ret)
{
	struct test_req *t = req->opaque;

	t->calls++;
	t->ret = ret;
	if (t->in_submit && *t->in_submit)
		t->saw_in_submit = true;
	if (t->done)
		t->order = (*t->done)++;
}

RAM_FN void test_req_init(struct test_req *t, uint8_t op, uint64_t off, void *buf, uint64_t len,
			  uint32_t flags, unsigned *done)
{
	memset(t, 0, sizeof(*t));
	t->iov.iov_base = buf;
	t->iov.iov_len = len;
	t->req.op = op;
	t->req.flags = flags;
	t->req.offset = off;
	t->req.len = len;
	if (op == BLK_OP_READ || op == BLK_OP_WRITE) {
		t->req.iov = &t->iov;
		t->req.iovcnt = 1;
	}
	t->req.cb = test_req_cb;
	t->req.opaque = t;
	t->done = done;
}

/* Submit with the in-submit marker set. */
RAM_FN int test_submit(struct blk_node *bs, struct test_req *t, bool *in_submit)
{
	int ret;

	t->in_submit = in_submit;
	*in_submit = true;
	ret = blk_submit(bs, &t->req);
	*in_submit = false;
	return ret;
}

#endif
