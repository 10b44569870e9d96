/* SPDX-License-Identifier: MIT */

/* lx_log: mp.log(level, ...), a script's lines in the server's log. */
#include "core/log.h"
#include "lx/lx_lane.h"
#include "lx/lx_log.h"

/* mp.log(level, ...): "error", "warn", "info" or "debug", then values
 * joined by spaces (tostring'd, like print) as one line of the log with
 * source "lua". A level above --log-level costs the check only. */
int lx_log(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  enum log_level level;
  if (log_parse_level(name, &level) != 0)
    return luaL_argerror(L, 1, "level must be \"error\", \"warn\", \"info\" or \"debug\"");
  if ((int)level > (int)log_get_level()) return 0;
  int n = lua_gettop(L);
  luaL_Buffer b;
  lua_getglobal(L, "tostring"); /* index n + 1, below the buffer */
  luaL_buffinit(L, &b);
  for (int i = 2; i <= n; i++) {
    if (i > 2) luaL_addchar(&b, ' ');
    lua_pushvalue(L, n + 1);
    lua_pushvalue(L, i);
    lua_call(L, 1, 1);
    if (!lua_isstring(L, -1))
      return luaL_error(L, "'tostring' must return a string to 'log'");
    luaL_addvalue(&b);
  }
  luaL_pushresult(&b);
  size_t len;
  const char *msg = lua_tolstring(L, -1, &len);
  log_write_raw(level, "lua", msg, len);
  return 0;
}
