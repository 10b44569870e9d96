/* reactor: the per-lane event loop: epoll readiness, timers, a mailbox,
 * connection state and event dispatch. */
#include "net/reactor.h"

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

/* What an epoll event points at: the first member of each pollable. */
enum { KIND_CONN = 1, KIND_LISTENER, KIND_MAILBOX, KIND_LINGER, KIND_WATCH };

struct reactor_watch {
  int kind; /* KIND_WATCH */
  int fd;
  bool closed; /* freed at the end of the loop iteration */
  void (*fn)(void *arg);
  void *arg;
  reactor_t *r;
  struct reactor_watch *next; /* on the reactor's list, or its closed list */
  void (*fn_io)(void *arg, unsigned events); /* instead of fn */
  unsigned flags;
};

/* How long a closed socket is drained for the peer's EOF (see linger). */
#define REACTOR_LINGER_MS 2000

/* Connection flags. */
enum {
  F_OPEN = 1u << 0,         /* connected; on_open delivered or due */
  F_CONNECTING = 1u << 1,   /* client connect in progress */
  F_PAUSED = 1u << 2,       /* the application paused reading */
  F_BP = 1u << 3,           /* back pressure: queue over the limit */
  F_READ_PENDING = 1u << 4, /* the socket may hold unread bytes */
  F_CLOSING = 1u << 5,      /* close once the queue drains */
  F_DEAD = 1u << 6,         /* fd closed, uuid invalid */
  F_NOTIFIED = 1u << 7,     /* on_close / on_fail delivered */
  F_FAILED = 1u << 8,       /* never opened: on_fail instead of on_close */
  F_IN_LIST = 1u << 9,      /* on the pending list */
  F_WROTE = 1u << 10,       /* the queue was non-empty: on_ready when drained */
  F_PEER_HUP = 1u << 11,    /* the peer shut down: read to EOF */
  F_ZOMBIE = 1u << 12,      /* dead, waiting for hold == 0, on zombie list */
  F_ACCEPTED = 1u << 13,    /* a server connection: counted open (stats) */
  F_HANDSHAKE = 1u << 14,   /* TLS: the handshake is not done (no on_open) */
  F_TLS_BYE = 1u << 15,     /* TLS: close_notify is out */
};

/* Plaintext a TLS connection encrypts per record: a record with its
 * overhead (22 bytes in TLS 1.3, 29 in 1.2) then fits the write queue's
 * largest pooled packet (16 KiB), so records never go to malloc. */
#define REACTOR_TLS_CHUNK ((size_t)16384 - 64)
/* Plaintext encrypted per step of a flush before the socket is tried. */
#define REACTOR_TLS_STEP (4 * REACTOR_TLS_CHUNK)
/* Plaintext one TLS read delivers at most (a few records). */
#define REACTOR_TLS_PLAIN ((size_t)64 * 1024)

/* Events that wait while the connection is held. */
enum {
  P_OPEN = 1u << 0,
  P_SHUTDOWN = 1u << 1,
  P_READ = 1u << 2,
  P_READY = 1u << 3,
  P_TIMEOUT = 1u << 4,
  P_SHUTCLOSE = 1u << 5, /* on_shutdown has run: close */
  P_TASK = 1u << 6,      /* reactor_conn_task waiting */
};

typedef struct conn_task {
  struct conn_task *next;
  void (*fn)(conn_t *c, void *arg);
  void *arg;
} conn_task_t;

struct conn {
  int kind; /* KIND_CONN */
  int fd;
  sock_uuid_t uuid;
  uint32_t flags;
  uint32_t pend;
  int hold; /* callbacks running or suspended */
  int reason;
  int fail_err;
  uint32_t timeout_ms;
  size_t write_limit;
  size_t max_queue;
  uint64_t last_active;
  reactor_t *r;
  const proto_t *proto;
  void *service, *udata;
  sock_wq_t wq;
  conn_t *prev, *next;   /* live list, or zombie list once dead */
  conn_t *pending_next;  /* pending list */
  /* Its part of the io_uring batching (net/uring.h): on the send list, a
   * read done ahead. Untouched on the direct path. */
  net_uring_io_t io;
  mp_timer_t *connect_timer;
  conn_task_t *tasks, *tasks_tail; /* reactor_conn_task, in order */
  /* TLS (net/tls.h), or NULL. `wq` then holds plaintext and `tls_out` the
   * records made from it that the socket has not taken yet (the io_uring
   * batch sends from tls_out); see "TLS" below. */
  net_tls_t *tls;
  sock_wq_t tls_out;
  const char *tls_plain_reply;
  uint32_t open_timeout_ms; /* timeout_ms once the handshake is done */
};

