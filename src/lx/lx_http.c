/* SPDX-License-Identifier: MIT */

/* lx_http: mp.http's Lua face. The HTTP protocol itself (the connection
 * state machine, keep-alive, pipelining, refusals, the access log, the
 * public folder, the WebSocket handshake) is C in src/http/server.c, and
 * every byte of a response goes through its writer (src/http/response.c:
 * the framing, HEAD/204/304, the filters); this file gives it hooks that run
 * Lua, and owns the Lua objects: each request becomes a Lua table and a
 * response object (`res`), and on_request (or websocket.on_upgrade) runs in
 * a pooled coroutine like every callback, so it may wait (mp.sleep, r:cmd,
 * req:read()). */
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "http/compress.h"
#include "http/h2_stream.h"
#include "http/http1.h"
#include "http/public.h"
#include "http/server.h"
#include "lx/lx_conn.h"
#include "lx/lx_embed.h"
#include "lx/lx_http.h"
#include "lx/lx_http_int.h"
#include "lx/lx_lane.h"
#include "lx/lx_moonport.h"
#include "lx/lx_multipart.h"
#include "lx/lx_server.h"
#include "lx/lx_stats.h"
#include "lx/lx_tls.h"
#include "lx/lx_ws.h"

#define LX_RES_MT "moonport.http.response"
#define LX_HTTP_ZERO_COPY_MIN 16384

/* Header lines a response keeps in its own userdata; more go to a buffer
 * userdata anchored in the response's environment table. Either way the
 * GC frees them with the response, so it needs no __gc (a finalizer per
 * request cost about 4 % of a hello request). The userdata is garbage of
 * every request, and LuaJIT's collector costs about 1.8 instructions per
 * byte of it: 64 holds a JSON answer's Content-Type line (32 bytes) or two
 * short lines; at 256 a hello or JSON request cost ~340 instructions more
 * (callgrind), which an answer with more lines than 64 bytes pays back
 * once, for its buffer. */
#define LX_RES_INLINE_HEADERS 64

/* The response object of one request. */
typedef struct {
  http_head_t h;   /* status, head_only, keep_alive, http10, has_type and
                      the header lines (h.headers == hbuf, h.hlen) */
  sock_uuid_t uuid; /* its connection */
  uint64_t xid;     /* its exchange (http_exchange_t.id) */
  lx_lane_t *ln;
  bool started;    /* the head is sent (streaming) */
  bool done;       /* the response is complete */
  bool upgrade;    /* of a WebSocket upgrade (websocket.on_upgrade) */
  size_t hcap;
  char *hbuf;      /* "Name: value\r\n" lines the handler set: `inline_h`
                      or a buffer userdata (see LX_RES_INLINE_HEADERS) */
  char inline_h[LX_RES_INLINE_HEADERS];
} lx_res_t;

static lx_http_cfg_t *lx__cfg(lx_service_t *s) { return s->ext; }

/* The row's slot (lx_module.h): set by the runner before the first lane,
 * read-only after. */
int lx_http_slot = -1;

static lx_http_lane_t *lx__hl(const lx_lane_t *ln) {
  return lx_lane_state(ln, lx_http_slot);
}

void lx_http_lane_free(lx_lane_t *ln) {
  http_cache_free(lx__hl(ln)->cache);
  lx__hl(ln)->cache = NULL;
  http_h2_pool_free(lx__hl(ln)->h2_pool); /* (the lane's sessions are gone) */
  lx__hl(ln)->h2_pool = NULL;
}

/* ---- the protocol: src/http's, with Lua's on_open and on_close ---- */

static void lx_http_on_open(conn_t *c) {
  lx_service_t *s = reactor_conn_service(c);
  s->conns++;
  http_server_accept(&lx__cfg(s)->srv, c);
}

static void lx_http_on_close(conn_t *c, int reason) {
  lx_hconn_t *hc = reactor_conn_udata(c);
  lx_service_t *s = reactor_conn_service(c);
  if (hc && hc->h.x.reading) {
    hc->h.x.body_err = "closed";
    if (s->ln->closing) {
      hc->h.x.reading = false;
      lx_run_abandon(s->ln, &hc->reader);
    } else {
      hc->h.srv->on_body(&hc->h.x);
    }
  }
  if (hc) free(hc->up_headers);
  http_conn_closed(c, hc ? &hc->h : NULL, reason);
  s->conns--;
  lx_service_maybe_free(s);
}

/* ---- requests into Lua ---- */

/* The request and headers metatables are lua/moonport/request.lua and
 * headers.lua. */

/* uid(conn_id): the connection's server-wide id (lx_push_uid). */
static int lx_req_uid(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_push_uid(L, ln->srv, (sock_uuid_t)luaL_checknumber(L, 1));
  return 1;
}

/* unescape(s): a form field decoded ('+' is a space); s as it is if it
 * holds a bad escape. */
static int lx_req_unescape(lua_State *L) {
  size_t n;
  const char *s = luaL_checklstring(L, 1, &n);
  if (!memchr(s, '%', n) && !memchr(s, '+', n)) {
    lua_settop(L, 1);
    return 1;
  }
  char *out = malloc(n ? n : 1);
  if (!out) return luaL_error(L, "out of memory");
  ssize_t dl = http_unescape(s, n, out, true);
  if (dl < 0) lua_pushlstring(L, s, n);
  else lua_pushlstring(L, out, (size_t)dl);
  free(out);
  return 1;
}

