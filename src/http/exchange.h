/* SPDX-License-Identifier: MIT */

/* exchange: what both HTTP framers (HTTP/1.1 in h1.c, HTTP/2 in h2.c),
 * the response writer (response.c) and the dispatcher (server.c) share:
 * a server's settings and hooks (http_server_t), a connection
 * (http_conn_t), an exchange (http_exchange_t: one request and its
 * response) and the framer of a connection (http_framer_t: its
 * protocol's code, given at accept by the selector, http/select.h).
 * What depends on the protocol (completing an exchange, refusing it,
 * its streamed body) goes through the connection's framer, so nothing
 * here names a framer: the writer and the dispatcher sit on this module,
 * and each framer on them.
 *
 * Threads: an http_server_t belongs to one reactor; every call here runs
 * on that reactor's thread (from its callbacks, or from code it runs). */
#ifndef MP_HTTP_EXCHANGE_H
#define MP_HTTP_EXCHANGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "core/stats.h"
#include "http/http1.h"
#include "net/reactor.h"
#include "net/sock.h"

typedef struct http_server http_server_t;
typedef struct http_conn http_conn_t;
typedef struct http_exchange http_exchange_t;
typedef struct http_framer http_framer_t;
/* The response writer's (http/response.h). */
typedef struct http_filter http_filter_t;
typedef struct http_out http_out_t;
/* Filters of one server at most. */
#define HTTP_FILTERS_MAX 8
/* Input buffers and request structs idle connections gave back; one per
 * thread (see http_server_t.cache); HTTP/1.1's (h1.c). */
typedef struct http_cache http_cache_t;
void http_cache_free(http_cache_t *k);

/* Unread bytes of a streamed body past which reading from the client
 * pauses until the application takes them (http_body_consume). */
#define HTTP_BODY_WINDOW (64 * 1024)

/* The events of a connection that became a stream. `st` is the stream
 * given to http_conn_stream; on_closed is its last event (it frees st). */
typedef struct http_stream_ops {
  void (*on_data)(conn_t *c, void *st, const char *data, size_t len);
  void (*on_ready)(conn_t *c, void *st);
  void (*on_timeout)(conn_t *c, void *st);
  void (*on_shutdown)(conn_t *c, void *st);
  void (*on_closed)(conn_t *c, void *st, int reason);
} http_stream_ops_t;

/* An error page: the body and Content-Type value the server answers a
 * status with instead of its short text (mp.http error_pages). */
typedef struct {
  char *body; /* NULL: none for this status */
  size_t len;
  char type[96];
} http_page_t;

/* Settings and hooks of one server (one mp.http on one lane). The
 * application fills it and keeps it until the last connection closed. */
struct http_server {
  reactor_t *r;
  size_t max_header, max_body;
  uint32_t header_timeout_ms, idle_ms;
  bool stream_body; /* on_request runs at the head; the body is streamed */
  bool h2c;         /* cleartext HTTP/2 by prior knowledge (http/h2.c) */
  uint32_t h2_max_streams; /* HTTP/2 streams open at once (0: 100) */
  int public_fd;           /* the public folder (http_public_*), -1 if none */
  /* Answers a request before the application does, if it is its to
   * answer (true: answered or refused); the application chains the
   * public folder in here (http_public_answer), so the dispatcher names
   * no part of its own. `app`: an on_request takes what is left. NULL:
   * none. */
  bool (*on_before)(http_exchange_t *x, bool app);
  char public_prefix[128]; /* only paths that start with it look there */
  size_t public_prefix_len;
  char status_path[128]; /* GET/HEAD of it answers on_metrics, or "" */
  size_t status_len;
  const int *access_fd; /* --log's fd (-1: none); read at each request */
  stats_slot_t *stats;  /* counts responses by class; may be NULL */
  http_cache_t **cache; /* the thread's cache, made on first use */
  /* The thread's pool of pages idle HTTP/2 sessions give back (h2_mem.c),
   * made on first use; NULL: sessions use malloc alone. The owner frees
   * it with http_h2_pool_free after the thread's last connection. */
  struct h2_pool **h2_pool;
  size_t conn_size;     /* bytes of a connection's state: at least
                           sizeof(http_conn_t), which it starts with
                           (the rest is the application's, zeroed) */
  /* A whole request (with stream_body: its head) that is not the
   * server's to answer. NULL: 404. The application answers with
   * the response writer (http_res_*, now or later), or
   * refuses. `body` (blen bytes) stays valid until the response is
   * complete; NULL with stream_body. */
  void (*on_request)(http_exchange_t *x, const char *body, size_t blen);
  /* A valid WebSocket upgrade request (GET, HTTP/1.1, a 24-byte key,
   * version 13); NULL: upgrades are ordinary requests. The application
   * accepts (http_res_upgrade) or answers.
   * Both hooks are called in HTTP_C_BUSY with no timeout set. */
  void (*on_upgrade)(http_exchange_t *x);
  /* A streamed body has news for a reader that waits (x->reading): bytes,
   * its end, or x->body_err ("timeout", "closed", "too large"...). */
  void (*on_body)(http_exchange_t *x);
  /* The metrics text of status_path (malloc'd, *n bytes), or NULL: 500. */
  char *(*on_metrics)(http_server_t *srv, size_t *n);
  /* Body filters every response goes through (http/response.h), in
   * order; the application fills them. */
  const http_filter_t *filters[HTTP_FILTERS_MAX];
  int nfilters;
  uint64_t exchanges; /* numbers them (http_exchange_t.id) */
  /* Error pages by status - 400 (400..599), or NULL: the application's */
  const http_page_t *pages;
  void *app; /* the application's */
};

