/* SPDX-License-Identifier: MIT */

/* lx_conn: connection objects for Lua, and the protocol that runs a
 * service's Lua handlers for each connection event. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "lx/lx_conn.h"
#include "lx/lx_embed.h"
#include "lx/lx_lane.h"
#include "lx/lx_listen.h"
#include "lx/lx_pubsub.h"
#include "lx/lx_server.h"
#include "lx/lx_tls.h"

#define LX_CONN_MT "moonport.conn"
/* Writes at least this long are queued by reference to the Lua string
 * (when the socket does not take them at once) instead of copied. */
#define LX_ZERO_COPY_MIN 16384

typedef struct {
  sock_uuid_t uuid; /* 0 for a connection that never existed */
  bool gone;        /* its connection closed: never look the uuid up again,
                       however long the object is kept (issue 16, item 6) */
} lx_conn_ud_t;

/* Registry keys (their addresses). */
static const char lx_noenv_key = 0;

/* conn.env and the method look-up: lua/moonport/object.lua. */

static lx_lane_t *lx__ln(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

/* luaL_checkudata looks the metatable up by name in the registry on every
 * call; methods carry it as upvalue 2 instead (every method call goes
 * through here, conn:write included). */
void *lx_check_self(lua_State *L, const char *name) {
  void *ud = lua_touserdata(L, 1);
  if (ud && lua_getmetatable(L, 1)) {
    int same = lua_rawequal(L, -1, lua_upvalueindex(2));
    lua_pop(L, 1);
    if (same) return ud;
  }
  luaL_typerror(L, 1, name);
  return NULL;
}

static lx_conn_ud_t *lx__check(lua_State *L) {
  return lx_check_self(L, LX_CONN_MT);
}

/* The live connection behind argument 1, or NULL once it closed. */
static conn_t *lx__conn(lua_State *L, lx_lane_t *ln) {
  lx_conn_ud_t *ud = lx__check(L);
  return ud->uuid && !ud->gone ? reactor_conn_find(ln->r, ud->uuid) : NULL;
}

static int lx__ref_of(conn_t *c) { return (int)(intptr_t)reactor_conn_udata(c); }

bool lx_is_callable(lua_State *L, int idx) {
  if (lua_isfunction(L, idx)) return true;
  if (!lua_getmetatable(L, idx)) return false;
  lua_getfield(L, -1, "__call");
  bool ok = lua_isfunction(L, -1);
  lua_pop(L, 2);
  return ok;
}

void *lx_new_env_ud(lua_State *L, size_t size, const char *name) {
  void *ud = lua_newuserdata(L, size);
  luaL_getmetatable(L, name);
  lua_setmetatable(L, -2);
  lua_pushlightuserdata(L, (void *)&lx_noenv_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lua_setfenv(L, -2);
  return ud;
}

static void lx__new_ud(lua_State *L, sock_uuid_t uuid) {
  lx_conn_ud_t *ud = lx_new_env_ud(L, sizeof(*ud), LX_CONN_MT);
  ud->uuid = uuid;
  ud->gone = false;
}

void lx_conn_push(lua_State *L, lx_lane_t *ln, conn_t *c) {
  int ref = lx__ref_of(c);
  if (ref > 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    return;
  }
  lx__new_ud(L, reactor_conn_uuid(c));
  lua_pushvalue(L, -1);
  reactor_conn_set_udata(c, (void *)(intptr_t)luaL_ref(L, LUA_REGISTRYINDEX));
}

void lx_conn_push_closed(lua_State *L, lx_lane_t *ln) { lx__new_ud(L, 0); }

/* ---- methods ---- */

void lx_unref_release(void *ctx, void *ctx2) {
  lx_lane_t *ln = ctx;
  luaL_unref(ln->L, LUA_REGISTRYINDEX, (int)(intptr_t)ctx2);
}

static int lx_conn_write(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  conn_t *c = lx__conn(L, ln);
  size_t len;
  const char *p = luaL_checklstring(L, 2, &len);
  if (!c) return lx_push_fail(L, -EPIPE);
  int rc;
  if (len >= LX_ZERO_COPY_MIN) {
    lua_pushvalue(L, 2);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX); /* released when sent */
    rc = reactor_conn_write_ref(c, p, len, lx_unref_release, ln,
                                (void *)(intptr_t)ref);
  } else {
    rc = reactor_conn_write(c, p, len);
  }
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int lx_conn_sendfile(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  conn_t *c = lx__conn(L, ln);
  const char *path = luaL_checkstring(L, 2);
  lua_Number off = luaL_optnumber(L, 3, 0);
  lua_Number len = luaL_optnumber(L, 4, -1);
  if (off < 0) return luaL_argerror(L, 3, "offset must be >= 0");
  if (!c) return lx_push_fail(L, -EPIPE);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return lx_push_fail(L, -errno);
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    int e = errno ? errno : EISDIR;
    close(fd);
    return lx_push_fail(L, S_ISREG(st.st_mode) ? -e : -EISDIR);
  }
  if (off > (lua_Number)st.st_size) off = (lua_Number)st.st_size;
  size_t left = (size_t)st.st_size - (size_t)off;
  size_t n = len < 0 || len > (lua_Number)left ? left : (size_t)len;
  int rc = reactor_conn_sendfile(c, fd, (off_t)off, n);
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int lx_conn_close(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  conn_t *c = lx__conn(L, ln);
  if (c) {
    if (lua_toboolean(L, 2))
      reactor_conn_force_close(c, CONN_LOCAL);
    else
      reactor_conn_close(c, CONN_LOCAL);
  }
  return 0;
}

static int lx_conn_pause(lua_State *L) {
  conn_t *c = lx__conn(L, lx__ln(L));
  if (c) reactor_conn_pause(c);
  return 0;
}

static int lx_conn_resume(lua_State *L) {
  conn_t *c = lx__conn(L, lx__ln(L));
  if (c) reactor_conn_resume(c);
  return 0;
}

int lx_push_peer(lua_State *L, conn_t *c) {
  char ip[128];
  int port;
  if (!c || reactor_conn_peer(c, ip, sizeof(ip), &port)) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushstring(L, ip);
  if (strcmp(ip, "unix") == 0) {
    char path[128];
    if (sock_local_path(reactor_conn_fd(c), path, sizeof(path))) path[0] = 0;
    lua_pushstring(L, path);
  } else {
    lua_pushinteger(L, port);
  }
  return 2;
}

static int lx_conn_peer(lua_State *L) {
  return lx_push_peer(L, lx__conn(L, lx__ln(L)));
}

static int lx_conn_id(lua_State *L) {
  lx_conn_ud_t *ud = lx__check(L);
  lua_pushnumber(L, (lua_Number)ud->uuid);
  return 1;
}

void lx_push_uid(lua_State *L, lx_server_t *srv, sock_uuid_t uuid) {
  char buf[48];
  int n = snprintf(buf, sizeof(buf), "%llu-%llu", (unsigned long long)srv->serial,
                   (unsigned long long)uuid);
  lua_pushlstring(L, buf, (size_t)n);
}

static int lx_conn_uid(lua_State *L) {
  lx_conn_ud_t *ud = lx__check(L);
  lx_push_uid(L, lx__ln(L)->srv, ud->uuid);
  return 1;
}

static int lx_conn_is_open(lua_State *L) {
  conn_t *c = lx__conn(L, lx__ln(L));
  lua_pushboolean(L, c && reactor_conn_is_open(c));
  return 1;
}

static int lx_conn_pending(lua_State *L) {
  conn_t *c = lx__conn(L, lx__ln(L));
  lua_pushnumber(L, c ? (lua_Number)reactor_conn_pending_ready(c) : 0);
  return 1;
}

static int lx_conn_timeout(lua_State *L) {
  conn_t *c = lx__conn(L, lx__ln(L));
  if (lua_gettop(L) >= 2) {
    lua_Number sec = luaL_checknumber(L, 2);
    if (sec < 0 || sec > 4000000) return luaL_argerror(L, 2, "seconds out of range");
    if (c) reactor_conn_set_timeout(c, (uint32_t)(sec * 1000));
    return 0;
  }
  if (!c) return 0;
  lua_pushnumber(L, reactor_conn_timeout(c) / 1000.0);
  return 1;
}

static int lx_conn_subscribe(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  conn_t *c = lx__conn(L, ln);
  if (!c) return lx_push_fail(L, -EPIPE);
  return lx_subscribe(L, ln, 2, reactor_conn_uuid(c), NULL);
}

/* conn:tls(): {protocol, cipher, sni, alpn, resumed} of an encrypted
 * connection (lx_tls_push_info); nil for a plain one or once closed. */
static int lx_conn_tls(lua_State *L) {
  return lx_tls_push_info(L, lx__conn(L, lx__ln(L)));
}

static int lx_conn_tostring(lua_State *L) {
  lx_conn_ud_t *ud = luaL_checkudata(L, 1, LX_CONN_MT);
  lua_pushfstring(L, "moonport.conn(%f)", (lua_Number)ud->uuid);
  return 1;
}

static const luaL_Reg lx_conn_methods[] = {
    {"write", lx_conn_write},     {"sendfile", lx_conn_sendfile},
    {"close", lx_conn_close},     {"pause", lx_conn_pause},
    {"resume", lx_conn_resume},   {"peer", lx_conn_peer},
    {"id", lx_conn_id},           {"uid", lx_conn_uid},
    {"is_open", lx_conn_is_open},
    {"pending", lx_conn_pending}, {"timeout", lx_conn_timeout},
    {"subscribe", lx_conn_subscribe}, {"tls", lx_conn_tls},
    {NULL, NULL}};

void lx_meta_env(lua_State *L, lx_lane_t *ln, const char *name,
                 const luaL_Reg *methods) {
  lua_pushlightuserdata(L, (void *)&lx_noenv_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_isnil(L, -1)) { /* the placeholder environment, also core.noenv */
    lua_pushlightuserdata(L, (void *)&lx_noenv_key);
    lua_newtable(L);
    lx_embed_core(L);
    lua_pushvalue(L, -2);
    lua_setfield(L, -2, "noenv");
    lua_pop(L, 1);
    lua_rawset(L, LUA_REGISTRYINDEX);
  }
  lua_pop(L, 1);

  luaL_newmetatable(L, name);
  lx_require(L, "moonport.object");
  lua_newtable(L);
  lua_pushlightuserdata(L, ln);
  lua_pushvalue(L, -4); /* the metatable */
  luaL_setfuncs(L, methods, 2);
  lua_call(L, 1, 2);
  lua_setfield(L, -3, "__newindex");
  lua_setfield(L, -2, "__index");
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__metatable");
}

void lx_conn_open(lua_State *L, lx_lane_t *ln) {
  lx_meta_env(L, ln, LX_CONN_MT, lx_conn_methods);
  lua_pushcfunction(L, lx_conn_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}

/* ---- the protocol: connection events into Lua ---- */

static lx_service_t *lx__svc(conn_t *c) { return reactor_conn_service(c); }

/* Calls handler `ref` with the connection (and what push_more adds). */
static void lx__dispatch(conn_t *c, int ref, const char *what) {
  lx_service_t *s = lx__svc(c);
  lx_lane_t *ln = s->ln;
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, ref);
  lx_conn_push(co, ln, c);
  lx_call_on(ln, co, co_ref, 1, LX_CONN, c, NULL, what);
}

static void lx_on_open(conn_t *c) {
  lx_service_t *s = lx__svc(c);
  if (!s->client) s->conns++;
  if (s->on_open != LUA_NOREF) lx__dispatch(c, s->on_open, "on_open");
}

struct lx__data {
  conn_t *c;
  const char *data;
  size_t len;
};

static int lx__push_data(lua_State *L, void *arg) {
  struct lx__data *d = arg;
  lx_service_t *s = lx__svc(d->c);
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->on_data);
  lx_conn_push(L, s->ln, d->c);
  lua_pushlstring(L, d->data, d->len);
  return 3;
}

static void lx_on_data(conn_t *c, const char *data, size_t len) {
  lx_lane_t *ln = lx__svc(c)->ln;
  /* The string of up to 64 KiB is the allocation most likely to meet out
   * of memory: push it protected. Failing, the bytes are lost, and a
   * stream with a hole is worse than a close. */
  struct lx__data d = {c, data, len};
  int co_ref, n;
  lua_State *co = lx_co_take_push(ln, &co_ref, lx__push_data, &d, &n);
  if (!co) {
    reactor_conn_force_close(c, CONN_ERROR);
    return;
  }
  lx_call_on(ln, co, co_ref, n - 1, LX_CONN, c, NULL, "on_data");
}

static void lx_on_ready(conn_t *c) {
  lx__dispatch(c, lx__svc(c)->on_ready, "on_ready");
}

static void lx_on_timeout(conn_t *c) {
  lx__dispatch(c, lx__svc(c)->on_timeout, "on_timeout");
}

static void lx_on_shutdown(conn_t *c) {
  lx__dispatch(c, lx__svc(c)->on_shutdown, "on_shutdown");
}

/* The last event: the Lua handler gets the object on its stack, so the
 * registry anchor can go now. */
static void lx__last(conn_t *c, int ref, const char *what, const char *arg) {
  lx_service_t *s = lx__svc(c);
  lx_lane_t *ln = s->ln;
  lx_pubsub_conn_closed(ln, reactor_conn_uuid(c));
  if (ref != LUA_NOREF) {
    int co_ref;
    lua_State *co = lx_co_take(ln, &co_ref);
    lua_rawgeti(co, LUA_REGISTRYINDEX, ref);
    lx_conn_push(co, ln, c);
    lua_pushstring(co, arg);
    lx_call_on(ln, co, co_ref, 2, LX_CONN, c, NULL, what);
  }
  int udref = lx__ref_of(c);
  if (udref > 0) {
    lua_rawgeti(ln->L, LUA_REGISTRYINDEX, udref);
    lx_conn_ud_t *ud = lua_touserdata(ln->L, -1);
    if (ud) ud->gone = true;
    lua_pop(ln->L, 1);
    luaL_unref(ln->L, LUA_REGISTRYINDEX, udref);
  }
  reactor_conn_set_udata(c, NULL);
  s->conns--;
  lx_service_maybe_free(s);
}

static void lx_on_close(conn_t *c, int reason) {
  lx__last(c, lx__svc(c)->on_close, "on_close", reactor_reason_name(reason));
}

static void lx_on_fail(conn_t *c, int err) {
  char buf[128];
  /* A TLS client's handshake names its reason ("certificate verify
   * failed: ..."), which says more than EPROTO's "protocol error". */
  const char *tls_err = reactor_conn_tls_error(c);
  lx__last(c, lx__svc(c)->on_fail, "on_fail",
           tls_err ? tls_err : lx_errmsg(err, buf, sizeof(buf)));
}

/* ---- services ---- */

static int lx__handler(lua_State *L, int idx, const char *name) {
  lua_getfield(L, idx, name);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return LUA_NOREF;
  }
  if (!lua_isfunction(L, -1))
    luaL_error(L, "%s must be a function (got %s)", name, luaL_typename(L, -1));
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

static lua_Number lx__number(lua_State *L, int idx, const char *name,
                             lua_Number def, lua_Number min, lua_Number max) {
  lua_getfield(L, idx, name);
  lua_Number v = def;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER)
      luaL_error(L, "%s must be a number (got %s)", name, luaL_typename(L, -1));
    v = lua_tonumber(L, -1);
    if (v < min || v > max)
      luaL_error(L, "%s out of range (%f not in %f..%f)", name, v, min, max);
  }
  lua_pop(L, 1);
  return v;
}

