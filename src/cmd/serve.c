/* `ioplane serve`: the daemon. Opens images (--image), starts iothreads,
 * serves exports over NBD (--nbd) and QMP monitors (--monitor, in
 * serve-monitor.c), and on SIGTERM/SIGINT (or QMP quit) stops accepting,
 * lets in-flight requests finish, flushes and closes the images, exits 0.
 * Signals and shutdown are in serve-signals.c.
 *
 * Threading: the main thread parses, opens images, runs the main loop
 * (accept, signals, shutdown) and tears down; connections live on the
 * iothreads. The handled signals are blocked in every thread and read from
 * a signalfd on the main loop. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "block/block.h"
#include "block/graph.h"
#include "block/job.h"
#include "block/throttle-group.h"
#include "cmd/cmd.h"
#include "cmd/pidfile.h"
#include "cmd/serve-int.h"
#include "cmd/serve-metrics.h"
#include "cmd/serve-monitor.h"
#include "cmd/serve-qsd.h"
#include "control/qmp-block.h"
#include "cmd/serve-vhost.h"
#include "export/nbd-server.h"
#include "control/qmp-export.h"
#include "control/qmp-object.h"
#include "loop/loop.h"
#include "util/log.h"
#include "util/opts.h"

#define EXIT_USAGE 1 /* a bad command line, as in qemu-storage-daemon */
#define MAX_IOTHREADS 64
/* Clients per listening address: enough for many VMs with multi-conn (each
 * connection costs ~300 KiB besides its requests), few enough that a
 * connection flood cannot exhaust memory or the default 1024 descriptors.
 * qemu-nbd serves 1 by default and nbdkit's limit filter 1; qsd has none. */
#define DEFAULT_MAX_CONNS 256
/* NBD request buffers in flight, all connections together. */
#define DEFAULT_REQUEST_MEMORY (256ull << 20)

