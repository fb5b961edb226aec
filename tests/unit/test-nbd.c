/* Unit tests for the NBD server: a small blocking client in this file talks to
 * connections attached over socketpairs, through the handshake variants,
 * every command and every validation rule.
 * Threading: the server's connections live on one iothread; the client (the
 * test thread) blocks on its socket with a receive timeout, and runs the
 * main loop only to receive the server's drain notification. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <cmocka.h>

#include "block/block.h"
#include "export/nbd-proto.h"
#include "export/nbd-server.h"
#include "loop/iothread.h"
#include "loop/loop.h"
#include "util/opts.h"

#define MiB (1u << 20)
#define FILE_SIZE (16 * MiB)
#define HOLE_START (8 * MiB) /* [8M, 12M) of the file is a hole */
#define HOLE_LEN (4 * MiB)
#define FILL 0xa5

static struct {
	struct loop *main_loop;
	struct iothread *io;
	struct nbd_server *srv;
	struct blk_node *null_bs, *file_bs;
	char path[64];
} g;

/* ---- fixture ------------------------------------------------------------ */

static struct blk_node *open_node(const char *spec)
{
	struct kv_opts o = {0};
	struct blk_node *bs = NULL;
	char err[256];

	assert_int_equal(kv_parse(&o, spec, NULL), 0);
	if (blk_open(&o, &bs, err, sizeof(err)) < 0)
		fail_msg("blk_open(%s): %s", spec, err);
	kv_free(&o);
	return bs;
}

static void make_file(void)
{
	static uint8_t buf[MiB];
	int fd, i;

	snprintf(g.path, sizeof(g.path), "/tmp/test-nbd.XXXXXX");
	fd = mkstemp(g.path);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, FILE_SIZE), 0);
	memset(buf, FILL, sizeof(buf));
	for (i = 0; i < 16; i++)
		if (i < 8 || i >= 12)
			assert_int_equal(pwrite(fd, buf, MiB, (off_t)i * MiB), MiB);
	close(fd);
}

static void add_export(const char *name, struct blk_node *bs, bool writable,
		       enum nbd_detect_zeroes dz)
{
	struct nbd_export_config ec = {.name = name, .bs = bs, .writable = writable,
				       .detect_zeroes = dz};
	char err[256];

	if (!strcmp(name, "null"))
		ec.description = "null device";
	assert_int_equal(nbd_server_add_export(g.srv, &ec, err, sizeof(err)), 0);
}

static int group_setup(void **state)
{
	struct loop *loops[1];
	struct nbd_server_config cfg = {0};
	char spec[128];

	(void)state;
	blk_register_builtin_drivers();
	assert_int_equal(loop_new(NULL, &g.main_loop), 0);
	loop_bind_current(g.main_loop);
	make_file();
	g.null_bs = open_node("driver=null,size=256M,read-zeroes=on");
	snprintf(spec, sizeof(spec), "driver=file,filename=%s", g.path);
	g.file_bs = open_node(spec);
	assert_int_equal(iothread_start("nbd-test", NULL, &g.io), 0);
	loops[0] = iothread_loop(g.io);
	cfg.main_loop = g.main_loop;
	cfg.loops = loops;
	cfg.nloops = 1;
	assert_int_equal(nbd_server_new(&cfg, &g.srv), 0);
	add_export("null", g.null_bs, true, NBD_DETECT_ZEROES_OFF);
	add_export("file", g.file_bs, true, NBD_DETECT_ZEROES_UNMAP);
	add_export("ro", g.file_bs, false, NBD_DETECT_ZEROES_OFF);
	return 0;
}

static void detach(void *arg)
{
	(void)arg;
	blk_detach_loop(g.null_bs, loop_current());
	blk_detach_loop(g.file_bs, loop_current());
}

static int group_teardown(void **state)
{
	(void)state;
	iothread_run_sync(g.io, detach, NULL);
	iothread_join(g.io);
	nbd_server_free(g.srv);
	blk_close(g.null_bs);
	blk_close(g.file_bs);
	unlink(g.path);
	loop_free(g.main_loop);
	return 0;
}

/* ---- client: connection and raw I/O ------------------------------------- */

struct cl {
	int fd;
	bool structured, extended;
	uint64_t size;
	uint16_t tflags;
};

struct attach_arg {
	int fd, ret;
};

static void attach_cb(void *p)
{
	struct attach_arg *a = p;

	a->ret = nbd_server_attach_fd(g.srv, loop_current(), a->fd);
}

static void wait_no_connections(void)
{
	int i;

	for (i = 0; i < 1000 && nbd_server_connections(g.srv); i++)
		usleep(2000);
	assert_int_equal(nbd_server_connections(g.srv), 0);
}

/* Each test starts with no connection left over from the previous one. */
static int test_setup(void **state)
{
	(void)state;
	wait_no_connections();
	return 0;
}

