/* server: the HTTP/1.1 connection protocol (keep-alive, pipelining, back
 * pressure, timeouts, refusals, bodies, the response head, the access
 * log, the metrics path and the WebSocket handshake); see server.h. No
 * Lua here: what a request means is the application's, through hooks. */
#include "http/server.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "http/access.h"
#include "http/public.h"
#include "http/static.h"
#include "http/ws.h"

/* ---- buffers an idle connection gives back ---- */

/* The input buffer a request starts with, and the most of them (and of
 * request structs, 2.4 KiB each with their field table) a thread keeps
 * for the next request: a busy thread takes and gives back without
 * malloc, and one with 10,000 idle connections holds 64 of each, not
 * 10,000. */
#define SV_BUF 4096
#define SV_CACHE 64

struct http_cache {
  char *bufs[SV_CACHE];
  http_request_t *reqs[SV_CACHE];
  int nbufs, nreqs;
};

void http_cache_free(http_cache_t *k) {
  if (!k) return;
  for (int i = 0; i < k->nbufs; i++) free(k->bufs[i]);
  for (int i = 0; i < k->nreqs; i++) free(k->reqs[i]);
  free(k);
}

static http_cache_t *sv__cache(http_server_t *srv) {
  if (!*srv->cache) *srv->cache = calloc(1, sizeof(**srv->cache));
  return *srv->cache;
}

/* Gives hc's input buffer (if it is of the usual size) and request struct
 * back to the cache. */
static void sv__give_back(http_conn_t *hc) {
  http_cache_t *k = sv__cache(hc->srv);
  if (hc->in) {
    if (k && hc->cap == SV_BUF && k->nbufs < SV_CACHE)
      k->bufs[k->nbufs++] = hc->in;
    else
      free(hc->in);
  }
  if (hc->req) {
    if (k && k->nreqs < SV_CACHE)
      k->reqs[k->nreqs++] = hc->req;
    else
      free(hc->req);
  }
  hc->in = NULL;
  hc->req = NULL;
  hc->len = hc->cap = 0;
}

/* A request begins: hc gets an input buffer and a request struct. False
 * when out of memory. */
static bool sv__take(http_conn_t *hc) {
  http_cache_t *k = sv__cache(hc->srv);
  if (!hc->req) {
    hc->req = k && k->nreqs ? k->reqs[--k->nreqs] : malloc(sizeof(*hc->req));
    if (!hc->req) return false;
  }
  if (!hc->in) {
    hc->in = k && k->nbufs ? k->bufs[--k->nbufs] : malloc(SV_BUF);
    if (!hc->in) return false;
    hc->cap = SV_BUF;
    hc->len = 0;
  }
  return true;
}

/* Nothing is buffered and no request is in hand: the buffers go back. */
static void sv__idle(http_conn_t *hc) {
  if (hc->len == 0 && hc->state == HTTP_C_HEAD) sv__give_back(hc);
}

void http_conn_drop_request(http_conn_t *hc) {
  sv__give_back(hc);
  hc->head_len = 0;
}

/* ---- the response head ---- */

static const char *sv__reason(int status) {
  switch (status) {
  case 100: return "Continue";
  case 101: return "Switching Protocols";
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 206: return "Partial Content";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 303: return "See Other";
  case 304: return "Not Modified";
  case 307: return "Temporary Redirect";
  case 308: return "Permanent Redirect";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 413: return "Content Too Large";
  case 415: return "Unsupported Media Type";
  case 416: return "Range Not Satisfiable";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 505: return "HTTP Version Not Supported";
  default: return "Status";
  }
}

static const char *sv__date(void) {
  static __thread time_t last;
  static __thread char buf[32];
  time_t now = time(NULL);
  if (now != last) {
    http_static_format_date((int64_t)now, buf);
    last = now;
  }
  return buf;
}

const char *http_reason(int status) { return sv__reason(status); }
const char *http_date_now(void) { return sv__date(); }


