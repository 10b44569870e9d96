/* SPDX-License-Identifier: MIT */

/* lx_moonport: the `moonport` Lua module: listen, connect, defer,
 * lifecycle events and facts about the process; the other modules add
 * their fields through the table in lx_modules.c (timers and sleep:
 * lx_timer.c). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "http/server.h"
#include "lx/lx_client.h"
#include "lx/lx_conn.h"
#include "lx/lx_tls.h"
#include "lx/lx_embed.h"
#include "lx/lx_lane.h"
#include "lx/lx_listen.h"
#include "lx/lx_log.h"
#include "lx/lx_module.h"
#include "lx/lx_moonport.h"
#include "lx/lx_server.h"
#include "lx/lx_tcp.h"
#include "redis/redis.h"

#define LX_LISTENER_MT "moonport.listener"

static lx_lane_t *lx__ln(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

/* ---- mp.listen ---- */

typedef struct {
  lx_service_t *svc; /* NULL once closed */
  int port;
  char address[128];
} lx_listener_ud_t;

/* Pushes the listener object of a service; tcp_fd < 0 for Unix. */
static lx_listener_ud_t *lx__push_listener(lua_State *L, lx_service_t *svc,
                                           const char *address, int tcp_fd) {
  lx_listener_ud_t *ud = lua_newuserdata(L, sizeof(*ud));
  ud->svc = svc;
  ud->port = tcp_fd >= 0 ? sock_local_port(tcp_fd) : 0;
  snprintf(ud->address, sizeof(ud->address), "%s", address);
  luaL_getmetatable(L, LX_LISTENER_MT);
  lua_setmetatable(L, -2);
  return ud;
}

static int lx_listen(lua_State *L) {
  return lx_listen_with(L, lx__ln(L), lx_tcp_service_new);
}

int lx_listen_with(lua_State *L, lx_lane_t *ln,
                   lx_service_t *(*make)(lua_State *L, lx_lane_t *ln, int idx)) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "path");
  lua_getfield(L, 1, "address");
  lua_getfield(L, 1, "port");
  lua_getfield(L, 1, "backlog");
  const char *path = lua_tostring(L, -4);
  const char *host = luaL_optstring(L, -3, "0.0.0.0");
  int backlog = (int)luaL_optinteger(L, -1, SOMAXCONN);
  int port = 0;
  if (path && strlen(path) > 200)
    return luaL_error(L, "mp.listen: Unix socket path too long");
  if (!path) {
    if (!lua_isnumber(L, -2))
      return luaL_error(L, "mp.listen: give a port (TCP) or a path (Unix)");
    lua_Number p = lua_tonumber(L, -2);
    if (p < 0 || p > 65535 || p != (int)p)
      return luaL_error(L, "mp.listen: bad port %s", lua_tostring(L, -2));
    port = (int)p;
    if (strlen(host) > 200) return luaL_error(L, "mp.listen: address too long");
  }
  /* Lanes running the same script share one socket per address. Port 0
   * asks for a fresh port each time, so the n-th port-0 listen of a lane
   * shares with the n-th of the other lanes. */
  char key[300], desc[300];
  if (path)
    snprintf(key, sizeof(key), "unix:%s", path);
  else if (port)
    snprintf(key, sizeof(key), "tcp:%s:%d", host, port);
  else
    snprintf(key, sizeof(key), "tcp:%s:0#%d", host, ln->port0_listens++);
  if (path)
    snprintf(desc, sizeof(desc), "unix:%s", path);
  else
    snprintf(desc, sizeof(desc), strchr(host, ':') ? "[%s]:%d" : "%s:%d",
             host, port);
  /* tls: read now (it raises), loaded once the socket is ours */
  lua_getfield(L, 1, "tls");
  lx_tls_conf_t *tls = lua_isnil(L, -1) ? NULL : lua_newuserdata(L, sizeof(*tls));
  if (tls) lx_tls_parse(L, -2, tls, "mp.listen");
  lx_service_t *svc = make(L, ln, 1);
  int err = 0;
  lx_shared_listener_t *sl =
      lx_shared_acquire(ln->srv, key, host, port, path, backlog, &err);
  if (!sl) {
    lx_service_free(svc);
    char buf[128];
    return luaL_error(L, "cannot listen on %s: %s", desc,
                      lx_errmsg(err, buf, sizeof(buf)));
  }
  svc->shared = sl;
  if (tls && tls->n) {
    char msg[400];
    /* an HTTP listener (svc->ext) offers src/http's protocols */
    svc->opts.tls = lx_tls_server(ln, sl, tls, svc->alpn, msg, sizeof(msg));
    if (!svc->opts.tls) {
      lx_service_free(svc);
      return luaL_error(L, "cannot listen on %s: %s", desc, msg);
    }
    if (svc->ext) svc->opts.tls_plain_reply = http_tls_plain_reply;
  }
  if (ln->is_root) {
    /* The root opens the sockets before it forks; workers serve them. */
    svc->closed = true;
    lx__push_listener(L, svc, path ? path : host, path ? -1 : sl->fd);
    return 1;
  }
  pthread_mutex_lock(&ln->srv->listen_lock);
  bool twice = sl->svc[ln->index] != NULL;
  if (!twice) sl->svc[ln->index] = svc;
  pthread_mutex_unlock(&ln->srv->listen_lock);
  if (twice) {
    lx_service_free(svc);
    return luaL_error(L, "cannot listen on %s: this lane listens there "
                         "already", desc);
  }
  svc->listener = reactor_listen(ln->r, sl->fd, &svc->proto, svc, svc->opts);
  if (!svc->listener) {
    int e = errno;
    lx_service_free(svc);
    return luaL_error(L, "cannot listen on %s: %s", desc, strerror(e));
  }
  if (ln->srv->nlanes > 1)
    reactor_listener_set_dispatch(svc->listener, lx_listen_dispatch, svc);
  lx_listener_ud_t *ud =
      lx__push_listener(L, svc, path ? path : host, path ? -1 : sl->fd);
  if (ln->index == 0 && path)
    log_info("listening on %s", desc);
  else if (ln->index == 0)
    log_info(strchr(host, ':') ? "listening on [%s]:%d" : "listening on %s:%d",
             host, ud->port);
  return 1;
}

