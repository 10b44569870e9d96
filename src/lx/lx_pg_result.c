/* SPDX-License-Identifier: MIT */

/* lx_pg_result: a query's rows as Lua values by column type (see the
 * header); the text format of each type as Postgres writes it. */
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>

#include "lx/lx_pg_result.h"

/* ---- values ---- */

static void lx__push_null(lua_State *L) { lua_pushlightuserdata(L, NULL); }

static int lx__hexval(int ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
  return -1;
}

/* bytea's text output (hex format, Postgres 9.0+: "\x0a1b...") as bytes. */
static void lx__push_bytea(lua_State *L, const char *s, size_t n) {
  if (n < 2 || s[0] != '\\' || s[1] != 'x') {
    lua_pushlstring(L, s, n); /* bytea_output = escape: left as it is */
    return;
  }
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (size_t i = 2; i + 1 < n; i += 2) {
    int hi = lx__hexval((unsigned char)s[i]),
        lo = lx__hexval((unsigned char)s[i + 1]);
    if (hi < 0 || lo < 0) break;
    luaL_addchar(&b, (char)(hi * 16 + lo));
  }
  luaL_pushresult(&b);
}

/* The element type of an array type, or 0. */
static unsigned lx__elem_type(unsigned oid) {
  switch (oid) {
  case 1000: return 16;   /* bool[] */
  case 1001: return 17;   /* bytea[] */
  case 1005: return 21;   /* int2[] */
  case 1007: return 23;   /* int4[] */
  case 1016: return 20;   /* int8[] */
  case 1021: return 700;  /* float4[] */
  case 1022: return 701;  /* float8[] */
  case 1231: return 1700; /* numeric[] */
  case 1009: return 25;   /* text[] */
  case 1015: return 1043; /* varchar[] */
  case 1014: return 1042; /* bpchar[] */
  case 199: return 114;   /* json[] */
  case 3807: return 3802; /* jsonb[] */
  case 2951: return 2950; /* uuid[] */
  case 1028: return 26;   /* oid[] */
  case 1182: return 1082; /* date[] */
  case 1115: return 1114; /* timestamp[] */
  case 1185: return 1184; /* timestamptz[] */
  default: return 0;
  }
}

static void lx__push_value(lua_State *L, unsigned oid, const char *s, size_t n,
                           int json_ref);

/* An array's text form ("{1,NULL,\"a b\",{2,3}}") as nested tables; an
 * element NULL is mp.null. Server output, but bounded anyway: depth is
 * capped (Postgres allows 6 dimensions). Returns the bytes consumed, or 0
 * when it is not well formed (then a string is pushed instead). */
static size_t lx__push_array(lua_State *L, unsigned elem, const char *s,
                             size_t n, int depth, int json_ref) {
  size_t i = 0;
  if (depth > 8 || n == 0 || s[0] != '{' || !lua_checkstack(L, 4)) return 0;
  i = 1;
  lua_newtable(L);
  int k = 0;
  if (i < n && s[i] == '}') return i + 1;
  luaL_Buffer b;
  while (i < n) {
    if (s[i] == '{') {
      size_t used = lx__push_array(L, elem, s + i, n - i, depth + 1, json_ref);
      if (!used) {
        lua_pop(L, 1);
        return 0;
      }
      lua_rawseti(L, -2, ++k);
      i += used;
    } else if (s[i] == '"') {
      i++;
      luaL_buffinit(L, &b);
      while (i < n && s[i] != '"') {
        if (s[i] == '\\' && i + 1 < n) i++;
        luaL_addchar(&b, s[i]);
        i++;
      }
      if (i >= n) {
        luaL_pushresult(&b);
        lua_pop(L, 2);
        return 0;
      }
      i++;
      luaL_pushresult(&b);
      size_t len;
      const char *v = lua_tolstring(L, -1, &len);
      lx__push_value(L, elem, v, len, json_ref);
      lua_remove(L, -2);
      lua_rawseti(L, -2, ++k);
    } else {
      size_t j = i;
      while (j < n && s[j] != ',' && s[j] != '}') j++;
      if (j == n) {
        lua_pop(L, 1);
        return 0;
      }
      if (j - i == 4 && memcmp(s + i, "NULL", 4) == 0)
        lx__push_null(L);
      else
        lx__push_value(L, elem, s + i, j - i, json_ref);
      lua_rawseti(L, -2, ++k);
      i = j;
    }
    if (i < n && s[i] == ',') {
      i++;
      continue;
    }
    if (i < n && s[i] == '}') return i + 1;
    lua_pop(L, 1);
    return 0;
  }
  lua_pop(L, 1);
  return 0;
}

