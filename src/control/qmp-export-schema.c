/* The QAPI types of the export commands, as qemu-storage-daemon 7.2 has
 * them (block-export.json, sockets.json), plus ioplane's members: iothreads
 * (a list: queues and connections spread over several) and serial.
 *
 * THREADING RULE: constant tables. */
#include "control/qmp-export-int.h"

static const struct qapi_type str_list = QAPI_LIST_TYPE(&qapi_str);

/* ---- SocketAddress, SocketAddressLegacy --------------------------------- */

static const struct qapi_type socket_type =
	QAPI_ENUM_TYPE("SocketAddressType", "inet", "unix", "vsock", "fd");
static const struct qapi_type inet_addr = QAPI_OBJECT_TYPE(
	"InetSocketAddress",
	QAPI_MEMBERS(QAPI_REQ("host", &qapi_str), QAPI_REQ("port", &qapi_str),
		     QAPI_OPT("numeric", &qapi_bool), QAPI_OPT("to", &qapi_uint16),
		     QAPI_OPT("ipv4", &qapi_bool), QAPI_OPT("ipv6", &qapi_bool),
		     QAPI_OPT("keep-alive", &qapi_bool), QAPI_OPT("mptcp", &qapi_bool)));
static const struct qapi_type unix_addr =
	QAPI_OBJECT_TYPE("UnixSocketAddress",
			 QAPI_MEMBERS(QAPI_REQ("path", &qapi_str), QAPI_OPT("abstract", &qapi_bool),
				      QAPI_OPT("tight", &qapi_bool)));
static const struct qapi_type vsock_addr =
	QAPI_OBJECT_TYPE("VsockSocketAddress",
			 QAPI_MEMBERS(QAPI_REQ("cid", &qapi_str), QAPI_REQ("port", &qapi_str)));
static const struct qapi_type fd_addr =
	QAPI_OBJECT_TYPE("String", QAPI_MEMBERS(QAPI_REQ("str", &qapi_str)));

const struct qapi_type qexp_socket_address = QAPI_UNION_TYPE(
	"SocketAddress", QAPI_MEMBERS(QAPI_REQ("type", &socket_type)), "type", {"inet", &inet_addr},
	{"unix", &unix_addr}, {"vsock", &vsock_addr}, {"fd", &fd_addr});

static const struct qapi_type inet_wrap =
	QAPI_OBJECT_TYPE("InetSocketAddressWrapper", QAPI_MEMBERS(QAPI_REQ("data", &inet_addr)));
static const struct qapi_type unix_wrap =
	QAPI_OBJECT_TYPE("UnixSocketAddressWrapper", QAPI_MEMBERS(QAPI_REQ("data", &unix_addr)));
static const struct qapi_type vsock_wrap =
	QAPI_OBJECT_TYPE("VsockSocketAddressWrapper", QAPI_MEMBERS(QAPI_REQ("data", &vsock_addr)));
static const struct qapi_type fd_wrap =
	QAPI_OBJECT_TYPE("StringWrapper", QAPI_MEMBERS(QAPI_REQ("data", &fd_addr)));
static const struct qapi_type legacy_type =
	QAPI_ENUM_TYPE("SocketAddressLegacyType", "inet", "unix", "vsock", "fd");
static const struct qapi_type socket_address_legacy = QAPI_UNION_TYPE(
	"SocketAddressLegacy", QAPI_MEMBERS(QAPI_REQ("type", &legacy_type)), "type",
	{"inet", &inet_wrap}, {"unix", &unix_wrap}, {"vsock", &vsock_wrap}, {"fd", &fd_wrap});

/* ---- nbd-server-start, --nbd-server ------------------------------------- */

const struct qapi_type qexp_nbd_server_start_args = QAPI_OBJECT_TYPE(
	"q_obj_nbd-server-start-arg",
	QAPI_MEMBERS(QAPI_REQ("addr", &socket_address_legacy), QAPI_OPT("tls-creds", &qapi_str),
		     QAPI_OPT("tls-authz", &qapi_str), QAPI_OPT("max-connections", &qapi_uint32)));
const struct qapi_type qmp_nbd_server_options = QAPI_OBJECT_TYPE(
	"NbdServerOptions",
	QAPI_MEMBERS(QAPI_REQ("addr", &qexp_socket_address), QAPI_OPT("tls-creds", &qapi_str),
		     QAPI_OPT("tls-authz", &qapi_str), QAPI_OPT("max-connections", &qapi_uint32)));

/* ---- block-export-add, --export ----------------------------------------- */

static const struct qapi_type export_type =
	QAPI_ENUM_TYPE("BlockExportType", "nbd", "vhost-user-blk", "vhost-user-scsi");