/* The connection of the request table at 1 (its conn_id), or NULL once
 * it is gone. Upvalue 1: the lane. */
static conn_t *lx__req_conn(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "conn_id");
  sock_uuid_t uuid = (sock_uuid_t)lua_tonumber(L, -1);
  lua_pop(L, 1);
  return uuid ? reactor_conn_find(ln->r, uuid) : NULL;
}

/* req:peer(): ip, port of the client (as conn:peer()), nil once gone. */
static int lx_req_peer(lua_State *L) {
  return lx_push_peer(L, lx__req_conn(L));
}

/* req:tls(): conn:tls()'s table for the request's connection; nil over
 * plain HTTP, or once the connection is gone. */
static int lx_req_tls(lua_State *L) {
  return lx_tls_push_info(L, lx__req_conn(L));
}

/* Pushes version string v (cfg's cache of them). */
static void lx__push_version(lua_State *L, lx_http_cfg_t *cfg, const char *v) {
  for (int i = 0; i < 3; i++) {
    if (cfg->vkey[i] == v) {
      lua_rawgeti(L, LUA_REGISTRYINDEX, cfg->vref[i]);
      return;
    }
    if (!cfg->vkey[i]) {
      lua_pushstring(L, v);
      lua_pushvalue(L, -1);
      cfg->vref[i] = luaL_ref(L, LUA_REGISTRYINDEX);
      cfg->vkey[i] = v;
      return;
    }
  }
  lua_pushstring(L, v);
}

/* Pushes the request's parts, the arguments of the Lua request builder
 * (lua/moonport/http.lua): method, path (decoded), query, target, the
 * exchange's version ("1.1"), headers (a table of lower-case names;
 * repeated fields joined with ", "), body (nil: streamed, read with
 * req:read()), conn_id and the exchange's id. The table itself
 * is made in Lua, where a constructor with constant keys is one template
 * copy instead of a hashed lua_setfield per field. False for a path that
 * doesn't decode (nothing pushed). */
#define LX_REQ_PARTS 9
static bool lx__push_req_parts(lua_State *L, lx_hconn_t *hc, const char *body,
                               size_t blen) {
  http_request_t *r = hc->h.x.req;
  const char *t, *q;
  size_t plen, qlen;
  http_target_split(r->target, r->target_len, &t, &plen, &q, &qlen);
  /* A long path decodes into a userdata (the GC owns it: a push that
   * raises for lack of memory leaks nothing), removed once it is pushed. */
  char stack[1024];
  int top = lua_gettop(L);
  char *path = plen <= sizeof(stack) ? stack : lua_newuserdata(L, plen);
  ssize_t dl = http_unescape(t, plen, path, false);
  if (dl < 0 || memchr(path, 0, (size_t)dl)) {
    lua_settop(L, top);
    return false;
  }
  lua_pushlstring(L, path, (size_t)dl);
  if (path != stack) lua_remove(L, -2);
  lua_pushlstring(L, r->method, r->method_len);
  lua_insert(L, -2); /* the method first, then the path */
  if (q)
    lua_pushlstring(L, q, qlen);
  else
    lua_pushliteral(L, "");
  /* a target without a query or an escape is the path: the same string,
   * not another look-up in the string table */
  size_t pl;
  const char *ps = lua_tolstring(L, -2, &pl);
  if (!q && pl == r->target_len && memcmp(ps, r->target, pl) == 0)
    lua_pushvalue(L, -2);
  else
    lua_pushlstring(L, r->target, r->target_len);
  lx__push_version(L, lx__cfg(lx_http_svc(hc)), hc->h.x.version);
  lua_createtable(L, 0, r->nheaders);
  char name[256];
  for (int i = 0; i < r->nheaders; i++) {
    const http_header_t *h = &r->headers[i];
    size_t n = h->name_len < sizeof(name) ? h->name_len : sizeof(name) - 1;
    for (size_t k = 0; k < n; k++) {
      char ch = h->name[k];
      name[k] = ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
    }
    lua_pushlstring(L, name, n);
    lua_pushvalue(L, -1);
    lua_rawget(L, -3);
    if (lua_isstring(L, -1)) {
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, h->value, h->value_len);
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, h->value, h->value_len);
    }
    lua_rawset(L, -3);
  }
  if (body)
    lua_pushlstring(L, body, blen);
  else
    lua_pushnil(L);
  lua_pushnumber(L, (lua_Number)hc->h.uuid);
  lua_pushnumber(L, (lua_Number)hc->h.x.id);
  return true;
}

/* Registry key of the request builder (the second value of
 * lua/moonport/http.lua). */
static const char lx_req_build_key = 0;