static struct cl cl_connect(void)
{
	struct timeval tv = {.tv_sec = 10};
	struct attach_arg a;
	struct cl c = {0};
	int sv[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
	setsockopt(sv[1], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	a.fd = sv[0];
	iothread_run_sync(g.io, attach_cb, &a);
	assert_int_equal(a.ret, 0);
	c.fd = sv[1];
	return c;
}

static void cl_close(struct cl *c)
{
	close(c->fd);
	c->fd = -1;
}

static void send_all(struct cl *c, const void *p, size_t len)
{
	size_t sent = 0;
	ssize_t n;

	/* Large payloads go out in pieces (the socket has a send timeout). */
	while (sent < len) {
		n = send(c->fd, (const char *)p + sent, len - sent, MSG_NOSIGNAL);
		assert_true(n > 0);
		sent += (size_t)n;
	}
}

static void recv_all(struct cl *c, void *p, size_t len)
{
	size_t got = 0;
	ssize_t n;

	while (got < len) {
		n = recv(c->fd, (uint8_t *)p + got, len - got, 0);
		/* io_uring task work for this thread's loop interrupts waits */
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail_msg("recv: %s after %zu of %zu bytes", n ? strerror(errno) : "EOF", got,
				 len);
		got += (size_t)n;
	}
}

/* The server closed the connection (after sending whatever it sent). */
static void expect_eof(struct cl *c)
{
	uint8_t b[256];
	ssize_t n;

	do {
		n = recv(c->fd, b, sizeof(b), 0);
	} while (n > 0 || (n < 0 && errno == EINTR));
	assert_true(n == 0 || errno == ECONNRESET);
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}
static void put32(uint8_t *p, uint32_t v)
{
	put16(p, (uint16_t)(v >> 16));
	put16(p + 2, (uint16_t)v);
}
static void put64(uint8_t *p, uint64_t v)
{
	put32(p, (uint32_t)(v >> 32));
	put32(p + 4, (uint32_t)v);
}
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get32(const uint8_t *p) { return (uint32_t)get16(p) << 16 | get16(p + 2); }
static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) << 32 | get32(p + 4); }

/* ---- client: handshake -------------------------------------------------- */

