/* qcow2 format driver: public interface for the image tool (`ioplane img`).
 * The driver itself is a built-in like the others (blk_drv_qcow2 in
 * block-driver.h) and is used through blk_open(...,format=qcow2,...).
 *
 * Threading: every function here is synchronous and must be called on a
 * thread that runs a loop (loop_current(); the main thread with a bound
 * loop), while no other request is in flight on the node. It runs its work
 * in a coroutine and that loop until the work is done; without a loop it
 * fails with -EINVAL (qc_run_sync). */
#ifndef IOPLANE_QCOW2_H
#define IOPLANE_QCOW2_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct blk_node;

enum qcow2_prealloc {
	QCOW2_PREALLOC_OFF = 0,
	QCOW2_PREALLOC_METADATA, /* L2 tables and data clusters allocated, file sparse */
	QCOW2_PREALLOC_FALLOC,   /* same, data space reserved with fallocate */
	QCOW2_PREALLOC_FULL,     /* same, data space written with zeroes */
};

enum qcow2_compression {
	QCOW2_COMPRESSION_ZLIB = 0,
	QCOW2_COMPRESSION_ZSTD = 1,
};

struct qcow2_create_opts {
	uint64_t size;         /* virtual size in bytes (required unless a backing file gives it) */
	uint32_t cluster_size; /* 0: 65536; power of two, 512 .. 2 MiB */
	int compat;            /* 0 or 3: version 3 ("1.1"); 2: version 2 ("0.10") */
	bool extended_l2;      /* subclusters (version 3, cluster_size >= 16 KiB) */
	bool lazy_refcounts;   /* version 3 */
	uint32_t refcount_bits; /* 0: 16; 1, 2, 4, ..., 64 */
	enum qcow2_prealloc prealloc;
	const char *backing_file; /* NULL: none */
	const char *backing_fmt;  /* required with backing_file ("raw", "qcow2") */
	enum qcow2_compression compression_type;
	const char *data_file; /* external data file (created or truncated), NULL: none */
	bool data_file_raw;    /* autoclear bit: the data file is a raw image */
	bool no_extent_hint;   /* do not set the 1 MiB XFS extent size hint */
};

/* Parse one "-o" option of qemu-img create (cluster_size=64K, compat=1.1,
 * extended_l2=on, lazy_refcounts=on, refcount_bits=16, preallocation=off,
 * backing_file=, backing_fmt=, compression_type=zlib|zstd, data_file=,
 * data_file_raw=on, size=). Strings point into `val` (keep it alive).
 * 0, or -EINVAL with a message. */
int qcow2_create_opt(struct qcow2_create_opts *o, const char *key, const char *val, char *err,
		     size_t errlen);

/* Create (or overwrite) a qcow2 image at path. 0 or -errno with a message. */
int qcow2_create(const char *path, const struct qcow2_create_opts *o, char *err, size_t errlen);

/* Consistency check. */
#define QCOW2_FIX_LEAKS (1 << 0)
#define QCOW2_FIX_ERRORS (1 << 1)

struct qcow2_check_result {
	uint64_t corruptions; /* errors still present */
	uint64_t leaks;       /* leaked clusters still present */
	uint64_t corruptions_fixed;
	uint64_t leaks_fixed;
	uint64_t check_errors;       /* internal errors (I/O) while checking */
	uint64_t image_end_offset;   /* end of the last cluster in use */
	uint64_t allocated_clusters; /* guest clusters allocated in the active L1 */
	uint64_t total_clusters;     /* guest clusters of the virtual disk */
	uint64_t fragmented_clusters;
	uint64_t compressed_clusters;
	char first_error[256]; /* human description of the first problem found */
};

/* Check bs (a qcow2 node); with repair flags, fix what can be fixed (the node
 * must be writable). When the repair leaves no corruption and no check error
 * (a repair that changed something is verified by a second pass), the dirty
 * and corrupt bits are cleared, as qemu-img check -r does. Returns 0 when
 * the check ran (see the counters), -errno when it could not. */
int qcow2_check(struct blk_node *bs, int repair_flags, struct qcow2_check_result *r);
/* The same, and report (may be NULL) gets each line of the report as it is
 * made, in qemu-img check's words ("Leaked cluster 6 refcount=1
 * reference=0", "ERROR ...", "Repairing ..."). */
typedef void qcow2_check_report_fn(void *opaque, const char *line);
int qcow2_check_report(struct blk_node *bs, int repair_flags, struct qcow2_check_result *r,
		       qcow2_check_report_fn *report, void *opaque);

/* Accept the open option repair=on in this process (`ioplane img check -r`
 * only; servers never call this, so they keep refusing to open an image
 * marked corrupt read-write). With repair=on, a writable open of an image
 * marked corrupt succeeds - writes stay refused until qcow2_check repairs it
 * - and a dirty image is left for qcow2_check to repair and report. Main
 * thread, before the open. */