static void serve_usage(FILE *f)
{
	fprintf(f,
		"Usage: ioplane serve [--iothreads N] [--pidfile FILE] [--daemonize] [--max-connections N]\n"
		"         [--max-request-memory SIZE] [--log-file FILE] [--run-with user=NAME]\n"
		"         --image ID,file=PATH[,format=raw|qcow2][,cache=none|writeback]\n"
		"               [,aio=io_uring|native|threads][,read-only=on]\n"
		"               [,discard=unmap|ignore][,detect-zeroes=off|on|unmap]\n"
		"               [,locking=on|off|auto][,force-share=on]\n"
		"         --image ID,file=PATH,format=qcow2[,backing=PATH|,backing=]\n"
		"               [,backing-format=raw|qcow2][,data-file=PATH][,l2-cache-size=SIZE]\n"
		"         --image ID,driver=null,size=SIZE[,latency-ns=NS][,read-zeroes=on]\n"
		"         --image ID,driver=nbd|rbd,... (or file=nbd://..., file=rbd:...)\n"
		"         --nbd unix=PATH|tcp=HOST:PORT,image=ID[,name=NAME][,writable=on]\n"
		"               [,description=TEXT][,mode=OCTAL][,user=U][,group=G][,id=ID]\n"
		"         --vhost-user-blk unix=PATH,image=ID[,num-queues=N][,writable=on]\n"
		"               [,logical-block-size=512|4096][,serial=TEXT][,mode=OCTAL]\n"
		"               [,user=U][,group=G][,id=ID]\n"
		"         --monitor unix=PATH[,mode=OCTAL][,user=U][,group=G][,pretty=on]\n"
		"         --metrics unix=PATH[,mode=OCTAL][,user=U][,group=G]|tcp=127.0.0.1:PORT[,public=on]\n"
		"         --chardev socket,id=ID,path=PATH,server=on[,wait=off] --monitor [chardev=]ID\n"
		"         --object iothread,id=ID[,poll-max-ns=NS]   --nbd-server addr.type=unix,addr.path=P\n"
		"         --object secret,id=ID,data=TEXT|file=PATH[,format=raw|base64]\n"
		"         --blockdev driver=DRIVER,node-name=NODE[,...]\n"
		"         --export type=nbd|vhost-user-blk,id=ID,node-name=NODE[,...]\n"
		"\n"
		"Serves disk images over NBD and vhost-user-blk until SIGTERM, SIGINT or QMP\n"
		"quit, then finishes the requests in flight, flushes, closes the images and\n"
		"exits 0. SIGHUP reopens the --log-file, SIGUSR1 logs the statistics; SIGUSR2,\n"
		"SIGALRM and SIGPIPE are logged or ignored; none of them stops the daemon.\n"
		"Under systemd: READY=1 once every socket listens, STOPPING=1 at shutdown\n"
		"($NOTIFY_SOCKET); sockets passed in ($LISTEN_FDS) are taken by the server whose\n"
		"id (FileDescriptorName=) or unix socket path they have.\n"
		"\n"
		"  --image SPEC           open an image (several allowed); ID names it. Without\n"
		"                         format= the file is probed: raw is served (writes that\n"
		"                         would make it look like another format are refused),\n"
		"                         any other format must be given. Images are locked as\n"
		"                         QEMU locks them (locking=off: not at all). qcow2\n"
		"                         opens the backing chain and the external data file\n"
		"                         the image names, with the same cache=, aio= and\n"
		"                         locking; backing formats come from the header, never\n"
		"                         probed; backing=, backing-format= and data-file= name\n"
		"                         them instead (backing= empty: no backing file)\n"
		"  --nbd SPEC             export an image over NBD (several allowed; exports\n"
		"                         with the same address share one socket). The export\n"
		"                         name defaults to the image ID; exports are read-only\n"
		"                         unless writable=on; unix sockets are created with\n"
		"                         mode 0600 unless mode= says otherwise, owned by the\n"
		"                         daemon's user unless user=/group= (names or numbers)\n"
		"  --vhost-user-blk SPEC  export an image to a VM (QEMU vhost-user-blk-pci,\n"
		"                         cloud-hypervisor) on a unix socket, one front-end at a\n"
		"                         time; num-queues defaults to the CPU count; read-only\n"
		"                         unless writable=on (several allowed)\n"
		"  --monitor SPEC         a QMP monitor (qemu-storage-daemon's commands) on a unix\n"
		"                         socket, mode 0600 unless mode= says otherwise; several\n"
		"                         clients at once; fd=N serves a socket passed in instead\n"
		"  --metrics SPEC         serve Prometheus metrics (HTTP GET /metrics) on a unix\n"
		"                         socket (mode 0600 unless mode=) or a loopback TCP\n"
		"                         address (public=on: any address)\n"
		"  --chardev SPEC         qemu-storage-daemon's form: a socket (path= or fd=) that\n"
		"                         --monitor chardev=ID serves\n"
		"  --object SPEC          qemu-storage-daemon's (object-add's arguments): a named\n"
		"                         iothread that exports name with iothread=ID; a secret\n"
		"                         that rbd's key-secret=ID names; tls-creds-x509 or\n"
		"                         tls-creds-psk (dir=, endpoint=server) and authz-simple\n"
		"                         or authz-list for --nbd-server; a\n"
		"                         throttle-group,id=ID,limits.iops-total=N,...\n"
		"  --blockdev SPEC        qemu-storage-daemon's: a block node (blockdev-add's\n"
		"                         arguments: file, raw, qcow2, null-co, throttle, rbd, nbd;\n"
		"                         keyval or JSON)\n"
		"  --nbd-server SPEC      qemu-storage-daemon's NBD server (nbd-server-start's\n"
		"                         arguments: addr.type=unix|inet|fd, max-connections=N,\n"
		"                         tls-creds=ID, tls-authz=ID)\n"
		"  --export SPEC          qemu-storage-daemon's block-export-add: type=nbd or\n"
		"                         vhost-user-blk, node-name= a --blockdev node or an\n"
		"                         --image ID; keyval or JSON\n"
		"  --iothreads N          threads serving connections (default: CPU count), named\n"
		"                         iothread0 ..\n"
		"  --poll-max-ns NS       iothreads busy-poll up to NS before sleeping (adaptive;\n"
		"                         default 32768, 0 turns polling off)\n"
		"  --max-connections N    NBD connections per listening address (default 256;\n"
		"                         0: no limit); clients beyond it are disconnected\n"
		"  --max-request-memory SIZE  NBD request buffers in flight over all\n"
		"                         connections (default 256M); a request that does not\n"
		"                         fit waits (its connection stops reading), none fails;\n"
		"                         one request of up to 64M gets through when nothing\n"
		"                         else is held\n"
		"  --pidfile FILE         write the process ID there once listening; the file\n"
		"                         is locked for the daemon's life (a second instance\n"
		"                         on it is refused) and removed at exit; it must be a\n"
		"                         regular file (a FIFO or device there is refused)\n"
		"  --log-file FILE        log there (appending) instead of stderr; SIGHUP reopens it\n"
		"  --run-with user=NAME   once every socket listens, switch to NAME's user and\n"
		"                         groups (root only; images are open already)\n"
		"  --daemonize            run in the background: the command returns (exit 0)\n"
		"                         once every export listens, or exits 1 with the\n"
		"                         error if start-up fails; logs then go to /dev/null\n"
		"                         (or the --log-file)\n"
		"  -v, --verbose          log debug messages    -q, --quiet   log errors only\n"
		"  -h, --help             show this help\n"
		"\n"
		"Examples:\n"
		"  ioplane serve --image disk,file=disk.img --nbd unix=/tmp/nbd.sock,image=disk\n"
		"      qemu-img info 'nbd+unix:///disk?socket=/tmp/nbd.sock'\n"
		"  ioplane serve --image d,file=d.img,cache=none,aio=io_uring \\\n"
		"      --nbd tcp=127.0.0.1:10809,image=d,writable=on\n"
		"      nbdinfo nbd://127.0.0.1:10809/d\n"
		"  ioplane serve --image vm,file=vm.qcow2,format=qcow2 \\\n"
		"      --vhost-user-blk unix=/tmp/vm.sock,image=vm,writable=on\n"
		"  ioplane serve --image n,driver=null,size=1G,read-zeroes=on \\\n"
		"      --nbd unix=/tmp/null.sock,image=n,writable=on\n");
}

