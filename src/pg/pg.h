/* SPDX-License-Identifier: MIT */

/* pg: PostgreSQL for a lane: a capped pool of libpq connections in
 * non-blocking pipeline mode, driven by the lane's reactor (each socket is
 * a reactor watch, as hiredis's are in src/redis), with host names
 * resolved by the lane's c-ares resolver and handed to libpq as hostaddr,
 * so nothing here blocks the lane.
 *
 * Queries from many callers share the pool's connections: each is sent as
 * its own pipeline segment (Parse/Bind/Execute, then Sync), so many are in
 * flight on one connection and an error fails only the query that caused
 * it. Parameterised queries are prepared once per connection and the
 * statement kept (an LRU of `stmt_cache` per connection). A query waits in
 * the pool's FIFO queue, at most `pool_timeout_ms`, while every connection
 * is busy, pinned or still connecting and the pool is at its cap.
 *
 * A query that runs past its timeout is answered "timeout" at once and
 * cancelled on the server: PQcancel blocks (libpq 15 has no non-blocking
 * cancel), so it runs on this module's cancel thread, never on the lane's.
 *
 * Threading: a pool, its connections, queries and every callback belong to
 * the reactor's thread. Callbacks never run from inside the call that
 * started the work (pg_query, pg_acquire). The library includes no lua.h
 * and hides libpq behind this header. */
#ifndef MP_PG_H
#define MP_PG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/stats.h"
#include "net/dns.h"
#include "net/reactor.h"

typedef struct pg_pool pg_pool_t;
typedef struct pg_conn pg_conn_t;
typedef struct pg_query pg_query_t;
typedef struct pg_res pg_res_t;

#define PG_POOL_DEFAULT 10
#define PG_POOL_MAX 1000
#define PG_STMT_CACHE_DEFAULT 256
#define PG_MAX_RESULT_DEFAULT ((size_t)64 << 20)
/* Queries in flight on one connection before the next waits (or goes to
 * another connection). */
#define PG_PIPELINE_DEPTH 128
#define PG_MAX_PARAMS 65535

typedef struct {
  int max;                  /* connections, 1..PG_POOL_MAX */
  uint32_t connect_ms;      /* resolve + connect + auth; 0: none */
  uint32_t idle_ms;         /* an unused connection closes after; 0: never */
  uint32_t pool_timeout_ms; /* waiting in the queue; 0: forever */
  size_t max_result;        /* bytes of one result, past which it fails */
  int stmt_cache;           /* prepared statements kept per connection */
} pg_opts_t;

/* Checks a postgres:// URL or a "key=value ..." conninfo string as libpq
 * reads it, plus what this module refuses (several hosts). 0, or -1 with
 * the reason in err. Any thread. */
int pg_url_check(const char *url, char *err, size_t errlen);

/* A pool for `url` on reactor r, resolving through dns (borrowed; it must
 * outlive the pool). No connection opens until the first query. NULL with
 * the reason in err (a bad URL, no memory). Reactor thread. */
pg_pool_t *pg_pool_new(reactor_t *r, dns_resolver_t *dns, const char *url,
                       const pg_opts_t *o, char *err, size_t errlen);
/* Closes every connection; every query in flight or waiting, and every
 * pending pg_acquire, is called back with the error "closed" first. Legal
 * from inside a callback of the pool (the memory goes when it returns). */
void pg_pool_free(pg_pool_t *p);

/* What the pool holds, for metrics. */
typedef struct {
  int size;      /* connections open or opening */
  int busy;      /* with a query in flight or pinned */
  int waiting;   /* queries and acquires in the queue */
  uint64_t queries, errors, timeouts;
  uint64_t query_us; /* summed time of answered queries */
} pg_pool_stats_t;
void pg_pool_stats(const pg_pool_t *p, pg_pool_stats_t *out);
/* Errors from the server are also counted by SQLSTATE class (its first two
 * characters), in the slot's STAT_PG_ERRCLASS + i: the classes of
 * Postgres's Appendix A, then "other" for one it does not list. The class
 * of slot i (0..STAT_PG_ERRCLASSES-1), and the slot of a SQLSTATE. */
