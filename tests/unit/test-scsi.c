/* Unit tests for the SCSI command decoder (scsi.c): every command ioplane
 * answers, its data-in bytes and block operations, and fixed-format sense
 * for every error: bad fields, LBAs past the end (also where lba + length
 * overflows), write protection, missing LUNs, unknown operation codes,
 * CDBs cut short, and hostile UNMAP parameter lists. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "export/scsi.h"

static struct scsi_lu lu;
static uint8_t buf[SCSI_EMUL_MAX];
static struct scsi_cmd c;

static int setup(void **state)
{
	(void)state;
	lu = (struct scsi_lu){.blocks = 1000,
			      .block_size = 512,
			      .write_cache = true,
			      .discard = true,
			      .serial = "disk0",
			      .naa = 0x1234};
	memset(buf, 0xaa, sizeof(buf));
	return 0;
}

static void run(const uint8_t *cdb, size_t len)
{
	uint16_t luns[] = {0, 3, 300};

	scsi_decode(&lu, luns, 3, cdb, len, buf, &c);
}

static void want_check(uint8_t key, uint16_t asc)
{
	assert_int_equal(c.kind, SCSI_CHECK);
	assert_int_equal(c.key, key);
	assert_int_equal(c.asc, asc);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void test_inquiry(void **state)
{
	uint8_t std[6] = {0x12, 0, 0, 0, 96, 0}, vpd[6] = {0x12, 1, 0, 0, 255, 0};
	static const uint8_t pages[] = {0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2};

	(void)state;
	run(std, 6);
	assert_int_equal(c.kind, SCSI_DATA);
	assert_int_equal(c.len, 36);
	assert_int_equal(buf[0], 0x00); /* direct access */
	assert_memory_equal(buf + 8, "IOPLANE ", 8);
	std[4] = 5; /* allocation length cuts */
	run(std, 6);
	assert_int_equal(c.len, 5);
	run(vpd, 6);
	assert_int_equal(c.kind, SCSI_DATA);
	assert_int_equal(buf[3], sizeof(pages));
	assert_memory_equal(buf + 4, pages, sizeof(pages));
	vpd[2] = 0x80;
	run(vpd, 6);
	assert_int_equal(buf[3], 5);
	assert_memory_equal(buf + 4, "disk0", 5);
	vpd[2] = 0x83;
	run(vpd, 6);
	assert_int_equal(buf[4 + 1] & 0xf, 3); /* NAA designator */
	assert_int_equal(buf[8] >> 4, 3);      /* locally assigned */
	vpd[2] = 0xb0;
	run(vpd, 6);
	assert_int_equal(get32(buf + 8), (8u << 20) / 512); /* maximum transfer length */
	assert_int_equal(get32(buf + 24), SCSI_UNMAP_MAX);
	vpd[2] = 0xb1;
	run(vpd, 6);
	assert_int_equal(buf[5], 1); /* non-rotating */
	vpd[2] = 0xb2;
	run(vpd, 6);
	assert_int_equal(buf[5], 0xc0); /* LBPU, LBPWS */
	vpd[2] = 0x99;
	run(vpd, 6);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
	std[2] = 0x80; /* a page without EVPD */
	run(std, 6);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
}

static void test_missing_lun(void **state)
{
	uint8_t inq[6] = {0x12, 0, 0, 0, 36, 0}, tur[6] = {0}, rs[6] = {0x03, 0, 0, 0, 18, 0};

	(void)state;
	scsi_decode(NULL, NULL, 0, inq, 6, buf, &c);
	assert_int_equal(c.kind, SCSI_DATA);
	assert_int_equal(buf[0], 0x7f); /* no unit here */
	scsi_decode(NULL, NULL, 0, tur, 6, buf, &c);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LUN_NOT_SUPPORTED);
	scsi_decode(NULL, NULL, 0, rs, 6, buf, &c);
	assert_int_equal(c.kind, SCSI_DATA);
	assert_int_equal(buf[0], 0x70);
	assert_int_equal(buf[2], SCSI_SENSE_ILLEGAL_REQUEST);
	assert_int_equal(buf[12], 0x25);
}

