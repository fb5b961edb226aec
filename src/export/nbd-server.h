/* NBD server: exports block nodes over the NBD protocol (fixed newstyle
 * handshake, structured replies, extended headers, base:allocation).
 *
 * Threading: a server is created, configured, drained and freed on the main
 * thread, whose loop accepts connections. Each connection then lives on one
 * loop (an iothread's) for its whole life; connections are spread over the
 * loops given in the configuration. Exports are added and removed by the
 * main thread at any time, also while clients connect and negotiate. */
#ifndef IOPLANE_NBD_SERVER_H
#define IOPLANE_NBD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct blk_node;
struct blk_dirty_bitmap;
struct loop;
struct nbd_budget;
struct nbd_export;
struct nbd_server;

/* The largest READ or WRITE payload accepted, and advertised as the maximum
 * in NBD_INFO_BLOCK_SIZE (more than the 32 MiB the spec lets every client
 * assume: its reference test client sends up to 48 MiB unasked). */
#define NBD_MAX_REQUEST (64u << 20)

struct nbd_server_config {
	struct loop *main_loop; /* accepts connections; the caller's thread runs it */
	struct loop **loops;    /* connections are spread over these (may be main_loop) */
	unsigned nloops;
	unsigned max_connections; /* 0: unlimited */
	/* Bound on request buffer bytes in flight, shared with other servers
	 * (NULL: none beyond the per-connection one). */
	struct nbd_budget *budget;
	/* TLS (nbd-tls.c): the ids of a tls-creds object with a server endpoint
	 * and of an authz object (NULL: none), looked up at each STARTTLS, so
	 * objects replaced under the same id serve new connections. With
	 * tls_creds set, clients must negotiate TLS before anything else. */
	const char *tls_creds, *tls_authz;
};

/* A daemon-wide bound of `limit` bytes on request buffers (READ data, WRITE
 * payloads) in flight over every connection of the servers given it: a
 * request that does not fit waits, its connection stops reading; one
 * request of any accepted size is admitted whenever nothing else is held.
 * Free it after the servers. */
int nbd_budget_new(uint64_t limit, struct nbd_budget **out);
void nbd_budget_free(struct nbd_budget *b);
/* Highest number of bytes held at once, and how often a request waited. */
void nbd_budget_stats(struct nbd_budget *b, uint64_t *peak, uint64_t *waits);

/* Zero detection on writes (detect-zeroes=): a write whose payload is all
 * zeroes becomes a write-zeroes, which may deallocate with UNMAP. */
enum nbd_detect_zeroes {
	NBD_DETECT_ZEROES_OFF = 0,
	NBD_DETECT_ZEROES_ON,
	NBD_DETECT_ZEROES_UNMAP,
};

struct nbd_export_config {
	const char *name;        /* as clients ask for it ("" allowed) */
	const char *description; /* NULL: none */
	struct blk_node *bs;
	bool writable; /* the node must not be read-only */
	enum nbd_detect_zeroes detect_zeroes;
	/* The loops its connections run on, round-robin (an export's iothread
	 * or iothreads); nloops 0: the server's. A connection accepted on
	 * another loop moves once the client has chosen the export. The loops
	 * must outlive the export (nbd_server_forget_loop when one goes). */
	struct loop *const *loops;
	unsigned nloops;
	/* Metadata contexts besides base:allocation: qemu:dirty-bitmap:NAME of
	 * each bitmap (of bs or a node below; busy while exported), and
	 * qemu:allocation-depth. */
	struct blk_dirty_bitmap *const *bitmaps;
	unsigned nbitmaps; /* at most NBD_MAX_EXPORT_BITMAPS */
	bool alloc_depth;
};

#define NBD_MAX_EXPORT_BITMAPS 6

int nbd_server_new(const struct nbd_server_config *cfg, struct nbd_server **out);
/* Add an export, before or while listening: clients negotiating afterwards
 * find it. -EEXIST (duplicate name), -EROFS (writable on a read-only node),
 * -EINVAL (name too long). err gets a human message. *out (if out is not
 * NULL) names the export for nbd_server_export_del(). */
