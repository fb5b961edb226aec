/* The daemon-wide bound on NBD request buffer memory (--max-request-memory),
 * shared by every server and connection. A connection reserves the bytes
 * of its next READ or WRITE before taking it; when they are not free it
 * stops reading and waits in a FIFO queue, and the release that frees
 * enough sends it a grant message. Nothing fails for lack of memory. A
 * request is admitted when it fits, or when nothing at all is held, so one
 * request of any accepted size always gets through; a queued request goes
 * before any later one, so a large request is never starved by small ones.
 *
 * Threading: the counters and the queue are protected by b->lock; a
 * connection's fields here are touched under that lock while it is queued,
 * and otherwise by its own loop. Grants are delivered with loop_send(). */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

#include "export/nbd-int.h"
#include "util/compiler.h"
#include "util/log.h"

int nbd_budget_new(uint64_t limit, struct nbd_budget **out)
{
	struct nbd_budget *b = calloc(1, sizeof(*b));

	if (!b)
		return -ENOMEM;
	pthread_mutex_init(&b->lock, NULL);
	b->limit = limit ? limit : 1;
	b->tail = &b->head;
	*out = b;
	return 0;
}

void nbd_budget_free(struct nbd_budget *b)
{
	if (!b)
		return;
	if (b->used || b->head)
		log_warn("nbd: request memory still held at exit: %llu bytes",
			 (unsigned long long)b->used);
	if (b->waits) /* worth knowing when tuning --max-request-memory */
		log_msg(LOG_INFO, "nbd: request memory: peak %llu of %llu bytes, %llu waits",
			(unsigned long long)b->peak, (unsigned long long)b->limit,
			(unsigned long long)b->waits);
	pthread_mutex_destroy(&b->lock);
	free(b);
}

void nbd_budget_stats(struct nbd_budget *b, uint64_t *peak, uint64_t *waits)
{
	pthread_mutex_lock(&b->lock);
	*peak = b->peak;
	*waits = b->waits;
	pthread_mutex_unlock(&b->lock);
}

static bool fits(const struct nbd_budget *b, uint64_t need)
{
	/* used may exceed the limit: one request larger than it, alone. */
	return b->used == 0 || (b->used < b->limit && need <= b->limit - b->used);
}

static void take(struct nbd_budget *b, uint64_t need)
{
	b->used += need;
	if (b->used > b->peak)
		b->peak = b->used;
}

/* Grant what the queue's head can have, in order; returns the connections
 * granted (linked through mem_next) for the caller to notify unlocked. */
static struct nbd_conn *wake_locked(struct nbd_budget *b)
{
	struct nbd_conn *granted = NULL, **gt = &granted, *c;

	while ((c = b->head) && fits(b, c->mem_need)) {
		b->head = c->mem_next;
		if (!b->head)
			b->tail = &b->head;
		c->mem_queued = false;
		take(b, c->mem_need);
		c->mem_next = NULL;
		*gt = c;
		gt = &c->mem_next;
	}
	return granted;
}

static void notify(struct nbd_conn *c)
{
	struct nbd_conn *next;

	for (; c; c = next) {
		next = c->mem_next;
		loop_send(c->loop, &c->mem_msg);
	}
}

bool nbd_budget_get(struct nbd_budget *b, struct nbd_conn *c, uint64_t need)
{
	bool ok;

	pthread_mutex_lock(&b->lock);
	ok = !b->head && fits(b, need);
	if (ok) {
		take(b, need);
	} else {
		c->mem_need = need;
		c->mem_queued = true;
		c->mem_next = NULL;
		*b->tail = c;
		b->tail = &c->mem_next;
		b->waits++;
	}
	pthread_mutex_unlock(&b->lock);
	return ok;
}

void nbd_budget_put(struct nbd_budget *b, uint64_t n)
{
	struct nbd_conn *granted;

	if (!n)
		return;
	pthread_mutex_lock(&b->lock);
	b->used -= n;
	granted = wake_locked(b);
	pthread_mutex_unlock(&b->lock);
	notify(granted);
}

/* False when c was granted meanwhile: its grant message is on the way. */
bool nbd_budget_cancel(struct nbd_budget *b, struct nbd_conn *c)
{
	struct nbd_conn **pp, *granted = NULL;
	bool found = false;

	pthread_mutex_lock(&b->lock);
	for (pp = &b->head; *pp; pp = &(*pp)->mem_next) {
		if (*pp != c)
			continue;
		*pp = c->mem_next;
		if (b->tail == &c->mem_next)
			b->tail = pp;
		c->mem_queued = false;
		found = true;
		/* Those behind it may fit now. */
		granted = wake_locked(b);
		break;
	}
	pthread_mutex_unlock(&b->lock);
	notify(granted);
	return found;
}
