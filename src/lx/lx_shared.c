/* SPDX-License-Identifier: MIT */

/* lx_shared: mp.shared, the dictionaries every lane and worker shares
 * (the store is src/core/shdict.c; this is its Lua face and the process's
 * list of dictionaries by name). */
#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/shdict.h"
#include "lx/lx_embed.h"
#include "lx/lx_lane.h"
#include "lx/lx_server.h"
#include "lx/lx_shared.h"

#define LX_SHARED_MT "moonport.shared"
/* keys() without a limit returns at most this many, as a guard against
 * building a huge table by accident (0 asks for all). */
#define LX_SHARED_KEYS 1024

/* A dictionary this process knows (made here or inherited from the root).
 * Never freed before exit: any lane may hold it. Guarded by
 * srv->shared_lock. */
struct lx_shared_dict {
  shdict_t *d;
  struct lx_shared_dict *next;
};

/* A Lua handle: the dictionary and a buffer values are copied into under
 * the shard's lock (so no Lua allocation, which may raise, happens while
 * it is held). One lane's, like every userdata. */
typedef struct {
  shdict_t *d;
  lx_lane_t *ln; /* its lane (for the loop's clock); outlives it */
  char *buf; /* small, or malloc'ed when a value outgrew it */
  size_t cap;
  char small[256];
} lx_shared_ud_t;

/* Upvalue 1 of every method is the metatable: comparing it is cheaper than
 * luaL_checkudata's registry lookup, which matters on the get path. */
static lx_shared_ud_t *lx__self(lua_State *L) {
  lx_shared_ud_t *ud = lua_touserdata(L, 1);
  if (ud && lua_getmetatable(L, 1)) {
    bool ok = lua_rawequal(L, -1, lua_upvalueindex(1));
    lua_pop(L, 1);
    if (ok) return ud;
  }
  luaL_typerror(L, 1, "shared dictionary");
  return NULL;
}

static const char *lx__key(lua_State *L, size_t *len) {
  if (lua_type(L, 2) != LUA_TSTRING && lua_type(L, 2) != LUA_TNUMBER)
    luaL_typerror(L, 2, "string key");
  return lua_tolstring(L, 2, len);
}

static double lx__ttl(lua_State *L, int idx) {
  lua_Number t = luaL_optnumber(L, idx, 0);
  if (!(t >= 0 && t <= 1e9)) luaL_argerror(L, idx, "ttl: seconds >= 0");
  return t;
}

/* Pushes the message for a store's error. */
static void lx__push_err(lua_State *L, shdict_t *d, int rc) {
  char buf[128];
  switch (rc) {
  case -ENOENT: lua_pushliteral(L, "not found"); break;
  case -EEXIST: lua_pushliteral(L, "exists"); break;
  case -ENOMEM: lua_pushliteral(L, "no memory"); break;
  case -EINVAL: lua_pushliteral(L, "empty key"); break;
  case -ENAMETOOLONG:
    lua_pushfstring(L, "key too long (at most %d bytes)", SHDICT_MAX_KEY);
    break;
  case -E2BIG:
    lua_pushfstring(L, "value too large (key and value at most %d bytes in "
                       "this dictionary)", (int)shdict_max_item(d));
    break;
  case -EIO:
    lua_pushliteral(L, "dictionary damaged (the part of it this key is in "
                       "was emptied)");
    break;
  default: lua_pushstring(L, lx_errmsg(rc, buf, sizeof(buf))); break;
  }
}

/* nil and the message for a store's error, then forcible: 3 values (or 2
 * without forcible). */
static int lx__fail(lua_State *L, shdict_t *d, int rc, int forcible) {
  lua_pushnil(L);
  lx__push_err(L, d, rc);
  if (forcible < 0) return 2;
  lua_pushboolean(L, forcible);
  return 3;
}

static void lx__push_value(lua_State *L, const shd_value_t *v) {
  if (v->type == SHD_STR)
    lua_pushlstring(L, v->s, v->len);
  else if (v->type == SHD_NUM)
    lua_pushnumber(L, v->num);
  else
    lua_pushboolean(L, v->num != 0);
}