struct listener {
  int kind; /* KIND_LISTENER */
  int fd;
  bool polled;
  reactor_t *r;
  const proto_t *proto;
  void *service;
  conn_opts_t opts;
  mp_timer_t retry; /* re-arms accepting after EMFILE */
  void (*dispatch)(listener_t *l, int fd, void *arg);
  void *dispatch_arg;
  bool closed; /* freed at the end of the loop iteration */
  listener_t *prev, *next;
};

/* A socket we closed gracefully, still being read until the peer's EOF. */
typedef struct mp_linger {
  int kind; /* KIND_LINGER */
  int fd;
  uint64_t until;
  struct mp_linger *prev, *next;
} linger_t;

/* Everything here belongs to the reactor's thread, except `mailbox` (its
 * own lock) and `shutdown_req` (atomic: set by any thread). */
struct reactor {
  int kind; /* KIND_MAILBOX: the mailbox eventfd's event points here */
  int index;
  int poller;
  uint64_t now;
  timer_heap_t timers;
  defer_queue_t mailbox;
  defer_queue_t local; /* reactor_defer: same thread, no wake-up */
  conn_t *live;        /* open connections */
  conn_t *zombies;     /* dead, still held */
  size_t nlive;
  conn_t *pend_head, *pend_tail;
  listener_t *listeners;
  listener_t *closed_listeners; /* closed, freed after this iteration */
  linger_t *lingers;            /* closed sockets draining the peer */
  reactor_watch_t *watches, *closed_watches;
  mp_timer_t sweep; /* idle timeouts, once a second */
  int refs;
  bool more_tasks;   /* a queue still had tasks after the last run */
  bool local_pushed; /* reactor_defer was called since the last run */
  bool stopping, stop_hook_done;
  bool draining;
  /* reactor_drain was called (any thread): a keep-alive answer already
   * says Connection: close before the loop gets to the posted drain, which
   * an event in the same epoll batch would otherwise beat */
  _Atomic bool drain_asked;
  uint64_t drain_deadline;
  _Atomic uint64_t drain_grace;
  uint64_t deadline;
  void (*stop_hook)(reactor_t *r, void *arg);
  void *stop_arg;
  char *rbuf;
  /* TLS connections' scratch: decrypted bytes on the way to on_data, and
   * plaintext gathered into one record. Made with the first of them. */
  char *tls_plain, *tls_gather;
  /* Writes of connections whose queue was empty wait on uring's send list
   * until the end of the loop iteration, then go out in one system call,
   * and the reads of one epoll_wait are done ahead in one (net/uring.h);
   * NULL: each read and write is its own system call, at once. */
  net_uring_t *uring;
  bool uring_tried;
  stats_slot_t *stats; /* the lane's counters, or NULL */
  /* The write-queue packets of this reactor's connections (net/sock.h):
   * written packets wait here for the next write instead of going back to
   * malloc. Emptied by the sweep once a second passes without a write. */
  sock_pool_t pool;
  uint64_t pool_seen; /* pool hits + misses at the last sweep */
};

/* The connection an io belongs to. */
static inline conn_t *conn__of(net_uring_io_t *io) {
  return (conn_t *)((char *)io - offsetof(conn_t, io));
}

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

