/* Image locking of the `file` driver, compatible with QEMU's: one byte per
 * permission, locked shared (F_RDLCK) with open file description (OFD)
 * locks - byte 100+bit while the permission is held, byte 200+bit while it
 * is not shared. A user may take a permission when no one else locks its
 * byte 200+bit, and may refuse to share one when no one else locks its
 * byte 100+bit. OFD locks belong to the open file, so they hold across
 * threads and drop when the fd is closed, and two opens of one image in
 * this process see each other as QEMU processes do.
 *
 * Threading: main thread (open, permission changes, close). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "block/file-int.h"

#define LOCK_PERM_BASE 100   /* QEMU's RAW_LOCK_PERM_BASE */
#define LOCK_SHARED_BASE 200 /* QEMU's RAW_LOCK_SHARED_BASE */

static int lock_byte(int fd, int cmd, short type, off_t off, struct flock *fl)
{
	*fl = (struct flock){.l_type = type, .l_whence = SEEK_SET, .l_start = off, .l_len = 1};
	return fcntl(fd, cmd, fl) == 0 ? 0 : -errno;
}

/* Does another open file lock byte off (*held)? 0 or -errno. */
static int lock_held_by_other(int fd, off_t off, bool *held)
{
	struct flock fl;
	int ret = lock_byte(fd, F_OFD_GETLK, F_WRLCK, off, &fl);

	*held = ret == 0 && fl.l_type != F_UNLCK;
	return ret;
}

/* Whether another open file locks byte off; false when that cannot be told. */
static bool lock_seen(int fd, off_t off)
{
	bool held;

	lock_held_by_other(fd, off, &held);
	return held;
}

int file_lock_probe(int fd)
{
	bool held;

	return lock_held_by_other(fd, LOCK_PERM_BASE, &held);
}

/* Lock the bytes of perm (held) and unshared (not shared); with unlock, also
 * release the bytes of s's locked sets that are not in them. */
static int lock_apply(struct file_state *s, uint32_t perm, uint32_t unshared, bool unlock)
{
	struct flock fl;
	int ret;

	for (unsigned i = 0; i < BLK_PERM_COUNT; i++) {
		uint32_t b = 1u << i;

		for (unsigned k = 0; k < 2; k++) {
			uint32_t want = k ? unshared : perm,
				 *have = k ? &s->lk_unshared : &s->lk_perm;
			off_t off = (k ? LOCK_SHARED_BASE : LOCK_PERM_BASE) + i;

			if ((want & b) && !(*have & b)) {
				ret = lock_byte(s->fd, F_OFD_SETLK, F_RDLCK, off, &fl);
				if (ret)
					return ret;
				*have |= b;
			} else if (unlock && !(want & b) && (*have & b)) {
				if (lock_byte(s->fd, F_OFD_SETLK, F_UNLCK, off, &fl) == 0)
					*have &= ~b;
			}
		}
	}
	return 0;
}

/* Which permissions other users hold (held) and refuse to share (unshared). */
static void lock_others(int fd, uint32_t *held, uint32_t *unshared)
{
	*held = *unshared = 0;
	for (unsigned i = 0; i < BLK_PERM_COUNT; i++) {
		if (lock_seen(fd, LOCK_PERM_BASE + i))
			*held |= 1u << i;
		if (lock_seen(fd, LOCK_SHARED_BASE + i))
			*unshared |= 1u << i;
	}
}

/* QEMU's words ("Failed to get "write" lock", "Is another process using the
 * image [PATH]?"), plus what the other users hold. */
static void lock_conflict_msg(int fd, const char *path, bool shared_lock, uint32_t bit, char *err,
			      size_t errlen)
{
	char name[32], held_s[96], unshared_s[96];
	uint32_t held, unshared;

	lock_others(fd, &held, &unshared);
	blk_perm_names(bit, name, sizeof(name));
	blk_perm_names(held, held_s, sizeof(held_s));
	blk_perm_names(unshared, unshared_s, sizeof(unshared_s));
	snprintf(err, errlen,
		 "Failed to get %s\"%s\" lock: another process %s \"%s\" (other users hold: %s; "
		 "they do not share: %s). Is another process using the image [%s]?",
		 shared_lock ? "shared " : "", name,
		 shared_lock ? "holds the permission" : "does not share", name, held_s, unshared_s,
		 path);
}