static void cl_greeting(struct cl *c, uint32_t cflags)
{
	uint8_t g18[18], f[4];

	recv_all(c, g18, sizeof(g18));
	assert_true(get64(g18) == NBD_MAGIC);
	assert_true(get64(g18 + 8) == NBD_OPTS_MAGIC);
	assert_int_equal(get16(g18 + 16), NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
	put32(f, cflags);
	send_all(c, f, 4);
}

static void cl_opt(struct cl *c, uint32_t opt, const void *data, uint32_t len)
{
	uint8_t h[16];

	put64(h, NBD_OPTS_MAGIC);
	put32(h + 8, opt);
	put32(h + 12, len);
	send_all(c, h, sizeof(h));
	if (len)
		send_all(c, data, len);
}

struct opt_reply {
	uint32_t opt, type, len;
	uint8_t data[8192];
};

static void cl_opt_reply(struct cl *c, struct opt_reply *r)
{
	uint8_t h[20];

	recv_all(c, h, sizeof(h));
	assert_true(get64(h) == NBD_REP_MAGIC);
	r->opt = get32(h + 8);
	r->type = get32(h + 12);
	r->len = get32(h + 16);
	assert_true(r->len <= sizeof(r->data));
	recv_all(c, r->data, r->len);
}

static uint32_t cl_opt_simple(struct cl *c, uint32_t opt, const void *data, uint32_t len)
{
	struct opt_reply r;

	cl_opt(c, opt, data, len);
	cl_opt_reply(c, &r);
	assert_int_equal(r.opt, opt);
	return r.type;
}

/* Data of NBD_OPT_INFO/GO: name, then info requests. */
static uint32_t info_data(uint8_t *d, const char *name, const uint16_t *req, unsigned n)
{
	uint32_t nl = (uint32_t)strlen(name), i;

	put32(d, nl);
	memcpy(d + 4, name, nl);
	put16(d + 4 + nl, (uint16_t)n);
	for (i = 0; i < n; i++)
		put16(d + 6 + nl + 2 * i, req[i]);
	return 6 + nl + 2 * n;
}

/* NBD_OPT_GO; returns the final reply type. Fills size/tflags from INFO. */
static uint32_t cl_go(struct cl *c, uint32_t opt, const char *name)
{
	static const uint16_t req[] = {NBD_INFO_BLOCK_SIZE};
	struct opt_reply r;
	uint8_t d[256];

	cl_opt(c, opt, d, info_data(d, name, req, 1));
	for (;;) {
		cl_opt_reply(c, &r);
		if (r.type != NBD_REP_INFO)
			return r.type;
		if (get16(r.data) == NBD_INFO_EXPORT) {
			assert_int_equal(r.len, 12);
			c->size = get64(r.data + 2);
			c->tflags = get16(r.data + 10);
		}
	}
}

static uint32_t cl_set_meta(struct cl *c, const char *exp, const char *query)
{
	struct opt_reply r;
	uint32_t el = (uint32_t)strlen(exp), ql = (uint32_t)strlen(query), ids = 0;
	uint8_t d[256];

	put32(d, el);
	memcpy(d + 4, exp, el);
	put32(d + 4 + el, 1);
	put32(d + 8 + el, ql);
	memcpy(d + 12 + el, query, ql);
	cl_opt(c, NBD_OPT_SET_META_CONTEXT, d, 12 + el + ql);
	for (;;) {
		cl_opt_reply(c, &r);
		if (r.type != NBD_REP_META_CONTEXT)
			return r.type == NBD_REP_ACK ? ids : 0x80000000u | r.type;
		assert_int_equal(r.len, 4 + strlen(NBD_META_BASE_ALLOCATION));
		assert_memory_equal(r.data + 4, NBD_META_BASE_ALLOCATION, r.len - 4);
		ids++;
	}
}

enum { MODE_SIMPLE, MODE_STRUCTURED, MODE_EXTENDED };

/* Connect and negotiate up to transmission on `name`. */
static struct cl cl_open(const char *name, int mode, bool meta)
{
	struct cl c = cl_connect();

	cl_greeting(&c, NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES);
	if (mode == MODE_STRUCTURED)
		assert_int_equal(cl_opt_simple(&c, NBD_OPT_STRUCTURED_REPLY, NULL, 0), NBD_REP_ACK);
	if (mode == MODE_EXTENDED)
		assert_int_equal(cl_opt_simple(&c, NBD_OPT_EXTENDED_HEADERS, NULL, 0), NBD_REP_ACK);
	c.structured = mode == MODE_STRUCTURED;
	c.extended = mode == MODE_EXTENDED;
	if (meta)
		assert_int_equal(cl_set_meta(&c, name, NBD_META_BASE_ALLOCATION), 1);
	assert_int_equal(cl_go(&c, NBD_OPT_GO, name), NBD_REP_ACK);
	return c;
}

/* ---- client: transmission ------------------------------------------------ */

static void cl_req(struct cl *c, uint16_t flags, uint16_t type, uint64_t cookie, uint64_t off,
		   uint64_t len, const void *payload, size_t plen)
{
	uint8_t h[32];
	size_t hl;

	put32(h, c->extended ? NBD_EXTENDED_REQUEST_MAGIC : NBD_REQUEST_MAGIC);
	put16(h + 4, flags);
	put16(h + 6, type);
	put64(h + 8, cookie);
	put64(h + 16, off);
	if (c->extended) {
		put64(h + 24, len);
		hl = 32;
	} else {
		put32(h + 24, (uint32_t)len);
		hl = 28;
	}
	send_all(c, h, hl);
	if (plen)
		send_all(c, payload, plen);
}

struct chunk {
	uint16_t flags, type;
	uint32_t error; /* simple replies: the error; error chunks: their error */
	uint64_t cookie, offset, len;
	uint8_t *data; /* payload (malloc'ed), len bytes */
	bool simple;
};

/* One reply message: simple (data_len bytes follow when error is 0 and the
 * caller expects data) or a structured/extended chunk. */
static void cl_reply(struct cl *c, struct chunk *k, size_t simple_data)
{
	uint8_t h[32];

	memset(k, 0, sizeof(*k));
	recv_all(c, h, 4);
	if (get32(h) == NBD_SIMPLE_REPLY_MAGIC) {
		assert_false(c->extended);
		recv_all(c, h + 4, 12);
		k->simple = true;
		k->error = get32(h + 4);
		k->cookie = get64(h + 8);
		k->len = k->error ? 0 : simple_data;
	} else if (get32(h) == NBD_STRUCTURED_REPLY_MAGIC) {
		assert_true(c->structured);
		recv_all(c, h + 4, 16);
		k->len = get32(h + 16);
	} else {
		assert_true(get32(h) == NBD_EXTENDED_REPLY_MAGIC);
		assert_true(c->extended);
		recv_all(c, h + 4, 28);
		k->offset = get64(h + 16);
		k->len = get64(h + 24);
	}
	if (!k->simple) {
		k->flags = get16(h + 4);
		k->type = get16(h + 6);
		k->cookie = get64(h + 8);
	}
	assert_true(k->len <= 64 * MiB + 32); /* a chunk: payload + header */
	k->data = malloc(k->len ? k->len : 1);
	assert_non_null(k->data);
	recv_all(c, k->data, k->len);
	if (!k->simple && (k->type & 0x8000)) {
		assert_true(k->len >= 6);
		k->error = get32(k->data);
		assert_true(get16(k->data + 4) <= k->len - 6);
	}
}

/* A command without reply data: returns its error (0 on success). */
static uint32_t cl_cmd(struct cl *c, uint16_t flags, uint16_t type, uint64_t off, uint64_t len)
{
	static uint64_t cookie = 1000;
	struct chunk k;
	uint32_t err;

	cl_req(c, flags, type, ++cookie, off, len, NULL, 0);
	cl_reply(c, &k, 0);
	assert_true(k.cookie == cookie);
	if (!k.simple)
		assert_true(k.flags & NBD_REPLY_FLAG_DONE);
	err = k.error;
	free(k.data);
	return err;
}

static uint32_t cl_write(struct cl *c, uint16_t flags, uint64_t off, const void *buf, size_t len)
{
	static uint64_t cookie = 2000;
	struct chunk k;
	uint32_t err;

	if (c->extended)
		flags |= NBD_CMD_FLAG_PAYLOAD_LEN;
	cl_req(c, flags, NBD_CMD_WRITE, ++cookie, off, len, buf, len);
	cl_reply(c, &k, 0);
	assert_true(k.cookie == cookie);
	err = k.error;
	free(k.data);
	return err;
}

/* Read into buf (zero-filled holes); returns the error; counts chunks. */
static uint32_t cl_read(struct cl *c, uint16_t flags, uint64_t off, uint8_t *buf, size_t len,
			unsigned *ndata, unsigned *nholes)
{
	static uint64_t cookie = 3000;
	struct chunk k;
	uint32_t err = 0;

	*ndata = *nholes = 0;
	cl_req(c, flags, NBD_CMD_READ, ++cookie, off, len, NULL, 0);
	do {
		cl_reply(c, &k, len);
		assert_true(k.cookie == cookie);
		if (k.simple) {
			memcpy(buf, k.data, k.len);
			err = k.error;
			free(k.data);
			return err;
		}
		if (c->extended)
			assert_true(k.offset == off);
		if (k.type == NBD_REPLY_TYPE_OFFSET_DATA) {
			uint64_t o = get64(k.data);

			assert_true(o >= off && o + k.len - 8 <= off + len);
			memcpy(buf + (o - off), k.data + 8, k.len - 8);
			(*ndata)++;
		} else if (k.type == NBD_REPLY_TYPE_OFFSET_HOLE) {
			uint64_t o = get64(k.data);
			uint32_t hl = get32(k.data + 8);

			assert_int_equal(k.len, 12);
			assert_true(o >= off && o + hl <= off + len);
			memset(buf + (o - off), 0, hl);
			(*nholes)++;
		} else if (k.type & 0x8000) {
			err = k.error;
		} else {
			assert_int_equal(k.type, NBD_REPLY_TYPE_NONE);
		}
		free(k.data);
	} while (!(k.flags & NBD_REPLY_FLAG_DONE));
	return err;
}

struct extent {
	uint64_t len;
	uint32_t flags;
};

/* BLOCK_STATUS: returns the error; fills up to max extents. */
static uint32_t cl_status(struct cl *c, uint16_t flags, uint64_t off, uint64_t len,
			  struct extent *e, unsigned max, unsigned *n)
{
	static uint64_t cookie = 4000;
	struct chunk k;
	uint32_t err = 0, i, cnt;

	*n = 0;
	cl_req(c, flags, NBD_CMD_BLOCK_STATUS, ++cookie, off, len, NULL, 0);
	cl_reply(c, &k, 0);
	assert_true(k.cookie == cookie);
	if (k.simple || (k.type & 0x8000)) {
		err = k.error;
	} else if (c->extended) {
		assert_int_equal(k.type, NBD_REPLY_TYPE_BLOCK_STATUS_EXT);
		assert_int_equal(get32(k.data), 1);
		cnt = get32(k.data + 4);
		assert_int_equal(k.len, 8 + 16 * cnt);
		for (i = 0; i < cnt && i < max; i++)
			e[(*n)++] = (struct extent){get64(k.data + 8 + 16 * i),
						    (uint32_t)get64(k.data + 16 + 16 * i)};
	} else {
		assert_int_equal(k.type, NBD_REPLY_TYPE_BLOCK_STATUS);
		assert_int_equal(get32(k.data), 1);
		assert_int_equal((k.len - 4) % 8, 0);
		for (i = 0; i < (k.len - 4) / 8 && i < max; i++)
			e[(*n)++] = (struct extent){get32(k.data + 4 + 8 * i),
						    get32(k.data + 8 + 8 * i)};
	}
	assert_true(k.flags & NBD_REPLY_FLAG_DONE);
	free(k.data);
	return err;
}

static void cl_disc(struct cl *c)
{
	cl_req(c, 0, NBD_CMD_DISC, 1, 0, 0, NULL, 0);
	expect_eof(c);
	cl_close(c);
}

/* ---- handshake tests ---------------------------------------------------- */

static void test_greeting_and_bad_flags(void **state)
{
	struct cl c = cl_connect();

	(void)state;
	/* A client flag the server did not offer: the spec has it hang up. */
	cl_greeting(&c, NBD_FLAG_C_FIXED_NEWSTYLE | (1u << 7));
	expect_eof(&c);
	cl_close(&c);
}

static void test_bad_option_magic(void **state)
{
	struct cl c = cl_connect();
	uint8_t h[16] = {0};

	(void)state;
	cl_greeting(&c, NBD_FLAG_C_FIXED_NEWSTYLE);
	send_all(&c, h, sizeof(h));
	expect_eof(&c);
	cl_close(&c);
}

static void test_options_errors(void **state)
{
	struct cl c = cl_connect();
	uint8_t d[64] = {0};

	(void)state;
	cl_greeting(&c, NBD_FLAG_C_FIXED_NEWSTYLE);
	assert_int_equal(cl_opt_simple(&c, 0x4242, "xyz", 3), NBD_REP_ERR_UNSUP);
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_STARTTLS, NULL, 0), NBD_REP_ERR_UNSUP);
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_LIST, "x", 1), NBD_REP_ERR_INVALID);
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_STRUCTURED_REPLY, "x", 1), NBD_REP_ERR_INVALID);
	/* meta contexts need structured replies first */
	assert_int_equal(cl_set_meta(&c, "null", NBD_META_BASE_ALLOCATION),
			 0x80000000u | NBD_REP_ERR_INVALID);
	/* INFO: name length past the data; trailing garbage; unknown export */
	put32(d, 100);
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_INFO, d, 10), NBD_REP_ERR_INVALID);
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_INFO, d, info_data(d, "null", NULL, 0) + 1),
			 NBD_REP_ERR_INVALID);
	assert_int_equal(cl_go(&c, NBD_OPT_INFO, "nosuch"), NBD_REP_ERR_UNKNOWN);
	/* too much option data: refused, skipped, and the stream stays in sync */
	{
		size_t big = 100 * 1024;
		uint8_t *p = calloc(1, big);

		assert_int_equal(cl_opt_simple(&c, 0x77, p, (uint32_t)big), NBD_REP_ERR_TOO_BIG);
		free(p);
	}
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_EXTENDED_HEADERS, NULL, 0), NBD_REP_ACK);
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_STRUCTURED_REPLY, NULL, 0),
			 NBD_REP_ERR_EXT_HEADER_REQD);
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_ABORT, NULL, 0), NBD_REP_ACK);
	expect_eof(&c);
	cl_close(&c);
}

