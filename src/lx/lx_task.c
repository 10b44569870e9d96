/* SPDX-License-Identifier: MIT */

/* lx_task: tasks (pooled coroutines of kind LX_TASK that t:kill can end in
 * any wait) and parks (a coroutine waiting for another one of its lane),
 * the C half of lua/moonport/task.lua. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "lx/lx_embed.h"
#include "lx/lx_lane.h"
#include "lx/lx_task.h"

#define LX_TASK_MT "moonport.task_handle"
#define LX_PARK_MT "moonport.park"

static lx_lane_t *lx__ln(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

/* ---- parks ---- */

enum { PARK_IDLE = 0, PARK_WAITING, PARK_WAKING };

/* A userdata. It needs no anchor of its own: while it is not idle, the
 * Lua frame that parked keeps it (task.lua holds it in a local), and the
 * run (its coroutine's registry ref) keeps that frame. */
struct lx_park_timer;
typedef struct lx_park {
  lx_lane_t *ln;
  lx_run_t run;   /* while not idle */
  int state;
  bool cancelled; /* killed while waking: dropped when the wake runs */
  int val_ref;    /* waking: what park returns */
  struct lx_park_timer *tm;    /* its timeout, or NULL */
  struct lx_park *prev, *next; /* the lane's parks that are not idle */
} lx_park_t;

/* A park's timeout lives apart from the park: a stopped timer may still
 * sit in the batch the heap is running (timer_heap_run), and the park, a
 * userdata, may be collected by then. The heap frees it (on_finish). */
typedef struct lx_park_timer {
  mp_timer_t t;
  lx_park_t *p; /* NULL once detached */
} lx_park_timer_t;

/* Per lane, a userdata in the registry (lx_task_key). */
typedef struct {
  lx_park_t *parks;
} lx_task_lane_t;

static const char lx_task_key = 0;

