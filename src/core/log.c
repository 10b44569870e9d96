/* log: formats a diagnostic line and writes it to stderr in one call. */
#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Written once at start, read by every thread: atomic, relaxed. */
static _Atomic int log_level = LOG_WARN;

void log_set_level(enum log_level level) {
  atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
}

enum log_level log_get_level(void) {
  return (enum log_level)atomic_load_explicit(&log_level, memory_order_relaxed);
}

void log_write(enum log_level level, const char *fmt, ...) {
  if ((int)level > (int)log_get_level()) return;
  char buf[8192];
  int n;
  if (level >= LOG_INFO)
    n = snprintf(buf, sizeof(buf), "moonport[%d]: ", (int)getpid());
  else
    n = snprintf(buf, sizeof(buf), "moonport: ");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof(buf) - 2) len = sizeof(buf) - 2;
  if (len == 0 || buf[len - 1] != '\n') buf[len++] = '\n';
  const char *p = buf;
  while (len > 0) {
    ssize_t w = write(STDERR_FILENO, p, len);
    if (w <= 0) break;
    p += w;
    len -= (size_t)w;
  }
}
