/* SPDX-License-Identifier: MIT */

/* lx_lane: a lane's Lua VM, its coroutine pool and the callback runner. */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <lualib.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "lx/lx_embed.h"
#include "lx/lx_lane.h"
#include "lx/lx_module.h"
#include "lx/lx_server.h"

/* Registry key whose address identifies the lane of a lua_State. */
static const char lx_lane_key = 0;

#define LX_IDLE_MAX 256

lx_lane_t *lx_lane_of(lua_State *L) {
  lua_pushlightuserdata(L, (void *)&lx_lane_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lx_lane_t *ln = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return ln;
}

const char *lx_errmsg(int err, char *buf, size_t len) {
  switch (err) {
  case -ETIMEDOUT: return "timeout";
  case -ECANCELED: return "shutdown";
  case -ECONNABORTED: return "closed";
  case -ENOBUFS: return "queue full";
  case -EADDRNOTAVAIL: return "cannot resolve address";
  case -EPIPE: return "closed";
  default: break;
  }
  const char *m = strerror_r(-err, buf, len);
  if (m != buf) {
    snprintf(buf, len, "%s", m);
  }
  if (buf[0] >= 'A' && buf[0] <= 'Z' && !(buf[1] >= 'A' && buf[1] <= 'Z'))
    buf[0] = (char)(buf[0] - 'A' + 'a');
  return buf;
}

int lx_push_fail(lua_State *L, int err) {
  char buf[128];
  lua_pushnil(L);
  lua_pushstring(L, lx_errmsg(err, buf, sizeof(buf)));
  return 2;
}

/* ---- the coroutine pool ---- */

lua_State *lx_co_take(lx_lane_t *ln, int *co_ref) {
  if (ln->idle_n > 0) {
    struct lx_idle_co *e = &ln->idle[--ln->idle_n];
    *co_ref = e->ref;
    return e->co;
  }
  lua_State *co = lua_newthread(ln->L);
  *co_ref = luaL_ref(ln->L, LUA_REGISTRYINDEX);
  return co;
}

/* lx_co_take_push's protected part, on the lane's main state. */
struct lx__take {
  lx_lane_t *ln;
  int (*push)(lua_State *L, void *arg);
  void *arg;
  lua_State *co;
  int co_ref, n;
};

static int lx__take_p(lua_State *L) {
  struct lx__take *t = lua_touserdata(L, 1);
  int n = t->push(L, t->arg);
  if (n < 0) {
    t->n = n;
    return 0;
  }
  t->co = lx_co_take(t->ln, &t->co_ref);
  /* A coroutine has LUA_MINSTACK free slots, so moving n <= LX_PUSH_MAX
   * values onto it allocates nothing (it could not raise in co). */
  lua_xmove(L, t->co, n);
  t->n = n;
  return 0;
}

/* Registry key of the lx__take_p closure, made once per lane so a call
 * allocates nothing before it is protected. */
static const char lx_take_key = 0;

lua_State *lx_co_take_push(lx_lane_t *ln, int *co_ref,
                           int (*push)(lua_State *L, void *arg), void *arg,
                           int *nargs) {
  lua_State *L = ln->L;
  struct lx__take t = {ln, push, arg, NULL, LUA_NOREF, 0};
  lua_pushlightuserdata(L, (void *)&lx_take_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lua_pushlightuserdata(L, &t);
  if (lua_pcall(L, 1, 0, 0) != 0) {
    log_error("out of memory while starting a callback: %s",
              lua_isstring(L, -1) ? lua_tostring(L, -1) : "?");
    lua_pop(L, 1);
    if (t.co) { /* taken, the push into it failed: drop it */
      lua_settop(t.co, 0);
      luaL_unref(L, LUA_REGISTRYINDEX, t.co_ref);
    }
    *nargs = -ENOMEM;
    return NULL;
  }
  *nargs = t.n;
  if (t.n < 0) return NULL;
  *co_ref = t.co_ref;
  return t.co;
}

static void lx__co_give_back(lx_lane_t *ln, lua_State *co, int co_ref) {
  lua_settop(co, 0);
  if (ln->idle_n == ln->idle_cap && ln->idle_cap < LX_IDLE_MAX) {
    int cap = ln->idle_cap ? ln->idle_cap * 2 : 16;
    struct lx_idle_co *idle = realloc(ln->idle, (size_t)cap * sizeof(*idle));
    if (idle) {
      ln->idle = idle;
      ln->idle_cap = cap;
    }
  }
  if (ln->idle_n < ln->idle_cap) {
    ln->idle[ln->idle_n++] = (struct lx_idle_co){co, co_ref};
    return;
  }
  luaL_unref(ln->L, LUA_REGISTRYINDEX, co_ref);
}

/* ---- running callbacks ---- */

/* The module whose callbacks run with run's kind, or NULL. */
static const lx_module_t *lx__module_of(lx_lane_t *ln, const lx_run_t *run) {
  for (const lx_module_t *m = ln->srv->modules; m && m->name; m++)
    if (m->run_kind == run->kind) return m;
  return NULL;
}

/* Every module's hook `fn` for the lane, in table order. */
#define LX_EACH_MODULE(ln, fn, ...)                                          \
  for (const lx_module_t *m_ = (ln)->srv->modules; m_ && m_->name; m_++)    \
    if (m_->fn) m_->fn(__VA_ARGS__)

static void lx__hold(lx_lane_t *ln, lx_run_t *run) {
  run->held = true;
  if (run->kind == LX_CONN && run->c)
    reactor_conn_hold(run->c);
  else
    reactor_ref(ln->r);
  /* What owns the callback may lose its last reference while it waits
   * (a timer's userdata); the module keeps it for a failure. */
  const lx_module_t *m = run->kind > LX_CONN ? lx__module_of(ln, run) : NULL;
  if (m && m->run_anchor) run->anchor = m->run_anchor(run);
}

static void lx__release(lx_lane_t *ln, lx_run_t *run) {
  if (run->kind == LX_CONN && run->c)
    reactor_conn_release(run->c);
  else
    reactor_unref(ln->r);
  luaL_unref(ln->L, LUA_REGISTRYINDEX, run->anchor);
  run->anchor = LUA_NOREF;
}

/* luaL_traceback in protected mode (lua_cpcall): out of memory while the
 * traceback is built must not panic the lane. */
struct lx__tb {
  lua_State *co;
  const char *what, *msg;
};

static int lx__traceback_p(lua_State *L) {
  struct lx__tb *tb = lua_touserdata(L, 1);
  luaL_traceback(L, tb->co, tb->msg, 0);
  log_error("error in %s: %s", tb->what, lua_tostring(L, -1));
  return 0;
}

/* Handles the error of a failed callback where it happened. */
#define LX_STRAY_YIELD                                                       \
  "attempt to yield from a callback outside a moonport waiting API (use "   \
  "mp.sleep; coroutines of your own must be resumed by you)"

static void lx__failed(lx_lane_t *ln, lx_run_t *run, int status) {
  lua_State *L = ln->L;
  const char *msg;
  if (status == LUA_YIELD) /* a yield past the checked one (a C module's) */
    msg = LX_STRAY_YIELD;
  else if (lua_gettop(run->co) > 0 && lua_type(run->co, -1) == LUA_TSTRING)
    msg = lua_tostring(run->co, -1);
  else
    msg = "(error object is not a string)";
  struct lx__tb tb = {run->co, run->what, msg};
  if (lua_cpcall(L, lx__traceback_p, &tb) != 0) {
    lua_pop(L, 1);
    log_error("error in %s: %s (no traceback: out of memory)", run->what, msg);
  }
  const lx_module_t *m = run->kind > LX_CONN ? lx__module_of(ln, run) : NULL;
  if (run->kind == LX_CONN && run->c)
    reactor_conn_force_close(run->c, CONN_ERROR);
  else if (m && m->run_failed)
    m->run_failed(run);
}

const char lx_wait_token = 0;

/* One resume of a run; `resumed` says it was suspended before (and so is
 * held). Returns whether it is suspended now. */
static bool lx__step(lx_lane_t *ln, lx_run_t *run, int nargs, bool resumed) {
  lx_run_t *outer = ln->running;
  ln->running = run;
  if (!outer) {
    atomic_store_explicit(&ln->busy_what, run->what, memory_order_relaxed);
    atomic_store_explicit(&ln->busy_since, reactor_clock_ms() + 1,
                          memory_order_release);
  }
  int status = lua_resume(run->co, nargs);
  if (!outer) atomic_store_explicit(&ln->busy_since, 0, memory_order_relaxed);
  ln->running = outer;
  if (status == LUA_YIELD && lua_gettop(run->co) >= 2 &&
      lua_touserdata(run->co, 1) == (void *)&lx_wait_token) {
    lx_arm_fn arm = (lx_arm_fn)lua_touserdata(run->co, 2);
    if (!resumed) lx__hold(ln, run);
    ln->arm_cancel = NULL;
    ln->arm_cancel_arg = NULL;
    int rc = arm(ln, run, run->co);
    lua_settop(run->co, 0);
    if (rc == 0) { /* arm keeps a copy of *run */
      const lx_module_t *m =
          run->kind > LX_CONN ? lx__module_of(ln, run) : NULL;
      if (m && m->run_waiting)
        m->run_waiting(run, ln->arm_cancel, ln->arm_cancel_arg);
      ln->arm_cancel = NULL;
      return true;
    }
    char buf[128];
    lua_pushstring(run->co, lx_errmsg(rc, buf, sizeof(buf)));
    status = LUA_ERRRUN;
    resumed = true;
  }
  if (status == 0) {
    lx__co_give_back(ln, run->co, run->co_ref);
  } else {
    lx__failed(ln, run, status);
    luaL_unref(ln->L, LUA_REGISTRYINDEX, run->co_ref);
  }
  if (resumed) lx__release(ln, run);
  return false;
}

void lx_wait_cancel_on(lx_lane_t *ln, lx_cancel_fn cancel, void *arg) {
  ln->arm_cancel = cancel;
  ln->arm_cancel_arg = arg;
}

void lx_check_waitable(lua_State *L, lx_lane_t *ln, const char *api) {
  if (!ln->running || ln->running->co != L)
    luaL_error(L, "%s: only inside a moonport callback (not at top level, "
                  "nor in a coroutine of your own)", api);
}

/* Registry key of the real coroutine.yield, which the waiting APIs use. */
static const char lx_raw_yield_key = 0;

void lx_push_raw_yield(lua_State *L) {
  lua_pushlightuserdata(L, (void *)&lx_raw_yield_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
}

/* The coroutine.yield scripts see: a yield straight out of a callback's
 * own coroutine (not from a coroutine the script made and resumes) would
 * leave the callback suspended for good, so it raises there instead,
 * where the callback's error handling takes it (on_request answers 500). */
static int lx__checked_yield(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  if (ln->running && ln->running->co == L) return luaL_error(L, LX_STRAY_YIELD);
  return lua_yield(L, lua_gettop(L));
}

/* core.waitable(): whether the caller may wait (it is the coroutine of
 * the callback now running), for Lua code that waits when it can and
 * falls back otherwise (lua/moonport/mp.lua's name lookups). */
static int lx__waitable(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lua_pushboolean(L, ln->running && ln->running->co == L);
  return 1;
}

static void lx__install_yield(lua_State *L, lx_lane_t *ln) {
  lua_getglobal(L, "coroutine");
  lua_pushlightuserdata(L, (void *)&lx_raw_yield_key);
  lua_getfield(L, -2, "yield");
  lx_embed_core(L); /* core.raw_yield, core.wait_token: lua/moonport/wait.lua */
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, "raw_yield");
  lua_pushlightuserdata(L, (void *)&lx_wait_token);
  lua_setfield(L, -2, "wait_token");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx__waitable, 1);
  lua_setfield(L, -2, "waitable");
  lua_pop(L, 1);
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx__checked_yield, 1);
  lua_setfield(L, -2, "yield");
  lua_pop(L, 1);
}

