/* Logging to stderr with levels. Threading: any thread (one write(2) per line). */
#ifndef IOPLANE_LOG_H
#define IOPLANE_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum log_level { LOG_ERR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

void log_set_level(enum log_level l);
/* Log to the file at path from now on (appending; created with mode 0640):
 * it becomes stderr. 0 or -errno. Main thread, before other threads log. */
int log_open_file(const char *path);
/* Can path be opened as log_open_file() opens it? 0 or -errno; stderr stays. */
int log_check_file(const char *path);
/* Open the log file again (SIGHUP, after logrotate moved it): 1 reopened, 0
 * no log file, -errno (logging goes on to the old one). Any thread. */
int log_reopen(void);
enum log_level log_get_level(void);
void log_msg(enum log_level l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_err(...) log_msg(LOG_ERR, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                                                             \
	do {                                                                                       \
		if (log_get_level() >= LOG_DEBUG)                                                  \
			log_msg(LOG_DEBUG, __VA_ARGS__);                                           \
	} while (0)

/* Errors of one source (an NBD connection, a virtqueue) that a client can
 * cause over and over: the first LOG_ERRORS_FIRST are logged, the rest only
 * counted, and log_errors_end() says how many there were in all. Owned by
 * the source's thread. */
#define LOG_ERRORS_FIRST 10

struct log_errors {
	uint64_t n; /* errors seen */
};

/* Count one error: true when it is to be logged. */
static inline bool log_errors_take(struct log_errors *e)
{
	return e->n++ < LOG_ERRORS_FIRST;
}

/* The source ends: log the total if some errors were not logged, and
 * start counting afresh. */
void log_errors_end(struct log_errors *e, const char *who);

#endif
