/* SPDX-License-Identifier: MIT */

/* lx_tcp_int: what the files of mp.tcp share (lx_tcp.c, the sockets and
 * their pool; lx_tcp_server.c, the on_connect listeners' connections):
 * the socket and pool entry structs and the connection events both
 * protocols use. Internal to them. Lane thread only. */
#ifndef MP_LX_TCP_INT_H
#define MP_LX_TCP_INT_H

#include "lx/lx_client.h"

#define LX_TCP_MT "moonport.tcp"

/* What a reactor connection's udata points at: a socket or a pool entry. */
enum { K_SOCK = 1, K_IDLE };
enum { S_NEW = 0, S_CONNECTING, S_OPEN, S_CLOSED };
enum { OP_NONE = 0, OP_CONNECT, OP_READ, OP_SEND };
enum { R_N = 0, R_LINE, R_ALL, R_UNTIL };

#define LX_TCP_MAX_BUFFER ((size_t)1 << 20) /* default max_buffer */
#define LX_TCP_MAX_LINE ((size_t)64 << 10)  /* default max_line */
#define LX_TCP_KEEP_BUF ((size_t)64 << 10)  /* an empty buffer kept */
#define LX_TCP_POOL_SIZE 30                 /* default per key */
#define LX_TCP_POOL_MAX 1024                /* per lane, all keys */
#define LX_TCP_IDLE_MS 60000                /* default idle time in the pool */
#define LX_TCP_TIMEOUT_MS 60000 /* default connect, send and read bounds */

struct lx_tcp {
  int kind;        /* K_SOCK */
  lx_client_t *cl; /* NULL once the lane's client state is gone */
  conn_t *c;       /* NULL when not connected */
  int state;
  char errbuf[256]; /* S_CLOSED: why ("closed", "connection refused", ..) */
  char *key;        /* pool key */
  char *host;       /* NULL for a Unix socket */
  char *path;
  int port;
  net_tls_ctx_t *tls; /* TLS: the context until the connect takes its own */
  char *tls_host;     /* TLS: the name sent as SNI and verified */
  dns_req_t *dq;      /* the lookup in flight */
  char *buf;          /* unread bytes: buf[off, len) */
  size_t off, len, cap;
  size_t scan; /* unread bytes already searched (line, pattern) */
  size_t max_buffer, max_line;
  uint32_t t_connect, t_send, t_read;
  int reused;
  bool paused;      /* reading stopped: the buffer is past max_buffer */
  bool server;      /* accepted by an on_connect listener (never pooled) */
  bool shutdown;    /* the server is stopping: a read that waits ends */
  sock_uuid_t uuid; /* server: the connection's, for s:uid() */
  /* the wait */
  int op;
  int rmode;
  size_t rn; /* R_N: bytes */
  char *pat; /* R_UNTIL: pattern */
  size_t plen;
  bool incl;
  size_t sent; /* OP_SEND: bytes the call sent */
  lx_run_t run;
  int anchor;  /* registry ref to the userdata while a wait is armed */
  bool queued; /* a resume task is posted */
  mp_timer_t timer;
  struct lx_tcp *prev, *next; /* cl->socks */
};

struct lx_tcp_idle {
  int kind; /* K_IDLE */
  lx_client_t *cl;
  conn_t *c;
  char *key;
  int reused;
  struct lx_tcp_idle *prev, *next;
};

/* ---- lx_tcp.c, for lx_tcp_server.c ---- */

/* Resumes the socket's waiter if its op can finish now. */
void lx_tcp__try(lx_tcp_t *s);
/* The connection went (err: a negative errno, or 0 with a reason). */
void lx_tcp__gone(conn_t *c, int err, int reason);
/* The connection events of a socket (or a pool entry). */
void lx_tcp__on_data(conn_t *c, const char *data, size_t len);
void lx_tcp__on_ready(conn_t *c);
void lx_tcp__on_timeout(conn_t *c);
void lx_tcp__on_fail(conn_t *c, int err);

#endif
