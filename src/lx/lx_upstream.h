/* SPDX-License-Identifier: MIT */

/* lx_upstream: mp.upstream, the reverse proxy (lua/moonport/upstream.lua
 * over src/http/proxy.c): core.upstream.try (one proxied try, a waiter),
 * core.upstream.hash and core.upstream.idle. Lane thread only. */
#ifndef MP_LX_UPSTREAM_H
#define MP_LX_UPSTREAM_H

#include "lx/lx_lane.h"

/* The module's state in a lane (lx_module.h: its row's slot and
 * lane_size): the pool, made on first use, and the try's waits kept for
 * the next request. */
typedef struct {
  struct proxy_pool *pool;
  struct lx_up_wait *spare;
  int n_spare;
} lx_upstream_lane_t;
extern int lx_upstream_slot;

/* Registers core.upstream and sets mp.upstream in the module table at the
 * top of L. */
void lx_upstream_open(lua_State *L, lx_lane_t *ln);
/* Closes the lane's pooled upstream connections, detaches the exchanges
 * in flight and frees the spare waits; before the reactor goes. */
void lx_upstream_lane_free(lx_lane_t *ln);
/* The per-server metrics of every mp.upstream (requests, errors, latency,
 * state; from its shared dictionary) in the Prometheus text format,
 * malloc'd (*n bytes), or NULL when there are none. Any thread. */
char *lx_upstream_prometheus(lx_server_t *srv, size_t *n);
/* CLOCK_MONOTONIC in milliseconds: upstream.lua's clock (the down marks
 * in the dictionary, which every process reads), called through the FFI
 * so the JIT keeps it inside its traces (core.fetch.now, a C API
 * function, cut them twice a proxied request). Exported for ffi.C. Any
 * thread. */
double moonport_upstream_now(void);

#endif
