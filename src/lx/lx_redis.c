/* SPDX-License-Identifier: MIT */

/* lx_redis: mp.redis(url), an asynchronous Redis client for scripts: one
 * connection per client object, on the lane's reactor, with commands
 * pipelined on it. r:cmd(...) waits for the reply inside a callback, or
 * calls a function given last. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "lx/lx_embed.h"
#include "lx/lx_lane.h"
#include "lx/lx_redis.h"
#include "lx/lx_server.h"
#include "redis/redis.h"

#define LX_REDIS_MT "moonport.redis"
#define LX_REDIS_MAX_ARGS 1024 * 1024
/* The defaults of mp.redis(url, { timeout =, connect_timeout = }), ms. */
#define LX_REDIS_TIMEOUT_MS 5000
#define LX_REDIS_CONNECT_MS 3000
#define LX_REDIS_MS_MAX 86400000 /* a day: anything longer is a mistake */

typedef struct lx_redis {
  redis_link_t *link; /* NULL until first used, and once closed */
  /* Until the first command the client has not connected: a top-level
   * mp.redis runs in the root too (which serves nothing) and in every
   * lane, and only the lanes that use it should hold a connection. The
   * URL waits here (malloc'd) until then; NULL once connected or closed. */
  redis_url_t *url;
  int connect_ms;
  lx_lane_t *ln;
  struct lx_redis *prev, *next; /* the lane's open clients */
  int timeout_ms;               /* each command's, unless it says; 0: none */
  char desc[300];
} lx_redis_t;

/* The row's slot (lx_module.h): set by the runner before the first lane,
 * read-only after. */
int lx_redis_slot = -1;

static lx_redis_lane_t *lx__rl(const lx_lane_t *ln) {
  return lx_lane_state(ln, lx_redis_slot);
}

/* One command in flight. Two owners hold it: hiredis's reply slot (until
 * lx__reply runs, with the reply or with NULL when the context goes) and
 * the timeout timer while it is armed (until its on_finish, which
 * timer_stop defers while the timer's own fn runs). It is freed when both
 * have let go, so a timeout whose Lua closes the client, freeing every
 * slot, is safe. After a timeout the slot stays (hiredis matches replies
 * to commands by order), `abandoned`: its late reply is dropped. */
typedef struct {
  lx_lane_t *ln;
  int fn_ref;     /* callback mode: the function; LUA_NOREF when waiting */
  bool waiting;
  bool abandoned; /* timed out, or its task killed: nothing waits for it */
  int refs;
  mp_timer_t timer;
  lx_run_t run;   /* waiting mode: the suspended callback */
} lx_req_t;

static lx_req_t *lx__req_new(lx_lane_t *ln) {
  lx_req_t *q = calloc(1, sizeof(*q));
  if (!q) return NULL;
  q->ln = ln;
  q->fn_ref = LUA_NOREF;
  q->refs = 1; /* the caller's until sent, then the reply slot's */
  timer_init(&q->timer);
  q->timer.udata = q;
  return q;
}

static void lx__req_unref(lx_req_t *q) {
  if (--q->refs == 0) free(q);
}

static void lx__req_timer_done(mp_timer_t *t) { lx__req_unref(t->udata); }

/* The command took longer than its timeout: its caller hears nil and
 * "timeout" now; the reply, if it ever comes, finds the slot abandoned. */
static void lx__req_timeout(mp_timer_t *t) {
  lx_req_t *q = t->udata;
  lx_lane_t *ln = q->ln;
  if (q->abandoned) return; /* its task was killed */
  q->abandoned = true;
  if (ln->closing) return;
  if (q->waiting) {
    lx_run_t run = q->run;
    lua_pushnil(run.co);
    lua_pushliteral(run.co, "timeout");
    lx_resume(ln, &run, 2);
    return;
  }
  int fn_ref = q->fn_ref;
  q->fn_ref = LUA_NOREF;
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, fn_ref);
  luaL_unref(ln->L, LUA_REGISTRYINDEX, fn_ref);
  lua_pushnil(co);
  lua_pushliteral(co, "timeout");
  lx_call_on(ln, co, co_ref, 2, LX_PLAIN, NULL, NULL, "redis callback");
}

/* Arms q's timeout (ms 0: none). 0 or -ENOMEM. */
static int lx__req_arm_timer(lx_req_t *q, int ms) {
  if (ms <= 0) return 0;
  reactor_t *r = q->ln->r;
  if (timer_start(reactor_timers(r), &q->timer, reactor_now(r), (uint64_t)ms,
                  0, 1, lx__req_timeout, lx__req_timer_done, q))
    return -ENOMEM;
  q->refs++;
  return 0;
}

