/* SCSI block commands (SPC-5, SBC-4) for a direct-access logical unit, as
 * pure functions: a CDB is decoded against what the unit is (size, block
 * size, read-only, write cache) into either the data-in bytes of an emulated
 * command, a block-layer operation for the transport to run, or CHECK
 * CONDITION with fixed-format sense. Nothing from the initiator is trusted:
 * every length and LBA is checked here.
 *
 * THREADING RULE: no state; callable from any thread. */
#ifndef IOPLANE_SCSI_H
#define IOPLANE_SCSI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Status codes (SAM-5). */
#define SCSI_STATUS_GOOD 0x00
#define SCSI_STATUS_CHECK_CONDITION 0x02

/* Sense keys. */
#define SCSI_SENSE_NO_SENSE 0x0
#define SCSI_SENSE_MEDIUM_ERROR 0x3
#define SCSI_SENSE_HARDWARE_ERROR 0x4
#define SCSI_SENSE_ILLEGAL_REQUEST 0x5
#define SCSI_SENSE_UNIT_ATTENTION 0x6
#define SCSI_SENSE_DATA_PROTECT 0x7
#define SCSI_SENSE_ABORTED_COMMAND 0xb

/* Additional sense codes (ASC << 8 | ASCQ). */
#define SCSI_ASC_NONE 0x0000
#define SCSI_ASC_WRITE_ERROR 0x0c00
#define SCSI_ASC_UNRECOVERED_READ 0x1100
#define SCSI_ASC_PARAM_LIST_LENGTH 0x1a00
#define SCSI_ASC_INVALID_OPCODE 0x2000
#define SCSI_ASC_LBA_OUT_OF_RANGE 0x2100
#define SCSI_ASC_INVALID_FIELD_CDB 0x2400
#define SCSI_ASC_LUN_NOT_SUPPORTED 0x2500
#define SCSI_ASC_INVALID_FIELD_PARAM 0x2600
#define SCSI_ASC_WRITE_PROTECTED 0x2700
#define SCSI_ASC_INTERNAL_TARGET_FAILURE 0x4400

#define SCSI_SENSE_LEN 18               /* fixed format */
#define SCSI_MAX_LUNS 256               /* LUNs of one target (REPORT LUNS fits 2056 bytes) */
#define SCSI_UNMAP_MAX 16               /* block descriptors of one UNMAP (VPD 0xb0) */
#define SCSI_EMUL_MAX 4096              /* data-in bytes an emulated command produces at most */
#define SCSI_MAX_XFER_BLOCKS (1u << 21) /* VPD 0xb0 MAXIMUM TRANSFER LENGTH (bytes / 4096) */

/* What the logical unit is. */
struct scsi_lu {
	uint64_t blocks;     /* capacity in logical blocks */
	uint32_t block_size; /* 512 or 4096 */
	bool read_only;
	bool write_cache; /* WCE of the caching mode page */
	bool discard;     /* UNMAP and WRITE SAME with UNMAP offered (VPD 0xb2) */
	uint16_t lun;
	const char *serial; /* unit serial number (VPD 0x80); NULL or "": none */
	uint64_t naa;       /* device identifier (VPD 0x83, NAA locally assigned) */
};

enum scsi_kind {
	SCSI_DATA,       /* GOOD, with len bytes of data-in in buf (maybe 0) */
	SCSI_CHECK,      /* CHECK CONDITION: key, asc */
	SCSI_READ,       /* read nblocks from lba */
	SCSI_WRITE,      /* write nblocks at lba (fua: write-through) */
	SCSI_SYNC,       /* flush the cache */
	SCSI_WRITE_SAME, /* one block of data-out (none: ndob) repeated over
			  * [lba, lba+nblocks); unmap: may deallocate */
	SCSI_UNMAP,      /* parameter list of param_len bytes in data-out */
};

struct scsi_cmd {
	enum scsi_kind kind;
	uint64_t lba;
	uint32_t nblocks;
	bool fua, unmap, ndob;
	uint32_t len; /* SCSI_DATA: bytes of buf; SCSI_UNMAP: parameter list length */
	uint8_t key;  /* SCSI_CHECK */
	uint16_t asc; /* SCSI_CHECK: ASC << 8 | ASCQ */
};

/* One range of an UNMAP parameter list. */
struct scsi_extent {
	uint64_t lba;
	uint32_t nblocks;
};

/* Decode cdb[0, cdb_len) for the unit lu. luns[0, nluns) is the target's
 * LUN list (REPORT LUNS); lu NULL: the addressed LUN does not exist (INQUIRY,
 * REPORT LUNS and REQUEST SENSE are still answered, others get LOGICAL UNIT
 * NOT SUPPORTED). buf has room for SCSI_EMUL_MAX bytes. */
void scsi_decode(const struct scsi_lu *lu, const uint16_t *luns, unsigned nluns, const uint8_t *cdb,
		 size_t cdb_len, uint8_t *buf, struct scsi_cmd *c);

/* READ and WRITE 6/10/16, nearly every command, without the rest of the
 * dispatch: false (c untouched) for another operation code, else true with
 * c what scsi_decode() would make of it. */
bool scsi_decode_rw(const struct scsi_lu *lu, const uint8_t *cdb, size_t cdb_len,
		    struct scsi_cmd *c);

/* Check an UNMAP parameter list p[0, len) against lu; returns the number
 * of extents (0..SCSI_UNMAP_MAX) stored in out, or -1 with c set to CHECK
 * CONDITION. */
int scsi_unmap_list(const struct scsi_lu *lu, const uint8_t *p, size_t len, struct scsi_extent *out,
		    struct scsi_cmd *c);

/* Fixed-format sense data (SCSI_SENSE_LEN bytes) for key/asc. */
void scsi_sense_fixed(uint8_t *sense, uint8_t key, uint16_t asc);

/* c becomes CHECK CONDITION with key/asc. */
void scsi_check(struct scsi_cmd *c, uint8_t key, uint16_t asc);

/* Single-level LUN in the flat space (SAM-5 4.7.7) and back. */
void scsi_lun_encode(uint16_t lun, uint8_t out[8]);

#endif
