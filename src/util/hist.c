/* Latency histogram percentiles and the benchmark result lines.
 * Threading: pure functions (stdout for printing). */
#include <stdio.h>

#include "util/clock.h"
#include "util/hist.h"

uint64_t hist_percentile(const uint64_t *hist, uint64_t total, uint64_t part)
{
	uint64_t rank = (total * part + 9999) / 10000, seen = 0, shift, lo;
	unsigned i;

	for (i = 0; i < HIST_BUCKETS - 1; i++) {
		seen += hist[i];
		if (seen >= rank && seen)
			break;
	}
	if (i < (2u << HIST_H))
		return i;
	shift = (i >> HIST_H) - 1;
	lo = (uint64_t)(i - (shift << HIST_H)) << shift;
	return lo + ((1ull << shift) - 1) / 2;
}

static double ticks_us(uint64_t ticks)
{
	return (double)clock_ticks_to_ns(ticks) / 1000.0;
}

void hist_print_results(const uint64_t *hist, uint64_t lat_sum, uint64_t n, uint64_t bufsize,
			double secs)
{
	if (!n)
		return;
	if (secs <= 0)
		secs = 1e-9;
	printf("IOPS: %.0f, bandwidth: %.2f MiB/s\n", (double)n / secs,
	       (double)n * (double)bufsize / secs / (1024.0 * 1024.0));
	printf("Latency: mean %.2f us, p50 %.2f us, p99 %.2f us, p99.9 %.2f us\n",
	       ticks_us(lat_sum / n), ticks_us(hist_percentile(hist, n, 5000)),
	       ticks_us(hist_percentile(hist, n, 9900)), ticks_us(hist_percentile(hist, n, 9990)));
}