/* Pushes the request table. */
static bool lx__push_req(lua_State *L, lx_hconn_t *hc, const char *body,
                         size_t blen) {
  lua_pushlightuserdata(L, (void *)&lx_req_build_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (!lx__push_req_parts(L, hc, body, blen)) {
    lua_pop(L, 1);
    return false;
  }
  lua_call(L, LX_REQ_PARTS, 1);
  return true;
}

/* The response metatable, also under this registry key (a light userdata
 * look-up, not a string's). */
static const char lx_res_mt_key = 0;

static lx_res_t *lx__push_res(lua_State *L, lx_lane_t *ln, conn_t *c,
                              lx_hconn_t *hc) {
  lx_res_t *res = lua_newuserdata(L, sizeof(*res));
  memset(res, 0, offsetof(lx_res_t, inline_h));
  res->h = http_exchange_head(&hc->h.x, 200);
  res->xid = hc->h.x.id;
  res->hbuf = res->inline_h;
  res->h.headers = res->hbuf;
  res->hcap = sizeof(res->inline_h);
  res->uuid = reactor_conn_uuid(c);
  res->ln = ln;
  lua_pushlightuserdata(L, (void *)&lx_res_mt_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lua_setmetatable(L, -2);
  return res;
}

/* Registry key of the Lua wrapper that builds the request from its parts
 * (lx__push_req_parts), runs the handler and then finishes its response
 * (or answers 500 for an error). The chunk gets the request and headers
 * metatables and returns the runner and the builder. */
static const char lx_runner_key = 0;
/* ... and of the wrapper of websocket.on_upgrade: it accepts the upgrade
 * (res:_upgrade) unless the handler answered. */
static const char lx_upgrade_key = 0;

static bool lx__push_upgrade_req(lua_State *L, void *arg) {
  return lx__push_req(L, arg, "", 0);
}

/* A run's function and arguments: the runner (on_request's, or
 * websocket.on_upgrade's), the handler, the response and the request's
 * parts (lx_co_take_push's push; -1 for a target that doesn't decode). */
struct lx__req_args {
  conn_t *c;
  lx_hconn_t *hc;
  const char *body;
  size_t blen;
  const char *runner_key; /* &lx_runner_key or &lx_upgrade_key */
  int handler;            /* registry ref */
};

static int lx__push_run(lua_State *L, void *arg) {
  struct lx__req_args *ra = arg;
  lx_service_t *s = lx_http_svc(ra->hc);
  int top = lua_gettop(L);
  lua_pushlightuserdata(L, (void *)ra->runner_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lua_rawgeti(L, LUA_REGISTRYINDEX, ra->handler);
  lx__push_res(L, s->ln, ra->c, ra->hc)->upgrade = ra->runner_key == &lx_upgrade_key;
  if (!lx__push_req_parts(L, ra->hc, ra->body, ra->blen)) {
    lua_settop(L, top);
    return -1;
  }
  return 3 + LX_REQ_PARTS;
}

/* Runs `handler` for the request in hand through the runner at
 * `runner_key`, in a pooled coroutine. The pushes are protected: out of
 * memory there fails this request (500) instead of panicking the process
 * (issue 16, item 13); a target that doesn't decode is a 400. */
/* inlined: its one hot caller is on_request, every request */
static inline __attribute__((always_inline)) void
lx__run(conn_t *c, lx_hconn_t *hc, const char *body, size_t blen,
        const char *runner_key, int handler, const char *what) {
  lx_lane_t *ln = lx_http_svc(hc)->ln;
  struct lx__req_args ra = {c, hc, body, blen, runner_key, handler};
  int co_ref, n;
  lua_State *co = lx_co_take_push(ln, &co_ref, lx__push_run, &ra, &n);
  if (!co) {
    http_exchange_refuse(&hc->h.x, n == -ENOMEM ? 500 : 400);
    return;
  }
  /* the server set HTTP_C_BUSY and no timeout: the handler takes what it
   * takes */
  lx_call_on(ln, co, co_ref, 2 + LX_REQ_PARTS, LX_CONN, c, NULL, what);
}

static void lx__upgrade_accept(conn_t *c, lx_hconn_t *hc);

/* The server's on_upgrade: a valid WebSocket handshake. Accepted now
 * when there is no websocket.on_upgrade; otherwise it decides before
 * anything is sent: it refuses by answering (res:status(403):send()), or
 * returns to accept. */
static void lx__on_upgrade(http_exchange_t *x) {
  lx_hconn_t *hc = (lx_hconn_t *)x->conn;
  conn_t *c = x->conn->c;
  lx_http_cfg_t *cfg = lx__cfg(lx_http_svc(hc));
  int hook = lx_ws_cfg_on_upgrade(cfg->ws);
  if (hook == LUA_NOREF) {
    lx__upgrade_accept(c, hc);
    return;
  }
  lx__run(c, hc, "", 0, &lx_upgrade_key, hook, "on_upgrade");
}

/* The upgrade is accepted: the 101 (with on_upgrade's header lines, if
 * any) goes out and the connection becomes a WebSocket stream (lx_ws). */
static void lx__upgrade_accept(conn_t *c, lx_hconn_t *hc) {
  lx_service_t *s = lx_http_svc(hc);
  lx_stream_t *st = lx_ws_new(s->ln, c, lx__cfg(s)->ws);
  if (!st) {
    http_exchange_refuse(&hc->h.x, 500);
    return;
  }
  /* permessage-deflate: the answer's line goes with on_upgrade's */
  const http_header_t *ext =
      http_header(hc->h.x.req, "sec-websocket-extensions");
  char resp[192];
  size_t rl = lx_ws_negotiate(st, ext ? ext->value : NULL,
                              ext ? ext->value_len : 0, resp, sizeof(resp));
  if (rl) {
    static const char name[] = "Sec-WebSocket-Extensions: ";
    size_t add = sizeof(name) - 1 + rl + 2;
    char *h = realloc(hc->up_headers, hc->up_hlen + add);
    if (h) {
      memcpy(h + hc->up_hlen, name, sizeof(name) - 1);
      memcpy(h + hc->up_hlen + sizeof(name) - 1, resp, rl);
      memcpy(h + hc->up_hlen + add - 2, "\r\n", 2);
      hc->up_headers = h;
      hc->up_hlen += add;
    } else {
      lx_ws_negotiate(st, NULL, 0, resp, 0); /* leaves it off: plain */
    }
  }
  const char *rest;
  size_t rest_len;
  http_res_upgrade(&hc->h.x, hc->up_headers, hc->up_hlen, &lx_stream_ops, st,
                   &rest, &rest_len);
  free(hc->up_headers);
  hc->up_headers = NULL;
  hc->up_hlen = 0;
  lx_ws_begin(c, st, lx__push_upgrade_req, hc, rest, rest_len);
  /* The request's bytes are not needed any more. */
  http_conn_drop_request(&hc->h);
}

/* Runs as the connection's callback after on_upgrade accepted. */
static void lx__upgrade_go(conn_t *c, void *arg) {
  lx_hconn_t *hc = c ? reactor_conn_udata(c) : NULL;
  if (!hc || hc->h.state != HTTP_C_BUSY || !hc->up_accept) return;
  hc->up_accept = false;
  lx__upgrade_accept(c, hc);
}

/* The server's on_request: run on_request. */
static void lx__on_request(http_exchange_t *x, const char *body, size_t blen) {
  lx_hconn_t *hc = (lx_hconn_t *)x->conn;
  conn_t *c = x->conn->c;
  lx__run(c, hc, body, blen, &lx_runner_key,
          lx__cfg(lx_http_svc(hc))->on_request, "on_request");
}

/* The server's on_metrics: `status`, in the Prometheus text format. */
static char *lx__metrics(http_server_t *srv, size_t *n) {
  lx_service_t *s = srv->app;
  return lx_stats_prometheus(s->ln->srv, n);
}

/* ---- the response object ---- */

/* The response at stack index 1 (lx_check_self: the methods carry the
 * metatable as upvalue 2). */
static lx_res_t *lx__res(lua_State *L) {
  return lx_check_self(L, LX_RES_MT);
}

/* The connection of a response whose exchange is still in flight, or
 * NULL (a `res` kept past its response finds nothing, not the next
 * request's exchange on the same connection). */
static conn_t *lx__res_conn(lx_res_t *res, lx_hconn_t **hc) {
  conn_t *c = reactor_conn_find(res->ln->r, res->uuid);
  http_exchange_t *x = http_exchange_find(c, res->xid);
  *hc = x ? (lx_hconn_t *)x->conn : NULL;
  return x ? c : NULL;
}

/* Sets the status from stack index idx (res:status, res:json's second
 * argument). */
static void lx__set_status(lua_State *L, lx_res_t *res, int idx) {
  lua_Integer s = luaL_checkinteger(L, idx);
  if (s < 100 || s > 999) luaL_argerror(L, idx, "status must be 100..999");
  if (res->started || res->done)
    luaL_error(L, "res:status: the response is already sent");
  res->h.status = (int)s;
}

static int lx_res_status(lua_State *L) {
  lx__set_status(L, lx__res(L), 2);
  lua_settop(L, 1);
  return 1;
}

bool lx_http_header_ok(const char *s, size_t n, bool name) {
  if (n == 0 && name) return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '\r' || ch == '\n' || ch == 0) return false;
    if (name && (ch <= ' ' || ch == ':' || ch >= 0x7f)) return false;
  }
  return true;
}

static void lx__add_header(lua_State *L, lx_res_t *res, const char *k,
                           size_t kl, const char *v, size_t vl) {
  size_t need = res->h.hlen + kl + vl + 4;
  if (need > res->hcap) { /* the response is at stack index 1 */
    size_t cap = res->hcap * 2;
    while (cap < need) cap *= 2;
    char *p = lua_newuserdata(L, cap);
    memcpy(p, res->hbuf, res->h.hlen);
    lua_createtable(L, 1, 0);
    lua_insert(L, -2);
    lua_rawseti(L, -2, 1);
    lua_setfenv(L, 1);
    res->hbuf = p;
    res->h.headers = p;
    res->hcap = cap;
  }
  memcpy(res->hbuf + res->h.hlen, k, kl);
  memcpy(res->hbuf + res->h.hlen + kl, ": ", 2);
  memcpy(res->hbuf + res->h.hlen + kl + 2, v, vl);
  memcpy(res->hbuf + res->h.hlen + kl + 2 + vl, "\r\n", 2);
  res->h.hlen = need;
  if (kl == 12 && strncasecmp(k, "content-type", 12) == 0) res->h.has_type = true;
}

/* Raises "bad argument #n to 'fn' (msg)" at the caller's line, n counted
 * as the caller wrote the call (res:header(name, value): the name is #1),
 * whether it came as a method or through a local copy of the function
 * (luaL_argerror would say '?' then). */
static int lx__badarg(lua_State *L, const char *fn, int n, const char *msg) {
  luaL_where(L, 1);
  lua_pushfstring(L, "bad argument #%d to '%s' (%s)", n, fn, msg);
  lua_concat(L, 2);
  return lua_error(L);
}

/* The string (or number) at idx, else raises as lx__badarg. */
static const char *lx__checkstr(lua_State *L, int idx, const char *fn, int n,
                                size_t *len) {
  int t = lua_type(L, idx);
  if (t != LUA_TSTRING && t != LUA_TNUMBER)
    lx__badarg(
        L, fn, n,
        lua_pushfstring(L, "string expected, got %s",
                        t == LUA_TNONE ? "no value" : lua_typename(L, t)));
  return lua_tolstring(L, idx, len);
}

static int lx_res_header(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t kl, vl;
  const char *k = lx__checkstr(L, 2, "res:header", 1, &kl);
  const char *v = lx__checkstr(L, 3, "res:header", 2, &vl);
  if (res->started || res->done)
    return luaL_error(L, "res:header: the response is already sent");
  if (!lx_http_header_ok(k, kl, true))
    return lx__badarg(L, "res:header", 1, "not a valid header name");
  if (!lx_http_header_ok(v, vl, false))
    return lx__badarg(L, "res:header", 2,
                      "a header value can't hold CR, LF or NUL");
  if ((kl == 14 && strncasecmp(k, "content-length", 14) == 0) ||
      (kl == 17 && strncasecmp(k, "transfer-encoding", 17) == 0))
    return lx__badarg(L, "res:header", 1, "moonport sets this header itself");
  lx__add_header(L, res, k, kl, v, vl);
  lua_settop(L, 1);
  return 1;
}

/* Hands the Lua string at idx (p, n bytes) to `send` (http_res_send's
 * or http_res_write's tail): a long one by reference (the registry keeps
 * it until the writer is done with it), a short one to be copied. */
typedef struct {
  sock_release_fn release;
  void *ctx, *ctx2;
} lx_body_ref_t;

static lx_body_ref_t lx__body_ref(lua_State *L, lx_res_t *res, int idx,
                                  size_t n) {
  lx_body_ref_t r = {NULL, NULL, NULL};
  if (n >= LX_HTTP_ZERO_COPY_MIN) {
    lua_pushvalue(L, idx);
    r.release = lx_unref_release;
    r.ctx = res->ln;
    r.ctx2 = (void *)(intptr_t)luaL_ref(L, LUA_REGISTRYINDEX);
  }
  return r;
}

/* The response is complete (the writer completed the exchange). */
static void lx__done(lx_res_t *res) {
  res->done = true;
  res->h.hlen = 0;
}

static int lx_res_send(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t n = 0;
  const char *body = lua_isnoneornil(L, 2) ? "" : luaL_checklstring(L, 2, &n);
  if (res->done || res->started)
    return luaL_error(L, "res:send: the response is already sent");
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) {
    res->done = true;
    return lx_push_fail(L, -EPIPE);
  }
  /* 1xx, 204 and 304 have no body (RFC 9110 6.4.1): the writer drops it */
  lx_body_ref_t ref = lx__body_ref(L, res, 2, n);
  int rc =
      http_res_send(&hc->h.x, &res->h, body, n, ref.release, ref.ctx, ref.ctx2);
  lx__done(res);
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static const char lx_json_encode_key = 0;

static int lx_res_json(lua_State *L) {
  lx_res_t *res = lx__res(L);
  luaL_checkany(L, 2);
  if (!lua_isnoneornil(L, 3)) lx__set_status(L, res, 3);
  /* mp.json.encode (lua/moonport/json.lua), looked up once per lane */
  lua_pushlightuserdata(L, (void *)&lx_json_encode_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    lx_require(L, "moonport.json");
    lua_getfield(L, -1, "encode");
    lua_remove(L, -2);
    lua_pushlightuserdata(L, (void *)&lx_json_encode_key);
    lua_pushvalue(L, -2);
    lua_rawset(L, LUA_REGISTRYINDEX);
  }
  lua_pushvalue(L, 2);
  lua_call(L, 1, 1);
  if (!res->h.has_type && !res->started && !res->done)
    lx__add_header(L, res, "Content-Type", 12, "application/json", 16);
  lua_replace(L, 2);
  lua_settop(L, 2);
  return lx_res_send(L);
}

static int lx_res_redirect(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t ul;
  const char *url = luaL_checklstring(L, 2, &ul);
  lua_Integer status = luaL_optinteger(L, 3, 302);
  if (status < 300 || status > 399) return luaL_argerror(L, 3, "a 3xx status");
  if (!lx_http_header_ok(url, ul, false)) return luaL_argerror(L, 2, "bad URL");
  if (res->started || res->done)
    return luaL_error(L, "res:redirect: the response is already sent");
  res->h.status = (int)status;
  lx__add_header(L, res, "Location", 8, url, ul);
  lua_settop(L, 1);
  return lx_res_send(L);
}

/* res:write(chunk): streams the body (chunked). */
static int lx_res_write(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  if (res->done) return luaL_error(L, "res:write: the response is finished");
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) return lx_push_fail(L, -EPIPE);
  int rc = 0;
  if (!res->started) {
    res->started = true;
    rc = http_res_head(&hc->h.x, &res->h, -1); /* chunked (or until close) */
  }
  if (!rc) {
    lx_body_ref_t ref = lx__body_ref(L, res, 2, n);
    rc = http_res_write(&hc->h.x, p, n, ref.release, ref.ctx, ref.ctx2);
  }
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* res:finish(): ends a streamed body (or sends an empty response). */
static int lx_res_finish(lua_State *L) {
  lx_res_t *res = lx__res(L);
  if (res->done) return 0;
  if (!res->started) {
    lua_settop(L, 1);
    return lx_res_send(L);
  }
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) {
    res->done = true;
    return 0;
  }
  http_res_end(&hc->h.x, NULL, 0);
  lx__done(res);
  return 0;
}

