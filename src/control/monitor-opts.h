/* A daemon's QMP monitors from its command line, in qemu-storage-daemon's
 * form and ioplane's shorthand:
 *   --chardev socket,id=ID,path=PATH,server=on[,wait=off]   (or fd=N)
 *   --monitor [chardev=]ID[,mode=control][,pretty=on|off][,id=NAME]
 *   --monitor unix=PATH[,mode=OCTAL][,user=U][,group=G][,pretty=on] (ioplane)
 *   --monitor fd=N[,pretty=on]                               (ioplane)
 * Options are checked as they are added; chardev references are resolved,
 * in any order, when the set starts.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_CONTROL_MONITOR_OPTS_H
#define IOPLANE_CONTROL_MONITOR_OPTS_H

#include <stddef.h>
#include <sys/types.h>

struct loop;
struct monitor_set;

struct monitor_set *monitor_set_new(void);
/* Check and keep one option (arg must outlive the set). 0, or -EINVAL
 * (-ENOMEM) with the message in err, worded as qsd words it where qsd has
 * the option. */
int monitor_set_add_chardev(struct monitor_set *ms, const char *arg, char *err, size_t errlen);
int monitor_set_add_monitor(struct monitor_set *ms, const char *arg, char *err, size_t errlen);
unsigned monitor_set_count(const struct monitor_set *ms);
/* Start every monitor. -EINVAL: a reference that does not resolve (a usage
 * error); another -errno: a socket that cannot be set up. err says which. */
int monitor_set_start(struct monitor_set *ms, struct loop *main_loop, char *err, size_t errlen);
/* Socket activation, before the set starts: a --chardev path= or --monitor
 * unix= takes the socket take(id, path) gives (-1: none) instead of
 * listening on the path itself. */
void monitor_set_take_passed(struct monitor_set *ms,
			     int (*take)(const char *name, const char *path));
void monitor_set_stop_listening(struct monitor_set *ms);
void monitor_set_free(struct monitor_set *ms);

/* What a socket qsd creates by path (a chardev, nbd-server-start's unix
 * address) gets under QEMU: 0777 less the umask. */
mode_t qmp_socket_mode(void);

#endif