/* The waiter itself is lua/moonport/wait.lua. */
void lx_push_waiter(lua_State *L, lx_lane_t *ln, lua_CFunction check,
                    lx_arm_fn arm) {
  lx_require(L, "moonport.wait");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, check, 1);
  lua_pushlightuserdata(L, (void *)arm);
  lua_call(L, 2, 1);
}

bool lx_call_on(lx_lane_t *ln, lua_State *co, int co_ref, int nargs, int kind,
                conn_t *c, lx_timer_t *timer, const char *what) {
  lx_run_t run = {co, co_ref, kind, c, timer, what, LUA_NOREF, NULL, false};
  return lx__step(ln, &run, nargs, false);
}

bool lx_call_owned(lx_lane_t *ln, lua_State *co, int co_ref, int nargs,
                   int kind, void *owner, const char *what) {
  lx_run_t run = {co, co_ref, kind, NULL, NULL, what, LUA_NOREF, owner, false};
  return lx__step(ln, &run, nargs, false);
}

void lx_call(lx_lane_t *ln, lua_State *from, int nargs, int kind, conn_t *c,
             lx_timer_t *timer, const char *what) {
  int ref;
  lua_State *co = lx_co_take(ln, &ref);
  lua_xmove(from, co, nargs + 1);
  lx_call_on(ln, co, ref, nargs, kind, c, timer, what);
}

