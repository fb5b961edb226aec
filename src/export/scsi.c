/* SCSI block commands for one direct-access logical unit (see scsi.h):
 * SPC-5 INQUIRY (standard and the VPD pages Linux and Windows read), REPORT
 * LUNS, MODE SENSE, REQUEST SENSE, and SBC-4 READ CAPACITY, READ/WRITE
 * 6/10/16, WRITE SAME 16, UNMAP and SYNCHRONIZE CACHE. The CDB is
 * untrusted: lengths and LBAs are checked before anything acts on them.
 *
 * THREADING RULE: pure functions; callable from any thread. */
#include <string.h>

#include "export/scsi.h"

#define OP_TEST_UNIT_READY 0x00
#define OP_REQUEST_SENSE 0x03
#define OP_READ_6 0x08
#define OP_WRITE_6 0x0a
#define OP_INQUIRY 0x12
#define OP_MODE_SENSE_6 0x1a
#define OP_READ_CAPACITY_10 0x25
#define OP_READ_10 0x28
#define OP_WRITE_10 0x2a
#define OP_SYNC_CACHE_10 0x35
#define OP_UNMAP 0x42
#define OP_MODE_SENSE_10 0x5a
#define OP_READ_16 0x88
#define OP_WRITE_16 0x8a
#define OP_SYNC_CACHE_16 0x91
#define OP_WRITE_SAME_16 0x93
#define OP_SERVICE_ACTION_IN_16 0x9e
#define SA_READ_CAPACITY_16 0x10
#define OP_REPORT_LUNS 0xa0

#define MODE_PAGE_CACHING 0x08
#define MODE_PAGE_CONTROL 0x0a
#define MODE_PAGE_ALL 0x3f
#define MAX_XFER_BYTES (8u << 20) /* one READ/WRITE; virtio-scsi max_sectors too */
#define MAX_WS_BYTES (1ull << 31) /* one WRITE SAME, one UNMAP range */
#define ASC_SAVING_NOT_SUPPORTED 0x3900

/* Inline: the compiler makes each one load and a byte swap. */
static inline uint16_t be16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static inline uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static inline uint64_t be64(const uint8_t *p)
{
	return (uint64_t)be32(p) << 32 | be32(p + 4);
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}

static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}

void scsi_sense_fixed(uint8_t *sense, uint8_t key, uint16_t asc)
{
	memset(sense, 0, SCSI_SENSE_LEN);
	sense[0] = 0x70; /* current error, fixed format */
	sense[2] = key & 0xf;
	sense[7] = SCSI_SENSE_LEN - 8;
	sense[12] = (uint8_t)(asc >> 8);
	sense[13] = (uint8_t)asc;
}

void scsi_check(struct scsi_cmd *c, uint8_t key, uint16_t asc)
{
	c->kind = SCSI_CHECK;
	c->key = key;
	c->asc = asc;
	c->len = 0;
}

static void invalid_cdb(struct scsi_cmd *c)
{
	scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_CDB);
}

void scsi_lun_encode(uint16_t lun, uint8_t out[8])
{
	memset(out, 0, 8);
	if (lun < 256) { /* peripheral device addressing */
		out[1] = (uint8_t)lun;
		return;
	}
	out[0] = (uint8_t)(0x40 | (lun >> 8)); /* flat space */
	out[1] = (uint8_t)lun;
}

/* Data-in of len bytes, cut to the allocation length. */
static void data(struct scsi_cmd *c, uint32_t len, uint32_t alloc)
{
	c->kind = SCSI_DATA;
	c->len = len < alloc ? len : alloc;
}

/* [lba, lba + n) inside the unit. */
static bool range_ok(const struct scsi_lu *lu, uint64_t lba, uint64_t n)
{
	return lba <= lu->blocks && n <= lu->blocks - lba;
}

/* ---- INQUIRY ------------------------------------------------------------------------ */

static uint32_t inquiry_std(const struct scsi_lu *lu, uint8_t *b)
{
	memset(b, 0, 36);
	b[0] = lu ? 0x00 : 0x7f; /* direct access; or no unit here (qualifier 3) */
	b[2] = 0x07;             /* SPC-5 */
	b[3] = 0x12;             /* HISUP, response data format 2 */
	b[4] = 36 - 5;
	b[7] = 0x02; /* CMDQUE */
	memcpy(b + 8, "IOPLANE ", 8);
	memcpy(b + 16, "ioplane disk    ", 16);
	memcpy(b + 32, "0.1 ", 4);
	return 36;
}

