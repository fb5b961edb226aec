/* Subcommands of the `ioplane` executable. Each takes the arguments that
 * follow its name (argv[0] is the subcommand name) and returns the process
 * exit status. Threading: main thread only; main() has already called
 * clock_init() and blk_register_builtin_drivers(). */
#ifndef IOPLANE_CMD_H
#define IOPLANE_CMD_H

int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_qmp(int argc, char **argv); /* qmp.c: a QMP client */

/* `ioplane img <cmd>` (img-*.c). */
int cmd_img_create(int argc, char **argv);
int cmd_img_info(int argc, char **argv);
int cmd_img_check(int argc, char **argv);
int cmd_img_map(int argc, char **argv);
int cmd_img_snapshot(int argc, char **argv);
int cmd_img_convert(int argc, char **argv);
int cmd_img_compare(int argc, char **argv);
int cmd_img_resize(int argc, char **argv);
int cmd_img_bitmap(int argc, char **argv);

#endif