/* Bytes of a request id on the access log (http_conn_t.log_id). */
#define HTTP_LOG_ID_MAX 64

/* States of a connection. */
enum {
  HTTP_C_HEAD,    /* reading a request's head (or idle) */
  HTTP_C_BODY,    /* its body */
  HTTP_C_BUSY,    /* the application has it (a response is due) */
  HTTP_C_CLOSING, /* closing: nothing more is read */
  HTTP_C_STREAM,  /* a WebSocket or SSE stream */
};

/* One exchange: a request and its response. HTTP/1.1 has one in flight
 * per connection (http_conn_t.x); a multiplexing protocol has many. The
 * application holds the exchange, not the connection: its hooks get it,
 * the writer (http/response.h) and the body calls below take it, and a
 * response object kept past its exchange finds nothing (the id no longer
 * matches: http_exchange_find). The application reads these fields and
 * sets only the ones marked so. */
struct http_exchange {
  http_conn_t *conn; /* its connection */
  uint64_t id;       /* unique on its server (http_server_t) */
  /* The request (its fields point into the connection's input). */
  http_request_t *req;
  const char *version; /* "1.0", "1.1", "2" */
  bool keep_alive;     /* false: the connection closes after it */
  /* stream_body: the request's body. */
  bool streaming;
  bool body_done;       /* all of it was taken */
  const char *body_err; /* it broke: no more reading, and the connection
                           closes after the response */
  bool reading;         /* the application waits for it (sets this) */
  uint64_t body_left;   /* Content-Length bytes not yet taken */
  uint64_t body_seen;   /* decoded bytes so far (chunked) */
  /* For the access log: the response's status and body bytes, and when
   * the request began. */
  int log_status;
  uint64_t log_bytes;
  uint64_t t_start;
  /* The response writer's state (http/response.h), which comes and goes
   * with req (one block from the cache): NULL when req is. */
  http_out_t *out;
  /* The request's id (the application's: [A-Za-z0-9._:-] only), last on
   * its access-log line: log_id_len bytes at log_id (with req's block;
   * HTTP_LOG_ID_MAX of room); cleared when the response completes. */
  char *log_id;
  uint8_t log_id_len;
};

/* One connection: the transport, the input, keep-alive and the limits.
 * The application reads these fields. */
