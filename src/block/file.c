/* Protocol driver `file`: regular files and block devices. Options, open and
 * probing (size, O_DIRECT alignment), the slow operations that run on the
 * thread pool for every engine (flush for native/threads, discard,
 * write-zeroes, block-status), and dispatch of reads/writes to an engine.
 *
 * Threading: open/close/truncate run on the main thread with no request in
 * flight; submit runs on the request's loop; work items run on pool workers
 * and only touch their own request and the (read-mostly) file_state. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "block/file-int.h"
#include "loop/thread-pool.h"
#include "util/iov.h"
#include "util/log.h"
#include "util/opts.h"

#ifndef STATX_DIOALIGN
#define STATX_DIOALIGN 0x2000U
#endif

/* Linux moves at most this much in one read/write (MAX_RW_COUNT); larger
 * transfers come back short and are continued. */
#define FILE_MAX_RW 0x7ffff000u

/* ---- position tracking shared by the engines ---- */

void file_rw_init(struct file_rw *rw, const struct blk_request *req)
{
	rw->pos = req->offset;
	rw->left = req->len;
	rw->idx = 0;
	rw->err = 0;
	rw->off = 0;
	while (rw->left > 0 && req->iov[rw->idx].iov_len == 0)
		rw->idx++;
}

void file_rw_piece(const struct file_rw *rw, const struct blk_request *req, struct file_piece *p)
{
	const struct iovec *v = &req->iov[rw->idx];

	assert(rw->idx < req->iovcnt);
	p->iov = v;
	p->cnt = req->iovcnt - rw->idx;
	if (p->cnt > IOV_MAX)
		p->cnt = IOV_MAX;
	p->single = rw->off != 0 || p->cnt == 1;
	p->buf = (char *)v->iov_base + rw->off;
	p->len = v->iov_len - rw->off;
	if (p->len > FILE_MAX_RW)
		p->len = FILE_MAX_RW;
}

static enum file_rw_next file_rw_fail(struct file_rw *rw, int err)
{
	rw->err = err;
	return FILE_RW_FAILED;
}

enum file_rw_next file_rw_advance(struct file_rw *rw, struct blk_request *req, ssize_t res)
{
	size_t n;

	if (res == -EAGAIN || res == -EINTR)
		return FILE_RW_AGAIN;
	if (res < 0)
		return file_rw_fail(rw, (int)res);
	if (res == 0) {
		/* A write that moves nothing will not move more. */
		if (req->op != BLK_OP_READ)
			return file_rw_fail(rw, -ENOSPC);
		/* End of file (the file is shorter than the node, e.g. an
		 * unaligned tail under O_DIRECT): the rest reads as zeroes. */
		iov_memset(req->iov, req->iovcnt, req->len - rw->left, 0, rw->left);
		rw->left = 0;
		return FILE_RW_DONE;
	}
	/* The kernel never does this; do not walk off the iovec. */
	if ((uint64_t)res > rw->left)
		return file_rw_fail(rw, -EIO);
	rw->pos += (uint64_t)res;
	rw->left -= (uint64_t)res;
	n = (size_t)res;
	while (n > 0) {
		size_t room = req->iov[rw->idx].iov_len - rw->off;

		if (n < room) {
			rw->off += n;
			break;
		}
		n -= room;
		rw->idx++;
		rw->off = 0;
	}
	/* Skip empty elements so that a continuation never starts on one. */
	while (rw->left > 0 && req->iov[rw->idx].iov_len == 0)
		rw->idx++;
	return rw->left == 0 ? FILE_RW_DONE : FILE_RW_AGAIN;
}

/* ---- flush, discard, write-zeroes, block-status on the thread pool ---- */

struct file_misc {
	struct tp_work work;
	struct blk_node *bs;
};

_Static_assert(sizeof(struct file_misc) <= BLK_DRV_CTX_SIZE, "file_misc too big");

