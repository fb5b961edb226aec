/* qcow2 internal snapshots: the snapshot table is parsed and validated so
 * that images with snapshots open, show up in `img info` and are checked.
 * Their clusters have refcounts above one, and the write path copies them
 * first; snapshot-ops.c creates, applies and deletes them.
 *
 * Threading: open (main thread, in a coroutine); read-only afterwards. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "block/qcow2/qcow2-int.h"

#define QC_SNAP_EXTRA_MAX 1024

/* Buffered reader over the table: grows in 64 KiB steps up to the limit. */
struct qc_snap_rd {
	struct qc_state *s;
	uint8_t *buf;
	uint64_t have, limit;
};

static int qc_snap_need(struct qc_snap_rd *r, uint64_t end)
{
	uint64_t want;
	uint8_t *nb;
	int ret;

	if (end <= r->have)
		return 0;
	if (end > r->limit)
		return -EINVAL;
	want = qc_align_up(end, 65536);
	if (want > r->limit)
		want = r->limit;
	nb = realloc(r->buf, want);
	if (!nb)
		return -ENOMEM;
	r->buf = nb;
	ret = qc_co_pread_clamped(r->s->file, r->s->h.snapshots_offset + r->have, nb + r->have,
				  want - r->have);
	if (ret)
		return ret;
	r->have = want;
	return 0;
}

static char *qc_snap_str(const uint8_t *p, size_t n)
{
	char *s = malloc(n + 1);

	if (s) {
		memcpy(s, p, n);
		s[n] = 0;
	}
	return s;
}

static int qc_snap_one(struct qc_state *s, struct qc_snap_rd *r, uint64_t *pos,
		       struct qc_snapshot *sn, char *err, size_t errlen)
{
	uint64_t p = *pos, extra, idl, nml, end;
	const uint8_t *b;
	int ret = qc_snap_need(r, p + 40);

	if (ret)
		goto trunc;
	b = r->buf + p;
	sn->l1_offset = qc_rd64(b);
	sn->l1_size = qc_rd32(b + 8);
	idl = qc_rd16(b + 12);
	nml = qc_rd16(b + 14);
	sn->date_sec = qc_rd32(b + 16);
	sn->date_nsec = qc_rd32(b + 20);
	sn->vm_clock_nsec = qc_rd64(b + 24);
	sn->vm_state_size = qc_rd32(b + 32);
	extra = qc_rd32(b + 36);
	sn->icount = UINT64_MAX;
	if (extra > QC_SNAP_EXTRA_MAX || (s->h.version >= 3 && extra < 16)) {
		snprintf(err, errlen, "qcow2: snapshot has bad extra data size %llu",
			 (unsigned long long)extra);
		return -EINVAL;
	}
	end = qc_align_up(p + 40 + extra + idl + nml, 8);
	ret = qc_snap_need(r, end);
	if (ret)
		goto trunc;
	b = r->buf + p;
	if (extra >= 8)
		sn->vm_state_size = qc_rd64(b + 40);
	if (extra >= 16)
		sn->disk_size = qc_rd64(b + 48);
	if (extra >= 24)
		sn->icount = qc_rd64(b + 56);
	sn->id = qc_snap_str(b + 40 + extra, idl);
	sn->name = qc_snap_str(b + 40 + extra + idl, nml);
	if (!sn->id || !sn->name)
		return -ENOMEM;
	if (extra > 24) {
		sn->extra_more_len = (uint32_t)(extra - 24);
		sn->extra_more = malloc(sn->extra_more_len);
		if (!sn->extra_more)
			return -ENOMEM;
		memcpy(sn->extra_more, b + 64, sn->extra_more_len);
	}
	*pos = end;
	return 0;
trunc:
	if (ret == -EINVAL && r->limit == QC_MAX_SNAPSHOTS_BYTES)
		snprintf(err, errlen,
			 "qcow2: snapshot table (%u entries at 0x%llx) is larger than "
			 "%u bytes",
			 s->h.nb_snapshots, (unsigned long long)s->h.snapshots_offset,
			 QC_MAX_SNAPSHOTS_BYTES);
	else if (ret == -EINVAL)
		snprintf(err, errlen,
			 "qcow2: snapshot table (%u entries at 0x%llx) runs past the "
			 "end of the file",
			 s->h.nb_snapshots, (unsigned long long)s->h.snapshots_offset);
	return ret;
}