struct http_conn {
  http_server_t *srv;
  const http_framer_t *framer; /* its protocol (http/select.h) */
  conn_t *c;                   /* the transport */
  sock_uuid_t uuid;
  int state;
  char *in; /* input not yet consumed */
  size_t len, cap;
  /* The request struct of the exchange in hand and the input buffer
   * come from the cache while a request is arriving or in flight and go
   * back when the connection is idle: an idle keep-alive connection holds
   * neither. */
  size_t head_len; /* of the request in hand (its body too once whole) */
  http_chunked_t chunk;
  size_t chunk_raw; /* input bytes the chunked decoder took */
  char *body;       /* a chunked body, decoded */
  size_t body_len, body_cap;
  bool continued; /* 100 Continue sent */
  bool held_back; /* pipelined requests wait for the queue to drain */
  bool paused;    /* a streamed body is over HTTP_BODY_WINDOW unread */
  /* Bytes of a streamed body offered to its reader straight from the
   * transport's read, before they are copied into `in` (h1_on_data, only
   * while nothing of the body waits in `in`): valid during that call
   * only; what the reader leaves is copied in after it. */
  const char *direct;
  size_t direct_len;
  uint64_t deadline; /* the arriving request must be whole by then */
  const http_stream_ops_t *stream_ops; /* HTTP_C_STREAM */
  void *stream;
  /* The exchange in flight (HTTP/1.1: one at a time). Streamed, the
   * request's head stays at in[0..head_len); unread body bytes follow it
   * (decoded ones in `body` for a chunked body). */
  http_exchange_t x;
  /* A watcher of the request in flight while the application serves it
   * without holding the connection (the proxy, http/proxy.h): told when
   * the write queue drained (HTTP_WATCH_READY), a streamed body has news
   * and no reader waits (HTTP_WATCH_BODY), and the connection closed
   * (HTTP_WATCH_CLOSED: its last call, hc is freed after it). Set and
   * cleared by the application. */
  void (*watch)(conn_t *c, void *arg, int event);
  void *watch_arg;
  void *proto; /* the framer's own state (HTTP/2: http/h2.c's), or NULL */
};
enum { HTTP_WATCH_READY, HTTP_WATCH_BODY, HTTP_WATCH_CLOSED };

/* Pipelined requests are answered while less than this is queued for
 * the connection: a client that sends requests and reads no answer holds
 * this much (plus one answer), not write_limit (which is for one large
 * answer); the rest of its requests wait in its socket. */
#define HTTP_PIPELINE_BUDGET (64u << 10)

/* A framer: the events of a connection of its protocol. */
struct http_framer {
  const char *alpn; /* its ALPN name ("http/1.1") */
  /* The connection opened: its state (srv->conn_size bytes, zeroed), now
   * c's udata; NULL when out of memory (c is then force-closed). */
  http_conn_t *(*open)(http_server_t *srv, conn_t *c);
  void (*on_data)(conn_t *c, const char *data, size_t len);
  void (*on_timeout)(conn_t *c);
  void (*on_ready)(conn_t *c);
  void (*on_shutdown)(conn_t *c);
  /* The connection closed: frees hc (its streams and exchanges first). */
  void (*closed)(conn_t *c, http_conn_t *hc, int reason);
  /* ---- a framer of its own responses (NULL: HTTP/1.1's, in
   * response.c). The writer (response.h) still owns the head's
   * contents, the filters and the byte counts; these put them in frames.
   * ---- */
  /* A body piece of x's response after the filters (its head first when
   * it has not gone out: x->out->h, x->out->len): n bytes (maybe 0),
   * `last` at its end. Runs release (when given) once. 0 or a negative
   * errno. */
  int (*out)(http_exchange_t *x, const char *p, size_t n, bool last,
             sock_release_fn release, void *ctx, void *ctx2);
  /* The head, then a whole body of len bytes of fd from off (takes fd). */
  int (*out_file)(http_exchange_t *x, int fd, off_t off, uint64_t len);
  /* ---- every framer's ---- */
  /* The exchange's response is complete (http_exchange_complete). */
  void (*complete)(http_exchange_t *x, bool keep_alive);
  /* Refuses the request in hand, or the connection (http_conn_refuse). */
  void (*refuse)(http_conn_t *hc, int status);
  /* A streamed body (stream_body): http_body_peek, http_body_consume and
   * http_body_finished below for the exchange in hand. */
  long (*body_peek)(http_exchange_t *x, const char **p);
  void (*body_consume)(http_exchange_t *x, size_t n);
  bool (*body_finished)(const http_exchange_t *x);
  /* http_body_wanted (NULL: nothing to do, as over HTTP/2). */
  void (*body_wanted)(http_exchange_t *x);
  /* Its counters of requests and body bytes (core/stats.h). */
  int stat_reqs, stat_body;
};