static int file_punch(struct file_state *s, uint64_t off, uint64_t len)
{
	const int mode = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;

	if (!__atomic_load_n(&s->punch_ok, __ATOMIC_RELAXED))
		return -ENOTSUP;
	if (fallocate(s->fd, mode, (off_t)off, (off_t)len) == 0)
		return 0;
	if (errno != EOPNOTSUPP)
		return -errno;
	__atomic_store_n(&s->punch_ok, false, __ATOMIC_RELAXED);
	return -ENOTSUP;
}

static int file_zero_range(struct file_state *s, uint64_t off, uint64_t len)
{
	if (!__atomic_load_n(&s->zero_range_ok, __ATOMIC_RELAXED))
		return -ENOTSUP;
	/* No KEEP_SIZE: zeroing past EOF (inside the node) extends the file
	 * just as a write would. */
	if (fallocate(s->fd, FALLOC_FL_ZERO_RANGE, (off_t)off, (off_t)len) == 0)
		return 0;
	if (errno != EOPNOTSUPP)
		return -errno;
	__atomic_store_n(&s->zero_range_ok, false, __ATOMIC_RELAXED);
	return -ENOTSUP;
}

static int file_blk_ioctl(struct file_state *s, unsigned long cmd, uint64_t off, uint64_t len)
{
	uint64_t range[2] = {off, len};

	if (ioctl(s->fd, cmd, range) == 0)
		return 0;
	return errno == EOPNOTSUPP || errno == ENOTTY ? -ENOTSUP : -errno;
}

/* Discard is a hint: where the device or file system cannot do it, doing
 * nothing is a correct answer. */
static int file_do_discard(struct file_state *s, struct blk_request *req)
{
	int ret;

	if (s->is_blk)
		ret = file_blk_ioctl(s, BLKDISCARD, req->offset, req->len);
	else
		ret = file_punch(s, req->offset, req->len);
	return ret == -ENOTSUP ? 0 : ret;
}

/* MAY_UNMAP lets us deallocate, so a hole is the cheapest zero. Without it
 * the blocks must stay allocated: ZERO_RANGE (unwritten extents) or nothing,
 * and -ENOTSUP makes the core write zero buffers unless NO_FALLBACK.
 * A punched range past EOF is not re-extended: it reads as zeroes anyway
 * (short reads are zero-filled) and growing the file here could race with
 * a concurrent extending write. */
static int file_do_write_zeroes(struct file_state *s, struct blk_request *req)
{
	int ret = -ENOTSUP;

	if (s->is_blk) {
		ret = file_blk_ioctl(s, BLKZEROOUT, req->offset, req->len);
	} else {
		if (req->flags & BLK_F_MAY_UNMAP)
			ret = file_punch(s, req->offset, req->len);
		if (ret == -ENOTSUP)
			ret = file_zero_range(s, req->offset, req->len);
	}
	if (ret == 0 && (req->flags & BLK_F_FUA) && fdatasync(s->fd) != 0)
		ret = -errno;
	return ret;
}

/* Keep block-status answers in units of the request alignment: a partly
 * allocated block counts as data; a zero run shorter than a block is data. */
static void file_status_align(uint32_t align, struct blk_request *req)
{
	uint64_t n = req->status_len;

	if (align <= 1 || n == req->len || n % align == 0)
		return;
	if (req->status & BLK_STATUS_DATA) {
		n = (n + align - 1) / align * align;
		req->status_len = n < req->len ? n : req->len;
		return;
	}
	n = n / align * align;
	if (n == 0) {
		req->status = BLK_STATUS_DATA | BLK_STATUS_ALLOCATED;
		n = align < req->len ? align : req->len;
	}
	req->status_len = n;
}

static void file_status_set(struct blk_request *req, uint32_t status, uint64_t len)
{
	req->status = status;
	req->status_len = len < req->len ? len : req->len;
}

/* lseek() moves the shared file position, which nothing else uses (all I/O
 * is positioned), and returns its result atomically, so workers may race. */
