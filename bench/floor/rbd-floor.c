/* The least CPU a librbd client spends per request: depth-N 4 KiB reads or
 * writes with rbd_aio_*, each request STEP bytes after the last (as qemu-img
 * bench -S), librbd's cache off. Mode 0: a completion wakes the submitting
 * thread (a condition variable), which submits the next request - the one
 * wake-up per completion an event-loop client such as ioplane or QEMU cannot
 * avoid. Mode 1: librbd's callback thread submits the next request itself, no
 * wake-up at all. bench/compare-remote.sh row 1 prints both beside the clients.
 * Threads: main and librbd's; done/issued/next are protected by lock.
 *
 *   rbd-floor POOL IMAGE COUNT DEPTH STEP MODE WRITE: prints "IOPS CPU_US_PER_IO"
 *   (CEPH_CONF names the cluster's configuration) */
#include <pthread.h>
#include <rados/librados.h>
#include <rbd/librbd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static long done, issued, count;
static uint64_t next, step, size;
static int mode, writes;
static rbd_image_t img;
static char *buf;

static void submit(void);

static void complete(rbd_completion_t c, void *arg)
{
	int more;

	(void)arg;
	rbd_aio_release(c);
	pthread_mutex_lock(&lock);
	done++;
	more = mode == 1 && issued < count;
	issued += more;
	if (mode == 0 || done == count)
		pthread_cond_signal(&cond);
	pthread_mutex_unlock(&lock);
	if (more)
		submit();
}

static void submit(void)
{
	rbd_completion_t c;
	uint64_t off;

	pthread_mutex_lock(&lock);
	off = next;
	next = (next + step) % (size - 4096);
	pthread_mutex_unlock(&lock);
	if (rbd_aio_create_completion(NULL, complete, &c) < 0)
		abort();
	if (writes ? rbd_aio_write(img, off, 4096, buf, c) : rbd_aio_read(img, off, 4096, buf, c))
		abort();
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
	       (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static int run(int depth)
{
	struct timespec t0, t1;
	double c0 = cpu_s(), el;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_mutex_lock(&lock);
	while (done < count) {
		while (issued - done < depth && issued < count) {
			issued++;
			pthread_mutex_unlock(&lock);
			submit();
			pthread_mutex_lock(&lock);
		}
		pthread_cond_wait(&cond, &lock);
	}
	pthread_mutex_unlock(&lock);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	el = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("%.0f %.2f\n", count / el, (cpu_s() - c0) * 1e6 / count);
	return 0;
}

int main(int argc, char **argv)
{
	rados_t cluster;
	rados_ioctx_t io;
	int depth;

	if (argc != 8) {
		fprintf(stderr, "usage: rbd-floor POOL IMAGE COUNT DEPTH STEP MODE WRITE\n");
		return 2;
	}
	count = strtol(argv[3], NULL, 10);
	depth = (int)strtol(argv[4], NULL, 10);
	step = strtoull(argv[5], NULL, 10);
	mode = (int)strtol(argv[6], NULL, 10);
	writes = (int)strtol(argv[7], NULL, 10);
	if (rados_create(&cluster, NULL) < 0 || rados_conf_read_file(cluster, NULL) < 0 ||
	    rados_conf_parse_env(cluster, NULL) < 0 ||
	    rados_conf_set(cluster, "rbd_cache", "false") < 0 || rados_connect(cluster) < 0 ||
	    rados_ioctx_create(cluster, argv[1], &io) < 0 || rbd_open(io, argv[2], &img, NULL) < 0 ||
	    rbd_get_size(img, &size) < 0 || size <= 4096) {
		fprintf(stderr, "rbd-floor: cannot open %s/%s\n", argv[1], argv[2]);
		return 1;
	}
	buf = aligned_alloc(4096, 4096);
	if (!buf || count <= 0 || depth <= 0)
		return 2;
	memset(buf, 0x5a, 4096);
	run(depth);
	rbd_close(img);
	rados_ioctx_destroy(io);
	rados_shutdown(cluster);
	free(buf);
	return 0;
}
