/* qcow2 driver internals shared by the files of src/block/qcow2/.
 *
 * THREADING RULE (whole driver). A qcow2 node serves requests from several
 * loops. Shared state is protected in two layers:
 *  - s->lock (a pthread mutex) protects the cache structures (hash, slots,
 *    slice contents), the in-flight allocation list and the small counters.
 *    It is held only for a few hundred instructions and never across a yield.
 *    The allocated-read fast path takes only this lock.
 *  - s->meta (a coroutine mutex) serialises every metadata operation that
 *    needs I/O: loading or writing back slices, allocating clusters, updating
 *    L1/L2/refcounts, flush. Slice contents are modified only with both held,
 *    so a holder of meta may read them without s->lock.
 * Data I/O runs with neither held. Requests that must wait run in coroutines
 * (one per slow request, from the per-thread pool) on the submitting loop; a
 * waiter on another loop is woken by a loop message to its own loop. */
#ifndef IOPLANE_QCOW2_INT_H
#define IOPLANE_QCOW2_INT_H

#include <endian.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "block/block-driver.h"
#include "block/qcow2/qcow2.h"
#include "loop/coroutine.h"
#include "loop/loop.h"

#define QC_MAGIC 0x514649fbu

/* Limits (the same as QEMU's, so that every image QEMU opens opens here and
 * a hostile header cannot make us allocate more). */
#define QC_MIN_CLUSTER_BITS 9
#define QC_MAX_CLUSTER_BITS 21
#define QC_MAX_L1_BYTES (32u << 20)
#define QC_MAX_RCT_BYTES (8u << 20)
#define QC_MAX_SNAPSHOTS 65536
#define QC_MAX_SNAPSHOTS_BYTES (1024u * QC_MAX_SNAPSHOTS)
#define QC_MAX_BACKING_NAME 1023
#define QC_MAX_BITMAPS 65535
#define QC_MAX_BITMAP_DIR_BYTES (64u << 20)
#define QC_MAX_CHAIN 64

/* Header feature bits. */
#define QC_INCOMPAT_DIRTY (1ull << 0)
#define QC_INCOMPAT_CORRUPT (1ull << 1)
#define QC_INCOMPAT_DATA_FILE (1ull << 2)
#define QC_INCOMPAT_COMPRESSION (1ull << 3)
#define QC_INCOMPAT_EXTL2 (1ull << 4)
#define QC_INCOMPAT_KNOWN 0x1full
#define QC_COMPAT_LAZY (1ull << 0)
#define QC_AUTOCLEAR_BITMAPS (1ull << 0)
#define QC_AUTOCLEAR_DATA_RAW (1ull << 1)
#define QC_AUTOCLEAR_KNOWN (QC_AUTOCLEAR_BITMAPS | QC_AUTOCLEAR_DATA_RAW)

/* Header extensions. */
#define QC_EXT_END 0x00000000u
#define QC_EXT_BACKING_FMT 0xe2792acau
#define QC_EXT_FEATURES 0x6803f857u
#define QC_EXT_BITMAPS 0x23852875u
#define QC_EXT_CRYPTO 0x0537be77u
#define QC_EXT_DATA_FILE 0x44415441u

/* L1 / L2 entries. */
#define QC_OFLAG_COPIED (1ull << 63)
#define QC_OFLAG_COMPRESSED (1ull << 62)
#define QC_OFLAG_ZERO (1ull << 0)
#define QC_OFFSET_MASK 0x00fffffffffffe00ull
#define QC_L1E_RESERVED 0x7f000000000001ffull
#define QC_L2E_RESERVED 0x3f000000000001feull
#define QC_RCT_RESERVED 0x1ffull

/* Classification of the part of a guest cluster (or subcluster run). */
enum qc_kind {
	QC_UNALLOC = 0, /* read from the backing file or zeroes */
	QC_ZERO,        /* reads as zeroes (flag or subcluster bits) */
	QC_NORMAL,      /* data at host offset */
	QC_COMPRESSED,
};

