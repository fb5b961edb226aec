/* Block exports at runtime, qemu-storage-daemon's way: nbd-server-start,
 * nbd-server-stop, block-export-add (nbd, vhost-user-blk), block-export-del,
 * query-block-exports and the BLOCK_EXPORT_DELETED event; --export and
 * --nbd-server, and ioplane's --nbd / --vhost-user-blk shorthands, create
 * exports through the same function. One export's addition or removal never
 * pauses another's; a removed export is gone (and the event sent) once its
 * requests in flight have finished.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_EXPORT_H
#define IOPLANE_CONTROL_QMP_EXPORT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "export/nbd-server.h"

struct blk_node;
struct loop;
struct nbd_budget;
struct nbd_server;
struct qapi_type;

/* What the exports are built on, given once by the daemon. */
struct qmp_export_env {
	struct loop *main_loop;
	struct loop **loops; /* the iothread pool: exports without iothread= */
	unsigned nloops;
	struct nbd_budget *budget;    /* shared NBD request memory */
	unsigned nbd_max_connections; /* nbd-server-start without max-connections */
	/* The node called name (and its detect-zeroes mode), or NULL. */
	struct blk_node *(*find_node)(void *ctx, const char *name, enum nbd_detect_zeroes *dz);
	void *ctx;
};

/* BlockExportOptions and NbdServerOptions, for --export and --nbd-server. */
extern const struct qapi_type qmp_block_export_options, qmp_nbd_server_options;
/* SocketAddress (sockets.json); blockdev-add's nbd driver takes one too. */
extern const struct qapi_type qexp_socket_address;

/* Register the commands and the event; env is copied. 0 or -errno. */
int qmp_export_init(const struct qmp_export_env *env);

/* What the command line can say beyond BlockExportOptions. */
struct qmp_export_extra {
	struct nbd_server *nbd; /* type nbd: this server (an --nbd address), not the QMP one */
	mode_t mode;            /* vhost-user-blk: socket permissions (0: 0600) */
	bool cmdline;           /* addr.type=fd allowed: a socket from the parent */
};

/* block-export-add: args validated against qmp_block_export_options. 0, or
 * -errno with qsd's message in err. */
int qmp_export_add(const json_t *args, const struct qmp_export_extra *x, char *err, size_t errlen);
/* --nbd-server: nbd-server-start with NbdServerOptions (flat addr; fd allowed). */
int qmp_nbd_server_start(const json_t *args, char *err, size_t errlen);

/* Shutdown: stop accepting and drop every export's clients (requests in
 * flight finish); done(opaque) runs once per returned count, later. */
unsigned qmp_exports_stop(void (*done)(void *opaque), void *opaque);
/* The drain took too long: drop NBD connections now. */
void qmp_exports_abort(void);
/* After qmp_exports_stop() finished and the iothreads are gone. */
void qmp_exports_free(void);
unsigned qmp_export_count(void);
/* The first iothread of the oldest export whose node is bs or has bs in
 * its chain below (backing files, filters' children); NULL when there is
 * none or it serves from the main loop. Main thread. */
struct loop *qmp_export_loop(struct blk_node *bs);

/* One export as the metrics endpoint reports it. */
struct qmp_export_view {
	const char *id, *type, *node; /* type: "nbd" or "vhost-user-blk" */
	unsigned clients;             /* NBD connections; vhost-user: 1 with a front-end */
	unsigned queues;              /* vhost-user-blk: num-queues; NBD: 0 */
};
/* fn(ctx, view) for each export, oldest first. */
void qmp_exports_foreach(void (*fn)(void *ctx, const struct qmp_export_view *v), void *ctx);
/* An export id for the command line's shorthands: want when it is a valid
 * id not taken, else PREFIX0, PREFIX1, ... (the first one free). */
void qmp_export_make_id(const char *want, const char *prefix, char *out, size_t len);

/* An iothread goes (object-del, exit): the NBD servers forget its loop,
 * where exports placed connections (nbd_server_forget_loop's rules). */
void qmp_exports_forget_loop(struct loop *loop);

#endif
