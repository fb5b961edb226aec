/* Unit tests for src/control/monitor.c and monitor-opts.c: the --chardev and
 * --monitor options (qemu-storage-daemon 7.2's messages for its forms), and
 * real sockets on an event loop: several clients, a client that stops
 * reading, a socket passed in by fd, a live socket never taken over.
 * Threading: single-threaded (the test drives the loop). */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/compiler.h"
#include "control/monitor-opts.h"
#include "control/monitor.h"
#include "control/qmp-cmds.h"
#include "control/qmp.h"
#include "loop/loop.h"


struct opt_case {
	const char *arg, *msg;
};

/* Every case is refused by add with its message. */
static void expect_refused(struct monitor_set *ms,
			   int (*add)(struct monitor_set *, const char *, char *, size_t),
			   const struct opt_case *cases, size_t n)
{
	char err[256];
	size_t i;

	for (i = 0; i < n; i++) {
		err[0] = '\0';
		assert_int_equal(add(ms, cases[i].arg, err, sizeof(err)), -EINVAL);
		if (strcmp(err, cases[i].msg))
			fail_msg("%s: got '%s', want '%s'", cases[i].arg, err, cases[i].msg);
	}
}

static void test_chardev_opts(void **state)
{
	static const struct opt_case cases[] = {
		{ "socket,path=/x,server=on,wait=off", "chardev: no id specified" },
		{ "bogus,id=m", "'bogus' is not a valid char driver name" },
		{ "socket,id=m,path=/x,server=on,wait=off,foo=bar", "Invalid parameter 'foo'" },
		{ "socket,id=m,path=/x,server=maybe", "Parameter 'server' expects 'on' or 'off'" },
		{ "socket,id=m,fd=abc", "Unable to parse FD number abc" },
		{ "socket,id=1m,path=/x,server=on", "Parameter 'id' expects an identifier" },
		{ "id=m,path=/x,server=on", "chardev: \"m\" missing backend" },
		{ "stdio,id=m", "chardev 'm': ioplane has only the socket backend, not 'stdio'" },
		{ "socket,id=m,host=127.0.0.1,port=4444,server=on",
		  "chardev 'm': 'host' is not supported by ioplane (unix sockets by path, and passed "
		  "fds, are)" },
		{ "socket,id=m,path=/x", "chardev 'm': ioplane listens (server=on); it does not "
					 "connect to a socket" },
		{ "socket,id=m,server=on", "chardev 'm': socket needs one of path= and fd=" },
		{ "socket,id=m,path=/x\xff,server=on", "Parameter 'path' is not valid UTF-8" },
		{ "sock\xc3,id=m", "Parameter 'backend' is not valid UTF-8" },
	};
	struct monitor_set *ms = monitor_set_new();
	char err[256];

	(void)state;
	expect_refused(ms, monitor_set_add_chardev, cases, ARRAY_SIZE(cases));
	/* QemuOpts' short forms still work (with a warning), and the last value wins. */
	assert_int_equal(monitor_set_add_chardev(ms, "socket,id=m,path=/x,server,nowait,wait=on",
						 err, sizeof(err)), 0);
	assert_int_equal(monitor_set_add_chardev(ms, "socket,id=m,fd=3", err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "Duplicate ID 'm' for chardev");
	monitor_set_free(ms);
}

static void test_monitor_opts(void **state)
{
	static const struct opt_case cases[] = {
		{ "m,mode=readline", "Only QMP is supported" },
		{ "m,mode=bogus", "Parameter 'mode' does not accept value 'bogus'" },
		{ "m,bogus=1", "Parameter 'bogus' is unexpected" },
		{ "m,pretty=maybe", "Parameter 'pretty' expects 'on' or 'off'" },
		{ "m,pretty", "Expected '=' after parameter 'pretty'" },
		{ "chardev.a=m", "Parameters 'chardev.*' are unexpected" },
		{ "m,x.y=1", "Parameter 'x' is unexpected" },
		{ "{\"chardev\":\"m\", \"pretty\": \"on\"}",
		  "Invalid parameter type for 'pretty', expected: boolean" },
		{ "pretty=on", "Parameter 'chardev' is missing" },
		{ "unix=/x,mode=rw", "mode must be octal permissions like 0600, not 'rw'" },
		{ "unix=/x,chardev=m", "give one of chardev=, unix= and fd=" },
		{ "fd=-1", "Unable to parse FD number -1" },
	};
	struct monitor_set *ms = monitor_set_new();
	char err[256];

	(void)state;
	expect_refused(ms, monitor_set_add_monitor, cases, ARRAY_SIZE(cases));
	assert_int_equal(monitor_set_count(ms), 0);
	assert_int_equal(monitor_set_add_monitor(ms, "m,mode=control,pretty=on", err, sizeof(err)), 0);
	assert_int_equal(monitor_set_add_monitor(ms, "{\"chardev\":\"n\"}", err, sizeof(err)), 0);
	assert_int_equal(monitor_set_count(ms), 2);
	monitor_set_free(ms);
}

/* ---- real sockets ----------------------------------------------------------- */

static struct loop *loop;
static char dir[64], path[96];

static int sock_setup(void **state)
{
	(void)state;
	assert_int_equal(qmp_register_builtin(), 0);
	assert_int_equal(loop_new(NULL, &loop), 0);
	loop_bind_current(loop);
	snprintf(dir, sizeof(dir), "/tmp/ioplane-test-monitor.XXXXXX");
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/qmp.sock", dir);
	return 0;
}

static int sock_teardown(void **state)
{
	(void)state;
	loop_free(loop);
	unlink(path);
	rmdir(dir);
	return 0;
}

static int connect_to(const char *p)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", p);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	return fd;
}

