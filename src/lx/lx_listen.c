/* SPDX-License-Identifier: MIT */

/* lx_listen: the listening sockets lanes share (one fd per address, or in
 * the root one SO_REUSEPORT socket per worker), what a forked worker keeps
 * of them, and the round robin that hands accepted connections to the
 * lanes. No Lua state is touched here; mp.listen (lx_moonport.c) is the
 * Lua face. See lx_listen.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "lx/lx_service.h"
#include "lx/lx_lane.h"
#include "lx/lx_listen.h"
#include "lx/lx_server.h"
#include "net/sock.h"
#include "net/tls.h"

/* ---- shared listening sockets ---- */

lx_shared_listener_t *lx_shared_acquire(lx_server_t *srv, const char *key,
                                        const char *host, int port,
                                        const char *path, int backlog,
                                        int *err) {
  pthread_mutex_lock(&srv->listen_lock);
  lx_shared_listener_t *sl = srv->listeners;
  while (sl && strcmp(sl->key, key) != 0) sl = sl->next;
  if (sl) {
    sl->refs++;
    pthread_mutex_unlock(&srv->listen_lock);
    return sl;
  }
  /* A root with several workers opens one socket per worker on the same
   * TCP port, so the kernel spreads connections over the workers (one
   * shared socket would let the idlest process take them all). The root
   * keeps them all open: a replaced worker takes over the same socket,
   * and connections waiting in it are not lost. */
  int nw = path || !srv->root ? 0 : srv->nworkers;
  int *wfds = nw ? calloc((size_t)nw, sizeof(int)) : NULL;
  if (nw && !wfds) {
    pthread_mutex_unlock(&srv->listen_lock);
    *err = -ENOMEM;
    return NULL;
  }
  /* --check: a socket that is never bound (the real server may hold the
   * port), and no file made for a Unix path */
  int fd = srv->check ? sock_unbound(path != NULL)
           : path     ? sock_listen_unix(path, backlog)
           : nw       ? sock_listen_tcp_group(host, port, backlog)
                      : sock_listen_tcp(host, port, backlog);
  if (srv->check) path = NULL;
  for (int i = 0; i < nw && fd >= 0; i++) {
    int p = sock_local_port(fd);
    wfds[i] = i == 0 ? fd : sock_listen_tcp_shared(host, p, backlog);
    if (wfds[i] < 0) {
      int e = wfds[i];
      for (int j = 0; j < i; j++) close(wfds[j]);
      fd = e;
    }
  }
  if (fd < 0) {
    free(wfds);
    pthread_mutex_unlock(&srv->listen_lock);
    *err = fd;
    return NULL;
  }
  sl = calloc(1, sizeof(*sl));
  if (sl) {
    sl->key = strdup(key);
    sl->svc = calloc(srv->nlanes, sizeof(*sl->svc));
  }
  if (sl && path) sl->path = strdup(path);
  if (!sl || !sl->key || !sl->svc || (path && !sl->path)) {
    if (sl) {
      free(sl->key);
      free(sl->svc);
      free(sl->path);
    }
    free(sl);
    close(fd);
    if (path) unlink(path);
    pthread_mutex_unlock(&srv->listen_lock);
    *err = -ENOMEM;
    return NULL;
  }
  sl->fd = fd;
  sl->worker_fds = wfds;
  sl->nworker_fds = nw;
  sl->refs = 1;
  sl->next = srv->listeners;
  srv->listeners = sl;
  pthread_mutex_unlock(&srv->listen_lock);
  return sl;
}

/* Set once before lanes run; read at exit. */
static bool lx_unlink_paths = true;

static void lx__shared_close(lx_shared_listener_t *sl) {
  if (sl->nworker_fds) {
    for (int i = 0; i < sl->nworker_fds; i++)
      if (sl->worker_fds[i] >= 0) close(sl->worker_fds[i]);
  } else {
    close(sl->fd);
  }
  free(sl->worker_fds);
  net_tls_ctx_unref(sl->tls);
  net_tls_ctx_unref(sl->tls_next);
  if (sl->path && lx_unlink_paths) unlink(sl->path);
  free(sl->path);
  free(sl->key);
  free(sl->svc);
  free(sl);
}