static const struct qapi_type export_nbd = QAPI_OBJECT_TYPE(
	"BlockExportOptionsNbd",
	QAPI_MEMBERS(QAPI_OPT("name", &qapi_str), QAPI_OPT("description", &qapi_str),
		     QAPI_OPT("bitmaps", &str_list), QAPI_OPT("allocation-depth", &qapi_bool)));
static const struct qapi_type export_vub = QAPI_OBJECT_TYPE(
	"BlockExportOptionsVhostUserBlk",
	QAPI_MEMBERS(QAPI_REQ("addr", &qexp_socket_address),
		     QAPI_OPT("logical-block-size", &qapi_size),
		     QAPI_OPT("num-queues", &qapi_uint16), QAPI_OPT("serial", &qapi_str)));
/* ioplane's: qsd has no vhost-user-scsi export. */
static const struct qapi_type scsi_lun =
	QAPI_OBJECT_TYPE("x-VhostUserScsiLun", QAPI_MEMBERS(QAPI_REQ("lun", &qapi_uint16),
							    QAPI_REQ("node-name", &qapi_str)));
static const struct qapi_type scsi_lun_list = QAPI_LIST_TYPE(&scsi_lun);
static const struct qapi_type export_vus = QAPI_OBJECT_TYPE(
	"x-BlockExportOptionsVhostUserScsi",
	QAPI_MEMBERS(QAPI_REQ("addr", &qexp_socket_address), QAPI_OPT("num-queues", &qapi_uint16),
		     QAPI_OPT("luns", &scsi_lun_list)));
const struct qapi_type qexp_lun_add_args =
	QAPI_OBJECT_TYPE("q_obj_x-vhost-user-scsi-lun-add-arg",
			 QAPI_MEMBERS(QAPI_REQ("id", &qapi_str), QAPI_REQ("lun", &qapi_uint16),
				      QAPI_REQ("node-name", &qapi_str)));
const struct qapi_type qexp_lun_remove_args =
	QAPI_OBJECT_TYPE("q_obj_x-vhost-user-scsi-lun-remove-arg",
			 QAPI_MEMBERS(QAPI_REQ("id", &qapi_str), QAPI_REQ("lun", &qapi_uint16)));
const struct qapi_type qmp_block_export_options = QAPI_UNION_TYPE(
	"BlockExportOptions",
	QAPI_MEMBERS(QAPI_REQ("type", &export_type), QAPI_REQ("id", &qapi_str),
		     QAPI_OPT("fixed-iothread", &qapi_bool), QAPI_OPT("iothread", &qapi_str),
		     QAPI_OPT("iothreads", &str_list), QAPI_REQ("node-name", &qapi_str),
		     QAPI_OPT("writable", &qapi_bool), QAPI_OPT("writethrough", &qapi_bool)),
	"type", {"nbd", &export_nbd}, {"vhost-user-blk", &export_vub},
	{"vhost-user-scsi", &export_vus});

static const struct qapi_type remove_mode = QAPI_ENUM_TYPE("BlockExportRemoveMode", "safe", "hard");
const struct qapi_type qexp_del_args =
	QAPI_OBJECT_TYPE("q_obj_block-export-del-arg",
			 QAPI_MEMBERS(QAPI_REQ("id", &qapi_str), QAPI_OPT("mode", &remove_mode)));

static const struct qapi_type export_info = QAPI_OBJECT_TYPE(
	"BlockExportInfo",
	QAPI_MEMBERS(QAPI_REQ("id", &qapi_str), QAPI_REQ("type", &export_type),
		     QAPI_REQ("node-name", &qapi_str), QAPI_REQ("shutting-down", &qapi_bool)));
const struct qapi_type qexp_info_list = QAPI_LIST_TYPE(&export_info);
static const struct qapi_type tls_layers =
	QAPI_OBJECT_TYPE("x-NbdTlsRecordLayers", QAPI_MEMBERS(QAPI_REQ("gnutls", &qapi_int),
							      QAPI_REQ("kernel", &qapi_int)));
const struct qapi_type qexp_nbd_server_info = QAPI_OBJECT_TYPE(
	"x-NbdServerInfo",
	QAPI_MEMBERS(QAPI_REQ("connections", &qapi_int), QAPI_OPT("tls-creds", &qapi_str),
		     QAPI_OPT("tls-authz", &qapi_str), QAPI_REQ("tls-record-layer", &tls_layers)));
const struct qapi_type qexp_deleted_data =
	QAPI_OBJECT_TYPE("q_obj_BLOCK_EXPORT_DELETED-arg", QAPI_MEMBERS(QAPI_REQ("id", &qapi_str)));
