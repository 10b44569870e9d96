/* SPDX-License-Identifier: MIT */

/* The Lua modules of lua/moonport/ built into the binary, and the loaders
 * that make them require()-able (package.preload) on a lane.
 *
 * Every module the server runs is a real file, lua/moonport/<name>.lua,
 * turned into a string constant at build time (scripts/embed-lua writes
 * build/<variant>/gen/lx_embedded.c). Its chunk name is
 * "@lua/moonport/<name>.lua", so tracebacks name the file and line.
 * MOONPORT_LUA_DIR=<dir> makes a lane load <dir>/moonport/<name>.lua from
 * disk first (development: edit, restart, no rebuild); a file that is
 * absent there falls back to the built-in copy.
 *
 * C primitives reach these modules as one named table, the module
 * "moonport.core" (package.loaded), which the C side of each module fills
 * with its functions (core.http.read_now, core.redis.send, ...) before it
 * requires the Lua half. It is internal: scripts have no use for it.
 *
 * All functions run on the lane's own thread, on its lua_State. */
#ifndef MOONPORT_LX_EMBED_H
#define MOONPORT_LX_EMBED_H

#include <stddef.h>

typedef struct lua_State lua_State;

typedef struct {
  const char *name; /* "moonport.router" */
  const char *path; /* "lua/moonport/router.lua" */
  const char *src;
  size_t len;
} lx_embedded_t;

/* Generated: every module, ended by an entry whose name is NULL. */
extern const lx_embedded_t lx_embedded[];

/* Installs a package.preload loader for every built-in module and makes
 * an empty "moonport.core" table (package.loaded). Raises on failure. */
void lx_embed_install(lua_State *L);

/* Pushes moonport.core (made by lx_embed_install). */
void lx_embed_core(lua_State *L);

/* Pushes core[name], a table made on first use, for a module's C side to
 * fill with its primitives. */
void lx_embed_core_table(lua_State *L, const char *name);

/* require(name) without going through the globals the script may have
 * changed: pushes package.loaded[name], loading the module through its
 * preload loader first if needed. Raises on a load error. */
void lx_require(lua_State *L, const char *name);

#endif