struct qc_header {
	uint32_t version;
	uint64_t backing_file_offset;
	uint32_t backing_file_size;
	uint32_t cluster_bits;
	uint64_t size;
	uint32_t crypt_method;
	uint32_t l1_size;
	uint64_t l1_table_offset;
	uint64_t refcount_table_offset;
	uint32_t refcount_table_clusters;
	uint32_t nb_snapshots;
	uint64_t snapshots_offset;
	uint64_t incompat, compat, autoclear;
	uint32_t refcount_order;
	uint32_t header_length;
	uint8_t compression_type;
};

struct qc_snapshot {
	uint64_t l1_offset;
	uint32_t l1_size;
	char *id, *name;
	uint32_t date_sec, date_nsec;
	uint64_t vm_clock_nsec, vm_state_size, disk_size, icount;
};

/* ---- metadata overlap (overlap.c) ---- */

/* Host cluster c (key c + 1; 0: empty): how many active L1 entries name it
 * (l2), how many refcount table entries (rbf bits 0-23, saturating), and
 * which fixed structures it holds (rbf bits 24-31: QC_OL_HEADER, _L1,
 * _RCT, _SNAPT, _BMDIR). */
struct qc_mslot {
	uint64_t key;
	uint32_t l2, rbf;
};

#define QC_MSLOT_RB 0xffffffu

/* Open addressing with linear probing; capacity mask + 1, a power of two
 * (v NULL: empty). */
struct qc_mset {
	struct qc_mslot *v;
	uint64_t mask, n;
	unsigned shift; /* 64 - log2(capacity) */
};

struct qc_range {
	uint64_t start, end;
};

/* ---- coroutine waiting (io.c) ---- */

struct qc_waiter {
	struct loop_msg msg;
	struct coroutine *co;
	struct loop *loop;
	struct qc_waiter *next;
};

struct qc_waitq {
	struct qc_waiter *head, *tail;
};

/* Which file a path names (backing.c: loops in a chain). */
struct qc_file_id {
	dev_t dev;
	ino_t ino;
	bool valid;
};
bool qc_file_id(const char *path, struct qc_file_id *id);

struct qc_comutex {
	bool locked;
	struct qc_waitq q;
};

/* A group of child requests issued by one coroutine and waited for together. */
struct qc_batch {
	struct coroutine *co;
	unsigned pending;
	int ret;
	bool waiting;
};

struct qc_child {
	struct blk_request req;
	struct qc_batch *b;
	struct iovec iov1;
};

/* ---- metadata cache (cache.c) ---- */

struct qc_slot {
	uint64_t key;  /* host offset of the slice; 0: unused */
	uint8_t *data; /* slice bytes as on disk (big endian) */
	struct qc_slot *hnext;
	bool ref; /* CLOCK reference bit */
	bool dirty;
};

struct qc_cache {
	const char *name;
	struct qc_slot *slots;
	unsigned nslots;
	struct qc_slot **hash;
	unsigned hmask;
	unsigned slice_bits; /* slice size = 1 << slice_bits */
	unsigned hand;
	unsigned ndirty;
	uint64_t hits, misses;
};

/* An allocating write (or subcluster fill) in flight on guest clusters
 * [gc, gc + n): on the coroutine's stack, linked in s->allocs under s->lock.
 * Other requests touching those clusters wait on `waiters`. */
struct qc_alloc {
	uint64_t gc, n;
	struct qc_alloc *next;
	struct qc_waitq waiters;
	/* Merging: when the new clusters read as zero and the allocating write
	 * writes nothing but its data, other writes into them "join": they
	 * write their data to `host` at once and complete once the L2 entries
	 * are linked, instead of waiting and allocating again. */
	uint64_t host; /* host offset of cluster gc (set before register) */
	bool joinable; /* set before register */
	bool linked;   /* lock: the allocation is finished (link_ret) */
	int link_ret;
	unsigned joiners;      /* lock */
	struct qc_waitq drain; /* the allocator waiting for joiners */
};

/* A refcount decrement waiting until the metadata that dropped the reference
 * is on disk (and, for freed clusters, until writes that might still target
 * them are done). */
struct qc_decref {
	uint64_t off; /* host offset (cluster aligned) */
	uint64_t n;   /* clusters */
	bool discard; /* punch the range if the cluster becomes free */
};