static void lx__req_stop_timer(lx_req_t *q) {
  timer_stop(reactor_timers(q->ln->r), &q->timer); /* may unref q */
}

/* Pushes a reply as Lua values: the value and nil, or nil and the error. */
static int lx__push_reply(lua_State *L, const redisReply *r, int depth) {
  if (!r) {
    lua_pushnil(L);
    lua_pushliteral(L, "connection lost");
    return 2;
  }
  switch (r->type) {
  case REDIS_REPLY_STRING:
  case REDIS_REPLY_STATUS:
    lua_pushlstring(L, r->str, r->len);
    break;
  case REDIS_REPLY_INTEGER:
    lua_pushnumber(L, (lua_Number)r->integer);
    break;
  case REDIS_REPLY_ARRAY:
    if (depth > 32 || !lua_checkstack(L, 4)) {
      lua_pushnil(L);
      lua_pushliteral(L, "reply nested too deep");
      return 2;
    }
    lua_createtable(L, (int)r->elements, 0);
    for (size_t i = 0; i < r->elements; i++) {
      int n = lx__push_reply(L, r->element[i], depth + 1);
      lua_pop(L, n - 1); /* the value (nil for a nested error) */
      if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        lua_pushboolean(L, 0); /* a nil element keeps its place */
      }
      lua_rawseti(L, -2, (int)i + 1);
    }
    break;
  case REDIS_REPLY_ERROR:
    lua_pushnil(L);
    lua_pushlstring(L, r->str, r->len);
    return 2;
  default: /* REDIS_REPLY_NIL */
    lua_pushnil(L);
    break;
  }
  lua_pushnil(L);
  return 2;
}

/* A waiting command of a client that was closed: it returns nil and
 * "connection closed", from a task (not from inside close). */
static void lx__closed_task(void *a, void *b) {
  lx_req_t *q = a;
  lx_lane_t *ln = q->ln;
  lx_run_t run = q->run;
  lx__req_unref(q);
  if (ln->closing) return;
  lua_pushnil(run.co);
  lua_pushliteral(run.co, "connection closed");
  lx_resume(ln, &run, 2);
}

static void lx__reply(redisAsyncContext *ac, void *r, void *priv) {
  lx_req_t *q = priv;
  lx_lane_t *ln = q->ln;
  lx__req_stop_timer(q);
  /* Timed out (the caller has had nil, "timeout": a late reply is
   * dropped), or the VM goes: nothing to call. */
  if (q->abandoned || ln->closing) {
    lx__req_unref(q);
    return;
  }
  if (!r && redis_link_closing(ac)) { /* r:close() or collected: no Lua */
    if (q->waiting && reactor_defer(ln->r, lx__closed_task, q, NULL) == 0)
      return;
    if (q->waiting) lx_run_abandon(ln, &q->run);
    if (q->fn_ref != LUA_NOREF) luaL_unref(ln->L, LUA_REGISTRYINDEX, q->fn_ref);
    lx__req_unref(q);
    return;
  }
  /* NULL: the context went; before it ever got through if the connect
   * timer freed it (a Redis that accepts and never answers, or an address
   * that never answers the SYN). */
  bool connect_timeout = !r && redis_link_connect_timed_out(ac);
  lua_State *co;
  int co_ref = LUA_NOREF;
  lx_run_t run = q->run;
  bool waiting = q->waiting;
  if (waiting) {
    co = run.co;
  } else {
    co = lx_co_take(ln, &co_ref);
    lua_rawgeti(co, LUA_REGISTRYINDEX, q->fn_ref);
    luaL_unref(ln->L, LUA_REGISTRYINDEX, q->fn_ref);
  }
  lx__req_unref(q);
  const char *tls_err = r ? NULL : redis_link_tls_error(ac);
  if (connect_timeout) {
    lua_pushnil(co);
    lua_pushliteral(co, "connect timeout");
  } else if (tls_err) { /* rediss: say why, not just "connection lost" */
    lua_pushnil(co);
    lua_pushfstring(co, "connection lost: %s", tls_err);
  } else {
    lx__push_reply(co, r, 0);
  }
  if (waiting)
    lx_resume(ln, &run, 2);
  else
    lx_call_on(ln, co, co_ref, 2, LX_PLAIN, NULL, NULL, "redis callback");
}

/* lx__send: hiredis's output buffer holds REDIS_OBUF_MAX unsent bytes
 * (Redis up but slow to read): nothing is sent and nothing calls back. */
