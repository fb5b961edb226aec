/* Unit tests for src/util/iov.c. Most checks compare against a flat reference
 * buffer for every offset and length over an iovec with awkward entry sizes
 * (including empty entries with NULL bases). Threading: single-threaded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util/compiler.h"
#include "util/iov.h"

/* Entry sizes: empty ones at the start, middle and end. */
static const size_t sizes[] = { 0, 3, 1, 0, 7, 16, 0, 5, 0 };
#define TOTAL 32

struct fixture {
	unsigned char mem[TOTAL];
	struct iovec iov[ARRAY_SIZE(sizes)];
	int cnt;
};

/* Lay the entries out back to back in mem, so byte i of the iovec is mem[i]
 * and a flat reference is simply mem. Empty entries get a NULL base. */
static void fixture_init(struct fixture *f)
{
	size_t i, pos = 0;

	for (i = 0; i < ARRAY_SIZE(sizes); i++) {
		f->iov[i].iov_base = sizes[i] ? f->mem + pos : NULL;
		f->iov[i].iov_len = sizes[i];
		pos += sizes[i];
	}
	assert_int_equal(pos, TOTAL);
	f->cnt = (int)ARRAY_SIZE(sizes);
	for (i = 0; i < TOTAL; i++)
		f->mem[i] = (unsigned char)(i + 1);
}

static size_t expect_len(size_t off, size_t len)
{
	if (off >= TOTAL)
		return 0;
	return len < TOTAL - off ? len : TOTAL - off;
}

static void test_size(void **state)
{
	struct fixture f;
	struct iovec one = { .iov_base = NULL, .iov_len = 0 };

	(void)state;
	fixture_init(&f);
	assert_int_equal(iov_size(f.iov, f.cnt), TOTAL);
	assert_int_equal(iov_size(f.iov, 2), 3);
	assert_int_equal(iov_size(f.iov, 0), 0);
	assert_int_equal(iov_size(f.iov, -1), 0);
	assert_int_equal(iov_size(&one, 1), 0);
}

static void test_to_buf(void **state)
{
	unsigned char buf[TOTAL + 8];
	struct fixture f;
	size_t off, len, n;

	(void)state;
	fixture_init(&f);
	for (off = 0; off <= TOTAL + 2; off++) {
		for (len = 0; len <= TOTAL + 2; len++) {
			memset(buf, 0xee, sizeof(buf));
			n = iov_to_buf(f.iov, f.cnt, off, buf, len);
			assert_int_equal(n, expect_len(off, len));
			if (n)
				assert_memory_equal(buf, f.mem + off, n);
			/* Nothing written past what was copied. */
			assert_int_equal(buf[n], 0xee);
		}
	}
	assert_int_equal(iov_to_buf(f.iov, 0, 0, buf, 4), 0);
	assert_int_equal(iov_to_buf(f.iov, f.cnt, 0, NULL, 0), 0);
}

static void test_from_buf(void **state)
{
	unsigned char src[TOTAL], ref[TOTAL];
	struct fixture f;
	size_t off, len, n, i;

	(void)state;
	for (i = 0; i < TOTAL; i++)
		src[i] = (unsigned char)(0x80 + i);
	for (off = 0; off <= TOTAL + 2; off++) {
		for (len = 0; len <= TOTAL + 2; len++) {
			fixture_init(&f);
			memcpy(ref, f.mem, TOTAL);
			n = iov_from_buf(f.iov, f.cnt, off, src, len);
			assert_int_equal(n, expect_len(off, len));
			if (n)
				memcpy(ref + off, src, n);
			assert_memory_equal(f.mem, ref, TOTAL);
		}
	}
}

