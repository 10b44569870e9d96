/* SPDX-License-Identifier: MIT */

/* lx_tls: see lx_tls.h. */
#include "lx/lx_tls.h"

#include <stdatomic.h>
#include <string.h>

#include "core/log.h"

#include "lx/lx_service.h"
#include "lx/lx_server.h"

/* A string field of the table at idx, or NULL; raises when it is there
 * but not a string. */
static const char *lx__str(lua_State *L, int idx, const char *name,
                           const char *what) {
  lua_getfield(L, idx, name);
  const char *v = NULL;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TSTRING)
      luaL_error(L, "%s: tls.%s must be a string", what, name);
    v = lua_tostring(L, -1);
  }
  lua_pop(L, 1); /* the table keeps the string alive */
  return v;
}

/* Reads one certificate table at idx into *ct (names into `names`). */
static void lx__cert(lua_State *L, int idx, net_tls_cert_t *ct,
                     const char **names, const char *what) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  if (!lua_istable(L, idx))
    luaL_error(L, "%s: tls must be a table {cert=, key=} or a list of them",
               what);
  ct->cert = lx_script_path(L, lx__str(L, idx, "cert", what));
  ct->key = lx_script_path(L, lx__str(L, idx, "key", what));
  ct->chain = lx_script_path(L, lx__str(L, idx, "chain", what));
  if (!ct->cert || !ct->key)
    luaL_error(L, "%s: tls needs cert and key (PEM file names)", what);
  lua_getfield(L, idx, "names");
  ct->nnames = 0;
  if (lua_istable(L, -1)) {
    size_t n = lua_objlen(L, -1);
    if (n > LX_TLS_MAX_NAMES)
      luaL_error(L, "%s: at most %d names per certificate", what,
                 LX_TLS_MAX_NAMES);
    for (size_t i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, (int)i);
      if (lua_type(L, -1) != LUA_TSTRING)
        luaL_error(L, "%s: tls names must be strings", what);
      names[ct->nnames++] = lua_tostring(L, -1);
      lua_pop(L, 1);
    }
  } else if (!lua_isnil(L, -1)) {
    luaL_error(L, "%s: tls names must be a list of host names", what);
  }
  lua_pop(L, 1);
  ct->names = names;
}

void lx_tls_parse(lua_State *L, int idx, lx_tls_conf_t *conf,
                  const char *what) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  conf->n = 0;
  if (lua_isnil(L, idx) || (lua_isboolean(L, idx) && !lua_toboolean(L, idx)))
    return;
  if (!lua_istable(L, idx))
    luaL_error(L, "%s: tls must be a table {cert=, key=} or a list of them",
               what);
  lua_rawgeti(L, idx, 1);
  bool list = lua_istable(L, -1);
  lua_pop(L, 1);
  if (!list) {
    lx__cert(L, idx, &conf->certs[0], conf->names[0], what);
    conf->n = 1;
    return;
  }
  size_t len = lua_objlen(L, idx);
  if (len > LX_TLS_MAX_CERTS)
    luaL_error(L, "%s: at most %d certificates", what, LX_TLS_MAX_CERTS);
  for (size_t i = 1; i <= len; i++) {
    lua_rawgeti(L, idx, (int)i);
    lx__cert(L, -1, &conf->certs[i - 1], conf->names[i - 1], what);
    lua_pop(L, 1);
  }
  conf->n = len;
}

net_tls_ctx_t *lx_tls_server(lx_lane_t *ln, lx_shared_listener_t *sl,
                             const lx_tls_conf_t *conf, const char *alpn,
                             char *err, size_t errlen) {
  lx_server_t *srv = ln->srv;
  /* Under the lock: the lanes of a process make it once. */
  pthread_mutex_lock(&srv->listen_lock);
  if (!ln->is_root && sl->tls) {
    net_tls_ctx_t *have = sl->tls;
    net_tls_ctx_ref(have);
    pthread_mutex_unlock(&srv->listen_lock);
    return have;
  }
  net_tls_ctx_t *ctx =
      net_tls_server_ctx_alpn(conf->certs, conf->n, alpn, err, errlen);
  net_tls_ctx_t *old = NULL;
  if (ctx && (!ln->is_root || !sl->tls)) { /* the first: in use at once */
    sl->tls = ctx;
    net_tls_ctx_ref(ctx); /* the caller's */
  } else if (ctx) {
    /* a root reload's: workers get it only once the whole script has
     * loaded (lx_shared_reload_end), so a reload that fails later
     * changes nothing */
    old = sl->tls_next;
    sl->tls_next = ctx;
    net_tls_ctx_ref(ctx);
  }
  pthread_mutex_unlock(&srv->listen_lock);
  net_tls_ctx_unref(old);
  static _Atomic bool told;
  if (ctx && !net_tls_kernel_available() && !atomic_exchange(&told, true))
    log_info("TLS: the kernel offers no kTLS (no \"tls\" in "
             "/proc/sys/net/ipv4/tcp_available_ulp): static files are read "
             "and encrypted by OpenSSL, not sent with sendfile");
  return ctx;
}

net_tls_ctx_t *lx_tls_client(lua_State *L, int idx, const char **sni,
                             const char *alpn) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  *sni = NULL;
  char err[400];
  if (lua_isnil(L, idx) || (lua_isboolean(L, idx) && !lua_toboolean(L, idx)))
    return NULL;
  (void)alpn; /* ALPN is offered only by a table's own context */
  if (lua_isboolean(L, idx)) {
    net_tls_ctx_t *d = net_tls_client_default(err, sizeof(err));
    if (!d) luaL_error(L, "%s", err);
    net_tls_ctx_ref(d);
    return d;
  }
  net_tls_client_opts_t o = {.verify = true, .alpn = NULL};
  if (lua_istable(L, idx)) {
    lua_getfield(L, idx, "verify");
    if (!lua_isnil(L, -1)) o.verify = lua_toboolean(L, -1);
    lua_pop(L, 1);
    o.ca = lx_script_path(L, lx__str(L, idx, "ca", "tls"));
    o.cert = lx_script_path(L, lx__str(L, idx, "cert", "tls"));
    o.key = lx_script_path(L, lx__str(L, idx, "key", "tls"));
    *sni = lx__str(L, idx, "sni", "tls");
  } else if (!lua_isboolean(L, idx)) {
    luaL_error(L, "tls must be true or a table {verify=, ca=, sni=, cert=, "
                  "key=}");
  }
  net_tls_ctx_t *ctx = net_tls_client_ctx(&o, err, sizeof(err));
  if (!ctx) luaL_error(L, "%s", err);
  return ctx;
}

int lx_tls_push_info(lua_State *L, conn_t *c) {
  net_tls_info_t info;
  if (!c || !reactor_conn_tls(c, &info)) {
    lua_pushnil(L);
    return 1;
  }
  lua_createtable(L, 0, 5);
  lua_pushstring(L, info.protocol ? info.protocol : "");
  lua_setfield(L, -2, "protocol");
  lua_pushstring(L, info.cipher ? info.cipher : "");
  lua_setfield(L, -2, "cipher");
  if (info.sni) {
    lua_pushstring(L, info.sni);
    lua_setfield(L, -2, "sni");
  }
  if (info.alpn[0]) {
    lua_pushstring(L, info.alpn);
    lua_setfield(L, -2, "alpn");
  }
  lua_pushboolean(L, info.resumed);
  lua_setfield(L, -2, "resumed");
  return 1;
}
