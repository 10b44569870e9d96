/* SPDX-License-Identifier: MIT */

/* lx_ws: the Lua face of WebSocket and SSE streams (their handlers and
 * objects); frames are written by src/http/ws_sse.c. Lane thread. */
#ifndef MP_LX_WS_H
#define MP_LX_WS_H

#include "lx/lx_lane.h"
#include "http/server.h"
#include "http/ws_deflate.h"

typedef struct lx_stream lx_stream_t;

typedef struct lx_ws_cfg lx_ws_cfg_t;
/* mp.http's `websocket` table at idx: handlers and max_msg (raises on
 * bad values). Freed by lx_ws_cfg_free. */
lx_ws_cfg_t *lx_ws_cfg_new(lua_State *L, int idx);
/* Only the checks of lx_ws_cfg_new (raises on bad values). */
void lx_ws_cfg_check(lua_State *L, int idx);
void lx_ws_cfg_free(lua_State *L, lx_ws_cfg_t *cfg);
/* The registry ref of websocket.on_upgrade (run before the 101, where an
 * app may refuse the upgrade or pick a subprotocol), or LUA_NOREF. */
int lx_ws_cfg_on_upgrade(const lx_ws_cfg_t *cfg);
/* Registers the websocket and sse metatables in L. */
void lx_ws_open(lua_State *L, lx_lane_t *ln);
/* A WebSocket on c, whose 101 answer is sent (NULL: out of memory). The
 * caller makes c a stream of it (http_conn_stream with lx_stream_ops),
 * then calls lx_ws_begin:
 * on_open with the request push_req pushes, then the bytes that came
 * after the request. */
lx_stream_t *lx_ws_new(lx_lane_t *ln, conn_t *c, const lx_ws_cfg_t *cfg);
/* permessage-deflate for a new WebSocket stream: the client's
 * Sec-WebSocket-Extensions value (offer, len; NULL: none) against the
 * service's websocket.compress. Returns the length of the answer's value
 * written to resp (cap bytes; 160 are enough), 0 when not agreed. */
size_t lx_ws_negotiate(lx_stream_t *st, const char *offer, size_t len,
                       char *resp, size_t cap);
/* Reads `compress = true | {...}` of the table at idx into *pmd (the
 * defaults first); returns whether it is on. Raises on a bad one. */
bool lx_ws_compress_opts(lua_State *L, int idx, ws_pmd_cfg_t *pmd);
void lx_ws_begin(conn_t *c, lx_stream_t *st,
                 bool (*push_req)(lua_State *L, void *arg), void *arg,
                 const char *rest, size_t rest_len);
/* An SSE stream on c, whose head is sent; handlers from the table at
 * `opts` of L (0: none); last_id: the Last-Event-ID the client sent, or
 * NULL; gz: the gzip stream its events go through (the stream takes it,
 * also when this fails), or NULL. Then lx_sse_begin (on_open runs as c's
 * next callback). */
struct http_gz;
lx_stream_t *lx_sse_new(lua_State *L, lx_lane_t *ln, conn_t *c, int opts,
                        const char *last_id, size_t last_len,
                        struct http_gz *gz);
void lx_sse_begin(conn_t *c, lx_stream_t *st);
/* st is HTTP/2 stream sid of its connection (http_h2_stream_open). */
void lx_sse_set_stream(lx_stream_t *st, int32_t sid);
/* Pushes the stream's Lua object. */
void lx_stream_push(lua_State *L, lx_stream_t *st);
/* The connection events of a stream (on_closed frees it), for
 * http_conn_stream: the HTTP server hands a connection that became a
 * WebSocket or SSE stream to these. */
extern const http_stream_ops_t lx_stream_ops;
#endif