void lx_shared_reload_end(lx_server_t *srv, bool ok) {
  pthread_mutex_lock(&srv->listen_lock);
  for (lx_shared_listener_t *sl = srv->listeners; sl; sl = sl->next) {
    net_tls_ctx_t *next = sl->tls_next;
    sl->tls_next = NULL;
    if (!next) continue;
    if (ok) {
      net_tls_ctx_t *old = sl->tls;
      sl->tls = next;
      next = old;
    }
    net_tls_ctx_unref(next); /* OpenSSL's free takes no lock of ours */
  }
  pthread_mutex_unlock(&srv->listen_lock);
}

void lx_shared_release(lx_server_t *srv, lx_shared_listener_t *sl) {
  pthread_mutex_lock(&srv->listen_lock);
  if (--sl->refs > 0) {
    pthread_mutex_unlock(&srv->listen_lock);
    return;
  }
  lx_shared_listener_t **pp = &srv->listeners;
  while (*pp && *pp != sl) pp = &(*pp)->next;
  if (*pp) *pp = sl->next;
  pthread_mutex_unlock(&srv->listen_lock);
  lx__shared_close(sl);
}

void lx_server_after_fork(lx_server_t *srv) {
  pthread_mutex_init(&srv->listen_lock, NULL);
  lx_unlink_paths = false; /* the socket files are the root's */
  for (lx_shared_listener_t *sl = srv->listeners; sl; sl = sl->next) {
    memset(sl->svc, 0, srv->nlanes * sizeof(*sl->svc));
    sl->refs = 0;
    if (!sl->nworker_fds) continue;
    /* This worker's socket; the others are its siblings'. */
    for (int i = 0; i < sl->nworker_fds; i++)
      if (i != srv->worker_index - 1) close(sl->worker_fds[i]);
    sl->fd = sl->worker_fds[srv->worker_index - 1];
    free(sl->worker_fds);
    sl->worker_fds = NULL;
    sl->nworker_fds = 0;
  }
}

void lx_server_stop_listening(lx_server_t *srv) {
  pthread_mutex_lock(&srv->listen_lock);
  for (lx_shared_listener_t *sl = srv->listeners; sl; sl = sl->next) {
    /* shutdown(2) on a listening socket ends the listen (Linux): a SYN now
     * gets a refusal, and the fd stays valid for whoever polls it */
    if (sl->nworker_fds) {
      for (int i = 0; i < sl->nworker_fds; i++)
        if (sl->worker_fds[i] >= 0) shutdown(sl->worker_fds[i], SHUT_RD);
    } else {
      shutdown(sl->fd, SHUT_RD);
    }
  }
  pthread_mutex_unlock(&srv->listen_lock);
}

void lx_server_close_listeners(lx_server_t *srv) {
  pthread_mutex_lock(&srv->listen_lock);
  lx_shared_listener_t *sl = srv->listeners;
  srv->listeners = NULL;
  pthread_mutex_unlock(&srv->listen_lock);
  while (sl) {
    lx_shared_listener_t *next = sl->next;
    lx__shared_close(sl);
    sl = next;
  }
}

void lx_shared_detach(lx_server_t *srv, lx_shared_listener_t *sl, int index,
                      struct lx_service *svc) {
  pthread_mutex_lock(&srv->listen_lock);
  if (sl->svc[index] == svc) sl->svc[index] = NULL;
  pthread_mutex_unlock(&srv->listen_lock);
}

/* ---- spreading connections over lanes ---- */

/* EPOLLEXCLUSIVE wakes one lane per connection, and on an idle server
 * mostly the same one; so the lane that accepts hands connections round
 * robin to the lanes listening on the same socket. */
typedef struct {
  lx_shared_listener_t *sl;
  int fd, lane;
} lx_handoff_t;

