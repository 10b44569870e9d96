/* lx_stats: mp.stats() and mp.metrics(), the server's counters
 * (core/stats.h) as a Lua table and in the Prometheus text format; and
 * each lane's once-a-second gauges (its Lua heap, how late its timers
 * run). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/cluster.h"
#include "lx/lx_lane.h"
#include "lx/lx_server.h"
#include "lx/lx_stats.h"
#include "redis/redis.h"

static int lx__per(const lx_server_t *srv) { return (int)srv->threads + 1; }

stats_slot_t *lx_stats_slot(lx_server_t *srv, int index, bool is_root) {
  if (!srv->stats) return NULL;
  return stats_slot(srv->stats, srv->sink * lx__per(srv) + (is_root ? 0 : 1 + index));
}

/* ---- the lane's gauges ---- */

#define LX_STATS_EVERY_MS 1000

static void lx__gauges(mp_timer_t *t) {
  lx_lane_t *ln = t->udata;
  uint64_t now = reactor_now(ln->r);
  /* how late this run is: the loop was busy (or blocked) that long */
  uint64_t late = now > t->due ? now - t->due : 0;
  stats_set(ln->stats, STAT_LAG_US, late * 1000);
  stats_set(ln->stats, STAT_LUA_KB, (uint64_t)lua_gc(ln->L, LUA_GCCOUNT, 0));
  lx_server_t *srv = ln->srv;
  if (srv->engine && srv->engine_r == ln->r && srv->stats)
    atomic_store_explicit(&stats_server(srv->stats)[STAT_SRV_REDIS_UP],
                          redis_engine_up(srv->engine), memory_order_relaxed);
}

void lx_stats_lane_start(lx_lane_t *ln) {
  if (!ln->stats || ln->stats_timer.armed) return;
  lx__gauges(&(mp_timer_t){.due = reactor_now(ln->r), .udata = ln});
  timer_start(reactor_timers(ln->r), &ln->stats_timer, reactor_now(ln->r),
              LX_STATS_EVERY_MS, LX_STATS_EVERY_MS, 0, lx__gauges, NULL, ln);
}

void lx_stats_lane_stop(lx_lane_t *ln) {
  if (!ln->stats_timer.armed) return;
  timer_stop(reactor_timers(ln->r), &ln->stats_timer);
  stats_set(ln->stats, STAT_LUA_KB, 0);
  stats_set(ln->stats, STAT_LAG_US, 0);
}

/* ---- reading ---- */

enum { LX_SCOPE_CLUSTER, LX_SCOPE_PROCESS, LX_SCOPE_LANE };

static void lx__sum(lx_server_t *srv, lx_lane_t *ln, int scope, uint64_t *v) {
  int per = lx__per(srv);
  if (scope == LX_SCOPE_LANE && ln->stats) {
    int i = (int)(ln->stats - stats_slot(srv->stats, 0));
    stats_sum(srv->stats, i, 1, false, v);
  } else if (scope == LX_SCOPE_PROCESS) {
    stats_sum(srv->stats, srv->sink * per, per, false, v);
  } else {
    stats_sum(srv->stats, 0, stats_slots(srv->stats), true, v);
  }
}

static void lx__field(lua_State *L, const char *k, uint64_t v) {
  lua_pushnumber(L, (lua_Number)v);
  lua_setfield(L, -2, k);
}

static uint64_t lx__open(const uint64_t *v, int opened, int closed) {
  return v[opened] > v[closed] ? v[opened] - v[closed] : 0;
}

/* The largest loop lag among the slots summed: a sum of lags says
 * nothing. */
static uint64_t lx__max_lag(lx_server_t *srv, lx_lane_t *ln, int scope) {
  int per = lx__per(srv), first = 0, n = stats_slots(srv->stats);
  if (scope == LX_SCOPE_LANE && ln->stats) {
    first = (int)(ln->stats - stats_slot(srv->stats, 0));
    n = 1;
  } else if (scope == LX_SCOPE_PROCESS) {
    first = srv->sink * per;
    n = per;
  }
  uint64_t max = 0;
  for (int i = first; i < first + n; i++) {
    uint64_t lag = atomic_load_explicit(&stats_slot(srv->stats, i)->v[STAT_LAG_US],
                                        memory_order_relaxed);
    if (lag > max) max = lag;
  }
  return max;
}