/* shdict_get into the handle's buffer, growing it once if the value is
 * bigger (it may change in between: then once more). */
static int lx__get(lua_State *L, lx_shared_ud_t *ud, bool stale,
                   shd_value_t *v, bool *expired) {
  size_t klen;
  const char *k = lx__key(L, &klen);
  for (;;) {
    int rc = shdict_get(ud->d, k, klen, stale, v, ud->buf, ud->cap, expired);
    if (rc || v->type != SHD_STR || v->s) return rc;
    char *nb = malloc(v->len);
    if (!nb) return -ENOMEM;
    if (ud->buf != ud->small) free(ud->buf);
    ud->buf = nb;
    ud->cap = v->len;
  }
}

/* d:get(key) -> value [, flags] | nil */
static int lx_shared_get(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  shd_value_t v;
  int rc = lx__get(L, ud, false, &v, NULL);
  if (rc == -ENOENT) {
    lua_pushnil(L);
    return 1;
  }
  if (rc) return lx__fail(L, ud->d, rc, -1);
  lx__push_value(L, &v);
  if (!v.flags) return 1;
  lua_pushinteger(L, v.flags);
  return 2;
}

/* d:get_stale(key) -> value, flags | nil, stale */
static int lx_shared_get_stale(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  shd_value_t v;
  bool expired = false;
  int rc = lx__get(L, ud, true, &v, &expired);
  if (rc == -ENOENT) {
    lua_pushnil(L);
    return 1;
  }
  if (rc) return lx__fail(L, ud->d, rc, -1);
  lx__push_value(L, &v);
  if (v.flags)
    lua_pushinteger(L, v.flags);
  else
    lua_pushnil(L);
  lua_pushboolean(L, expired);
  return 3;
}

static int lx__store(lua_State *L, int op) {
  lx_shared_ud_t *ud = lx__self(L);
  size_t klen;
  const char *k = lx__key(L, &klen);
  shd_value_t v = {0};
  switch (lua_type(L, 3)) {
  case LUA_TSTRING:
    v.type = SHD_STR;
    v.s = lua_tolstring(L, 3, &v.len);
    break;
  case LUA_TNUMBER:
    v.type = SHD_NUM;
    v.num = lua_tonumber(L, 3);
    break;
  case LUA_TBOOLEAN:
    v.type = SHD_BOOL;
    v.num = lua_toboolean(L, 3);
    break;
  case LUA_TNIL:
  case LUA_TNONE:
    /* set(k, nil) deletes; add/replace of nil would store nothing */
    if (op != SHD_SET)
      return luaL_argerror(L, 3, "a string, number or boolean");
    break;
  default:
    return luaL_argerror(L, 3, "a string, number or boolean (nil: delete)");
  }
  double ttl = lx__ttl(L, 4);
  lua_Number fl = luaL_optnumber(L, 5, 0);
  if (!(fl >= 0 && fl <= 4294967295.0) || fl != (lua_Number)(uint32_t)fl)
    return luaL_argerror(L, 5, "flags: a whole number 0 to 2^32-1");
  v.flags = (uint32_t)fl;
  bool forcible = false;
  int rc = shdict_store(ud->d, op, k, klen, &v, ttl, &forcible);
  if (rc) return lx__fail(L, ud->d, rc, forcible);
  lua_pushboolean(L, 1);
  lua_pushnil(L);
  lua_pushboolean(L, forcible);
  return 3;
}

/* d:set(key, value [, ttl [, flags]]) -> true, nil, forcible
 *                                     | nil, err, forcible */
static int lx_shared_set(lua_State *L) { return lx__store(L, SHD_SET); }
static int lx_shared_add(lua_State *L) { return lx__store(L, SHD_ADD); }
static int lx_shared_replace(lua_State *L) {
  return lx__store(L, SHD_REPLACE);
}

