/* vhost-user-scsi export: the virtio-scsi device on vhost-user-blk.c's
 * dataplane (the same queues, batching, polling and notification), plus
 * what only SCSI has: LUN hot-plug with transport reset events, and task
 * management functions that wait for the commands they name.
 *
 * THREADING RULE: main thread, except vus_tmf_wait and the timer and
 * message callbacks of a queue, which run on its iothread. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export/vhost-user-blk-int.h"
#include "block/graph.h"
#include "util/compiler.h"

#define VUS_RETRY_NS 1000000ull /* 1 ms: a wait for commands in flight */

static uint64_t fnv1a(const char *s)
{
	uint64_t h = 0xcbf29ce484222325ull;

	while (s && *s)
		h = (h ^ (uint8_t)*s++) * 0x100000001b3ull;
	return h;
}

int vus_init(struct vub_export *e, const struct vub_export_config *cfg, char *err, size_t errlen)
{
	int ret;

	e->scsi = calloc(1, sizeof(*e->scsi));
	if (!e->scsi || vscsi_dev_init(e->scsi, e->nqueues, cfg->blk.writable, cfg->write_cache)) {
		free(e->scsi);
		e->scsi = NULL;
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	/* Stable across restarts: the guest's by-id names stay. */
	e->scsi->naa_base = fnv1a(cfg->id ? cfg->id : cfg->path) << 8;
	e->nqueues += VSCSI_FIRST_REQ_Q;
	ret = vscsi_lun_add(e->scsi, 0, cfg->bs, blk_node_name(cfg->bs));
	if (ret < 0)
		snprintf(err, errlen, "Cannot export read-only node as writable");
	return ret;
}

static void vus_removal_cb(struct loop_timer *t);

void vus_free(struct vub_export *e)
{
	struct vub_lun_removal *r;

	if (!e->scsi)
		return;
	if (loop_timer_armed(&e->removal_timer))
		loop_timer_cancel(e->main_loop, &e->removal_timer);
	while ((r = e->removals)) { /* no command runs any more */
		e->removals = r->next;
		r->done(vscsi_lun_release(e->scsi, r->lun), r->opaque);
		free(r);
	}
	/* e->blk.bs's notifier is vhost-user-blk.c's. */
	for (unsigned i = 0; i < SCSI_MAX_LUNS; i++)
		if (e->scsi->luns[i].bs && e->scsi->luns[i].bs != e->blk.bs)
			blk_resize_notifier_del(e->scsi->luns[i].bs, vub_resized, e);
	vscsi_dev_destroy(e->scsi);
	free(e->scsi);
	e->scsi = NULL;
}

bool vub_export_is_scsi(const struct vub_export *e)
{
	return e->scsi != NULL;
}

struct blk_node *vub_export_lun_node(const struct vub_export *e, unsigned lun)
{
	if (!e->scsi || lun >= SCSI_MAX_LUNS || !atomic_load(&e->scsi->luns[lun].present))
		return NULL;
	return e->scsi->luns[lun].bs;
}

void vus_get_config(struct vub_export *e, uint8_t *buf, uint32_t off, uint32_t len)
{
	struct virtio_scsi_config c;

	vscsi_dev_config(e->scsi, &c);
	if (off >= sizeof(c))
		return;
	memcpy(buf, (uint8_t *)&c + off, len < sizeof(c) - off ? len : sizeof(c) - off);
}

/* ---- events ------------------------------------------------------------------------------ */

static void vus_events_cb(struct loop_msg *m)
{
	struct vub_queue *q = container_of(m, struct vub_queue, events_msg);

	atomic_store(&q->events_queued, false);
	/* A stopped queue keeps them for its next start. */
	if (q->handlers_on)
		vscsi_events_deliver(q->exp->scsi);
}

void vus_kick_events(struct vub_export *e)
{
	struct vub_queue *q = &e->queues[VSCSI_EVENT_Q];

	if (!atomic_exchange(&q->events_queued, true))
		loop_send(q->loop, &q->events_msg);
}

/* ---- task management ------------------------------------------------------------------- */

static void vus_tmf_cb(struct loop_timer *t)
{
	struct vub_queue *q = container_of(t, struct vub_queue, tmf_timer);
	struct vscsi_req **pp = &q->tmf_wait, *r;

	while ((r = *pp)) {
		if (vscsi_tmf_retry(r)) {
			*pp = r->next;
			vub_req_done(&r->v);
		} else {
			pp = &r->next;
		}
	}
	if (q->tmf_wait)
		loop_timer_arm(q->loop, &q->tmf_timer, loop_now_ns() + VUS_RETRY_NS);
}

void vus_tmf_wait(struct vub_queue *q, struct vscsi_req *r)
{
	r->next = q->tmf_wait;
	q->tmf_wait = r;
	if (!loop_timer_armed(&q->tmf_timer))
		loop_timer_arm(q->loop, &q->tmf_timer, loop_now_ns() + VUS_RETRY_NS);
}

void vus_queue_init(struct vub_queue *q)
{
	q->tmf_timer.cb = vus_tmf_cb;
	q->events_msg.cb = vus_events_cb;
}

/* ---- LUN hot-plug ---------------------------------------------------------------------- */

int vub_export_lun_add(struct vub_export *e, unsigned lun, struct blk_node *bs, char *err,
		       size_t errlen)
{
	int ret;

	if (!e->scsi) {
		snprintf(err, errlen, "export is not a vhost-user-scsi export");
		return -EINVAL;
	}
	for (unsigned i = 0; i < SCSI_MAX_LUNS; i++) {
		if (e->scsi->luns[i].bs == bs) {
			snprintf(err, errlen, "node '%s' is LUN %u already", blk_node_name(bs), i);
			return -EEXIST;
		}
	}
	/* e->blk.bs (LUN 0 at the start) has the export's notifier. */
	if (bs != e->blk.bs && blk_resize_notifier_add(bs, vub_resized, e) < 0) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ret = vscsi_lun_add(e->scsi, lun, bs, blk_node_name(bs));
	if (ret == -EINVAL)
		snprintf(err, errlen, "lun must be 0..%u", SCSI_MAX_LUNS - 1);
	else if (ret == -EEXIST)
		snprintf(err, errlen, "LUN %u is in use", lun);
	else if (ret == -EROFS)
		snprintf(err, errlen, "Cannot export read-only node as writable");
	if (ret < 0) {
		if (bs != e->blk.bs)
			blk_resize_notifier_del(bs, vub_resized, e);
		return ret;
	}
	/* A driver that attaches later scans when it starts. */
	if (e->conn) {
		vscsi_event_post(e->scsi, VIRTIO_SCSI_T_TRANSPORT_RESET, (uint16_t)lun,
				 VIRTIO_SCSI_EVT_RESET_RESCAN);
		vus_kick_events(e);
	}
	return 0;
}

static void vus_removal_cb(struct loop_timer *t)
{
	struct vub_export *e = container_of(t, struct vub_export, removal_timer);
	struct vub_lun_removal **pp = &e->removals, *r;

	while ((r = *pp)) {
		if (vscsi_lun_busy(e->scsi, r->lun)) {
			pp = &r->next;
			continue;
		}
		*pp = r->next;
		r->done(vscsi_lun_release(e->scsi, r->lun), r->opaque);
		free(r);
	}
	if (e->removals)
		loop_timer_arm(e->main_loop, &e->removal_timer, loop_now_ns() + VUS_RETRY_NS);
}

int vub_export_lun_remove(struct vub_export *e, unsigned lun,
			  void (*done)(struct blk_node *bs, void *opaque), void *opaque, char *err,
			  size_t errlen)
{
	struct vub_lun_removal *r;

	if (!e->scsi || lun >= SCSI_MAX_LUNS || !atomic_load(&e->scsi->luns[lun].present)) {
		snprintf(err, errlen, "no LUN %u", lun);
		return -ENOENT;
	}
	r = calloc(1, sizeof(*r));
	if (!r) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	vscsi_lun_remove(e->scsi, lun);
	if (e->scsi->luns[lun].bs != e->blk.bs) /* that one is the export's */
		blk_resize_notifier_del(e->scsi->luns[lun].bs, vub_resized, e);
	*r = (struct vub_lun_removal){e->removals, lun, done, opaque};
	e->removals = r;
	e->removal_timer.cb = vus_removal_cb;
	vus_removal_cb(&e->removal_timer); /* at once when idle */
	if (e->conn) {
		vscsi_event_post(e->scsi, VIRTIO_SCSI_T_TRANSPORT_RESET, (uint16_t)lun,
				 VIRTIO_SCSI_EVT_RESET_REMOVED);
		vus_kick_events(e);
	}
	return 0;
}
