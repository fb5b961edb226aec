/* Libraries loaded when first needed: dlopen once, dlsym every entry point.
 * Threading: dynlib_load from any thread; one lock serialises loads. */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "util/dynlib.h"

static pthread_mutex_t dynlib_lock = PTHREAD_MUTEX_INITIALIZER;

static int dynlib_fill(struct dynlib *lib, const char *what)
{
	void *h[8] = {0};
	size_t n = 0;

	for (; lib->sonames[n]; n++) {
		if (n == sizeof(h) / sizeof(h[0]) ||
		    !(h[n] = dlopen(lib->sonames[n], RTLD_NOW | RTLD_LOCAL))) {
			snprintf(lib->err, sizeof(lib->err), "%s support needs %s (dlopen: %s)",
				 what, lib->pkg, n < 8 ? dlerror() : "too many libraries");
			return -ENOENT;
		}
	}
	for (size_t i = 0; i < lib->nsyms; i++) {
		void *p = NULL;

		for (size_t j = 0; j < n && !p; j++)
			p = dlsym(h[j], lib->syms[i].name);
		if (!p) {
			snprintf(lib->err, sizeof(lib->err),
				 "%s support needs %s (dlopen: no symbol %s in %s)", what, lib->pkg,
				 lib->syms[i].name, lib->sonames[0]);
			return -ENOENT;
		}
		/* A data pointer from dlsym into a function pointer slot (POSIX). */
		memcpy(lib->syms[i].slot, &p, sizeof(p));
	}
	return 0;
}

int dynlib_load(struct dynlib *lib, const char *what, char *err, size_t errlen)
{
	int ret = 0;

	pthread_mutex_lock(&dynlib_lock);
	if (!lib->loaded && !lib->err[0]) {
		ret = dynlib_fill(lib, what);
		lib->loaded = ret == 0;
	} else if (!lib->loaded) {
		ret = -ENOENT;
	}
	pthread_mutex_unlock(&dynlib_lock);
	if (ret && err)
		snprintf(err, errlen, "%s", lib->err);
	return ret;
}
