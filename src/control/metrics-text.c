/* The Prometheus text exposition (format 0.0.4) of the daemon's counters:
 * per node (node=, op=), per export (export=) and per iothread (iothread=).
 * Names follow Prometheus' conventions: ioplane_..._total counters, base
 * units (bytes, seconds), `_seconds` histograms from blk_stats' log2 bins.
 *
 * THREADING RULE: main thread only. The counters belong to the iothreads and
 * are read without locks (blk_get_stats, loop_get_stats), so a scrape never
 * stalls a request; a sum may be a few requests stale. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/block.h"
#include "block/graph.h"
#include "control/metrics.h"
#include "control/qmp-export.h"
#include "control/qmp-object.h"
#include "ioplane-version.h"
#include "loop/iothread.h"
#include "loop/loop.h"
#include "util/compiler.h"

/* Latency buckets reported: upper bounds 2^LE_FIRST .. 2^LE_LAST ns (about
 * 1 us to 17 s), then +Inf. Bin i of blk_op_stats.hist holds [2^i, 2^(i+1))
 * ns, so the bucket le=2^k ns is the sum of bins 0 .. k-1, exactly. */
#define LE_FIRST 10
#define LE_LAST 34
#define NODE_OPEN "{node=\""
#define VALUE_LEN 32 /* a sample value: 20 digits, a point, 9 decimals */

/* Room for more bytes than b->cap - b->len, or b->oom. */
static bool mbuf_grow(struct mbuf *b, size_t more)
{
	size_t cap = b->cap ? b->cap : 16384;
	char *p;

	while (cap - b->len <= more)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return false;
	}
	b->p = p;
	b->cap = cap;
	return true;
}

void mbuf_printf(struct mbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (int tries = 0; !b->oom && tries < 2; tries++) {
		size_t room = b->cap - b->len;

		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
		va_end(ap);
		if (n < 0)
			b->oom = true;
		else if ((size_t)n < room)
			b->len += (size_t)n;
		else if (mbuf_grow(b, (size_t)n))
			continue;
		return;
	}
}

void mbuf_put(struct mbuf *b, const void *p, size_t len)
{
	if (b->oom || !len || (b->cap - b->len <= len && !mbuf_grow(b, len)))
		return;
	memcpy(b->p + b->len, p, len);
	b->len += len;
}

static void mbuf_str(struct mbuf *b, const char *s)
{
	mbuf_put(b, s, strlen(s));
}

void mbuf_free(struct mbuf *b)
{
	free(b->p);
	*b = (struct mbuf){0};
}

/* A label value with \, " and newline escaped, as the format requires. */
static const char *esc(const char *s, char *buf, size_t len)
{
	size_t o = 0;

	for (; *s && o + 3 < len; s++) {
		if (*s == '\\' || *s == '"' || *s == '\n')
			buf[o++] = '\\';
		buf[o++] = *s == '\n' ? 'n' : *s;
	}
	buf[o] = 0;
	return buf;
}

static void family(struct mbuf *b, const char *name, const char *type, const char *help)
{
	mbuf_str(b, "# HELP ");
	mbuf_str(b, name);
	mbuf_put(b, " ", 1);
	mbuf_str(b, help);
	mbuf_str(b, "\n# TYPE ");
	mbuf_str(b, name);
	mbuf_put(b, " ", 1);
	mbuf_str(b, type);
	mbuf_put(b, "\n", 1);
}

/* ---- nodes --------------------------------------------------------------- */

struct node_snap {
	char name[256]; /* escaped for a label value */
	struct blk_stats st;
};

/* A per-operation counter: a uint64_t of struct blk_op_stats. */
static const struct op_counter {
	const char *name, *help;
	size_t off;
} op_counters[] = {
	{"ioplane_node_operations_total", "Requests completed by the node, failed ones included",
	 offsetof(struct blk_op_stats, ops)},
	{"ioplane_node_bytes_total", "Bytes of the requests that completed successfully",
	 offsetof(struct blk_op_stats, bytes)},
	{"ioplane_node_errors_total", "Requests that completed with an error",
	 offsetof(struct blk_op_stats, errors)},
};

/* A per-node value: a uint64_t of struct blk_stats; ns: nanoseconds, shown in seconds. */
static const struct node_value {
	const char *name, *type, *help;
	size_t off;
	bool ns;
} node_values[] = {
	{"ioplane_node_in_flight", "gauge", "Requests submitted to the node and not completed",
	 offsetof(struct blk_stats, in_flight), false},
	{"ioplane_node_throttle_waits_total", "counter",
	 "Requests a throttle node held back for its group's limits",
	 offsetof(struct blk_stats, throttle_waits), false},
	{"ioplane_node_throttle_wait_seconds_total", "counter",
	 "Time requests waited in a throttle node", offsetof(struct blk_stats, throttle_wait_ns),
	 true},
};

