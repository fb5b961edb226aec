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

/* A resize or replace notifier, on a list of the node (bs->resize_notifiers,
 * bs->replace_notifiers). */
struct blk_notifier {
	struct blk_notifier *next;
	union {
		void (*resize)(struct blk_node *bs, void *opaque);
		blk_replace_fn replace;
	} cb;
	void *opaque;
};

static void notifiers_free(void **list)
{
	struct blk_notifier *n, *next;

	for (n = *list; n; n = next) {
		next = n->next;
		free(n);
	}
	*list = NULL;
}

/* Append n (a list itself) to *list. */
static void notifiers_append(void **list, struct blk_notifier *n)
{
	struct blk_notifier **p;

	for (p = (struct blk_notifier **)list; *p; p = &(*p)->next)
		;
	*p = n;
}

static int notifier_add(void **list, struct blk_notifier n)
{
	struct blk_notifier *c = malloc(sizeof(*c));

	if (!c)
		return -ENOMEM;
	*c = n;
	c->next = NULL;
	notifiers_append(list, c);
	return 0;
}

/* Remove the first entry with the same callback and opaque. */
static void notifier_del(void **list, struct blk_notifier key)
{
	struct blk_notifier **p, *n;

	for (p = (struct blk_notifier **)list; (n = *p); p = &n->next)
		if (!memcmp(&n->cb, &key.cb, sizeof(key.cb)) && n->opaque == key.opaque) {
			*p = n->next;
			free(n);
			return;
		}
}

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
	notifiers_free(&bs->resize_notifiers);
	notifiers_free(&bs->replace_notifiers);
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

/* ---- replacing a node ------------------------------------------------------ */

int blk_replace_notifier_add(struct blk_node *bs, blk_replace_fn cb, void *opaque)
{
	return notifier_add(&bs->replace_notifiers,
			    (struct blk_notifier){.cb.replace = cb, .opaque = opaque});
}

void blk_replace_notifier_del(struct blk_node *bs, blk_replace_fn cb, void *opaque)
{
	notifier_del(&bs->replace_notifiers,
		     (struct blk_notifier){.cb.replace = cb, .opaque = opaque});
}

static int subtree_has(struct blk_node *bs, void *opaque)
{
	return bs == opaque;
}

#define REPLACE_MAX_PARENTS (BLK_MAX_CHILDREN * 4)

/* What blk_replace_node() changes before it knows the permissions allow it,
 * to be put back otherwise. */
struct replace {
	struct blk_node *from, *to;
	struct blk_node *parents[REPLACE_MAX_PARENTS]; /* moving to `to` */
	unsigned nparents;
	unsigned links; /* parent links moved */
	uint32_t to_perm, to_shared, from_perm, from_shared;
};

/* Point every moving parent's links to from at dst instead (src: from or
 * to, the other way round when undoing). */
static void replace_links(struct replace *r, struct blk_node *src, struct blk_node *dst)
{
	for (unsigned i = 0; i < r->nparents; i++) {
		struct blk_node *p = r->parents[i];

		for (unsigned c = 0; c < p->nchildren; c++) {
			if (p->children[c].node != src)
				continue;
			p->children[c].node = dst;
			r->links += src == r->from ? 1 : 0;
			src->nparents--;
			dst->nparents++;
		}
		if (p->next == src)
			p->next = dst;
	}
}

static int replace_collect(struct replace *r, char *err, size_t errlen)
{
	struct blk_node *p[REPLACE_MAX_PARENTS];
	unsigned n = blk_parents(r->from, p, REPLACE_MAX_PARENTS);

	if (n > REPLACE_MAX_PARENTS) {
		snprintf(err, errlen, "node '%s' has too many parents", blk_node_name(r->from));
		return -E2BIG;
	}
	for (unsigned i = 0; i < n; i++) {
		bool dup = false;

		for (unsigned j = 0; j < r->nparents; j++)
			dup |= r->parents[j] == p[i];
		/* to's own links (its backing link to from), and those of nodes
		 * under it, stay: moving them would make a loop. */
		if (!dup && !blk_walk(r->to, subtree_has, p[i]))
			r->parents[r->nparents++] = p[i];
	}
	return 0;
}

/* Move the users' permissions and the parents' links, then ask every
 * locking node; undo both when it says no. */
static int replace_perms(struct replace *r, char *err, size_t errlen)
{
	struct blk_node *from = r->from, *to = r->to;
	int ret;

	if (to->read_only && (from->user_perm & (BLK_PERM_WRITE | BLK_PERM_RESIZE))) {
		snprintf(err, errlen, "Node '%s' is read only", blk_node_name(to));
		return -EPERM;
	}
	r->to_perm = to->user_perm;
	r->to_shared = to->user_shared;
	r->from_perm = from->user_perm;
	r->from_shared = from->user_shared;
	to->user_perm |= from->user_perm;
	to->user_shared &= from->user_shared;
	from->user_perm = 0;
	from->user_shared = BLK_PERM_ALL;
	replace_links(r, from, to);
	ret = blk_perm_refresh(from, err, errlen);
	if (!ret)
		return 0;
	replace_links(r, to, from);
	to->user_perm = r->to_perm;
	to->user_shared = r->to_shared;
	from->user_perm = r->from_perm;
	from->user_shared = r->from_shared;
	blk_perm_refresh(from, NULL, 0); /* back to what was held: cannot conflict */
	return -EPERM;
}

/* The references of the users and of the moved parents follow them; from
 * keeps its others (the overlay's, the monitor's). */