static void conn__enqueue(conn_t *c, uint32_t pend) {
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

static void list__push(conn_t **head, conn_t *c) {
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
static void conn__kill(conn_t *c, int reason) {
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
  c->flags |= F_ZOMBIE;
  list__push(&r->zombies, c);
  conn__enqueue(c, 0);
}

static bool conn__can_read(const conn_t *c) {
  return !(c->flags & (F_DEAD | F_PAUSED | F_BP | F_CLOSING | F_CONNECTING)) &&
         (c->flags & F_OPEN) && c->hold == 0;
}

static void conn__tls_read(conn_t *c);
static void conn__flush(conn_t *c);

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
static ssize_t conn__read_raw(conn_t *c, const char **buf, char **own) {
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
static bool conn__read_none(conn_t *c, ssize_t n) {
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
  conn__kill(c, errno == ECONNRESET ? CONN_PEER : CONN_ERROR);
  return false;
}

static void conn__read(conn_t *c) {
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
static void conn__call(conn_t *c, void (*fn)(conn_t *)) {
  c->hold++;
  fn(c);
  c->hold--;
}

static void conn__finish(conn_t *c) {
  if (!(c->flags & F_NOTIFIED)) {
    c->flags |= F_NOTIFIED;
    c->hold++;
    if (c->flags & F_ACCEPTED) stats_add(c->r->stats, STAT_CONN_CLOSED, 1);
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

static void conn__after_queue(conn_t *c) {
  if (c->wq.bytes > 0) {
    c->flags |= F_WROTE;
    if (c->wq.bytes > c->write_limit) c->flags |= F_BP;
  }
}

/* After queued bytes went out (directly or in a batch): back pressure
 * ends at half the limit; once the queue is empty (`drained`) a close
 * asked for completes, or on_ready is due. */
static void conn__wrote(conn_t *c, bool drained) {
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

static void conn__tls_flush(conn_t *c);

static void conn__flush(conn_t *c) {
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
    conn__kill(c, rc == -ECONNRESET || rc == -EPIPE ? CONN_PEER : CONN_ERROR);
    return;
  }
  conn__wrote(c, rc == 0);
}

static int conn__tls_write(conn_t *c, const char *p, size_t len,
                           sock_release_fn release, void *ctx, void *ctx2);

static int conn__write(conn_t *c, const void *data, size_t len,
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
      conn__kill(c, rc == -ECONNRESET || rc == -EPIPE ? CONN_PEER : CONN_ERROR);
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
sock_uuid_t reactor_conn_uuid(const conn_t *c) { return c->uuid; }
reactor_t *reactor_conn_reactor(const conn_t *c) { return c->r; }
void *reactor_conn_service(const conn_t *c) { return c->service; }
void *reactor_conn_udata(const conn_t *c) { return c->udata; }
void reactor_conn_set_udata(conn_t *c, void *udata) { c->udata = udata; }
int reactor_conn_fd(const conn_t *c) { return c->fd; }

bool reactor_conn_is_open(const conn_t *c) {
  return !(c->flags & (F_DEAD | F_CLOSING));
}

conn_t *reactor_conn_find(reactor_t *r, sock_uuid_t uuid) {
  conn_t *c = sock_uuid_udata(uuid, r->index);
  return c && !(c->flags & F_DEAD) ? c : NULL;
}

/* ---- TLS (net/tls.h) ----
 *
 * A TLS connection's write queue `wq` holds plaintext, exactly as a plain
 * connection's holds what goes on the wire, so back pressure, max_queue,
 * on_ready and a graceful close mean the same over TLS. Plaintext is
 * encrypted when it goes out: at once when nothing waits (the records go
 * to the socket, or on the io_uring batch, from `tls_out`), else by the
 * flush, which turns at most REACTOR_TLS_STEP of the queue into records
 * each time the socket has room. So the records that wait in memory are
 * bounded by one step whatever was queued, and bytes are encrypted in the
 * order they go on the wire (a record's sequence number is its place in
 * the stream: nothing queued may be encrypted ahead of what waits). A
 * file in the queue is read and encrypted by the same flush (no kTLS). */

/* Records from OpenSSL (the handshake's, or conn__tls_put's). */
static int conn__tls_out(void *arg, const void *data, size_t len) {
  conn_t *c = arg;
  if (c->flags & F_DEAD) return -EPIPE;
  return sock_wq_push_copy(&c->tls_out, data, len);
}

static int conn__tls_init(conn_t *c, conn_opts_t opts) {
  reactor_t *r = c->r;
  if (!r->tls_plain) {
    r->tls_plain = malloc(REACTOR_TLS_PLAIN);
    r->tls_gather = malloc(REACTOR_TLS_CHUNK);
    if (!r->tls_plain || !r->tls_gather) return -ENOMEM;
  }
  c->tls = net_tls_new(opts.tls, opts.tls_host, conn__tls_out, c);
  if (!c->tls) return -ENOMEM;
  c->tls_plain_reply = opts.tls_plain_reply;
  c->flags |= F_HANDSHAKE;
  c->open_timeout_ms = c->timeout_ms;
  if (!c->timeout_ms) c->timeout_ms = REACTOR_HANDSHAKE_MS;
  /* the io_uring batch sends records, not the plaintext */
  net_uring_io_init(&c->io, c->fd, &c->tls_out);
  return 0;
}

/* Turns up to REACTOR_TLS_STEP bytes from the head of the plaintext queue
 * into records. Small pieces (pipelined answers, frames) are gathered into
 * one record. 0 or a negative errno. */
static int conn__tls_encrypt(conn_t *c) {
  reactor_t *r = c->r;
  size_t done = 0;
  while (done < REACTOR_TLS_STEP && c->wq.head) {
    struct iovec iov[16];
    int cnt = sock_wq_iov(&c->wq, iov, 16, NULL);
    size_t n;
    if (cnt == 0) { /* a file */
      ssize_t got = sock_wq_read_file(&c->wq, r->tls_gather, REACTOR_TLS_CHUNK);
      if (got < 0) return (int)got;
      if (net_tls_write(c->tls, r->tls_gather, (size_t)got)) return -EPROTO;
      n = (size_t)got;
    } else if (cnt == 1 || iov[0].iov_len >= REACTOR_TLS_CHUNK / 2) {
      n = iov[0].iov_len < REACTOR_TLS_CHUNK ? iov[0].iov_len
                                             : REACTOR_TLS_CHUNK;
      if (net_tls_write(c->tls, iov[0].iov_base, n)) return -EPROTO;
      sock_wq_consume(&c->wq, n);
    } else {
      n = 0;
      for (int i = 0; i < cnt && n < REACTOR_TLS_CHUNK; i++) {
        size_t k = iov[i].iov_len;
        if (k > REACTOR_TLS_CHUNK - n) k = REACTOR_TLS_CHUNK - n;
        memcpy(r->tls_gather + n, iov[i].iov_base, k);
        n += k;
      }
      if (net_tls_write(c->tls, r->tls_gather, n)) return -EPROTO;
      sock_wq_consume(&c->wq, n);
    }
    done += n;
  }
  return 0;
}

static void conn__tls_flush(conn_t *c) {
  if (c->flags & F_DEAD) return;
  /* Written here and now: whatever waited for the batch goes first. */
  if (net_uring_queued(&c->io)) net_uring_send_cancel(c->r->uring, &c->io);
  bool open = net_tls_open(c->tls);
  for (;;) {
    if (c->tls_out.head) {
      int rc = sock_wq_flush(c->fd, &c->tls_out);
      if (rc < 0) {
        conn__kill(c, rc == -ECONNRESET || rc == -EPIPE ? CONN_PEER
                                                         : CONN_ERROR);
        return;
      }
      if (rc == 1) { /* the socket is full: a write event resumes */
        if (!(c->flags & F_HANDSHAKE)) conn__wrote(c, false);
        return;
      }
    }
    if (open && c->wq.head) {
      if (conn__tls_encrypt(c)) {
        conn__kill(c, CONN_ERROR);
        return;
      }
      continue;
    }
    if (open && (c->flags & F_CLOSING) && !(c->flags & F_TLS_BYE)) {
      c->flags |= F_TLS_BYE;
      net_tls_close_notify(c->tls);
      if (c->tls_out.head) continue;
    }
    break;
  }
  if (open || (c->flags & F_CLOSING)) conn__wrote(c, !c->wq.head);
}

/* A write of plaintext (conn__write's TLS half). */
static int conn__tls_write(conn_t *c, const char *p, size_t len,
                           sock_release_fn release, void *ctx, void *ctx2) {
  int rc;
  reactor_t *r = c->r;
  if (c->wq.bytes >= c->max_queue) {
    rc = -ENOBUFS;
    goto fail;
  }
  stats_add(r->stats, STAT_BYTES_OUT, len);
  if (net_tls_open(c->tls) && !c->wq.head) {
    /* Nothing waits: encrypt now. A small write joins the batch of the
     * loop iteration (io_uring), as a plain connection's does. */
    if (r->uring && len <= NET_URING_SEND_MAX &&
        c->tls_out.bytes + len <= NET_URING_SEND_MAX &&
        (net_uring_queued(&c->io) || !c->tls_out.head)) {
      if (net_tls_write(c->tls, p, len)) goto broken;
      /* (a second small write of the iteration joins the records already
       * on the batch: io must not be put on the list twice) */
      if (!net_uring_queued(&c->io)) net_uring_send_later(r->uring, &c->io);
      if (release) release(ctx, ctx2);
      return 0;
    }
    if (c->tls_out.head) conn__tls_flush(c); /* what waited goes first */
    while (len > 0 && !c->tls_out.head && !(c->flags & F_DEAD)) {
      size_t n = len < REACTOR_TLS_CHUNK ? len : REACTOR_TLS_CHUNK;
      if (net_tls_write(c->tls, p, n)) goto broken;
      p += n;
      len -= n;
      int w = sock_wq_flush(c->fd, &c->tls_out);
      if (w < 0) {
        conn__kill(c, w == -ECONNRESET || w == -EPIPE ? CONN_PEER
                                                       : CONN_ERROR);
        rc = -EPIPE;
        goto fail;
      }
    }
    if (c->flags & F_DEAD) {
      rc = -EPIPE;
      goto fail;
    }
    if (!(c->flags & F_HANDSHAKE)) c->last_active = r->now;
    if (len == 0) {
      if (release) release(ctx, ctx2);
      return 0;
    }
  }
  /* The rest waits as plaintext (the socket is full, something waits
   * already, or the handshake is not done). */
  rc = release ? sock_wq_push_ref(&c->wq, p, len, release, ctx, ctx2)
               : sock_wq_push_copy(&c->wq, p, len);
  if (rc) return rc; /* the push released the reference */
  conn__after_queue(c);
  return 0;
broken:
  conn__kill(c, CONN_ERROR);
  rc = -EPIPE;
fail:
  if (release) release(ctx, ctx2);
  return rc;
}

/* The handshake is done: on_open (from the pending list, before any
 * plaintext), and what was written before goes out. */
static void conn__tls_opened(conn_t *c) {
  c->flags &= ~F_HANDSHAKE;
  if (c->connect_timer) timer_stop(&c->r->timers, c->connect_timer);
  c->timeout_ms = c->open_timeout_ms;
  c->last_active = c->r->now;
  conn__enqueue(c, P_OPEN);
  conn__tls_flush(c);
}

static void conn__tls_failed(conn_t *c, ssize_t why) {
  if (why == NET_TLS_PLAIN && c->tls_plain_reply) {
    /* A plain request to a TLS port: say so, in plaintext, then close
     * gracefully so the client reads it. */
    sock_wq_clear(&c->tls_out);
    if (sock_wq_push_copy(&c->tls_out, c->tls_plain_reply,
                          strlen(c->tls_plain_reply)) == 0) {
      c->flags |= F_CLOSING;
      c->reason = CONN_LOCAL;
      conn__tls_flush(c);
      return;
    }
  }
  if (c->flags & F_HANDSHAKE) c->fail_err = -EPROTO;
  /* A failed handshake's alert, if OpenSSL made one, goes out first. */
  if (c->tls_out.head) (void)sock_wq_flush(c->fd, &c->tls_out);
  conn__kill(c, CONN_ERROR);
}

/* conn__read's TLS half: raw bytes from the socket (or the batch's read
 * ahead) go into the record layer; the handshake runs there, and
 * decrypted bytes come out to on_data a few records at a time. */
static void conn__tls_read_some(conn_t *c);

static void conn__tls_read(conn_t *c) {
  conn__tls_read_some(c);
  /* Whatever way it left (its round limit, say, right after a read), the
   * fed bytes not read yet must not point into the reactor's buffer or the
   * batch's slot, which the next connection's read reuses. */
  if (!(c->flags & F_DEAD) && net_tls_stash(c->tls)) conn__kill(c, CONN_ERROR);
}

static void conn__tls_read_some(conn_t *c) {
  reactor_t *r = c->r;
  for (int round = 0; round < 16; round++) {
    /* (a handshake goes on while the protocol, not opened yet, would
     * have paused reading) */
    if (!conn__can_read(c) &&
        !((c->flags & F_HANDSHAKE) && c->hold == 0 &&
          !(c->flags & (F_DEAD | F_CONNECTING | F_CLOSING))))
      return;
    /* What the record layer holds already. */
    size_t got = 0;
    ssize_t n = 0;
    while (got + 16384 <= REACTOR_TLS_PLAIN) {
      n = net_tls_read(c->tls, r->tls_plain + got, REACTOR_TLS_PLAIN - got);
      if (n <= 0) break;
      got += (size_t)n;
    }
    if (c->tls_out.head && !net_uring_queued(&c->io) &&
        !(c->flags & F_DEAD)) {
      /* the handshake's messages, a ticket, an alert (an answer on the
       * batch list stays there) */
      conn__tls_flush(c);
      if (c->flags & F_DEAD) return;
    }
    if (got > 0) {
      if (net_tls_stash(c->tls)) { /* the rest must outlive r->rbuf */
        conn__kill(c, CONN_ERROR);
        return;
      }
      c->last_active = r->now;
      if (c->proto->on_data) {
        c->hold++;
        c->proto->on_data(c, r->tls_plain, got);
        if (--c->hold > 0) return; /* suspended: release re-queues reading */
        if (c->tasks) {
          conn__enqueue(c, P_TASK);
          return;
        }
      }
      if (n > 0 || n == NET_TLS_WANT) continue; /* more may wait */
    }
    if (n == NET_TLS_OPENED) {
      if (net_tls_stash(c->tls)) {
        conn__kill(c, CONN_ERROR);
        return;
      }
      conn__tls_opened(c); /* reading goes on after on_open */
      return;
    }
    if (n == NET_TLS_EOF) {
      reactor_conn_close(c, CONN_PEER);
      return;
    }
    if (n < 0) {
      conn__tls_failed(c, n);
      return;
    }
    if (net_tls_stash(c->tls)) {
      conn__kill(c, CONN_ERROR);
      return;
    }
    /* NET_TLS_WANT: more bytes from the socket. */
    if (!(c->flags & F_READ_PENDING)) return;
    const char *buf;
    char *own;
    ssize_t k = conn__read_raw(c, &buf, &own);
    if (k > 0) {
      if (!(c->flags & F_HANDSHAKE)) c->last_active = r->now;
      net_tls_feed(c->tls, buf, (size_t)k);
      if (own) { /* the batch's buffer goes now */
        int e = net_tls_stash(c->tls);
        free(own);
        if (e) {
          conn__kill(c, CONN_ERROR);
          return;
        }
      }
      continue;
    }
    free(own);
    if (conn__read_none(c, k)) continue;
    return;
  }
  conn__enqueue(c, P_READ); /* more to read: let others have a turn first */
}

bool reactor_conn_tls(const conn_t *c, net_tls_info_t *info) {
  if (!c->tls) return false;
  if (info) net_tls_info(c->tls, info);
  return true;
}

const char *reactor_conn_tls_error(const conn_t *c) {
  if (!c->tls) return NULL;
  return net_tls_has_failed(c->tls) ? net_tls_error(c->tls) : NULL;
}

/* ---- connections come into being ---- */

static conn_t *conn__new(reactor_t *r, int fd, const proto_t *proto,
                         void *service, conn_opts_t opts, uint32_t flags) {
  conn_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->kind = KIND_CONN;
  c->fd = fd;
  c->r = r;
  c->proto = proto;
  c->service = service;
  c->flags = flags;
  c->timeout_ms = opts.timeout_ms;
  c->write_limit = opts.write_limit ? opts.write_limit
                                    : REACTOR_DEFAULT_WRITE_LIMIT;
  c->max_queue = opts.max_queue ? opts.max_queue : REACTOR_DEFAULT_MAX_QUEUE;
  c->last_active = r->now;
  sock_wq_init_pooled(&c->wq, &r->pool);
  sock_wq_init_pooled(&c->tls_out, &r->pool);
  net_uring_io_init(&c->io, fd, &c->wq);
  if (opts.tls && conn__tls_init(c, opts)) {
    free(c);
    errno = ENOMEM;
    return NULL;
  }
  c->uuid = sock_uuid_open(fd, r->index, c);
  if (!c->uuid) {
    net_tls_free(c->tls);
    free(c);
    errno = EMFILE;
    return NULL;
  }
  /* Edge-triggered for both directions, registered once: no epoll_ctl per
   * read or write. */
  if (poll_add(r->poller, fd, c, POLL_READ | POLL_WRITE | POLL_EDGE)) {
    int e = errno;
    sock_uuid_close(c->uuid);
    net_tls_free(c->tls);
    free(c);
    errno = e;
    return NULL;
  }
  list__push(&r->live, c);
  r->nlive++;
  return c;
}

static void listener__accept(listener_t *l);

static void listener__retry(mp_timer_t *t) {
  listener_t *l = t->udata;
  if (!l->closed && !l->polled && !l->r->stopping &&
      poll_add(l->r->poller, l->fd, l, POLL_READ | POLL_EXCLUSIVE) == 0)
    l->polled = true;
}

static void listener__accept(listener_t *l) {
  reactor_t *r = l->r;
  /* on_open may close the listener: check after every connection. */
  for (int i = 0; i < 64 && !r->stopping && !l->closed; i++) {
    int fd = sock_accept(l->fd);
    if (fd == -EAGAIN) return;
    if (fd == -EINTR || fd == -ECONNABORTED) continue;
    if (fd < 0) {
      /* Out of fds: stop polling the listener for a moment, or the level-
       * triggered readiness would spin the loop. */
      log_warn("accept failed: %s; pausing accepts for 500 ms",
               strerror(-fd));
      if (l->polled && poll_del(r->poller, l->fd) == 0) l->polled = false;
      timer_start(&r->timers, &l->retry, r->now, 500, 0, 1, listener__retry,
                  NULL, l);
      return;
    }
    if (l->dispatch)
      l->dispatch(l, fd, l->dispatch_arg);
    else
      reactor_adopt(r, fd, l->proto, l->service, l->opts);
  }
}

void reactor_adopt(reactor_t *r, int fd, const proto_t *proto, void *service,
                   conn_opts_t opts) {
  if (r->stopping) {
    close(fd);
    return;
  }
  conn_t *c = conn__new(r, fd, proto, service, opts, F_OPEN | F_ACCEPTED);
  if (!c) {
    close(fd);
    return;
  }
  stats_add(r->stats, STAT_CONN_ACCEPTED, 1);
  /* TLS: on_open once the handshake is done (conn__tls_read) */
  if (proto->on_open && !c->tls) conn__call(c, proto->on_open);
  if (c->flags & F_DEAD) conn__enqueue(c, 0);
}

void reactor_listener_set_dispatch(listener_t *l,
                                   void (*dispatch)(listener_t *, int, void *),
                                   void *arg) {
  l->dispatch = dispatch;
  l->dispatch_arg = arg;
}

listener_t *reactor_listen(reactor_t *r, int fd, const proto_t *proto,
                           void *service, conn_opts_t opts) {
  listener_t *l = calloc(1, sizeof(*l));
  if (!l) return NULL;
  l->kind = KIND_LISTENER;
  l->fd = fd;
  l->r = r;
  l->proto = proto;
  l->service = service;
  l->opts = opts;
  timer_init(&l->retry);
  if (!r->stopping) {
    int rc = poll_add(r->poller, fd, l, POLL_READ | POLL_EXCLUSIVE);
    if (rc) {
      free(l);
      errno = -rc;
      return NULL;
    }
    l->polled = true;
  }
  l->next = r->listeners;
  if (l->next) l->next->prev = l;
  r->listeners = l;
  return l;
}

/* The listener may be in use further up the stack (accepting, an event
 * of this batch, its retry timer in the running timer batch), so it is
 * only unhooked here and freed at the end of the loop iteration. */
void reactor_listener_close(listener_t *l) {
  reactor_t *r = l->r;
  if (l->closed) return;
  l->closed = true;
  if (l->polled) poll_del(r->poller, l->fd);
  l->polled = false;
  timer_stop(&r->timers, &l->retry);
  if (l->prev)
    l->prev->next = l->next;
  else
    r->listeners = l->next;
  if (l->next) l->next->prev = l->prev;
  l->prev = NULL;
  l->next = r->closed_listeners;
  r->closed_listeners = l;
}

static reactor_watch_t *reactor__watch(reactor_t *r, int fd, unsigned flags,
                                       void (*fn)(void *),
                                       void (*fn_io)(void *, unsigned),
                                       void *arg) {
  reactor_watch_t *w = calloc(1, sizeof(*w));
  if (!w) return NULL;
  *w = (reactor_watch_t){KIND_WATCH, fd, false, fn, arg, r, r->watches,
                          fn_io, flags};
  int rc = poll_add(r->poller, fd, w, flags);
  if (rc) {
    free(w);
    errno = -rc;
    return NULL;
  }
  r->watches = w;
  return w;
}

reactor_watch_t *reactor_watch(reactor_t *r, int fd, void (*fn)(void *),
                               void *arg) {
  return reactor__watch(r, fd, POLL_READ, fn, NULL, arg);
}

reactor_watch_t *reactor_watch_io(reactor_t *r, int fd, unsigned flags,
                                  void (*fn)(void *arg, unsigned events),
                                  void *arg) {
  return reactor__watch(r, fd, flags, NULL, fn, arg);
}

int reactor_watch_set(reactor_watch_t *w, unsigned flags) {
  if (w->closed || w->flags == flags) return 0;
  w->flags = flags;
  return poll_mod(w->r->poller, w->fd, w, flags);
}

void reactor_unwatch(reactor_watch_t *w) {
  reactor_t *r = w->r;
  if (w->closed) return;
  w->closed = true;
  poll_del(r->poller, w->fd);
  reactor_watch_t **pp = &r->watches;
  while (*pp && *pp != w) pp = &(*pp)->next;
  if (*pp) *pp = w->next;
  w->next = r->closed_watches;
  r->closed_watches = w;
}

static void reactor__free_closed_listeners(reactor_t *r) {
  while (r->closed_watches) {
    reactor_watch_t *w = r->closed_watches;
    r->closed_watches = w->next;
    free(w);
  }
  while (r->closed_listeners) {
    listener_t *l = r->closed_listeners;
    r->closed_listeners = l->next;
    free(l);
  }
}

int reactor_listener_fd(const listener_t *l) { return l->fd; }

static void conn__connect_timeout(mp_timer_t *t) {
  conn_t *c = t->udata;
  if (!(c->flags & (F_CONNECTING | F_HANDSHAKE))) return;
  c->fail_err = -ETIMEDOUT;
  conn__kill(c, CONN_ERROR);
}

static void conn__connected(conn_t *c, int err) {
  /* TLS: the connect timeout covers the handshake too */
  if (c->connect_timer && (err || !c->tls))
    timer_stop(&c->r->timers, c->connect_timer);
  if (err) {
    c->fail_err = err;
    conn__kill(c, CONN_ERROR);
    return;
  }
  c->flags &= ~F_CONNECTING;
  c->flags |= F_OPEN | F_READ_PENDING;
  c->last_active = c->r->now;
  if (c->tls) { /* the ClientHello; on_open comes with the server's answer */
    conn__tls_read(c);
    return;
  }
  conn__enqueue(c, P_OPEN);
  conn__flush(c);
}

conn_t *reactor_connect(reactor_t *r, const char *host, int port,
                        const char *path, uint32_t connect_timeout_ms,
                        const proto_t *proto, void *service, conn_opts_t opts,
                        int *err) {
  bool done = false;
  if (r->stopping) {
    *err = -ECANCELED;
    return NULL;
  }
  int fd = path ? sock_connect_unix(path, &done)
                : sock_connect_tcp(host, port, &done);
  if (fd < 0) {
    *err = fd;
    return NULL;
  }
  conn_t *c;
  c = conn__new(r, fd, proto, service, opts, F_CONNECTING);
  if (!c) {
    *err = -errno;
    close(fd);
    return NULL;
  }
  if (done) {
    conn__connected(c, 0);
    return c;
  }
  if (connect_timeout_ms) {
    c->connect_timer = malloc(sizeof(*c->connect_timer));
    if (c->connect_timer) {
      timer_init(c->connect_timer);
      timer_start(&r->timers, c->connect_timer, r->now, connect_timeout_ms, 0,
                  1, conn__connect_timeout, NULL, c);
    }
  }
  return c;
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
uint64_t reactor_now(const reactor_t *r) { return r->now; }
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
    r->deadline = r->now; /* asked twice: stop waiting */
    return;
  }
  r->stopping = true;
  r->deadline = r->now + grace;
  for (listener_t *l = r->listeners; l; l = l->next) {
    if (l->polled) poll_del(r->poller, l->fd);
    l->polled = false;
    timer_stop(&r->timers, &l->retry);
  }
  for (conn_t *c = r->live; c; c = c->next) conn__enqueue(c, P_SHUTDOWN);
}

void reactor_shutdown(reactor_t *r, uint64_t grace_ms) {
  reactor_post(r, reactor__begin_shutdown, r, (void *)(uintptr_t)grace_ms);
}

static void reactor__begin_drain(void *a, void *b) {
  reactor_t *r = a;
  if (r->stopping || r->draining) return;
  r->draining = true;
  r->drain_deadline = r->now + (uint64_t)(uintptr_t)b;
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
      conn__kill(c, err && err != -ECONNRESET && err != -EPIPE ? CONN_ERROR
                                                               : CONN_PEER);
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
    conn__kill(c, res == -ECONNRESET || res == -EPIPE ? CONN_PEER : CONN_ERROR);
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
    if (r->live && !past) continue;
    if (!r->stop_hook_done) {
      r->stop_hook_done = true;
      if (r->deadline < r->now + 1000) r->deadline = r->now + 1000;
      if (r->stop_hook) r->stop_hook(r, r->stop_arg);
      r->more_tasks = true; /* check again at once, not after the sweep */
      continue;
    }
    /* Past the deadline the loop ends whatever is left: callbacks still
     * waiting are abandoned (their connections get no on_close). */
    if ((r->refs <= 0 && !r->zombies && !r->pend_head && !r->live) || past)
      break;
  }
  if (r->uring && net_uring_has_sends(r->uring))
    net_uring_send_all(r->uring, batch__done);
  timer_stop(&r->timers, &r->sweep);
  return 0;
}

/* ---- groups ---- */

struct reactor__io_task {
  sock_uuid_t uuid;
  void (*fn)(conn_t *c, void *a);
  void *a;
};

static void reactor__io_run(void *task, void *reactor) {
  struct reactor__io_task *t = task;
  conn_t *c = reactor_conn_find(reactor, t->uuid);
  t->fn(c, t->a);
  free(t);
}

void reactor_defer_io(reactor_group_t *g, sock_uuid_t uuid,
                      void (*fn)(conn_t *c, void *a), void *a) {
  int owner = sock_uuid_owner(uuid);
  struct reactor__io_task *t =
      owner >= 0 && (size_t)owner < g->n ? malloc(sizeof(*t)) : NULL;
  if (t) {
    *t = (struct reactor__io_task){uuid, fn, a};
    if (reactor_post(g->r[owner], reactor__io_run, t, g->r[owner]) == 0)
      return;
    free(t);
  }
  fn(NULL, a);
}

struct reactor__each_task {
  void *service;
  void (*fn)(conn_t *c, void *a);
  void *a;
};

static void reactor__each_run(void *task, void *reactor) {
  struct reactor__each_task *t = task;
  reactor_t *r = reactor;
  for (conn_t *c = r->live, *next; c; c = next) {
    next = c->next;
    /* (a TLS connection still in its handshake is not the protocol's yet) */
    if (c->service == t->service && !(c->flags & (F_DEAD | F_HANDSHAKE)))
      t->fn(c, t->a);
  }
  free(t);
}

void reactor_each(reactor_group_t *g, void *service,
                  void (*fn)(conn_t *c, void *a), void *a) {
  for (size_t i = 0; i < g->n; i++) {
    struct reactor__each_task *t = malloc(sizeof(*t));
    if (!t) continue;
    *t = (struct reactor__each_task){service, fn, a};
    if (reactor_post(g->r[i], reactor__each_run, t, g->r[i])) free(t);
  }
}
