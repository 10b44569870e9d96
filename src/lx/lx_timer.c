/* SPDX-License-Identifier: MIT */

/* lx_timer: mp.after, mp.every (timer objects with stop/active) and
 * mp.sleep, on the lane's reactor timer heap; and what a retired lane's
 * timers and sleeps become. Moved from lx_moonport.c. */
#include <errno.h>
#include <stdlib.h>

#include "lx/lx_lane.h"
#include "lx/lx_server.h"
#include "lx/lx_timer.h"

/* The row's slot (lx_module.h): set by the runner before the first lane,
 * read-only after. */
int lx_timer_slot = -1;

static lx_timer_lane_t *lx__tl(const lx_lane_t *ln) {
  return lx_lane_state(ln, lx_timer_slot);
}

#define LX_TIMER_MT "moonport.timer"

static lx_lane_t *lx__ln(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

/* ---- timers ---- */

struct lx_timer {
  mp_timer_t t;
  lx_lane_t *ln;
  int fn_ref, done_ref, self_ref;
  bool failed;
  bool linked; /* on the lane's list of running timers */
  struct lx_timer *prev, *next;
};

static void lx__timer_fire(mp_timer_t *mt) {
  lx_timer_t *t = mt->udata;
  lx_lane_t *ln = t->ln;
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, t->fn_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, t->self_ref);
  lx_call_on(ln, co, co_ref, 1, LX_TIMER, NULL, t, "timer");
}

static void lx__timer_unlink(lx_timer_t *t) {
  if (!t->linked) return;
  t->linked = false;
  if (t->prev)
    t->prev->next = t->next;
  else
    lx__tl(t->ln)->timers = t->next;
  if (t->next) t->next->prev = t->prev;
  t->prev = t->next = NULL;
}

static void lx__timer_finish(mp_timer_t *mt) {
  lx_timer_t *t = mt->udata;
  lx_lane_t *ln = t->ln;
  lua_State *L = ln->L;
  lx__timer_unlink(t);
  if (!t->failed && t->done_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->done_ref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
    lx_call(ln, L, 1, LX_PLAIN, NULL, NULL, "timer on_done");
  }
  luaL_unref(L, LUA_REGISTRYINDEX, t->fn_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, t->done_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, t->self_ref); /* collectable from now */
  t->fn_ref = t->done_ref = t->self_ref = LUA_NOREF;
}

