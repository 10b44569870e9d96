/* log: the one place that prints diagnostics; thread-safe, line-atomic. */
#ifndef MP_LOG_H
#define MP_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* Sets the most verbose level printed (default LOG_WARN). Any thread;
 * meant to be called once at start. */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);

/* Prints "moonport: " (plus "[pid] " at INFO and DEBUG) and the formatted
 * message as one write(2) to stderr, so lines from threads never mix.
 * A message longer than 8 KiB is cut. Any thread. */
void log_write(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_write(LOG_WARN, __VA_ARGS__)
#define log_info(...)                                                         \
  do {                                                                        \
    if (log_get_level() >= LOG_INFO) log_write(LOG_INFO, __VA_ARGS__);        \
  } while (0)
#define log_debug(...)                                                        \
  do {                                                                        \
    if (log_get_level() >= LOG_DEBUG) log_write(LOG_DEBUG, __VA_ARGS__);      \
  } while (0)

#endif
