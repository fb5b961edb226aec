/* The registry of nodes and their node-names, reference counts by user,
 * monitor ownership, resize notifiers (graph.h).
 *
 * Threading: main thread only. Nodes join the registry when they are made
 * (node_new in open.c) and leave it when they are freed. */
#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-int.h"
#include "block/graph.h"
#include "util/log.h"
#include "util/trace.h"

static struct blk_node *graph_head, *graph_tail; /* every node, oldest first */
static uint64_t graph_name_counter;              /* generated names, as QEMU's */

/* Users other than parents: descriptions with counts. */
struct blk_user {
	char *desc;
	unsigned count;
};

struct blk_users {
	struct blk_user *v;
	unsigned n;
};

struct blk_resize_notifier {
	struct blk_resize_notifier *next;
	void (*cb)(struct blk_node *bs, void *opaque);
	void *opaque;
};

/* ---- registry -------------------------------------------------------------- */

struct blk_node *blk_graph_next(struct blk_node *prev)
{
	return prev ? prev->graph_next : graph_head;
}

void blk_graph_detach_loop(struct loop *loop)
{
	for (struct blk_node *bs = graph_head; bs; bs = bs->graph_next)
		blk_detach_node(bs, loop);
}

struct blk_node *blk_graph_find(const char *node_name)
{
	struct blk_node *bs;

	if (!node_name)
		return NULL;
	for (bs = graph_head; bs; bs = bs->graph_next)
		if (bs->name && !strcmp(bs->name, node_name))
			return bs;
	return NULL;
}

const char *blk_node_name(const struct blk_node *bs)
{
	return bs->name ? bs->name : "";
}

const char *blk_node_driver(const struct blk_node *bs)
{
	return bs->drv->name;
}

/* QEMU's id_wellformed(): a letter, then letters, digits, '-', '.', '_'. */
static bool name_wellformed(const char *s)
{
	if (!isalpha((unsigned char)s[0]))
		return false;
	for (s++; *s; s++)
		if (!isalnum((unsigned char)*s) && !strchr("-._", *s))
			return false;
	return true;
}

int blk_node_name_check(const char *name, char *err, size_t errlen)
{
	if (!name_wellformed(name)) {
		snprintf(err, errlen, "Invalid node-name: '%s'", name);
		return -EINVAL;
	}
	if (blk_graph_find(name)) {
		snprintf(err, errlen, "Duplicate nodes with node-name='%s'", name);
		return -EINVAL;
	}
	if (strlen(name) > BLK_NODE_NAME_MAX) {
		snprintf(err, errlen, "Node name too long");
		return -EINVAL;
	}
	return 0;
}

int blk_node_set_name(struct blk_node *bs, const char *name, char *err, size_t errlen)
{
	char *copy;
	int ret;

	if (!name || (bs->name && !strcmp(bs->name, name)))
		return 0;
	ret = blk_node_name_check(name, err, errlen);
	if (ret)
		return ret;
	copy = strdup(name);
	if (!copy) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	free(bs->name);
	bs->name = copy;
	IOPLANE_TRACE(blk_node_name, bs, bs->name);
	return 0;
}

/* "#block" + a counter + two random digits, as QEMU's id_generate(): the
 * digits keep users from guessing names. Unique even if a user took a
 * name of that form (they cannot: '#' is not well formed). */
static char *graph_gen_name(void)
{
	char buf[48];

	snprintf(buf, sizeof(buf), "#block%llu%02d", (unsigned long long)graph_name_counter++,
		 rand() % 100);
	return strdup(buf);
}

int blk_graph_register(struct blk_node *bs)
{
	bs->name = graph_gen_name();
	if (!bs->name)
		return -ENOMEM;
	bs->refcnt = 1;
	bs->graph_prev = graph_tail;
	if (graph_tail)
		graph_tail->graph_next = bs;
	else
		graph_head = bs;
	graph_tail = bs;
	return 0;
}

void blk_graph_unregister(struct blk_node *bs)
{
	struct blk_resize_notifier *n, *next;
	struct blk_users *u = bs->users;

	if (bs->graph_prev)
		bs->graph_prev->graph_next = bs->graph_next;
	else if (graph_head == bs)
		graph_head = bs->graph_next;
	if (bs->graph_next)
		bs->graph_next->graph_prev = bs->graph_prev;
	else if (graph_tail == bs)
		graph_tail = bs->graph_prev;
	bs->graph_prev = bs->graph_next = NULL;
	for (n = bs->resize_notifiers; n; n = next) {
		next = n->next;
		free(n);
	}
	bs->resize_notifiers = NULL;
	for (unsigned i = 0; u && i < u->n; i++)
		free(u->v[i].desc);
	if (u)
		free(u->v);
	free(u);
	bs->users = NULL;
}