struct qc_decref_list {
	struct qc_decref *v;
	size_t n, cap;
};

enum qc_cow_mode {
	QC_COW_AUTO = 0,
	QC_COW_WRITE_ZEROES,
	QC_COW_BUFFERS,
};

struct qc_state {
	struct blk_node *bs;
	struct blk_node *file;    /* bs->next: the image file */
	struct blk_node *data;    /* where guest data lives: file or external data file */
	struct blk_node *backing; /* NULL: none */
	uint64_t backing_size;
	char *image_path; /* filename option of the protocol node (may be NULL) */
	char *backing_name, *backing_fmt, *data_name;
	bool data_external, data_raw;
	struct qc_file_id data_id; /* the external data file (main thread, open) */

	struct qc_header h;
	uint8_t *hdr_cluster; /* the first cluster as read (for info/extensions) */
	unsigned nb_bitmaps;
	uint64_t bmdir_offset, bmdir_bytes; /* bitmap directory (0: none or ignored) */
	bool bm_owned; /* open read-write: the bitmaps on disk are marked in use (bitmap.c) */
	uint64_t open_incompat; /* incompatible features as found at open */

	/* Geometry (read-only after open). */
	unsigned cluster_bits;
	uint64_t cluster_size;
	bool ext_l2;
	unsigned l2_entry_bytes; /* 8 or 16 */
	unsigned l2_bits;        /* log2 entries per L2 table */
	unsigned sc_bits;        /* log2 subcluster size (== cluster_bits without ext_l2) */
	unsigned rc_order;       /* refcount_bits = 1 << rc_order */
	unsigned rb_bits;        /* log2 refcount entries per block */
	uint64_t rc_max;
	int comp_type;

	/* Tables kept whole in memory, host endian. Modified under meta (+lock
	 * for l1, which the fast path reads). */
	uint64_t *l1;
	uint32_t l1_size;
	uint64_t l1_offset;
	uint8_t *l1_dirty; /* one flag per QC_TABLE_CHUNK entries */
	uint64_t *rct;
	uint64_t rct_size; /* entries */
	uint64_t rct_used; /* entries from here on are zero */
	uint64_t rct_offset;
	uint8_t *rct_dirty; /* one flag per QC_TABLE_CHUNK entries */

	struct qc_cache l2c, rbc;

	struct qc_snapshot *snaps;
	uint32_t nsnaps;
	uint64_t snap_offset, snap_bytes; /* the snapshot table */

	/* Overlap checks (overlap.c): L2 tables of the active L1 and refcount
	 * blocks (changed under lock, with meta held), the snapshots' L1
	 * tables (built at open, then read-only). */
	struct qc_mset mset;
	struct qc_range *snap_l1r;
	uint32_t nsnap_l1r;

	pthread_mutex_t lock;
	struct qc_comutex meta;
	struct qc_alloc *allocs; /* lock */

	/* meta */
	uint64_t free_index;            /* first cluster that may be free */
	uint64_t run_hint;              /* where the next multi-cluster search starts */
	uint64_t file_size;             /* size of s->file as we made it */
	uint64_t data_size;             /* same for an external data file */
	uint64_t open_file_size;        /* at open: the file is not shrunk below it */
	uint64_t fresh_from;            /* host bytes at/after this read as zero and are unused */
	uint64_t alloc_end;             /* end of the highest cluster with a refcount */
	uint64_t comp_next;             /* next byte for compressed data (0: none) */
	bool rc_garbage_seen;           /* a refcount past alloc_end was found (logged once) */
	bool hdr_dirty_set;             /* dirty bit written to disk */
	bool metadata_changed;          /* something to flush */
	struct qc_decref_list dec_new;  /* references dropped in memory, not yet on disk */
	struct qc_decref_list dec_wait; /* on disk; waiting for writes of epoch dec_epoch */
	unsigned dec_epoch;

	/* Writes in flight per epoch parity; epoch under lock, counts atomic. */
	unsigned wr_epoch;
	int64_t wr_count[2];

