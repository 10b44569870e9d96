/* SPDX-License-Identifier: MIT */

/* lx_multipart: core.multipart, the Lua face of the streaming multipart
 * parser (src/http/multipart.h) for lua/moonport/multipart.lua, which
 * builds req:parts() and req.form's multipart fields over it.
 *
 *   core.multipart.new(boundary, max_parts, max_header, max_part)
 *       -> parser, or nil and a message for a bad boundary
 *   p:next(chunk, off) -> kind, value, off'  kind: "part" (value: the
 *       header lines), "data" (value: bytes), "end", "done", "more" (the
 *       chunk is used up); or nil, message, status (400 or 413)
 *   p:save(chunk, off, file) -> kind, bytes, off'  writes the part's data
 *       in the chunk to a Lua file (io.open's) until the part ends
 *       ("end") or the chunk does ("more"); or nil, message, status
 *   p:finish() -> true, or nil, message, 400 (the body ended early)
 *
 * Offsets are 0-based byte counts into the chunk. The parser's memory is
 * C's, freed by __gc (or p:close()). */
#include <errno.h>
#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>
#include <stdio.h>
#include <string.h>

#include "http/multipart.h"
#include "lx/lx_embed.h"
#include "lx/lx_multipart.h"

#define LX_MULTIPART_MT "moonport.multipart"

typedef struct {
  multipart_t *m;
} lx_mp_t;

static lx_mp_t *lx__mp(lua_State *L) {
  lx_mp_t *p = luaL_checkudata(L, 1, LX_MULTIPART_MT);
  if (!p->m) luaL_error(L, "multipart: the parser is closed");
  return p;
}

static lua_Number lx__limit(lua_State *L, int idx) {
  lua_Number v = luaL_checknumber(L, idx);
  if (v < 1 || v > 9007199254740992.0) luaL_argerror(L, idx, "a limit from 1 to 2^53");
  return v;
}

static int lx_mp_new(lua_State *L) {
  size_t blen;
  const char *b = luaL_checklstring(L, 1, &blen);
  multipart_limits_t lim = {.max_parts = (size_t)lx__limit(L, 2),
                            .max_header = (size_t)lx__limit(L, 3),
                            .max_part = (uint64_t)lx__limit(L, 4)};
  if (lim.max_header > (1u << 20)) return luaL_argerror(L, 3, "at most 1 MiB");
  lx_mp_t *p = lua_newuserdata(L, sizeof(*p));
  p->m = NULL;
  luaL_getmetatable(L, LX_MULTIPART_MT);
  lua_setmetatable(L, -2);
  p->m = multipart_new(b, blen, &lim);
  if (!p->m) {
    if (errno == ENOMEM) return luaL_error(L, "out of memory");
    lua_pushnil(L);
    lua_pushliteral(L, "bad multipart boundary");
    return 2;
  }
  return 1;
}

static int lx__mp_fail(lua_State *L, lx_mp_t *p, long rc) {
  lua_pushnil(L);
  lua_pushstring(L, multipart_error(p->m));
  lua_pushinteger(L, -rc);
  return 3;
}

/* The chunk at 2 and the offset at 3 (checked). */
static const char *lx__chunk(lua_State *L, size_t *len, size_t *off) {
  const char *s = luaL_checklstring(L, 2, len);
  lua_Integer o = luaL_checkinteger(L, 3);
  if (o < 0 || (size_t)o > *len) luaL_argerror(L, 3, "an offset into the chunk");
  *off = (size_t)o;
  return s;
}

static int lx_mp_next(lua_State *L) {
  lx_mp_t *p = lx__mp(L);
  size_t len, off;
  const char *s = lx__chunk(L, &len, &off);
  multipart_event_t ev;
  long rc = multipart_parse(p->m, s + off, len - off, &ev);
  if (rc < 0) return lx__mp_fail(L, p, rc);
  off += (size_t)rc;
  switch (ev.type) {
  case MULTIPART_PART: lua_pushliteral(L, "part"); lua_pushlstring(L, ev.p, ev.n); break;
  case MULTIPART_DATA: lua_pushliteral(L, "data"); lua_pushlstring(L, ev.p, ev.n); break;
  case MULTIPART_END: lua_pushliteral(L, "end"); lua_pushnil(L); break;
  case MULTIPART_DONE: lua_pushliteral(L, "done"); lua_pushnil(L); break;
  default: lua_pushliteral(L, "more"); lua_pushnil(L); break;
  }
  lua_pushinteger(L, (lua_Integer)off);
  return 3;
}

