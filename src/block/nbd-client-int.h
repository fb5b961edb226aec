/* Private parts of the `nbd` protocol driver, shared by nbd-client.c
 * (connections and requests) and nbd-client-open.c (libnbd's loading, options
 * and open). Threading: the node (struct nbdc_state) is read-only after open
 * except its lock-protected fields; the libnbd table after loading. */
#ifndef IOPLANE_BLOCK_NBD_CLIENT_INT_H
#define IOPLANE_BLOCK_NBD_CLIENT_INT_H

#include <libnbd.h>
#include <pthread.h>

#include "block/block-driver.h"

/* libnbd, loaded at the first open: an idle daemon does not map it and what
 * it pulls in (gnutls, libxml2). The header declares the entry points. */
/* clang-format off */
#define NBDC_LIB_FNS(X) \
	X(nbd_add_meta_context) X(nbd_aio_block_status) X(nbd_aio_connect_tcp) \
	X(nbd_aio_connect_unix) X(nbd_aio_connect_uri) X(nbd_aio_flush) \
	X(nbd_aio_get_direction) X(nbd_aio_get_fd) X(nbd_aio_is_closed) \
	X(nbd_aio_is_connecting) X(nbd_aio_is_dead) X(nbd_aio_is_ready) \
	X(nbd_aio_notify_read) X(nbd_aio_notify_write) X(nbd_aio_pread) \
	X(nbd_aio_pwrite) X(nbd_aio_trim) X(nbd_aio_zero) \
	X(nbd_can_fast_zero) X(nbd_can_flush) X(nbd_can_fua) \
	X(nbd_can_meta_context) X(nbd_can_multi_conn) X(nbd_can_trim) \
	X(nbd_can_zero) X(nbd_close) X(nbd_create) \
	X(nbd_get_block_size) X(nbd_get_errno) X(nbd_get_error) \
	X(nbd_get_size) X(nbd_is_read_only) X(nbd_poll) \
	X(nbd_set_export_name) X(nbd_shutdown)
/* clang-format on */

#define NBDC_LIB_PTR(f) __typeof__(f) *f;
struct nbdc_lib_fns {
	NBDC_LIB_FNS(NBDC_LIB_PTR)
};

/* Filled once by dynlib_load (nbdc_open), read-only afterwards (any thread). */
extern struct nbdc_lib_fns nbdc_nl;

#define NBDC_MAX_CONNS 16
#define NBDC_MAX_IO (32u << 20)         /* bytes per read/write command */
#define NBDC_MAX_ZERO (1u << 30)        /* bytes per trim/zero/block-status command */
#define NBDC_OPEN_TIMEOUT_MS 30000      /* connecting at open */
#define NBDC_RETRY_MIN_NS 50000000ull   /* first pause between reconnect attempts */
#define NBDC_RETRY_MAX_NS 1000000000ull /* longest pause */
#define NBDC_MAX_DELAY_S 86400

/* The node. Read-only after open except where said. */
struct nbdc_state {
	char *uri, *path, *host, *port, *export;
	char desc[256]; /* the server, for messages */
	uint64_t delay_ns;
	uint64_t open_ns; /* open-timeout: keep trying to connect at open for so long */
	unsigned nconns;  /* connections at most (1 unless multi-conn) */
	uint32_t max_io;
	bool can_flush, can_trim, can_zero, can_fast_zero, can_fua, can_status, can_multi;
	pthread_mutex_t lock;
	/* Protected by lock: the loop owning each connection slot (NULL: free),
	 * the handle open() connected (taken by the first connection), the
	 * round-robin counter of loops without a connection. */
	struct loop *slot_loop[NBDC_MAX_CONNS];
	struct nbd_handle *first;
	unsigned rr;
};

static inline struct nbdc_state *nbdc_state(struct blk_node *bs)
{
	return bs->opaque;
}

/* nbd-client-open.c */
struct nbd_handle *nbdc_handle_new(const struct nbdc_state *s);
int nbdc_start_connect(const struct nbdc_state *s, struct nbd_handle *h);
int nbdc_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen);
void nbdc_state_free(struct nbdc_state *s);

#endif
