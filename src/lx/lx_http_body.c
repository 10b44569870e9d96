/* SPDX-License-Identifier: MIT */

/* lx_http_body: a streamed request body (mp.http's stream_body) read from
 * Lua: req:read() waits on the exchange's body (http/server.h's body_peek
 * and body_consume), part:save writes a multipart part straight from the
 * server's bytes. Lane thread. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/server.h"
#include "lx/lx_conn.h"
#include "lx/lx_http_int.h"
#include "lx/lx_lane.h"
#include "lx/lx_multipart.h"

/* Pushes what req:read() returns now: a chunk, nil at the end, or nil and
 * an error; returns the count, or 0 when it must wait. */
static int lx__body_take(lua_State *L, conn_t *c, lx_hconn_t *hc) {
  const char *p;
  long n = http_body_peek(&hc->h.x, &p);
  if (n == HTTP_BODY_ERR) {
    lua_pushnil(L);
    lua_pushstring(L, hc->h.x.body_err);
    return 2;
  }
  if (n == HTTP_BODY_WAIT) return 0;
  if (n == HTTP_BODY_END) {
    lua_pushnil(L);
    return 1;
  }
  lua_pushlstring(L, p, (size_t)n);
  http_body_consume(&hc->h.x, (size_t)n);
  return 1;
}

/* Resumes the waiting req:read() with what there is. */
void lx_http_reader_wake(http_exchange_t *x) {
  lx_hconn_t *hc = (lx_hconn_t *)x->conn;
  conn_t *c = x->conn->c;
  lx_lane_t *ln = lx_http_svc(hc)->ln;
  hc->h.x.reading = false;
  lx_run_t run = hc->reader;
  reactor_conn_hold(c); /* the run's hold, given up while it waited */
  reactor_conn_set_timeout(c, 0);
  if (hc->reader_peek) { /* part:save takes the bytes itself (save_now) */
    hc->reader_peek = false;
    lua_pushboolean(run.co, 1);
    lx_resume(ln, &run, 1);
    return;
  }
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
  lua_getfield(L, 1, "_xid");
  uint64_t xid = (uint64_t)lua_tonumber(L, -1);
  lua_pop(L, 2);
  conn_t *c = uuid ? reactor_conn_find(ln->r, uuid) : NULL;
  /* only an exchange of mp.http in flight (conn_id is a plain field) */
  http_exchange_t *x = http_exchange_find(c, xid);
  if (x && !x->streaming)
    luaL_error(L, "req:read: the body was read already (mp.http stream_body "
                  "is off: use req.body)");
  if (x && x->reading) luaL_error(L, "req:read: another read is waiting");
  *hcp = x ? (lx_hconn_t *)x->conn : NULL;
  return x ? c : NULL;
}

/* req:read() without waiting: a chunk, nil (end), nil + error, or false
 * (nothing yet: then the Lua side waits). */
int lx_http_req_read_now(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_hconn_t *hc;
  conn_t *c = lx__reader_conn(L, ln, &hc);
  if (!c) {
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
  }
  http_body_wanted(&hc->h.x);
  int n = lx__body_take(L, c, hc);
  if (n) return n;
  lua_pushboolean(L, 0);
  return 1;
}

/* save_now(req, parser, file): part:save over a streamed body, from the
 * connection's bytes themselves (no Lua string per piece): writes the
 * part's data that has come to the file. "end", bytes (the part ended);
 * false, bytes (wait: read_wait(req, true), then again); "eof", bytes
 * (the body ended first); nil, message[, status]. */
int lx_http_req_save_now(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  multipart_t *m = lx_multipart_check(L, 2);
  FILE *f = lx_multipart_file(L, 3);
  lx_hconn_t *hc;
  conn_t *c = lx__reader_conn(L, ln, &hc);
  if (!c) {
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
  }
  http_body_wanted(&hc->h.x);
  size_t total = 0;
  for (;;) {
    const char *p;
    long n = http_body_peek(&hc->h.x, &p);
    if (n == HTTP_BODY_ERR) {
      lua_pushnil(L);
      lua_pushstring(L, hc->h.x.body_err);
      return 2;
    }
    if (n == HTTP_BODY_WAIT || n == HTTP_BODY_END) {
      if (n == HTTP_BODY_WAIT)
        lua_pushboolean(L, 0);
      else
        lua_pushliteral(L, "eof");
      lua_pushnumber(L, (lua_Number)total);
      return 2;
    }
    size_t took = 0, wrote = 0;
    int rc = lx_multipart_save(m, p, (size_t)n, f, &took, &wrote);
    if (rc < 0) return lx_multipart_push_save(L, m, rc, 0, 0);
    http_body_consume(&hc->h.x, took);
    total += wrote;
    if (rc == MULTIPART_END) {
      lua_pushliteral(L, "end");
      lua_pushnumber(L, (lua_Number)total);
      return 2;
    }
  }
}

int lx_http_read_check(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_check_waitable(L, ln, "req:read");
  lx_hconn_t *hc;
  conn_t *c = lx__reader_conn(L, ln, &hc);
  if (!c) luaL_error(L, "req:read: the request is over");
  /* Waiting gives up the hold of the run that waits (lx_http_read_arm): only
   * the request's own handler holds the connection, so only it may wait.
   * From a timer or another callback the release would drop the
   * handler's hold, and the connection's next callbacks would overlap. */
  if (ln->running->kind != LX_CONN || ln->running->c != c)
    luaL_error(L, "req:read: can wait only in the request's own handler "
                  "(not in a timer or another callback)");
  return 0;
}

int lx_http_read_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  lx_hconn_t *hc;
  lua_pushvalue(co, 3);
  lua_replace(co, 1);
  conn_t *c = lx__reader_conn(co, ln, &hc);
  if (!c) return -EPIPE;
  hc->reader = *run;
  hc->reader_peek = lua_toboolean(co, 4);
  hc->h.x.reading = true;
  /* While the handler waits for its body, the connection must keep
   * reading: give up the run's hold (lx_http_reader_wake takes it back). */
  reactor_conn_release(c);
  reactor_conn_set_timeout(c, hc->h.srv->idle_ms);
  return 0;
}
