/* virtio-scsi requests (virtio 1.2 section 5.6.6) on the block layer. A
 * command chain is: readable header (LUN, tag, CDB of cdb_size bytes) and
 * data-out, then writable response (status, sense of sense_size bytes) and
 * data-in, wherever the driver put the descriptor boundaries. The CDB is
 * decoded by scsi.c; data stays in guest memory. The control queue answers
 * task management once the units it names have no command in flight; the
 * event queue keeps the driver's buffers until there is an event to report.
 *
 * THREADING RULE: see virtio-scsi.h. */
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "export/virtio-scsi.h"
#include "util/iov.h"

#define VSCSI_SEG_MAX (VBLK_SEG_MAX - 2)
#define VSCSI_MAX_SECTORS 16384 /* 8 MiB, scsi.c's transfer limit */

/* ---- device ---------------------------------------------------------------------------- */

int vscsi_dev_init(struct vscsi_dev *d, unsigned num_queues, bool writable, bool write_cache)
{
	memset(d, 0, sizeof(*d));
	d->num_queues = num_queues ? num_queues : 1;
	d->writable = writable;
	d->write_cache = write_cache;
	atomic_store(&d->cdb_size, VIRTIO_SCSI_CDB_DEFAULT);
	atomic_store(&d->sense_size, VIRTIO_SCSI_SENSE_DEFAULT);
	return -pthread_mutex_init(&d->ev_lock, NULL);
}

void vscsi_dev_destroy(struct vscsi_dev *d)
{
	pthread_mutex_destroy(&d->ev_lock);
}

uint64_t vscsi_dev_features(const struct vscsi_dev *d)
{
	(void)d;
	return 1ull << VIRTIO_F_VERSION_1 | 1ull << VIRTIO_RING_F_INDIRECT_DESC |
	       1ull << VIRTIO_RING_F_EVENT_IDX | 1ull << VIRTIO_SCSI_F_HOTPLUG |
	       1ull << VIRTIO_SCSI_F_CHANGE;
}

void vscsi_dev_config(const struct vscsi_dev *d, struct virtio_scsi_config *c)
{
	memset(c, 0, sizeof(*c));
	c->num_queues = htole32(d->num_queues);
	c->seg_max = htole32(VSCSI_SEG_MAX);
	c->max_sectors = htole32(VSCSI_MAX_SECTORS);
	c->cmd_per_lun = htole32(128);
	c->event_info_size = htole32(sizeof(struct virtio_scsi_event));
	c->sense_size = htole32(atomic_load_explicit(&d->sense_size, memory_order_relaxed));
	c->cdb_size = htole32(atomic_load_explicit(&d->cdb_size, memory_order_relaxed));
	c->max_target = 0;
	c->max_lun = htole32(SCSI_MAX_LUNS - 1);
}

/* The driver may set sense_size and cdb_size (both le32). */
int vscsi_dev_set_config(struct vscsi_dev *d, uint32_t off, const uint8_t *buf, uint32_t len)
{
	uint32_t v;

	if (len != 4 || (off != VSCSI_CONFIG_SENSE_OFF && off != VSCSI_CONFIG_CDB_OFF))
		return -EINVAL;
	memcpy(&v, buf, 4);
	v = le32toh(v);
	if (off == VSCSI_CONFIG_SENSE_OFF && v <= VSCSI_SENSE_MAX)
		atomic_store_explicit(&d->sense_size, v, memory_order_relaxed);
	else if (off == VSCSI_CONFIG_CDB_OFF && v >= 6 && v <= VSCSI_CDB_MAX)
		atomic_store_explicit(&d->cdb_size, v, memory_order_relaxed);
	else
		return -EINVAL;
	return 0;
}

/* ---- LUNs (main thread) ------------------------------------------------------------------ */

static uint64_t lun_blocks(const struct blk_node *bs, uint32_t bsz)
{
	return bs->size / bsz;
}

int vscsi_lun_add(struct vscsi_dev *d, unsigned lun, struct blk_node *bs, const char *serial)
{
	struct vscsi_lun *l;

	if (lun >= SCSI_MAX_LUNS)
		return -EINVAL;
	l = &d->luns[lun];
	/* bs is cleared only once a removal's commands are done. */
	if (atomic_load(&l->present) || l->bs)
		return -EEXIST;
	if (d->writable && bs->read_only)
		return -EROFS;
	memset(&l->lu, 0, sizeof(l->lu));
	snprintf(l->serial, sizeof(l->serial), "%s", serial ? serial : "");
	l->lu.block_size = 512;
	l->lu.blocks = lun_blocks(bs, 512);
	l->lu.read_only = !d->writable;
	l->lu.write_cache = d->write_cache;
	l->lu.discard = d->writable;
	l->lu.lun = (uint16_t)lun;
	l->lu.serial = l->serial;
	l->lu.naa = d->naa_base + lun;
	l->bs = bs;
	atomic_store(&l->present, true); /* seq_cst: after everything above */
	return 0;
}

