/* Cheap timestamps for statistics: the TSC on x86-64 (calibrated once), else
 * CLOCK_MONOTONIC. Threading: any thread; clock_init() once at start-up. */
#ifndef IOPLANE_CLOCK_H
#define IOPLANE_CLOCK_H

#include <stdint.h>
#include <time.h>

void clock_init(void);
extern double clock_ns_per_tick; /* set by clock_init() */

static inline uint64_t clock_mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t clock_ticks(void)
{
	return __rdtsc();
}
#else
static inline uint64_t clock_ticks(void)
{
	return clock_mono_ns();
}
#endif

static inline uint64_t clock_ticks_to_ns(uint64_t ticks)
{
	return (uint64_t)((double)ticks * clock_ns_per_tick);
}

#endif