static uint64_t u64_at(const void *base, size_t off)
{
	uint64_t v;

	memcpy(&v, (const char *)base + off, sizeof(v));
	return v;
}

/* A sample's value: an integer, or nanoseconds as decimal seconds, exactly
 * (no float formatting: a counter past 2^53, or past 9 digits in %g, would
 * lose its low digits and seem to stand still). */
static const char *value(char buf[VALUE_LEN], uint64_t v, bool ns)
{
	char *p = buf + VALUE_LEN - 1;
	int digits = 0;

	*p = 0;
	do {
		*--p = (char)('0' + v % 10);
		v /= 10;
		if (ns && ++digits == 9)
			*--p = '.';
	} while (v || (ns && digits < 10));
	return p;
}

/* One sample: NAME{KEY="KVAL"[,op="OP"][,le="LE"]} VALUE, put together without
 * printf (nearly all of a scrape's lines); open is `{KEY="`, kval is escaped. */
static void sample(struct mbuf *b, const char *name, const char *open, const char *kval,
		   const char *op, const char *le, const char *val)
{
	mbuf_str(b, name);
	mbuf_str(b, open);
	mbuf_str(b, kval);
	if (op) {
		mbuf_str(b, "\",op=\"");
		mbuf_str(b, op);
	}
	if (le) {
		mbuf_str(b, "\",le=\"");
		mbuf_str(b, le);
	}
	mbuf_str(b, "\"} ");
	mbuf_str(b, val);
	mbuf_put(b, "\n", 1);
}

static void node_op_counters(struct mbuf *b, const struct node_snap *n, size_t nn)
{
	char val[VALUE_LEN];

	for (size_t c = 0; c < ARRAY_SIZE(op_counters); c++) {
		family(b, op_counters[c].name, "counter", op_counters[c].help);
		for (size_t i = 0; i < nn; i++)
			for (unsigned op = 0; op < BLK_OP__COUNT; op++)
				sample(b, op_counters[c].name, NODE_OPEN, n[i].name,
				       blk_op_name((enum blk_op)op), NULL,
				       value(val, u64_at(&n[i].st.op[op], op_counters[c].off),
					     false));
	}
}

static void node_value_families(struct mbuf *b, const struct node_snap *n, size_t nn)
{
	char val[VALUE_LEN];

	for (size_t c = 0; c < ARRAY_SIZE(node_values); c++) {
		const struct node_value *v = &node_values[c];

		family(b, v->name, v->type, v->help);
		for (size_t i = 0; i < nn; i++)
			sample(b, v->name, NODE_OPEN, n[i].name, NULL, NULL,
			       value(val, u64_at(&n[i].st, v->off), v->ns));
	}
}

/* The le= label of each bucket, 2^k ns in seconds: formatted once. */
static const char *bucket_le(unsigned k)
{
	static char le[LE_LAST + 1][24];

	if (!le[k][0])
		snprintf(le[k], sizeof(le[k]), "%.9g", (double)(1ull << k) / 1e9);
	return le[k];
}

static void histogram(struct mbuf *b, const char *node, const char *op,
		      const struct blk_op_stats *o)
{
	char val[VALUE_LEN];
	uint64_t cum = 0;
	unsigned bin = 0;

	for (unsigned k = LE_FIRST; k <= LE_LAST; k++) {
		while (bin < k)
			cum += o->hist[bin++];
		sample(b, "ioplane_node_latency_seconds_bucket", NODE_OPEN, node, op, bucket_le(k),
		       value(val, cum, false));
	}
	sample(b, "ioplane_node_latency_seconds_bucket", NODE_OPEN, node, op, "+Inf",
	       value(val, o->ops, false));
	sample(b, "ioplane_node_latency_seconds_sum", NODE_OPEN, node, op, NULL,
	       value(val, o->total_ns, true));
	sample(b, "ioplane_node_latency_seconds_count", NODE_OPEN, node, op, NULL,
	       value(val, o->ops, false));
}

static void node_histograms(struct mbuf *b, const struct node_snap *n, size_t nn)
{
	family(b, "ioplane_node_latency_seconds", "histogram",
	       "Time from submission to completion of the node's requests");
	for (size_t i = 0; i < nn; i++)
		for (unsigned op = 0; op < BLK_OP__COUNT; op++)
			histogram(b, n[i].name, blk_op_name((enum blk_op)op), &n[i].st.op[op]);
}