static void test_list_and_info(void **state)
{
	static const uint16_t req[] = {NBD_INFO_NAME, NBD_INFO_DESCRIPTION, NBD_INFO_BLOCK_SIZE};
	const char *names[] = {"null", "file", "ro"};
	struct cl c = cl_connect();
	struct opt_reply r;
	unsigned i, seen = 0;
	uint8_t d[64];

	(void)state;
	cl_greeting(&c, NBD_FLAG_C_FIXED_NEWSTYLE);
	cl_opt(&c, NBD_OPT_LIST, NULL, 0);
	for (i = 0; i < 3; i++) {
		cl_opt_reply(&c, &r);
		assert_int_equal(r.type, NBD_REP_SERVER);
		assert_int_equal(get32(r.data), strlen(names[i]));
		assert_memory_equal(r.data + 4, names[i], strlen(names[i]));
	}
	cl_opt_reply(&c, &r);
	assert_int_equal(r.type, NBD_REP_ACK);
	cl_opt(&c, NBD_OPT_INFO, d, info_data(d, "null", req, 3));
	for (cl_opt_reply(&c, &r); r.type == NBD_REP_INFO; cl_opt_reply(&c, &r)) {
		uint16_t t = get16(r.data);

		seen |= 1u << t;
		if (t == NBD_INFO_EXPORT) {
			assert_true(get64(r.data + 2) == 256 * MiB);
			assert_false(get16(r.data + 10) & NBD_FLAG_READ_ONLY);
			assert_true(get16(r.data + 10) & NBD_FLAG_SEND_WRITE_ZEROES);
			/* no structured replies negotiated: DF must be clear */
			assert_false(get16(r.data + 10) & NBD_FLAG_SEND_DF);
		} else if (t == NBD_INFO_NAME) {
			assert_memory_equal(r.data + 2, "null", 4);
		} else if (t == NBD_INFO_DESCRIPTION) {
			assert_memory_equal(r.data + 2, "null device", 11);
		} else if (t == NBD_INFO_BLOCK_SIZE) {
			assert_int_equal(r.len, 14);
			assert_int_equal(get32(r.data + 10), NBD_MAX_REQUEST);
		}
	}
	assert_int_equal(r.type, NBD_REP_ACK);
	assert_int_equal(seen, 0xf);
	/* Block size only when asked for (our limits are the spec's defaults
	 * or looser); the name neither. */
	cl_opt(&c, NBD_OPT_INFO, d, info_data(d, "null", req, 0));
	for (seen = 0, cl_opt_reply(&c, &r); r.type == NBD_REP_INFO; cl_opt_reply(&c, &r))
		seen |= 1u << get16(r.data);
	assert_int_equal(r.type, NBD_REP_ACK);
	assert_int_equal(seen, 1u << NBD_INFO_EXPORT);
	/* the empty name is the default export */
	assert_int_equal(cl_go(&c, NBD_OPT_INFO, ""), NBD_REP_ACK);
	assert_true(c.size == 256 * MiB);
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_ABORT, NULL, 0), NBD_REP_ACK);
	cl_close(&c);
}

