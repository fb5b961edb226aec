/* QOM-style objects of `ioplane serve`: iothreads (and TLS credentials and
 * authorisation, qmp-tls.h), made by --object,
 * --iothreads N (the pool, named iothread0 ..) or QMP object-add, removed by
 * object-del when nothing uses them, listed by query-iothreads; and throttle
 * groups the same way (qmp-throttle.h), in the same namespace of ids. Exports name
 * the iothreads they run on (iothread=ID) and hold a use of each.
 *
 * THREADING RULE: main thread only; the iothreads themselves run their loops. */
#ifndef IOPLANE_CONTROL_QMP_OBJECT_H
#define IOPLANE_CONTROL_QMP_OBJECT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct loop;
struct qapi_type;

/* ObjectOptions (qom-type iothread, secret, throttle-group, and the TLS ones
 * of qmp-tls.h), for --object and object-add. */
extern const struct qapi_type qmp_object_options;

/* Register object-add, object-del, query-iothreads, qom-get, qom-set. 0 or
 * -errno. */
int qmp_object_register(void);
/* Create the object validated args describe (ObjectOptions). 0, or -errno
 * with qsd's message in err. */
int qmp_object_add(const json_t *args, char *err, size_t errlen);
/* Is there an object (of any type) with this id? */
bool qmp_object_exists(const char *id);
/* --object ARG: parse, validate and add; 0 or -errno (-EINVAL: bad syntax). */
int qmp_object_add_option(const char *arg, char *err, size_t errlen);
/* The --iothreads N pool: iothread0 .. iothread{N-1}, held for the daemon's
 * life; *loops gets their loops (an array owned here). 0 or -errno. */
int qmp_iothread_pool(unsigned n, int64_t poll_max_ns, struct loop ***loops, char *err,
		      size_t errlen);

/* A use of iothread id: its loop, or NULL (err: qsd's "iothread \"X\" not
 * found"). Give it back with qmp_iothread_put(). */
struct loop *qmp_iothread_get(const char *id, char *err, size_t errlen);
void qmp_iothread_put(struct loop *loop);
/* fn(ctx, id, t) for each iothread, oldest first (the metrics endpoint). */
struct iothread;
void qmp_iothreads_foreach(void (*fn)(void *ctx, const char *id, struct iothread *t), void *ctx);
/* The id of the iothread running loop (NULL: not one of ours). */
const char *qmp_iothread_id(const struct loop *loop);

/* fn(arg) runs on each iothread just before it is stopped (object-del, and
 * qmp_objects_free): block nodes drop their state for that thread there. */
void qmp_objects_set_detach(void (*fn)(void *arg), void *arg);
/* Stop and free every iothread (the pool too), at the daemon's end. */
void qmp_objects_free(void);

/* A secret object (QEMU's SecretProperties: data= or file=, format=raw|
 * base64) into util/secret.h's table (qmp-secret.c). 0 or -errno and
 * QEMU's message. */
int qmp_secret_add(const char *id, const json_t *args, char *err, size_t errlen);

#endif
