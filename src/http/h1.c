/* SPDX-License-Identifier: MIT */

/* h1: the HTTP/1.1 framer of an HTTP listener. It owns a connection from
 * its first byte to its close: reading and buffering requests (http1
 * parses), keep-alive and pipelining (one request in flight, the next
 * ones wait in the buffer), back pressure (pipelined requests wait while
 * reactor_conn_congested), the header and idle timeouts, refusals (400,
 * 408, 413, 431, 500...), 100 Continue, chunked bodies and streamed
 * bodies (stream_body). A whole request (or its head) goes to the
 * dispatcher (http_exchange_dispatch, server.h); the response's framing
 * is the writer's (response.c); the exchange's completion, its refusal
 * and its body come back here through http_framer_h1 (http/exchange.h).
 * h2c (by prior knowledge, or Upgrade: h2c) hands the connection to
 * HTTP/2 (http_h2_take, http_h2_upgrade). No Lua here. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "http/exchange.h"
#include "http/response.h"
#include "http/select.h"
#include "http/server.h"

/* ---- buffers an idle connection gives back ---- */

/* The input buffer a request starts with, and the most of them (and of
 * request structs, 2.4 KiB each with their field table) a thread keeps
 * for the next request: a busy thread takes and gives back without
 * malloc, and one with 10,000 idle connections holds 64 of each, not
 * 10,000. */
#define H1_BUF 4096
#define H1_CACHE 64

/* A request struct and the writer's state of its response: one block,
 * taken from the cache and given back together. */
typedef struct {
  http_request_t req;
  http_out_t out;
  char log_id[HTTP_LOG_ID_MAX];
} h1_req_t;

struct http_cache {
  char *bufs[H1_CACHE];
  http_request_t *reqs[H1_CACHE];
  int nbufs, nreqs;
};

void http_cache_free(http_cache_t *k) {
  if (!k) return;
  for (int i = 0; i < k->nbufs; i++) free(k->bufs[i]);
  for (int i = 0; i < k->nreqs; i++) free(k->reqs[i]);
  free(k);
}

static http_cache_t *h1__cache(http_server_t *srv) {
  if (!*srv->cache) *srv->cache = calloc(1, sizeof(**srv->cache));
  return *srv->cache;
}

/* Gives hc's input buffer (if it is of the usual size) and request struct
 * back to the cache. */
static void h1__give_back(http_conn_t *hc) {
  http_cache_t *k = h1__cache(hc->srv);
  if (hc->in) {
    if (k && hc->cap == H1_BUF && k->nbufs < H1_CACHE)
      k->bufs[k->nbufs++] = hc->in;
    else
      free(hc->in);
  }
  if (hc->x.req) {
    http_out_reset(hc->x.out);
    hc->x.out = NULL;
    if (k && k->nreqs < H1_CACHE)
      k->reqs[k->nreqs++] = hc->x.req;
    else
      free(hc->x.req);
  }
  hc->in = NULL;
  hc->x.req = NULL;
  hc->len = hc->cap = 0;
}

/* A request begins: hc gets an input buffer and a request struct. False
 * when out of memory. */
static bool h1__take(http_conn_t *hc) {
  http_cache_t *k = h1__cache(hc->srv);
  if (!hc->x.req) {
    bool fresh = !k || !k->nreqs; /* a cached one was reset when given back */
    hc->x.req = !fresh ? k->reqs[--k->nreqs] : malloc(sizeof(h1_req_t));
    if (!hc->x.req) return false;
    hc->x.out = &((h1_req_t *)(void *)hc->x.req)->out;
    if (fresh) memset(hc->x.out, 0, sizeof(*hc->x.out));
    hc->x.log_id = ((h1_req_t *)(void *)hc->x.req)->log_id;
    hc->x.log_id_len = 0;
  }
  if (!hc->in) {
    hc->in = k && k->nbufs ? k->bufs[--k->nbufs] : malloc(H1_BUF);
    if (!hc->in) return false;
    hc->cap = H1_BUF;
    hc->len = 0;
  }
  return true;
}

/* Nothing is buffered and no request is in hand: the buffers go back. */
static void h1__idle(http_conn_t *hc) {
  if (hc->len == 0 && hc->state == HTTP_C_HEAD) h1__give_back(hc);
}

void http_conn_drop_request(http_conn_t *hc) {
  h1__give_back(hc);
  hc->head_len = 0;
}

/* ---- refusals and completion ---- */

/* Answers `status` with a short text body (or its error page) and closes
 * the connection (http_conn_refuse). */
