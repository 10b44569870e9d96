/* SPDX-License-Identifier: MIT */

/* lx_client: the per-lane state of mp.resolve, mp.tcp and mp.wait, and
 * their registration (see lx_client.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lx/lx_client.h"
#include "lx/lx_tls.h"

/* Registry key of the lane's lx_client_t (a light userdata). */
static const char lx_client_key = 0;

static lx_client_t *lx__client_get(lua_State *L) {
  lua_pushlightuserdata(L, (void *)&lx_client_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lx_client_t *cl = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return cl;
}

lx_client_t *lx_client_of(lx_lane_t *ln) {
  lua_State *L = ln->L;
  lx_client_t *cl = lx__client_get(L);
  if (cl) return cl;
  cl = calloc(1, sizeof(*cl));
  if (!cl) return NULL;
  cl->ln = ln;
  lua_pushlightuserdata(L, (void *)&lx_client_key);
  lua_pushlightuserdata(L, cl);
  lua_rawset(L, LUA_REGISTRYINDEX);
  return cl;
}

dns_resolver_t *lx_client_dns(lx_lane_t *ln, int *err) {
  lx_client_t *cl = lx_client_of(ln);
  if (!cl) {
    *err = -ENOMEM;
    return NULL;
  }
  if (cl->closing) {
    *err = -ESHUTDOWN;
    return NULL;
  }
  if (!cl->dns) {
    /* Tests (and hosts with a local cache) point a server at a given
     * address without touching /etc/resolv.conf. */
    dns_opts_t o = {0};
    o.servers = getenv("MOONPORT_DNS_SERVERS");
    if (o.servers && !*o.servers) o.servers = NULL;
    cl->dns = dns_new(ln->r, &o, err);
  }
  return cl->dns;
}

/* Appends field `name` of the table at idx to b as "<len>:<bytes>|" ("-|"
 * when absent, "?|" when not a string: lx_tls_client then raises). */
static void lx__tls_key_field(lua_State *L, int idx, const char *name,
                              luaL_Buffer *b) {
  lua_getfield(L, idx, name);
  int t = lua_type(L, -1);
  if (t == LUA_TSTRING) {
    size_t n;
    const char *v = lua_tolstring(L, -1, &n);
    char num[24];
    snprintf(num, sizeof(num), "%zu:", n);
    lua_pop(L, 1); /* the table keeps the string; b may use the stack */
    luaL_addstring(b, num);
    luaL_addlstring(b, v, n);
  } else {
    lua_pop(L, 1);
    luaL_addstring(b, t == LUA_TNIL ? "-" : "?");
  }
  luaL_addchar(b, '|');
}

#define LX_CLIENT_TLS_BOX "moonport.tls_ref"

static int lx__tls_box_gc(lua_State *L) {
  net_tls_ctx_t **box = lua_touserdata(L, 1);
  net_tls_ctx_unref(*box);
  *box = NULL;
  return 0;
}

/* Pushes a box holding ctx (a reference it takes over). */
static net_tls_ctx_t *lx__tls_box(lua_State *L, net_tls_ctx_t *ctx) {
  net_tls_ctx_t **box = lua_newuserdata(L, sizeof(*box));
  *box = NULL;
  if (luaL_newmetatable(L, LX_CLIENT_TLS_BOX)) {
    lua_pushcfunction(L, lx__tls_box_gc);
    lua_setfield(L, -2, "__gc");
  }
  lua_setmetatable(L, -2);
  *box = ctx;
  return ctx;
}

/* The context for the settings string at the top of the stack, from the
 * cache or made; a new reference. Pops the string. */
static net_tls_ctx_t *lx__tls_lookup(lua_State *L, lx_client_t *cl, int idx,
                                     const char **sni, const char **key) {
  const char *k = lua_tostring(L, -1);
  for (int i = 0; i < LX_CLIENT_TLS_CACHE && cl->tls[i].key; i++) {
    if (strcmp(cl->tls[i].key, k) != 0) continue;
    lx_client_tls_t hit = cl->tls[i]; /* to the front: the newest */
    memmove(&cl->tls[1], &cl->tls[0], sizeof(cl->tls[0]) * (size_t)i);
    cl->tls[0] = hit;
    lua_pop(L, 1);
    if (lua_istable(L, idx)) {
      lua_getfield(L, idx, "sni");
      if (lua_type(L, -1) == LUA_TSTRING)
        *sni = lua_tostring(L, -1);
      else if (!lua_isnil(L, -1))
        luaL_error(L, "tls: tls.sni must be a string");
      lua_pop(L, 1);
    }
    net_tls_ctx_ref(hit.ctx);
    *key = hit.key;
    return hit.ctx;
  }
  /* Made first (it raises on a bad table, with nothing held yet), then
   * cached under a copy of the key, which is still on the stack. */
  net_tls_ctx_t *ctx = lx_tls_client(L, idx, sni, NULL);
  char *copy = strdup(k);
  lua_pop(L, 1);
  if (!copy) return ctx; /* served, not cached */
  lx_client_tls_t *last = &cl->tls[LX_CLIENT_TLS_CACHE - 1];
  if (last->key) {
    free(last->key);
    net_tls_ctx_unref(last->ctx);
  }
  memmove(&cl->tls[1], &cl->tls[0],
          sizeof(cl->tls[0]) * (LX_CLIENT_TLS_CACHE - 1));
  cl->tls[0].key = copy;
  cl->tls[0].ctx = ctx;
  net_tls_ctx_ref(ctx); /* the cache's; the caller has its own */
  *key = copy;
  return ctx;
}

net_tls_ctx_t *lx_client_tls(lua_State *L, lx_client_t *cl, int idx,
                             const char **sni, const char **key) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  *sni = NULL;
  *key = NULL;
  if (lua_isnoneornil(L, idx) ||
      (lua_isboolean(L, idx) && !lua_toboolean(L, idx))) {
    lua_pushnil(L);
    return NULL;
  }
  /* The settings that make a context, as one string. */
  if (lua_istable(L, idx)) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    lua_getfield(L, idx, "verify");
    bool verify = lua_isnil(L, -1) || lua_toboolean(L, -1);
    lua_pop(L, 1);
    luaL_addstring(&b, verify ? "v|" : "n|");
    lx__tls_key_field(L, idx, "ca", &b);
    lx__tls_key_field(L, idx, "cert", &b);
    lx__tls_key_field(L, idx, "key", &b);
    luaL_pushresult(&b);
  } else if (lua_isboolean(L, idx)) {
    lua_pushliteral(L, "default|");
  } else {
    lx_tls_client(L, idx, sni, NULL); /* raises */
    lua_pushnil(L);
    return NULL;
  }
  net_tls_ctx_t *ctx = lx__tls_lookup(L, cl, idx, sni, key);
  return lx__tls_box(L, ctx);
}

lx_client_t *lx_client_closing(lx_lane_t *ln) {
  lx_client_t *cl = ln->L ? lx__client_get(ln->L) : NULL;
  if (cl) cl->closing = true;
  return cl;
}

void lx_client_lane_free(lx_lane_t *ln) {
  lx_client_t *cl = lx_client_closing(ln);
  if (!cl) return;
  /* Pending lookups get -ECANCELED from inside dns_free; their callbacks
   * see the lane closing and only free their request. */
  if (cl->dns) dns_free(cl->dns);
  cl->dns = NULL;
  for (int i = 0; i < LX_CLIENT_TLS_CACHE; i++) {
    free(cl->tls[i].key);
    net_tls_ctx_unref(cl->tls[i].ctx);
  }
  lua_pushlightuserdata(ln->L, (void *)&lx_client_key);
  lua_pushnil(ln->L);
  lua_rawset(ln->L, LUA_REGISTRYINDEX);
  free(cl);
}
