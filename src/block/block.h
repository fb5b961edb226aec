/* Block layer: requests, nodes, drivers.
 *
 * A node is an opened image layer. Nodes form a graph: each node has
 * children with roles (a format node's `file`, a qcow2 node's `backing` and
 * `data-file`), and everything that visits a stack (close, detach, flush,
 * probes) goes through the children. A request is submitted to a node with
 * blk_submit(); the core checks it once (range, alignment, read-only, flags)
 * and hands it to the driver.
 *
 * Async contract: blk_submit() returns 0 and later calls req->cb exactly once,
 * never from inside blk_submit(); or it returns -errno and never calls it.
 *
 * Threading: a node may be used from several loops at once; each request runs
 * on the loop that submitted it (req->loop). Per-thread driver state and
 * statistics are indexed by loop_index(). Open/close happen on the main thread
 * while no request is in flight. */
#ifndef IOPLANE_BLOCK_H
#define IOPLANE_BLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "loop/loop.h"

struct blk_node;
struct kv_opts;

enum blk_op {
	BLK_OP_READ = 0,
	BLK_OP_WRITE,
	BLK_OP_FLUSH,
	BLK_OP_DISCARD,
	BLK_OP_WRITE_ZEROES,
	BLK_OP_BLOCK_STATUS,
	BLK_OP__COUNT,
};

/* Request flags */
#define BLK_F_FUA (1u << 0)         /* write/write-zeroes: durable on completion */
#define BLK_F_MAY_UNMAP (1u << 1)   /* write-zeroes: may deallocate */
#define BLK_F_NO_FALLBACK (1u << 2) /* write-zeroes: fail with -ENOTSUP rather than write zero buffers */
#define BLK_F__ALL (BLK_F_FUA | BLK_F_MAY_UNMAP | BLK_F_NO_FALLBACK)

/* Block-status result bits */
#define BLK_STATUS_DATA (1u << 0)      /* range holds data (not known to be a hole) */
#define BLK_STATUS_ZERO (1u << 1)      /* range reads as zeroes */
#define BLK_STATUS_ALLOCATED (1u << 2) /* allocated in this layer (not from a backing file) */
#define BLK_STATUS_OFFSET_VALID (1u << 3) /* status_offset holds the host offset of `offset` */

#define BLK_DRV_CTX_SIZE 160

/* Permissions on an image, QEMU's bits: the file driver turns them into the
 * lock bytes QEMU's file driver uses, so that QEMU and ioplane see each
 * other (file-lock.c). A node "holds" the permissions its users need and
 * "shares" those it lets other users (in this or another process) have. */
#define BLK_PERM_CONSISTENT_READ (1u << 0) /* reads see what was written */
#define BLK_PERM_WRITE		 (1u << 1)
#define BLK_PERM_WRITE_UNCHANGED (1u << 2) /* writes that do not change the data */
#define BLK_PERM_RESIZE		 (1u << 3)
#define BLK_PERM_ALL		 0xfu
#define BLK_PERM_COUNT		 4

/* What a node needs of one child (child_perms). */
struct blk_perm_req {
	struct blk_node *child;
	uint32_t perm, shared;
};
#define BLK_PERM_MAX_CHILDREN 4

enum blk_perm_step { BLK_PERM_PREPARE, BLK_PERM_COMMIT, BLK_PERM_ABORT };

struct blk_request {
	/* Set by the submitter. */
	uint8_t op;            /* enum blk_op */
	uint32_t flags;        /* BLK_F_* */
	uint64_t offset;       /* bytes */
	uint64_t len;          /* bytes; read/write: must equal the iovec's total */
	struct iovec *iov;     /* read/write only */
	int iovcnt;
	void (*cb)(struct blk_request *req, int ret);
	void *opaque;

	/* Result of BLK_OP_BLOCK_STATUS: the first status_len bytes (1..len) from
	 * offset all have status `status`. */
	uint64_t status_len;
	uint32_t status;
	/* With BLK_STATUS_OFFSET_VALID: where the range starts in the format
	 * node's file (qcow2: host offset in the image or data file). */
	uint64_t status_offset;