static int lx_res_sendfile(lua_State *L) {
  lx_res_t *res = lx__res(L);
  const char *path = luaL_checkstring(L, 2);
  if (res->done || res->started)
    return luaL_error(L, "res:sendfile: the response is already sent");
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) return lx_push_fail(L, -EPIPE);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    int e = fd < 0 ? errno : EISDIR;
    if (fd >= 0) close(fd);
    return lx_push_fail(L, -e);
  }
  int rc = http_res_sendfile(&hc->h.x, &res->h, fd, 0, (uint64_t)st.st_size);
  lx__done(res); /* the writer took fd */
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* res:sse([handlers]): the response becomes a stream of Server-Sent
 * Events; returns its object. */
static int lx_res_sse(lua_State *L) {
  lx_res_t *res = lx__res(L);
  int opts = 0;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    opts = 2;
    static const char *const names[] = {"on_open", "on_close"};
    for (int i = 0; i < 2; i++) {
      lua_getfield(L, 2, names[i]);
      if (!lua_isnil(L, -1) && !lua_isfunction(L, -1))
        return luaL_error(L, "res:sse: %s must be a function", names[i]);
      lua_pop(L, 1);
    }
  }
  if (res->done || res->started)
    return luaL_error(L, "res:sse: the response is already sent");
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) {
    res->done = true;
    return lx_push_fail(L, -EPIPE);
  }
  const http_header_t *last = http_header(hc->h.x.req, "last-event-id");
  /* compressed through a gzip or br stream of its own, flushed at each
   * event: SSE bypasses the writer's filters (http_res_sse) */
  lx_http_cfg_t *cfg = (lx_http_cfg_t *)hc->h.srv;
  http_gz_t *gz = NULL;
  if (cfg->compress && !res->h.no_compress) {
    lx__add_header(L, res, "Vary", 4, "Accept-Encoding", 15);
    int coding = http_compress_stream_pick(&cfg->comp, &hc->h.x, &res->h);
    if (coding != HTTP_CODING_IDENTITY) {
      gz = http_gz_new(coding, cfg->comp.level);
      if (!gz) return luaL_error(L, "out of memory");
      bool br = coding == HTTP_CODING_BR;
      lx__add_header(L, res, "Content-Encoding", 16, br ? "br" : "gzip",
                     br ? 2 : 4);
    }
  }
  lx_stream_t *st = lx_sse_new(L, res->ln, c, opts, last ? last->value : NULL,
                               last ? last->value_len : 0, gz);
  if (!st) return luaL_error(L, "out of memory");
  if (hc->h.x.req->h2) { /* one stream of the connection; the rest go on */
    int32_t sid = http_h2_stream_open(&hc->h.x, &res->h, &lx_stream_ops, st);
    res->done = true;
    res->h.hlen = 0;
    if (sid < 0) {
      lx_stream_ops.on_closed(c, st, CONN_ERROR); /* frees it */
      return lx_push_fail(L, sid);
    }
    lx_sse_set_stream(st, sid);
    lx_sse_begin(c, st);
    lx_stream_push(L, st);
    /* The exchange is over: a handler that goes on (sends, sleeps) must
     * not hold the connection's other streams. */
    lx_run_detach(res->ln, c);
    return 1;
  }
  /* The stream ends with the connection: nothing more is read as HTTP. */
  int rc = http_res_sse(&hc->h.x, &res->h, &lx_stream_ops, st); /* logs it */
  res->done = true;
  res->h.hlen = 0;
  lx_sse_begin(c, st);
  http_conn_drop_request(&hc->h); /* the request's bytes are not needed */
  lx_stream_push(L, st);
  if (rc) reactor_conn_close(c, CONN_ERROR);
  /* nor the stream's own callbacks (on_open, subscribers), which would
   * wait for the handler to end */
  lx_run_detach(res->ln, c);
  return 1;
}

