/* --object, --blockdev, --nbd-server, --export for `ioplane serve` (see
 * serve-qsd.h): objects first, then block nodes, the NBD server and the
 * exports, each kind in command-line order.
 * Messages at start-up are those of the QMP command that builds the same
 * thing, prefixed with the option, as qsd prints them; the exit status is
 * then 1, as qsd's.
 *
 * THREADING RULE: main thread only. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/serve-qsd.h"
#include "control/qmp-block.h"
#include "control/qmp-export.h"
#include "control/qmp-object.h"
#include "control/schema.h"

#define EXIT_USAGE 2

struct serve_qsd {
	json_t *objects, *blockdevs, *exports; /* validated options, in command-line order */
	json_t *nbd_server;                    /* NULL: none */
};

static int qsd_fail(const char *opt, const char *arg, const char *err, int status)
{
	fprintf(stderr, "ioplane serve: --%s %s: %s\n", opt, arg, err);
	return status;
}

int serve_qsd_opt(struct serve_qsd **qp, const char *opt, const char *arg)
{
	const struct qapi_type *t = &qmp_object_options;
	const char *implied = "qom-type";
	struct serve_qsd *q = *qp;
	char err[512];
	json_t *o;

	if (!q && !(q = *qp = calloc(1, sizeof(*q))))
		return 1;
	if (!strcmp(opt, "blockdev")) {
		t = &qmp_blockdev_options;
		implied = "driver";
	} else if (!strcmp(opt, "export")) {
		t = &qmp_block_export_options;
		implied = "type";
	} else if (!strcmp(opt, "nbd-server")) {
		t = &qmp_nbd_server_options;
		implied = NULL;
		if (q->nbd_server)
			return qsd_fail(opt, arg, "NBD server already running", EXIT_USAGE);
	}
	o = qapi_parse_option(t, arg, implied, err, sizeof(err));
	if (!o)
		return qsd_fail(opt, arg, err, EXIT_USAGE);
	if (t == &qmp_nbd_server_options) {
		q->nbd_server = o;
		return -1;
	}
	if (t == &qmp_object_options)
		return json_array_append_new(q->objects ? q->objects : (q->objects = json_array()),
					     o)
			       ? 1
			       : -1;
	if (t == &qmp_blockdev_options)
		return json_array_append_new(
			       q->blockdevs ? q->blockdevs : (q->blockdevs = json_array()), o)
			       ? 1
			       : -1;
	return json_array_append_new(q->exports ? q->exports : (q->exports = json_array()), o) ? 1
											       : -1;
}

unsigned serve_qsd_count(const struct serve_qsd *q)
{
	return q ? (unsigned)json_array_size(q->exports) + (q->nbd_server != NULL) : 0;
}

int serve_qsd_objects(struct serve_qsd *q)
{
	char err[512];
	json_t *o;
	size_t i;

	if (!q)
		return -1;
	json_array_foreach (q->objects, i, o) {
		if (qmp_object_add(o, err, sizeof(err)) < 0)
			return qsd_fail("object", qapi_get_str(o, "id"), err, 1);
	}
	json_array_foreach (q->blockdevs, i, o) {
		const char *name = qapi_get_str(o, "node-name");

		if (qmp_blockdev_add(o, err, sizeof(err)) < 0)
			return qsd_fail("blockdev", name ? name : "", err, 1);
	}
	return -1;
}

int serve_qsd_start(struct serve_qsd *q)
{
	const struct qmp_export_extra cmdline = {.cmdline = true};
	char err[512];
	json_t *o;
	size_t i;

	if (!q)
		return -1;
	if (q->nbd_server && qmp_nbd_server_start(q->nbd_server, err, sizeof(err)) < 0)
		return qsd_fail("nbd-server", "", err, 1);
	json_array_foreach (q->exports, i, o) {
		if (qmp_export_add(o, &cmdline, err, sizeof(err)) < 0)
			return qsd_fail("export", qapi_get_str(o, "id"), err, 1);
	}
	return -1;
}

void serve_qsd_free(struct serve_qsd *q)
{
	if (!q)
		return;
	json_decref(q->objects);
	json_decref(q->blockdevs);
	json_decref(q->exports);
	json_decref(q->nbd_server);
	free(q);
}
