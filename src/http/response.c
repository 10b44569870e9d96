/* SPDX-License-Identifier: MIT */

/* response: the response writer, its filter chain and the HTTP/1.1
 * framing of a response; see response.h. */
#include "http/response.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "http/exchange.h"
#include "http/ws.h"

/* Pieces a file is read in when a filter must see its bytes. */
#define RS_FILE_PIECE (16 * 1024)

static bool rs__bodiless(int status) {
  return status < 200 || status == 204 || status == 304;
}

static char *rs__put(char *p, const char *s, size_t n) {
  memcpy(p, s, n);
  return p + n;
}
#define RS_PUT(p, lit) rs__put(p, lit, sizeof(lit) - 1)

char *http_put_hex(char *p, uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  char tmp[16];
  int i = 0;
  do tmp[i++] = digits[v & 15];
  while ((v >>= 4));
  while (i) *p++ = tmp[--i];
  return p;
}

/* Bytes the fixed lines of a head take at most (the status line, Date,
 * the framing, Connection, the default Content-Type and the blank line). */
#define RS_HEAD_FIXED 400

/* The head's bytes at p (room: RS_HEAD_FIXED + o->h.hlen); returns the
 * end. memcpy, not snprintf: this runs once per response. */
static char *rs__head_bytes(const http_out_t *o, char *p) {
  const http_head_t *h = &o->h;
  p = RS_PUT(p, "HTTP/1.1 ");
  p = http_put_dec(p, (uint64_t)h->status);
  *p++ = ' ';
  const char *reason = http_reason(h->status);
  p = rs__put(p, reason, strlen(reason));
  p = RS_PUT(p, "\r\nDate: ");
  p = rs__put(p, http_date_now(), 29);
  p = RS_PUT(p, "\r\n");
  if (o->chunked) {
    p = RS_PUT(p, "Transfer-Encoding: chunked\r\n");
  } else if (o->len >= 0 && !rs__bodiless(h->status)) {
    p = RS_PUT(p, "Content-Length: ");
    p = http_put_dec(p, (uint64_t)o->len);
    p = RS_PUT(p, "\r\n");
  }
  if (!h->keep_alive)
    p = RS_PUT(p, "Connection: close\r\n");
  else if (h->http10)
    p = RS_PUT(p, "Connection: keep-alive\r\n");
  if (!h->has_type && o->len != 0)
    p = RS_PUT(p, "Content-Type: text/plain; charset=utf-8\r\n");
  if (h->hlen) p = rs__put(p, h->headers, h->hlen);
  return RS_PUT(p, "\r\n");
}

void http_out_free(http_out_t *o) {
  for (int i = 0; i < o->nfilt; i++)
    if (o->filt[i].f->free) o->filt[i].f->free(o->filt[i].state);
  o->nfilt = 0;
  free(o->filt);
  o->filt = NULL;
  free(o->hx);
  o->hx = NULL;
}

/* The framing once the body's length is known (or known to be unknown:
 * -1). */
static void rs__settle(const http_exchange_t *x, long long len) {
  http_out_t *o = x->out;
  http_head_t *oh = &o->h;
  o->len = len;
  if (x->conn->framer->out) { /* frames end a body: no chunks, no close */
    o->chunked = false;
    return;
  }
  o->chunked = len < 0 && !oh->http10 && !rs__bodiless(oh->status);
  if (len < 0 && oh->http10 && !rs__bodiless(oh->status))
    oh->keep_alive = false; /* the body ends with the connection */
}

bool http_res_started(const http_exchange_t *x) {
  return x->out && x->out->active;
}

/* A response begins: the head is h (as the filters leave it), the body
 * len bytes (-1: unknown). The framing is chosen here. */