/* res:compress(on): whether this response may be compressed (mp.http's
 * compress setting decides the rest). */
static int lx_res_compress(lua_State *L) {
  lx_res_t *res = lx__res(L);
  luaL_checkany(L, 2);
  if (res->started || res->done)
    return luaL_error(L, "res:compress: the response is already sent");
  res->h.no_compress = !lua_toboolean(L, 2);
  lua_settop(L, 1);
  return 1;
}

/* res:sent(): whether the response (or its head) went out, so that
 * middleware knows a handler answered. */
static int lx_res_sent(lua_State *L) {
  lx_res_t *res = lx__res(L);
  lua_pushboolean(L, res->done || res->started);
  return 1;
}

/* The same for lua/moonport/router.lua through the FFI (a call the JIT
 * compiles, where res:sent() ends the trace): `res` is the payload of a
 * response userdata, which the caller checked by its metatable. */
int lx_res_sent_ffi(const void *res);
int lx_res_sent_ffi(const void *res) {
  const lx_res_t *r = res;
  return r->done || r->started;
}

/* After the handler returned: a response it did not finish is finished
 * now (an empty one with its status if it sent nothing). */
/* res:_status(): the status sent (or to be sent), for the route timing. */
static int lx_res_status_get(lua_State *L) {
  lua_pushinteger(L, lx__res(L)->h.status);
  return 1;
}