static void h1_refuse(http_conn_t *hc, int status) {
  conn_t *c = hc->c;
  const char *reason = http_reason(status);
  const http_page_t *page = http_conn_page(hc, status);
  if (page) {
    char head[512];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: %s\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     status, reason, http_date_now(), page->type, page->len);
    if (reactor_conn_write(c, head, (size_t)n) == 0)
      reactor_conn_write(c, page->body, page->len);
    http_conn_log(hc, status, page->len);
    hc->state = HTTP_C_CLOSING;
    reactor_conn_close(c, CONN_LOCAL);
    return;
  }
  char buf[512];
  int n = snprintf(buf, sizeof(buf),
                   "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: text/plain\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                   status, reason, http_date_now(), strlen(reason) + 1, reason);
  reactor_conn_write(c, buf, (size_t)n);
  http_conn_log(hc, status, strlen(reason) + 1);
  if (hc->x.out) http_out_reset(hc->x.out);
  hc->state = HTTP_C_CLOSING;
  reactor_conn_close(c, CONN_LOCAL);
}

static void h1__process(conn_t *c, http_conn_t *hc);
static void h1__body_more(conn_t *c, http_conn_t *hc);

/* Runs as the connection's callback after a response finished. */
static void h1__next(conn_t *c, void *arg) {
  if (!c) return;
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == HTTP_C_HEAD) h1__process(c, hc);
}

