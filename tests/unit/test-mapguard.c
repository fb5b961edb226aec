/* Unit tests of the SIGBUS guard: a guarded shared mapping whose file is
 * truncated under it reads as zeroes and raises its flag instead of killing
 * the process; SIGBUS elsewhere still kills. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "util/mapguard.h"

static uint8_t *map_memfd(int *fd, size_t len)
{
	void *p;

	*fd = memfd_create("mapguard-test", MFD_CLOEXEC);
	assert_true(*fd >= 0);
	assert_int_equal(ftruncate(*fd, (off_t)len), 0);
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
	assert_true(p != MAP_FAILED);
	memset(p, 0xab, len);
	return p;
}

static void test_truncated_reads_zero(void **state)
{
	size_t len = 4 * (size_t)getpagesize();
	atomic_int flag = 0, other = 0;
	volatile uint8_t *p;
	uint8_t *q;
	int fd, fd2, h, h2;

	(void)state;
	p = map_memfd(&fd, len);
	q = map_memfd(&fd2, len);
	h = mapguard_add((void *)p, len, &flag);
	h2 = mapguard_add(q, len, &other);
	assert_true(h > 0);
	assert_true(h2 > 0 && h2 != h);
	assert_int_equal(p[0], 0xab);
	assert_int_equal(ftruncate(fd, 0), 0); /* the other side shrinks it */
	assert_int_equal(p[len - 1], 0);       /* would be SIGBUS */
	assert_int_equal(atomic_load(&flag), 1);
	p[5] = 7; /* writes land in private zero pages */
	assert_int_equal(p[5], 7);
	/* The other range is untouched. */
	assert_int_equal(atomic_load(&other), 0);
	assert_int_equal(q[len - 1], 0xab);
	mapguard_del(h);
	mapguard_del(h2);
	munmap((void *)p, len);
	munmap(q, len);
	close(fd);
	close(fd2);
}

/* After mapguard_del the range is no longer guarded: the process dies of
 * SIGBUS as it would without the guard. Run in a fresh process (this file
 * re-executed), where SIGBUS has its default action and not cmocka's. */
static int child_unguarded(void)
{
	size_t len = (size_t)getpagesize();
	volatile uint8_t *p;
	atomic_int flag = 0;
	int fd, h;

	p = map_memfd(&fd, len);
	h = mapguard_add((void *)p, len, &flag);
	mapguard_del(h);
	if (ftruncate(fd, 0) < 0)
		return 3;
	return p[0] == 0 ? 5 : 6; /* must not get here */
}

static void test_unguarded_still_kills(void **state)
{
	int status;
	pid_t pid;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int null = open("/dev/null", O_WRONLY);

		if (null >= 0)
			dup2(null, 2); /* a sanitizer's report of the expected SIGBUS */
		execl("/proc/self/exe", "test-mapguard", "--child-unguarded", (char *)NULL);
		_exit(4);
	}
	assert_int_equal(waitpid(pid, &status, 0), pid);
	/* Killed by SIGBUS; under ASan its SIGBUS report aborts (abort_on_error)
	 * or exits with 1 instead. Never the exits of child_unguarded. */
	if (WIFSIGNALED(status))
		assert_true(WTERMSIG(status) == SIGBUS || WTERMSIG(status) == SIGABRT);
	else
		assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 1);
}

static void test_bad_args(void **state)
{
	atomic_int flag = 0;

	(void)state;
	assert_int_equal(mapguard_add(NULL, 4096, &flag), -EINVAL);
	assert_int_equal(mapguard_add((void *)4096, 0, &flag), -EINVAL);
	mapguard_del(0);
	mapguard_del(-3);
	mapguard_del(MAPGUARD_SLOTS + 1);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_truncated_reads_zero),
		cmocka_unit_test(test_unguarded_still_kills),
		cmocka_unit_test(test_bad_args),
	};

	if (argc == 2 && !strcmp(argv[1], "--child-unguarded"))
		return child_unguarded();
	return cmocka_run_group_tests(tests, NULL, NULL);
}
