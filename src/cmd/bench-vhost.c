/* `ioplane bench --vhost-user PATH [--num-queues N]`: qemu-img bench's
 * options (-c -d -s -S -o -w -q -t, --pattern, --random, --seed) driven
 * through a vhost-user-blk back-end, spread over N queues, with bench's
 * output. Extra: --verify (offset-derived data, checked on read),
 * --setup-only, --reconnect (survive a back-end restart through the inflight
 * area) and --reconnect-after N (drop the connection ourselves mid-run).
 *
 * THREADING RULE: single-threaded; one epoll set waits on the call eventfds
 * and the socket. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "cmd/bench-vhost.h"
#include "cmd/img-int.h"
#include "util/clock.h"
#include "util/hist.h"
#include "util/opts.h"

#define PROG "ioplane bench"
#define WAIT_MS 30000
#define SOCK_TAG ((void *)1)

struct vb_opts {
	uint64_t count, depth, bufsize, step, offset, seed, reconnect_after, nq, poll_ns;
	const char *path;
	uint8_t pattern;
	bool write, quiet, random, verify, setup_only, reconnect, unsafe, scsi, packed;
};

struct vb {
	struct vhc c;
	struct vb_opts o;
	int epfd;
	bool ready_phase;
	uint64_t to_submit, in_flight, completed;
	uint64_t offset, step, wrap, rng, rand_base, rand_blocks;
	uint64_t lat_sum, *hist;
	int err;
	uint64_t bad_offset;
};

/* ---- offsets and data ------------------------------------------------------------- */

static uint64_t vb_next_offset(struct vb *b)
{
	uint64_t off, x;

	if (b->o.random) {
		x = b->rng;
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		b->rng = x;
		return b->rand_base +
		       (uint64_t)(((unsigned __int128)x * b->rand_blocks) >> 64) * b->o.bufsize;
	}
	off = b->offset;
	b->offset += b->step;
	if (b->offset >= b->wrap)
		b->offset = b->wrap ? b->offset % b->wrap : 0;
	return off;
}

static inline uint64_t verify_word(const struct vb *b, uint64_t byte_off)
{
	return byte_off ^ (0x0101010101010101ull * b->o.pattern);
}

static void vb_fill(const struct vb *b, struct vhc_slot *sl, uint64_t off)
{
	uint64_t i, *w = (uint64_t *)sl->buf;

	for (i = 0; i < b->o.bufsize / 8; i++)
		w[i] = verify_word(b, off + 8 * i);
}

static bool vb_check(struct vb *b, const struct vhc_slot *sl)
{
	const uint64_t *w = (const uint64_t *)sl->buf;
	uint64_t i;

	for (i = 0; i < sl->len / 8; i++) {
		if (w[i] != verify_word(b, sl->offset + 8 * i)) {
			b->bad_offset = sl->offset + 8 * i;
			return false;
		}
	}
	return true;
}

/* ---- the request path ------------------------------------------------------------- */

static void vb_submit(struct vb *b, struct vhc_queue *q, unsigned s)
{
	struct vhc_slot *sl = &q->slots[s];
	uint64_t off = vb_next_offset(b);

	if (b->o.write && b->o.verify)
		vb_fill(b, sl, off);
	sl->start = clock_ticks();
	vhc_submit(&b->c, q, s, b->o.write ? VIRTIO_BLK_T_OUT : VIRTIO_BLK_T_IN, off,
		   (uint32_t)b->o.bufsize);
	b->to_submit--;
	b->in_flight++;
}

static void vb_fail(struct vb *b, int err)
{
	if (!b->err)
		b->err = err;
	b->to_submit = 0;
}

static void vb_complete(struct vb *b, struct vhc_queue *q, unsigned s)
{
	struct vhc_slot *sl = &q->slots[s];
	uint64_t lat = clock_ticks() - sl->start;

	b->in_flight--;
	if (!vhc_slot_ok(&b->c, sl)) {
		vb_fail(b, -EIO);
		return;
	}
	if (b->ready_phase)
		return;
	b->completed++;
	b->lat_sum += lat;
	b->hist[hist_bucket(lat)]++;
	if (b->o.verify && !b->o.write && !vb_check(b, sl))
		vb_fail(b, -EILSEQ);
	if (b->to_submit)
		vb_submit(b, q, s);
}

