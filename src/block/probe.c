/* Format probing: which image format a file's first 512 bytes (and, for dmg,
 * its name or last 512 bytes) say it is, for every format qemu-img probes,
 * so that an image of another format is never taken for raw. The signatures
 * come from the formats' specifications.
 *
 * Threading: any thread; blk_probe_file() does blocking reads of the path,
 * or of a remote target through its driver on the caller's loop. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "block/block.h"
#include "block/file.h"
#include "util/log.h"

static uint32_t probe_be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t probe_le32(const uint8_t *p)
{
	return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

static bool probe_at(const uint8_t *b, size_t n, size_t off, const void *sig, size_t len)
{
	return off + len <= n && !memcmp(b + off, sig, len);
}

/* A NUL-terminated string in a fixed-size field, as the Bochs header has. */
static bool probe_field(const uint8_t *b, size_t n, size_t off, const char *s)
{
	return probe_at(b, n, off, s, strlen(s) + 1);
}

/* A VMDK descriptor file: comment lines (#) and blank lines, then a
 * "version=1", "version=2" or "version=3" line (LF or CRLF). */
static bool probe_vmdk_text(const uint8_t *b, size_t n)
{
	size_t i = 0;

	while (i < n) {
		if (b[i] == '#') {
			while (i < n && b[i] != '\n')
				i++;
			i++;
			continue;
		}
		if (b[i] == ' ' || b[i] == '\r' || b[i] == '\n') {
			while (i < n && b[i] == ' ')
				i++;
			if (i < n && b[i] == '\r')
				i++;
			if (i >= n || b[i] != '\n')
				return false;
			i++;
			continue;
		}
		if (n - i < 10 || memcmp(b + i, "version=", 8) || b[i + 8] < '1' || b[i + 8] > '3')
			return false;
		return b[i + 9] == '\n' || (n - i >= 11 && b[i + 9] == '\r' && b[i + 10] == '\n');
	}
	return false;
}

static bool probe_bochs(const uint8_t *b, size_t n)
{
	uint32_t v = n >= 68 ? probe_le32(b + 64) : 0;

	return probe_field(b, n, 0, "Bochs Virtual HD Image") && probe_field(b, n, 32, "Redolog") &&
	       probe_field(b, n, 48, "Growing") && (v == 0x00020000 || v == 0x00010000);
}

static const char probe_cloop[] = "#!/bin/sh\n#V2.0 Format\n"
				  "modprobe cloop file=$0 && mount -r -t iso9660 /dev/cloop $1\n";

/* Formats recognised by their first bytes alone. */
static const char *probe_head(const uint8_t *b, size_t n)
{
	if (probe_at(b, n, 0, "QFI\xfb", 4))
		return n >= 8 && probe_be32(b + 4) == 1 ? "qcow" : "qcow2";
	if (probe_at(b, n, 0, "QED\0", 4))
		return "qed";
	if (probe_at(b, n, 0, "KDMV", 4) || probe_at(b, n, 0, "COWD", 4) || probe_vmdk_text(b, n))
		return "vmdk";
	if (n >= 68 && probe_le32(b + 64) == 0xbeda107f)
		return "vdi";
	if (probe_at(b, n, 0, "vhdxfile", 8))
		return "vhdx";
	if (probe_at(b, n, 0, "conectix", 8))
		return "vpc";
	if ((probe_at(b, n, 0, "WithoutFreeSpace", 16) ||
	     probe_at(b, n, 0, "WithouFreSpacExt", 16)) &&
	    n >= 20 && probe_le32(b + 16) == 2)
		return "parallels";
	if (probe_at(b, n, 0, probe_cloop, sizeof(probe_cloop) - 1))
		return "cloop";
	if (probe_bochs(b, n))
		return "bochs";
	if (probe_at(b, n, 0, "LUKS\xba\xbe", 6))
		return "luks";
	return NULL;
}

