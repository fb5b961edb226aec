/* Unit tests for util/log.c: the line format, levels, truncation, and the
 * syslog priority prefix when stderr is the stream $JOURNAL_STREAM names
 * (and only then). Each case runs in a child process, since the log reads
 * its environment once; stderr goes to a temporary file the test reads.
 * Threading: one thread per process. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "util/log.h"

enum journal { J_NONE, J_STDERR, J_OTHER, J_BAD };

/* In a child with stderr on a temporary file (JOURNAL_STREAM as asked),
 * log one line per level with the level at debug; returns what was written. */
static char *log_in_child(enum journal j, char *out, size_t cap)
{
	char path[] = "/tmp/ioplane-test-log.XXXXXX";
	int fd = mkstemp(path), status;
	ssize_t n;
	pid_t pid;

	assert_true(fd >= 0);
	unlink(path);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct stat st;
		char v[64];

		dup2(fd, STDERR_FILENO);
		fstat(STDERR_FILENO, &st);
		unsetenv("IOPLANE_LOG_TIME");
		unsetenv("JOURNAL_STREAM");
		if (j == J_STDERR || j == J_OTHER)
			snprintf(v, sizeof(v), "%llu:%llu", (unsigned long long)st.st_dev,
				 (unsigned long long)st.st_ino + (j == J_OTHER));
		if (j == J_BAD)
			snprintf(v, sizeof(v), "%llu:%llux", (unsigned long long)st.st_dev,
				 (unsigned long long)st.st_ino);
		if (j != J_NONE)
			setenv("JOURNAL_STREAM", v, 1);
		log_set_level(LOG_DEBUG);
		log_err("e %d", 1);
		log_warn("w");
		log_info("i");
		log_debug("d");
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	n = pread(fd, out, cap - 1, 0);
	assert_true(n >= 0);
	out[n] = 0;
	close(fd);
	return out;
}

static void test_plain(void **state)
{
	char buf[512];

	(void)state;
	assert_string_equal(log_in_child(J_NONE, buf, sizeof(buf)),
			    "ioplane: error: e 1\nioplane: warning: w\nioplane: info: i\n"
			    "ioplane: debug: d\n");
}

static void test_journal(void **state)
{
	char buf[512];

	(void)state;
	assert_string_equal(log_in_child(J_STDERR, buf, sizeof(buf)),
			    "<3>ioplane: error: e 1\n<4>ioplane: warning: w\n<6>ioplane: info: i\n"
			    "<7>ioplane: debug: d\n");
}

/* Another stream (stderr redirected away from the journal), or a value that
 * is not DEV:INO: no prefix. */
static void test_not_journal(void **state)
{
	char buf[512];

	(void)state;
	assert_string_equal(log_in_child(J_OTHER, buf, sizeof(buf)),
			    "ioplane: error: e 1\nioplane: warning: w\nioplane: info: i\n"
			    "ioplane: debug: d\n");
	assert_non_null(strstr(log_in_child(J_BAD, buf, sizeof(buf)), "\nioplane: info: i\n"));
	assert_null(strchr(buf, '<'));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain),
		cmocka_unit_test(test_journal),
		cmocka_unit_test(test_not_journal),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
