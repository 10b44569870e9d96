/* SPDX-License-Identifier: MIT */

/* reactor_open: how connections come into being on a reactor: a new
 * connection's state, listeners and accept (with its retry when out of
 * descriptors), fd watches, and outgoing connects with their timeout.
 * The loop (reactor.c) calls in here for the events of listeners and
 * connects; reactor_int.h is what the files of the reactor share. */
#include "net/reactor_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/log.h"
#include "core/stats.h"
#include "net/poll.h"
#include "net/uring.h"

static conn_t *conn__new(reactor_t *r, int fd, const proto_t *proto,
                         void *service, conn_opts_t opts, uint32_t flags) {
  conn_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->kind = KIND_CONN;
  c->fd = fd;
  c->r = r;
  c->proto = proto;
  c->service = service;
  c->flags = flags | (opts.outlive_shutdown ? F_OUTLIVE : 0);
  c->timeout_ms = opts.timeout_ms;
  c->write_limit =
      opts.write_limit ? opts.write_limit : REACTOR_DEFAULT_WRITE_LIMIT;
  c->max_queue = opts.max_queue ? opts.max_queue : REACTOR_DEFAULT_MAX_QUEUE;
  c->last_active = r->now;
  sock_wq_init_pooled(&c->wq, &r->pool);
  sock_wq_init_pooled(&c->tls_out, &r->pool);
  net_uring_io_init(&c->io, fd, &c->wq);
  if (opts.tls && conn__tls_init(c, opts)) {
    free(c);
    errno = ENOMEM;
    return NULL;
  }
  c->uuid = sock_uuid_open(fd, r->index, c);
  if (!c->uuid) {
    net_tls_free(c->tls);
    free(c);
    errno = EMFILE;
    return NULL;
  }
  /* Edge-triggered for both directions, registered once: no epoll_ctl per
   * read or write. */
  if (poll_add(r->poller, fd, c, POLL_READ | POLL_WRITE | POLL_EDGE)) {
    int e = errno;
    sock_uuid_close(c->uuid);
    net_tls_free(c->tls);
    free(c);
    errno = e;
    return NULL;
  }
  list__push(&r->live, c);
  r->nlive++;
  if (c->flags & F_OUTLIVE) r->noutlive++;
  return c;
}

static void listener__retry(mp_timer_t *t) {
  listener_t *l = t->udata;
  if (!l->closed && !l->polled && !l->r->stopping &&
      poll_add(l->r->poller, l->fd, l, POLL_READ | POLL_EXCLUSIVE) == 0)
    l->polled = true;
}

void listener__accept(listener_t *l) {
  reactor_t *r = l->r;
  /* on_open may close the listener: check after every connection. */
  for (int i = 0; i < 64 && !r->stopping && !l->closed; i++) {
    int fd = sock_accept(l->fd);
    if (fd == -EAGAIN) return;
    if (fd == -EINTR || fd == -ECONNABORTED) continue;
    if (fd == -EINVAL) {
      /* It no longer listens: a graceful stop shut it down (it refuses
       * new connections now). Nothing to accept, ever: stop polling it. */
      if (l->polled && poll_del(r->poller, l->fd) == 0) l->polled = false;
      return;
    }
    if (fd < 0) {
      /* Out of fds: stop polling the listener for a moment, or the level-
       * triggered readiness would spin the loop. */
      log_warn("accept failed: %s; pausing accepts for 500 ms", strerror(-fd));
      if (l->polled && poll_del(r->poller, l->fd) == 0) l->polled = false;
      timer_start(&r->timers, &l->retry, reactor_clock_ms(), 500, 0, 1,
                  listener__retry, NULL, l);
      return;
    }
    if (l->dispatch)
      l->dispatch(l, fd, l->dispatch_arg);
    else
      reactor_adopt(r, fd, l->proto, l->service, l->opts);
  }
}

void reactor_adopt(reactor_t *r, int fd, const proto_t *proto, void *service,
                   conn_opts_t opts) {
  if (r->stopping) {
    close(fd);
    return;
  }
  conn_t *c = conn__new(r, fd, proto, service, opts,
                        F_OPEN | F_ACCEPTED | (opts.internal ? 0 : F_COUNTED));
  if (!c) {
    close(fd);
    return;
  }
  if (!opts.internal) stats_add(r->stats, STAT_CONN_ACCEPTED, 1);
  /* TLS: on_open once the handshake is done (conn__tls_read) */
  if (proto->on_open && !c->tls) conn__call(c, proto->on_open);
  if (c->flags & F_DEAD) conn__enqueue(c, 0);
}

void reactor_listener_set_dispatch(listener_t *l,
                                   void (*dispatch)(listener_t *, int, void *),
                                   void *arg) {
  l->dispatch = dispatch;
  l->dispatch_arg = arg;
}

listener_t *reactor_listen(reactor_t *r, int fd, const proto_t *proto,
                           void *service, conn_opts_t opts) {
  listener_t *l = calloc(1, sizeof(*l));
  if (!l) return NULL;
  l->kind = KIND_LISTENER;
  l->fd = fd;
  l->r = r;
  l->proto = proto;
  l->service = service;
  l->opts = opts;
  timer_init(&l->retry);
  if (!r->stopping) {
    int rc = poll_add(r->poller, fd, l, POLL_READ | POLL_EXCLUSIVE);
    if (rc) {
      free(l);
      errno = -rc;
      return NULL;
    }
    l->polled = true;
  }
  l->next = r->listeners;
  if (l->next) l->next->prev = l;
  r->listeners = l;
  return l;
}

