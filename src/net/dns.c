/* SPDX-License-Identifier: MIT */

/* dns: the lane's resolver (see dns.h). c-ares does the protocol; this
 * file owns the glue to the reactor (a watch per c-ares socket, one timer
 * for c-ares's timeouts), the requests (each with a timer that is both its
 * timeout and its delivery, so no callback runs inside c-ares or inside
 * dns_resolve), the sharing of in-flight queries and the TTL cache. */
#include "net/dns.h"

#include <ares.h>
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "net/poll.h"

typedef struct dns_query dns_query_t;

enum { REQ_WAITING, REQ_READY, REQ_DELIVERING };

struct dns_req {
  dns_resolver_t *d;
  dns_query_t *q;            /* the query it waits for, or NULL */
  dns_req_t *qprev, *qnext;  /* on q->reqs */
  dns_req_t *prev, *next;    /* on d->reqs: every request not yet delivered */
  mp_timer_t timer;          /* the timeout, then the delivery */
  bool free_on_finish;       /* the timer's on_finish frees the request */
  int state;
  dns_cb cb;
  void *arg;
  int err;
  uint32_t ttl;
  size_t n;
  dns_addr_t addrs[DNS_MAX_ADDRS];
};

struct dns_query {
  dns_resolver_t *d;
  dns_query_t *prev, *next;  /* on d->queries */
  dns_req_t *reqs;
  int family;
  char host[]; /* lower case */
};

typedef struct dns_cache {
  struct dns_cache *prev, *next; /* most recently used first */
  uint64_t expires;              /* reactor ms */
  int family;
  size_t n;
  dns_addr_t addrs[DNS_MAX_ADDRS];
  char host[];
} dns_cache_t;

typedef struct dns_sock {
  struct dns_sock *next;
  int fd;
  reactor_watch_t *w;
  dns_resolver_t *d;
} dns_sock_t;

struct dns_resolver {
  reactor_t *r;
  ares_channel ch;
  bool closing;
  mp_timer_t *ares_timer; /* its own allocation: freed by its on_finish,
                             which may run after the resolver is gone */
  dns_req_t *reqs;
  dns_query_t *queries;
  dns_sock_t *socks;
  dns_cache_t *cache_head, *cache_tail;
  size_t cached, cache_max;
  uint64_t nqueries, hits;
};

/* ---- errors ---- */

static int dns__errno(int status) {
  switch (status) {
  case ARES_SUCCESS: return 0;
  case ARES_ENODATA:
  case ARES_ENOTFOUND:
  case ARES_ENONAME: return -ENOENT;
  case ARES_ETIMEOUT: return -ETIMEDOUT;
  case ARES_ESERVFAIL:
  case ARES_EREFUSED:
  case ARES_ECONNREFUSED:
  case ARES_EFORMERR:
  case ARES_EBADRESP: return -EAGAIN;
  case ARES_EBADNAME: return -EINVAL;
  case ARES_EBADFAMILY: return -EAFNOSUPPORT;
  case ARES_ENOMEM: return -ENOMEM;
  case ARES_ECANCELLED:
  case ARES_EDESTRUCTION: return -ECANCELED;
  default: return -EIO;
  }
}

const char *dns_strerror(int err) {
  switch (err) {
  case 0: return "ok";
  case -ENOENT: return "no such host";
  case -ETIMEDOUT: return "timeout";
  case -EAGAIN: return "dns server failure";
  case -EINVAL: return "bad host name";
  case -EAFNOSUPPORT: return "address family not supported";
  case -ECANCELED: return "canceled";
  case -ENOMEM: return "out of memory";
  case -ESHUTDOWN: return "resolver closing";
  default: return "dns error";
  }
}

/* ---- the cache ---- */

static void cache__unlink(dns_resolver_t *d, dns_cache_t *e) {
  if (e->prev) e->prev->next = e->next;
  else d->cache_head = e->next;
  if (e->next) e->next->prev = e->prev;
  else d->cache_tail = e->prev;
  e->prev = e->next = NULL;
}

static void cache__push_front(dns_resolver_t *d, dns_cache_t *e) {
  e->prev = NULL;
  e->next = d->cache_head;
  if (d->cache_head) d->cache_head->prev = e;
  d->cache_head = e;
  if (!d->cache_tail) d->cache_tail = e;
}

