/* Small compiler helpers shared by every module: the structure around a
 * member, array length, branch hints. Threading: none (macros).
 *
 * Include it from .c files and private (-int.h) headers only: a file that
 * still has its own container_of and includes a public header must not see
 * a second, differently spelled definition. */
#ifndef IOPLANE_UTIL_COMPILER_H
#define IOPLANE_UTIL_COMPILER_H

#include <stddef.h>

/* The structure of type `type` whose member `member` ptr points to. */
#ifndef container_of
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))
#endif

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

#endif
