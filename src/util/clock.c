/* Tick-to-nanosecond calibration for clock_ticks(). On x86-64 the ticks are
 * the TSC, whose rate is measured once against CLOCK_MONOTONIC over a few
 * milliseconds; elsewhere ticks already are nanoseconds. Threading: any
 * thread may call clock_init(); the calibration runs exactly once and
 * clock_ns_per_tick is written only inside it. */
#include <errno.h>
#include <pthread.h>
#include <time.h>

#include "util/clock.h"

/* Until clock_init() has run this is 1.0, which is exact off x86-64 and only a
 * rough scale on it: statistics taken before initialisation are not trusted. */
double clock_ns_per_tick = 1.0;

static pthread_once_t clock_once = PTHREAD_ONCE_INIT;

#define CLOCK_CALIBRATE_NS 3000000ull /* long enough for <0.1% error */

#if defined(__x86_64__)
static void clock_sleep_ns(uint64_t ns)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
			      .tv_nsec = (long)(ns % 1000000000ull)};

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

static void clock_calibrate(void)
{
	uint64_t t0, t1, c0, c1;

	t0 = clock_mono_ns();
	c0 = clock_ticks();
	clock_sleep_ns(CLOCK_CALIBRATE_NS);
	/* Oversleeping only makes the measurement longer, hence better. */
	do {
		t1 = clock_mono_ns();
		c1 = clock_ticks();
	} while (t1 - t0 < CLOCK_CALIBRATE_NS);
	/* A TSC that does not advance would make every duration zero; keep
	 * the 1.0 fallback rather than dividing by zero. */
	if (c1 > c0)
		clock_ns_per_tick = (double)(t1 - t0) / (double)(c1 - c0);
}
#else
static void clock_calibrate(void)
{
	clock_ns_per_tick = 1.0;
}
#endif

void clock_init(void)
{
	pthread_once(&clock_once, clock_calibrate);
}
