/* SPDX-License-Identifier: MIT */

/* lx_wait: the C half of mp.wait(fn [, timeout_ms]) (lua/moonport/
 * wake.lua): a one-shot latch a callback API fires, which resumes the
 * coroutine that waits on it, or a timer that resumes it with "timeout".
 *
 * The latch is a userdata, anchored in the registry while armed. Firing it
 * never resumes the waiter from inside the caller of wake (which may be
 * another coroutine in the middle of its own work): the resume is a task
 * on the lane's loop, as soon as the current callback returns. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lx/lx_client.h"
#include "lx/lx_embed.h"
#include "lx/lx_wait.h"

#define LX_WAKE_MT "moonport.wake"

enum { W_NEW = 0, W_ARMED, W_DONE };

struct lx_wake {
  lx_lane_t *ln;
  lx_client_t *cl; /* while armed (on cl->wakes), else NULL */
  int state;
  bool woken;      /* fired (not timed out) */
  bool queued;     /* a resume task is posted */
  bool cancelled;  /* killed while queued: the task only drops the anchor */
  lx_run_t run;    /* W_ARMED: the waiting callback */
  mp_timer_t timer;
  int anchor;      /* registry ref to the userdata while armed, so a timer
                      or a task never outlives it */
  struct lx_wake *prev, *next; /* cl->wakes while armed */
};

static void lx__unlink(lx_wake_t *w) {
  if (!w->cl) return;
  if (w->prev)
    w->prev->next = w->next;
  else if (w->cl->wakes == w)
    w->cl->wakes = w->next;
  if (w->next) w->next->prev = w->prev;
  w->prev = w->next = NULL;
  w->cl = NULL;
}

/* Resumes the waiter: true and nothing else when woken (the Lua half
 * returns what wake got), nil and "timeout" otherwise. */
static void lx__resume(lx_wake_t *w) {
  lx_lane_t *ln = w->ln;
  lx__unlink(w);
  lx_run_t run = w->run;
  int anchor = w->anchor;
  w->anchor = LUA_NOREF;
  int n = 1;
  if (w->woken) {
    lua_pushboolean(run.co, 1);
  } else {
    lua_pushnil(run.co);
    lua_pushliteral(run.co, "timeout");
    n = 2;
  }
  lx_resume(ln, &run, n);
  /* Last: no Lua runs between this and the return to the timer heap. */
  luaL_unref(ln->L, LUA_REGISTRYINDEX, anchor);
}

static void lx__task(void *a, void *b) {
  (void)b;
  lx_wake_t *w = a;
  w->queued = false;
  if (w->cancelled) {
    w->cancelled = false;
    int anchor = w->anchor;
    w->anchor = LUA_NOREF;
    if (!w->ln->closing) luaL_unref(w->ln->L, LUA_REGISTRYINDEX, anchor);
    return;
  }
  if (!w->cl || w->cl->closing || w->ln->closing) return;
  lx__resume(w);
}

static void lx__timeout(mp_timer_t *t) {
  lx_wake_t *w = t->udata;
  if (w->state != W_ARMED) return;
  w->state = W_DONE;
  lx__resume(w);
}

/* A killed task's mp.wait (lx_wait_cancel_on): the timer and any posted
 * resume are dropped; a later wake(...) is a no-op. */
static void lx__cancel(lx_lane_t *ln, void *arg) {
  lx_wake_t *w = arg;
  if (w->timer.armed) timer_stop(reactor_timers(ln->r), &w->timer);
  lx__unlink(w);
  w->state = W_DONE;
  lx_run_t run = w->run;
  lx_run_abandon(ln, &run);
  if (w->queued) { /* fired, its task posted: that task drops the anchor */
    w->cancelled = true;
    return;
  }
  int anchor = w->anchor;
  w->anchor = LUA_NOREF;
  luaL_unref(ln->L, LUA_REGISTRYINDEX, anchor);
}