static char *sv__put(char *p, const char *s, size_t n) {
  memcpy(p, s, n);
  return p + n;
}
#define SV_PUT(p, lit) sv__put(p, lit, sizeof(lit) - 1)

static char *sv__put_uint(char *p, uint64_t v) {
  char tmp[20];
  int i = 0;
  do tmp[i++] = (char)('0' + v % 10);
  while ((v /= 10));
  while (i) *p++ = tmp[--i];
  return p;
}

int http_conn_write_head(conn_t *c, http_conn_t *hc, http_head_t *res,
                         long long len, const char *body, bool *inlined) {
  if (hc && !hc->keep_alive) res->keep_alive = false; /* shutting down */
  if (hc && hc->streaming && (!http_conn_body_finished(hc) || hc->body_err))
    res->keep_alive = false; /* the rest of the body is in the way */
  if (hc) {
    hc->log_status = res->status;
    hc->log_bytes = len > 0 && !res->head_only ? (uint64_t)len : 0;
  }
  bool chunked = len < 0 && !res->http10;
  if (len < 0 && res->http10) res->keep_alive = false;
  size_t blen = body && len > 0 && len <= HTTP_INLINE_BODY && !res->head_only
                    ? (size_t)len : 0;
  char stack[512 + HTTP_INLINE_BODY + 1024];
  /* `need` leaves room for the fixed lines below */
  size_t need = 400 + res->hlen + blen;
  char *buf = need <= sizeof(stack) ? stack : malloc(need);
  if (!buf) return -ENOMEM;
  /* memcpy, not snprintf: this runs once per response */
  char *p = buf;
  p = SV_PUT(p, "HTTP/1.1 ");
  p = sv__put_uint(p, (uint64_t)res->status);
  *p++ = ' ';
  const char *reason = sv__reason(res->status);
  p = sv__put(p, reason, strlen(reason));
  p = SV_PUT(p, "\r\nDate: ");
  p = sv__put(p, sv__date(), 29);
  p = SV_PUT(p, "\r\n");
  if (chunked) {
    p = SV_PUT(p, "Transfer-Encoding: chunked\r\n");
  } else if (len >= 0 && res->status != 204 && res->status != 304 &&
             res->status >= 200) {
    p = SV_PUT(p, "Content-Length: ");
    p = sv__put_uint(p, (uint64_t)len);
    p = SV_PUT(p, "\r\n");
  }
  if (!res->keep_alive)
    p = SV_PUT(p, "Connection: close\r\n");
  else if (res->http10)
    p = SV_PUT(p, "Connection: keep-alive\r\n");
  if (!res->has_type && len != 0)
    p = SV_PUT(p, "Content-Type: text/plain; charset=utf-8\r\n");
  size_t at = (size_t)(p - buf);
  if (res->hlen) memcpy(buf + at, res->headers, res->hlen);
  at += res->hlen;
  memcpy(buf + at, "\r\n", 2);
  at += 2;
  if (blen) memcpy(buf + at, body, blen);
  at += blen;
  *inlined = blen > 0 || len <= 0 || res->head_only;
  int rc = reactor_conn_write(c, buf, at);
  if (buf != stack) free(buf);
  return rc;
}

/* ---- the access log ---- */

void http_conn_log(conn_t *c, http_conn_t *hc, int status, uint64_t bytes) {
  http_server_t *srv = hc->srv;
  unsigned cls = (unsigned)status / 100;
  if (cls >= 1 && cls <= 5) stats_add(srv->stats, STAT_HTTP_1XX + (int)cls - 1, 1);
  if (!srv->access_fd || *srv->access_fd < 0) return;
  char ip[128];
  int port;
  if (sock_peer(reactor_conn_fd(c), ip, sizeof(ip), &port)) strcpy(ip, "-");
  const http_request_t *req = hc->state == HTTP_C_HEAD ? NULL : hc->req;
  size_t start = 0, rawlen = 0;
  long span;
  if (!req && hc->in && (span = http_request_line_span(hc->in, hc->len, &start)) > 0)
    rawlen = (size_t)span;
  uint64_t took = reactor_now(srv->r) - hc->t_start;
  char buf[HTTP_ACCESS_LINE_MAX];
  size_t n = http_access_line(buf, ip, time(NULL), req, hc->in + start, rawlen,
                              status, bytes, (double)took / 1000.0);
  /* one write(2), so lines of different threads and processes don't mix
   * (O_APPEND) */
  ssize_t w = write(*srv->access_fd, buf, n);
  (void)w; /* a full disk loses log lines, not requests */
}