static int rs__begin(http_exchange_t *x, const http_head_t *h, long long len,
                     bool file) {
  http_out_t *o = x->out;
  http_out_reset(o);
  o->active = true;
  o->failed = false;
  o->file = file;
  o->bytes = 0;
  o->h = *h;
  if (rs__bodiless(h->status) && len > 0) len = 0; /* RFC 9110 6.4.1 */
  o->len = len;
  http_server_t *srv = x->conn->srv;
  for (int i = 0; i < srv->nfilters; i++) {
    const http_filter_t *f = srv->filters[i];
    void *state = NULL;
    int rc = f->head(f, x, &o->h, &o->len, &state);
    if (rc < 0) return rc;
    if (rc > 0 && !o->filt)
      o->filt = malloc(HTTP_FILTERS_MAX * sizeof(*o->filt));
    if (rc > 0 && !o->filt) {
      if (f->free) f->free(state);
      return -ENOMEM;
    }
    if (rc > 0) {
      o->filt[o->nfilt].f = f;
      o->filt[o->nfilt].state = state;
      o->nfilt++;
    }
  }
  http_head_t *oh = &o->h;
  if (!x->keep_alive) oh->keep_alive = false; /* shutting down */
  if (x->streaming && (!http_body_finished(x) || x->body_err))
    oh->keep_alive = false; /* the rest of the body is in the way */
  o->no_body = oh->head_only || rs__bodiless(oh->status);
  /* (HEAD keeps HTTP_LEN_LATER: its body goes through the filters so
   * that its head says what a GET's would) */
  if (o->len == HTTP_LEN_LATER && rs__bodiless(oh->status)) o->len = -1;
  if (o->len != HTTP_LEN_LATER) rs__settle(x, o->len);
  x->log_status = oh->status;
  return 0;
}

/* Writes the head, with `n` bytes of body (framed already, or nothing)
 * after it in the same write. */
static int rs__write_head(http_exchange_t *x, const char *more, size_t n) {
  http_out_t *o = x->out;
  if (o->len == HTTP_LEN_LATER) rs__settle(x, -1); /* flushed before the body */
  char stack[RS_HEAD_FIXED + HTTP_INLINE_BODY + 1024];
  size_t need = RS_HEAD_FIXED + o->h.hlen + n;
  char *buf = need <= sizeof(stack) ? stack : malloc(need);
  if (!buf) return -ENOMEM;
  char *p = rs__head_bytes(o, buf);
  if (n) p = rs__put(p, more, n);
  o->head_sent = true;
  int rc = reactor_conn_write(x->conn->c, buf, (size_t)(p - buf));
  if (buf != stack) free(buf);
  /* the lines were the caller's (or hx): not needed any more */
  o->h.headers = NULL;
  o->h.hlen = 0;
  return rc;
}

static int rs__body_bytes(http_exchange_t *x, const char *p, size_t n,
                          sock_release_fn release, void *ctx, void *ctx2) {
  if (release)
    return reactor_conn_write_ref(x->conn->c, p, n, release, ctx, ctx2);
  return reactor_conn_write(x->conn->c, p, n);
}

/* The framing: a body piece (after the filters) goes out. Runs release
 * (when given) once in every case. */
static int rs__frame(http_exchange_t *x, const char *p, size_t n, bool last,
                     sock_release_fn release, void *ctx, void *ctx2,
                     const char *trailers, size_t tlen) {
  http_out_t *o = x->out;
  int rc = 0;
  if (o->len == HTTP_LEN_LATER) /* the first piece out of the filters */
    rs__settle(x, last ? (long long)n : -1);
  if (o->no_body) n = 0;
  if (!o->chunked && o->len >= 0 && o->bytes + n > (uint64_t)o->len) {
    /* more than Content-Length said: a filter's (or caller's) mistake,
     * which would desynchronise the connection */
    if (release) release(ctx, ctx2);
    o->failed = true;
    return -EMSGSIZE;
  }
  o->bytes += n;
  if (x->conn->framer->out) {
    rc = x->conn->framer->out(x, p, n, last, release, ctx, ctx2);
    if (rc) o->failed = true;
    return rc;
  }
  if (o->chunked) {
    char fr[RS_HEAD_FIXED + HTTP_INLINE_BODY + 64];
    char *q = fr;
    bool inl = n <= HTTP_INLINE_BODY && tlen <= 1024;
    if (n) {
      q = http_put_hex(q, n);
      q = RS_PUT(q, "\r\n");
      if (inl) {
        q = rs__put(q, p, n);
        q = RS_PUT(q, "\r\n");
      }
    }
    if (n && !inl) { /* size line, body by reference, then its CRLF */
      rc = !o->head_sent ? rs__write_head(x, fr, (size_t)(q - fr))
                         : reactor_conn_write(x->conn->c, fr, (size_t)(q - fr));
      if (!rc)
        rc = rs__body_bytes(x, p, n, release, ctx, ctx2);
      else if (release)
        release(ctx, ctx2);
      release = NULL;
      q = fr;
      if (!rc) q = RS_PUT(q, "\r\n");
    } else if (release) {
      release(ctx, ctx2); /* copied */
      release = NULL;
    }
    if (last && !rc && !o->no_body) {
      if (tlen > 1024) {
        if (q > fr) rc = reactor_conn_write(x->conn->c, fr, (size_t)(q - fr));
        q = fr;
        q = RS_PUT(q, "0\r\n");
        if (!rc) rc = reactor_conn_write(x->conn->c, fr, (size_t)(q - fr));
        if (!rc) rc = reactor_conn_write(x->conn->c, trailers, tlen);
        q = fr;
      } else {
        q = RS_PUT(q, "0\r\n");
        if (tlen) q = rs__put(q, trailers, tlen);
      }
      q = RS_PUT(q, "\r\n");
    }
    if (!rc && (q > fr || !o->head_sent))
      rc = !o->head_sent ? rs__write_head(x, fr, (size_t)(q - fr))
                         : reactor_conn_write(x->conn->c, fr, (size_t)(q - fr));
  } else if (!o->head_sent && n <= HTTP_INLINE_BODY) {
    rc = rs__write_head(x, p, n); /* the head and a small body: one write */
    if (release) release(ctx, ctx2);
  } else {
    if (!o->head_sent) rc = rs__write_head(x, NULL, 0);
    if (n && !rc)
      rc = rs__body_bytes(x, p, n, release, ctx, ctx2);
    else if (release)
      release(ctx, ctx2);
  }
  if (rc) o->failed = true;
  return rc;
}

