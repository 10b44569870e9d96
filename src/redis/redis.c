/* SPDX-License-Identifier: MIT */

/* redis: hiredis connections on a moonport reactor, and the pub/sub
 * engine. */
#include "redis/redis.h"
#include "net/sock.h"

#include <errno.h>
#include <hiredis/sds.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "net/poll.h"
#include "redis/redis_pipe.h"

/* ---- URLs ---- */

static int redis__hex(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Copies s[0..n) to out with %XX decoded. */
static bool redis__unescape(const char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    int c = (unsigned char)s[i];
    if (c == '%') {
      if (i + 2 >= n) return false;
      int h = redis__hex(s[i + 1]), l = redis__hex(s[i + 2]);
      if (h < 0 || l < 0) return false;
      c = h * 16 + l;
      i += 2;
    }
    if (o + 1 >= cap) return false;
    out[o++] = (char)c;
  }
  out[o] = 0;
  return true;
}

/* Query parameters: keepalive=SECS; rediss:// also verify=0|1 (also
 * false/true, no/yes), ca=, cert=, key=, sni= (%-decoded). */
static int redis__query(const char *q, redis_url_t *u, char *err,
                        size_t errlen) {
  while (*q) {
    size_t n = strcspn(q, "&");
    const char *eq = memchr(q, '=', n);
    if (!eq) {
      snprintf(err, errlen, "bad query parameter in the Redis URL: %.*s",
               (int)n, q);
      return -1;
    }
    size_t klen = (size_t)(eq - q);
    const char *v = eq + 1;
    size_t vlen = n - klen - 1;
    char *dst = NULL;
    size_t cap = 0;
    char vb[16];
    if (klen == 2 && !memcmp(q, "ca", 2)) {
      dst = u->ca, cap = sizeof(u->ca);
    } else if (klen == 4 && !memcmp(q, "cert", 4)) {
      dst = u->cert, cap = sizeof(u->cert);
    } else if (klen == 3 && !memcmp(q, "key", 3)) {
      dst = u->key, cap = sizeof(u->key);
    } else if (klen == 3 && !memcmp(q, "sni", 3)) {
      dst = u->sni, cap = sizeof(u->sni);
    } else if (klen == 6 && !memcmp(q, "verify", 6)) {
      dst = vb, cap = sizeof(vb);
    } else if (klen == 9 && !memcmp(q, "keepalive", 9)) {
      dst = vb, cap = sizeof(vb);
    } else {
      snprintf(err, errlen, "unknown query parameter in the Redis URL: %.*s",
               (int)klen, q);
      return -1;
    }
    if (!redis__unescape(v, vlen, dst, cap)) {
      snprintf(err, errlen, "bad or too long value of %.*s in the Redis URL",
               (int)klen, q);
      return -1;
    }
    if (dst == vb && klen == 9) {
      char *e;
      long secs = strtol(vb, &e, 10);
      if (!vb[0] || *e || secs < 0 || secs > 86400) {
        snprintf(err, errlen,
                 "keepalive= takes 0 to 86400 seconds in the Redis URL");
        return -1;
      }
      u->keepalive = (int)secs;
    } else if (dst == vb) {
      if (!strcmp(vb, "0") || !strcmp(vb, "false") || !strcmp(vb, "no"))
        u->verify = false;
      else if (!strcmp(vb, "1") || !strcmp(vb, "true") || !strcmp(vb, "yes"))
        u->verify = true;
      else {
        snprintf(err, errlen, "verify= takes 0 or 1 in the Redis URL");
        return -1;
      }
    }
    q += n;
    if (*q == '&') q++;
  }
  if (!u->cert[0] != !u->key[0]) {
    snprintf(err, errlen, "cert= and key= go together in the Redis URL");
    return -1;
  }
  return 0;
}