#define LX__FULL INT_MIN
#define LX__FULL_MSG "output buffer full (Redis is slow to read)"

/* The client's link, made (connecting) on first use; NULL once closed or
 * when it can't be made (out of memory). */
static redis_link_t *lx__link(lx_redis_t *rc) {
  if (rc->link || !rc->url) return rc->link;
  rc->link =
      redis_link_new(rc->ln->r, rc->url, "redis (mp.redis)", rc->connect_ms,
                     (redis_link_hooks_t){NULL, NULL}, NULL);
  if (rc->link) {
    free(rc->url);
    rc->url = NULL;
  }
  return rc->link;
}

/* Sends the command in L's arguments [first, last]; q gets the reply, or
 * nil and "timeout" after ms (0: never). On failure nothing is armed. */
static int lx__send(lua_State *L, lx_redis_t *rc, int first, int last,
                    lx_req_t *q, int ms) {
  int argc = last - first + 1;
  if (argc < 1) return -1;
  redisAsyncContext *ac = lx__link(rc) ? redis_link_ctx_any(rc->link) : NULL;
  if (!ac) return -2;
  const char *stack_argv[16];
  size_t stack_lens[16];
  const char **argv = argc <= 16 ? stack_argv : malloc(sizeof(*argv) * (size_t)argc);
  size_t *lens = argc <= 16 ? stack_lens : malloc(sizeof(*lens) * (size_t)argc);
  if (!argv || !lens) {
    if (argv != stack_argv) free(argv);
    if (lens != stack_lens) free(lens);
    return -3;
  }
  for (int i = 0; i < argc; i++) {
    int t = lua_type(L, first + i);
    if (t != LUA_TSTRING && t != LUA_TNUMBER) {
      if (argv != stack_argv) free(argv);
      if (lens != stack_lens) free(lens);
      return -4 - i;
    }
    argv[i] = lua_tolstring(L, first + i, &lens[i]);
  }
  size_t total = 0;
  for (int i = 0; i < argc; i++) total += lens[i];
  if (redis_ctx_unsent(ac) + total > REDIS_OBUF_MAX) {
    if (argv != stack_argv) free(argv);
    if (lens != stack_lens) free(lens);
    return LX__FULL;
  }
  int ok = lx__req_arm_timer(q, ms) ? REDIS_ERR - 1
           : redisAsyncCommandArgv(ac, lx__reply, q, argc, argv, lens);
  if (argv != stack_argv) free(argv);
  if (lens != stack_lens) free(lens);
  if (ok == REDIS_OK) return 0;
  lx__req_stop_timer(q);
  return ok == REDIS_ERR ? -2 : -3;
}

/* Milliseconds in field `key` of the table at t: dflt when absent;
 * raises unless it is a number in [min, LX_REDIS_MS_MAX]. */
static int lx__opt_ms(lua_State *L, int t, const char *key, int dflt, int min,
                      const char *api) {
  lua_getfield(L, t, key);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return dflt;
  }
  lua_Number v = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : -1;
  lua_pop(L, 1);
  if (!(v >= min && v <= LX_REDIS_MS_MAX))
    luaL_error(L, "%s: %s must be a number of milliseconds from %d to %d",
               api, key, min, LX_REDIS_MS_MAX);
  return (int)ceil(v);
}

/* Raises if the table at t has a key not in `keys` (a misspelt option
 * would otherwise be ignored in silence). */
static void lx__opt_keys(lua_State *L, int t, const char *const *keys,
                         const char *api) {
  lua_pushnil(L);
  while (lua_next(L, t)) {
    lua_pop(L, 1);
    bool known = false;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (const char *const *k = keys; *k && !known; k++)
        known = strcmp(lua_tostring(L, -1), *k) == 0;
    if (!known) {
      const char *name = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                        : luaL_typename(L, -1);
      luaL_error(L, "%s: unknown option '%s'", api, name);
    }
  }
}

/* A command's options: r:cmd({ timeout = ms }, name, ...) (a table can't
 * be a Redis argument, so it can't be mistaken for one). Sets *ms to the
 * command's timeout and returns the index of its name. Raises on misuse. */
static int lx__cmd_opts(lua_State *L, int idx, const lx_redis_t *rc, int *ms) {
  *ms = rc->timeout_ms;
  if (lua_type(L, idx) != LUA_TTABLE) return idx;
  static const char *const keys[] = {"timeout", NULL};
  lx__opt_keys(L, idx, keys, "redis: cmd");
  *ms = lx__opt_ms(L, idx, "timeout", rc->timeout_ms, 0, "redis: cmd");
  return idx + 1;
}

