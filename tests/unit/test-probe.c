/* Unit tests for format probing (probe.c): every format qemu-img probes is
 * recognised from a header built from its specification, near misses stay
 * raw, and blk_probe_format refuses what blk_open cannot open. Threading:
 * the test thread only. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "block/block.h"

static uint8_t g_buf[512];

static const char *probe(void)
{
	return blk_probe_buf(g_buf, sizeof(g_buf), NULL, 0, NULL);
}

static void put(size_t off, const void *p, size_t n)
{
	memcpy(g_buf + off, p, n);
}

static void put_le32(size_t off, uint32_t v)
{
	uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};

	put(off, b, 4);
}

static void put_be32(size_t off, uint32_t v)
{
	uint8_t b[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};

	put(off, b, 4);
}

static void reset(void)
{
	memset(g_buf, 0, sizeof(g_buf));
}

static void test_raw(void **state)
{
	(void)state;
	reset();
	assert_string_equal(probe(), "raw");
	memset(g_buf, 0xa5, sizeof(g_buf));
	assert_string_equal(probe(), "raw");
	assert_string_equal(blk_probe_buf(g_buf, 0, NULL, 0, NULL), "raw");
	/* A signature cut short by the end of the file is no signature. */
	reset();
	put(0, "vhdxfile", 8);
	assert_string_equal(blk_probe_buf(g_buf, 7, NULL, 0, NULL), "raw");
}

static void test_qcow(void **state)
{
	(void)state;
	for (uint32_t v = 1; v <= 3; v++) {
		reset();
		put(0, "QFI\xfb", 4);
		put_be32(4, v);
		assert_string_equal(probe(), v == 1 ? "qcow" : "qcow2");
	}
	reset();
	put(0, "QFI\xfa", 4);
	assert_string_equal(probe(), "raw");
}

static void test_simple_magics(void **state)
{
	static const struct {
		const char *magic;
		size_t len;
		const char *fmt;
	} t[] = {
		{"QED\0", 4, "qed"},
		{"KDMV", 4, "vmdk"},
		{"COWD", 4, "vmdk"},
		{"vhdxfile", 8, "vhdx"},
		{"conectix", 8, "vpc"},
		{"LUKS\xba\xbe\0\1", 8, "luks"},
		{"LUKS\xba\xbe\0\2", 8, "luks"},
	};

	(void)state;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		reset();
		put(0, t[i].magic, t[i].len);
		assert_string_equal(probe(), t[i].fmt);
		g_buf[1] ^= 0x20; /* one byte off */
		assert_string_equal(probe(), "raw");
	}
}

static void test_vdi_parallels(void **state)
{
	(void)state;
	reset();
	put(0, "<<< Oracle VM VirtualBox Disk Image >>>\n", 40);
	put_le32(64, 0xbeda107f);
	assert_string_equal(probe(), "vdi");
	put_le32(64, 0xbeda1070);
	assert_string_equal(probe(), "raw");

	reset();
	put(0, "WithoutFreeSpace", 16);
	put_le32(16, 2);
	assert_string_equal(probe(), "parallels");
	put(0, "WithouFreSpacExt", 16);
	assert_string_equal(probe(), "parallels");
	put_le32(16, 3);
	assert_string_equal(probe(), "raw");
}

static void test_vmdk_descriptor(void **state)
{
	static const char *const yes[] = {
		"# Disk DescriptorFile\nversion=1\nCID=fffffffe\n",
		"# Disk DescriptorFile\r\nversion=3\r\n",
		"version=2\n",
		"#\n#\n  \n\nversion=1\n",
	};
	static const char *const no[] = {
		"# Disk DescriptorFile\nversion=4\n",
		"# Disk DescriptorFile\nCID=1\nversion=1\n",
		"version=1",
		"x version=1\n",
	};

	(void)state;
	for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
		reset();
		put(0, yes[i], strlen(yes[i]));
		assert_string_equal(probe(), "vmdk");
	}
	for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
		reset();
		put(0, no[i], strlen(no[i]));
		assert_string_equal(blk_probe_buf(g_buf, strlen(no[i]), NULL, 0, NULL), "raw");
	}
}