/* ---- command line ------------------------------------------------------- */

static int usage_error(const char *fmt, const char *arg)
{
	fprintf(stderr, "ioplane serve: ");
	fprintf(stderr, fmt, arg);
	fprintf(stderr, " (try 'ioplane serve --help')\n");
	return EXIT_USAGE;
}

static int parse_count(const char *s, unsigned max, unsigned *out)
{
	uint64_t v;

	if (parse_u64(s, &v) < 0 || v > max)
		return -EINVAL;
	*out = (unsigned)v;
	return 0;
}

static const struct option serve_long_opts[] = {
	{"iothreads", required_argument, NULL, 't'},
	{"pidfile", required_argument, NULL, 'p'},
	{"max-connections", required_argument, NULL, 'm'},
	{"max-request-memory", required_argument, NULL, 'M'},
	{"poll-max-ns", required_argument, NULL, 'P'},
	{"image", required_argument, NULL, 'i'},
	{"nbd", required_argument, NULL, 'n'},
	{"vhost-user-blk", required_argument, NULL, 'u'},
	{"monitor", required_argument, NULL, 'Q'},
	{"chardev", required_argument, NULL, 'C'},
	{"metrics", required_argument, NULL, 'X'},
	{"log-file", required_argument, NULL, 'L'},
	{"run-with", required_argument, NULL, 'R'},
	{"object", required_argument, NULL, 'O'},
	{"export", required_argument, NULL, 'E'},
	{"nbd-server", required_argument, NULL, 'N'},
	{"blockdev", required_argument, NULL, 'B'},
	{"daemonize", no_argument, NULL, 'D'},
	{"verbose", no_argument, NULL, 'v'},
	{"quiet", no_argument, NULL, 'q'},
	{"help", no_argument, NULL, 'h'},
	{NULL, 0, NULL, 0},
};

/* Returns -1 to go on, else an exit status. */
static int serve_opt(struct serve *sv, int c, const char *arg)
{
	switch (c) {
	case 't':
		if (parse_count(arg, MAX_IOTHREADS, &sv->niothreads) < 0 || !sv->niothreads)
			return usage_error("--iothreads: expected 1..64, not '%s'", arg);
		return -1;
	case 'm':
		if (parse_count(arg, 1u << 20, &sv->max_conns) < 0)
			return usage_error("--max-connections: expected a number, not '%s'", arg);
		return -1;
	case 'M':
		if (parse_size(arg, &sv->request_memory) < 0 || sv->request_memory < (1u << 20))
			return usage_error("--max-request-memory: expected a size of 1M or more, "
					   "not '%s'", arg);
		return -1;
	case 'P': {
		uint64_t v;

		if (parse_u64(arg, &v) < 0 || v > 1000000000)
			return usage_error("--poll-max-ns: expected 0..1000000000 ns, not '%s'", arg);
		sv->poll_max_ns = (int64_t)v;
		return -1;
	}
	case 'p':
		sv->pidfile = arg;
		return -1;
	case 'D':
		sv->daemonize = true;
		return -1;
	case 'i':
		sv->image_args[sv->nimages++] = (char *)arg;
		return -1;
	case 'n':
		sv->nbd_args[sv->nnbd++] = (char *)arg;
		return -1;
	case 'u':
		sv->vhost_args[sv->nvhost++] = (char *)arg;
		return -1;
	case 'Q':
	case 'C':
		return serve_monitor_opt(&sv->monitors, c == 'C', arg);
	case 'X':
		return serve_metrics_parse(&sv->metrics, arg) ? EXIT_USAGE : -1;
	case 'L':
		sv->log_file = arg;
		return -1;
	case 'R':
		if (strncmp(arg, "user=", 5) || !arg[5] || strchr(arg, ','))
			return usage_error("--run-with: expected user=NAME, not '%s'", arg);
		sv->run_with_user = arg + 5;
		return -1;
	case 'O':
	case 'E':
	case 'N':
	case 'B':
		return serve_qsd_opt(&sv->qsd, c == 'O' ? "object" : c == 'E' ? "export" :
					       c == 'N' ? "nbd-server" : "blockdev", arg);
	case 'v':
		log_set_level(LOG_DEBUG);
		return -1;
	case 'q':
		log_set_level(LOG_ERR);
		return -1;
	case 'h':
		serve_usage(stdout);
		return 0;
	case ':':
		return usage_error("option '%s' needs an argument", arg);
	default:
		return usage_error("unknown option '%s'", arg);
	}
}