/* unix://[[user:]password@]/path[?db=N]: p is past "unix://". */
static int redis__unix_url(const char *s, const char *p, redis_url_t *u,
                           char *err, size_t errlen) {
  const char *slash = strchr(p, '/');
  if (!slash) {
    snprintf(err, errlen,
             "a unix:// Redis URL needs an absolute path "
             "(unix:///run/redis/redis.sock), not '%s'",
             s);
    return -1;
  }
  if (slash > p) { /* a password before the path */
    if (slash[-1] != '@') {
      snprintf(err, errlen,
               "a unix:// Redis URL takes no host, only "
               "[password@]/path: '%s'",
               s);
      return -1;
    }
    const char *colon = memchr(p, ':', (size_t)(slash - 1 - p));
    const char *pw = colon ? colon + 1 : p;
    if (!redis__unescape(pw, (size_t)(slash - 1 - pw), u->password,
                         sizeof(u->password))) {
      snprintf(err, errlen, "bad password in the Redis URL");
      return -1;
    }
  }
  size_t plen = strcspn(slash, "?");
  if (plen >= sizeof(u->path)) {
    snprintf(err, errlen,
             "Unix socket path too long in the Redis URL "
             "(at most %zu bytes)",
             sizeof(u->path) - 1);
    return -1;
  }
  memcpy(u->path, slash, plen);
  snprintf(u->host, sizeof(u->host), "%s", u->path);
  u->port = 0;
  const char *q = slash + plen;
  if (*q == '?') {
    char *e;
    if (strncmp(q + 1, "db=", 3) != 0 || !q[4]) goto bad_query;
    long db = strtol(q + 4, &e, 10);
    if (*e || db < 0 || db > 1 << 20) goto bad_query;
    u->db = (int)db;
  }
  return 0;
bad_query:
  snprintf(err, errlen, "a unix:// Redis URL takes only ?db=N: '%s'", s);
  return -1;
}

const char *redis_url_where(const redis_url_t *u, char *buf, size_t len) {
  if (u->path[0])
    snprintf(buf, len, "unix:%s", u->path);
  else
    snprintf(buf, len, "%s:%d", u->host, u->port);
  return buf;
}

int redis_url_parse(const char *s, redis_url_t *u, char *err, size_t errlen) {
  memset(u, 0, sizeof(*u));
  u->port = 6379;
  u->verify = true;
  u->keepalive = REDIS_KEEPALIVE;
  const char *p = s;
  if (strncmp(p, "rediss://", 9) == 0) {
    u->tls = true;
    p += 9;
  } else if (strncmp(p, "redis://", 8) == 0) {
    p += 8;
  } else if (strncmp(p, "unix://", 7) == 0) {
    return redis__unix_url(s, p + 7, u, err, errlen);
  } else {
    snprintf(err, errlen, "'%s' is not a redis://, rediss:// or unix:// URL",
             s);
    return -1;
  }
  /* rediss: the query is TLS's, and may hold an '@' (in a file name); a
   * password with '?' is written %3F there. */
  const char *query = u->tls ? strchr(p, '?') : NULL;
  const char *at = query ? memrchr(p, '@', (size_t)(query - p)) : strrchr(p, '@');
  /* redis://: a query after the password (which may hold a '?') */
  if (!u->tls) query = strchr(at ? at : p, '?');
  if (at) {
    const char *colon = memchr(p, ':', (size_t)(at - p));
    const char *pw = colon ? colon + 1 : p; /* user:password, or password */
    if (!redis__unescape(pw, (size_t)(at - pw), u->password,
                         sizeof(u->password))) {
      snprintf(err, errlen, "bad password in the Redis URL");
      return -1;
    }
    p = at + 1;
  }
  const char *end = p + strcspn(p, "/?");
  const char *hend = end;
  if (*p == '[') { /* [IPv6]:port */
    const char *rb = memchr(p, ']', (size_t)(end - p));
    if (!rb) {
      snprintf(err, errlen, "bad host in the Redis URL '%s'", s);
      return -1;
    }
    if ((size_t)(rb - p - 1) >= sizeof(u->host)) goto bad_host;
    memcpy(u->host, p + 1, (size_t)(rb - p - 1));
    hend = rb + 1;
  } else {
    const char *colon = memchr(p, ':', (size_t)(end - p));
    hend = colon ? colon : end;
    if ((size_t)(hend - p) >= sizeof(u->host)) goto bad_host;
    memcpy(u->host, p, (size_t)(hend - p));
  }
  if (!u->host[0]) strcpy(u->host, "127.0.0.1");
  if (hend < end && *hend == ':') {
    char *e;
    long port = strtol(hend + 1, &e, 10);
    if (e != end || port < 1 || port > 65535) {
      snprintf(err, errlen, "bad port in the Redis URL '%s'", s);
      return -1;
    }
    u->port = (int)port;
  }
  if (*end == '/' && end[1] && end[1] != '?') {
    char *e;
    long db = strtol(end + 1, &e, 10);
    if ((*e && *e != '?') || db < 0 || db > 1 << 20) {
      snprintf(err, errlen, "bad database number in the Redis URL '%s'", s);
      return -1;
    }
    u->db = (int)db;
  }
  if (query && redis__query(query + 1, u, err, errlen)) return -1;
  if (!u->tls && (u->ca[0] || u->cert[0] || u->sni[0] || !u->verify)) {
    snprintf(err, errlen,
             "ca=, cert=, key=, sni= and verify= are for rediss:// URLs");
    return -1;
  }
  return 0;
bad_host:
  snprintf(err, errlen, "host name too long in the Redis URL");
  return -1;
}