static void test_meta_contexts(void **state)
{
	struct cl c = cl_connect();
	struct opt_reply r;
	uint8_t d[64];

	(void)state;
	cl_greeting(&c, NBD_FLAG_C_FIXED_NEWSTYLE);
	assert_int_equal(cl_opt_simple(&c, NBD_OPT_STRUCTURED_REPLY, NULL, 0), NBD_REP_ACK);
	/* LIST with no query lists everything */
	put32(d, 4);
	memcpy(d + 4, "file", 4);
	put32(d + 8, 0);
	cl_opt(&c, NBD_OPT_LIST_META_CONTEXT, d, 12);
	cl_opt_reply(&c, &r);
	assert_int_equal(r.type, NBD_REP_META_CONTEXT);
	assert_int_equal(get32(r.data), 0);
	cl_opt_reply(&c, &r);
	assert_int_equal(r.type, NBD_REP_ACK);
	/* SET: unknown leaves and namespaces are ignored; "base:" selects nothing */
	assert_int_equal(cl_set_meta(&c, "file", "x-foo:bar"), 0);
	assert_int_equal(cl_set_meta(&c, "file", "base:"), 0);
	assert_int_equal(cl_set_meta(&c, "nosuch", NBD_META_BASE_ALLOCATION),
			 0x80000000u | NBD_REP_ERR_UNKNOWN);
	/* selected for "null" but then GO to "file": no block status there */
	assert_int_equal(cl_set_meta(&c, "null", NBD_META_BASE_ALLOCATION), 1);
	assert_int_equal(cl_go(&c, NBD_OPT_GO, "file"), NBD_REP_ACK);
	c.structured = true;
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_BLOCK_STATUS, 0, 4096), NBD_EINVAL);
	cl_disc(&c);
}

static void test_export_name(void **state)
{
	struct cl c = cl_connect();
	uint8_t r[134];

	(void)state;
	cl_greeting(&c, NBD_FLAG_C_FIXED_NEWSTYLE); /* no NO_ZEROES: 124 zero bytes */
	cl_opt(&c, NBD_OPT_EXPORT_NAME, "ro", 2);
	recv_all(&c, r, sizeof(r));
	assert_true(get64(r) == FILE_SIZE);
	assert_true(get16(r + 8) & NBD_FLAG_READ_ONLY);
	assert_true(get16(r + 8) & NBD_FLAG_CAN_MULTI_CONN);
	assert_false(get16(r + 8) & NBD_FLAG_SEND_TRIM);
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_FLUSH, 0, 0), 0);
	cl_disc(&c);

	c = cl_connect();
	cl_greeting(&c, NBD_FLAG_C_FIXED_NEWSTYLE);
	cl_opt(&c, NBD_OPT_EXPORT_NAME, "nosuch", 6); /* cannot be refused politely */
	expect_eof(&c);
	cl_close(&c);
}

/* ---- transmission tests ------------------------------------------------- */

static void check_fill(const uint8_t *b, size_t len, uint8_t v)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (b[i] != v)
			fail_msg("byte %zu is %#x, expected %#x", i, b[i], v);
}

