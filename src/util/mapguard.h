/* Guarded shared mappings: memory mapped from a file that another process
 * controls (a VM's memfd) can be truncated under us, and touching it then
 * raises SIGBUS, which would kill the whole daemon. A guarded range that
 * faults is replaced by anonymous zero pages and its flag is set; the owner
 * checks the flag and stops using the range (a virtio device goes broken).
 * SIGBUS outside every guarded range keeps its usual meaning.
 *
 * THREADING RULE: add/del from any thread, but a range must not be deleted
 * while another thread may still touch it (callers stop their queues first);
 * the signal handler runs on whichever thread faulted. */
#ifndef IOPLANE_UTIL_MAPGUARD_H
#define IOPLANE_UTIL_MAPGUARD_H

#include <stdatomic.h>
#include <stddef.h>

#define MAPGUARD_SLOTS 4096

/* Guard [base, base+len) (page aligned). On a fault, *flag becomes 1.
 * Returns a handle > 0, or -errno (-ENOSPC: all slots taken). */
int mapguard_add(void *base, size_t len, atomic_int *flag);
/* Stop guarding (before munmap). A handle <= 0 is ignored. */
void mapguard_del(int handle);

#endif
