/* SPDX-License-Identifier: MIT */

/* lx_pg: mp.pg, PostgreSQL clients for scripts (src/pg below). */
#ifndef MP_LX_PG_H
#define MP_LX_PG_H

#include "lx/lx_lane.h"

/* Registers mp.pg and mp.null into the module table at the top of L. */
void lx_pg_open(lua_State *L, lx_lane_t *ln);
/* Closes the lane's clients: their waits are dropped (the lane goes).
 * Before the reactor and the resolver go. */
void lx_pg_close_all(lx_lane_t *ln);

#endif
