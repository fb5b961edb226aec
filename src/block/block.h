/* Block layer, the side of those who open nodes and submit requests
 * (exports, tools, jobs). Drivers include block-driver.h as well.
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

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#include "loop/loop.h"

struct blk_node;
struct blk_driver;
struct blk_dirty_bitmap;
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
#define BLK_F_FUA (1u << 0)       /* write/write-zeroes: durable on completion */
#define BLK_F_MAY_UNMAP (1u << 1) /* write-zeroes: may deallocate */
/* write-zeroes: fail with -ENOTSUP rather than write zero buffers */
#define BLK_F_NO_FALLBACK (1u << 2)
/* block-status: only BLK_STATUS_ALLOCATED is asked for (a job's walk of a
 * chain, as QEMU's bdrv_is_allocated): a driver may then report one run
 * across changes of the other bits and of the host offset, and leaves
 * those bits out. */
#define BLK_F_ALLOC_ONLY (1u << 3)
#define BLK_F__ALL (BLK_F_FUA | BLK_F_MAY_UNMAP | BLK_F_NO_FALLBACK | BLK_F_ALLOC_ONLY)

/* Block-status result bits */
#define BLK_STATUS_DATA (1u << 0)         /* range holds data (not known to be a hole) */
#define BLK_STATUS_ZERO (1u << 1)         /* range reads as zeroes */
#define BLK_STATUS_ALLOCATED (1u << 2)    /* allocated in this layer (not from a backing file) */
#define BLK_STATUS_OFFSET_VALID (1u << 3) /* status_offset holds the host offset of `offset` */

/* Bytes of per-request driver context (see block-driver.h). */
#define BLK_DRV_CTX_SIZE 160

/* Permissions on an image, QEMU's bits: the file driver turns them into the
 * lock bytes QEMU's file driver uses, so that QEMU and ioplane see each
 * other (file-lock.c). A node "holds" the permissions its users need and
 * "shares" those it lets other users (in this or another process) have. */
#define BLK_PERM_CONSISTENT_READ (1u << 0) /* reads see what was written */
#define BLK_PERM_WRITE (1u << 1)
#define BLK_PERM_WRITE_UNCHANGED (1u << 2) /* writes that do not change the data */
#define BLK_PERM_RESIZE (1u << 3)
#define BLK_PERM_ALL 0xfu
#define BLK_PERM_COUNT 4

/* The core's own part of a request (block.c, align.c, stats.c): set by
 * blk_submit(), never read or written by the submitter or a driver.
 * Owned by the thread of req->loop, except the overlap-list links. */
struct blk_req_core {
	struct blk_node *node; /* the node the request was submitted to */
	struct blk_stats *st;  /* node's statistics slot for req->loop */
	uint64_t start_tsc;
	uint64_t shift; /* offset added by blk_forward_shift(), undone on completion */
	int ret;        /* result kept for a deferred completion */
	uint16_t flags; /* BLK_CORE_* (block-int.h); 0 on the fast path */
	uint8_t saved_op;
	uint8_t saved_flags; /* with saved_op: the submitter's flags */
	union {
		struct loop_defer defer; /* deferred completion */
		struct loop_msg wake;    /* resume after waiting for an overlapping request */
	};
	struct blk_request *parent; /* internal child: the request it works for */
	void *slow;                 /* alignment slow-path state (align.c) */
	/* Overlap tracking (align > 1 only): protected by the mutex of the
	 * node's overlap list (struct blk_track, block-int.h). */
	struct blk_request *track_next, *track_prev;
	uint64_t track_lo, track_hi;
	bool serialising, waiting;
};

struct blk_request {
	/* Set by the submitter. */
	uint8_t op;        /* enum blk_op */
	uint32_t flags;    /* BLK_F_* */
	uint64_t offset;   /* bytes */
	uint64_t len;      /* bytes; read/write: must equal the iovec's total */
	struct iovec *iov; /* read/write only */
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

	/* Set by blk_submit(): the loop the request runs on (its callback too).
	 * Drivers read it. */
	struct loop *loop;
	struct blk_req_core core; /* not the submitter's, not the driver's */

	/* Per-request context of the driver that executes the request
	 * (block-driver.h): inline, so that no request allocates. */
	union {
		unsigned char bytes[BLK_DRV_CTX_SIZE];
		uint64_t u64;
		void *ptr;
	} drv;
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
	/* throttle filter nodes: requests that waited for the group's
	 * limits, and the time they waited in all */
	uint64_t throttle_waits, throttle_wait_ns;
};

#define BLK_DETECT_ZEROES_OFF 0
#define BLK_DETECT_ZEROES_ON 1
#define BLK_DETECT_ZEROES_UNMAP 2

