/* qemu-storage-daemon's command-line syntax for structured options
 * (--blockdev, --export, --monitor, --object, --nbd-server): KEY=VALUE pairs
 * made into a JSON object whose leaves are strings, with QEMU's rules and
 * error texts; or, when the argument starts with '{', a JSON object.
 * The schema layer (schema.h) turns the strings into the member types.
 *
 * THREADING RULE: pure functions. */
#ifndef IOPLANE_CONTROL_KEYVAL_H
#define IOPLANE_CONTROL_KEYVAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* Syntax (as QEMU's util/keyval.c documents it):
 *   key-vals = [ key '=' val { ',' key '=' val } [ ',' ] ]
 *   key      = fragment { '.' fragment }: a QAPI name, later fragments may
 *              be list indices (decimal digits); 1..127 characters each
 *   val      = any text; ",," is a comma
 * a.b=x makes {"a": {"b": "x"}}; a.0=x,a.1=y makes {"a": ["x", "y"]} (no
 * gaps allowed); a key given twice keeps its last value. With implied_key,
 * a first element without '=' is implied_key's value (it ends at the first
 * ','). An element "help" or "?" sets *help; with help NULL it is the error
 * "Help is not available for this option".
 * Returns a new object, or NULL with QEMU's message in err. */
json_t *keyval_parse(const char *s, const char *implied_key, bool *help, char *err, size_t errlen);

/* qsd's option argument: JSON if it starts with '{' (*is_json true: the
 * values are typed), else keyval_parse() without help. */
json_t *keyval_or_json(const char *s, const char *implied_key, bool *is_json, char *err,
		       size_t errlen);

#endif
