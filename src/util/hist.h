/* Latency histogram of clock ticks for the benchmarks, log-linear: values
 * below 2^(H+1) have a bucket each; above, each power of two is split into
 * 2^H buckets, so a bucket is at most 1/128 (0.8%) wide relative to its value.
 * Recording is one count in a preallocated array. Threading: caller's. */
#ifndef IOPLANE_HIST_H
#define IOPLANE_HIST_H

#include <stdint.h>

#define HIST_H 7
#define HIST_BUCKETS ((65 - HIST_H) << HIST_H)

static inline unsigned hist_bucket(uint64_t v)
{
	unsigned shift = (unsigned)(63 - __builtin_clzll(v | (1ull << HIST_H))) - HIST_H;

	return (shift << HIST_H) + (unsigned)(v >> shift);
}

/* The value (middle of its bucket) below which `part` of 10000 of the
 * `total` recorded values lie. */
uint64_t hist_percentile(const uint64_t *hist, uint64_t total, uint64_t part);

/* Print the IOPS/bandwidth and latency lines that follow qemu-img bench's
 * output, for n requests of `bufsize` bytes in `secs` seconds; latencies in
 * clock ticks (util/clock.h). */
void hist_print_results(const uint64_t *hist, uint64_t lat_sum, uint64_t n, uint64_t bufsize,
			double secs);

#endif
