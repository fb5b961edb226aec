/* Unit tests for src/control/qmp-block.c: blockdev-add and blockdev-del on
 * null-co and raw nodes through a QMP connection that keeps its output in
 * memory, including what the functional test cannot reach without an
 * export: a node with a user that is not a parent (an export's reference),
 * resize notifiers, and the graph after a failure. Messages are qsd 7.2's.
 * Threading: single-threaded; a loop on the test thread. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "block/graph.h"
#include "control/qmp-block.h"
#include "control/qmp-cmds.h"
#include "control/qmp.h"
#include "loop/loop.h"

struct fake {
	struct qmp_conn s;
	char text[1 << 16];
	size_t len;
};

static void fake_output(struct qmp_conn *s)
{
	struct fake *f = s->opaque;
	size_t n = s->out_len - s->out_head;

	if (n > sizeof(f->text) - f->len - 1)
		n = sizeof(f->text) - f->len - 1;
	memcpy(f->text + f->len, s->out + s->out_head, n);
	f->len += n;
	f->text[f->len] = '\0';
	qmp_conn_wrote(s, s->out_len - s->out_head);
}

static void fake_resume(struct qmp_conn *s)
{
	(void)s;
}

static const struct qmp_conn_ops fake_ops = {.output = fake_output, .resume = fake_resume};

/* One command; its reply line (CRLF stripped). */
static const char *cmd(struct fake *f, const char *in)
{
	static char out[1 << 16];
	size_t n;

	f->len = 0;
	f->text[0] = '\0';
	n = qmp_conn_input(&f->s, (const uint8_t *)in, strlen(in));
	assert_int_equal(n, strlen(in));
	snprintf(out, sizeof(out), "%s", f->text);
	out[strcspn(out, "\r\n")] = '\0';
	return out;
}

#define OK "{\"return\": {}}"
#define ERR(text) "{\"error\": {\"class\": \"GenericError\", \"desc\": \"" text "\"}}"

static int setup(void **state)
{
	struct loop_opts o = {.backend = LOOP_BACKEND_AUTO, .poll_max_ns = 0};
	struct loop *loop;
	struct fake *f = calloc(1, sizeof(*f));

	assert_int_equal(loop_new(&o, &loop), 0);
	loop_bind_current(loop);
	assert_int_equal(qmp_register_builtin(), 0);
	assert_int_equal(qmp_block_register(), 0);
	qmp_conn_init(&f->s, &fake_ops, f, false);
	f->len = 0;
	cmd(f, "{\"execute\": \"qmp_capabilities\"}");
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fake *f = *state;
	struct loop *loop = loop_current();

	qmp_conn_destroy(&f->s);
	free(f);
	qmp_block_close_all();
	assert_null(blk_graph_next(NULL)); /* every node closed */
	loop_bind_current(NULL);
	loop_free(loop);
	return 0;
}

static void test_in_use_by_export(void **state)
{
	struct fake *f = *state;
	struct blk_node *bs;

	assert_string_equal(cmd(f, "{\"execute\": \"blockdev-add\", \"arguments\": "
				   "{\"driver\": \"null-co\", \"node-name\": \"n0\"}}"),
			    OK);
	bs = blk_graph_find("n0");
	assert_non_null(bs);
	assert_int_equal(blk_size(bs), 1 << 30); /* QEMU's default */
	blk_ref(bs, "block export 'e0'");
	assert_string_equal(cmd(f, "{\"execute\": \"blockdev-del\", \"arguments\": "
				   "{\"node-name\": \"n0\"}}"),
			    ERR("Node n0 is in use"));
	assert_ptr_equal(blk_graph_find("n0"), bs);
	blk_unref(bs, "block export 'e0'");
	assert_string_equal(cmd(f, "{\"execute\": \"blockdev-del\", \"arguments\": "
				   "{\"node-name\": \"n0\"}}"),
			    OK);
	assert_null(blk_graph_find("n0"));
}

/* A node the monitor deleted while an export still held it would be
 * freed under the export: the export's reference keeps it. */
