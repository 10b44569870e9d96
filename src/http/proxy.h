/* SPDX-License-Identifier: MIT */

/* proxy: the reverse proxy's hot path below the binding (mp.upstream,
 * src/lx/lx_upstream.c). Three parts, none of them Lua:
 *
 *  - the request head for the upstream (proxy_request_head): the client's
 *    head rewritten (target, Host, hop-by-hop fields and the ones its
 *    Connection names dropped, X-Forwarded-*, Forwarded, the framing);
 *  - one try of an exchange (proxy_start): the head and body go to the
 *    upstream, the answer comes back to the client, both ways with back
 *    pressure (a congested side pauses reading from the other), the
 *    response head filtered the same way and the body re-framed by the
 *    server's response writer (http_conn_write_head); a WebSocket upgrade
 *    answered with 101 splices the two sockets;
 *  - a keep-alive pool of upstream connections per reactor.
 *
 * Threads: a pool and its exchanges belong to one reactor; every call
 * here runs on that reactor's thread. */
#ifndef MP_HTTP_PROXY_H
#define MP_HTTP_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http1.h"
#include "http/server.h"
#include "net/reactor.h"

/* Whether a field is hop-by-hop (RFC 9110 7.6.1: Connection,
 * Proxy-Connection, Keep-Alive, TE, Transfer-Encoding, Upgrade, Trailer)
 * or named in one of the message's Connection fields (`conn`, the
 * Connection values joined, may be NULL). */
bool proxy_hop_by_hop(const char *name, size_t len, const char *conn,
                      size_t conn_len);

/* What proxy_request_head adds and drops. Strings are borrowed. */
typedef struct {
  const char *target; /* the request target, NULL: the client's */
  size_t target_len;
  const char *host;   /* the Host to send, NULL: the client's */
  size_t host_len;
  const char *peer;   /* the client's address ("127.0.0.1", "::1") */
  const char *proto;  /* "http" or "https" */
  /* lines to add ("Name: value\r\n"...) */
  const char *extra;
  size_t extra_len;
  /* lower-case names, each ended by '\n', of the client's fields not to
   * pass on (those `extra` replaces, and opts.strip) */
  const char *drop;
  size_t drop_len;
  /* The body's framing: body_len >= 0 is a whole body of that length
   * (Content-Length); -1 streams the client's body (its Content-Length,
   * or chunked); -2 none. */
  long long body_len;
} proxy_head_opts_t;

/* Writes the upstream request head (through its empty line) into
 * out[0..cap). Returns its length, or -ENOSPC. */
long proxy_request_head(char *out, size_t cap, const http_request_t *req,
                        const proxy_head_opts_t *o);

typedef struct proxy_pool proxy_pool_t;
typedef struct proxy proxy_t;

/* A pool of idle upstream connections for reactor r: at most `per_key`
 * (given per try) per server and PROXY_POOL_MAX in all. NULL and errno. */
#define PROXY_POOL_MAX 1024
proxy_pool_t *proxy_pool_new(reactor_t *r);
/* Closes the idle connections and detaches the live exchanges (their
 * callbacks never run); before the reactor goes. */
void proxy_pool_free(proxy_pool_t *pool);
/* Idle connections now held (for tests and metrics). */
size_t proxy_pool_idle(const proxy_pool_t *pool);

/* One try. */
typedef struct {
  const char *ip;   /* numeric */
  int port;
  const char *key;  /* the pool's key of this server (at most 63 bytes) */
  uint32_t keepalive;  /* idle connections kept for the key; 0: none */
  uint32_t connect_ms, timeout_ms; /* timeout: of each read and write */
  const char *head; /* the request head (copied) */
  size_t head_len;
  const char *body; /* a whole body (copied), or NULL */
  size_t body_len;
  bool stream_body; /* the client's streamed body follows the head */
  bool chunk_body;  /* ... re-chunked (the client's was chunked) */
  bool head_request;
  bool upgrade;     /* a 101 answer splices the connections */
  bool fresh;       /* don't take a pooled connection */
  /* TLS to the upstream (a new connection's; a pooled one keeps its
   * session): the client context (borrowed; the connection takes its own
   * reference) and the name sent as SNI and verified (copied). NULL:
   * plain. The pool key must tell TLS settings apart (the caller's). */
  net_tls_ctx_t *tls;
  const char *tls_host;
} proxy_try_t;

/* How a try ended. */
typedef struct proxy_result {
  int err;          /* 0, or a negative errno: -ECONNREFUSED and the
                       connect's errors, -ETIMEDOUT (connect or read),
                       -EPROTO (a bad answer), -ECONNRESET (closed early),
                       -EPIPE (the client went away), -EIO (its body
                       broke) */
  int status;       /* the upstream's status, 0 if none came */
  bool sent;        /* request bytes went to an open upstream connection */
  bool answered;    /* response bytes went to the client */
  bool reused;      /* on a pooled connection */
  bool spliced;     /* the connections became a tunnel (101) */
  uint64_t ms;      /* from the start to the response head (or the end) */
  /* why a TLS connect failed (the handshake, the certificate check), or
   * NULL; valid while done runs */
  const char *tls_error;
} proxy_result_t;

/* Called once per try, when its outcome for the caller is known: at the
 * error before any answer (the caller may try again), else when the
 * response is complete or broke, or the tunnel closed. The client
 * connection is held for the caller again (see proxy_start). A complete
 * response has been completed (http_conn_complete) before. */
typedef void (*proxy_done_fn)(void *arg, const proxy_result_t *res);

/* Starts a try for the request in flight on `client` (HTTP_C_BUSY, held
 * by the caller's callback). Takes over the caller's hold: it is released
 * now (so the client's data and drain events flow) and taken again before
 * done runs. 0, or a negative errno (nothing started, nothing released,
 * done never runs). */
int proxy_start(proxy_pool_t *pool, conn_t *client, http_conn_t *hc,
                const proxy_try_t *t, proxy_done_fn done, void *arg);

#endif