/* Complete what the used ring holds and publish the requests that replace
 * it. arm: when the ring is empty, ask for a call at the next used entry
 * (about to sleep); a polling client does not, so the back-end need not
 * signal it. */
static int vb_reap_ring(struct vb *b, struct vhc_queue *q, bool arm)
{
	int s;

	while ((s = vhc_next_used(q, arm, vhc_event_idx(&b->c))) >= 0)
		vb_complete(b, q, (unsigned)s);
	if (s == -2)
		return -EPROTO;
	vhc_publish(q, vhc_event_idx(&b->c));
	return 0;
}

static int vb_reap(struct vb *b, struct vhc_queue *q)
{
	uint64_t v;

	if (read(q->call_fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return -errno;
	return vb_reap_ring(b, q, true);
}

/* --poll-max-ns: watch the used rings for up to that long before sleeping,
 * as a guest with polled virtio-blk queues does. Returns 1 when something
 * completed, 0 when the time ran out, or -errno. */
static int vb_poll(struct vb *b)
{
	uint64_t deadline = clock_mono_ns() + b->o.poll_ns;
	bool found;
	int ret;

	do {
		found = false;
		for (unsigned i = 0; i < b->c.nq; i++) {
			struct vhc_queue *q = &b->c.q[i];

			if (!vhc_used_pending(q))
				continue;
			ret = vb_reap_ring(b, q, false);
			if (ret)
				return ret;
			found = true;
		}
	} while (!found && b->in_flight && clock_mono_ns() < deadline);
	return found;
}

/* ---- connection and waiting ------------------------------------------------------- */

static int vb_watch(struct vb *b, int fd, void *ptr)
{
	struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = ptr};

	return epoll_ctl(b->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 ? -errno : 0;
}

static int vb_connect(struct vb *b, bool reconnect)
{
	int ret;

	if (b->c.sock >= 0) {
		close(b->c.sock); /* also leaves the epoll set */
		b->c.sock = -1;
	}
	ret = vhc_connect(&b->c, reconnect);
	if (ret < 0) {
		fprintf(stderr, "%s: vhost-user %s: %s\n", PROG, b->o.path, strerror(-ret));
		return ret;
	}
	return vb_watch(b, b->c.sock, SOCK_TAG);
}

/* The socket woke us: the back-end went away. */
static int vb_sock_event(struct vb *b)
{
	if (!b->o.reconnect) {
		fprintf(stderr, "%s: the vhost-user back-end closed the connection\n", PROG);
		return -ECONNRESET;
	}
	if (!b->o.quiet)
		fprintf(stderr, "%s: back-end gone, reconnecting\n", PROG);
	return vb_connect(b, true);
}

static int vb_wait(struct vb *b)
{
	struct epoll_event ev[64];
	int i, n, ret = 0;

	while (b->in_flight && !ret) {
		if (b->o.poll_ns && !b->ready_phase) {
			ret = vb_poll(b);
			if (ret) {
				ret = ret < 0 ? ret : 0;
				continue;
			}
			/* Nothing came: arm every queue's call before sleeping. */
			for (i = 0; i < (int)b->c.nq && !ret; i++)
				ret = vb_reap_ring(b, &b->c.q[i], true);
			if (ret || !b->in_flight)
				continue;
		}
		n = epoll_wait(b->epfd, ev, 64, WAIT_MS);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return n < 0 ? -errno : -ETIMEDOUT;
		for (i = 0; i < n && !ret; i++)
			ret = ev[i].data.ptr == SOCK_TAG ? vb_sock_event(b)
							 : vb_reap(b, ev[i].data.ptr);
		if (!ret && b->o.reconnect_after && b->completed >= b->o.reconnect_after) {
			b->o.reconnect_after = 0; /* once, with requests in flight */
			ret = vb_connect(b, true);
		}
	}
	return ret;
}

/* Every queue answers one GET_ID: from connect() to here is the setup time. */
static int vb_setup(struct vb *b, double *ms)
{
	uint64_t t0 = clock_mono_ns();
	unsigned i;
	int ret = vb_connect(b, false);

	for (i = b->c.first_req; !ret && i < b->c.nq; i++) {
		/* scsi: READ CAPACITY (16) */
		vhc_submit(&b->c, &b->c.q[i], 0, VIRTIO_BLK_T_GET_ID, 0, VIRTIO_BLK_ID_BYTES);
		vhc_publish(&b->c.q[i], vhc_event_idx(&b->c));
		b->in_flight++;
	}
	b->ready_phase = true;
	if (!ret)
		ret = vb_wait(b);
	b->ready_phase = false;
	*ms = (double)(clock_mono_ns() - t0) / 1e6;
	if (!ret && b->c.scsi)
		vhc_scsi_capacity(&b->c, &b->c.q[b->c.first_req].slots[0]);
	return ret;
}

static int vb_flush(struct vb *b)
{
	struct vhc_queue *q = &b->c.q[b->c.first_req];

	if (!b->c.scsi && !(b->c.features & (1ull << VIRTIO_BLK_F_FLUSH)))
		return 0;
	vhc_submit(&b->c, q, 0, VIRTIO_BLK_T_FLUSH, 0, 0);
	vhc_publish(q, vhc_event_idx(&b->c));
	b->in_flight++;
	b->ready_phase = true;
	return vb_wait(b);
}

/* ---- options -------------------------------------------------------------------------- */

enum {
	OPT_VHOST = 256,
	OPT_NQ,
	OPT_PATTERN,
	OPT_RANDOM,
	OPT_SEED,
	OPT_VERIFY,
	OPT_SETUP_ONLY,
	OPT_RECONNECT,
	OPT_RECONNECT_AFTER,
	OPT_POLL,
	OPT_SCSI,
	OPT_PACKED,
};

static const struct option vb_long_opts[] = {
	{"help", no_argument, NULL, 'h'},
	{"vhost-user", required_argument, NULL, OPT_VHOST},
	{"num-queues", required_argument, NULL, OPT_NQ},
	{"pattern", required_argument, NULL, OPT_PATTERN},
	{"random", no_argument, NULL, OPT_RANDOM},
	{"seed", required_argument, NULL, OPT_SEED},
	{"verify", no_argument, NULL, OPT_VERIFY},
	{"setup-only", no_argument, NULL, OPT_SETUP_ONLY},
	{"reconnect", no_argument, NULL, OPT_RECONNECT},
	{"reconnect-after", required_argument, NULL, OPT_RECONNECT_AFTER},
	{"poll-max-ns", required_argument, NULL, OPT_POLL},
	{"scsi", no_argument, NULL, OPT_SCSI},
	{"packed", no_argument, NULL, OPT_PACKED},
	{"force-share", no_argument, NULL, 'U'},
	{NULL, 0, NULL, 0},
};

static void vb_usage(void)
{
	printf("Usage: ioplane bench --vhost-user SOCKET [--num-queues N] [-c count]\n"
	       "         [-d depth] [-s buffer_size] [-S step_size] [-o offset] [-w] [-q]\n"
	       "         [--pattern=BYTE] [--random [--seed=N]] [--verify] [--setup-only]\n"
	       "         [--reconnect] [--reconnect-after=N] [--poll-max-ns=NS] [--scsi]\n"
	       "         [--packed]\n"
	       "Drives a vhost-user-blk back-end (ioplane serve --vhost-user-blk,\n"
	       "qemu-storage-daemon) as a guest would; depth is spread over the queues.\n"
	       "--scsi: the back-end is vhost-user-scsi (LUN 0; READ/WRITE 16, SYNCHRONIZE\n"
	       "  CACHE); --num-queues counts request queues\n"
	       "--packed: packed virtqueues (VIRTIO_F_RING_PACKED; not with --reconnect)\n"
	       "--verify: writes carry offset-derived data that reads check\n"
	       "--setup-only: connect, bring every queue up, report the time, quit\n"
	       "--reconnect: ride out a back-end restart (inflight area)\n"
	       "--reconnect-after=N: drop the connection after N requests, reconnect\n"
	       "--poll-max-ns=NS: watch the used rings up to NS before sleeping (default 0)\n");
}

static int vb_num(const char *arg, uint64_t min, uint64_t max, const char *what, uint64_t *out)
{
	uint64_t v;

	if (parse_u64(arg, &v) || v < min || v > max) {
		fprintf(stderr, "%s: Invalid %s specified\n", PROG, what);
		return -EINVAL;
	}
	*out = v;
	return 0;
}

/* Sizes as qemu-img bench reads them (img_strtosz), as for a block device. */
static int vb_size(const char *arg, uint64_t max, const char *what, uint64_t *out)
{
	bool hex_suffix;

	if (img_strtosz_quiet(arg, out, &hex_suffix) || *out > max) {
		fprintf(stderr, "%s: Invalid %s specified\n", PROG, what);
		return -EINVAL;
	}
	return 0;
}

static int vb_opt(int c, const char *arg, struct vb_opts *o)
{
	uint64_t v;

	switch (c) {
	case 'c':
		return vb_num(arg, 0, INT_MAX, "request count", &o->count);
	case 'd':
		return vb_num(arg, 1, 65536, "queue depth", &o->depth);
	case 's':
		return vb_size(arg, 1u << 24, "buffer size", &o->bufsize);
	case 'S':
		return vb_size(arg, INT_MAX, "step_size", &o->step);
	case 'o':
		return vb_size(arg, INT64_MAX, "offset", &o->offset);
	case 'w':
		o->write = true;
		return 0;
	case 'q':
		o->quiet = true;
		return 0;
	case 't':
		o->unsafe = !strcmp(arg, "unsafe");
		return 0;
	case 'f':
	case 'i':
	case 'n':
	case 'U':
		return 0;
	case 'h':
		vb_usage();
		return 1;
	case OPT_VHOST:
		o->path = arg;
		return 0;
	case OPT_NQ:
		return vb_num(arg, 1, VU_MAX_QUEUES, "number of queues", &o->nq);
	case OPT_PATTERN:
		if (vb_num(arg, 0, 255, "pattern byte", &v))
			return -EINVAL;
		o->pattern = (uint8_t)v;
		return 0;
	case OPT_RANDOM:
		o->random = true;
		return 0;
	case OPT_SEED:
		return vb_num(arg, 0, UINT64_MAX, "seed", &o->seed);
	case OPT_VERIFY:
		o->verify = true;
		return 0;
	case OPT_SETUP_ONLY:
		o->setup_only = true;
		return 0;
	case OPT_RECONNECT:
		o->reconnect = true;
		return 0;
	case OPT_RECONNECT_AFTER:
		return vb_num(arg, 1, UINT64_MAX, "reconnect count", &o->reconnect_after);
	case OPT_POLL:
		return vb_num(arg, 0, 1000000000, "poll-max-ns", &o->poll_ns);
	case OPT_SCSI:
		o->scsi = true;
		return 0;
	case OPT_PACKED:
		o->packed = true;
		return 0;
	default: /* getopt said what was wrong */
		fprintf(stderr, "Try '%s --help' for more information\n", PROG);
		return -EINVAL;
	}
}

static int vb_parse(int argc, char **argv, struct vb_opts *o)
{
	int c, ret;

	*o = (struct vb_opts){.count = 75000, .depth = 64, .bufsize = 4096, .nq = 1, .seed = 1};
	optind = 0;
	opterr = 1;
	while ((c = getopt_long(argc, argv, "hc:d:f:i:no:qs:S:t:wU", vb_long_opts, NULL)) != -1) {
		ret = vb_opt(c, optarg, o);
		if (ret)
			return ret;
	}
	if (optind != argc) {
		fprintf(stderr, "%s: --vhost-user takes no image file name\n", PROG);
		return -EINVAL;
	}
	if (o->packed && (o->reconnect || o->reconnect_after)) {
		fprintf(stderr, "%s: --packed has no inflight area to reconnect with\n", PROG);
		return -EINVAL;
	}
	if (o->scsi && o->nq > VU_MAX_QUEUES - 2) {
		fprintf(stderr, "%s: --scsi takes at most %u request queues\n", PROG,
			VU_MAX_QUEUES - 2);
		return -EINVAL;
	}
	if (!o->bufsize || o->bufsize % 512 || (o->verify && o->bufsize % 8)) {
		fprintf(stderr, "%s: buffer size must be a non-zero multiple of 512\n", PROG);
		return -EINVAL;
	}
	return 0;
}

/* ---- report ---------------------------------------------------------------------------- */

static void vb_report(const struct vb *b, double secs)
{
	uint64_t n = b->completed;

	printf("Run completed in %3.3f seconds.\n", secs);
	hist_print_results(b->hist, b->lat_sum, n, b->o.bufsize, secs);
}

/* ---- run --------------------------------------------------------------------------------- */

static int vb_prepare(struct vb *b)
{
	uint64_t size = b->c.capacity;

	if (size < b->o.bufsize || b->o.offset > size - b->o.bufsize) {
		fprintf(stderr, "%s: the disk (%" PRIu64 " bytes) is too small\n", PROG, size);
		return -EINVAL;
	}
	if (b->o.write && !b->c.scsi && (b->c.features & (1ull << VIRTIO_BLK_F_RO))) {
		fprintf(stderr, "%s: the vhost-user disk is read-only\n", PROG);
		return -EROFS;
	}
	b->offset = b->o.offset;
	b->step = b->o.step ? b->o.step : b->o.bufsize;
	b->wrap = size > b->o.bufsize ? size - b->o.bufsize : 0;
	b->rand_base = b->o.offset;
	b->rand_blocks = (size - b->o.offset) / b->o.bufsize;
	b->rng = b->o.seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
	b->to_submit = b->o.count;
	return 0;
}

static int vb_run(struct vb *b)
{
	uint64_t t0, t1;
	unsigned i, s;
	int ret;

	if (!b->o.quiet) {
		printf("Sending %d %s requests, %d bytes each, %d in parallel "
		       "(starting at offset %" PRIu64 ", step size %d)\n",
		       (int)b->o.count, b->o.write ? "write" : "read", (int)b->o.bufsize,
		       (int)b->o.depth, b->o.offset, (int)b->step);
		fflush(stdout);
	}
	t0 = clock_mono_ns();
	for (i = b->c.first_req; i < b->c.nq; i++) {
		for (s = 0; s < b->c.q[i].nslots && b->to_submit; s++)
			vb_submit(b, &b->c.q[i], s);
		vhc_publish(&b->c.q[i], vhc_event_idx(&b->c));
	}
	ret = vb_wait(b);
	t1 = clock_mono_ns();
	if (!ret && b->err)
		ret = b->err;
	if (!ret && b->o.write && !b->o.unsafe)
		ret = vb_flush(b);
	if (ret == -EILSEQ)
		fprintf(stderr, "%s: data mismatch at offset %" PRIu64 "\n", PROG, b->bad_offset);
	else if (ret)
		fprintf(stderr, "%s: Failed request: %s\n", PROG, strerror(-ret));
	else if (!b->o.quiet)
		vb_report(b, (double)(t1 - t0) / 1e9);
	return ret;
}

int cmd_bench_vhost(int argc, char **argv)
{
	struct vb b = {.err = 0};
	double ms = 0;
	int ret, status = 1;

	ret = vb_parse(argc, argv, &b.o);
	if (ret)
		return ret > 0 ? 0 : 1;
	b.c.path = b.o.path;
	b.c.want_inflight = b.o.reconnect || b.o.reconnect_after;
	b.c.scsi = b.o.scsi;
	b.c.packed = b.o.packed;
	b.epfd = epoll_create1(EPOLL_CLOEXEC);
	b.hist = calloc(HIST_BUCKETS, sizeof(*b.hist));
	ret = vhc_init(&b.c, (unsigned)b.o.nq, (unsigned)b.o.depth, (uint32_t)b.o.bufsize);
	if (ret || b.epfd < 0 || !b.hist) {
		fprintf(stderr, "%s: cannot set up guest memory: %s\n", PROG,
			strerror(ret ? -ret : ENOMEM));
		goto out;
	}
	for (unsigned i = 0; i < b.c.nq; i++)
		if (vb_watch(&b, b.c.q[i].call_fd, &b.c.q[i]) < 0)
			goto out;
	if (!b.o.write || !b.o.verify)
		for (unsigned i = 0; i < b.c.nq; i++)
			for (unsigned s = 0; s < b.c.q[i].nslots; s++)
				memset(b.c.q[i].slots[s].buf, b.o.pattern, b.o.bufsize);
	if (vb_setup(&b, &ms))
		goto out;
	if (!b.o.quiet)
		printf("vhost-user: %u queue(s) of %u entries ready in %.3f ms\n",
		       b.c.nq - b.c.first_req, b.c.queue_size, ms);
	if (!b.o.setup_only && (vb_prepare(&b) || vb_run(&b)))
		goto out;
	status = vhc_disconnect(&b.c) ? 1 : 0;
out:
	vhc_free(&b.c);
	free(b.hist);
	if (b.epfd >= 0)
		close(b.epfd);
	return status;
}
