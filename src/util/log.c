/* Logging to stderr: "ioplane: <level>: <message>\n", optionally preceded by a
 * CLOCK_MONOTONIC timestamp ($IOPLANE_LOG_TIME=1). When stderr is the
 * systemd journal ($JOURNAL_STREAM names its device and inode, as systemd
 * sets it for a service's stderr), each line starts with its syslog priority
 * ("<3>" error, "<4>" warning, "<6>" info, "<7>" debug; sd-daemon(3)) and
 * no timestamp, which the journal keeps itself. The level comes from
 * $IOPLANE_LOG (err|warn|info|debug) at first use unless log_set_level() ran
 * first. Threading: any thread; the level is an atomic, and each line is
 * formatted on the stack and written with one write(2) so that lines from
 * different threads never interleave. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "util/compiler.h"
#include "util/log.h"

#define LOG_LINE_MAX 1024

/* -1 until decided; then an enum log_level. Relaxed atomics are enough: the
 * level is a hint, and a racing first use decides the same value twice. */
static int log_level = -1;
static int log_with_time = -1;
static int log_to_journal = -1;
static char *log_path; /* --log-file; set once at start-up */

static const char *const log_names[] = {
	[LOG_ERR] = "error",
	[LOG_WARN] = "warning",
	[LOG_INFO] = "info",
	[LOG_DEBUG] = "debug",
};

static int log_level_from_env(bool *bad)
{
	static const struct {
		const char *name;
		enum log_level level;
	} names[] = {
		{"err", LOG_ERR},      {"error", LOG_ERR}, {"warn", LOG_WARN},
		{"warning", LOG_WARN}, {"info", LOG_INFO}, {"debug", LOG_DEBUG},
	};
	const char *s = getenv("IOPLANE_LOG");
	size_t i;

	*bad = false;
	if (!s || !*s)
		return LOG_INFO;
	for (i = 0; i < ARRAY_SIZE(names); i++)
		if (!strcasecmp(s, names[i].name))
			return names[i].level;
	*bad = true;
	return LOG_INFO;
}

enum log_level log_get_level(void)
{
	int l = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
	int expected = -1;
	bool bad;

	if (l >= 0)
		return (enum log_level)l;
	l = log_level_from_env(&bad);
	/* An explicit log_set_level() that raced with us wins. */
	if (!__atomic_compare_exchange_n(&log_level, &expected, l, false, __ATOMIC_RELAXED,
					 __ATOMIC_RELAXED))
		return (enum log_level)expected;
	if (bad)
		log_msg(LOG_WARN, "IOPLANE_LOG='%s' not understood (err|warn|info|debug)",
			getenv("IOPLANE_LOG"));
	return (enum log_level)l;
}

void log_set_level(enum log_level l)
{
	if (l > LOG_DEBUG)
		l = LOG_DEBUG;
	__atomic_store_n(&log_level, (int)l, __ATOMIC_RELAXED);
}

static bool log_timestamps(void)
{
	int t = __atomic_load_n(&log_with_time, __ATOMIC_RELAXED);
	const char *s;

	if (t < 0) {
		s = getenv("IOPLANE_LOG_TIME");
		t = s && *s && strcmp(s, "0") != 0;
		__atomic_store_n(&log_with_time, t, __ATOMIC_RELAXED);
	}
	return t;
}

/* Is stderr the stream $JOURNAL_STREAM ("DEV:INO") names? */
static bool log_journal(void)
{
	int j = __atomic_load_n(&log_to_journal, __ATOMIC_RELAXED);
	const char *s;
	unsigned long long dev, ino;
	struct stat st;
	char tail;

	if (j < 0) {
		s = getenv("JOURNAL_STREAM");
		j = s && sscanf(s, "%llu:%llu%c", &dev, &ino, &tail) == 2 &&
		    fstat(STDERR_FILENO, &st) == 0 && (unsigned long long)st.st_dev == dev &&
		    (unsigned long long)st.st_ino == ino;
		__atomic_store_n(&log_to_journal, j, __ATOMIC_RELAXED);
	}
	return j;
}

static size_t log_prefix(char *buf, size_t cap, enum log_level l)
{
	static const char priority[] = {
		[LOG_ERR] = '3', [LOG_WARN] = '4', [LOG_INFO] = '6', [LOG_DEBUG] = '7'};
	struct timespec ts;
	int n;

	if (log_journal()) {
		n = snprintf(buf, cap, "<%c>ioplane: %s: ", priority[l], log_names[l]);
	} else if (log_timestamps()) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		n = snprintf(buf, cap, "[%5lld.%06ld] ioplane: %s: ", (long long)ts.tv_sec,
			     ts.tv_nsec / 1000, log_names[l]);
	} else {
		n = snprintf(buf, cap, "ioplane: %s: ", log_names[l]);
	}
	return n < 0 ? 0 : (size_t)n;
}

static void log_write_all(const char *p, size_t len)
{
	ssize_t r;

	while (len > 0) {
		r = write(STDERR_FILENO, p, len);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return; /* nowhere to report a failure to log */
		p += r;
		len -= (size_t)r;
	}
}

void log_msg(enum log_level l, const char *fmt, ...)
{
	char buf[LOG_LINE_MAX];
	int saved_errno = errno; /* callers may log with %m */
	size_t n;
	va_list ap;
	int m;

	if (l > LOG_DEBUG)
		l = LOG_DEBUG;
	if ((int)l > (int)log_get_level())
		goto out;
	n = log_prefix(buf, sizeof(buf), l);
	errno = saved_errno;
	va_start(ap, fmt);
	m = vsnprintf(buf + n, sizeof(buf) - n, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	if ((size_t)m >= sizeof(buf) - n) {
		/* Truncated: mark it, keep room for the newline. */
		n = sizeof(buf) - 1;
		memcpy(buf + n - 3, "...", 3);
	} else {
		n += (size_t)m;
	}
	if (n == 0 || buf[n - 1] != '\n')
		buf[n++] = '\n';
	log_write_all(buf, n);
out:
	errno = saved_errno;
}

static int log_dup_file(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);

	if (fd < 0)
		return -errno;
	/* dup2 replaces stderr atomically: a line being written by another
	 * thread goes wholly to the old file or to the new one. */
	if (fd != STDERR_FILENO && dup2(fd, STDERR_FILENO) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	if (fd != STDERR_FILENO)
		close(fd);
	return 0;
}

int log_check_file(const char *path)
{
	int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);

	if (fd < 0)
		return -errno;
	close(fd);
	return 0;
}

int log_open_file(const char *path)
{
	int ret = log_dup_file(path);

	if (ret < 0)
		return ret;
	free(log_path);
	log_path = strdup(path);
	if (!log_path)
		return -ENOMEM;
	/* A file is not the journal, whatever $JOURNAL_STREAM said. */
	__atomic_store_n(&log_to_journal, 0, __ATOMIC_RELAXED);
	return 0;
}

int log_reopen(void)
{
	int ret;

	if (!log_path)
		return 0;
	ret = log_dup_file(log_path);
	return ret < 0 ? ret : 1;
}

void log_errors_end(struct log_errors *e, const char *who)
{
	if (e->n > LOG_ERRORS_FIRST)
		log_warn("%s: %llu I/O errors in all, the first %u logged", who,
			 (unsigned long long)e->n, LOG_ERRORS_FIRST);
	e->n = 0;
}