/* Once the whole table is known (it is one of the things to overlap). */
static int qc_snap_validate(struct qc_state *s, const struct qc_snapshot *sn, char *err,
			    size_t errlen)
{
	uint64_t bytes = (uint64_t)sn->l1_size * 8;
	char what[96], why[128];

	if (bytes > QC_MAX_L1_BYTES)
		snprintf(why, sizeof(why), "is too large (at most %u bytes)", QC_MAX_L1_BYTES);
	else if (sn->l1_offset & (s->cluster_size - 1))
		snprintf(why, sizeof(why), "is not cluster aligned");
	else if (bytes && (!sn->l1_offset || sn->l1_offset > (1ull << 56) ||
			   sn->l1_offset + bytes > qc_align_up(s->file->size, s->cluster_size)))
		snprintf(why, sizeof(why), "is outside the file");
	else if (bytes && qc_meta_overlap(s, QC_OL_FIXED, sn->l1_offset, bytes, what, sizeof(what)))
		snprintf(why, sizeof(why), "overlaps the %s", what);
	else
		return 0;
	snprintf(err, errlen, "qcow2: the L1 table of snapshot '%.64s' (0x%llx, %u entries) %s",
		 sn->id, (unsigned long long)sn->l1_offset, sn->l1_size, why);
	return -EINVAL;
}

int qc_snapshots_read(struct qc_state *s, char *err, size_t errlen)
{
	struct qc_snap_rd r = {.s = s};
	uint64_t pos = 0, fend = qc_align_up(s->file->size, s->cluster_size);
	uint32_t i;
	int ret = 0;

	if (!s->h.nb_snapshots)
		return 0;
	r.limit = fend - s->h.snapshots_offset;
	if (r.limit > QC_MAX_SNAPSHOTS_BYTES)
		r.limit = QC_MAX_SNAPSHOTS_BYTES;
	/* An entry takes at least 40 bytes: the count is bounded by the file
	 * before anything is allocated for it. */
	if ((uint64_t)s->h.nb_snapshots * 40 > r.limit) {
		snprintf(err, errlen, "qcow2: snapshot table (%u entries at 0x%llx) %s",
			 s->h.nb_snapshots, (unsigned long long)s->h.snapshots_offset,
			 r.limit == QC_MAX_SNAPSHOTS_BYTES ? "is too large"
							   : "runs past the end of the file");
		return -EINVAL;
	}
	s->snaps = calloc(s->h.nb_snapshots, sizeof(*s->snaps));
	if (!s->snaps)
		return -ENOMEM;
	for (i = 0; i < s->h.nb_snapshots && !ret; i++) {
		ret = qc_snap_one(s, &r, &pos, &s->snaps[i], err, errlen);
		s->nsnaps = i + 1;
	}
	free(r.buf);
	if (!ret &&
	    (qc_ranges_overlap(s->h.snapshots_offset, pos, s->l1_offset,
			       (uint64_t)s->l1_size * 8) ||
	     qc_ranges_overlap(s->h.snapshots_offset, pos, s->rct_offset, s->rct_size * 8))) {
		snprintf(err, errlen,
			 "qcow2: the snapshot table (0x%llx, %llu bytes) overlaps the "
			 "%s table",
			 (unsigned long long)s->h.snapshots_offset, (unsigned long long)pos,
			 qc_ranges_overlap(s->h.snapshots_offset, pos, s->l1_offset,
					   (uint64_t)s->l1_size * 8)
				 ? "L1"
				 : "refcount");
		ret = -EINVAL;
	}
	s->snap_offset = s->h.snapshots_offset;
	s->snap_bytes = pos;
	for (i = 0; i < s->nsnaps && !ret; i++)
		ret = qc_snap_validate(s, &s->snaps[i], err, errlen);
	return ret;
}

void qc_snapshots_free(struct qc_state *s)
{
	uint32_t i;

	for (i = 0; i < s->nsnaps; i++) {
		free(s->snaps[i].id);
		free(s->snaps[i].name);
		free(s->snaps[i].extra_more);
	}
	free(s->snaps);
	s->snaps = NULL;
	s->nsnaps = 0;
}
