/* The node graph as the control plane sees it: every node has a unique
 * node-name and is found by it in one registry; nodes are reference-counted
 * by their users (parents, exports, jobs, the monitor); a subtree can be
 * drained; resizes are announced to those who asked.
 *
 * Threading: main thread only, except what blk_drain_begin() says about
 * iothreads. */
#ifndef IOPLANE_BLOCK_GRAPH_H
#define IOPLANE_BLOCK_GRAPH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block/block.h"

/* QEMU's limit: a node-name is at most 31 bytes. */
#define BLK_NODE_NAME_MAX 31

/* ---- registry and node-names -------------------------------------------- */

/* The node with that node-name (given or generated), or NULL. */
struct blk_node *blk_graph_find(const char *node_name);
const char *blk_node_name(const struct blk_node *bs);
/* The name of the node's driver ("file", "raw", "qcow2", "null"). */
const char *blk_node_driver(const struct blk_node *bs);
/* Give bs the node-name `name` (NULL: keep the generated one). -EINVAL and
 * QEMU's message for a name that is not well formed ("Invalid node-name:
 * 'x'"), too long ("Node name too long") or taken ("Duplicate nodes with
 * node-name='x'"). */
int blk_node_set_name(struct blk_node *bs, const char *name, char *err, size_t errlen);
/* Whether name could be given to a new node (same checks and messages). */
int blk_node_name_check(const char *name, char *err, size_t errlen);
/* Iterate over every node, in creation order: first with NULL. */
struct blk_node *blk_graph_next(struct blk_node *prev);
/* blk_detach_loop() for every node, on the loop that is going away, while
 * the main thread waits for it (iothread_run_sync). */
void blk_graph_detach_loop(struct loop *loop);

/* Monitor-owned nodes (blockdev-add): the registry holds the reference
 * that the opener had. blk_graph_release() hands it back (blockdev-del then
 * drops it with blk_unref). */
void blk_graph_own(struct blk_node *bs);
bool blk_graph_owned(const struct blk_node *bs);
void blk_graph_release(struct blk_node *bs);

/* ---- references ---------------------------------------------------------- */

/* A user takes a reference: parents (blk_add_child takes the opener's),
 * exports, jobs. `user` describes it in busy errors ("block export 'e0'")
 * and is copied; blk_unref() drops the reference of the user with the
 * same description (NULL: the opener's). The last reference closes the
 * node (blk_close() is blk_unref(bs, NULL)). */
void blk_ref(struct blk_node *bs, const char *user);
void blk_unref(struct blk_node *bs, const char *user);
/* Is bs used by anyone but its owner (the opener or the monitor)? If so,
 * and why != NULL, say by whom: "used by block export 'e0'", "used as
 * 'file' of node 'n1'". */
bool blk_in_use(const struct blk_node *bs, char *why, size_t whylen);
/* Users other than parents (exports, jobs), and parents. */
unsigned blk_user_count(const struct blk_node *bs);
unsigned blk_parent_count(const struct blk_node *bs);
/* The parents of bs, found through the registry: up to max, returns the
 * count (which may exceed max). */
unsigned blk_parents(const struct blk_node *bs, struct blk_node **out, unsigned max);

/* ---- drain ----------------------------------------------------------------- */

/* Quiesce bs, every node below it and every node above it: requests
 * submitted to those nodes from now on wait (blk_submit() returns 0; they
 * run after blk_drain_end()), and this returns once the requests in flight
 * on them, on every thread, have finished. Iothreads go on serving every
 * other node. Main thread; nests (each begin needs its end). 0 or -ENOMEM. */
int blk_drain_begin(struct blk_node *bs);
/* The waiting requests go on, on their own threads. */
void blk_drain_end(struct blk_node *bs);
/* Is bs drained (by any drain)? */
bool blk_drained(const struct blk_node *bs);

/* ---- replacing a node ------------------------------------------------------ */

/* A user other than a parent that holds a node by pointer (an export, a
 * job) says how it follows a replacement: cb runs on the main thread inside
 * blk_replace_node(), both nodes drained, and makes the user submit to `to`
 * from now on (its reference has moved already). The notifier moves to `to`
 * with the user. -ENOMEM; _del removes the first entry with cb and opaque. */
