/* Unit tests for image locking (perm.c, file-lock.c): two opens of one file
 * in this process see each other as two processes do (OFD locks); the lock
 * bytes are QEMU's; a refused change leaves every node as it was (all or
 * nothing across a qcow2 image and its data file); creating over an image in
 * use neither truncates it nor keeps a lock; locking=off takes none.
 * Threading: one loop bound to the test thread. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "block/block.h"
#include "block/file.h"
#include "block/qcow2/qcow2.h"
#include "loop/loop.h"
#include "util/opts.h"

#define CR BLK_PERM_CONSISTENT_READ
#define W  BLK_PERM_WRITE
#define WU BLK_PERM_WRITE_UNCHANGED
#define RS BLK_PERM_RESIZE

static struct loop *g_loop;
static char g_dir[] = "/var/tmp/ioplane-test-lock-XXXXXX";
static char g_err[512];

static void path(char *buf, size_t n, const char *name)
{
	snprintf(buf, n, "%s/%s", g_dir, name);
}

static struct blk_node *open_spec(const char *spec, int want)
{
	struct kv_opts o = {0};
	struct blk_node *bs = NULL;

	assert_int_equal(kv_parse(&o, spec, NULL), 0);
	assert_int_equal(blk_open(&o, &bs, g_err, sizeof(g_err)), want);
	kv_free(&o);
	return bs;
}

static struct blk_node *open_raw(const char *file, const char *extra)
{
	char spec[256];

	snprintf(spec, sizeof(spec), "driver=file,filename=%s,format=raw%s%s", file,
		 extra ? "," : "", extra ? extra : "");
	return open_spec(spec, 0);
}

/* Bits of the bytes 100+i (held) and 200+i (unshared) that any open file
 * other than a fresh one locks: what the others see. */
static void locked(const char *file, uint32_t *held, uint32_t *unshared)
{
	int fd = open(file, O_RDONLY);

	assert_true(fd >= 0);
	*held = *unshared = 0;
	for (unsigned i = 0; i < BLK_PERM_COUNT; i++) {
		for (unsigned k = 0; k < 2; k++) {
			struct flock fl = {.l_type = F_WRLCK,
					   .l_whence = SEEK_SET,
					   .l_start = (k ? 200 : 100) + i,
					   .l_len = 1};

			assert_int_equal(fcntl(fd, F_OFD_GETLK, &fl), 0);
			if (fl.l_type != F_UNLCK)
				*(k ? unshared : held) |= 1u << i;
		}
	}
	close(fd);
}

static void expect_locked(const char *file, uint32_t held, uint32_t unshared)
{
	uint32_t h, u;

	locked(file, &h, &u);
	assert_int_equal(h, held);
	assert_int_equal(u, unshared);
}

static void make_file(const char *file, off_t size)
{
	int fd = open(file, O_RDWR | O_CREAT | O_TRUNC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, size), 0);
	close(fd);
}

/* The lock bytes are QEMU's: a writable user that shares only reads holds
 * 100, 101 and refuses 201, 203 (write, resize). Another open of the file
 * that wants write is refused in QEMU's words; a reader that shares
 * everything is not. */
static void test_two_opens(void **state)
{
	char f[128];
	struct blk_node *a, *b;

	(void)state;
	path(f, sizeof(f), "two.raw");
	make_file(f, 1 << 20);
	a = open_raw(f, NULL);
	expect_locked(f, 0, 0); /* no users, no locks */
	assert_int_equal(blk_set_perm(a, CR | W, CR | WU, g_err, sizeof(g_err)), 0);
	expect_locked(f, CR | W, W | RS);
	b = open_raw(f, NULL);
	assert_int_equal(blk_set_perm(b, CR | W, BLK_PERM_ALL, g_err, sizeof(g_err)), -EBUSY);
	assert_non_null(strstr(g_err, "Failed to get \"write\" lock"));
	assert_non_null(strstr(g_err, "Is another process using the image ["));
	assert_non_null(strstr(g_err, f));
	assert_int_equal(b->user_perm, 0);
	assert_int_equal(blk_set_perm(b, CR, BLK_PERM_ALL, g_err, sizeof(g_err)), 0);
	/* b may not refuse to share write while a writes. */
	assert_int_equal(blk_set_perm(b, CR, CR, g_err, sizeof(g_err)), -EBUSY);
	assert_non_null(strstr(g_err, "Failed to get shared \"write\" lock"));
	blk_close(a); /* its locks go with its fd */
	expect_locked(f, CR, 0);
	assert_int_equal(blk_set_perm(b, CR | W | RS, 0, g_err, sizeof(g_err)), 0);
	expect_locked(f, CR | W | RS, BLK_PERM_ALL);
	assert_int_equal(blk_set_perm(b, CR, BLK_PERM_ALL, g_err, sizeof(g_err)), 0);
	expect_locked(f, CR, 0); /* a lower permission drops the bytes */
	blk_close(b);
	expect_locked(f, 0, 0);
	unlink(f);
}

/* A refused change leaves no extra lock behind: the node that failed and
 * the nodes prepared before it go back to what they held. qcow2 with an
 * external data file: the image file is prepared first (taking "write
 * unchanged", byte 102), the data file (held by a reader that does not
 * share write) refuses. */