lx_service_t *lx_service_new(lua_State *L, lx_lane_t *ln, int idx,
                             bool client) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  /* Options first: they raise, and nothing is allocated yet. */
  lua_Number timeout = lx__number(L, idx, "timeout", client ? 0 : 40, 0, 4e6);
  lua_Number limit = lx__number(L, idx, "write_limit",
                                (lua_Number)REACTOR_DEFAULT_WRITE_LIMIT, 1024,
                                (lua_Number)((size_t)1 << 40));
  lua_Number max_queue = lx__number(L, idx, "max_queue",
                                    (lua_Number)REACTOR_DEFAULT_MAX_QUEUE, 1024,
                                    (lua_Number)((size_t)1 << 40));
  /* on_connect sockets' read limits (0: lx_tcp.c's defaults) */
  lua_Number max_buffer = lx__number(L, idx, "max_buffer", 0, 1, 1 << 30);
  lua_Number max_line = lx__number(L, idx, "max_line", 0, 1, 1 << 30);
  static const char *const names[] = {"on_open",     "on_data",  "on_ready",
                                      "on_timeout",  "on_shutdown",
                                      "on_close",    "on_fail"};
  for (int i = 0; i < 7; i++) {
    lua_getfield(L, idx, names[i]);
    if (!lua_isnil(L, -1) && !lua_isfunction(L, -1))
      luaL_error(L, "%s must be a function (got %s)", names[i],
                 luaL_typename(L, -1));
    lua_pop(L, 1);
  }
  lx_service_t *s = calloc(1, sizeof(*s));
  if (!s) luaL_error(L, "out of memory");
  s->ln = ln;
  s->client = client;
  s->opts.timeout_ms = (uint32_t)(timeout * 1000);
  s->opts.write_limit = (size_t)limit;
  s->opts.max_queue = (size_t)max_queue;
  s->on_open = lx__handler(L, idx, "on_open");
  s->on_data = lx__handler(L, idx, "on_data");
  s->on_ready = lx__handler(L, idx, "on_ready");
  s->on_timeout = lx__handler(L, idx, "on_timeout");
  s->on_shutdown = lx__handler(L, idx, "on_shutdown");
  s->on_close = lx__handler(L, idx, "on_close");
  s->on_fail = client ? lx__handler(L, idx, "on_fail") : LUA_NOREF;
  s->on_connect = client ? LUA_NOREF : lx__handler(L, idx, "on_connect");
  s->proto.on_open = lx_on_open;
  s->proto.on_data = s->on_data != LUA_NOREF ? lx_on_data : NULL;
  s->proto.on_ready = s->on_ready != LUA_NOREF ? lx_on_ready : NULL;
  s->proto.on_timeout = s->on_timeout != LUA_NOREF ? lx_on_timeout : NULL;
  s->proto.on_shutdown = s->on_shutdown != LUA_NOREF ? lx_on_shutdown : NULL;
  s->proto.on_close = lx_on_close;
  s->proto.on_fail = lx_on_fail;
  /* The cosocket style (on_connect): lx_tcp_service_new puts its protocol
   * in; lua/moonport/mp.lua checked the options. */
  s->max_buffer = (size_t)max_buffer;
  s->max_line = (size_t)max_line;
  s->next = ln->services;
  if (s->next) s->next->prev = s;
  ln->services = s;
  return s;
}