static int file_do_block_status(struct blk_node *bs, struct file_state *s, struct blk_request *req)
{
	const uint32_t data = BLK_STATUS_DATA | BLK_STATUS_ALLOCATED;
	off_t off = (off_t)req->offset, d, h;

	if (s->is_blk) {
		file_status_set(req, data, req->len);
		return 0;
	}
	d = lseek(s->fd, off, SEEK_DATA);
	if (d < 0) {
		/* ENXIO: no data at or after off (a hole to EOF, or past EOF,
		 * which reads as zeroes). Anything else: no SEEK_DATA here. */
		file_status_set(req, errno == ENXIO ? BLK_STATUS_ZERO : data, req->len);
	} else if (d > off) {
		file_status_set(req, BLK_STATUS_ZERO, (uint64_t)(d - off));
	} else {
		h = lseek(s->fd, off, SEEK_HOLE);
		file_status_set(req, data, h > off ? (uint64_t)(h - off) : req->len);
	}
	file_status_align(bs->align, req);
	return 0;
}

static int file_misc_run(struct tp_work *w)
{
	struct file_misc *m = (struct file_misc *)w;
	struct blk_request *req = file_req_of(m);
	struct file_state *s = file_state(m->bs);

	switch (req->op) {
	case BLK_OP_FLUSH:
		return fdatasync(s->fd) == 0 ? 0 : -errno;
	case BLK_OP_DISCARD:
		return file_do_discard(s, req);
	case BLK_OP_WRITE_ZEROES:
		return file_do_write_zeroes(s, req);
	case BLK_OP_BLOCK_STATUS:
		return file_do_block_status(m->bs, s, req);
	default:
		return -EINVAL;
	}
}

static void file_misc_done(struct tp_work *w, int ret)
{
	blk_complete(file_req_of(w), ret);
}

int file_submit_misc(struct blk_node *bs, struct blk_request *req)
{
	struct file_misc *m = (struct file_misc *)req->drv.bytes;

	memset(&m->work, 0, sizeof(m->work));
	m->work.fn = file_misc_run;
	m->work.done = file_misc_done;
	m->bs = bs;
	tp_submit(req->loop, &m->work);
	return 0;
}

/* ---- opening a path ---- */

static const char *file_type_name(mode_t m)
{
	if (S_ISDIR(m))
		return "a directory";
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISSOCK(m))
		return "a socket";
	if (S_ISCHR(m))
		return "a character device";
	return "of an unknown type";
}

static bool file_type_ok(mode_t m)
{
	return S_ISREG(m) || S_ISBLK(m);
}

/* "'PATH' is a FIFO", or "'PATH' (a symbolic link to 'TARGET') is a FIFO". */
static int file_type_err(const char *path, mode_t m, char *err, size_t errlen)
{
	char target[256];
	struct stat lst;
	ssize_t n = -1;

	if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
		n = readlink(path, target, sizeof(target) - 1);
	if (n >= 0) {
		target[n] = 0;
		snprintf(err, errlen,
			 "'%s' (a symbolic link to '%s') is %s, not a regular file "
			 "or a block device",
			 path, target, file_type_name(m));
	} else {
		snprintf(err, errlen, "'%s' is %s, not a regular file or a block device", path,
			 file_type_name(m));
	}
	return -EINVAL;
}

/* Why open(2) failed: the type of what is there when that is the reason
 * (a socket gives ENXIO, a directory EISDIR), else the errno. */
static int file_open_err(const char *path, int flags, int e, char *err, size_t errlen)
{
	struct stat st;

	if (stat(path, &st) == 0 && !file_type_ok(st.st_mode))
		return file_type_err(path, st.st_mode, err, errlen);
	if (e == EINVAL && (flags & O_DIRECT))
		snprintf(err, errlen,
			 "cannot open '%s' with O_DIRECT (cache=none); the file "
			 "system may not support it, try cache=writeback",
			 path);
	else
		snprintf(err, errlen, "cannot open '%s': %s", path, strerror(e));
	return -e;
}