	uint64_t fwd_limit;        /* lock: the fast paths stay below this byte of s->data */
	bool fast_fwd;             /* reads may be forwarded to s->file as they are */
	bool fast_write;           /* writes may skip the coroutine */
	enum qc_cow_mode cow_mode; /* resolved: WRITE_ZEROES or BUFFERS */
	bool grow_alloc;           /* allocate (unwritten) when growing the file */
	uint8_t *zero_buf;         /* cluster_size bytes of zeroes (never written) */
	uint64_t data_fresh_from;  /* external data file: bytes past this read as zero */
	bool lazy;
	bool corrupt; /* set atomically (qc_corrupt); read by qc_submit */
	bool repair;  /* opened with repair=on (for qcow2_check); set at open */
	bool read_only;
	uint64_t cache_l2_bytes;
	char fs_name[16];
};

static inline struct qc_state *qc_state(struct blk_node *bs)
{
	return (struct qc_state *)bs->opaque;
}

/* ---- geometry helpers ---- */

static inline uint64_t qc_l2_entries(const struct qc_state *s)
{
	return 1ull << s->l2_bits;
}
static inline uint64_t qc_gcluster(const struct qc_state *s, uint64_t off)
{
	return off >> s->cluster_bits;
}
static inline uint64_t qc_coff(const struct qc_state *s, uint64_t off)
{
	return off & (s->cluster_size - 1);
}
static inline uint64_t qc_align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) & ~(a - 1);
}
static inline uint64_t qc_align_down(uint64_t x, uint64_t a)
{
	return x & ~(a - 1);
}
static inline uint32_t qc_rd32(const uint8_t *p)
{
	uint32_t v;
	__builtin_memcpy(&v, p, 4);
	return be32toh(v);
}
static inline uint64_t qc_rd64(const uint8_t *p)
{
	uint64_t v;
	__builtin_memcpy(&v, p, 8);
	return be64toh(v);
}
static inline uint16_t qc_rd16(const uint8_t *p)
{
	uint16_t v;
	__builtin_memcpy(&v, p, 2);
	return be16toh(v);
}
static inline void qc_wr32(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	__builtin_memcpy(p, &v, 4);
}
static inline void qc_wr64(uint8_t *p, uint64_t v)
{
	v = htobe64(v);
	__builtin_memcpy(p, &v, 8);
}
static inline void qc_wr16(uint8_t *p, uint16_t v)
{
	v = htobe16(v);
	__builtin_memcpy(p, &v, 2);
}

/* Compressed descriptor: host offset and byte length (to the end of the last
 * sector). */
static inline void qc_comp_desc(const struct qc_state *s, uint64_t e, uint64_t *off, uint64_t *len)
{
	unsigned x = 62 - (s->cluster_bits - 8);
	uint64_t nsect = (e >> x) & ((1ull << (s->cluster_bits - 8)) - 1);

	*off = e & ((1ull << x) - 1);
	*len = (nsect + 1) * 512 - (*off & 511);
}

/* ---- io.c: coroutine helpers ---- */
void qc_wait(struct qc_state *s, struct qc_waitq *q); /* lock held; coroutine */
void qc_wake_all(struct qc_waitq *q);                 /* lock held */
void qc_co_lock(struct qc_state *s, struct qc_comutex *m);
void qc_co_unlock(struct qc_state *s, struct qc_comutex *m);
void qc_batch_init(struct qc_batch *b);
/* Submit a child on node; on failure the error is recorded in b. */
void qc_batch_add(struct qc_batch *b, struct qc_child *c, struct blk_node *node, uint8_t op,
		  uint64_t off, struct iovec *iov, int iovcnt, uint64_t len, uint32_t flags);
int qc_batch_wait(struct qc_batch *b);
int qc_co_pread(struct blk_node *node, uint64_t off, void *buf, uint64_t len);
int qc_co_pread_clamped(struct blk_node *node, uint64_t off, void *buf, uint64_t len);
int qc_co_pwrite(struct blk_node *node, uint64_t off, const void *buf, uint64_t len);
int qc_co_op(struct blk_node *node, uint8_t op, uint64_t off, uint64_t len, uint32_t flags);
/* One child read or write of [off, off+len) of node, with the bytes at
 * iov_off of iov: 0 or -errno (-EINVAL: iov is shorter). */
