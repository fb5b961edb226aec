/* Unit tests for the node graph: children with roles (file, backing,
 * data-file) and the walkers that must reach every one of them (close,
 * detach_loop, the shutdown flush, multi-conn, the failure path of open).
 * A test format driver "fan" opens two children of its own like qcow2 does.
 * Threading: one loop on the test thread. */
#include "blk-test-ram.h"
#include "block/graph.h"

/* Counted by the "cnt" protocol driver. */
static unsigned n_close, n_detach, n_flush;
static bool cnt_multi = true;

static int cnt_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	(void)opts;
	(void)err;
	(void)errlen;
	bs->size = 1 << 20;
	return 0;
}

static void cnt_close(struct blk_node *bs)
{
	(void)bs;
	n_close++;
}

static void cnt_detach(struct blk_node *bs, struct loop *loop)
{
	(void)bs;
	(void)loop;
	n_detach++;
}

static int cnt_submit(struct blk_node *bs, struct blk_request *req)
{
	(void)bs;
	n_flush += req->op == BLK_OP_FLUSH;
	blk_complete_deferred(req, 0);
	return 0;
}

static bool cnt_can_multi(struct blk_node *bs)
{
	(void)bs;
	return cnt_multi;
}

static const struct blk_driver cnt_driver = {
	.name = "cnt", .open = cnt_open, .close = cnt_close, .submit = cnt_submit,
	.detach_loop = cnt_detach, .can_multi_conn = cnt_can_multi,
};

/* "fan": a format on `file` that opens a read-only backing node and a
 * writable data-file node (both "cnt"); fan-fail=on fails after that. */
static int fan_child(struct blk_node *bs, const char *role, const char *spec)
{
	struct kv_opts o = { 0 };
	struct blk_node *c;
	char err[128];
	int ret;

	assert_int_equal(kv_parse(&o, spec, NULL), 0);
	ret = blk_open(&o, &c, err, sizeof(err));
	kv_free(&o);
	return ret ? ret : blk_add_child(bs, role, c);
}

static int fan_open(struct blk_node *bs, struct kv_opts *opts, char *err, size_t errlen)
{
	bool fail = false;
	int ret;

	kv_get_bool(opts, "fan-fail", &fail);
	bs->size = bs->next->size;
	ret = fan_child(bs, BLK_ROLE_BACKING, "driver=cnt,read-only=on");
	if (!ret)
		ret = fan_child(bs, BLK_ROLE_DATA_FILE, "driver=cnt");
	if (!ret && fail)
		ret = -EIO;
	if (ret)
		snprintf(err, errlen, "fan: failed");
	return ret;
}

static int fan_submit(struct blk_node *bs, struct blk_request *req)
{
	return blk_forward(bs, req);
}

static bool fan_can_multi(struct blk_node *bs)
{
	return blk_children_can_multi_conn(bs);
}

static const struct blk_driver fan_driver = {
	.name = "fan", .is_format = true, .open = fan_open, .submit = fan_submit,
	.can_multi_conn = fan_can_multi,
};

static int setup(void **state)
{
	static bool registered;

	if (!registered) {
		blk_register_builtin_drivers();
		assert_int_equal(blk_register_driver(&cnt_driver), 0);
		assert_int_equal(blk_register_driver(&fan_driver), 0);
		assert_int_equal(ram_register(), 0);
		registered = true;
	}
	ram_reset_config();
	n_close = n_detach = n_flush = 0;
	cnt_multi = true;
	*state = test_loop_new();
	return 0;
}

static int count_node(struct blk_node *bs, void *opaque)
{
	(void)bs;
	(*(unsigned *)opaque)++;
	return 0;
}

static void test_children(void **state)
{
	struct blk_node *bs = test_open("driver=cnt,format=fan");
	unsigned n = 0;

	(void)state;
	assert_int_equal(bs->nchildren, 3);
	assert_string_equal(bs->children[0].role, BLK_ROLE_FILE);
	assert_ptr_equal(bs->children[0].node, bs->next);
	assert_ptr_equal(blk_child(bs, BLK_ROLE_FILE), bs->next);
	assert_true(blk_child(bs, BLK_ROLE_BACKING)->read_only);
	assert_false(blk_child(bs, BLK_ROLE_DATA_FILE)->read_only);
	assert_null(blk_child(bs, "nonsense"));
	assert_int_equal(blk_walk(bs, count_node, &n), 0);
	assert_int_equal(n, 4);
	blk_close(bs);
	assert_int_equal(n_close, 3);
}

/* Every node's per-loop state goes, not only the file chain's. */
static void test_detach_reaches_every_child(void **state)
{
	struct blk_node *bs = test_open("driver=cnt,format=fan");

	blk_detach_loop(bs, *state);
	assert_int_equal(n_detach, 3);
	blk_close(bs);
}