/* mp.stats([{ scope = "cluster" | "process" | "lane" }]) */
static int lx_stats(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_server_t *srv = ln->srv;
  int scope = LX_SCOPE_CLUSTER;
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TTABLE);
    lua_getfield(L, 1, "scope");
    const char *s = luaL_optstring(L, -1, "cluster");
    if (strcmp(s, "process") == 0)
      scope = LX_SCOPE_PROCESS;
    else if (strcmp(s, "lane") == 0)
      scope = LX_SCOPE_LANE;
    else if (strcmp(s, "cluster") != 0)
      return luaL_argerror(L, 1, "scope must be \"cluster\", \"process\" or \"lane\"");
    lua_pop(L, 1);
  }
  if (!srv->stats) return luaL_error(L, "mp.stats: no counters");
  uint64_t v[STAT_N];
  lx__sum(srv, ln, scope, v);
  _Atomic uint64_t *g = stats_server(srv->stats);
  lua_createtable(L, 0, 16);
  lua_createtable(L, 0, 2);
  lx__field(L, "open", lx__open(v, STAT_CONN_ACCEPTED, STAT_CONN_CLOSED));
  lx__field(L, "accepted", v[STAT_CONN_ACCEPTED]);
  lua_setfield(L, -2, "connections");
  lua_createtable(L, 0, 5);
  static const char *const classes[] = {"1xx", "2xx", "3xx", "4xx", "5xx"};
  uint64_t total = 0;
  for (int i = 0; i < 5; i++) {
    lx__field(L, classes[i], v[STAT_HTTP_1XX + i]);
    total += v[STAT_HTTP_1XX + i];
  }
  lx__field(L, "total", total);
  lua_setfield(L, -2, "requests");
  lx__field(L, "bytes_in", v[STAT_BYTES_IN]);
  lx__field(L, "bytes_out", v[STAT_BYTES_OUT]);
  lx__field(L, "websockets", lx__open(v, STAT_WS_OPENED, STAT_WS_CLOSED));
  lx__field(L, "sse", lx__open(v, STAT_SSE_OPENED, STAT_SSE_CLOSED));
  lx__field(L, "pubsub_delivered", v[STAT_PUBSUB_DELIVERED]);
  lx__field(L, "lua_bytes", v[STAT_LUA_KB] * 1024);
  lua_pushnumber(L, (lua_Number)lx__max_lag(srv, ln, scope) / 1e6);
  lua_setfield(L, -2, "loop_lag");
  lx__field(L, "worker_restarts", g[STAT_SRV_WORKER_RESTARTS]);
  lx__field(L, "reloads", g[STAT_SRV_RELOADS]);
  if (srv->redis_url)
    lua_pushstring(L, g[STAT_SRV_REDIS_UP] ? "up" : "down");
  else
    lua_pushliteral(L, "off");
  lua_setfield(L, -2, "redis");
  lua_pushnumber(L, stats_uptime(srv->stats));
  lua_setfield(L, -2, "uptime");
  lua_pushinteger(L, srv->nworkers);
  lua_setfield(L, -2, "workers");
  lua_pushinteger(L, (lua_Integer)srv->threads);
  lua_setfield(L, -2, "lanes");
  return 1;
}

/* ---- the Prometheus text format ---- */

typedef struct {
  char *b;
  size_t len, cap;
  bool oom;
} lx_text_t;

static void lx__printf(lx_text_t *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void lx__printf(lx_text_t *t, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->b ? t->b + t->len : NULL, t->b ? t->cap - t->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (t->b && t->len + (size_t)n < t->cap) {
      t->len += (size_t)n;
      return;
    }
    size_t cap = t->cap ? t->cap * 2 : 4096;
    while (cap < t->len + (size_t)n + 1) cap *= 2;
    char *p = realloc(t->b, cap);
    if (!p) {
      t->oom = true;
      return;
    }
    t->b = p;
    t->cap = cap;
  }
}

static void lx__metric(lx_text_t *t, const char *name, const char *type,
                       const char *help, uint64_t v) {
  lx__printf(t, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name,
             type, name, (unsigned long long)v);
}

