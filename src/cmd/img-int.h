/* `ioplane img`: helpers shared by the image tool's subcommands (img-*.c):
 * the loop, opening images, option parsing with qemu-img's words, sizes as
 * qemu-img prints them, JSON strings and the "-p" progress line.
 *
 * Threading: main thread only. A command binds one loop to the thread for
 * its whole run (img_loop_start) and drives requests on it, synchronously or
 * from coroutines on that loop. */
#ifndef IOPLANE_CMD_IMG_INT_H
#define IOPLANE_CMD_IMG_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct blk_node;
struct loop;

#define IMG_PROG "ioplane img"
#define IMG_EXIT_USAGE 1 /* like qemu-img: a bad command line is exit 1 */

enum img_output { IMG_OUT_HUMAN = 0, IMG_OUT_JSON };

/* Error line "ioplane img: ...\n" on stderr. */
void img_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

int img_loop_start(struct loop **out);
void img_loop_end(struct loop *loop, struct blk_node *bs);

/* Opening. path: a file name or "null:size=..."; fmt NULL: probed as
 * qemu-img does (blk_probe_format: an image of a format other than raw and
 * qcow2 is refused, naming it; a probed raw image is opened x-probed=on).
 * Only a file named on the command line is probed: backing files never are,
 * the qcow2 driver takes their format from the header. */
#define IMG_OPEN_RW (1u << 0)
#define IMG_OPEN_NO_BACKING (1u << 1) /* qcow2: do not open the backing chain */
/* qcow2, with IMG_OPEN_RW: open for qcow2_check's repair (repair=on), even
 * when the image is marked corrupt (check -r only). */
#define IMG_OPEN_REPAIR (1u << 2)
/* Locks, as qemu-img takes them: every open holds consistent read (and
 * write with IMG_OPEN_RW) and shares everything, except as below. */
#define IMG_OPEN_RESIZE (1u << 3)      /* with IMG_OPEN_RW: resize too */
#define IMG_OPEN_NO_SHARE (1u << 4)    /* share only reads (convert's source) */
#define IMG_OPEN_FORCE_SHARE (1u << 5) /* -U: force-share=on, read-only only */
#define IMG_OPEN_NO_IO (1u << 6)       /* info: metadata only, no consistent read */
/* path is an option list with serve --image's keys (--image-opts); the
 * flags and cache fill in only the keys it leaves out. Never probed. */
#define IMG_OPEN_IMAGE_OPTS (1u << 7)
struct img_open_opts {
	const char *fmt;   /* NULL: probe */
	unsigned flags;    /* IMG_OPEN_* */
	const char *cache; /* NULL, or qemu-img's -t/-T value */
};
struct img_args;
/* fmt, -U and --image-opts of a command line (o's other fields zeroed). */
void img_open_opts_from(struct img_open_opts *o, const struct img_args *a);
/* Prints one error line itself. *fmt_out (may be NULL) gets the format used. */
int img_open(const char *path, const struct img_open_opts *o, struct blk_node **out,
	     const char **fmt_out);
/* Is `cache` one qemu-img knows? (none, writeback, writethrough, directsync,
 * unsafe) If not, says so; `source`: for -T ("Invalid source cache option"). */
int img_check_cache(const char *cache, bool source);

/* The "Snapshot list:" table of qemu-img info and snapshot -l (img-info.c). */
struct qcow2_info;
void img_print_snapshots(const struct qcow2_info *q);

/* Create an image (img-create.c): raw or qcow2, with qemu-img create's -o
 * options (o may be NULL); prints "Formatting ..." unless quiet. */
struct kv_opts;
struct img_create {
	const char *fmt, *file, *backing, *backing_fmt;
	struct kv_opts *o;
	uint64_t size;
	bool quiet;
};
int img_create_image(const struct img_create *c);

/* Command line (img-cmdline.c). A subcommand declares its options once, in
 * a struct img_cmd: the common ones by IMG_C_* bits (parsed into struct
 * img_args), its own in a table handed to its opt() callback. */
