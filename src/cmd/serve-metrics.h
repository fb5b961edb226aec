/* --metrics of `ioplane serve` (serve-metrics.c): where the Prometheus
 * endpoint listens. THREADING RULE: main thread only. */
#ifndef IOPLANE_CMD_SERVE_METRICS_H
#define IOPLANE_CMD_SERVE_METRICS_H

struct loop;
struct serve_metrics;

/* Parse one --metrics SPEC into *m (allocated; a second one is refused).
 * 0, or an exit status after printing the error. */
int serve_metrics_parse(struct serve_metrics **m, const char *arg);
/* Listen (or serve passed_fd, a listening socket from the service manager,
 * when >= 0) and serve on main_loop. -1 to go on, else an exit status. NULL
 * m: nothing to do. */
int serve_metrics_start(struct serve_metrics *m, struct loop *main_loop, int passed_fd);
/* The unix= path, or NULL. */
const char *serve_metrics_path(struct serve_metrics *m);
void serve_metrics_free(struct serve_metrics *m);

#endif