/* The exchange's response is complete (http_exchange_complete). */
static void h1_complete(http_exchange_t *x, bool keep_alive) {
  http_conn_t *hc = x->conn;
  conn_t *c = hc->c;
  http_conn_log(hc, hc->x.log_status, hc->x.log_bytes);
  if (hc->x.out) http_out_reset(hc->x.out);
  hc->x.log_id_len = 0;
  if (hc->x.streaming) { /* what is left of its body can't be told from the
                          next request without reading it: close */
    if (!hc->x.body_done || hc->x.body_err) keep_alive = false;
    hc->x.streaming = false;
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
  /* Not from here (inside the application's handler): pipelined requests
   * run as the connection's next callback. The next request begins now
   * if it is buffered, else at its first byte (h1_on_data: no clock read
   * here for a keep-alive connection that waits). */
  if (hc->len) {
    hc->x.t_start = reactor_now(hc->srv->r);
    hc->deadline = hc->x.t_start + hc->srv->header_timeout_ms;
    reactor_conn_task(c, h1__next, NULL);
  } else {
    reactor_conn_set_timeout(c, hc->srv->idle_ms);
    h1__idle(hc);
  }
}

/* ---- requests ---- */

/* Upgrade: h2c, with Connection naming Upgrade and HTTP2-Settings. */
static bool h1__wants_h2c(const http_request_t *r) {
  if (!r->upgrade) return false;
  const http_header_t *u = http_header(r, "upgrade");
  const http_header_t *cn = http_header(r, "connection");
  return u && cn && http_list_has(u->value, u->value_len, "h2c") &&
         http_list_has(cn->value, cn->value_len, "http2-settings");
}

static void h1__body_add(const char *p, size_t n, void *arg) {
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
static void h1__until_deadline(conn_t *c, http_conn_t *hc) {
  uint64_t now = reactor_now(hc->srv->r);
  reactor_conn_set_timeout(
      c, hc->deadline > now ? (uint32_t)(hc->deadline - now) : 1);
}

static void h1__stream_start(conn_t *c, http_conn_t *hc);

/* Parses what is buffered and runs the requests that are whole, one at a
 * time. */
static void h1__process(conn_t *c, http_conn_t *hc) {
  http_server_t *srv = hc->srv;
  while (hc->state == HTTP_C_HEAD || hc->state == HTTP_C_BODY) {
    if (hc->state == HTTP_C_HEAD) {
      if (hc->len == 0) {
        reactor_conn_set_timeout(c, srv->idle_ms);
        h1__idle(hc);
        return;
      }
      /* Back pressure: reading has stopped, but requests already in the
       * buffer (64 KiB of pipelined GETs is thousands) would each queue
       * a response. They wait for on_ready; a client that reads nothing
       * in idle_ms is closed. */
      if (reactor_conn_congested(c) ||
          reactor_conn_pending(c) >= HTTP_PIPELINE_BUDGET) {
        hc->held_back = true;
        reactor_conn_pause(c); /* the next requests wait in the socket */
        reactor_conn_set_timeout(c, srv->idle_ms);
        return;
      }
      int rc = http_parse_head(hc->in, hc->len, srv->max_header, hc->x.req);
      if (rc == HTTP_NEED_MORE) {
        h1__until_deadline(c, hc);
        return;
      }
      if (rc < 0) {
        http_conn_refuse(c, hc, -rc);
        return;
      }
      hc->head_len = (size_t)rc;
      bool first = hc->x.id == 0;
      hc->x.id = ++srv->exchanges;
      hc->x.version = hc->x.req->minor == 0 ? "1.0" : "1.1";
      /* A draining server (replaced by a reload or a restart) answers
       * with Connection: close, and the client's next request goes to the
       * new process: no idle connection is closed under a request. */
      hc->x.keep_alive = hc->x.req->keep_alive && !reactor_draining(srv->r);
      /* Upgrade: h2c on a first request with nothing pipelined after it
       * (RFC 7540 3.2; cleartext only): stream 1 of HTTP/2 answers it */
      if (first && srv->h2c && !reactor_draining(srv->r) &&
          hc->x.req->minor == 1 && hc->len == hc->head_len &&
          h1__wants_h2c(hc->x.req) && !reactor_conn_tls(c, NULL) &&
          http_h2_upgrade(hc)) {
        hc->head_len = 0;
        h1__give_back(hc);
        http_h2_upgraded(hc);
        return;
      }
      if (hc->x.req->content_length > (int64_t)srv->max_body) {
        http_conn_refuse(c, hc, 413); /* before reading it */
        return;
      }
      hc->continued = false;
      hc->chunk_raw = 0;
      hc->body_len = 0;
      if (hc->x.req->chunked) http_chunked_init(&hc->chunk, srv->max_header);
      hc->state = HTTP_C_BODY;
      if (srv->stream_body) {
        h1__stream_start(c, hc);
        continue;
      }
    }
    const char *body;
    size_t blen, used;
    if (hc->x.req->chunked) {
      bool done = false;
      ssize_t n = http_chunked_feed(
          &hc->chunk, hc->in + hc->head_len + hc->chunk_raw,
          hc->len - hc->head_len - hc->chunk_raw, h1__body_add, hc, &done);
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
      blen =
          hc->x.req->content_length > 0 ? (size_t)hc->x.req->content_length : 0;
      if (hc->len - hc->head_len < blen) goto wait_body;
      body = hc->in + hc->head_len;
      used = hc->head_len + blen;
    }
    /* The request leaves the buffer when its response is done; until then
     * its strings stay where they are. */
    hc->head_len = used;
    http_exchange_dispatch(hc, body, blen);
    continue; /* HTTP_C_BUSY ends the loop unless the answer is done */
  wait_body:
    if (hc->x.req->expect_continue && !hc->continued) {
      hc->continued = true;
      static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
      reactor_conn_write(c, cont, sizeof(cont) - 1);
    }
    h1__until_deadline(c, hc);
    return;
  }
}

/* ---- the protocol's events ---- */

static http_conn_t *h1_open(http_server_t *srv, conn_t *c) {
  size_t size = srv->conn_size > sizeof(http_conn_t) ? srv->conn_size
                                                     : sizeof(http_conn_t);
  http_conn_t *hc = calloc(1, size);
  if (!hc) {
    reactor_conn_force_close(c, CONN_ERROR);
    return NULL;
  }
  hc->srv = srv;
  hc->framer = &http_framer_h1;
  hc->c = c;
  hc->x.conn = hc;
  hc->uuid = reactor_conn_uuid(c);
  reactor_conn_set_udata(c, hc);
  reactor_conn_set_timeout(c, srv->header_timeout_ms);
  return hc;
}

/* A streamed body's bytes (Content-Length) with none of it waiting in
 * `in`: its reader takes them from the read itself, so a reader that
 * keeps up copies nothing (an upload to disk: a copy per byte less);
 * *data, *len become what it left, to be copied in as usual. */
static void h1__body_direct(conn_t *c, http_conn_t *hc, const char **data,
                            size_t *len) {
  if (hc->state != HTTP_C_BUSY || !hc->x.streaming || hc->x.req->chunked ||
      hc->len != hc->head_len || hc->paused)
    return;
  hc->direct = *data;
  hc->direct_len = *len;
  h1__body_more(c, hc);
  *data = hc->direct;
  *len = hc->direct_len;
  hc->direct = NULL;
  hc->direct_len = 0;
}

static void h1_on_data(conn_t *c, const char *data, size_t len) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc) h1__body_direct(c, hc, &data, &len);
  if (!hc || !len || hc->state == HTTP_C_CLOSING) return;
  if (hc->state == HTTP_C_STREAM) {
    hc->stream_ops->on_data(c, hc->stream, data, len);
    return;
  }
  http_server_t *srv = hc->srv;
  /* h2c by prior knowledge: the preface ("PRI * HTTP/2.0...") starts
   * what would be the first request (RFC 9113 3.3). */
  if (srv->h2c && hc->x.id == 0 && hc->len == 0 && hc->state == HTTP_C_HEAD &&
      len >= 4 && memcmp(data, "PRI ", 4) == 0) {
    h1__give_back(hc);
    http_h2_take(hc, data, len);
    return;
  }
  /* What one request may take in the buffer: its head and its body (a
   * chunked body's framing counts, up to a head's worth). */
  size_t limit = srv->max_header + srv->max_body + srv->max_header;
  uint64_t now = reactor_now(srv->r);
  bool begins = hc->len == 0;
  if (begins) { /* a request begins (its refusal below is logged from now) */
    hc->deadline = now + srv->header_timeout_ms;
    hc->x.t_start = now;
  }
  if (hc->len + len > limit) {
    http_conn_refuse(c, hc, hc->state == HTTP_C_HEAD ? 431 : 413);
    return;
  }
  if (!begins && now >= hc->deadline && !hc->x.streaming) {
    /* dribbled in too slowly (a streamed body is paced by its reader, and
     * its silence by the idle timeout: a 1 GiB upload takes its time) */
    http_conn_refuse(c, hc, 408);
    return;
  }
  if ((!hc->in || !hc->x.req) && !h1__take(hc)) {
    http_conn_refuse(c, hc, 500);
    return;
  }
  if (hc->len + len > hc->cap) {
    size_t cap = hc->cap ? hc->cap : H1_BUF;
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
    if (hc->state == HTTP_C_BODY ||
        (hc->state == HTTP_C_BUSY && hc->x.streaming))
      http_parse_head(hc->in, hc->len, srv->max_header, hc->x.req);
  }
  memcpy(hc->in + hc->len, data, len);
  hc->len += len;
  if (hc->state == HTTP_C_HEAD || hc->state == HTTP_C_BODY)
    h1__process(c, hc);
  else if (hc->state == HTTP_C_BUSY && hc->x.streaming)
    h1__body_more(c, hc);
}