static void test_report_luns(void **state)
{
	uint8_t cdb[12] = {0xa0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0};

	(void)state;
	run(cdb, 12);
	assert_int_equal(c.kind, SCSI_DATA);
	assert_int_equal(c.len, 32);
	assert_int_equal(get32(buf), 24);
	assert_int_equal(buf[8 + 8 + 1], 3); /* LUN 3: peripheral */
	assert_int_equal(buf[8 + 16], 0x41); /* LUN 300: flat space */
	assert_int_equal(buf[8 + 16 + 1], 44);
	cdb[8] = 0;
	cdb[9] = 15; /* less than 16 */
	run(cdb, 12);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
}

static void test_capacity(void **state)
{
	uint8_t rc10[10] = {0x25}, rc16[16] = {0x9e, 0x10};

	(void)state;
	run(rc10, 10);
	assert_int_equal(c.kind, SCSI_DATA);
	assert_int_equal(get32(buf), 999);
	assert_int_equal(get32(buf + 4), 512);
	rc16[13] = 32;
	run(rc16, 16);
	assert_int_equal(c.len, 32);
	assert_int_equal(get32(buf + 4), 999);
	assert_int_equal(buf[14] & 0x80, 0x80); /* LBPME */
	lu.blocks = 1ull << 33;
	run(rc10, 10);
	assert_int_equal(get32(buf), 0xffffffffu); /* too big for 10: use 16 */
	rc16[1] = 0x11;
	run(rc16, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
}

static void test_read_write(void **state)
{
	uint8_t r6[6] = {0x08, 0, 0, 10, 0, 0}, w10[10] = {0x2a, 0x08, 0, 0, 0, 100, 0, 0, 8, 0};
	uint8_t r16[16] = {0x88};

	(void)state;
	run(r6, 6);
	assert_int_equal(c.kind, SCSI_READ);
	assert_int_equal(c.lba, 10);
	assert_int_equal(c.nblocks, 256); /* 0 means 256 */
	run(w10, 10);
	assert_int_equal(c.kind, SCSI_WRITE);
	assert_int_equal(c.lba, 100);
	assert_int_equal(c.nblocks, 8);
	assert_true(c.fua);
	r16[13] = 1;
	r16[8] = 0x03;
	r16[9] = 0xe7; /* lba 999: the last block */
	run(r16, 16);
	assert_int_equal(c.kind, SCSI_READ);
	r16[13] = 2; /* one past the end */
	run(r16, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LBA_OUT_OF_RANGE);
	memset(r16 + 2, 0xff, 8); /* lba + length wraps */
	run(r16, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LBA_OUT_OF_RANGE);
	lu.blocks = 1ull << 40;
	memset(r16 + 2, 0, 8);
	r16[10] = 0x01; /* 16 M blocks: more than one transfer may carry */
	r16[13] = 0;
	run(r16, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
	r16[10] = 0;
	r16[1] = 0x20; /* RDPROTECT */
	r16[13] = 1;
	run(r16, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
	lu.read_only = true;
	run(w10, 10);
	want_check(SCSI_SENSE_DATA_PROTECT, SCSI_ASC_WRITE_PROTECTED);
	lu.read_only = false;
	lu.write_cache = false; /* write-through: every write is FUA */
	w10[1] = 0;
	run(w10, 10);
	assert_true(c.fua);
}

/* scsi_decode_rw(), the READ/WRITE path the transport takes first: it
 * takes exactly the six READ and WRITE opcodes (not READ/WRITE 12 and the
 * like that share their low bits) and checks them as scsi_decode() does. */
static void test_rw_path(void **state)
{
	static const uint8_t rw[] = {0x08, 0x0a, 0x28, 0x2a, 0x88, 0x8a};
	uint8_t cdb[16] = {0};
	struct scsi_cmd d;

	(void)state;
	for (unsigned op = 0; op < 256; op++) {
		bool want = memchr(rw, (int)op, sizeof(rw)) != NULL;

		cdb[0] = (uint8_t)op;
		cdb[4] = op >> 5 ? 0 : 1; /* a block for the 6-byte ones */
		assert_int_equal(scsi_decode_rw(&lu, cdb, 16, &d), want);
		if (!want)
			continue;
		run(cdb, 16);
		assert_memory_equal(&c, &d, sizeof(c));
		assert_int_equal(c.kind, op & 0x02 ? SCSI_WRITE : SCSI_READ);
		assert_true(scsi_decode_rw(NULL, cdb, 16, &d)); /* no such unit */
		assert_int_equal(d.kind, SCSI_CHECK);
		assert_int_equal(d.asc, SCSI_ASC_LUN_NOT_SUPPORTED);
		assert_true(scsi_decode_rw(&lu, cdb, op >> 5 ? 9 : 5, &d)); /* cut short */
		assert_int_equal(d.asc, SCSI_ASC_INVALID_FIELD_CDB);
	}
	assert_false(scsi_decode_rw(&lu, cdb, 0, &d));
	cdb[0] = 0x2a;
	cdb[9] = 0x04; /* NACA */
	assert_true(scsi_decode_rw(&lu, cdb, 16, &d));
	assert_int_equal(d.kind, SCSI_CHECK);
	assert_int_equal(d.asc, SCSI_ASC_INVALID_FIELD_CDB);
	cdb[0] = 0xa8; /* READ 12: not offered */
	run(cdb, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_OPCODE);
}

static void test_write_same_unmap(void **state)
{
	uint8_t ws[16] = {0x93, 0x08, 0, 0, 0, 0, 0, 0, 0, 10, 0, 0, 0, 5, 0, 0};
	uint8_t um[10] = {0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0};

	(void)state;
	run(ws, 16);
	assert_int_equal(c.kind, SCSI_WRITE_SAME);
	assert_true(c.unmap);
	assert_int_equal(c.lba, 10);
	assert_int_equal(c.nblocks, 5);
	ws[13] = 0; /* WSNZ */
	run(ws, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
	ws[13] = 0xff;
	ws[12] = 0xff;
	run(ws, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LBA_OUT_OF_RANGE);
	run(um, 10);
	assert_int_equal(c.kind, SCSI_UNMAP);
	assert_int_equal(c.len, 24);
	lu.discard = false;
	run(um, 10);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_OPCODE);
	lu.discard = true;
	lu.read_only = true;
	run(um, 10);
	want_check(SCSI_SENSE_DATA_PROTECT, SCSI_ASC_WRITE_PROTECTED);
}

static void test_unmap_list(void **state)
{
	uint8_t p[8 + 16 * (SCSI_UNMAP_MAX + 1)] = {0};
	struct scsi_extent x[SCSI_UNMAP_MAX];

	(void)state;
	p[1] = 22;
	p[3] = 16;
	p[8 + 7] = 100; /* lba 100 */
	p[8 + 11] = 50; /* 50 blocks */
	assert_int_equal(scsi_unmap_list(&lu, p, 24, x, &c), 1);
	assert_int_equal(x[0].lba, 100);
	assert_int_equal(x[0].nblocks, 50);
	assert_int_equal(scsi_unmap_list(&lu, p, 0, x, &c), 0);
	assert_int_equal(scsi_unmap_list(&lu, p, 7, x, &c), -1);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_PARAM_LIST_LENGTH);
	p[3] = 32; /* descriptors past the list */
	assert_int_equal(scsi_unmap_list(&lu, p, 24, x, &c), -1);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_PARAM_LIST_LENGTH);
	p[3] = 16;
	p[8 + 11] = 0xff;
	p[8 + 10] = 0xff; /* past the end */
	assert_int_equal(scsi_unmap_list(&lu, p, 24, x, &c), -1);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LBA_OUT_OF_RANGE);
	p[0] = (uint8_t)((sizeof(p) - 2) >> 8);
	p[1] = (uint8_t)(sizeof(p) - 2);
	p[2] = (uint8_t)((sizeof(p) - 8) >> 8);
	p[3] = (uint8_t)(sizeof(p) - 8); /* one descriptor too many */
	p[8 + 10] = 0;
	p[8 + 11] = 1;
	assert_int_equal(scsi_unmap_list(&lu, p, sizeof(p), x, &c), -1);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_PARAM);
}

