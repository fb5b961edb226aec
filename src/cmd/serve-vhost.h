/* `ioplane serve --vhost-user-blk unix=PATH,image=ID[,id=ID][,num-queues=N]
 * [,writable=on][,logical-block-size=512|4096][,serial=TEXT][,mode=OCTAL]`:
 * option parsing and the life cycle of the vhost-user-blk exports, kept out
 * of serve.c, which calls these hooks.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_SERVE_VHOST_H
#define IOPLANE_SERVE_VHOST_H

struct blk_node;

/* Parse and start every export (listening once this returns). Returns -1 on
 * success, else the exit status, like serve.c: 2 for a bad command line, 1
 * when a socket cannot be listened on (the message is --nbd's). The exports
 * are qmp-export.c's from then on (qmp_exports_stop/free). */
int serve_vhost_start(char **args, unsigned n,
		      struct blk_node *(*find_image)(void *ctx, const char *id), void *ctx);

#endif