typedef void (*blk_replace_fn)(struct blk_node *from, struct blk_node *to, void *opaque);
int blk_replace_notifier_add(struct blk_node *bs, blk_replace_fn cb, void *opaque);
void blk_replace_notifier_del(struct blk_node *bs, blk_replace_fn cb, void *opaque);

/* Put `to` in the place of `from` for everyone who uses it, as QEMU's
 * bdrv_replace_node(): every parent link to from (but those of `to` and the
 * nodes under it, such as to's backing link to from: a snapshot overlay),
 * every other user (references, replace and resize notifiers, the
 * permissions it holds: user_perm/user_shared), and the requests users
 * submitted to from that a drain holds, which resume on `to`. from keeps
 * its monitor ownership and what its remaining parents need of it: as a
 * backing file, consistent read only, so its image lock stops keeping
 * other readers out. External snapshots, and a job's switch-over (mirror,
 * commit), use it.
 *
 * The caller drains from and to (so nothing is in flight) and keeps them
 * drained until this returns; their sizes must be equal. All or nothing:
 * -EINVAL (not the same size, or the same node), -EPERM (a lock or a
 * permission conflict), -ENOMEM, with a message, and then nothing moved. */
int blk_replace_node(struct blk_node *from, struct blk_node *to, char *err, size_t errlen);
/* The same where `to` may also be larger (an active commit into a larger
 * base, which QEMU allows): the users then see a resize (their resize
 * notifiers run). */
int blk_replace_node_grow(struct blk_node *from, struct blk_node *to, char *err, size_t errlen);

/* The old top of an external snapshot becomes, as in QEMU, a read-only
 * backing file (ro: true), with its `file` child: it then holds no write
 * lock, so other processes may read it. false undoes it (an aborted
 * snapshot), or makes a backing file opened read-only writable (a commit's
 * base: its file is opened again for writing). The driver writes back what it holds first (qcow2:
 * caches, dropped references, the dirty bit), as at close. Main thread, bs drained and written by
 * nobody. 0, or -errno (nothing changed) with a message. */
int blk_set_backing_read_only(struct blk_node *bs, bool ro, char *err, size_t errlen);

/* ---- resize ---------------------------------------------------------------- */

/* cb runs on the main thread after every successful blk_resize() of bs.
 * -ENOMEM. _del removes the first entry with the same cb and opaque. */
int blk_resize_notifier_add(struct blk_node *bs, void (*cb)(struct blk_node *bs, void *opaque),
			    void *opaque);
void blk_resize_notifier_del(struct blk_node *bs, void (*cb)(struct blk_node *bs, void *opaque),
			     void *opaque);
/* Grow (or shrink) bs to size bytes, drained, then run the notifiers.
 * -EROFS, -ENOTSUP (a driver that cannot), -errno; a message in err. */
int blk_resize(struct blk_node *bs, uint64_t size, char *err, size_t errlen);

/* ---- synchronous work from main-loop callbacks ------------------------------ */

/* Opening, closing, flushing and resizing nodes wait for I/O by running the
 * current loop (blk_do_sync), which a callback of that same loop must not
 * do. A callback (a QMP handler) brackets such work with these: the
 * thread's current loop becomes a control loop of its own, made once and
 * run only there. blk_ctl_enter: 0 and *prev to give back, or -ENOMEM. */
int blk_ctl_enter(struct loop **prev);
void blk_ctl_leave(struct loop *prev);
/* At exit, once every node is closed. */
void blk_ctl_free(void);

/* ---- events ---------------------------------------------------------------- */

/* Who hears of a format driver finding an image corrupt (the monitor's
 * BLOCK_IMAGE_CORRUPTED): fn runs on main's thread, told the node-name,
 * the driver's message and whether the image is now unusable for writes.
 * Main thread, at start-up. */
void blk_set_corrupt_handler(struct loop *main,
			     void (*fn)(const char *node_name, const char *msg, bool fatal));
/* A driver found bs corrupt (any thread): the handler hears of it later. */
void blk_report_corrupt(struct blk_node *bs, const char *msg, bool fatal);

#endif
