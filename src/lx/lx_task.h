/* SPDX-License-Identifier: MIT */

/* lx_task: the C primitives under mp.spawn, mp.join, mp.wait_any, t:kill
 * and mp.semaphore (lua/moonport/task.lua holds the rest): tasks that run
 * in pooled coroutines of kind LX_TASK, and parks, the one way a task or
 * any callback waits for another coroutine of the same lane. Lane thread
 * only; nothing here crosses lanes.
 *
 * A task handle (userdata) is the run's owner (lx_run_t.owner): the
 * runner tells this module when the task's coroutine waits and with which
 * cancel (lx_wait_cancel_on), so t:kill() can end the wait at once. A
 * park (userdata) holds one suspended run until core.task.unpark(p, v)
 * (resumed on the loop's next turn with v), its timeout (nil, "timeout")
 * or a kill (never resumed). */
#ifndef MP_LX_TASK_H
#define MP_LX_TASK_H

#include "lx/lx_lane.h"

/* Fills core.task and adds mp.spawn, mp.join, mp.wait_any and
 * mp.semaphore to the module table at the top of L. */
void lx_task_open(lua_State *L, lx_lane_t *ln);
/* A retired lane: every parked run is dropped (as sleeps are). */
void lx_task_retire(lx_lane_t *ln);
/* Before the lane's reactor goes: park timers leave its heap. */
void lx_task_close(lx_lane_t *ln);
/* The module table's run hooks for LX_TASK (lx_module.h). */
void lx_task_run_failed(const lx_run_t *run);
void lx_task_run_waiting(const lx_run_t *run, lx_cancel_fn cancel, void *arg);
bool lx_task_run_resuming(const lx_run_t *run);

#endif
