/* SPDX-License-Identifier: MIT */

/* sock: connection uuids, non-blocking socket calls and the per-connection
 * write queue. Knows nothing of events or Lua. */
#ifndef MP_SOCK_H
#define MP_SOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

/* A connection handle: the fd in the low 21 bits, the fd's generation above
 * them (32 bits, 53 in all, so the value is exact as a Lua number). Each
 * open of an fd takes the next generation (never 0), so a handle to a
 * closed connection matches a later connection on the same fd only after
 * 2^32 - 1 more opens of that very fd (a day at 50,000 connections a
 * second all landing on one fd; see ARCHITECTURE.md, issue 16 item 6).
 * 0 is never a valid uuid. */
typedef uint64_t sock_uuid_t;

#define SOCK_FD_BITS 21
#define SOCK_GEN_BITS 32

/* Raises RLIMIT_NOFILE's soft limit to the hard one, at most 2^21 (the fds
 * a uuid can name: a lower soft limit makes accept fail with EMFILE rather
 * than hand out an fd no uuid can name), and sizes the uuid table to it. Call once from the main thread before any
 * other sock call. Returns 0 or a negative errno. */
int sock_init(void);
/* Releases the table. Main thread, after every other thread is gone. */
void sock_deinit(void);

/* How many fds the table can hold. */
size_t sock_capacity(void);

/* Registers `fd` as a new connection owned by event loop `owner` (an index
 * the caller chooses), with `udata` for that owner. Returns the uuid, or 0
 * when fd is beyond the table. Owner thread. */
sock_uuid_t sock_uuid_open(int fd, int owner, void *udata);

/* Invalidates `uuid` (the caller then closes the fd). Owner thread. */
void sock_uuid_close(sock_uuid_t uuid);

/* Whether `uuid` still names an open connection. Any thread (a snapshot). */
bool sock_uuid_valid(sock_uuid_t uuid);

/* The fd of `uuid` (valid or not). */
static inline int sock_uuid_fd(sock_uuid_t uuid) {
  return (int)(uuid & ((1u << SOCK_FD_BITS) - 1));
}

/* The owner index given at open, or -1 when `uuid` is not valid. Any
 * thread (a snapshot: only the owner may act on it). */
int sock_uuid_owner(sock_uuid_t uuid);

/* The udata given at open when `uuid` is valid and owned by `owner`, else
 * NULL. Called by the owner thread, the answer stays true until that same
 * thread closes the uuid. */
void *sock_uuid_udata(sock_uuid_t uuid, int owner);

/* ---- sockets; each returns an fd (non-blocking, close-on-exec) or a
 * negative errno. -EADDRNOTAVAIL means a host name did not resolve. ---- */

/* TCP listener on host:port ("0.0.0.0", "::", "localhost", ...). */
int sock_listen_tcp(const char *host, int port, int backlog);
/* The same with SO_REUSEPORT: several such sockets share one port and the
 * kernel spreads new connections over them. */
int sock_listen_tcp_shared(const char *host, int port, int backlog);
/* The first socket of such a group: -EADDRINUSE when anything listens on
 * host:port already (another server's group too, which a plain
 * SO_REUSEPORT bind would join and split connections with). */
int sock_listen_tcp_group(const char *host, int port, int backlog);
/* A stream socket (TCP, or Unix with `unix`) that is neither bound nor
 * listening: what moonport --check hands a listener, so the script's
 * top level runs without taking a port. */
int sock_unbound(bool unix_domain);
/* Unix listener at `path`. A stale socket file (nobody accepts on it) is
 * replaced; a live one gives -EADDRINUSE. */
int sock_listen_unix(const char *path, int backlog);
/* The port a TCP listener is bound to, or a negative errno. */
int sock_local_port(int fd);
/* TCP keepalive on a connected (or connecting) socket, so a peer that
 * vanished without a FIN or RST (a host that went down, a dropped route)
 * is found: probes after `secs` idle, then every secs/3 (at least 1 s),
 * 3 unanswered ones close it; and TCP_USER_TIMEOUT at 2 * secs, so data
 * left unacknowledged that long closes it too (ETIMEDOUT). secs <= 0
 * leaves the socket as it is. 0 or a negative errno. Any thread. */
int sock_keepalive(int fd, int secs);
/* Accepts one connection (TCP_NODELAY set for TCP), or -EAGAIN. */
int sock_accept(int listen_fd);
/* Starts a connection. *done is true when it completed at once, false
 * when it is in progress (wait for writability, then sock_connect_result). */
int sock_connect_tcp(const char *host, int port, bool *done);
int sock_connect_unix(const char *path, bool *done);
/* The outcome of an in-progress connect: 0 or a negative errno. */
int sock_connect_result(int fd);
/* The peer's address as text and port; for a Unix socket "unix" and 0.
 * Returns 0 or a negative errno. */
int sock_peer(int fd, char *ip, size_t iplen, int *port);
/* A peer's address in 20 bytes, small enough for a connection to keep
 * (reactor_conn_peer): family 0 (not known yet), AF_INET, AF_INET6 or
 * AF_UNIX; the port in host order; the address's 4 or 16 bytes. */
