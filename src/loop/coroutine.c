/* Stackful coroutines. A brand-new coroutine is started once with
 * makecontext/setcontext (which cost signal-mask system calls); every later
 * switch is _setjmp/_longjmp, which saves no signal mask. Finished coroutines
 * keep their stack and their trampoline frame on a per-thread free list.
 *
 * Threading: everything here is per thread (the `co_tls` state); a coroutine
 * is entered only on the thread that created it. */

/* _FORTIFY_SOURCE turns _longjmp into __longjmp_chk, which rejects jumps to
 * another stack. */
#undef _FORTIFY_SOURCE

#include <assert.h>
#include <setjmp.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "loop/coroutine.h"

#if defined(__SANITIZE_ADDRESS__)
#define CO_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CO_ASAN 1
#endif
#endif
#ifdef CO_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
/* Tell valgrind about our stacks (a few no-op instructions otherwise). */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#define CO_VALGRIND 1
#endif
#endif

#define CO_STACK_SIZE (256 * 1024)
#define CO_POOL_MAX 64

struct coroutine {
	jmp_buf env; /* where it resumes; meaningful only while it is switched out */
	coroutine_fn *fn;
	void *opaque;
	/* Who entered it. Set while it is running or has entered another
	 * coroutine that has not yielded yet; NULL when it may be entered. */
	struct coroutine *caller;
	struct coroutine *next_free;
	struct co_thread *home;
	void *map; /* stack mapping, guard page first; NULL for a thread's leader */
	size_t map_size;
	bool done; /* fn returned; the one it switched to recycles it */
#ifdef CO_VALGRIND
	unsigned vg_stack_id;
#endif
#ifdef CO_ASAN
	void *fake_stack;
	const void *stack_bottom;
	size_t stack_size;
#endif
};

/* The `leader` stands for the thread's own stack. */
struct co_thread {
	struct coroutine leader;
	struct coroutine *current; /* NULL: the leader */
	struct coroutine *free_list;
	struct coroutine *booting; /* the coroutine being started by co_boot() */
	struct coroutine_stats stats;
#ifdef CO_ASAN
	struct coroutine *switch_from;
#endif
};

static __thread struct co_thread co_tls;

static struct coroutine *co_current(struct co_thread *t)
{
	return t->current ? t->current : &t->leader;
}

/* ---- AddressSanitizer: tell it which stack we are on ---------------------- */

#ifdef CO_ASAN
static void co_asan_start(struct co_thread *t, struct coroutine *from, struct coroutine *to)
{
	/* A finished coroutine's fake frames die with it (NULL save slot). */
	__sanitizer_start_switch_fiber(from->done ? NULL : &from->fake_stack, to->stack_bottom,
				       to->stack_size);
	t->switch_from = from;
}

static void co_asan_finish(struct co_thread *t, struct coroutine *self)
{
	const void *bottom;
	size_t size;

	__sanitizer_finish_switch_fiber(self->fake_stack, &bottom, &size);
	self->fake_stack = NULL;
	/* The thread's own stack is learnt the first time we leave it. */
	if (t->switch_from == &t->leader) {
		t->leader.stack_bottom = bottom;
		t->leader.stack_size = size;
	}
}

static void co_asan_forget_stack(struct coroutine *co)
{
	ASAN_UNPOISON_MEMORY_REGION(co->map, co->map_size);
}
#else
static void co_asan_start(struct co_thread *t, struct coroutine *from, struct coroutine *to)
{
	(void)t;
	(void)from;
	(void)to;
}

static void co_asan_finish(struct co_thread *t, struct coroutine *self)
{
	(void)t;
	(void)self;
}

static void co_asan_forget_stack(struct coroutine *co)
{
	(void)co;
}
#endif

/* ---- switching ----------------------------------------------------------------- */

/* Leave `from` (saving where it resumes) for `to`. Returns when someone
 * switches back to `from`. */
static void co_switch(struct co_thread *t, struct coroutine *from, struct coroutine *to)
{
	t->current = to == &t->leader ? NULL : to;
	t->stats.switches++;
	co_asan_start(t, from, to);
	if (!_setjmp(from->env))
		_longjmp(to->env, 1);
	co_asan_finish(t, from);
}

/* First code on a new stack: record a resume point, go back to the creator,
 * then run one fn per trip through the free list. */