int blk_file_open(const char *path, int flags, mode_t mode, char *err, size_t errlen)
{
	struct stat st;
	int fd, e;

	/* Refuse early what is plainly not an image, so that opening it has
	 * no side effect; the fstat below is the check that counts. */
	if (stat(path, &st) == 0 && !file_type_ok(st.st_mode))
		return file_type_err(path, st.st_mode, err, errlen);
	fd = open(path, flags | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, mode);
	if (fd < 0)
		return file_open_err(path, flags, errno, err, errlen);
	if (fstat(fd, &st) != 0) {
		e = errno;
		close(fd);
		snprintf(err, errlen, "cannot stat '%s': %s", path, strerror(e));
		return -e;
	}
	if (!file_type_ok(st.st_mode)) {
		close(fd);
		return file_type_err(path, st.st_mode, err, errlen);
	}
	/* O_NONBLOCK would make io_uring fail reads with -EAGAIN. */
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
		e = errno;
		close(fd);
		snprintf(err, errlen, "cannot open '%s': %s", path, strerror(e));
		return -e;
	}
	return fd;
}

/* ---- open, probing, close ---- */

enum file_locking { FILE_LOCK_AUTO = 0, FILE_LOCK_ON, FILE_LOCK_OFF };

struct file_opts {
	const char *filename;
	bool direct;
	enum file_aio aio;
	unsigned max_batch;
	enum file_locking locking;
};

/* locking=on|off|auto, as QEMU's file driver: auto locks where OFD locks work. */
static int file_parse_locking(struct kv_opts *opts, struct file_opts *fo, char *err, size_t errlen)
{
	const char *l = kv_get(opts, "locking");

	if (!l || !strcmp(l, "auto"))
		fo->locking = FILE_LOCK_AUTO;
	else if (!strcmp(l, "on"))
		fo->locking = FILE_LOCK_ON;
	else if (!strcmp(l, "off"))
		fo->locking = FILE_LOCK_OFF;
	else {
		snprintf(err, errlen, "file: locking must be on, off or auto, not '%s'", l);
		return -EINVAL;
	}
	return 0;
}

static int file_parse_opts(struct kv_opts *opts, struct file_opts *fo, char *err, size_t errlen)
{
	const char *cache, *aio;
	uint64_t max_batch = 0;

	fo->filename = kv_get(opts, "filename");
	cache = kv_get(opts, "cache");
	aio = kv_get(opts, "aio");
	if (!fo->filename || !*fo->filename) {
		snprintf(err, errlen, "file: option 'filename' is required");
		return -EINVAL;
	}
	if (!cache || !strcmp(cache, "writeback")) {
		fo->direct = false;
	} else if (!strcmp(cache, "none")) {
		fo->direct = true;
	} else {
		snprintf(err, errlen, "file: cache must be 'none' or 'writeback', not '%s'", cache);
		return -EINVAL;
	}
	if (!aio || !strcmp(aio, "io_uring")) {
		fo->aio = FILE_AIO_URING;
	} else if (!strcmp(aio, "native")) {
		fo->aio = FILE_AIO_NATIVE;
	} else if (!strcmp(aio, "threads")) {
		fo->aio = FILE_AIO_THREADS;
	} else {
		snprintf(err, errlen, "file: aio must be io_uring, native or threads, not '%s'",
			 aio);
		return -EINVAL;
	}
	/* As QEMU's aio-max-batch: 0 picks the engine's default. */
	if (kv_get_u64(opts, "aio-max-batch", &max_batch) < 0 || max_batch > FILE_AIO_DEPTH) {
		snprintf(err, errlen, "file: aio-max-batch must be a number from 0 to %d, not '%s'",
			 FILE_AIO_DEPTH, kv_get(opts, "aio-max-batch"));
		return -EINVAL;
	}
	fo->max_batch = (unsigned)max_batch;
	return file_parse_locking(opts, fo, err, errlen);
}

