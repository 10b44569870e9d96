/* SPDX-License-Identifier: MIT */

/* select: the framer of each connection, by ALPN; see select.h. */
#include "http/select.h"

#include <string.h>

/* The framers, by ALPN name. */
static const http_framer_t *const sel_framers[] = {&http_framer_h2,
                                                   &http_framer_h1};

const char http_alpn_protos[] = "\x02h2\x08http/1.1";
const char http_alpn_protos_h1[] = "\x08http/1.1";

/* The framer of c: the one whose name TLS agreed on, else HTTP/1.1. */
static const http_framer_t *sel__framer(conn_t *c) {
  net_tls_info_t info;
  if (!reactor_conn_tls(c, &info) || !info.alpn[0]) return &http_framer_h1;
  for (size_t i = 0; i < sizeof(sel_framers) / sizeof(sel_framers[0]); i++)
    if (strcmp(sel_framers[i]->alpn, info.alpn) == 0) return sel_framers[i];
  return &http_framer_h1; /* (ALPN offers only what is in the table) */
}

http_conn_t *http_server_accept(http_server_t *srv, conn_t *c) {
  return sel__framer(c)->open(srv, c);
}

/* The listener's events go to the connection's framer. */
void http_server_on_data(conn_t *c, const char *data, size_t len) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc) hc->framer->on_data(c, data, len);
}

static void sel__on_timeout(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc)
    hc->framer->on_timeout(c);
  else
    reactor_conn_close(c, CONN_TIMEOUT);
}

static void sel__on_ready(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc) hc->framer->on_ready(c);
}

static void sel__on_shutdown(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc)
    hc->framer->on_shutdown(c);
  else
    reactor_conn_close(c, CONN_SHUTDOWN);
}

void http_conn_closed(conn_t *c, http_conn_t *hc, int reason) {
  if (hc) {
    hc->framer->closed(c, hc, reason);
    return;
  }
  reactor_conn_set_udata(c, NULL);
}

/* c's HTTP connection, if c is one of an HTTP server's. */
static http_conn_t *sel__hc(conn_t *c) {
  /* the application's service starts with its proto_t (reactor_listen's
   * `service` is what reactor_conn_service gives) */
  const proto_t *p = c ? reactor_conn_service(c) : NULL;
  return p && p->on_data == http_server_on_data ? reactor_conn_udata(c) : NULL;
}

http_exchange_t *http_exchange_find(conn_t *c, uint64_t id) {
  http_conn_t *hc = sel__hc(c);
  return hc && hc->state == HTTP_C_BUSY && hc->x.id == id ? &hc->x : NULL;
}

void *http_conn_stream_of(conn_t *c, const http_stream_ops_t *ops) {
  http_conn_t *hc = sel__hc(c);
  return hc && hc->state == HTTP_C_STREAM && hc->stream_ops == ops ? hc->stream
                                                                   : NULL;
}

proto_t http_server_proto(void (*on_open)(conn_t *c),
                          void (*on_close)(conn_t *c, int reason)) {
  return (proto_t){.on_open = on_open,
                   .on_data = http_server_on_data,
                   .on_timeout = sel__on_timeout,
                   .on_ready = sel__on_ready,
                   .on_shutdown = sel__on_shutdown,
                   .on_close = on_close};
}