static void test_export_outlives_nothing(void **state)
{
	struct fake *f = *state;
	struct blk_node *bs;

	cmd(f, "{\"execute\": \"blockdev-add\", \"arguments\": "
	       "{\"driver\": \"null-co\", \"node-name\": \"n0\", \"size\": 4096}}");
	bs = blk_graph_find("n0");
	blk_ref(bs, "block export 'e0'");
	qmp_block_close_all(); /* at exit: the export still holds it */
	assert_ptr_equal(blk_graph_find("n0"), bs);
	blk_unref(bs, "block export 'e0'");
	assert_null(blk_graph_find("n0"));
}

/* A failed blockdev-add leaves nothing open, also the inline children it
 * made and the references it took. */
static void test_failure_leaves_nothing(void **state)
{
	struct fake *f = *state;
	struct blk_node *n0;

	cmd(f, "{\"execute\": \"blockdev-add\", \"arguments\": "
	       "{\"driver\": \"null-co\", \"node-name\": \"n0\", \"size\": 4096}}");
	n0 = blk_graph_find("n0");
	/* the inline child takes the root's name: QEMU's message, nothing kept */
	assert_string_equal(cmd(f, "{\"execute\": \"blockdev-add\", \"arguments\": {\"driver\": "
				   "\"raw\", \"node-name\": \"r0\", \"file\": {\"driver\": "
				   "\"null-co\", \"node-name\": \"r0\"}}}"),
			    ERR("Duplicate nodes with node-name='r0'"));
	assert_null(blk_graph_next(n0));
	assert_ptr_equal(blk_graph_next(NULL), n0);
	/* a reference taken for a node that then fails is given back */
	assert_string_equal(cmd(f, "{\"execute\": \"blockdev-add\", \"arguments\": {\"driver\": "
				   "\"raw\", \"node-name\": \"r1\", \"file\": \"n0\", \"offset\": "
				   "8192}}"),
			    ERR("Offset (8192) cannot be greater than size of the containing file "
				"(4096)"));
	assert_false(blk_in_use(n0, NULL, 0));
	assert_string_equal(cmd(f, "{\"execute\": \"blockdev-del\", \"arguments\": "
				   "{\"node-name\": \"n0\"}}"),
			    OK);
}

static unsigned resized;

static void on_resize(struct blk_node *bs, void *opaque)
{
	(void)opaque;
	assert_int_equal(blk_size(bs), 8192);
	resized++;
}

/* block_resize of a raw node on a null node (which ioplane can resize,
 * unlike QEMU's null-co): the notifier runs after it grew; a raw window
 * with a size cannot grow, and then no notifier runs. */
static void test_resize(void **state)
{
	struct fake *f = *state;
	struct blk_node *r0, *w0;

	cmd(f, "{\"execute\": \"blockdev-add\", \"arguments\": {\"driver\": \"raw\", "
	       "\"node-name\": \"r0\", \"file\": {\"driver\": \"null-co\", \"size\": 4096}}}");
	cmd(f, "{\"execute\": \"blockdev-add\", \"arguments\": {\"driver\": \"raw\", "
	       "\"node-name\": \"w0\", \"size\": 512, \"file\": {\"driver\": \"null-co\", "
	       "\"size\": 4096}}}");
	r0 = blk_graph_find("r0");
	w0 = blk_graph_find("w0");
	assert_non_null(r0);
	assert_non_null(w0);
	assert_int_equal(blk_resize_notifier_add(r0, on_resize, NULL), 0);
	assert_int_equal(blk_resize_notifier_add(w0, on_resize, NULL), 0);
	resized = 0;
	assert_string_equal(cmd(f, "{\"execute\": \"block_resize\", \"arguments\": "
				   "{\"node-name\": \"r0\", \"size\": 8192}}"),
			    OK);
	assert_int_equal(resized, 1);
	assert_int_equal(blk_size(r0), 8192);
	assert_string_equal(cmd(f, "{\"execute\": \"block_resize\", \"arguments\": "
				   "{\"node-name\": \"w0\", \"size\": 8192}}"),
			    ERR("Cannot resize fixed-size raw disks"));
	assert_int_equal(resized, 1);
	assert_int_equal(blk_size(w0), 512);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_in_use_by_export, setup, teardown),
		cmocka_unit_test_setup_teardown(test_export_outlives_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_failure_leaves_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(test_resize, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