static int lx_res_done(lua_State *L) {
  lx_res_t *res = lx__res(L);
  if (res->done) return 0;
  /* An exchange that is over already (up:proxy answered it from C, or
   * the client went away): nothing to finish. Seen here, before
   * lx_res_send, which would look it up again and push an error nobody
   * reads (about 700 instructions of every proxied request). */
  lx_hconn_t *hc;
  if (!lx__res_conn(res, &hc)) {
    res->done = true;
    return 0;
  }
  lx_res_finish(L);
  return 0;
}

/* res:_id(id): the request's id, for its access-log line (the caller
 * checked it: lua/moonport/request.lua). */
static int lx_res_id(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t n;
  const char *id = luaL_checklstring(L, 2, &n);
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (c && n <= HTTP_LOG_ID_MAX && lx_http_header_ok(id, n, true)) {
    memcpy(hc->h.x.log_id, id, n);
    hc->h.x.log_id_len = (uint8_t)n;
  }
  return 0;
}

/* Drops the Content-Type lines of the headers the handler set (its 500
 * keeps the others: a request id, a cookie). */
static void lx__drop_type(lx_res_t *res) {
  size_t out = 0, at = 0;
  while (at < res->h.hlen) {
    const char *nl = memchr(res->hbuf + at, '\n', res->h.hlen - at);
    size_t len = (size_t)(nl - (res->hbuf + at)) + 1;
    if (!(len > 13 && strncasecmp(res->hbuf + at, "content-type:", 13) == 0)) {
      memmove(res->hbuf + out, res->hbuf + at, len);
      out += len;
    }
    at += len;
  }
  res->h.hlen = out;
  res->h.has_type = false;
}

