/* SPDX-License-Identifier: MIT */

/* lx_modules: the one table of the binding's Lua modules (lx_module.h):
 * what each registers in a lane and what it ends when a lane stops, is
 * retired by a reload or is freed. The only file that names them all; the
 * lane runner walks this table. Order matters where noted. */
#include "lx/lx_client.h"
#include "lx/lx_conn.h"
#include "lx/lx_crypto.h"
#include "lx/lx_dns.h"
#include "lx/lx_fetch.h"
#include "lx/lx_http.h"
#include "lx/lx_lane.h"
#include "lx/lx_listen.h"
#include "lx/lx_metric.h"
#include "lx/lx_module.h"
#include "lx/lx_moonport.h"
#include "lx/lx_multipart.h"
#include "lx/lx_pg.h"
#include "lx/lx_pubsub.h"
#include "lx/lx_re.h"
#include "lx/lx_redis.h"
#include "lx/lx_server.h"
#include "lx/lx_shared.h"
#include "lx/lx_stats.h"
#include "lx/lx_tcp.h"
#include "lx/lx_task.h"
#include "lx/lx_template.h"
#include "lx/lx_timer.h"
#include "lx/lx_upstream.h"
#include "lx/lx_wait.h"
#include "lx/lx_ws.h"
#include "lx/lx_wsc.h"

/* ---- connections and services (lx_conn.c) ---- */

/* A retired root lane's listeners go (the root serves none; the new lane
 * has its own); its client connections stay. */
static void conn_retire(lx_lane_t *ln) {
  lx_service_t *s = ln->services, *next;
  for (; s; s = next) {
    next = s->next;
    if (!s->client) lx_service_free(s);
  }
}

/* Before the reactor goes: reactor_free frees the listeners itself. */
static void conn_close(lx_lane_t *ln) {
  for (lx_service_t *s = ln->services; s; s = s->next) s->listener = NULL;
}

static void conn_free(lx_lane_t *ln) {
  while (ln->services) lx_service_free(ln->services);
}

/* ---- the moonport module (lx_moonport.c); timers, sleeps (lx_timer.c) ---- */

static void moonport_init(lua_State *L, lx_lane_t *ln) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_moonport);
  lua_setfield(L, -2, "moonport");
  lua_pop(L, 2);
}

static void timer_retire(lx_lane_t *ln) {
  lx_timers_stop_all(ln);
  lx_sleeps_abandon(ln);
}

/* A timer's userdata may lose its last reference while its callback
 * waits; the callback still needs it if it fails. */
static int timer_anchor(const lx_run_t *run) {
  return run->timer ? lx_timer_anchor(run->timer) : LUA_NOREF;
}

static void timer_failed(const lx_run_t *run) {
  if (run->timer) lx_timer_failed(run->timer);
}

/* ---- the rest ---- */

static void stats_init(lua_State *L, lx_lane_t *ln) {
  (void)L;
  ln->stats = lx_stats_slot(ln->srv, ln->index, ln->is_root);
  if (ln->owns_r) reactor_set_stats(ln->r, ln->stats);
}

static const lx_module_t lx_modules[] = {
    /* conn first: its services (and their protocol settings) are freed
     * before http's per-lane cache. */
    {.name = "conn",
     .init = lx_conn_open,
     .retire = conn_retire,
     .reload_end = lx_shared_reload_end,
     .close = conn_close,
     .free = conn_free},
    {.name = "ws", .init = lx_ws_open},
    {.name = "moonport", .init = moonport_init},
    {.name = "timer",
     .slot = &lx_timer_slot,
     .lane_size = sizeof(lx_timer_lane_t),
     .open = lx_timer_open,
     .retire = timer_retire,
     .free = lx_sleeps_free,
     .run_kind = LX_TIMER,
     .run_anchor = timer_anchor,
     .run_failed = timer_failed},
    {.name = "pubsub",
     .slot = &lx_pubsub_slot,
     .lane_size = sizeof(lx_pubsub_lane_t),
     .init = lx_pubsub_init,
     .open = lx_pubsub_open,
     .retire = lx_pubsub_cancel_all},
    {.name = "multipart", .init = lx_multipart_init},
    {.name = "http",
     .slot = &lx_http_slot,
     .lane_size = sizeof(lx_http_lane_t),
     .open = lx_http_open,
     .free = lx_http_lane_free},
    {.name = "redis",
     .slot = &lx_redis_slot,
     .lane_size = sizeof(lx_redis_lane_t),
     .open = lx_redis_open,
     .close = lx_redis_close_all},
    /* mp.pg: closed before client's, whose resolver its pools use */
    {.name = "pg", .open = lx_pg_open, .close = lx_pg_close_all},
    /* mp.resolve, mp.tcp, mp.wait: their sockets are on the reactor; the
     * state they share (lx_client.h) goes after their closes */
    {.name = "dns", .open = lx_dns_open},
    {.name = "tcp", .open = lx_tcp_open, .close = lx_tcp_lane_close},
    {.name = "wait", .open = lx_wait_open, .close = lx_wait_lane_close},
    {.name = "client", .close = lx_client_lane_free},
    /* mp.fetch: after client (fetch.lua is written over mp.tcp) */
    {.name = "fetch", .open = lx_fetch_open},
    /* mp.upstream: its pooled connections are on the reactor */
    {.name = "upstream",
     .slot = &lx_upstream_slot,
     .lane_size = sizeof(lx_upstream_lane_t),
     .open = lx_upstream_open,
     .close = lx_upstream_lane_free},
    /* mp.websocket: Lua over mp.connect, nothing of its own to end */
    {.name = "wsc", .open = lx_wsc_open},
    {.name = "stats",
     .init = stats_init,
     .open = lx_stats_open,
     .start = lx_stats_lane_start,
     .stop = lx_stats_lane_stop},
    {.name = "shared", .open = lx_shared_open},
    {.name = "crypto", .open = lx_crypto_open},
    {.name = "jwt", .open = lx_jwt_open}, /* after crypto: written over it */
    {.name = "re", .open = lx_re_open},
    {.name = "template", .open = lx_template_open},
    /* mp.counter, mp.gauge, mp.histogram */
    {.name = "metric", .open = lx_metric_open},
    {.name = "task",
     .open = lx_task_open,
     .retire = lx_task_retire,
     .close = lx_task_close,
     .run_kind = LX_TASK,
     .run_failed = lx_task_run_failed,
     .run_waiting = lx_task_run_waiting,
     .run_resuming = lx_task_run_resuming},
    {.name = NULL}};

const lx_module_t *lx_binding_modules(void) { return lx_modules; }
