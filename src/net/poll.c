/* SPDX-License-Identifier: MIT */

/* poll: epoll. */
#include "net/poll.h"

#include <errno.h>
#include <sys/epoll.h>
#include <unistd.h>

int poll_new(void) {
  int fd = epoll_create1(EPOLL_CLOEXEC);
  return fd < 0 ? -errno : fd;
}

void poll_free(int poller) {
  if (poller >= 0) close(poller);
}

static struct epoll_event poll__event(void *ptr, unsigned flags) {
  struct epoll_event ev = {.data.ptr = ptr};
  if (flags & POLL_READ) ev.events |= EPOLLIN | EPOLLRDHUP;
  if (flags & POLL_WRITE) ev.events |= EPOLLOUT;
  if (flags & POLL_EDGE) ev.events |= EPOLLET;
  /* EPOLLEXCLUSIVE takes no EPOLLRDHUP (listeners don't need it). */
  if (flags & POLL_EXCLUSIVE) ev.events = (ev.events & ~EPOLLRDHUP) | EPOLLEXCLUSIVE;
  return ev;
}

int poll_add(int poller, int fd, void *ptr, unsigned flags) {
  struct epoll_event ev = poll__event(ptr, flags);
  return epoll_ctl(poller, EPOLL_CTL_ADD, fd, &ev) ? -errno : 0;
}

int poll_mod(int poller, int fd, void *ptr, unsigned flags) {
  struct epoll_event ev = poll__event(ptr, flags);
  return epoll_ctl(poller, EPOLL_CTL_MOD, fd, &ev) ? -errno : 0;
}

int poll_del(int poller, int fd) {
  struct epoll_event ev = {0};
  return epoll_ctl(poller, EPOLL_CTL_DEL, fd, &ev) ? -errno : 0;
}

int poll_wait(int poller, poll_event_t *out, int max, int timeout_ms) {
  struct epoll_event ev[256];
  if (max > 256) max = 256;
  int n = epoll_wait(poller, ev, max, timeout_ms);
  if (n < 0) return errno == EINTR ? 0 : -errno;
  for (int i = 0; i < n; i++) {
    unsigned f = 0;
    if (ev[i].events & (EPOLLIN | EPOLLRDHUP)) f |= POLL_READ;
    if (ev[i].events & EPOLLRDHUP) f |= POLL_RDHUP;
    if (ev[i].events & EPOLLOUT) f |= POLL_WRITE;
    if (ev[i].events & (EPOLLHUP | EPOLLERR)) f |= POLL_HUP | POLL_READ;
    out[i].ptr = ev[i].data.ptr;
    out[i].flags = f;
  }
  return n;
}
