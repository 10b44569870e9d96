/* SPDX-License-Identifier: MIT */

/* server: mp.http's HTTP server in C, as an application sees it, and its
 * dispatcher. This header brings what an application uses: the server's
 * settings and hooks, connections and exchanges (http/exchange.h), the
 * response writer (http/response.h) and what a listener is given
 * (http/select.h). What a request *means* is the application's: the
 * server calls the hooks of its http_server_t (on_request, on_upgrade,
 * on_body, on_metrics), and the application answers through the response
 * writer (the framing, the body filters) and the calls of exchange.h.
 * mp.http's Lua objects (src/lx/lx_http.c) are one such application;
 * spec/c/test_server.c is another.
 *
 * The protocols are framers behind the selector: HTTP/1.1 (h1.c: the
 * connection from its first byte to its close, keep-alive and
 * pipelining, back pressure, the header and idle timeouts, refusals,
 * 100 Continue, chunked and streamed request bodies) and HTTP/2 (h2.c).
 * Both hand each request to the dispatcher here (server.c): the server's
 * own answers (the metrics path, the WebSocket handshake's checks, the
 * public folder through on_before, 404) come before the application's.
 *
 * A connection may become a stream (WebSocket or SSE): from then on its
 * events go to the http_stream_ops_t it was given (src/lx/lx_ws.c's), and
 * nothing more is read as HTTP.
 *
 * Threads: an http_server_t belongs to one reactor; every call here runs
 * on that reactor's thread (from its callbacks, or from code it runs). */
#ifndef MP_HTTP_SERVER_H
#define MP_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "http/exchange.h"
#include "http/response.h"
#include "http/select.h"

/* Runs the request of hc->x (whole, or its head with stream_body): the
 * server's own answers (status path, on_before), else the application's
 * on_request (or 404). Called by the framers once they filled hc->x. */
void http_exchange_dispatch(http_conn_t *hc, const char *body, size_t blen);

/* Whether the WebSocket upgrade request r offered subprotocol p (n
 * bytes) in any of its Sec-WebSocket-Protocol fields (comma-separated;
 * compared exactly, as the client checks the answer exactly). */
bool http_ws_offered(const http_request_t *r, const char *p, size_t n);

/* What a plain HTTP request to an HTTPS port is told before the close
 * (conn_opts_t.tls_plain_reply). */
extern const char http_tls_plain_reply[];

#endif