void qcow2_allow_repair_open(void);

struct qcow2_snapshot_info {
	char *id, *name; /* NUL-terminated */
	uint64_t vm_state_size;
	uint64_t disk_size;
	uint32_t date_sec, date_nsec;
	uint64_t vm_clock_nsec;
	uint64_t icount; /* (uint64_t)-1 if absent */
};

struct qcow2_info {
	uint64_t virtual_size;
	uint64_t cluster_size;
	int version; /* 2 or 3 ("0.10" or "1.1") */
	uint32_t refcount_bits;
	bool extended_l2;
	bool lazy_refcounts;
	bool corrupt;
	bool dirty; /* dirty bit as found at open */
	enum qcow2_compression compression_type;
	char *data_file; /* NULL: none */
	bool data_file_raw;
	char *backing_file;   /* NULL: none (as written in the header) */
	char *backing_format; /* NULL: none declared */
	uint64_t incompatible_features, compatible_features, autoclear_features;
	unsigned nb_snapshots;
	struct qcow2_snapshot_info *snapshots;
	unsigned nb_bitmaps; /* bitmaps in the extension */
};

/* A bitmap of the bitmaps extension. */
#define QCOW2_BITMAP_IN_USE (1u << 0) /* not saved since it was last changed */
#define QCOW2_BITMAP_AUTO (1u << 1)   /* tracks writes (enabled) */
struct qcow2_bitmap_info {
	char *name;
	uint32_t flags;        /* QCOW2_BITMAP_* */
	uint32_t granularity;  /* bytes per bit */
	uint64_t table_offset; /* bitmap table: table_size 8-byte entries */
	uint32_t table_size;
};
/* The bitmaps of bs's directory, each checked as QEMU loads it (none when
 * there is no extension, or its autoclear bit is clear: then QEMU ignores
 * them too). Free with qcow2_bitmaps_free. -EINVAL with a message in err for
 * a bad directory. As on disk; the node's dirty bitmaps (dirty-bitmap.h)
 * are what an open image tracks. */
int qcow2_get_bitmaps(struct blk_node *bs, struct qcow2_bitmap_info **out, unsigned *n, char *err,
		      size_t errlen);
void qcow2_bitmaps_free(struct qcow2_bitmap_info *b, unsigned n);
/* Could a new persistent bitmap name of this granularity be stored in bs
 * (QEMU's constraints)? 0, or -EINVAL and QEMU's message. Main thread. */
int qcow2_bitmap_can_store(struct blk_node *bs, const char *name, uint32_t granularity, char *err,
			   size_t errlen);

/* Fill info (free with qcow2_info_free). bs must be a qcow2 node. */
int qcow2_get_info(struct blk_node *bs, struct qcow2_info *info);
void qcow2_info_free(struct qcow2_info *info);

/* True if bs is a qcow2 node. */
bool qcow2_is(const struct blk_node *bs);
/* The opened backing node (NULL: none). */
struct blk_node *qcow2_backing(struct blk_node *bs);
/* Give bs, opened without one (backing=none, or an image that names none),
 * the backing node `backing` (a new reference; the image header is not
 * changed: an external snapshot's overlay names its backing file already),
 * and take the permissions it needs of it. Main thread, bs drained. 0, or
 * -EEXIST (it has one), -ENOTSUP (not qcow2), -EPERM with a message. */
int qcow2_attach_backing(struct blk_node *bs, struct blk_node *backing, char *err, size_t errlen);
/* Undo qcow2_attach_backing(): bs reads zeroes again where it allocates
 * nothing; the reference is dropped. Main thread, bs drained. */
void qcow2_detach_backing(struct blk_node *bs);

/* Make bs's header name backing file `name` in format fmt (name NULL: no
 * backing file, fmt ignored), durably, in one write of the header cluster
 * (a stream's or a commit's new backing link; the graph is the caller's).
 * bs writable, drained. 0, or -EROFS, -ENOTSUP, -ENOSPC (too long for the
 * header cluster), -errno, with a message. */
int qcow2_change_backing_file(struct blk_node *bs, const char *name, const char *fmt, char *err,
			      size_t errlen);

/* Write whole clusters compressed (convert -c). offset cluster-aligned, len
 * a multiple of the cluster size except at the end of the image; the target
 * clusters must be unallocated. Falls back to a normal write when the data
 * does not shrink. Synchronous, like blk_pwrite. */
int qcow2_pwrite_compressed(struct blk_node *bs, uint64_t offset, const void *buf, uint64_t len);

/* How many clusters of the image file have a refcount, counting up to limit
 * at most (img map's test for metadata preallocation, as QEMU's). */
int qcow2_count_refcounted(struct blk_node *bs, uint64_t limit, uint64_t *count);

/* Cluster size of a qcow2 node (0 otherwise). */
uint64_t qcow2_cluster_size(const struct blk_node *bs);

#endif
