/* throttle-group objects for QMP and --object (qmp-throttle.c): the
 * ThrottleGroupProperties branch of ObjectOptions, their creation, and
 * qom-get / qom-set on them.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_THROTTLE_H
#define IOPLANE_CONTROL_QMP_THROTTLE_H

#include <jansson.h>
#include <stddef.h>

struct qapi_type;

extern const struct qapi_type qmp_throttle_group_props;

/* Make the group validated args (ObjectOptions, qom-type throttle-group)
 * describe. 0, or -errno with qsd's message. */
int qmp_throttle_add(const json_t *args, char *err, size_t errlen);
/* A property of the group at path ("ID" or "/objects/ID"): -ENOENT when
 * no group is there, -EINVAL with qsd's message. */
int qmp_throttle_qom_get(const char *path, const char *prop, json_t **out, char *err,
			 size_t errlen);
int qmp_throttle_qom_set(const char *path, const char *prop, json_t *value, char *err,
			 size_t errlen);
/* Register qom-get and qom-set. 0 or -errno. */
int qmp_throttle_register(void);

#endif
