/* SPDX-License-Identifier: MIT */

/* server: the dispatcher of a request both framers hand over (the
 * server's own answers, then the application's), the WebSocket
 * handshake's checks; see server.h. No Lua here: what a request means is
 * the application's, through hooks. */
#include "http/server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

const char http_tls_plain_reply[] =
    "HTTP/1.1 400 Bad Request\r\n"
    "Content-Type: text/plain\r\n"
    "Content-Length: 46\r\n"
    "Connection: close\r\n"
    "\r\n"
    "This port speaks HTTPS: use an https:// URL.\r\n";

/* ---- requests ---- */

/* `status`: GET or HEAD of that path answers the server's metrics, from
 * C (no application code runs). */
static bool sv__status(conn_t *c, http_conn_t *hc) {
  http_server_t *srv = hc->srv;
  const char *path, *q;
  size_t plen, qlen;
  http_target_split(hc->x.req->target, hc->x.req->target_len, &path, &plen, &q,
                    &qlen);
  if (plen != srv->status_len || memcmp(path, srv->status_path, plen) != 0)
    return false;
  http_head_t res = http_exchange_head(&hc->x, 200);
  if (!res.head_only && !http_is_method(hc->x.req, "GET"))
    return false; /* the app's */
  size_t n = 0;
  char *text = srv->on_metrics ? srv->on_metrics(srv, &n) : NULL;
  static const char type[] = "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n";
  res.status = text ? 200 : 500;
  res.headers = type;
  res.hlen = sizeof(type) - 1;
  res.has_type = true;
  hc->state = HTTP_C_BUSY;
  http_res_send(&hc->x, &res, text, text ? n : 0, NULL, NULL, NULL);
  free(text);
  return true;
}

static bool sv__is_upgrade(const http_request_t *r) {
  if (!r->upgrade) return false;
  const http_header_t *u = http_header(r, "upgrade");
  return u && http_list_has(u->value, u->value_len, "websocket");
}

/* A WebSocket handshake (RFC 6455 4.2): a valid one goes to on_upgrade,
 * another is refused. */
static void sv__upgrade(conn_t *c, http_conn_t *hc) {
  http_request_t *r = hc->x.req;
  const http_header_t *ver = http_header(r, "sec-websocket-version");
  const http_header_t *key = http_header(r, "sec-websocket-key");
  if (!http_is_method(r, "GET") || r->minor != 1 || !key || key->value_len != 24) {
    http_conn_refuse(c, hc, 400);
    return;
  }
  if (!ver || ver->value_len != 2 || memcmp(ver->value, "13", 2) != 0) {
    static const char resp[] =
        "HTTP/1.1 426 Upgrade Required\r\nSec-WebSocket-Version: 13\r\n"
        "Content-Length: 0\r\nConnection: close\r\n\r\n";
    reactor_conn_write(c, resp, sizeof(resp) - 1);
    hc->state = HTTP_C_CLOSING;
    reactor_conn_close(c, CONN_LOCAL);
    return;
  }
  hc->state = HTTP_C_BUSY; /* as for on_request */
  reactor_conn_set_timeout(c, 0);
  hc->srv->on_upgrade(&hc->x);
}

/* Whether the upgrade request offered subprotocol p (in any of its
 * Sec-WebSocket-Protocol fields, comma-separated; compared exactly, as the
 * client checks the answer exactly). */
bool http_ws_offered(const http_request_t *r, const char *p, size_t n) {
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

/* The request in hand is whole (or, streamed, its head): the server's
 * own answers first, then the application's. */
static void sv__dispatch(conn_t *c, http_conn_t *hc, const char *body,
                         size_t blen) {
  http_server_t *srv = hc->srv;
  if (srv->on_upgrade && sv__is_upgrade(hc->x.req)) {
    sv__upgrade(c, hc);
    return;
  }
  if (srv->status_len && sv__status(c, hc)) return;
  if (srv->on_before && srv->on_before(&hc->x, srv->on_request != NULL)) return;
  if (!srv->on_request) {
    static const char nf[] = "Not Found\n";
    const http_page_t *page = http_conn_page(hc, 404);
    char type[128];
    http_head_t res = http_exchange_head(&hc->x, 404);
    if (page) {
      res.hlen = (size_t)snprintf(type, sizeof(type), "Content-Type: %s\r\n",
                                  page->type);
      res.headers = type;
      res.has_type = true;
    }
    hc->state = HTTP_C_BUSY;
    http_res_send(&hc->x, &res, page ? page->body : nf,
                  page ? page->len : sizeof(nf) - 1, NULL, NULL, NULL);
    return;
  }
  /* The handler takes what it takes: no timeout while the app has it.
   * Set before the hook, which may answer (and set the next one) now. */
  hc->state = HTTP_C_BUSY;
  reactor_conn_set_timeout(c, 0);
  srv->on_request(&hc->x, body, blen);
}

void http_exchange_dispatch(http_conn_t *hc, const char *body, size_t blen) {
  sv__dispatch(hc->c, hc, body, blen);
}