static uint32_t vpd_serial(const struct scsi_lu *lu, uint8_t *b)
{
	size_t n = lu->serial ? strnlen(lu->serial, 252) : 0;

	memcpy(b + 4, lu->serial ? lu->serial : "", n);
	b[3] = (uint8_t)n;
	return 4 + (uint32_t)n;
}

static uint32_t vpd_ident(const struct scsi_lu *lu, uint8_t *b)
{
	uint8_t *d = b + 4;

	d[0] = 0x01; /* binary */
	d[1] = 0x03; /* logical unit, NAA */
	d[3] = 8;
	put64(d + 4, 0x3ull << 60 | (lu->naa & ((1ull << 60) - 1))); /* NAA 3: local */
	b[3] = 12;
	return 16;
}

static uint32_t vpd_limits(const struct scsi_lu *lu, uint8_t *b)
{
	uint32_t bs = lu->block_size;

	b[3] = 0x3c;
	b[4] = 0x01; /* WSNZ: WRITE SAME of 0 blocks is refused */
	put16(b + 6, 1);
	put32(b + 8, MAX_XFER_BYTES / bs);
	put32(b + 12, MAX_XFER_BYTES / bs);
	if (lu->discard) {
		put32(b + 20, (uint32_t)(MAX_WS_BYTES / bs));
		put32(b + 24, SCSI_UNMAP_MAX);
		put32(b + 28, 1);
	}
	put64(b + 36, MAX_WS_BYTES / bs);
	return 4 + 0x3c;
}

static uint32_t vpd_page(const struct scsi_lu *lu, uint8_t page, uint8_t *b, struct scsi_cmd *c)
{
	static const uint8_t pages[] = {0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2};

	memset(b, 0, 64);
	b[1] = page;
	switch (page) {
	case 0x00:
		b[3] = sizeof(pages);
		memcpy(b + 4, pages, sizeof(pages));
		return 4 + sizeof(pages);
	case 0x80:
		return vpd_serial(lu, b);
	case 0x83:
		return vpd_ident(lu, b);
	case 0xb0:
		return vpd_limits(lu, b);
	case 0xb1:
		b[3] = 0x3c;
		put16(b + 4, 1); /* non-rotating medium */
		return 4 + 0x3c;
	case 0xb2:
		b[3] = 4;
		b[5] = lu->discard ? 0xc0 : 0; /* LBPU, LBPWS */
		b[6] = lu->discard ? 0x02 : 0; /* thin provisioned */
		return 8;
	default:
		invalid_cdb(c);
		return 0;
	}
}

static void do_inquiry(const struct scsi_lu *lu, const uint8_t *cdb, uint8_t *buf,
		       struct scsi_cmd *c)
{
	uint16_t alloc = be16(cdb + 3);
	uint32_t n;

	if (cdb[1] & 0xfe || (!(cdb[1] & 1) && cdb[2])) /* CMDDT, or a page without EVPD */
		return invalid_cdb(c);
	if (!(cdb[1] & 1))
		return data(c, inquiry_std(lu, buf), alloc);
	if (!lu)
		return scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LUN_NOT_SUPPORTED);
	n = vpd_page(lu, cdb[2], buf, c);
	if (n)
		data(c, n, alloc);
}

/* ---- REPORT LUNS, REQUEST SENSE, READ CAPACITY -------------------------------------- */

static void do_report_luns(const uint16_t *luns, unsigned nluns, const uint8_t *cdb, uint8_t *buf,
			   struct scsi_cmd *c)
{
	uint32_t alloc = be32(cdb + 6), i, n;

	if (cdb[2] > 2 || alloc < 16)
		return invalid_cdb(c);
	n = cdb[2] == 1 || nluns > SCSI_MAX_LUNS ? 0 : nluns; /* 1: well-known LUNs only */
	if (cdb[2] == 1)
		n = 0;
	memset(buf, 0, 8);
	put32(buf, 8 * n);
	for (i = 0; i < n; i++)
		scsi_lun_encode(luns[i], buf + 8 + 8 * i);
	data(c, 8 + 8 * n, alloc);
}