static void test_mode_sense(void **state)
{
	uint8_t ms6[6] = {0x1a, 0, 0x08, 0, 255, 0},
		ms10[10] = {0x5a, 0x08, 0x3f, 0, 0, 0, 0, 1, 0, 0};

	(void)state;
	run(ms6, 6);
	assert_int_equal(c.kind, SCSI_DATA);
	assert_int_equal(c.len, 4 + 8 + 20);
	assert_int_equal(buf[0], c.len - 1);
	assert_int_equal(buf[3], 8);            /* block descriptor */
	assert_int_equal(buf[4 + 8], 0x08);     /* caching page */
	assert_int_equal(buf[4 + 8 + 2], 0x04); /* WCE */
	lu.write_cache = false;
	lu.read_only = true;
	run(ms6, 6);
	assert_int_equal(buf[4 + 8 + 2], 0);
	assert_int_equal(buf[2] & 0x80, 0x80); /* write protected */
	run(ms10, 10);                         /* all pages, no block descriptor */
	assert_int_equal(c.len, 8 + 20 + 12);
	assert_int_equal(buf[8], 0x08);
	assert_int_equal(buf[8 + 20], 0x0a);
	ms6[2] = 0xc8; /* saved values */
	run(ms6, 6);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, 0x3900);
	ms6[2] = 0x19; /* a page we do not have */
	run(ms6, 6);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
}

