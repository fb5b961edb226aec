/* Libraries loaded when first needed (dlopen), so that a daemon that never
 * opens an rbd or nbd node does not pay for librbd's or libnbd's static
 * constructors, threads and the libraries they pull in. A library is loaded
 * once and never unloaded.
 *
 * THREADING RULE: dynlib_load from any thread (serialised inside); the table
 * it fills is read-only once dynlib_load has returned 0. */
#ifndef IOPLANE_UTIL_DYNLIB_H
#define IOPLANE_UTIL_DYNLIB_H

#include <stdbool.h>
#include <stddef.h>

/* One entry point: its name and where its address goes (a function pointer). */
struct dynlib_sym {
	const char *name;
	void *slot;
};

/* A set of entry points from one or more shared objects. */
struct dynlib {
	const char *pkg;            /* the Debian package that ships them, for messages */
	const char *const *sonames; /* NULL-terminated, loaded in order */
	const struct dynlib_sym *syms;
	size_t nsyms;
	bool loaded;   /* protected by dynlib's lock */
	char err[256]; /* the first failure, repeated to later callers */
};

/* Load the library and fill every slot: 0, or -ENOENT and
 * "<what> support needs <pkg> (dlopen: ...)" in err. */
int dynlib_load(struct dynlib *lib, const char *what, char *err, size_t errlen);

/* Entry `f` of a table `tab` whose member f has f's own type. */
#define DYNLIB_SYM(tab, f)                                                                         \
	{                                                                                          \
#f, &(tab).f                                                                       \
	}

#endif
