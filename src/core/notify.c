/* SPDX-License-Identifier: MIT */

/* notify: the sd_notify protocol in a few lines: one datagram of
 * "KEY=VALUE" lines to a unix socket, no libsystemd. */
#include "core/notify.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Set once by notify_init before any thread exists; read-only after. */
static struct sockaddr_un notify_addr;
static socklen_t notify_len; /* 0: no manager to tell */
static pid_t notify_pid;     /* the process that may send */

int notify_init(void) {
  const char *v = getenv("NOTIFY_SOCKET");
  if (!v || !*v) return 0;
  size_t n = strlen(v);
  int rc = 0;
  if ((v[0] != '/' && v[0] != '@') || n >= sizeof(notify_addr.sun_path)) {
    rc = -EINVAL;
  } else {
    notify_addr.sun_family = AF_UNIX;
    memcpy(notify_addr.sun_path, v, n);
    if (v[0] == '@') notify_addr.sun_path[0] = 0; /* abstract: no NUL end */
    notify_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n +
                             (v[0] == '/'));
    notify_pid = getpid();
  }
  unsetenv("NOTIFY_SOCKET");
  return rc;
}

int notify_send(const char *state) {
  if (!notify_len || getpid() != notify_pid) return 0;
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL,
                     (struct sockaddr *)&notify_addr, notify_len);
  int rc = w < 0 ? -errno : 0;
  close(fd);
  return rc;
}

int notify_reloading(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  char buf[64];
  snprintf(buf, sizeof(buf), "RELOADING=1\nMONOTONIC_USEC=%llu",
           (unsigned long long)ts.tv_sec * 1000000ull +
               (unsigned long long)ts.tv_nsec / 1000);
  return notify_send(buf);
}
