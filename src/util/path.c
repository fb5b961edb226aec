/* File name helpers (see path.h). Threading: pure functions. */
#include <stdlib.h>
#include <string.h>

#include "util/path.h"

char *path_relative(const char *base, const char *name)
{
	const char *slash = base ? strrchr(base, '/') : NULL;
	size_t dl, nl = strlen(name) + 1;
	char *p;

	if (name[0] == '/' || !slash)
		return strdup(name);
	dl = (size_t)(slash - base) + 1;
	p = malloc(dl + nl);
	if (p) {
		memcpy(p, base, dl);
		memcpy(p + dl, name, nl);
	}
	return p;
}