int http_filter_pass(http_exchange_t *x, int at, const char *p, size_t n,
                     bool last) {
  http_out_t *o = x->out;
  int next = at + 1;
  if (next < o->nfilt)
    return o->filt[next].f->body(o->filt[next].state, x, next, p, n, last);
  return rs__frame(x, p, n, last, NULL, NULL, NULL, o->trailers, o->tlen);
}

/* A piece from the application: through the filters, or straight to the
 * framing. */
static int rs__piece(http_exchange_t *x, const char *p, size_t n, bool last,
                     sock_release_fn release, void *ctx, void *ctx2) {
  http_out_t *o = x->out;
  if (!o->nfilt)
    return rs__frame(x, p, n, last, release, ctx, ctx2, o->trailers, o->tlen);
  int rc = o->filt[0].f->body(o->filt[0].state, x, 0, p, n, last);
  if (release) release(ctx, ctx2); /* the filters copied what they keep */
  if (rc) o->failed = true;
  return rc;
}

/* The response is over: the exchange completes. */
static int rs__complete(http_exchange_t *x, int rc) {
  http_out_t *o = x->out;
  bool keep = o->h.keep_alive && x->keep_alive && !o->failed && rc == 0;
  x->log_bytes = o->bytes;
  http_exchange_complete(x, keep); /* resets o */
  return rc;
}

/* A response that failed before anything went out becomes a 500. */
static int rs__fail_early(http_exchange_t *x, int rc) {
  http_out_reset(x->out);
  http_exchange_refuse(x, 500);
  return rc;
}

int http_res_send(http_exchange_t *x, const http_head_t *h, const char *body,
                  size_t n, sock_release_fn release, void *ctx, void *ctx2) {
  int rc = rs__begin(x, h, (long long)n, false);
  if (rc) {
    if (release) release(ctx, ctx2);
    return rs__fail_early(x, rc);
  }
  http_out_t *o = x->out;
  o->trailers = NULL;
  o->tlen = 0;
  if (!o->nfilt && !o->chunked && !x->conn->framer->out &&
      (o->no_body || n <= HTTP_INLINE_BODY)) {
    /* the common case, in one write: the head and a small body */
    size_t k = o->no_body ? 0 : n;
    o->bytes = k;
    rc = rs__write_head(x, body, k);
    if (release) release(ctx, ctx2);
    if (rc) o->failed = true;
    return rs__complete(x, rc);
  }
  rc = rs__piece(x, body, n, true, release, ctx, ctx2);
  return rs__complete(x, rc);
}

int http_res_head(http_exchange_t *x, const http_head_t *h, long long len) {
  int rc = rs__begin(x, h, len, false);
  x->out->trailers = NULL;
  x->out->tlen = 0;
  if (rc) rs__fail_early(x, rc);
  return rc;
}