static void lx__send_error(lua_State *L, int rc, int first) {
  if (rc == -1) luaL_error(L, "redis: cmd needs a command name");
  if (rc == -3) luaL_error(L, "redis: out of memory");
  if (rc <= -4)
    luaL_error(L, "redis: argument %d is a %s (strings and numbers only)",
               -rc - 4 + 1, luaL_typename(L, first + (-rc - 4)));
}

/* r:cmd(name, args..., fn) */
static int lx_redis_send(lua_State *L) {
  lx_redis_t *rc = luaL_checkudata(L, 1, LX_REDIS_MT);
  int top = lua_gettop(L);
  luaL_checktype(L, top, LUA_TFUNCTION);
  int ms;
  int first = lx__cmd_opts(L, 2, rc, &ms);
  lx_req_t *q = lx__req_new(rc->ln);
  if (!q) return luaL_error(L, "redis: out of memory");
  int err = lx__send(L, rc, first, top - 1, q, ms);
  if (err == -2 || err == LX__FULL) { /* nothing will call back */
    free(q);
    lua_pushnil(L);
    if (err == LX__FULL)
      lua_pushliteral(L, LX__FULL_MSG);
    else if (rc->link || rc->url)
      lua_pushliteral(L, "not connected");
    else
      lua_pushliteral(L, "connection closed");
    return 2;
  }
  if (err) {
    free(q);
    lx__send_error(L, err, first);
  }
  lua_pushvalue(L, top);
  q->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pushboolean(L, 1);
  return 1;
}

/* Checks a waiting r:cmd(...) before it yields: raises on misuse;
 * returns false and why when it can't be sent (the caller returns nil and
 * that), true otherwise. */
