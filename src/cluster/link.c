/* SPDX-License-Identifier: MIT */

/* cluster/link: a worker's non-blocking byte stream of frames to the root
 * (see link.h). Lanes never block on the root: a root lane busy in Lua
 * must not stall the worker's lanes, so what the socket refuses waits here
 * and the main thread flushes it. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "cluster/ipc.h"
#include "cluster/link.h"

void link_init(server_link_t *l, int fd, int wake_fd) {
  *l = (server_link_t){.fd = fd, .wake_fd = wake_fd};
}

void link_free(server_link_t *l) {
  free(l->out);
  l->out = NULL;
  l->off = l->len = l->cap = 0;
}

bool link_pending(const server_link_t *l) { return l->len > l->off; }

void link_flush(server_link_t *l) {
  while (l->fd >= 0 && l->off < l->len) {
    ssize_t n = send(l->fd, l->out + l->off, l->len - l->off,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) /* the root is gone */
        l->off = l->len;
      break;
    }
    l->off += (size_t)n;
  }
  if (l->off == l->len) l->off = l->len = 0;
}

int link_send(server_link_t *l, int type, unsigned flags, const char *ch,
              size_t clen, const char *msg, size_t mlen) {
  char hdr[IPC_HEADER];
  ipc_header(hdr, type, flags, clen, mlen);
  struct iovec iov[3] = {{hdr, IPC_HEADER}, {(void *)ch, clen},
                         {(void *)msg, mlen}};
  int cnt = 3, i = 0;
  if (l->len) link_flush(l);
  if (!l->len) {
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
    for (;;) {
      ssize_t n = sendmsg(l->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
      if (n < 0) n = 0;
      while (i < cnt && (size_t)n >= iov[i].iov_len)
        n -= (ssize_t)iov[i++].iov_len;
      if (i < cnt) {
        iov[i].iov_base = (char *)iov[i].iov_base + n;
        iov[i].iov_len -= (size_t)n;
      }
      break;
    }
    if (i == cnt) return 0;
  }
  size_t rest = 0;
  for (int k = i; k < cnt; k++) rest += iov[k].iov_len;
  bool whole = i == 0 && iov[0].iov_len == IPC_HEADER; /* nothing went */
  if (type == IPC_PUBLISH && whole && l->len - l->off + rest > LINK_OUT_MAX)
    return -ENOBUFS;
  if (l->len + rest > l->cap) {
    if (l->off) { /* slide the unsent part to the front */
      memmove(l->out, l->out + l->off, l->len - l->off);
      l->len -= l->off;
      l->off = 0;
    }
    size_t cap = l->cap ? l->cap : 65536;
    while (cap < l->len + rest) cap *= 2;
    if (cap != l->cap) {
      char *out = realloc(l->out, cap);
      if (!out) return -ENOMEM;
      l->out = out;
      l->cap = cap;
    }
  }
  for (int k = i; k < cnt; k++) {
    if (iov[k].iov_len) memcpy(l->out + l->len, iov[k].iov_base, iov[k].iov_len);
    l->len += iov[k].iov_len;
  }
  uint64_t one = 1; /* the main thread now polls for writing */
  ssize_t w = write(l->wake_fd, &one, sizeof(one));
  (void)w;
  return 0;
}