typedef struct {
  uint8_t family;
  uint16_t port;
  uint8_t addr[16];
} sock_addr_t;
/* fd's peer into *a (getpeername). 0 or a negative errno. Any thread. */
int sock_peer_addr(int fd, sock_addr_t *a);
/* *a as sock_peer gives it: text into ip (iplen >= 46 holds any) and the
 * port. An IPv4 address is written without printf (a proxied request
 * asks for it every time). Any thread. */
void sock_addr_text(const sock_addr_t *a, char *ip, size_t iplen, int *port);
/* The path a Unix socket is bound to (the listener's path for accepted
 * connections); "" when unnamed. 0 or a negative errno. */
int sock_local_path(int fd, char *path, size_t len);

/* ---- the write queue ----
 *
 * Ownership on failure (docs/ARCHITECTURE.md, "Ownership on failure"): a
 * call that takes a buffer by reference (with a release function) or an
 * fd takes it whether it succeeds or fails. On failure it has released
 * the buffer or closed the fd before returning; the caller never cleans
 * up after it. Calls that copy (sock_wq_push_copy) take nothing. */

typedef struct sock_packet sock_packet_t;
typedef void (*sock_release_fn)(void *ctx, void *ctx2);

/* A pool of write-queue packets for the queues of one thread (a lane's
 * reactor): packets come in a few size classes, and a written packet goes
 * back to its class's free list instead of to malloc, so the steady state
 * of queued writes allocates nothing and glibc has no reason to trim and
 * re-fault its heap per message. At most `max_idle` bytes wait in the
 * pool; past that a packet goes back to malloc. Caller-provided storage;
 * the thread that owns the queues alone touches it. */
#define SOCK_POOL_CLASSES 5
typedef struct {
  sock_packet_t *free[SOCK_POOL_CLASSES];
  size_t idle;     /* bytes of the packets on the free lists */
  size_t max_idle; /* the bound on `idle` */
  uint64_t hits;   /* packets served from a free list */
  uint64_t misses; /* packets that had to be malloc'ed */
} sock_pool_t;

#define SOCK_POOL_DEFAULT_IDLE ((size_t)1 << 20)

void sock_pool_init(sock_pool_t *pool, size_t max_idle);
/* Frees the idle packets; every queue using the pool must be cleared. */
void sock_pool_deinit(sock_pool_t *pool);
/* Frees idle packets until at most `keep` bytes wait in the pool. */
void sock_pool_trim(sock_pool_t *pool, size_t keep);

/* Caller-provided storage. Single-threaded (the connection's owner). */
typedef struct {
  sock_packet_t *head, *tail;
  size_t bytes; /* queued and not yet written (files count their length) */
  sock_pool_t *pool; /* where packets come from and go back to; NULL: malloc */
} sock_wq_t;

void sock_wq_init(sock_wq_t *wq);
/* The same, taking packets from `pool` (borrowed: it must outlive the
 * queue's packets, i.e. the queue is cleared before the pool goes). */
void sock_wq_init_pooled(sock_wq_t *wq, sock_pool_t *pool);
/* Drops what is queued, releasing references and closing files. */
void sock_wq_clear(sock_wq_t *wq);
/* Copies `len` bytes in (small writes share a buffer; a packet's size is
 * the smallest class that holds the write). 0 or -ENOMEM. */
int sock_wq_push_copy(sock_wq_t *wq, const void *data, size_t len);
/* Queues `len` bytes at `data` without copying; they must stay valid until
 * release(ctx, ctx2) is called (after they are written or dropped). Takes
 * the reference in every case: on -ENOMEM release has run before the
 * return. 0 or -ENOMEM. */
int sock_wq_push_ref(sock_wq_t *wq, const void *data, size_t len,
                     sock_release_fn release, void *ctx, void *ctx2);
/* Queues `len` bytes of file `file_fd` from `offset`; takes the fd in
 * every case: the queue closes it when done or dropped, and on -ENOMEM
 * (or len 0) it is closed before the return. 0 or -ENOMEM. */
int sock_wq_push_file(sock_wq_t *wq, int file_fd, off_t offset, size_t len);
/* Writes as much as the socket takes. Returns 0 when the queue is empty,
 * 1 when bytes remain (the socket is full), or a negative errno. */
int sock_wq_flush(int fd, sock_wq_t *wq);
/* The memory packets at the head of the queue (up to the first file, at
 * most `max`) as an iovec; `*total` (if not NULL) gets their bytes. */
int sock_wq_iov(const sock_wq_t *wq, struct iovec *iov, int max,
                size_t *total);
/* For a queue whose bytes are transformed before they go out (TLS): when
 * the head is a file, reads up to `cap` of its bytes into buf and drops
 * them from the queue. The count, 0 when the head is not a file, or a
 * negative errno (-EIO when the file ended early). */
ssize_t sock_wq_read_file(sock_wq_t *wq, void *buf, size_t cap);
/* Drops the first `n` bytes, written elsewhere (at most the memory packets
 * sock_wq_iov described). */
void sock_wq_consume(sock_wq_t *wq, size_t n);

#endif