/* res:_drop_type(): an error page replaces the handler's Content-Type. */
static int lx_res_drop_type(lua_State *L) {
  lx_res_t *res = lx__res(L);
  if (!res->started && !res->done) lx__drop_type(res);
  lua_settop(L, 1);
  return 1;
}

/* The handler failed (res:_fail(err [, id])): the trace goes to the log
 * with the request's method, target, client and id; the client gets a
 * 500 if nothing was sent yet (else the connection closes). */
static int lx_res_fail(lua_State *L) {
  lx_res_t *res = lx__res(L);
  const char *err = luaL_optstring(L, 2, "?");
  const char *id = luaL_optstring(L, 3, "-");
  const char *what = res->upgrade ? "websocket on_upgrade" : "on_request";
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  char ip[128];
  int port = 0;
  if (!c || reactor_conn_peer(c, ip, sizeof(ip), &port)) strcpy(ip, "-");
  const http_request_t *r = c ? hc->h.x.req : NULL;
  if (r)
    log_error("error in %s: %.*s %.*s from %s:%d (request id %s): %s", what,
              (int)r->method_len, r->method,
              (int)(r->target_len > 512 ? 512 : r->target_len), r->target, ip,
              port, id, err);
  else
    log_error("error in %s: (request id %s): %s", what, id, err);
  if (res->done || !c) return 0;
  if (res->started) {
    res->done = true;
    hc->h.state = HTTP_C_CLOSING;
    reactor_conn_force_close(c, CONN_ERROR);
    return 0;
  }
  res->h.status = 500;
  lx__drop_type(res);
  lua_settop(L, 1);
  lua_pushliteral(L, "Internal Server Error\n");
  return lx_res_send(L);
}

/* Adds header lines from the table at idx ({ name = value, ... }), with
 * the checks of res:header; raises on a bad one. */
static void lx__upgrade_headers(lua_State *L, lx_res_t *res, int idx) {
  lua_pushnil(L);
  while (lua_next(L, idx)) {
    size_t kl, vl;
    if (lua_type(L, -2) != LUA_TSTRING ||
        (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER))
      luaL_error(L, "websocket on_upgrade: headers must map names to strings");
    const char *k = lua_tolstring(L, -2, &kl);
    const char *v = lua_tolstring(L, -1, &vl);
    if (!lx_http_header_ok(k, kl, true) || !lx_http_header_ok(v, vl, false))
      luaL_error(L, "websocket on_upgrade: a bad header name or value (%s)", k);
    lx__add_header(L, res, k, kl, v, vl);
    lua_pop(L, 1);
  }
}

/* res:_upgrade(v): what websocket.on_upgrade returned. If the handler
 * answered, the upgrade is refused and that answer stands; otherwise it
 * is accepted, with v's subprotocol (one the client offered) and header
 * lines, and the 101 goes out as the connection's next callback. Raises
 * on a bad v (the wrapper answers 500). */
