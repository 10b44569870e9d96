/* SPDX-License-Identifier: MIT */

/* reactor: the per-lane event loop: epoll readiness, timers, a mailbox,
 * connection state, reads, writes and event dispatch. How connections
 * come into being (accept, watches, connect) is reactor_open.c, the TLS
 * part of a connection reactor_tls.c; reactor_int.h is what they share. */
#include "net/reactor_int.h"

#include "core/stats.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/defer.h"
#include "core/log.h"
#include "net/poll.h"
#include "net/uring.h"

static const char *const reason_names[] = {"peer", "error", "timeout",
                                           "shutdown", "local"};

const char *reactor_reason_name(int reason) {
  if (reason < 0 || reason > CONN_LOCAL) return "error";
  return reason_names[reason];
}

uint64_t reactor_clock_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* ---- the pending list: events to deliver outside of the current call ---- */

void conn__enqueue(conn_t *c, uint32_t pend) {
  c->pend |= pend;
  if (c->flags & F_IN_LIST) return;
  c->flags |= F_IN_LIST;
  c->pending_next = NULL;
  reactor_t *r = c->r;
  if (r->pend_tail)
    r->pend_tail->pending_next = c;
  else
    r->pend_head = c;
  r->pend_tail = c;
}

static void list__unlink(conn_t **head, conn_t *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    *head = c->next;
  if (c->next) c->next->prev = c->prev;
  c->prev = c->next = NULL;
}

void list__push(conn_t **head, conn_t *c) {
  c->prev = NULL;
  c->next = *head;
  if (*head) (*head)->prev = c;
  *head = c;
}

/* Tasks of a connection that is gone get fn(NULL) to free what they hold. */
static void conn__drop_tasks(conn_t *c) {
  while (c->tasks) {
    conn_task_t *t = c->tasks;
    c->tasks = t->next;
    t->fn(NULL, t->arg);
    free(t);
  }
  c->tasks_tail = NULL;
}

static void conn__free(conn_t *c) {
  conn__drop_tasks(c);
  net_tls_free(c->tls);
  sock_wq_clear(&c->tls_out);
  net_uring_io_deinit(&c->io);
  if (c->flags & F_ZOMBIE) list__unlink(&c->r->zombies, c);
  free(c->connect_timer);
  free(c);
}

static void linger__free(reactor_t *r, linger_t *lg) {
  if (lg->prev)
    lg->prev->next = lg->next;
  else
    r->lingers = lg->next;
  if (lg->next) lg->next->prev = lg->prev;
  poll_del(r->poller, lg->fd);
  close(lg->fd);
  free(lg);
}

/* Reads and drops what the peer sends; true once it is done (EOF/error). */
static bool linger__drain(reactor_t *r, int fd) {
  for (;;) {
    ssize_t n = read(fd, r->rbuf, REACTOR_READ_CHUNK);
    if (n > 0) continue;
    if (n < 0 && errno == EINTR) continue;
    return !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }
}

/* Closing a socket whose input holds unread bytes makes the kernel send a
 * reset, which can destroy the last bytes we sent before the peer has read
 * them. So a graceful close shuts the write side (the peer sees EOF after
 * every byte), then reads and drops input until the peer's EOF, for at
 * most REACTOR_LINGER_MS, and only then closes. */
static void linger__start(reactor_t *r, int fd) {
  shutdown(fd, SHUT_WR);
  linger_t *lg = linger__drain(r, fd) ? NULL : malloc(sizeof(*lg));
  if (!lg || poll_mod(r->poller, fd, lg, POLL_READ | POLL_EDGE)) {
    free(lg);
    poll_del(r->poller, fd);
    close(fd);
    return;
  }
  *lg = (linger_t){KIND_LINGER, fd, r->now + REACTOR_LINGER_MS, NULL,
                   r->lingers};
  if (lg->next) lg->next->prev = lg;
  r->lingers = lg;
}

/* The fd goes now; the last callback and the free come from the pending
 * list once nothing holds the connection. */
void conn__kill_errno(conn_t *c, int err) {
  if (err == -ECONNRESET) c->flags |= F_RESET;
  conn__kill(c, err == -ECONNRESET || err == -EPIPE ? CONN_PEER : CONN_ERROR);
}

bool reactor_conn_was_reset(const conn_t *c) { return c->flags & F_RESET; }

