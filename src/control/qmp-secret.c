/* secret objects (QEMU's, qom.json SecretProperties): the value from data=
 * or from file=, decoded when format=base64, into util/secret.h's table,
 * where drivers find it by id (rbd's key-secret). Encrypted secrets (keyid,
 * iv) are refused by name.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "control/qmp-object.h"
#include "control/schema.h"
#include "util/secret.h"

#define SECRET_FILE_MAX (64u << 10)

/* The file's bytes (at most SECRET_FILE_MAX) in a new buffer. */
static int read_secret_file(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	char *buf = malloc(SECRET_FILE_MAX + 1);
	ssize_t n = 0, r = 1;

	while (fd >= 0 && buf && r > 0 && (size_t)n <= SECRET_FILE_MAX) {
		r = read(fd, buf + n, SECRET_FILE_MAX + 1 - (size_t)n);
		n += r > 0 ? r : 0;
	}
	if (fd < 0 || !buf || r < 0 || (size_t)n > SECRET_FILE_MAX) {
		snprintf(err, errlen, "Unable to read %s: %s", path,
			 fd < 0 || r < 0 ? strerror(errno)
			 : !buf          ? "out of memory"
					 : "too large");
		if (fd >= 0)
			close(fd);
		free(buf);
		return -EINVAL;
	}
	close(fd);
	*out = buf;
	*len = (size_t)n;
	return 0;
}

static int secret_value(const json_t *args, char **val, size_t *len, char *err, size_t errlen)
{
	const char *data = qapi_get_str(args, "data"), *file = qapi_get_str(args, "file");

	if (data && file) {
		snprintf(err, errlen, "'data' and 'file' are mutually exclusive");
		return -EINVAL;
	}
	if (!data && !file) {
		snprintf(err, errlen, "'file' or 'data' must be provided");
		return -EINVAL;
	}
	if (file)
		return read_secret_file(file, val, len, err, errlen);
	*val = strdup(data);
	*len = strlen(data);
	if (!*val) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

/* format=base64: decoded in place. A file's one trailing newline is not
 * part of the text. */
static int secret_decode(char *val, size_t *len, char *err, size_t errlen)
{
	long n;

	if (*len && val[*len - 1] == '\n')
		(*len)--;
	n = secret_base64_decode(val, *len, (unsigned char *)val);
	if (n < 0) {
		snprintf(err, errlen, "Secret data is not valid base64");
		return -EINVAL;
	}
	*len = (size_t)n;
	return 0;
}

int qmp_secret_add(const char *id, const json_t *args, char *err, size_t errlen)
{
	const char *fmt = qapi_get_str(args, "format");
	char *val = NULL;
	size_t len = 0, cap;
	int ret;

	if (qapi_has(args, "keyid") || qapi_has(args, "iv")) {
		snprintf(err, errlen, "encrypted secrets (keyid, iv) are not supported by ioplane");
		return -ENOTSUP;
	}
	ret = secret_value(args, &val, &len, err, errlen);
	cap = len;
	if (!ret && fmt && !strcmp(fmt, "base64"))
		ret = secret_decode(val, &len, err, errlen);
	if (!ret && (ret = secret_add(id, val, len)) < 0)
		snprintf(err, errlen, "%s", ret == -EEXIST ? "duplicate id" : "out of memory");
	if (val) {
		explicit_bzero(val, cap);
		free(val);
	}
	return ret;
}
