/* USDT probes (docs/tracing.md lists them): IOPLANE_TRACE(name, args...)
 * is one nop in the code and a note in the executable that bpftrace,
 * perf or SystemTap attach to (provider "ioplane"). Arguments are values
 * the caller already has; a probe never computes anything. Built without
 * (-Dusdt=false) it is nothing at all. Threading: none. */
#ifndef IOPLANE_UTIL_TRACE_H
#define IOPLANE_UTIL_TRACE_H

#ifdef IOPLANE_USDT
#define SDT_USE_VARIADIC 1
#include <sys/sdt.h>
#define IOPLANE_TRACE(name, ...) STAP_PROBEV(ioplane, name, ##__VA_ARGS__)
#else
#define IOPLANE_TRACE(name, ...)                                                                   \
	do {                                                                                       \
	} while (0)
#endif

#endif
