/* SPDX-License-Identifier: MIT */

/* reactor: one event loop per lane thread. It owns that lane's connections
 * (sock uuids), its timers and a mailbox other threads post tasks to, and
 * dispatches connection events to protocol objects.
 *
 * Threading model: every connection, listener registration and timer of a
 * reactor belongs to the reactor's thread; only reactor_post,
 * reactor_shutdown, reactor_defer_io and reactor_each may be called from
 * other threads. A connection's callbacks therefore never run on two
 * threads, and never two at once: while one is running or suspended
 * (reactor_conn_hold), the connection's other events wait. */
#ifndef MP_REACTOR_H
#define MP_REACTOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/stats.h"
#include "core/timer.h"
#include "net/sock.h"
#include "net/tls.h"

typedef struct reactor reactor_t;
typedef struct conn conn_t;
typedef struct listener listener_t;

/* Why a connection closed; the names are what Lua sees. */
enum conn_reason {
  CONN_PEER = 0,  /* "peer": the other side closed */
  CONN_ERROR,     /* "error": read/write error, or a handler failed */
  CONN_TIMEOUT,   /* "timeout": idle */
  CONN_SHUTDOWN,  /* "shutdown": the server is stopping */
  CONN_LOCAL,     /* "local": the application closed it */
};
const char *reactor_reason_name(int reason);

/* A protocol: what a connection does on each event. Any member may be
 * NULL. Every callback runs on the reactor's thread with the connection
 * held (it cannot be freed under it; it may close itself). */
typedef struct {
  void (*on_open)(conn_t *c);
  void (*on_data)(conn_t *c, const char *data, size_t len);
  void (*on_ready)(conn_t *c);    /* the write queue drained */
  void (*on_timeout)(conn_t *c);  /* idle; NULL closes (CONN_TIMEOUT) */
  void (*on_shutdown)(conn_t *c); /* server stopping; writes still go out */
  /* The last callback of a connection that opened; the fd is gone. */
  void (*on_close)(conn_t *c, int reason);
  /* The last callback of a client connection that never opened (instead
   * of on_open/on_close); err is a negative errno (-ETIMEDOUT on the
   * connect timeout, -ECANCELED at shutdown). */
  void (*on_fail)(conn_t *c, int err);
} proto_t;

/* Per-connection settings, copied into each connection. */
typedef struct {
  uint32_t timeout_ms;  /* idle limit, 0 = none */
  size_t write_limit;   /* queue bytes before reading pauses; 0 = default */
  size_t max_queue;     /* queue bytes past which writes fail; 0 = default */
  /* TLS (net/tls.h): a server context on a listener, a client context on
   * reactor_connect. The connection then opens (on_open) once the
   * handshake is done, within timeout_ms (or REACTOR_HANDSHAKE_MS when
   * that is 0) of the accept or the connect, bytes or not; its queue holds
   * plaintext and is encrypted as it goes out. A server connection whose
   * handshake fails closes without a callback; a client's gets on_fail
   * with -EPROTO (reactor_conn_tls_error says why) or -ETIMEDOUT. */
  net_tls_ctx_t *tls;
  const char *tls_host;  /* client: SNI and the name verified (copied) */
  /* server: written, unencrypted, to a client that sends plaintext where a
   * ClientHello goes (a plain HTTP request on an HTTPS port), before the
   * close; NULL closes at once. Must outlive the listener. */
  const char *tls_plain_reply;
  /* reactor_adopt: an internal link (the root's pipe to a worker, the
   * Redis pipe between lanes), not a client: left out of the connection
   * counters, which say what clients hold */
  bool internal;
  /* A connection other connections' work goes through (the rediss://
   * pipe): a shutdown neither tells nor waits for it, so it stays open
   * through the stop hook; it closes (CONN_SHUTDOWN) when the loop has
   * nothing else left, or at the deadline. */
  bool outlive_shutdown;
} conn_opts_t;

#define REACTOR_HANDSHAKE_MS 10000

#define REACTOR_DEFAULT_WRITE_LIMIT ((size_t)1 << 20)
#define REACTOR_DEFAULT_MAX_QUEUE ((size_t)16 << 20)
#define REACTOR_READ_CHUNK ((size_t)64 * 1024)

