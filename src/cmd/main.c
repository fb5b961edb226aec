/* The `ioplane` executable: dispatches to a subcommand (`ioplane bench ...`,
 * `ioplane img bench ...`) through tables so serve/img commands slot in.
 * Threading: main thread only. */
#include <stdio.h>
#include <string.h>

#include "block/block.h"
#include "cmd/cmd.h"
#include "ioplane-version.h" /* generated from meson.build's project version */
#include "util/clock.h"

/* Exit status for a command line we cannot dispatch, as qemu-img says it. */
#define EXIT_USAGE 1

struct cmd {
	const char *name;
	int (*run)(int argc, char **argv);
	const char *help;
};

/* `ioplane img <cmd>`: the image tool, qemu-img's commands and options. */
static const struct cmd img_cmds[] = {
	{ "create", cmd_img_create, "create a raw or qcow2 image" },
	{ "info", cmd_img_info, "show an image's format, size and properties" },
	{ "check", cmd_img_check, "check a qcow2 image's metadata (-r: repair)" },
	{ "map", cmd_img_map, "show where an image's data lives" },
	{ "convert", cmd_img_convert, "copy an image, possibly to another format" },
	{ "compare", cmd_img_compare, "compare the contents of two images" },
	{ "resize", cmd_img_resize, "change an image's virtual size" },
	{ "bitmap", cmd_img_bitmap, "add, remove, clear, enable, disable or merge qcow2 bitmaps" },
	{ "snapshot", cmd_img_snapshot, "list, create, apply or delete internal qcow2 snapshots" },
	{ "bench", cmd_bench, "run a block-layer benchmark (same as `ioplane bench`)" },
	{ NULL, NULL, NULL },
};

static int main_img(int argc, char **argv);

/* Top level: `ioplane <cmd>` (serve joins here). */
static const struct cmd top_cmds[] = {
	{ "bench", cmd_bench, "run a block-layer benchmark (qemu-img bench options)" },
	{ "serve", cmd_serve, "serve images over NBD and vhost-user-blk (the daemon)" },
	{ "qmp", cmd_qmp, "send one QMP command to a monitor and print the reply" },
	{ "img", main_img, "image tool: ioplane img <command> ..." },
	{ NULL, NULL, NULL },
};

static const struct cmd *cmd_find(const struct cmd *tab, const char *name)
{
	for (; tab->name; tab++) {
		if (!strcmp(tab->name, name))
			return tab;
	}
	return NULL;
}

static void cmd_list(FILE *f, const struct cmd *tab)
{
	for (; tab->name; tab++)
		fprintf(f, "  %-8s %s\n", tab->name, tab->help);
}

static void main_usage(FILE *f)
{
	fprintf(f, "Usage: ioplane <command> [options]\n"
		   "       ioplane --help | --version\n\nCommands:\n");
	cmd_list(f, top_cmds);
	fprintf(f, "\nImage commands (ioplane img <command>):\n");
	cmd_list(f, img_cmds);
	fprintf(f, "\nRun 'ioplane <command> --help' for a command's options.\n");
}

static int is_help(const char *arg)
{
	return !strcmp(arg, "--help") || !strcmp(arg, "-h") || !strcmp(arg, "help");
}

/* Run argv[1] from tab; prefix names the level for messages. */
static int cmd_dispatch(const struct cmd *tab, const char *prefix, int argc, char **argv)
{
	const struct cmd *c;

	if (argc < 2) {
		fprintf(stderr, "%s: missing command (try 'ioplane --help')\n", prefix);
		return EXIT_USAGE;
	}
	c = cmd_find(tab, argv[1]);
	if (!c) {
		fprintf(stderr, "%s: unknown command '%s' (try 'ioplane --help')\n", prefix,
			argv[1]);
		return EXIT_USAGE;
	}
	return c->run(argc - 1, argv + 1);
}

static int main_img(int argc, char **argv)
{
	if (argc >= 2 && is_help(argv[1])) {
		printf("Usage: ioplane img <command> [options]\n\nCommands:\n");
		cmd_list(stdout, img_cmds);
		printf("\nWithout -f, a file's format is probed as qemu-img probes it; formats\n"
		       "other than raw and qcow2 are refused, naming them. Images are locked as\n"
		       "qemu-img locks them: an image another process holds is refused, and -U\n"
		       "(--force-share) reads it anyway (commands that only read).\n");
		return 0;
	}
	return cmd_dispatch(img_cmds, "ioplane img", argc, argv);
}

int main(int argc, char **argv)
{
	if (argc >= 2 && is_help(argv[1])) {
		main_usage(stdout);
		return 0;
	}
	if (argc >= 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "-V"))) {
		printf("ioplane version %s\n", IOPLANE_VERSION);
		return 0;
	}
	if (argc >= 2 && argv[1][0] == '-') {
		fprintf(stderr, "ioplane: unknown option '%s' (try 'ioplane --help')\n", argv[1]);
		return EXIT_USAGE;
	}
	clock_init();
	blk_register_builtin_drivers();
	return cmd_dispatch(top_cmds, "ioplane", argc, argv);
}