int nbd_server_export_add(struct nbd_server *s, const struct nbd_export_config *e,
			  struct nbd_export **out, char *err, size_t errlen);
int nbd_server_add_export(struct nbd_server *s, const struct nbd_export_config *e, char *err,
			  size_t errlen);
/* A loop (an iothread that no export uses any more) is going away: forget
 * it. Main thread, or the loop's own thread while the main thread waits. */
void nbd_server_forget_loop(struct nbd_server *s, struct loop *loop);
/* The node was replaced (blk_replace_node, main thread, both nodes
 * drained): requests go to bs from now on. Same size; the connections'
 * negotiated properties stay. */
void nbd_export_set_node(struct nbd_export *e, struct blk_node *bs);
/* Connections that use the export or negotiate with it now. */
unsigned nbd_export_users(const struct nbd_export *e);
/* Remove it: no client finds it any more; those using it are disconnected,
 * their requests in flight finishing first (replies dropped). done(opaque)
 * runs on the main loop, in a later round, once nothing refers to it: the
 * export is then freed. Every other export goes on undisturbed. */
void nbd_server_export_del(struct nbd_server *s, struct nbd_export *e, void (*done)(void *opaque),
			   void *opaque);
/* Listen on a unix socket created with permissions `mode` (unix-listener.h's
 * rules: a live socket at PATH is refused, a stale one replaced), or on every
 * address HOST:PORT resolves to. */
int nbd_server_listen_unix(struct nbd_server *s, const char *path, mode_t mode, char *err,
			   size_t errlen);
int nbd_server_listen_tcp(struct nbd_server *s, const char *host, const char *port, char *err,
			  size_t errlen);
/* Accept on fd, a listening socket the parent passed in (ownership passes
 * on success). */
int nbd_server_listen_fd(struct nbd_server *s, int fd);
/* Serve an already connected socket (takes ownership of fd) on `loop`, which
 * must be the calling thread's loop. Used by tests and the fuzz target. */
int nbd_server_attach_fd(struct nbd_server *s, struct loop *loop, int fd);

/* Stop accepting: close the listening sockets and remove the unix socket
 * files they created (if still theirs). */
void nbd_server_stop_listening(struct nbd_server *s);
/* Every connection stops reading, finishes its in-flight requests, sends
 * their replies and closes; connections still in the handshake close at
 * once. done(opaque) then runs on the main loop, in a later round. */
void nbd_server_drain(struct nbd_server *s, void (*done)(void *opaque), void *opaque);
/* Drop every connection now (their in-flight requests still complete; their
 * replies are discarded). Use after a drain took too long. */
void nbd_server_abort(struct nbd_server *s);
unsigned nbd_server_connections(const struct nbd_server *s);
/* TLS connections open now whose record layer is GnuTLS's, and the kernel's
 * (kTLS). Any thread. */
void nbd_server_tls_counts(const struct nbd_server *s, unsigned *gnutls, unsigned *kernel);
/* Its tls-creds and tls-authz ids (NULL: none). */
void nbd_server_tls_ids(const struct nbd_server *s, const char **creds, const char **authz);
/* Main thread, no connection left and no message of ours pending in a loop:
 * after the drain callback ran, or once the loops are gone. */
void nbd_server_free(struct nbd_server *s);

/* Fuzz entry point: feeds `data` as one client's byte stream through the
 * handshake and transmission phases of a connection over a socketpair
 * (exports "null", read-only, and "rw", writable). Never crashes, leaks or
 * hangs on any input; returns 0. */
int nbd_fuzz_one(const uint8_t *data, size_t len);
/* The same against a server in TLS-only mode (FORCEDTLS) whose credentials
 * are missing: the option rules before TLS and a STARTTLS refused. */
int nbd_fuzz_tls_one(const uint8_t *data, size_t len);

#endif
