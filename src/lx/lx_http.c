/* lx_http: mp.http's Lua face. The HTTP protocol itself (the connection
 * state machine, keep-alive, pipelining, refusals, the response head, the
 * access log, the public folder, the WebSocket handshake) is C in
 * src/http/server.c; this file gives it hooks that run Lua, and owns the
 * Lua objects: each request becomes a Lua table and a response object
 * (`res`), and on_request (or websocket.on_upgrade) runs in a pooled
 * coroutine like every callback, so it may wait (mp.sleep, r:cmd,
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
#include "http/http1.h"
#include "http/public.h"
#include "http/server.h"
#include "lx/lx_conn.h"
#include "lx/lx_embed.h"
#include "lx/lx_http.h"
#include "lx/lx_lane.h"
#include "lx/lx_moonport.h"
#include "lx/lx_server.h"
#include "lx/lx_stats.h"
#include "lx/lx_tls.h"
#include "lx/lx_ws.h"

#define LX_RES_MT "moonport.http.response"
#define LX_HTTP_ZERO_COPY_MIN 16384

/* ---- settings of one mp.http ---- */

typedef struct {
  http_server_t srv; /* first: the server's settings and hooks */
  int on_request; /* registry ref, or LUA_NOREF: 404 (when only public or
                     websocket is given) */
  lx_ws_cfg_t *ws; /* websocket handlers, or NULL */
} lx_http_cfg_t;

/* ---- a connection: the server's state and what Lua adds ---- */

typedef struct {
  http_conn_t h;     /* first: the server's (http_server_t.conn_size) */
  lx_run_t reader;   /* the req:read() that waits (h.reading) */
  bool up_accept;    /* on_upgrade accepted: the 101 goes out next */
  char *up_headers;  /* its extra header lines ("Name: v\r\n"...) */
  size_t up_hlen;
} lx_hconn_t;

/* Header lines a response keeps in its own userdata; more go to a buffer
 * userdata anchored in the response's environment table. Either way the
 * GC frees them with the response, so it needs no __gc (a finalizer per
 * request cost about 4 % of a hello request). */
#define LX_RES_INLINE_HEADERS 256