#define IMG_C_FORMAT (1u << 0)      /* -f, --format FMT */
#define IMG_C_OUTPUT (1u << 1)      /* --output=human|json */
#define IMG_C_FORCE_SHARE (1u << 2) /* -U, --force-share */
#define IMG_C_QUIET (1u << 3)       /* -q, --quiet */
#define IMG_C_IMAGE_OPTS (1u << 4)  /* --image-opts: FILE is an option list */
/* Keys of long options without a short form: IMG_OPT_LOCAL and up are a
 * subcommand's own. */
enum { IMG_OPT_OUTPUT = 256, IMG_OPT_IMAGE_OPTS, IMG_OPT_LOCAL };

struct img_opt {
	int key;          /* the short option letter, or IMG_OPT_LOCAL + n */
	const char *name; /* long name, or NULL */
	bool arg;         /* takes an argument */
};

struct img_cmd {
	const char *name;           /* "info": for messages */
	unsigned common;            /* IMG_C_* */
	const struct img_opt *opts; /* own options, up to a { 0 } entry (NULL: none) */
	/* An own option: 0, -errno with the message printed, or 1 when it
	 * printed the usage (the command then exits 0). */
	int (*opt)(void *ctx, int key, const char *arg);
	void (*usage)(FILE *f);
	int min_files, max_files; /* operands */
	const char *files_err;    /* qemu-img's message for a wrong count */
};

struct img_args {
	const char *fmt;     /* -f, or NULL */
	enum img_output out; /* --output */
	bool force_share, quiet, image_opts;
	char **files; /* the operands */
	int nfiles;
};

/* 0: go on; 1: --help printed the usage (exit 0); -errno: a bad command
 * line, one line printed (exit 1, as in qemu-img). */
int img_parse_args(const struct img_cmd *cmd, int argc, char **argv, void *ctx, struct img_args *a);
int img_parse_output(const char *arg, enum img_output *out);
/* A size as qemu-img reads one (qemu_strtosz): blanks and '+' first, decimal
 * or 0x hex digits, a decimal fraction (rounded half up to a byte; not for
 * bytes, not hex, no exponent), one suffix b, k, M, G, T, P, E (binary, any
 * case). -EINVAL malformed, -ERANGE above 2^64 - 1; no message. */
int img_strtosz(const char *s, uint64_t *out);
/* The same without the warning qemu-img gives for a suffix on a hex number:
 * *hex_suffix says whether it is due (for a caller with its own prefix). */
int img_strtosz_quiet(const char *s, uint64_t *out, bool *hex_suffix);
/* img_strtosz up to INT64_MAX, with qemu-img's message naming `what`
 * ("image size", "start offset"). */
int img_parse_size(const char *arg, const char *what, uint64_t *out);
/* The same for a size-valued parameter `key` (-o size=, cluster_size=,
 * extent_size_hint=; resize's size), in qemu-img's words for one, up to
 * 2^64 - 1; file (NULL: none) prefixes the message. */
int img_parse_size_param(const char *file, const char *key, const char *arg, uint64_t *out);
/* A number-valued parameter (-o refcount_bits=) as qemu-img reads one
 * (qemu_strtou64: base 0, no suffix), with its messages. */
int img_parse_number_param(const char *file, const char *key, const char *arg, uint64_t *out);

/* Output. */
void img_size_str(uint64_t v, char *buf, size_t n); /* "1.25 MiB", like qemu-img */
void img_json_str(FILE *f, const char *s);          /* quoted and escaped */
void img_indent(FILE *f, int level);                /* 4 spaces per level */
/* The virtual size qemu-img shows: a raw image's is rounded up to a whole
 * 512-byte sector (the rest reads as zeroes), as QEMU sizes it. */
uint64_t img_size(struct blk_node *bs);
/* st_blocks * 512 of path, or -1. */
int64_t img_allocated_size(const char *path);

/* "    (NN.NN/100%)\r" on stdout, updated in place, like qemu-img -p. */
struct img_progress {
	bool on;
	double last;
};
void img_progress_init(struct img_progress *p, bool on);
void img_progress_update(struct img_progress *p, uint64_t done, uint64_t total);
void img_progress_end(struct img_progress *p);

/* Block status of [off, off+len) on bs, synchronously: 0 with *status and
 * *n (1..len bytes), *host (with BLK_STATUS_OFFSET_VALID), or -errno. */
int img_block_status(struct blk_node *bs, uint64_t off, uint64_t len, uint32_t *status, uint64_t *n,
		     uint64_t *host);

#endif