	/* Private to the core. Drivers may read `loop`; `node` is the node the
	 * request was submitted to (not necessarily the driver's own: use the bs
	 * argument of submit()). */
	struct blk_node *node;
	struct loop *loop;
	struct blk_stats *st;        /* node's statistics slot for `loop` */
	uint64_t start_tsc;
	uint64_t shift;             /* offset added by blk_forward_shift(), undone on completion */
	int ret;
	uint16_t core;              /* BLK_CORE_* (block-int.h); 0 on the fast path */
	uint8_t saved_op;
	union {
		struct loop_defer defer; /* deferred completion */
		struct loop_msg wake;    /* resume after waiting for an overlapping request */
	};
	struct blk_request *parent;  /* internal child: the request it works for */
	void *slow;                  /* alignment slow-path state (align.c) */
	/* Overlap tracking (align > 1 only): protected by the node's track lock. */
	struct blk_request *track_next, *track_prev;
	uint64_t track_lo, track_hi;
	bool serialising, waiting;

	/* Per-request driver context, inline (no allocation per request). Used by
	 * the protocol driver that finally executes the request; format drivers
	 * that need their own state use child requests. */
	union {
		unsigned char bytes[BLK_DRV_CTX_SIZE];
		uint64_t u64;
		void *ptr;
	} drv;
};

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
	 * req->node) and req->loop. Requests are aligned (align, mem_align);
	 * write-zeroes may fail with -ENOTSUP: the core then writes zeroes unless
	 * NO_FALLBACK. The core may resubmit a finished request (FUA flush). */
	int (*submit)(struct blk_node *bs, struct blk_request *req);
	int (*truncate)(struct blk_node *bs, uint64_t size); /* synchronous, main thread */
	/* Release per-thread state for a loop that is going away (the core
	 * calls it on every node of the graph). */
	void (*detach_loop)(struct blk_node *bs, struct loop *loop);
	/* Capability probes (NULL = false), asked once at open (bs->has_*). */
	bool (*can_discard)(struct blk_node *bs);
	bool (*can_write_zeroes)(struct blk_node *bs);
	bool (*can_fua)(struct blk_node *bs);         /* false: core emulates with a flush */
	bool (*can_block_status)(struct blk_node *bs);
	bool (*can_multi_conn)(struct blk_node *bs);  /* flush covers all threads' writes */
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

#define BLK_HIST_BUCKETS 40 /* log2 of latency in ns */

/* ops: completed requests, errors: those that failed, bytes: of the others. */
struct blk_op_stats {
	uint64_t ops, bytes, errors, total_ns;
	uint64_t hist[BLK_HIST_BUCKETS]; /* bucket i: latency in [2^i, 2^(i+1)) ns */
};

struct blk_stats {
	struct blk_op_stats op[BLK_OP__COUNT];
	uint64_t in_flight;
};

/* Child roles (static strings; compare with strcmp). */
#define BLK_ROLE_FILE      "file"      /* the node a format driver forwards to */
#define BLK_ROLE_BACKING   "backing"   /* qcow2: unallocated clusters read from here */
#define BLK_ROLE_DATA_FILE "data-file" /* qcow2: guest data outside the image file */
#define BLK_MAX_CHILDREN   4

struct blk_child {
	const char *role;      /* BLK_ROLE_* */
	struct blk_node *node; /* owned by the parent: closed with it */
};

struct blk_node {
	const struct blk_driver *drv;
	/* The `file` child (NULL: none), cached so that forwarding a request
	 * costs one load. */
	struct blk_node *next;
	/* Every child, `file` first. Changed on the main thread only, at open
	 * (blk_add_child) and while no request is in flight. */
	struct blk_child children[BLK_MAX_CHILDREN];
	unsigned nchildren;
	char *name;
	void *opaque;            /* driver state */
	uint64_t size;           /* bytes */
	/* The core only hands the driver requests whose offset, length and
	 * iovec segment lengths are multiples of align and whose buffer
	 * addresses are multiples of mem_align (Linux O_DIRECT rules). */
	uint32_t align;          /* request alignment: offset and length (>= 1) */
	uint32_t mem_align;      /* buffer address alignment (>= 1) */
	uint32_t max_transfer;   /* 0: unlimited; advisory, the core does not split */
	bool read_only;
	bool discard_ignore;     /* discard=ignore: succeed without doing anything */
	/* Capabilities, cached by blk_open() from the driver's probes. */
	bool has_fua, has_discard, has_write_zeroes, has_block_status;
	/* Permissions (perm.c), main thread only. user_perm/user_shared: what
	 * the users of a root node hold and share (blk_set_perm; 0 and
	 * BLK_PERM_ALL after open). perm/shared: what this node holds and
	 * shares as a result. force_share: force-share=on, shares everything. */
	uint32_t user_perm, user_shared;
	uint32_t perm, shared;
	bool force_share;
	bool no_io; /* x-no-io=on: metadata only (img info), no consistent read */