static int file_check_engine(enum file_aio aio, char *err, size_t errlen)
{
	if (aio == FILE_AIO_URING)
		return file_uring_check(err, errlen);
	if (aio == FILE_AIO_NATIVE)
		return file_aio_check(err, errlen);
	return 0;
}

static int file_probe_size(struct blk_node *bs, struct file_state *s, const char *name, char *err,
			   size_t errlen)
{
	struct stat st;
	uint64_t size;

	if (fstat(s->fd, &st) != 0)
		goto fail_errno;
	if (S_ISREG(st.st_mode)) {
		bs->size = (uint64_t)st.st_size;
		return 0;
	}
	if (ioctl(s->fd, BLKGETSIZE64, &size) != 0)
		goto fail_errno;
	s->is_blk = true; /* blk_file_open() let nothing else through */
	bs->size = size;
	return 0;
fail_errno:
	snprintf(err, errlen, "file: cannot get the size of '%s': %s", name, strerror(errno));
	return -errno;
}

/* Last resort when neither statx nor BLKSSZGET answers: the smallest length
 * (or buffer misalignment) that an O_DIRECT read accepts. Needs a file of at
 * least one page, else reads at EOF succeed whatever the alignment. */
static uint32_t file_probe_dio(int fd, char *buf, bool mem, uint32_t len)
{
	for (uint32_t a = 512; a < 4096; a <<= 1) {
		ssize_t n = mem ? pread(fd, buf + a, len, 0) : pread(fd, buf, a, 0);

		if (n >= 0)
			return a;
	}
	return 4096;
}

static void file_probe_align(struct blk_node *bs, struct file_state *s)
{
	struct statx stx;
	int lbs = 0;
	char *buf;

	bs->align = 1;
	bs->mem_align = 1;
	if (!s->direct)
		return;
	if (statx(s->fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &stx) == 0 &&
	    (stx.stx_mask & STATX_DIOALIGN) && stx.stx_dio_offset_align) {
		bs->align = stx.stx_dio_offset_align;
		bs->mem_align = stx.stx_dio_mem_align ? stx.stx_dio_mem_align : bs->align;
		return;
	}
	if (s->is_blk && ioctl(s->fd, BLKSSZGET, &lbs) == 0 && lbs > 0) {
		bs->align = (uint32_t)lbs;
		bs->mem_align = (uint32_t)lbs;
		return;
	}
	bs->align = bs->mem_align = 4096;
	if (bs->size < 4096 || posix_memalign((void **)&buf, 4096, 8192) != 0)
		return;
	bs->align = file_probe_dio(s->fd, buf, false, 0);
	bs->mem_align = file_probe_dio(s->fd, buf, true, bs->align);
	free(buf);
}

/* Punching at EOF with KEEP_SIZE changes nothing where it works and fails
 * with EOPNOTSUPP where it does not, so can_discard can tell the truth. */
static void file_probe_punch(struct file_state *s, uint64_t size)
{
	if (fallocate(s->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)size, 1) != 0 &&
	    errno == EOPNOTSUPP)
		s->punch_ok = false;
}

static int file_do_open(struct file_state *s, const struct file_opts *fo, bool ro, char *err,
			size_t errlen)
{
	int flags = (ro ? O_RDONLY : O_RDWR) | (fo->direct ? O_DIRECT : 0);
	char sub[384];

	s->fd = blk_file_open(fo->filename, flags, 0, sub, sizeof(sub));
	if (s->fd >= 0)
		return 0;
	snprintf(err, errlen, "file: %s", sub);
	return s->fd;
}

/* No lock is taken yet: the node holds nothing and shares everything until
 * the permissions are set (perm.c). */