static void co_trampoline(void)
{
	struct co_thread *t = &co_tls;
	struct coroutine *self = t->booting;
	struct coroutine *to;

	co_asan_finish(t, self);
	t->booting = NULL;
	co_switch(t, self, self->caller);
	for (;;) {
		self->fn(self->opaque);
		self->done = true;
		to = self->caller;
		self->caller = NULL;
		co_switch(t, self, to);
	}
}

/* Start co's trampoline on its stack; it comes straight back here. */
static void co_boot(struct co_thread *t, struct coroutine *co, size_t guard)
{
	struct coroutine *self = co_current(t);
	ucontext_t uc;

	getcontext(&uc);
	uc.uc_link = NULL;
	uc.uc_stack.ss_sp = (char *)co->map + guard;
	uc.uc_stack.ss_size = CO_STACK_SIZE;
	makecontext(&uc, co_trampoline, 0);
	t->booting = co;
	co->caller = self;
	co_asan_start(t, self, co);
	/* Our side is saved by _setjmp, so setcontext (not swapcontext) will do. */
	if (!_setjmp(self->env))
		setcontext(&uc);
	co_asan_finish(t, self);
	co->caller = NULL;
}

static struct coroutine *co_new(struct co_thread *t)
{
	size_t guard = (size_t)sysconf(_SC_PAGESIZE);
	struct coroutine *co = calloc(1, sizeof(*co));

	if (!co)
		return NULL;
	co->map_size = CO_STACK_SIZE + guard;
	co->map = mmap(NULL, co->map_size, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
	if (co->map == MAP_FAILED)
		goto fail;
	/* The stack grows down into the guard page: overflow faults. */
	if (mprotect(co->map, guard, PROT_NONE) < 0)
		goto fail_unmap;
	co->home = t;
#ifdef CO_ASAN
	co->stack_bottom = (char *)co->map + guard;
	co->stack_size = CO_STACK_SIZE;
#endif
#ifdef CO_VALGRIND
	co->vg_stack_id =
		VALGRIND_STACK_REGISTER((char *)co->map + guard, (char *)co->map + co->map_size);
#endif
	co_boot(t, co, guard);
	t->stats.created++;
	return co;

fail_unmap:
	munmap(co->map, co->map_size);
fail:
	free(co);
	return NULL;
}

static void co_destroy(struct coroutine *co)
{
#ifdef CO_VALGRIND
	VALGRIND_STACK_DEREGISTER(co->vg_stack_id);
#endif
	co_asan_forget_stack(co);
	munmap(co->map, co->map_size);
	free(co);
}

/* ---- API ---------------------------------------------------------------------- */

struct coroutine *coroutine_create(coroutine_fn *fn, void *opaque)
{
	struct co_thread *t = &co_tls;
	struct coroutine *co = t->free_list;

	if (co) {
		t->free_list = co->next_free;
		t->stats.pooled--;
		t->stats.reused++;
	} else {
		co = co_new(t);
		if (!co)
			return NULL;
	}
	co->fn = fn;
	co->opaque = opaque;
	co->done = false;
	co->next_free = NULL;
	return co;
}

static void co_recycle(struct co_thread *t, struct coroutine *co)
{
	if (t->stats.pooled >= CO_POOL_MAX) {
		co_destroy(co);
		return;
	}
	co->fn = NULL;
	co->opaque = NULL;
	co->next_free = t->free_list;
	t->free_list = co;
	t->stats.pooled++;
}

void coroutine_enter(struct coroutine *co)
{
	struct co_thread *t = &co_tls;
	struct coroutine *self = co_current(t);

	assert(co->home == t);             /* created on another thread */
	assert(!co->caller && co != self); /* already running */
	assert(!co->done && co->fn);       /* finished (recycled) */
	co->caller = self;
	co_switch(t, self, co);
	/* Only co switches back to us: it yielded or it finished. */
	if (co->done)
		co_recycle(t, co);
}

void coroutine_yield(void)
{
	struct co_thread *t = &co_tls;
	struct coroutine *self = t->current;
	struct coroutine *to;

	assert(self); /* not in a coroutine */
	to = self->caller;
	self->caller = NULL;
	co_switch(t, self, to);
}

struct coroutine *coroutine_self(void)
{
	return co_tls.current;
}

bool coroutine_in(void)
{
	return co_tls.current != NULL;
}

void coroutine_pool_cleanup(void)
{
	struct co_thread *t = &co_tls;

	while (t->free_list) {
		struct coroutine *co = t->free_list;

		t->free_list = co->next_free;
		co_destroy(co);
	}
	t->stats.pooled = 0;
}

void coroutine_pool_stats(struct coroutine_stats *out)
{
	*out = co_tls.stats;
}