int qc_co_rw_iov(struct blk_node *node, uint8_t op, uint64_t off, uint64_t len,
		 const struct iovec *iov, int iovcnt, size_t iov_off);
int qc_co_flush(struct blk_node *node);
/* Run fn(arg) in a coroutine on the current loop, running the loop until it
 * is done, and return its result: for open, close, truncate and the tool
 * API. From inside a coroutine, fn runs at once; without a loop, -EINVAL. */
int qc_run_sync(int (*fn)(void *arg), void *arg);
/* Run a blocking function on the thread pool from a coroutine. */
int qc_co_blocking(int (*fn)(void *arg), void *arg);
void *qc_alloc_buf(size_t len); /* 4 KiB aligned, NULL on failure */

/* ---- header.c ---- */
int qc_header_read(struct qc_state *s, char *err, size_t errlen);
int qc_header_parse(struct qc_state *s, const uint8_t *buf, size_t len, uint64_t file_size,
		    char *err, size_t errlen);
int qc_header_write_features(struct qc_state *s, uint64_t incompat, uint64_t autoclear);
int qc_header_write_field(struct qc_state *s, unsigned off, const void *val, unsigned len);
int qc_header_mark_dirty(struct qc_state *s);
int qc_header_mark_clean(struct qc_state *s);
/* The header names backing file name in format fmt (NULL, NULL: none),
 * written in one write of the header cluster and flushed. -ENOSPC when
 * it does not fit. Coroutine, metadata lock held or no request in flight. */
int qc_header_set_backing(struct qc_state *s, const char *name, const char *fmt);
int qc_header_set_bitmaps(struct qc_state *s, unsigned count, uint64_t len, uint64_t off);
void qc_header_free(struct qc_state *s);

/* ---- overlap.c ---- */

/* Metadata kinds for qc_meta_overlap (meta held, or lock, or open). The
 * fixed ones cost a comparison each, the snapshots' L1 tables a binary
 * search, L2 tables and refcount blocks a hash lookup per cluster. */
#define QC_OL_HEADER (1u << 0)
#define QC_OL_L1 (1u << 1)
#define QC_OL_RCT (1u << 2)
#define QC_OL_SNAPT (1u << 3)
#define QC_OL_SNAP_L1 (1u << 4) /* L1 tables of snapshots */
#define QC_OL_L2 (1u << 5)      /* L2 tables of the active L1 */
#define QC_OL_RB (1u << 6)      /* refcount blocks */
#define QC_OL_BMDIR (1u << 7)   /* bitmap directory */
#define QC_OL_FIXED (QC_OL_HEADER | QC_OL_L1 | QC_OL_RCT | QC_OL_SNAPT | QC_OL_BMDIR)
#define QC_OL_ALL 0xffu
/* True if [off, off+len) overlaps metadata of a kind in `which`; buf names
 * the first structure found and where it is. */
bool qc_meta_overlap(const struct qc_state *s, unsigned which, uint64_t off, uint64_t len,
		     char *buf, size_t buflen);
/* Header cluster, L1 table, refcount table, snapshot table, bitmap
 * directory: the same as QC_OL_FIXED without a description. */
bool qc_overlaps_fixed(const struct qc_state *s, uint64_t off, uint64_t len);
int qc_meta_build(struct qc_state *s, char *err, size_t errlen);
void qc_meta_free(struct qc_state *s);
/* The clusters of [off, off+len) hold (no longer hold) metadata of one kind:
 * lock held. Adding may fail (-ENOMEM); the set is then unchanged or holds
 * more than it should, which is safe. */
int qc_mset_add(struct qc_state *s, uint64_t off, uint64_t len, unsigned kind);
void qc_mset_del(struct qc_state *s, uint64_t off, uint64_t len, unsigned kind);
bool qc_snap_l1_hit(const struct qc_state *s, uint64_t off, uint64_t len);
/* The slot of cluster c, made (zeroed) if missing: valid until the next
 * call; NULL: out of memory. check.c uses such sets of its own too. */