void blk_graph_own(struct blk_node *bs)
{
	bs->monitor_owned = true;
}

bool blk_graph_owned(const struct blk_node *bs)
{
	return bs->monitor_owned;
}

void blk_graph_release(struct blk_node *bs)
{
	bs->monitor_owned = false;
}

/* ---- references ------------------------------------------------------------ */

static int users_add(struct blk_node *bs, const char *user)
{
	struct blk_users *u = bs->users;
	struct blk_user *v;

	if (!u && !(u = bs->users = calloc(1, sizeof(*u))))
		return -ENOMEM;
	for (unsigned i = 0; i < u->n; i++)
		if (!strcmp(u->v[i].desc, user)) {
			u->v[i].count++;
			return 0;
		}
	v = realloc(u->v, (u->n + 1) * sizeof(*v));
	if (!v)
		return -ENOMEM;
	u->v = v;
	v[u->n].desc = strdup(user);
	if (!v[u->n].desc)
		return -ENOMEM;
	v[u->n++].count = 1;
	return 0;
}

static bool users_del(struct blk_node *bs, const char *user)
{
	struct blk_users *u = bs->users;

	for (unsigned i = 0; u && i < u->n; i++) {
		if (strcmp(u->v[i].desc, user))
			continue;
		if (--u->v[i].count == 0) {
			free(u->v[i].desc);
			u->v[i] = u->v[--u->n];
		}
		return true;
	}
	return false;
}

void blk_ref(struct blk_node *bs, const char *user)
{
	/* Without memory for the description the reference still counts;
	 * only the busy message loses the name. */
	if (user && users_add(bs, user))
		log_warn("%s: out of memory for a user's name", blk_node_name(bs));
	bs->refcnt++;
}

void blk_unref(struct blk_node *bs, const char *user)
{
	if (!bs)
		return;
	if (user && !users_del(bs, user))
		log_warn("%s: unknown user '%s' dropped a reference", blk_node_name(bs), user);
	assert(bs->refcnt > 0);
	if (--bs->refcnt == 0)
		blk_node_destroy(bs);
}

unsigned blk_user_count(const struct blk_node *bs)
{
	const struct blk_users *u = bs->users;
	unsigned n = 0;

	for (unsigned i = 0; u && i < u->n; i++)
		n += u->v[i].count;
	return n;
}

unsigned blk_parent_count(const struct blk_node *bs)
{
	return bs->nparents;
}

unsigned blk_parents(const struct blk_node *bs, struct blk_node **out, unsigned max)
{
	struct blk_node *p;
	unsigned n = 0;

	for (p = graph_head; p; p = p->graph_next)
		for (unsigned i = 0; i < p->nchildren; i++)
			if (p->children[i].node == bs) {
				if (n < max)
					out[n] = p;
				n++;
			}
	return n;
}

static const char *parent_role(const struct blk_node *p, const struct blk_node *bs)
{
	for (unsigned i = 0; i < p->nchildren; i++)
		if (p->children[i].node == bs)
			return p->children[i].role;
	return "child";
}

bool blk_in_use(const struct blk_node *bs, char *why, size_t whylen)
{
	const struct blk_users *u = bs->users;
	struct blk_node *p;

	if (u && u->n) {
		if (why)
			snprintf(why, whylen, "used by %s", u->v[0].desc);
		return true;
	}
	if (!bs->nparents)
		return false;
	if (why && blk_parents(bs, &p, 1))
		snprintf(why, whylen, "used as '%s' of node '%s'", parent_role(p, bs),
			 blk_node_name(p));
	else if (why)
		snprintf(why, whylen, "used by a parent node");
	return true;
}

/* ---- resize ---------------------------------------------------------------- */

int blk_resize_notifier_add(struct blk_node *bs, void (*cb)(struct blk_node *bs, void *opaque),
			    void *opaque)
{
	struct blk_resize_notifier *n = calloc(1, sizeof(*n)), **p;

	if (!n)
		return -ENOMEM;
	n->cb = cb;
	n->opaque = opaque;
	for (p = (struct blk_resize_notifier **)&bs->resize_notifiers; *p; p = &(*p)->next)
		;
	*p = n;
	return 0;
}