static int lx_listener_port(lua_State *L) {
  lx_listener_ud_t *ud = luaL_checkudata(L, 1, LX_LISTENER_MT);
  lua_pushinteger(L, ud->port);
  return 1;
}

static int lx_listener_address(lua_State *L) {
  lx_listener_ud_t *ud = luaL_checkudata(L, 1, LX_LISTENER_MT);
  lua_pushstring(L, ud->address);
  return 1;
}

static int lx_listener_close(lua_State *L) {
  lx_listener_ud_t *ud = luaL_checkudata(L, 1, LX_LISTENER_MT);
  lx_service_t *s = ud->svc;
  if (!s) return 0;
  ud->svc = NULL;
  s->closed = true;
  if (s->listener) reactor_listener_close(s->listener);
  s->listener = NULL;
  if (s->shared) {
    lx_shared_detach(s->ln->srv, s->shared, s->ln->index, s);
    lx_shared_release(s->ln->srv, s->shared);
  }
  s->shared = NULL;
  lx_service_maybe_free(s);
  return 0;
}

/* ---- mp.connect ---- */

typedef struct {
  lx_service_t *svc;
  int err;
  int udref;
  int msgref; /* a message for on_fail instead of err's, or LUA_NOREF */
} lx_fail_later_t;

static void lx__fail_later(void *a, void *b) {
  lx_fail_later_t *f = a;
  lx_service_t *s = f->svc;
  lx_lane_t *ln = s->ln;
  if (s->on_fail != LUA_NOREF) {
    char buf[128];
    lua_State *L = ln->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->on_fail);
    lua_rawgeti(L, LUA_REGISTRYINDEX, f->udref);
    if (f->msgref != LUA_NOREF)
      lua_rawgeti(L, LUA_REGISTRYINDEX, f->msgref);
    else
      lua_pushstring(L, lx_errmsg(f->err, buf, sizeof(buf)));
    lx_call(ln, L, 2, LX_PLAIN, NULL, NULL, "on_fail");
  }
  luaL_unref(ln->L, LUA_REGISTRYINDEX, f->udref);
  luaL_unref(ln->L, LUA_REGISTRYINDEX, f->msgref);
  s->conns = 0;
  lx_service_maybe_free(s);
  free(f);
}

