/* SPDX-License-Identifier: MIT */

/* lx_metric: see lx_metric.h. The C side is the primitives (register a
 * family or a series, update one, read one); the objects, the label
 * handling and the argument checks are lua/moonport/metric.lua. */
#include "lx/lx_metric.h"

#include <errno.h>
#include <string.h>

#include "core/metric.h"
#include "lx/lx_embed.h"
#include "lx/lx_server.h"

static metric_set_t *lx__set(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  return ln->srv->metrics;
}

/* family(type, name, help, labels, buckets) -> index; raises (with the
 * reason) when it can't be had. The Lua side checked the names. */
static int lx_metric_family(lua_State *L) {
  metric_set_t *m = lx__set(L);
  int type = (int)luaL_checkinteger(L, 1);
  const char *name = luaL_checkstring(L, 2);
  const char *help = luaL_checkstring(L, 3);
  luaL_checktype(L, 4, LUA_TTABLE);
  const char *labels[METRIC_MAX_LABELS];
  double bounds[METRIC_MAX_BUCKETS];
  int nl = (int)lua_objlen(L, 4), nb = 0;
  if (nl > METRIC_MAX_LABELS) nl = METRIC_MAX_LABELS + 1;
  for (int i = 0; i < nl && i < METRIC_MAX_LABELS; i++) {
    lua_rawgeti(L, 4, i + 1);
    labels[i] = lua_tostring(L, -1); /* the table keeps it */
    lua_pop(L, 1);
  }
  if (lua_istable(L, 5)) {
    nb = (int)lua_objlen(L, 5);
    if (nb > METRIC_MAX_BUCKETS) nb = METRIC_MAX_BUCKETS + 1;
    for (int i = 0; i < nb && i < METRIC_MAX_BUCKETS; i++) {
      lua_rawgeti(L, 5, i + 1);
      bounds[i] = lua_tonumber(L, -1);
      lua_pop(L, 1);
    }
  }
  if (!m) return luaL_error(L, "%s: no shared memory for metrics", name);
  int rc = metric_family(m, type, name, help, labels, nl, bounds, nb);
  if (rc == -EEXIST)
    return luaL_error(L, "'%s' is already registered with another type, "
                         "labels or buckets", name);
  if (rc == -ENOSPC)
    return luaL_error(L, "'%s': no room for another metric (at most %d)",
                      name, METRIC_MAX_FAMILIES);
  if (rc < 0) return luaL_error(L, "'%s': %s", name, strerror(-rc));
  lua_pushinteger(L, rc);
  return 1;
}

/* series(family, packed values) -> index, or nil and a message. */
static int lx_metric_series(lua_State *L) {
  metric_set_t *m = lx__set(L);
  int fam = (int)luaL_checkinteger(L, 1);
  size_t len;
  const char *v = luaL_checklstring(L, 2, &len);
  int rc = m ? metric_series(m, fam, v, len) : -ENOSPC;
  if (rc >= 0) {
    lua_pushinteger(L, rc);
    return 1;
  }
  lua_pushnil(L);
  lua_pushstring(L, rc == -E2BIG ? "label values too long (256 bytes in all)"
                    : rc == -ENOSPC
                        ? "no room for another series (too many label values?)"
                        : strerror(-rc));
  return 2;
}

static int lx_metric_add(lua_State *L) {
  metric_set_t *m = lx__set(L);
  if (m) metric_add(m, (int)lua_tointeger(L, 1), lua_tonumber(L, 2));
  return 0;
}

static int lx_metric_set(lua_State *L) {
  metric_set_t *m = lx__set(L);
  if (m) metric_set(m, (int)lua_tointeger(L, 1), lua_tonumber(L, 2));
  return 0;
}

static int lx_metric_observe(lua_State *L) {
  metric_set_t *m = lx__set(L);
  if (m) metric_observe(m, (int)lua_tointeger(L, 1), lua_tonumber(L, 2));
  return 0;
}

static int lx_metric_value(lua_State *L) {
  metric_set_t *m = lx__set(L);
  lua_pushnumber(L, m ? metric_value(m, (int)lua_tointeger(L, 1)) : 0);
  return 1;
}

void lx_metric_open(lua_State *L, lx_lane_t *ln) {
  static const luaL_Reg fns[] = {
      {"family", lx_metric_family}, {"series", lx_metric_series},
      {"add", lx_metric_add},       {"set", lx_metric_set},
      {"observe", lx_metric_observe}, {"value", lx_metric_value},
      {NULL, NULL}};
  lx_embed_core_table(L, "metric");
  lua_pushlightuserdata(L, ln);
  luaL_setfuncs(L, fns, 1);
  lua_pushinteger(L, METRIC_COUNTER);
  lua_setfield(L, -2, "COUNTER");
  lua_pushinteger(L, METRIC_GAUGE);
  lua_setfield(L, -2, "GAUGE");
  lua_pushinteger(L, METRIC_HISTOGRAM);
  lua_setfield(L, -2, "HISTOGRAM");
  lua_pop(L, 1);
  lx_require(L, "moonport.metric"); /* .install(mp) sets the three */
  lua_getfield(L, -1, "install");
  lua_pushvalue(L, -3);
  lua_call(L, 1, 0);
  lua_pop(L, 1);
}
