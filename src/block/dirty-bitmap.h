/* Dirty bitmaps of a node: one bit per `granularity` bytes, set by every
 * write, write-zeroes and discard submitted to the node while the bitmap is
 * enabled (QEMU's BdrvDirtyBitmap). Persistent bitmaps are loaded and saved
 * by the node's format driver (qcow2).
 *
 * Threading: the list of a node (bs->dirty_bitmaps) and every field but
 * `words`, `enabled` and `mark_nbits` are the main thread's, changed while
 * the node is drained or before it serves; `enabled` and `mark_nbits` are
 * written by the main thread at any time (relaxed atomics); submitting
 * threads read the list and set bits with atomic fetch_or, without a lock. */
#ifndef IOPLANE_BLOCK_DIRTY_BITMAP_H
#define IOPLANE_BLOCK_DIRTY_BITMAP_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "block/block.h"

#define BLK_BITMAP_MIN_GRAN 512u
#define BLK_BITMAP_MAX_GRAN (1u << 31)
#define BLK_BITMAP_MAX_NAME 1023

struct blk_dirty_bitmap {
	struct blk_dirty_bitmap *next; /* main thread, changed drained */
	char *name;
	uint64_t size; /* bytes covered (the node's size when it was made) */
	uint32_t granularity;
	unsigned gran_bits;
	uint64_t nbits, nwords;
	_Atomic uint64_t *words; /* bit i of word w: bytes [(64w+i) << gran_bits, ...) */
	atomic_bool enabled;     /* recording: writes set bits (blk_dirty_bitmap_enable) */
	/* What writers read: nbits while enabled, 0 while not, so that the
	 * marking fast path tests the bitmap's state and its length at once. */
	_Atomic uint64_t mark_nbits;
	bool persistent;   /* saved in the image at close */
	bool inconsistent; /* found in use at open: never used, kept as found */
	bool readonly;     /* loaded from a read-only image */
	unsigned busy;     /* users (NBD exports): cannot be changed or removed */
	/* The format driver's: where the image keeps this bitmap as loaded
	 * (qcow2: bitmap table offset and size, flags; 0: not in the image). */
	uint64_t disk_table_offset;
	uint32_t disk_table_size, disk_flags;
};

/* A new bitmap (not on any node) of size bytes: all clear, enabled.
 * granularity: a power of two in [512, 2 GiB]. NULL: -ENOMEM. */
struct blk_dirty_bitmap *blk_dirty_bitmap_new(const char *name, uint64_t size,
					      uint32_t granularity);
void blk_dirty_bitmap_free(struct blk_dirty_bitmap *bm);
/* The bitmap named name on bs, or NULL. */
struct blk_dirty_bitmap *blk_dirty_bitmap_find(const struct blk_node *bs, const char *name);
/* Append bm to bs's list / take it off (main thread; bs drained, or not
 * serving yet). */
void blk_dirty_bitmap_link(struct blk_node *bs, struct blk_dirty_bitmap *bm);
void blk_dirty_bitmap_unlink(struct blk_node *bs, struct blk_dirty_bitmap *bm);
/* Free every bitmap of bs (its close). */
void blk_dirty_bitmaps_free(struct blk_node *bs);

/* Start (on) or stop recording writes (main thread); returns the old state. */
bool blk_dirty_bitmap_enable(struct blk_dirty_bitmap *bm, bool on);

/* Set the bits covering [off, off+len) (any thread). */
void blk_dirty_bitmap_set(struct blk_dirty_bitmap *bm, uint64_t off, uint64_t len);

/* Clear the bits of every granule [off, off+len) touches (any thread;
 * callers that race with setters say why that is harmless). */
void blk_dirty_bitmap_clear(struct blk_dirty_bitmap *bm, uint64_t off, uint64_t len);

/* Every enabled bitmap of bs, the long way (ranges of several granules). */
void blk_dirty_mark_slow(struct blk_node *bs, uint64_t off, uint64_t len);

/* A write to [off, off+len) of bs (inside the node; bs->dirty_bitmaps not
 * NULL): mark every enabled bitmap (any thread). Inline for the common
 * case, one granule per bitmap: a test, and an atomic or only when the bit
 * is clear (so writers on several threads do not bounce the word's cache
 * line). Anything else (len 0, a range of several granules, a bitmap
 * shorter than the node) goes to blk_dirty_mark_slow, which does the whole
 * list again: a bit set twice is harmless. A disabled bitmap has
 * mark_nbits 0: skipped by the same comparison that bounds the bit. */
static inline void blk_dirty_mark(struct blk_node *bs, uint64_t off, uint64_t len)
{
	uint64_t last = off + len - 1;
	struct blk_dirty_bitmap *bm = bs->dirty_bitmaps;

	do {
		unsigned g = bm->gran_bits;
		uint64_t b = off >> g;
		const _Atomic uint64_t *w;

		if (__builtin_expect(
			    b >= atomic_load_explicit(&bm->mark_nbits, memory_order_relaxed), 0)) {
			if (!atomic_load_explicit(&bm->mark_nbits, memory_order_relaxed))
				continue; /* disabled */
			blk_dirty_mark_slow(bs, off, len);
			return;
		}
		if (__builtin_expect((last >> g) != b || !len, 0)) {
			blk_dirty_mark_slow(bs, off, len);
			return;
		}
		w = &bm->words[b / 64];
		if (__builtin_expect(
			    !((atomic_load_explicit(w, memory_order_relaxed) >> (b % 64)) & 1),
			    0)) {
			blk_dirty_mark_slow(bs, off, len); /* once per granule */
			return;
		}
	} while ((bm = bm->next));
}
/* The node's size changed (drained): every bitmap follows, new bits clear. */
void blk_dirty_bitmaps_resize(struct blk_node *bs, uint64_t size);
void blk_dirty_bitmap_reset_all(struct blk_dirty_bitmap *bm);
/* dst |= src, any granularities (src's set ranges marked in dst). */
void blk_dirty_bitmap_merge(struct blk_dirty_bitmap *dst, const struct blk_dirty_bitmap *src);
/* Dirty bytes: bits set times granularity (QEMU's count). */
uint64_t blk_dirty_bitmap_count(const struct blk_dirty_bitmap *bm);
/* Is bit i set? */
bool blk_dirty_bitmap_bit(const struct blk_dirty_bitmap *bm, uint64_t i);
/* The run from byte off (< size) of the same state, at most len bytes:
 * returns its length (> 0) and *dirty. */
uint64_t blk_dirty_bitmap_extent(const struct blk_dirty_bitmap *bm, uint64_t off, uint64_t len,
				 bool *dirty);

/* QEMU's default granularity for a node: its cluster size clamped to
 * [4 KiB, 64 KiB], 64 KiB when it has none. */
uint32_t blk_dirty_bitmap_default_gran(struct blk_node *bs);

#endif
