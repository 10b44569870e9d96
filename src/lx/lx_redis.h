/* SPDX-License-Identifier: MIT */

/* lx_redis: mp.redis clients (r:cmd waits in its coroutine; the Lua half
 * is lua/moonport/redis.lua). Lane thread. */
#ifndef MP_LX_REDIS_H
#define MP_LX_REDIS_H

#include "lx/lx_lane.h"

/* The module's state in a lane (lx_module.h: its row's slot and
 * lane_size). */
typedef struct {
  struct lx_redis *clients; /* open mp.redis clients */
} lx_redis_lane_t;
extern int lx_redis_slot;

/* Adds mp.redis to the module table at the top of L. */
void lx_redis_open(lua_State *L, lx_lane_t *ln);
/* Closes the lane's mp.redis clients (before its reactor goes). */
void lx_redis_close_all(lx_lane_t *ln);
#endif