void lx_run_detach(lx_lane_t *ln, conn_t *c) {
  lx_run_t *run = ln->running;
  if (!run || run->kind != LX_CONN || run->c != c) return;
  if (run->held) { /* its hold moves from c to the loop */
    reactor_ref(ln->r);
    reactor_conn_release(c);
  }
  run->kind = LX_PLAIN;
  run->c = NULL;
}

void lx_run_abandon(lx_lane_t *ln, lx_run_t *run) {
  lx__release(ln, run);
  luaL_unref(ln->L, LUA_REGISTRYINDEX, run->co_ref);
}

void lx_resume(lx_lane_t *ln, lx_run_t *run, int nargs) {
  /* A run its module gave up on (a killed task) whose event came anyway:
   * dropped here, so no arm needs to know about killing. */
  const lx_module_t *m = run->kind > LX_CONN ? lx__module_of(ln, run) : NULL;
  if (m && m->run_resuming && !m->run_resuming(run)) {
    lua_settop(run->co, 0);
    lx_run_abandon(ln, run);
    return;
  }
  lx__step(ln, run, nargs, true);
}

void lx_call_list(lx_lane_t *ln, int list_ref, const char *what) {
  lua_State *L = ln->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, list_ref);
  int n = (int)lua_objlen(L, -1);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    lx_call(ln, L, 0, LX_PLAIN, NULL, NULL, what);
  }
  lua_pop(L, 1);
}