static int lx_connect(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "path");
  lua_getfield(L, 1, "host");
  lua_getfield(L, 1, "port");
  lua_getfield(L, 1, "connect_timeout");
  const char *path = lua_tostring(L, -4);
  const char *host = luaL_optstring(L, -3, "127.0.0.1");
  lua_Number port = lua_tonumber(L, -2);
  lua_Number ct = luaL_optnumber(L, -1, 10);
  if (!path && (port <= 0 || port > 65535 || port != (int)port))
    return luaL_error(L, "mp.connect: give a host and port (TCP) or a path "
                         "(Unix)");
  if (ct < 0 || ct > 4e6)
    return luaL_error(L, "mp.connect: connect_timeout out of range");
  /* _fail (a negative errno): the name lookup of lua/moonport/mp.lua
   * failed; answered through on_fail like any failed connect. */
  lua_getfield(L, 1, "_fail");
  int fail = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  /* _fail_msg: the address check of mp.lua refused every address; that
   * message reaches on_fail. */
  lua_getfield(L, 1, "_fail_msg");
  bool has_msg = lua_type(L, -1) == LUA_TSTRING;
  int msg_at = lua_gettop(L);
  if (has_msg && fail >= 0) fail = -EACCES;
  /* tls = true | {verify=, ca=, sni=, cert=, key=}: read (and raising on
   * a bad one) before anything is held. The name verified is tls.sni, or
   * the host name mp.lua looked up (_name), or the host. */
  lx_client_t *cl = lx_client_of(ln);
  if (!cl) return luaL_error(L, "out of memory");
  lua_getfield(L, 1, "tls");
  lua_getfield(L, 1, "_name");
  const char *sni = NULL, *tkey = NULL;
  net_tls_ctx_t *tls = lx_client_tls(L, cl, -2, &sni, &tkey);
  /* (the context is the box's at -1, on the stack until the return;
   * the connection takes its own reference) */
  const char *tls_host = sni                     ? sni
                         : lua_isstring(L, -2) ? lua_tostring(L, -2)
                         : path                ? NULL
                                               : host;
  if (tls && !tls_host)
    return luaL_error(L, "mp.connect: tls over a Unix socket needs tls.sni "
                         "(the name to verify)");
  lx_service_t *svc = lx_service_new(L, ln, 1, true);
  svc->conns = 1;
  int err = fail < 0 ? fail : 0;
  conn_opts_t opts = svc->opts;
  opts.tls = tls;
  opts.tls_host = tls_host;
  conn_t *c = fail < 0 ? NULL
                       : reactor_connect(ln->r, host, (int)port, path,
                                         (uint32_t)(ct * 1000), &svc->proto,
                                         svc, opts, &err);
  if (c) {
    lx_conn_push(L, ln, c);
    return 1;
  }
  /* Failed at once: still answered through on_fail, from the loop, so the
   * caller sees the same order of events as for a late failure. */
  lx_fail_later_t *f = malloc(sizeof(*f));
  if (!f) {
    lx_service_free(svc);
    return luaL_error(L, "out of memory");
  }
  lx_conn_push_closed(L, ln);
  lua_pushvalue(L, -1);
  int udref = luaL_ref(L, LUA_REGISTRYINDEX);
  int msgref = LUA_NOREF;
  if (has_msg) {
    lua_pushvalue(L, msg_at);
    msgref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  *f = (lx_fail_later_t){svc, err, udref, msgref};
  reactor_defer(ln->r, lx__fail_later, f, NULL);
  return 1;
}

/* ---- defer, events, stop ---- */

static void lx__defer_run(void *a, void *b) {
  lx_lane_t *ln = a;
  int ref = (int)(intptr_t)b;
  lua_State *L = ln->L;
  if (ln->retired) { /* its code was replaced */
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    lx_lane_task_done(ln);
    return;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  lua_getfield(L, -1, "n");
  int nargs = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  for (int i = 1; i <= nargs + 1; i++) lua_rawgeti(L, -i, i);
  lua_remove(L, -(nargs + 2));
  lx_call(ln, L, nargs, LX_PLAIN, NULL, NULL, "deferred function");
  lx_lane_task_done(ln);
}

static int lx_defer(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  int n = lua_gettop(L);
  lua_createtable(L, n, 1);
  for (int i = 1; i <= n; i++) {
    lua_pushvalue(L, i);
    lua_rawseti(L, -2, i);
  }
  lua_pushinteger(L, n - 1);
  lua_setfield(L, -2, "n");
  int ref = luaL_ref(L, LUA_REGISTRYINDEX);
  atomic_fetch_add(&ln->tasks, 1);
  if (reactor_defer(ln->r, lx__defer_run, ln, (void *)(intptr_t)ref)) {
    atomic_fetch_sub(&ln->tasks, 1);
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    return luaL_error(L, "mp.defer: out of memory");
  }
  return 0;
}

static int lx_on(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  const char *name = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  int list;
  if (strcmp(name, "start") == 0)
    list = ln->start_ref;
  else if (strcmp(name, "stop") == 0)
    list = ln->stop_ref;
  else if (strcmp(name, "worker_start") == 0)
    list = ln->worker_start_ref;
  else if (strcmp(name, "reload") == 0)
    list = ln->reload_ref;
  else
    return luaL_argerror(
        L, 1, "unknown event (known: start, stop, worker_start, reload)");
  lua_rawgeti(L, LUA_REGISTRYINDEX, list);
  lua_pushvalue(L, 2);
  lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
  return 0;
}

/* mp.engine { redis = url }: pub/sub through Redis, like --redis (which
 * wins). Only before the server starts: at the script's top level. */
static int lx_engine(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  lx_server_t *srv = ln->srv;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "redis");
  if (!lua_isstring(L, -1))
    return luaL_error(L, "mp.engine: give { redis = \"redis://host:port\" }");
  const char *url = lua_tostring(L, -1);
  if (srv->redis_cli) return 0; /* --redis / MOONPORT_REDIS win */
  if (srv->redis_url && strcmp(srv->redis_url, url) == 0) return 0;
  if (srv->engine_started)
    return luaL_error(L, "mp.engine: the engine is chosen when the server "
                         "starts (at the script's top level); it uses %s",
                      srv->redis_url ? srv->redis_url : "none");
  if (srv->redis_url)
    return luaL_error(L, "mp.engine: already set to %s", srv->redis_url);
  char err[512];
  redis_url_t u;
  if (redis_url_parse(url, &u, err, sizeof(err)))
    return luaL_error(L, "mp.engine: %s", err);
  srv->redis_url = srv->redis_url_own = strdup(url);
  if (!srv->redis_url) return luaL_error(L, "mp.engine: out of memory");
  srv->remote = true;
  return 0;
}