net_tls_ctx_t *redis_url_tls(const redis_url_t *u, char *err, size_t errlen) {
  if (u->verify && !u->ca[0] && !u->cert[0]) {
    net_tls_ctx_t *d = net_tls_client_default(err, errlen);
    if (d) net_tls_ctx_ref(d);
    return d;
  }
  net_tls_client_opts_t o = {.verify = u->verify,
                             .ca = u->ca[0] ? u->ca : NULL,
                             .cert = u->cert[0] ? u->cert : NULL,
                             .key = u->key[0] ? u->key : NULL};
  return net_tls_client_ctx(&o, err, errlen);
}

/* ---- links ---- */

#define REDIS_BACKOFF_MIN_MS 100
#define REDIS_BACKOFF_MAX_MS 5000

struct redis_link {
  reactor_t *r;
  redis_url_t u;
  const char *name;
  int connect_ms;
  redis_link_hooks_t hooks;
  void *arg;
  redisAsyncContext *ac; /* connecting or connected, or NULL */
  bool up;
  bool freeing;
  /* The connect timer freed the context now being freed: its pending
   * replies come back NULL because it never got through (see
   * redis_link_connect_timed_out). */
  bool timing_out;
  /* Freed from inside its connect timer's callback: the timer is part of
   * the link, so the heap's on_finish frees it once done with it. */
  bool free_after_timer;
  /* A ref on the stopping loop while hiredis has output (redis__set). */
  bool holding;
  /* The engine's publisher: held too while replies are due, so that over
   * rediss:// a publish from a stop handler has gone through the pipe to
   * Redis (not only into the local socket) before the loop ends. */
  bool hold_replies;
  /* Calls into hiredis under way: hiredis may call back into the user of
   * the link (a reply callback resumes Lua, which may free the link), so
   * the block stays until the outermost call has returned. */
  int depth;
  reactor_watch_t *w;
  unsigned want; /* POLL_READ | POLL_WRITE, what hiredis asked for */
  mp_timer_t retry, connect_timer;
  uint64_t backoff;
  unsigned failures; /* in a row, for the log */
  /* rediss: the client context, this connection's pipe, and why its TLS
   * side failed (for the log line of the disconnect that follows). */
  net_tls_ctx_t *tls;
  redis_pipe_t *pipe;
  char tls_err[256];
  /* Replies the link waits for before it is up: AUTH, SELECT, and over
   * TLS a PING (hiredis's "connected" is only the local socket's). */
  int gates;
};

/* hiredis's adapter hooks. */
static void redis__set(redis_link_t *l) {
  if (l->w) reactor_watch_set(l->w, l->want);
  /* A stopping loop ends once nothing holds it; hiredis's output (a
   * publish from a stop handler) would wait for a write event that never
   * comes. Held while a link that is up has output (a link still
   * connecting, Redis down, must not hold the exit), bounded by the
   * loop's shutdown deadline. */
  bool due = (l->want & POLL_WRITE) ||
             (l->hold_replies && l->ac && l->ac->replies.head);
  bool hold = l->w && l->up && due && reactor_stopping(l->r);
  if (hold == l->holding) return;
  l->holding = hold;
  if (hold)
    reactor_ref(l->r);
  else
    reactor_unref(l->r);
}
static void redis__add_read(void *d) {
  redis_link_t *l = d;
  l->want |= POLL_READ;
  redis__set(l);
}
static void redis__del_read(void *d) {
  redis_link_t *l = d;
  l->want &= ~(unsigned)POLL_READ;
  redis__set(l);
}
static void redis__add_write(void *d) {
  redis_link_t *l = d;
  l->want |= POLL_WRITE;
  redis__set(l);
}
static void redis__del_write(void *d) {
  redis_link_t *l = d;
  l->want &= ~(unsigned)POLL_WRITE;
  redis__set(l);
}
static void redis__cleanup(void *d) {
  redis_link_t *l = d;
  if (l->w) reactor_unwatch(l->w);
  l->w = NULL;
  l->want = 0;
  redis__set(l); /* lets go of a stopping loop */
}

/* Around every hiredis call that can run callbacks: a link freed from
 * inside one (r:close() or a collected client in a resumed coroutine) is
 * marked and freed by the outermost leave, so neither hiredis's own
 * cleanup and disconnect hooks nor the code after the call touch a freed
 * block. redis__leave returns true if it freed the link. */
static void redis__enter(redis_link_t *l) { l->depth++; }
static bool redis__leave(redis_link_t *l) {
  if (--l->depth > 0 || !l->freeing) return false;
  free(l);
  return true;
}