/* ---- the loop ---- */

/* A new reactor with lane index `index` (also its sock owner id). NULL and
 * errno on failure. Any thread; it then belongs to the thread that runs
 * it. */
reactor_t *reactor_new(int index);
/* Frees a reactor whose loop has returned (or never ran). Connections
 * still held are freed without callbacks. */
void reactor_free(reactor_t *r);
int reactor_index(const reactor_t *r);

/* Runs the loop until a shutdown has completed: every connection is gone,
 * the stop hook has run, and nothing holds the reactor (reactor_ref), or
 * the grace deadline passed. Returns 0 or a negative errno. */
int reactor_run(reactor_t *r);

/* Called once on the reactor's thread when a shutdown has closed every
 * connection (or the deadline passed); may start timers and hold the
 * reactor to finish work. Set before running. */
void reactor_set_stop_hook(reactor_t *r, void (*fn)(reactor_t *r, void *arg),
                           void *arg);

/* The monotonic clock in milliseconds, read now (not a stamp of the
 * iteration: timers armed from it last their whole delay however long the
 * iteration has run). Any thread. */
uint64_t reactor_now(const reactor_t *r);
/* Reads the clock now (monotonic ms). */
uint64_t reactor_clock_ms(void);
/* The loop's stamp of this iteration (monotonic ms, read once per pass):
 * for a hot path that may be up to one iteration behind (mp.limit's
 * decisions), never for arming a deadline (reactor_now). Loop thread. */
uint64_t reactor_loop_ms(const reactor_t *r);

/* Keeps a stopping loop alive (a suspended task waits for a timer, say);
 * every ref needs an unref. Reactor thread. */
void reactor_ref(reactor_t *r);
void reactor_unref(reactor_t *r);

/* Runs fn(a, b) on the reactor's thread soon. Any thread. 0 or -ENOMEM. */
int reactor_post(reactor_t *r, void (*fn)(void *a, void *b), void *a, void *b);
/* Same, from the reactor's own thread, without a wake-up. */
int reactor_defer(reactor_t *r, void (*fn)(void *a, void *b), void *a, void *b);

/* Starts a graceful shutdown of this reactor: listeners stop polling (they
 * stay allocated until reactor_listener_close or reactor_free), every
 * connection gets on_shutdown and closes once its queue drains; whatever
 * is left after grace_ms is closed at once. Any thread; idempotent (a
 * second call moves the deadline to now). */
void reactor_shutdown(reactor_t *r, uint64_t grace_ms);
bool reactor_stopping(const reactor_t *r);

/* Stops accepting and lets the open connections finish by themselves; when
 * the last is gone, or after drain_ms, shuts down as reactor_shutdown does
 * with grace_ms. Any thread. */
void reactor_drain(reactor_t *r, uint64_t drain_ms, uint64_t grace_ms);
/* Whether a drain has begun, or reactor_drain has been called (reactor
 * thread). A protocol with keep-alive
 * lets its next answer close the connection, so the client reconnects to
 * a server that accepts rather than having an idle connection closed
 * under a request it is sending. */
bool reactor_draining(const reactor_t *r);

/* Counts accepted and closed server connections and bytes read and
 * written into `slot` (core/stats.h), or nothing with NULL. Reactor
 * thread, before or between iterations. */
void reactor_set_stats(reactor_t *r, stats_slot_t *slot);

/* The reactor's timer heap, for timer_start/timer_stop (reactor thread;
 * use reactor_now for `now`). */
timer_heap_t *reactor_timers(reactor_t *r);

/* Calls fn(arg) on the reactor's thread whenever `fd` turns readable
 * (level-triggered: fn must consume what made it readable). The reactor
 * does not own or close fd. NULL and errno on failure. Reactor thread, or
 * before the loop runs. */
typedef struct reactor_watch reactor_watch_t;
reactor_watch_t *reactor_watch(reactor_t *r, int fd, void (*fn)(void *arg),
                               void *arg);
/* The same for a client library that drives its own socket (hiredis):
 * fn(arg, events) gets POLL_READ / POLL_WRITE / POLL_HUP as they happen,
 * for the interest `flags` (POLL_READ | POLL_WRITE, changed with
 * reactor_watch_set; level-triggered). */