static int serve_parse(struct serve *sv, int argc, char **argv)
{
	int c, ret;

	sv->image_args = calloc((size_t)argc, sizeof(char *));
	sv->nbd_args = calloc((size_t)argc, sizeof(char *));
	sv->vhost_args = calloc((size_t)argc, sizeof(char *));
	if (!sv->image_args || !sv->nbd_args || !sv->vhost_args)
		return 1;
	opterr = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, ":hvq", serve_long_opts, NULL)) != -1) {
		ret = serve_opt(sv, c, argv[optind - 1]);
		if (ret >= 0)
			return ret;
	}
	if (optind < argc)
		return usage_error("unexpected argument '%s'", argv[optind]);
	if (!sv->nnbd && !sv->nvhost && !serve_monitor_count(sv->monitors) &&
	    !serve_qsd_count(sv->qsd))
		return usage_error("%s", "nothing to serve: give at least one --nbd, --vhost-user-blk, "
					 "--export, --nbd-server or --monitor");
	if (!sv->niothreads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		sv->niothreads = n < 1 ? 1 : n > MAX_IOTHREADS ? MAX_IOTHREADS : (unsigned)n;
	}
	return -1;
}

/* ---- images ------------------------------------------------------------- */

static struct serve_image *find_image(struct serve *sv, const char *id)
{
	unsigned i;

	for (i = 0; i < sv->nimages; i++)
		if (sv->images[i].id && !strcmp(sv->images[i].id, id))
			return &sv->images[i];
	return NULL;
}

/* file= without format=: probed as qemu-img does, but only raw is taken on
 * a guess (and opened x-probed=on, so that writes cannot make it look like
 * another format). Any other signature needs format=: opening a guessed
 * qcow2 would follow backing file names that whoever wrote the image chose.
 * Returns an exit status or -1. */
static int image_probe(struct kv_opts *o, struct serve_image *img, const char *file)
{
	const char *fmt;
	char err[512];
	int ret = blk_probe_file(file, &fmt, err, sizeof(err));

	if (ret) {
		fprintf(stderr, "ioplane serve: --image %s: %s\n", img->id, err);
		return ret == -EINVAL ? EXIT_USAGE : 1;
	}
	if (!strcmp(fmt, "qcow2")) {
		fprintf(stderr, "ioplane serve: --image %s: '%s' is a qcow2 image; formats other "
			"than raw are never guessed: give format=qcow2 (or format=raw to serve "
			"its bytes as they are)\n", img->id, file);
		return EXIT_USAGE;
	}
	if (strcmp(fmt, "raw")) {
		fprintf(stderr, "ioplane serve: --image %s: '%s' is a %s image, a format ioplane "
			"does not open (qemu-img convert -O qcow2 can convert it; format=raw "
			"serves its bytes as they are)\n", img->id, file, fmt);
		return EXIT_USAGE;
	}
	return kv_set(o, "format", "raw") || kv_set(o, "x-probed", "on") ? 1 : -1;
}

/* --image's shorthands onto blk_open's keys; returns an exit status or -1. */
static int image_map_opts(struct kv_opts *o, struct serve_image *img)
{
	const char *file = kv_get(o, "file"), *dz = kv_get(o, "detect-zeroes");
	int ret;

	if (file && kv_get(o, "driver"))
		return usage_error("--image %s: give file= or driver=, not both", img->id);
	if (file && blk_target_remote(file) && blk_target_opts(o, file))
		return 1;
	if (file && !blk_target_remote(file) &&
	    (kv_set(o, "driver", "file") || kv_set(o, "filename", file)))
		return 1;
	if (file && !kv_get(o, "format") && (ret = image_probe(o, img, file)) >= 0)
		return ret;
	if (!file && !kv_get(o, "driver"))
		return usage_error("--image %s: needs file=PATH or driver=null", img->id);
	kv_get(o, "driver"); /* kv_set leaves new keys unmarked; blk_open reads them */
	if (!dz || !strcmp(dz, "off"))
		img->dz = NBD_DETECT_ZEROES_OFF;
	else if (!strcmp(dz, "on"))
		img->dz = NBD_DETECT_ZEROES_ON;
	else if (!strcmp(dz, "unmap"))
		img->dz = NBD_DETECT_ZEROES_UNMAP;
	else
		return usage_error("--image: detect-zeroes must be off, on or unmap, not '%s'", dz);
	return -1;
}

static int open_image(struct serve *sv, const char *arg, struct serve_image *img)
{
	struct kv_opts o = {0};
	const char *id;
	int ret;

	if (kv_parse(&o, arg, "id") < 0 || !(id = kv_get(&o, "id")) || !*id) {
		kv_free(&o);
		return usage_error("--image '%s': expected ID,KEY=VALUE,...", arg);
	}
	if (find_image(sv, id)) {
		ret = usage_error("--image: ID '%s' used twice", id);
		kv_free(&o);
		return ret;
	}
	img->id = strdup(id);
	ret = img->id ? image_map_opts(&o, img) : 1;
	if (ret < 0) {
		ret = blk_open(&o, &img->bs, sv->err, sizeof(sv->err));
		if (ret < 0)
			fprintf(stderr, "ioplane serve: --image %s: %s\n", img->id, sv->err);
		else if (kv_get(&o, "x-probed"))
			blk_probe_warn(img->bs, kv_get(&o, "filename"));
		/* The ID is the node-name when it is one (QMP finds it by that). */
		if (ret == 0 && blk_node_name_check(img->id, sv->err, sizeof(sv->err)) == 0)
			blk_node_set_name(img->bs, img->id, sv->err, sizeof(sv->err));
		ret = ret == -EINVAL ? EXIT_USAGE : ret < 0 ? 1 : -1;
	}
	kv_free(&o);
	return ret;
}

