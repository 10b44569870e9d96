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
  STAT_LUA_KB,           /* gauge */
  STAT_LAG_US,           /* gauge */
  STAT_N
};

/* Counters of the server as a whole, in the root's slot area. */
enum {
  STAT_SRV_WORKER_RESTARTS, /* workers started after the first ones */
  STAT_SRV_RELOADS,         /* reloads that took */
  STAT_SRV_REDIS_UP,        /* gauge: 1 while the Redis engine is connected */
  STAT_SRV_PROCESSES,       /* processes started (the root and -w 1 included) */
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

/* Sums slots [first, first + count) and, with `gone`, what stats_retire
 * folded, into out[STAT_N]. */
void stats_sum(stats_t *s, int first, int count, bool gone, uint64_t *out);
/* The slots [first, first + count) belonged to a process that exited:
 * their counters join the totals of the gone (an open connection, stream
 * counts as closed), gauges are dropped, and the slots are zeroed for the
 * next process. Root only. */
void stats_retire(stats_t *s, int first, int count);

#endif