/* ---- the exchange, whatever its protocol ---- */

/* The exchange's response is complete: logs it, then closes
 * (keep_alive false) or goes on to the next request (HTTP/1.1's
 * pipelined ones run as the connection's next callback, not from inside
 * this call). */
static inline void http_exchange_complete(http_exchange_t *x, bool keep_alive) {
  x->conn->framer->complete(x, keep_alive);
}
/* Answers `status` with a short text body (or its error page) and closes
 * the connection (HTTP/2: resets the exchange's stream once its head went
 * out). */
static inline void http_conn_refuse(conn_t *c, http_conn_t *hc, int status) {
  (void)c;
  hc->framer->refuse(hc, status);
}
/* The application refuses the exchange: `status` with a short text
 * body, and its connection closes. */
static inline void http_exchange_refuse(http_exchange_t *x, int status) {
  x->conn->framer->refuse(x->conn, status);
}
/* An HTTP/2 exchange that needs HTTP/1.1 (an event stream: res:sse) is
 * reset with HTTP_1_1_REQUIRED, which tells the client to ask again over
 * HTTP/1.1 (RFC 9113 7), and completes. -EINVAL for another protocol
 * (h2.c). */
int http_exchange_h1_required(http_exchange_t *x);
/* The error page of `status`, or NULL. */
static inline const http_page_t *http_conn_page(const http_conn_t *hc,
                                                int status) {
  const http_page_t *p = hc->srv->pages;
  if (!p || status < 400 || status > 599 || !p[status - 400].body) return NULL;
  return &p[status - 400];
}
/* One access-log line (and the response count by class and protocol) for
 * the request in hand, or for the one that is arriving when state is
 * HTTP_C_HEAD. */
void http_conn_log(http_conn_t *hc, int status, uint64_t bytes);
/* The connection becomes a stream: its events go to ops with st, the
 * idle timeout applies, and nothing more is read as HTTP. The request in
 * hand and the bytes after it (*rest, *rest_len: a WebSocket client's
 * first frames) stay until http_conn_drop_request. */
void http_conn_stream(http_conn_t *hc, const http_stream_ops_t *ops, void *st,
                      const char **rest, size_t *rest_len);
/* Gives back the request's buffers (a stream needs them no more; h1.c). */
void http_conn_drop_request(http_conn_t *hc);

/* ---- streamed bodies (stream_body) ---- */

/* Results of http_body_peek besides a length. */
enum { HTTP_BODY_WAIT = -1, HTTP_BODY_END = -2, HTTP_BODY_ERR = -3 };
/* What came of the exchange's body and was not taken: its bytes at *p
 * and their count (take them with http_body_consume); HTTP_BODY_WAIT
 * when nothing came yet; HTTP_BODY_END at its end (marks it taken
 * whole); HTTP_BODY_ERR with x->body_err set. */
static inline long http_body_peek(http_exchange_t *x, const char **p) {
  return x->conn->framer->body_peek(x, p);
}
/* The application took n bytes of what http_body_peek gave: they leave
 * the buffer, and reading resumes if it was paused. */
static inline void http_body_consume(http_exchange_t *x, size_t n) {
  x->conn->framer->body_consume(x, n);
}
/* The application wants the body: a client waiting for 100 Continue
 * gets it now (once). */
static inline void http_body_wanted(http_exchange_t *x) {
  const http_framer_t *fr = x->conn->framer;
  if (fr->body_wanted) fr->body_wanted(x);
}
/* Whether the whole body was taken. */
static inline bool http_body_finished(const http_exchange_t *x) {
  return x->conn->framer->body_finished(x);
}

/* ---- the protocol's words ---- */

/* The reason phrase of a status ("Status" when unknown). */
const char *http_reason(int status);
/* The Date header's value (29 characters) of now, made at most once a
 * second per thread. */
const char *http_date_now(void);
/* Whether the request's method is m (inline: a constant m folds). */
static inline bool http_is_method(const http_request_t *r, const char *m) {
  size_t n = strlen(m);
  return r->method_len == n && memcmp(r->method, m, n) == 0;
}

#endif