void conn__kill(conn_t *c, int reason) {
  if (c->flags & F_DEAD) return;
  reactor_t *r = c->r;
  net_uring_read_drop(&c->io);
  if (net_uring_queued(&c->io)) {
    /* Its writes were due at the end of the iteration; what was written
     * before a close goes to the kernel first, as a direct write would
     * have. */
    net_uring_send_cancel(r->uring, &c->io);
    if (c->flags & F_OPEN)
      (void)sock_wq_flush(c->fd, c->tls ? &c->tls_out : &c->wq);
  }
  if (!(c->flags & F_CLOSING) || reason == CONN_ERROR) c->reason = reason;
  if ((c->flags & F_HANDSHAKE) && !(c->flags & F_ACCEPTED))
    c->flags |= F_CONNECTING; /* a client's TLS never opened: on_fail */
  if ((c->flags & F_HANDSHAKE) && !c->fail_err)
    c->fail_err = reason == CONN_TIMEOUT ? -ETIMEDOUT : 0;
  if (c->flags & F_CONNECTING) { /* never opened: on_fail, not on_close */
    c->flags |= F_FAILED;
    if (!c->fail_err)
      c->fail_err = reason == CONN_SHUTDOWN ? -ECANCELED
                    : reason == CONN_LOCAL  ? -ECONNABORTED
                                            : -EIO;
  }
  c->flags |= F_DEAD;
  c->flags &= ~(F_READ_PENDING | F_CONNECTING);
  if (c->connect_timer) timer_stop(&r->timers, c->connect_timer);
  /* A close asked for (not a failure, not the peer's EOF) after the queue
   * drained: let the peer read everything. */
  bool graceful = (c->flags & F_CLOSING) && (c->flags & F_OPEN) &&
                  !c->wq.head && !c->tls_out.head && reason != CONN_ERROR &&
                  reason != CONN_PEER &&
                  !(c->flags & F_PEER_HUP);
  sock_uuid_close(c->uuid);
  if (graceful) {
    linger__start(r, c->fd);
  } else {
    /* Deregister explicitly: if a fork shares the file description, close
     * alone would leave it in the epoll set, pointing at freed memory. */
    poll_del(r->poller, c->fd);
    close(c->fd);
  }
  c->fd = -1;
  sock_wq_clear(&c->wq);
  sock_wq_clear(&c->tls_out);
  list__unlink(&r->live, c);
  r->nlive--;
  if (c->flags & F_OUTLIVE) r->noutlive--;
  c->flags |= F_ZOMBIE;
  list__push(&r->zombies, c);
  conn__enqueue(c, 0);
}

/* A TLS handshake reads on whatever the protocol asked (a pause, back
 * pressure): it was not opened yet, and what it queued waits for the
 * handshake. (A client that queued past its write limit before it was
 * done once left the server's answer unread and hung to its timeout.) */
bool conn__can_read(const conn_t *c) {
  if (c->flags & (F_DEAD | F_CLOSING | F_CONNECTING) || c->hold > 0)
    return false;
  if (c->flags & F_HANDSHAKE) return true;
  return !(c->flags & (F_PAUSED | F_BP)) && (c->flags & F_OPEN);
}

/* Whether reading has something to do: the socket may hold bytes, or (TLS)
 * records or decrypted bytes wait already. */
static bool conn__want_read(const conn_t *c) {
  return (c->flags & F_READ_PENDING) ||
         (c->tls && net_tls_has_input(c->tls));
}

/* One read from the socket, or the result the batch read ahead: the
 * bytes at *buf (the reactor's buffer, or *own, which the caller frees).
 * Bytes clear F_READ_PENDING when they did not fill the buffer
 * (edge-triggered: a short read emptied the socket, and later bytes bring
 * a new event; after a hang-up, read on to the EOF). */
ssize_t conn__read_raw(conn_t *c, const char **buf, char **own) {
  reactor_t *r = c->r;
  size_t cap = REACTOR_READ_CHUNK;
  ssize_t n;
  *buf = r->rbuf;
  *own = NULL;
  if (net_uring_read_ready(&c->io)) { /* read already, with the batch */
    cap = NET_URING_READ_SIZE;
    n = net_uring_read_take(&c->io, buf, own);
    if (n < 0) errno = (int)-n, n = -1;
  } else {
    n = read(c->fd, r->rbuf, REACTOR_READ_CHUNK);
  }
  if (n > 0) {
    if ((size_t)n < cap && !(c->flags & F_PEER_HUP))
      c->flags &= ~F_READ_PENDING;
    stats_add(r->stats, STAT_BYTES_IN, (uint64_t)n);
  }
  return n;
}

/* What a read that brought no bytes (n <= 0, errno) means: true to try
 * again (EINTR), false when reading is over for now (EAGAIN), the peer
 * closed (EOF), or the connection failed. */
bool conn__read_none(conn_t *c, ssize_t n) {
  if (n == 0) {
    c->flags &= ~F_READ_PENDING;
    reactor_conn_close(c, CONN_PEER);
    return false;
  }
  if (errno == EINTR) return true;
  if (errno == EAGAIN || errno == EWOULDBLOCK) {
    c->flags &= ~F_READ_PENDING;
    return false;
  }
  conn__kill_errno(c, -errno);
  return false;
}