static lx_task_lane_t *lx__state(lx_lane_t *ln) {
  lua_State *L = ln->L;
  lua_pushlightuserdata(L, (void *)&lx_task_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lx_task_lane_t *st = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return st;
}

static void lx__park_link(lx_park_t *p) {
  lx_task_lane_t *st = lx__state(p->ln);
  p->prev = NULL;
  p->next = st->parks;
  if (p->next) p->next->prev = p;
  st->parks = p;
}

static void lx__park_unlink(lx_park_t *p) {
  lx_task_lane_t *st = lx__state(p->ln);
  if (p->prev)
    p->prev->next = p->next;
  else if (st->parks == p)
    st->parks = p->next;
  if (p->next) p->next->prev = p->prev;
  p->prev = p->next = NULL;
}

static void lx__park_timer_free(mp_timer_t *t) { free(t->udata); }

static void lx__park_timer_stop(lx_park_t *p) {
  lx_park_timer_t *pt = p->tm;
  if (!pt) return;
  p->tm = NULL;
  pt->p = NULL;
  timer_stop(reactor_timers(p->ln->r), &pt->t); /* frees pt, now or later */
}

static void lx__park_timeout(mp_timer_t *t) {
  lx_park_timer_t *pt = t->udata;
  lx_park_t *p = pt->p;
  if (!p) return;
  pt->p = NULL;
  p->tm = NULL; /* the heap frees pt after this */
  if (p->state != PARK_WAITING) return;
  lx__park_unlink(p);
  p->state = PARK_IDLE;
  lx_run_t run = p->run;
  lua_pushnil(run.co);
  lua_pushliteral(run.co, "timeout");
  lx_resume(p->ln, &run, 2);
}

/* Drops a park's run for good (kill, retire); a waking one is dropped by
 * its wake, which still needs the park. */
static void lx__park_cancel(lx_lane_t *ln, void *arg) {
  lx_park_t *p = arg;
  if (p->state == PARK_WAKING) {
    p->cancelled = true;
    return;
  }
  if (p->state != PARK_WAITING) return;
  lx__park_timer_stop(p);
  lx__park_unlink(p);
  p->state = PARK_IDLE;
  lx_run_t run = p->run;
  lx_run_abandon(ln, &run); /* p may be collected from here on */
}

static void lx__park_wake(void *a, void *b) {
  (void)b;
  lx_park_t *p = a;
  lx_lane_t *ln = p->ln;
  if (!ln->closing && p->state == PARK_WAKING) {
    lx__park_unlink(p);
    p->state = PARK_IDLE;
    lx_run_t run = p->run;
    int ref = p->val_ref;
    p->val_ref = LUA_NOREF;
    if (p->cancelled) {
      p->cancelled = false;
      luaL_unref(ln->L, LUA_REGISTRYINDEX, ref);
      lx_run_abandon(ln, &run);
    } else {
      lua_rawgeti(run.co, LUA_REGISTRYINDEX, ref);
      luaL_unref(ln->L, LUA_REGISTRYINDEX, ref);
      lx_resume(ln, &run, 1);
    }
  }
  lx_lane_task_done(ln); /* a retired lane may be freed now */
}

static int lx_park_new(lua_State *L) {
  lx_park_t *p = lua_newuserdata(L, sizeof(*p));
  *p = (lx_park_t){.ln = lx__ln(L), .val_ref = LUA_NOREF};
  luaL_getmetatable(L, LX_PARK_MT);
  lua_setmetatable(L, -2);
  return 1;
}

/* park(p [, ms]): checked before the yield. */
static int lx__park_check(lua_State *L) {
  lx_park_t *p = luaL_checkudata(L, 1, LX_PARK_MT);
  if (p->state != PARK_IDLE) return luaL_argerror(L, 1, "already waiting");
  if (!lua_isnoneornil(L, 2)) {
    lua_Number ms = luaL_checknumber(L, 2);
    if (ms < 0 || ms > 1e12) luaL_argerror(L, 2, "milliseconds out of range");
  }
  lx_check_waitable(L, lx__ln(L), "wait");
  return 0;
}

static int lx__park_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  lx_park_t *p = lua_touserdata(co, 3);
  if (lua_isnumber(co, 4)) {
    lx_park_timer_t *pt = malloc(sizeof(*pt));
    if (!pt) return -ENOMEM;
    pt->p = p;
    timer_init(&pt->t);
    if (timer_start(reactor_timers(ln->r), &pt->t, reactor_now(ln->r),
                    (uint64_t)lua_tonumber(co, 4), 0, 1, lx__park_timeout,
                    lx__park_timer_free, pt)) {
      free(pt);
      return -ENOMEM;
    }
    p->tm = pt;
  }
  p->run = *run;
  p->state = PARK_WAITING;
  p->cancelled = false;
  lx__park_link(p);
  lx_wait_cancel_on(ln, lx__park_cancel, p);
  return 0;
}

/* unpark(p, v) -> whether p was waiting: it returns v on the loop's next
 * turn (not from inside this call: the waker goes on first). */
static int lx_unpark(lua_State *L) {
  lx_park_t *p = luaL_checkudata(L, 1, LX_PARK_MT);
  lua_settop(L, 2);
  if (p->state != PARK_WAITING) {
    lua_pushboolean(L, 0);
    return 1;
  }
  int ref = luaL_ref(L, LUA_REGISTRYINDEX); /* before anything changes */
  if (reactor_defer(p->ln->r, lx__park_wake, p, NULL)) {
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    return luaL_error(L, "cannot wake a waiting coroutine: out of memory");
  }
  atomic_fetch_add(&p->ln->tasks, 1);
  lx__park_timer_stop(p);
  p->state = PARK_WAKING;
  p->val_ref = ref;
  lua_pushboolean(L, 1);
  return 1;
}