static int open_images(struct serve *sv)
{
	unsigned i;
	int ret;

	sv->images = calloc(sv->nimages + 1, sizeof(*sv->images));
	if (!sv->images)
		return 1;
	for (i = 0; i < sv->nimages; i++) {
		ret = open_image(sv, sv->image_args[i], &sv->images[i]);
		if (ret >= 0)
			return ret;
	}
	return -1;
}

static void close_images(struct serve *sv, int *status)
{
	unsigned i;

	for (i = 0; sv->images && i < sv->nimages; i++) {
		struct serve_image *img = &sv->images[i];

		/* Every writable node of the graph: a qcow2 node's data file too. */
		if (img->bs && blk_flush_tree_sync(img->bs) < 0) {
			log_err("image %s: flush failed", img->id);
			*status = 1;
		}
		if (img->bs)
			blk_close(img->bs);
		free(img->id);
	}
	free(sv->images);
}

/* ---- image locks -------------------------------------------------------- */

/* Add what the exports in args of image id need, as qemu-storage-daemon's
 * take it: consistent read, and write when writable; an NBD export does not
 * share resize, a vhost-user-blk export shares everything. The exports'
 * own parsers report bad arguments later. */
static void export_perms(char **args, unsigned n, const char *id, bool nbd, uint32_t *perm,
			 uint32_t *shared)
{
	for (unsigned i = 0; i < n; i++) {
		struct kv_opts o = {0};
		const char *img;
		bool w = false;

		img = kv_parse(&o, args[i], NULL) ? NULL : kv_get(&o, "image");
		if (img && !strcmp(img, id)) {
			kv_get_bool(&o, "writable", &w);
			*perm |= BLK_PERM_CONSISTENT_READ | (w ? BLK_PERM_WRITE : 0);
			if (nbd)
				*shared &= ~BLK_PERM_RESIZE;
		}
		kv_free(&o);
	}
}

/* Before any export listens: refuse images other processes hold. */
static int lock_images(struct serve *sv)
{
	for (unsigned i = 0; i < sv->nimages; i++) {
		struct serve_image *img = &sv->images[i];
		uint32_t perm = 0, shared = BLK_PERM_ALL;

		export_perms(sv->nbd_args, sv->nnbd, img->id, true, &perm, &shared);
		export_perms(sv->vhost_args, sv->nvhost, img->id, false, &perm, &shared);
		if (img->bs->read_only)
			perm &= ~BLK_PERM_WRITE; /* the export refuses writable=on itself */
		if (blk_set_perm(img->bs, perm, shared, sv->err, sizeof(sv->err)) < 0) {
			fprintf(stderr, "ioplane serve: --image %s: %s\n", img->id, sv->err);
			return 1;
		}
	}
	return -1;
}

/* ---- --nbd -------------------------------------------------------------- */

/* "HOST:PORT" or "[V6ADDR]:PORT" (HOST may be empty: every address); the
 * port is a number 1..65535. */
static int split_host_port(const char *t, char *host, size_t hostlen, const char **port)
{
	const char *colon = strrchr(t, ':');
	uint64_t p;

	if (!colon || parse_u64(colon + 1, &p) < 0 || p < 1 || p > 65535 ||
	    strspn(colon + 1, "0123456789") != strlen(colon + 1))
		return -EINVAL;
	if (t[0] == '[' && colon > t + 1 && colon[-1] == ']')
		snprintf(host, hostlen, "%.*s", (int)(colon - t - 2), t + 1);
	else
		snprintf(host, hostlen, "%.*s", (int)(colon - t), t);
	*port = colon + 1;
	return 0;
}

static int nbd_parse_addr(struct serve_nbd *n, const char *arg)
{
	const char *u = kv_get(&n->o, "unix"), *t = kv_get(&n->o, "tcp"), *port;
	char host[256];
	size_t len;

	if (!u == !t)
		return usage_error("--nbd '%s': give exactly one of unix=PATH, tcp=HOST:PORT", arg);
	if (t && split_host_port(t, host, sizeof(host), &port) < 0)
		return usage_error("--nbd: tcp=%s: expected HOST:PORT with a port 1..65535", t);
	if ((u && !*u))
		return usage_error("--nbd '%s': empty unix socket path", arg);
	len = strlen(u ? u : t) + 6;
	n->addr = malloc(len);
	if (!n->addr)
		return 1;
	snprintf(n->addr, len, "%s:%s", u ? "unix" : "tcp", u ? u : t);
	return -1;
}