	/* Per-thread state, indexed by loop_index(); each slot is owned by that
	 * loop's thread. Statistics count requests submitted to this node only
	 * (a request forwarded from a format node is counted there). The driver's
	 * close() frees its thread_state slots. */
	struct blk_stats *stats[LOOP_MAX_THREADS];
	void *thread_state[LOOP_MAX_THREADS];

	/* Overlap tracking for the alignment slow path (only when align > 1).
	 * Protected by track_lock. */
	void *track; /* struct blk_track, private to block.c */
};

/* Built-in drivers (one file each). */
extern const struct blk_driver blk_drv_null;
extern const struct blk_driver blk_drv_raw;
extern const struct blk_driver blk_drv_file;

/* Register drivers (start-up, main thread). The built-in list is registered
 * once however often this is called; blk_open() calls it. */
void blk_register_builtin_drivers(void);
/* Add a driver (tests, plug-ins): -EEXIST if the name is taken, -ENOSPC. */
int blk_register_driver(const struct blk_driver *drv);
const struct blk_driver *blk_find_driver(const char *name);

/* Open a node stack from options:
 *   driver=file,filename=PATH[,cache=none|writeback][,aio=io_uring|native|threads]
 *   driver=null,size=SIZE[,read-zeroes=on][,latency-ns=NS][,mode=timer|threads]
 *   format=raw|...: a format node on top of the protocol node ([,offset=..,size=..])
 *     raw: x-probed=on when the tool guessed the format (see raw.c)
 *   read-only=on, discard=unmap|ignore, request-alignment=N (testing),
 *   force-share=on (read-only only: share every permission, take no lock that
 *   keeps others out), x-no-io=on (qemu-img info's open: no consistent read
 *   on metadata), file: locking=on|off|auto
 * Options not consumed by anyone are an error. */
int blk_open(struct kv_opts *opts, struct blk_node **out, char *err, size_t errlen);
/* Open a TARGET as `ioplane bench`/`img` take it: a path, or
 * "null:size=SIZE[,...]" ; fmt may be NULL (raw). extra: more options (may be NULL). */
int blk_open_target(const char *target, const char *fmt, const char *extra,
                    struct blk_node **out, char *err, size_t errlen);
/* Permissions (perm.c): the users of root node bs now hold perm and share
 * shared (BLK_PERM_*); every node below gets what its parent's driver says
 * it needs, and file nodes lock accordingly. All or nothing: on a conflict
 * with another user of an image (-EBUSY, with a message naming the image
 * and the permission) or an error, every node keeps its previous locks.
 * WRITE or RESIZE on a read-only node: -EROFS. Main thread. */
int blk_set_perm(struct blk_node *bs, uint32_t perm, uint32_t shared, char *err, size_t errlen);
/* Recompute and apply the permissions of the stack below root bs from its
 * users' (after a child was added or opened). Same results as blk_set_perm. */
int blk_perm_refresh(struct blk_node *bs, char *err, size_t errlen);
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
/* "consistent read, write" for a set of BLK_PERM_* bits. */
void blk_perm_names(uint32_t perm, char *buf, size_t len);
/* Create (file-lock.c): open path for writing, creating it, lock it for
 * perm and shared and, if nobody conflicts, truncate it to 0 bytes. The fd
 * keeps the locks until closed. fd or -errno with a message in err. QEMU
 * creates a file holding write and resize and sharing all but resize
 * (BLK_CREATE_*), and a qcow2 image then as a writable qcow2 open. */