static void test_memset(void **state)
{
	unsigned char ref[TOTAL];
	struct fixture f;
	size_t off, len, n;

	(void)state;
	for (off = 0; off <= TOTAL + 2; off++) {
		for (len = 0; len <= TOTAL + 2; len++) {
			fixture_init(&f);
			memcpy(ref, f.mem, TOTAL);
			n = iov_memset(f.iov, f.cnt, off, 0x5a, len);
			assert_int_equal(n, expect_len(off, len));
			if (n)
				memset(ref + off, 0x5a, n);
			assert_memory_equal(f.mem, ref, TOTAL);
		}
	}
}

static void test_slice(void **state)
{
	struct iovec dst[ARRAY_SIZE(sizes)];
	unsigned char flat[TOTAL];
	struct fixture f;
	size_t off, len, i;
	int n;

	(void)state;
	fixture_init(&f);
	for (off = 0; off <= TOTAL; off++) {
		for (len = 0; off + len <= TOTAL; len++) {
			n = iov_slice(dst, (int)ARRAY_SIZE(dst), f.iov, f.cnt, off, len);
			assert_true(n >= 0);
			assert_int_equal(iov_size(dst, n), len);
			/* The slice aliases the source: same bytes, same memory. */
			assert_int_equal(iov_to_buf(dst, n, 0, flat, len), len);
			if (len)
				assert_memory_equal(flat, f.mem + off, len);
			for (i = 0; i < (size_t)n; i++) {
				assert_true(dst[i].iov_len > 0);
				assert_true((unsigned char *)dst[i].iov_base >= f.mem);
				assert_true((unsigned char *)dst[i].iov_base + dst[i].iov_len <=
					    f.mem + TOTAL);
			}
			if (len == 0)
				assert_int_equal(n, 0);
		}
	}
}

static void test_slice_limits(void **state)
{
	struct iovec dst[4];
	struct fixture f;

	(void)state;
	fixture_init(&f);
	/* [2, 12) spans the 3-, 1- and 7-byte entries and 1 byte of the 16. */
	assert_int_equal(iov_slice(dst, 4, f.iov, f.cnt, 2, 10), 4);
	assert_ptr_equal(dst[0].iov_base, f.mem + 2);
	assert_int_equal(dst[0].iov_len, 1);
	assert_int_equal(dst[1].iov_len, 1);
	assert_int_equal(dst[2].iov_len, 7);
	assert_ptr_equal(dst[3].iov_base, f.mem + 11);
	assert_int_equal(dst[3].iov_len, 1);
	/* One entry too few. */
	assert_int_equal(iov_slice(dst, 3, f.iov, f.cnt, 2, 10), -1);
	assert_int_equal(iov_slice(dst, 0, f.iov, f.cnt, 0, 1), -1);
	/* Exactly enough room; empty entries do not use any. */
	assert_int_equal(iov_slice(dst, 1, f.iov, f.cnt, 11, 16), 1);
	assert_int_equal(dst[0].iov_len, 16);
	/* Range past the end of the source. */
	assert_int_equal(iov_slice(dst, 4, f.iov, f.cnt, TOTAL - 1, 2), -1);
	assert_int_equal(iov_slice(dst, 4, f.iov, f.cnt, TOTAL, 1), -1);
	assert_int_equal(iov_slice(dst, 4, f.iov, f.cnt, TOTAL, 0), 0);
	assert_int_equal(iov_slice(dst, 4, f.iov, 0, 0, 1), -1);
	/* Whole source with room for every non-empty entry. */
	assert_int_equal(iov_slice(dst, 4, f.iov, f.cnt, 0, TOTAL), -1);
}

