/* Dirty bitmaps: the bit arithmetic and the write hook (dirty-bitmap.h).
 * Threading: bits are set with relaxed atomics from any submitting thread;
 * the list and everything else change on the main thread while the node is
 * drained, so a submitter never sees a bitmap come or go under it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "block/block.h"
#include "block/dirty-bitmap.h"
#include "block/qcow2/qcow2.h"

struct blk_dirty_bitmap *blk_dirty_bitmap_new(const char *name, uint64_t size, uint32_t granularity)
{
	struct blk_dirty_bitmap *bm = calloc(1, sizeof(*bm));

	if (!bm)
		return NULL;
	bm->name = strdup(name);
	bm->size = size;
	bm->granularity = granularity;
	bm->gran_bits = (unsigned)__builtin_ctz(granularity);
	bm->nbits = (size + granularity - 1) >> bm->gran_bits;
	bm->nwords = (bm->nbits + 63) / 64;
	bm->words = calloc(bm->nwords ? bm->nwords : 1, sizeof(*bm->words));
	atomic_init(&bm->enabled, true);
	atomic_init(&bm->mark_nbits, bm->nbits);
	if (!bm->name || !bm->words) {
		blk_dirty_bitmap_free(bm);
		return NULL;
	}
	return bm;
}

bool blk_dirty_bitmap_enable(struct blk_dirty_bitmap *bm, bool on)
{
	atomic_store_explicit(&bm->mark_nbits, on ? bm->nbits : 0, memory_order_relaxed);
	return atomic_exchange(&bm->enabled, on);
}

void blk_dirty_bitmap_free(struct blk_dirty_bitmap *bm)
{
	if (!bm)
		return;
	free(bm->name);
	free((void *)bm->words);
	free(bm);
}

struct blk_dirty_bitmap *blk_dirty_bitmap_find(const struct blk_node *bs, const char *name)
{
	struct blk_dirty_bitmap *bm;

	for (bm = bs->dirty_bitmaps; bm; bm = bm->next)
		if (!strcmp(bm->name, name))
			return bm;
	return NULL;
}

void blk_dirty_bitmap_link(struct blk_node *bs, struct blk_dirty_bitmap *bm)
{
	struct blk_dirty_bitmap **p = &bs->dirty_bitmaps;

	while (*p)
		p = &(*p)->next;
	bm->next = NULL;
	*p = bm;
}

void blk_dirty_bitmap_unlink(struct blk_node *bs, struct blk_dirty_bitmap *bm)
{
	struct blk_dirty_bitmap **p = &bs->dirty_bitmaps;

	while (*p && *p != bm)
		p = &(*p)->next;
	if (*p)
		*p = bm->next;
	bm->next = NULL;
}

void blk_dirty_bitmaps_free(struct blk_node *bs)
{
	while (bs->dirty_bitmaps) {
		struct blk_dirty_bitmap *bm = bs->dirty_bitmaps;

		bs->dirty_bitmaps = bm->next;
		blk_dirty_bitmap_free(bm);
	}
}

/* Bits [b0, b1] (inclusive, b1 < nbits) set, or cleared. */
static void bm_change_bits(struct blk_dirty_bitmap *bm, uint64_t b0, uint64_t b1, bool set)
{
	uint64_t w0 = b0 / 64, w1 = b1 / 64;
	uint64_t m0 = ~0ull << (b0 % 64), m1 = ~0ull >> (63 - b1 % 64);

	if (w0 == w1) {
		m0 &= m1;
	} else {
		for (uint64_t w = w0 + 1; w < w1; w++)
			atomic_store_explicit(&bm->words[w], set ? ~0ull : 0, memory_order_relaxed);
	}
	if (set)
		atomic_fetch_or_explicit(&bm->words[w0], m0, memory_order_relaxed);
	else
		atomic_fetch_and_explicit(&bm->words[w0], ~m0, memory_order_relaxed);
	if (w0 == w1)
		return;
	if (set)
		atomic_fetch_or_explicit(&bm->words[w1], m1, memory_order_relaxed);
	else
		atomic_fetch_and_explicit(&bm->words[w1], ~m1, memory_order_relaxed);
}

/* The bits of every granule [off, off+len) touches, inside the bitmap. */
static void bm_change(struct blk_dirty_bitmap *bm, uint64_t off, uint64_t len, bool set)
{
	uint64_t b0, b1;

	if (!len || off >= bm->size)
		return;
	b0 = off >> bm->gran_bits;
	b1 = (off + len - 1) >> bm->gran_bits;
	if (b1 >= bm->nbits)
		b1 = bm->nbits - 1;
	bm_change_bits(bm, b0, b1, set);
}

void blk_dirty_bitmap_set(struct blk_dirty_bitmap *bm, uint64_t off, uint64_t len)
{
	bm_change(bm, off, len, true);
}

