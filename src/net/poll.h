/* SPDX-License-Identifier: MIT */

/* poll: the readiness poller (epoll), behind a handful of calls so the rest
 * of the core never sees epoll. One poller per event loop thread. */
#ifndef MP_POLL_H
#define MP_POLL_H

enum {
  POLL_READ = 1,      /* readable (or a listener has a connection) */
  POLL_WRITE = 2,     /* writable (or a connect finished) */
  POLL_HUP = 4,       /* peer hung up or the socket failed */
  POLL_EDGE = 8,      /* report changes only: read/write until EAGAIN */
  POLL_EXCLUSIVE = 16, /* one of the pollers sharing an fd is woken */
  POLL_RDHUP = 32      /* the peer shut down its writing side */
};

typedef struct {
  void *ptr;      /* given at poll_add */
  unsigned flags; /* POLL_READ | POLL_WRITE | POLL_HUP | POLL_RDHUP */
} poll_event_t;

/* A new poller, or a negative errno. */
int poll_new(void);
void poll_free(int poller);
/* Watches `fd` for `flags`; events carry `ptr`. 0 or a negative errno. */
int poll_add(int poller, int fd, void *ptr, unsigned flags);
/* Changes what `fd` is watched for and the pointer its events carry. */
int poll_mod(int poller, int fd, void *ptr, unsigned flags);
/* Stops watching `fd`. 0 or a negative errno. */
int poll_del(int poller, int fd);
/* Waits up to timeout_ms (-1: forever) and fills at most `max` events.
 * Returns how many (0 on timeout or EINTR), or a negative errno. */
int poll_wait(int poller, poll_event_t *ev, int max, int timeout_ms);

#endif