static void test_commands_simple(void **state)
{
	struct cl c = cl_open("file", MODE_SIMPLE, false);
	uint8_t *buf = malloc(MiB), *w = malloc(65536);
	unsigned nd, nh;

	(void)state;
	assert_true(c.size == FILE_SIZE);
	assert_true(c.tflags & NBD_FLAG_SEND_FLUSH);
	assert_true(c.tflags & NBD_FLAG_SEND_FUA);
	assert_int_equal(cl_read(&c, 0, 0, buf, 4096, &nd, &nh), 0);
	check_fill(buf, 4096, FILL);
	memset(w, 0x3c, 65536);
	assert_int_equal(cl_write(&c, NBD_CMD_FLAG_FUA, 65536, w, 65536), 0);
	assert_int_equal(cl_read(&c, 0, 65536 - 512, buf, 66560, &nd, &nh), 0);
	check_fill(buf, 512, FILL);
	check_fill(buf + 512, 65536, 0x3c);
	check_fill(buf + 512 + 65536, 512, FILL);
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_FLUSH, 0, 0), 0);
	assert_int_equal(cl_cmd(&c, NBD_CMD_FLAG_NO_HOLE, NBD_CMD_WRITE_ZEROES, 65536, 4096), 0);
	assert_int_equal(cl_read(&c, 0, 65536, buf, 8192, &nd, &nh), 0);
	check_fill(buf, 4096, 0);
	check_fill(buf + 4096, 4096, 0x3c);
	assert_int_equal(cl_cmd(&c, NBD_CMD_FLAG_FUA, NBD_CMD_TRIM, 2 * MiB, MiB), 0);
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_CACHE, 0, MiB), 0);
	assert_int_equal(cl_cmd(&c, NBD_CMD_FLAG_FAST_ZERO, NBD_CMD_WRITE_ZEROES, 3 * MiB, 4096),
			 0);
	/* zero-length requests succeed and do nothing */
	assert_int_equal(cl_read(&c, 0, 0, buf, 0, &nd, &nh), 0);
	assert_int_equal(cl_write(&c, 0, 4096, w, 0), 0);
	/* put the filler back for the other tests */
	memset(w, FILL, 65536);
	assert_int_equal(cl_write(&c, 0, 65536, w, 65536), 0);
	cl_disc(&c);
	free(buf);
	free(w);
}

static void test_validation(void **state)
{
	struct cl c = cl_open("file", MODE_SIMPLE, false);
	uint8_t *w = calloc(1, 8192), buf[4096];
	unsigned nd, nh;

	(void)state;
	assert_int_equal(cl_cmd(&c, 0, 42, 0, 4096), NBD_EINVAL);
	assert_int_equal(cl_cmd(&c, 0, 0xffff, 0, 0), NBD_EINVAL);
	/* flags not valid for the command (DF needs structured replies) */
	assert_int_equal(cl_read(&c, NBD_CMD_FLAG_DF, 0, buf, 4096, &nd, &nh), NBD_EINVAL);
	assert_int_equal(cl_cmd(&c, NBD_CMD_FLAG_REQ_ONE, NBD_CMD_TRIM, 0, 4096), NBD_EINVAL);
	assert_int_equal(cl_cmd(&c, 1u << 12, NBD_CMD_FLUSH, 0, 0), NBD_EINVAL);
	/* a refused write's payload is consumed: it looks like requests */
	memset(w, 0, 8192);
	put32(w, NBD_REQUEST_MAGIC);
	assert_int_equal(cl_write(&c, NBD_CMD_FLAG_NO_HOLE, 0, w, 8192), NBD_EINVAL);
	/* ranges: reads past the end EINVAL, writes ENOSPC, overflow too */
	assert_int_equal(cl_read(&c, 0, FILE_SIZE - 512, buf, 1024, &nd, &nh), NBD_EINVAL);
	assert_int_equal(cl_write(&c, 0, FILE_SIZE, w, 512), NBD_ENOSPC);
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_WRITE_ZEROES, UINT64_MAX - 511, 1024), NBD_ENOSPC);
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_TRIM, FILE_SIZE + 4096, 4096), NBD_EINVAL);
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_CACHE, FILE_SIZE, 1), NBD_EINVAL);
	/* BLOCK_STATUS without a selected context */
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_BLOCK_STATUS, 0, 4096), NBD_EINVAL);
	/* a read larger than the maximum payload (simple replies: EINVAL) */
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_READ, 0, NBD_MAX_REQUEST + 1), NBD_EINVAL);
	/* still in sync */
	assert_int_equal(cl_read(&c, 0, 0, buf, 4096, &nd, &nh), 0);
	check_fill(buf, 4096, FILL);
	cl_disc(&c);
	free(w);
}

static void test_readonly(void **state)
{
	struct cl c = cl_open("ro", MODE_STRUCTURED, false);
	uint8_t w[4096] = {0};
	unsigned nd, nh;

	(void)state;
	assert_true(c.tflags & NBD_FLAG_READ_ONLY);
	assert_int_equal(cl_write(&c, 0, 0, w, sizeof(w)), NBD_EPERM);
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_TRIM, 0, 4096), NBD_EPERM);
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_WRITE_ZEROES, 0, 4096), NBD_EPERM);
	assert_int_equal(cl_read(&c, 0, 0, w, sizeof(w), &nd, &nh), 0);
	check_fill(w, sizeof(w), FILL);
	cl_disc(&c);
}

static void test_bad_magic_and_oversize(void **state)
{
	struct cl c = cl_open("null", MODE_SIMPLE, false);
	uint8_t junk[28] = {0x12, 0x34}, *big;
	unsigned nd, nh;

	(void)state;
	send_all(&c, junk, sizeof(junk));
	expect_eof(&c);
	cl_close(&c);
	/* Up to 64 MiB is fine, unasked (the reference test client sends 48 MiB
	 * requests without negotiating block sizes). */
	c = cl_open("null", MODE_SIMPLE, false);
	big = calloc(1, NBD_MAX_REQUEST);
	assert_non_null(big);
	assert_int_equal(cl_write(&c, 0, 0, big, 48 * MiB), 0);
	assert_int_equal(cl_write(&c, NBD_CMD_FLAG_FUA, MiB, big, NBD_MAX_REQUEST), 0);
	memset(big, 0x55, NBD_MAX_REQUEST);
	assert_int_equal(cl_read(&c, 0, 0, big, NBD_MAX_REQUEST, &nd, &nh), 0);
	check_fill(big, NBD_MAX_REQUEST, 0);
	free(big);
	cl_disc(&c);
	/* a write payload past 64 MiB is treated as an attack: hang up */
	c = cl_open("null", MODE_SIMPLE, false);
	cl_req(&c, 0, NBD_CMD_WRITE, 1, 0, NBD_MAX_REQUEST + 1, NULL, 0);
	expect_eof(&c);
	cl_close(&c);
}