/* ---- refusals and completion ---- */

void http_conn_refuse(conn_t *c, http_conn_t *hc, int status) {
  const char *reason = http_reason(status);
  char buf[512];
  int n = snprintf(buf, sizeof(buf),
                   "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: text/plain\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                   status, reason, http_date_now(), strlen(reason) + 1, reason);
  reactor_conn_write(c, buf, (size_t)n);
  http_conn_log(c, hc, status, strlen(reason) + 1);
  hc->state = HTTP_C_CLOSING;
  reactor_conn_close(c, CONN_LOCAL);
}

static void sv__process(conn_t *c, http_conn_t *hc);
static void sv__body_more(conn_t *c, http_conn_t *hc);

/* Runs as the connection's callback after a response finished. */
static void sv__next(conn_t *c, void *arg) {
  if (!c) return;
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == HTTP_C_HEAD) sv__process(c, hc);
}

void http_conn_complete(conn_t *c, http_conn_t *hc, bool keep_alive) {
  http_conn_log(c, hc, hc->log_status, hc->log_bytes);
  if (hc->streaming) { /* what is left of its body can't be told from the
                          next request without reading it: close */
    if (!hc->body_done || hc->body_err) keep_alive = false;
    hc->streaming = false;
    if (hc->paused) reactor_conn_resume(c);
    hc->paused = false;
  }
  size_t used = hc->head_len;
  if (used > hc->len) used = hc->len;
  memmove(hc->in, hc->in + used, hc->len - used);
  hc->len -= used;
  hc->head_len = 0;
  if (!keep_alive) {
    hc->state = HTTP_C_CLOSING;
    reactor_conn_close(c, CONN_LOCAL);
    return;
  }
  hc->state = HTTP_C_HEAD;
  hc->t_start = reactor_now(hc->srv->r);
  hc->deadline = hc->t_start + hc->srv->header_timeout_ms;
  /* Not from here (inside the application's handler): pipelined requests
   * run as the connection's next callback. */
  if (hc->len) {
    reactor_conn_task(c, sv__next, NULL);
  } else {
    reactor_conn_set_timeout(c, hc->srv->idle_ms);
    sv__idle(hc);
  }
}

/* ---- requests ---- */

/* `status`: GET or HEAD of that path answers the server's metrics, from
 * C (no application code runs). */
static bool sv__status(conn_t *c, http_conn_t *hc) {
  http_server_t *srv = hc->srv;
  const char *path, *q;
  size_t plen, qlen;
  http_target_split(hc->req->target, hc->req->target_len, &path, &plen, &q, &qlen);
  if (plen != srv->status_len || memcmp(path, srv->status_path, plen) != 0)
    return false;
  http_head_t res = http_conn_head(hc, 200);
  if (!res.head_only && !http_is_method(hc->req, "GET"))
    return false; /* the app's */
  size_t n = 0;
  char *text = srv->on_metrics ? srv->on_metrics(srv, &n) : NULL;
  static const char type[] = "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n";
  res.status = text ? 200 : 500;
  res.headers = type;
  res.hlen = sizeof(type) - 1;
  res.has_type = true;
  bool inlined;
  hc->state = HTTP_C_BUSY;
  if (http_conn_write_head(c, hc, &res, text ? (long long)n : 0, text, &inlined) == 0 &&
      !inlined && !res.head_only && text)
    reactor_conn_write(c, text, n);
  free(text);
  http_conn_complete(c, hc, res.keep_alive && hc->keep_alive);
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
  http_request_t *r = hc->req;
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
  hc->srv->on_upgrade(c, hc);
}

