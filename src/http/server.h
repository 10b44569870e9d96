/* server: the HTTP/1.1 connection protocol of mp.http, in C. It owns a
 * connection from its first byte to its close: reading and buffering
 * requests (http1 parses), keep-alive and pipelining (one request in
 * flight, the next ones wait in the buffer), back pressure (pipelined
 * requests wait while reactor_conn_congested), the header and idle
 * timeouts, refusals (400, 408, 413, 431, 500...), 100 Continue, chunked
 * bodies, streamed bodies (stream_body), the response head, the access
 * log, the metrics path, the public folder (http/public.h) and the
 * WebSocket handshake. What a request *means* is the application's: the
 * server calls the hooks of its http_server_t (on_request, on_upgrade,
 * on_body, on_metrics), and the application answers through the
 * http_conn_* calls below. mp.http's Lua objects (src/lx/lx_http.c) are
 * one such application; spec/c/test_server.c is another.
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
#include <stdint.h>
#include <string.h>

#include "core/stats.h"
#include "http/http1.h"
#include "net/reactor.h"
#include "net/sock.h"

typedef struct http_server http_server_t;
typedef struct http_conn http_conn_t;
/* Input buffers and request structs idle connections gave back; one per
 * thread (see http_server_t.cache). */
typedef struct http_cache http_cache_t;
void http_cache_free(http_cache_t *k);

/* Unread bytes of a streamed body past which reading from the client
 * pauses until the application takes them (http_conn_body_take). */
#define HTTP_BODY_WINDOW (64 * 1024)

/* The events of a connection that became a stream. `st` is the stream
 * given to http_conn_stream; on_closed is its last event (it frees st). */
typedef struct {
  void (*on_data)(conn_t *c, void *st, const char *data, size_t len);
  void (*on_ready)(conn_t *c, void *st);
  void (*on_timeout)(conn_t *c, void *st);
  void (*on_shutdown)(conn_t *c, void *st);
  void (*on_closed)(conn_t *c, void *st, int reason);
} http_stream_ops_t;

/* Settings and hooks of one server (one mp.http on one lane). The
 * application fills it and keeps it until the last connection closed. */
struct http_server {
  reactor_t *r;
  size_t max_header, max_body;
  uint32_t header_timeout_ms, idle_ms;
  bool stream_body; /* on_request runs at the head; the body is streamed */
  int public_fd;    /* the public folder (http_public_*), -1 if none */
  char public_prefix[128]; /* only paths that start with it look there */
  size_t public_prefix_len;
  char status_path[128];   /* GET/HEAD of it answers on_metrics, or "" */
  size_t status_len;
  const int *access_fd;    /* --log's fd (-1: none); read at each request */
  stats_slot_t *stats;     /* counts responses by class; may be NULL */
  http_cache_t **cache;    /* the thread's cache, made on first use */
  size_t conn_size;        /* bytes of a connection's state: at least
                              sizeof(http_conn_t), which it starts with
                              (the rest is the application's, zeroed) */
  /* A whole request (with stream_body: its head) that is not the
   * server's to answer. NULL: 404. The application answers with
   * http_conn_write_head + http_conn_complete (now or later), or
   * refuses. `body` (blen bytes) stays valid until the response is
   * complete; NULL with stream_body. */
  void (*on_request)(conn_t *c, http_conn_t *hc, const char *body,
                     size_t blen);
  /* A valid WebSocket upgrade request (GET, HTTP/1.1, a 24-byte key,
   * version 13); NULL: upgrades are ordinary requests. The application
   * accepts (http_conn_upgrade_101, then http_conn_stream) or answers.
   * Both hooks are called in HTTP_C_BUSY with no timeout set. */
  void (*on_upgrade)(conn_t *c, http_conn_t *hc);
  /* A streamed body has news for a reader that waits (hc->reading): bytes,
   * its end, or hc->body_err ("timeout", "closed", "too large"...). */
  void (*on_body)(conn_t *c, http_conn_t *hc);
  /* The metrics text of status_path (malloc'd, *n bytes), or NULL: 500. */
  char *(*on_metrics)(http_server_t *srv, size_t *n);
  void *app; /* the application's */
};

/* States of a connection. */
enum {
  HTTP_C_HEAD,    /* reading a request's head (or idle) */
  HTTP_C_BODY,    /* its body */
  HTTP_C_BUSY,    /* the application has it (a response is due) */
  HTTP_C_CLOSING, /* closing: nothing more is read */
  HTTP_C_STREAM,  /* a WebSocket or SSE stream */
};

/* One connection. The application reads these fields and sets only the
 * ones marked so. */
struct http_conn {
  http_server_t *srv;
  sock_uuid_t uuid;
  int state;
  char *in; /* input not yet consumed */
  size_t len, cap;
  /* The request in hand (its fields point into `in`). Both come from the
   * cache while a request is arriving or in flight and go back when the
   * connection is idle: an idle keep-alive connection holds neither. */
  http_request_t *req;
  size_t head_len; /* of the request in hand (its body too once whole) */
  http_chunked_t chunk;
  size_t chunk_raw; /* input bytes the chunked decoder took */
  char *body;       /* a chunked body, decoded */
  size_t body_len, body_cap;
  bool continued;   /* 100 Continue sent */
  bool held_back;   /* pipelined requests wait for the queue to drain */
  bool keep_alive;  /* of the request in flight (false: close after it) */
  uint64_t deadline; /* the arriving request must be whole by then */
  const http_stream_ops_t *stream_ops; /* HTTP_C_STREAM */
  void *stream;
  /* stream_body: the body of the request in flight. The head stays at
   * in[0..head_len); unread body bytes follow it (decoded ones in `body`
   * for a chunked body). */
  bool streaming;
  bool body_done;       /* all of it was taken */
  const char *body_err; /* it broke: no more reading, and the connection
                           closes after the response */
  bool reading;         /* the application waits for it (sets this) */
  bool paused;          /* over HTTP_BODY_WINDOW unread */
  uint64_t body_left;   /* Content-Length bytes not yet taken */
  uint64_t body_seen;   /* decoded bytes so far (chunked) */
  uint32_t seq;         /* numbers the requests (the application's) */
  /* For the access log: the response's status and body bytes, and when
   * the request began. */
  int log_status;
  uint64_t log_bytes;
  uint64_t t_start;
};

