/* SPDX-License-Identifier: MIT */

/* redis_pipe: hiredis's plaintext through a TLS connection (see
 * redis_pipe.h). */
#include "redis/redis_pipe.h"
#include "net/sock.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct redis_pipe {
  reactor_t *r;
  char dir[256];
  char path[PATH_MAX]; /* "" once removed */
  int lfd;             /* the listener, -1 once closed */
  conn_t *in;          /* hiredis's peer: our end of the local socket */
  conn_t *out;         /* the TLS connection to Redis */
  bool in_paused, out_paused;
  bool attached;
  int depth; /* calls under way that may free it (see pipe__leave) */
  redis_pipe_fail_fn fail;
  void *arg;
};

/* The listener and its directory go (after the accept, or unused). */
static void pipe__unlisten(redis_pipe_t *p) {
  if (p->lfd >= 0) close(p->lfd);
  p->lfd = -1;
  if (p->path[0]) unlink(p->path);
  p->path[0] = 0;
  if (p->dir[0]) rmdir(p->dir);
  p->dir[0] = 0;
}

static void pipe__enter(redis_pipe_t *p) { p->depth++; }
/* Frees p when nothing is left of it: not attached, both ends closed. */
static void pipe__leave(redis_pipe_t *p) {
  if (--p->depth > 0 || p->attached || p->in || p->out || p->lfd >= 0) return;
  free(p);
}

static const char *pipe__tmpdir(void) {
  const char *t = getenv("TMPDIR");
  return t && *t && strlen(t) < 200 ? t : "/tmp";
}

redis_pipe_t *redis_pipe_new(reactor_t *r, char *err, size_t errlen) {
  redis_pipe_t *p = calloc(1, sizeof(*p));
  if (!p) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  p->r = r;
  p->lfd = -1;
  p->attached = true;
  snprintf(p->dir, sizeof(p->dir), "%s/moonport-rediss-XXXXXX", pipe__tmpdir());
  if (!mkdtemp(p->dir)) { /* mode 0700: only this user can reach it */
    snprintf(err, errlen, "mkdtemp in %s: %s", pipe__tmpdir(), strerror(errno));
    free(p);
    return NULL;
  }
  snprintf(p->path, sizeof(p->path), "%s/s", p->dir);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  if (strlen(p->path) >= sizeof(sa.sun_path)) {
    snprintf(err, errlen, "socket path too long: %s", p->path);
    goto fail;
  }
  memcpy(sa.sun_path, p->path, strlen(p->path) + 1);
  p->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (p->lfd < 0 || bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)) ||
      listen(p->lfd, 1)) {
    snprintf(err, errlen, "local socket %s: %s", p->path, strerror(errno));
    goto fail;
  }
  return p;
fail:
  pipe__unlisten(p);
  free(p);
  return NULL;
}

const char *redis_pipe_path(const redis_pipe_t *p) { return p->path; }

/* ---- the two ends ---- */

/* Bytes from one end to the other; the source stops reading while the
 * other's queue is past its write limit (its on_ready resumes it). */
static void pipe__forward(redis_pipe_t *p, conn_t *from, conn_t *to,
                          bool *paused, const char *data, size_t len) {
  if (!to || !reactor_conn_is_open(to)) { /* the other end is going */
    reactor_conn_close(from, CONN_LOCAL);
    return;
  }
  if (reactor_conn_write(to, data, len)) { /* closed, or no memory */
    reactor_conn_close(from, CONN_ERROR);
    return;
  }
  if (!*paused && reactor_conn_congested(to)) {
    *paused = true;
    reactor_conn_pause(from);
  }
  (void)p;
}

static void pipe__in_open(conn_t *c) {
  redis_pipe_t *p = reactor_conn_service(c);
  p->in = c;
}

static void pipe__in_data(conn_t *c, const char *data, size_t len) {
  redis_pipe_t *p = reactor_conn_service(c);
  pipe__forward(p, c, p->out, &p->in_paused, data, len);
}

/* hiredis took what waited for it: Redis's side may send again. */
static void pipe__in_ready(conn_t *c) {
  redis_pipe_t *p = reactor_conn_service(c);
  if (p->out_paused && p->out) {
    p->out_paused = false;
    reactor_conn_resume(p->out);
  }
}

static void pipe__in_close(conn_t *c, int reason) {
  (void)reason;
  redis_pipe_t *p = reactor_conn_service(c);
  pipe__enter(p);
  p->in = NULL;
  if (p->out) reactor_conn_close(p->out, CONN_LOCAL);
  pipe__leave(p);
}

