/* SPDX-License-Identifier: MIT */

/* lx_fetch: core.fetch.parse for lua/moonport/fetch.lua (lx_fetch.h). The
 * head is parsed in C, where the framing rules already live and are
 * fuzzed (http1_response.c); the values cross to Lua once. */
#include <ctype.h>
#include <time.h>
#include <lauxlib.h>
#include <lua.h>

#include "http/http1_response.h"
#include "lx/lx_embed.h"
#include "lx/lx_fetch.h"

static const char *const body_names[] = {
    [HTTP_BODY_NONE] = "none",
    [HTTP_BODY_LENGTH] = "length",
    [HTTP_BODY_CHUNKED] = "chunked",
    [HTTP_BODY_CLOSE] = "close",
};

/* Pushes the field name lower-cased (names are ASCII tokens: the parser
 * refused anything else), like req.headers on the server side. */
static void push_lower(lua_State *L, const char *s, uint32_t n) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (uint32_t i = 0; i < n; i++)
    luaL_addchar(&b, (char)tolower((unsigned char)s[i]));
  luaL_pushresult(&b);
}

/* The headers as { name = value }, a repeated field's values joined with
 * ", " in their order (RFC 9110 5.3). */
static void push_headers(lua_State *L, const http_response_t *r) {
  lua_createtable(L, 0, r->nheaders);
  for (int i = 0; i < r->nheaders; i++) {
    const http_header_t *h = &r->headers[i];
    push_lower(L, h->name, h->name_len);
    lua_pushvalue(L, -1);
    lua_rawget(L, -3);
    if (lua_isnil(L, -1)) {
      lua_pop(L, 1);
      lua_pushlstring(L, h->value, h->value_len);
    } else {
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, h->value, h->value_len);
      lua_concat(L, 3);
    }
    lua_rawset(L, -3);
  }
}

/* core.fetch.parse(buf, max_head, head_request): on a whole head
 * head_len, status, headers, body ("none" | "length" | "chunked" |
 * "close"), content_length (-1: none), keep_alive, interim, reason;
 * false, "incomplete" when more bytes may complete it; nil, err when
 * it is too large or malformed. */
static int lx_fetch_parse(lua_State *L) {
  size_t len;
  const char *buf = luaL_checklstring(L, 1, &len);
  lua_Integer max_head = luaL_checkinteger(L, 2);
  if (max_head < 1) return luaL_argerror(L, 2, "max_head must be >= 1");
  int head_request = lua_toboolean(L, 3);
  /* ~5 KB: on the heap of the Lua state, not the lane's C stack. */
  http_response_t *r = lua_newuserdata(L, sizeof(*r));
  int n = http_parse_response(buf, len, (size_t)max_head, head_request, r);
  if (n == HTTP_RES_INCOMPLETE) {
    lua_pushboolean(L, 0);
    lua_pushliteral(L, "incomplete");
    return 2;
  }
  if (n < 0) {
    lua_pushnil(L);
    if (n == HTTP_RES_TOO_LARGE)
      lua_pushliteral(L, "response header too large");
    else
      lua_pushliteral(L, "bad response");
    return 2;
  }
  lua_pushinteger(L, n);
  lua_pushinteger(L, r->status);
  push_headers(L, r);
  lua_pushstring(L, body_names[r->body]);
  lua_pushnumber(L, (lua_Number)r->content_length);
  lua_pushboolean(L, r->keep_alive);
  lua_pushboolean(L, r->interim);
  lua_pushlstring(L, r->reason, r->reason_len);
  return 8;
}

/* core.fetch.now(): monotonic ms, for the deadline of one fetch. */
static int lx_fetch_now(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec * 1e3 + (lua_Number)ts.tv_nsec / 1e6);
  return 1;
}

void lx_fetch_open(lua_State *L, lx_lane_t *ln) {
  (void)ln;
  lx_embed_core_table(L, "fetch");
  lua_pushcfunction(L, lx_fetch_parse);
  lua_setfield(L, -2, "parse");
  lua_pushcfunction(L, lx_fetch_now);
  lua_setfield(L, -2, "now");
  lua_pushliteral(L, MOONPORT_VERSION); /* the default User-Agent's */
  lua_setfield(L, -2, "version");
  lua_pop(L, 1);
  lx_require(L, "moonport.fetch");
  lua_setfield(L, -2, "fetch");
}