char *lx_stats_prometheus(lx_server_t *srv, size_t *len) {
  if (!srv->stats) return NULL;
  uint64_t v[STAT_N];
  stats_sum(srv->stats, 0, stats_slots(srv->stats), true, v);
  _Atomic uint64_t *g = stats_server(srv->stats);
  lx_text_t t = {0};
  lx__metric(&t, "moonport_connections_accepted_total", "counter",
             "Connections accepted.", v[STAT_CONN_ACCEPTED]);
  lx__metric(&t, "moonport_connections_open", "gauge", "Connections open.",
             lx__open(v, STAT_CONN_ACCEPTED, STAT_CONN_CLOSED));
  lx__printf(&t, "# HELP moonport_http_requests_total HTTP responses, by status class.\n"
                 "# TYPE moonport_http_requests_total counter\n");
  static const char *const classes[] = {"1xx", "2xx", "3xx", "4xx", "5xx"};
  for (int i = 0; i < 5; i++)
    lx__printf(&t, "moonport_http_requests_total{class=\"%s\"} %llu\n", classes[i],
               (unsigned long long)v[STAT_HTTP_1XX + i]);
  lx__metric(&t, "moonport_received_bytes_total", "counter",
             "Bytes read from connections.", v[STAT_BYTES_IN]);
  lx__metric(&t, "moonport_sent_bytes_total", "counter",
             "Bytes written to connections.", v[STAT_BYTES_OUT]);
  lx__metric(&t, "moonport_websockets_open", "gauge", "WebSocket connections open.",
             lx__open(v, STAT_WS_OPENED, STAT_WS_CLOSED));
  lx__metric(&t, "moonport_sse_streams_open", "gauge", "Server-Sent Events streams open.",
             lx__open(v, STAT_SSE_OPENED, STAT_SSE_CLOSED));
  lx__metric(&t, "moonport_pubsub_delivered_total", "counter",
             "Pub/sub messages handed to a subscriber.", v[STAT_PUBSUB_DELIVERED]);
  lx__metric(&t, "moonport_worker_restarts_total", "counter",
             "Worker processes started after the first ones.",
             g[STAT_SRV_WORKER_RESTARTS]);
  lx__metric(&t, "moonport_reloads_total", "counter", "Reloads of the script that took.",
             g[STAT_SRV_RELOADS]);
  if (srv->redis_url)
    lx__metric(&t, "moonport_redis_up", "gauge",
               "1 while the Redis pub/sub engine is connected.", g[STAT_SRV_REDIS_UP]);
  lx__printf(&t, "# HELP moonport_uptime_seconds Seconds since the server started.\n"
                 "# TYPE moonport_uptime_seconds gauge\nmoonport_uptime_seconds %.3f\n",
             stats_uptime(srv->stats));
  lx__metric(&t, "moonport_workers", "gauge", "Worker processes configured.",
             (uint64_t)srv->nworkers);
  /* per lane: the live ones have a heap */
  int per = lx__per(srv), n = stats_slots(srv->stats);
  lx__printf(&t, "# HELP moonport_lua_memory_bytes Lua heap of a lane.\n"
                 "# TYPE moonport_lua_memory_bytes gauge\n");
  for (int i = 0; i < n; i++) {
    uint64_t kb = atomic_load_explicit(&stats_slot(srv->stats, i)->v[STAT_LUA_KB],
                                       memory_order_relaxed);
    if (!kb) continue;
    int sink = i / per, lane = i % per;
    int worker = sink == 0 ? (srv->nworkers > 1 ? 0 : 1) : (sink - 1) % srv->nworkers + 1;
    lx__printf(&t, "moonport_lua_memory_bytes{worker=\"%d\",sink=\"%d\",lane=\"%d\"} %llu\n",
               worker, sink, lane, (unsigned long long)kb * 1024);
  }
  lx__printf(&t, "# HELP moonport_event_loop_lag_seconds How late a lane's last "
                 "once-a-second timer ran.\n"
                 "# TYPE moonport_event_loop_lag_seconds gauge\n");
  for (int i = 0; i < n; i++) {
    stats_slot_t *sl = stats_slot(srv->stats, i);
    if (!atomic_load_explicit(&sl->v[STAT_LUA_KB], memory_order_relaxed)) continue;
    uint64_t lag = atomic_load_explicit(&sl->v[STAT_LAG_US], memory_order_relaxed);
    int sink = i / per, lane = i % per;
    int worker = sink == 0 ? (srv->nworkers > 1 ? 0 : 1) : (sink - 1) % srv->nworkers + 1;
    lx__printf(&t, "moonport_event_loop_lag_seconds{worker=\"%d\",sink=\"%d\",lane=\"%d\"} %.6f\n",
               worker, sink, lane, (double)lag / 1e6);
  }
  if (t.oom) {
    free(t.b);
    return NULL;
  }
  *len = t.len;
  return t.b;
}

/* mp.metrics(): the text. */
static int lx_metrics(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  size_t n;
  char *text = lx_stats_prometheus(ln->srv, &n);
  if (!text) return luaL_error(L, "mp.metrics: out of memory");
  lua_pushlstring(L, text, n);
  free(text);
  return 1;
}

void lx_stats_open(lua_State *L, lx_lane_t *ln) {
  static const luaL_Reg fns[] = {{"stats", lx_stats}, {"metrics", lx_metrics}, {NULL, NULL}};
  lua_pushlightuserdata(L, ln);
  luaL_setfuncs(L, fns, 1);
}