/* d:incr(key, n [, init [, init_ttl]]) -> value, nil, forcible | nil, err */
static int lx_shared_incr(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  size_t klen;
  const char *k = lx__key(L, &klen);
  double n = luaL_checknumber(L, 3);
  double init = 0;
  bool has_init = !lua_isnoneornil(L, 4);
  if (has_init) init = luaL_checknumber(L, 4);
  double ttl = lx__ttl(L, 5);
  double out = 0;
  bool forcible = false;
  int rc = shdict_incr(ud->d, k, klen, n, has_init ? &init : NULL, ttl, &out,
                       &forcible);
  if (rc == -EINVAL && klen) {
    lua_pushnil(L);
    lua_pushliteral(L, "not a number");
    return 2;
  }
  if (rc) return lx__fail(L, ud->d, rc, -1);
  lua_pushnumber(L, out);
  lua_pushnil(L);
  lua_pushboolean(L, forcible);
  return 3;
}

/* mp.limit's clock: the lane loop's, in microseconds (read once per loop
 * iteration, as nginx's ngx.now() that lua-resty-limit-traffic uses), or
 * -1 (shdict_gcra reads the clock) on a lane without a loop. A clock read
 * costs as much as the rest of a decision (it was 42 % of one in perf). */
static double lx__loop_us(const lx_shared_ud_t *ud) {
  return ud->ln && ud->ln->r ? (double)reactor_loop_ms(ud->ln->r) * 1e3 : -1;
}

/* d:_gcra(key, interval_us, tolerance_us, n) -> passed, wait_us (mp.limit,
 * lua/moonport/limit.lua: shdict_gcra), or nil, err */
static int lx_shared_gcra(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  size_t klen;
  const char *k = lx__key(L, &klen);
  double iv = luaL_checknumber(L, 3), tol = luaL_checknumber(L, 4);
  double n = luaL_checknumber(L, 5);
  if (!(iv > 0) || !(tol >= 0) || !(n > 0))
    return luaL_argerror(L, 3, "bad rate");
  double wait = 0;
  bool forcible = false;
  int rc = shdict_gcra(ud->d, k, klen, lx__loop_us(ud), iv, tol, n, &wait,
                       &forcible);
  if (rc == -EINVAL && klen) {
    lua_pushnil(L);
    lua_pushliteral(L, "not a number");
    return 2;
  }
  if (rc < 0) return lx__fail(L, ud->d, rc, -1);
  lua_pushboolean(L, rc == 1);
  lua_pushnumber(L, wait);
  return 2;
}

/* d:delete(key) -> true */
static int lx_shared_delete(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  size_t klen;
  const char *k = lx__key(L, &klen);
  int rc = shdict_delete(ud->d, k, klen);
  if (rc) return lx__fail(L, ud->d, rc, -1);
  lua_pushboolean(L, 1);
  return 1;
}

/* d:ttl(key) -> seconds left (0: never expires) | nil, "not found" */
static int lx_shared_ttl(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  size_t klen;
  const char *k = lx__key(L, &klen);
  double left;
  int rc = shdict_ttl(ud->d, k, klen, &left);
  if (rc) return lx__fail(L, ud->d, rc, -1);
  lua_pushnumber(L, left);
  return 1;
}

/* d:expire(key, ttl) -> true | nil, "not found" (ttl 0: never) */
static int lx_shared_expire(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  size_t klen;
  const char *k = lx__key(L, &klen);
  luaL_checknumber(L, 3);
  int rc = shdict_expire(ud->d, k, klen, lx__ttl(L, 3));
  if (rc) return lx__fail(L, ud->d, rc, -1);
  lua_pushboolean(L, 1);
  return 1;
}

/* Holds shdict_keys' block while its keys become Lua strings (which may
 * raise): the __gc frees it then. */
#define LX_SHARED_KEYS_MT "moonport.shared.keys"

static int lx__keys_gc(lua_State *L) {
  char **blk = lua_touserdata(L, 1);
  free(*blk);
  *blk = NULL;
  return 0;
}

