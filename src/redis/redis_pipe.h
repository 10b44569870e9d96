/* SPDX-License-Identifier: MIT */

/* redis_pipe: TLS for a hiredis connection (rediss://). hiredis 0.14 has
 * neither TLS nor a way to hand it a socket of ours, but it reads and
 * writes its fd with plain read(2)/write(2): so it is given a local Unix
 * socket whose other end this module pumps, both ways, through a reactor
 * client connection with TLS (net/tls.h) to the real Redis. hiredis speaks
 * plaintext to its end and never knows.
 *
 * The local pair is made through a listening socket in a new private
 * directory (mode 0700) that lives only for the one connect: hiredis's
 * redisAsyncConnectUnix(path) completes at once (a Unix connect lands in
 * the backlog), the pipe accepts it there and then, checks that the peer
 * is this process (SO_PEERCRED), and removes the socket and the
 * directory. Nothing is left to connect to afterwards.
 *
 * Back pressure both ways: each end stops reading while the other's write
 * queue is past its limit. Either end closing closes the other once what
 * it has queued is delivered, so hiredis sees the TLS connection's end as
 * its socket's end, and a reconnect makes a new pipe.
 *
 * Reactor thread only. */
#ifndef MP_REDIS_PIPE_H
#define MP_REDIS_PIPE_H

#include <stddef.h>
#include <stdint.h>

#include "net/reactor.h"
#include "net/tls.h"

typedef struct redis_pipe redis_pipe_t;

/* Why the TLS side failed (the handshake's reason, "connection refused",
 * "timeout", ...), once, while the pipe is attached (redis_pipe_detach
 * stops it). */
typedef void (*redis_pipe_fail_fn)(void *arg, const char *why);

/* A pipe with its listening socket: the path for redisAsyncConnectUnix is
 * redis_pipe_path(p). NULL with a reason in err on failure. */
redis_pipe_t *redis_pipe_new(reactor_t *r, char *err, size_t errlen);
const char *redis_pipe_path(const redis_pipe_t *p);

/* Takes the connection hiredis made to the path (the listener and the
 * directory go), and connects to host:port (an IP address) with TLS over
 * ctx (referenced by the connection), verifying tls_host, with TCP
 * keepalive after keepalive_s idle seconds (sock_keepalive; 0: off). 0,
 * or -1 with a reason in err (the pipe still needs redis_pipe_detach). */
int redis_pipe_start(redis_pipe_t *p, const char *host, int port,
                     net_tls_ctx_t *ctx, const char *tls_host,
                     uint32_t connect_ms, int keepalive_s,
                     redis_pipe_fail_fn fail, void *arg, char *err,
                     size_t errlen);

/* In a process forked from the pipe's: closes its sockets (the parent's
 * copies stay), frees nothing. NULL is a no-op. */
void redis_pipe_close_fds(redis_pipe_t *p);

/* The owner lets go: no more callbacks. The pipe closes what is left of
 * it (gracefully) and frees itself once both ends are gone; at once if it
 * never started. NULL is a no-op. */
void redis_pipe_detach(redis_pipe_t *p);

#endif