static void cache__drop(dns_resolver_t *d, dns_cache_t *e) {
  cache__unlink(d, e);
  d->cached--;
  free(e);
}

/* The live entry for host/family, moved to the front; expired ones met on
 * the way are dropped. A linear walk: the cache is small (hundreds of
 * names) and a hit saves a network round trip. */
static dns_cache_t *cache__find(dns_resolver_t *d, const char *host,
                                int family, uint64_t now) {
  dns_cache_t *e = d->cache_head;
  while (e) {
    dns_cache_t *next = e->next;
    if (e->expires <= now) {
      cache__drop(d, e);
    } else if (e->family == family && strcmp(e->host, host) == 0) {
      cache__unlink(d, e);
      cache__push_front(d, e);
      return e;
    }
    e = next;
  }
  return NULL;
}

static void cache__put(dns_resolver_t *d, const char *host, int family,
                       const dns_addr_t *addrs, size_t n, uint32_t ttl,
                       uint64_t now) {
  if (ttl == 0 || n == 0 || d->cache_max == 0) return;
  for (dns_cache_t *e = d->cache_head; e; e = e->next)
    if (e->family == family && strcmp(e->host, host) == 0) {
      cache__drop(d, e);
      break;
    }
  size_t hl = strlen(host);
  dns_cache_t *e = malloc(sizeof(*e) + hl + 1);
  if (!e) return; /* not cached: the next request asks again */
  e->expires = now + (uint64_t)ttl * 1000u;
  e->family = family;
  e->n = n;
  memcpy(e->addrs, addrs, n * sizeof(*addrs));
  memcpy(e->host, host, hl + 1);
  cache__push_front(d, e);
  if (++d->cached > d->cache_max) cache__drop(d, d->cache_tail);
}

/* ---- c-ares on the reactor ---- */

static void dns__arm(dns_resolver_t *d);

static void dns__io(void *arg, unsigned events) {
  dns_sock_t *s = arg;
  dns_resolver_t *d = s->d;
  int fd = s->fd; /* s may be freed inside ares_process_fd */
  ares_socket_t rfd = events & (POLL_READ | POLL_HUP) ? fd : ARES_SOCKET_BAD;
  ares_socket_t wfd = events & POLL_WRITE ? fd : ARES_SOCKET_BAD;
  ares_process_fd(d->ch, rfd, wfd);
  dns__arm(d);
}

/* c-ares opens, changes or (readable == writable == 0) closes a socket. */
static void dns__sock_state(void *data, ares_socket_t fd, int readable,
                            int writable) {
  dns_resolver_t *d = data;
  dns_sock_t **pp = &d->socks;
  while (*pp && (*pp)->fd != fd) pp = &(*pp)->next;
  dns_sock_t *s = *pp;
  unsigned flags = (readable ? POLL_READ : 0) | (writable ? POLL_WRITE : 0);
  if (!flags) {
    if (s) {
      *pp = s->next;
      reactor_unwatch(s->w);
      free(s);
    }
    return;
  }
  if (s) {
    reactor_watch_set(s->w, flags);
    return;
  }
  s = calloc(1, sizeof(*s));
  if (!s) return; /* the query then times out in c-ares */
  s->fd = fd;
  s->d = d;
  s->w = reactor_watch_io(d->r, fd, flags, dns__io, s);
  if (!s->w) {
    free(s);
    return;
  }
  s->next = d->socks;
  d->socks = s;
}