/* Child roles (static strings; compare with strcmp). */
#define BLK_ROLE_FILE "file"           /* the node a format driver forwards to */
#define BLK_ROLE_BACKING "backing"     /* qcow2: unallocated clusters read from here */
#define BLK_ROLE_DATA_FILE "data-file" /* qcow2: guest data outside the image file */
#define BLK_ROLE_TARGET "target"       /* copy-before-write: where old data goes */
#define BLK_MAX_CHILDREN 4

struct blk_child {
	const char *role;      /* BLK_ROLE_* */
	struct blk_node *node; /* owned by the parent: closed with it */
};

/* A node. Users read size, read_only, align, mem_align and the has_*
 * capabilities; everything else is the core's and the driver's. */
struct blk_node {
	const struct blk_driver *drv;
	/* The `file` child (NULL: none), cached so that forwarding a request
	 * costs one load. */
	struct blk_node *next;
	/* Drains holding this node (graph.c, drain.c): written by the main
	 * thread, read by every submitting thread (relaxed; a message to each
	 * thread orders it, see drain.c). Non-zero: blk_submit() queues. */
	atomic_uint quiesce;
	/* Every child, `file` first. Changed on the main thread only, at open
	 * (blk_add_child) and while no request is in flight. */
	struct blk_child children[BLK_MAX_CHILDREN];
	unsigned nchildren;
	char *name;    /* node-name (graph.h), unique */
	void *opaque;  /* driver state */
	uint64_t size; /* bytes */
	/* The core only hands the driver requests whose offset, length and
	 * iovec segment lengths are multiples of align and whose buffer
	 * addresses are multiples of mem_align (Linux O_DIRECT rules). */
	uint32_t align;        /* request alignment: offset and length (>= 1) */
	uint32_t mem_align;    /* buffer address alignment (>= 1) */
	uint32_t max_transfer; /* 0: unlimited; advisory, the core does not split */
	bool read_only;
	bool discard_ignore; /* discard=ignore: succeed without doing anything */
	bool no_flush;       /* no-flush=on (cache.no-flush): flushes succeed at once */
	/* detect-zeroes=on|unmap: a write of zeroes becomes a write-zeroes
	 * (unmap: that may deallocate, with discard=unmap). */
	uint8_t detect_zeroes; /* BLK_DETECT_ZEROES_* */
	bool write_slow;       /* read_only || detect_zeroes: writes leave the fast path */
	/* Capabilities, cached by blk_open() from the driver's probes. */
	bool has_fua, has_discard, has_write_zeroes, has_block_status;
	/* Dirty bitmaps (struct blk_dirty_bitmap list, block/dirty-bitmap.h):
	 * changed by the main thread while the node is drained (or before it
	 * serves), read by every submitting thread. NULL: writes pay one
	 * branch. */
	struct blk_dirty_bitmap *dirty_bitmaps;
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

	/* Overlap list for the alignment slow path (only when align > 1):
	 * struct blk_track (block-int.h), used by align.c, with its own mutex. Set at
	 * open, freed at close. */
	void *track;

	/* The graph (graph.c), main thread only: every node is on the
	 * registry's list; refcnt counts the owner (opener or monitor), each
	 * parent (nparents) and each other user (users, struct blk_users). */
	struct blk_node *graph_prev, *graph_next;
	unsigned refcnt, nparents;
	bool monitor_owned;
	void *users;             /* struct blk_users (graph.c) */
	void *resize_notifiers;  /* struct blk_notifier list (graph.c) */
	void *replace_notifiers; /* struct blk_notifier list (graph.c) */
	/* The loop of each thread that ever submitted to this node (so that a
	 * drain knows whom to ask): set by that thread, read by the main
	 * thread (seq_cst, paired with quiesce), cleared by blk_detach_loop. */
	_Atomic(struct loop *) loops[LOOP_MAX_THREADS];
};

/* Register the built-in drivers (start-up, main thread): null, raw, file,
 * qcow2, throttle, once however often this is called; blk_open() calls it. */
void blk_register_builtin_drivers(void);

/* Open a node stack from options:
 *   driver=file,filename=PATH[,cache=none|writeback][,aio=io_uring|native|threads]
 *   driver=null,size=SIZE[,read-zeroes=on][,latency-ns=NS][,mode=timer|threads]
 *   driver=nbd,{filename=URI|server.type=unix,server.path=P|server.type=inet,
 *     server.host=H[,server.port=N]}[,export=NAME][,reconnect-delay=S][,connections=N]
 *   format=raw|...: a format node on top of the protocol node ([,offset=..,size=..])
 *     raw: x-probed=on when the tool guessed the format (see raw.c)
 *   read-only=on, discard=unmap|ignore, no-flush=on, detect-zeroes=off|on|unmap,
 *   request-alignment=N (testing),
 *   force-share=on (read-only only: share every permission, take no lock that
 *   keeps others out), x-no-io=on (qemu-img info's open: no consistent read
 *   on metadata), file: locking=on|off|auto
 * Options not consumed by anyone are an error. */