#define BLK_CREATE_PERM	  (BLK_PERM_WRITE | BLK_PERM_RESIZE)
#define BLK_CREATE_SHARED (BLK_PERM_ALL & ~BLK_PERM_RESIZE)
int blk_file_create(const char *path, uint32_t perm, uint32_t shared, char *err, size_t errlen);

/* Close bs: its driver's close(), then every child (recursively), then the
 * node itself. Drivers never close their children. NULL: nothing. */
void blk_close(struct blk_node *bs);
/* Tell every driver in the graph under bs that `loop` is going away
 * (detach_loop), from the loop's own thread. */
void blk_detach_loop(struct blk_node *bs, struct loop *loop);

/* The graph (main thread, no request in flight). blk_add_child: bs owns
 * child from now on; the `file` child goes first and into bs->next; drivers
 * call it from open() for the nodes they open themselves (qcow2: backing,
 * data-file). -ENOSPC past BLK_MAX_CHILDREN. */
int blk_add_child(struct blk_node *bs, const char *role, struct blk_node *child);
/* The child with that role, or NULL. */
struct blk_node *blk_child(const struct blk_node *bs, const char *role);
/* Remove the child with that role from bs and hand it to the caller. */
struct blk_node *blk_take_child(struct blk_node *bs, const char *role);
/* Call fn on bs and on every node below it, parents first; stops at the
 * first non-zero return, which it returns. */
int blk_walk(struct blk_node *bs, int (*fn)(struct blk_node *bs, void *opaque), void *opaque);
/* Flush bs and every writable node below it (a shutdown or close flush):
 * the first error, or 0. Synchronous, like blk_flush_sync(). */
int blk_flush_tree_sync(struct blk_node *bs);
/* True when every writable child of bs can_multi_conn: for format drivers'
 * can_multi_conn probe. */
bool blk_children_can_multi_conn(struct blk_node *bs);

/* Submit from a loop thread. Checks, each failing with -errno and no callback:
 *   op unknown or a flag not allowed for it (FUA: write, write-zeroes;
 *   MAY_UNMAP, NO_FALLBACK: write-zeroes) -> -EINVAL; offset+len overflows or
 *   passes the end -> -EINVAL; read/write whose iovec total != len -> -EINVAL;
 *   write, discard, write-zeroes on a read-only node -> -EROFS; block-status
 *   with len 0 or offset >= size -> -EINVAL (len past the end is clamped, in
 *   place); write-zeroes + NO_FALLBACK on a node that cannot -> -ENOTSUP.
 * Zero-length read/write/discard/write-zeroes, discard on a node that cannot
 * or with discard=ignore: success without the driver. The core emulates FUA
 * (write, then flush), write-zeroes (zero-buffer writes, also when the driver
 * fails one with -ENOTSUP) and block-status (DATA|ALLOCATED), and handles
 * alignment (align, mem_align) with bounce buffers and read-modify-write.
 * The submitter owns the request until its callback; offset, len (except the
 * block-status clamp), iov and flags are as submitted when it runs. */
int blk_submit(struct blk_node *bs, struct blk_request *req);

/* For drivers: finish a request from a completion context (never from inside
 * the submit call); the driver must not touch req afterwards ... */
void blk_complete(struct blk_request *req, int ret);
/* ... or from inside the submit call: completion is deferred to the end of
 * the current round. */
void blk_complete_deferred(struct blk_request *req, int ret);

/* Forward a request to bs->next without re-validation (format drivers). */
static inline int blk_forward(struct blk_node *bs, struct blk_request *req)
{
	return bs->next->drv->submit(bs->next, req);
}
/* Same, with req->offset moved up by delta for the child; the core moves it
 * back before the submitter's callback runs. */
int blk_forward_shift(struct blk_node *bs, struct blk_request *req, uint64_t delta);

/* The request owning a driver context (req->drv.bytes). */
static inline struct blk_request *blk_req_from_drv(void *ctx)
{
	return (struct blk_request *)((char *)ctx - offsetof(struct blk_request, drv));
}