const char *blk_probe_buf(const uint8_t *head, size_t n, const uint8_t *tail, size_t tn,
			  const char *filename)
{
	const char *fmt = probe_head(head, n);
	size_t fl = filename ? strlen(filename) : 0;

	if (fmt)
		return fmt;
	/* qemu-img takes a file named *.dmg for dmg; the format's trailer
	 * (the "koly" block in the last 512 bytes) says so whatever the name. */
	if ((fl > 4 && !strcmp(filename + fl - 4, ".dmg")) ||
	    (tail && tn == 512 && !memcmp(tail, "koly", 4)))
		return "dmg";
	return "raw";
}

bool blk_format_supported(const char *fmt)
{
	return fmt && (!strcmp(fmt, "raw") || !strcmp(fmt, "qcow2"));
}

static int probe_read(int fd, const char *path, uint8_t *buf, size_t len, off_t off, size_t *got,
		      char *err, size_t errlen)
{
	ssize_t n = pread(fd, buf, len, off);

	if (n < 0) {
		snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
		return -errno;
	}
	*got = (size_t)n;
	return 0;
}

/* A remote image: its first and last 512 bytes through its driver, on the
 * caller's loop. */
static int probe_remote(const char *target, uint8_t *head, size_t *n, uint8_t *tail, size_t *tn,
			char *err, size_t errlen)
{
	struct loop *loop = loop_current();
	struct blk_node *bs;
	uint64_t size;
	int ret;

	if (!loop) {
		snprintf(err, errlen, "cannot probe '%s' without an event loop", target);
		return -EINVAL;
	}
	ret = blk_open_target(target, NULL, "read-only=on", &bs, err, errlen);
	if (ret)
		return ret;
	size = blk_size(bs);
	*n = size < 512 ? (size_t)size : 512;
	ret = *n ? blk_pread(bs, 0, head, *n) : 0;
	if (!ret && size >= 1024) {
		*tn = 512;
		ret = blk_pread(bs, size - 512, tail, 512);
	}
	if (ret)
		snprintf(err, errlen, "cannot read '%s': %s", target, strerror(-ret));
	blk_detach_loop(bs, loop);
	blk_close(bs);
	return ret;
}

int blk_probe_file(const char *path, const char **fmt, char *err, size_t errlen)
{
	uint8_t head[512] = {0}, tail[512] = {0};
	size_t n = 0, tn = 0;
	struct stat st;
	int fd, ret;

	if (blk_target_remote(path)) {
		ret = probe_remote(path, head, &n, tail, &tn, err, errlen);
		if (!ret)
			*fmt = blk_probe_buf(head, n, tn ? tail : NULL, tn, NULL);
		return ret;
	}
	fd = blk_file_open(path, O_RDONLY, 0, err, errlen);
	if (fd < 0)
		return fd;
	ret = probe_read(fd, path, head, sizeof(head), 0, &n, err, errlen);
	if (!ret && fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= 1024)
		ret = probe_read(fd, path, tail, sizeof(tail), st.st_size - 512, &tn, err, errlen);
	close(fd);
	if (!ret)
		*fmt = blk_probe_buf(head, n, tn ? tail : NULL, tn, path);
	return ret;
}

int blk_probe_format(const char *path, const char **fmt, char *err, size_t errlen)
{
	int ret = blk_probe_file(path, fmt, err, errlen);

	if (ret || blk_format_supported(*fmt))
		return ret;
	snprintf(err, errlen,
		 "'%s' is a %s image, a format ioplane does not open (it opens raw "
		 "and qcow2; qemu-img convert -O qcow2 can convert it)",
		 path, *fmt);
	return -ENOTSUP;
}

void blk_probe_warn(const struct blk_node *bs, const char *path)
{
	if (!bs->read_only)
		log_warn("the format of '%s' was not given and probing guessed raw: writes that "
			 "would make its first 512 bytes look like another format are refused "
			 "(give format=raw to lift this)",
			 path);
}