static void test_misc(void **state)
{
	uint8_t tur[6] = {0}, sc10[10] = {0x35}, sc16[16] = {0x91}, bad[16] = {0xc0};
	uint8_t naca[6] = {0, 0, 0, 0, 0, 0x04}, rs[6] = {0x03, 0, 0, 0, 252, 0};

	(void)state;
	run(tur, 6);
	assert_int_equal(c.kind, SCSI_DATA);
	assert_int_equal(c.len, 0);
	run(sc10, 10);
	assert_int_equal(c.kind, SCSI_SYNC);
	sc16[2] = 0xff;
	run(sc16, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LBA_OUT_OF_RANGE);
	run(bad, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_OPCODE);
	bad[0] = 0x4f; /* unsupported 10-byte opcode */
	run(bad, 16);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_OPCODE);
	run(naca, 6);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
	run(sc16, 10); /* cut short */
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
	run(sc16, 0);
	want_check(SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
	run(rs, 6);
	assert_int_equal(c.len, SCSI_SENSE_LEN);
	assert_int_equal(buf[0], 0x70);
	assert_int_equal(buf[2], SCSI_SENSE_NO_SENSE);
	scsi_sense_fixed(buf, SCSI_SENSE_MEDIUM_ERROR, SCSI_ASC_UNRECOVERED_READ);
	assert_int_equal(buf[7], 10);
	assert_int_equal(buf[12], 0x11);
	assert_int_equal(buf[13], 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_inquiry, setup),
		cmocka_unit_test_setup(test_missing_lun, setup),
		cmocka_unit_test_setup(test_report_luns, setup),
		cmocka_unit_test_setup(test_capacity, setup),
		cmocka_unit_test_setup(test_read_write, setup),
		cmocka_unit_test_setup(test_rw_path, setup),
		cmocka_unit_test_setup(test_write_same_unmap, setup),
		cmocka_unit_test_setup(test_unmap_list, setup),
		cmocka_unit_test_setup(test_mode_sense, setup),
		cmocka_unit_test_setup(test_misc, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