/* The shutdown flush: the node, its file, its data file; not the read-only
 * backing node. */
static void test_flush_tree(void **state)
{
	struct blk_node *bs = test_open("driver=cnt,format=fan");

	(void)state;
	assert_int_equal(blk_flush_tree_sync(bs), 0);
	assert_int_equal(n_flush, 3);
	blk_close(bs);
}

/* Multi-conn needs every writable child: a data file that cannot says no. */
static void test_multi_conn(void **state)
{
	struct blk_node *bs = test_open("driver=cnt,format=fan");

	(void)state;
	assert_true(blk_can_multi_conn(bs));
	cnt_multi = false;
	assert_false(blk_can_multi_conn(bs));
	blk_close(bs);
}

/* A driver failing after it opened children: they are closed (the sanitizer
 * build would report a leak otherwise), and so is the file node. */
static void test_open_failure_closes_children(void **state)
{
	struct kv_opts o = { 0 };
	struct blk_node *bs = NULL;
	char err[128];

	(void)state;
	assert_int_equal(kv_parse(&o, "driver=cnt,format=fan,fan-fail=on", NULL), 0);
	assert_int_equal(blk_open(&o, &bs, err, sizeof(err)), -EIO);
	kv_free(&o);
	assert_null(bs);
	assert_int_equal(n_close, 3);
}

static void test_take_child(void **state)
{
	struct blk_node *bs = test_open("driver=cnt,format=fan"), *file, *back;

	(void)state;
	file = blk_take_child(bs, BLK_ROLE_FILE);
	assert_non_null(file);
	assert_null(bs->next);
	assert_int_equal(bs->nchildren, 2);
	back = blk_take_child(bs, BLK_ROLE_BACKING);
	assert_string_equal(bs->children[0].role, BLK_ROLE_DATA_FILE);
	assert_null(blk_take_child(bs, BLK_ROLE_BACKING));
	blk_close(bs); /* the data file only */
	assert_int_equal(n_close, 1);
	assert_int_equal(blk_add_child(back, BLK_ROLE_FILE, file), 0);
	assert_ptr_equal(back->next, file);
	blk_close(back);
	assert_int_equal(n_close, 3);
}

/* Every node has a generated node-name "#block" + digits, unique, found in
 * the registry; a given name replaces it; the registry forgets freed nodes. */