/* d:keys([max]) -> { key, ... } (max: 1024; 0: all) */
static int lx_shared_keys(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  lua_Number max = luaL_optnumber(L, 2, LX_SHARED_KEYS);
  if (!(max >= 0 && max <= 1e12)) return luaL_argerror(L, 2, "max >= 0");
  char **blk = lua_newuserdata(L, sizeof(char *));
  *blk = NULL;
  luaL_getmetatable(L, LX_SHARED_KEYS_MT);
  lua_setmetatable(L, -2);
  size_t n;
  errno = 0; /* NULL with n == 0 is also an empty dictionary */
  *blk = shdict_keys(ud->d, (size_t)max, &n);
  if (!*blk && errno == ENOMEM) return luaL_error(L, "d:keys: out of memory");
  lua_createtable(L, (int)(n < 1u << 20 ? n : 1u << 20), 0);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t kl;
    memcpy(&kl, *blk + at, 4);
    lua_pushlstring(L, *blk + at + 4, kl);
    lua_rawseti(L, -2, (int)i + 1);
    at += 4 + kl;
  }
  free(*blk);
  *blk = NULL;
  return 1;
}

static int lx_shared_flush_all(lua_State *L) {
  shdict_flush_all(lx__self(L)->d);
  return 0;
}

/* d:flush_expired([max]) -> how many went */
static int lx_shared_flush_expired(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  lua_Number max = luaL_optnumber(L, 2, 0);
  if (!(max >= 0 && max <= 1e12)) return luaL_argerror(L, 2, "max >= 0");
  lua_pushinteger(L, (lua_Integer)shdict_flush_expired(ud->d, (size_t)max));
  return 1;
}

static int lx_shared_capacity(lua_State *L) {
  lua_pushnumber(L, (lua_Number)shdict_capacity(lx__self(L)->d));
  return 1;
}

static int lx_shared_free_space(lua_State *L) {
  lua_pushnumber(L, (lua_Number)shdict_free_space(lx__self(L)->d));
  return 1;
}

static int lx_shared_name(lua_State *L) {
  lua_pushstring(L, shdict_name(lx__self(L)->d));
  return 1;
}

static int lx_shared_gc(lua_State *L) {
  lx_shared_ud_t *ud = lua_touserdata(L, 1);
  if (ud->buf != ud->small) free(ud->buf);
  ud->buf = ud->small;
  return 0;
}

/* For the FFI get: (dictionary, negative errno) -> its message. */
static int lx__errmsg_of(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  lx__push_err(L, ud->d, (int)luaL_checkinteger(L, 2));
  return 1;
}

static int lx_shared_tostring(lua_State *L) {
  lx_shared_ud_t *ud = lx__self(L);
  lua_pushfstring(L, "shared dictionary %s (%d bytes)", shdict_name(ud->d),
                  (int)shdict_size(ud->d));
  return 1;
}

static const luaL_Reg lx_shared_methods[] = {
    {"get", lx_shared_get},
    {"get_stale", lx_shared_get_stale},
    {"set", lx_shared_set},
    {"add", lx_shared_add},
    {"replace", lx_shared_replace},
    {"incr", lx_shared_incr},
    {"delete", lx_shared_delete},
    {"_gcra", lx_shared_gcra},
    {"ttl", lx_shared_ttl},
    {"expire", lx_shared_expire},
    {"keys", lx_shared_keys},
    {"flush_all", lx_shared_flush_all},
    {"flush_expired", lx_shared_flush_expired},
    {"capacity", lx_shared_capacity},
    {"free_space", lx_shared_free_space},
    {"name", lx_shared_name},
    {NULL, NULL}};

/* ---- mp.shared ---- */

/* "16m", "64k", "1g", or a number of bytes; 0 if not a size. */
static size_t lx__size(lua_State *L, int idx) {
  if (lua_type(L, idx) == LUA_TNUMBER) {
    lua_Number n = lua_tonumber(L, idx);
    return n >= 0 && n <= (lua_Number)SHDICT_MAX_SIZE ? (size_t)n : 0;
  }
  const char *s = lua_tostring(L, idx);
  if (!s) return 0;
  char *end;
  errno = 0;
  double n = strtod(s, &end);
  if (errno || end == s || n < 0) return 0;
  double mul = 1;
  switch (tolower((unsigned char)*end)) {
  case 'k': mul = 1024, end++; break;
  case 'm': mul = 1024 * 1024, end++; break;
  case 'g': mul = 1024.0 * 1024 * 1024, end++; break;
  default: break;
  }
  if (*end || n * mul > (double)SHDICT_MAX_SIZE) return 0;
  return (size_t)(n * mul);
}

