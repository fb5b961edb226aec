/* Corpus replayer: a main() that runs LLVMFuzzerTestOneInput (linked in from a
 * fuzz-NAME.c) once on every file given, or on every regular file in each directory
 * given (sorted by name, not recursive). Built with any compiler, so the normal test
 * run replays the corpora and crashers under gcc and ASan (tests/fuzz/replay.sh).
 * Exit 0 when every input ran, 1 when an input could not be read, 2 on usage.
 * Threading: single-threaded. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

/* Larger inputs are refused: libFuzzer's own inputs are far smaller. */
#define REPLAY_MAX_INPUT (64u << 20)

static int replay_read(const char *path, uint8_t **out, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	struct stat st;
	int ret;

	if (!f)
		return -errno;
	ret = -EFBIG;
	if (fstat(fileno(f), &st) < 0 || st.st_size > (off_t)REPLAY_MAX_INPUT)
		goto out;
	ret = -ENOMEM;
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf)
		goto out;
	ret = -EIO;
	if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size)
		goto out;
	*out = buf;
	*len = (size_t)st.st_size;
	buf = NULL;
	ret = 0;
out:
	free(buf);
	fclose(f);
	return ret;
}

static int replay_file(const char *path)
{
	uint8_t *data = NULL;
	size_t len = 0;
	int ret = replay_read(path, &data, &len);

	if (ret < 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(-ret));
		return ret;
	}
	/* Printed first so that a crash report names its input. */
	fprintf(stderr, "replay: %s (%zu bytes)\n", path, len);
	LLVMFuzzerTestOneInput(data, len);
	free(data);
	return 0;
}

static int replay_name_cmp(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

static int replay_dir(const char *dir, unsigned *count)
{
	struct dirent **ents;
	char path[4096];
	struct stat st;
	int n = scandir(dir, &ents, NULL, replay_name_cmp);
	int i, ret = 0;

	if (n < 0) {
		ret = -errno;
		fprintf(stderr, "replay: %s: %s\n", dir, strerror(-ret));
		return ret;
	}
	for (i = 0; i < n; i++) {
		int len = snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);

		if (len > 0 && (size_t)len < sizeof(path) && !stat(path, &st) &&
		    S_ISREG(st.st_mode) && ents[i]->d_name[0] != '.') {
			if (replay_file(path) < 0)
				ret = -EIO;
			else
				(*count)++;
		}
		free(ents[i]);
	}
	free(ents);
	return ret;
}

int main(int argc, char **argv)
{
	unsigned count = 0;
	struct stat st;
	int i, bad = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	for (i = 1; i < argc; i++) {
		if (stat(argv[i], &st) < 0) {
			fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
			bad = 1;
		} else if (S_ISDIR(st.st_mode)) {
			bad |= replay_dir(argv[i], &count) < 0;
		} else if (replay_file(argv[i]) < 0) {
			bad = 1;
		} else {
			count++;
		}
	}
	printf("replayed %u inputs\n", count);
	return bad;
}
