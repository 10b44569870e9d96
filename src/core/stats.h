/* SPDX-License-Identifier: MIT */

/* stats: the server's counters, in one shared mapping that the root makes
 * before it forks, so that any lane of any process can read the whole
 * server's figures without asking anyone. Each lane writes only its own
 * slot (relaxed atomic adds: one writer per slot, so no lock and no
 * contended cache line); a reader sums the slots. A process that exits
 * leaves its slots to the root, which folds their counts into the
 * totals of the gone (stats_retire) before the slots are reused. */
#ifndef MP_STATS_H
#define MP_STATS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What a slot counts. "_opened"/"_closed" pairs make gauges (open =
 * opened - closed) that survive a process's death (its open ones count as
 * closed then). STAT_LUA_KB and STAT_LAG_US are gauges set by their lane
 * (its Lua heap; how late its last timer check ran), dropped with it. */
enum {
  STAT_CONN_ACCEPTED, /* also the "opened" of connections */
  STAT_CONN_CLOSED,
  STAT_BYTES_IN,
  STAT_BYTES_OUT,
  STAT_HTTP_1XX,
  STAT_HTTP_2XX,
  STAT_HTTP_3XX,
  STAT_HTTP_4XX,
  STAT_HTTP_5XX,
  STAT_WS_OPENED,
  STAT_WS_CLOSED,
  STAT_SSE_OPENED,
  STAT_SSE_CLOSED,
  STAT_PUBSUB_DELIVERED, /* messages handed to a subscriber */
  /* compression: body bytes before and after (HTTP responses, SSE),
   * WebSocket message bytes before and after deflate, and the deflate
   * runs of WebSocket messages (a shared fan-out frame counts once);
   * responses sent from the compressed-file cache (no compression run) */
  STAT_HTTP_COMP_IN,
  STAT_HTTP_COMP_OUT,
  STAT_HTTP_COMP_CACHED,
  STAT_WS_DEFL_IN,
  STAT_WS_DEFL_OUT,
  STAT_WS_DEFLATES,
  /* HTTP responses and their body bytes (after compression) by the
   * protocol they went over: HTTP/1.1, HTTP/2 (h2 and h2c) */
  STAT_HTTP_H1_REQS,
  STAT_HTTP_H2_REQS,
  STAT_HTTP_H1_BODY,
  STAT_HTTP_H2_BODY,
  /* mp.pg's pools (src/pg): connections, busy ones (a query in flight or
   * pinned), waiters in the queues, as opened/closed pairs; queries
   * answered, errors among them, timeouts, summed query time */
  STAT_PG_CONN_OPENED,
  STAT_PG_CONN_CLOSED,
  STAT_PG_BUSY_IN,
  STAT_PG_BUSY_OUT,
  STAT_PG_WAIT_IN,
  STAT_PG_WAIT_OUT,
  STAT_PG_QUERIES,
  STAT_PG_ERRORS,
  STAT_PG_TIMEOUTS,
  STAT_PG_QUERY_US,
  /* errors from the server by SQLSTATE class (pg.h's pg_errclass_name) */
  STAT_PG_ERRCLASS,
  STAT_LUA_KB = STAT_PG_ERRCLASS + 44, /* gauge */
  STAT_LAG_US,                         /* gauge */
  /* HTTP request latency by status class: for each class (1xx..5xx) the
   * count of each bucket of stats_latency_bounds_ms (not cumulative), the
   * +Inf bucket, then the sum in ms (stats_latency) */
  STAT_LAT,
  STAT_N = STAT_LAT + 5 * (12 + 2)
};

#define STAT_PG_ERRCLASSES 44 /* the slots from STAT_PG_ERRCLASS */
#define STAT_LAT_BOUNDS 12    /* finite buckets */
#define STAT_LAT_PER (STAT_LAT_BOUNDS + 2)
/* The buckets' upper bounds, ms. */
extern const double stats_latency_bounds_ms[STAT_LAT_BOUNDS];

/* Counters of the server as a whole, in the root's slot area. */
enum {
  /* workers started after the first ones, by why (as cluster_cause_t,
   * from CLUSTER_CAUSE_CRASH on) */
  STAT_SRV_RESTARTS_CRASH,
  STAT_SRV_RESTARTS_WATCHDOG,
  STAT_SRV_RESTARTS_MEMORY,
  STAT_SRV_RESTARTS_RELOAD,
  STAT_SRV_RESTARTS_RESTART,
  STAT_SRV_RELOADS,   /* reloads that took */
  STAT_SRV_REDIS_UP,  /* gauge: 1 while the Redis engine is connected */
  STAT_SRV_PROCESSES, /* processes started (the root and -w 1 included) */
  STAT_SRV_N
};

typedef struct {
  _Atomic uint64_t v[STAT_N];
} stats_slot_t;

typedef struct stats stats_t;

/* A mapping of `nslots` slots shared with every process forked after it.
 * NULL and errno on failure. */
stats_t *stats_new(int nslots);
void stats_free(stats_t *s);
int stats_slots(const stats_t *s);
stats_slot_t *stats_slot(stats_t *s, int i);
/* The server-wide counters (STAT_SRV_*). */
_Atomic uint64_t *stats_server(stats_t *s);
/* A number no other process of the server has or had: 1 for the first
 * process, then one more for each process started (stats_next_serial in
 * each, at its start). */
uint64_t stats_next_serial(stats_t *s);
/* Seconds since stats_new. */
double stats_uptime(const stats_t *s);

/* A slot has one writer, so an add is a relaxed load and store (no locked
 * instruction on the hot path); readers see each value whole. */
static inline void stats_add(stats_slot_t *sl, int what, uint64_t n) {
  if (!sl) return;
  uint64_t v = atomic_load_explicit(&sl->v[what], memory_order_relaxed);
  atomic_store_explicit(&sl->v[what], v + n, memory_order_relaxed);
}
static inline void stats_set(stats_slot_t *sl, int what, uint64_t v) {
  if (sl) atomic_store_explicit(&sl->v[what], v, memory_order_relaxed);
}

/* Counts a response of status class `cls` (1..5) that took `ms`. */
static inline void stats_latency(stats_slot_t *sl, int cls, uint64_t ms) {
  if (!sl || cls < 1 || cls > 5) return;
  int b = 0;
  while (b < STAT_LAT_BOUNDS && (double)ms > stats_latency_bounds_ms[b]) b++;
  int at = STAT_LAT + (cls - 1) * STAT_LAT_PER;
  stats_add(sl, at + b, 1);
  stats_add(sl, at + STAT_LAT_BOUNDS + 1, ms);
}

/* Sums slots [first, first + count) and, with `gone`, what stats_retire
 * folded, into out[STAT_N]. */
void stats_sum(stats_t *s, int first, int count, bool gone, uint64_t *out);
/* The slots [first, first + count) belonged to a process that exited:
 * their counters join the totals of the gone (an open connection, stream
 * counts as closed), gauges are dropped, and the slots are zeroed for the
 * next process. Root only. */
void stats_retire(stats_t *s, int first, int count);

#endif