static void test_is_aligned(void **state)
{
	static char mem[8192] __attribute__((aligned(4096)));
	struct iovec iov[3] = {
		{ .iov_base = mem, .iov_len = 512 },
		{ .iov_base = mem + 4096, .iov_len = 1024 },
		{ .iov_base = mem + 2048, .iov_len = 2048 },
	};

	(void)state;
	assert_true(iov_is_aligned(iov, 3, 512));
	assert_true(iov_is_aligned(iov, 3, 1));
	assert_true(iov_is_aligned(iov, 3, 0));
	assert_false(iov_is_aligned(iov, 3, 4096));
	assert_false(iov_is_aligned(iov, 3, 1024)); /* first length is 512 */
	assert_true(iov_is_aligned(iov + 1, 2, 1024));
	assert_true(iov_is_aligned(iov, 0, 4096));
	iov[2].iov_base = mem + 2049; /* base off by one */
	assert_false(iov_is_aligned(iov, 3, 512));
	assert_true(iov_is_aligned(iov, 2, 512));
	iov[2].iov_base = mem + 2048;
	iov[2].iov_len = 2047; /* length off by one */
	assert_false(iov_is_aligned(iov, 3, 512));
	assert_true(iov_is_aligned(iov, 3, 1));
	/* Not a power of two: a plain multiple is still enforced. */
	iov[0].iov_base = mem + (3 - (uintptr_t)mem % 3) % 3;
	iov[0].iov_len = 1536;
	assert_true(iov_is_aligned(iov, 1, 3));
	iov[0].iov_len = 1537;
	assert_false(iov_is_aligned(iov, 1, 3));
	iov[0].iov_base = (char *)iov[0].iov_base + 1;
	iov[0].iov_len = 1536;
	assert_false(iov_is_aligned(iov, 1, 3));
}

static void test_is_zero(void **state)
{
	enum { MAXLEN = 80 };
	unsigned char *a = calloc(1, MAXLEN), *b = calloc(1, MAXLEN);
	struct iovec iov[4];
	size_t la, lb, pos;

	(void)state;
	assert_non_null(a);
	assert_non_null(b);
	assert_true(iov_is_zero(NULL, 0));
	/* Every split of lengths around the 16-byte head, every dirty byte. */
	for (la = 0; la < MAXLEN; la += 3) {
		for (lb = 0; lb < MAXLEN; lb += 5) {
			iov[0] = (struct iovec){ .iov_base = NULL, .iov_len = 0 };
			iov[1] = (struct iovec){ .iov_base = a, .iov_len = la };
			iov[2] = (struct iovec){ .iov_base = NULL, .iov_len = 0 };
			iov[3] = (struct iovec){ .iov_base = b, .iov_len = lb };
			assert_true(iov_is_zero(iov, 4));
			for (pos = 0; pos < la + lb; pos++) {
				unsigned char *p = pos < la ? a + pos : b + pos - la;

				*p = 0x01;
				assert_false(iov_is_zero(iov, 4));
				*p = 0x80;
				assert_false(iov_is_zero(iov, 4));
				*p = 0;
			}
		}
	}
	/* Bytes outside the iovec do not count. */
	a[10] = 1;
	iov[0] = (struct iovec){ .iov_base = a, .iov_len = 10 };
	iov[1] = (struct iovec){ .iov_base = a + 11, .iov_len = MAXLEN - 11 };
	assert_true(iov_is_zero(iov, 2));
	assert_true(iov_is_zero(iov, -1)); /* negative count: empty */
	free(a);
	free(b);
}

static void test_is_zero_large(void **state)
{
	size_t len = 1 << 20, pos;
	unsigned char *p = calloc(1, len);
	struct iovec iov = { .iov_base = p, .iov_len = len };

	(void)state;
	assert_non_null(p);
	assert_true(iov_is_zero(&iov, 1));
	for (pos = 0; pos < len; pos += 4093) {
		p[pos] = 0xff;
		assert_false(iov_is_zero(&iov, 1));
		p[pos] = 0;
	}
	p[len - 1] = 1;
	assert_false(iov_is_zero(&iov, 1));
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_size),	   cmocka_unit_test(test_to_buf),
		cmocka_unit_test(test_from_buf),   cmocka_unit_test(test_memset),
		cmocka_unit_test(test_slice),	   cmocka_unit_test(test_slice_limits),
		cmocka_unit_test(test_is_aligned), cmocka_unit_test(test_is_zero),
		cmocka_unit_test(test_is_zero_large),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