static void do_request_sense(const struct scsi_lu *lu, const uint8_t *cdb, uint8_t *buf,
			     struct scsi_cmd *c)
{
	/* Sense goes with each CHECK CONDITION (autosense): none is pending. */
	if (lu)
		scsi_sense_fixed(buf, SCSI_SENSE_NO_SENSE, SCSI_ASC_NONE);
	else
		scsi_sense_fixed(buf, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LUN_NOT_SUPPORTED);
	data(c, SCSI_SENSE_LEN, cdb[4]);
}

static void do_read_capacity(const struct scsi_lu *lu, const uint8_t *cdb, bool sixteen,
			     uint8_t *buf, struct scsi_cmd *c)
{
	uint64_t last = lu->blocks ? lu->blocks - 1 : 0;

	if (!sixteen) {
		/* PMI and an LBA are obsolete: refused as SBC-4 allows. */
		if (cdb[8] & 1 || be32(cdb + 2))
			return invalid_cdb(c);
		put32(buf, last > 0xffffffffull ? 0xffffffffu : (uint32_t)last);
		put32(buf + 4, lu->block_size);
		return data(c, 8, 8);
	}
	memset(buf, 0, 32);
	put64(buf, last);
	put32(buf + 8, lu->block_size);
	buf[14] = lu->discard ? 0x80 : 0; /* LBPME */
	data(c, 32, be32(cdb + 10));
}

/* ---- MODE SENSE ---------------------------------------------------------------------- */

/* The pages asked for at p; changeable: the mask of what MODE SELECT could
 * change (nothing). Returns their length, 0 for an unknown page. */
static uint32_t mode_pages(const struct scsi_lu *lu, uint8_t page, bool changeable, uint8_t *p)
{
	uint32_t n = 0;

	if (page == MODE_PAGE_CACHING || page == MODE_PAGE_ALL) {
		memset(p, 0, 20);
		p[0] = MODE_PAGE_CACHING;
		p[1] = 18;
		if (!changeable && lu->write_cache)
			p[2] = 0x04; /* WCE */
		n += 20;
	}
	if (page == MODE_PAGE_CONTROL || page == MODE_PAGE_ALL) {
		memset(p + n, 0, 12);
		p[n] = MODE_PAGE_CONTROL;
		p[n + 1] = 10;
		n += 12;
	}
	return n;
}

static void do_mode_sense(const struct scsi_lu *lu, const uint8_t *cdb, bool ten, uint8_t *buf,
			  struct scsi_cmd *c)
{
	uint32_t hdr = ten ? 8 : 4, bd = cdb[1] & 0x08 ? 0 : 8, n;
	uint8_t pc = cdb[2] >> 6, page = cdb[2] & 0x3f;
	uint64_t blocks = lu->blocks > 0xffffff ? 0xffffff : lu->blocks;

	if (pc == 3)
		return scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, ASC_SAVING_NOT_SUPPORTED);
	if (cdb[3] && cdb[3] != 0xff) /* subpages: none */
		return invalid_cdb(c);
	memset(buf, 0, hdr + bd);
	n = mode_pages(lu, page, pc == 1, buf + hdr + bd);
	if (!n)
		return invalid_cdb(c);
	buf[ten ? 3 : 2] = (uint8_t)((lu->read_only ? 0x80 : 0) | 0x10); /* WP, DPOFUA */
	if (bd) {
		uint8_t *d = buf + hdr;

		d[1] = (uint8_t)(blocks >> 16);
		d[2] = (uint8_t)(blocks >> 8);
		d[3] = (uint8_t)blocks;
		put32(d + 4, lu->block_size & 0xffffff);
	}
	n += hdr + bd;
	if (ten) {
		put16(buf, (uint16_t)(n - 2));
		put16(buf + 6, (uint16_t)bd);
		return data(c, n, be16(cdb + 7));
	}
	buf[0] = (uint8_t)(n - 1);
	buf[3] = (uint8_t)bd;
	data(c, n, cdb[4]);
}

/* ---- block commands ------------------------------------------------------------------ */