static int nbd_parse(struct serve *sv, const char *arg, struct serve_nbd *n)
{
	const char *id, *unused;
	bool b;
	mode_t mode;

	if (kv_parse(&n->o, arg, NULL) < 0)
		return usage_error("--nbd '%s': expected KEY=VALUE,...", arg);
	if (nbd_parse_addr(n, arg) >= 0)
		return EXIT_USAGE;
	id = kv_get(&n->o, "image");
	if (!id)
		return usage_error("--nbd '%s': image=ID is required", arg);
	n->img = find_image(sv, id);
	if (!n->img)
		return usage_error("--nbd: no --image with ID '%s'", id);
	kv_get(&n->o, "name");
	kv_get(&n->o, "description");
	kv_get(&n->o, "id");
	if (kv_get_bool(&n->o, "writable", &b) < 0)
		return usage_error("--nbd '%s': writable must be on or off", arg);
	if (kv_get(&n->o, "mode") && parse_octal_mode(kv_get(&n->o, "mode"), &mode) < 0)
		return usage_error("--nbd '%s': mode must be octal permissions like 0660", arg);
	if (svc_owner_parse(&n->o, &n->owner, sv->err, sizeof(sv->err)) < 0)
		return usage_error("--nbd: %s", sv->err);
	unused = kv_first_unused(&n->o);
	if (unused)
		return usage_error("--nbd: unknown option '%s'", unused);
	return -1;
}

/* Through block-export-add's own function, on this address's server. */
static int add_export(struct serve *sv, struct serve_nbd *n, unsigned idx)
{
	struct qmp_export_extra x = {.nbd = n->srv};
	const char *name = kv_get(&n->o, "name"), *desc = kv_get(&n->o, "description");
	bool w = false;
	char id[128];
	json_t *args;
	int ret;

	name = name ? name : n->img->id;
	kv_get_bool(&n->o, "writable", &w);
	(void)idx;
	if (kv_get(&n->o, "id"))
		snprintf(id, sizeof(id), "%s", kv_get(&n->o, "id"));
	else
		qmp_export_make_id(name, "nbd", id, sizeof(id));
	args = json_pack("{s:s,s:s,s:s,s:s,s:b}", "type", "nbd", "id", id, "node-name",
			 n->img->id, "name", name, "writable", w);
	if (args && desc)
		json_object_set_new(args, "description", json_string(desc));
	ret = args ? qmp_export_add(args, &x, sv->err, sizeof(sv->err)) : -ENOMEM;
	json_decref(args);
	if (ret < 0) {
		fprintf(stderr, "ioplane serve: --nbd: %s\n", sv->err);
		return EXIT_USAGE;
	}
	return -1;
}

/* The name a service manager's passed socket must have to be this
 * address's: the first export's id= (default: its export name). */
static const char *nbd_socket_name(struct serve_nbd *n)
{
	const char *id = kv_get(&n->o, "id"), *name = kv_get(&n->o, "name");

	return id ? id : name ? name : n->img->id;
}

static int server_listen(struct serve *sv, struct serve_nbd *n)
{
	const char *u = kv_get(&n->o, "unix"), *t = kv_get(&n->o, "tcp"), *port;
	int ret, fd = svc_listen_take(nbd_socket_name(n), u);
	mode_t mode = 0600;
	char host[256];

	if (fd >= 0) {
		ret = nbd_server_listen_fd(n->srv, fd);
		if (ret < 0) {
			close(fd);
			snprintf(sv->err, sizeof(sv->err), "%s: passed socket: %s", n->addr,
				 strerror(-ret));
		}
	} else if (u) {
		if (kv_get(&n->o, "mode"))
			parse_octal_mode(kv_get(&n->o, "mode"), &mode); /* checked by nbd_parse */
		ret = nbd_server_listen_unix(n->srv, u, mode, sv->err, sizeof(sv->err));
		if (ret == 0)
			ret = svc_owner_apply(u, &n->owner, sv->err, sizeof(sv->err));
	} else {
		split_host_port(t, host, sizeof(host), &port); /* checked by nbd_parse_addr */
		ret = nbd_server_listen_tcp(n->srv, host, port, sv->err, sizeof(sv->err));
	}
	if (ret < 0)
		log_err("%s", sv->err);
	else
		log_info("listening on %s%s", n->addr, fd >= 0 ? " (passed in)" : "");
	return ret < 0 ? 1 : -1;
}

/* The first --nbd at an address creates its server; later ones share it. */
static struct serve_nbd *first_at_addr(struct serve *sv, struct serve_nbd *n)
{
	struct serve_nbd *p;

	for (p = sv->nbds; p < n; p++)
		if (!strcmp(p->addr, n->addr))
			return p;
	return n;
}

static int nbd_server_for(struct serve *sv, struct serve_nbd *n)
{
	struct nbd_server_config cfg = {.main_loop = sv->main_loop, .loops = sv->loops,
					.nloops = sv->nthreads, .max_connections = sv->max_conns,
					.budget = sv->budget};
	struct serve_nbd *first = first_at_addr(sv, n);

	if (first != n) {
		n->srv = first->srv;
		return -1;
	}
	if (nbd_server_new(&cfg, &n->srv) < 0)
		return 1;
	sv->servers[sv->nservers++] = n->srv;
	return -1;
}

