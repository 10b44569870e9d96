/* lx_client: the per-lane state of mp.resolve, mp.tcp and mp.wait, and
 * their registration (see lx_client.h). */
#include <errno.h>
#include <stdlib.h>

#include "lx/lx_client.h"

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

void lx_client_open(lua_State *L, lx_lane_t *ln) {
  lx_dns_open(L, ln);
  lx_tcp_open(L, ln);
  lx_wait_open(L, ln);
}

void lx_client_lane_free(lx_lane_t *ln) {
  if (!ln->L) return;
  lx_client_t *cl = lx__client_get(ln->L);
  if (!cl) return;
  cl->closing = true;
  lx_tcp_free_all(cl);
  lx_wait_free_all(cl);
  /* Pending lookups get -ECANCELED from inside dns_free; their callbacks
   * see the lane closing and only free their request. */
  if (cl->dns) dns_free(cl->dns);
  cl->dns = NULL;
  lua_pushlightuserdata(ln->L, (void *)&lx_client_key);
  lua_pushnil(ln->L);
  lua_rawset(ln->L, LUA_REGISTRYINDEX);
  free(cl);
}