/* ---- lanes ---- */

/* The script's folder first on package.path (moonport's own modules come
 * from package.preload: lx_embed.h). */
/* Registry keys: the script's absolute folder (a string) and the table
 * that keeps lx_script_path's strings alive. */
static const char lx__script_dir_key = 0;
static const char lx__paths_key = 0;

static void lx__set_paths(lua_State *L, const char *script) {
  char *copy = strdup(script);
  const char *dir = copy ? dirname(copy) : ".";
  char *abs = realpath(dir, NULL); /* NULL: keep it as given */
  if (abs) dir = abs;
  lua_pushlightuserdata(L, (void *)&lx__script_dir_key);
  lua_pushstring(L, dir);
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, "%s/?.lua;%s/?/init.lua;%s", dir, dir,
                  lua_tostring(L, -1));
  lua_setfield(L, -3, "path");
  lua_pop(L, 2);
  free(abs);
  free(copy);
}

void lx_push_script_dir(lua_State *L) {
  lua_pushlightuserdata(L, (void *)&lx__script_dir_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
}

const char *lx_script_path(lua_State *L, const char *name) {
  if (!name || name[0] == '/') return name;
  lx_push_script_dir(L);
  size_t dl = 0, nl = strlen(name);
  const char *dir = lua_tolstring(L, -1, &dl);
  if (!dir) dir = ".", dl = 1;
  if (dl + 1 + nl >= PATH_MAX) {
    lua_pop(L, 1);
    luaL_error(L, "file name too long: %s", name);
  }
  lua_pushlightuserdata(L, (void *)&lx__paths_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushlightuserdata(L, (void *)&lx__paths_key);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
  }
  lua_pushfstring(L, "%s/%s", dir, name);
  const char *full = lua_tostring(L, -1);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3); /* paths[full] = true: interned, so `full` lives on */
  lua_pop(L, 2);
  return full;
}