/* core.wake.new(): a latch. */
static int lx_wake_new(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_wake_t *w = lua_newuserdata(L, sizeof(*w));
  memset(w, 0, sizeof(*w));
  w->ln = ln;
  w->anchor = LUA_NOREF;
  timer_init(&w->timer);
  luaL_getmetatable(L, LX_WAKE_MT);
  lua_setmetatable(L, -2);
  return 1;
}

/* core.wake.fire(w): true the first time, before any timeout (the Lua
 * half keeps the values then); false after. */
static int lx_wake_fire(lua_State *L) {
  lx_wake_t *w = luaL_checkudata(L, 1, LX_WAKE_MT);
  if (w->state == W_DONE || w->ln->closing) {
    lua_pushboolean(L, 0);
    return 1;
  }
  w->woken = true;
  if (w->state == W_ARMED) {
    if (w->timer.armed) timer_stop(reactor_timers(w->ln->r), &w->timer);
    if (reactor_defer(w->ln->r, lx__task, w, NULL)) {
      /* No memory for the task: resume now rather than never. */
      w->state = W_DONE;
      lx__resume(w);
      lua_pushboolean(L, 1);
      return 1;
    }
    w->queued = true;
  }
  w->state = W_DONE;
  lua_pushboolean(L, 1);
  return 1;
}

/* core.wake.check(w, ms): may this coroutine wait? */
static int lx_wake_check(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_check_waitable(L, ln, "mp.wait");
  return 0;
}

/* Arms the wait: the latch at co's 3, the timeout (ms, 0 none) at 4. */
static int lx_wake_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  lx_wake_t *w = lua_touserdata(co, 3);
  uint32_t ms = (uint32_t)lua_tonumber(co, 4);
  lx_client_t *cl = lx_client_of(ln);
  if (!cl || cl->closing) return -ESHUTDOWN;
  if (w->state != W_NEW) return -EINVAL;
  w->run = *run;
  if (ms && timer_start(reactor_timers(ln->r), &w->timer, reactor_now(ln->r),
                        ms, 0, 1, lx__timeout, NULL, w))
    return -ENOMEM;
  lua_pushvalue(co, 3);
  w->anchor = luaL_ref(co, LUA_REGISTRYINDEX);
  w->state = W_ARMED;
  w->cl = cl;
  w->next = cl->wakes;
  if (w->next) w->next->prev = w;
  cl->wakes = w;
  lx_wait_cancel_on(ln, lx__cancel, w);
  return 0;
}

/* A latch is collected only when no waiting frame holds it: an armed one
 * here belongs to a callback that was dropped. */
static int lx_wake_gc(lua_State *L) {
  lx_wake_t *w = luaL_checkudata(L, 1, LX_WAKE_MT);
  if (!w->cl) return 0; /* not armed, or the lane's state is gone */
  if (w->timer.armed) timer_stop(reactor_timers(w->ln->r), &w->timer);
  lx__unlink(w);
  return 0;
}

void lx_wait_lane_close(lx_lane_t *ln) {
  lx_client_t *cl = lx_client_closing(ln);
  if (!cl) return;
  while (cl->wakes) {
    lx_wake_t *w = cl->wakes;
    if (w->timer.armed) timer_stop(reactor_timers(cl->ln->r), &w->timer);
    lx__unlink(w); /* its anchor goes with the Lua state */
  }
}

void lx_wait_open(lua_State *L, lx_lane_t *ln) {
  luaL_newmetatable(L, LX_WAKE_MT);
  lua_pushcfunction(L, lx_wake_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushliteral(L, LX_WAKE_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
  lx_embed_core_table(L, "wake");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_wake_new, 1);
  lua_setfield(L, -2, "new");
  lua_pushcfunction(L, lx_wake_fire);
  lua_setfield(L, -2, "fire");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_wake_check, 1);
  lua_setfield(L, -2, "check");
  lua_pushlightuserdata(L, (void *)lx_wake_arm);
  lua_setfield(L, -2, "arm");
  lua_pop(L, 1);
  lx_require(L, "moonport.wake");
  lua_setfield(L, -2, "wait");
}
