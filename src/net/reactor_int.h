/* SPDX-License-Identifier: MIT */

/* reactor_int: what the files of the reactor share (reactor.c, the loop
 * and a connection's reads and writes; reactor_open.c, listeners, watches
 * and connects; reactor_tls.c; reactor_group.c): the reactor's structs
 * and the connection steps each calls of the others. Internal to
 * src/net: nothing outside the reactor includes it. */
#ifndef MP_REACTOR_INT_H
#define MP_REACTOR_INT_H

#include "net/reactor.h"

#include <stdatomic.h>

#include "core/defer.h"
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
  F_ACCEPTED = 1u << 13,    /* a server connection */
  F_HANDSHAKE = 1u << 14,   /* TLS: the handshake is not done (no on_open) */
  F_TLS_BYE = 1u << 15,     /* TLS: close_notify is out */
  F_RESET = 1u << 16,       /* the peer reset it (ECONNRESET) */
  F_COUNTED = 1u << 17,     /* a client's: counted open (stats) */
  F_OUTLIVE = 1u << 18,     /* outlives a shutdown's start (conn_opts_t) */
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
  conn_t *prev, *next;  /* live list, or zombie list once dead */
  conn_t *pending_next; /* pending list */
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
  sock_addr_t peer;         /* reactor_conn_peer's, once asked */
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
  size_t noutlive; /* of them, those that outlive a shutdown (F_OUTLIVE) */
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

/* ---- reactor.c ---- */

void conn__enqueue(conn_t *c, uint32_t pend);
void conn__kill(conn_t *c, int reason);
/* conn__kill for a failed read or write (err: a negative errno): a reset
 * or a broken pipe is the peer's doing (CONN_PEER; a reset is remembered
 * for reactor_conn_was_reset), anything else CONN_ERROR. */
void conn__kill_errno(conn_t *c, int err);
bool conn__can_read(const conn_t *c);
ssize_t conn__read_raw(conn_t *c, const char **buf, char **own);
bool conn__read_none(conn_t *c, ssize_t n);
void conn__read(conn_t *c);
void conn__after_queue(conn_t *c);
void conn__wrote(conn_t *c, bool drained);
int conn__write(conn_t *c, const void *data, size_t len,
                sock_release_fn release, void *ctx, void *ctx2);
void conn__flush(conn_t *c);
/* Delivers one held-back event with the connection held. */
void conn__call(conn_t *c, void (*fn)(conn_t *));
void list__push(conn_t **head, conn_t *c);

/* ---- reactor_open.c ---- */

/* A listener is readable: accepts what waits (or retries later). */
void listener__accept(listener_t *l);
/* Frees the listeners closed since the last sweep. */
void reactor__free_closed_listeners(reactor_t *r);
/* A connect finished (err 0, or a negative errno). */
void conn__connected(conn_t *c, int err);

/* ---- reactor_tls.c ---- */

int conn__tls_init(conn_t *c, conn_opts_t opts);
int conn__tls_encrypt(conn_t *c);
void conn__tls_flush(conn_t *c);
int conn__tls_write(conn_t *c, const char *p, size_t len,
                    sock_release_fn release, void *ctx, void *ctx2);
void conn__tls_read(conn_t *c);

#endif
