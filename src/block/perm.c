/* Permissions of a node stack, as QEMU's block layer has them: the users of
 * a root node hold and share permissions (BLK_PERM_*); each format driver
 * says what it needs of its children (child_perms, with the role helpers
 * below), down to the file nodes, which lock the image (file-lock.c).
 * Changes are all or nothing: every locking node prepares (takes the new
 * locks, keeps the old, checks for conflicts), then all commit, or those
 * already prepared abort.
 *
 * Threading: main thread only, with no request in flight. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block-int.h"
#include "block/graph.h"

#define PERM_MAX_NODES 256 /* a backing chain of 64 images with data files */

struct perm_item {
	struct blk_node *bs;
	uint32_t perm, shared;
};

struct perm_list {
	struct perm_item v[PERM_MAX_NODES];
	unsigned n;
};

void blk_perm_names(uint32_t perm, char *buf, size_t len)
{
	static const char *const names[BLK_PERM_COUNT] = {"consistent read", "write",
							  "write unchanged", "resize"};
	size_t used = 0;

	buf[0] = 0;
	for (unsigned i = 0; i < BLK_PERM_COUNT && used < len; i++) {
		if (!(perm & (1u << i)))
			continue;
		used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? ", " : "",
					 names[i]);
	}
	if (!buf[0])
		snprintf(buf, len, "nothing");
}

void blk_perm_storage(const struct blk_node *bs, bool metadata, bool data, uint32_t perm,
		      uint32_t shared, struct blk_perm_req *r)
{
	uint32_t p = perm & BLK_PERM_ALL, s = shared & BLK_PERM_ALL;

	if (metadata) {
		/* The format writes metadata even when its users do not write,
		 * and its metadata must not change under it. */
		if (!bs->read_only)
			p |= BLK_PERM_WRITE | BLK_PERM_RESIZE;
		if (!bs->no_io)
			p |= BLK_PERM_CONSISTENT_READ;
		s &= ~(BLK_PERM_WRITE | BLK_PERM_RESIZE);
	}
	if (data) {
		/* The size may be in the metadata; writes may extend the file;
		 * an unchanged write may still copy data in. */
		s &= ~BLK_PERM_RESIZE;
		if (p & BLK_PERM_WRITE_UNCHANGED)
			p |= BLK_PERM_WRITE;
		if (p & BLK_PERM_WRITE)
			p |= BLK_PERM_RESIZE;
	}
	r->perm = p;
	r->shared = s;
}

void blk_perm_backing(uint32_t perm, uint32_t shared, struct blk_perm_req *r)
{
	const uint32_t wr = BLK_PERM_WRITE | BLK_PERM_RESIZE;

	r->perm = perm & BLK_PERM_CONSISTENT_READ;
	r->shared = BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE_UNCHANGED;
	/* QEMU lets others write and resize the backing file when the users
	 * share write; ioplane only when they do not read either (no users
	 * yet, img info), which QEMU notes as the better rule. */
	if ((shared & BLK_PERM_WRITE) && !(perm & BLK_PERM_CONSISTENT_READ))
		r->shared |= wr;
}

/* A driver without child_perms: `file` gets what the node's users have,
 * other children QEMU's rules for their role. Every child, not only next. */
static unsigned perm_children(struct blk_node *bs, uint32_t perm, uint32_t shared,
			      struct blk_perm_req *out)
{
	unsigned n = 0;

	if (bs->drv->child_perms)
		return bs->drv->child_perms(bs, perm, shared, out);
	for (unsigned i = 0; i < bs->nchildren && n < BLK_PERM_MAX_CHILDREN; i++) {
		const struct blk_child *c = &bs->children[i];
		struct blk_perm_req *r = &out[n++];

		r->child = c->node;
		if (!strcmp(c->role, BLK_ROLE_BACKING))
			blk_perm_backing(perm, shared, r);
		else if (!strcmp(c->role, BLK_ROLE_DATA_FILE))
			blk_perm_storage(bs, false, true, perm, shared, r);
		else
			*r = (struct blk_perm_req){c->node, perm, shared};
	}
	return n;
}

static struct perm_item *perm_find(struct perm_list *l, const struct blk_node *bs)
{
	for (unsigned i = 0; i < l->n; i++)
		if (l->v[i].bs == bs)
			return &l->v[i];
	return NULL;
}