static void dns__ares_tick(mp_timer_t *t) {
  dns_resolver_t *d = t->udata;
  ares_process_fd(d->ch, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
  dns__arm(d);
}

static void dns__ares_timer_free(mp_timer_t *t) { free(t); }

/* (Re)starts the timer for c-ares's next timeout, or stops it when no
 * query is pending. */
static void dns__arm(dns_resolver_t *d) {
  if (d->closing) return;
  timer_heap_t *h = reactor_timers(d->r);
  struct timeval tv, *tvp = ares_timeout(d->ch, NULL, &tv);
  timer_stop(h, d->ares_timer);
  if (!tvp) return;
  uint64_t ms = (uint64_t)tvp->tv_sec * 1000u + ((uint64_t)tvp->tv_usec + 999u) / 1000u;
  /* The on_finish (free) is only set at dns_free's final stop, below. */
  timer_start(h, d->ares_timer, reactor_now(d->r), ms, 0, 1, dns__ares_tick,
              NULL, d);
}

/* ---- requests ---- */

static void req__unlink(dns_req_t *q) {
  dns_resolver_t *d = q->d;
  if (q->q) {
    if (q->qprev) q->qprev->qnext = q->qnext;
    else q->q->reqs = q->qnext;
    if (q->qnext) q->qnext->qprev = q->qprev;
    q->q = NULL;
  }
  if (d) {
    if (q->prev) q->prev->next = q->next;
    else d->reqs = q->next;
    if (q->next) q->next->prev = q->prev;
    q->d = NULL;
  }
  q->prev = q->next = q->qprev = q->qnext = NULL;
}

static void req__finished(mp_timer_t *t) {
  dns_req_t *q = t->udata;
  if (q->free_on_finish) free(q);
}

static void req__fire(mp_timer_t *t) {
  dns_req_t *q = t->udata;
  if (q->state == REQ_WAITING) {
    q->err = -ETIMEDOUT;
    q->n = 0;
    q->ttl = 0;
  }
  req__unlink(q);
  q->state = REQ_DELIVERING;
  q->cb(q->arg, q->err, q->addrs, q->n, q->ttl);
  q->free_on_finish = true; /* req__finished, when this returns */
}

/* Stores the answer and has the request's timer deliver it next turn. */
static void req__ready(dns_req_t *q, timer_heap_t *h, uint64_t now, int err,
                       const dns_addr_t *addrs, size_t n, uint32_t ttl) {
  q->err = err;
  q->n = n;
  q->ttl = ttl;
  if (n) memcpy(q->addrs, addrs, n * sizeof(*addrs));
  q->state = REQ_READY;
  /* Stop then start reuses the heap slot the timeout held: it can't fail. */
  timer_stop(h, &q->timer);
  timer_start(h, &q->timer, now, 0, 0, 1, req__fire, req__finished, q);
}

/* ---- queries ---- */

static void query__done(void *arg, int status, int timeouts,
                        struct ares_addrinfo *res) {
  dns_query_t *qu = arg;
  dns_resolver_t *d = qu->d;
  dns_addr_t addrs[DNS_MAX_ADDRS];
  size_t n = 0;
  uint32_t ttl = DNS_MAX_TTL;
  int err = dns__errno(status);
  if (status == ARES_SUCCESS && res) {
    for (struct ares_addrinfo_node *a = res->nodes; a && n < DNS_MAX_ADDRS;
         a = a->ai_next) {
      dns_addr_t x;
      memset(&x, 0, sizeof(x));
      if (a->ai_family == AF_INET && a->ai_addr) {
        x.family = AF_INET;
        x.a.v4 = ((struct sockaddr_in *)(void *)a->ai_addr)->sin_addr;
      } else if (a->ai_family == AF_INET6 && a->ai_addr) {
        x.family = AF_INET6;
        x.a.v6 = ((struct sockaddr_in6 *)(void *)a->ai_addr)->sin6_addr;
      } else {
        continue;
      }
      bool dup = false;
      for (size_t i = 0; i < n && !dup; i++)
        dup = memcmp(&addrs[i], &x, sizeof(x)) == 0;
      if (dup) continue;
      addrs[n++] = x;
      uint32_t t = a->ai_ttl > 0 ? (uint32_t)a->ai_ttl : 0;
      if (t < ttl) ttl = t;
    }
    for (struct ares_addrinfo_cname *c = res->cnames; c; c = c->next)
      if (c->ttl >= 0 && (uint32_t)c->ttl < ttl) ttl = (uint32_t)c->ttl;
    if (n == 0) err = -ENOENT;
  }
  if (res) ares_freeaddrinfo(res);
  if (n == 0) ttl = 0;
  if (d && !d->closing) {
    uint64_t now = reactor_now(d->r);
    if (err == 0) cache__put(d, qu->host, qu->family, addrs, n, ttl, now);
    timer_heap_t *h = reactor_timers(d->r);
    while (qu->reqs) {
      dns_req_t *q = qu->reqs;
      /* off the query; stays on d->reqs until delivered */
      qu->reqs = q->qnext;
      if (qu->reqs) qu->reqs->qprev = NULL;
      q->q = NULL;
      q->qnext = q->qprev = NULL;
      req__ready(q, h, now, err, addrs, n, ttl);
    }
  }
  if (d) {
    if (qu->prev) qu->prev->next = qu->next;
    else if (d->queries == qu) d->queries = qu->next;
    if (qu->next) qu->next->prev = qu->prev;
  }
  free(qu);
}

/* ---- the API ---- */

static pthread_once_t dns_once = PTHREAD_ONCE_INIT;
static int dns_lib_status;
static void dns__lib_init(void) { dns_lib_status = ares_library_init(ARES_LIB_INIT_ALL); }

dns_resolver_t *dns_new(reactor_t *r, const dns_opts_t *opts, int *err) {
  pthread_once(&dns_once, dns__lib_init);
  if (dns_lib_status != ARES_SUCCESS) {
    *err = -ENOMEM;
    return NULL;
  }
  dns_opts_t none = {0};
  if (!opts) opts = &none;
  dns_resolver_t *d = calloc(1, sizeof(*d));
  mp_timer_t *t = calloc(1, sizeof(*t));
  if (!d || !t) {
    free(d);
    free(t);
    *err = -ENOMEM;
    return NULL;
  }
  timer_init(t);
  d->r = r;
  d->ares_timer = t;
  d->cache_max = opts->cache_max ? opts->cache_max : DNS_DEFAULT_CACHE;
  struct ares_options ao;
  memset(&ao, 0, sizeof(ao));
  int mask = ARES_OPT_SOCK_STATE_CB | ARES_OPT_LOOKUPS;
  ao.sock_state_cb = dns__sock_state;
  ao.sock_state_cb_data = d;
  ao.lookups = (char *)"fb"; /* /etc/hosts, then DNS */
  if (opts->try_timeout_ms) {
    mask |= ARES_OPT_TIMEOUTMS;
    ao.timeout = (int)opts->try_timeout_ms;
  }
  if (opts->tries > 0) {
    mask |= ARES_OPT_TRIES;
    ao.tries = opts->tries;
  }
  int st = ares_init_options(&d->ch, &ao, mask);
  if (st == ARES_SUCCESS && opts->servers)
    st = ares_set_servers_ports_csv(d->ch, opts->servers);
  if (st != ARES_SUCCESS) {
    if (d->ch) ares_destroy(d->ch);
    free(t);
    free(d);
    *err = st == ARES_ENOMEM ? -ENOMEM : -EINVAL;
    return NULL;
  }
  return d;
}

void dns_free(dns_resolver_t *d) {
  if (!d || d->closing) return;
  d->closing = true;
  timer_heap_t *h = reactor_timers(d->r);
  /* Every pending request hears now, in order; a callback may cancel
   * others (they leave the list) or free its own things. */
  while (d->reqs) {
    dns_req_t *q = d->reqs;
    int err = q->state == REQ_READY ? q->err : -ECANCELED;
    size_t n = q->state == REQ_READY ? q->n : 0;
    req__unlink(q);
    q->state = REQ_DELIVERING;
    q->cb(q->arg, err, q->addrs, n, n ? q->ttl : 0);
    q->free_on_finish = true;
    if (q->timer.armed) timer_stop(h, &q->timer);
    else if (!q->timer.firing) free(q);
  }
  /* The timer storage outlives us if it is in the running batch. */
  d->ares_timer->on_finish = dns__ares_timer_free;
  if (d->ares_timer->armed) timer_stop(h, d->ares_timer);
  else if (!d->ares_timer->firing) free(d->ares_timer);
  /* Pending queries end with ARES_EDESTRUCTION (query__done frees them);
   * the sockets close through dns__sock_state. */
  for (dns_query_t *qu = d->queries; qu; qu = qu->next) qu->d = NULL;
  d->queries = NULL;
  ares_destroy(d->ch);
  while (d->socks) {
    dns_sock_t *s = d->socks;
    d->socks = s->next;
    reactor_unwatch(s->w);
    free(s);
  }
  while (d->cache_head) cache__drop(d, d->cache_head);
  free(d);
}

static bool dns__numeric(const char *host, int family, dns_addr_t *out,
                         int *err) {
  memset(out, 0, sizeof(*out));
  if (inet_pton(AF_INET, host, &out->a.v4) == 1) {
    out->family = AF_INET;
  } else if (inet_pton(AF_INET6, host, &out->a.v6) == 1) {
    out->family = AF_INET6;
  } else {
    return false;
  }
  *err = family != AF_UNSPEC && family != out->family ? -EINVAL : 0;
  return true;
}

dns_req_t *dns_resolve(dns_resolver_t *d, const char *host, int family,
                       uint32_t timeout_ms, dns_cb cb, void *arg) {
  if (d->closing) {
    errno = ESHUTDOWN;
    return NULL;
  }
  size_t hl = strlen(host);
  if (hl == 0 || hl > DNS_MAX_NAME) {
    errno = EINVAL;
    return NULL;
  }
  dns_req_t *q = calloc(1, sizeof(*q));
  if (!q) {
    errno = ENOMEM;
    return NULL;
  }
  timer_init(&q->timer);
  q->cb = cb;
  q->arg = arg;
  q->state = REQ_WAITING;
  timer_heap_t *h = reactor_timers(d->r);
  uint64_t now = reactor_now(d->r);
  /* Always armed (a day stands for "no timeout of its own"): the slot it
   * holds in the heap is what the delivery reuses. */
  uint64_t delay = timeout_ms ? timeout_ms : (uint64_t)DNS_MAX_TTL * 1000u;
  if (timer_start(h, &q->timer, now, delay, 0, 1, req__fire, req__finished,
                  q)) {
    free(q);
    errno = ENOMEM;
    return NULL;
  }
  q->d = d;
  q->next = d->reqs;
  if (d->reqs) d->reqs->prev = q;
  d->reqs = q;

  int err;
  dns_addr_t num;
  if (family != AF_UNSPEC && family != AF_INET && family != AF_INET6) {
    req__ready(q, h, now, -EAFNOSUPPORT, NULL, 0, 0);
    return q;
  }
  if (dns__numeric(host, family, &num, &err)) {
    req__ready(q, h, now, err, &num, err ? 0 : 1, 0);
    return q;
  }
  char lower[DNS_MAX_NAME + 1];
  for (size_t i = 0; i <= hl; i++)
    lower[i] = host[i] >= 'A' && host[i] <= 'Z' ? host[i] + 32 : host[i];
  if (hl > 1 && lower[hl - 1] == '.') lower[--hl] = 0; /* "a.b." is "a.b" */
  dns_cache_t *e = cache__find(d, lower, family, now);
  if (e) {
    d->hits++;
    uint32_t left = (uint32_t)((e->expires - now + 999u) / 1000u);
    req__ready(q, h, now, 0, e->addrs, e->n, left);
    return q;
  }
  /* a query for the same name and family in flight: wait for it too */
  dns_query_t *qu = d->queries;
  while (qu && !(qu->family == family && strcmp(qu->host, lower) == 0))
    qu = qu->next;
  bool fresh = !qu;
  if (fresh) {
    qu = calloc(1, sizeof(*qu) + hl + 1);
    if (!qu) {
      req__ready(q, h, now, -ENOMEM, NULL, 0, 0);
      return q;
    }
    qu->d = d;
    qu->family = family;
    memcpy(qu->host, lower, hl + 1);
    qu->next = d->queries;
    if (d->queries) d->queries->prev = qu;
    d->queries = qu;
  }
  q->q = qu;
  q->qnext = qu->reqs;
  if (qu->reqs) qu->reqs->qprev = q;
  qu->reqs = q;
  if (fresh) {
    /* the query's first request: start it (an /etc/hosts answer may call
     * query__done before ares_getaddrinfo returns; it only queues) */
    struct ares_addrinfo_hints hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = family;
    hints.ai_flags = ARES_AI_NOSORT;
    d->nqueries++;
    ares_getaddrinfo(d->ch, qu->host, NULL, &hints, query__done, qu);
    dns__arm(d);
  }
  return q;
}

void dns_cancel(dns_req_t *q) {
  if (!q || q->state == REQ_DELIVERING) return;
  dns_resolver_t *d = q->d;
  req__unlink(q);
  q->state = REQ_DELIVERING; /* never delivered now */
  q->free_on_finish = true;
  if (q->timer.armed && d) timer_stop(reactor_timers(d->r), &q->timer);
  else if (!q->timer.firing) free(q);
}

void dns_stats(const dns_resolver_t *d, dns_stats_t *out) {
  out->queries = d->nqueries;
  out->cache_hits = d->hits;
  out->cached = d->cached;
}
