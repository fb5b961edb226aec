/* The least CPU a libnbd client spends per request: depth-N 4 KiB random reads
 * through libnbd's asynchronous API and nbd_poll(), nothing else (no event loop,
 * no block layer, no server). bench/compare-remote.sh row 3 prints it beside the
 * re-exporters. Single-threaded.
 *
 *   nbd-floor SOCKET COUNT DEPTH: prints "IOPS CPU_US_PER_IO" */
#include <libnbd.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>

static long done;

static int read_done(void *opaque, int *error)
{
	(void)opaque;
	(void)error;
	done++;
	return 1;
}

static double cpu_s(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
	       (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char **argv)
{
	struct nbd_handle *h = nbd_create();
	long count = argc > 3 ? strtol(argv[2], NULL, 10) : 0, issued = 0;
	int depth = argc > 3 ? (int)strtol(argv[3], NULL, 10) : 0;
	unsigned seed = 1;
	struct timespec t0, t1;
	double c0, el;
	int64_t blocks;
	char *buf;

	if (!h || count <= 0 || depth <= 0 || nbd_connect_unix(h, argv[1]) < 0) {
		fprintf(stderr, "usage: nbd-floor SOCKET COUNT DEPTH (%s)\n",
			h ? nbd_get_error() : "no handle");
		return 2;
	}
	nbd_set_pread_initialize(h, false);
	blocks = nbd_get_size(h) / 4096;
	buf = malloc((size_t)depth * 4096);
	if (!buf || blocks <= 0)
		return 1;
	c0 = cpu_s();
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (done < count) {
		for (; issued - done < depth && issued < count; issued++) {
			uint64_t off = (uint64_t)(rand_r(&seed) % blocks) * 4096;
			nbd_completion_callback cb = {.callback = read_done};

			if (nbd_aio_pread(h, buf + (issued % depth) * 4096, 4096, off, cb, 0) < 0)
				goto fail;
		}
		if (nbd_poll(h, -1) < 0)
			goto fail;
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	el = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("%.0f %.2f\n", count / el, (cpu_s() - c0) * 1e6 / count);
	nbd_close(h);
	free(buf);
	return 0;
fail:
	fprintf(stderr, "nbd-floor: %s\n", nbd_get_error());
	return 1;
}