int http_conn_upgrade_101(conn_t *c, http_conn_t *hc, const char *extra,
                          size_t elen) {
  char stack[512];
  size_t need = 160 + elen;
  char *resp = need <= sizeof(stack) ? stack : malloc(need);
  if (!resp) return -ENOMEM;
  const http_header_t *key = http_header(hc->req, "sec-websocket-key");
  char accept[29];
  ws_accept_key(key->value, key->value_len, accept);
  int n = snprintf(resp, need,
                   "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n",
                   accept);
  if (elen) memcpy(resp + n, extra, elen);
  memcpy(resp + n + elen, "\r\n", 2);
  int rc = reactor_conn_write(c, resp, (size_t)n + elen + 2);
  if (resp != stack) free(resp);
  http_conn_log(c, hc, 101, 0);
  return rc;
}

void http_conn_stream(conn_t *c, http_conn_t *hc, const http_stream_ops_t *ops,
                      void *st, const char **rest, size_t *rest_len) {
  hc->state = HTTP_C_STREAM;
  hc->stream_ops = ops;
  hc->stream = st;
  reactor_conn_set_timeout(c, hc->srv->idle_ms);
  size_t used = hc->head_len < hc->len ? hc->head_len : hc->len;
  if (rest) *rest = hc->in ? hc->in + used : "";
  if (rest_len) *rest_len = hc->len - used;
}

/* The request in hand is whole (or, streamed, its head): the server's
 * own answers first, then the application's. */
static void sv__dispatch(conn_t *c, http_conn_t *hc, const char *body,
                         size_t blen) {
  http_server_t *srv = hc->srv;
  if (srv->on_upgrade && sv__is_upgrade(hc->req)) {
    sv__upgrade(c, hc);
    return;
  }
  if (srv->status_len && sv__status(c, hc)) return;
  if (srv->public_fd >= 0 && http_public_answer(c, hc, srv->on_request != NULL))
    return;
  if (!srv->on_request) {
    static const char nf[] = "Not Found\n";
    http_head_t res = http_conn_head(hc, 404);
    bool inlined;
    hc->state = HTTP_C_BUSY;
    http_conn_write_head(c, hc, &res, (long long)sizeof(nf) - 1, nf, &inlined);
    http_conn_complete(c, hc, res.keep_alive && hc->keep_alive);
    return;
  }
  /* The handler takes what it takes: no timeout while the app has it.
   * Set before the hook, which may answer (and set the next one) now. */
  hc->state = HTTP_C_BUSY;
  reactor_conn_set_timeout(c, 0);
  srv->on_request(c, hc, body, blen);
}

static void sv__body_add(const char *p, size_t n, void *arg) {
  http_conn_t *hc = arg;
  if (hc->body_len + n > hc->body_cap) {
    size_t cap = hc->body_cap ? hc->body_cap : 4096;
    while (cap < hc->body_len + n) cap *= 2;
    char *b = realloc(hc->body, cap);
    if (!b) {
      hc->body_len = SIZE_MAX; /* marks the failure */
      return;
    }
    hc->body = b;
    hc->body_cap = cap;
  }
  if (hc->body_len != SIZE_MAX) {
    memcpy(hc->body + hc->body_len, p, n);
    hc->body_len += n;
  }
}

/* The idle timer, used as the arriving request's deadline. */
static void sv__until_deadline(conn_t *c, http_conn_t *hc) {
  uint64_t now = reactor_now(hc->srv->r);
  reactor_conn_set_timeout(c, hc->deadline > now ? (uint32_t)(hc->deadline - now) : 1);
}

static void sv__stream_start(conn_t *c, http_conn_t *hc);

/* Parses what is buffered and runs the requests that are whole, one at a
 * time. */