static inline uint64_t blk_size(const struct blk_node *bs) { return bs->size; }
bool blk_can_discard(struct blk_node *bs);      /* discard really deallocates */
bool blk_can_write_zeroes(struct blk_node *bs); /* without writing zero buffers */
bool blk_can_fua(struct blk_node *bs);          /* without a flush */
bool blk_can_multi_conn(struct blk_node *bs);
/* Synchronous, main thread, no request in flight. -EROFS, -ENOTSUP. */
int blk_truncate(struct blk_node *bs, uint64_t size);

/* Sum the per-thread statistics. */
void blk_get_stats(const struct blk_node *bs, struct blk_stats *out);
const char *blk_op_name(enum blk_op op);

/* Per-thread driver state helper: returns bs->thread_state[idx] creating it
 * with ctor on first use (NULL on failure). */
void *blk_thread_state(struct blk_node *bs, struct loop *loop,
                       void *(*ctor)(struct blk_node *bs, struct loop *loop));

/* Synchronous helpers for tools and tests: run the current loop until the
 * request completes. Must be called from a loop thread, outside a callback. */
int blk_pread(struct blk_node *bs, uint64_t offset, void *buf, uint64_t len);
int blk_pwrite(struct blk_node *bs, uint64_t offset, const void *buf, uint64_t len, uint32_t flags);
int blk_flush_sync(struct blk_node *bs);
int blk_do_sync(struct blk_node *bs, struct blk_request *req);

/* Open an image path (file.c): open(2) with flags plus O_NONBLOCK, O_NOCTTY
 * and O_CLOEXEC, keep only a regular file or a block device (checked with
 * fstat on the open fd, O_NONBLOCK cleared again), so that a FIFO, socket,
 * directory or character device is refused at once instead of blocking or
 * being read. Returns the fd, or -errno with a message naming the path and
 * what it is in err (-EINVAL: not a regular file or block device). */
int blk_file_open(const char *path, int flags, mode_t mode, char *err, size_t errlen);

/* Format probing (probe.c), for every format qemu-img probes: the format
 * that a file's first bytes (head), last 512 bytes (tail, may be NULL) and
 * name (may be NULL) say it is: "qcow2", "qcow", "qed", "vmdk", "vdi",
 * "vhdx", "vpc", "parallels", "cloop", "bochs", "luks", "dmg" or "raw". */
const char *blk_probe_buf(const uint8_t *head, size_t n, const uint8_t *tail, size_t tn,
			  const char *filename);
/* Probe the image at path (opened with blk_file_open): 0 and *fmt, or
 * -errno and a message in err. */
int blk_probe_file(const char *path, const char **fmt, char *err, size_t errlen);
/* Same, and -ENOTSUP with a message naming the format if it is one that
 * blk_open cannot open. */
int blk_probe_format(const char *path, const char **fmt, char *err, size_t errlen);
bool blk_format_supported(const char *fmt); /* raw, qcow2 */
/* Log, for a writable node opened x-probed=on, that it was probed and what
 * that restricts (callers, once the open succeeded). */
void blk_probe_warn(const struct blk_node *bs, const char *path);

/* Aligned buffer allocation (free with free()). */
void *blk_alloc_buf(struct blk_node *bs, size_t len);
/* Image creation: on XFS, give the (still empty) file at fd an extent size
 * hint of `bytes`, so that scattered first writes allocate whole extents
 * instead of fragmenting the file (qemu-img does the same, 1 MiB by
 * default). Other file systems: nothing. 0 or -errno. */
int blk_file_extent_hint(int fd, uint32_t bytes);
#define BLK_EXTENT_HINT_DEFAULT (1u << 20) /* qemu-img's default */

/* Request pool: a free list owned by one thread. */
struct blk_req_pool {
	struct blk_request *reqs;
	void **free_list;
	unsigned n, nfree;
};
int blk_req_pool_init(struct blk_req_pool *p, unsigned n);
void blk_req_pool_destroy(struct blk_req_pool *p);
static inline struct blk_request *blk_req_get(struct blk_req_pool *p)
{
	return p->nfree ? (struct blk_request *)p->free_list[--p->nfree] : NULL;
}
static inline void blk_req_put(struct blk_req_pool *p, struct blk_request *r)
{
	p->free_list[p->nfree++] = r;
}

#endif
