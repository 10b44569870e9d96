/* SPDX-License-Identifier: MIT */

/* Loaders of the built-in Lua modules (lua/moonport/, see lx_embed.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>

#include "lx/lx_embed.h"

/* package.preload[name]: upvalue 1 is the module's lx_embedded_t. */
static int lx__load(lua_State *L) {
  const lx_embedded_t *m = lua_touserdata(L, lua_upvalueindex(1));
  const char *dir = getenv("MOONPORT_LUA_DIR");
  if (dir && *dir) {
    /* "lua/moonport/x.lua" lives at <dir>/moonport/x.lua */
    const char *rel = strncmp(m->path, "lua/", 4) == 0 ? m->path + 4 : m->path;
    lua_pushfstring(L, "%s/%s", dir, rel);
    const char *file = lua_tostring(L, -1);
    FILE *f = fopen(file, "rb");
    if (f) {
      fclose(f);
      if (luaL_loadfile(L, file)) return lua_error(L);
      lua_pushstring(L, m->name);
      lua_call(L, 1, 1);
      return 1;
    }
    if (errno != ENOENT)
      return luaL_error(L, "cannot open %s: %s", file, strerror(errno));
    lua_pop(L, 1);
  }
  lua_pushfstring(L, "@%s", m->path);
  if (luaL_loadbuffer(L, m->src, m->len, lua_tostring(L, -1)))
    return lua_error(L);
  lua_pushstring(L, m->name);
  lua_call(L, 1, 1);
  return 1;
}

static void lx__loaded(lua_State *L) {
  lua_getfield(L, LUA_REGISTRYINDEX, "_LOADED");
}

void lx_embed_install(lua_State *L) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  for (const lx_embedded_t *m = lx_embedded; m->name; m++) {
    lua_pushlightuserdata(L, (void *)m);
    lua_pushcclosure(L, lx__load, 1);
    lua_setfield(L, -2, m->name);
  }
  lua_pop(L, 2);
  lx__loaded(L);
  lua_newtable(L);
  lua_setfield(L, -2, "moonport.core");
  lua_pop(L, 1);
}

void lx_embed_core(lua_State *L) {
  lx__loaded(L);
  lua_getfield(L, -1, "moonport.core");
  lua_remove(L, -2);
}

void lx_embed_core_table(lua_State *L, const char *name) {
  lx_embed_core(L);
  lua_getfield(L, -1, name);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushvalue(L, -1);
    lua_setfield(L, -3, name);
  }
  lua_remove(L, -2);
}

void lx_require(lua_State *L, const char *name) {
  lx__loaded(L);
  lua_getfield(L, -1, name);
  if (!lua_isnil(L, -1)) {
    lua_remove(L, -2);
    return;
  }
  lua_pop(L, 1);
  const lx_embedded_t *m = lx_embedded;
  while (m->name && strcmp(m->name, name) != 0) m++;
  if (!m->name) luaL_error(L, "moonport: no built-in module %s", name);
  lua_pushlightuserdata(L, (void *)m);
  lua_pushcclosure(L, lx__load, 1);
  lua_call(L, 0, 1);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lua_pushboolean(L, 1);
  }
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, name);
  lua_remove(L, -2);
}