static void redis__io(void *arg, unsigned events) {
  redis_link_t *l = arg;
  redisAsyncContext *ac = l->ac;
  if (!ac) return;
  redis__enter(l);
  if (events & POLL_HUP) {
    /* A failed connect shows as an error while waiting to write. */
    if (l->want & POLL_WRITE)
      redisAsyncHandleWrite(ac);
    else
      redisAsyncHandleRead(ac);
  } else {
    if (events & POLL_READ) redisAsyncHandleRead(ac);
    if (l->ac == ac && (events & POLL_WRITE)) redisAsyncHandleWrite(ac);
  }
  if (l->ac == ac) redis__set(l); /* a reply came: replies due changed */
  redis__leave(l);
}

static void redis__connect(mp_timer_t *t);

/* rediss: a stopping reactor has closed the pipe's connections (every
 * connection closes as a shutdown begins) and connects no more: no retry,
 * no log lines about it. */
static bool redis__tls_stopping(const redis_link_t *l) {
  return l->tls && reactor_stopping(l->r);
}

static void redis__retry_later(redis_link_t *l) {
  if (l->freeing || l->retry.armed || redis__tls_stopping(l)) return;
  uint64_t ms = l->backoff;
  l->backoff = l->backoff * 2 > REDIS_BACKOFF_MAX_MS ? REDIS_BACKOFF_MAX_MS
                                                    : l->backoff * 2;
  timer_start(reactor_timers(l->r), &l->retry, reactor_now(l->r), ms, 0, 1,
              redis__connect, NULL, l);
}

/* Logs a failure: every one of the first few, then one in 20. */
static void redis__failed(redis_link_t *l, const char *what, const char *why) {
  if (redis__tls_stopping(l)) return;
  l->failures++;
  char where[300];
  if (l->failures <= 3 || l->failures % 20 == 0)
    log_error("%s: %s %s: %s (attempt %u; retrying)", l->name, what,
              redis_url_where(&l->u, where, sizeof(where)), why, l->failures);
}

static void redis__went_down(redis_link_t *l) {
  bool was_up = l->up;
  l->up = false;
  timer_stop(reactor_timers(l->r), &l->connect_timer);
  redis__retry_later(l);
  if (was_up && l->hooks.down) l->hooks.down(l, l->arg);
}

/* Connected, and AUTH and SELECT (if any) accepted: the link is up. */
static void redis__ready(redis_link_t *l) {
  timer_stop(reactor_timers(l->r), &l->connect_timer);
  l->up = true;
  l->backoff = REDIS_BACKOFF_MIN_MS;
  char where[300];
  if (l->failures)
    log_warn("%s: connected to %s", l->name,
             redis_url_where(&l->u, where, sizeof(where)));
  l->failures = 0;
  if (l->hooks.up) l->hooks.up(l, l->arg);
}

static void redis__on_connect(const redisAsyncContext *ac, int status) {
  redis_link_t *l = ac->ev.data;
  if (status != REDIS_OK) {
    l->ac = NULL; /* hiredis frees it */
    redis__failed(l, "cannot connect to", ac->errstr);
    redis__went_down(l);
    return;
  }
  if (l->gates == 0) redis__ready(l);
  /* else up once the last of AUTH, SELECT and PING is answered */
}

static void redis__on_disconnect(const redisAsyncContext *ac, int status) {
  redis_link_t *l = ac->ev.data;
  if (l->ac == ac) l->ac = NULL;
  if (l->freeing) return;
  /* Over TLS the local socket's end says little: the pipe said why. */
  const char *why = l->tls_err[0] ? l->tls_err : ac->errstr;
  char where[300];
  if (l->up && !redis__tls_stopping(l))
    log_error("%s: lost the connection to %s%s%s", l->name,
              redis_url_where(&l->u, where, sizeof(where)), why[0] ? ": " : "",
              why);
  else if (l->tls_err[0])
    redis__failed(l, "cannot connect (TLS) to", l->tls_err);
  l->tls_err[0] = 0;
  redis__went_down(l);
}

/* A gate's reply came back: the link is up after the last one. */
static void redis__gate(redis_link_t *l) {
  if (--l->gates == 0) redis__ready(l);
}

static void redis__ping_reply(redisAsyncContext *ac, void *r, void *priv) {
  redis_link_t *l = priv;
  redisReply *reply = r;
  if (!reply || l->ac != ac) return;
  if (reply->type == REDIS_REPLY_ERROR) {
    redis__failed(l, "PING refused by", reply->str);
    redisAsyncDisconnect(ac);
    return;
  }
  redis__gate(l);
}