reactor_watch_t *reactor_watch_io(reactor_t *r, int fd, unsigned flags,
                                  void (*fn)(void *arg, unsigned events),
                                  void *arg);
int reactor_watch_set(reactor_watch_t *w, unsigned flags);
/* Stops watching and frees the watch (safe from inside fn). */
void reactor_unwatch(reactor_watch_t *w);

/* ---- listeners ---- */

/* Accepts connections from `fd` (non-blocking, may be shared with other
 * reactors; this one does not own or close it). New connections get
 * `proto`, `service` and `opts`. NULL and errno on failure. Reactor
 * thread. */
listener_t *reactor_listen(reactor_t *r, int fd, const proto_t *proto,
                           void *service, conn_opts_t opts);
/* With a dispatcher, each accepted fd goes to dispatch(l, fd, arg) instead
 * of becoming a connection of this reactor, so the caller can spread
 * connections over reactors (reactor_adopt on the chosen one). dispatch
 * takes the fd (it adopts or closes it, whatever fails). Set it
 * right after reactor_listen. Reactor thread. */
void reactor_listener_set_dispatch(listener_t *l,
                                   void (*dispatch)(listener_t *l, int fd,
                                                    void *arg),
                                   void *arg);

/* Makes an accepted fd a connection of this reactor (on_open runs). Takes
 * the fd in every case: on failure (a stopping reactor, no memory, an fd
 * epoll refuses) it is closed before the return. Reactor thread. */
void reactor_adopt(reactor_t *r, int fd, const proto_t *proto, void *service,
                   conn_opts_t opts);

/* Stops accepting in this reactor and frees the listener; connections it
 * accepted go on. Reactor thread. */
void reactor_listener_close(listener_t *l);
int reactor_listener_fd(const listener_t *l);

/* ---- connections (reactor thread unless said otherwise) ---- */

/* Starts a client connection to host:port (TCP) or to a Unix `path` (when
 * path != NULL). It is open once proto->on_open runs; until then writes are
 * queued. Failures after return arrive as proto->on_fail; a failure known
 * at once (refused, no such socket file, unresolved host) returns NULL
 * with *err set to a negative errno, and no callback runs. */
conn_t *reactor_connect(reactor_t *r, const char *host, int port,
                        const char *path, uint32_t connect_timeout_ms,
                        const proto_t *proto, void *service, conn_opts_t opts,
                        int *err);

/* The connection with `uuid` if it is open (or opening) and owned by this
 * reactor, else NULL. */
conn_t *reactor_conn_find(reactor_t *r, sock_uuid_t uuid);

sock_uuid_t reactor_conn_uuid(const conn_t *c);
reactor_t *reactor_conn_reactor(const conn_t *c);
void *reactor_conn_service(const conn_t *c);
void *reactor_conn_udata(const conn_t *c);
void reactor_conn_set_udata(conn_t *c, void *udata);
int reactor_conn_fd(const conn_t *c);
/* The peer's address as text and port, as sock_peer gives them; read
 * from the socket on the first call and kept, so later calls (a request
 * log line, X-Forwarded-For, req:peer() on every request) make no system
 * call. 0 or a negative errno. */
int reactor_conn_peer(conn_t *c, char *ip, size_t iplen, int *port);
/* Whether writes are still accepted (not closed, no close requested). */
bool reactor_conn_is_open(const conn_t *c);

/* Writes. The calls that take a buffer by reference or an fd follow the
 * one ownership rule (docs/ARCHITECTURE.md, "Ownership on failure"): they
 * take it whether they succeed or fail, and on failure have released the
 * buffer / closed the fd before returning, so a caller never frees after
 * a failed call (nor needs to tell the failures apart to know whether to).
 *
 * Writes `len` bytes: as much as the socket takes at once, the rest copied
 * into the queue. 0, or -EPIPE when the connection is closed or closing,
 * -ENOBUFS when max_queue bytes are queued already (back pressure only
 * stops reading; this bounds writes that come from elsewhere, such as
 * timers or other connections), or -ENOMEM. A write error closes the
 * connection (CONN_ERROR). */
