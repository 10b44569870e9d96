/* SPDX-License-Identifier: MIT */

/* uring: the reactor's send list and reads ahead over one io_uring batch;
 * see uring.h. */
#include "net/uring.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "net/batch.h"

/* Operations per submission: a fan-out to this many connections of a lane
 * goes out in one system call. */
#define URING_ENTRIES 1024
/* A tight memory limit (RLIMIT_MEMLOCK on old kernels): a smaller ring. */
#define URING_ENTRIES_SMALL 256

/* Reads ahead per epoll_wait. */
#define URING_READ_SLOTS 128

net_uring_t *net_uring_new(void) {
  net_uring_t *u = calloc(1, sizeof(*u));
  if (!u) return NULL;
  u->batch = net_batch_new(URING_ENTRIES);
  if (!u->batch && errno == ENOMEM) u->batch = net_batch_new(URING_ENTRIES_SMALL);
  if (!u->batch) {
    int e = errno;
    free(u);
    errno = e;
    return NULL;
  }
  return u;
}

void net_uring_free(net_uring_t *u) {
  if (!u) return;
  net_batch_free(u->batch);
  free(u->slots);
  free(u);
}

void net_uring_io_init(net_uring_io_t *io, int fd, sock_wq_t *wq) {
  memset(io, 0, sizeof(*io));
  io->fd = fd;
  io->wq = wq;
}

void net_uring_io_deinit(net_uring_io_t *io) {
  free(io->own);
  io->own = NULL;
  io->preread = false;
}

/* ---- the send list ---- */

void net_uring_send_all(net_uring_t *u, net_uring_done_fn done) {
  while (u->send_head) {
    net_uring_io_t *io = u->send_head;
    net_uring_send_cancel(u, io);
    struct iovec iov[NET_BATCH_IOV];
    size_t total = 0;
    int cnt = sock_wq_iov(io->wq, iov, NET_BATCH_IOV, &total);
    if (cnt == 0) { /* flushed meanwhile, or a file first */
      done(io, NET_URING_DIRECT, NULL);
      continue;
    }
    io->sent = total;
    if (!net_batch_send(u->batch, io->fd, iov, cnt, io)) {
      net_batch_run(u->batch, done, NULL);
      if (!net_batch_send(u->batch, io->fd, iov, cnt, io)) {
        done(io, NET_URING_DIRECT, NULL);
        continue;
      }
    }
  }
  net_batch_run(u->batch, done, NULL);
}

/* ---- reads ahead ---- */

bool net_uring_read_ahead(net_uring_t *u, net_uring_io_t *io) {
  if (u->nread >= URING_READ_SLOTS) return false;
  if (!u->slots) {
    u->slots = malloc(URING_READ_SLOTS * NET_URING_READ_SIZE);
    if (!u->slots) return false;
  }
  char *slot = u->slots + (size_t)u->nread * NET_URING_READ_SIZE;
  if (!net_batch_recv(u->batch, io->fd, slot, NET_URING_READ_SIZE, io))
    return false;
  io->preread = true;
  io->data = slot;
  io->res = -ECANCELED;
  io->ahead = u->ahead;
  u->ahead = io;
  u->nread++;
  return true;
}

static void uring__read(void *tag, int res, void *arg) {
  net_uring_io_t *io = tag;
  (void)arg;
  io->res = res;
}

void net_uring_read_run(net_uring_t *u) {
  if (!u->nread) return;
  net_batch_run(u->batch, uring__read, NULL);
}

void net_uring__read_end(net_uring_t *u, void (*fail)(net_uring_io_t *io)) {
  net_uring_io_t *io = u->ahead;
  u->ahead = NULL;
  u->nread = 0;
  for (net_uring_io_t *next; io; io = next) {
    next = io->ahead;
    io->ahead = NULL;
    if (!io->preread || io->own) continue;
    if (io->res > 0) {
      io->own = malloc((size_t)io->res);
      if (!io->own) {
        io->preread = false;
        fail(io);
        continue;
      }
      memcpy(io->own, io->data, (size_t)io->res);
      io->data = io->own;
    }
  }
}
