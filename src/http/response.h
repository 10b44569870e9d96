/* SPDX-License-Identifier: MIT */

/* response: the writer of one response, from its head to its last byte.
 * An application (src/lx/lx_http.c, the public folder, the server's own
 * answers, spec/c/test_server.c) says what to send (a status, header
 * lines, body bytes, a file, the end); the writer owns how it goes out:
 * Content-Length or chunked (or, for an HTTP/1.0 client, a body that ends
 * with the connection), no body for HEAD, 1xx, 204 and 304, trailers,
 * Connection, Date and the default Content-Type, the byte count for the
 * access log and the metrics, and the completion of the exchange
 * (through its framer: http/exchange.h). HTTP/1.1's framing of a
 * response is here; another framer's (HTTP/2) is its own
 * (http_framer_t.out).
 *
 * Body filters sit between the application and the framing (as nginx's
 * output filters or h2o's ostreams): each filter of the server's chain
 * sees the head before it goes out (and may change its status, header
 * lines and length: a filter that changes the body's length sets it
 * unknown, -1, so the response goes chunked), then every body piece and
 * the end, and passes what it makes to the next one
 * (http_filter_pass); the last one's output is framed. With no filter,
 * a response takes the same path as before filters existed: one write for
 * a small response, the body by reference or sendfile for a large one.
 *
 * Threads: the connection's reactor thread, like exchange.h. */
#ifndef MP_HTTP_RESPONSE_H
#define MP_HTTP_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "http/exchange.h"
#include "net/sock.h"

/* The head of a response. `headers` holds the extra lines ("Name:
 * value\r\n"...), hlen bytes; has_type: one of them is Content-Type. */
typedef struct {
  int status;
  bool head_only;  /* a HEAD request: no body bytes */
  bool keep_alive; /* cleared when the connection closes after it */
  bool http10;
  bool has_type;
  bool no_compress; /* the application turned compression off for it */
  const char *headers;
  size_t hlen;
} http_head_t;

/* Small bodies go out in the same write as the head. */
#define HTTP_INLINE_BODY 4096
/* A body length a filter gives when it will know the length only once
 * the body is through it (a compressor of a whole body): the head waits
 * for the first piece the filter passes on; when that piece is the last
 * one, its length is the body's (Content-Length), else the body goes as
 * one of unknown length (chunked for HTTP/1.1). */
#define HTTP_LEN_LATER (-2)
/* A file through the filters comes in one piece up to this size (so a
 * filter sees it whole), in pieces past it. */
#define HTTP_FILE_WHOLE (256 * 1024)

/* A body filter (one entry of http_server_t.filters). */
typedef struct http_filter {
  const char *name;
  /* The head is about to go out. The filter may change *h (through
   * http_res_header_set for its lines) and *len (the body's length, -1
   * for unknown, HTTP_LEN_LATER). Returns 1 to take part in this response (with
   * its state in *state), 0 to stay out of it, or a negative errno (the
   * response fails: 500 if nothing went out). */
  int (*head)(const struct http_filter *f, struct http_exchange *x,
              http_head_t *h, long long *len, void **state);
  /* A piece of the body (n bytes, maybe 0), `last` at its end (then p
   * may be NULL). The filter passes what it makes with http_filter_pass
   * (at is its place, given here), as often as it likes, and must pass
   * last = true exactly once, when last is true here. 0 or a negative
   * errno. */
  int (*body)(void *state, struct http_exchange *x, int at, const char *p,
              size_t n, bool last);
  /* Frees the state (the response ended, or its connection closed). */
  void (*free)(void *state);
  void *cfg; /* the filter's settings */
} http_filter_t;

/* A filter that takes part in a response, and its state. */
typedef struct http_out_filter {
  const http_filter_t *f;
  void *state;
} http_out_filter_t;

/* The writer's state of an exchange's response (http_exchange_t.out). */
typedef struct http_out {
  bool active;    /* a head was given (http_res_head / _send...) */
  bool head_sent; /* its bytes are queued */
  bool chunked;
  bool no_body;   /* HEAD, 1xx, 204, 304: body bytes are dropped */
  bool failed;    /* a write failed: the connection closes after it */
  bool file;      /* the body is a file's (http_res_sendfile) */
  long long len;  /* the framed length, -1 for chunked / until close */
  uint64_t bytes; /* body bytes queued (after the filters) */
  http_head_t h;  /* the head as the filters left it */
  int nfilt;      /* filters that take part, in filt (malloc'd when
                     one does: an idle connection holds none) */
  http_out_filter_t *filt;
  char *hx;             /* header lines a filter changed (malloc'd), or NULL */
  const char *trailers; /* http_res_end's, while it runs */
  size_t tlen;
} http_out_t;

/* ---- for the application ---- */

/* A head for the exchange's request: `status`, keep_alive, http10 and
 * head_only from the request, no header lines. */