static int file_setup_lock(struct file_state *s, const struct file_opts *fo, char *err,
			   size_t errlen)
{
	int ret;

	s->shared = BLK_PERM_ALL;
	s->path = strdup(fo->filename);
	if (!s->path) {
		snprintf(err, errlen, "file: out of memory");
		return -ENOMEM;
	}
	if (fo->locking == FILE_LOCK_OFF)
		return 0;
	ret = file_lock_probe(s->fd);
	s->use_lock = ret == 0;
	if (ret && fo->locking == FILE_LOCK_ON) {
		snprintf(err, errlen, "file: locking=on, but '%s' cannot be locked: %s",
			 fo->filename, strerror(-ret));
		return ret;
	}
	if (ret)
		log_debug("file: '%s': no OFD locks (%s); not locked", fo->filename,
			  strerror(-ret));
	return 0;
}

static int file_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	struct file_opts fo;
	struct file_state *s;
	int ret;

	ret = file_parse_opts(opts, &fo, err, errlen);
	if (ret == 0)
		ret = file_check_engine(fo.aio, err, errlen);
	if (ret)
		return ret;
	s = calloc(1, sizeof(*s));
	if (!s) {
		snprintf(err, errlen, "file: out of memory");
		return -ENOMEM;
	}
	s->direct = fo.direct;
	s->aio = fo.aio;
	s->max_batch = fo.max_batch;
	s->zero_range_ok = s->punch_ok = true;
	ret = file_do_open(s, &fo, bs->read_only, err, errlen);
	if (ret)
		goto fail;
	ret = file_probe_size(bs, s, fo.filename, err, errlen);
	if (!ret)
		ret = file_setup_lock(s, &fo, err, errlen);
	if (ret)
		goto fail_close;
	file_probe_align(bs, s);
	if (!bs->read_only && !s->is_blk)
		file_probe_punch(s, bs->size);
	bs->max_transfer = FILE_MAX_RW / bs->align * bs->align;
	bs->opaque = s;
	return 0;
fail_close:
	close(s->fd);
fail:
	free((char *)s->path);
	free(s);
	return ret;
}

static void file_free_thread(struct blk_node *bs, unsigned idx)
{
	struct file_thread *t = bs->thread_state[idx];

	if (!t)
		return;
	assert(t->stats.in_flight == 0);
	if (file_state(bs)->aio == FILE_AIO_NATIVE)
		file_aio_detach(bs, t);
	else if (file_state(bs)->aio == FILE_AIO_URING)
		file_uring_detach(bs, t);
	bs->thread_state[idx] = NULL;
}

static void file_detach_loop(struct blk_node *bs, struct loop *loop)
{
	file_free_thread(bs, loop_index(loop));
}

/* The core detaches every loop on its own thread before close; whatever is
 * left belongs to loops that are no longer running. */
static void file_close(struct blk_node *bs)
{
	struct file_state *s = file_state(bs);

	if (!s)
		return;
	for (unsigned i = 0; i < LOOP_MAX_THREADS; i++)
		file_free_thread(bs, i);
	file_unlock_all(s);
	close(s->fd);
	free((char *)s->path);
	free(s);
	bs->opaque = NULL;
}

unsigned file_max_batch(struct blk_node *bs, const struct loop *loop)
{
	struct file_state *s = file_state(bs);
	unsigned a = s->max_batch, b = loop_aio_max_batch(loop);

	if (a && b)
		return a < b ? a : b;
	if (a || b)
		return a ? a : b;
	return s->aio == FILE_AIO_NATIVE ? FILE_AIO_MAX_BATCH_NATIVE : 0;
}

int file_get_engine_stats(struct blk_node *bs, struct loop *loop, struct file_engine_stats *out)
{
	struct file_thread *t = bs->thread_state[loop_index(loop)];

	if (!t)
		return -ENOENT;
	*out = t->stats;
	return 0;
}

/* Block devices keep their size; files grow or shrink (new space is a hole). */
static int file_truncate(struct blk_node *bs, uint64_t size)
{
	struct file_state *s = file_state(bs);

	if (s->is_blk)
		return size == bs->size ? 0 : -ENOTSUP;
	if (size > (uint64_t)INT64_MAX)
		return -EFBIG;
	if (ftruncate(s->fd, (off_t)size) != 0)
		return -errno;
	bs->size = size;
	return 0;
}

