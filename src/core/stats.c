/* SPDX-License-Identifier: MIT */

/* stats: counters in a shared mapping; see stats.h. */
#include "core/stats.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

const double stats_latency_bounds_ms[STAT_LAT_BOUNDS] = {
    1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000};

struct stats {
  int nslots;
  struct timespec started;
  _Atomic uint64_t server[STAT_SRV_N];
  _Atomic uint64_t gone[STAT_N]; /* root only writes; readers anywhere */
  stats_slot_t slots[];
};

static size_t stats__size(int nslots) {
  return sizeof(stats_t) + (size_t)nslots * sizeof(stats_slot_t);
}

stats_t *stats_new(int nslots) {
  if (nslots < 1) {
    errno = EINVAL;
    return NULL;
  }
  stats_t *s = mmap(NULL, stats__size(nslots), PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (s == MAP_FAILED) return NULL;
  memset(s, 0, stats__size(nslots));
  s->nslots = nslots;
  clock_gettime(CLOCK_MONOTONIC, &s->started);
  return s;
}

void stats_free(stats_t *s) {
  if (s) munmap(s, stats__size(s->nslots));
}

int stats_slots(const stats_t *s) { return s->nslots; }

stats_slot_t *stats_slot(stats_t *s, int i) {
  return s && i >= 0 && i < s->nslots ? &s->slots[i] : NULL;
}

_Atomic uint64_t *stats_server(stats_t *s) { return s->server; }

uint64_t stats_next_serial(stats_t *s) {
  return atomic_fetch_add(&s->server[STAT_SRV_PROCESSES], 1) + 1;
}

double stats_uptime(const stats_t *s) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)(now.tv_sec - s->started.tv_sec) +
         (double)(now.tv_nsec - s->started.tv_nsec) / 1e9;
}

static bool stats__gauge(int what) {
  return what == STAT_LUA_KB || what == STAT_LAG_US;
}

void stats_sum(stats_t *s, int first, int count, bool gone, uint64_t *out) {
  memset(out, 0, sizeof(uint64_t) * STAT_N);
  if (first < 0) first = 0;
  if (first + count > s->nslots) count = s->nslots - first;
  for (int i = first; i < first + count; i++)
    for (int k = 0; k < STAT_N; k++)
      out[k] += atomic_load_explicit(&s->slots[i].v[k], memory_order_relaxed);
  if (gone)
    for (int k = 0; k < STAT_N; k++)
      if (!stats__gauge(k))
        out[k] += atomic_load_explicit(&s->gone[k], memory_order_relaxed);
}

void stats_retire(stats_t *s, int first, int count) {
  uint64_t sum[STAT_N];
  stats_sum(s, first, count, false, sum);
  /* what was open when the process went is closed now */
  sum[STAT_CONN_CLOSED] = sum[STAT_CONN_ACCEPTED];
  sum[STAT_WS_CLOSED] = sum[STAT_WS_OPENED];
  sum[STAT_SSE_CLOSED] = sum[STAT_SSE_OPENED];
  sum[STAT_PG_CONN_CLOSED] = sum[STAT_PG_CONN_OPENED];
  sum[STAT_PG_BUSY_OUT] = sum[STAT_PG_BUSY_IN];
  sum[STAT_PG_WAIT_OUT] = sum[STAT_PG_WAIT_IN];
  for (int k = 0; k < STAT_N; k++)
    if (!stats__gauge(k))
      atomic_fetch_add_explicit(&s->gone[k], sum[k], memory_order_relaxed);
  for (int i = first; i < first + count && i < s->nslots; i++)
    for (int k = 0; k < STAT_N; k++)
      atomic_store_explicit(&s->slots[i].v[k], 0, memory_order_relaxed);
}
