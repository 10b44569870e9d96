/* SPDX-License-Identifier: MIT */

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
#include "core/metric.h"
#include "lx/lx_lane.h"
#include "lx/lx_server.h"
#include "lx/lx_stats.h"
#include "lx/lx_upstream.h"
#include "pg/pg.h"
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

/* The labels of the restart counters, in STAT_SRV_RESTARTS_* order. */
#define LX_RESTART_CAUSES 5
static const char *const lx__causes[LX_RESTART_CAUSES] = {
    "crash", "watchdog", "memory", "reload", "restart"};

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
  lua_createtable(L, 0, 2);
  static const char *const protos[] = {"1.1", "2"};
  for (int i = 0; i < 2; i++) {
    lua_createtable(L, 0, 2);
    lx__field(L, "requests", v[STAT_HTTP_H1_REQS + i]);
    lx__field(L, "body_bytes", v[STAT_HTTP_H1_BODY + i]);
    lua_setfield(L, -2, protos[i]);
  }
  lua_setfield(L, -2, "protocols");
  lx__field(L, "bytes_in", v[STAT_BYTES_IN]);
  lx__field(L, "bytes_out", v[STAT_BYTES_OUT]);
  lx__field(L, "websockets", lx__open(v, STAT_WS_OPENED, STAT_WS_CLOSED));
  lx__field(L, "sse", lx__open(v, STAT_SSE_OPENED, STAT_SSE_CLOSED));
  lx__field(L, "pubsub_delivered", v[STAT_PUBSUB_DELIVERED]);
  lx__field(L, "http_compress_in", v[STAT_HTTP_COMP_IN]);
  lx__field(L, "http_compress_out", v[STAT_HTTP_COMP_OUT]);
  lx__field(L, "http_compress_cached", v[STAT_HTTP_COMP_CACHED]);
  lx__field(L, "ws_deflate_in", v[STAT_WS_DEFL_IN]);
  lx__field(L, "ws_deflate_out", v[STAT_WS_DEFL_OUT]);
  lx__field(L, "ws_deflates", v[STAT_WS_DEFLATES]);
  lx__field(L, "lua_bytes", v[STAT_LUA_KB] * 1024);
  lua_pushnumber(L, (lua_Number)lx__max_lag(srv, ln, scope) / 1e6);
  lua_setfield(L, -2, "loop_lag");
  uint64_t restarts = 0;
  lua_createtable(L, 0, 5);
  for (int i = 0; i < LX_RESTART_CAUSES; i++) {
    lx__field(L, lx__causes[i], g[STAT_SRV_RESTARTS_CRASH + i]);
    restarts += g[STAT_SRV_RESTARTS_CRASH + i];
  }
  lua_setfield(L, -2, "worker_restarts_by");
  lx__field(L, "worker_restarts", restarts);
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

/* metric_text's writer. */
static void lx__append(void *ctx, const char *s, size_t n) {
  lx__printf(ctx, "%.*s", (int)n, s);
}

/* moonport_http_request_duration_seconds{class=}: the histogram the HTTP
 * server keeps in the counters (core/stats.h), cumulative here. */