static void replace_refs(struct replace *r)
{
	struct blk_users *u = r->from->users;
	unsigned users = 0;

	for (unsigned i = 0; u && i < u->n; i++) {
		for (unsigned k = 0; k < u->v[i].count; k++)
			blk_ref(r->to, u->v[i].desc);
		users += u->v[i].count;
		free(u->v[i].desc);
	}
	if (u)
		u->n = 0;
	r->to->refcnt += r->links;
	assert(r->from->refcnt > users + r->links);
	r->from->refcnt -= users + r->links;
}

static void resize_notify(struct blk_node *bs);

static int replace_node(struct blk_node *from, struct blk_node *to, bool may_grow, char *err,
			size_t errlen)
{
	struct replace *r;
	struct blk_notifier *n, *next;
	int ret;

	if (from == to || (from->size != to->size && !(may_grow && to->size > from->size))) {
		snprintf(err, errlen, "Node '%s' cannot take the place of node '%s'",
			 blk_node_name(to), blk_node_name(from));
		return -EINVAL;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r->from = from;
	r->to = to;
	ret = replace_collect(r, err, errlen);
	if (!ret)
		ret = replace_perms(r, err, errlen);
	if (ret) {
		free(r);
		return ret;
	}
	replace_refs(r);
	free(r);
	notifiers_append(&to->resize_notifiers, from->resize_notifiers);
	from->resize_notifiers = NULL;
	for (n = from->replace_notifiers, from->replace_notifiers = NULL; n; n = next) {
		next = n->next;
		n->next = NULL;
		n->cb.replace(from, to, n->opaque);
		notifiers_append(&to->replace_notifiers, n);
	}
	blk_drain_retarget(from, to);
	if (to->size != from->size)
		resize_notify(to); /* the users see the larger node */
	return 0;
}

int blk_replace_node(struct blk_node *from, struct blk_node *to, char *err, size_t errlen)
{
	return replace_node(from, to, false, err, errlen);
}

int blk_replace_node_grow(struct blk_node *from, struct blk_node *to, char *err, size_t errlen)
{
	return replace_node(from, to, true, err, errlen);
}

static void node_set_ro(struct blk_node *bs, bool ro)
{
	bs->read_only = ro;
	bs->write_slow = ro || bs->detect_zeroes;
}

/* Writable again: the file first (a backing file opened read-only opens
 * its image again for writing), then the format. */
static int set_writable(struct blk_node *bs, char *err, size_t errlen)
{
	struct blk_node *f = bs->next && bs->next->nparents == 1 ? bs->next : NULL;
	int ret = f && f->drv->set_read_only ? f->drv->set_read_only(f, false) : 0;

	if (!ret && bs->drv->set_read_only)
		ret = bs->drv->set_read_only(bs, false);
	if (ret)
		snprintf(err, errlen, "Could not make node '%s' writable: %s", blk_node_name(bs),
			 strerror(-ret));
	return ret;
}

int blk_set_backing_read_only(struct blk_node *bs, bool ro, char *err, size_t errlen)
{
	int ret = ro && bs->drv->set_read_only ? bs->drv->set_read_only(bs, true) : 0;

	if (ret) {
		snprintf(err, errlen, "Could not make node '%s' read-only: %s", blk_node_name(bs),
			 strerror(-ret));
		return ret;
	}
	if (!ro && (ret = set_writable(bs, err, errlen)))
		return ret;
	node_set_ro(bs, ro);
	if (bs->next && bs->next->nparents == 1)
		node_set_ro(bs->next, ro);
	/* Fewer permissions cannot conflict; more are those it held before. */
	blk_perm_refresh(bs, NULL, 0);
	return 0;
}

/* ---- resize ---------------------------------------------------------------- */

int blk_resize_notifier_add(struct blk_node *bs, void (*cb)(struct blk_node *bs, void *opaque),
			    void *opaque)
{
	return notifier_add(&bs->resize_notifiers,
			    (struct blk_notifier){.cb.resize = cb, .opaque = opaque});
}

void blk_resize_notifier_del(struct blk_node *bs, void (*cb)(struct blk_node *bs, void *opaque),
			     void *opaque)
{
	notifier_del(&bs->resize_notifiers,
		     (struct blk_notifier){.cb.resize = cb, .opaque = opaque});
}

static void resize_notify(struct blk_node *bs)
{
	struct blk_notifier *n, *next;

	/* A callback may remove itself. */
	for (n = bs->resize_notifiers; n; n = next) {
		next = n->next;
		n->cb.resize(bs, n->opaque);
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

static struct loop *ctl_loop;  /* main thread */
static struct loop *ctl_outer; /* main thread: the loop blk_ctl_enter() left */

int blk_ctl_enter(struct loop **prev)
{
	struct loop_opts o = {.backend = LOOP_BACKEND_AUTO, .poll_max_ns = 0};

	if (!ctl_loop && loop_new(&o, &ctl_loop))
		return -ENOMEM;
	*prev = loop_current();
	if (*prev != ctl_loop)
		ctl_outer = *prev;
	loop_bind_current(ctl_loop);
	return 0;
}

struct loop *blk_ctl_loop(void)
{
	return ctl_loop;
}

struct loop *blk_ctl_outer(void)
{
	return ctl_loop && loop_current() == ctl_loop ? ctl_outer : NULL;
}

void blk_ctl_leave(struct loop *prev)
{
	loop_bind_current(prev);
	if (prev != ctl_loop)
		ctl_outer = NULL;
}

void blk_ctl_free(void)
{
	loop_free(ctl_loop);
	ctl_loop = NULL;
}