/* The response object of one request. */
typedef struct {
  http_head_t h;   /* status, head_only, keep_alive, http10, has_type and
                      the header lines (h.headers == hbuf, h.hlen) */
  sock_uuid_t uuid;
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
static lx_service_t *lx__svc(const lx_hconn_t *hc) { return hc->h.srv->app; }

void lx_http_lane_free(lx_lane_t *ln) {
  http_cache_free(ln->http_cache);
  ln->http_cache = NULL;
}

/* ---- the protocol: the server's, with Lua's on_open and on_close ---- */

static void lx_http_on_open(conn_t *c) {
  lx_service_t *s = reactor_conn_service(c);
  s->conns++;
  http_conn_open(&lx__cfg(s)->srv, c);
}

static void lx_http_on_close(conn_t *c, int reason) {
  lx_hconn_t *hc = reactor_conn_udata(c);
  lx_service_t *s = reactor_conn_service(c);
  if (hc && hc->h.reading) {
    hc->h.body_err = "closed";
    if (s->ln->closing) {
      hc->h.reading = false;
      lx_run_abandon(s->ln, &hc->reader);
    } else {
      hc->h.srv->on_body(c, &hc->h);
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

/* Pushes the request table. Returns false (nothing pushed) for a target
 * that can't be decoded. */
/* Pushes the request's parts, the arguments of the Lua request builder
 * (lua/moonport/http.lua): method, path (decoded), query, target, minor version,
 * headers (a table of lower-case names; repeated fields joined with ", "),
 * body (nil: streamed, read with req:read()), conn_id and the request's
 * number on its connection (hc->seq, bumped here). The table itself
 * is made in Lua, where a constructor with constant keys is one template
 * copy instead of a hashed lua_setfield per field. False for a path that
 * doesn't decode (nothing pushed). */
#define LX_REQ_PARTS 9
static bool lx__push_req_parts(lua_State *L, lx_hconn_t *hc, const char *body,
                               size_t blen) {
  http_request_t *r = hc->h.req;
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
  lua_pushlstring(L, r->target, r->target_len);
  lua_pushinteger(L, r->minor);
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
  lua_pushnumber(L, (lua_Number)++hc->h.seq);
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
  res->h = http_conn_head(&hc->h, 200);
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
  lx_service_t *s = lx__svc(ra->hc);
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
  lx_lane_t *ln = lx__svc(hc)->ln;
  struct lx__req_args ra = {c, hc, body, blen, runner_key, handler};
  int co_ref, n;
  lua_State *co = lx_co_take_push(ln, &co_ref, lx__push_run, &ra, &n);
  if (!co) {
    http_conn_refuse(c, &hc->h, n == -ENOMEM ? 500 : 400);
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
static void lx__on_upgrade(conn_t *c, http_conn_t *h) {
  lx_hconn_t *hc = (lx_hconn_t *)h;
  lx_http_cfg_t *cfg = lx__cfg(lx__svc(hc));
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
  lx_service_t *s = lx__svc(hc);
  lx_stream_t *st = lx_ws_new(s->ln, c, lx__cfg(s)->ws);
  if (!st) {
    http_conn_refuse(c, &hc->h, 500);
    return;
  }
  http_conn_upgrade_101(c, &hc->h, hc->up_headers, hc->up_hlen);
  free(hc->up_headers);
  hc->up_headers = NULL;
  hc->up_hlen = 0;
  const char *rest;
  size_t rest_len;
  http_conn_stream(c, &hc->h, &lx_stream_ops, st, &rest, &rest_len);
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
static void lx__on_request(conn_t *c, http_conn_t *h, const char *body,
                           size_t blen) {
  lx_hconn_t *hc = (lx_hconn_t *)h;
  lx__run(c, hc, body, blen, &lx_runner_key, lx__cfg(lx__svc(hc))->on_request,
          "on_request");
}

/* The server's on_metrics: `status`, in the Prometheus text format. */
static char *lx__metrics(http_server_t *srv, size_t *n) {
  lx_service_t *s = srv->app;
  return lx_stats_prometheus(s->ln->srv, n);
}

/* ---- streamed request bodies (stream_body): req:read() ---- */

/* Pushes what req:read() returns now: a chunk, nil at the end, or nil and
 * an error; returns the count, or 0 when it must wait. */
static int lx__body_take(lua_State *L, conn_t *c, lx_hconn_t *hc) {
  const char *p;
  long n = http_conn_body_peek(&hc->h, &p);
  if (n == HTTP_BODY_ERR) {
    lua_pushnil(L);
    lua_pushstring(L, hc->h.body_err);
    return 2;
  }
  if (n == HTTP_BODY_WAIT) return 0;
  if (n == HTTP_BODY_END) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushlstring(L, p, (size_t)n);
  http_conn_body_consume(c, &hc->h, (size_t)n);
  return 1;
}

/* Resumes the waiting req:read() with what there is. */
static void lx__reader_wake(conn_t *c, http_conn_t *h) {
  lx_hconn_t *hc = (lx_hconn_t *)h;
  lx_lane_t *ln = lx__svc(hc)->ln;
  hc->h.reading = false;
  lx_run_t run = hc->reader;
  reactor_conn_hold(c); /* the run's hold, given up while it waited */
  reactor_conn_set_timeout(c, 0);
  int n = lx__body_take(run.co, c, hc);
  if (n == 0) { /* can't be: it was woken for something */
    lua_pushnil(run.co);
    lua_pushliteral(run.co, "closed");
    n = 2;
  }
  lx_resume(ln, &run, n);
}

/* The connection whose streamed body a req:read() call may read (raises on
 * misuse). The request must be the one in flight on its connection: a
 * `req` kept past its response (in a timer, say) finds nothing, rather
 * than the body of the next keep-alive request. */
static conn_t *lx__reader_conn(lua_State *L, lx_lane_t *ln, lx_hconn_t **hcp) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "conn_id");
  sock_uuid_t uuid = (sock_uuid_t)lua_tonumber(L, -1);
  lua_getfield(L, 1, "_seq");
  lua_Number seq = lua_tonumber(L, -1);
  lua_pop(L, 2);
  conn_t *c = uuid ? reactor_conn_find(ln->r, uuid) : NULL;
  /* only a connection of mp.http (conn_id is a plain field of req) */
  const proto_t *pr = c ? reactor_conn_service(c) : NULL;
  lx_hconn_t *hc = pr && pr->on_data == http_server_on_data ? reactor_conn_udata(c)
                                                            : NULL;
  if (hc && (hc->h.state == HTTP_C_STREAM || (lua_Number)hc->h.seq != seq))
    hc = NULL;
  if (hc && hc->h.state == HTTP_C_BUSY && !hc->h.streaming)
    luaL_error(L, "req:read: the body was read already (mp.http stream_body "
                  "is off: use req.body)");
  if (hc && hc->h.reading) luaL_error(L, "req:read: another read is waiting");
  *hcp = hc && hc->h.state == HTTP_C_BUSY ? hc : NULL;
  return *hcp ? c : NULL;
}

/* req:read() without waiting: a chunk, nil (end), nil + error, or false
 * (nothing yet: then the Lua side waits). */
static int lx_req_read_now(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_hconn_t *hc;
  conn_t *c = lx__reader_conn(L, ln, &hc);
  if (!c) {
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
  }
  http_conn_body_wanted(c, &hc->h);
  int n = lx__body_take(L, c, hc);
  if (n) return n;
  lua_pushboolean(L, 0);
  return 1;
}

static int lx__read_check(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_check_waitable(L, ln, "req:read");
  lx_hconn_t *hc;
  conn_t *c = lx__reader_conn(L, ln, &hc);
  if (!c) luaL_error(L, "req:read: the request is over");
  /* Waiting gives up the hold of the run that waits (lx__read_arm): only
   * the request's own handler holds the connection, so only it may wait.
   * From a timer or another callback the release would drop the
   * handler's hold, and the connection's next callbacks would overlap. */
  if (ln->running->kind != LX_CONN || ln->running->c != c)
    luaL_error(L, "req:read: can wait only in the request's own handler "
                  "(not in a timer or another callback)");
  return 0;
}

static int lx__read_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  lx_hconn_t *hc;
  lua_pushvalue(co, 3);
  lua_replace(co, 1);
  conn_t *c = lx__reader_conn(co, ln, &hc);
  if (!c) return -EPIPE;
  hc->reader = *run;
  hc->h.reading = true;
  /* While the handler waits for its body, the connection must keep
   * reading: give up the run's hold (lx__reader_wake takes it back). */
  reactor_conn_release(c);
  reactor_conn_set_timeout(c, hc->h.srv->idle_ms);
  return 0;
}

/* ---- the response object ---- */

/* The response at stack index 1 (lx_check_self: the methods carry the
 * metatable as upvalue 2). */
static lx_res_t *lx__res(lua_State *L) {
  return lx_check_self(L, LX_RES_MT);
}

/* The connection of a response still in flight, or NULL. */
static conn_t *lx__res_conn(lx_res_t *res, lx_hconn_t **hc) {
  conn_t *c = reactor_conn_find(res->ln->r, res->uuid);
  *hc = c ? reactor_conn_udata(c) : NULL;
  if (!*hc || (*hc)->h.state != HTTP_C_BUSY) return NULL;
  return c;
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

static bool lx__header_ok(const char *s, size_t n, bool name) {
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

static int lx_res_header(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t kl, vl;
  const char *k = luaL_checklstring(L, 2, &kl);
  const char *v = luaL_checklstring(L, 3, &vl);
  if (res->started || res->done)
    return luaL_error(L, "res:header: the response is already sent");
  if (!lx__header_ok(k, kl, true))
    return luaL_argerror(L, 2, "not a valid header name");
  if (!lx__header_ok(v, vl, false))
    return luaL_argerror(L, 3, "a header value can't hold CR, LF or NUL");
  if ((kl == 14 && strncasecmp(k, "content-length", 14) == 0) ||
      (kl == 17 && strncasecmp(k, "transfer-encoding", 17) == 0))
    return luaL_argerror(L, 2, "moonport sets this header itself");
  lx__add_header(L, res, k, kl, v, vl);
  lua_settop(L, 1);
  return 1;
}

/* Writes the Lua string at idx. */
static int lx__write_body(lua_State *L, lx_res_t *res, conn_t *c, int idx,
                          const char *p, size_t n) {
  if (n >= LX_HTTP_ZERO_COPY_MIN) {
    lua_pushvalue(L, idx);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return reactor_conn_write_ref(c, p, n, lx_unref_release, res->ln,
                                  (void *)(intptr_t)ref);
  }
  return reactor_conn_write(c, p, n);
}

/* Ends the response: the connection goes on to the next request. */
static void lx__finish(lx_res_t *res, conn_t *c, lx_hconn_t *hc) {
  res->done = true;
  res->h.hlen = 0;
  http_conn_complete(c, &hc->h, res->h.keep_alive && hc->h.keep_alive);
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
  /* 1xx, 204 and 304 have no body (RFC 9110 6.4.1): one given is dropped */
  if (res->h.status < 200 || res->h.status == 204 || res->h.status == 304) n = 0;
  bool inlined;
  int rc = http_conn_write_head(c, &hc->h, &res->h, (long long)n, body, &inlined);
  if (!rc && !inlined) rc = lx__write_body(L, res, c, 2, body, n);
  lx__finish(res, c, hc);
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
  if (!lx__header_ok(url, ul, false)) return luaL_argerror(L, 2, "bad URL");
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
    bool inlined;
    res->started = true;
    rc = http_conn_write_head(c, &hc->h, &res->h, -1, NULL, &inlined);
  }
  if (!rc && n && !res->h.head_only) {
    if (!res->h.http10) {
      char size[24];
      int sl = snprintf(size, sizeof(size), "%zx\r\n", n);
      rc = reactor_conn_write(c, size, (size_t)sl);
    }
    if (!rc) rc = lx__write_body(L, res, c, 2, p, n);
    hc->h.log_bytes += n;
    if (!rc && !res->h.http10) rc = reactor_conn_write(c, "\r\n", 2);
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
  if (!res->h.http10 && !res->h.head_only) reactor_conn_write(c, "0\r\n\r\n", 5);
  lx__finish(res, c, hc);
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
  bool inlined;
  int rc = http_conn_write_head(c, &hc->h, &res->h, (long long)st.st_size, NULL, &inlined);
  if (!rc && st.st_size && !res->h.head_only)
    rc = reactor_conn_sendfile(c, fd, 0, (size_t)st.st_size); /* owns fd */
  else
    close(fd);
  lx__finish(res, c, hc);
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
  http_conn_log(c, &hc->h, res->h.status, 0);
  const http_header_t *last = http_header(hc->h.req, "last-event-id");
  lx_stream_t *st = lx_sse_new(L, res->ln, c, opts, last ? last->value : NULL,
                               last ? last->value_len : 0);
  if (!st) return luaL_error(L, "out of memory");
  char head[256];
  int n = snprintf(head, sizeof(head),
                   "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: text/event-stream\r\n"
                   "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n",
                   res->h.status, http_reason(res->h.status), http_date_now());
  int rc = reactor_conn_write(c, head, (size_t)n);
  if (!rc && res->h.hlen) rc = reactor_conn_write(c, res->hbuf, res->h.hlen);
  if (!rc) rc = reactor_conn_write(c, "\r\n", 2);
  res->done = true;
  res->h.hlen = 0;
  /* The stream ends with the connection: nothing more is read as HTTP. */
  http_conn_stream(c, &hc->h, &lx_stream_ops, st, NULL, NULL);
  lx_sse_begin(c, st);
  http_conn_drop_request(&hc->h); /* the request's bytes are not needed */
  lx_stream_push(L, st);
  if (rc) reactor_conn_close(c, CONN_ERROR);
  return 1;
}

/* After the handler returned: a response it did not finish is finished
 * now (an empty one with its status if it sent nothing). */
static int lx_res_done(lua_State *L) {
  lx_res_t *res = lx__res(L);
  if (!res->done) lx_res_finish(L);
  return 0;
}

/* The handler failed: the trace goes to the log, the client gets a 500
 * if nothing was sent yet (else the connection closes). */
static int lx_res_fail(lua_State *L) {
  lx_res_t *res = lx__res(L);
  log_error("error in %s: %s", res->upgrade ? "websocket on_upgrade" : "on_request",
            luaL_optstring(L, 2, "?"));
  if (res->done) return 0;
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) return 0;
  if (res->started) {
    res->done = true;
    hc->h.state = HTTP_C_CLOSING;
    reactor_conn_force_close(c, CONN_ERROR);
    return 0;
  }
  res->h.status = 500;
  res->h.hlen = 0;
  res->h.has_type = false;
  lua_settop(L, 1);
  lua_pushliteral(L, "Internal Server Error\n");
  return lx_res_send(L);
}

/* Whether the upgrade request offered subprotocol p (in any of its
 * Sec-WebSocket-Protocol fields, comma-separated; compared exactly, as the
 * client checks the answer exactly). */
static bool lx__offered(const http_request_t *r, const char *p, size_t n) {
  for (int i = 0; i < r->nheaders; i++) {
    const http_header_t *h = &r->headers[i];
    if (h->name_len != 22 || strncasecmp(h->name, "sec-websocket-protocol", 22))
      continue;
    const char *v = h->value, *end = h->value + h->value_len;
    while (v < end) {
      while (v < end && (*v == ' ' || *v == '\t' || *v == ',')) v++;
      const char *t = v;
      while (v < end && *v != ',' && *v != ' ' && *v != '\t') v++;
      if ((size_t)(v - t) == n && n && memcmp(t, p, n) == 0) return true;
    }
  }
  return false;
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
    if (!lx__header_ok(k, kl, true) || !lx__header_ok(v, vl, false))
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
      if (!lx__offered(hc->h.req, p, n))
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

static const luaL_Reg lx_res_methods[] = {
    {"status", lx_res_status},     {"header", lx_res_header},
    {"send", lx_res_send},         {"json", lx_res_json},
    {"write", lx_res_write},       {"finish", lx_res_finish},
    {"redirect", lx_res_redirect}, {"sendfile", lx_res_sendfile},
    {"sse", lx_res_sse},
    {"_done", lx_res_done},        {"_fail", lx_res_fail},
    {"_upgrade", lx_res_upgrade},
    {NULL, NULL}};

/* ---- mp.http ---- */

static void lx__cfg_free(lx_service_t *s) {
  lx_http_cfg_t *cfg = s->ext;
  if (!cfg) return;
  luaL_unref(s->ln->L, LUA_REGISTRYINDEX, cfg->on_request);
  lx_ws_cfg_free(s->ln->L, cfg->ws);
  if (cfg->srv.public_fd >= 0) close(cfg->srv.public_fd);
  free(cfg);
  s->ext = NULL;
}

static lua_Number lx__opt(lua_State *L, int idx, const char *name,
                          lua_Number def, lua_Number min, lua_Number max) {
  lua_getfield(L, idx, name);
  lua_Number v = def;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER)
      luaL_error(L, "mp.http: %s must be a number (got %s)", name,
                 luaL_typename(L, -1));
    v = lua_tonumber(L, -1);
    if (v < min || v > max)
      luaL_error(L, "mp.http: %s out of range (%g not in %g..%g)", name, v,
                 min, max);
  }
  lua_pop(L, 1);
  return v;
}

/* Opens the public folder named at opts[idx].public once, at mp.http
 * time (http_public_open). Raises on failure. */
static int lx__static_root(lua_State *L, int idx) {
  lua_getfield(L, idx, "public");
  const char *dir = lua_tostring(L, -1);
  const char *step = "open";
  char buf[128];
  int fd = http_public_open(dir, &step);
  if (fd < 0 && strcmp(step, "open") == 0)
    luaL_error(L, "mp.http: public folder \"%s\": %s", dir,
               strerror_r(-fd, buf, sizeof(buf)));
  if (fd < 0)
    luaL_error(L, "mp.http: public folder \"%s\": openat2(2) fails (%s); "
                  "static files need Linux 5.6 or later",
               dir, strerror_r(-fd, buf, sizeof(buf)));
  lua_pop(L, 1);
  return fd;
}

static lx_service_t *lx__http_service(lua_State *L, lx_lane_t *ln, int idx) {
  lua_getfield(L, idx, "public");
  if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
    luaL_error(L, "mp.http: public must be a string (got %s)",
               luaL_typename(L, -1));
  bool has_public = !lua_isnil(L, -1);
  lua_getfield(L, idx, "public_prefix");
  size_t prefix_len = 0;
  const char *prefix = lua_tolstring(L, -1, &prefix_len);
  if (!lua_isnil(L, -1) &&
      (lua_type(L, -1) != LUA_TSTRING || prefix_len == 0 || prefix[0] != '/' ||
       prefix_len >= sizeof(((http_server_t *)0)->public_prefix) || !has_public))
    luaL_error(L, "mp.http: public_prefix must be a path that starts with / "
                  "(under 128 bytes), given with public");
  char prefix_copy[128] = {0};
  if (prefix) memcpy(prefix_copy, prefix, prefix_len);
  lua_pop(L, 1);
  lua_getfield(L, idx, "status");
  size_t status_len = 0;
  const char *status = lua_tolstring(L, -1, &status_len);
  if (!lua_isnil(L, -1) &&
      (lua_type(L, -1) != LUA_TSTRING || status_len == 0 || status[0] != '/' ||
       status_len >= sizeof(((http_server_t *)0)->status_path)))
    luaL_error(L, "mp.http: status must be a path that starts with / (under "
                  "128 bytes)");
  char status_copy[128] = {0};
  if (status) memcpy(status_copy, status, status_len);
  lua_pop(L, 1);
  lua_getfield(L, idx, "on_request");
  lua_getfield(L, idx, "websocket");
  bool has_ws = !lua_isnil(L, -1);
  if (!lx_is_callable(L, -2) && !(lua_isnil(L, -2) && (has_public || has_ws)))
    luaL_error(L, "mp.http: on_request must be a function or a router (got %s)",
               luaL_typename(L, -2));
  if (has_ws) lx_ws_cfg_check(L, -1); /* raises now, while nothing is held */
  lua_pop(L, 3);
  lua_getfield(L, idx, "stream_body");
  bool stream_body = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_Number max_header = lx__opt(L, idx, "max_header", 8192, 256, 1 << 20);
  lua_Number max_body = lx__opt(L, idx, "max_body", 1 << 20, 0, (lua_Number)(1ull << 32));
  lua_Number header_timeout = lx__opt(L, idx, "header_timeout", 10, 0.01, 3600);
  lua_Number idle = lx__opt(L, idx, "timeout", 40, 0, 4e6);
  lua_Number limit = lx__opt(L, idx, "write_limit",
                             (lua_Number)REACTOR_DEFAULT_WRITE_LIMIT, 1024,
                             (lua_Number)((size_t)1 << 40));
  lua_Number max_queue = lx__opt(L, idx, "max_queue",
                                 (lua_Number)REACTOR_DEFAULT_MAX_QUEUE, 1024,
                                 (lua_Number)((size_t)1 << 40));
  /* last: nothing may raise once the folder is open */
  int public_fd = has_public ? lx__static_root(L, idx) : -1;
  lx_ws_cfg_t *ws = NULL; /* checked above: only out of memory raises */
  if (has_ws) {
    lua_getfield(L, idx, "websocket");
    ws = lx_ws_cfg_new(L, -1);
    lua_pop(L, 1);
  }
  lx_service_t *s = calloc(1, sizeof(*s));
  lx_http_cfg_t *cfg = calloc(1, sizeof(*cfg));
  if (!s || !cfg) {
    free(s);
    free(cfg);
    lx_ws_cfg_free(L, ws);
    if (public_fd >= 0) close(public_fd);
    luaL_error(L, "out of memory");
  }
  s->ln = ln;
  s->on_open = s->on_data = s->on_ready = s->on_timeout = s->on_shutdown =
      s->on_close = s->on_fail = s->on_connect = LUA_NOREF;
  s->opts.timeout_ms = (uint32_t)(header_timeout * 1000);
  s->opts.write_limit = (size_t)limit;
  s->opts.max_queue = (size_t)max_queue;
  s->proto.on_open = lx_http_on_open;
  s->proto.on_data = http_server_on_data;
  s->proto.on_timeout = http_server_on_timeout;
  s->proto.on_ready = http_server_on_ready;
  s->proto.on_shutdown = http_server_on_shutdown;
  s->proto.on_close = lx_http_on_close;
  http_server_t *hs = &cfg->srv;
  hs->r = ln->r;
  hs->max_header = (size_t)max_header;
  hs->max_body = (size_t)max_body;
  hs->header_timeout_ms = (uint32_t)(header_timeout * 1000);
  hs->idle_ms = (uint32_t)(idle * 1000);
  hs->stream_body = stream_body;
  hs->public_fd = public_fd;
  memcpy(hs->public_prefix, prefix_copy, sizeof(prefix_copy));
  hs->public_prefix_len = prefix ? prefix_len : 0;
  memcpy(hs->status_path, status_copy, sizeof(status_copy));
  hs->status_len = status ? status_len : 0;
  hs->access_fd = &ln->srv->access_fd;
  hs->stats = ln->stats;
  hs->cache = &ln->http_cache;
  hs->conn_size = sizeof(lx_hconn_t);
  hs->on_upgrade = ws ? lx__on_upgrade : NULL;
  hs->on_body = lx__reader_wake;
  hs->on_metrics = lx__metrics;
  hs->app = s;
  lua_getfield(L, idx, "on_request");
  cfg->on_request = lua_isnil(L, -1) ? (lua_pop(L, 1), LUA_NOREF)
                                     : luaL_ref(L, LUA_REGISTRYINDEX);
  hs->on_request = cfg->on_request == LUA_NOREF ? NULL : lx__on_request;
  cfg->ws = ws;
  s->ext = cfg;
  s->ext_free = lx__cfg_free;
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
  lua_pushlightuserdata(L, (void *)&lx_res_mt_key);
  lua_insert(L, -2);
  lua_rawset(L, LUA_REGISTRYINDEX);
  lx_embed_core_table(L, "http"); /* for lua/moonport/request.lua */
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_req_peer, 1);
  lua_setfield(L, -2, "peer");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_req_tls, 1);
  lua_setfield(L, -2, "tls");
  lua_pushcfunction(L, lx_req_unescape);
  lua_setfield(L, -2, "unescape");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_req_read_now, 1);
  lua_setfield(L, -2, "read_now");
  lx_push_waiter(L, ln, lx__read_check, lx__read_arm);
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