static int file_submit(struct blk_node *bs, struct blk_request *req)
{
	struct file_state *s = file_state(bs);

	switch (req->op) {
	case BLK_OP_READ:
	case BLK_OP_WRITE:
		if (req->len == 0) {
			blk_complete_deferred(req, 0);
			return 0;
		}
		break;
	case BLK_OP_FLUSH:
		if (s->aio == FILE_AIO_URING)
			break;
		return file_submit_misc(bs, req);
	default:
		return file_submit_misc(bs, req);
	}
	switch (s->aio) {
	case FILE_AIO_URING:
		return file_uring_submit(bs, req);
	case FILE_AIO_NATIVE:
		return file_aio_submit(bs, req);
	default:
		return file_threads_submit(bs, req);
	}
}

static bool file_can_true(struct blk_node *bs)
{
	(void)bs;
	return true;
}

static bool file_can_discard(struct blk_node *bs)
{
	struct file_state *s = file_state(bs);

	return s->is_blk || s->punch_ok;
}

/* SEEK_DATA on a block device says "all data"; not worth a round trip. */
static bool file_can_block_status(struct blk_node *bs)
{
	return !file_state(bs)->is_blk;
}

/* Writable again (a commit's base, opened read-only as a backing file): the
 * image is opened for writing and the new file takes the old one's place
 * (same descriptor number, so the engines keep using it) holding the same
 * locks first. Read-only: nothing (the node refuses writes itself). */
static int file_set_read_only(struct blk_node *bs, bool ro)
{
	struct file_state *s = file_state(bs);
	int flags = fcntl(s->fd, F_GETFL), fd, ret;
	char err[256];

	if (ro || flags < 0 || (flags & O_ACCMODE) == O_RDWR || s->is_blk)
		return flags < 0 ? -errno : 0;
	fd = blk_file_open(s->path, O_RDWR | (s->direct ? O_DIRECT : 0), 0, err, sizeof(err));
	if (fd < 0)
		return fd;
	ret = file_lock_copy(s, fd);
	if (!ret && dup3(fd, s->fd, O_CLOEXEC) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

const struct blk_driver blk_drv_file = {
	.set_read_only = file_set_read_only,
	.name = "file",
	.open = file_open,
	.close = file_close,
	.submit = file_submit,
	.truncate = file_truncate,
	.detach_loop = file_detach_loop,
	.can_discard = file_can_discard,
	.can_write_zeroes = file_can_true,
	.can_fua = file_can_true, /* RWF_DSYNC in every engine */
	.can_block_status = file_can_block_status,
	.can_multi_conn = file_can_true, /* fdatasync covers writes from every thread */
	.set_perm = file_set_perm,
};

#define FILE_XFS_MAGIC 0x58465342

int blk_file_extent_hint(int fd, uint32_t bytes)
{
	struct fsxattr fa;
	struct statfs st;

	if (fstatfs(fd, &st) != 0 || (unsigned long)st.f_type != FILE_XFS_MAGIC)
		return 0;
	if (ioctl(fd, FS_IOC_FSGETXATTR, &fa) != 0)
		return -errno;
	if (bytes)
		fa.fsx_xflags |= FS_XFLAG_EXTSIZE;
	else
		fa.fsx_xflags &= ~(unsigned)FS_XFLAG_EXTSIZE;
	fa.fsx_extsize = bytes;
	return ioctl(fd, FS_IOC_FSSETXATTR, &fa) == 0 ? 0 : -errno;
}

const char *blk_file_path(const struct blk_node *bs)
{
	const struct file_state *s = bs->opaque;

	return bs->drv == &blk_drv_file && s ? s->path : NULL;
}

bool blk_file_direct(const struct blk_node *bs)
{
	const struct file_state *s = bs->opaque;

	return bs->drv == &blk_drv_file && s && s->direct;
}