static void redis__pipe_fail(void *arg, const char *why) {
  redis_link_t *l = arg;
  snprintf(l->tls_err, sizeof(l->tls_err), "%s", why);
}

static void redis__auth_reply(redisAsyncContext *ac, void *r, void *priv) {
  redis_link_t *l = priv;
  redisReply *reply = r;
  if (!reply || l->ac != ac) return;
  if (reply->type == REDIS_REPLY_ERROR) {
    redis__failed(l, "AUTH refused by", reply->str);
    redisAsyncDisconnect(ac);
    return;
  }
  redis__gate(l);
}

static void redis__select_reply(redisAsyncContext *ac, void *r, void *priv) {
  redis_link_t *l = priv;
  redisReply *reply = r;
  if (!reply || l->ac != ac) return;
  if (reply->type == REDIS_REPLY_ERROR) {
    redis__failed(l, "SELECT refused by", reply->str);
    redisAsyncDisconnect(ac);
    return;
  }
  redis__gate(l);
}

static void redis__connect_timer_done(mp_timer_t *t) {
  redis_link_t *l = t->udata;
  if (l->free_after_timer) free(l);
}

static void redis__connect_timeout(mp_timer_t *t) {
  redis_link_t *l = t->udata;
  redisAsyncContext *ac = l->ac;
  if (!ac || l->up) return; /* (a handshake that hangs times out too) */
  l->ac = NULL;
  redis__enter(l);
  l->timing_out = true;
  redisAsyncFree(ac); /* pending replies come back as NULL: Lua may run */
  l->timing_out = false;
  /* Lua that closed the client (r:close() after its "connect timeout")
   * freed the link, and this timer with it, while the heap still holds
   * the timer: not freed here but in redis__connect_timer_done. */
  if (--l->depth == 0 && l->freeing) {
    l->free_after_timer = true;
    return;
  }
  if (l->freeing) return;
  redis__failed(l, "timed out connecting to", "no answer");
  redis__went_down(l);
}

static void redis__connect(mp_timer_t *t) {
  redis_link_t *l = t->udata;
  if (l->freeing || l->ac) return;
  redisAsyncContext *ac;
  if (l->tls) {
    /* rediss: hiredis talks to a local socket that a pipe carries over
     * TLS (redis_pipe.h); the last attempt's pipe goes now. */
    char err[300];
    redis_pipe_detach(l->pipe);
    l->pipe = redis_pipe_new(l->r, err, sizeof(err));
    l->tls_err[0] = 0;
    if (!l->pipe) {
      redis__failed(l, "cannot connect to", err);
      redis__retry_later(l);
      return;
    }
    ac = redisAsyncConnectUnix(redis_pipe_path(l->pipe));
    /* The link's connect timer (below: TCP, TLS and the PING) decides;
     * the pipe's own, armed a moment earlier with the same delay, won
     * the race now and then and said "connection lost: timeout" instead
     * of "connect timeout" (under load). A second later, it is only a
     * backstop. */
    if (ac && !ac->err &&
        redis_pipe_start(l->pipe, l->u.host, l->u.port, l->tls,
                         l->u.sni[0] ? l->u.sni : l->u.host,
                         (uint32_t)l->connect_ms + 1000, l->u.keepalive,
                         redis__pipe_fail, l, err, sizeof(err))) {
      redis__failed(l, "cannot connect (TLS) to", err);
      redisAsyncFree(ac);
      redis_pipe_detach(l->pipe);
      l->pipe = NULL;
      redis__retry_later(l);
      return;
    }
    if (!ac || ac->err) { /* (reported below) */
      redis_pipe_detach(l->pipe);
      l->pipe = NULL;
    }
  } else if (l->u.path[0]) {
    ac = redisAsyncConnectUnix(l->u.path);
  } else {
    ac = redisAsyncConnect(l->u.host, l->u.port);
    if (ac && !ac->err) (void)sock_keepalive(ac->c.fd, l->u.keepalive);
  }
  if (!ac) {
    redis__failed(l, "cannot connect to", "out of memory");
    redis__retry_later(l);
    return;
  }
  if (ac->err) {
    redis__failed(l, "cannot connect to", ac->errstr);
    redisAsyncFree(ac);
    redis__retry_later(l);
    return;
  }
  l->want = 0;
  l->w = reactor_watch_io(l->r, ac->c.fd, 0, redis__io, l);
  if (!l->w) {
    redis__failed(l, "cannot watch the connection to", strerror(errno));
    redisAsyncFree(ac);
    redis__retry_later(l);
    return;
  }
  l->ac = ac;
  ac->ev.data = l;
  ac->ev.addRead = redis__add_read;
  ac->ev.delRead = redis__del_read;
  ac->ev.addWrite = redis__add_write;
  ac->ev.delWrite = redis__del_write;
  ac->ev.cleanup = redis__cleanup;
  redisAsyncSetConnectCallback(ac, redis__on_connect); /* asks to write */
  redisAsyncSetDisconnectCallback(ac, redis__on_disconnect);
  /* Queued ahead of whatever the user of the link sends. */
  l->gates = 0;
  if (l->u.password[0]) {
    redisAsyncCommand(ac, redis__auth_reply, l, "AUTH %s", l->u.password);
    l->gates++;
  }
  if (l->u.db) {
    redisAsyncCommand(ac, redis__select_reply, l, "SELECT %d", l->u.db);
    l->gates++;
  }
  if (l->tls) {
    redisAsyncCommand(ac, redis__ping_reply, l, "PING");
    l->gates++;
  }
  timer_start(reactor_timers(l->r), &l->connect_timer, reactor_now(l->r),
              (uint64_t)l->connect_ms, 0, 1, redis__connect_timeout,
              redis__connect_timer_done, l);
}