struct qc_mslot *qc_mset_get(struct qc_mset *m, uint64_t c);
struct qc_mslot *qc_mset_lookup(struct qc_mset *m, uint64_t c); /* NULL: absent */
void qc_mset_free(struct qc_mset *m);

static inline bool qc_ranges_overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen)
{
	return alen && blen && a < b + blen && b < a + alen;
}

static inline uint64_t qc_mset_hash(const struct qc_mset *m, uint64_t key)
{
	return (key * 0x9e3779b97f4a7c15ull) >> m->shift;
}

/* Kinds of metadata host cluster c holds (QC_OL_* bits but SNAP_L1; 0:
 * none). The set is never empty: it has the header. */
static inline unsigned qc_meta_kinds(const struct qc_state *s, uint64_t c)
{
	const struct qc_mset *m = &s->mset;
	const struct qc_mslot *sl;
	uint64_t i;

	for (i = qc_mset_hash(m, c + 1); (sl = &m->v[i])->key; i = (i + 1) & m->mask) {
		if (sl->key == c + 1)
			return (sl->rbf >> 24) | (sl->l2 ? QC_OL_L2 : 0) |
			       (sl->rbf & QC_MSLOT_RB ? QC_OL_RB : 0);
	}
	return 0;
}

/* Does whole-cluster range [off, off+len) hold metadata of a kind in which?
 * One hash lookup per cluster (lock or meta held): the fast paths. */
static inline bool qc_meta_on(const struct qc_state *s, uint64_t off, uint64_t len, unsigned which)
{
	uint64_t c = off >> s->cluster_bits, last = (off + len - 1) >> s->cluster_bits;

	for (; c <= last; c++)
		if (qc_meta_kinds(s, c) & which)
			return true;
	return (which & QC_OL_SNAP_L1) && s->nsnap_l1r && qc_snap_l1_hit(s, off, len);
}

/* An inconsistency found in use (coroutine): logs it, marks the image
 * corrupt (on disk when writable, version 3) and returns -EIO; nothing is
 * written to the image from then on. */