void lx_task_retire(lx_lane_t *ln) {
  lx_task_lane_t *st = lx__state(ln);
  lx_park_t *p = st ? st->parks : NULL;
  while (p) {
    lx_park_t *next = p->next;
    lx__park_cancel(ln, p); /* a waking one stays listed for its wake */
    p = next;
  }
}

void lx_task_close(lx_lane_t *ln) {
  lx_task_lane_t *st = lx__state(ln);
  for (lx_park_t *p = st ? st->parks : NULL; p; p = p->next)
    lx__park_timer_stop(p);
}

/* ---- tasks ---- */

typedef struct {
  lx_lane_t *ln;
  int self_ref; /* the Lua task object while it runs */
  bool done;    /* finished, failed or killed */
  bool killed;
  bool waiting; /* suspended in a waiting API */
  lx_cancel_fn cancel;
  void *cancel_arg;
} lx_task_t;

static int lx_task_new(lua_State *L) {
  lx_task_t *h = lua_newuserdata(L, sizeof(*h));
  *h = (lx_task_t){.ln = lx__ln(L), .self_ref = LUA_NOREF};
  luaL_getmetatable(L, LX_TASK_MT);
  lua_setmetatable(L, -2);
  return 1;
}

static void lx__task_end(lx_task_t *h) {
  h->done = true;
  h->cancel = NULL;
  luaL_unref(h->ln->L, LUA_REGISTRYINDEX, h->self_ref);
  h->self_ref = LUA_NOREF;
}

/* run(h, body, task, fn, ...): body(task, fn, ...) in a pooled coroutine
 * of kind LX_TASK, at once, until it first waits. */
static int lx_task_run(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  lx_task_t *h = luaL_checkudata(L, 1, LX_TASK_MT);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  int n = lua_gettop(L) - 1; /* body and its arguments */
  lx_check_waitable(L, ln, "mp.spawn");
  lua_pushvalue(L, 3);
  h->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  if (!lua_checkstack(co, n + LUA_MINSTACK)) {
    lx__task_end(h);
    luaL_unref(ln->L, LUA_REGISTRYINDEX, co_ref);
    return luaL_error(L, "mp.spawn: too many arguments");
  }
  lua_xmove(L, co, n);
  lx_call_owned(ln, co, co_ref, n - 1, LX_TASK, h, "task");
  return 0;
}

/* done(h): body returned. */
static int lx_task_done(lua_State *L) {
  lx__task_end(luaL_checkudata(L, 1, LX_TASK_MT));
  return 0;
}

/* kill(h) -> what happened: "done" (nothing to kill), "self" (the caller
 * is the task: task.lua ends it with a yield that never resumes),
 * "cancelled" (its wait is gone) or "dropped" (its wait has no cancel: the
 * run is dropped when the event comes). Raises for a task that runs
 * further up the caller's stack. */
static int lx_task_kill(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  lx_task_t *h = luaL_checkudata(L, 1, LX_TASK_MT);
  if (h->done) {
    lua_pushliteral(L, "done");
    return 1;
  }
  if (ln->running && ln->running->owner == h) {
    h->killed = true;
    lx__task_end(h);
    lua_pushliteral(L, "self");
    return 1;
  }
  if (!h->waiting)
    return luaL_error(L, "t:kill: the task is running (it started the "
                         "caller); it can be killed once it waits");
  lx_cancel_fn cancel = h->cancel;
  void *arg = h->cancel_arg;
  h->killed = true;
  lx__task_end(h);
  if (!cancel) {
    lua_pushliteral(L, "dropped");
    return 1;
  }
  h->waiting = false;
  cancel(ln, arg);
  lua_pushliteral(L, "cancelled");
  return 1;
}

static int lx_task_now(lua_State *L) {
  lua_pushnumber(L, (lua_Number)reactor_now(lx__ln(L)->r));
  return 1;
}