static void test_structured_read(void **state)
{
	struct cl c = cl_open("file", MODE_STRUCTURED, false);
	uint8_t *buf = malloc(8 * MiB);
	unsigned nd, nh;

	(void)state;
	assert_true(c.tflags & NBD_FLAG_SEND_DF);
	assert_int_equal(cl_read(&c, 0, 0, buf, 4096, &nd, &nh), 0);
	assert_int_equal(nd, 1);
	check_fill(buf, 4096, FILL);
	/* across data and the hole: data and hole chunks */
	memset(buf, 0x77, 8 * MiB);
	assert_int_equal(cl_read(&c, 0, HOLE_START - MiB, buf, 6 * MiB, &nd, &nh), 0);
	assert_true(nd >= 2 && nh >= 1);
	check_fill(buf, MiB, FILL);
	check_fill(buf + MiB, HOLE_LEN, 0);
	check_fill(buf + 5 * MiB, MiB, FILL);
	/* the same with DF: one content chunk, holes as zero data */
	memset(buf, 0x77, 8 * MiB);
	assert_int_equal(cl_read(&c, NBD_CMD_FLAG_DF, HOLE_START - MiB, buf, 6 * MiB, &nd, &nh),
			 0);
	assert_int_equal(nd + nh, 1);
	check_fill(buf + MiB, HOLE_LEN, 0);
	/* all hole: no data at all */
	assert_int_equal(cl_read(&c, 0, HOLE_START, buf, HOLE_LEN, &nd, &nh), 0);
	assert_int_equal(nd, 0);
	check_fill(buf, HOLE_LEN, 0);
	/* errors come as error chunks; too large is EOVERFLOW */
	assert_int_equal(cl_read(&c, 0, FILE_SIZE, buf, 4096, &nd, &nh), NBD_EINVAL);
	cl_disc(&c);
	c = cl_open("null", MODE_STRUCTURED, false);
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_READ, 0, NBD_MAX_REQUEST + 1), NBD_EOVERFLOW);
	cl_disc(&c);
	free(buf);
}

static void test_block_status(void **state)
{
	struct cl c = cl_open("file", MODE_STRUCTURED, true);
	struct extent e[64];
	uint64_t sum = 0;
	unsigned n, i;

	(void)state;
	assert_int_equal(cl_status(&c, 0, 0, FILE_SIZE, e, 64, &n), 0);
	assert_true(n >= 3);
	for (i = 0; i < n; i++) {
		/* 5M: data no other test touches; 9M: in the hole */
		if (sum <= 5 * MiB && 5 * MiB < sum + e[i].len)
			assert_int_equal(e[i].flags, 0);
		if (sum <= 9 * MiB && 9 * MiB < sum + e[i].len)
			assert_int_equal(e[i].flags, NBD_STATE_HOLE | NBD_STATE_ZERO);
		sum += e[i].len;
	}
	assert_true(sum == FILE_SIZE);
	/* REQ_ONE: exactly one extent, not past the request */
	assert_int_equal(cl_status(&c, NBD_CMD_FLAG_REQ_ONE, HOLE_START - 4096, 2 * MiB, e, 64,
				   &n), 0);
	assert_int_equal(n, 1);
	assert_true(e[0].len == 4096 && e[0].flags == 0);
	assert_int_equal(cl_status(&c, NBD_CMD_FLAG_REQ_ONE, HOLE_START, 4096, e, 64, &n), 0);
	assert_true(n == 1 && e[0].len == 4096);
	assert_int_equal(e[0].flags, NBD_STATE_HOLE | NBD_STATE_ZERO);
	assert_int_equal(cl_status(&c, 0, FILE_SIZE, 4096, e, 64, &n), NBD_EINVAL);
	assert_int_equal(cl_status(&c, 0, 0, 0, e, 64, &n), NBD_EINVAL);
	cl_disc(&c);
}

static void test_extended(void **state)
{
	struct cl c = cl_open("file", MODE_EXTENDED, true);
	uint8_t w[4096], buf[8192];
	struct extent e[8];
	unsigned nd, nh, n;

	(void)state;
	assert_true(c.tflags & NBD_FLAG_SEND_DF);
	memset(w, 0x5a, sizeof(w));
	assert_int_equal(cl_write(&c, NBD_CMD_FLAG_FUA, 4 * MiB, w, sizeof(w)), 0);
	assert_int_equal(cl_read(&c, 0, 4 * MiB, buf, 8192, &nd, &nh), 0);
	check_fill(buf, 4096, 0x5a);
	check_fill(buf + 4096, 4096, FILL);
	/* a write must carry PAYLOAD_LEN; other commands must not */
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_WRITE, 0, 4096), NBD_EINVAL);
	cl_req(&c, NBD_CMD_FLAG_PAYLOAD_LEN, NBD_CMD_TRIM, 77, 0, 16, w, 16);
	{
		struct chunk k;

		cl_reply(&c, &k, 0);
		assert_true(k.cookie == 77 && k.error == NBD_EINVAL);
		free(k.data);
	}
	/* 64-bit effect lengths; success replies are NONE chunks */
	assert_int_equal(cl_cmd(&c, 0, NBD_CMD_CACHE, 0, FILE_SIZE), 0);
	assert_int_equal(cl_status(&c, 0, HOLE_START, HOLE_LEN, e, 8, &n), 0);
	assert_true(n == 1 && e[0].len == HOLE_LEN);
	memset(w, FILL, sizeof(w));
	assert_int_equal(cl_write(&c, 0, 4 * MiB, w, sizeof(w)), 0);
	cl_disc(&c);
}

