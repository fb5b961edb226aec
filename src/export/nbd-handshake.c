/* NBD handshake: fixed newstyle negotiation and option haggling, as a state
 * machine over the connection's input buffer (docs/nbd.md draws it):
 *
 *   greeting sent -> CLIENT_FLAGS -> OPTIONS -(EXPORT_NAME | GO ok)-> TRANSMISSION
 *                                     |  \-(ABORT)-> ACK, close
 *                                     \-- every other option: replies, stay
 *
 * An option is handled once all of its data is in the buffer (options carry
 * at most NBD_MAX_OPT_DATA bytes; larger ones are skipped and refused).
 * Replies go to the connection's handshake output buffer.
 *
 * Threading: runs on the connection's loop. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "block/dirty-bitmap.h"
#include "export/nbd-int.h"
#include "util/log.h"

/* Option data being parsed: a cursor that refuses to run past the end. */
struct opt_cursor {
	const uint8_t *p;
	uint32_t left;
};

static bool cur_u32(struct opt_cursor *cur, uint32_t *v)
{
	if (cur->left < 4)
		return false;
	*v = nbd_get32(cur->p);
	cur->p += 4;
	cur->left -= 4;
	return true;
}

static bool cur_str(struct opt_cursor *cur, uint32_t len, const uint8_t **s)
{
	if (len > cur->left || len > NBD_MAX_STRING)
		return false;
	*s = cur->p;
	cur->p += len;
	cur->left -= len;
	return true;
}

static int opt_reply(struct nbd_conn *c, uint32_t opt, uint32_t type, const void *data,
		     uint32_t len)
{
	uint8_t h[sizeof(struct nbd_opt_reply)];
	int ret;

	nbd_put64(h, NBD_REP_MAGIC);
	nbd_put32(h + 8, opt);
	nbd_put32(h + 12, type);
	nbd_put32(h + 16, len);
	ret = nbd_conn_hbuf_append(c, h, sizeof(h));
	if (!ret && data && len) /* no data: the caller appends the payload */
		ret = nbd_conn_hbuf_append(c, data, len);
	nbd_conn_kick(c);
	return ret;
}

static int opt_error(struct nbd_conn *c, uint32_t opt, uint32_t type, const char *msg)
{
	log_debug("nbd: option %u refused: %s", opt, msg);
	return opt_reply(c, opt, type, msg, (uint32_t)strlen(msg));
}

