/* SPDX-License-Identifier: MIT */

/* log: the one place that prints diagnostics; thread-safe, line-atomic. */
#ifndef MP_LOG_H
#define MP_LOG_H

#include <stddef.h>

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

/* Sets the most verbose level printed (default LOG_WARN). Any thread;
 * meant to be called once at start. */
void log_set_level(enum log_level level);
enum log_level log_get_level(void);
/* The level named "error", "warn", "info" or "debug": 0 and *out, or -1. */
int log_parse_level(const char *name, enum log_level *out);
/* The name of a level ("error" ...). */
const char *log_level_name(enum log_level level);

/* Which process of the server this is, for the worker field of each line:
 * 0 the root, N > 0 worker N (a one-process server is worker 1), -1 not
 * known yet ("-"). Call on the main thread while the process has no other
 * thread: at start, and in a worker right after the fork. */
void log_set_worker(int index);

/* Prints one line, in the one format every line of the log has:
 *
 *   2026-12-01T09:48:38.123Z warn w1 [4243] moonport: the message
 *
 * the time in UTC (milliseconds), the level, the process ("root", "w1",
 * "w2" ...), its pid, the source ("moonport" for the server, "lua" for a
 * script's mp.log) and the formatted message, as one write(2) to stderr
 * (fd 2), so lines from threads and processes never mix. A message
 * longer than 8 KiB is cut. Any thread. */
void log_write(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The same with another source than "moonport" and a message of `len`
 * bytes taken as it is (no format). */
void log_write_raw(enum log_level level, const char *source, const char *msg,
                   size_t len);

/* Opens `path` for appending (created 0644 if missing) and puts it on
 * `fd` with dup2(2), so writers using fd keep going and each write lands
 * whole in the old file or the new one: how a log is reopened after
 * logrotate moved it, and how --error-log replaces stderr (fd 2). 0 or a
 * negative errno (fd is unchanged then). Any thread. */
int log_reopen_fd(int fd, const char *path);
/* Opens `path` for appending (created 0644 if missing), close-on-exec,
 * with O_NOFOLLOW when its folder is writable by group or others (a link
 * planted there is refused with ELOOP rather than written through). The
 * fd, or a negative errno. Any thread. */
int log_open(const char *path);

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