/* The head of a response. `headers` holds the extra lines ("Name:
 * value\r\n"...), hlen bytes; has_type: one of them is Content-Type. */
typedef struct {
  int status;
  bool head_only;  /* a HEAD request: no body bytes */
  bool keep_alive; /* cleared when the connection closes after it */
  bool http10;
  bool has_type;
  const char *headers;
  size_t hlen;
} http_head_t;

/* A head for the request in hand: `status`, keep_alive, http10 and
 * head_only from the request, no header lines. */
static inline http_head_t http_conn_head(const http_conn_t *hc, int status) {
  http_head_t h = {.status = status,
                   .keep_alive = hc->keep_alive,
                   .http10 = hc->req->minor == 0,
                   .head_only = hc->req->method_len == 4 &&
                                memcmp(hc->req->method, "HEAD", 4) == 0};
  return h;
}

/* Small bodies go out in the same write as the head. */
#define HTTP_INLINE_BODY 4096

/* ---- the protocol (proto_t members: the application's proto_t points
 * at these, and wraps on_open / on_close) ---- */

/* A connection opened: its state (srv->conn_size bytes, zeroed), now
 * c's udata. NULL when out of memory (c is then force-closed). */
http_conn_t *http_conn_open(http_server_t *srv, conn_t *c);
void http_server_on_data(conn_t *c, const char *data, size_t len);
void http_server_on_timeout(conn_t *c);
void http_server_on_ready(conn_t *c);
void http_server_on_shutdown(conn_t *c);
/* The connection closed: a stream gets on_closed, then hc is freed and
 * c's udata cleared. The application's on_close runs what it must first
 * (a waiting reader). */
void http_conn_closed(conn_t *c, http_conn_t *hc, int reason);

/* The stream c became, if c is a connection of this protocol in
 * HTTP_C_STREAM with these ops; else NULL. The `service` the listener
 * was given (reactor_conn_service) must start with its proto_t, as
 * lx_service_t does. */
void *http_conn_stream_of(conn_t *c, const http_stream_ops_t *ops);

/* ---- answering ---- */

/* Writes the status line, Date, the framing (Content-Length, or chunked
 * for len < 0; an HTTP/1.0 client's unframed body ends with the
 * connection), Connection, a default Content-Type when a body comes and
 * none is set, h's lines, and the body too if it is small (*inlined says
 * whether the body needs no more writing). Records the status and length
 * for the access log. May clear h->keep_alive. 0 or a negative errno. */
int http_conn_write_head(conn_t *c, http_conn_t *hc, http_head_t *h,
                         long long len, const char *body, bool *inlined);
/* The response of the request in flight is complete: logs it, then
 * closes (keep_alive false) or goes on to the next request (pipelined
 * ones run as c's next callback, not from inside this call). */
void http_conn_complete(conn_t *c, http_conn_t *hc, bool keep_alive);
/* Answers `status` with a short text body and closes the connection. */
void http_conn_refuse(conn_t *c, http_conn_t *hc, int status);
/* One access-log line (and the response count by class) for the request
 * in hand, or for the one that is arriving when state is HTTP_C_HEAD. */
void http_conn_log(conn_t *c, http_conn_t *hc, int status, uint64_t bytes);

/* ---- WebSocket and SSE ---- */

/* Writes the 101 of the WebSocket upgrade in hand (with the extra header
 * lines, elen bytes) and logs it. 0 or a negative errno. */
int http_conn_upgrade_101(conn_t *c, http_conn_t *hc, const char *extra,
                          size_t elen);
/* c becomes a stream: its events go to ops with st, the idle timeout
 * applies, and nothing more is read as HTTP. The request in hand and the
 * bytes after it (*rest, *rest_len: a WebSocket client's first frames)
 * stay until http_conn_drop_request. */
void http_conn_stream(conn_t *c, http_conn_t *hc, const http_stream_ops_t *ops,
                      void *st, const char **rest, size_t *rest_len);
/* Gives back the request's buffers (a stream needs them no more). */
void http_conn_drop_request(http_conn_t *hc);

/* ---- streamed bodies (stream_body) ---- */

/* Results of http_conn_body_peek besides a length. */
enum { HTTP_BODY_WAIT = -1, HTTP_BODY_END = -2, HTTP_BODY_ERR = -3 };
/* What came of the body and was not taken: its bytes at *p and their
 * count (take them with http_conn_body_consume); HTTP_BODY_WAIT when
 * nothing came yet; HTTP_BODY_END at its end (marks it taken whole);
 * HTTP_BODY_ERR with hc->body_err set. */
long http_conn_body_peek(http_conn_t *hc, const char **p);
/* The application took n bytes of what http_conn_body_peek gave: they
 * leave the buffer, and reading resumes if it was paused. */
void http_conn_body_consume(conn_t *c, http_conn_t *hc, size_t n);
/* The application wants the body: a client waiting for 100 Continue
 * gets it now (once). */
void http_conn_body_wanted(conn_t *c, http_conn_t *hc);
/* Whether the whole body was taken. */
bool http_conn_body_finished(const http_conn_t *hc);

/* ---- used by the parts of the server (public.c) ---- */

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