static void pipe__out_data(conn_t *c, const char *data, size_t len) {
  redis_pipe_t *p = reactor_conn_service(c);
  pipe__forward(p, c, p->in, &p->out_paused, data, len);
}

static void pipe__out_ready(conn_t *c) {
  redis_pipe_t *p = reactor_conn_service(c);
  if (p->in_paused && p->in) {
    p->in_paused = false;
    reactor_conn_resume(p->in);
  }
}

/* The TLS side ended: hiredis's end follows, once it has everything
 * that came before. A failure is told to the owner first. */
static void pipe__out_gone(conn_t *c, const char *why) {
  redis_pipe_t *p = reactor_conn_service(c);
  pipe__enter(p);
  p->out = NULL;
  if (why && p->attached && p->fail) p->fail(p->arg, why);
  if (p->in) reactor_conn_close(p->in, CONN_LOCAL);
  pipe__leave(p);
}

static void pipe__out_close(conn_t *c, int reason) {
  const char *why = reactor_conn_tls_error(c);
  if (!why && reason == CONN_ERROR) why = "connection error";
  pipe__out_gone(c, why);
}

static void pipe__out_fail(conn_t *c, int err) {
  char buf[128];
  const char *why = reactor_conn_tls_error(c);
  if (!why) {
    if (err == -ETIMEDOUT)
      why = "timeout";
    else if (err == -ECANCELED)
      why = "shutdown";
    else
      why = strerror_r(-err, buf, sizeof(buf));
  }
  pipe__out_gone(c, why);
}

static const proto_t pipe__in_proto = {
    .on_open = pipe__in_open,
    .on_data = pipe__in_data,
    .on_ready = pipe__in_ready,
    .on_close = pipe__in_close,
};

static const proto_t pipe__out_proto = {
    .on_data = pipe__out_data,
    .on_ready = pipe__out_ready,
    .on_close = pipe__out_close,
    .on_fail = pipe__out_fail,
};

int redis_pipe_start(redis_pipe_t *p, const char *host, int port,
                     net_tls_ctx_t *ctx, const char *tls_host,
                     uint32_t connect_ms, int keepalive_s,
                     redis_pipe_fail_fn fail, void *arg, char *err,
                     size_t errlen) {
  /* hiredis's connect is in the backlog already (a Unix connect lands
   * there at once): take it now, and nothing else. */
  int fd = accept4(p->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  int e = errno;
  pipe__unlisten(p);
  if (fd < 0) {
    snprintf(err, errlen, "local socket: accept: %s", strerror(e));
    return -1;
  }
  struct ucred cred;
  socklen_t clen = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) ||
      cred.pid != getpid()) {
    close(fd);
    snprintf(err, errlen, "local socket: a connection from another process");
    return -1;
  }
  p->fail = fail;
  p->arg = arg;
  /* Both ends outlive a shutdown's start: what the stop handlers send
   * Redis goes through them (reactor.h). Not a client: not counted. */
  conn_opts_t in_opts = {.internal = true, .outlive_shutdown = true};
  reactor_adopt(p->r, fd, &pipe__in_proto, p, in_opts); /* sets p->in */
  if (!p->in) {
    snprintf(err, errlen, "local socket: the loop refused it");
    return -1;
  }
  conn_opts_t out_opts = {.outlive_shutdown = true};
  out_opts.tls = ctx;
  out_opts.tls_host = tls_host;
  int cerr = 0;
  p->out = reactor_connect(p->r, host, port, NULL, connect_ms,
                           &pipe__out_proto, p, out_opts, &cerr);
  if (!p->out) {
    char buf[128];
    snprintf(err, errlen, "%s",
             strerror_r(cerr ? -cerr : EIO, buf, sizeof(buf)));
    reactor_conn_close(p->in, CONN_LOCAL);
    return -1;
  }
  if (reactor_conn_fd(p->out) >= 0)
    (void)sock_keepalive(reactor_conn_fd(p->out), keepalive_s);
  return 0;
}

void redis_pipe_detach(redis_pipe_t *p) {
  if (!p) return;
  pipe__enter(p);
  p->attached = false;
  p->fail = NULL;
  pipe__unlisten(p);
  if (p->in) reactor_conn_close(p->in, CONN_LOCAL);
  if (p->out) reactor_conn_close(p->out, CONN_LOCAL);
  pipe__leave(p);
}

void redis_pipe_close_fds(redis_pipe_t *p) {
  if (!p) return;
  if (p->lfd >= 0) close(p->lfd);
  if (p->in && reactor_conn_fd(p->in) >= 0) close(reactor_conn_fd(p->in));
  if (p->out && reactor_conn_fd(p->out) >= 0) close(reactor_conn_fd(p->out));
}
