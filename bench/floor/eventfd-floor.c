/* The least CPU a vhost-user back-end spends per request of an interrupt-driven
 * front-end at depth 1: a kick eventfd written by the front-end wakes the
 * back-end, which writes the call eventfd that wakes the front-end again, and
 * nothing else (no ring, no request, no block layer). A forked child is the
 * back-end, the parent the front-end; both sleep while they wait, as the two
 * sides of bench/compare-vhost-user.sh's irq rows do. The child prints its own
 * CPU time (user + system, getrusage) per round trip.
 * bench/compare-vhost-user.sh prints it beside the depth-1 irq rows.
 *
 * Modes of the back-end:
 *   uring: ioplane's way: a multishot IORING_OP_POLL_ADD of the kick eventfd,
 *          the call written through the ring (RWF_NOWAIT, CQE_SKIP_SUCCESS)
 *          by the io_uring_enter that waits for the next kick, on a
 *          DEFER_TASKRUN ring where the kernel has it: one system call per
 *          round trip.
 *   poll:  a plain event loop's way: poll() the kick eventfd, read() it,
 *          write() the call: three system calls.
 *
 *   eventfd-floor uring|poll COUNT: prints "ROUNDS_PER_S CPU_US_PER_ROUND" */
#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const uint64_t one = 1;

static double cpu_us(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec +
	       ru.ru_stime.tv_usec;
}

static double now_s(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* The back-end's loop: count round trips, then report CPU per round on out. */
static int serve_poll(int kick, int call, long count, FILE *out)
{
	struct pollfd p = {.fd = kick, .events = POLLIN};
	double c0 = 0;
	uint64_t v;

	for (long i = 0; i < count; i++) {
		if (poll(&p, 1, -1) < 0 && errno != EINTR)
			return -1;
		if (read(kick, &v, sizeof(v)) < 0 && errno != EAGAIN)
			return -1;
		if (i == 0)
			c0 = cpu_us(); /* from the first kick: setup not counted */
		if (write(call, &one, sizeof(one)) < 0)
			return -1;
	}
	fprintf(out, "%.3f\n", (cpu_us() - c0) / (double)(count - 1));
	return 0;
}

static int serve_uring(int kick, int call, long count, FILE *out)
{
	struct io_uring ring;
	struct io_uring_params p;
	struct io_uring_sqe *sqe;
	struct io_uring_cqe *cqe;
	double c0 = 0;
	long seen = 0;
	int ret;

	memset(&p, 0, sizeof(p));
	p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN |
		  IORING_SETUP_COOP_TASKRUN | IORING_SETUP_SUBMIT_ALL;
	ret = io_uring_queue_init_params(64, &ring, &p);
	if (ret < 0) {
		memset(&p, 0, sizeof(p));
		ret = io_uring_queue_init_params(64, &ring, &p);
	}
	if (ret < 0)
		return -1;
	sqe = io_uring_get_sqe(&ring);
	io_uring_prep_poll_multishot(sqe, kick, POLLIN);
	io_uring_sqe_set_data64(sqe, 1);
	while (seen < count) {
		ret = io_uring_submit_and_wait(&ring, 1);
		if (ret < 0 && ret != -EINTR)
			return -1;
		while (io_uring_peek_cqe(&ring, &cqe) == 0) {
			uint64_t tag = io_uring_cqe_get_data64(cqe);
			unsigned flags = cqe->flags;
			int res = cqe->res;

			io_uring_cqe_seen(&ring, cqe);
			if (tag != 1)
				continue; /* a call write that failed */
			if (res < 0)
				return -1;
			if (!(flags & IORING_CQE_F_MORE)) { /* the kernel ended it: arm again */
				sqe = io_uring_get_sqe(&ring);
				io_uring_prep_poll_multishot(sqe, kick, POLLIN);
				io_uring_sqe_set_data64(sqe, 1);
			}
			if (seen++ == 0)
				c0 = cpu_us();
			sqe = io_uring_get_sqe(&ring);
			if (!sqe)
				return -1;
			io_uring_prep_write(sqe, call, &one, sizeof(one), 0);
			sqe->rw_flags = RWF_NOWAIT;
			sqe->flags |= IOSQE_CQE_SKIP_SUCCESS;
			io_uring_sqe_set_data64(sqe, 2);
		}
	}
	io_uring_submit(&ring); /* the last call */
	fprintf(out, "%.3f\n", (cpu_us() - c0) / (double)(count - 1));
	io_uring_queue_exit(&ring);
	return 0;
}

int main(int argc, char **argv)
{
	long count = argc > 2 ? strtol(argv[2], NULL, 10) : 0;
	int kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	int call = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	int pfd[2], status;
	char line[64];
	double t0, el;
	pid_t pid;
	FILE *in;

	if (argc != 3 || count < 2 || count > 100000000 ||
	    (strcmp(argv[1], "uring") && strcmp(argv[1], "poll"))) {
		fprintf(stderr, "usage: eventfd-floor uring|poll COUNT (2 to 10^8)\n");
		return 2;
	}
	if (kick < 0 || call < 0 || pipe(pfd) < 0) {
		perror("eventfd-floor");
		return 1;
	}
	pid = fork();
	if (pid < 0) {
		perror("eventfd-floor: fork");
		return 1;
	}
	if (pid == 0) {
		FILE *out = fdopen(pfd[1], "w");
		int r;

		close(pfd[0]);
		alarm(600); /* bounded whatever the parent does */
		r = !strcmp(argv[1], "uring") ? serve_uring(kick, call, count, out)
					      : serve_poll(kick, call, count, out);
		if (r < 0)
			fprintf(stderr, "eventfd-floor: back-end: %s\n", strerror(errno));
		fclose(out);
		_exit(r < 0);
	}
	close(pfd[1]);
	alarm(600);
	t0 = now_s();
	for (long i = 0; i < count; i++) {
		struct pollfd p = {.fd = call, .events = POLLIN};
		uint64_t v;

		if (write(kick, &one, sizeof(one)) < 0) {
			perror("eventfd-floor: kick");
			break;
		}
		/* The front-end sleeps until called, as a guest's interrupt does. */
		if (poll(&p, 1, -1) < 0 || read(call, &v, sizeof(v)) < 0) {
			perror("eventfd-floor: call");
			break;
		}
	}
	el = now_s() - t0;
	in = fdopen(pfd[0], "r");
	if (!in || !fgets(line, sizeof(line), in)) {
		fprintf(stderr, "eventfd-floor: the back-end reported nothing\n");
		kill(pid, SIGKILL);
		waitpid(pid, &status, 0);
		return 1;
	}
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status))
		return 1;
	printf("%.0f %s", count / el, line);
	return 0;
}