int vscsi_lun_remove(struct vscsi_dev *d, unsigned lun)
{
	if (lun >= SCSI_MAX_LUNS || !atomic_load(&d->luns[lun].present))
		return -ENOENT;
	atomic_store(&d->luns[lun].present, false);
	return 0;
}

bool vscsi_lun_busy(struct vscsi_dev *d, unsigned lun)
{
	return atomic_load(&d->luns[lun].refs) != 0;
}

struct blk_node *vscsi_lun_release(struct vscsi_dev *d, unsigned lun)
{
	struct blk_node *bs = d->luns[lun].bs;

	d->luns[lun].bs = NULL;
	return bs;
}

void vscsi_lun_resized(struct vscsi_dev *d, struct blk_node *bs)
{
	for (unsigned i = 0; i < SCSI_MAX_LUNS; i++) {
		struct vscsi_lun *l = &d->luns[i];

		if (!atomic_load(&l->present) || l->bs != bs)
			continue;
		__atomic_store_n(&l->lu.blocks, lun_blocks(bs, l->lu.block_size), __ATOMIC_RELAXED);
		/* CAPACITY DATA HAS CHANGED: reason is ASCQ << 8 | ASC. */
		vscsi_event_post(d, VIRTIO_SCSI_T_PARAM_CHANGE, (uint16_t)i, 0x09 << 8 | 0x2a);
	}
}

void vscsi_lun_set_node(struct vscsi_dev *d, struct blk_node *from, struct blk_node *to)
{
	for (unsigned i = 0; i < SCSI_MAX_LUNS; i++)
		if (d->luns[i].bs == from)
			__atomic_store_n(&d->luns[i].bs, to, __ATOMIC_RELEASE);
}

/* ---- events (event queue thread; posting from any) ------------------------------------- */

void vscsi_event_post(struct vscsi_dev *d, uint32_t event, uint16_t lun, uint32_t reason)
{
	pthread_mutex_lock(&d->ev_lock);
	if (d->npending < VSCSI_EVENTS_PENDING)
		d->pending[d->npending++] = (struct vscsi_event){event, reason, lun};
	else
		d->missed = true; /* the driver rescans everything */
	pthread_mutex_unlock(&d->ev_lock);
}

static void event_fill(struct vscsi_req *r, uint32_t event, uint16_t lun, uint32_t reason)
{
	struct virtio_scsi_event ev = {.event = htole32(event), .reason = htole32(reason)};

	ev.lun[0] = 1;
	ev.lun[2] = (uint8_t)(0x40 | lun >> 8);
	ev.lun[3] = (uint8_t)lun;
	iov_from_buf(r->v.iov + r->v.nout, (int)r->v.nin, 0, &ev, sizeof(ev));
	r->v.used_len = sizeof(ev);
}

static struct vscsi_req *parked_take(struct vscsi_dev *d)
{
	struct vscsi_req *r = d->parked;

	if (r)
		d->parked = r->next;
	return r;
}

/* Take the oldest pending event; false if none. */
static bool event_take(struct vscsi_dev *d, struct vscsi_event *ev)
{
	bool got = true;

	pthread_mutex_lock(&d->ev_lock);
	if (d->npending) {
		*ev = d->pending[0];
		memmove(d->pending, d->pending + 1, --d->npending * sizeof(*ev));
	} else if (d->missed) {
		*ev = (struct vscsi_event){VIRTIO_SCSI_T_NO_EVENT | VIRTIO_SCSI_T_EVENTS_MISSED, 0,
					   0};
		d->missed = false;
	} else {
		got = false;
	}
	pthread_mutex_unlock(&d->ev_lock);
	return got;
}

void vscsi_events_deliver(struct vscsi_dev *d)
{
	struct vscsi_event ev;

	while (d->parked && event_take(d, &ev)) {
		struct vscsi_req *r = parked_take(d);

		event_fill(r, ev.event, ev.lun, ev.reason);
		r->v.done(&r->v);
	}
}

void vscsi_events_flush(struct vscsi_dev *d)
{
	struct vscsi_req *r;

	while ((r = parked_take(d))) {
		event_fill(r, VIRTIO_SCSI_T_NO_EVENT, 0, 0);
		r->v.done(&r->v);
	}
}

static enum vblk_submit_result event_park(struct vscsi_req *r)
{
	struct vscsi_dev *d = r->dev;
	struct vscsi_req **pp = &d->parked;

	if (r->v.in_len < sizeof(struct virtio_scsi_event))
		return VBLK_BROKEN;
	r->next = NULL;
	while (*pp) /* oldest first; a driver posts a handful */
		pp = &(*pp)->next;
	*pp = r;
	vscsi_events_deliver(d);
	return VBLK_SUBMITTED;
}

/* ---- control queue ----------------------------------------------------------------------- */

#define TMF_REQ_SIZE 24
#define AN_REQ_SIZE 16

/* The LUNs a task management function waits for: -1 all, -2 none. */
static bool tmf_busy(struct vscsi_dev *d, int lun)
{
	if (lun == -2)
		return false;
	if (lun >= 0)
		return atomic_load(&d->luns[lun].refs) != 0;
	for (unsigned i = 0; i < SCSI_MAX_LUNS; i++)
		if (atomic_load(&d->luns[i].refs))
			return true;
	return false;
}