redis_link_t *redis_link_new(reactor_t *r, const redis_url_t *u,
                             const char *name, int connect_ms,
                             redis_link_hooks_t hooks, void *arg) {
  redis_link_t *l = calloc(1, sizeof(*l));
  if (!l) return NULL;
  if (u->tls) {
    char err[400];
    l->tls = redis_url_tls(u, err, sizeof(err));
    if (!l->tls) {
      log_error("%s: %s", name, err);
      free(l);
      errno = EINVAL;
      return NULL;
    }
  }
  l->r = r;
  l->u = *u;
  l->name = name;
  l->connect_ms = connect_ms;
  l->hooks = hooks;
  l->arg = arg;
  l->backoff = REDIS_BACKOFF_MIN_MS;
  timer_init(&l->retry);
  timer_init(&l->connect_timer);
  l->retry.udata = l;
  redis__connect(&l->retry);
  return l;
}

/* A context hiredis is tearing down (its NULL replies run Lua, which may
 * send again at once) refuses commands: it is not offered. */
static redisAsyncContext *redis__usable(redisAsyncContext *ac) {
  return ac && !(ac->c.flags & (REDIS_DISCONNECTING | REDIS_FREEING)) ? ac
                                                                      : NULL;
}

redisAsyncContext *redis_link_ctx(redis_link_t *l) {
  return l->up ? redis__usable(l->ac) : NULL;
}

redisAsyncContext *redis_link_ctx_any(redis_link_t *l) {
  return redis__usable(l->ac);
}

bool redis_link_connect_timed_out(const redisAsyncContext *ac) {
  const redis_link_t *l = ac ? ac->ev.data : NULL;
  return l && l->timing_out;
}

const char *redis_link_tls_error(const redisAsyncContext *ac) {
  const redis_link_t *l = ac ? ac->ev.data : NULL;
  return l && l->tls_err[0] ? l->tls_err : NULL;
}

bool redis_link_closing(const redisAsyncContext *ac) {
  const redis_link_t *l = ac ? ac->ev.data : NULL;
  return !l || l->freeing;
}

void redis_link_free(redis_link_t *l) {
  if (!l || l->freeing) return;
  l->freeing = true;
  timer_stop(reactor_timers(l->r), &l->retry);
  timer_stop(reactor_timers(l->r), &l->connect_timer);
  redis_pipe_detach(l->pipe);
  l->pipe = NULL;
  net_tls_ctx_unref(l->tls); /* a pipe's connection holds its own */
  l->tls = NULL;
  redis__enter(l);
  if (l->ac) {
    redisAsyncContext *ac = l->ac;
    l->ac = NULL;
    /* Calls back with NULL replies, then cleanup; inside a hiredis
     * callback it only marks the context, and hiredis frees it (with the
     * same calls) when that callback returns. */
    redisAsyncFree(ac);
  }
  redis__leave(l);
}

/* ---- the engine ---- */

typedef struct redis_pending {
  struct redis_pending *next;
  size_t clen, mlen;
  char data[]; /* channel, then message */
} redis_pending_t;

struct redis_engine {
  redis_link_t *sub, *pub;
  redis_msg_fn on_msg;
  redis_each_fn each;
  void *arg;
  redis_pending_t *head, *tail; /* publishes waiting for Redis */
  size_t queued, queued_bytes, dropped;
  /* SUBSCRIBEs sent and not confirmed yet: publishes wait for them, or
   * a message published right after a subscription could reach Redis
   * (on the other connection) before it. */
  int sub_pending;
  _Atomic size_t *gauge; /* redis_engine_set_gauge */
};

