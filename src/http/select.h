/* SPDX-License-Identifier: MIT */

/* select: the accept-time protocol selector of an HTTP listener. A
 * connection that opens is given a framer, the code that reads its bytes
 * as requests and writes responses (the response writer's framing is the
 * framer's): the protocol the TLS handshake agreed on by ALPN, HTTP/1.1
 * without TLS or without ALPN. From then on the connection's events go to
 * that framer (http_framer_t, http/exchange.h); the application sees
 * exchanges, whatever the protocol. HTTP/1.1 (h1.c) and HTTP/2 (h2.c)
 * are the rows of the table in select.c; another adds a row there and its
 * name to http_alpn_protos. The selector names the framers; they do not
 * name it, nor each other but for HTTP/1.1's hand-over to HTTP/2 below.
 * Threads: the connection's reactor thread, like exchange.h. */
#ifndef MP_HTTP_SELECT_H
#define MP_HTTP_SELECT_H

#include "http/exchange.h"

extern const http_framer_t http_framer_h1; /* h1.c */
extern const http_framer_t http_framer_h2; /* h2.c */

/* HTTP/1.1 connection hc got the HTTP/2 preface (h2c by prior knowledge,
 * data: its first bytes): it becomes an HTTP/2 connection and reads them
 * as such. */
void http_h2_take(http_conn_t *hc, const char *data, size_t len);
/* HTTP/1.1 connection hc has the whole head of its first request in
 * hc->x.req, asking for Upgrade: h2c with one HTTP2-Settings field, and
 * nothing after it. True: nghttp2 took the client's settings, the 101
 * went out and the request is stream 1's (copied); the caller gives its
 * HTTP/1.1 buffers back, then calls http_h2_upgraded. False: nothing
 * changed, the request is served as HTTP/1.1 (a body, a malformed
 * HTTP2-Settings, no memory). */
bool http_h2_upgrade(http_conn_t *hc);
void http_h2_upgraded(http_conn_t *hc);

/* Frees a thread's pool of HTTP/2 session pages (http_server_t.h2_pool,
 * h2_mem.c) once the thread's connections are gone. */
void http_h2_pool_free(struct h2_pool *p);

/* ---- the protocol: what an HTTP listener is given ---- */

/* The proto_t of an HTTP listener: the events go to each connection's
 * framer; on_open and on_close are the application's. Its on_open calls
 * http_server_accept, its on_close (after what it must do first: wake a
 * waiting reader) http_conn_closed. */
proto_t http_server_proto(void (*on_open)(conn_t *c),
                          void (*on_close)(conn_t *c, int reason));
/* A connection opened on srv: the selector picks its protocol (ALPN) and
 * the connection's state (srv->conn_size bytes, zeroed) is made, now c's
 * udata. NULL when out of memory (c is then force-closed). */
http_conn_t *http_server_accept(http_server_t *srv, conn_t *c);
/* The listener's on_data (proto_t): tells an HTTP connection. */
void http_server_on_data(conn_t *c, const char *data, size_t len);
/* The connection closed: a stream gets on_closed, then hc is freed and
 * c's udata cleared. */
void http_conn_closed(conn_t *c, http_conn_t *hc, int reason);

/* The exchange `id` of connection c if c is a connection of this
 * protocol and that exchange is in flight (the application has it);
 * else NULL. */
http_exchange_t *http_exchange_find(conn_t *c, uint64_t id);
/* The stream c became, if c is a connection of this protocol in
 * HTTP_C_STREAM with these ops; else NULL. The `service` the listener
 * was given (reactor_conn_service) must start with its proto_t, as
 * lx_service_t does. */
void *http_conn_stream_of(conn_t *c, const http_stream_ops_t *ops);

/* What an HTTPS listener offers by ALPN (the framers above), in our
 * order of preference, in the wire format (each name after its length
 * byte), for net_tls_server_ctx_alpn. */
extern const char http_alpn_protos[];
/* ... without HTTP/2 (mp.http's http2 = false). */
extern const char http_alpn_protos_h1[];

#endif
