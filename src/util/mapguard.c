/* SIGBUS guard for shared mappings of files other processes control (see
 * mapguard.h). The registry is a fixed array of slots with atomic fields, so
 * that the signal handler reads it without locks; a slot is claimed with a
 * compare-and-swap on its base address.
 *
 * THREADING RULE: slots are claimed and released by any thread; the handler
 * only reads them, on the faulting thread. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#include "util/mapguard.h"

struct mapguard_slot {
	_Atomic uintptr_t base; /* 0: free; 1: being filled in */
	_Atomic size_t len;
	_Atomic(atomic_int *) flag;
};

static struct mapguard_slot slots[MAPGUARD_SLOTS];
static struct sigaction old_action;
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_err;

/* Only async-signal-safe calls here: mmap and atomics. */
static void mapguard_sigbus(int sig, siginfo_t *si, void *uctx)
{
	uintptr_t a = (uintptr_t)si->si_addr;
	unsigned i;

	for (i = 0; i < MAPGUARD_SLOTS; i++) {
		uintptr_t base = atomic_load(&slots[i].base);
		size_t len = atomic_load(&slots[i].len);
		atomic_int *flag;

		if (base <= 1 || a < base || a - base >= len)
			continue;
		/* The faulting instruction runs again on zero pages. */
		if (mmap((void *)base, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1,
			 0) == MAP_FAILED)
			break;
		flag = atomic_load(&slots[i].flag);
		if (flag)
			atomic_store(flag, 1);
		return;
	}
	/* Not ours: what SIGBUS would have done without us. */
	if (old_action.sa_flags & SA_SIGINFO && old_action.sa_sigaction) {
		old_action.sa_sigaction(sig, si, uctx);
		return;
	}
	if (old_action.sa_handler != SIG_DFL && old_action.sa_handler != SIG_IGN) {
		old_action.sa_handler(sig);
		return;
	}
	/* Returning re-runs the access, which faults again with the default. */
	signal(SIGBUS, SIG_DFL);
}

static void mapguard_install(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = mapguard_sigbus;
	sa.sa_flags = SA_SIGINFO | SA_NODEFER;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &old_action) < 0)
		install_err = -errno;
}

int mapguard_add(void *base, size_t len, atomic_int *flag)
{
	unsigned i;

	if (!base || !len || (uintptr_t)base <= 1)
		return -EINVAL;
	pthread_once(&install_once, mapguard_install);
	if (install_err)
		return install_err;
	for (i = 0; i < MAPGUARD_SLOTS; i++) {
		uintptr_t expect = 0;

		if (!atomic_compare_exchange_strong(&slots[i].base, &expect, 1))
			continue;
		atomic_store(&slots[i].len, len);
		atomic_store(&slots[i].flag, flag);
		atomic_store(&slots[i].base, (uintptr_t)base);
		return (int)i + 1;
	}
	return -ENOSPC;
}

void mapguard_del(int handle)
{
	struct mapguard_slot *s;

	if (handle <= 0 || handle > MAPGUARD_SLOTS)
		return;
	s = &slots[handle - 1];
	atomic_store(&s->base, 1); /* the handler skips it from now on */
	atomic_store(&s->flag, NULL);
	atomic_store(&s->len, 0);
	atomic_store(&s->base, 0);
}
