/* `ioplane serve --vhost-user-blk unix=PATH,image=ID[,num-queues=N]
 * [,writable=on][,logical-block-size=512|4096][,serial=TEXT][,mode=OCTAL]`:
 * option parsing and the life cycle of the vhost-user-blk exports, kept out
 * of serve.c, which calls these hooks.
 *
 * THREADING RULE: main thread only. */
#ifndef IOPLANE_SERVE_VHOST_H
#define IOPLANE_SERVE_VHOST_H

struct blk_node;
struct loop;
struct serve_vhost;

/* Parse and start every export (listening once this returns). Returns -1 on
 * success, else the exit status, like serve.c: 2 for a bad command line, 1
 * when a socket cannot be listened on (the message is --nbd's). */
int serve_vhost_start(char **args, unsigned n,
		      struct blk_node *(*find_image)(void *ctx, const char *id), void *ctx,
		      struct loop *main_loop, struct loop **loops, unsigned nloops,
		      struct serve_vhost **out);
/* Stop listening and drop the front-ends; done(opaque) runs once per export
 * whose stop finished, later, on the main loop. Returns how many will. */
unsigned serve_vhost_stop(struct serve_vhost *v, void (*done)(void *opaque), void *opaque);
unsigned serve_vhost_count(const struct serve_vhost *v);
void serve_vhost_free(struct serve_vhost *v);

#endif
