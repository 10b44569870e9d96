/* SPDX-License-Identifier: MIT */

/* lx_dns: mp.resolve(host [, opts]), a lookup on the lane's c-ares
 * resolver (net/dns.h) that waits only its coroutine. The Lua half is
 * lua/moonport/dns.lua; the resolver itself lives in lx_client.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "lx/lx_client.h"
#include "lx/lx_dns.h"
#include "lx/lx_embed.h"

/* Default bound of one mp.resolve when opts.timeout is not given. */
#define LX_DNS_TIMEOUT_MS 5000

typedef struct {
  lx_lane_t *ln;
  lx_run_t run;
  dns_req_t *dq; /* the lookup, until its callback */
} lx_dns_q_t;

static void lx__resolved(void *arg, int err, const dns_addr_t *addrs, size_t n,
                         uint32_t ttl_s) {
  (void)ttl_s;
  lx_dns_q_t *q = arg;
  lx_lane_t *ln = q->ln;
  lx_run_t run = q->run;
  free(q);
  if (ln->closing) return; /* the lane is going: no Lua to resume */
  lua_State *co = run.co;
  if (err) {
    lua_pushnil(co);
    lua_pushstring(co, dns_strerror(err));
    lx_resume(ln, &run, 2);
    return;
  }
  lua_createtable(co, (int)n, 0);
  for (size_t i = 0; i < n; i++) {
    char buf[INET6_ADDRSTRLEN];
    inet_ntop(addrs[i].family, &addrs[i].a, buf, sizeof(buf));
    lua_pushstring(co, buf);
    lua_rawseti(co, -2, (int)i + 1);
  }
  lx_resume(ln, &run, 1);
}

/* A killed task's lookup (lx_wait_cancel_on): its callback never runs
 * (the query itself may go on and fill the cache). */
static void lx__cancel(lx_lane_t *ln, void *arg) {
  lx_dns_q_t *q = arg;
  dns_cancel(q->dq);
  lx_run_abandon(ln, &q->run);
  free(q);
}

/* core.dns.check(host, family, timeout_ms): raises on misuse (the Lua half
 * has turned opts into numbers). */
static int lx_dns_check(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  size_t len;
  luaL_checklstring(L, 1, &len);
  if (len == 0 || len > DNS_MAX_NAME)
    return luaL_argerror(L, 1, "a host name of 1 to 253 characters");
  lua_Integer fam = luaL_checkinteger(L, 2);
  if (fam != 0 && fam != 4 && fam != 6)
    return luaL_argerror(L, 2, "family must be 4, 6 or nil");
  lua_Number ms = luaL_checknumber(L, 3);
  if (!(ms >= 0 && ms <= 86400000))
    return luaL_argerror(L, 3, "timeout must be 0 to 86400000 ms");
  lx_check_waitable(L, ln, "mp.resolve");
  return 0;
}

/* Arms the lookup: host, family, timeout at co's 3, 4, 5. */
static int lx_dns_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  int err = 0;
  dns_resolver_t *d = lx_client_dns(ln, &err);
  if (!d) return err;
  lx_dns_q_t *q = calloc(1, sizeof(*q));
  if (!q) return -ENOMEM;
  q->ln = ln;
  q->run = *run;
  int fam = (int)lua_tointeger(co, 4);
  uint32_t ms = (uint32_t)lua_tonumber(co, 5);
  if (!ms) ms = LX_DNS_TIMEOUT_MS;
  q->dq = dns_resolve(d, lua_tostring(co, 3),
                      fam == 4 ? AF_INET : fam == 6 ? AF_INET6 : AF_UNSPEC,
                      ms, lx__resolved, q);
  if (!q->dq) {
    err = -errno;
    free(q);
    return err;
  }
  lx_wait_cancel_on(ln, lx__cancel, q);
  return 0;
}

void lx_dns_open(lua_State *L, lx_lane_t *ln) {
  lx_embed_core_table(L, "dns");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_dns_check, 1);
  lua_setfield(L, -2, "check");
  lua_pushlightuserdata(L, (void *)lx_dns_arm);
  lua_setfield(L, -2, "arm");
  lua_pop(L, 1);
  lx_require(L, "moonport.dns");
  lua_setfield(L, -2, "resolve");
}