static void lx__latency(lx_text_t *t, const uint64_t *v) {
  static const char *const classes[] = {"1xx", "2xx", "3xx", "4xx", "5xx"};
  lx__printf(t, "# HELP moonport_http_request_duration_seconds Time from a "
                "request's first byte to its response's end, by status "
                "class (millisecond resolution).\n"
                "# TYPE moonport_http_request_duration_seconds histogram\n");
  for (int c = 0; c < 5; c++) {
    const uint64_t *h = v + STAT_LAT + c * STAT_LAT_PER;
    uint64_t cum = 0;
    for (int b = 0; b <= STAT_LAT_BOUNDS; b++) {
      cum += h[b];
      if (b < STAT_LAT_BOUNDS)
        lx__printf(t,
                   "moonport_http_request_duration_seconds_bucket{class=\"%s\","
                   "le=\"%g\"} %llu\n",
                   classes[c], stats_latency_bounds_ms[b] / 1000.0,
                   (unsigned long long)cum);
      else
        lx__printf(t,
                   "moonport_http_request_duration_seconds_bucket{class=\"%s\","
                   "le=\"+Inf\"} %llu\n",
                   classes[c], (unsigned long long)cum);
    }
    lx__printf(
        t,
        "moonport_http_request_duration_seconds_sum{class=\"%s\"} %.3f\n"
        "moonport_http_request_duration_seconds_count{class=\"%s\"} %llu\n",
        classes[c], (double)h[STAT_LAT_BOUNDS + 1] / 1000.0, classes[c],
        (unsigned long long)cum);
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
  lx__printf(
      &t,
      "# HELP moonport_http_protocol_requests_total HTTP responses, by "
      "protocol.\n"
      "# TYPE moonport_http_protocol_requests_total counter\n"
      "moonport_http_protocol_requests_total{protocol=\"1.1\"} %llu\n"
      "moonport_http_protocol_requests_total{protocol=\"2\"} %llu\n"
      "# HELP moonport_http_response_body_bytes_total HTTP response body "
      "bytes sent (after compression), by protocol.\n"
      "# TYPE moonport_http_response_body_bytes_total counter\n"
      "moonport_http_response_body_bytes_total{protocol=\"1.1\"} %llu\n"
      "moonport_http_response_body_bytes_total{protocol=\"2\"} %llu\n",
      (unsigned long long)v[STAT_HTTP_H1_REQS],
      (unsigned long long)v[STAT_HTTP_H2_REQS],
      (unsigned long long)v[STAT_HTTP_H1_BODY],
      (unsigned long long)v[STAT_HTTP_H2_BODY]);
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
  lx__metric(&t, "moonport_http_compress_in_bytes_total", "counter",
             "Response body bytes given to gzip or brotli.",
             v[STAT_HTTP_COMP_IN]);
  lx__metric(&t, "moonport_http_compress_out_bytes_total", "counter",
             "Response body bytes gzip or brotli made of them.",
             v[STAT_HTTP_COMP_OUT]);
  lx__metric(&t, "moonport_http_compress_cached_total", "counter",
             "Static files sent compressed from the cache.",
             v[STAT_HTTP_COMP_CACHED]);
  lx__metric(&t, "moonport_ws_deflate_in_bytes_total", "counter",
             "WebSocket message bytes given to permessage-deflate.",
             v[STAT_WS_DEFL_IN]);
  lx__metric(&t, "moonport_ws_deflate_out_bytes_total", "counter",
             "WebSocket message bytes permessage-deflate made of them.",
             v[STAT_WS_DEFL_OUT]);
  lx__metric(&t, "moonport_ws_deflates_total", "counter",
             "WebSocket messages deflated (a fan-out frame shared by its "
             "subscribers counts once).",
             v[STAT_WS_DEFLATES]);
  lx__metric(&t, "moonport_pg_connections", "gauge",
             "mp.pg connections open or opening.",
             lx__open(v, STAT_PG_CONN_OPENED, STAT_PG_CONN_CLOSED));
  lx__metric(&t, "moonport_pg_connections_busy", "gauge",
             "mp.pg connections with a query in flight or a transaction.",
             lx__open(v, STAT_PG_BUSY_IN, STAT_PG_BUSY_OUT));
  lx__metric(&t, "moonport_pg_waiting", "gauge",
             "mp.pg queries and transactions waiting for a connection.",
             lx__open(v, STAT_PG_WAIT_IN, STAT_PG_WAIT_OUT));
  lx__metric(&t, "moonport_pg_queries_total", "counter",
             "mp.pg queries answered.", v[STAT_PG_QUERIES]);
  lx__metric(&t, "moonport_pg_errors_total", "counter",
             "mp.pg queries answered with an error.", v[STAT_PG_ERRORS]);
  lx__printf(&t,
             "# HELP moonport_pg_sqlstate_errors_total mp.pg errors from the "
             "server by SQLSTATE class (the code's first two characters).\n"
             "# TYPE moonport_pg_sqlstate_errors_total counter\n");
  for (int i = 0; i < STAT_PG_ERRCLASSES; i++)
    if (v[STAT_PG_ERRCLASS + i])
      lx__printf(&t, "moonport_pg_sqlstate_errors_total{class=\"%s\"} %llu\n",
                 pg_errclass_name(i),
                 (unsigned long long)v[STAT_PG_ERRCLASS + i]);
  lx__metric(&t, "moonport_pg_timeouts_total", "counter",
             "mp.pg query and pool timeouts.", v[STAT_PG_TIMEOUTS]);
  lx__printf(&t,
             "# HELP moonport_pg_query_seconds_total Time mp.pg queries took, "
             "summed.\n"
             "# TYPE moonport_pg_query_seconds_total counter\n"
             "moonport_pg_query_seconds_total %.6f\n",
             (double)v[STAT_PG_QUERY_US] / 1e6);
  lx__printf(&t, "# HELP moonport_worker_restarts_total Worker processes "
                 "started after the first ones, by cause (crash, watchdog, "
                 "memory, reload, restart).\n"
                 "# TYPE moonport_worker_restarts_total counter\n");
  for (int i = 0; i < LX_RESTART_CAUSES; i++)
    lx__printf(&t, "moonport_worker_restarts_total{cause=\"%s\"} %llu\n",
               lx__causes[i],
               (unsigned long long)g[STAT_SRV_RESTARTS_CRASH + i]);
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
  lx__latency(&t, v);
  if (srv->metrics) {
    lx__metric(&t, "moonport_metric_updates_dropped_total", "counter",
               "Updates of a script's metrics that found no room for their "
               "series (too many label values).",
               metric_dropped(srv->metrics));
    metric_text(srv->metrics, lx__append, &t);
  }
  size_t un = 0;
  char *ut = lx_upstream_prometheus(srv, &un); /* mp.upstream's servers */
  if (ut) lx__printf(&t, "%.*s", (int)un, ut);
  free(ut);
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