/* An integer as Postgres writes one ([-]digits), of at most 18 digits
 * (so it fits): true and *v; false for anything else. */
static bool lx__parse_int(const char *s, size_t n, long long *v) {
  size_t i = n > 0 && s[0] == '-';
  if (i == n || n - i > 18) return false;
  long long x = 0;
  for (; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return false;
    x = x * 10 + (s[i] - '0');
  }
  *v = s[0] == '-' ? -x : x;
  return true;
}

static void lx__push_value(lua_State *L, unsigned oid, const char *s, size_t n,
                           int json_ref) {
  char buf[64];
  switch (oid) {
  case 16: /* bool */ lua_pushboolean(L, n > 0 && s[0] == 't'); return;
  case 21:
  case 23:
  case 26: { /* int2, int4, oid: digits, parsed here (strtod costs more) */
    long long v;
    if (lx__parse_int(s, n, &v)) {
      lua_pushnumber(L, (lua_Number)v);
      return;
    }
    break;
  }
  case 700:
  case 701: /* float4, float8 */
    if (n < sizeof(buf)) {
      memcpy(buf, s, n);
      buf[n] = 0;
      lua_pushnumber(L, strtod(buf, NULL));
      return;
    }
    break;
  case 20: { /* int8: a number when exact (|v| <= 2^53), else the string */
    long long v;
    if (lx__parse_int(s, n, &v) && v <= (1LL << 53) && v >= -(1LL << 53)) {
      lua_pushnumber(L, (lua_Number)v);
      return;
    }
    break;
  }
  case 17: lx__push_bytea(L, s, n); return;
  case 114:
  case 3802: /* json, jsonb: through mp.json.decode */
    lua_rawgeti(L, LUA_REGISTRYINDEX, json_ref);
    lua_pushlstring(L, s, n);
    if (lua_pcall(L, 1, 1, 0) == 0 && !lua_isnil(L, -1)) return;
    lua_pop(L, 1);
    break;
  default: {
    unsigned elem = lx__elem_type(oid);
    if (elem) {
      size_t used = lx__push_array(L, elem, s, n, 0, json_ref);
      if (used == n) return;
      if (used) lua_pop(L, 1); /* trailing bytes: not an array after all */
    }
    break;
  }
  }
  lua_pushlstring(L, s, n);
}

/* Pushes rows (or nil, err, info) for res; returns how many values. */
int lx_pg_push_result(lua_State *L, const pg_res_t *res, int json_ref) {
  const char *err = pg_res_error(res);
  if (err) {
    lua_pushnil(L);
    lua_pushstring(L, err);
    const char *code = pg_res_diag(res, 'C');
    if (!code) return 2;
    lua_createtable(L, 0, 6);
    static const struct {
      int f;
      const char *k;
    } fields[] = {{'C', "sqlstate"},   {'D', "detail"},   {'H', "hint"},
                  {'n', "constraint"}, {'P', "position"}, {'M', "message"},
                  {'t', "table"},      {'c', "column"},   {'S', "severity"}};
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
      const char *v = pg_res_diag(res, fields[i].f);
      if (!v) continue;
      if (fields[i].f == 'P')
        lua_pushnumber(L, atoi(v));
      else
        lua_pushstring(L, v);
      lua_setfield(L, -2, fields[i].k);
    }
    return 3;
  }
  int nrows = pg_res_nrows(res), ncols = pg_res_ncols(res);
  lua_createtable(L, nrows, 2);
  lua_createtable(L, ncols, 0);
  for (int c = 0; c < ncols; c++) {
    lua_pushstring(L, pg_res_colname(res, c));
    lua_rawseti(L, -2, c + 1);
  }
  int cols = lua_gettop(L);
  unsigned types[64];
  for (int c = 0; c < ncols && c < 64; c++) types[c] = pg_res_coltype(res, c);
  for (int r = 0; r < nrows; r++) {
    lua_createtable(L, 0, ncols);
    for (int c = 0; c < ncols; c++) {
      size_t len;
      const char *v = pg_res_value(res, r, c, &len);
      lua_rawgeti(L, cols, c + 1);
      if (!v)
        lx__push_null(L);
      else
        lx__push_value(L, c < 64 ? types[c] : pg_res_coltype(res, c), v, len,
                       json_ref);
      lua_rawset(L, -3);
    }
    lua_rawseti(L, cols - 1, r + 1);
  }
  lua_setfield(L, -2, "columns");
  long long aff = pg_res_affected(res);
  if (aff >= 0) {
    lua_pushnumber(L, (lua_Number)aff);
    lua_setfield(L, -2, "affected");
  }
  return 1;
}