static void sv__process(conn_t *c, http_conn_t *hc) {
  http_server_t *srv = hc->srv;
  while (hc->state == HTTP_C_HEAD || hc->state == HTTP_C_BODY) {
    if (hc->state == HTTP_C_HEAD) {
      if (hc->len == 0) {
        reactor_conn_set_timeout(c, srv->idle_ms);
        sv__idle(hc);
        return;
      }
      /* Back pressure: reading has stopped, but requests already in the
       * buffer (64 KiB of pipelined GETs is thousands) would each queue
       * a response. They wait for on_ready; a client that reads nothing
       * in idle_ms is closed. */
      if (reactor_conn_congested(c)) {
        hc->held_back = true;
        reactor_conn_set_timeout(c, srv->idle_ms);
        return;
      }
      int rc = http_parse_head(hc->in, hc->len, srv->max_header, hc->req);
      if (rc == HTTP_NEED_MORE) {
        sv__until_deadline(c, hc);
        return;
      }
      if (rc < 0) {
        http_conn_refuse(c, hc, -rc);
        return;
      }
      hc->head_len = (size_t)rc;
      /* A draining server (replaced by a reload or a restart) answers
       * with Connection: close, and the client's next request goes to the
       * new process: no idle connection is closed under a request. */
      hc->keep_alive = hc->req->keep_alive && !reactor_draining(srv->r);
      if (hc->req->content_length > (int64_t)srv->max_body) {
        http_conn_refuse(c, hc, 413); /* before reading it */
        return;
      }
      hc->continued = false;
      hc->chunk_raw = 0;
      hc->body_len = 0;
      if (hc->req->chunked) http_chunked_init(&hc->chunk, srv->max_header);
      hc->state = HTTP_C_BODY;
      if (srv->stream_body) {
        sv__stream_start(c, hc);
        continue;
      }
    }
    const char *body;
    size_t blen, used;
    if (hc->req->chunked) {
      bool done = false;
      ssize_t n = http_chunked_feed(&hc->chunk, hc->in + hc->head_len + hc->chunk_raw,
                                    hc->len - hc->head_len - hc->chunk_raw,
                                    sv__body_add, hc, &done);
      if (n < 0) {
        http_conn_refuse(c, hc, 400);
        return;
      }
      hc->chunk_raw += (size_t)n;
      if (hc->body_len == SIZE_MAX) {
        http_conn_refuse(c, hc, 500);
        return;
      }
      if (hc->body_len > srv->max_body) {
        http_conn_refuse(c, hc, 413);
        return;
      }
      if (!done) goto wait_body;
      body = hc->body ? hc->body : "";
      blen = hc->body_len;
      used = hc->head_len + hc->chunk_raw;
    } else {
      blen = hc->req->content_length > 0 ? (size_t)hc->req->content_length : 0;
      if (hc->len - hc->head_len < blen) goto wait_body;
      body = hc->in + hc->head_len;
      used = hc->head_len + blen;
    }
    /* The request leaves the buffer when its response is done; until then
     * its strings stay where they are. */
    hc->head_len = used;
    sv__dispatch(c, hc, body, blen);
    continue; /* HTTP_C_BUSY ends the loop unless the answer is done */
  wait_body:
    if (hc->req->expect_continue && !hc->continued) {
      hc->continued = true;
      static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
      reactor_conn_write(c, cont, sizeof(cont) - 1);
    }
    sv__until_deadline(c, hc);
    return;
  }
}

/* ---- the protocol's events ---- */

http_conn_t *http_conn_open(http_server_t *srv, conn_t *c) {
  size_t size = srv->conn_size > sizeof(http_conn_t) ? srv->conn_size
                                                     : sizeof(http_conn_t);
  http_conn_t *hc = calloc(1, size);
  if (!hc) {
    reactor_conn_force_close(c, CONN_ERROR);
    return NULL;
  }
  hc->srv = srv;
  hc->uuid = reactor_conn_uuid(c);
  reactor_conn_set_udata(c, hc);
  reactor_conn_set_timeout(c, srv->header_timeout_ms);
  return hc;
}