static int lx_res_upgrade(lua_State *L) {
  lx_res_t *res = lx__res(L);
  if (!res->upgrade) return luaL_error(L, "res:_upgrade: not an upgrade");
  if (res->started) return lx_res_finish(L); /* a streamed refusal */
  if (res->done) return 0;
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) return 0;
  if (!lua_isnil(L, 2)) {
    if (!lua_istable(L, 2))
      return luaL_error(L, "websocket on_upgrade: return nothing or a table "
                           "{ protocol =, headers = } (got %s)",
                        luaL_typename(L, 2));
    lua_getfield(L, 2, "protocol");
    if (!lua_isnil(L, -1)) {
      size_t n;
      const char *p = lua_tolstring(L, -1, &n);
      if (lua_type(L, -1) != LUA_TSTRING)
        return luaL_error(L, "websocket on_upgrade: protocol must be a string");
      if (!http_ws_offered(hc->h.x.req, p, n))
        return luaL_error(L, "websocket on_upgrade: the client did not offer "
                             "the protocol '%s'", p);
      lx__add_header(L, res, "Sec-WebSocket-Protocol", 22, p, n);
    }
    lua_pop(L, 1);
    lua_getfield(L, 2, "headers");
    if (lua_istable(L, -1))
      lx__upgrade_headers(L, res, lua_gettop(L));
    else if (!lua_isnil(L, -1))
      return luaL_error(L, "websocket on_upgrade: headers must be a table");
    lua_pop(L, 1);
  }
  if (res->h.hlen) {
    hc->up_headers = malloc(res->h.hlen);
    if (!hc->up_headers) return luaL_error(L, "out of memory");
    memcpy(hc->up_headers, res->hbuf, res->h.hlen);
    hc->up_hlen = res->h.hlen;
  }
  res->done = true;
  res->h.hlen = 0;
  hc->up_accept = true;
  if (reactor_conn_task(c, lx__upgrade_go, NULL)) {
    hc->h.state = HTTP_C_CLOSING;
    reactor_conn_force_close(c, CONN_ERROR);
  }
  return 0;
}

static const luaL_Reg lx_res_methods[] = {{"status", lx_res_status},
                                          {"header", lx_res_header},
                                          {"send", lx_res_send},
                                          {"json", lx_res_json},
                                          {"write", lx_res_write},
                                          {"finish", lx_res_finish},
                                          {"redirect", lx_res_redirect},
                                          {"sendfile", lx_res_sendfile},
                                          {"sse", lx_res_sse},
                                          {"sent", lx_res_sent},
                                          {"compress", lx_res_compress},
                                          {"_id", lx_res_id},
                                          {"_drop_type", lx_res_drop_type},
                                          {"_done", lx_res_done},
                                          {"_fail", lx_res_fail},
                                          {"_status", lx_res_status_get},
                                          {"_upgrade", lx_res_upgrade},
                                          {NULL, NULL}};

/* ---- mp.http ---- */

/* The service of one mp.http: its settings from lx_http_opts.c, the hooks
 * that run Lua from here. */
static lx_service_t *lx__http_service(lua_State *L, lx_lane_t *ln, int idx) {
  lx_service_t *s = lx_http_service_new(L, ln, idx);
  lx_http_cfg_t *cfg = s->ext;
  http_server_t *hs = &cfg->srv;
  s->proto = http_server_proto(lx_http_on_open, lx_http_on_close);
  hs->cache = &lx__hl(ln)->cache;
  hs->h2_pool = &lx__hl(ln)->h2_pool;
  hs->conn_size = sizeof(lx_hconn_t);
  hs->on_upgrade = cfg->ws ? lx__on_upgrade : NULL;
  hs->on_body = lx_http_reader_wake;
  hs->on_metrics = lx__metrics;
  hs->on_request = cfg->on_request == LUA_NOREF ? NULL : lx__on_request;
  lx_service_link(s);
  return s;
}

static int lx_http(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  return lx_listen_with(L, ln, lx__http_service);
}

void lx_http_open(lua_State *L, lx_lane_t *ln) {
  luaL_newmetatable(L, LX_RES_MT);
  lua_newtable(L);
  lua_pushlightuserdata(L, ln);
  lua_pushvalue(L, -3);
  luaL_setfuncs(L, lx_res_methods, 2); /* the lane, the metatable */
  lua_setfield(L, -2, "__index");
  lua_pushliteral(L, LX_RES_MT);
  lua_setfield(L, -2, "__metatable");
  lua_getfield(L, -1, "__index"); /* the methods, for the Lua ones */
  lua_insert(L, -2);
  lua_pushlightuserdata(L, (void *)&lx_res_mt_key);
  lua_insert(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
  lx_embed_core_table(L, "http"); /* for lua/moonport/request.lua */
  lua_insert(L, -2);
  lua_setfield(L, -2, "res_methods"); /* lua/moonport/http.lua adds to it */
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_req_peer, 1);
  lua_setfield(L, -2, "peer");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_req_tls, 1);
  lua_setfield(L, -2, "tls");
  lua_pushcfunction(L, lx_req_unescape);
  lua_setfield(L, -2, "unescape");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_http_req_read_now, 1);
  lua_setfield(L, -2, "read_now");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_http_req_save_now, 1);
  lua_setfield(L, -2, "save_now");
  lx_push_waiter(L, ln, lx_http_read_check, lx_http_read_arm);
  lua_setfield(L, -2, "read_wait");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_req_uid, 1);
  lua_setfield(L, -2, "uid");
  lua_pop(L, 1);
  lx_require(L, "moonport.http");
  static const struct { const char *name; const char *key; } fns[] = {
      {"run", &lx_runner_key}, {"build", &lx_req_build_key},
      {"upgrade", &lx_upgrade_key}};
  for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
    lua_pushlightuserdata(L, (void *)fns[i].key);
    lua_getfield(L, -2, fns[i].name);
    lua_rawset(L, LUA_REGISTRYINDEX);
  }
  lua_pop(L, 1);
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_http, 1);
  lua_setfield(L, -2, "http");
}