static int lx_stop(lua_State *L) {
  lx_server_t *srv = lx__ln(L)->srv;
  if (srv->proc.stop) srv->proc.stop(srv);
  return 0;
}

/* ---- facts ---- */

static int lx_threads(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)lx__ln(L)->srv->nlanes);
  return 1;
}

static int lx_lane(lua_State *L) {
  lua_pushinteger(L, lx__ln(L)->index + 1);
  return 1;
}

static int lx_is_root(lua_State *L) {
  lua_pushboolean(L, lx__ln(L)->is_root);
  return 1;
}

static int lx_worker(lua_State *L) {
  lua_pushinteger(L, lx__ln(L)->srv->worker_index);
  return 1;
}

static int lx_workers(lua_State *L) {
  lua_pushinteger(L, lx__ln(L)->srv->nworkers);
  return 1;
}

static int lx_pid(lua_State *L) {
  lua_pushinteger(L, getpid());
  return 1;
}

static int lx_now(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec * 1e3 + (lua_Number)ts.tv_nsec / 1e6);
  return 1;
}

static const luaL_Reg lx_functions[] = {
    {"listen", lx_listen},   {"connect", lx_connect}, {"defer", lx_defer},
    {"on", lx_on},           {"stop", lx_stop},       {"threads", lx_threads},
    {"lane", lx_lane},       {"pid", lx_pid},         {"now", lx_now},
    {"is_root", lx_is_root}, {"worker", lx_worker},   {"workers", lx_workers},
    {"engine", lx_engine},   {"log", lx_log},
    {NULL, NULL}};

static const luaL_Reg lx_listener_methods[] = {{"port", lx_listener_port},
                                               {"address", lx_listener_address},
                                               {"close", lx_listener_close},
                                               {NULL, NULL}};

static void lx__class(lua_State *L, const char *name, const luaL_Reg *methods) {
  luaL_newmetatable(L, name);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
}

int luaopen_moonport(lua_State *L) {
  lx_lane_t *ln = lx_lane_of(L);
  lx__class(L, LX_LISTENER_MT, lx_listener_methods);
  lua_newtable(L);
  lua_pushlightuserdata(L, ln);
  luaL_setfuncs(L, lx_functions, 1);
  /* The other modules' fields (lx_modules.c lists them). */
  for (const lx_module_t *m = ln->srv->modules; m && m->name; m++)
    if (m->open) m->open(L, ln);
  lua_pushliteral(L, MOONPORT_VERSION);
  lua_setfield(L, -2, "version");
  lx_push_script_dir(L);
  lua_setfield(L, -2, "script_dir");
  lua_createtable(L, ln->srv->argc, 0);
  for (int i = 0; i < ln->srv->argc; i++) {
    lua_pushstring(L, ln->srv->argv[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "args");
  lx_require(L, "moonport.mp"); /* the Lua-written parts: lua/moonport/mp.lua */
  lua_insert(L, -2);
  lua_call(L, 1, 1);
  return 1;
}