void *http_conn_stream_of(conn_t *c, const http_stream_ops_t *ops) {
  const proto_t *p = reactor_conn_service(c);
  /* the application's service starts with its proto_t (reactor_listen's
   * `service` is what reactor_conn_service gives) */
  if (!p || p->on_data != http_server_on_data) return NULL;
  http_conn_t *hc = reactor_conn_udata(c);
  return hc && hc->state == HTTP_C_STREAM && hc->stream_ops == ops ? hc->stream
                                                                   : NULL;
}

void http_server_on_data(conn_t *c, const char *data, size_t len) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (!hc || hc->state == HTTP_C_CLOSING) return;
  if (hc->state == HTTP_C_STREAM) {
    hc->stream_ops->on_data(c, hc->stream, data, len);
    return;
  }
  http_server_t *srv = hc->srv;
  /* What one request may take in the buffer: its head and its body (a
   * chunked body's framing counts, up to a head's worth). */
  size_t limit = srv->max_header + srv->max_body + srv->max_header;
  if (hc->len + len > limit) {
    http_conn_refuse(c, hc, hc->state == HTTP_C_HEAD ? 431 : 413);
    return;
  }
  uint64_t now = reactor_now(srv->r);
  if (hc->len == 0) { /* a request begins */
    hc->deadline = now + srv->header_timeout_ms;
    hc->t_start = now;
  } else if (now >= hc->deadline) { /* dribbled in too slowly */
    http_conn_refuse(c, hc, 408);
    return;
  }
  if ((!hc->in || !hc->req) && !sv__take(hc)) {
    http_conn_refuse(c, hc, 500);
    return;
  }
  if (hc->len + len > hc->cap) {
    size_t cap = hc->cap ? hc->cap : SV_BUF;
    while (cap < hc->len + len) cap *= 2;
    char *p = realloc(hc->in, cap);
    if (!p) {
      http_conn_refuse(c, hc, 500);
      return;
    }
    hc->in = p;
    hc->cap = cap;
    /* A parsed head waiting for its body points into the buffer: parse it
     * again where it is now (the same bytes: it succeeds as before). */
    if (hc->state == HTTP_C_BODY || (hc->state == HTTP_C_BUSY && hc->streaming))
      http_parse_head(hc->in, hc->len, srv->max_header, hc->req);
  }
  memcpy(hc->in + hc->len, data, len);
  hc->len += len;
  if (hc->state == HTTP_C_HEAD || hc->state == HTTP_C_BODY) sv__process(c, hc);
  else if (hc->state == HTTP_C_BUSY && hc->streaming) sv__body_more(c, hc);
}

void http_server_on_timeout(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc && hc->reading) {
    hc->body_err = "timeout"; /* the body stopped coming */
    hc->srv->on_body(c, hc);
  } else if (hc && hc->held_back) {
    /* Answers wait for a client that stopped reading: nothing to say */
    reactor_conn_force_close(c, CONN_TIMEOUT);
  } else if (hc && hc->state == HTTP_C_STREAM)
    hc->stream_ops->on_timeout(c, hc->stream);
  else if (hc && hc->state != HTTP_C_BUSY && hc->len > 0)
    http_conn_refuse(c, hc, 408); /* a request that comes too slowly */
  else
    reactor_conn_close(c, CONN_TIMEOUT);
}

void http_server_on_ready(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == HTTP_C_STREAM) hc->stream_ops->on_ready(c, hc->stream);
  else if (hc && hc->held_back && hc->state == HTTP_C_HEAD) {
    hc->held_back = false;
    sv__process(c, hc);
  }
}

void http_server_on_shutdown(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == HTTP_C_STREAM) hc->stream_ops->on_shutdown(c, hc->stream);
  else if (!hc || hc->state != HTTP_C_BUSY) reactor_conn_close(c, CONN_SHUTDOWN);
  else hc->keep_alive = false; /* close after the response in flight */
}

void http_conn_closed(conn_t *c, http_conn_t *hc, int reason) {
  if (hc && hc->stream) {
    void *st = hc->stream;
    hc->stream = NULL;
    hc->state = HTTP_C_CLOSING;
    hc->stream_ops->on_closed(c, st, reason);
  }
  reactor_conn_set_udata(c, NULL);
  if (!hc) return;
  sv__give_back(hc);
  free(hc->body);
  free(hc);
}