/* May we hold perm and refuse to share what shared lacks? */
static int lock_check(int fd, const char *path, uint32_t perm, uint32_t shared, char *err,
		      size_t errlen)
{
	for (unsigned k = 0; k < 2; k++) {
		for (unsigned i = 0; i < BLK_PERM_COUNT; i++) {
			uint32_t b = 1u << i;
			bool held;
			int ret;

			if (k ? (shared & b) : !(perm & b))
				continue;
			ret = lock_held_by_other(fd, (k ? LOCK_PERM_BASE : LOCK_SHARED_BASE) + i,
						 &held);
			if (ret < 0) {
				snprintf(err, errlen, "cannot test the locks of '%s': %s", path,
					 strerror(-ret));
				return ret;
			}
			if (held) {
				lock_conflict_msg(fd, path, k, b, err, errlen);
				return -EBUSY;
			}
		}
	}
	return 0;
}

static int lock_prepare(struct file_state *s, uint32_t perm, uint32_t shared, char *err,
			size_t errlen)
{
	int ret = lock_apply(s, s->perm | perm, ~s->shared | ~shared, false);

	if (ret)
		snprintf(err, errlen, "cannot lock '%s': %s", s->path, strerror(-ret));
	else
		ret = lock_check(s->fd, s->path, perm, shared, err, errlen);
	if (ret)
		lock_apply(s, s->perm, ~s->shared, true);
	return ret;
}

int file_lock_copy(struct file_state *s, int fd)
{
	struct flock fl;

	for (unsigned i = 0; s->use_lock && i < BLK_PERM_COUNT; i++) {
		if ((s->lk_perm & (1u << i)) &&
		    lock_byte(fd, F_OFD_SETLK, F_RDLCK, LOCK_PERM_BASE + i, &fl))
			return -errno;
		if ((s->lk_unshared & (1u << i)) &&
		    lock_byte(fd, F_OFD_SETLK, F_RDLCK, LOCK_SHARED_BASE + i, &fl))
			return -errno;
	}
	return 0;
}

void file_unlock_all(struct file_state *s)
{
	if (s->use_lock)
		lock_apply(s, 0, 0, true);
	s->perm = 0;
	s->shared = BLK_PERM_ALL;
}

int file_set_perm(struct blk_node *bs, enum blk_perm_step step, uint32_t perm, uint32_t shared,
		  char *err, size_t errlen)
{
	struct file_state *s = file_state(bs);

	if (!s->use_lock)
		return 0;
	switch (step) {
	case BLK_PERM_PREPARE:
		return lock_prepare(s, perm, shared, err, errlen);
	case BLK_PERM_COMMIT:
		lock_apply(s, perm, ~shared & BLK_PERM_ALL, true);
		s->perm = perm;
		s->shared = shared;
		return 0;
	default:
		lock_apply(s, s->perm, ~s->shared & BLK_PERM_ALL, true);
		return 0;
	}
}

int blk_file_create(const char *path, uint32_t perm, uint32_t shared, char *err, size_t errlen)
{
	struct file_state s = {.perm = 0, .shared = BLK_PERM_ALL, .path = path};
	struct stat st;
	int ret;

	s.fd = blk_file_open(path, O_RDWR | O_CREAT, 0644, err, errlen);
	if (s.fd < 0)
		return s.fd;
	ret = file_lock_probe(s.fd);
	if (!ret)
		ret = lock_prepare(&s, perm, shared, err, errlen);
	else
		ret = 0; /* no OFD locks here: create without, as locking=auto */
	if (!ret && fstat(s.fd, &st) == 0 && S_ISREG(st.st_mode) && ftruncate(s.fd, 0) != 0) {
		ret = -errno;
		snprintf(err, errlen, "cannot truncate '%s': %s", path, strerror(errno));
	}
	if (ret) {
		close(s.fd);
		return ret;
	}
	return s.fd;
}