void blk_dirty_bitmap_clear(struct blk_dirty_bitmap *bm, uint64_t off, uint64_t len)
{
	bm_change(bm, off, len, false);
}

void blk_dirty_mark_slow(struct blk_node *bs, uint64_t off, uint64_t len)
{
	for (struct blk_dirty_bitmap *bm = bs->dirty_bitmaps; bm; bm = bm->next)
		if (atomic_load_explicit(&bm->mark_nbits, memory_order_relaxed)) /* enabled */
			blk_dirty_bitmap_set(bm, off, len); /* a bit set twice is harmless */
}

void blk_dirty_bitmaps_resize(struct blk_node *bs, uint64_t size)
{
	for (struct blk_dirty_bitmap *bm = bs->dirty_bitmaps; bm; bm = bm->next) {
		uint64_t nbits = (size + bm->granularity - 1) >> bm->gran_bits;
		uint64_t nwords = (nbits + 63) / 64;
		_Atomic uint64_t *w = realloc((void *)bm->words, (nwords ? nwords : 1) * 8);

		if (!w)
			continue; /* keeps the old size: writes past it are clamped */
		for (uint64_t i = bm->nwords; i < nwords; i++)
			w[i] = 0;
		if (nbits < bm->nbits && nbits % 64) /* bits past the new end go */
			w[nwords - 1] &= (1ull << (nbits % 64)) - 1;
		bm->words = w;
		bm->size = size;
		bm->nbits = nbits;
		bm->nwords = nwords;
		if (atomic_load(&bm->enabled))
			atomic_store(&bm->mark_nbits, nbits);
	}
}

void blk_dirty_bitmap_reset_all(struct blk_dirty_bitmap *bm)
{
	for (uint64_t w = 0; w < bm->nwords; w++)
		atomic_store_explicit(&bm->words[w], 0, memory_order_relaxed);
}

bool blk_dirty_bitmap_bit(const struct blk_dirty_bitmap *bm, uint64_t i)
{
	uint64_t w = atomic_load_explicit(&bm->words[i / 64], memory_order_relaxed);

	return (w >> (i % 64)) & 1;
}

/* The first bit from b (< end) whose state is not `dirty`; end if none. */
static uint64_t bm_next_change(const struct blk_dirty_bitmap *bm, uint64_t b, uint64_t end,
			       bool dirty)
{
	while (b < end) {
		uint64_t w = atomic_load_explicit(&bm->words[b / 64], memory_order_relaxed);

		w = (dirty ? ~w : w) >> (b % 64);
		if (w) {
			b += (uint64_t)__builtin_ctzll(w);
			return b < end ? b : end;
		}
		b = (b / 64 + 1) * 64;
	}
	return end;
}

uint64_t blk_dirty_bitmap_extent(const struct blk_dirty_bitmap *bm, uint64_t off, uint64_t len,
				 bool *dirty)
{
	uint64_t b = off >> bm->gran_bits, stop = off + len, end_bit, byte;

	if (stop > bm->size)
		stop = bm->size;
	*dirty = blk_dirty_bitmap_bit(bm, b);
	end_bit = ((stop - 1) >> bm->gran_bits) + 1;
	byte = bm_next_change(bm, b + 1, end_bit, *dirty) << bm->gran_bits;
	return (byte < stop ? byte : stop) - off;
}

void blk_dirty_bitmap_merge(struct blk_dirty_bitmap *dst, const struct blk_dirty_bitmap *src)
{
	uint64_t b = 0;

	if (dst->granularity == src->granularity && dst->nwords == src->nwords) {
		for (uint64_t w = 0; w < dst->nwords; w++)
			atomic_fetch_or_explicit(
				&dst->words[w],
				atomic_load_explicit(&src->words[w], memory_order_relaxed),
				memory_order_relaxed);
		return;
	}
	while (b < src->nbits) {
		uint64_t s = bm_next_change(src, b, src->nbits, false), e;

		if (s == src->nbits)
			break;
		e = bm_next_change(src, s, src->nbits, true);
		blk_dirty_bitmap_set(dst, s << src->gran_bits, (e - s) << src->gran_bits);
		b = e;
	}
}

uint64_t blk_dirty_bitmap_count(const struct blk_dirty_bitmap *bm)
{
	uint64_t bits = 0;

	for (uint64_t w = 0; w < bm->nwords; w++)
		bits += (uint64_t)__builtin_popcountll(
			atomic_load_explicit(&bm->words[w], memory_order_relaxed));
	return bits << bm->gran_bits; /* whole bits, as QEMU counts */
}

uint32_t blk_dirty_bitmap_default_gran(struct blk_node *bs)
{
	uint64_t cs = qcow2_cluster_size(bs);

	if (!cs)
		return 65536;
	return cs < 4096 ? 4096 : cs > 65536 ? 65536 : (uint32_t)cs;
}
