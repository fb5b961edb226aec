/* `ioplane qmp`'s KEY=VALUE arguments into a command's typed "arguments".
 *
 * THREADING RULE: single-threaded (a command-line tool). */
#ifndef IOPLANE_CMD_QMP_ARGS_H
#define IOPLANE_CMD_QMP_ARGS_H

#include <jansson.h>
#include <stddef.h>

/* argv[0..argc): "key=value" each, dotted keys as on qsd's command line.
 * schema: the server's query-qmp-schema answer (NULL: none); with the
 * command in it, the values get their member types and are checked; else
 * they stay strings. A new object, or NULL with the message in err. */
json_t *qmp_args_from_keyval(char **argv, int argc, const char *command, json_t *schema, char *err,
			     size_t errlen);

#endif
