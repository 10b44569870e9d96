/* SPDX-License-Identifier: MIT */

/* log: formats a diagnostic line and writes it to stderr in one call. */
#include "core/log.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Written once at start, read by every thread: atomic, relaxed. */
static _Atomic int log_level = LOG_WARN;
/* Written by the main thread while no other thread exists (see
 * log_set_worker), read by every thread. */
static _Atomic int log_worker = -1;

static const char *const log_names[] = {"error", "warn", "info", "debug"};

void log_set_level(enum log_level level) {
  atomic_store_explicit(&log_level, (int)level, memory_order_relaxed);
}

enum log_level log_get_level(void) {
  return (enum log_level)atomic_load_explicit(&log_level, memory_order_relaxed);
}

int log_parse_level(const char *name, enum log_level *out) {
  for (int i = 0; i <= LOG_DEBUG; i++)
    if (strcmp(name, log_names[i]) == 0) {
      *out = (enum log_level)i;
      return 0;
    }
  return -1;
}

const char *log_level_name(enum log_level level) {
  return (unsigned)level <= LOG_DEBUG ? log_names[level] : "?";
}

void log_set_worker(int index) {
  atomic_store_explicit(&log_worker, index, memory_order_relaxed);
}

/* The fixed prefix of a line, up to and including "SOURCE: ". */
static int log__prefix(char *buf, size_t len, enum log_level level,
                       const char *source) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  char who[16];
  int w = atomic_load_explicit(&log_worker, memory_order_relaxed);
  if (w == 0)
    snprintf(who, sizeof(who), "root");
  else if (w > 0)
    snprintf(who, sizeof(who), "w%d", w);
  else
    snprintf(who, sizeof(who), "-");
  return snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ %s %s [%d] %s: ",
                  tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                  tm.tm_min, tm.tm_sec, (int)(ts.tv_nsec / 1000000),
                  log_level_name(level), who, (int)getpid(), source);
}

/* Ends the line in buf (len bytes, room for one more) and writes it. */
static void log__emit(char *buf, size_t len) {
  if (len == 0 || buf[len - 1] != '\n') buf[len++] = '\n';
  const char *p = buf;
  while (len > 0) {
    ssize_t w = write(STDERR_FILENO, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    p += w;
    len -= (size_t)w;
  }
}

void log_write(enum log_level level, const char *fmt, ...) {
  if ((int)level > (int)log_get_level()) return;
  char buf[8192];
  int n = log__prefix(buf, sizeof(buf), level, "moonport");
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof(buf) - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof(buf) - 2) len = sizeof(buf) - 2;
  log__emit(buf, len);
}

void log_write_raw(enum log_level level, const char *source, const char *msg,
                   size_t len) {
  if ((int)level > (int)log_get_level()) return;
  char buf[8192];
  size_t n = (size_t)log__prefix(buf, sizeof(buf), level, source);
  if (len > sizeof(buf) - 2 - n) len = sizeof(buf) - 2 - n;
  memcpy(buf + n, msg, len);
  log__emit(buf, n + len);
}

int log_open(const char *path) {
  /* In a folder others may write to (and so plant a link in: /tmp, a
   * shared log folder), the file itself is opened, never a link. */
  char dir[4200];
  snprintf(dir, sizeof(dir), "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash == dir)
    dir[1] = 0;
  else if (slash)
    *slash = 0;
  else
    snprintf(dir, sizeof(dir), ".");
  struct stat st;
  int flags = O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC;
  if (stat(dir, &st) != 0 || (st.st_mode & (S_IWGRP | S_IWOTH)))
    flags |= O_NOFOLLOW;
  int fd = open(path, flags, 0644);
  return fd < 0 ? -errno : fd;
}

int log_reopen_fd(int fd, const char *path) {
  int nfd = log_open(path);
  if (nfd < 0) return nfd;
  if (nfd < 0) return -errno;
  if (nfd == fd) return 0;
  /* stdin..stderr stay inheritable (processes a script starts share
   * them); other logs stay close-on-exec, as they were opened. */
  int rc = dup3(nfd, fd, fd <= 2 ? 0 : O_CLOEXEC) < 0 ? -errno : 0;
  close(nfd);
  return rc;
}
