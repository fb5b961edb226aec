/* qcow2 internal snapshots, shared by snapshot-rc.c and snapshot-ops.c.
 *
 * Threading: every function runs in a coroutine with s->meta held and the
 * node drained. */
#ifndef IOPLANE_QCOW2_SNAPSHOT_INT_H
#define IOPLANE_QCOW2_SNAPSHOT_INT_H

#include <stdbool.h>
#include <stdint.h>

struct qc_state;
struct qc_snapshot;

/* Add delta (-1, 0, +1) to the refcount of every cluster the L1 table l1 (n
 * entries, host endian) references: its L2 tables and the clusters they
 * name. fix: l1 is the active table; its L1 and L2 entries get COPIED
 * exactly where the refcount is 1 afterwards. */
int qc_snap_walk(struct qc_state *s, uint64_t *l1, uint32_t n, int delta, bool fix);
/* The same, stopping after limit refcount changes; done counts them (a walk
 * that failed is undone by one with -delta and limit = its done). */
struct qc_walk {
	int delta;
	bool fix;
	uint64_t done, limit;
};
int qc_snap_walk_w(struct qc_state *s, uint64_t *l1, uint32_t n, struct qc_walk *w);
/* Drop one reference of each cluster of [off, off + bytes). */
int qc_snap_free_clusters(struct qc_state *s, uint64_t off, uint64_t bytes);
/* Write the cached refcount blocks (and table) and flush. */
int qc_snap_rc_durable(struct qc_state *s);
/* A new snapshot table with entries v[0..n) written, made durable, and the
 * header switched to it; the old table's clusters are freed. */
int qc_snap_table_write(struct qc_state *s, const struct qc_snapshot *v, uint32_t n);
/* The L1 table of sn, host endian, COPIED flags dropped, in a zeroed array
 * of size entries (size >= sn->l1_size). */
int qc_snap_l1_load(struct qc_state *s, const struct qc_snapshot *sn, uint32_t size,
		    uint64_t **out);
/* Make v (n entries, malloc'ed) the list; frees the old array and the
 * strings of entries no longer in it (entries are moved, not copied). */
int qc_snap_list_set(struct qc_state *s, struct qc_snapshot *v, uint32_t n);

#endif
