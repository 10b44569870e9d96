/* lx_modules: the Lua modules of the binding as the lane runner sees them:
 * one table (lx_modules, in lx_modules.c) lists each with the hooks it
 * needs at the points of a lane's life. The runner (lx_lane.c) walks the
 * table it is given (lx_server.modules) and names no module.
 *
 * Contract. Every hook may be NULL. They run on the lane's thread, or on
 * the main thread while the lane does not run yet (init) or no more
 * (close, free). Hooks of one kind run in table order. */
#ifndef MP_LX_MODULES_H
#define MP_LX_MODULES_H

#include "lx/lx_lane.h"
#include "lx/lx_server.h"

typedef struct lx_module {
  const char *name; /* NULL ends the table */
  /* A new lane's state, before the script runs: metatables, preloads. */
  void (*init)(lua_State *L, lx_lane_t *ln);
  /* require "moonport": adds the module's fields to the table at the top
   * of L. */
  void (*open)(lua_State *L, lx_lane_t *ln);
  /* The lane's loop starts (before its start handlers); it stops (the
   * shutdown's stop hook, a retire, a free: so idempotent). */
  void (*start)(lx_lane_t *ln);
  void (*stop)(lx_lane_t *ln);
  /* A root lane replaced by a reload: end what the module started for it
   * (its client connections finish on the old code). */
  void (*retire)(lx_lane_t *ln);
  /* The lane is freed: close runs before its reactor goes (sockets on
   * it), free after the reactor (its connections are gone) and before
   * lua_close. */
  void (*close)(lx_lane_t *ln);
  void (*free)(lx_lane_t *ln);
  /* For callbacks this module runs with kind `run_kind` (lx_run_t.kind,
   * above LX_CONN): when one suspends, a registry ref that keeps its owner
   * alive (or LUA_NOREF); when one fails, what to stop. */
  int run_kind;
  int (*run_anchor)(const lx_run_t *run);
  void (*run_failed)(const lx_run_t *run);
  /* One suspended in a wait, with the cancel its arm registered (NULL:
   * none; lx_wait_cancel_on); one about to be resumed: false drops it
   * instead (lx_run_abandon). */
  void (*run_waiting)(const lx_run_t *run, lx_cancel_fn cancel, void *arg);
  bool (*run_resuming)(const lx_run_t *run);
} lx_module_t;

/* The binding's modules, in the order their hooks run. */
extern const lx_module_t lx_modules[];

#endif