static void test_detect_zeroes(void **state)
{
	struct cl c = cl_open("file", MODE_STRUCTURED, true);
	uint8_t *z = calloc(1, MiB), *f = malloc(MiB);
	struct extent e[4];
	unsigned n;

	(void)state;
	/* detect-zeroes=unmap on "file": a zero write deallocates */
	assert_int_equal(cl_write(&c, 0, 13 * MiB, z, MiB), 0);
	assert_int_equal(cl_status(&c, NBD_CMD_FLAG_REQ_ONE, 13 * MiB, MiB, e, 4, &n), 0);
	assert_true(n == 1 && (e[0].flags & NBD_STATE_ZERO));
	memset(f, FILL, MiB);
	assert_int_equal(cl_write(&c, 0, 13 * MiB, f, MiB), 0);
	assert_int_equal(cl_status(&c, NBD_CMD_FLAG_REQ_ONE, 13 * MiB, MiB, e, 4, &n), 0);
	assert_true(n == 1 && e[0].flags == 0);
	cl_disc(&c);
	free(z);
	free(f);
}

/* Many requests in one burst, more than a connection's request pool: all
 * answered, each cookie once. */
static void test_pipeline(void **state)
{
	enum { N = 600 };
	struct cl c = cl_open("null", MODE_STRUCTURED, false);
	static uint8_t burst[N * 28 + N * 512];
	static bool seen[N];
	size_t off = 0;
	struct chunk k;
	unsigned i, got = 0;

	(void)state;
	memset(seen, 0, sizeof(seen));
	for (i = 0; i < N; i++) {
		uint8_t *h = burst + off;

		put32(h, NBD_REQUEST_MAGIC);
		put16(h + 4, 0);
		put16(h + 6, i % 3 == 0 ? NBD_CMD_WRITE : NBD_CMD_READ);
		put64(h + 8, i);
		put64(h + 16, (uint64_t)i * 4096);
		put32(h + 24, 512);
		off += 28;
		if (i % 3 == 0) {
			memset(burst + off, (int)i, 512);
			off += 512;
		}
	}
	send_all(&c, burst, off);
	while (got < N) {
		cl_reply(&c, &k, 0);
		assert_true(k.cookie < N);
		assert_false(k.error);
		if (k.simple || (k.flags & NBD_REPLY_FLAG_DONE)) {
			assert_false(seen[k.cookie]);
			seen[k.cookie] = true;
			got++;
		}
		free(k.data);
	}
	cl_disc(&c);
}

/* The client goes away in the middle of a write payload and with requests
 * in flight: the server cleans up and keeps serving. */
static void test_vanishing_client(void **state)
{
	struct cl c = cl_open("file", MODE_SIMPLE, false);
	uint8_t w[8192];
	unsigned nd, nh, i;

	(void)state;
	memset(w, FILL, sizeof(w));
	for (i = 0; i < 16; i++)
		cl_req(&c, 0, NBD_CMD_WRITE, i, 1 * MiB + i * 8192, 8192, w, 8192);
	cl_req(&c, 0, NBD_CMD_WRITE, 99, 0, 8192, w, 1000);
	cl_close(&c);
	wait_no_connections();
	c = cl_open("file", MODE_SIMPLE, false);
	assert_int_equal(cl_read(&c, 0, MiB, w, sizeof(w), &nd, &nh), 0);
	check_fill(w, sizeof(w), FILL);
	cl_disc(&c);
}

static void drained(void *opaque)
{
	*(bool *)opaque = true;
}

/* Shutdown: a connection in transmission and one in the handshake close;
 * the drain callback runs on the main loop. Must run last. */
static void test_drain(void **state)
{
	struct cl a = cl_open("null", MODE_SIMPLE, false), b = cl_connect();
	bool done = false;
	int i;

	(void)state;
	assert_int_equal(cl_cmd(&a, 0, NBD_CMD_FLUSH, 0, 0), 0);
	assert_int_equal(nbd_server_connections(g.srv), 2);
	nbd_server_drain(g.srv, drained, &done);
	expect_eof(&a);
	expect_eof(&b);
	for (i = 0; i < 1000 && !done; i++)
		loop_run_once(g.main_loop, false), usleep(1000);
	assert_true(done);
	assert_int_equal(nbd_server_connections(g.srv), 0);
	cl_close(&a);
	cl_close(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_greeting_and_bad_flags, test_setup),
		cmocka_unit_test_setup(test_bad_option_magic, test_setup),
		cmocka_unit_test_setup(test_options_errors, test_setup),
		cmocka_unit_test_setup(test_list_and_info, test_setup),
		cmocka_unit_test_setup(test_meta_contexts, test_setup),
		cmocka_unit_test_setup(test_export_name, test_setup),
		cmocka_unit_test_setup(test_commands_simple, test_setup),
		cmocka_unit_test_setup(test_validation, test_setup),
		cmocka_unit_test_setup(test_readonly, test_setup),
		cmocka_unit_test_setup(test_bad_magic_and_oversize, test_setup),
		cmocka_unit_test_setup(test_structured_read, test_setup),
		cmocka_unit_test_setup(test_block_status, test_setup),
		cmocka_unit_test_setup(test_extended, test_setup),
		cmocka_unit_test_setup(test_detect_zeroes, test_setup),
		cmocka_unit_test_setup(test_pipeline, test_setup),
		cmocka_unit_test_setup(test_vanishing_client, test_setup),
		cmocka_unit_test_setup(test_drain, test_setup),
	};

	int failed;

	/* Once with transmission's socket input through the io_uring (where the
	 * loop waits in one set up with DEFER_TASKRUN, nbd-ring.c), once as on a
	 * kernel without it: readiness events and recv. */
	failed = cmocka_run_group_tests_name("nbd", tests, group_setup, group_teardown);
	setenv("IOPLANE_RING_PLAIN", "1", 1);
	failed += cmocka_run_group_tests_name("nbd, plain ring", tests, group_setup, group_teardown);
	unsetenv("IOPLANE_RING_PLAIN");
	return failed;
}
