/* SPDX-License-Identifier: MIT */

/* lx_wait: mp.wait, a callback API turned into a wait (its latches live
 * in the lane's lx_client_t). Lane thread. */
#ifndef MP_LX_WAIT_H
#define MP_LX_WAIT_H

#include "lx/lx_lane.h"

/* Registers mp.wait into the module table at the top of L. */
void lx_wait_open(lua_State *L, lx_lane_t *ln);
/* The lane is going: stops the armed latches' timers and drops their
 * waits without resuming them. Before the reactor is freed. */
void lx_wait_lane_close(lx_lane_t *ln);

#endif