/* ---- streamed request bodies (stream_body) ---- */

/* Bytes of the body that came and were not taken. */
static size_t sv__body_unread(const http_conn_t *hc) {
  if (hc->req->chunked) return hc->body_len;
  size_t have = hc->len - hc->head_len;
  return (uint64_t)have < hc->body_left ? have : (size_t)hc->body_left;
}

/* Chunked: decodes what came (into hc->body) and drops its raw bytes. */
static void sv__body_decode(http_conn_t *hc) {
  if (!hc->req->chunked || hc->body_done || hc->body_err) return;
  size_t before = hc->body_len;
  bool done = false;
  ssize_t n = http_chunked_feed(&hc->chunk, hc->in + hc->head_len,
                                hc->len - hc->head_len, sv__body_add, hc, &done);
  if (n < 0 || hc->body_len == SIZE_MAX) {
    hc->body_err = n < 0 ? "malformed chunked body" : "out of memory";
    hc->body_len = 0;
    return;
  }
  hc->body_seen += hc->body_len - before;
  if (hc->body_seen > hc->srv->max_body) {
    hc->body_err = "too large";
    hc->body_len = 0;
    return;
  }
  memmove(hc->in + hc->head_len, hc->in + hc->head_len + n,
          hc->len - hc->head_len - (size_t)n);
  hc->len -= (size_t)n;
  if (done) hc->body_done = true; /* once what is decoded is taken */
}

bool http_conn_body_finished(const http_conn_t *hc) {
  return hc->req->chunked ? hc->body_done && hc->body_len == 0
                          : hc->body_left == 0;
}

long http_conn_body_peek(http_conn_t *hc, const char **p) {
  if (hc->body_err) return HTTP_BODY_ERR;
  size_t n = sv__body_unread(hc);
  if (n == 0) {
    if (!http_conn_body_finished(hc)) return HTTP_BODY_WAIT;
    hc->body_done = true;
    return HTTP_BODY_END;
  }
  *p = hc->req->chunked ? hc->body : hc->in + hc->head_len;
  return (long)n;
}

void http_conn_body_consume(conn_t *c, http_conn_t *hc, size_t n) {
  if (hc->req->chunked) {
    hc->body_len = 0; /* peek gives all of it */
  } else {
    memmove(hc->in + hc->head_len, hc->in + hc->head_len + n,
            hc->len - hc->head_len - n);
    hc->len -= n;
    hc->body_left -= n;
    if (!hc->body_left) hc->body_done = true;
  }
  if (hc->paused) {
    hc->paused = false;
    reactor_conn_resume(c);
  }
}

void http_conn_body_wanted(conn_t *c, http_conn_t *hc) {
  if (hc->req->expect_continue && !hc->continued && !hc->body_done) {
    hc->continued = true; /* the handler wants the body: let it come */
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    reactor_conn_write(c, cont, sizeof(cont) - 1);
  }
}

/* The head of a request with stream_body is in: the application runs
 * now. */
static void sv__stream_start(conn_t *c, http_conn_t *hc) {
  hc->streaming = true;
  hc->body_err = NULL;
  hc->reading = hc->paused = false;
  hc->body_seen = 0;
  hc->body_left = hc->req->content_length > 0 ? (uint64_t)hc->req->content_length : 0;
  hc->body_done = !hc->req->chunked && hc->body_left == 0;
  sv__body_decode(hc);
  sv__dispatch(c, hc, NULL, 0);
}

/* More body bytes came while the handler runs or waits. */
static void sv__body_more(conn_t *c, http_conn_t *hc) {
  sv__body_decode(hc);
  if (!hc->paused && sv__body_unread(hc) > HTTP_BODY_WINDOW) {
    hc->paused = true;
    reactor_conn_pause(c);
  }
  if (hc->reading &&
      (hc->body_err || sv__body_unread(hc) || http_conn_body_finished(hc)))
    hc->srv->on_body(c, hc);
}