static void test_all_or_nothing(void **state)
{
	struct qcow2_create_opts q = {.size = 1 << 20};
	char img[128], data[128], spec[512];
	struct blk_node *top, *holder;
	uint32_t h0, u0;

	(void)state;
	path(img, sizeof(img), "aon.qcow2");
	path(data, sizeof(data), "aon.data");
	q.data_file = data;
	assert_int_equal(qcow2_create(img, &q, g_err, sizeof(g_err)), 0);
	holder = open_raw(data, "read-only=on");
	assert_int_equal(blk_set_perm(holder, CR, CR | WU, g_err, sizeof(g_err)), 0);
	snprintf(spec, sizeof(spec), "driver=file,filename=%s,format=qcow2,data-file=%s", img,
		 data);
	top = open_spec(spec, 0);
	/* Open: the writable qcow2 holds its file, the data file nothing yet. */
	expect_locked(img, CR | W | RS, W | RS);
	locked(img, &h0, &u0);
	assert_int_equal(blk_set_perm(top, CR | W | WU, BLK_PERM_ALL, g_err, sizeof(g_err)),
			 -EBUSY);
	assert_non_null(strstr(g_err, data));
	expect_locked(img, h0, u0);
	blk_close(holder);
	expect_locked(data, 0, RS); /* the data file keeps its size for the qcow2 node */
	assert_int_equal(blk_set_perm(top, CR | W | WU, BLK_PERM_ALL, g_err, sizeof(g_err)), 0);
	expect_locked(img, CR | W | WU | RS, W | RS);
	expect_locked(data, CR | W | WU | RS, RS);
	blk_close(top);
	expect_locked(img, 0, 0);
	expect_locked(data, 0, 0);
	unlink(img);
	unlink(data);
}

/* Creating over an image in use is refused before anything is truncated. */
static void test_create(void **state)
{
	struct blk_node *a;
	struct stat st;
	char f[128];
	int fd;

	(void)state;
	path(f, sizeof(f), "create.raw");
	make_file(f, 1 << 20);
	a = open_raw(f, NULL);
	assert_int_equal(blk_set_perm(a, CR | W, BLK_PERM_ALL & ~RS, g_err, sizeof(g_err)), 0);
	fd = blk_file_create(f, BLK_CREATE_PERM, BLK_CREATE_SHARED, g_err, sizeof(g_err));
	assert_int_equal(fd, -EBUSY);
	assert_non_null(strstr(g_err, "\"resize\" lock"));
	assert_int_equal(stat(f, &st), 0);
	assert_int_equal(st.st_size, 1 << 20);
	expect_locked(f, CR | W, RS); /* the refused create holds nothing */
	blk_close(a);
	fd = blk_file_create(f, BLK_CREATE_PERM, BLK_CREATE_SHARED, g_err, sizeof(g_err));
	assert_true(fd >= 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_size, 0);
	expect_locked(f, W | RS, RS);
	close(fd);
	unlink(f);
}

static void test_options(void **state)
{
	struct blk_node *a, *b;
	char f[128], spec[256];

	(void)state;
	path(f, sizeof(f), "opts.raw");
	make_file(f, 1 << 20);
	a = open_raw(f, "locking=off");
	assert_int_equal(blk_set_perm(a, CR | W | RS, 0, g_err, sizeof(g_err)), 0);
	expect_locked(f, 0, 0);
	b = open_raw(f, "locking=on");
	assert_int_equal(blk_set_perm(b, CR | W | RS, 0, g_err, sizeof(g_err)), 0);
	expect_locked(f, CR | W | RS, BLK_PERM_ALL); /* a locked nothing to conflict with */
	blk_close(a);
	blk_close(b);
	/* force-share: read-only only; then nothing is refused to others. */
	snprintf(spec, sizeof(spec), "driver=file,filename=%s,format=raw,force-share=on", f);
	open_spec(spec, -EINVAL);
	assert_non_null(strstr(g_err, "force-share=on can only be used with read-only images"));
	a = open_raw(f, "read-only=on,force-share=on");
	assert_int_equal(blk_set_perm(a, CR, 0, g_err, sizeof(g_err)), 0);
	expect_locked(f, CR, 0);
	blk_close(a);
	snprintf(spec, sizeof(spec), "driver=file,filename=%s,format=raw,locking=maybe", f);
	open_spec(spec, -EINVAL);
	assert_non_null(strstr(g_err, "locking"));
	a = open_raw(f, "read-only=on");
	assert_int_equal(blk_set_perm(a, CR | W, BLK_PERM_ALL, g_err, sizeof(g_err)), -EROFS);
	blk_close(a);
	unlink(f);
}

static int group_setup(void **state)
{
	(void)state;
	if (!mkdtemp(g_dir) || loop_new(NULL, &g_loop) != 0)
		return -1;
	loop_bind_current(g_loop);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	loop_bind_current(NULL);
	loop_free(g_loop);
	rmdir(g_dir);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_two_opens),
		cmocka_unit_test(test_all_or_nothing),
		cmocka_unit_test(test_create),
		cmocka_unit_test(test_options),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
