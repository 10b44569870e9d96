/* SPDX-License-Identifier: MIT */

/* proxy: the reverse proxy's hot path below the binding (see proxy.h). */
#include "http/proxy.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "http/h2_stream.h"
#include "http/http1_lex.h"
#include "http/http1_response.h"

/* ---- the heads ---- */

/* Inline (http1_lex.h's compare): for a literal the length folds, so a
 * name of another length costs one compare, and one of the same length
 * no call to strncasecmp. */
static inline __attribute__((always_inline)) bool
px__name_is(const char *n, size_t len, const char *lit) {
  return http__ieq(n, len, lit);
}

/* The options a message's Connection fields name (RFC 9110 7.6.1),
 * pointers into the message: split once per message, so a field costs a
 * length compare per option rather than a scan of the joined list (about
 * 100 instructions a field, callgrind). Options past PX_CONN_MAX are not
 * kept, which only keeps more fields: a list the joined 1 KiB of the
 * first version held has fewer. */
#define PX_CONN_MAX 512
typedef struct {
  int n;
  const char *p[PX_CONN_MAX];
  uint32_t len[PX_CONN_MAX];
} px_conn_t;

static void px__conn_add(px_conn_t *c, const char *v, size_t vl) {
  size_t i = 0;
  while (i < vl && c->n < PX_CONN_MAX) {
    while (i < vl && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    size_t s = i;
    while (i < vl && v[i] != ',') i++;
    size_t e = i;
    while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
    if (e > s) {
      c->p[c->n] = v + s;
      c->len[c->n++] = (uint32_t)(e - s);
    }
  }
}

static inline bool px__hop(const char *name, size_t len, const px_conn_t *c) {
  switch (len) {
  case 2: if (px__name_is(name, len, "te")) return true; break;
  case 7:
    if (px__name_is(name, len, "upgrade") || px__name_is(name, len, "trailer"))
      return true;
    break;
  case 10:
    if (px__name_is(name, len, "connection") || px__name_is(name, len, "keep-alive"))
      return true;
    break;
  case 16: if (px__name_is(name, len, "proxy-connection")) return true; break;
  case 17: if (px__name_is(name, len, "transfer-encoding")) return true; break;
  default: break;
  }
  for (int i = 0; i < c->n; i++)
    if (c->len[i] == len && http__ieqn(c->p[i], len, name, len)) return true;
  return false;
}

bool proxy_hop_by_hop(const char *name, size_t len, const char *conn,
                      size_t conn_len) {
  px_conn_t c;
  c.n = 0;
  if (conn) px__conn_add(&c, conn, conn_len);
  return px__hop(name, len, &c);
}

/* The options of the message's Connection fields, into c. */
static void px__connection(const http_header_t *h, int n, px_conn_t *c) {
  c->n = 0;
  for (int i = 0; i < n; i++)
    if (px__name_is(h[i].name, h[i].name_len, "connection"))
      px__conn_add(c, h[i].value, h[i].value_len);
}

/* Whether name is in the '\n'-ended list of lower-case names. */
static bool px__dropped(const char *name, size_t len, const char *drop, size_t dl) {
  size_t i = 0;
  while (i < dl) {
    const char *e = memchr(drop + i, '\n', dl - i);
    size_t l = e ? (size_t)(e - (drop + i)) : dl - i;
    if (l == len && strncasecmp(drop + i, name, len) == 0) return true;
    i += l + 1;
  }
  return false;
}

typedef struct {
  char *p, *end;
  bool full;
} px_out_t;

static void px__put(px_out_t *o, const char *s, size_t n) {
  if ((size_t)(o->end - o->p) < n) {
    o->full = true;
    return;
  }
  memcpy(o->p, s, n);
  o->p += n;
}
#define PX_PUT(o, lit) px__put(o, lit, sizeof(lit) - 1)
static void px__puts(px_out_t *o, const char *s) { px__put(o, s, strlen(s)); }

long proxy_request_head(char *out, size_t cap, const http_request_t *req,
                        const proxy_head_opts_t *o) {
  px_out_t w = {out, out + cap, false};
  /* one pass for what the rewrite needs before the fields: the
   * Connection options, the first Host and Upgrade (http_header's) */
  px_conn_t conn;
  conn.n = 0;
  const http_header_t *host = NULL, *up = NULL;
  for (int i = 0; i < req->nheaders; i++) {
    const http_header_t *h = &req->headers[i];
    if (px__name_is(h->name, h->name_len, "connection"))
      px__conn_add(&conn, h->value, h->value_len);
    else if (!host && px__name_is(h->name, h->name_len, "host"))
      host = h;
    else if (!up && px__name_is(h->name, h->name_len, "upgrade"))
      up = h;
  }
  px__put(&w, req->method, req->method_len);
  PX_PUT(&w, " ");
  if (o->target) px__put(&w, o->target, o->target_len);
  else px__put(&w, req->target, req->target_len);
  PX_PUT(&w, " HTTP/1.1\r\nHost: ");
  if (o->host) px__put(&w, o->host, o->host_len);
  else if (host) px__put(&w, host->value, host->value_len);
  PX_PUT(&w, "\r\n");
  const http_header_t *xff = NULL, *fwd = NULL;
  for (int i = 0; i < req->nheaders; i++) {
    const http_header_t *h = &req->headers[i];
    const char *n = h->name;
    size_t nl = h->name_len;
    if (px__hop(n, nl, &conn)) continue;
    if (px__name_is(n, nl, "host") || px__name_is(n, nl, "content-length") ||
        px__name_is(n, nl, "x-forwarded-proto") ||
        px__name_is(n, nl, "x-forwarded-host"))
      continue;
    if (px__name_is(n, nl, "x-forwarded-for")) {
      if (!xff) xff = h;
      continue;
    }
    if (px__name_is(n, nl, "forwarded")) {
      if (!fwd) fwd = h;
      continue;
    }
    if (o->drop_len && px__dropped(n, nl, o->drop, o->drop_len)) continue;
    px__put(&w, n, nl);
    PX_PUT(&w, ": ");
    px__put(&w, h->value, h->value_len);
    PX_PUT(&w, "\r\n");
  }
  const char *peer = o->peer ? o->peer : "unknown";
  bool v6 = strchr(peer, ':') != NULL;
  PX_PUT(&w, "X-Forwarded-For: ");
  if (xff) {
    px__put(&w, xff->value, xff->value_len);
    PX_PUT(&w, ", ");
  }
  px__puts(&w, peer);
  PX_PUT(&w, "\r\nX-Forwarded-Proto: ");
  px__puts(&w, o->proto);
  if (host) {
    PX_PUT(&w, "\r\nX-Forwarded-Host: ");
    px__put(&w, host->value, host->value_len);
  }
  PX_PUT(&w, "\r\nForwarded: ");
  if (fwd) {
    px__put(&w, fwd->value, fwd->value_len);
    PX_PUT(&w, ", ");
  }
  PX_PUT(&w, "for=");
  if (v6) PX_PUT(&w, "\"[");
  px__puts(&w, peer);
  if (v6) PX_PUT(&w, "]\"");
  PX_PUT(&w, ";proto=");
  px__puts(&w, o->proto);
  /* a Host is a token or an IP literal, safe unquoted only as a token */
  if (host) {
    PX_PUT(&w, ";host=\"");
    px__put(&w, host->value, host->value_len);
    PX_PUT(&w, "\"");
  }
  PX_PUT(&w, "\r\n");
  if (req->upgrade) {
    /* the one hop-by-hop pair a tunnel needs passed on */
    PX_PUT(&w, "Connection: upgrade\r\nUpgrade: ");
    if (up) px__put(&w, up->value, up->value_len);
    PX_PUT(&w, "\r\n");
  }
  if (o->extra_len) px__put(&w, o->extra, o->extra_len);
  if (o->body_len >= 0) {
    bool has = o->body_len > 0 || req->content_length >= 0 || req->chunked;
    if (has) {
      char num[48];
      int k = snprintf(num, sizeof(num), "Content-Length: %lld\r\n", o->body_len);
      px__put(&w, num, (size_t)k);
    }
  } else if (o->body_len == -1) {
    if (req->chunked) {
      PX_PUT(&w, "Transfer-Encoding: chunked\r\n");
    } else if (req->content_length >= 0) {
      char num[48];
      int k = snprintf(num, sizeof(num), "Content-Length: %lld\r\n",
                       (long long)req->content_length);
      px__put(&w, num, (size_t)k);
    }
  }
  PX_PUT(&w, "\r\n");
  if (w.full) return -ENOSPC;
  return (long)(w.p - out);
}

/* The response's fields for the client: hop-by-hop ones, the framing
 * (the server's writer frames the body) and Date (the writer's) dropped.
 * *has_type: a Content-Type came. Returns the length, or -ENOSPC. */
static long px__response_fields(char *out, size_t cap, const http_response_t *r,
                                bool *has_type) {
  px_out_t w = {out, out + cap, false};
  px_conn_t conn;
  px__connection(r->headers, r->nheaders, &conn);
  *has_type = false;
  for (int i = 0; i < r->nheaders; i++) {
    const http_header_t *h = &r->headers[i];
    if (px__hop(h->name, h->name_len, &conn) ||
        px__name_is(h->name, h->name_len, "content-length") ||
        px__name_is(h->name, h->name_len, "date"))
      continue;
    if (px__name_is(h->name, h->name_len, "content-type")) *has_type = true;
    px__put(&w, h->name, h->name_len);
    PX_PUT(&w, ": ");
    px__put(&w, h->value, h->value_len);
    PX_PUT(&w, "\r\n");
  }
  if (w.full) return -ENOSPC;
  return (long)(w.p - out);
}

/* ---- the pool and the exchange ---- */

enum { PX_EXCHANGE = 1, PX_IDLE };
enum { PX_CONNECTING, PX_HEAD, PX_BODY, PX_TUNNEL };

#define PX_KEY 64

/* Copies a pool key (cut at PX_KEY - 1 bytes, as snprintf would): twice
 * a proxied request, where snprintf's "%s" cost ~600 instructions. */
static void px__key_copy(char *dst, const char *src) {
  size_t n = strnlen(src, PX_KEY - 1);
  memcpy(dst, src, n);
  dst[n] = 0;
}
#define PX_MAX_HEAD (64 * 1024)
#define PX_POOL_IDLE_MS 60000

typedef struct px_idle {
  int kind; /* PX_IDLE: first, as in proxy_t (a connection's udata is
               either) */
  proxy_pool_t *pool;
  conn_t *c;
  struct px_idle *prev, *next;
  char key[PX_KEY];
} px_idle_t;

/* Freed exchanges and idle entries kept for the next request (through
 * their `next`): every proxied request made and freed one of each, about
 * 600 instructions of malloc and free (callgrind). At most px_spare_max
 * of each. None under ASan, so that a use after free is still caught. */
#if defined(__SANITIZE_ADDRESS__)
static const size_t px_spare_max = 0;
#else
static const size_t px_spare_max = 64;
#endif

struct proxy_pool {
  reactor_t *r;
  px_idle_t *idle; /* newest first */
  size_t n_idle;
  proxy_t *live;   /* exchanges and tunnels */
  proxy_t *spare;  /* px_spare_max above */
  px_idle_t *spare_idle;
  size_t n_spare, n_spare_idle;
};

struct proxy {
  int kind; /* PX_EXCHANGE */
  proxy_pool_t *pool;
  proxy_t *prev, *next;
  conn_t *client;
  http_conn_t *hc; /* while the client's request is ours (watch set) */
  conn_t *up;
  int state;
  proxy_done_fn done; /* NULL once called */
  void *arg;
  proxy_result_t res;
  char key[PX_KEY];
  uint32_t keepalive, timeout_ms;
  bool head_request, upgrade, stream_body, chunk_body;
  bool req_done;    /* the whole request went to the upstream */
  bool up_paused;   /* reading the upstream waits for the client's queue */
  bool body_wait;   /* the client's body waits for the upstream's queue */
  bool client_paused; /* tunnel: reading the client waits for upstream */
  bool up_keep;     /* the upstream can carry another request after this */
  int deferred_err; /* a failure known at once, posted */
  int rbody;        /* enum http_body of the response */
  uint64_t left;    /* Content-Length bytes still to come */
  http_chunked_t chunk;
  uint64_t t0;
  char *hbuf;       /* a response head that came in pieces */
  size_t hlen, hcap;
  char *obuf;       /* chunk framing assembled for one write */
  size_t olen, ocap;
  int obuf_err;
  char tls_error[160]; /* res.tls_error's copy */
};

static const proto_t px_proto;

proxy_pool_t *proxy_pool_new(reactor_t *r) {
  proxy_pool_t *p = calloc(1, sizeof(*p));
  if (!p) return NULL;
  p->r = r;
  return p;
}

size_t proxy_pool_idle(const proxy_pool_t *pool) { return pool->n_idle; }

static void px__idle_unlink(px_idle_t *e) {
  proxy_pool_t *pool = e->pool;
  if (e->prev) e->prev->next = e->next;
  else pool->idle = e->next;
  if (e->next) e->next->prev = e->prev;
  pool->n_idle--;
}

/* A zeroed idle entry, or NULL. */
static px_idle_t *px__idle_new(proxy_pool_t *pool) {
  px_idle_t *e = pool->spare_idle;
  if (!e) return calloc(1, sizeof(*e));
  pool->spare_idle = e->next;
  pool->n_spare_idle--;
  memset(e, 0, sizeof(*e));
  return e;
}

/* e, unlinked, back to its pool's spares (or freed). */
static void px__idle_free(px_idle_t *e) {
  proxy_pool_t *pool = e->pool;
  if (pool->n_spare_idle >= px_spare_max) {
    free(e);
    return;
  }
  e->next = pool->spare_idle;
  pool->spare_idle = e;
  pool->n_spare_idle++;
}

static void px__idle_close(px_idle_t *e) {
  px__idle_unlink(e);
  reactor_conn_set_udata(e->c, NULL);
  reactor_conn_close(e->c, CONN_LOCAL);
  px__idle_free(e);
}

static void px__live_unlink(proxy_t *p) {
  if (!p->pool) return;
  if (p->prev) p->prev->next = p->next;
  else p->pool->live = p->next;
  if (p->next) p->next->prev = p->prev;
  p->prev = p->next = NULL;
}

/* p, done with, back to its pool's spares (or freed: also once the pool
 * is gone, a tunnel's last reference). */
static void px__free(proxy_t *p) {
  px__live_unlink(p);
  free(p->hbuf);
  free(p->obuf);
  proxy_pool_t *pool = p->pool;
  if (!pool || pool->n_spare >= px_spare_max) {
    free(p);
    return;
  }
  p->next = pool->spare;
  pool->spare = p;
  pool->n_spare++;
}

/* A connection back to the pool (or closed when it can't be kept). */
static void px__pool_put(proxy_pool_t *pool, conn_t *c, const char *key,
                         uint32_t per_key) {
  if (!per_key || !reactor_conn_is_open(c)) {
    reactor_conn_set_udata(c, NULL);
    reactor_conn_close(c, CONN_LOCAL);
    return;
  }
  size_t same = 0;
  px_idle_t *oldest = NULL, *last = NULL;
  for (px_idle_t *e = pool->idle; e; e = e->next) {
    last = e;
    if (strcmp(e->key, key) == 0) {
      same++;
      oldest = e;
    }
  }
  if (same >= per_key) px__idle_close(oldest);
  else if (pool->n_idle >= PROXY_POOL_MAX && last) px__idle_close(last);
  px_idle_t *e = px__idle_new(pool);
  if (!e) {
    reactor_conn_set_udata(c, NULL);
    reactor_conn_close(c, CONN_LOCAL);
    return;
  }
  e->kind = PX_IDLE;
  e->pool = pool;
  e->c = c;
  px__key_copy(e->key, key);
  e->next = pool->idle;
  if (pool->idle) pool->idle->prev = e;
  pool->idle = e;
  pool->n_idle++;
  reactor_conn_set_udata(c, e);
  reactor_conn_resume(c);
  reactor_conn_set_timeout(c, PX_POOL_IDLE_MS);
}

/* The newest open idle connection of key, taken out of the pool. */
static conn_t *px__pool_take(proxy_pool_t *pool, const char *key) {
  for (px_idle_t *e = pool->idle, *next; e; e = next) {
    next = e->next;
    if (strcmp(e->key, key) != 0) continue;
    conn_t *c = e->c;
    px__idle_unlink(e);
    px__idle_free(e);
    if (reactor_conn_is_open(c)) return c;
    reactor_conn_set_udata(c, NULL);
    reactor_conn_close(c, CONN_LOCAL);
  }
  return NULL;
}

/* The client gets its connection back: the watch goes, the caller's hold
 * is taken again. */
static void px__client_back(proxy_t *p) {
  if (p->hc) {
    p->hc->watch = NULL;
    p->hc->watch_arg = NULL;
    p->hc = NULL;
  }
  reactor_conn_hold(p->client);
}

static void px__call_done(proxy_t *p) {
  proxy_done_fn fn = p->done;
  p->done = NULL;
  if (!fn) return;
  p->res.ms = reactor_now(p->pool->r) - p->t0;
  fn(p->arg, &p->res);
}

static void px__up_drop(proxy_t *p, bool force) {
  if (!p->up) return;
  conn_t *u = p->up;
  p->up = NULL;
  reactor_conn_set_udata(u, NULL);
  if (force) reactor_conn_force_close(u, CONN_LOCAL);
  else reactor_conn_close(u, CONN_LOCAL);
}

/* The try failed with err: the upstream goes; a client that had part of
 * the answer is closed (what it got can't be completed). */
static void px__fail(proxy_t *p, int err) {
  if (!p->res.err) p->res.err = err;
  px__up_drop(p, true);
  http_conn_t *hc = p->hc;
  px__client_back(p);
  if (p->res.answered && hc && reactor_conn_is_open(p->client)) {
    if (hc->x.out) hc->x.log_bytes = hc->x.out->bytes; /* what it got */
    hc->state = HTTP_C_CLOSING;
    reactor_conn_close(p->client, CONN_ERROR);
  }
  px__call_done(p);
  px__free(p);
}

/* The response is complete: the upstream goes back to the pool when it
 * can carry another request, the client's response completes. */
static void px__finish(proxy_t *p, bool reusable) {
  conn_t *u = p->up;
  p->up = NULL;
  if (u) {
    if (reusable && p->up_keep && p->req_done) px__pool_put(p->pool, u, p->key, p->keepalive);
    else {
      reactor_conn_set_udata(u, NULL);
      reactor_conn_close(u, CONN_LOCAL);
    }
  }
  http_conn_t *hc = p->hc;
  px__client_back(p);
  /* the writer ends the framing, counts the bytes and completes the
   * exchange (keep-alive as its head said) */
  if (hc && reactor_conn_is_open(p->client)) http_res_end(&hc->x, NULL, 0);
  px__call_done(p);
  px__free(p);
}

/* ---- the request body (stream_body) to the upstream ---- */

static void px__pump_body(proxy_t *p) {
  if (p->req_done || !p->up || !p->hc || p->state == PX_CONNECTING) return;
  p->body_wait = false;
  for (;;) {
    const char *d;
    long n = http_body_peek(&p->hc->x, &d);
    if (n == HTTP_BODY_WAIT) return;
    if (n == HTTP_BODY_ERR) {
      px__fail(p, -EIO);
      return;
    }
    if (n == HTTP_BODY_END) {
      if (p->chunk_body) reactor_conn_write(p->up, "0\r\n\r\n", 5);
      p->req_done = true;
      return;
    }
    int rc = 0;
    if (p->chunk_body) {
      char sz[24];
      int k = snprintf(sz, sizeof(sz), "%lx\r\n", (unsigned long)n);
      rc = reactor_conn_write(p->up, sz, (size_t)k);
    }
    if (!rc) rc = reactor_conn_write(p->up, d, (size_t)n);
    if (!rc && p->chunk_body) rc = reactor_conn_write(p->up, "\r\n", 2);
    http_body_consume(&p->hc->x, (size_t)n);
    if (rc) {
      px__fail(p, -ECONNRESET);
      return;
    }
    p->res.sent = true;
    if (reactor_conn_congested(p->up)) {
      p->body_wait = true;
      return;
    }
  }
}

/* ---- the response to the client ---- */

static void px__obuf_add(proxy_t *p, const char *s, size_t n) {
  if (p->obuf_err) return;
  if (p->olen + n > p->ocap) {
    size_t cap = p->ocap ? p->ocap : 16384;
    while (cap < p->olen + n) cap *= 2;
    char *b = realloc(p->obuf, cap);
    if (!b) {
      p->obuf_err = -ENOMEM;
      return;
    }
    p->obuf = b;
    p->ocap = cap;
  }
  memcpy(p->obuf + p->olen, s, n);
  p->olen += n;
}

static void px__chunk_piece(const char *d, size_t n, void *arg) {
  proxy_t *p = arg;
  if (n) px__obuf_add(p, d, n);
}

/* Writes body bytes to the client through the response writer (its
 * filters and framing; it counts them for the log); pauses the upstream
 * past the client's write limit. 0, or a negative errno (the client is
 * gone). */
static int px__to_client(proxy_t *p, const char *d, size_t n) {
  if (!p->hc) return -EPIPE;
  int rc = n ? http_res_write(&p->hc->x, d, n, NULL, NULL, NULL) : 0;
  /* past the socket's write limit, or (HTTP/2) the stream's own buffer */
  if (!rc && !p->up_paused && p->up &&
      (reactor_conn_congested(p->client) ||
       http_h2_exchange_congested(&p->hc->x))) {
    p->up_paused = true;
    reactor_conn_pause(p->up);
  }
  return rc;
}

/* Body bytes from the upstream. */
static void px__body(proxy_t *p, const char *d, size_t len) {
  if (p->rbody == HTTP_BODY_LENGTH) {
    size_t take = (uint64_t)len < p->left ? len : (size_t)p->left;
    p->left -= take;
    if (px__to_client(p, d, take)) {
      px__fail(p, -EPIPE);
      return;
    }
    if (!p->left) px__finish(p, take == len);
    return;
  }
  if (p->rbody == HTTP_BODY_CHUNKED) {
    bool done = false;
    p->olen = 0;
    ssize_t n = http_chunked_feed(&p->chunk, d, len, px__chunk_piece, p, &done);
    if (n < 0 || p->obuf_err) {
      px__fail(p, n < 0 ? -EPROTO : p->obuf_err);
      return;
    }
    if (px__to_client(p, p->obuf, p->olen)) {
      px__fail(p, -EPIPE);
      return;
    }
    if (done) px__finish(p, (size_t)n == len);
    return;
  }
  /* HTTP_BODY_CLOSE: everything until the upstream closes */
  if (px__to_client(p, d, len)) px__fail(p, -EPIPE);
}

static void px__tunnel(proxy_t *p, const char *head, size_t n, const char *rest,
                       size_t rlen);

/* A whole response head r: the client gets its head, its lines written
 * into fields[0..cap). It goes out now, unless `whole` (the answer's
 * body came with it): then with the body's first write, in one write
 * with a small body (the caller keeps fields until then). */
static void px__head(proxy_t *p, const http_response_t *r, char *fields,
                     size_t cap, bool whole) {
  http_conn_t *hc = p->hc;
  bool has_type;
  long fl = px__response_fields(fields, cap, r, &has_type);
  if (fl < 0) {
    px__fail(p, -EPROTO);
    return;
  }
  http_head_t h = http_exchange_head(&hc->x, r->status);
  h.headers = fields;
  h.hlen = (size_t)fl;
  h.has_type = true; /* the upstream's Content-Type or none, never ours */
  (void)has_type;
  long long len;
  switch (r->body) {
  case HTTP_BODY_NONE:
    len = p->head_request && r->content_length >= 0 ? r->content_length : 0;
    break;
  case HTTP_BODY_LENGTH: len = r->content_length; break;
  default: len = -1; break;
  }
  p->res.answered = true;
  if (http_res_head(&hc->x, &h, len)) {
    px__fail(p, -EPROTO); /* answered 500 */
    return;
  }
  /* with a body filter (compression) the head may wait past the body's
   * first write: it goes now, as the lines are the caller's */
  if ((!whole || hc->x.out->nfilt) && http_res_flush(&hc->x)) {
    px__fail(p, -EPIPE);
    return;
  }
  p->up_keep = r->keep_alive;
  p->rbody = r->body;
  p->left = r->body == HTTP_BODY_LENGTH ? (uint64_t)r->content_length : 0;
  if (r->body == HTTP_BODY_CHUNKED) http_chunked_init(&p->chunk, PX_MAX_HEAD);
  p->state = PX_BODY;
}

/* Response bytes while the head is due. */
static void px__on_head_data(proxy_t *p, const char *data, size_t len) {
  const char *buf = data;
  size_t have = len;
  if (p->hlen) { /* a head that came in pieces */
    if (p->hlen + len > p->hcap) {
      size_t cap = p->hcap ? p->hcap : 4096;
      while (cap < p->hlen + len) cap *= 2;
      if (cap > 2 * PX_MAX_HEAD + REACTOR_READ_CHUNK) {
        px__fail(p, -EPROTO);
        return;
      }
      char *b = realloc(p->hbuf, cap);
      if (!b) {
        px__fail(p, -ENOMEM);
        return;
      }
      p->hbuf = b;
      p->hcap = cap;
    }
    memcpy(p->hbuf + p->hlen, data, len);
    p->hlen += len;
    buf = p->hbuf;
    have = p->hlen;
  }
  for (;;) {
    http_response_t r;
    int n = http_parse_response(buf, have, PX_MAX_HEAD, p->head_request, &r);
    if (n == HTTP_RES_INCOMPLETE) {
      /* keep what came for the next read */
      if (p->hbuf && buf >= p->hbuf && buf < p->hbuf + p->hcap) {
        memmove(p->hbuf, buf, have);
      } else {
        size_t cap = have < 4096 ? 4096 : have;
        if (cap > p->hcap) {
          char *b = realloc(p->hbuf, cap);
          if (!b) {
            px__fail(p, -ENOMEM);
            return;
          }
          p->hbuf = b;
          p->hcap = cap;
        }
        memcpy(p->hbuf, buf, have);
      }
      p->hlen = have;
      return;
    }
    if (n < 0) {
      px__fail(p, -EPROTO);
      return;
    }
    p->res.status = r.status;
    if (r.interim) { /* 100 Continue and the like: the client's own 100
                        is the server's business */
      buf += n;
      have -= (size_t)n;
      if (!have) {
        p->hlen = 0;
        return;
      }
      continue;
    }
    if (r.upgrade) {
      if (!p->upgrade) {
        px__fail(p, -EPROTO);
        return;
      }
      /* the head is copied before the buffer it may be in changes */
      px__tunnel(p, buf, (size_t)n, buf + n, have - (size_t)n);
      return;
    }
    p->res.ms = reactor_now(p->pool->r) - p->t0;
    const char *rest = buf + n;
    size_t rlen = have - (size_t)n;
    /* The answer's body is whole in this read and the client speaks
     * HTTP/1.1: the head waits for the body (one write for both when
     * the body is small, ~200 instructions less). The body's write
     * (px__body, below) sends it, or drops it when the client is gone,
     * before this returns: fields, where its lines are, lives until then.
     * An HTTP/2 client's framer gets the head alone, as before. */
    bool whole = !p->hc->x.conn->framer->out && r.body == HTTP_BODY_LENGTH &&
                 r.content_length > 0 &&
                 (uint64_t)rlen >= (uint64_t)r.content_length;
    char fields[16384];
    px__head(p, &r, fields, sizeof(fields), whole);
    if (p->state != PX_BODY) return; /* failed */
    p->hlen = 0;
    if (r.body == HTTP_BODY_NONE ||
        (r.body == HTTP_BODY_LENGTH && r.content_length == 0)) {
      px__finish(p, rlen == 0);
      return;
    }
    /* rest may point into hbuf, which lives as long as p */
    if (rlen) px__body(p, rest, rlen);
    return;
  }
}

static void px__on_data(conn_t *c, const char *data, size_t len) {
  int *kind = reactor_conn_udata(c);
  if (!kind) return;
  if (*kind == PX_IDLE) { /* a pooled connection must stay silent */
    px__idle_close((px_idle_t *)kind);
    return;
  }
  proxy_t *p = (proxy_t *)kind;
  reactor_conn_set_timeout(c, p->timeout_ms);
  if (p->state == PX_HEAD || p->state == PX_CONNECTING) px__on_head_data(p, data, len);
  else if (p->state == PX_BODY) px__body(p, data, len);
  else if (p->state == PX_TUNNEL && p->client) {
    if (reactor_conn_write(p->client, data, len)) return;
    if (!p->up_paused && reactor_conn_congested(p->client)) {
      p->up_paused = true;
      reactor_conn_pause(c);
    }
  }
}

static void px__on_open(conn_t *c) {
  proxy_t *p = reactor_conn_udata(c);
  if (!p || p->kind != PX_EXCHANGE) return;
  p->state = PX_HEAD;
  p->res.sent = true; /* the queued head went out with the open */
  px__pump_body(p);
}

static void px__on_ready(conn_t *c) {
  proxy_t *p = reactor_conn_udata(c);
  if (!p || p->kind != PX_EXCHANGE) return;
  if (p->body_wait) px__pump_body(p);
  else if (p->state == PX_TUNNEL && p->client_paused && p->client) {
    p->client_paused = false;
    reactor_conn_resume(p->client);
  }
}

static void px__on_timeout(conn_t *c) {
  int *kind = reactor_conn_udata(c);
  if (!kind) {
    reactor_conn_close(c, CONN_TIMEOUT);
    return;
  }
  if (*kind == PX_IDLE) {
    px__idle_close((px_idle_t *)kind);
    return;
  }
  proxy_t *p = (proxy_t *)kind;
  if (p->state == PX_TUNNEL) return; /* the client's idle timeout rules */
  px__fail(p, -ETIMEDOUT);
}

static void px__on_close(conn_t *c, int reason) {
  (void)reason;
  int *kind = reactor_conn_udata(c);
  if (!kind) return;
  reactor_conn_set_udata(c, NULL);
  if (*kind == PX_IDLE) {
    px_idle_t *e = (px_idle_t *)kind;
    px__idle_unlink(e);
    px__idle_free(e);
    return;
  }
  proxy_t *p = (proxy_t *)kind;
  p->up = NULL;
  if (p->state == PX_TUNNEL) {
    if (p->client) reactor_conn_close(p->client, CONN_PEER);
    return;
  }
  if (p->state == PX_BODY && p->rbody == HTTP_BODY_CLOSE) {
    px__finish(p, false);
    return;
  }
  px__fail(p, -ECONNRESET);
}

static void px__on_fail(conn_t *c, int err) {
  proxy_t *p = reactor_conn_udata(c);
  if (!p) return;
  reactor_conn_set_udata(c, NULL);
  p->up = NULL;
  const char *why = err == -EPROTO ? reactor_conn_tls_error(c) : NULL;
  if (why && *why) {
    snprintf(p->tls_error, sizeof(p->tls_error), "%s", why);
    p->res.tls_error = p->tls_error;
  }
  px__fail(p, err ? err : -ECONNREFUSED);
}

static const proto_t px_proto = {
    .on_open = px__on_open,
    .on_data = px__on_data,
    .on_ready = px__on_ready,
    .on_timeout = px__on_timeout,
    .on_close = px__on_close,
    .on_fail = px__on_fail,
};

/* ---- the client's side ---- */

static void px__watch(conn_t *c, void *arg, int event) {
  proxy_t *p = arg;
  (void)c;
  switch (event) {
  case HTTP_WATCH_READY:
    if (p->up_paused && p->up) {
      p->up_paused = false;
      reactor_conn_resume(p->up);
    }
    break;
  case HTTP_WATCH_BODY:
    if (!p->body_wait) px__pump_body(p);
    break;
  case HTTP_WATCH_CLOSED: /* hc is freed after this */
    p->hc = NULL;
    px__fail(p, -EPIPE);
    break;
  }
}

/* ---- tunnels (101) ---- */

static void px__t_data(conn_t *c, void *st, const char *data, size_t len) {
  proxy_t *p = st;
  if (!p->up) return;
  if (reactor_conn_write(p->up, data, len)) return;
  if (!p->client_paused && reactor_conn_congested(p->up)) {
    p->client_paused = true;
    reactor_conn_pause(c);
  }
}

static void px__t_ready(conn_t *c, void *st) {
  proxy_t *p = st;
  (void)c;
  if (p->up_paused && p->up) {
    p->up_paused = false;
    reactor_conn_resume(p->up);
  }
}

static void px__t_close(conn_t *c, void *st) {
  (void)st;
  reactor_conn_close(c, CONN_LOCAL);
}

static void px__t_closed(conn_t *c, void *st, int reason) {
  proxy_t *p = st;
  (void)c;
  (void)reason;
  p->client = NULL;
  px__up_drop(p, false);
  px__free(p);
}

static const http_stream_ops_t px_tunnel_ops = {
    .on_data = px__t_data,
    .on_ready = px__t_ready,
    .on_timeout = px__t_close,
    .on_shutdown = px__t_close,
    .on_closed = px__t_closed,
};

static void px__tunnel(proxy_t *p, const char *head, size_t n, const char *rest,
                       size_t rlen) {
  http_conn_t *hc = p->hc;
  conn_t *c = p->client;
  p->res.answered = true;
  p->res.spliced = true;
  if (reactor_conn_write(c, head, n)) {
    px__fail(p, -EPIPE);
    return;
  }
  /* the upstream's 101 went out as it came (rewritten): the upgrade
   * handoff of http_res_upgrade without its own 101 */
  http_out_reset(hc->x.out);
  http_conn_log(hc, 101, 0);
  if (rlen && reactor_conn_write(c, rest, rlen)) {
    px__fail(p, -EPIPE);
    return;
  }
  hc->watch = NULL;
  hc->watch_arg = NULL;
  p->hc = NULL;
  p->state = PX_TUNNEL;
  const char *early;
  size_t elen;
  http_conn_stream(hc, &px_tunnel_ops, p, &early, &elen);
  if (elen && p->up) reactor_conn_write(p->up, early, elen);
  http_conn_drop_request(hc);
  free(p->hbuf);
  p->hbuf = NULL;
  p->hlen = p->hcap = 0;
  reactor_conn_hold(c);
  px__call_done(p);
}

/* ---- starting a try ---- */

static void px__deferred(void *a, void *b) {
  proxy_t *p = a;
  (void)b;
  px__fail(p, p->deferred_err);
}

int proxy_start(proxy_pool_t *pool, conn_t *client, http_conn_t *hc,
                const proxy_try_t *t, proxy_done_fn done, void *arg) {
  proxy_t *p = pool->spare;
  if (p) {
    pool->spare = p->next;
    pool->n_spare--;
    /* all but the TLS reason, written (with its pointer) only on a
     * failed connect */
    memset(p, 0, offsetof(proxy_t, tls_error));
  } else if (!(p = calloc(1, sizeof(*p)))) {
    return -ENOMEM;
  }
  p->kind = PX_EXCHANGE;
  p->pool = pool;
  p->client = client;
  p->hc = hc;
  p->done = done;
  p->arg = arg;
  p->keepalive = t->keepalive;
  p->timeout_ms = t->timeout_ms;
  p->head_request = t->head_request;
  p->upgrade = t->upgrade;
  p->stream_body = t->stream_body;
  p->chunk_body = t->chunk_body;
  p->req_done = !t->stream_body;
  p->t0 = reactor_now(pool->r);
  px__key_copy(p->key, t->key);
  conn_t *u = t->fresh ? NULL : px__pool_take(pool, p->key);
  int err = 0;
  if (u) {
    p->res.reused = true;
    p->state = PX_HEAD;
    reactor_conn_set_udata(u, p);
    reactor_conn_set_timeout(u, t->timeout_ms);
  } else {
    conn_opts_t o = {.timeout_ms = t->timeout_ms,
                     .tls = t->tls,
                     .tls_host = t->tls ? t->tls_host : NULL};
    u = reactor_connect(pool->r, t->ip, t->port, NULL, t->connect_ms, &px_proto,
                        pool, o, &err);
    if (u) reactor_conn_set_udata(u, p);
    p->state = PX_CONNECTING;
  }
  if (u) {
    p->up = u;
    int rc = reactor_conn_write(u, t->head, t->head_len);
    if (!rc && t->body_len) rc = reactor_conn_write(u, t->body, t->body_len);
    if (rc) err = rc;
    else if (p->res.reused) p->res.sent = true;
  } else if (!err) {
    err = -ECONNREFUSED;
  }
  p->next = pool->live;
  if (pool->live) pool->live->prev = p;
  pool->live = p;
  hc->watch = px__watch;
  hc->watch_arg = p;
  if (t->stream_body) http_body_wanted(&hc->x);
  if (err) {
    /* known at once: posted, so done never runs inside this call; the
     * client is not watched (the post may outlive its request) */
    hc->watch = NULL;
    hc->watch_arg = NULL;
    p->hc = NULL;
    p->deferred_err = err;
    if (reactor_defer(pool->r, px__deferred, p, NULL)) {
      px__up_drop(p, true);
      px__free(p);
      return -ENOMEM;
    }
  } else if (p->res.reused) {
    px__pump_body(p);
  }
  reactor_conn_release(client);
  return 0;
}

void proxy_pool_free(proxy_pool_t *pool) {
  if (!pool) return;
  while (pool->idle) {
    px_idle_t *e = pool->idle;
    px__idle_unlink(e);
    reactor_conn_set_udata(e->c, NULL);
    reactor_conn_force_close(e->c, CONN_SHUTDOWN);
    free(e);
  }
  while (pool->spare_idle) {
    px_idle_t *e = pool->spare_idle;
    pool->spare_idle = e->next;
    free(e);
  }
  while (pool->spare) {
    proxy_t *p = pool->spare;
    pool->spare = p->next;
    free(p);
  }
  while (pool->live) {
    proxy_t *p = pool->live;
    px__live_unlink(p);
    p->pool = NULL;
    px__up_drop(p, true);
    if (p->hc) p->hc->watch = NULL;
    if (p->state == PX_TUNNEL && p->client) {
      /* its stream's on_closed frees it */
      reactor_conn_force_close(p->client, CONN_SHUTDOWN);
      continue;
    }
    free(p->hbuf);
    free(p->obuf);
    free(p);
  }
  free(pool);
}