void conn__read(conn_t *c) {
  reactor_t *r = c->r;
  if (c->tls) {
    conn__tls_read(c);
    return;
  }
  for (int round = 0; round < 16; round++) {
    if (!(c->flags & F_READ_PENDING) || !conn__can_read(c)) return;
    const char *buf;
    char *own;
    ssize_t n = conn__read_raw(c, &buf, &own);
    if (n > 0) {
      c->last_active = r->now;
      if (c->proto->on_data) {
        c->hold++;
        c->proto->on_data(c, buf, (size_t)n);
        free(own);
        own = NULL;
        if (--c->hold > 0) return; /* suspended: release re-queues reading */
        if (c->tasks) { /* tasks it queued run before the next read */
          conn__enqueue(c, P_TASK);
          return;
        }
      }
      free(own);
      continue;
    }
    free(own);
    if (conn__read_none(c, n)) continue;
    return;
  }
  conn__enqueue(c, P_READ); /* more to read: let others have a turn first */
}

/* Delivers one held-back event with the connection held. */
void conn__call(conn_t *c, void (*fn)(conn_t *)) {
  c->hold++;
  fn(c);
  c->hold--;
}

static void conn__finish(conn_t *c) {
  if (!(c->flags & F_NOTIFIED)) {
    c->flags |= F_NOTIFIED;
    c->hold++;
    if (c->flags & F_COUNTED) stats_add(c->r->stats, STAT_CONN_CLOSED, 1);
    if (c->flags & F_FAILED) {
      if (c->proto->on_fail) c->proto->on_fail(c, c->fail_err);
    } else if ((c->flags & F_HANDSHAKE) && (c->flags & F_ACCEPTED)) {
      /* a TLS client that never finished its handshake: the protocol
       * never saw it (on_open did not run), so it hears nothing now */
    } else if (c->proto->on_close) {
      c->proto->on_close(c, c->reason);
    }
    c->hold--;
  }
  if (c->hold == 0 && !(c->flags & F_IN_LIST)) conn__free(c);
}

static void conn__process(conn_t *c) {
  if (c->hold > 0) return; /* reactor_conn_release re-queues it */
  uint32_t p = c->pend;
  c->pend = 0;
  /* One event at a time; if a callback suspends, the rest wait for the
   * release, so a connection's callbacks never overlap. */
  while (!(c->flags & F_DEAD) && c->hold == 0) {
    if (p & P_OPEN) {
      p &= ~P_OPEN;
      if (c->proto->on_open) conn__call(c, c->proto->on_open);
    } else if (p & P_SHUTDOWN) {
      p = (p & ~P_SHUTDOWN) | P_SHUTCLOSE;
      if (c->proto->on_shutdown && (c->flags & F_OPEN) &&
          !(c->flags & F_HANDSHAKE) && reactor_conn_is_open(c))
        conn__call(c, c->proto->on_shutdown);
    } else if (p & P_SHUTCLOSE) {
      p &= ~P_SHUTCLOSE;
      reactor_conn_close(c, CONN_SHUTDOWN);
    } else if ((p & P_TASK) && c->tasks) {
      conn_task_t *t = c->tasks; /* one at a time: it may wait */
      c->tasks = t->next;
      if (!c->tasks) {
        c->tasks_tail = NULL;
        p &= ~P_TASK;
      }
      c->hold++;
      t->fn(c, t->arg);
      c->hold--;
      free(t);
    } else if (p & P_READY) {
      p &= ~P_READY;
      if (c->proto->on_ready) conn__call(c, c->proto->on_ready);
    } else if (p & P_TIMEOUT) {
      p &= ~P_TIMEOUT;
      if (c->flags & (F_CLOSING | F_HANDSHAKE))
        conn__kill(c, CONN_TIMEOUT);
      else if (c->proto->on_timeout)
        conn__call(c, c->proto->on_timeout);
      else
        reactor_conn_close(c, CONN_TIMEOUT);
    } else {
      conn__read(c);
      break;
    }
  }
  c->pend |= p & ~P_READ;
  if (c->tasks) {
    c->pend |= P_TASK;
    /* queued by a callback that returned: run them in the next round */
    if (c->hold == 0 && !(c->flags & F_DEAD)) conn__enqueue(c, P_TASK);
  }
  if ((c->flags & F_DEAD) && c->hold == 0) {
    conn__drop_tasks(c);
    conn__finish(c);
  }
}

/* Delivers the events queued so far; ones queued meanwhile wait for the
 * next loop iteration (so a busy connection can't starve the poller). */
static void reactor__drain_pending(reactor_t *r) {
  conn_t *c = r->pend_head, *last = r->pend_tail;
  if (!c) return;
  r->pend_head = r->pend_tail = NULL;
  for (;;) {
    conn_t *next = c->pending_next;
    bool end = c == last;
    c->flags &= ~F_IN_LIST;
    c->pending_next = NULL;
    conn__process(c);
    if (end) break;
    c = next;
  }
}

/* ---- writing ---- */

void conn__after_queue(conn_t *c) {
  if (c->wq.bytes > 0) {
    c->flags |= F_WROTE;
    if (c->wq.bytes > c->write_limit) c->flags |= F_BP;
  }
}

