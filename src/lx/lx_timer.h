/* SPDX-License-Identifier: MIT */

/* lx_timer: mp.after, mp.every, mp.sleep and timer objects. Lane thread. */
#ifndef MP_LX_TIMER_H
#define MP_LX_TIMER_H

#include "lx/lx_lane.h"

/* A suspended callback waiting for a timer (mp.sleep). */
typedef struct lx_sleep {
  mp_timer_t timer;
  lx_run_t run;
  lx_lane_t *ln;
  struct lx_sleep *prev, *next;
} lx_sleep_t;

/* The module's state in a lane (lx_module.h: its row's slot and
 * lane_size). */
typedef struct {
  lx_timer_t *timers; /* running mp.after / mp.every timers */
  lx_sleep_t *sleeps; /* suspended in mp.sleep */
} lx_timer_lane_t;
extern int lx_timer_slot;

/* Stops every timer of a retired lane, without their on_done. */
void lx_timers_stop_all(lx_lane_t *ln);
/* Ends every mp.sleep of a retired lane without resuming it. */
void lx_sleeps_abandon(lx_lane_t *ln);
/* Frees what is left of the lane's mp.sleep waits (after its reactor). */
void lx_sleeps_free(lx_lane_t *ln);
/* A timer whose callback failed: stop it without its on_done. */
void lx_timer_failed(lx_timer_t *t);
/* A registry ref to the timer's userdata (LUA_NOREF once finished). */
int lx_timer_anchor(lx_timer_t *t);
/* Adds mp.after, mp.every and mp.sleep to the module table at the top of
 * L (lx_timer.c, as are the four above). */
void lx_timer_open(lua_State *L, lx_lane_t *ln);
#endif