static void test_cloop_bochs(void **state)
{
	static const char cloop[] = "#!/bin/sh\n#V2.0 Format\n"
				    "modprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n";

	(void)state;
	reset();
	put(0, cloop, sizeof(cloop) - 1);
	assert_string_equal(probe(), "cloop");
	g_buf[15] = '1';
	assert_string_equal(probe(), "raw");

	reset();
	put(0, "Bochs Virtual HD Image", 23);
	put(32, "Redolog", 8);
	put(48, "Growing", 8);
	put_le32(64, 0x00020000);
	assert_string_equal(probe(), "bochs");
	put_le32(64, 0x00010000);
	assert_string_equal(probe(), "bochs");
	put_le32(64, 0x00030000);
	assert_string_equal(probe(), "raw");
	put_le32(64, 0x00020000);
	g_buf[48 + 7] = 'x'; /* "Growingx": not the NUL-terminated subtype */
	assert_string_equal(probe(), "raw");
}

static void test_dmg(void **state)
{
	uint8_t tail[512] = {0};

	(void)state;
	reset();
	assert_string_equal(blk_probe_buf(g_buf, 512, NULL, 0, "disk.dmg"), "dmg");
	assert_string_equal(blk_probe_buf(g_buf, 512, NULL, 0, "disk.dmg.raw"), "raw");
	memcpy(tail, "koly", 4);
	assert_string_equal(blk_probe_buf(g_buf, 512, tail, 512, "disk.img"), "dmg");
	tail[0] = 'K';
	assert_string_equal(blk_probe_buf(g_buf, 512, tail, 512, "disk.img"), "raw");
}

static void test_probe_file(void **state)
{
	char path[64] = "/var/tmp/ioplane-test-probe-XXXXXX", err[512];
	const char *fmt = NULL;
	int fd = mkstemp(path);

	(void)state;
	assert_true(fd >= 0);
	assert_int_equal(blk_probe_format(path, &fmt, err, sizeof(err)), 0);
	assert_string_equal(fmt, "raw"); /* empty */
	assert_int_equal(pwrite(fd, "QFI\xfb\0\0\0\3", 8, 0), 8);
	assert_int_equal(blk_probe_format(path, &fmt, err, sizeof(err)), 0);
	assert_string_equal(fmt, "qcow2");
	assert_int_equal(pwrite(fd, "KDMV", 4, 0), 4);
	assert_int_equal(blk_probe_file(path, &fmt, err, sizeof(err)), 0);
	assert_string_equal(fmt, "vmdk");
	assert_int_equal(blk_probe_format(path, &fmt, err, sizeof(err)), -ENOTSUP);
	assert_non_null(strstr(err, "is a vmdk image"));
	assert_non_null(strstr(err, path));
	/* The dmg trailer sits in the last 512 bytes of a larger file. */
	assert_int_equal(pwrite(fd, "\0\0\0\0", 4, 0), 4);
	assert_int_equal(pwrite(fd, "koly", 4, 4096 - 512), 4);
	assert_int_equal(ftruncate(fd, 4096), 0);
	assert_int_equal(blk_probe_file(path, &fmt, err, sizeof(err)), 0);
	assert_string_equal(fmt, "dmg");
	close(fd);
	unlink(path);
	assert_int_equal(blk_probe_file(path, &fmt, err, sizeof(err)), -ENOENT);
	assert_int_equal(blk_probe_file("/dev/zero", &fmt, err, sizeof(err)), -EINVAL);
	assert_true(blk_format_supported("raw") && blk_format_supported("qcow2"));
	assert_false(blk_format_supported("qcow") || blk_format_supported(NULL));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_raw),
		cmocka_unit_test(test_qcow),
		cmocka_unit_test(test_simple_magics),
		cmocka_unit_test(test_vdi_parallels),
		cmocka_unit_test(test_vmdk_descriptor),
		cmocka_unit_test(test_cloop_bochs),
		cmocka_unit_test(test_dmg),
		cmocka_unit_test(test_probe_file),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