static void redis__flush(redis_engine_t *e);

/* Whether a publish may go to Redis now: both links up, no SUBSCRIBE
 * unconfirmed. A publish sent while the subscriber link is still coming
 * up (or back) would reach Redis before its re-SUBSCRIBEs: the server's
 * own subscribers would miss it (a worker's first round trip through the
 * root did, over a slow rediss:// start). So it waits, as for an
 * unconfirmed SUBSCRIBE, and every server gets it. */
static bool redis__may_publish(redis_engine_t *e) {
  return e->sub_pending == 0 && redis_link_ctx(e->sub) &&
         redis_link_ctx(e->pub);
}

size_t redis_ctx_unsent(const redisAsyncContext *ac) {
  return ac && ac->c.obuf ? sdslen(ac->c.obuf) : 0;
}

static void redis__gauge(redis_engine_t *e) {
  if (e->gauge)
    atomic_store_explicit(
        e->gauge, redis_ctx_unsent(redis_link_ctx(e->pub)) + e->queued_bytes,
        memory_order_relaxed);
}

void redis_engine_set_gauge(redis_engine_t *e, _Atomic size_t *gauge) {
  e->gauge = gauge;
  redis__gauge(e);
}

static void redis__message(redisAsyncContext *ac, void *r, void *priv) {
  redis_engine_t *e = priv;
  redisReply *reply = r;
  if (!reply || reply->type != REDIS_REPLY_ARRAY || reply->elements < 3)
    return;
  redisReply **el = reply->element;
  if (el[0]->type != REDIS_REPLY_STRING) return;
  const char *kind = el[0]->str;
  if (strcmp(kind, "subscribe") == 0 || strcmp(kind, "psubscribe") == 0) {
    if (e->sub_pending > 0 && --e->sub_pending == 0) redis__flush(e);
    return;
  }
  redisReply *ch, *msg, *pat = NULL;
  if (strcmp(kind, "message") == 0) {
    ch = el[1];
    msg = el[2];
  } else if (strcmp(kind, "pmessage") == 0 && reply->elements == 4) {
    pat = el[1];
    ch = el[2];
    msg = el[3];
    if (pat->type != REDIS_REPLY_STRING) return;
  } else {
    return; /* unsubscribe confirmations */
  }
  if (ch->type != REDIS_REPLY_STRING || msg->type != REDIS_REPLY_STRING)
    return;
  e->on_msg(ch->str, ch->len, msg->str, msg->len, pat ? pat->str : NULL,
            pat ? pat->len : 0, e->arg);
}

static void redis__sub_one(const char *ch, size_t len, bool pattern,
                           void *arg) {
  redis_engine_t *e = arg;
  redisAsyncContext *ac = redis_link_ctx(e->sub);
  if (!ac) return;
  const char *argv[2] = {pattern ? "PSUBSCRIBE" : "SUBSCRIBE", ch};
  size_t lens[2] = {strlen(argv[0]), len};
  if (redisAsyncCommandArgv(ac, redis__message, e, 2, argv, lens) == REDIS_OK)
    e->sub_pending++;
}

static void redis__sub_down(redis_link_t *l, void *arg) {
  redis_engine_t *e = arg;
  e->sub_pending = 0; /* subscribed again when it is back; publishes
                       * wait for that (redis__may_publish) */
}

static void redis__sub_up(redis_link_t *l, void *arg) {
  redis_engine_t *e = arg;
  if (e->each) e->each(redis__sub_one, e, e->arg);
  redis__flush(e); /* (waits for the SUBSCRIBEs just sent, if any) */
}

static void redis__pub_up(redis_link_t *l, void *arg) {
  redis__flush(arg);
  redis__gauge(arg);
}

static void redis__pub_down(redis_link_t *l, void *arg) { redis__gauge(arg); }

redis_engine_t *redis_engine_new(reactor_t *r, const redis_url_t *u,
                                 redis_msg_fn on_msg, redis_each_fn each,
                                 void *arg) {
  redis_engine_t *e = calloc(1, sizeof(*e));
  if (!e) return NULL;
  e->on_msg = on_msg;
  e->each = each;
  e->arg = arg;
  e->sub = redis_link_new(r, u, "redis (subscriber)", 3000,
                          (redis_link_hooks_t){redis__sub_up, redis__sub_down}, e);
  e->pub = redis_link_new(r, u, "redis (publisher)", 3000,
                          (redis_link_hooks_t){redis__pub_up, redis__pub_down}, e);
  if (e->pub) e->pub->hold_replies = true;
  if (!e->sub || !e->pub) {
    redis_engine_free(e);
    return NULL;
  }
  return e;
}