static void test_names(void **state)
{
	struct blk_node *bs = test_open("driver=cnt,format=fan"), *file = bs->next;
	char err[128], name[64];

	(void)state;
	assert_int_equal(strncmp(blk_node_name(bs), "#block", 6), 0);
	assert_true(strlen(blk_node_name(bs)) > 6);
	assert_string_not_equal(blk_node_name(bs), blk_node_name(file));
	assert_ptr_equal(blk_graph_find(blk_node_name(file)), file);
	assert_int_equal(blk_node_set_name(bs, "top0", err, sizeof(err)), 0);
	assert_ptr_equal(blk_graph_find("top0"), bs);
	assert_int_equal(blk_node_set_name(file, "top0", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "Duplicate nodes with node-name='top0'");
	assert_int_equal(blk_node_name_check("0bad", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "Invalid node-name: '0bad'");
	assert_int_equal(blk_node_name_check("#block1", err, sizeof(err)), -EINVAL);
	assert_int_equal(blk_node_name_check("a234567890123456789012345678901x", err, sizeof(err)),
			 -EINVAL);
	assert_string_equal(err, "Node name too long");
	assert_int_equal(blk_node_name_check("a.b-c_9", err, sizeof(err)), 0);
	snprintf(name, sizeof(name), "%s", blk_node_name(file));
	blk_close(bs);
	assert_null(blk_graph_find("top0"));
	assert_null(blk_graph_find(name));
	assert_null(blk_graph_next(NULL));
}

/* Users keep a node open past its opener's close; the last one closes it.
 * A child in use by its parent, and by an export, says so. */
static void test_refs(void **state)
{
	struct blk_node *bs = test_open("driver=cnt,format=fan"), *file = bs->next, *p[2];
	char why[128];

	(void)state;
	assert_false(blk_in_use(bs, why, sizeof(why)));
	assert_true(blk_in_use(file, why, sizeof(why)));
	blk_node_set_name(bs, "top0", why, sizeof(why));
	assert_true(blk_in_use(file, why, sizeof(why)));
	assert_string_equal(why, "used as 'file' of node 'top0'");
	assert_int_equal(blk_parents(file, p, 2), 1);
	assert_ptr_equal(p[0], bs);
	blk_ref(bs, "block export 'e0'");
	blk_ref(bs, "block export 'e0'");
	assert_int_equal(blk_user_count(bs), 2);
	assert_true(blk_in_use(bs, why, sizeof(why)));
	assert_string_equal(why, "used by block export 'e0'");
	blk_close(bs); /* the opener's reference */
	assert_int_equal(n_close, 0);
	blk_unref(bs, "block export 'e0'");
	assert_true(blk_in_use(bs, NULL, 0));
	blk_unref(bs, "block export 'e0'");
	assert_int_equal(n_close, 3);
	assert_null(blk_graph_next(NULL));
}

/* An iothread going away: every node of the registry lets go of it, those
 * of separate stacks and a child reached from two parents alike. */
static void test_graph_detach_loop(void **state)
{
	struct blk_node *a = test_open("driver=cnt,format=fan"), *b = test_open("driver=cnt");

	blk_graph_detach_loop(*state);
	assert_int_equal(n_detach, 4);
	blk_close(a);
	blk_close(b);
}

/* A child shared by reference: two parents; it closes with the last. */
static void test_shared_child(void **state)
{
	struct blk_node *a = test_open("driver=cnt,format=fan"), *file = a->next;
	struct blk_node *b = test_open("driver=cnt");

	(void)state;
	blk_ref(file, NULL); /* the reference b's new child link takes over */
	assert_int_equal(blk_add_child(b, BLK_ROLE_FILE, file), 0);
	assert_int_equal(blk_parent_count(file), 2);
	blk_close(a);
	assert_int_equal(n_close, 2); /* a's backing and data file */
	assert_int_equal(blk_parent_count(file), 1);
	blk_close(b);
	assert_int_equal(n_close, 4);
}

/* A node shared by two parents holds what both need, whichever parent
 * changes its permissions last, and what the other no longer needs goes
 * when one closes. */
static void test_shared_child_perms(void **state)
{
	struct blk_node *a = test_open("driver=cnt,format=raw"), *file = a->next, *b = NULL;
	const uint32_t rw = BLK_PERM_CONSISTENT_READ | BLK_PERM_WRITE;
	struct kv_opts o = {0};
	char err[256];

	(void)state;
	blk_ref(file, NULL);
	assert_int_equal(blk_open_node("raw", file, NULL, 0, &o, &b, err, sizeof(err)), 0);
	assert_int_equal(blk_set_perm(a, rw, BLK_PERM_ALL, err, sizeof(err)), 0);
	assert_int_equal(file->perm & rw, rw);
	assert_int_equal(blk_set_perm(b, BLK_PERM_CONSISTENT_READ, BLK_PERM_ALL & ~BLK_PERM_RESIZE,
				      err, sizeof(err)),
			 0);
	assert_int_equal(file->perm & rw, rw);
	assert_int_equal(file->shared & BLK_PERM_RESIZE, 0);
	blk_close(a);
	assert_int_equal(file->perm & BLK_PERM_WRITE, 0);
	assert_int_equal(file->perm & BLK_PERM_CONSISTENT_READ, BLK_PERM_CONSISTENT_READ);
	blk_close(b);
	kv_free(&o);
}

static unsigned n_resized;

static void on_resize(struct blk_node *bs, void *opaque)
{
	assert_ptr_equal(opaque, &n_resized);
	assert_int_equal(blk_size(bs), 2 << 20);
	n_resized++;
}

/* A resize of a node that cannot, then one that can: the notifier runs
 * only after the second, and not once removed. */
static void test_resize_notifier(void **state)
{
	struct blk_node *cnt = test_open("driver=cnt"), *ram = test_open("driver=ram,ram-size=1M");
	char err[128];

	(void)state;
	assert_int_equal(blk_resize_notifier_add(cnt, on_resize, &n_resized), 0);
	assert_int_equal(blk_resize(cnt, 2 << 20, err, sizeof(err)), -ENOTSUP);
	assert_string_equal(err, "Image format driver does not support resize");
	assert_int_equal(blk_resize_notifier_add(ram, on_resize, &n_resized), 0);
	n_resized = 0;
	assert_int_equal(blk_resize(ram, 2 << 20, err, sizeof(err)), 0);
	assert_int_equal(n_resized, 1);
	blk_resize_notifier_del(ram, on_resize, &n_resized);
	assert_int_equal(blk_resize(ram, 2 << 20, err, sizeof(err)), 0);
	assert_int_equal(n_resized, 1);
	blk_close(cnt);
	blk_close(ram);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_children, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_detach_reaches_every_child, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_flush_tree, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_multi_conn, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_open_failure_closes_children, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_take_child, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_names, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_refs, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_shared_child, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_graph_detach_loop, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_shared_child_perms, setup, ram_test_teardown),
		cmocka_unit_test_setup_teardown(test_resize_notifier, setup, ram_test_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