static inline http_head_t http_exchange_head(const http_exchange_t *x,
                                             int status) {
  http_head_t h = {.status = status,
                   .keep_alive = x->keep_alive,
                   .http10 = x->req->minor == 0,
                   .head_only = x->req->method_len == 4 &&
                                memcmp(x->req->method, "HEAD", 4) == 0};
  return h;
}

/* Sends a whole response: head `h` (status and header lines; copied) and
 * `body` (n bytes; 1xx, 204, 304 drop it; HEAD sends only its length),
 * then completes the exchange (http_exchange_complete). release (may be
 * NULL: the bytes are copied) runs once when the writer is done with
 * body, as for reactor_conn_write_ref. 0 or a negative errno (the
 * exchange is completed either way, and a failed one closes). */
int http_res_send(struct http_exchange *x, const http_head_t *h,
                  const char *body, size_t n, sock_release_fn release,
                  void *ctx, void *ctx2);
/* The head of a streamed response: len is the body's length, or -1 when
 * unknown (chunked for HTTP/1.1; an HTTP/1.0 client's body ends with the
 * connection). The head goes out with the first body piece (or at
 * http_res_flush / http_res_end). 0 or a negative errno. */
int http_res_head(struct http_exchange *x, const http_head_t *h, long long len);
/* A piece of a streamed body (release as for http_res_send). 0 or a
 * negative errno. */
int http_res_write(struct http_exchange *x, const char *p, size_t n,
                   sock_release_fn release, void *ctx, void *ctx2);
/* Sends the head now if it has not gone out. */
int http_res_flush(struct http_exchange *x);
/* Ends a streamed body, with trailer lines ("Name: value\r\n"..., tlen
 * bytes; only a chunked body carries them) and completes the exchange. */
int http_res_end(struct http_exchange *x, const char *trailers, size_t tlen);
/* Sends a whole response whose body is len bytes of the file open at fd
 * from offset (sendfile; through the filters, when any takes part, by
 * reading it), then completes the exchange. Takes fd in every case. */
int http_res_sendfile(struct http_exchange *x, const http_head_t *h, int fd,
                      off_t offset, uint64_t len);
/* The response becomes a Server-Sent Events stream: the head (status,
 * h's lines, the event stream's Content-Type, no caching) goes out with
 * no framing after it (events are written by http/ws_sse.h, and the
 * stream ends with the connection), the exchange is logged, and the
 * connection's events go to ops with st (http_conn_stream). Filters do
 * not see a stream. 0 or a negative errno (a failed head: the caller
 * closes). */
struct http_stream_ops;
int http_res_sse(struct http_exchange *x, const http_head_t *h,
                 const struct http_stream_ops *ops, void *st);
/* The WebSocket upgrade in hand is accepted: its 101 (with the extra
 * lines, elen bytes) goes out, it is logged, and the connection becomes
 * a stream of ops with st; *rest, *rest_len: the bytes after the request
 * (the client's first frames). 0 or a negative errno. */
int http_res_upgrade(struct http_exchange *x, const char *extra, size_t elen,
                     const struct http_stream_ops *ops, void *st,
                     const char **rest, size_t *rest_len);
/* Whether a response's head was given (it is under way). */
bool http_res_started(const struct http_exchange *x);

/* ---- for a filter ---- */

/* Passes a piece on from the filter at `at` to the next one (or to the
 * framing). 0 or a negative errno. */
int http_filter_pass(struct http_exchange *x, int at, const char *p, size_t n,
                     bool last);
/* In a filter's head: sets the header `name` to `value` (NULL removes
 * it), replacing every line of that name. 0 or -ENOMEM. */
int http_res_header_set(struct http_exchange *x, http_head_t *h,
                        const char *name, const char *value);
/* The value of header `name` among h's lines (*vlen its length), or
 * NULL. */
const char *http_res_header_get(const http_head_t *h, const char *name,
                                size_t *vlen);

/* ---- for the server ---- */

/* Frees the filters' state and the changed header lines of the response
 * in flight (at its end, or when its connection closes). */
void http_out_free(http_out_t *o);
static inline void http_out_reset(http_out_t *o) {
  if (o->filt || o->hx) http_out_free(o);
  o->active = o->head_sent = false;
  o->h.headers = NULL;
  o->h.hlen = 0;
}

/* Writes v in lower-case hex at p (at most 16 bytes, no NUL); returns the
 * end. The chunk sizes' writer, also the static sender's ETags'. */
char *http_put_hex(char *p, uint64_t v);
/* Writes v in decimal at p (at most 20 bytes, no NUL); returns the end.
 * The status and Content-Length writer of HTTP/1.1's heads and HTTP/2's
 * (snprintf cost 350 instructions each, a tenth of this); inline, so
 * that h2 (and fuzz_h2, which stubs response.c) needs no more of it. */
static inline char *http_put_dec(char *p, uint64_t v) {
  char tmp[20];
  int i = 0;
  do tmp[i++] = (char)('0' + v % 10);
  while ((v /= 10));
  while (i) *p++ = tmp[--i];
  return p;
}

#endif