multipart_t *lx_multipart_check(lua_State *L, int idx) {
  lx_mp_t *p = luaL_checkudata(L, idx, LX_MULTIPART_MT);
  if (!p->m) luaL_error(L, "multipart: the parser is closed");
  return p->m;
}

FILE *lx_multipart_file(lua_State *L, int idx) {
  FILE **f = luaL_checkudata(L, idx, LUA_FILEHANDLE);
  if (!*f) luaL_argerror(L, idx, "the file is closed");
  return *f;
}

int lx_multipart_save(multipart_t *m, const char *s, size_t len, FILE *f,
                      size_t *took, size_t *wrote) {
  size_t off = 0;
  *wrote = 0;
  for (;;) {
    multipart_event_t ev;
    long rc = multipart_parse(m, s + off, len - off, &ev);
    if (rc < 0) return (int)rc;
    off += (size_t)rc;
    *took = off;
    if (ev.type == MULTIPART_DATA) {
      if (fwrite(ev.p, 1, ev.n, f) != ev.n) return LX_MULTIPART_EIO;
      *wrote += ev.n;
      continue;
    }
    /* a part can't begin or the body end before this one ends */
    if (ev.type != MULTIPART_NONE && ev.type != MULTIPART_END)
      return LX_MULTIPART_MISUSE;
    return ev.type;
  }
}

int lx_multipart_push_save(lua_State *L, multipart_t *m, int rc, size_t wrote,
                           size_t off) {
  if (rc == LX_MULTIPART_MISUSE)
    return luaL_error(L, "multipart: save outside a part's data");
  if (rc == LX_MULTIPART_EIO || rc < 0) {
    lua_pushnil(L);
    lua_pushstring(L, rc == LX_MULTIPART_EIO ? strerror(errno)
                                             : multipart_error(m));
    lua_pushinteger(L, rc == LX_MULTIPART_EIO ? 500 : -rc);
    return 3;
  }
  if (rc == MULTIPART_END)
    lua_pushliteral(L, "end");
  else
    lua_pushliteral(L, "more");
  lua_pushnumber(L, (lua_Number)wrote);
  lua_pushinteger(L, (lua_Integer)off);
  return 3;
}

static int lx_mp_save(lua_State *L) {
  lx_mp_t *p = lx__mp(L);
  size_t len, off;
  const char *s = lx__chunk(L, &len, &off);
  FILE *f = lx_multipart_file(L, 4);
  size_t took = 0, wrote;
  int rc = lx_multipart_save(p->m, s + off, len - off, f, &took, &wrote);
  return lx_multipart_push_save(L, p->m, rc, wrote, off + took);
}

static int lx_mp_finish(lua_State *L) {
  lx_mp_t *p = lx__mp(L);
  int rc = multipart_finish(p->m);
  if (rc < 0) return lx__mp_fail(L, p, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int lx_mp_parts(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)multipart_parts(lx__mp(L)->m));
  return 1;
}

static int lx_mp_gc(lua_State *L) {
  lx_mp_t *p = luaL_checkudata(L, 1, LX_MULTIPART_MT);
  multipart_free(p->m);
  p->m = NULL;
  return 0;
}

void lx_multipart_init(lua_State *L, lx_lane_t *ln) {
  (void)ln;
  static const luaL_Reg methods[] = {{"next", lx_mp_next},     {"save", lx_mp_save},
                                     {"finish", lx_mp_finish}, {"parts", lx_mp_parts},
                                     {"close", lx_mp_gc},      {NULL, NULL}};
  luaL_newmetatable(L, LX_MULTIPART_MT);
  lua_newtable(L);
  luaL_register(L, NULL, methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, lx_mp_gc);
  lua_setfield(L, -2, "__gc");
  lua_pop(L, 1);
  lx_embed_core_table(L, "multipart");
  lua_pushcfunction(L, lx_mp_new);
  lua_setfield(L, -2, "new");
  lua_pop(L, 1);
}