/* math.random in every lane starts from the OS's randomness, so two
 * workers (or lanes) never draw the same numbers (ids made with it would
 * collide). LuaJIT seeds from a double: 53 random bits. */
static void lx__seed_random(lua_State *L) {
  uint64_t r = 0;
  if (getrandom(&r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    r = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^
        ((uint64_t)getpid() << 40) ^ (uint64_t)(uintptr_t)L;
  }
  lua_getglobal(L, "math");
  lua_getfield(L, -1, "randomseed");
  lua_pushnumber(L, (lua_Number)(r >> 11));
  lua_call(L, 1, 0);
  lua_pop(L, 1);
}

static void lx__set_args(lua_State *L, lx_server_t *srv) {
  lua_createtable(L, srv->argc, 1);
  lua_pushstring(L, srv->script);
  lua_rawseti(L, -2, 0);
  for (int i = 0; i < srv->argc; i++) {
    lua_pushstring(L, srv->argv[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setglobal(L, "arg");
}

static void lx__retire(lx_lane_t *ln);

/* The modules' per-lane states (lx_module.h: slot, lane_size). A row's
 * slot is written here only while it differs: the first lane of the
 * process is made on the main thread before any lane thread runs, and
 * every later one writes nothing, so lane threads only read it. */
static int lx__states_new(lx_lane_t *ln) {
  size_t n = 0;
  for (const lx_module_t *m = ln->srv->modules; m && m->name; m++) n++;
  ln->state = calloc(n ? n : 1, sizeof(*ln->state));
  if (!ln->state) return -ENOMEM;
  int i = 0;
  for (const lx_module_t *m = ln->srv->modules; m && m->name; m++, i++) {
    if (!m->slot) continue;
    if (*m->slot != i) *m->slot = i;
    if (m->lane_size && !(ln->state[i] = calloc(1, m->lane_size)))
      return -ENOMEM;
  }
  return 0;
}

static void lx__states_free(lx_lane_t *ln) {
  if (!ln->state) return;
  int i = 0;
  for (const lx_module_t *m = ln->srv->modules; m && m->name; m++, i++)
    free(ln->state[i]);
  free(ln->state);
  ln->state = NULL;
}

lx_lane_t *lx_lane_new(lx_server_t *srv, int index, bool is_root,
                       reactor_t *on, char *err, size_t errlen) {
  lx_lane_t *ln = calloc(1, sizeof(*ln));
  if (!ln) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  ln->srv = srv;
  ln->index = index;
  ln->is_root = is_root;
  ln->start_ref = ln->stop_ref = ln->worker_start_ref = ln->reload_ref =
      LUA_NOREF;
  if (lx__states_new(ln)) {
    snprintf(err, errlen, "out of memory");
    lx__states_free(ln);
    free(ln);
    return NULL;
  }
  ln->owns_r = !on;
  ln->r = on ? on : reactor_new(index);
  if (!ln->r) {
    snprintf(err, errlen, "cannot create an event loop: %s", strerror(errno));
    lx__states_free(ln);
    free(ln);
    return NULL;
  }
  timer_init(&ln->stats_timer);
  lua_State *L = ln->L = luaL_newstate();
  if (!L) {
    snprintf(err, errlen, "cannot create a Lua state");
    lx_lane_free(ln);
    return NULL;
  }
  luaL_openlibs(L);
  lx__seed_random(L);
  lua_pushlightuserdata(L, (void *)&lx_take_key);
  lua_pushcfunction(L, lx__take_p);
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_pushlightuserdata(L, (void *)&lx_lane_key);
  lua_pushlightuserdata(L, ln);
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_newtable(L);
  ln->start_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_newtable(L);
  ln->stop_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_newtable(L);
  ln->worker_start_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_newtable(L);
  ln->reload_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lx_embed_install(L);
  lx__install_yield(L, ln);
  LX_EACH_MODULE(ln, init, L, ln);
  lx__set_paths(L, srv->script);
  lx__set_args(L, srv);

  int rc = luaL_loadfile(L, srv->script);
  ln->loading = true; /* mp.shared may make dictionaries */
  if (rc == 0) rc = lua_pcall(L, 0, 0, 0);
  ln->loading = false;
  if (rc) {
    const char *m = lua_tostring(L, -1);
    if (rc == LUA_ERRFILE && m && strncmp(m, "cannot open ", 12) == 0)
      m += 12; /* "cannot open x.lua" becomes "x.lua: No such file ..." */
    snprintf(err, errlen, "%s", m ? m : "error loading the script");
    if (ln->owns_r)
      lx_lane_free(ln);
    else /* what its top level started on the shared reactor ends */
      lx__retire(ln);
    return NULL;
  }
  return ln;
}

static void lx__stop_hook(reactor_t *r, void *arg) {
  lx_lane_t *ln = arg;
  LX_EACH_MODULE(ln, stop, ln);
  lx_call_list(ln, ln->stop_ref, "stop handler");
}

static void lx__start(void *a, void *b) {
  lx_lane_t *ln = a;
  LX_EACH_MODULE(ln, start, ln);
  if (!ln->is_root) lx_call_list(ln, ln->worker_start_ref, "worker_start handler");
  lx_call_list(ln, ln->start_ref, "start handler");
  if (ln->is_root) return;
  /* The process serves once every lane's start handlers have run: the
   * main thread tells the root (or systemd) then. */
  atomic_fetch_add(&ln->srv->lanes_started, 1);
  uint64_t one = 1;
  ssize_t w = write(ln->srv->proc.wake_fd, &one, sizeof(one));
  (void)w;
}

void lx_lane_run(lx_lane_t *ln) {
  reactor_set_stop_hook(ln->r, lx__stop_hook, ln);
  reactor_defer(ln->r, lx__start, ln, NULL);
  /* A reload may replace (and free) the root lane while the loop runs. */
  lx_server_t *srv = ln->srv;
  int index = ln->index;
  int rc = reactor_run(ln->r);
  if (rc) log_error("lane %d: event loop failed: %s", index + 1,
                    strerror(-rc));
  atomic_fetch_add(&srv->lanes_done, 1);
  uint64_t one = 1; /* wake the main thread */
  ssize_t w = write(srv->proc.wake_fd, &one, sizeof(one));
  (void)w;
}

void lx_lane_free(lx_lane_t *ln) {
  if (!ln) return;
  if (ln->retired) { /* off the server's list */
    lx_lane_t **pp = &ln->srv->retired;
    while (*pp && *pp != ln) pp = &(*pp)->next_retired;
    if (*pp) *pp = ln->next_retired;
  }
  ln->closing = true;
  ln->retired = false; /* freeing its services must not post its free */
  if (ln->r) LX_EACH_MODULE(ln, stop, ln);
  /* Connections and write queues go first: their release callbacks still
   * use the Lua state. reactor_free frees the listeners too; what modules
   * keep on the reactor (sockets) goes before it. */
  if (ln->L) LX_EACH_MODULE(ln, close, ln);
  if (ln->owns_r) reactor_free(ln->r);
  if (ln->L) LX_EACH_MODULE(ln, free, ln);
  if (ln->L) lua_close(ln->L);
  lx__states_free(ln);
  free(ln->idle);
  free(ln);
}

/* ---- reloading the root lane ---- */

/* A retired lane is freed once nothing can call into it: no service (its
 * client connections are gone) and no task posted for it. */
static void lx__retired_free(void *a, void *b) {
  lx_lane_t *ln = a;
  ln->free_posted = false;
  if (ln->services || atomic_load(&ln->tasks) > 0) return; /* not yet */
  lx_lane_free(ln);
}

static void lx__retired_check(lx_lane_t *ln) {
  if (!ln->retired || ln->srv->exiting || ln->free_posted || ln->services ||
      atomic_load(&ln->tasks) > 0)
    return;
  /* Not here: a caller up the stack may still use the lane. */
  ln->free_posted = true;
  reactor_defer(ln->r, lx__retired_free, ln, NULL);
}

void lx_lane_task_done(lx_lane_t *ln) {
  if (atomic_fetch_sub(&ln->tasks, 1) == 1 && ln->retired)
    lx__retired_check(ln);
}

void lx_lane_service_gone(lx_lane_t *ln) {
  if (ln->retired && !ln->services) lx__retired_check(ln);
}

/* Ends what a replaced root lane started: timers, sleeps, subscriptions,
 * its claims on listeners; client connections finish on the old code. */
static void lx__retire(lx_lane_t *ln) {
  ln->retired = true;
  ln->next_retired = ln->srv->retired;
  ln->srv->retired = ln;
  LX_EACH_MODULE(ln, stop, ln);
  LX_EACH_MODULE(ln, retire, ln);
  lx__retired_check(ln);
}

bool lx_lane_reload_root(lx_server_t *srv, char *err, size_t errlen) {
  lx_lane_t *old = srv->lanes[0];
  lx_lane_t *ln = lx_lane_new(srv, 0, true, old->r, err, errlen);
  LX_EACH_MODULE(old, reload_end, srv, ln != NULL); /* new certificates? */
  if (!ln) return false;
  srv->lanes[0] = ln; /* deliveries from now on go to the new code */
  ln->owns_r = old->owns_r; /* the reactor outlives the old lane */
  old->owns_r = false;
  reactor_set_stop_hook(ln->r, lx__stop_hook, ln);
  lx_call_list(old, old->reload_ref, "reload handler");
  lx__retire(old);
  reactor_defer(ln->r, lx__start, ln, NULL);
  return true;
}

void lx_lane_free_retired(lx_server_t *srv) {
  while (srv->retired) lx_lane_free(srv->retired);
}

/* ---- for the process layer (lx_server.h) ---- */

reactor_t *lx_lane_reactor(const lx_lane_t *ln) { return ln->r; }

uint64_t lx_lane_busy(const lx_lane_t *ln, const char **what) {
  uint64_t since = atomic_load_explicit(&ln->busy_since, memory_order_acquire);
  *what = atomic_load_explicit(&ln->busy_what, memory_order_relaxed);
  return since;
}

/* In each lane of a replaced worker, before it drains: its
 * mp.on("reload") handlers, which may hand state to the new worker (its
 * subscriptions are in place: it said it was ready). */
static void lx__reload_task(void *a, void *b) {
  lx_lane_t *ln = a;
  lx_call_list(ln, ln->reload_ref, "reload handler");
}

void lx_lane_post_reload(lx_lane_t *ln) {
  reactor_post(ln->r, lx__reload_task, ln, NULL);
}
