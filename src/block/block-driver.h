/* Block layer, the side of the drivers: the driver table, finishing and
 * forwarding requests, per-thread state, the inline per-request context,
 * children a driver opens itself, and what a format driver needs of its
 * children (permissions). The built-in drivers are listed here too.
 *
 * The request a driver gets has been checked by the core (range, flags,
 * read-only, alignment) and is the driver's until it finishes it; it may
 * read req->loop (set by blk_submit()), never req->core. Threading: as
 * block.h; submit and completions run on req->loop's thread. */
#ifndef IOPLANE_BLOCK_DRIVER_H
#define IOPLANE_BLOCK_DRIVER_H

#include "block/block.h"

/* What a node needs of one child (child_perms). */
struct blk_perm_req {
	struct blk_node *child;
	uint32_t perm, shared;
};
#define BLK_PERM_MAX_CHILDREN 4

enum blk_perm_step { BLK_PERM_PREPARE, BLK_PERM_COMMIT, BLK_PERM_ABORT };

struct blk_driver {
	const char *name;
	bool is_format; /* sits on a `file` child (bs->next) */
	/* Parse options, open, fill bs->size, bs->align etc. Return 0/-errno and
	 * put a human message into err. */
	int (*open)(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen);
	/* Release the driver's state. The children are still open (metadata
	 * may be written to them); the core closes them afterwards. */
	void (*close)(struct blk_node *bs);
	/* Called by the core after validation; same async contract as blk_submit.
	 * Finish with blk_complete() or blk_complete_deferred(); use bs (not
	 * the node the request was submitted to) and req->loop. Requests are
	 * aligned (align, mem_align); write-zeroes may fail with -ENOTSUP: the
	 * core then writes zeroes unless NO_FALLBACK. The core may resubmit a
	 * finished request (FUA flush). */
	int (*submit)(struct blk_node *bs, struct blk_request *req);
	int (*truncate)(struct blk_node *bs, uint64_t size); /* synchronous, main thread */
	/* The node becomes read-only (true: write back what the driver holds,
	 * as at close, while it may still write) or writable again (false).
	 * Synchronous, main thread, no request in flight. NULL: nothing to do. */
	int (*set_read_only)(struct blk_node *bs, bool ro);
	/* Release per-thread state for a loop that is going away (the core
	 * calls it on every node of the graph). */
	void (*detach_loop)(struct blk_node *bs, struct loop *loop);
	/* Capability probes (NULL = false), asked once at open (bs->has_*). */
	bool (*can_discard)(struct blk_node *bs);
	bool (*can_write_zeroes)(struct blk_node *bs);
	bool (*can_fua)(struct blk_node *bs); /* false: core emulates with a flush */
	bool (*can_block_status)(struct blk_node *bs);
	bool (*can_multi_conn)(struct blk_node *bs); /* flush covers all threads' writes */
	/* Permissions (perm.c), main thread. The children this node uses and
	 * what it needs of each while it holds perm and shares shared: fills
	 * out (at most BLK_PERM_MAX_CHILDREN), returns the count. NULL: `next`
	 * (if any) gets perm and shared as they are. Also called before open()
	 * (bs->opaque NULL, `next` set), so that `next` is locked before the
	 * driver reads or writes it. */
	unsigned (*child_perms)(struct blk_node *bs, uint32_t perm, uint32_t shared,
				struct blk_perm_req *out);
	/* Nodes that lock an image (file): PREPARE takes what perm and shared
	 * need, keeping what is held, and checks that no other user conflicts
	 * (-errno and a message, having dropped what it took); then exactly
	 * one of COMMIT (drop what is no longer needed) or ABORT (back to the
	 * previous state), which cannot fail. */
	int (*set_perm)(struct blk_node *bs, enum blk_perm_step step, uint32_t perm,
			uint32_t shared, char *err, size_t errlen);
};

/* Built-in drivers (one file or folder each), registered by
 * blk_register_builtin_drivers(). */
