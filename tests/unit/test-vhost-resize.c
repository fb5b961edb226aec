/* A resize reaches a vhost-user-blk front-end: the test thread plays the
 * front-end over a socketpair (GET_CONFIG, SET_BACKEND_REQ_FD with the
 * BACKEND_REQ and CONFIG protocol features), resizes the node with
 * blk_resize() and expects VHOST_USER_BACKEND_CONFIG_CHANGE_MSG on the
 * back-end channel and the new capacity in the configuration space.
 * Threading: the export's messages run on the main loop, which the test
 * thread turns between its requests; the queue's iothread stays idle. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <cmocka.h>

#include "block/block.h"
#include "block/graph.h"
#include "export/vhost-user-blk.h"
#include "export/vhost-user.h"
#include "loop/iothread.h"
#include "loop/loop.h"

#define F_PROTOCOL (1ull << 30)
#define CONFIG_CHANGE_MSG 2

static struct {
	struct loop *main_loop;
	struct iothread *io;
	struct blk_node *bs;
	struct vub_export *e;
	int fe;    /* the front-end's end of the connection */
	int bk[2]; /* the back-end channel: [0] read here, [1] given away */
	bool stopped;
} g;

static bool readable(int fd, int ms)
{
	struct pollfd p = {.fd = fd, .events = POLLIN};

	return poll(&p, 1, ms) == 1;
}

/* Turn the main loop until fd has something to read (bounded). */
static bool pump_until(int fd)
{
	for (int i = 0; i < 1000; i++) {
		if (readable(fd, 0))
			return true;
		loop_run_once(g.main_loop, false);
		readable(fd, 1);
	}
	return readable(fd, 0);
}

static void send_msg(uint32_t req, const void *payload, uint32_t size, int fd)
{
	struct vu_msg_hdr h = {.request = req, .flags = VHOST_USER_VERSION, .size = size};
	struct iovec iov[2] = {{&h, sizeof(h)}, {(void *)payload, size}};
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = size ? 2 : 1};

	if (fd >= 0) {
		struct cmsghdr *cm;

		mh.msg_control = u.buf;
		mh.msg_controllen = sizeof(u.buf);
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	}
	assert_int_equal(sendmsg(g.fe, &mh, 0), (ssize_t)(sizeof(h) + size));
	loop_run_once(g.main_loop, false);
}

static uint32_t recv_reply(uint32_t req, void *payload, uint32_t max)
{
	struct vu_msg_hdr h;

	assert_true(pump_until(g.fe));
	assert_int_equal(recv(g.fe, &h, sizeof(h), MSG_WAITALL), sizeof(h));
	assert_int_equal(h.request, req);
	assert_true(h.flags & VHOST_USER_REPLY);
	assert_true(h.size <= max);
	if (h.size)
		assert_int_equal(recv(g.fe, payload, h.size, MSG_WAITALL), h.size);
	return h.size;
}

static uint64_t get_u64(uint32_t req)
{
	uint64_t v = 0;

	send_msg(req, NULL, 0, -1);
	assert_int_equal(recv_reply(req, &v, sizeof(v)), sizeof(v));
	return v;
}

static uint64_t capacity(void)
{
	uint8_t buf[sizeof(struct vu_config_msg) + 8] = {0};
	struct vu_config_msg *c = (struct vu_config_msg *)buf;
	uint64_t cap;

	c->size = 8;
	send_msg(VHOST_USER_GET_CONFIG, buf, sizeof(buf), -1);
	assert_int_equal(recv_reply(VHOST_USER_GET_CONFIG, buf, sizeof(buf)), sizeof(buf));
	memcpy(&cap, c->payload, sizeof(cap));
	return cap;
}

static void stopped(void *opaque)
{
	(void)opaque;
	g.stopped = true;
}

static int setup(void **state)
{
	struct vub_export_config cfg = {.blk = {.num_queues = 1, .logical_block_size = 512}};
	struct loop *loops[1];
	char err[256];
	int sv[2];

	(void)state;
	blk_register_builtin_drivers();
	assert_int_equal(loop_new(NULL, &g.main_loop), 0);
	loop_bind_current(g.main_loop);
	assert_int_equal(blk_open_target("null:size=1M", NULL, NULL, &g.bs, err, sizeof(err)), 0);
	assert_int_equal(iothread_start("vhost-resize", NULL, &g.io), 0);
	loops[0] = iothread_loop(g.io);
	cfg.bs = g.bs;
	cfg.main_loop = g.main_loop;
	cfg.loops = loops;
	cfg.nloops = 1;
	assert_int_equal(vub_export_start(&cfg, &g.e, err, sizeof(err)), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, g.bk), 0);
	fcntl(sv[1], F_SETFL, O_NONBLOCK);
	g.fe = sv[0];
	assert_int_equal(vub_export_attach_fd(g.e, sv[1]), 0);
	return 0;
}

static void detach(void *arg)
{
	(void)arg;
	blk_detach_loop(g.bs, loop_current());
}

static int teardown(void **state)
{
	(void)state;
	vub_export_stop(g.e, stopped, NULL);
	close(g.fe);
	for (int i = 0; i < 1000 && !g.stopped; i++)
		loop_run_once(g.main_loop, false);
	assert_true(g.stopped);
	vub_export_free(g.e);
	iothread_run_sync(g.io, detach, NULL);
	iothread_join(g.io);
	blk_close(g.bs);
	close(g.bk[0]);
	loop_free(g.main_loop);
	return 0;
}

static void test_resize_notifies_front_end(void **state)
{
	uint64_t pf = (1ull << VHOST_USER_PROTOCOL_F_BACKEND_REQ) |
		      (1ull << VHOST_USER_PROTOCOL_F_CONFIG);
	struct vu_msg_hdr h;
	char err[256];
	uint64_t f;

	(void)state;
	f = get_u64(VHOST_USER_GET_FEATURES);
	assert_true(f & F_PROTOCOL);
	send_msg(VHOST_USER_SET_FEATURES, &f, sizeof(f), -1);
	assert_true(get_u64(VHOST_USER_GET_PROTOCOL_FEATURES) & pf);
	send_msg(VHOST_USER_SET_PROTOCOL_FEATURES, &pf, sizeof(pf), -1);
	assert_int_equal(capacity(), 2048); /* 1 MiB in sectors */
	send_msg(VHOST_USER_SET_BACKEND_REQ_FD, NULL, 0, g.bk[1]);
	close(g.bk[1]);
	loop_run_once(g.main_loop, false);
	assert_false(readable(g.bk[0], 0));

	assert_int_equal(blk_resize(g.bs, 3u << 20, err, sizeof(err)), 0);
	assert_true(pump_until(g.bk[0]));
	assert_int_equal(recv(g.bk[0], &h, sizeof(h), MSG_WAITALL), sizeof(h));
	assert_int_equal(h.request, CONFIG_CHANGE_MSG);
	assert_int_equal(h.size, 0);
	assert_int_equal(capacity(), 6144);
	/* Shrinking is announced too. */
	assert_int_equal(blk_resize(g.bs, 1u << 19, err, sizeof(err)), 0);
	assert_true(pump_until(g.bk[0]));
	assert_int_equal(recv(g.bk[0], &h, sizeof(h), MSG_WAITALL), sizeof(h));
	assert_int_equal(capacity(), 1024);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_resize_notifies_front_end, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