const char *pg_errclass_name(int i);
int pg_errclass_index(const char *sqlstate);
/* Counts the pool's connections, busy ones, waiters, queries, errors,
 * timeouts and query time into `slot` (core/stats.h's STAT_PG_*), from
 * now on; NULL stops. Set it before the first query. */
void pg_pool_set_stats(pg_pool_t *p, stats_slot_t *slot);

/* ---- results ---- */

/* A query's outcome: rows, or an error. Owned by the callback it is given
 * to, which frees it with pg_res_free (any time later, same thread). */
void pg_res_free(pg_res_t *r);
/* NULL on success; else one line: "ERROR 23505: duplicate key ..." for an
 * error from the server, or "closed", "timeout", "pool timeout",
 * "result larger than max_result", "connect: <libpq's reason>". */
const char *pg_res_error(const pg_res_t *r);
/* A field of the server's error (libpq's PG_DIAG_* codes: 'C' SQLSTATE,
 * 'D' detail, 'H' hint, 'n' constraint, 'P' position), or NULL. */
const char *pg_res_diag(const pg_res_t *r, int field);
int pg_res_nrows(const pg_res_t *r);
int pg_res_ncols(const pg_res_t *r);
const char *pg_res_colname(const pg_res_t *r, int col);
/* The column's type OID (pg_type.oid). */
unsigned pg_res_coltype(const pg_res_t *r, int col);
/* The value in text format and its length, or NULL for SQL NULL. Valid
 * until pg_res_free. */
const char *pg_res_value(const pg_res_t *r, int row, int col, size_t *len);
/* Rows the command affected (INSERT/UPDATE/DELETE/SELECT...), or -1. */
long long pg_res_affected(const pg_res_t *r);

/* ---- queries ---- */

/* The outcome, once, on the reactor's thread; takes `res` (never NULL). */
typedef void (*pg_done_fn)(void *arg, pg_res_t *res);

/* Sends sql with nparams parameters ($1..): vals[i] the bytes (NULL: SQL
 * NULL), lens[i] their length (a value holding a zero byte goes in binary
 * format, which only bytea takes). The bytes are copied. On `pin` (a
 * connection from pg_acquire) when not NULL, else on any of the pool's.
 * timeout_ms bounds the query once sent (0: none). Returns a handle valid
 * until the callback starts or pg_query_abandon; NULL with errno EINVAL
 * (too many parameters), ENOMEM or ESHUTDOWN (the pool is closing), and
 * then no callback runs. */
pg_query_t *pg_query(pg_pool_t *p, pg_conn_t *pin, const char *sql,
                     int nparams, const char *const *vals, const size_t *lens,
                     uint32_t timeout_ms, pg_done_fn cb, void *arg);
/* The callback of q will not run (a killed task). A query already sent
 * still runs on the server to its end; its result is dropped. */
void pg_query_abandon(pg_query_t *q);

/* A pipeline: n statements (1..PG_PIPELINE_DEPTH) sent at once on one
 * connection, each its own Parse/Bind/Execute, with one Sync after the
 * last, so they run as one implicit transaction (a statement after an
 * error is not run: its result says "aborted: an earlier statement of
 * the pipeline failed"). cb gets an array of n results (the array and
 * each result are the callback's: pg_res_free each, free the array).
 * Parameters as for pg_query, copied; timeout_ms bounds each statement.
 * The handle is as pg_query's. */
typedef struct {
  const char *sql;
  int nparams;
  const char *const *vals;
  const size_t *lens;
} pg_stmt_args_t;
typedef void (*pg_batch_fn)(void *arg, pg_res_t **res, int n);
pg_query_t *pg_batch(pg_pool_t *p, pg_conn_t *pin, int n,
                     const pg_stmt_args_t *stmts, uint32_t timeout_ms,
                     pg_batch_fn cb, void *arg);