static void lx__adopt(void *a, void *b) {
  lx_handoff_t *h = a;
  lx_server_t *srv = b;
  pthread_mutex_lock(&srv->listen_lock);
  lx_service_t *s = h->sl->svc[h->lane];
  pthread_mutex_unlock(&srv->listen_lock);
  /* Only this lane frees its service, so s stays valid from here on. */
  if (s)
    reactor_adopt(srv->lanes[h->lane]->r, h->fd, &s->proto, s, s->opts);
  else
    close(h->fd);
  lx_shared_release(srv, h->sl);
  free(h);
}

void lx_listen_dispatch(listener_t *l, int fd, void *arg) {
  lx_service_t *svc = arg;
  lx_lane_t *ln = svc->ln;
  lx_server_t *srv = ln->srv;
  lx_shared_listener_t *sl = svc->shared;
  int target = ln->index;
  pthread_mutex_lock(&srv->listen_lock);
  for (size_t k = 0; k < srv->nlanes; k++) {
    unsigned i = sl->next_lane++ % (unsigned)srv->nlanes;
    if (sl->svc[i]) {
      target = (int)i;
      break;
    }
  }
  lx_handoff_t *h = target != ln->index ? malloc(sizeof(*h)) : NULL;
  if (h) sl->refs++;
  pthread_mutex_unlock(&srv->listen_lock);
  if (h) {
    *h = (lx_handoff_t){sl, fd, target};
    if (reactor_post(srv->lanes[target]->r, lx__adopt, h, srv) == 0) return;
    lx_shared_release(srv, sl);
    free(h);
  }
  reactor_adopt(ln->r, fd, &svc->proto, svc, svc->opts);
}

/* ---- the start line ---- */

/* Appends the URL of the listening socket of service `s` to out. */
static size_t lx__listener_url(const lx_service_t *s, char *out, size_t len) {
  const lx_shared_listener_t *sl = s->shared;
  bool http = s->ext != NULL; /* only mp.http services have settings */
  bool tls = s->opts.tls != NULL;
  const char *scheme = http ? (tls ? "https" : "http") : (tls ? "tls" : "tcp");
  if (sl->path)
    return (size_t)snprintf(out, len, "%s:%s",
                            http ? (tls ? "https+unix" : "http+unix")
                                 : (tls ? "tls+unix" : "unix"),
                            sl->path);
  struct sockaddr_storage ss;
  socklen_t sl_len = sizeof(ss);
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (getsockname(sl->fd, (struct sockaddr *)&ss, &sl_len) == 0) {
    if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
      port = ntohs(a->sin6_port);
      return (size_t)snprintf(out, len, "%s://[%s]:%d", scheme, host, port);
    }
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  }
  return (size_t)snprintf(out, len, "%s://%s:%d", scheme, host, port);
}

size_t lx_server_listen_urls(lx_server_t *srv, char *urls, size_t size) {
  size_t at = 0;
  const lx_shared_listener_t *seen[64];
  int nseen = 0;
  urls[0] = 0;
  size_t nlanes = srv->root ? 1 : srv->nlanes; /* the root has its lane */
  for (size_t i = 0; i < nlanes; i++) {
    /* Services are listed newest first: collect, then print in order. */
    const lx_service_t *list[64];
    int n = 0;
    for (const lx_service_t *s = srv->lanes[i]->services; s && n < 64;
         s = s->next) {
      if (!s->shared || s->client || (s->closed && !srv->lanes[i]->is_root))
        continue;
      bool dup = false;
      for (int k = 0; k < nseen && !dup; k++) dup = seen[k] == s->shared;
      for (int k = 0; k < n && !dup; k++) dup = list[k]->shared == s->shared;
      if (!dup) list[n++] = s;
    }
    for (int k = n - 1; k >= 0 && at < size - 1; k--) {
      if (nseen < 64) seen[nseen++] = list[k]->shared;
      if (at) at += (size_t)snprintf(urls + at, size - at, ", ");
      if (at < size - 1) at += lx__listener_url(list[k], urls + at, size - at);
    }
  }
  return at < size ? at : size - 1;
}