int blk_open(struct kv_opts *opts, struct blk_node **out, char *err, size_t errlen);
/* Open one node of driver `driver` (a format on `file`, or a protocol
 * driver when file is NULL) with the children in extra (roles backing,
 * data-file; the driver uses them instead of opening its own) and the
 * options above that are not about the stack (no format=). The
 * references to file and the extra children are the new node's on
 * success and dropped on failure. Main thread. */
int blk_open_node(const char *driver, struct blk_node *file, const struct blk_child *extra,
		  unsigned nextra, struct kv_opts *opts, struct blk_node **out, char *err,
		  size_t errlen);
/* Open a TARGET as `ioplane bench`/`img` take it: a path, a remote image
 * (nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH), or
 * "null:size=SIZE[,...]" ; fmt may be NULL (raw). extra: more options (may be NULL). */
int blk_open_target(const char *target, const char *fmt, const char *extra, struct blk_node **out,
		    char *err, size_t errlen);
/* The driver a remote TARGET names ("nbd"), or NULL for a file or null:. */
const char *blk_target_remote(const char *target);
/* Set driver= (and filename= or the null driver's options) for TARGET. */
int blk_target_opts(struct kv_opts *o, const char *target);
/* Permissions (perm.c): the users of root node bs now hold perm and share
 * shared (BLK_PERM_*); every node below gets what its parent's driver says
 * it needs, and file nodes lock accordingly. All or nothing: on a conflict
 * with another user of an image (-EBUSY, with a message naming the image
 * and the permission) or an error, every node keeps its previous locks.
 * WRITE or RESIZE on a read-only node: -EROFS. Main thread. */
int blk_set_perm(struct blk_node *bs, uint32_t perm, uint32_t shared, char *err, size_t errlen);

/* Close bs: its driver's close(), then every child (recursively), then the
 * node itself. Drivers never close their children. NULL: nothing. */
void blk_close(struct blk_node *bs);
/* Tell every driver in the graph under bs that `loop` is going away
 * (detach_loop), from the loop's own thread. */
void blk_detach_loop(struct blk_node *bs, struct loop *loop);

/* The graph (main thread). The child with that role, or NULL. */
struct blk_node *blk_child(const struct blk_node *bs, const char *role);
/* Call fn on bs and on every node below it, parents first; stops at the
 * first non-zero return, which it returns. */
int blk_walk(struct blk_node *bs, int (*fn)(struct blk_node *bs, void *opaque), void *opaque);
/* Flush bs and every writable node below it (a shutdown or close flush):
 * the first error, or 0. Synchronous, like blk_flush_sync_ungated(): also
 * while the caller holds a drain of bs (a transaction whose earlier action
 * drained the node). */
int blk_flush_tree_sync(struct blk_node *bs);

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
/* The same for a request a driver sends to a child while it works for a
 * request already in flight: never held back by a drain (it would wait for
 * itself). */
int blk_submit_child(struct blk_node *bs, struct blk_request *req);

static inline uint64_t blk_size(const struct blk_node *bs)
{
	return bs->size;
}
bool blk_can_discard(struct blk_node *bs);      /* discard really deallocates */
bool blk_can_write_zeroes(struct blk_node *bs); /* without writing zero buffers */
bool blk_can_fua(struct blk_node *bs);          /* without a flush */
bool blk_can_multi_conn(struct blk_node *bs);
/* Synchronous, main thread, no request in flight. -EROFS, -ENOTSUP. */
int blk_truncate(struct blk_node *bs, uint64_t size);

/* Sum the per-thread statistics. */
void blk_get_stats(const struct blk_node *bs, struct blk_stats *out);
const char *blk_op_name(enum blk_op op);

/* Synchronous helpers for tools and tests: run the current loop until the
 * request completes. Must be called from a loop thread, outside a callback. */
int blk_pread(struct blk_node *bs, uint64_t offset, void *buf, uint64_t len);
int blk_pwrite(struct blk_node *bs, uint64_t offset, const void *buf, uint64_t len, uint32_t flags);
int blk_flush_sync(struct blk_node *bs);
/* The same past a drain of bs: the control plane's own flush inside a drain
 * it holds (QEMU flushes drained nodes too), which blk_flush_sync would
 * wait for forever. */
int blk_flush_sync_ungated(struct blk_node *bs);
int blk_do_sync(struct blk_node *bs, struct blk_request *req);

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

/* Image files (opening a path safely, creating one, the XFS extent size
 * hint) are the file driver's: block/file.h, which the image tool reaches
 * through here. */
#include "block/file.h"

#endif