int http_res_write(http_exchange_t *x, const char *p, size_t n,
                   sock_release_fn release, void *ctx, void *ctx2) {
  if (!x->out->active) {
    if (release) release(ctx, ctx2);
    return -EINVAL;
  }
  if (n == 0) {
    if (release) release(ctx, ctx2);
    return http_res_flush(x);
  }
  return rs__piece(x, p, n, false, release, ctx, ctx2);
}

int http_res_flush(http_exchange_t *x) {
  http_out_t *o = x->out;
  if (!o->active || o->head_sent) return 0;
  /* an empty piece through the filters would mean nothing to them: the
   * head alone goes out */
  const http_framer_t *fr = x->conn->framer;
  if (o->len == HTTP_LEN_LATER) rs__settle(x, -1); /* the head goes first */
  int rc = fr->out ? fr->out(x, NULL, 0, false, NULL, NULL, NULL)
                   : rs__write_head(x, NULL, 0);
  if (rc) o->failed = true;
  return rc;
}

int http_res_end(http_exchange_t *x, const char *trailers, size_t tlen) {
  http_out_t *o = x->out;
  if (!o->active) return -EINVAL;
  o->trailers = trailers;
  o->tlen = tlen;
  int rc = rs__piece(x, NULL, 0, true, NULL, NULL, NULL);
  return rs__complete(x, rc);
}

/* The file through the filters: read whole up to HTTP_FILE_WHOLE (the
 * filters see it in one piece, the last), in pieces past it. */
static int rs__file_pieces(http_exchange_t *x, int fd, off_t off,
                           uint64_t len) {
  if (len && len <= HTTP_FILE_WHOLE) {
    char *all = malloc((size_t)len);
    if (!all) return -ENOMEM;
    ssize_t got = pread(fd, all, (size_t)len, off);
    int rc = got == (ssize_t)len ? 0 : got < 0 ? -errno : -EIO;
    if (!rc) rc = rs__piece(x, all, (size_t)len, true, NULL, NULL, NULL);
    free(all);
    return rc;
  }
  char *buf = malloc(RS_FILE_PIECE);
  if (!buf) return -ENOMEM;
  int rc = 0;
  while (len && !rc) {
    size_t want = len < RS_FILE_PIECE ? (size_t)len : RS_FILE_PIECE;
    ssize_t got = pread(fd, buf, want, off);
    if (got <= 0) {
      rc = got < 0 ? -errno : -EIO;
      break;
    }
    rc = rs__piece(x, buf, (size_t)got, false, NULL, NULL, NULL);
    off += got;
    len -= (uint64_t)got;
  }
  free(buf);
  if (!rc) rc = rs__piece(x, NULL, 0, true, NULL, NULL, NULL);
  return rc;
}

int http_res_sendfile(http_exchange_t *x, const http_head_t *h, int fd,
                      off_t offset, uint64_t len) {
  int rc = rs__begin(x, h, (long long)len, true);
  http_out_t *o = x->out;
  o->trailers = NULL;
  o->tlen = 0;
  if (rc) {
    close(fd);
    return rs__fail_early(x, rc);
  }
  const http_framer_t *fr = x->conn->framer;
  if (o->nfilt && (!o->no_body || o->len == HTTP_LEN_LATER)) {
    rc = rs__file_pieces(x, fd, offset, len);
    close(fd);
  } else if (fr->out) {
    if (o->no_body || len == 0) {
      close(fd);
      rc = fr->out(x, NULL, 0, true, NULL, NULL, NULL);
    } else {
      o->bytes = len;
      rc = fr->out_file(x, fd, offset, len); /* owns fd */
    }
  } else if (o->no_body || len == 0) {
    close(fd);
    rc = rs__write_head(x, NULL, 0);
  } else {
    rc = rs__write_head(x, NULL, 0);
    if (!rc) {
      o->bytes = len;
      rc = reactor_conn_sendfile(x->conn->c, fd, offset,
                                 (size_t)len); /* owns fd */
    } else {
      close(fd);
    }
  }
  if (rc) o->failed = true;
  return rs__complete(x, rc);
}