void redis_engine_free(redis_engine_t *e) {
  if (!e) return;
  redis_link_free(e->sub);
  redis_link_free(e->pub);
  while (e->head) {
    redis_pending_t *p = e->head;
    e->head = p->next;
    free(p);
  }
  free(e);
}

bool redis_engine_up(const redis_engine_t *e) {
  return e->sub->up && e->pub->up;
}

static void redis__close_fd(redis_link_t *l) {
  if (l && l->ac && l->ac->c.fd >= 0) close(l->ac->c.fd);
  if (l) redis_pipe_close_fds(l->pipe);
}

void redis_engine_close_fds(redis_engine_t *e) {
  redis__close_fd(e->sub);
  redis__close_fd(e->pub);
}

void redis_engine_subscribe(redis_engine_t *e, const char *ch, size_t len,
                            bool pattern) {
  redis__sub_one(ch, len, pattern, e);
}

void redis_engine_unsubscribe(redis_engine_t *e, const char *ch, size_t len,
                              bool pattern) {
  redisAsyncContext *ac = redis_link_ctx(e->sub);
  if (!ac) return; /* resubscribing after the reconnect leaves it out */
  const char *argv[2] = {pattern ? "PUNSUBSCRIBE" : "UNSUBSCRIBE", ch};
  size_t lens[2] = {strlen(argv[0]), len};
  redisAsyncCommandArgv(ac, redis__message, e, 2, argv, lens);
}

/* A PUBLISH's reply: its bytes left the output buffer, so queued ones may
 * follow. NULL: the context is going (nothing to do, e may be going too). */
static void redis__published(redisAsyncContext *ac, void *r, void *priv) {
  if (!r) return;
  redis_engine_t *e = priv;
  redis__flush(e);
  redis__gauge(e);
}

static int redis__send(redis_engine_t *e, const char *ch, size_t clen,
                       const char *msg, size_t mlen) {
  redisAsyncContext *ac = redis_link_ctx(e->pub);
  if (!ac) return -1;
  /* Redis up but not reading fast enough: hold it in the bounded queue
   * rather than in hiredis's unbounded buffer. */
  if (redis_ctx_unsent(ac) + clen + mlen > REDIS_OBUF_MAX) return -1;
  const char *argv[3] = {"PUBLISH", ch, msg};
  size_t lens[3] = {7, clen, mlen};
  return redisAsyncCommandArgv(ac, redis__published, e, 3, argv, lens) ==
                 REDIS_OK
             ? 0
             : -1;
}

static void redis__flush(redis_engine_t *e) {
  if (!redis__may_publish(e)) return;
  if (e->dropped) {
    log_error("redis: Redis was away; dropped the %zu oldest messages "
              "waiting to be published", e->dropped);
    e->dropped = 0;
  }
  while (e->head) {
    redis_pending_t *p = e->head;
    if (redis__send(e, p->data, p->clen, p->data + p->clen, p->mlen)) return;
    e->head = p->next;
    if (!e->head) e->tail = NULL;
    e->queued--;
    e->queued_bytes -= p->clen + p->mlen;
    free(p);
  }
}

void redis_engine_publish(redis_engine_t *e, const char *ch, size_t clen,
                          const char *msg, size_t mlen) {
  if (!e->head && redis__may_publish(e) &&
      redis__send(e, ch, clen, msg, mlen) == 0) {
    redis__gauge(e);
    return;
  }
  redis_pending_t *p = malloc(sizeof(*p) + clen + mlen);
  if (!p) {
    e->dropped++;
    return;
  }
  p->next = NULL;
  p->clen = clen;
  p->mlen = mlen;
  memcpy(p->data, ch, clen);
  memcpy(p->data + clen, msg, mlen);
  if (e->tail)
    e->tail->next = p;
  else
    e->head = p;
  e->tail = p;
  e->queued++;
  e->queued_bytes += clen + mlen;
  while (e->head && (e->queued > REDIS_QUEUE_MAX ||
                     e->queued_bytes > REDIS_QUEUE_BYTES)) {
    redis_pending_t *old = e->head;
    e->head = old->next;
    if (!e->head) e->tail = NULL;
    e->queued--;
    e->queued_bytes -= old->clen + old->mlen;
    free(old);
    if (e->dropped++ == 0)
      log_error("redis: Redis is away and %d messages wait; dropping the "
                "oldest", REDIS_QUEUE_MAX); /* (or slow: the same queue) */
  }
  redis__flush(e); /* the link may be up with an older queue */
  redis__gauge(e);
}
