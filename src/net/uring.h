/* SPDX-License-Identifier: MIT */

/* uring: the reactor's io_uring batching behind a handful of functions.
 *
 * Two uses of one ring (net/batch.h) per reactor:
 * * a send list: a connection whose queue was empty when the loop
 *   iteration wrote to it waits here, and at the end of the iteration
 *   every listed queue goes out with one io_uring_enter;
 * * reads ahead: the sockets one epoll_wait reported readable are read
 *   with one io_uring_enter into slots of a shared buffer, and the
 *   reactor's read takes that result instead of calling read(2).
 *
 * The reactor keeps no io_uring state of its own: each connection embeds
 * one net_uring_io_t, the reactor holds one net_uring_t, or NULL when
 * io_uring is unavailable or turned off (MOONPORT_IO_URING=0): then every
 * read and write is its own system call and none of this is used.
 *
 * Ownership: the io is caller storage; it borrows the connection's write
 * queue and fd (the caller cancels the send and drops the read ahead
 * before closing the fd), and owns only a read ahead kept past its
 * iteration (freed by net_uring_io_deinit or handed out by
 * net_uring_read_take). Threads: a net_uring_t and its ios belong to the
 * reactor's thread; net_uring_new must run on that thread (the ring is
 * single-issuer). */
#ifndef MP_URING_H
#define MP_URING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net/sock.h"

typedef struct net_uring net_uring_t;
typedef struct net_uring_io net_uring_io_t;

/* Writes up to this size wait for the send list (a larger one gains
 * little from it and goes out at once); also what a listed queue may hold
 * before it is written directly. 16 KiB: the largest pooled packet. */
#define NET_URING_SEND_MAX ((size_t)16 * 1024)

/* Bytes one read ahead asks for. */
#define NET_URING_READ_SIZE ((size_t)4096)

/* One connection's part. Caller storage; the fields are the module's. */
struct net_uring_io {
  net_uring_io_t *prev, *next; /* the send list */
  net_uring_io_t *ahead;       /* the reads ahead of this iteration */
  sock_wq_t *wq;               /* borrowed */
  int fd;                      /* borrowed */
  bool queued;                 /* on the send list */
  bool preread;                /* a read's result waits (res, data) */
  int res;                     /* bytes, 0 for EOF, or a negative errno */
  size_t sent;                 /* bytes its send carried */
  const char *data;            /* in a slot, or in `own` */
  char *own;                   /* a result kept past its iteration */
};

/* The reactor's part. Its fields are the module's; they are here only so
 * that the calls made once per write or read below can be inline (the
 * reactor's hot path paid no call for them before they moved here). */
struct net_uring {
  struct net_batch *batch;
  net_uring_io_t *send_head, *send_tail;
  char *slots;           /* the reads' buffer, allocated on first use */
  unsigned nread;        /* reads queued since the last net_uring_read_end */
  net_uring_io_t *ahead; /* the ios read ahead in this iteration */
};

/* The reactor's ring, or NULL with errno: ENOTSUP for
 * MOONPORT_IO_URING=0, else why io_uring can't be used. Reactor thread. */
net_uring_t *net_uring_new(void);
void net_uring_free(net_uring_t *u);

/* Prepares `io` for the connection on `fd` with queue `wq` (both
 * borrowed for the io's life). */
void net_uring_io_init(net_uring_io_t *io, int fd, sock_wq_t *wq);
/* Frees a read ahead it still owns. The io must not be on the send list. */
void net_uring_io_deinit(net_uring_io_t *io);

/* ---- the send list ---- */

static inline bool net_uring_queued(const net_uring_io_t *io) {
  return io->queued;
}
/* Puts io on the send list (it must not be on it). */
static inline void net_uring_send_later(net_uring_t *u, net_uring_io_t *io) {
  io->queued = true;
  io->next = NULL;
  io->prev = u->send_tail;
  if (u->send_tail)
    u->send_tail->next = io;
  else
    u->send_head = io;
  u->send_tail = io;
}
/* Takes io off the send list (it must be on it). */
static inline void net_uring_send_cancel(net_uring_t *u, net_uring_io_t *io) {
  if (io->prev)
    io->prev->next = io->next;
  else
    u->send_head = io->next;
  if (io->next)
    io->next->prev = io->prev;
  else
    u->send_tail = io->prev;
  io->prev = io->next = NULL;
  io->queued = false;
}
/* Whether the send list holds anything. */
static inline bool net_uring_has_sends(const net_uring_t *u) {
  return u->send_head != NULL;
}

/* Result given to done when the ring could not take an io's send (its
 * queue starts with a file, or is empty, or the ring failed to queue it):
 * the caller writes it directly. Never a byte count or an errno. */
#define NET_URING_DIRECT INT32_MIN

/* A send's result: `io` is the net_uring_io_t (void * so that the ring
 * calls it directly, with no step in between); res is the bytes sent, a
 * negative errno (-EAGAIN: the socket is full) or NET_URING_DIRECT; the
 * send carried everything it was given when res == io->sent; arg is
 * unused (NULL). */
typedef void (*net_uring_done_fn)(void *io, int res, void *arg);

/* Sends the memory packets at the head of every listed queue (up to
 * NET_BATCH_IOV pieces each), emptying the list, then calls done for each
 * in list order. done may cancel or kill other ios (their done still
 * comes; the caller checks) but must not put any on the list. The queue
 * is not consumed: done does that. */
void net_uring_send_all(net_uring_t *u, net_uring_done_fn done);

/* ---- reads ahead ---- */

/* Queues a non-blocking read of up to NET_URING_READ_SIZE bytes for io
 * (which has no result waiting). False when all slots are taken (stop
 * queuing) or the buffer can't be had. */
bool net_uring_read_ahead(net_uring_t *u, net_uring_io_t *io);
/* Runs the reads queued since the last run; each io then holds its result
 * (preread). */
void net_uring_read_run(net_uring_t *u);

static inline bool net_uring_read_ready(const net_uring_io_t *io) {
  return io->preread;
}
/* Hands out a waiting result: returns bytes, 0 for EOF or a negative
 * errno; *data gets the bytes (valid until the end of the iteration, or
 * until *own is freed); *own gets memory the caller now owns (free it
 * after using *data; NULL when the bytes are in a slot). */
static inline int net_uring_read_take(net_uring_io_t *io, const char **data,
                                      char **own) {
  io->preread = false;
  *data = io->data;
  *own = io->own;
  io->own = NULL;
  return io->res;
}
/* Forgets a waiting result (the connection is dying); a copy it owns goes
 * with net_uring_io_deinit. */
static inline void net_uring_read_drop(net_uring_io_t *io) {
  io->preread = false;
}
/* After the iteration's events: a result its connection could not take
 * yet is copied out of the slots (which the next run reuses). When that
 * copy can't be allocated the result is dropped and fail(io) is called
 * (the caller closes the connection: bytes were lost). */
void net_uring__read_end(net_uring_t *u, void (*fail)(net_uring_io_t *io));
static inline void net_uring_read_end(net_uring_t *u,
                                      void (*fail)(net_uring_io_t *io)) {
  if (u->ahead) net_uring__read_end(u, fail); /* most iterations read none */
}

#endif
