/* lx_redis: mp.redis(url), an asynchronous Redis client for scripts: one
 * connection per client object, on the lane's reactor, with commands
 * pipelined on it. r:cmd(...) waits for the reply inside a callback, or
 * calls a function given last. */
#include <errno.h>
#include <limits.h>
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

typedef struct lx_redis {
  redis_link_t *link; /* NULL once closed */
  lx_lane_t *ln;
  struct lx_redis *prev, *next; /* the lane's open clients */
  char desc[300];
} lx_redis_t;

/* One command in flight. */
typedef struct {
  lx_lane_t *ln;
  int fn_ref;     /* callback mode: the function; LUA_NOREF when waiting */
  bool waiting;
  bool dropped;   /* its waiter was killed (t:kill): the reply is ignored */
  lx_run_t run;   /* waiting mode: the suspended callback */
} lx_req_t;

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
  bool dropped = q->dropped;
  free(q);
  if (ln->closing || dropped) return;
  lua_pushnil(run.co);
  lua_pushliteral(run.co, "connection closed");
  lx_resume(ln, &run, 2);
}

static void lx__reply(redisAsyncContext *ac, void *r, void *priv) {
  lx_req_t *q = priv;
  lx_lane_t *ln = q->ln;
  if (ln->closing || q->dropped) { /* the VM goes, or the waiter did */
    free(q);
    return;
  }
  if (!r && redis_link_closing(ac)) { /* r:close() or collected: no Lua */
    if (q->waiting && reactor_defer(ln->r, lx__closed_task, q, NULL) == 0)
      return;
    if (q->waiting) lx_run_abandon(ln, &q->run);
    if (q->fn_ref != LUA_NOREF) luaL_unref(ln->L, LUA_REGISTRYINDEX, q->fn_ref);
    free(q);
    return;
  }
  if (q->waiting) {
    lx_run_t run = q->run;
    free(q);
    lx__push_reply(run.co, r, 0);
    lx_resume(ln, &run, 2);
    return;
  }
  lua_State *L = ln->L;
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, q->fn_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, q->fn_ref);
  free(q);
  lx__push_reply(co, r, 0);
  lx_call_on(ln, co, co_ref, 2, LX_PLAIN, NULL, NULL, "redis callback");
}

/* lx__send: hiredis's output buffer holds REDIS_OBUF_MAX unsent bytes
 * (Redis up but slow to read): nothing is sent and nothing calls back. */
#define LX__FULL INT_MIN
#define LX__FULL_MSG "output buffer full (Redis is slow to read)"

/* Sends the command in L's arguments [first, last]; q gets the reply. */
static int lx__send(lua_State *L, lx_redis_t *rc, int first, int last,
                    lx_req_t *q) {
  int argc = last - first + 1;
  if (argc < 1) return -1;
  redisAsyncContext *ac = rc->link ? redis_link_ctx_any(rc->link) : NULL;
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
  int ok = redisAsyncCommandArgv(ac, lx__reply, q, argc, argv, lens);
  if (argv != stack_argv) free(argv);
  if (lens != stack_lens) free(lens);
  return ok == REDIS_OK ? 0 : -2;
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
  lx_req_t *q = calloc(1, sizeof(*q));
  if (!q) return luaL_error(L, "redis: out of memory");
  q->ln = rc->ln;
  int err = lx__send(L, rc, 2, top - 1, q);
  if (err == -2 || err == LX__FULL) { /* nothing will call back */
    free(q);
    lua_pushnil(L);
    if (err == LX__FULL)
      lua_pushliteral(L, LX__FULL_MSG);
    else if (rc->link)
      lua_pushliteral(L, "not connected");
    else
      lua_pushliteral(L, "connection closed");
    return 2;
  }
  if (err) {
    free(q);
    lx__send_error(L, err, 2);
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
  if (top < 2) return luaL_error(L, "redis: cmd needs a command name");
  for (int i = 2; i <= top; i++) {
    int t = lua_type(L, i);
    if (t != LUA_TSTRING && t != LUA_TNUMBER)
      return luaL_error(L, "redis: argument %d is a %s (strings and numbers "
                           "only)", i - 1, luaL_typename(L, i));
  }
  lx_check_waitable(L, lua_touserdata(L, lua_upvalueindex(1)), "redis cmd");
  if (!rc->link || !redis_link_ctx_any(rc->link)) {
    lua_pushboolean(L, 0);
    lua_pushstring(L, rc->link ? "not connected" : "connection closed");
    return 2;
  }
  size_t total = 0;
  for (int i = 2; i <= top; i++) {
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
  q->dropped = true;
  q->waiting = false;
  lx_run_abandon(ln, &q->run);
}

/* Arms a waiting r:cmd: the client is at co's index 3, the command after. */
static int lx_redis_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  lx_redis_t *rc = lua_touserdata(co, 3);
  lx_req_t *q = calloc(1, sizeof(*q));
  if (!q) return -ENOMEM;
  q->ln = ln;
  q->waiting = true;
  q->run = *run;
  q->fn_ref = LUA_NOREF;
  int err = lx__send(co, rc, 4, lua_gettop(co), q);
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
  if (!l) return;
  rc->link = NULL;
  if (rc->prev)
    rc->prev->next = rc->next;
  else
    rc->ln->redis_clients = rc->next;
  if (rc->next) rc->next->prev = rc->prev;
  rc->prev = rc->next = NULL;
  redis_link_free(l); /* pending replies come back as NULL, from here or,
                        * inside a reply callback, once it returns */
}

void lx_redis_close_all(lx_lane_t *ln) {
  while (ln->redis_clients) lx__redis_close(ln->redis_clients);
}

static int lx_redis_gc(lua_State *L) {
  lx__redis_close(luaL_checkudata(L, 1, LX_REDIS_MT));
  return 0;
}

static int lx_redis_close(lua_State *L) { return lx_redis_gc(L); }

static int lx_redis_connected(lua_State *L) {
  lx_redis_t *rc = luaL_checkudata(L, 1, LX_REDIS_MT);
  lua_pushboolean(L, rc->link && redis_link_ctx(rc->link) != NULL);
  return 1;
}

static int lx_redis_tostring(lua_State *L) {
  lx_redis_t *rc = luaL_checkudata(L, 1, LX_REDIS_MT);
  lua_pushfstring(L, "redis client (%s)", rc->desc);
  return 1;
}

/* mp.redis(url) */
static int lx_redis_new(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  const char *url = luaL_checkstring(L, 1);
  redis_url_t u;
  char err[512];
  if (redis_url_parse(url, &u, err, sizeof(err)))
    return luaL_error(L, "mp.redis: %s", err);
  lx_redis_t *rc = lua_newuserdata(L, sizeof(*rc));
  memset(rc, 0, sizeof(*rc));
  rc->ln = ln;
  snprintf(rc->desc, sizeof(rc->desc), "%s:%d/%d", u.host, u.port, u.db);
  luaL_getmetatable(L, LX_REDIS_MT);
  lua_setmetatable(L, -2);
  rc->link = redis_link_new(ln->r, &u, "redis (mp.redis)", 3000,
                            (redis_link_hooks_t){NULL, NULL}, NULL);
  if (!rc->link) return luaL_error(L, "mp.redis: out of memory");
  rc->next = ln->redis_clients;
  if (rc->next) rc->next->prev = rc;
  ln->redis_clients = rc;
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
