/* SPDX-License-Identifier: MIT */

/* pg_int: what the files of src/pg share and nothing else sees: the
 * structures of a pool, its connections, queries and results, and the
 * internal functions (pg__*) each file offers the others. Everything
 * here belongs to the pool's reactor thread, as in pg.h. */
#ifndef MP_PG_INT_H
#define MP_PG_INT_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/stats.h"
#include "core/timer.h"
#include "net/dns.h"
#include "net/reactor.h"
#include "pg/pg.h"

/* What a segment's command is. */
enum { SEG_PREPARE = 1, SEG_EXEC, SEG_DISCARD };

/* Q_BATCH is a pg_batch: its statements go on the wire as Q_SUB queries,
 * one segment each with one Sync after the last. */
enum { Q_QUERY = 0, Q_ACQUIRE, Q_INTERNAL, Q_BATCH, Q_SUB };

/* Rows are copied out of libpq's results as they come (a single-row
 * PGresult costs a 2 KiB block at least): the values' bytes in one
 * arena, and per value its offset and length (-1: NULL). */
struct pg_res {
  char *data;
  size_t used, dcap;
  size_t *off;
  int32_t *len;
  size_t nvals, vcap;
  int nrows, ncols;
  PGresult *head; /* the column descriptions and the command status */
  PGresult *err;  /* the server's error */
  char msg[320];  /* the error line ("" on success) */
};

typedef struct {
  uint64_t hash;
  char *sql; /* NULL: a free slot */
  char name[16];
  unsigned id;   /* the N of its name mpN: a slot reused gets a new one */
  uint64_t used; /* LRU clock */
} pg_stmt_t;

struct pg_query {
  pg_pool_t *p;
  pg_conn_t *c; /* sent on, NULL while queued */
  pg_conn_t *pin;
  pg_query_t *prev, *next; /* the pool's queue, or c's flight */
  int kind;
  bool queued, abandoned, retried, timed_out;
  int refs; /* the pool's, and the timer's while armed */
  char *sql;
  int nparams;
  char **vals;
  int *lens, *fmts;
  uint32_t timeout_ms;
  mp_timer_t timer;
  pg_done_fn cb;
  pg_acquire_fn acb;
  void *arg;
  /* on the wire */
  uint8_t segs[3];
  int nseg, seg;
  bool seg_began; /* a result of segs[seg] has come */
  bool prepared_now;
  pg_stmt_t *stmt;
  unsigned stmt_id;  /* stmt->id when sent: the slot may be reused since */
  unsigned seq_sent; /* the connection's stmt_seq when sent */
  pg_res_t *res;
  size_t bytes;
  uint64_t sent_at;
  pg_query_t *done_next;
  const char *fail; /* finished with this error, no server result */
  char failbuf[256];
  bool nosync; /* a batch's statement before its last: no Sync */
  /* Q_BATCH: its statements and their results; Q_SUB: its batch, index */
  pg_query_t **kids;
  pg_res_t **kres;
  int nkids, left, idx;
  pg_query_t *parent;
  pg_batch_fn bcb;
};

/* C_COPY: out of pipeline mode, in a COPY (pg_copy_*), pinned. */
enum { C_RESOLVING, C_CONNECTING, C_READY, C_DEAD, C_COPY };

struct pg_conn {
  pg_pool_t *p;
  pg_conn_t *prev, *next;
  PGconn *pq;
  int st;
  int fd;
  reactor_watch_t *w;
  unsigned wflags;
  dns_req_t *dq;
  mp_timer_t ctimer; /* connect timeout */
  pg_query_t *head, *tail;
  int inflight;
  bool pinned;
  bool cancelling; /* a cancel went for a query still in flight */
  uint64_t idle_since;
  pg_stmt_t *stmts;
  unsigned stmt_seq;
  uint64_t stmt_clock;
  pg_conn_t *zombie_next;
  bool busy_counted; /* counted in STAT_PG_BUSY_IN */
  /* COPY: the one waiter, woken from the tick once its events came */
  void (*copy_cb)(void *arg);
  void *copy_arg;
  bool copy_woken;
};

struct pg_pool {
  reactor_t *r;
  dns_resolver_t *dns;
  pg_opts_t o;
  char **keys, **vals; /* conninfo, NULL-terminated; hostaddr last */
  int hostaddr_idx;    /* index of the hostaddr slot to fill, or -1 */
  char host[256];      /* to resolve ("" for a Unix socket / hostaddr) */
  pg_conn_t *conns;
  int nconns;
  pg_query_t *qhead, *qtail; /* FIFO of waiters */
  int nwait;
  pg_query_t *done, *done_tail;
  int refs;
  bool closing, freed, kicked, pumping, pump_again;
  mp_timer_t sweep;
  mp_timer_t tick;    /* a 0 ms timer: callbacks, zombies, pumping */
  pg_conn_t *zombies; /* unlinked connections freed by the tick */
  char last_err[256];
  uint64_t n_queries, n_errors, n_timeouts, query_us;
  /* LISTEN (pg_pool_listen): what runs first on every new connection,
   * the notifications waiting for the tick, the reconnect timer. */
  char **init;
  int ninit;
  pg_notify_fn notify;
  void *notify_arg;
  struct pg_note {
    struct pg_note *next;
    size_t clen, len;
    char data[]; /* channel, NUL, payload, NUL */
  } * nhead, *ntail;
  int nnotes;
  uint64_t notes_dropped;
  mp_timer_t keep;
  stats_slot_t *stats; /* the lane's, or NULL */
};

/* pg.c (the pool: its queue, the tick, choosing a connection) */
void pg__conn_busy_update(pg_conn_t *c);
void pg__pool_kick(pg_pool_t *p);
void pg__pool_pump(pg_pool_t *p);
void pg__pool_unref(pg_pool_t *p);
pg_query_t *pg__query_alloc(pg_pool_t *p, const char *sql, int nparams,
                            const char *const *vals, const size_t *lens);
int pg__query_arm(pg_query_t *q, uint32_t ms, timer_fn fn);
void pg__query_finish(pg_query_t *q, const char *fail);
void pg__query_stop_timer(pg_query_t *q);
void pg__query_unref(pg_query_t *q);
void pg__queue_fail_all(pg_pool_t *p, const char *why);
void pg__st_add(pg_pool_t *p, int what, uint64_t n);

/* pg_conn.c (a connection: connect, send, read results, statements) */
void pg__batch_send(pg_conn_t *c, pg_query_t *b);
void pg__conn_fail(pg_conn_t *c, const char *why);
bool pg__conn_flush(pg_conn_t *c);
void pg__conn_free(pg_conn_t *c);
bool pg__conn_open(pg_pool_t *p);
int pg__conn_send(pg_conn_t *c, pg_query_t *q);
int pg__conn_send_internal(pg_conn_t *c, const char *sql);
void pg__conn_watch(pg_conn_t *c, unsigned flags);

/* pg_res.c (results) */
int pg__res_add_rows(pg_res_t *r, const PGresult *x, size_t max);
pg_res_t *pg__res_new(void);
void pg__res_set_server_error(pg_res_t *r, PGresult *x);

/* pg_listen.c (LISTEN) */
void pg__notes_deliver(pg_pool_t *p);
void pg__notes_free(pg_pool_t *p);
void pg__notes_push(pg_pool_t *p, const char *channel, const char *payload);
void pg__notes_read(pg_conn_t *c);

/* pg_copy.c (COPY) */
void pg__copy_wake_all(pg_pool_t *p);

#endif
