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
struct img_open_opts {
	const char *fmt;   /* NULL: probe */
	unsigned flags;    /* IMG_OPEN_* */
	const char *cache; /* NULL, or qemu-img's -t/-T value */
};
/* Prints one error line itself. *fmt_out (may be NULL) gets the format used. */
int img_open(const char *path, const struct img_open_opts *o, struct blk_node **out,
	     const char **fmt_out);
/* Is `cache` one qemu-img knows? (none, writeback, writethrough, directsync, unsafe) */
int img_check_cache(const char *cache);

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

/* Command line. */
int img_parse_output(const char *arg, enum img_output *out);
/* A size "1G", "512", "1.5M" with qemu-img's message on error. */
int img_parse_size(const char *arg, uint64_t *out);
/* getopt's complaint in one line naming the subcommand. */
void img_bad_opt(const char *cmd, int c, char **argv);
/* Reset getopt for a subcommand's argv (argv[0] is the subcommand). */
void img_getopt_reset(void);

/* Output. */
void img_size_str(uint64_t v, char *buf, size_t n); /* "1.25 MiB", like qemu-img */
void img_json_str(FILE *f, const char *s);          /* quoted and escaped */
void img_indent(FILE *f, int level);                /* 4 spaces per level */
/* Path of `name` (a backing file as written in a header) relative to the
 * directory of `image`, the way the qcow2 driver resolves it. Caller frees. */
char *img_path_relative(const char *image, const char *name);
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
int img_block_status(struct blk_node *bs, uint64_t off, uint64_t len, uint32_t *status,
		     uint64_t *n, uint64_t *host);

#endif