int http_res_sse(http_exchange_t *x, const http_head_t *h,
                 const http_stream_ops_t *ops, void *st) {
  http_out_t *o = x->out;
  if (x->conn->framer->out) return -EPROTONOSUPPORT; /* HTTP/1.1 only */
  http_out_reset(o);
  http_conn_log(x->conn, h->status, 0);
  char stack[512];
  size_t need = RS_HEAD_FIXED + h->hlen;
  char *buf = need <= sizeof(stack) ? stack : malloc(need);
  if (!buf) return -ENOMEM;
  char *p = buf;
  p = RS_PUT(p, "HTTP/1.1 ");
  p = http_put_dec(p, (uint64_t)h->status);
  *p++ = ' ';
  const char *reason = http_reason(h->status);
  p = rs__put(p, reason, strlen(reason));
  p = RS_PUT(p, "\r\nDate: ");
  p = rs__put(p, http_date_now(), 29);
  p = RS_PUT(p, "\r\nContent-Type: text/event-stream\r\n"
                "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n");
  if (h->hlen) p = rs__put(p, h->headers, h->hlen);
  p = RS_PUT(p, "\r\n");
  int rc = reactor_conn_write(x->conn->c, buf, (size_t)(p - buf));
  if (buf != stack) free(buf);
  http_conn_stream(x->conn, ops, st, NULL, NULL);
  return rc;
}

/* Writes the 101 of the WebSocket upgrade in hand (with the extra header
 * lines, elen bytes) and logs it. 0 or a negative errno. */
static int rs__upgrade_101(http_conn_t *hc, const char *extra, size_t elen) {
  conn_t *c = hc->c;
  char stack[512];
  size_t need = 160 + elen;
  char *resp = need <= sizeof(stack) ? stack : malloc(need);
  if (!resp) return -ENOMEM;
  const http_header_t *key = http_header(hc->x.req, "sec-websocket-key");
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
  http_conn_log(hc, 101, 0);
  return rc;
}

int http_res_upgrade(http_exchange_t *x, const char *extra, size_t elen,
                     const http_stream_ops_t *ops, void *st, const char **rest,
                     size_t *rest_len) {
  http_out_reset(x->out);
  int rc = rs__upgrade_101(x->conn, extra, elen);
  http_conn_stream(x->conn, ops, st, rest, rest_len);
  return rc;
}

/* ---- header lines, for filters ---- */

/* Whether the line at p (up to its "\r\n") is header `name`. */
static bool rs__line_is(const char *p, const char *end, const char *name,
                        size_t nl) {
  return (size_t)(end - p) > nl && p[nl] == ':' &&
         strncasecmp(p, name, nl) == 0;
}

const char *http_res_header_get(const http_head_t *h, const char *name,
                                size_t *vlen) {
  size_t nl = strlen(name);
  const char *p = h->headers, *end = h->headers + h->hlen;
  while (p && p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) break;
    if (rs__line_is(p, eol, name, nl)) {
      const char *v = p + nl + 1;
      while (v < eol && (*v == ' ' || *v == '\t')) v++;
      const char *ve = eol;
      if (ve > v && ve[-1] == '\r') ve--;
      *vlen = (size_t)(ve - v);
      return v;
    }
    p = eol + 1;
  }
  return NULL;
}

int http_res_header_set(http_exchange_t *x, http_head_t *h, const char *name,
                        const char *value) {
  http_out_t *o = x->out;
  size_t nl = strlen(name), vl = value ? strlen(value) : 0;
  size_t need = h->hlen + (value ? nl + vl + 4 : 0);
  char *buf = malloc(need ? need : 1);
  if (!buf) return -ENOMEM;
  char *q = buf;
  bool type = false;
  const char *p = h->headers, *end = h->headers + h->hlen;
  while (p && p < end) {
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    const char *next = eol ? eol + 1 : end;
    if (!rs__line_is(p, next, name, nl)) {
      if (rs__line_is(p, next, "content-type", 12)) type = true;
      q = rs__put(q, p, (size_t)(next - p));
    }
    p = next;
  }
  if (value) {
    q = rs__put(q, name, nl);
    q = RS_PUT(q, ": ");
    q = rs__put(q, value, vl);
    q = RS_PUT(q, "\r\n");
    if (nl == 12 && strncasecmp(name, "content-type", 12) == 0) type = true;
  }
  free(o->hx); /* h's lines may be the old hx: copied above */
  o->hx = buf;
  h->headers = buf;
  h->hlen = (size_t)(q - buf);
  h->has_type = type;
  return 0;
}
