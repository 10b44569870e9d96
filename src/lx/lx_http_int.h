/* SPDX-License-Identifier: MIT */

/* lx_http_int: what lx_http.c and lx_http_opts.c share (the settings of
 * one mp.http). Not for other files. */
#ifndef MP_LX_HTTP_INT_H
#define MP_LX_HTTP_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "http/compress.h"
#include "http/response.h"
#include "http/server.h"
#include "lx/lx_conn.h"
#include "lx/lx_lane.h"
#include "lx/lx_ws.h"

/* ---- settings of one mp.http ---- */

typedef struct {
  http_server_t srv; /* first: the server's settings and hooks */
  int on_request;    /* registry ref, or LUA_NOREF: 404 (when only public or
                        websocket is given) */
  lx_ws_cfg_t *ws;   /* websocket handlers, or NULL */
  bool compress;     /* compress = ...: comp is the filter's settings */
  http_compress_cfg_t comp;
  http_filter_t comp_filter;
  /* The exchanges' version strings (http_exchange_t.version: a few
   * constants) as registry refs, so a request pushes one without hashing
   * it again. */
  const char *vkey[3];
  int vref[3];
  bool http2; /* TLS offers h2 by ALPN (http2 = false: HTTP/1.1 only) */
} lx_http_cfg_t;

/* ---- a connection: the server's state and what Lua adds ---- */

typedef struct {
  http_conn_t h;    /* first: the server's (http_server_t.conn_size) */
  lx_run_t reader;  /* the req:read() that waits (h.reading) */
  bool reader_peek; /* it wants only to hear that bytes came (save_now) */
  bool up_accept;   /* on_upgrade accepted: the 101 goes out next */
  char *up_headers; /* its extra header lines ("Name: v\r\n"...) */
  size_t up_hlen;
} lx_hconn_t;

static inline lx_service_t *lx_http_svc(const lx_hconn_t *hc) {
  return hc->h.srv->app;
}

/* ---- streamed request bodies (lx_http_body.c) ---- */

/* http_server_t.on_body: a streamed body has news; wakes the req:read()
 * that waits. */
void lx_http_reader_wake(http_exchange_t *x);
/* req:_read_now / req:_save_now and the waiter's check and arm (the
 * lane's waiter protocol, lx_push_waiter). */
int lx_http_req_read_now(lua_State *L);
int lx_http_req_save_now(lua_State *L);
int lx_http_read_check(lua_State *L);
int lx_http_read_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co);

/* A header name (name) or value fit for a response line: no CR, LF or
 * NUL; a name is a token. */
bool lx_http_header_ok(const char *s, size_t n, bool name);

/* mp.http's options at opts[idx] into a new service (s->ext: its
 * lx_http_cfg_t), not linked, without the Lua hooks; raises on a bad one. */
lx_service_t *lx_http_service_new(lua_State *L, lx_lane_t *ln, int idx);

#endif