extern const struct blk_driver blk_drv_null;       /* null.c */
extern const struct blk_driver blk_drv_raw;        /* raw.c */
extern const struct blk_driver blk_drv_file;       /* file.c and its engines */
extern const struct blk_driver blk_drv_qcow2;      /* qcow2/ */
extern const struct blk_driver blk_drv_throttle;   /* throttle.c, on throttle-group.c */
extern const struct blk_driver blk_drv_nbd;        /* nbd-client.c (libnbd) */
extern const struct blk_driver blk_drv_rbd;        /* rbd.c (librbd) */
extern const struct blk_driver blk_drv_cbw;        /* cbw.c: copy-before-write filter */
extern const struct blk_driver blk_drv_mirror_top; /* mirror-top.c: a mirror's filter */

/* Add a driver (tests, plug-ins; main thread, start-up): -EEXIST if the
 * name is taken, -ENOSPC. */
int blk_register_driver(const struct blk_driver *drv);
const struct blk_driver *blk_find_driver(const char *name);

/* Finish a request from a completion context (never from inside the submit
 * call); the driver must not touch req afterwards ... */
void blk_complete(struct blk_request *req, int ret);
/* ... or from inside the submit call: completion is deferred to the end of
 * the current round. */
void blk_complete_deferred(struct blk_request *req, int ret);

/* A request forwarded to child skips child's checks: its dirty bitmaps are
 * marked here instead (block.c), as the checks would have. */
void blk_dirty_mark_forward(struct blk_node *child, const struct blk_request *req);

/* Forward a request to bs->next without re-validation (format drivers,
 * filters). A node below with dirty bitmaps still records the write. */
static inline int blk_forward(struct blk_node *bs, struct blk_request *req)
{
	if (__builtin_expect(bs->next->dirty_bitmaps != NULL, 0))
		blk_dirty_mark_forward(bs->next, req);
	return bs->next->drv->submit(bs->next, req);
}
/* Same, with req->offset moved up by delta for the child; the core moves it
 * back before the submitter's callback runs. */
int blk_forward_shift(struct blk_node *bs, struct blk_request *req, uint64_t delta);

/* Per-request context: req->drv (BLK_DRV_CTX_SIZE bytes, aligned for any
 * pointer or uint64_t) belongs to the protocol driver that finally executes
 * the request, from submit until it finishes it. A format driver that needs
 * state of its own sends child requests, whose context is then its own.
 * Check the size of a context with _Static_assert. The request owning a
 * context: */
static inline struct blk_request *blk_req_from_drv(void *ctx)
{
	return (struct blk_request *)((char *)ctx - offsetof(struct blk_request, drv));
}

/* Per-thread driver state: bs->thread_state[loop_index(loop)], created with
 * ctor on first use (NULL on failure). Freed by the driver (detach_loop,
 * close). */
void *blk_thread_state(struct blk_node *bs, struct loop *loop,
		       void *(*ctor)(struct blk_node *bs, struct loop *loop));

/* The node's statistics slot for loop, made on first use (NULL: no memory);
 * only the thread of loop writes it (stats.c). Filters count their own
 * events there (the throttle filter's waits). */
struct blk_stats *blk_stats_slot(struct blk_node *bs, struct loop *loop);

/* Children a driver opens itself (main thread, no request in flight):
 * blk_add_child makes bs own child from now on (the core closes it after
 * the driver's close(), also when open() fails later); the `file` child
 * goes first and into bs->next. -ENOSPC past BLK_MAX_CHILDREN. */
int blk_add_child(struct blk_node *bs, const char *role, struct blk_node *child);
/* Remove the child with that role from bs and hand it to the caller. */
struct blk_node *blk_take_child(struct blk_node *bs, const char *role);
/* True when every writable child of bs can_multi_conn: for format drivers'
 * can_multi_conn probe. */
bool blk_children_can_multi_conn(struct blk_node *bs);

/* What a format driver needs of a child, by role (QEMU's rules), when the
 * node holds perm and shares shared. Storage: the image file (metadata: the
 * format's own metadata is there; data: guest data is there). */
void blk_perm_storage(const struct blk_node *bs, bool metadata, bool data, uint32_t perm,
		      uint32_t shared, struct blk_perm_req *r);
/* A backing file: consistent read if the node needs it; shares write and
 * resize only when the node's users share write and do not read (QEMU
 * shares them whenever the users share write: ioplane does not let the
 * data under an overlay that is read change). */
void blk_perm_backing(uint32_t perm, uint32_t shared, struct blk_perm_req *r);
/* "consistent read, write" for a set of BLK_PERM_* bits (lock messages). */
void blk_perm_names(uint32_t perm, char *buf, size_t len);

#endif