static int setup_nbd(struct serve *sv)
{
	unsigned i;
	int ret;

	sv->nbds = calloc(sv->nnbd, sizeof(*sv->nbds));
	sv->servers = calloc(sv->nnbd, sizeof(*sv->servers));
	if (!sv->nbds || !sv->servers)
		return 1;
	for (i = 0; i < sv->nnbd; i++) {
		ret = nbd_parse(sv, sv->nbd_args[i], &sv->nbds[i]);
		if (ret >= 0)
			return ret;
	}
	for (i = 0; i < sv->nnbd; i++) {
		ret = nbd_server_for(sv, &sv->nbds[i]);
		if (ret >= 0 || (ret = add_export(sv, &sv->nbds[i], i)) >= 0)
			return ret;
	}
	/* Listen only when every export is known: a client may come at once. */
	for (i = 0; i < sv->nnbd; i++) {
		if (first_at_addr(sv, &sv->nbds[i]) != &sv->nbds[i])
			continue;
		ret = server_listen(sv, &sv->nbds[i]);
		if (ret >= 0)
			return ret;
	}
	return -1;
}

static void free_nbd(struct serve *sv)
{
	unsigned i;

	for (i = 0; i < sv->nservers; i++)
		nbd_server_free(sv->servers[i]);
	for (i = 0; sv->nbds && i < sv->nnbd; i++) {
		kv_free(&sv->nbds[i].o);
		free(sv->nbds[i].addr);
	}
	free(sv->nbds);
	free(sv->servers);
	nbd_budget_free(sv->budget);
}

/* ---- iothreads ---------------------------------------------------------- */

/* On each iothread before it goes: drivers drop their per-thread state, in
 * every node of each image's graph (backing and data-file nodes too). */
static void detach_images(void *arg)
{
	(void)arg;
	blk_graph_detach_loop(loop_current()); /* every node: --image's and blockdev-add's */
	qmp_exports_forget_loop(loop_current());
}

static int start_iothreads(struct serve *sv)
{
	int ret;

	/* Before any export takes a use of one of them. */
	qmp_objects_set_detach(detach_images, sv);
	ret = qmp_iothread_pool(sv->niothreads, sv->poll_max_ns, &sv->loops, sv->err,
				sizeof(sv->err));
	if (ret < 0) {
		log_err("cannot start the iothreads: %s", *sv->err ? sv->err : strerror(-ret));
		return 1;
	}
	sv->nthreads = sv->niothreads;
	return -1;
}

static void stop_iothreads(struct serve *sv)
{
	(void)sv;
	qmp_objects_free();
}

/* ---- main --------------------------------------------------------------- */

static void serve_teardown(struct serve *sv, int *status)
{
	sv->tearing_down = true;
	serve_monitor_free(sv->monitors);
	sv->monitors = NULL;
	serve_metrics_free(sv->metrics);
	sv->metrics = NULL;
	/* Jobs end (cancelled) while their iothreads still run. */
	job_cancel_all_sync();
	job_shutdown();
	/* Iothreads first: every message they were sent has run once joined. */
	stop_iothreads(sv);
	qmp_exports_free(); /* before the --nbd servers: it refers to their exports */
	free_nbd(sv);
	serve_qsd_free(sv->qsd);
	sv->qsd = NULL;
	close_images(sv, status);
	qmp_block_close_all(); /* the nodes of blockdev-add */
	throttle_group_free_all(); /* no throttle node is left */
	serve_close_signals(sv);
	pidfile_release(&sv->pf);
	loop_free(sv->main_loop);
}

static struct blk_node *vhost_find_image(void *ctx, const char *id)
{
	struct serve_image *img = find_image(ctx, id);

	return img ? img->bs : NULL;
}

/* Exports name nodes: an --image ID (its detect-zeroes with it), or any
 * node-name of the graph. */
static struct blk_node *export_find_node(void *ctx, const char *name, enum nbd_detect_zeroes *dz)
{
	struct serve_image *img = find_image(ctx, name);

	if (img)
		*dz = img->dz;
	return img ? img->bs : blk_graph_find(name);
}

/* What QMP and the qsd options build exports and objects on. */
static int setup_control(struct serve *sv)
{
	struct qmp_export_env env = {.main_loop = sv->main_loop, .loops = sv->loops,
				     .nloops = sv->nthreads, .nbd_max_connections = sv->max_conns,
				     .find_node = export_find_node, .ctx = sv};
	int ret;

	if (nbd_budget_new(sv->request_memory, &sv->budget) < 0)
		return 1;
	env.budget = sv->budget;
	job_set_loops(sv->main_loop, sv->loops, sv->nthreads);
	ret = qmp_export_init(&env);
	if (ret == 0)
		ret = qmp_object_register();
	if (ret < 0) {
		log_err("cannot register the QMP commands: %s", strerror(-ret));
		return 1;
	}
	return serve_qsd_start(sv->qsd);
}

/* --image, --object and --blockdev. The opens run on the control loop, as
 * blockdev-add's do: the main loop never submits to a node itself, so a
 * later drain from a QMP handler (which blocks the main loop) never waits
 * for it. */