static void ctrl_answer(struct vscsi_req *r, uint8_t response)
{
	iov_from_buf(r->v.iov + r->v.nout, (int)r->v.nin, 0, &response, 1);
	r->v.used_len = 1;
}

bool vscsi_tmf_retry(struct vscsi_req *r)
{
	int lun = r->tmf_kind == VIRTIO_SCSI_T_TMF_I_T_NEXUS_RESET ? -1 : r->tmf_lun;

	if (tmf_busy(r->dev, lun))
		return false;
	/* Every command it names has completed: the function is complete. */
	ctrl_answer(r, VIRTIO_SCSI_S_FUNCTION_COMPLETE);
	return true;
}

/* Commands are never cancelled half-way (the block layer finishes them):
 * aborts and resets complete once the commands they name are done. */
static enum vblk_submit_result do_tmf(struct vscsi_req *r, const uint8_t *req)
{
	uint32_t sub;
	int lun = vscsi_lun_decode(req + 8);

	memcpy(&sub, req + 4, 4);
	sub = le32toh(sub);
	if (lun < 0 && sub != VIRTIO_SCSI_T_TMF_I_T_NEXUS_RESET)
		return ctrl_answer(r, VIRTIO_SCSI_S_BAD_TARGET), VBLK_FINISHED;
	if (sub != VIRTIO_SCSI_T_TMF_I_T_NEXUS_RESET &&
	    (lun >= SCSI_MAX_LUNS || !atomic_load(&r->dev->luns[lun].present)))
		return ctrl_answer(r, VIRTIO_SCSI_S_INCORRECT_LUN), VBLK_FINISHED;
	switch (sub) {
	case VIRTIO_SCSI_T_TMF_QUERY_TASK:
	case VIRTIO_SCSI_T_TMF_QUERY_TASK_SET:
		ctrl_answer(r, tmf_busy(r->dev, lun) ? VIRTIO_SCSI_S_FUNCTION_SUCCEEDED
						     : VIRTIO_SCSI_S_FUNCTION_COMPLETE);
		return VBLK_FINISHED;
	case VIRTIO_SCSI_T_TMF_ABORT_TASK:
	case VIRTIO_SCSI_T_TMF_ABORT_TASK_SET:
	case VIRTIO_SCSI_T_TMF_CLEAR_TASK_SET:
	case VIRTIO_SCSI_T_TMF_LOGICAL_UNIT_RESET:
	case VIRTIO_SCSI_T_TMF_I_T_NEXUS_RESET:
		r->tmf_kind = (uint8_t)sub;
		r->tmf_lun = (uint16_t)(lun < 0 ? 0 : lun);
		return vscsi_tmf_retry(r) ? VBLK_FINISHED : VBLK_SUBMITTED;
	default: /* CLEAR ACA (no ACA here), unknown */
		ctrl_answer(r, VIRTIO_SCSI_S_FUNCTION_REJECTED);
		return VBLK_FINISHED;
	}
}

static enum vblk_submit_result do_ctrl(struct vscsi_req *r)
{
	uint8_t req[TMF_REQ_SIZE], an[5] = {0};
	uint32_t type;

	if (r->v.out_len < 4 || r->v.in_len < 1)
		return VBLK_BROKEN;
	iov_to_buf(r->v.iov, (int)r->v.nout, 0, req, sizeof(req));
	memcpy(&type, req, 4);
	type = le32toh(type);
	r->tmf_kind = 0xff;
	if (type == VIRTIO_SCSI_T_TMF) {
		if (r->v.out_len < TMF_REQ_SIZE)
			return VBLK_BROKEN;
		return do_tmf(r, req);
	}
	if (type == VIRTIO_SCSI_T_AN_QUERY || type == VIRTIO_SCSI_T_AN_SUBSCRIBE) {
		if (r->v.out_len < AN_REQ_SIZE || r->v.in_len < sizeof(an))
			return VBLK_BROKEN;
		/* No asynchronous notification classes: event_actual 0. */
		an[4] = vscsi_lun_decode(req + 4) < 0 ? VIRTIO_SCSI_S_BAD_TARGET : VIRTIO_SCSI_S_OK;
		iov_from_buf(r->v.iov + r->v.nout, (int)r->v.nin, 0, an, sizeof(an));
		r->v.used_len = sizeof(an);
		return VBLK_FINISHED;
	}
	ctrl_answer(r, VIRTIO_SCSI_S_FUNCTION_REJECTED);
	return VBLK_FINISHED;
}

enum vblk_submit_result vscsi_req_submit(struct vscsi_req *r, unsigned qidx)
{
	r->v.status = NULL;
	r->v.used_len = 0;
	r->v.error = 0;
	r->lun = NULL;
	if (qidx == VSCSI_CTRL_Q)
		return do_ctrl(r);
	if (qidx == VSCSI_EVENT_Q)
		return event_park(r);
	return vscsi_cmd_submit(r);
}