static void render_nodes(struct mbuf *b)
{
	struct node_snap *snap;
	struct blk_node *bs;
	size_t nn = 0, i = 0;

	for (bs = blk_graph_next(NULL); bs; bs = blk_graph_next(bs))
		nn++;
	snap = calloc(nn ? nn : 1, sizeof(*snap));
	if (!snap) {
		b->oom = true;
		return;
	}
	for (bs = blk_graph_next(NULL); bs && i < nn; bs = blk_graph_next(bs), i++) {
		esc(blk_node_name(bs), snap[i].name, sizeof(snap[i].name));
		blk_get_stats(bs, &snap[i].st);
	}
	node_op_counters(b, snap, i);
	node_value_families(b, snap, i);
	node_histograms(b, snap, i);
	free(snap);
}

/* ---- exports ------------------------------------------------------------- */

struct export_pass {
	struct mbuf *b;
	int what; /* 0 info, 1 clients, 2 queues */
};

static void export_line(void *ctx, const struct qmp_export_view *v)
{
	struct export_pass *p = ctx;
	char id[256], node[256];

	esc(v->id, id, sizeof(id));
	if (p->what == 0)
		mbuf_printf(p->b, "ioplane_export_info{export=\"%s\",type=\"%s\",node=\"%s\"} 1\n",
			    id, v->type, esc(v->node, node, sizeof(node)));
	else if (p->what == 1)
		mbuf_printf(p->b, "ioplane_export_clients{export=\"%s\",type=\"%s\"} %u\n", id,
			    v->type, v->clients);
	else if (v->queues)
		mbuf_printf(p->b, "ioplane_vhost_user_queues{export=\"%s\"} %u\n", id, v->queues);
}

static void render_exports(struct mbuf *b)
{
	struct export_pass p = {.b = b};

	family(b, "ioplane_export_info", "gauge",
	       "One per export: its type and the node it serves (join on node)");
	qmp_exports_foreach(export_line, &p);
	p.what = 1;
	family(b, "ioplane_export_clients", "gauge",
	       "NBD connections, or 1 while a vhost-user front-end is connected");
	qmp_exports_foreach(export_line, &p);
	p.what = 2;
	family(b, "ioplane_vhost_user_queues", "gauge", "Virtqueues of a vhost-user-blk export");
	qmp_exports_foreach(export_line, &p);
}

/* ---- iothreads ----------------------------------------------------------- */

static const struct loop_counter {
	const char *name, *type, *help;
	size_t off; /* in struct loop_stats; SIZE_MAX: the thread's CPU time */
	bool ns;
} loop_counters[] = {
	{"ioplane_iothread_rounds_total", "counter", "Dispatch rounds of the iothread's loop",
	 offsetof(struct loop_stats, rounds), false},
	{"ioplane_iothread_sleeps_total", "counter", "Times the loop went to sleep in the kernel",
	 offsetof(struct loop_stats, sleeps), false},
	{"ioplane_iothread_poll_hits_total", "counter", "Busy-polling phases that found work",
	 offsetof(struct loop_stats, poll_hits), false},
	{"ioplane_iothread_poll_misses_total", "counter",
	 "Busy-polling phases that found nothing and slept",
	 offsetof(struct loop_stats, poll_misses), false},
	{"ioplane_iothread_poll_seconds", "gauge", "The loop's current adaptive polling time",
	 offsetof(struct loop_stats, poll_ns), true},
	{"ioplane_iothread_busy_seconds_total", "counter",
	 "CPU time the iothread used (user and system, polling included)", SIZE_MAX, true},
};

struct loop_pass {
	struct mbuf *b;
	const struct loop_counter *c;
};

static void iothread_line(void *ctx, const char *id, struct iothread *t)
{
	struct loop_pass *p = ctx;
	struct loop_stats st;
	char lbl[256], val[VALUE_LEN];
	uint64_t v;

	if (p->c->off == SIZE_MAX) {
		v = iothread_cpu_ns(t);
	} else {
		loop_get_stats(iothread_loop(t), &st);
		v = u64_at(&st, p->c->off);
	}
	sample(p->b, p->c->name, "{iothread=\"", esc(id, lbl, sizeof(lbl)), NULL, NULL,
	       value(val, v, p->c->ns));
}

static void render_iothreads(struct mbuf *b)
{
	struct loop_pass p = {.b = b};

	for (size_t c = 0; c < ARRAY_SIZE(loop_counters); c++) {
		p.c = &loop_counters[c];
		family(b, p.c->name, p.c->type, p.c->help);
		qmp_iothreads_foreach(iothread_line, &p);
	}
}

void metrics_render(struct mbuf *b)
{
	family(b, "ioplane_build_info", "gauge", "The ioplane version serving these metrics");
	mbuf_printf(b, "ioplane_build_info{version=\"%s\"} 1\n", IOPLANE_VERSION);
	render_nodes(b);
	render_exports(b);
	render_iothreads(b);
}