/* After queued bytes went out (directly or in a batch): back pressure
 * ends at half the limit; once the queue is empty (`drained`) a close
 * asked for completes, or on_ready is due. */
void conn__wrote(conn_t *c, bool drained) {
  /* A handshake has its whole limit, however the bytes trickle. */
  if (!(c->flags & F_HANDSHAKE)) c->last_active = c->r->now;
  if ((c->flags & F_BP) && c->wq.bytes <= c->write_limit / 2) {
    c->flags &= ~F_BP;
    if (conn__want_read(c)) conn__enqueue(c, P_READ);
  }
  if (!drained) return;
  if (c->flags & F_CLOSING) {
    conn__kill(c, c->reason);
    return;
  }
  if (c->flags & F_WROTE) {
    c->flags &= ~F_WROTE;
    conn__enqueue(c, P_READY);
  }
}

void conn__flush(conn_t *c) {
  if (c->flags & F_DEAD) return;
  if (c->tls) {
    conn__tls_flush(c);
    return;
  }
  if (c->wq.bytes == 0 && !c->wq.head) {
    if (c->flags & F_CLOSING) conn__kill(c, c->reason);
    return;
  }
  int rc = sock_wq_flush(c->fd, &c->wq);
  if (rc < 0) {
    conn__kill_errno(c, rc);
    return;
  }
  conn__wrote(c, rc == 0);
}

