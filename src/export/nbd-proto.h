/* NBD wire protocol: magic numbers, flags, option/reply/command codes and the
 * fixed-size message layouts, as defined by doc/proto.md of the
 * NetworkBlockDevice/nbd project (extended headers: its extension-ext-header
 * branch). All fields travel in network byte order.
 * Threading: constants and plain structs only. */
#ifndef IOPLANE_NBD_PROTO_H
#define IOPLANE_NBD_PROTO_H

#include <stdint.h>

/* ---- handshake ---------------------------------------------------------- */

#define NBD_MAGIC 0x4e42444d41474943ull      /* "NBDMAGIC" */
#define NBD_OPTS_MAGIC 0x49484156454F5054ull /* "IHAVEOPT" */
#define NBD_REP_MAGIC 0x0003e889045565a9ull  /* option reply */

/* Handshake flags (server, 16 bits) */
#define NBD_FLAG_FIXED_NEWSTYLE (1u << 0)
#define NBD_FLAG_NO_ZEROES (1u << 1)

/* Client flags (32 bits) */
#define NBD_FLAG_C_FIXED_NEWSTYLE (1u << 0)
#define NBD_FLAG_C_NO_ZEROES (1u << 1)

/* Transmission flags (16 bits) */
#define NBD_FLAG_HAS_FLAGS (1u << 0)
#define NBD_FLAG_READ_ONLY (1u << 1)
#define NBD_FLAG_SEND_FLUSH (1u << 2)
#define NBD_FLAG_SEND_FUA (1u << 3)
#define NBD_FLAG_ROTATIONAL (1u << 4)
#define NBD_FLAG_SEND_TRIM (1u << 5)
#define NBD_FLAG_SEND_WRITE_ZEROES (1u << 6)
#define NBD_FLAG_SEND_DF (1u << 7)
#define NBD_FLAG_CAN_MULTI_CONN (1u << 8)
#define NBD_FLAG_SEND_RESIZE (1u << 9)
#define NBD_FLAG_SEND_CACHE (1u << 10)
#define NBD_FLAG_SEND_FAST_ZERO (1u << 11)
#define NBD_FLAG_BLOCK_STATUS_PAYLOAD (1u << 12)

/* Options */
#define NBD_OPT_EXPORT_NAME 1
#define NBD_OPT_ABORT 2
#define NBD_OPT_LIST 3
#define NBD_OPT_PEEK_EXPORT 4
#define NBD_OPT_STARTTLS 5
#define NBD_OPT_INFO 6
#define NBD_OPT_GO 7
#define NBD_OPT_STRUCTURED_REPLY 8
#define NBD_OPT_LIST_META_CONTEXT 9
#define NBD_OPT_SET_META_CONTEXT 10
#define NBD_OPT_EXTENDED_HEADERS 11

/* Option replies; errors have bit 31 set */
#define NBD_REP_ACK 1u
#define NBD_REP_SERVER 2u
#define NBD_REP_INFO 3u
#define NBD_REP_META_CONTEXT 4u
#define NBD_REP_FLAG_ERROR (1u << 31)
#define NBD_REP_ERR_UNSUP (NBD_REP_FLAG_ERROR | 1u)
#define NBD_REP_ERR_POLICY (NBD_REP_FLAG_ERROR | 2u)
#define NBD_REP_ERR_INVALID (NBD_REP_FLAG_ERROR | 3u)
#define NBD_REP_ERR_PLATFORM (NBD_REP_FLAG_ERROR | 4u)
#define NBD_REP_ERR_TLS_REQD (NBD_REP_FLAG_ERROR | 5u)
#define NBD_REP_ERR_UNKNOWN (NBD_REP_FLAG_ERROR | 6u)
#define NBD_REP_ERR_SHUTDOWN (NBD_REP_FLAG_ERROR | 7u)
#define NBD_REP_ERR_BLOCK_SIZE_REQD (NBD_REP_FLAG_ERROR | 8u)
#define NBD_REP_ERR_TOO_BIG (NBD_REP_FLAG_ERROR | 9u)
#define NBD_REP_ERR_EXT_HEADER_REQD (NBD_REP_FLAG_ERROR | 10u)

/* NBD_REP_INFO types */
#define NBD_INFO_EXPORT 0
#define NBD_INFO_NAME 1
#define NBD_INFO_DESCRIPTION 2
#define NBD_INFO_BLOCK_SIZE 3

/* ---- transmission ------------------------------------------------------- */

#define NBD_REQUEST_MAGIC 0x25609513u
#define NBD_EXTENDED_REQUEST_MAGIC 0x21e41c71u
#define NBD_SIMPLE_REPLY_MAGIC 0x67446698u
#define NBD_STRUCTURED_REPLY_MAGIC 0x668e33efu
#define NBD_EXTENDED_REPLY_MAGIC 0x6e8a278cu

/* Commands */
#define NBD_CMD_READ 0
#define NBD_CMD_WRITE 1
#define NBD_CMD_DISC 2
#define NBD_CMD_FLUSH 3
#define NBD_CMD_TRIM 4
#define NBD_CMD_CACHE 5
#define NBD_CMD_WRITE_ZEROES 6
#define NBD_CMD_BLOCK_STATUS 7

/* Command flags */
#define NBD_CMD_FLAG_FUA (1u << 0)
#define NBD_CMD_FLAG_NO_HOLE (1u << 1)
#define NBD_CMD_FLAG_DF (1u << 2)
#define NBD_CMD_FLAG_REQ_ONE (1u << 3)
#define NBD_CMD_FLAG_FAST_ZERO (1u << 4)
#define NBD_CMD_FLAG_PAYLOAD_LEN (1u << 5)