/* READ/WRITE 6/10/16 decoded into lba and nblocks. */
static void rw_fields(const uint8_t *cdb, struct scsi_cmd *c)
{
	switch (cdb[0] >> 5) {
	case 0: /* 6-byte: a length of 0 means 256 */
		c->lba = (uint64_t)(cdb[1] & 0x1f) << 16 | be16(cdb + 2);
		c->nblocks = cdb[4] ? cdb[4] : 256;
		break;
	case 1:
		c->lba = be32(cdb + 2);
		c->nblocks = be16(cdb + 7);
		c->fua = cdb[1] & 0x08;
		break;
	default:
		c->lba = be64(cdb + 2);
		c->nblocks = be32(cdb + 10);
		c->fua = cdb[1] & 0x08;
		break;
	}
}

static void do_rw(const struct scsi_lu *lu, const uint8_t *cdb, bool write, struct scsi_cmd *c)
{
	rw_fields(cdb, c);
	if (cdb[0] >> 5 && cdb[1] & 0xe0) /* RDPROTECT/WRPROTECT: no protection info */
		return invalid_cdb(c);
	if (!range_ok(lu, c->lba, c->nblocks))
		return scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LBA_OUT_OF_RANGE);
	if ((uint64_t)c->nblocks * lu->block_size > MAX_XFER_BYTES)
		return invalid_cdb(c);
	if (write && lu->read_only)
		return scsi_check(c, SCSI_SENSE_DATA_PROTECT, SCSI_ASC_WRITE_PROTECTED);
	c->kind = write ? SCSI_WRITE : SCSI_READ;
	if (!lu->write_cache)
		c->fua = write;
}

static void do_sync(const struct scsi_lu *lu, const uint8_t *cdb, bool sixteen, struct scsi_cmd *c)
{
	uint64_t lba = sixteen ? be64(cdb + 2) : be32(cdb + 2);
	uint32_t n = sixteen ? be32(cdb + 10) : be16(cdb + 7);

	if (!range_ok(lu, lba, n))
		return scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LBA_OUT_OF_RANGE);
	c->kind = SCSI_SYNC; /* the whole cache: cheaper than tracking ranges */
}

static void do_write_same(const struct scsi_lu *lu, const uint8_t *cdb, struct scsi_cmd *c)
{
	c->lba = be64(cdb + 2);
	c->nblocks = be32(cdb + 10);
	c->unmap = cdb[1] & 0x08;
	c->ndob = cdb[1] & 0x01;
	if (cdb[1] & 0xf6 || !c->nblocks) /* WRPROTECT, ANCHOR; WSNZ */
		return invalid_cdb(c);
	if (!range_ok(lu, c->lba, c->nblocks))
		return scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LBA_OUT_OF_RANGE);
	if ((uint64_t)c->nblocks * lu->block_size > MAX_WS_BYTES)
		return invalid_cdb(c);
	if (lu->read_only)
		return scsi_check(c, SCSI_SENSE_DATA_PROTECT, SCSI_ASC_WRITE_PROTECTED);
	c->kind = SCSI_WRITE_SAME;
	c->fua = !lu->write_cache;
}

static void do_unmap(const struct scsi_lu *lu, const uint8_t *cdb, struct scsi_cmd *c)
{
	if (!lu->discard)
		return scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_OPCODE);
	if (cdb[1] & 0x01) /* ANCHOR */
		return invalid_cdb(c);
	if (lu->read_only)
		return scsi_check(c, SCSI_SENSE_DATA_PROTECT, SCSI_ASC_WRITE_PROTECTED);
	c->kind = SCSI_UNMAP;
	c->len = be16(cdb + 7);
}

int scsi_unmap_list(const struct scsi_lu *lu, const uint8_t *p, size_t len, struct scsi_extent *out,
		    struct scsi_cmd *c)
{
	uint32_t bdl, n, i;

	if (len == 0)
		return 0;
	if (len < 8) {
		scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_PARAM_LIST_LENGTH);
		return -1;
	}
	bdl = be16(p + 2);
	if (bdl > len - 8 || (uint32_t)be16(p) + 2 > len) {
		scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_PARAM_LIST_LENGTH);
		return -1;
	}
	n = bdl / 16; /* a partial last descriptor is ignored */
	if (n > SCSI_UNMAP_MAX) {
		scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_PARAM);
		return -1;
	}
	for (i = 0; i < n; i++) {
		out[i].lba = be64(p + 8 + 16 * i);
		out[i].nblocks = be32(p + 16 + 16 * i);
		if (!range_ok(lu, out[i].lba, out[i].nblocks)) {
			scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LBA_OUT_OF_RANGE);
			return -1;
		}
		if ((uint64_t)out[i].nblocks * lu->block_size > MAX_WS_BYTES) {
			scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_FIELD_PARAM);
			return -1;
		}
	}
	return (int)n;
}