static int perm_collect(struct blk_node *bs, uint32_t perm, uint32_t shared, struct perm_list *l,
			unsigned depth)
{
	struct blk_perm_req c[BLK_PERM_MAX_CHILDREN];
	unsigned n;
	int ret;

	struct perm_item *it = perm_find(l, bs);

	if (depth > PERM_MAX_NODES)
		return -ELOOP;
	/* Users of this very node (an export on a child, block_resize) add to
	 * what its parents need. */
	perm |= bs->user_perm;
	shared &= bs->user_shared;
	if (bs->force_share)
		shared = BLK_PERM_ALL;
	if (it) {
		/* A node with several parents needs what each of them needs:
		 * walk its children again only if that grew. */
		if ((it->perm | perm) == it->perm && (it->shared & shared) == it->shared)
			return 0;
		perm |= it->perm;
		shared &= it->shared;
		*it = (struct perm_item){bs, perm, shared};
	} else if (l->n == PERM_MAX_NODES) {
		return -ELOOP;
	} else {
		l->v[l->n++] = (struct perm_item){bs, perm, shared};
	}
	n = perm_children(bs, perm, shared, c);
	for (unsigned i = 0; i < n; i++) {
		ret = perm_collect(c[i].child, c[i].perm, c[i].shared, l, depth + 1);
		if (ret)
			return ret;
	}
	return 0;
}

static int perm_mark(struct blk_node *bs, void *opaque)
{
	struct perm_list *m = opaque;

	if (perm_find(m, bs))
		return 0;
	if (m->n == PERM_MAX_NODES)
		return -ELOOP;
	m->v[m->n++].bs = bs;
	return 0;
}

static int perm_marked(struct blk_node *bs, void *opaque)
{
	return perm_find(opaque, bs) != NULL;
}

/* What every node under bs needs, collected from each root (a node without
 * parents) whose graph shares a node with bs's: a node shared by several
 * parents (blockdev-add's references) needs what all of them need. */
static int perm_collect_roots(struct blk_node *bs, struct perm_list *l)
{
	struct perm_list *mine = malloc(sizeof(*mine));
	int ret;

	if (!mine)
		return -ENOMEM;
	mine->n = 0;
	ret = blk_walk(bs, perm_mark, mine);
	for (struct blk_node *r = blk_graph_next(NULL); r && !ret; r = blk_graph_next(r))
		if (!r->nparents && blk_walk(r, perm_marked, mine) > 0)
			ret = perm_collect(r, r->user_perm, r->user_shared, l, 0);
	free(mine);
	return ret;
}

static int perm_step(struct perm_item *it, enum blk_perm_step step, char *err, size_t errlen)
{
	struct blk_node *bs = it->bs;

	if (!bs->drv->set_perm)
		return 0;
	return bs->drv->set_perm(bs, step, it->perm, it->shared, err, errlen);
}

static int perm_apply(struct perm_list *l, char *err, size_t errlen)
{
	unsigned i;
	int ret = 0;

	for (i = 0; i < l->n && !ret; i++)
		ret = perm_step(&l->v[i], BLK_PERM_PREPARE, err, errlen);
	if (ret) {
		/* The failed node has dropped what it took. */
		for (unsigned j = 0; j + 1 < i; j++)
			perm_step(&l->v[j], BLK_PERM_ABORT, NULL, 0);
		return ret;
	}
	for (i = 0; i < l->n; i++) {
		perm_step(&l->v[i], BLK_PERM_COMMIT, NULL, 0);
		l->v[i].bs->perm = l->v[i].perm;
		l->v[i].bs->shared = l->v[i].shared;
	}
	return 0;
}

int blk_perm_refresh(struct blk_node *bs, char *err, size_t errlen)
{
	struct perm_list *l = malloc(sizeof(*l));
	int ret;

	if (!l) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	l->n = 0;
	ret = perm_collect_roots(bs, l);
	if (ret)
		snprintf(err, errlen, "node graph too deep for permissions");
	else
		ret = perm_apply(l, err, errlen);
	free(l);
	return ret;
}

int blk_set_perm(struct blk_node *bs, uint32_t perm, uint32_t shared, char *err, size_t errlen)
{
	uint32_t old_perm = bs->user_perm, old_shared = bs->user_shared;
	int ret;

	if (bs->read_only && (perm & (BLK_PERM_WRITE | BLK_PERM_RESIZE))) {
		snprintf(err, errlen, "the image is read-only");
		return -EROFS;
	}
	bs->user_perm = perm & BLK_PERM_ALL;
	bs->user_shared = shared & BLK_PERM_ALL;
	ret = blk_perm_refresh(bs, err, errlen);
	if (ret) {
		bs->user_perm = old_perm;
		bs->user_shared = old_shared;
	}
	return ret;
}