/* mp.shared(name, { size = "16m" }) -> dictionary. Made by the script's
 * top level in the root (or, with one process, lane 1) before workers and
 * lanes exist; everywhere else the same call finds it. */
static int lx_shared(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_server_t *srv = ln->srv;
  size_t nlen;
  const char *name = luaL_checklstring(L, 1, &nlen);
  if (nlen == 0 || nlen > SHDICT_MAX_NAME)
    return luaL_argerror(L, 1, "a name of 1 to 63 bytes");
  size_t size = 0;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    lua_getfield(L, 2, "size");
    if (!lua_isnil(L, -1)) {
      size = lx__size(L, -1);
      if (size < SHDICT_MIN_SIZE || size > SHDICT_MAX_SIZE)
        return luaL_error(L, "mp.shared: size must be 8k to 16g (\"16m\", "
                             "\"512k\" or bytes), not %s",
                          lua_isstring(L, -1) ? lua_tostring(L, -1)
                                              : luaL_typename(L, -1));
      size = (size + 4095) & ~(size_t)4095; /* as shdict_new rounds */
    }
    lua_pop(L, 1);
  }
  pthread_mutex_lock(&srv->shared_lock);
  struct lx_shared_dict *e = srv->shared;
  while (e && strcmp(shdict_name(e->d), name) != 0) e = e->next;
  shdict_t *d = e ? e->d : NULL;
  const char *why = NULL;
  if (d && size && size != shdict_size(d)) {
    why = "has another size";
  } else if (!d && !ln->loading) {
    why = "is new: declare dictionaries at the script's top level";
  } else if (!d && srv->nworkers > 1 && !ln->is_root) {
    why = "is not known to the root process (added to the script after the "
          "server started? reload to add it)";
  } else if (!d && !size) {
    why = "needs a size, as in mp.shared(name, { size = \"16m\" })";
  } else if (!d) {
    e = calloc(1, sizeof(*e));
    d = e ? shdict_new(name, size) : NULL;
    if (!d) {
      free(e);
      why = "cannot be mapped (out of memory)";
    } else {
      e->d = d;
      e->next = srv->shared;
      srv->shared = e;
    }
  }
  pthread_mutex_unlock(&srv->shared_lock);
  if (why && d)
    return luaL_error(L, "mp.shared: '%s' %s (%d bytes; it keeps its size "
                         "until the server restarts)", name, why,
                      (int)shdict_size(d));
  if (why) return luaL_error(L, "mp.shared: '%s' %s", name, why);
  lx_shared_ud_t *ud = lua_newuserdata(L, sizeof(*ud));
  ud->d = d;
  ud->ln = ln;
  ud->buf = ud->small;
  ud->cap = sizeof(ud->small);
  luaL_getmetatable(L, LX_SHARED_MT);
  lua_setmetatable(L, -2);
  return 1;
}

/* lua/moonport/shared.lua replaces methods.get by the FFI one; where it
 * fails (no FFI, MOONPORT_SHARED_FFI=0), the C get stays. */
static int lx__require_shared(lua_State *L) {
  lx_require(L, "moonport.shared");
  return 0;
}