int lx_timer_anchor(lx_timer_t *t) {
  if (t->self_ref == LUA_NOREF) return LUA_NOREF;
  lua_State *L = t->ln->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

void lx_timers_stop_all(lx_lane_t *ln) {
  while (lx__tl(ln)->timers) {
    lx_timer_t *t = lx__tl(ln)->timers;
    /* Off the list first: a timer due in the batch now running finishes
     * only when the batch reaches it. */
    lx__timer_unlink(t);
    t->failed = true; /* no on_done: the code is being replaced */
    timer_stop(reactor_timers(ln->r), &t->t);
  }
}

void lx_timer_failed(lx_timer_t *t) {
  t->failed = true;
  timer_stop(reactor_timers(t->ln->r), &t->t);
}

static lua_Number lx__ms(lua_State *L, int idx) {
  lua_Number ms = luaL_checknumber(L, idx);
  if (ms < 0 || ms > 1e12) luaL_argerror(L, idx, "milliseconds out of range");
  return ms;
}

static int lx__timer_new(lua_State *L, lua_Number delay, lua_Number interval,
                         lua_Number count, int fn_idx, int done_idx) {
  lx_lane_t *ln = lx__ln(L);
  luaL_checktype(L, fn_idx, LUA_TFUNCTION);
  if (done_idx && !lua_isnoneornil(L, done_idx))
    luaL_checktype(L, done_idx, LUA_TFUNCTION);
  else
    done_idx = 0;
  /* The userdata goes on top: an absent on_done's slot may be where it
   * lands, so that slot was decided above. */
  lx_timer_t *t = lua_newuserdata(L, sizeof(*t));
  timer_init(&t->t);
  t->ln = ln;
  t->failed = false;
  t->linked = false;
  t->fn_ref = t->done_ref = t->self_ref = LUA_NOREF;
  luaL_getmetatable(L, LX_TIMER_MT);
  lua_setmetatable(L, -2);
  /* From the clock now, not the loop's (stamped before this callback, or
   * before a slow top level, ran): a timer never fires before its delay
   * as mp.now() sees it. */
  int rc = timer_start(reactor_timers(ln->r), &t->t, reactor_clock_ms(),
                       (uint64_t)delay, (uint64_t)interval, (int64_t)count,
                       lx__timer_fire, lx__timer_finish, t);
  if (rc) return luaL_error(L, "cannot start a timer: out of memory");
  t->prev = NULL;
  t->next = lx__tl(ln)->timers;
  if (t->next) t->next->prev = t;
  lx__tl(ln)->timers = t;
  t->linked = true;
  lua_pushvalue(L, fn_idx);
  t->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (done_idx) {
    lua_pushvalue(L, done_idx);
    t->done_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_pushvalue(L, -1);
  t->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

static int lx_after(lua_State *L) {
  return lx__timer_new(L, lx__ms(L, 1), 0, 1, 2, 0);
}

static int lx_every(lua_State *L) {
  lua_Number ms = lx__ms(L, 1);
  lua_Number times = luaL_optnumber(L, 3, 0);
  if (times < 0 || times != (lua_Number)(int64_t)times)
    return luaL_argerror(L, 3, "times must be a whole number >= 0");
  return lx__timer_new(L, ms, ms, times, 2, 4);
}

static int lx_timer_stop(lua_State *L) {
  lx_timer_t *t = luaL_checkudata(L, 1, LX_TIMER_MT);
  timer_stop(reactor_timers(t->ln->r), &t->t);
  return 0;
}

static int lx_timer_active(lua_State *L) {
  lx_timer_t *t = luaL_checkudata(L, 1, LX_TIMER_MT);
  lua_pushboolean(L, t->t.armed);
  return 1;
}

/* ---- waiting ---- */

static void lx__sleep_unlink(lx_lane_t *ln, lx_sleep_t *s) {
  if (s->prev)
    s->prev->next = s->next;
  else
    lx__tl(ln)->sleeps = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = NULL;
}

static void lx__sleep_fire(mp_timer_t *mt) {
  lx_sleep_t *s = mt->udata;
  lx_lane_t *ln = s->ln;
  lx__sleep_unlink(ln, s);
  lx_run_t run = s->run;
  lx_resume(ln, &run, 0);
}

/* The timer is done with its storage only after fn returned. */
static void lx__sleep_free(mp_timer_t *mt) { free(mt->udata); }

/* A killed task's sleep (lx_wait_cancel_on): it never fires. */
static void lx__sleep_cancel(lx_lane_t *ln, void *arg) {
  lx_sleep_t *s = arg;
  lx__sleep_unlink(ln, s);
  lx_run_abandon(ln, &s->run);
  timer_stop(reactor_timers(ln->r), &s->timer); /* frees s */
}

static int lx__sleep_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  lx_sleep_t *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  s->run = *run;
  s->ln = ln;
  timer_init(&s->timer);
  if (timer_start(reactor_timers(ln->r), &s->timer, reactor_clock_ms(),
                  (uint64_t)lua_tonumber(co, 3), 0, 1, lx__sleep_fire,
                  lx__sleep_free, s)) {
    free(s);
    return -ENOMEM;
  }
  s->next = lx__tl(ln)->sleeps;
  if (s->next) s->next->prev = s;
  lx__tl(ln)->sleeps = s;
  lx_wait_cancel_on(ln, lx__sleep_cancel, s);
  return 0;
}

void lx_sleeps_abandon(lx_lane_t *ln) {
  while (lx__tl(ln)->sleeps) {
    lx_sleep_t *s = lx__tl(ln)->sleeps;
    lx__tl(ln)->sleeps = s->next;
    lx_run_abandon(ln, &s->run);
    timer_stop(reactor_timers(ln->r), &s->timer); /* frees s */
  }
}

void lx_sleeps_free(lx_lane_t *ln) {
  while (lx__tl(ln)->sleeps) {
    lx_sleep_t *s = lx__tl(ln)->sleeps;
    lx__tl(ln)->sleeps = s->next;
    free(s);
  }
}

static int lx__sleep_check(lua_State *L) {
  lx__ms(L, 1);
  lx_check_waitable(L, lx__ln(L), "mp.sleep");
  return 0;
}

/* ---- the module ---- */

static const luaL_Reg lx_timer_methods[] = {
    {"stop", lx_timer_stop}, {"active", lx_timer_active}, {NULL, NULL}};

void lx_timer_open(lua_State *L, lx_lane_t *ln) {
  luaL_newmetatable(L, LX_TIMER_MT);
  lua_newtable(L);
  luaL_setfuncs(L, lx_timer_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushliteral(L, LX_TIMER_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_after, 1);
  lua_setfield(L, -2, "after");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_every, 1);
  lua_setfield(L, -2, "every");
  lx_push_waiter(L, ln, lx__sleep_check, lx__sleep_arm);
  lua_setfield(L, -2, "sleep");
}