/* Structured/extended reply flags and chunk types */
#define NBD_REPLY_FLAG_DONE (1u << 0)
#define NBD_REPLY_TYPE_NONE 0
#define NBD_REPLY_TYPE_OFFSET_DATA 1
#define NBD_REPLY_TYPE_OFFSET_HOLE 2
#define NBD_REPLY_TYPE_BLOCK_STATUS 5
#define NBD_REPLY_TYPE_BLOCK_STATUS_EXT 6
#define NBD_REPLY_TYPE_ERROR ((1u << 15) | 1u)
#define NBD_REPLY_TYPE_ERROR_OFFSET ((1u << 15) | 2u)

/* base:allocation status flags */
#define NBD_STATE_HOLE (1u << 0)
#define NBD_STATE_ZERO (1u << 1)
/* qemu:dirty-bitmap: status flag */
#define NBD_STATE_DIRTY (1u << 0)

/* Error values */
#define NBD_EPERM 1
#define NBD_EIO 5
#define NBD_ENOMEM 12
#define NBD_EINVAL 22
#define NBD_ENOSPC 28
#define NBD_EOVERFLOW 75
#define NBD_ENOTSUP 95
#define NBD_ESHUTDOWN 108

/* Limits. A string (export name, query, message) must not exceed 4096 bytes;
 * payloads up to 2^25 bytes must not be treated as a denial of service (the
 * server accepts more: NBD_MAX_REQUEST in nbd-int.h). */
#define NBD_MAX_STRING 4096u
#define NBD_MAX_PAYLOAD (32u << 20)
#define NBD_META_BASE_ALLOCATION "base:allocation"

/* ---- message layouts ---------------------------------------------------- */

struct nbd_hs_greeting {     /* S: right after connect (newstyle) */
	uint64_t magic;      /* NBD_MAGIC */
	uint64_t opts_magic; /* NBD_OPTS_MAGIC */
	uint16_t flags;      /* handshake flags */
} __attribute__((packed));

struct nbd_opt_hdr {    /* C: every option */
	uint64_t magic; /* NBD_OPTS_MAGIC */
	uint32_t option;
	uint32_t len; /* bytes of option data that follow */
} __attribute__((packed));

struct nbd_opt_reply {  /* S: every option reply (fixed newstyle) */
	uint64_t magic; /* NBD_REP_MAGIC */
	uint32_t option;
	uint32_t type; /* NBD_REP_* */
	uint32_t len;
} __attribute__((packed));

struct nbd_export_name_reply { /* S: after NBD_OPT_EXPORT_NAME */
	uint64_t size;
	uint16_t flags;
	uint8_t zeroes[124]; /* omitted with NBD_FLAG_C_NO_ZEROES */
} __attribute__((packed));

struct nbd_request {    /* C: compact request */
	uint32_t magic; /* NBD_REQUEST_MAGIC */
	uint16_t flags;
	uint16_t type;
	uint64_t cookie;
	uint64_t offset;
	uint32_t len;
} __attribute__((packed));

struct nbd_request_ext { /* C: extended request */
	uint32_t magic;  /* NBD_EXTENDED_REQUEST_MAGIC */
	uint16_t flags;
	uint16_t type;
	uint64_t cookie;
	uint64_t offset;
	uint64_t len; /* payload length with NBD_CMD_FLAG_PAYLOAD_LEN, else effect length */
} __attribute__((packed));

struct nbd_simple_reply {
	uint32_t magic; /* NBD_SIMPLE_REPLY_MAGIC */
	uint32_t error;
	uint64_t cookie;
} __attribute__((packed));

struct nbd_structured_reply {
	uint32_t magic; /* NBD_STRUCTURED_REPLY_MAGIC */
	uint16_t flags;
	uint16_t type;
	uint64_t cookie;
	uint32_t len;
} __attribute__((packed));

struct nbd_extended_reply {
	uint32_t magic; /* NBD_EXTENDED_REPLY_MAGIC */
	uint16_t flags;
	uint16_t type;
	uint64_t cookie;
	uint64_t offset; /* the request's offset */
	uint64_t len;
} __attribute__((packed));

struct nbd_chunk_hole { /* NBD_REPLY_TYPE_OFFSET_HOLE payload */
	uint64_t offset;
	uint32_t len;
} __attribute__((packed));

struct nbd_chunk_error { /* NBD_REPLY_TYPE_ERROR payload (then the message) */
	uint32_t error;
	uint16_t msg_len;
} __attribute__((packed));

struct nbd_block_descriptor { /* NBD_REPLY_TYPE_BLOCK_STATUS entries */
	uint32_t len;
	uint32_t flags;
} __attribute__((packed));

struct nbd_block_descriptor_ext { /* NBD_REPLY_TYPE_BLOCK_STATUS_EXT entries */
	uint64_t len;
	uint64_t flags;
} __attribute__((packed));

_Static_assert(sizeof(struct nbd_hs_greeting) == 18, "greeting");
_Static_assert(sizeof(struct nbd_opt_hdr) == 16, "option header");
_Static_assert(sizeof(struct nbd_opt_reply) == 20, "option reply");
_Static_assert(sizeof(struct nbd_export_name_reply) == 134, "export name reply");
_Static_assert(sizeof(struct nbd_request) == 28, "request");
_Static_assert(sizeof(struct nbd_request_ext) == 32, "extended request");
_Static_assert(sizeof(struct nbd_simple_reply) == 16, "simple reply");
_Static_assert(sizeof(struct nbd_structured_reply) == 20, "structured reply");
_Static_assert(sizeof(struct nbd_extended_reply) == 32, "extended reply");

#endif
