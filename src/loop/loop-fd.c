/* Registered fds of the event loop: a slot table whose tags (slot index and
 * generation) the backends store with each poll, so that an event for an fd
 * deleted or modified since is dropped. Arming is the backend's (loop-uring.c
 * or loop-epoll.c). Threading: owned by the loop's thread. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "loop/loop-int.h"

uint64_t loop_fd_tag(struct loop *loop, struct loop_fd *h)
{
	(void)loop;
	return h->gen;
}

static int slot_alloc(struct loop *loop, struct loop_fd *h)
{
	unsigned i;

	for (i = loop->free_slot_hint; i < loop->nslots; i++)
		if (!loop->slots[i].h)
			goto found;
	if (loop->nslots == loop->slots_cap) {
		unsigned cap = loop->slots_cap ? loop->slots_cap * 2 : 16;
		struct fd_slot *s = realloc(loop->slots, sizeof(*s) * cap);

		if (!s)
			return -ENOMEM;
		memset(s + loop->slots_cap, 0, sizeof(*s) * (cap - loop->slots_cap));
		loop->slots = s;
		loop->slots_cap = cap;
	}
	i = loop->nslots++;
found:
	loop->slots[i].h = h;
	loop->free_slot_hint = i + 1;
	h->gen = ((uint64_t)i << 32) | ((uint64_t)(loop->slots[i].gen & 0x3fffffff) << 2) | TAG_FD;
	return 0;
}

static void slot_free(struct loop *loop, struct loop_fd *h)
{
	unsigned i = (unsigned)(h->gen >> 32);

	loop->slots[i].h = NULL;
	loop->slots[i].gen++;
	if (i < loop->free_slot_hint)
		loop->free_slot_hint = i;
}

int loop_fd_add(struct loop *loop, struct loop_fd *h)
{
	int ret;

	h->loop = loop;
	ret = slot_alloc(loop, h);
	if (ret < 0)
		return ret;
	h->armed = true;
	if (loop->backend == LOOP_BACKEND_URING)
		ret = loop_uring_fd_arm(loop, h);
	else
		ret = loop_epoll_fd_arm(loop, h, false);
	if (ret < 0) {
		h->armed = false;
		slot_free(loop, h);
	}
	return ret;
}

int loop_fd_modify(struct loop *loop, struct loop_fd *h, uint32_t events)
{
	uint64_t old = h->gen;

	h->events = events;
	if (loop->backend == LOOP_BACKEND_EPOLL)
		return loop_epoll_fd_arm(loop, h, true);
	/* io_uring: cancel the pending poll and arm a new one under a new tag. */
	slot_free(loop, h);
	if (slot_alloc(loop, h) < 0)
		return -ENOMEM;
	loop_uring_fd_disarm(loop, h, old);
	return loop_uring_fd_arm(loop, h);
}

void loop_fd_del(struct loop *loop, struct loop_fd *h)
{
	uint64_t old = h->gen;

	if (!h->armed)
		return;
	h->armed = false;
	slot_free(loop, h);
	if (loop->backend == LOOP_BACKEND_URING)
		loop_uring_fd_disarm(loop, h, old);
	else
		loop_epoll_fd_disarm(loop, h);
}

/* Called by the backends with the tag they stored. Stale tags (fd deleted or
 * modified since) are dropped. */
void loop_dispatch_fd(struct loop *loop, uint64_t tag, uint32_t revents)
{
	unsigned i = (unsigned)(tag >> 32);
	struct loop_fd *h;

	if (i >= loop->nslots)
		return;
	h = loop->slots[i].h;
	if (!h || h->gen != tag)
		return;
	h->cb(h, revents);
	/* io_uring polls are one-shot: re-arm if the handler is still there
	 * (this keeps epoll's level-triggered meaning). */
	if (loop->backend == LOOP_BACKEND_URING && loop->slots[i].h == h && h->gen == tag)
		loop_uring_fd_arm(loop, h);
}