/* A connection of the pool for the caller alone (a transaction), through
 * the queue like a query (pool_timeout_ms): cb(arg, c, NULL), or cb(arg,
 * NULL, err) ("pool timeout", "closed", "connect: ..."). The handle is
 * as pg_query's (pg_query_abandon cancels the wait). */
typedef void (*pg_acquire_fn)(void *arg, pg_conn_t *c, const char *err);
pg_query_t *pg_acquire(pg_pool_t *p, pg_acquire_fn cb, void *arg);
/* Gives c back. `reusable` false (a transaction left in an unknown state)
 * closes it instead. Legal after c died (it is then freed). */
void pg_release(pg_pool_t *p, pg_conn_t *c, bool reusable);
/* Whether c is still connected. */
bool pg_conn_alive(const pg_conn_t *c);

/* ---- COPY ---- */

/* COPY on a connection from pg_acquire with nothing in flight on it
 * (libpq runs COPY only outside pipeline mode: the connection leaves it
 * for the COPY and goes back after). Every call returns at once; -EAGAIN
 * means "call pg_copy_wait for these events, then again". Reactor
 * thread; the callbacks run from the pool's tick.
 *
 * pg_copy_begin sends sql: 0, -EBUSY (queries in flight), -EPIPE (the
 * connection is gone). pg_copy_started: 1 COPY FROM STDIN began, 2 COPY
 * TO STDOUT began, 0 with *res the statement's error (the COPY is over),
 * -EAGAIN (wait POLL_READ), -EPIPE. */
int pg_copy_begin(pg_conn_t *c, const char *sql);
int pg_copy_started(pg_conn_t *c, pg_res_t **res);
/* FROM STDIN: sends len bytes (copied): 0, -EAGAIN (the last bytes are
 * still going: wait POLL_WRITE), -EPIPE. pg_copy_end ends the data
 * (errmsg not NULL: aborts the COPY with that message): 0, -EAGAIN
 * (POLL_WRITE), -EPIPE. */
int pg_copy_put(pg_conn_t *c, const char *data, size_t len);
int pg_copy_end(pg_conn_t *c, const char *errmsg);
/* TO STDOUT: the next row, 1 with *row (free it with pg_copy_free) and
 * *len; 0 at the end; -EAGAIN (POLL_READ); -EPIPE. Nothing is read from
 * the socket while no one waits, so a slow reader holds the server back
 * instead of filling memory. */
int pg_copy_get(pg_conn_t *c, char **row, size_t *len);
void pg_copy_free(char *row);
/* After the data (pg_copy_end, or pg_copy_get's 0): 0 with *res the
 * COPY's result (pg_res_affected: the rows; or an error), the connection
 * back in pipeline mode; -EAGAIN (POLL_READ); -EPIPE. */
int pg_copy_finish(pg_conn_t *c, pg_res_t **res);
/* cb(arg) once, from the pool's tick, when events (POLL_READ,
 * POLL_WRITE) came or the connection failed; pg_copy_unwait drops it. */
void pg_copy_wait(pg_conn_t *c, unsigned events, void (*cb)(void *arg),
                  void *arg);
void pg_copy_unwait(pg_conn_t *c);

/* ---- LISTEN ---- */

/* Notifications queued for the callback, at most (the oldest go). */
#define PG_NOTES_MAX 10000

/* A notification, on the reactor's thread (from the pool's tick). */
typedef void (*pg_notify_fn)(void *arg, const char *channel,
                             const char *payload, size_t len);
/* Makes p a listening pool: LISTEN channel (1..63 bytes, any characters:
 * sent as a quoted identifier) on its connection now and on every
 * connection it opens later, and keeps one connection open (reopened
 * within a second of a loss: notifications sent meanwhile are lost, as
 * Postgres does not keep them). fn/arg replace any given before. 0 or
 * -EINVAL, -ENOMEM, -ESHUTDOWN. Use a pool of its own (max 1, no idle
 * timeout) for listening. */
int pg_pool_listen(pg_pool_t *p, const char *channel, pg_notify_fn fn,
                   void *arg);

#endif