static int open_nodes(struct serve *sv)
{
	struct loop *prev;
	int status;

	if (blk_ctl_enter(&prev) < 0)
		return 1;
	status = open_images(sv);
	if (status < 0)
		status = lock_images(sv);
	if (status < 0)
		status = serve_qsd_objects(sv->qsd);
	blk_ctl_leave(prev);
	return status;
}

/* Every socket listens: the pidfile, the privilege drop, then tell whoever
 * waits (--daemonize's parent, systemd) that the daemon is ready. */
static int go_live(struct serve *sv)
{
	int ret;

	svc_listen_close_unused();
	if (sv->pidfile && pidfile_write(&sv->pf, sv->err, sizeof(sv->err)) < 0) {
		log_err("%s", sv->err);
		return 1;
	}
	if (sv->run_with_user && svc_run_as(sv->run_with_user, sv->err, sizeof(sv->err)) < 0) {
		log_err("%s", sv->err);
		return 1;
	}
	if (sv->daemonize && sv->log_file && (ret = log_open_file(sv->log_file)) < 0)
		log_warn("--log-file %s: %s; logging to /dev/null", sv->log_file, strerror(-ret));
	daemon_ready(sv->ready_fd, sv->log_file != NULL); /* --daemonize: the parent exits 0 */
	log_info("serving %u export(s) with %u iothread(s)", qmp_export_count(), sv->nthreads);
	svc_notify_ready(qmp_export_count(), sv->nthreads);
	return -1;
}

static int serve_run(struct serve *sv, const sigset_t *set)
{
	int status;

	if (loop_new(NULL, &sv->main_loop) < 0) {
		log_err("cannot create the main loop");
		return 1;
	}
	loop_bind_current(sv->main_loop);
	/* Before anything else: a second instance must not open the images. */
	status = -1;
	if (sv->pidfile && pidfile_lock(&sv->pf, sv->pidfile, sv->err, sizeof(sv->err)) < 0) {
		fprintf(stderr, "ioplane serve: %s\n", sv->err);
		status = 1;
	}
	if (status < 0)
		status = open_nodes(sv);
	if (status < 0)
		status = start_iothreads(sv);
	if (status < 0)
		status = setup_control(sv);
	if (status < 0)
		status = setup_nbd(sv);
	if (status < 0)
		status = serve_vhost_start(sv->vhost_args, sv->nvhost, vhost_find_image, sv);
	if (status < 0)
		status = serve_setup_signals(sv, set);
	if (status < 0)
		status = serve_monitor_start(sv->monitors, sv->main_loop);
	if (status < 0 && sv->metrics)
		status = serve_metrics_start(sv->metrics, sv->main_loop,
					     svc_listen_take("metrics", serve_metrics_path(sv->metrics)));
	if (status < 0)
		status = go_live(sv);
	if (status < 0) {
		/* Connections are accepted from here on, by the main loop. */
		loop_run(sv->main_loop);
		status = 0;
	}
	serve_teardown(sv, &status);
	return status;
}

/* Before the fork of --daemonize (LISTEN_PID names this process) and before
 * any thread (the environment changes). */
static int serve_early(struct serve *sv)
{
	int ret;

	/* --daemonize: start-up errors go to the caller's stderr, the log to
	 * the file once the daemon is ready; the file is only checked now. */
	ret = sv->log_file && sv->daemonize ? log_check_file(sv->log_file)
		: sv->log_file		    ? log_open_file(sv->log_file)
					    : 0;
	if (ret < 0) {
		fprintf(stderr, "ioplane serve: --log-file %s: %s\n", sv->log_file, strerror(-ret));
		return 1;
	}
	ret = svc_listen_init(sv->err, sizeof(sv->err));
	if (ret < 0) {
		fprintf(stderr, "ioplane serve: %s\n", sv->err);
		return 1;
	}
	if (ret > 0)
		log_info("%d socket(s) passed in by the service manager", ret);
	if (sv->run_with_user && getuid() != 0 && geteuid() != 0) {
		fprintf(stderr, "ioplane serve: --run-with user=%s: only root can change user\n",
			sv->run_with_user);
		return 1;
	}
	return -1;
}

int cmd_serve(int argc, char **argv)
{
	struct serve *sv = calloc(1, sizeof(*sv));
	sigset_t set;
	int status;

	if (!sv)
		return 1;
	sv->sig_h.fd = -1;
	sv->pf.fd = -1;
	sv->poll_max_ns = -1;
	sv->max_conns = DEFAULT_MAX_CONNS;
	sv->request_memory = DEFAULT_REQUEST_MEMORY;
	sv->ready_fd = -1;
	status = serve_parse(sv, argc, argv);
	if (status < 0)
		status = serve_early(sv);
	/* Before any thread: only the forking thread survives a fork. */
	if (status < 0 && sv->daemonize && (sv->ready_fd = daemon_start()) < 0)
		status = 1;
	if (status < 0) {
		serve_block_signals(&set);
		status = serve_run(sv, &set);
	}
	free(sv->image_args);
	free(sv->nbd_args);
	free(sv->vhost_args);
	serve_monitor_free(sv->monitors);
	serve_metrics_free(sv->metrics);
	serve_qsd_free(sv->qsd);
	free(sv);
	return status;
}
