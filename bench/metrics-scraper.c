/* The scraper of bench/compare-metrics.sh: GET /metrics COUNT times, every
 * INTERVAL seconds on a fixed schedule, over one kept HTTP/1.1 connection to
 * a unix socket, as Prometheus does (a new one when the server closes it).
 * C, so that the scraper's own CPU, which shares the machine with fio and
 * the daemon, is small. Prints: scrapes, connections, CPU us, context switches.
 * Built by the bench with cc; single-threaded. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static char buf[1 << 20];

static void die(const char *what)
{
	fprintf(stderr, "metrics-scraper: %s\n", what);
	exit(1);
}

static int conn(const char *path)
{
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0)
		die("cannot connect");
	return fd;
}

/* One GET: 1 if the server closes the connection after it, else 0. */
static int scrape(int fd)
{
	static const char req[] = "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n";
	size_t len = 0, want = 0;
	char *end = NULL, *cl;
	int closing = 0;
	ssize_t n;

	if (write(fd, req, sizeof(req) - 1) != (ssize_t)sizeof(req) - 1)
		die("write failed");
	while (!end || len < want) {
		n = read(fd, buf + len, sizeof(buf) - 1 - len);
		if (n <= 0)
			die("the connection closed mid-reply");
		len += (size_t)n;
		buf[len] = 0;
		if (end || !(end = strstr(buf, "\r\n\r\n")))
			continue;
		*end = 0; /* search the headers only */
		cl = strcasestr(buf, "\r\nContent-Length:");
		closing = strcasestr(buf, "\r\nConnection: close") != NULL;
		if (strncmp(buf, "HTTP/1.1 200", 12) || !cl)
			die("not a 200 reply with a Content-Length");
		want = (size_t)(end + 4 - buf) + strtoul(cl + 17, NULL, 10);
		if (want >= sizeof(buf))
			die("reply too large");
	}
	return closing;
}

static void next_due(struct timespec *t, long ns)
{
	t->tv_nsec += ns;
	t->tv_sec += t->tv_nsec / 1000000000;
	t->tv_nsec %= 1000000000;
}

int main(int argc, char **argv)
{
	long count = argc == 4 ? strtol(argv[2], NULL, 10) : 0;
	long ns = argc == 4 ? (long)(strtod(argv[3], NULL) * 1e9) : 0;
	int fd = -1, connects = 0;
	struct timespec due;
	struct rusage ru;

	if (count <= 0 || ns <= 0 || ns >= 1000000000L * 3600) {
		fprintf(stderr, "usage: metrics-scraper SOCKET COUNT INTERVAL_S\n");
		return 2;
	}
	clock_gettime(CLOCK_MONOTONIC, &due);
	for (long i = 0; i < count; i++) {
		next_due(&due, ns);
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &due, NULL) == EINTR)
			;
		if (fd < 0) {
			fd = conn(argv[1]);
			connects++;
		}
		if (scrape(fd)) {
			close(fd);
			fd = -1;
		}
	}
	getrusage(RUSAGE_SELF, &ru);
	printf("%ld %d %ld %ld\n", count, connects,
	       (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000L + ru.ru_utime.tv_usec +
		       ru.ru_stime.tv_usec,
	       ru.ru_nvcsw + ru.ru_nivcsw);
	return 0;
}