static void h1_on_timeout(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc && hc->x.reading) {
    hc->x.body_err = "timeout"; /* the body stopped coming */
    hc->srv->on_body(&hc->x);
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

static void h1_on_ready(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == HTTP_C_STREAM)
    hc->stream_ops->on_ready(c, hc->stream);
  else if (hc && hc->watch && hc->state == HTTP_C_BUSY)
    hc->watch(c, hc->watch_arg, HTTP_WATCH_READY);
  else if (hc && hc->held_back && hc->state == HTTP_C_HEAD) {
    hc->held_back = false;
    reactor_conn_resume(c);
    h1__process(c, hc);
  }
}

static void h1_on_shutdown(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == HTTP_C_STREAM)
    hc->stream_ops->on_shutdown(c, hc->stream);
  else if (!hc || hc->state != HTTP_C_BUSY)
    reactor_conn_close(c, CONN_SHUTDOWN);
  else
    hc->x.keep_alive = false; /* close after the response in flight */
}

static void h1_closed(conn_t *c, http_conn_t *hc, int reason) {
  if (hc && hc->stream) {
    void *st = hc->stream;
    hc->stream = NULL;
    hc->state = HTTP_C_CLOSING;
    hc->stream_ops->on_closed(c, st, reason);
  }
  if (hc && hc->watch) hc->watch(c, hc->watch_arg, HTTP_WATCH_CLOSED);
  reactor_conn_set_udata(c, NULL);
  if (!hc) return;
  h1__give_back(hc);
  free(hc->body);
  free(hc);
}

/* ---- streamed request bodies (stream_body) ---- */

/* Bytes of the body that came and were not taken. */
static size_t h1__body_unread(const http_conn_t *hc) {
  if (hc->x.req->chunked) return hc->body_len;
  size_t have = hc->len - hc->head_len + hc->direct_len;
  return (uint64_t)have < hc->x.body_left ? have : (size_t)hc->x.body_left;
}

