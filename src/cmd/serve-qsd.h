/* qemu-storage-daemon's options for `ioplane serve`: --object, --nbd-server,
 * --export (and --blockdev), in qsd's keyval or JSON syntax. Each is
 * checked against its QAPI type as it is parsed, and built at start-up by
 * the very functions the QMP commands use (object-add, nbd-server-start,
 * block-export-add).
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_SERVE_QSD_H
#define IOPLANE_SERVE_QSD_H

struct serve_qsd;

/* One option: opt is "object", "nbd-server", "export" or "blockdev". -1 to
 * go on, else the exit status (2: bad command line). */
int serve_qsd_opt(struct serve_qsd **q, const char *opt, const char *arg);
/* How many of them serve something (--export, --nbd-server). */
unsigned serve_qsd_count(const struct serve_qsd *q);
/* --object: before the iothread pool starts. -1 or the exit status. */
int serve_qsd_objects(struct serve_qsd *q);
/* --nbd-server, then every --export in order (after qmp_export_init). */
int serve_qsd_start(struct serve_qsd *q);
void serve_qsd_free(struct serve_qsd *q);

#endif
