/* Private to qmp-export*.c: the schema tables, the export list's entries
 * and the vhost-user-scsi LUN commands (qmp-export-scsi.c).
 *
 * THREADING RULE: constant tables; the rest is main-thread only. */
#ifndef IOPLANE_CONTROL_QMP_EXPORT_INT_H
#define IOPLANE_CONTROL_QMP_EXPORT_INT_H

#include "control/qmp-export.h"
#include "control/schema.h"

#include <stdbool.h>

enum { QEXP_NBD, QEXP_VUB, QEXP_VUS };

struct qexp {
	struct qexp *next;
	char *id, *node;
	struct blk_node *bs; /* holds a reference as "block export 'ID'" */
	int type;
	bool shutting_down;
	struct nbd_server *srv; /* NBD: the server it is on */
	struct nbd_export *nexp;
	struct vub_export *vub;
	struct loop **held; /* iothreads it holds a use of */
	unsigned nheld;
	void (*stop_done)(void *opaque); /* daemon shutdown waits for it */
	void *stop_opaque;
	/* vhost-user-scsi: LUNs that hold their own reference to their node
	 * ("block export 'ID' LUN N"); the first LUN 0 uses bs's. */
	bool *lun_ref;
	bool writable;
};

extern struct qmp_export_env qexp_env;
struct qexp *qexp_find(const char *id);

/* qmp-export-scsi.c: luns=[...] of a new export; the references of its
 * LUNs before it is freed; the LUN commands. */
int qexp_scsi_luns(const json_t *args, struct qexp *x, char *err, size_t errlen);
void qexp_scsi_release(struct qexp *x);
int qexp_scsi_init(void);

extern const struct qapi_type qexp_socket_address, qexp_nbd_server_start_args, qexp_del_args,
	qexp_info_list, qexp_deleted_data, qexp_nbd_server_info, qexp_lun_add_args,
	qexp_lun_remove_args;

#endif