lx_service_t *lx_service_new_server(lua_State *L, lx_lane_t *ln, int idx) {
  return lx_service_new(L, ln, idx, false);
}

void lx_service_link(lx_service_t *s) {
  lx_lane_t *ln = s->ln;
  s->prev = NULL;
  s->next = ln->services;
  if (s->next) s->next->prev = s;
  ln->services = s;
}

void lx_service_free(lx_service_t *s) {
  lx_lane_t *ln = s->ln;
  if (s->ext_free) s->ext_free(s);
  int *refs[] = {&s->on_open,     &s->on_data,  &s->on_ready, &s->on_timeout,
                 &s->on_shutdown, &s->on_close, &s->on_fail, &s->on_connect};
  for (size_t i = 0; i < sizeof(refs) / sizeof(refs[0]); i++)
    luaL_unref(ln->L, LUA_REGISTRYINDEX, *refs[i]);
  if (s->listener) reactor_listener_close(s->listener);
  if (s->shared) {
    lx_shared_detach(ln->srv, s->shared, ln->index, s);
    lx_shared_release(ln->srv, s->shared);
  }
  /* connections hold their own references to it */
  net_tls_ctx_unref(s->opts.tls);
  if (s->prev)
    s->prev->next = s->next;
  else
    ln->services = s->next;
  if (s->next) s->next->prev = s->prev;
  free(s);
  lx_lane_service_gone(ln);
}

void lx_service_maybe_free(lx_service_t *s) {
  if (s->conns > 0) return;
  if (s->client || s->closed) lx_service_free(s);
}