/* Chunked: decodes what came (into hc->body) and drops its raw bytes. */
static void h1__body_decode(http_conn_t *hc) {
  if (!hc->x.req->chunked || hc->x.body_done || hc->x.body_err) return;
  size_t before = hc->body_len;
  bool done = false;
  ssize_t n =
      http_chunked_feed(&hc->chunk, hc->in + hc->head_len,
                        hc->len - hc->head_len, h1__body_add, hc, &done);
  if (n < 0 || hc->body_len == SIZE_MAX) {
    hc->x.body_err = n < 0 ? "malformed chunked body" : "out of memory";
    hc->body_len = 0;
    return;
  }
  hc->x.body_seen += hc->body_len - before;
  if (hc->x.body_seen > hc->srv->max_body) {
    hc->x.body_err = "too large";
    hc->body_len = 0;
    return;
  }
  memmove(hc->in + hc->head_len, hc->in + hc->head_len + n,
          hc->len - hc->head_len - (size_t)n);
  hc->len -= (size_t)n;
  if (done) hc->x.body_done = true; /* once what is decoded is taken */
}

static bool h1__body_finished(const http_conn_t *hc) {
  return hc->x.req->chunked ? hc->x.body_done && hc->body_len == 0
                            : hc->x.body_left == 0;
}

static bool h1_body_finished(const http_exchange_t *x) {
  return h1__body_finished(x->conn);
}

static long h1_body_peek(http_exchange_t *x, const char **p) {
  http_conn_t *hc = x->conn;
  if (hc->x.body_err) return HTTP_BODY_ERR;
  size_t n = h1__body_unread(hc);
  if (n == 0) {
    if (!h1__body_finished(hc)) return HTTP_BODY_WAIT;
    hc->x.body_done = true;
    return HTTP_BODY_END;
  }
  *p = hc->x.req->chunked ? hc->body
       : hc->direct_len   ? hc->direct
                          : hc->in + hc->head_len;
  return (long)n;
}

static void h1_body_consume(http_exchange_t *x, size_t n) {
  http_conn_t *hc = x->conn;
  conn_t *c = hc->c;
  if (hc->x.req->chunked) {
    hc->body_len = 0; /* peek gives all of it */
  } else {
    if (hc->direct_len) {
      hc->direct += n;
      hc->direct_len -= n;
    } else {
      memmove(hc->in + hc->head_len, hc->in + hc->head_len + n,
              hc->len - hc->head_len - n);
      hc->len -= n;
    }
    hc->x.body_left -= n;
    if (!hc->x.body_left) hc->x.body_done = true;
  }
  if (hc->paused) {
    hc->paused = false;
    reactor_conn_resume(c);
  }
}

static void h1_body_wanted(http_exchange_t *x) {
  http_conn_t *hc = x->conn;
  conn_t *c = hc->c;
  if (hc->x.req->expect_continue && !hc->continued && !hc->x.body_done) {
    hc->continued = true; /* the handler wants the body: let it come */
    static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
    reactor_conn_write(c, cont, sizeof(cont) - 1);
  }
}

/* The head of a request with stream_body is in: the application runs
 * now. */
static void h1__stream_start(conn_t *c, http_conn_t *hc) {
  hc->x.streaming = true;
  hc->x.body_err = NULL;
  hc->x.reading = hc->paused = false;
  hc->x.body_seen = 0;
  hc->x.body_left =
      hc->x.req->content_length > 0 ? (uint64_t)hc->x.req->content_length : 0;
  hc->x.body_done = !hc->x.req->chunked && hc->x.body_left == 0;
  h1__body_decode(hc);
  http_exchange_dispatch(hc, NULL, 0);
}

/* More body bytes came while the handler runs or waits. */
static void h1__body_more(conn_t *c, http_conn_t *hc) {
  h1__body_decode(hc);
  if (!hc->paused && h1__body_unread(hc) > HTTP_BODY_WINDOW) {
    hc->paused = true;
    reactor_conn_pause(c);
  }
  if (hc->x.body_err || h1__body_unread(hc) || h1__body_finished(hc)) {
    if (hc->x.reading)
      hc->srv->on_body(&hc->x);
    else if (hc->watch)
      hc->watch(c, hc->watch_arg, HTTP_WATCH_BODY);
  }
}

/* ---- the framer (http/exchange.h, in http/select.h's table) ---- */

const http_framer_t http_framer_h1 = {
    .alpn = "http/1.1",
    .open = h1_open,
    .on_data = h1_on_data,
    .on_timeout = h1_on_timeout,
    .on_ready = h1_on_ready,
    .on_shutdown = h1_on_shutdown,
    .closed = h1_closed,
    .complete = h1_complete,
    .refuse = h1_refuse,
    .body_peek = h1_body_peek,
    .body_consume = h1_body_consume,
    .body_finished = h1_body_finished,
    .body_wanted = h1_body_wanted,
    .stat_reqs = STAT_HTTP_H1_REQS,
    .stat_body = STAT_HTTP_H1_BODY,
};