static int lx_redis_check(lua_State *L) {
  lx_redis_t *rc = luaL_checkudata(L, 1, LX_REDIS_MT);
  int top = lua_gettop(L);
  int ms;
  int first = lx__cmd_opts(L, 2, rc, &ms);
  if (top < first) return luaL_error(L, "redis: cmd needs a command name");
  for (int i = first; i <= top; i++) {
    int t = lua_type(L, i);
    if (t != LUA_TSTRING && t != LUA_TNUMBER)
      return luaL_error(L, "redis: argument %d is a %s (strings and numbers "
                           "only)", i - first + 1, luaL_typename(L, i));
  }
  lx_check_waitable(L, lua_touserdata(L, lua_upvalueindex(1)), "redis cmd");
  if (!lx__link(rc) || !redis_link_ctx_any(rc->link)) {
    lua_pushboolean(L, 0);
    lua_pushstring(L,
                   rc->link || rc->url ? "not connected" : "connection closed");
    return 2;
  }
  size_t total = 0;
  for (int i = first; i <= top; i++) {
    size_t n;
    lua_tolstring(L, i, &n); /* a number becomes its string, as sent */
    total += n;
  }
  if (redis_ctx_unsent(redis_link_ctx_any(rc->link)) + total > REDIS_OBUF_MAX) {
    lua_pushboolean(L, 0);
    lua_pushliteral(L, LX__FULL_MSG);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* A killed task's r:cmd (lx_wait_cancel_on): the command is on the wire,
 * so q stays until its reply (or the close) comes, and then only goes. */
static void lx__cmd_cancel(lx_lane_t *ln, void *arg) {
  lx_req_t *q = arg;
  q->abandoned = true; /* as after a timeout: the late reply is dropped */
  q->waiting = false;
  lx__req_stop_timer(q); /* hiredis's slot still holds q */
  lx_run_abandon(ln, &q->run);
}

/* Arms a waiting r:cmd: the client is at co's index 3, the command after. */
static int lx_redis_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  lx_redis_t *rc = lua_touserdata(co, 3);
  int ms;
  int first = lx__cmd_opts(co, 4, rc, &ms); /* checked: does not raise */
  lx_req_t *q = lx__req_new(ln);
  if (!q) return -ENOMEM;
  q->waiting = true;
  q->run = *run;
  int err = lx__send(co, rc, first, lua_gettop(co), q, ms);
  if (err) {
    free(q);
    return err == -2 ? -ENOTCONN
         : err == -3 ? -ENOMEM
         : err == LX__FULL ? -ENOBUFS
                           : -EINVAL;
  }
  lx_wait_cancel_on(ln, lx__cmd_cancel, q);
  return 0;
}

/* r:cmd itself is lua/moonport/redis.lua. */

static void lx__redis_close(lx_redis_t *rc) {
  redis_link_t *l = rc->link;
  if (!l && !rc->url) return;
  rc->link = NULL;
  free(rc->url);
  rc->url = NULL;
  if (rc->prev)
    rc->prev->next = rc->next;
  else
    lx__rl(rc->ln)->clients = rc->next;
  if (rc->next) rc->next->prev = rc->prev;
  rc->prev = rc->next = NULL;
  if (l)
    redis_link_free(l); /* pending replies come back as NULL, from here or,
                         * inside a reply callback, once it returns */
}

void lx_redis_close_all(lx_lane_t *ln) {
  while (lx__rl(ln)->clients) lx__redis_close(lx__rl(ln)->clients);
}

static int lx_redis_gc(lua_State *L) {
  lx__redis_close(luaL_checkudata(L, 1, LX_REDIS_MT));
  return 0;
}

static int lx_redis_close(lua_State *L) { return lx_redis_gc(L); }

static int lx_redis_connected(lua_State *L) {
  lx_redis_t *rc = luaL_checkudata(L, 1, LX_REDIS_MT);
  /* a use like a command: the first one starts connecting */
  lua_pushboolean(L, lx__link(rc) && redis_link_ctx(rc->link) != NULL);
  return 1;
}

static int lx_redis_tostring(lua_State *L) {
  lx_redis_t *rc = luaL_checkudata(L, 1, LX_REDIS_MT);
  lua_pushfstring(L, "redis client (%s)", rc->desc);
  return 1;
}

/* mp.redis(url [, { timeout = ms, connect_timeout = ms }]) */
static int lx_redis_new(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  const char *url = luaL_checkstring(L, 1);
  int timeout = LX_REDIS_TIMEOUT_MS, connect_ms = LX_REDIS_CONNECT_MS;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    static const char *const keys[] = {"timeout", "connect_timeout", NULL};
    lx__opt_keys(L, 2, keys, "mp.redis");
    timeout = lx__opt_ms(L, 2, "timeout", timeout, 0, "mp.redis");
    connect_ms = lx__opt_ms(L, 2, "connect_timeout", connect_ms, 1, "mp.redis");
  }
  redis_url_t u;
  char err[512];
  if (redis_url_parse(url, &u, err, sizeof(err)))
    return luaL_error(L, "mp.redis: %s", err);
  if (u.tls) { /* rediss: its files must load (the link loads them again) */
    net_tls_ctx_t *t = redis_url_tls(&u, err, sizeof(err));
    if (!t) return luaL_error(L, "mp.redis: %s", err);
    net_tls_ctx_unref(t);
  }
  lx_redis_t *rc = lua_newuserdata(L, sizeof(*rc));
  memset(rc, 0, sizeof(*rc));
  rc->ln = ln;
  rc->timeout_ms = timeout;
  char where[280];
  snprintf(rc->desc, sizeof(rc->desc), "%s/%d",
           redis_url_where(&u, where, sizeof(where)), u.db);
  luaL_getmetatable(L, LX_REDIS_MT);
  lua_setmetatable(L, -2);
  rc->connect_ms = connect_ms;
  rc->url = malloc(sizeof(*rc->url)); /* connects on first use (lx__link) */
  if (!rc->url) return luaL_error(L, "mp.redis: out of memory");
  *rc->url = u;
  rc->next = lx__rl(ln)->clients;
  if (rc->next) rc->next->prev = rc;
  lx__rl(ln)->clients = rc;
  return 1;
}

void lx_redis_open(lua_State *L, lx_lane_t *ln) {
  luaL_newmetatable(L, LX_REDIS_MT);
  lua_newtable(L); /* methods */
  lx_embed_core_table(L, "redis");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_redis_check, 1);
  lua_setfield(L, -2, "check");
  lua_pushlightuserdata(L, (void *)lx_redis_arm);
  lua_setfield(L, -2, "arm");
  lua_pushcfunction(L, lx_redis_send);
  lua_setfield(L, -2, "send");
  lua_pop(L, 1);
  lx_require(L, "moonport.redis");
  lua_setfield(L, -2, "cmd");
  lua_pushcfunction(L, lx_redis_close);
  lua_setfield(L, -2, "close");
  lua_pushcfunction(L, lx_redis_connected);
  lua_setfield(L, -2, "connected");
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, lx_redis_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, lx_redis_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushliteral(L, LX_REDIS_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_redis_new, 1);
  lua_setfield(L, -2, "redis");
}
