/* Private to qmp-export*.c: the schema tables.
 *
 * THREADING RULE: constant tables. */
#ifndef IOPLANE_CONTROL_QMP_EXPORT_INT_H
#define IOPLANE_CONTROL_QMP_EXPORT_INT_H

#include "control/qmp-export.h"
#include "control/schema.h"

extern const struct qapi_type qexp_socket_address, qexp_nbd_server_start_args, qexp_del_args,
	qexp_info_list, qexp_deleted_data, qexp_nbd_server_info;

#endif