int conn__write(conn_t *c, const void *data, size_t len,
                sock_release_fn release, void *ctx, void *ctx2) {
  int rc;
  if (c->tls && !(c->flags & (F_DEAD | F_CLOSING)))
    return conn__tls_write(c, data, len, release, ctx, ctx2);
  if (c->flags & (F_DEAD | F_CLOSING)) {
    rc = -EPIPE;
    goto fail;
  }
  stats_add(c->r->stats, STAT_BYTES_OUT, len);
  if (net_uring_queued(&c->io) && c->wq.bytes + len > NET_URING_SEND_MAX) {
    /* Past what a batch carries: what waits goes out now, directly, and
     * this write after it, so bulk output never piles up in memory until
     * the end of the iteration (nor counts against max_queue there). */
    net_uring_send_cancel(c->r->uring, &c->io);
    conn__flush(c);
    if (c->flags & F_DEAD) {
      rc = -EPIPE;
      goto fail;
    }
  }
  if (c->wq.bytes >= c->max_queue) {
    rc = -ENOBUFS;
    goto fail;
  }
  const char *p = data;
  bool empty = c->wq.bytes == 0 && !c->wq.head && (c->flags & F_OPEN);
  /* Small writes wait for the batch; a large one gains little from it and
   * goes out at once (as much as the socket takes), uncopied. */
  if (empty && c->r->uring && len <= NET_URING_SEND_MAX) {
    if (release)
      rc = sock_wq_push_ref(&c->wq, p, len, release, ctx, ctx2);
    else
      rc = sock_wq_push_copy(&c->wq, p, len);
    if (rc) return rc; /* the push released the reference */
    net_uring_send_later(c->r->uring, &c->io);
    return 0;
  }
  if (empty) {
    while (len > 0) {
      ssize_t n = write(c->fd, p, len);
      if (n > 0) {
        p += n;
        len -= (size_t)n;
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      rc = n < 0 ? -errno : -EIO;
      conn__kill_errno(c, rc);
      rc = -EPIPE;
      goto fail;
    }
    c->last_active = c->r->now;
    if (len == 0) {
      if (release) release(ctx, ctx2);
      return 0;
    }
  }
  if (release)
    rc = sock_wq_push_ref(&c->wq, p, len, release, ctx, ctx2);
  else
    rc = sock_wq_push_copy(&c->wq, p, len);
  if (rc) return rc; /* the push released the reference */
  /* More for a connection on the batch list goes out with the rest; it
   * is a backlog only past the write limit. */
  if (!net_uring_queued(&c->io) || c->wq.bytes > c->write_limit)
    conn__after_queue(c);
  return 0;
fail:
  if (release) release(ctx, ctx2);
  return rc;
}

int reactor_conn_write(conn_t *c, const void *data, size_t len) {
  return conn__write(c, data, len, NULL, NULL, NULL);
}

int reactor_conn_write_ref(conn_t *c, const void *data, size_t len,
                           sock_release_fn release, void *ctx, void *ctx2) {
  return conn__write(c, data, len, release, ctx, ctx2);
}

int reactor_conn_sendfile(conn_t *c, int file_fd, off_t offset, size_t len) {
  if (c->flags & (F_DEAD | F_CLOSING) || c->wq.bytes >= c->max_queue) {
    close(file_fd);
    return c->flags & (F_DEAD | F_CLOSING) ? -EPIPE : -ENOBUFS;
  }
  bool was_empty = c->wq.head == NULL;
  /* TLS: no kTLS here (net_tls_kernel_available), so the file is read and
   * encrypted as the flush reaches it (conn__tls_encrypt). */
  int rc = sock_wq_push_file(&c->wq, file_fd, offset, len);
  if (rc) return rc;
  stats_add(c->r->stats, STAT_BYTES_OUT, len);
  conn__after_queue(c);
  if (was_empty && (c->flags & F_OPEN)) conn__flush(c);
  return 0;
}

size_t reactor_conn_pending(const conn_t *c) {
  return c->wq.bytes + c->tls_out.bytes;
}

size_t reactor_conn_pending_ready(conn_t *c) {
  size_t n = reactor_conn_pending(c);
  /* Bytes a small write left on the io_uring batch set no F_WROTE (a
   * direct write would have sent them); whoever saw them waits for
   * on_ready all the same. */
  if (n && !(c->flags & F_DEAD)) c->flags |= F_WROTE;
  return n;
}

bool reactor_conn_congested(const conn_t *c) { return c->flags & F_BP; }

void reactor_conn_close(conn_t *c, int reason) {
  if (c->flags & (F_DEAD | F_CLOSING)) return;
  if (!(c->flags & F_OPEN)) {
    conn__kill(c, reason);
    return;
  }
  c->flags |= F_CLOSING;
  c->reason = reason;
  if (c->tls && (c->flags & F_HANDSHAKE)) { /* nothing to say goodbye to */
    conn__kill(c, reason);
    return;
  }
  if (c->tls) { /* the plaintext queue, then close_notify, then the close */
    if (!c->wq.head) conn__flush(c);
    return;
  }
  if (!c->wq.head) conn__kill(c, reason);
}

void reactor_conn_force_close(conn_t *c, int reason) {
  if (c->flags & F_CLOSING) c->flags &= ~F_CLOSING; /* take the new reason */
  conn__kill(c, reason);
}

void reactor_conn_pause(conn_t *c) { c->flags |= F_PAUSED; }

void reactor_conn_resume(conn_t *c) {
  if (!(c->flags & F_PAUSED)) return;
  c->flags &= ~F_PAUSED;
  if (conn__want_read(c)) conn__enqueue(c, P_READ);
}

void reactor_conn_hold(conn_t *c) {
  c->hold++;
  reactor_ref(c->r);
}

void reactor_conn_release(conn_t *c) {
  reactor_unref(c->r);
  if (--c->hold > 0) return;
  if ((c->flags & F_DEAD) || c->pend || conn__want_read(c))
    conn__enqueue(c, conn__want_read(c) ? P_READ : 0);
}

bool reactor_conn_busy(const conn_t *c) { return c->hold > 0 || c->tasks; }

int reactor_conn_task(conn_t *c, void (*fn)(conn_t *, void *), void *arg) {
  if (!reactor_conn_busy(c) && !(c->flags & F_DEAD)) {
    c->hold++;
    fn(c, arg);
    c->hold--;
    if (c->hold == 0 && ((c->flags & F_DEAD) || c->pend))
      conn__enqueue(c, 0);
    return 0;
  }
  conn_task_t *t = malloc(sizeof(*t));
  if (!t) return -ENOMEM;
  *t = (conn_task_t){NULL, fn, arg};
  if (c->tasks_tail)
    c->tasks_tail->next = t;
  else
    c->tasks = t;
  c->tasks_tail = t;
  c->pend |= P_TASK;
  if (c->hold == 0) conn__enqueue(c, P_TASK);
  return 0;
}

void reactor_conn_set_timeout(conn_t *c, uint32_t timeout_ms) {
  c->timeout_ms = timeout_ms;
  c->last_active = c->r->now;
}

uint32_t reactor_conn_timeout(const conn_t *c) { return c->timeout_ms; }
size_t reactor_conn_max_queue(const conn_t *c) { return c->max_queue; }
sock_uuid_t reactor_conn_uuid(const conn_t *c) { return c->uuid; }
reactor_t *reactor_conn_reactor(const conn_t *c) { return c->r; }
void *reactor_conn_service(const conn_t *c) { return c->service; }
void *reactor_conn_udata(const conn_t *c) { return c->udata; }
void reactor_conn_set_udata(conn_t *c, void *udata) { c->udata = udata; }
int reactor_conn_fd(const conn_t *c) { return c->fd; }

int reactor_conn_peer(conn_t *c, char *ip, size_t iplen, int *port) {
  if (!c->peer.family) {
    int rc = sock_peer_addr(c->fd, &c->peer);
    if (rc) return rc;
  }
  sock_addr_text(&c->peer, ip, iplen, port);
  return 0;
}

bool reactor_conn_is_open(const conn_t *c) {
  return !(c->flags & (F_DEAD | F_CLOSING));
}

conn_t *reactor_conn_find(reactor_t *r, sock_uuid_t uuid) {
  conn_t *c = sock_uuid_udata(uuid, r->index);
  return c && !(c->flags & F_DEAD) ? c : NULL;
}

/* ---- the loop ---- */

static void reactor__sweep(mp_timer_t *t) {
  reactor_t *r = t->udata;
  for (linger_t *lg = r->lingers, *next; lg; lg = next) {
    next = lg->next;
    if (r->now >= lg->until) linger__free(r, lg);
  }
  for (conn_t *c = r->live; c; c = c->next) {
    if (c->timeout_ms && !(c->flags & F_CONNECTING) &&
        r->now - c->last_active >= c->timeout_ms) {
      c->last_active = r->now;
      conn__enqueue(c, P_TIMEOUT);
    }
  }
  /* An idle lane keeps no spare packets. */
  uint64_t used = r->pool.hits + r->pool.misses;
  if (used == r->pool_seen) sock_pool_trim(&r->pool, 0);
  r->pool_seen = used;
}

reactor_t *reactor_new(int index) {
  reactor_t *r = calloc(1, sizeof(*r));
  if (!r) return NULL;
  r->kind = KIND_MAILBOX;
  r->index = index;
  r->poller = -1;
  sock_pool_init(&r->pool, SOCK_POOL_DEFAULT_IDLE);
  r->rbuf = malloc(REACTOR_READ_CHUNK);
  int rc = r->rbuf ? 0 : -ENOMEM;
  if (!rc) rc = defer_queue_init(&r->mailbox, true);
  if (!rc) {
    rc = defer_queue_init(&r->local, false);
    if (rc) defer_queue_deinit(&r->mailbox);
  }
  if (rc) {
    free(r->rbuf);
    free(r);
    errno = -rc;
    return NULL;
  }
  r->poller = poll_new();
  if (r->poller < 0 ||
      poll_add(r->poller, defer_wake_fd(&r->mailbox), r, POLL_READ)) {
    int e = r->poller < 0 ? -r->poller : errno;
    poll_free(r->poller);
    defer_queue_deinit(&r->mailbox);
    defer_queue_deinit(&r->local);
    free(r->rbuf);
    free(r);
    errno = e;
    return NULL;
  }
  timer_heap_init(&r->timers);
  timer_init(&r->sweep);
  r->now = reactor_clock_ms();
  return r;
}

void reactor_free(reactor_t *r) {
  if (!r) return;
  while (r->listeners) reactor_listener_close(r->listeners);
  while (r->watches) reactor_unwatch(r->watches);
  reactor__free_closed_listeners(r);
  /* Tasks still posted (connections handed over during the shutdown) see a
   * stopping reactor and close what they carry. */
  r->stopping = true;
  defer_run(&r->mailbox, (size_t)-1);
  while (r->live) {
    conn_t *c = r->live;
    c->flags |= F_NOTIFIED;
    conn__kill(c, CONN_SHUTDOWN);
  }
  while (r->zombies) conn__free(r->zombies);
  /* Exiting does not wait for lingering peers; one last drain makes a
   * reset (and lost bytes) unlikely. */
  while (r->lingers) {
    linger__drain(r, r->lingers->fd);
    linger__free(r, r->lingers);
  }
  timer_heap_deinit(&r->timers);
  defer_queue_deinit(&r->mailbox);
  defer_queue_deinit(&r->local);
  poll_free(r->poller);
  net_uring_free(r->uring);
  free(r->rbuf);
  free(r->tls_plain);
  free(r->tls_gather);
  sock_pool_deinit(&r->pool);
  free(r);
}

int reactor_index(const reactor_t *r) { return r->index; }
/* The clock, not r->now: a deadline armed late in an iteration (after a
 * slow Lua callback, say) would start from the iteration's stamp and
 * fire that much early (a 2 s connect timeout after a 1.5 s callback
 * fired in 0.5 s). One vDSO read. */
uint64_t reactor_now(const reactor_t *r) {
  (void)r;
  return reactor_clock_ms();
}
uint64_t reactor_loop_ms(const reactor_t *r) { return r->now; }
timer_heap_t *reactor_timers(reactor_t *r) { return &r->timers; }
bool reactor_stopping(const reactor_t *r) { return r->stopping; }
void reactor_ref(reactor_t *r) { r->refs++; }
void reactor_unref(reactor_t *r) { r->refs--; }

void reactor_set_stop_hook(reactor_t *r, void (*fn)(reactor_t *, void *),
                           void *arg) {
  r->stop_hook = fn;
  r->stop_arg = arg;
}

int reactor_post(reactor_t *r, void (*fn)(void *, void *), void *a, void *b) {
  return defer_push(&r->mailbox, fn, a, b);
}

int reactor_defer(reactor_t *r, void (*fn)(void *, void *), void *a, void *b) {
  r->local_pushed = true;
  return defer_push(&r->local, fn, a, b);
}

static void reactor__begin_shutdown(void *a, void *b) {
  reactor_t *r = a;
  uint64_t grace = (uint64_t)(uintptr_t)b;
  if (r->stopping) {
    r->deadline = 0; /* asked twice: stop waiting */
    return;
  }
  r->stopping = true;
  r->deadline = reactor_clock_ms() + grace;
  for (listener_t *l = r->listeners; l; l = l->next) {
    if (l->polled) poll_del(r->poller, l->fd);
    l->polled = false;
    timer_stop(&r->timers, &l->retry);
  }
  for (conn_t *c = r->live; c; c = c->next)
    if (!(c->flags & F_OUTLIVE)) conn__enqueue(c, P_SHUTDOWN);
}

/* Whether a stopping loop still waits for a connection: one that does not
 * outlive the shutdown. */
static bool reactor__waits_for_conns(const reactor_t *r) {
  return r->nlive > r->noutlive;
}

void reactor_shutdown(reactor_t *r, uint64_t grace_ms) {
  reactor_post(r, reactor__begin_shutdown, r, (void *)(uintptr_t)grace_ms);
}

static void reactor__begin_drain(void *a, void *b) {
  reactor_t *r = a;
  if (r->stopping || r->draining) return;
  r->draining = true;
  r->drain_deadline = reactor_clock_ms() + (uint64_t)(uintptr_t)b;
  for (listener_t *l = r->listeners; l; l = l->next) {
    if (l->polled) poll_del(r->poller, l->fd);
    l->polled = false;
    timer_stop(&r->timers, &l->retry);
  }
}

bool reactor_draining(const reactor_t *r) {
  return r->draining || atomic_load_explicit(&r->drain_asked, memory_order_relaxed);
}

void reactor_set_stats(reactor_t *r, stats_slot_t *slot) { r->stats = slot; }

void reactor_drain(reactor_t *r, uint64_t drain_ms, uint64_t grace_ms) {
  r->drain_grace = grace_ms; /* read on the loop thread after the post */
  atomic_store_explicit(&r->drain_asked, true, memory_order_relaxed);
  reactor_post(r, reactor__begin_drain, r, (void *)(uintptr_t)drain_ms);
}

static void reactor__event(reactor_t *r, poll_event_t *ev) {
  int kind = *(int *)ev->ptr;
  if (kind == KIND_MAILBOX) {
    defer_wake_clear(&r->mailbox);
    return; /* drained after the events */
  }
  if (kind == KIND_WATCH) {
    reactor_watch_t *w = ev->ptr;
    if (w->closed) return;
    if (w->fn_io)
      w->fn_io(w->arg, ev->flags);
    else
      w->fn(w->arg);
    return;
  }
  if (kind == KIND_LINGER) {
    linger_t *lg = ev->ptr;
    if (linger__drain(r, lg->fd)) linger__free(r, lg);
    return;
  }
  if (kind == KIND_LISTENER) {
    listener_t *l = ev->ptr;
    if (!l->closed) listener__accept(l);
    return;
  }
  conn_t *c = ev->ptr;
  if (c->flags & F_DEAD) return;
  if (c->flags & F_CONNECTING) {
    if (ev->flags & (POLL_WRITE | POLL_HUP))
      conn__connected(c, sock_connect_result(c->fd));
    return;
  }
  if (ev->flags & POLL_WRITE) conn__flush(c);
  if (c->flags & F_DEAD) return;
  if (ev->flags & POLL_READ) {
    c->flags |= F_READ_PENDING;
    if (ev->flags & (POLL_HUP | POLL_RDHUP)) c->flags |= F_PEER_HUP;
    if (conn__can_read(c)) {
      conn__read(c);
    } else if (ev->flags & POLL_HUP) {
      /* Not reading (paused, back pressure, closing, a callback waits),
       * but the peer is gone both ways or the socket failed: nothing can
       * be delivered any more, so don't wait for a resume. */
      int err = sock_connect_result(c->fd);
      if (err)
        conn__kill_errno(c, err);
      else
        conn__kill(c, CONN_PEER);
    }
  }
}

/* ---- io_uring: reads ahead and the send list (net/uring.h) ---- */

/* Reads each connection the events report readable (and that could read
 * now) ahead, all in one system call; conn__read takes the result instead
 * of calling read(2). */
static void reactor__prefetch(reactor_t *r, const poll_event_t *ev, int n) {
  bool any = false;
  for (int i = 0; i < n; i++) {
    if (*(int *)ev[i].ptr != KIND_CONN || !(ev[i].flags & POLL_READ)) continue;
    conn_t *c = ev[i].ptr;
    if (net_uring_read_ready(&c->io) || (c->flags & F_CONNECTING) ||
        !conn__can_read(c))
      continue;
    if (!net_uring_read_ahead(r->uring, &c->io)) break;
    any = true;
  }
  if (any) net_uring_read_run(r->uring);
}

/* A read ahead that could not be kept: its bytes are lost. */
static void prefetch__lost(net_uring_io_t *io) {
  conn__kill(conn__of(io), CONN_ERROR);
}

/* One batched send's result: like conn__flush after its write. */
static void batch__done(void *tag, int res, void *arg) {
  net_uring_io_t *io = tag;
  conn_t *c = conn__of(io);
  (void)arg;
  if (c->flags & F_DEAD) return;
  sock_wq_t *q = io->wq; /* a TLS connection's records, else c->wq */
  if (res == NET_URING_DIRECT) { /* a file first, or the ring was full */
    if (q->head || c->wq.head) conn__flush(c);
    return;
  }
  if (res < 0 && res != -EAGAIN && res != -EINTR) {
    conn__kill_errno(c, res);
    return;
  }
  if (res > 0) sock_wq_consume(q, (size_t)res);
  if (c->tls) { /* more plaintext to encrypt, or close_notify */
    if (q->head && res >= 0 && (size_t)res < io->sent) {
      conn__after_queue(c); /* the socket is full: a write event resumes */
      return;
    }
    if (q->head || c->wq.head || (c->flags & F_CLOSING))
      conn__flush(c);
    else
      conn__wrote(c, true);
    return;
  }
  if (c->wq.head) {
    /* A full socket brings a write event once it drains; anything else
     * left (more pieces than one send carries, a file) goes out now. */
    conn__after_queue(c);
    if (res >= 0 && (size_t)res == io->sent) {
      conn__flush(c);
      return;
    }
  }
  conn__wrote(c, !c->wq.head);
}

int reactor_run(reactor_t *r) {
  poll_event_t ev[256];
  r->now = reactor_clock_ms();
  timer_start(&r->timers, &r->sweep, r->now, 1000, 1000, 0, reactor__sweep,
              NULL, r);
  if (!r->uring_tried) { /* here: the ring belongs to the running thread */
    r->uring_tried = true;
    r->uring = net_uring_new();
    static atomic_bool told;
    if (!r->uring && errno != ENOTSUP && !atomic_exchange(&told, true))
      log_info("io_uring unavailable (%s): each read and write is its own "
               "system call", strerror(errno));
  }
  for (;;) {
    if (r->uring && net_uring_has_sends(r->uring))
      net_uring_send_all(r->uring, batch__done);
    int wait = -1;
    r->now = reactor_clock_ms(); /* the work since the poll took time */
    if (r->pend_head || r->more_tasks || r->local_pushed) {
      wait = 0;
    } else {
      int64_t t = timer_heap_wait(&r->timers, r->now);
      if (t >= 0) wait = t > 1000 ? 1000 : (int)t;
      if (r->stopping) {
        int64_t left = r->deadline > r->now ? (int64_t)(r->deadline - r->now) : 0;
        if (wait < 0 || left < wait) wait = (int)left;
      }
    }
    int n = poll_wait(r->poller, ev, 256, wait);
    if (n < 0) return n;
    r->now = reactor_clock_ms();
    if (r->uring && n > 1) reactor__prefetch(r, ev, n);
    for (int i = 0; i < n; i++) reactor__event(r, &ev[i]);
    if (r->uring) net_uring_read_end(r->uring, prefetch__lost);
    reactor__drain_pending(r);
    /* The answers go out before the timers run (one may run long). */
    if (r->uring && net_uring_has_sends(r->uring))
      net_uring_send_all(r->uring, batch__done);
    timer_heap_run(&r->timers, r->now);
    /* A queue left non-empty sends no new wake-up: poll without waiting. */
    r->local_pushed = false;
    r->more_tasks = defer_run(&r->mailbox, 1024) == 1024;
    r->more_tasks |= defer_run(&r->local, 1024) == 1024;
    reactor__drain_pending(r);
    reactor__free_closed_listeners(r);
    /* Draining: no new connections; once the open ones are gone, or at the
     * drain deadline, a normal shutdown. */
    if (r->draining && !r->stopping &&
        (!r->live || r->now >= r->drain_deadline))
      reactor__begin_shutdown(r, (void *)(uintptr_t)r->drain_grace);
    if (!r->stopping) continue;
    bool past = r->now >= r->deadline;
    if (past) {
      while (r->live) conn__kill(r->live, CONN_SHUTDOWN);
      reactor__drain_pending(r);
    }
    if (!past && reactor__waits_for_conns(r)) continue;
    if (!r->stop_hook_done) {
      r->stop_hook_done = true;
      if (r->deadline < r->now + 1000) r->deadline = r->now + 1000;
      if (r->stop_hook) r->stop_hook(r, r->stop_arg);
      r->more_tasks = true; /* check again at once, not after the sweep */
      continue;
    }
    /* Past the deadline the loop ends whatever is left: callbacks still
     * waiting are abandoned (their connections get no on_close). */
    if (past) break;
    if (r->refs > 0 || r->zombies || r->pend_head ||
        reactor__waits_for_conns(r))
      continue;
    if (!r->live) break;
    /* Only connections that outlive the shutdown are left: they close
     * now, and the loop ends once what that sets off is done. */
    while (r->live) conn__kill(r->live, CONN_SHUTDOWN);
    reactor__drain_pending(r);
    r->more_tasks = true;
  }
  if (r->uring && net_uring_has_sends(r->uring))
    net_uring_send_all(r->uring, batch__done);
  timer_stop(&r->timers, &r->sweep);
  return 0;
}