/* current() -> the task object of the running coroutine, or nil. */
static int lx_task_current(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  lx_run_t *run = ln->running;
  if (!run || run->co != L || run->kind != LX_TASK) return 0;
  lx_task_t *h = run->owner;
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->self_ref);
  return 1;
}

/* The yield of a task killing itself: its run is dropped here. */
static int lx__selfkill_check(lua_State *L) {
  lx_check_waitable(L, lx__ln(L), "t:kill");
  return 0;
}

static int lx__selfkill_arm(lx_lane_t *ln, const lx_run_t *run,
                            lua_State *co) {
  (void)co;
  lx_run_t copy = *run;
  lx_run_abandon(ln, &copy);
  return 0;
}

static int lx_task_check(lua_State *L) {
  lx_check_waitable(L, lx__ln(L), luaL_checkstring(L, 1));
  return 0;
}

void lx_task_run_waiting(const lx_run_t *run, lx_cancel_fn cancel,
                         void *arg) {
  lx_task_t *h = run->owner;
  h->waiting = true;
  h->cancel = cancel;
  h->cancel_arg = arg;
}

bool lx_task_run_resuming(const lx_run_t *run) {
  lx_task_t *h = run->owner;
  h->waiting = false;
  h->cancel = NULL;
  return !h->killed;
}

/* The runner logged the error; the task's joiners get nil, err
 * (core.task.on_fail(task, err), from lua/moonport/task.lua). */
void lx_task_run_failed(const lx_run_t *run) {
  lx_task_t *h = run->owner;
  if (h->done) return;
  lx_lane_t *ln = h->ln;
  lua_State *L = ln->L;
  const char *msg = lua_type(run->co, -1) == LUA_TSTRING
                        ? lua_tostring(run->co, -1)
                        : "task failed (see the log)";
  lx_embed_core_table(L, "task");
  lua_getfield(L, -1, "on_fail");
  lua_remove(L, -2);
  lua_rawgeti(L, LUA_REGISTRYINDEX, h->self_ref);
  lua_pushstring(L, msg);
  lx__task_end(h);
  lx_call(ln, L, 2, LX_PLAIN, NULL, NULL, "task on_fail");
}

/* ---- the module ---- */

static void lx__reg(lua_State *L, lx_lane_t *ln, const char *name,
                    lua_CFunction fn) {
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, fn, 1);
  lua_setfield(L, -2, name);
}

void lx_task_open(lua_State *L, lx_lane_t *ln) {
  lua_pushlightuserdata(L, (void *)&lx_task_key);
  lx_task_lane_t *st = lua_newuserdata(L, sizeof(*st));
  st->parks = NULL;
  lua_rawset(L, LUA_REGISTRYINDEX);
  luaL_newmetatable(L, LX_TASK_MT);
  lua_pushliteral(L, LX_TASK_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
  luaL_newmetatable(L, LX_PARK_MT);
  lua_pushliteral(L, LX_PARK_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);

  lx_embed_core_table(L, "task"); /* for lua/moonport/task.lua */
  lx__reg(L, ln, "new", lx_task_new);
  lx__reg(L, ln, "run", lx_task_run);
  lx__reg(L, ln, "done", lx_task_done);
  lx__reg(L, ln, "kill", lx_task_kill);
  lx__reg(L, ln, "check", lx_task_check);
  lx__reg(L, ln, "current", lx_task_current);
  lx__reg(L, ln, "now", lx_task_now);
  lx__reg(L, ln, "park_new", lx_park_new);
  lx__reg(L, ln, "unpark", lx_unpark);
  lx_push_waiter(L, ln, lx__park_check, lx__park_arm);
  lua_setfield(L, -2, "park");
  lx_push_waiter(L, ln, lx__selfkill_check, lx__selfkill_arm);
  lua_setfield(L, -2, "selfkill");
  lua_pop(L, 1);
  lx_require(L, "moonport.task"); /* returns install(mp) */
  lua_pushvalue(L, -2);
  lua_call(L, 1, 0);
}