int qc_corrupt(struct qc_state *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- cache.c ---- */
int qc_cache_init(struct qc_cache *c, const char *name, unsigned slice_bits, uint64_t bytes);
void qc_cache_free(struct qc_cache *c);
/* lock held: the slice data or NULL. */
uint8_t *qc_cache_peek(struct qc_cache *c, uint64_t key);
/* meta held, coroutine: the slot (loaded, or zero-filled if fresh), or NULL
 * with *ret set. Valid until the holder's next get on the same cache. */
struct qc_slot *qc_cache_get(struct qc_state *s, struct qc_cache *c, uint64_t key, bool fresh,
			     int *ret);
void qc_cache_mark_dirty(struct qc_state *s, struct qc_cache *c, struct qc_slot *sl);
/* Drop slices in [off, off+len) (freed metadata clusters); meta held. */
void qc_cache_forget(struct qc_state *s, struct qc_cache *c, uint64_t off, uint64_t len);
/* The L1 and refcount tables are written in chunks of QC_TABLE_CHUNK
 * entries (4 KiB), each with a flag in the table's dirty array. Any chunk
 * flagged? Write the flagged chunks of tab (n entries) to the image at
 * off; meta held. */
#define QC_TABLE_CHUNK 512
bool qc_table_is_dirty(const uint8_t *dirty, uint64_t n);
int qc_table_write_dirty(struct qc_state *s, const uint64_t *tab, uint64_t n, uint8_t *dirty,
			 uint64_t off);
/* Write back dirty slices of c (copies taken under the lock); meta held. */
int qc_cache_writeback(struct qc_state *s, struct qc_cache *c);
/* Full metadata writeback with ordering (refcounts, L2, L1); meta held. */
int qc_metadata_writeback(struct qc_state *s, bool data_too);

/* header.c: the bitmap directory, in a coroutine (qcow2_get_bitmaps). */
struct qcow2_bitmap_info;
int qc_bitmaps_read(struct qc_state *s, struct qcow2_bitmap_info **out, unsigned *n, char *err,
		    size_t errlen);

/* bitmap.c: load the bitmaps into the node's dirty bitmaps (marking them
 * in use on disk when writable), and write them back at close (meta held). */
int qc_bitmaps_load(struct qc_state *s, char *err, size_t errlen);
int qc_bitmaps_store(struct qc_state *s);

/* ---- refcount.c ---- */
int qc_rc_get(struct qc_state *s, uint64_t cluster, uint64_t *rc);
int qc_rc_update(struct qc_state *s, uint64_t cluster, int64_t delta);
/* Set the refcount of cluster from rc (what it is) to want. */
int qc_rc_set(struct qc_state *s, uint64_t cluster, uint64_t rc, uint64_t want);
/* Allocate n contiguous clusters; *off host offset; *fresh: known zero. */
int qc_alloc_clusters(struct qc_state *s, uint64_t n, uint64_t *off, bool *fresh);
/* Same, up to *n clusters (at least one); *n is set to what was allocated. */
int qc_alloc_run(struct qc_state *s, uint64_t *n, uint64_t *off, bool *fresh);
/* Allocate len bytes for compressed data (may share a cluster). */
int qc_alloc_bytes(struct qc_state *s, uint64_t len, uint64_t *off);
int qc_grow_file(struct qc_state *s, struct blk_node *node, uint64_t need);
/* Grow a file that ends inside a cluster to the cluster's end (meta held). */
int qc_file_whole(struct qc_state *s);
int qc_rc_init(struct qc_state *s, char *err, size_t errlen);
int qc_rct_write_dirty(struct qc_state *s);
bool qc_rct_is_dirty(const struct qc_state *s);
void qc_decref_add(struct qc_state *s, uint64_t off, uint64_t n, bool discard);
/* After a metadata writeback: move/apply deferred decrements. */
int qc_decref_process(struct qc_state *s);
void qc_wr_begin(struct qc_state *s, unsigned *epoch); /* lock held */
void qc_wr_end(struct qc_state *s, unsigned epoch);
uint64_t qc_rc_get_raw(const struct qc_state *s, const uint8_t *slice, uint64_t idx);
void qc_rc_set_raw(const struct qc_state *s, uint8_t *slice, uint64_t idx, uint64_t v);

/* ---- cluster.c ---- */
/* L2 entry (and bitmap) of guest cluster gc; meta held. Unallocated L2
 * table: entry 0. */
int qc_l2_get(struct qc_state *s, uint64_t gc, uint64_t *entry, uint64_t *bitmap);
/* Same, for writing: makes the L2 table exist and be writable (allocates or
 * copies it). */
int qc_l2_set(struct qc_state *s, uint64_t gc, uint64_t entry, uint64_t bitmap);
int qc_l2_patch(struct qc_state *s, uint64_t l2off, uint64_t idx, uint64_t entry);
/* Classify bytes [coff, coff + len) of a cluster with this entry: returns
 * the kind of the first byte and shrinks *len to the run of that kind. */
enum qc_kind qc_classify(const struct qc_state *s, uint64_t entry, uint64_t bitmap, uint64_t coff,
			 uint64_t *len);
/* Fast path lookup under s->lock: true, with the entry, if its slice is
 * cached (or the L1 entry is empty). */
bool qc_l2_peek(struct qc_state *s, uint64_t gc, uint64_t *entry, uint64_t *bitmap);
/* Why an entry / an L1 entry cannot be used (NULL: it can); buf may hold
 * the answer. which: the metadata kinds (QC_OL_*) the data or the L2 table
 * must not overlap. */
const char *qc_entry_problem(const struct qc_state *s, uint64_t gc, uint64_t entry, uint64_t bitmap,
			     unsigned which, char *buf, size_t len);
const char *qc_l1e_problem(const struct qc_state *s, uint64_t l1e, unsigned which, char *buf,
			   size_t len);
/* Same, as a corruption (qc_corrupt) when it cannot: 0 or -EIO. */
int qc_entry_check(struct qc_state *s, uint64_t gc, uint64_t entry, uint64_t bitmap,
		   unsigned which);
int qc_l1_read(struct qc_state *s, char *err, size_t errlen);
int qc_l1_write_dirty(struct qc_state *s);
int qc_l1_grow(struct qc_state *s, uint64_t min_size);
struct qc_alloc *qc_alloc_find(struct qc_state *s, uint64_t gc, uint64_t n); /* lock held */
void qc_alloc_register(struct qc_state *s, struct qc_alloc *a, uint64_t gc, uint64_t n);
void qc_alloc_unregister(struct qc_state *s, struct qc_alloc *a, int ret);
void qc_alloc_drain(struct qc_state *s, struct qc_alloc *a);
/* meta held: join an allocation covering [off, off+len) of cluster gc;
 * NULL if none can be joined. */
struct qc_alloc *qc_alloc_try_join(struct qc_state *s, uint64_t gc, uint64_t off, uint64_t *host);
int qc_alloc_join_finish(struct qc_state *s, struct qc_alloc *a);
/* meta held: wait (dropping meta) while an allocation overlaps; true if it
 * waited (the entry must be looked up again). */
bool qc_alloc_wait(struct qc_state *s, uint64_t gc, uint64_t n);
/* Drop the reference of an old entry (deferred). */
void qc_entry_release(struct qc_state *s, uint64_t entry, bool discard);

/* ---- cow.c ---- */
int qc_cow_open(struct qc_state *s, const char *mode, char *err, size_t errlen);
/* An allocating write: guest [gstart, gend) goes to host `host` (contiguous);
 * the guest data covers [off, off+len) of it; the head [gstart, off) lies in
 * the first cluster, whose old entry is head_*, the tail [off+len, gend) in
 * the last one (tail_*). fresh: the host range reads as zero already. */
struct qc_cow {
	uint64_t gstart, gend;
	uint64_t host;
	uint64_t head_entry, head_bitmap, tail_entry, tail_bitmap;
	bool fresh;
};
int qc_cow_write(struct qc_state *s, const struct qc_cow *c, uint64_t off, uint64_t len,
		 const struct iovec *iov, int iovcnt, size_t iov_off);
/* True if writing [off, off+len) into c writes nothing else (no COW). */
bool qc_cow_data_only(struct qc_state *s, const struct qc_cow *c, uint64_t off, uint64_t len);

/* ---- compress.c ---- */
int qc_decompress(int type, const void *src, size_t srclen, void *dst, size_t dstlen);
/* Returns compressed length, 0 if it does not shrink, -errno. */
long qc_compress(int type, const void *src, size_t srclen, void *dst, size_t dstlen);

/* ---- backing.c ---- */
int qc_backing_open(struct qc_state *s, struct kv_opts *opts, char *err, size_t errlen);
int qc_data_open(struct qc_state *s, struct kv_opts *opts, char *err, size_t errlen);
void qc_backing_close(struct qc_state *s);
/* Read guest range of the backing file into iov (zeroes past its end). */
int qc_backing_read(struct qc_state *s, uint64_t off, uint64_t len, const struct iovec *iov,
		    int iovcnt, size_t iov_off);

/* ---- snapshot.c ---- */
int qc_snapshots_read(struct qc_state *s, char *err, size_t errlen);
void qc_snapshots_free(struct qc_state *s);

/* ---- rw.c: request paths ---- */
int qc_read_entry(struct qc_state *s, uint64_t gc, uint64_t entry, uint64_t bitmap, uint64_t coff,
		  uint64_t len, const struct iovec *iov, int iovcnt, size_t iov_off);
int qc_co_readv(struct qc_state *s, uint64_t off, uint64_t len, const struct iovec *iov,
		int iovcnt);
int qc_co_writev(struct qc_state *s, uint64_t off, uint64_t len, const struct iovec *iov,
		 int iovcnt, uint32_t flags);
int qc_co_zero(struct qc_state *s, uint64_t off, uint64_t len, uint32_t flags, bool discard);
int qc_co_block_status(struct qc_state *s, struct blk_request *req);
int qc_co_write_compressed(struct qc_state *s, uint64_t off, const void *buf, uint64_t len);

/* ---- qcow2.c ---- */
int qc_co_flush_all(struct qc_state *s);

#endif