/* Run the loop until fd has a line ending in want (or 2000 rounds). */
static void expect_line(int fd, const char *want)
{
	static char buf[1 << 16];
	static size_t len;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char *nl;
	int i;
	ssize_t n;

	for (i = 0; i < 2000; i++) {
		nl = memchr(buf, '\n', len);
		if (nl) {
			*nl = '\0';
			if (!strstr(buf, want))
				fail_msg("got '%s', want '%s'", buf, want);
			len -= (size_t)(nl + 1 - buf);
			memmove(buf, nl + 1, len);
			return;
		}
		loop_run_once(loop, false);
		if (poll(&p, 1, 5) == 1) {
			n = recv(fd, buf + len, sizeof(buf) - len, MSG_DONTWAIT);
			if (n <= 0)
				fail_msg("connection closed waiting for '%s'", want);
			len += (size_t)n;
		}
	}
	fail_msg("no line with '%s'", want);
}

static void say(int fd, const char *msg)
{
	assert_int_equal(send(fd, msg, strlen(msg), MSG_NOSIGNAL), (ssize_t)strlen(msg));
}

static void run_rounds(int n)
{
	while (n--)
		loop_run_once(loop, false);
}

static void test_clients(void **state)
{
	struct monitor_config cfg = { .path = path, .mode = 0600, .fd = -1 };
	struct monitor *m, *m2;
	char err[256];
	struct stat st;
	int a, b;

	(void)state;
	assert_int_equal(monitor_start(loop, &cfg, &m, err, sizeof(err)), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	/* A live monitor's socket is never taken over. */
	assert_int_equal(monitor_start(loop, &cfg, &m2, err, sizeof(err)), -EADDRINUSE);
	a = connect_to(path);
	b = connect_to(path);
	expect_line(a, "{\"QMP\": {\"version\": ");
	expect_line(b, "{\"QMP\": {\"version\": ");
	say(a, "{\"execute\":\"qmp_capabilities\"}");
	expect_line(a, "{\"return\": {}}");
	say(b, "{\"execute\":\"query-version\",\"id\":7}");
	expect_line(b, "\"desc\": \"Expecting capabilities negotiation with 'qmp_capabilities'\"}, "
		       "\"id\": 7}");
	say(b, "{\"execute\":\"qmp_capabilities\"}{\"execute\":\"query-commands\"}");
	expect_line(b, "{\"return\": {}}");
	expect_line(b, "{\"name\": \"quit\"}");
	qmp_emit_shutdown("host-signal");
	expect_line(a, "\"event\": \"SHUTDOWN\"");
	expect_line(b, "\"event\": \"SHUTDOWN\"");
	assert_int_equal(monitor_client_count(m), 2);
	/* A client that goes away is forgotten; the other is not disturbed. */
	close(a);
	run_rounds(20);
	assert_int_equal(monitor_client_count(m), 1);
	say(b, "{\"execute\":\"query-version\"}");
	expect_line(b, "\"package\": \"ioplane ");
	/* A client that hangs up after its last command still gets it run. */
	say(b, "{\"execute\":\"query-version\"}");
	shutdown(b, SHUT_WR);
	expect_line(b, "\"package\": \"ioplane ");
	run_rounds(20);
	assert_int_equal(monitor_client_count(m), 0);
	close(b);
	monitor_free(m);
	assert_int_equal(stat(path, &st), -1); /* the socket file went with it */
}

static void test_slow_client(void **state)
{
	struct monitor_config cfg = { .path = path, .mode = 0600, .fd = -1 };
	struct monitor *m;
	char err[256];
	int a, b, rcv = 4096, i;

	(void)state;
	assert_int_equal(monitor_start(loop, &cfg, &m, err, sizeof(err)), 0);
	a = connect_to(path);
	b = connect_to(path);
	setsockopt(a, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof(rcv));
	say(a, "{\"execute\":\"qmp_capabilities\"}");
	say(b, "{\"execute\":\"qmp_capabilities\"}");
	expect_line(b, "{\"QMP\"");
	expect_line(b, "{\"return\": {}}");
	run_rounds(10);
	/* a reads nothing: events pile up until it is dropped; b reads along. */
	for (i = 0; i < 200000 && monitor_client_count(m) == 2; i++) {
		qmp_emit_shutdown("host-signal");
		if (i % 64 == 0) {
			char buf[65536];

			run_rounds(1);
			while (recv(b, buf, sizeof(buf), MSG_DONTWAIT) > 0)
				;
		}
	}
	run_rounds(10);
	assert_int_equal(monitor_client_count(m), 1);
	say(b, "{\"execute\":\"query-version\",\"id\":\"after\"}");
	for (i = 0; i < 100; i++) {
		char buf[65536];
		ssize_t n;

		run_rounds(1);
		n = recv(b, buf, sizeof(buf) - 1, MSG_DONTWAIT);
		if (n > 0) {
			buf[n] = '\0';
			if (strstr(buf, "\"id\": \"after\""))
				break;
		}
		usleep(1000);
	}
	assert_true(i < 100);
	close(a);
	close(b);
	monitor_free(m);
}

static void test_passed_fd(void **state)
{
	struct monitor_config cfg = { .fd = -1 };
	struct monitor *m;
	char err[256], want[256];
	int sv[2];

	(void)state;
	/* A connected socket from the parent is served as one client. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	cfg.fd = sv[1];
	assert_int_equal(monitor_start(loop, &cfg, &m, err, sizeof(err)), 0);
	expect_line(sv[0], "{\"QMP\"");
	say(sv[0], "{\"execute\":\"qmp_capabilities\"}");
	expect_line(sv[0], "{\"return\": {}}");
	monitor_free(m);
	close(sv[0]);
	/* Not a socket, or not a stream: refused, and left open. */
	assert_int_equal(pipe(sv), 0);
	cfg.fd = sv[0];
	assert_int_equal(monitor_start(loop, &cfg, &m, err, sizeof(err)), -ENOTSOCK);
	snprintf(want, sizeof(want), "File descriptor '%d' is not a stream socket", sv[0]);
	assert_string_equal(err, want);
	assert_true(fcntl(sv[0], F_GETFD) >= 0);
	close(sv[0]);
	close(sv[1]);
	assert_int_equal(socketpair(AF_UNIX, SOCK_DGRAM, 0, sv), 0);
	cfg.fd = sv[0];
	assert_int_equal(monitor_start(loop, &cfg, &m, err, sizeof(err)), -EPROTOTYPE);
	close(sv[0]);
	close(sv[1]);
	cfg.fd = 1000000;
	assert_int_equal(monitor_start(loop, &cfg, &m, err, sizeof(err)), -EBADF);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_chardev_opts),
		cmocka_unit_test(test_monitor_opts),
		cmocka_unit_test_setup_teardown(test_clients, sock_setup, sock_teardown),
		cmocka_unit_test_setup_teardown(test_slow_client, sock_setup, sock_teardown),
		cmocka_unit_test_setup_teardown(test_passed_fd, sock_setup, sock_teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