int nbd_handshake_start(struct nbd_conn *c)
{
	uint8_t g[sizeof(struct nbd_hs_greeting)];

	nbd_put64(g, NBD_MAGIC);
	nbd_put64(g + 8, NBD_OPTS_MAGIC);
	nbd_put16(g + 16, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
	c->phase = NBD_PHASE_CLIENT_FLAGS;
	return nbd_conn_hbuf_append(c, g, sizeof(g));
}

static int enter_transmission(struct nbd_conn *c, struct nbd_export *e)
{
	int ret;

	/* The export's iothread(s): the connection moves there (nbd-conn.c). */
	c->move_to = nbd_export_pick_loop(e, c->loop);
	ret = nbd_conn_enter_transmission(c);

	if (ret < 0)
		return ret;
	c->exp = e; /* takes the caller's reference */
	c->tflags = nbd_export_tflags(e, c->structured || c->extended);
	/* Block status needs a context selected for this very export. */
	c->meta = c->meta_exp == e ? c->meta : 0;
	nbd_export_put(c->meta_exp);
	c->meta_exp = NULL;
	c->phase = NBD_PHASE_TRANSMISSION;
	if (loop_timer_armed(&c->timer))
		loop_timer_cancel(c->loop, &c->timer);
	log_debug("nbd: client uses export '%s' (%s replies)", e->name,
		  c->extended     ? "extended"
		  : c->structured ? "structured"
				  : "simple");
	return 0;
}

/* ---- NBD_OPT_EXPORT_NAME, LIST ----------------------------------------- */

static int opt_export_name(struct nbd_conn *c, const uint8_t *data, uint32_t len)
{
	uint8_t r[sizeof(struct nbd_export_name_reply)];
	struct nbd_export *e;

	/* No way to report an error here: the spec has us end the session. */
	if (c->extended || len > NBD_MAX_STRING)
		return -EPROTO;
	e = nbd_export_find(c->srv, (const char *)data, len);
	if (!e) {
		log_info("nbd: client asked for an unknown export (NBD_OPT_EXPORT_NAME)");
		return -ENOENT;
	}
	memset(r, 0, sizeof(r));
	if (enter_transmission(c, e) < 0) {
		nbd_export_put(e);
		return -ENOMEM;
	}
	nbd_put64(r, blk_size(nbd_export_node(e)));
	nbd_put16(r + 8, c->tflags);
	nbd_conn_kick(c);
	return nbd_conn_hbuf_append(c, r, c->no_zeroes ? 10 : sizeof(r));
}

static int opt_list(struct nbd_conn *c, uint32_t len)
{
	struct nbd_export *e;
	uint8_t n[4];
	int ret = 0;

	if (len)
		return opt_error(c, NBD_OPT_LIST, NBD_REP_ERR_INVALID,
				 "NBD_OPT_LIST takes no data");
	nbd_exports_lock(c->srv); /* the main thread may add or remove one */
	for (e = c->srv->exports; e && !ret; e = e->next) {
		uint32_t nl = (uint32_t)strlen(e->name);
		uint32_t dl = e->description ? (uint32_t)strlen(e->description) : 0;

		nbd_put32(n, nl);
		ret = opt_reply(c, NBD_OPT_LIST, NBD_REP_SERVER, NULL, 4 + nl + dl);
		if (!ret)
			ret = nbd_conn_hbuf_append(c, n, 4);
		if (!ret)
			ret = nbd_conn_hbuf_append(c, e->name, nl);
		if (!ret && dl)
			ret = nbd_conn_hbuf_append(c, e->description, dl);
	}
	nbd_exports_unlock(c->srv);
	return ret ? ret : opt_reply(c, NBD_OPT_LIST, NBD_REP_ACK, NULL, 0);
}

/* ---- NBD_OPT_INFO, GO --------------------------------------------------- */

static int info_reply(struct nbd_conn *c, uint32_t opt, uint16_t type, const void *data,
		      uint32_t len)
{
	uint8_t t[2];
	int ret;

	nbd_put16(t, type);
	ret = opt_reply(c, opt, NBD_REP_INFO, NULL, 2 + len);
	if (!ret)
		ret = nbd_conn_hbuf_append(c, t, 2);
	if (!ret && len)
		ret = nbd_conn_hbuf_append(c, data, len);
	return ret;
}

/* Size constraints: byte-granular (the block layer does read-modify-write
 * below its alignment), 4 KiB or the node's alignment preferred, and the
 * largest payload accepted (64 MiB, more than the 32 MiB every client may
 * assume). Sent only when asked for: these are the spec's defaults or
 * looser (minimum 1, maximum at least 2^25), so nothing obliges a server
 * to send them unasked, and a client that did not ask has not agreed to
 * honour anything we would send. */
static int info_block_size(struct nbd_conn *c, uint32_t opt, struct nbd_export *e)
{
	uint32_t pref = 4096;
	uint8_t b[12];

	while (pref < nbd_export_node(e)->align && pref < (1u << 16))
		pref <<= 1;
	nbd_put32(b, 1);
	nbd_put32(b + 4, pref);
	nbd_put32(b + 8, NBD_MAX_REQUEST);
	return info_reply(c, opt, NBD_INFO_BLOCK_SIZE, b, sizeof(b));
}

#define WANT_NAME (1u << 0)
#define WANT_DESC (1u << 1)
#define WANT_BS (1u << 2)

static int info_replies(struct nbd_conn *c, uint32_t opt, struct nbd_export *e, unsigned want)
{
	uint8_t x[10];
	int ret;

	nbd_put64(x, blk_size(nbd_export_node(e)));
	nbd_put16(x + 8, nbd_export_tflags(e, c->structured || c->extended));
	ret = info_reply(c, opt, NBD_INFO_EXPORT, x, sizeof(x));
	if (!ret && (want & WANT_NAME))
		ret = info_reply(c, opt, NBD_INFO_NAME, e->name, (uint32_t)strlen(e->name));
	if (!ret && (want & WANT_DESC) && e->description)
		ret = info_reply(c, opt, NBD_INFO_DESCRIPTION, e->description,
				 (uint32_t)strlen(e->description));
	if (!ret && (want & WANT_BS))
		ret = info_block_size(c, opt, e);
	return ret;
}

static int opt_info_go(struct nbd_conn *c, uint32_t opt, const uint8_t *data, uint32_t len)
{
	struct opt_cursor cur = {data, len};
	unsigned want = 0;
	const uint8_t *name;
	struct nbd_export *e;
	uint32_t namelen;
	uint16_t nreq, i;
	int ret;

	if (!cur_u32(&cur, &namelen) || !cur_str(&cur, namelen, &name) || cur.left < 2)
		return opt_error(c, opt, NBD_REP_ERR_INVALID, "malformed NBD_OPT_INFO/GO");
	nreq = nbd_get16(cur.p);
	if (cur.left != 2u + 2u * nreq)
		return opt_error(c, opt, NBD_REP_ERR_INVALID, "NBD_OPT_INFO/GO length mismatch");
	for (i = 0; i < nreq; i++) {
		uint16_t t = nbd_get16(cur.p + 2 + 2 * i);

		want |= t == NBD_INFO_NAME          ? WANT_NAME
			: t == NBD_INFO_DESCRIPTION ? WANT_DESC
			: t == NBD_INFO_BLOCK_SIZE  ? WANT_BS
						    : 0;
	}
	e = nbd_export_find(c->srv, (const char *)name, namelen);
	if (!e)
		return opt_error(c, opt, NBD_REP_ERR_UNKNOWN, "no such export");
	ret = info_replies(c, opt, e, want);
	if (!ret)
		ret = opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
	if (!ret && opt == NBD_OPT_GO && !(ret = enter_transmission(c, e)))
		return 0; /* the connection keeps the reference */
	nbd_export_put(e);
	return ret;
}

/* ---- meta contexts ------------------------------------------------------ */

static bool query_is(const uint8_t *q, uint32_t len, const char *s)
{
	return strlen(s) == len && !memcmp(q, s, len);
}

#define QEMU_BITMAP_PREFIX "qemu:dirty-bitmap:"

/* The contexts (NBD_META_*) one query names for export e (NULL: not
 * known). LIST also takes the namespaces "base:", "qemu:" and
 * "qemu:dirty-bitmap:" as every context under them; unknown namespaces and
 * leaves select nothing. */
static uint32_t meta_match(const struct nbd_export *e, const uint8_t *q, uint32_t len, bool set)
{
	size_t plen = strlen(QEMU_BITMAP_PREFIX);
	uint32_t m = 0, bitmaps = 0;

	if (query_is(q, len, NBD_META_BASE_ALLOCATION) || (!set && query_is(q, len, "base:")))
		return NBD_META_ALLOC;
	if (!e)
		return 0;
	for (unsigned i = 0; i < e->nbitmaps; i++) {
		const char *name = e->bitmaps[i]->name;

		bitmaps |= NBD_META_BITMAP(i);
		if (len == plen + strlen(name) && !memcmp(q, QEMU_BITMAP_PREFIX, plen) &&
		    !memcmp(q + plen, name, len - plen))
			m |= NBD_META_BITMAP(i);
	}
	if (e->alloc_depth && query_is(q, len, "qemu:allocation-depth"))
		m |= NBD_META_DEPTH;
	if (!set && query_is(q, len, QEMU_BITMAP_PREFIX))
		m |= bitmaps;
	if (!set && query_is(q, len, "qemu:"))
		m |= bitmaps | (e->alloc_depth ? NBD_META_DEPTH : 0);
	return m;
}

/* Every context of export e. */
static uint32_t meta_all(const struct nbd_export *e)
{
	return NBD_META_ALLOC | (e->alloc_depth ? NBD_META_DEPTH : 0) |
	       (NBD_META_BITMAP(e->nbitmaps) - NBD_META_BITMAP(0));
}

/* Parse NBD_OPT_{LIST,SET}_META_CONTEXT: the export (a reference) and the
 * contexts its queries name. Returns an NBD_REP_ERR_* or 0. */
static uint32_t meta_parse(struct nbd_conn *c, const uint8_t *data, uint32_t len, bool set,
			   struct nbd_export **exp, uint32_t *sel)
{
	struct opt_cursor cur = {data, len};
	const uint8_t *name, *q;
	uint32_t namelen, nq, qlen, i;

	*sel = 0;
	*exp = NULL;
	if (!cur_u32(&cur, &namelen) || !cur_str(&cur, namelen, &name) || !cur_u32(&cur, &nq))
		return NBD_REP_ERR_INVALID;
	/* Each query takes at least 4 bytes: bound the loop by the data. */
	if (nq > cur.left / 4)
		return NBD_REP_ERR_INVALID;
	*exp = nbd_export_find(c->srv, (const char *)name, namelen);
	for (i = 0; i < nq; i++) {
		if (!cur_u32(&cur, &qlen) || !cur_str(&cur, qlen, &q))
			return NBD_REP_ERR_INVALID;
		*sel |= meta_match(*exp, q, qlen, set);
	}
	if (cur.left)
		return NBD_REP_ERR_INVALID;
	if (!*exp)
		return NBD_REP_ERR_UNKNOWN;
	if (!set && nq == 0)
		*sel = meta_all(*exp);
	return 0;
}

/* One NBD_REP_META_CONTEXT for context bit i of export e. */
static int meta_reply(struct nbd_conn *c, uint32_t opt, const struct nbd_export *e, unsigned i,
		      bool set)
{
	uint8_t buf[4 + sizeof(QEMU_BITMAP_PREFIX) + 1024];
	int n;

	if (i == 0)
		n = snprintf((char *)buf + 4, sizeof(buf) - 4, "%s", NBD_META_BASE_ALLOCATION);
	else if (i == 1)
		n = snprintf((char *)buf + 4, sizeof(buf) - 4, "qemu:allocation-depth");
	else
		n = snprintf((char *)buf + 4, sizeof(buf) - 4, "%s%s", QEMU_BITMAP_PREFIX,
			     e->bitmaps[i - 2]->name);
	nbd_put32(buf, set ? i + 1 : 0);
	return opt_reply(c, opt, NBD_REP_META_CONTEXT, buf, 4 + (uint32_t)n);
}

static int opt_meta(struct nbd_conn *c, uint32_t opt, const uint8_t *data, uint32_t len)
{
	bool set = opt == NBD_OPT_SET_META_CONTEXT;
	struct nbd_export *e;
	uint32_t err, sel;
	int ret = 0;

	if (set) { /* replaces the selection even when it fails */
		c->meta = 0;
		nbd_export_put(c->meta_exp);
		c->meta_exp = NULL;
	}
	if (!c->structured && !c->extended)
		return opt_error(c, opt, NBD_REP_ERR_INVALID,
				 "negotiate structured replies or extended headers first");
	err = meta_parse(c, data, len, set, &e, &sel);
	if (err) {
		nbd_export_put(e);
		return opt_error(c, opt, err,
				 err == NBD_REP_ERR_UNKNOWN ? "no such export" : "malformed query");
	}
	for (unsigned i = 0; !ret && i < 32; i++)
		if (sel & (1u << i))
			ret = meta_reply(c, opt, e, i, set);
	if (set && sel && !ret) {
		c->meta = sel;
		c->meta_exp = e; /* keeps the reference */
		e = NULL;
	}
	nbd_export_put(e);
	return ret ? ret : opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
}

/* ---- dispatch ----------------------------------------------------------- */

static int opt_flag(struct nbd_conn *c, uint32_t opt, uint32_t len)
{
	if (len)
		return opt_error(c, opt, NBD_REP_ERR_INVALID, "option takes no data");
	if (opt == NBD_OPT_STRUCTURED_REPLY) {
		/* Extended headers take precedence; no downgrade. */
		if (c->extended)
			return opt_error(c, opt, NBD_REP_ERR_EXT_HEADER_REQD,
					 "extended headers already negotiated");
		c->structured = true;
	} else {
		c->extended = true;
	}
	return opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
}

/* STARTTLS: the spec's rules for a server with TLS. */
static int opt_starttls(struct nbd_conn *c, uint32_t len)
{
	int ret;

	if (!c->srv->tls_creds)
		return opt_error(c, NBD_OPT_STARTTLS, NBD_REP_ERR_UNSUP, "TLS is not supported");
	if (c->tls_on) /* "MUST respond with NBD_REP_ERR_INVALID" */
		return opt_error(c, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID,
				 "TLS already negotiated");
	if (len)
		return opt_error(c, NBD_OPT_STARTTLS, NBD_REP_ERR_INVALID,
				 "NBD_OPT_STARTTLS takes no data");
	/* The client waits for our reply before its TLS handshake: anything
	 * after the option would have to be plaintext, which nothing allows. */
	if (c->rend != c->rpos)
		return -EPROTO;
	ret = nbd_tls_start(c);
	if (ret < 0)
		return opt_error(c, NBD_OPT_STARTTLS, NBD_REP_ERR_POLICY, "TLS is not available");
	return opt_reply(c, NBD_OPT_STARTTLS, NBD_REP_ACK, NULL, 0);
}

/* FORCEDTLS: before TLS, only ABORT and STARTTLS; EXPORT_NAME cannot get an
 * error reply, so it ends the session; everything else gets TLS_REQD. */
static int tls_required(struct nbd_conn *c, uint32_t opt)
{
	if (opt == NBD_OPT_EXPORT_NAME) {
		log_warn("nbd: client %s asked for an export before TLS", c->peer);
		return -EACCES;
	}
	if (!c->tls_refused) /* once per connection: a client cannot flood the log */
		log_info("nbd: client %s sent option %u without TLS: TLS is required", c->peer,
			 opt);
	c->tls_refused = true;
	return opt_error(c, opt, NBD_REP_ERR_TLS_REQD, "TLS is required");
}

static int handle_option(struct nbd_conn *c, uint32_t opt, const uint8_t *data, uint32_t len)
{
	if (c->srv->tls_creds && !c->tls_on && opt != NBD_OPT_ABORT && opt != NBD_OPT_STARTTLS)
		return tls_required(c, opt);
	switch (opt) {
	case NBD_OPT_EXPORT_NAME:
		return opt_export_name(c, data, len);
	case NBD_OPT_ABORT:
		/* Soft disconnect: acknowledge, then close once it is sent. */
		c->state = NBD_CONN_DRAIN;
		return opt_reply(c, opt, NBD_REP_ACK, NULL, 0);
	case NBD_OPT_LIST:
		return opt_list(c, len);
	case NBD_OPT_INFO:
	case NBD_OPT_GO:
		return opt_info_go(c, opt, data, len);
	case NBD_OPT_STRUCTURED_REPLY:
	case NBD_OPT_EXTENDED_HEADERS:
		return opt_flag(c, opt, len);
	case NBD_OPT_LIST_META_CONTEXT:
	case NBD_OPT_SET_META_CONTEXT:
		return opt_meta(c, opt, data, len);
	case NBD_OPT_STARTTLS:
		return opt_starttls(c, len);
	default:
		return opt_error(c, opt, NBD_REP_ERR_UNSUP, "unknown option");
	}
}

static int client_flags(struct nbd_conn *c)
{
	uint32_t f = nbd_get32(c->rbuf + c->rpos);

	c->rpos += 4;
	/* Spec: the server MUST drop the connection on flags it did not offer.
	 * Fixed newstyle is honoured even without the client's bit (a MAY). */
	if (f & ~(uint32_t)(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES))
		return -EPROTO;
	c->no_zeroes = f & NBD_FLAG_C_NO_ZEROES;
	c->phase = NBD_PHASE_OPTIONS;
	return 0;
}

static int one_option(struct nbd_conn *c)
{
	const uint8_t *h = c->rbuf + c->rpos;
	uint32_t opt, len;

	if (nbd_get64(h) != NBD_OPTS_MAGIC)
		return -EPROTO;
	opt = nbd_get32(h + 8);
	len = nbd_get32(h + 12);
	if (len > NBD_MAX_OPT_DATA) {
		if (opt == NBD_OPT_EXPORT_NAME)
			return -EPROTO;
		c->rpos += sizeof(struct nbd_opt_hdr);
		c->skip = len;
		return opt_error(c, opt, NBD_REP_ERR_TOO_BIG, "option data too large");
	}
	if (c->rend - c->rpos < sizeof(struct nbd_opt_hdr) + len)
		return 1; /* wait for the rest */
	c->rpos += sizeof(struct nbd_opt_hdr) + len;
	return handle_option(c, opt, h + sizeof(struct nbd_opt_hdr), len);
}

int nbd_handshake_input(struct nbd_conn *c)
{
	int ret = 0;

	while (!ret && c->state == NBD_CONN_OPEN && c->phase != NBD_PHASE_TRANSMISSION &&
	       c->phase != NBD_PHASE_TLS) {
		if (!nbd_conn_skip_input(c))
			break;
		/* A client that sends options without reading the replies
		 * waits until they drain. */
		if (c->hlen - c->hoff >= NBD_HBUF_HIGH) {
			c->in_blocked = true;
			break;
		}
		if (c->phase == NBD_PHASE_CLIENT_FLAGS) {
			if (c->rend - c->rpos < 4)
				break;
			ret = client_flags(c);
			continue;
		}
		if (c->rend - c->rpos < sizeof(struct nbd_opt_hdr))
			break;
		ret = one_option(c);
	}
	return ret > 0 ? 0 : ret;
}