/* ---- dispatch ------------------------------------------------------------------------- */

/* The CDB length its operation code's group gives; 0: a group we do not know. */
static size_t cdb_size(uint8_t op)
{
	static const uint8_t by_group[8] = {6, 10, 10, 0, 16, 12, 0, 0};

	return by_group[op >> 5];
}

/* Commands that need an existing unit. */
static void decode_lu(const struct scsi_lu *lu, const uint8_t *cdb, uint8_t *buf,
		      struct scsi_cmd *c)
{
	switch (cdb[0]) {
	case OP_TEST_UNIT_READY:
		return data(c, 0, 0);
	case OP_READ_CAPACITY_10:
		return do_read_capacity(lu, cdb, false, buf, c);
	case OP_SERVICE_ACTION_IN_16:
		if ((cdb[1] & 0x1f) != SA_READ_CAPACITY_16)
			return invalid_cdb(c);
		return do_read_capacity(lu, cdb, true, buf, c);
	case OP_SYNC_CACHE_10:
		return do_sync(lu, cdb, false, c);
	case OP_SYNC_CACHE_16:
		return do_sync(lu, cdb, true, c);
	case OP_WRITE_SAME_16:
		return do_write_same(lu, cdb, c);
	case OP_UNMAP:
		return do_unmap(lu, cdb, c);
	case OP_MODE_SENSE_6:
		return do_mode_sense(lu, cdb, false, buf, c);
	case OP_MODE_SENSE_10:
		return do_mode_sense(lu, cdb, true, buf, c);
	default:
		return scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_OPCODE);
	}
}

/* OP_READ_6 OP_WRITE_6 OP_READ_10 OP_WRITE_10 OP_READ_16 OP_WRITE_16: low
 * bits 01000 (read) or 01010 (write), groups 0, 1 and 4. */
static bool is_rw(uint8_t op)
{
	return (op & 0x1d) == 0x08 && (0x13 >> (op >> 5) & 1);
}

/* The checks every command gets (cut short, NACA, no unit) in
 * scsi_decode's order, for a READ or WRITE. */
bool scsi_decode_rw(const struct scsi_lu *lu, const uint8_t *cdb, size_t cdb_len,
		    struct scsi_cmd *c)
{
	size_t need;

	if (!cdb_len || !is_rw(cdb[0]))
		return false;
	memset(c, 0, sizeof(*c));
	need = cdb_size(cdb[0]);
	if (cdb_len < need || cdb[need - 1] & 0x04) /* cut short; NACA */
		invalid_cdb(c);
	else if (!lu)
		scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LUN_NOT_SUPPORTED);
	else
		do_rw(lu, cdb, cdb[0] & 0x02, c);
	return true;
}

void scsi_decode(const struct scsi_lu *lu, const uint16_t *luns, unsigned nluns, const uint8_t *cdb,
		 size_t cdb_len, uint8_t *buf, struct scsi_cmd *c)
{
	size_t need;

	if (scsi_decode_rw(lu, cdb, cdb_len, c))
		return;
	memset(c, 0, sizeof(*c));
	if (!cdb_len)
		return invalid_cdb(c);
	need = cdb_size(cdb[0]);
	if (!need)
		return scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_INVALID_OPCODE);
	if (cdb_len < need || cdb[need - 1] & 0x04) /* cut short; NACA */
		return invalid_cdb(c);
	switch (cdb[0]) {
	case OP_INQUIRY:
		return do_inquiry(lu, cdb, buf, c);
	case OP_REPORT_LUNS:
		return do_report_luns(luns, nluns, cdb, buf, c);
	case OP_REQUEST_SENSE:
		return do_request_sense(lu, cdb, buf, c);
	}
	if (!lu)
		return scsi_check(c, SCSI_SENSE_ILLEGAL_REQUEST, SCSI_ASC_LUN_NOT_SUPPORTED);
	decode_lu(lu, cdb, buf, c);
}