int reactor_conn_write(conn_t *c, const void *data, size_t len);
/* Same without copying: what is not written at once is queued by reference
 * and release(ctx, ctx2) runs when it is sent or dropped. Takes the
 * reference in every case: on failure release has run once before the
 * return (the bytes are not needed any more). Returns 0 or a negative
 * errno as above. */
int reactor_conn_write_ref(conn_t *c, const void *data, size_t len,
                           sock_release_fn release, void *ctx, void *ctx2);
/* Queues `len` bytes of `file_fd` from `offset` (sendfile). Takes the fd
 * in every case: on failure it is closed before the return. 0, -EPIPE,
 * -ENOBUFS or -ENOMEM as above. */
int reactor_conn_sendfile(conn_t *c, int file_fd, off_t offset, size_t len);
/* TLS: whether `c` is encrypted; if so and `info` is not NULL, fills it
 * (net/tls.h; the strings live as long as the connection). */
bool reactor_conn_tls(const conn_t *c, net_tls_info_t *info);
/* Why a TLS connection failed (the handshake, a bad record), as one line,
 * or NULL when it did not. Valid in on_fail and on_close. */
const char *reactor_conn_tls_error(const conn_t *c);
/* Whether the peer reset `c` (a read or write failed with ECONNRESET; the
 * close reason says CONN_PEER, as for an orderly close). Valid in on_fail
 * and on_close. Reactor thread. */
bool reactor_conn_was_reset(const conn_t *c);

/* Bytes queued and not yet written. */
size_t reactor_conn_pending(const conn_t *c);
/* The same for a caller that may wait for them: when not 0, on_ready
 * follows once the queue drains, whether the kernel refused the bytes or
 * they only wait for the loop's io_uring batch (which alone sets no
 * on_ready). The Lua `pending()` methods. Reactor thread. */
size_t reactor_conn_pending_ready(conn_t *c);
/* Whether the queue is past write_limit (back pressure: reading stops
 * until it is down to half). A protocol that answers input already read
 * (pipelined requests) waits for on_ready instead of writing more. */
bool reactor_conn_congested(const conn_t *c);

/* Closes once the queue has drained (reading stops now). */
void reactor_conn_close(conn_t *c, int reason);
/* Closes now, dropping the queue. */
void reactor_conn_force_close(conn_t *c, int reason);

/* Stops / restarts reading (no on_data while paused). */
void reactor_conn_pause(conn_t *c);
void reactor_conn_resume(conn_t *c);

/* Marks a callback of `c` as suspended: until the matching release, no
 * other callback of `c` runs and `c` is not freed (its fd may close). */
void reactor_conn_hold(conn_t *c);
void reactor_conn_release(conn_t *c);

/* Whether a callback of `c` is running or waiting (held). */
bool reactor_conn_busy(const conn_t *c);

/* Runs fn(c, arg) as one of c's callbacks: at once if none is running or
 * waiting and no earlier task waits, else after them, in order. If c
 * closes first, fn(NULL, arg) runs instead (to free arg). 0 or -ENOMEM
 * (then nothing runs). */
int reactor_conn_task(conn_t *c, void (*fn)(conn_t *c, void *arg), void *arg);

/* The idle limit, and a reset of the idle clock. */
void reactor_conn_set_timeout(conn_t *c, uint32_t timeout_ms);
uint32_t reactor_conn_timeout(const conn_t *c);
/* The bytes its write queue holds at most (max_queue). */
size_t reactor_conn_max_queue(const conn_t *c);

/* ---- groups: the reactors of one process ---- */

typedef struct {
  reactor_t **r;
  size_t n;
} reactor_group_t;

/* Runs fn(c, a) on the owner thread of `uuid` if the connection is still
 * open then, else fn(NULL, a) (on the owner's or the calling thread).
 * Any thread. */
void reactor_defer_io(reactor_group_t *g, sock_uuid_t uuid,
                      void (*fn)(conn_t *c, void *a), void *a);

/* Runs fn(c, a) for every open connection of `service` on each reactor of
 * the group, on that reactor's thread. Returns how many reactors will run
 * it: g->n, or fewer when memory ran out (0 if the tasks could not all be
 * made: then none runs), so a caller that must reach every connection can
 * tell it did not. Any thread. */
size_t reactor_each(reactor_group_t *g, void *service,
                    void (*fn)(conn_t *c, void *a), void *a);

#endif