/* The listener may be in use further up the stack (accepting, an event
 * of this batch, its retry timer in the running timer batch), so it is
 * only unhooked here and freed at the end of the loop iteration. */
void reactor_listener_close(listener_t *l) {
  reactor_t *r = l->r;
  if (l->closed) return;
  l->closed = true;
  if (l->polled) poll_del(r->poller, l->fd);
  l->polled = false;
  timer_stop(&r->timers, &l->retry);
  if (l->prev)
    l->prev->next = l->next;
  else
    r->listeners = l->next;
  if (l->next) l->next->prev = l->prev;
  l->prev = NULL;
  l->next = r->closed_listeners;
  r->closed_listeners = l;
}

static reactor_watch_t *reactor__watch(reactor_t *r, int fd, unsigned flags,
                                       void (*fn)(void *),
                                       void (*fn_io)(void *, unsigned),
                                       void *arg) {
  reactor_watch_t *w = calloc(1, sizeof(*w));
  if (!w) return NULL;
  *w = (reactor_watch_t){KIND_WATCH, fd,         false, fn,   arg,
                         r,          r->watches, fn_io, flags};
  int rc = poll_add(r->poller, fd, w, flags);
  if (rc) {
    free(w);
    errno = -rc;
    return NULL;
  }
  r->watches = w;
  return w;
}

reactor_watch_t *reactor_watch(reactor_t *r, int fd, void (*fn)(void *),
                               void *arg) {
  return reactor__watch(r, fd, POLL_READ, fn, NULL, arg);
}

reactor_watch_t *reactor_watch_io(reactor_t *r, int fd, unsigned flags,
                                  void (*fn)(void *arg, unsigned events),
                                  void *arg) {
  return reactor__watch(r, fd, flags, NULL, fn, arg);
}

int reactor_watch_set(reactor_watch_t *w, unsigned flags) {
  if (w->closed || w->flags == flags) return 0;
  w->flags = flags;
  return poll_mod(w->r->poller, w->fd, w, flags);
}

void reactor_unwatch(reactor_watch_t *w) {
  reactor_t *r = w->r;
  if (w->closed) return;
  w->closed = true;
  poll_del(r->poller, w->fd);
  reactor_watch_t **pp = &r->watches;
  while (*pp && *pp != w) pp = &(*pp)->next;
  if (*pp) *pp = w->next;
  w->next = r->closed_watches;
  r->closed_watches = w;
}

void reactor__free_closed_listeners(reactor_t *r) {
  while (r->closed_watches) {
    reactor_watch_t *w = r->closed_watches;
    r->closed_watches = w->next;
    free(w);
  }
  while (r->closed_listeners) {
    listener_t *l = r->closed_listeners;
    r->closed_listeners = l->next;
    free(l);
  }
}

int reactor_listener_fd(const listener_t *l) { return l->fd; }

static void conn__connect_timeout(mp_timer_t *t) {
  conn_t *c = t->udata;
  if (!(c->flags & (F_CONNECTING | F_HANDSHAKE))) return;
  c->fail_err = -ETIMEDOUT;
  conn__kill(c, CONN_ERROR);
}

void conn__connected(conn_t *c, int err) {
  /* TLS: the connect timeout covers the handshake too */
  if (c->connect_timer && (err || !c->tls))
    timer_stop(&c->r->timers, c->connect_timer);
  if (err) {
    c->fail_err = err;
    conn__kill(c, CONN_ERROR);
    return;
  }
  c->flags &= ~F_CONNECTING;
  c->flags |= F_OPEN | F_READ_PENDING;
  c->last_active = c->r->now;
  if (c->tls) { /* the ClientHello; on_open comes with the server's answer */
    conn__tls_read(c);
    return;
  }
  conn__enqueue(c, P_OPEN);
  conn__flush(c);
}

conn_t *reactor_connect(reactor_t *r, const char *host, int port,
                        const char *path, uint32_t connect_timeout_ms,
                        const proto_t *proto, void *service, conn_opts_t opts,
                        int *err) {
  bool done = false;
  if (r->stopping) {
    *err = -ECANCELED;
    return NULL;
  }
  int fd = path ? sock_connect_unix(path, &done)
                : sock_connect_tcp(host, port, &done);
  if (fd < 0) {
    *err = fd;
    return NULL;
  }
  conn_t *c;
  c = conn__new(r, fd, proto, service, opts, F_CONNECTING);
  if (!c) {
    *err = -errno;
    close(fd);
    return NULL;
  }
  if (done) {
    conn__connected(c, 0);
    return c;
  }
  if (connect_timeout_ms) {
    c->connect_timer = malloc(sizeof(*c->connect_timer));
    if (c->connect_timer) {
      timer_init(c->connect_timer);
      timer_start(&r->timers, c->connect_timer, reactor_clock_ms(),
                  connect_timeout_ms, 0, 1, conn__connect_timeout, NULL, c);
    }
  }
  return c;
}
