/* The `file` driver's helpers for image files that are not (yet) nodes:
 * opening a path safely, creating an image file as QEMU does, and the XFS
 * extent size hint for a new image. Used by the driver itself, probing,
 * qcow2 create and the image tool. Threading: any thread; blocking calls. */
#ifndef IOPLANE_BLOCK_FILE_H
#define IOPLANE_BLOCK_FILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "block/block.h" /* BLK_PERM_* */

/* Open an image path (file.c): open(2) with flags plus O_NONBLOCK, O_NOCTTY
 * and O_CLOEXEC, keep only a regular file or a block device (checked with
 * fstat on the open fd, O_NONBLOCK cleared again), so that a FIFO, socket,
 * directory or character device is refused at once instead of blocking or
 * being read. Returns the fd, or -errno with a message naming the path and
 * what it is in err (-EINVAL: not a regular file or block device). */
int blk_file_open(const char *path, int flags, mode_t mode, char *err, size_t errlen);

/* Create (file-lock.c): open path for writing, creating it, lock it for
 * perm and shared (BLK_PERM_*) and, if nobody conflicts, truncate it to 0
 * bytes. The fd keeps the locks until closed. fd or -errno with a message
 * in err. QEMU creates a file holding write and resize and sharing all but
 * resize (BLK_CREATE_*), and a qcow2 image then as a writable qcow2 open. */
#define BLK_CREATE_PERM (BLK_PERM_WRITE | BLK_PERM_RESIZE)
#define BLK_CREATE_SHARED (BLK_PERM_ALL & ~BLK_PERM_RESIZE)
int blk_file_create(const char *path, uint32_t perm, uint32_t shared, char *err, size_t errlen);

/* Image creation (file.c): on XFS, give the (still empty) file at fd an
 * extent size hint of `bytes`, so that scattered first writes allocate
 * whole extents instead of fragmenting the file (qemu-img does the same,
 * 1 MiB by default). Other file systems: nothing. 0 or -errno. */
int blk_file_extent_hint(int fd, uint32_t bytes);
#define BLK_EXTENT_HINT_DEFAULT (1u << 20) /* qemu-img's default */

/* The path a file node opened (NULL: not a file node). */
const char *blk_file_path(const struct blk_node *bs);
/* Whether a file node opened its file with O_DIRECT (cache=none). */
bool blk_file_direct(const struct blk_node *bs);

#endif
