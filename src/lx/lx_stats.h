/* SPDX-License-Identifier: MIT */

/* lx_stats: mp.stats() and mp.metrics(), and each lane's gauges. */
#ifndef MP_LX_STATS_H
#define MP_LX_STATS_H

#include "lx/lx_lane.h"
#include "core/stats.h"

/* The slot of lane `index` (0-based; the root lane: is_root) of this
 * process. */
stats_slot_t *lx_stats_slot(lx_server_t *srv, int index, bool is_root);
/* Starts / stops the lane's once-a-second gauges (Lua heap, loop lag). */
void lx_stats_lane_start(lx_lane_t *ln);
void lx_stats_lane_stop(lx_lane_t *ln);
/* The whole server's figures in the Prometheus text format (0.0.4), in a
 * malloc'd string of *len bytes; NULL when out of memory. */
char *lx_stats_prometheus(lx_server_t *srv, size_t *len);
/* mp.stats and mp.metrics into the table at the top of L. */
void lx_stats_open(lua_State *L, lx_lane_t *ln);
#endif