void lx_shared_open(lua_State *L, lx_lane_t *ln) {
  luaL_newmetatable(L, LX_SHARED_MT);
  lua_newtable(L);
  for (const luaL_Reg *r = lx_shared_methods; r->name; r++) {
    lua_pushvalue(L, -2);
    lua_pushcclosure(L, r->func, 1);
    lua_setfield(L, -2, r->name);
  }
  /* The FFI get replaces the C one where it can be had; if the chunk
   * fails, the C get stays. */
  lx_embed_core_table(L, "shared");
  lua_pushvalue(L, -2); /* methods */
  lua_setfield(L, -2, "methods");
  lua_getfield(L, -2, "get"); /* the C get */
  lua_setfield(L, -2, "get");
  lua_pushvalue(L, -3); /* the metatable, for errmsg_of */
  lua_pushcclosure(L, lx__errmsg_of, 1);
  lua_setfield(L, -2, "errmsg_of");
  lua_pop(L, 1);
  lua_pushcfunction(L, lx__require_shared);
  if (lua_pcall(L, 0, 0, 0)) lua_pop(L, 1);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, lx_shared_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushvalue(L, -1);
  lua_pushcclosure(L, lx_shared_tostring, 1);
  lua_setfield(L, -2, "__tostring");
  lua_pushliteral(L, LX_SHARED_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
  luaL_newmetatable(L, LX_SHARED_KEYS_MT);
  lua_pushcfunction(L, lx__keys_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_shared, 1);
  lua_setfield(L, -2, "shared");
}

struct shdict *lx_shared_find(lx_server_t *srv, const char *name) {
  pthread_mutex_lock(&srv->shared_lock);
  struct lx_shared_dict *e = srv->shared;
  while (e && strcmp(shdict_name(e->d), name) != 0) e = e->next;
  shdict_t *d = e ? e->d : NULL;
  pthread_mutex_unlock(&srv->shared_lock);
  return d;
}

void lx_shared_free_all(lx_server_t *srv) {
  pthread_mutex_lock(&srv->shared_lock);
  struct lx_shared_dict *e = srv->shared;
  srv->shared = NULL;
  pthread_mutex_unlock(&srv->shared_lock);
  while (e) {
    struct lx_shared_dict *next = e->next;
    shdict_free(e->d);
    free(e);
    e = next;
  }
}

/* The get path for LuaJIT's FFI, which calls it from compiled traces
 * without the Lua C API's per-call cost. h: a dictionary object (the FFI
 * passes a userdata as a pointer to its bytes; the caller checks that it
 * is one). Returns SHD_STR with *s and *len (a copy in h's buffer, valid
 * until h is used again), SHD_NUM or SHD_BOOL with *num; *flags; 0 if the
 * key is missing or expired; a negative errno on failure. Exported for
 * ffi.C. Any lane, its own objects. */
int moonport_shared_get(void *h, const char *k, size_t klen, double *num,
                        const char **s, size_t *len, uint32_t *flags) {
  lx_shared_ud_t *ud = h;
  shd_value_t v;
  for (;;) {
    int rc = shdict_get(ud->d, k, klen, false, &v, ud->buf, ud->cap, NULL);
    if (rc == -ENOENT) return 0;
    if (rc) return rc;
    if (v.type != SHD_STR || v.s) break;
    char *nb = malloc(v.len);
    if (!nb) return -ENOMEM;
    if (ud->buf != ud->small) free(ud->buf);
    ud->buf = nb;
    ud->cap = v.len;
  }
  *num = v.num;
  *s = v.s;
  *len = v.len;
  *flags = v.flags;
  return v.type;
}

/* mp.limit's rate decision through the FFI (lua/moonport/limit.lua):
 * shdict_gcra on the key prefix .. key, joined here so the caller makes
 * no Lua string per decision. 1 passed, 0 rejected (*wait_us as
 * shdict_gcra says), or a negative errno (-ENAMETOOLONG past 4096 bytes).
 * Exported for ffi.C. Any lane, its own objects. */
int moonport_shared_gcra(void *h, const char *p, size_t pl, const char *k,
                         size_t kl, double interval_us, double tolerance_us,
                         double n, double *wait_us) {
  lx_shared_ud_t *ud = h;
  char key[4096];
  if (pl + kl > sizeof(key) || !(interval_us > 0) || !(tolerance_us >= 0) ||
      !(n > 0))
    return pl + kl > sizeof(key) ? -ENAMETOOLONG : -EINVAL;
  memcpy(key, p, pl);
  memcpy(key + pl, k, kl);
  bool forcible;
  return shdict_gcra(ud->d, key, pl + kl, lx__loop_us(ud), interval_us,
                     tolerance_us, n, wait_us, &forcible);
}
