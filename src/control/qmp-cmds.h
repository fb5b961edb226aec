/* The built-in QMP commands and events (qmp-cmds.c, introspect.c).
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_QMP_CMDS_H
#define IOPLANE_CONTROL_QMP_CMDS_H

/* The QEMU release whose qemu-storage-daemon QMP ioplane speaks. */
#define QMP_QEMU_MAJOR 7
#define QMP_QEMU_MINOR 2
#define QMP_QEMU_MICRO 0

/* Register qmp_capabilities, query-version, query-commands,
 * query-qmp-schema, quit and the SHUTDOWN event (once; later calls do
 * nothing). 0 or -errno. */
int qmp_register_builtin(void);
int qmp_register_introspection(void);

/* What `quit` does after its reply (the daemon: start its SIGTERM shutdown).
 * Without one, quit only replies. */
void qmp_set_quit_handler(void (*fn)(void *opaque), void *opaque);

/* The SHUTDOWN event QEMU sends: {"guest": false, "reason": reason}, reason
 * one of ShutdownCause ("host-qmp-quit", "host-signal"). */
void qmp_emit_shutdown(const char *reason);

#endif
