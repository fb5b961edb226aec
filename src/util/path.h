/* File name helpers. Threading: pure functions. */
#ifndef IOPLANE_UTIL_PATH_H
#define IOPLANE_UTIL_PATH_H

/* `name` as seen from the directory of the file `base`, as qemu-img takes a
 * backing file name: an absolute name, or a base without a directory part
 * (or NULL), gives name itself; otherwise base's directory (up to its last
 * '/') followed by name. A new string (free it), NULL when out of memory. */
char *path_relative(const char *base, const char *name);

#endif
