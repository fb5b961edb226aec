/* Logging to stderr with levels. Threading: any thread (one write(2) per line). */
#ifndef IOPLANE_LOG_H
#define IOPLANE_LOG_H

enum log_level { LOG_ERR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

void log_set_level(enum log_level l);
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

#endif
