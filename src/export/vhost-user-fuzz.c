/* Fuzz entry point for the vhost-user back-end: one input is a front-end's
 * message stream. The harness cuts it at message headers and attaches the
 * file descriptors each message type carries (memfds for memory and inflight
 * areas, eventfds for kick/call/err), so that inputs reach the handlers
 * rather than the fd-count checks. A 4-queue vhost-user-blk export on a
 * writable 1 MiB null image, run by the caller's thread, serves it.
 *
 * THREADING RULE: single-threaded; the loop, image and export are created on
 * the first call and kept. */
#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "block/block.h"
#include "export/vhost-user-blk.h"
#include "export/vhost-user.h"
#include "loop/loop.h"
#include "util/log.h"

#define FUZZ_MEM_SIZE (1u << 20)
#define FUZZ_ROUNDS_PER_MSG 4
#define FUZZ_MAX_ROUNDS 10000

static struct {
	struct loop *loop;
	struct blk_node *bs;
	struct vub_export *e;
	bool ready, failed;
} fz;

/* The caller's thread runs the loop, without polling, quiet but for errors. */
static int fuzz_loop(void)
{
	struct loop_opts lo = {.poll_max_ns = 0};
	int ret = loop_new(&lo, &fz.loop);

	if (ret == 0)
		loop_bind_current(fz.loop);
	return ret;
}

static int fuzz_init(void)
{
	struct vub_export_config cfg = {.blk = {.writable = true, .num_queues = 4}, .nloops = 1};
	char err[256];
	int ret;

	log_set_level(LOG_ERR);
	ret = fuzz_loop();
	if (!ret)
		ret = blk_open_target("null:size=1M,read-zeroes=on", NULL, NULL, &fz.bs, err,
				      sizeof(err));
	if (ret < 0)
		return ret;
	cfg.bs = fz.bs;
	cfg.main_loop = fz.loop;
	cfg.loops = &fz.loop;
	return vub_export_start(&cfg, &fz.e, err, sizeof(err));
}

static int fuzz_memfd(void)
{
	int fd = memfd_create("fuzz-guest", MFD_CLOEXEC);

	if (fd >= 0 && ftruncate(fd, FUZZ_MEM_SIZE) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* How many fds (and which kind) this message would carry from QEMU. */
static unsigned fuzz_nfds(const struct vu_msg_hdr *h, const uint8_t *p, size_t plen, bool *mem)
{
	uint64_t v = 0;
	uint32_t n = 0;

	*mem = true;
	switch (h->request) {
	case VHOST_USER_SET_MEM_TABLE:
		if (plen >= 4)
			memcpy(&n, p, 4);
		return n > VU_MEM_TABLE_MAX ? VU_MEM_TABLE_MAX : n;
	case VHOST_USER_ADD_MEM_REG:
	case VHOST_USER_SET_INFLIGHT_FD:
		return 1;
	case VHOST_USER_SET_VRING_KICK:
	case VHOST_USER_SET_VRING_CALL:
	case VHOST_USER_SET_VRING_ERR:
		*mem = false;
		if (plen >= 8)
			memcpy(&v, p, 8);
		return v & VHOST_USER_VRING_NOFD ? 0 : 1;
	default:
		return 0;
	}
}

static void fuzz_send(int fd, const uint8_t *msg, size_t len, const struct vu_msg_hdr *h)
{
	union {
		char buf[CMSG_SPACE(VU_MAX_FDS * sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = {(void *)msg, len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
	int fds[VU_MAX_FDS];
	bool mem;
	unsigned i, n = fuzz_nfds(h, msg + VU_HDR_SIZE, len - VU_HDR_SIZE, &mem);

	for (i = 0; i < n; i++)
		fds[i] = mem ? fuzz_memfd() : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (n) {
		struct cmsghdr *cm;

		mh.msg_control = u.buf;
		mh.msg_controllen = CMSG_SPACE(n * sizeof(int));
		cm = CMSG_FIRSTHDR(&mh);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(n * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, n * sizeof(int));
	}
	sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
	for (i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

static void fuzz_rounds(int fd, unsigned n)
{
	static uint8_t sink[4096];
	unsigned i;

	for (i = 0; i < n; i++) {
		while (recv(fd, sink, sizeof(sink), MSG_DONTWAIT) > 0)
			;
		loop_run_once(fz.loop, false);
	}
}

int vu_fuzz_one(const uint8_t *data, size_t len)
{
	size_t off = 0;
	int sv[2], i;

	if (!fz.ready && !fz.failed) {
		fz.failed = fuzz_init() < 0;
		fz.ready = !fz.failed;
	}
	if (!fz.ready || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
		return 0;
	if (vub_export_attach_fd(fz.e, sv[0]) < 0) {
		close(sv[1]);
		return 0;
	}
	/* Each message is header + payload; the last one may be cut short. */
	while (off + VU_HDR_SIZE <= len && vub_export_connected(fz.e)) {
		struct vu_msg_hdr h;
		size_t n;

		memcpy(&h, data + off, sizeof(h));
		n = len - off - VU_HDR_SIZE < h.size ? len - off : VU_HDR_SIZE + (size_t)h.size;
		fuzz_send(sv[1], data + off, n, &h);
		off += n;
		fuzz_rounds(sv[1], FUZZ_ROUNDS_PER_MSG);
	}
	shutdown(sv[1], SHUT_WR);
	for (i = 0; i < FUZZ_MAX_ROUNDS && vub_export_connected(fz.e); i++)
		fuzz_rounds(sv[1], 1);
	if (vub_export_connected(fz.e))
		log_err("vhost-user fuzz: connection still open after %d rounds", FUZZ_MAX_ROUNDS);
	close(sv[1]);
	return 0;
}
