/* SPDX-License-Identifier: MIT */

/* redis: Redis connections driven by a moonport reactor (hiredis's async
 * API through its adapter hooks: no second event loop), and the pub/sub
 * engine that joins the post offices of several servers through one
 * Redis. One reactor thread owns each link and engine. */
#ifndef MP_REDIS_H
#define MP_REDIS_H

#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "net/reactor.h"

/* redis://[:password@]host[:port][/db] (also redis://user:password@...,
 * the user being ignored: Redis 5 AUTH takes a password only), and
 * rediss://...[?verify=0&ca=FILE&sni=NAME&cert=FILE&key=FILE], the same
 * over TLS (redis_pipe.h): verified against the system's store, or `ca`,
 * for the host's name, or `sni`. Query values are %-decoded. Both take
 * keepalive=SECS (default REDIS_KEEPALIVE; 0: off): TCP keepalive and
 * TCP_USER_TIMEOUT on the link (sock_keepalive), so a Redis that vanished
 * is found in about 2 * SECS, not minutes. */
#define REDIS_KEEPALIVE 15
typedef struct {
  char host[256];
  int port;
  char path[108]; /* unix:///path: the Unix socket ("" for TCP) */
  char password[256];
  int db;
  bool tls;
  bool verify;        /* tls: check the certificate (default) */
  char sni[256];      /* tls: the name sent and verified ("": the host) */
  char ca[512], cert[512], key[512]; /* tls: PEM files, or "" */
  int keepalive;                     /* seconds (sock_keepalive); 0: off */
} redis_url_t;

/* 0, or -1 with a message in err. Also takes
 * unix://[[user:]password@]/path/to/redis.sock[?db=N] (no TLS). */
int redis_url_parse(const char *s, redis_url_t *u, char *err, size_t errlen);

/* "host:port" or "unix:PATH", for log lines; returns buf. */
const char *redis_url_where(const redis_url_t *u, char *buf, size_t len);

/* A rediss:// URL's client context (a reference the caller drops), or
 * NULL with the reason in err (a file that doesn't load). Any thread. */
net_tls_ctx_t *redis_url_tls(const redis_url_t *u, char *err, size_t errlen);

/* ---- a link: one connection that reconnects ---- */

typedef struct redis_link redis_link_t;

typedef struct {
  /* Connected (AUTH and SELECT are queued ahead of anything sent from
   * here on). */
  void (*up)(redis_link_t *l, void *arg);
  /* Lost, or failed to connect; it retries by itself. */
  void (*down)(redis_link_t *l, void *arg);
} redis_link_hooks_t;

/* Connects now and again after each loss, with a backoff from 100 ms to
 * 5 s; a connect that takes longer than `connect_ms` fails. `name` is for
 * log lines ("redis subscriber"). A rediss:// URL goes through a
 * redis_pipe each time, and the link is up only once a PING has come back
 * through it. NULL when out of memory, or (errno EINVAL, logged) when the
 * URL's TLS files don't load. */
redis_link_t *redis_link_new(reactor_t *r, const redis_url_t *u,
                             const char *name, int connect_ms,
                             redis_link_hooks_t hooks, void *arg);
/* The most bytes of commands a context holds unsent (hiredis's output
 * buffer, which has no bound of its own): while Redis is up but slow to
 * read, the engine queues publishes past it (bounded below) and r:cmd
 * refuses with "output buffer full". */
#define REDIS_OBUF_MAX ((size_t)16 << 20)
/* Bytes of commands in ac's output buffer not yet written to the socket
 * (0 for NULL). The context's thread. */
size_t redis_ctx_unsent(const redisAsyncContext *ac);

/* The live context (commands may be sent), or NULL while down. */
redisAsyncContext *redis_link_ctx(redis_link_t *l);
/* The same, or the context still connecting (commands sent to it wait
 * for the connection, behind AUTH and SELECT). */
redisAsyncContext *redis_link_ctx_any(redis_link_t *l);
/* rediss: why the TLS connection under ac failed or ended (the pipe's
 * reason: "certificate verify failed: ..."), while its NULL replies are
 * called back; NULL when it didn't. The link's thread. */
const char *redis_link_tls_error(const redisAsyncContext *ac);
/* True when ac's link is being freed: a reply callback that gets NULL then
 * must not run user code (the owner closed the link). */
bool redis_link_closing(const redisAsyncContext *ac);
/* True while the connect timer frees ac (a connect, or the AUTH/SELECT
 * handshake, took longer than connect_ms): the NULL replies then mean
 * "timed out connecting", not a lost connection. The link's thread. */
bool redis_link_connect_timed_out(const redisAsyncContext *ac);
/* Frees the link and its context; pending replies are called back with
 * NULL first. Legal from inside any of the link's callbacks (a reply
 * callback that closes its own client): the memory then goes when the
 * outermost hiredis call returns. */
void redis_link_free(redis_link_t *l);

/* ---- the pub/sub engine ---- */

typedef struct redis_engine redis_engine_t;

/* A message that came through Redis, for one subscription: the exact
 * channel's (pat NULL) or pattern pat's. Redis sends one copy per
 * matching subscription, so each copy is for its own subscribers only. */
typedef void (*redis_msg_fn)(const char *ch, size_t clen, const char *msg,
                             size_t mlen, const char *pat, size_t plen,
                             void *arg);
/* Calls add(ch, len, pattern, add_arg) for every channel and pattern the
 * server subscribes to (to subscribe again after a reconnect). */
typedef void (*redis_each_fn)(void (*add)(const char *ch, size_t len,
                                          bool pattern, void *add_arg),
                              void *add_arg, void *arg);

/* Publishes that wait while Redis is away or slow (its output buffer
 * holds REDIS_OBUF_MAX), at most. */
#define REDIS_QUEUE_MAX 10000
#define REDIS_QUEUE_BYTES ((size_t)64 << 20)

redis_engine_t *redis_engine_new(reactor_t *r, const redis_url_t *u,
                                 redis_msg_fn on_msg, redis_each_fn each,
                                 void *arg);
void redis_engine_free(redis_engine_t *e);
/* Both of the engine's connections are up. */
bool redis_engine_up(const redis_engine_t *e);
/* In a process forked from the engine's: closes its sockets, frees
 * nothing (the memory is the parent's copy). */
void redis_engine_close_fds(redis_engine_t *e);
/* The first subscriber of a channel or pattern in this server appeared,
 * or the last one went. */
void redis_engine_subscribe(redis_engine_t *e, const char *ch, size_t len,
                            bool pattern);
void redis_engine_unsubscribe(redis_engine_t *e, const char *ch, size_t len,
                              bool pattern);
/* PUBLISH; waits in a bounded queue while Redis is away or slow (the
 * oldest are dropped past REDIS_QUEUE_MAX messages or REDIS_QUEUE_BYTES,
 * with a log line that says how many). */
void redis_engine_publish(redis_engine_t *e, const char *ch, size_t clen,
                          const char *msg, size_t mlen);
/* From now on the engine stores in *gauge, after every change, the bytes
 * of publishes it holds (unsent in the output buffer, and queued), for
 * other threads to read (relaxed: a hint for refusing more). */
void redis_engine_set_gauge(redis_engine_t *e, _Atomic size_t *gauge);

#endif