void blk_resize_notifier_del(struct blk_node *bs, void (*cb)(struct blk_node *bs, void *opaque),
			     void *opaque)
{
	struct blk_resize_notifier **p, *n;

	for (p = (struct blk_resize_notifier **)&bs->resize_notifiers; (n = *p); p = &n->next)
		if (n->cb == cb && n->opaque == opaque) {
			*p = n->next;
			free(n);
			return;
		}
}

static void resize_notify(struct blk_node *bs)
{
	struct blk_resize_notifier *n, *next;

	/* A callback may remove itself. */
	for (n = bs->resize_notifiers; n; n = next) {
		next = n->next;
		n->cb(bs, n->opaque);
	}
}

int blk_resize(struct blk_node *bs, uint64_t size, char *err, size_t errlen)
{
	uint32_t perm = bs->user_perm, shared = bs->user_shared;
	int ret;

	if (bs->read_only) {
		snprintf(err, errlen, "Image is read-only");
		return -EROFS;
	}
	if (!bs->drv->truncate) {
		snprintf(err, errlen, "Image format driver does not support resize");
		return -ENOTSUP;
	}
	/* A user that resizes, as QEMU's block_resize is: nobody who does not
	 * share resize (a raw window, another process) may be there. */
	ret = blk_set_perm(bs, perm | BLK_PERM_RESIZE, shared, err, errlen);
	if (ret)
		return ret;
	ret = blk_drain_begin(bs);
	if (ret) {
		blk_set_perm(bs, perm, shared, err, errlen);
		snprintf(err, errlen, "Could not drain node '%s': %s", blk_node_name(bs),
			 strerror(-ret));
		return ret;
	}
	ret = blk_truncate(bs, size); /* its bitmaps too */
	blk_drain_end(bs);
	blk_set_perm(bs, perm, shared, NULL, 0); /* dropping one cannot fail */
	if (ret == -ENOTSUP && !strcmp(bs->drv->name, "raw")) {
		snprintf(err, errlen, "Cannot resize fixed-size raw disks"); /* QEMU's */
		return ret;
	}
	if (ret) {
		snprintf(err, errlen, "Could not resize: %s", strerror(-ret));
		return ret;
	}
	resize_notify(bs);
	return 0;
}

/* ---- corruption events ------------------------------------------------------ */

static struct loop *corrupt_loop; /* written at start-up, then read by any thread */
static void (*corrupt_fn)(const char *node_name, const char *msg, bool fatal);

struct corrupt_msg {
	struct loop_msg m;
	bool fatal;
	char node_name[BLK_NODE_NAME_MAX + 1];
	char msg[256];
};

void blk_set_corrupt_handler(struct loop *main,
			     void (*fn)(const char *node_name, const char *msg, bool fatal))
{
	corrupt_fn = fn;
	corrupt_loop = main;
}

static void corrupt_msg_cb(struct loop_msg *m)
{
	struct corrupt_msg *c = container_of(m, struct corrupt_msg, m);

	if (corrupt_fn)
		corrupt_fn(c->node_name, c->msg, c->fatal);
	free(c);
}

/* Node-names are set before a node serves any request, so reading it here
 * races with nothing. */
void blk_report_corrupt(struct blk_node *bs, const char *msg, bool fatal)
{
	struct corrupt_msg *c;

	if (!corrupt_fn || !corrupt_loop || !(c = calloc(1, sizeof(*c))))
		return;
	c->m.cb = corrupt_msg_cb;
	c->fatal = fatal;
	snprintf(c->node_name, sizeof(c->node_name), "%s", blk_node_name(bs));
	snprintf(c->msg, sizeof(c->msg), "%s", msg);
	loop_send(corrupt_loop, &c->m);
}

/* ---- the control loop ------------------------------------------------------- */

static struct loop *ctl_loop; /* main thread */

int blk_ctl_enter(struct loop **prev)
{
	struct loop_opts o = {.backend = LOOP_BACKEND_AUTO, .poll_max_ns = 0};

	if (!ctl_loop && loop_new(&o, &ctl_loop))
		return -ENOMEM;
	*prev = loop_current();
	loop_bind_current(ctl_loop);
	return 0;
}

struct loop *blk_ctl_loop(void)
{
	return ctl_loop;
}

void blk_ctl_leave(struct loop *prev)
{
	loop_bind_current(prev);
}

void blk_ctl_free(void)
{
	loop_free(ctl_loop);
	ctl_loop = NULL;
}
