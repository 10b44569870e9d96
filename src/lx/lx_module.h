/* SPDX-License-Identifier: MIT */

/* lx_module: a Lua module of the binding as the lane runner sees it: the
 * hooks it needs at the points of a lane's life. One table (lx_modules.c,
 * the only file that names every module) lists them; the runner
 * (lx_lane.c) walks the table it is given (lx_server.modules) and names no
 * module. This header is the type alone, so it includes nothing of the
 * binding: the runner includes it without pulling the table's modules
 * upward.
 *
 * Contract. Every hook may be NULL. They run on the lane's thread, or on
 * the main thread while the lane does not run yet (init) or no more
 * (close, free). Hooks of one kind run in table order. */
#ifndef MP_LX_MODULE_H
#define MP_LX_MODULE_H

#include <lua.h>
#include <stdbool.h>

/* lx_lane.h's (a repeated typedef is allowed in C11) */
typedef struct lx_lane lx_lane_t;
typedef struct lx_run lx_run_t;
typedef void (*lx_cancel_fn)(lx_lane_t *ln, void *arg);
typedef struct lx_server lx_server_t;

typedef struct lx_module {
  const char *name; /* NULL ends the table */
  /* Per-lane state (the one pattern for it): lane_size zeroed bytes in
   * every lane, made before the init hooks and freed after the free
   * hooks (plain memory: end what it points at in close or free). The
   * runner writes the row's index into *slot before the first lane
   * exists; the module reaches its state with lx_lane_state(ln, *slot)
   * (lx_lane.h). slot NULL: no state. */
  int *slot;
  size_t lane_size;
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
  /* A root reload ended (lx_lane_reload_root): the new lane loaded (ok)
   * or the script failed. Once per reload, with the old lane's table. */
  void (*reload_end)(lx_server_t *srv, bool ok);
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

#endif
