/* SPDX-License-Identifier: MIT */

/* lx_tcp: the C half of mp.tcp (lua/moonport/tcp.lua), a TCP or Unix
 * client socket whose calls wait only their coroutine (the cosocket
 * shape): connect (host names through the lane's resolver, the connect
 * timeout covering the lookup), send with back pressure, buffered reads
 * (n bytes, a line, to the end, up to a pattern) under limits, and the
 * lane's keep-alive pool.
 *
 * A socket is a userdata holding its connection (a reactor client
 * connection whose udata points back at it), its read buffer and at most
 * one wait: the op a coroutine is suspended in (connect, read, send),
 * with its timer. While a wait is armed the userdata is anchored in the
 * registry, so its timer or a posted task never outlives it. Every
 * connection event calls lx_tcp__try, which resumes the waiter once its op
 * can finish. A resume never happens inside the call that armed the wait
 * (failures known at once are posted as a task).
 *
 * The pool (cl->idle) holds connections, not sockets: s:setkeepalive
 * moves the connection out of its socket (which then reads as closed)
 * into an entry keyed "host:port" or "unix:path" (a TLS connection's key
 * starts "tls <settings> <name> ": see lx_tcp_new); mp.tcp takes the
 * newest open entry of its key. An idle entry closes when the idle time passes
 * (the reactor's idle timeout), when the peer closes or sends anything.
 *
 * The connections of mp.listen { on_connect = } are sockets too; their
 * protocol is lx_tcp_server.c (lx_tcp_int.h is what the two share).
 *
 * Lane thread only. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "core/log.h"
#include "lx/lx_client.h"
#include "lx/lx_conn.h"
#include "lx/lx_embed.h"
#include "lx/lx_tcp.h"
#include "lx/lx_tcp_int.h"
#include "lx/lx_tls.h"

static const proto_t lx_tcp_proto;

/* ---- small helpers ---- */

static lx_tcp_t *lx__check(lua_State *L) {
  return luaL_checkudata(L, 1, LX_TCP_MT);
}

static void lx__set_closed(lx_tcp_t *s, const char *why) {
  s->state = S_CLOSED;
  snprintf(s->errbuf, sizeof(s->errbuf), "%s", why);
}

static void lx__set_closed_err(lx_tcp_t *s, int err) {
  char buf[96];
  lx__set_closed(s, lx_errmsg(err, buf, sizeof(buf)));
}

/* Drops the connection (now, without the queue) and its back link. */
static void lx__drop_conn(lx_tcp_t *s, int reason) {
  if (!s->c) return;
  conn_t *c = s->c;
  s->c = NULL;
  reactor_conn_set_udata(c, NULL);
  reactor_conn_force_close(c, reason);
}

static void lx__timer_stop(lx_tcp_t *s) {
  if (s->timer.armed && s->cl)
    timer_stop(reactor_timers(s->cl->ln->r), &s->timer);
}

/* A connect that ends before it completed (killed, timed out): its name
 * lookup is cancelled, its connection dropped, and the socket reads as
 * closed with `why`. */
static void lx__end_connect(lx_tcp_t *s, int reason, const char *why) {
  if (s->dq) {
    dns_cancel(s->dq);
    s->dq = NULL;
  }
  lx__drop_conn(s, reason);
  lx__set_closed(s, why);
}

/* ---- the pool ---- */

static void lx__idle_unlink(lx_tcp_idle_t *e) {
  lx_client_t *cl = e->cl;
  if (e->prev)
    e->prev->next = e->next;
  else
    cl->idle = e->next;
  if (e->next) e->next->prev = e->prev;
  cl->nidle--;
}

/* Closes and frees a pool entry. */
static void lx__idle_free(lx_tcp_idle_t *e, bool close_conn) {
  lx__idle_unlink(e);
  if (e->c) {
    reactor_conn_set_udata(e->c, NULL);
    if (close_conn) reactor_conn_force_close(e->c, CONN_LOCAL);
  }
  free(e->key);
  free(e);
}

/* The newest open entry for key, taken out of the pool; NULL if none. */
static lx_tcp_idle_t *lx__idle_take(lx_client_t *cl, const char *key) {
  for (lx_tcp_idle_t *e = cl->idle, *next; e; e = next) {
    next = e->next;
    if (strcmp(e->key, key) != 0) continue;
    if (!reactor_conn_is_open(e->c)) continue; /* its on_close frees it */
    lx__idle_unlink(e);
    return e;
  }
  return NULL;
}

/* ---- resuming ---- */

/* Pushes the result of s's op onto L and returns how many values, or -1
 * while the op must wait. May consume the buffer or close s. */
static int lx__result(lx_tcp_t *s, lua_State *L);

static void lx__finish(lx_tcp_t *s, int n) {
  lx_lane_t *ln = s->cl->ln;
  s->op = OP_NONE;
  lx__timer_stop(s);
  lx_run_t run = s->run;
  int anchor = s->anchor;
  s->anchor = LUA_NOREF;
  lx_resume(ln, &run, n);
  /* Last: no Lua runs between this and our caller's return. */
  luaL_unref(ln->L, LUA_REGISTRYINDEX, anchor);
}

/* Resumes the waiter if its op can finish now. */
void lx_tcp__try(lx_tcp_t *s) {
  if (!s->cl || s->op == OP_NONE || s->queued || s->cl->ln->closing) return;
  int n = lx__result(s, s->run.co);
  if (n >= 0) lx__finish(s, n);
}

static void lx__task(void *a, void *b) {
  (void)b;
  lx_tcp_t *s = a;
  s->queued = false;
  if (s->op == OP_NONE && s->anchor != LUA_NOREF) { /* killed meanwhile */
    int anchor = s->anchor;
    s->anchor = LUA_NOREF;
    if (s->cl && !s->cl->ln->closing)
      luaL_unref(s->cl->ln->L, LUA_REGISTRYINDEX, anchor);
    return;
  }
  lx_tcp__try(s);
}

/* A killed task's connect, read or send (lx_wait_cancel_on): the wait
 * ends now. A connect in progress is dropped (the socket reads as
 * closed); after a read or send the socket stays as it is. */
static void lx__cancel(lx_lane_t *ln, void *arg) {
  lx_tcp_t *s = arg;
  if (s->op == OP_CONNECT) lx__end_connect(s, CONN_LOCAL, "closed");
  s->op = OP_NONE;
  lx__timer_stop(s);
  lx_run_t run = s->run;
  lx_run_abandon(ln, &run);
  if (s->queued) return; /* lx__task drops the anchor */
  int anchor = s->anchor;
  s->anchor = LUA_NOREF;
  luaL_unref(ln->L, LUA_REGISTRYINDEX, anchor);
}

/* A result known while arming: resumed from the loop, not from arm. */
static int lx__post_try(lx_tcp_t *s) {
  if (reactor_defer(s->cl->ln->r, lx__task, s, NULL)) return -ENOMEM;
  s->queued = true;
  return 0;
}

static void lx__timeout(mp_timer_t *t) {
  lx_tcp_t *s = t->udata;
  if (!s->cl || s->op == OP_NONE || s->queued) return;
  lua_State *co = s->run.co;
  if (s->op == OP_CONNECT) lx__end_connect(s, CONN_TIMEOUT, "timeout");
  lua_pushnil(co);
  lua_pushliteral(co, "timeout");
  lx__finish(s, 2);
}

/* Anchors s (at co's index 3), starts the op's timer. */
static int lx__arm_common(lx_tcp_t *s, const lx_run_t *run, lua_State *co,
                          uint32_t ms) {
  s->run = *run;
  if (s->anchor != LUA_NOREF) /* a killed wait's, its task not run yet */
    luaL_unref(co, LUA_REGISTRYINDEX, s->anchor);
  lua_pushvalue(co, 3);
  s->anchor = luaL_ref(co, LUA_REGISTRYINDEX);
  lx_lane_t *ln = s->cl->ln;
  if (ms && timer_start(reactor_timers(ln->r), &s->timer, reactor_now(ln->r),
                        ms, 0, 1, lx__timeout, NULL, s)) {
    luaL_unref(co, LUA_REGISTRYINDEX, s->anchor);
    s->anchor = LUA_NOREF;
    s->op = OP_NONE;
    return -ENOMEM;
  }
  lx_wait_cancel_on(ln, lx__cancel, s);
  return 0;
}

/* ---- the buffer ---- */

static size_t lx__avail(const lx_tcp_t *s) { return s->len - s->off; }

static void lx__consume(lx_tcp_t *s, size_t n) {
  s->off += n;
  s->scan = 0;
  if (s->off == s->len) {
    s->off = s->len = 0;
    if (s->cap > LX_TCP_KEEP_BUF) { /* a big read's buffer goes with it */
      free(s->buf);
      s->buf = NULL;
      s->cap = 0;
    }
  }
  if (s->paused && s->c && lx__avail(s) <= s->max_buffer) {
    s->paused = false;
    reactor_conn_resume(s->c);
  }
}

static int lx__append(lx_tcp_t *s, const char *data, size_t n) {
  if (s->off && s->len + n > s->cap) {
    memmove(s->buf, s->buf + s->off, s->len - s->off);
    s->len -= s->off;
    s->off = 0;
  }
  if (s->len + n > s->cap) {
    size_t cap = s->cap ? s->cap : 4096;
    while (cap < s->len + n) cap *= 2;
    char *b = realloc(s->buf, cap);
    if (!b) return -ENOMEM;
    s->buf = b;
    s->cap = cap;
  }
  memcpy(s->buf + s->len, data, n);
  s->len += n;
  return 0;
}

/* A read past its limit: the stream can't be read on in step, so the
 * socket closes. */
static int lx__limit(lx_tcp_t *s, lua_State *L, const char *why) {
  lx__drop_conn(s, CONN_LOCAL);
  lx__set_closed(s, "closed");
  s->off = s->len = s->scan = 0;
  lua_pushnil(L);
  lua_pushstring(L, why);
  return 2;
}

static int lx__read_result(lx_tcp_t *s, lua_State *L) {
  size_t avail = lx__avail(s);
  const char *p = s->buf + s->off;
  switch (s->rmode) {
  case R_N:
    if (avail >= s->rn) {
      lua_pushlstring(L, p, s->rn);
      lx__consume(s, s->rn);
      return 1;
    }
    break;
  case R_LINE: {
    const char *nl = avail > s->scan ? memchr(p + s->scan, '\n', avail - s->scan)
                                     : NULL;
    if (nl) {
      size_t l = (size_t)(nl - p);
      if (l > s->max_line) return lx__limit(s, L, "line too long");
      lua_pushlstring(L, p, l > 0 && p[l - 1] == '\r' ? l - 1 : l);
      lx__consume(s, l + 1);
      return 1;
    }
    s->scan = avail;
    if (avail > s->max_line) return lx__limit(s, L, "line too long");
    break;
  }
  case R_ALL:
    if (s->state == S_CLOSED && !strcmp(s->errbuf, "closed")) {
      lua_pushlstring(L, p, avail);
      lx__consume(s, avail);
      return 1;
    }
    if (avail > s->max_buffer) return lx__limit(s, L, "max_buffer exceeded");
    break;
  case R_UNTIL: {
    size_t from = s->scan >= s->plen ? s->scan - s->plen + 1 : 0;
    const char *hit =
        avail > from ? memmem(p + from, avail - from, s->pat, s->plen) : NULL;
    if (hit) {
      size_t at = (size_t)(hit - p);
      lua_pushlstring(L, p, s->incl ? at + s->plen : at);
      lx__consume(s, at + s->plen);
      return 1;
    }
    s->scan = avail;
    if (avail > s->max_buffer) return lx__limit(s, L, "max_buffer exceeded");
    break;
  }
  }
  if (s->state != S_CLOSED && !s->shutdown) return -1;
  lua_pushnil(L);
  lua_pushstring(L, s->state == S_CLOSED ? s->errbuf : "shutdown");
  lua_pushlstring(L, p, avail); /* the partial data */
  lx__consume(s, avail);
  return 3;
}

static int lx__result(lx_tcp_t *s, lua_State *L) {
  switch (s->op) {
  case OP_CONNECT:
    if (s->state == S_OPEN) {
      lua_pushboolean(L, 1);
      return 1;
    }
    if (s->state != S_CLOSED) return -1;
    lua_pushnil(L);
    lua_pushstring(L, s->errbuf);
    return 2;
  case OP_READ:
    return lx__read_result(s, L);
  case OP_SEND:
    if (s->state == S_OPEN && s->c && !reactor_conn_congested(s->c)) {
      lua_pushnumber(L, (lua_Number)s->sent);
      return 1;
    }
    if (s->state == S_OPEN && s->c) return -1;
    lua_pushnil(L);
    lua_pushstring(L, s->state == S_CLOSED ? s->errbuf : "closed");
    return 2;
  default:
    return -1;
  }
}

/* ---- connection events ---- */

static void lx__on_open(conn_t *c) {
  lx_tcp_t *s = reactor_conn_udata(c);
  if (!s || s->kind != K_SOCK) return;
  s->state = S_OPEN;
  lx_tcp__try(s);
}

void lx_tcp__on_data(conn_t *c, const char *data, size_t len) {
  int *kind = reactor_conn_udata(c);
  if (!kind) return;
  if (*kind == K_IDLE) { /* a pooled connection must be silent */
    lx__idle_free((lx_tcp_idle_t *)kind, true);
    return;
  }
  lx_tcp_t *s = (lx_tcp_t *)kind;
  if (lx__append(s, data, len)) {
    lx__drop_conn(s, CONN_ERROR);
    lx__set_closed(s, "out of memory");
    lx_tcp__try(s);
    return;
  }
  if (lx__avail(s) > s->max_buffer && !s->paused) {
    s->paused = true;
    reactor_conn_pause(c);
  }
  lx_tcp__try(s);
}

void lx_tcp__on_ready(conn_t *c) {
  lx_tcp_t *s = reactor_conn_udata(c);
  if (!s || s->kind != K_SOCK) return;
  lx_tcp__try(s);
}

void lx_tcp__on_timeout(conn_t *c) {
  int *kind = reactor_conn_udata(c);
  if (kind && *kind == K_IDLE) { /* idle too long in the pool */
    lx__idle_free((lx_tcp_idle_t *)kind, true);
    return;
  }
  reactor_conn_close(c, CONN_TIMEOUT);
}

void lx_tcp__gone(conn_t *c, int err, int reason) {
  int *kind = reactor_conn_udata(c);
  if (!kind) return;
  reactor_conn_set_udata(c, NULL);
  if (*kind == K_IDLE) {
    lx_tcp_idle_t *e = (lx_tcp_idle_t *)kind;
    e->c = NULL;
    lx__idle_free(e, false);
    return;
  }
  lx_tcp_t *s = (lx_tcp_t *)kind;
  s->c = NULL;
  const char *tls_err = reactor_conn_tls_error(c);
  if (s->state != S_CLOSED) {
    if (tls_err) /* the handshake's reason, not "protocol error" */
      lx__set_closed(s, tls_err);
    else if (err)
      lx__set_closed_err(s, err);
    else if (reason == CONN_PEER && reactor_conn_was_reset(c))
      lx__set_closed(s, "connection reset");
    else
      lx__set_closed(s, reason == CONN_PEER || reason == CONN_LOCAL
                            ? "closed"
                            : reactor_reason_name(reason));
  }
  lx_tcp__try(s);
}

static void lx__on_close(conn_t *c, int reason) { lx_tcp__gone(c, 0, reason); }
void lx_tcp__on_fail(conn_t *c, int err) { lx_tcp__gone(c, err, CONN_ERROR); }

static const proto_t lx_tcp_proto = {
    .on_open = lx__on_open,
    .on_data = lx_tcp__on_data,
    .on_ready = lx_tcp__on_ready,
    .on_timeout = lx_tcp__on_timeout,
    .on_close = lx__on_close,
    .on_fail = lx_tcp__on_fail,
};

/* s:peer(): ip, port (or "unix", path), or nil, "closed". */
static int lx_tcp_peer(lua_State *L) {
  lx_tcp_t *s = lx__check(L);
  int n = s->c ? lx_push_peer(L, s->c) : 0;
  if (n > 0) return n;
  lua_pushnil(L);
  lua_pushliteral(L, "closed");
  return 2;
}

/* s:uid(): the server-wide id of an accepted connection (as conn:uid()),
 * nil for a client socket. */
static int lx_tcp_uid(lua_State *L) {
  lx_tcp_t *s = lx__check(L);
  if (!s->server || !s->cl) {
    lua_pushnil(L);
    return 1;
  }
  lx_push_uid(L, s->cl->ln->srv, s->uuid);
  return 1;
}

/* s:tls(): {protocol=, cipher=, sni=, alpn=, resumed=} for an encrypted
 * connection, nil for a plain or closed one. */
static int lx_tcp_tls(lua_State *L) {
  lx_tcp_t *s = lx__check(L);
  return lx_tls_push_info(L, s->c);
}

/* ---- connecting ---- */

static int lx__connect_to(lx_tcp_t *s, const char *ip, uint32_t ms) {
  int err = 0;
  conn_opts_t o = {0};
  o.tls = s->tls;
  o.tls_host = s->tls_host;
  conn_t *c = reactor_connect(s->cl->ln->r, ip, s->port, s->path, ms,
                              &lx_tcp_proto, NULL, o, &err);
  /* The connection holds its own reference to the context. */
  net_tls_ctx_unref(s->tls);
  s->tls = NULL;
  if (!c) return err ? err : -EIO;
  s->c = c;
  reactor_conn_set_udata(c, s);
  s->state = S_CONNECTING;
  return 0;
}

static void lx__resolved(void *arg, int err, const dns_addr_t *addrs, size_t n,
                         uint32_t ttl_s) {
  (void)ttl_s;
  lx_tcp_t *s = arg;
  s->dq = NULL;
  if (!s->cl || s->cl->closing) return;
  if (err || n == 0) {
    lx__set_closed(s, err ? dns_strerror(err) : "no such host");
    lx_tcp__try(s);
    return;
  }
  char ip[INET6_ADDRSTRLEN];
  inet_ntop(addrs[0].family, &addrs[0].a, ip, sizeof(ip));
  /* The connect gets what is left of the connect timeout (our timer ends
   * the wait anyway; this bounds the half-open socket). */
  int rc = lx__connect_to(s, ip, s->t_connect);
  if (rc) {
    lx__set_closed_err(s, rc);
    lx_tcp__try(s);
  }
}

static bool lx__numeric(const char *host) {
  unsigned char b[sizeof(struct in6_addr)];
  return inet_pton(AF_INET, host, b) == 1 || inet_pton(AF_INET6, host, b) == 1;
}

/* Arms a connect: the socket at co's 3. */
static int lx_tcp_arm_connect(lx_lane_t *ln, const lx_run_t *run,
                              lua_State *co) {
  lx_tcp_t *s = lua_touserdata(co, 3);
  if (!s->cl || s->state != S_NEW) return -EINVAL;
  s->op = OP_CONNECT;
  int rc = lx__arm_common(s, run, co, s->t_connect);
  if (rc) return rc;
  if (s->path || lx__numeric(s->host)) {
    rc = lx__connect_to(s, s->host, s->t_connect);
  } else {
    dns_resolver_t *d = lx_client_dns(ln, &rc);
    if (d) {
      s->state = S_CONNECTING;
      s->dq = dns_resolve(d, s->host, AF_UNSPEC, s->t_connect, lx__resolved, s);
      rc = s->dq ? 0 : -errno;
    }
  }
  if (rc) {
    lx__set_closed_err(s, rc);
    if (lx__post_try(s)) { /* the callback fails instead: undo the arm */
      lx__timer_stop(s);
      luaL_unref(co, LUA_REGISTRYINDEX, s->anchor);
      s->anchor = LUA_NOREF;
      s->op = OP_NONE;
      return -ENOMEM;
    }
  }
  return 0;
}

/* ---- Lua primitives (core.tcp) ---- */

static uint32_t lx__ms_arg(lua_State *L, int idx, uint32_t dflt) {
  if (lua_isnoneornil(L, idx)) return dflt;
  lua_Number n = luaL_checknumber(L, idx);
  if (!(n >= 0 && n <= 2147483647.0))
    luaL_argerror(L, idx, "a timeout in ms, 0 to 2^31-1");
  return (uint32_t)n;
}

static size_t lx__size_arg(lua_State *L, int idx, size_t dflt) {
  if (lua_isnoneornil(L, idx)) return dflt;
  lua_Number n = luaL_checknumber(L, idx);
  if (!(n >= 1 && n <= (double)(1u << 30)))
    luaL_argerror(L, idx, "a size of 1 byte to 1 GiB");
  return (size_t)n;
}

/* Whether a host name has no blank or control byte (none resolves, and
 * pool keys use a blank as a separator). */
static bool lx__host_ok(const char *h) {
  for (; *h; h++)
    if ((unsigned char)*h <= ' ' || *h == 0x7f) return false;
  return true;
}

/* core.tcp.new(host, port, path, timeout, max_buffer, max_line, fresh,
 * tls): a socket and whether it is connected already (from the pool;
 * never when `fresh`: mp.fetch's retry after a pooled connection turned
 * out dead). `tls` is nil, true or a table (lx_tls_client). */
static int lx_tcp_new(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  const char *host = luaL_optstring(L, 1, NULL);
  lua_Integer port = luaL_optinteger(L, 2, 0);
  const char *path = luaL_optstring(L, 3, NULL);
  if (!path && !host) return luaL_argerror(L, 1, "host and port, or path");
  if (host && (!*host || strlen(host) > DNS_MAX_NAME || !lx__host_ok(host)))
    return luaL_argerror(L, 1, "a host of 1 to 253 characters, no blanks "
                               "or control bytes");
  if (!path && (port < 1 || port > 65535))
    return luaL_argerror(L, 2, "port must be 1 to 65535");
  uint32_t timeout = lx__ms_arg(L, 4, LX_TCP_TIMEOUT_MS);
  size_t max_buffer = lx__size_arg(L, 5, LX_TCP_MAX_BUFFER);
  size_t max_line = lx__size_arg(L, 6, LX_TCP_MAX_LINE);
  if (max_line > max_buffer) max_line = max_buffer;
  bool fresh = lua_toboolean(L, 7);
  lx_check_waitable(L, ln, "mp.tcp");
  lx_client_t *cl = lx_client_of(ln);
  if (!cl) return luaL_error(L, "mp.tcp: out of memory");
  lx_tcp_t *s = lua_newuserdata(L, sizeof(*s));
  memset(s, 0, sizeof(*s));
  s->kind = K_SOCK;
  s->anchor = LUA_NOREF;
  s->max_buffer = max_buffer;
  s->max_line = max_line;
  s->t_connect = s->t_send = s->t_read = timeout;
  s->port = (int)port;
  timer_init(&s->timer);
  luaL_getmetatable(L, LX_TCP_MT);
  lua_setmetatable(L, -2);
  /* TLS: the context is the socket's from here (its __gc drops it). The
   * pool key then names the trust settings and the verified name too, so
   * a pooled TLS connection never goes to a plain socket, nor to one that
   * asked for another name or other settings. */
  const char *sni = NULL, *tkey = NULL;
  s->tls = lx_client_tls(L, cl, 8, &sni, &tkey);
  if (s->tls) net_tls_ctx_ref(s->tls); /* the box on the stack goes */
  lua_pop(L, 1);
  if (s->tls && path && !sni)
    return luaL_error(L, "mp.tcp: tls over a Unix socket needs tls.sni "
                         "(the name to verify)");
  const char *name = sni ? sni : host;
  size_t klen = (path ? strlen(path) : strlen(host)) + 16 +
                (s->tls ? strlen(tkey) + strlen(name) + 8 : 0);
  s->key = malloc(klen);
  s->host = path ? NULL : strdup(host);
  s->path = path ? strdup(path) : NULL;
  s->tls_host = s->tls ? strdup(name) : NULL;
  if (!s->key || (!path && !s->host) || (path && !s->path) ||
      (s->tls && !s->tls_host))
    return luaL_error(L, "mp.tcp: out of memory");
  int at = s->tls ? snprintf(s->key, klen, "tls %s %s ", tkey, name) : 0;
  if (path)
    snprintf(s->key + at, klen - (size_t)at, "unix:%s", path);
  else
    snprintf(s->key + at, klen - (size_t)at, "%s:%d", host, (int)port);
  s->cl = cl;
  s->next = cl->socks;
  if (s->next) s->next->prev = s;
  cl->socks = s;
  lx_tcp_idle_t *e = fresh ? NULL : lx__idle_take(cl, s->key);
  if (e) {
    s->c = e->c;
    s->reused = e->reused + 1;
    s->state = S_OPEN;
    reactor_conn_set_udata(s->c, s);
    reactor_conn_set_timeout(s->c, 0);
    e->c = NULL;
    free(e->key);
    free(e);
  }
  lua_pushboolean(L, e != NULL);
  return 2;
}

/* core.tcp.recv(s, mode, arg, inclusive): the data (or nil, err
 * [, partial]) when the read finishes now; false after storing it as the
 * socket's op, when the caller must wait (arm_io). */
static int lx_tcp_recv(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_tcp_t *s = lx__check(L);
  int mode = (int)luaL_checkinteger(L, 2);
  if (s->op != OP_NONE) {
    lua_pushnil(L);
    lua_pushliteral(L, "socket busy (another coroutine waits on it)");
    return 2;
  }
  s->rmode = mode;
  /* What an earlier call searched was for its own mode or pattern. */
  s->scan = 0;
  if (mode == R_N) {
    lua_Number n = luaL_checknumber(L, 3);
    if (!(n >= 0)) return luaL_argerror(L, 3, "a byte count >= 0");
    if (n > (lua_Number)s->max_buffer) {
      lua_pushnil(L);
      lua_pushliteral(L, "max_buffer exceeded");
      return 2;
    }
    s->rn = (size_t)n;
  } else if (mode == R_UNTIL) {
    size_t plen;
    const char *pat = luaL_checklstring(L, 3, &plen);
    if (plen != s->plen || !s->pat || memcmp(pat, s->pat, plen)) {
      char *copy = malloc(plen);
      if (!copy) return luaL_error(L, "mp.tcp: out of memory");
      memcpy(copy, pat, plen);
      free(s->pat);
      s->pat = copy;
      s->plen = plen;
    }
    s->incl = lua_toboolean(L, 4);
  } else if (mode != R_LINE && mode != R_ALL) {
    return luaL_argerror(L, 2, "bad read mode");
  }
  s->op = OP_READ;
  int n = lx__read_result(s, L);
  if (n >= 0) {
    s->op = OP_NONE;
    return n;
  }
  if (s->state != S_OPEN) { /* cannot happen: closed reads finish */
    s->op = OP_NONE;
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
  }
  if (!ln->running || ln->running->co != L) {
    s->op = OP_NONE;
    lx_check_waitable(L, ln, "tcp receive");
  }
  lua_pushboolean(L, 0);
  return 1;
}

/* core.tcp.send(s, data): the byte count once the bytes are written or
 * queued below the connection's write limit (REACTOR_DEFAULT_WRITE_LIMIT;
 * small writes wait for the loop's batch), nil and why, or false when the
 * queue is past the limit and the caller must wait for on_ready, which
 * the reactor sends when the queue has drained (back pressure). */
static int lx_tcp_send(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_tcp_t *s = lx__check(L);
  size_t len;
  const char *data = luaL_checklstring(L, 2, &len);
  if (s->op != OP_NONE) {
    lua_pushnil(L);
    lua_pushliteral(L, "socket busy (another coroutine waits on it)");
    return 2;
  }
  if (s->state != S_OPEN || !s->c || !reactor_conn_is_open(s->c)) {
    lua_pushnil(L);
    lua_pushstring(L, s->state == S_CLOSED ? s->errbuf : "closed");
    return 2;
  }
  lx_check_waitable(L, ln, "tcp send");
  int rc = len ? reactor_conn_write(s->c, data, len) : 0;
  if (rc) return lx_push_fail(L, rc);
  if (!reactor_conn_congested(s->c)) {
    lua_pushnumber(L, (lua_Number)len);
    return 1;
  }
  s->op = OP_SEND;
  s->sent = len;
  lua_pushboolean(L, 0);
  return 1;
}

/* Arms the read or send that recv/send stored: the socket at co's 3. */
static int lx_tcp_arm_io(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  (void)ln;
  lx_tcp_t *s = lua_touserdata(co, 3);
  if (!s->cl || (s->op != OP_READ && s->op != OP_SEND)) return -EINVAL;
  return lx__arm_common(s, run, co, s->op == OP_READ ? s->t_read : s->t_send);
}

/* s:settimeouts(connect, send, read) in ms (nil keeps one). */
static int lx_tcp_settimeouts(lua_State *L) {
  lx_tcp_t *s = lx__check(L);
  s->t_connect = lx__ms_arg(L, 2, s->t_connect);
  s->t_send = lx__ms_arg(L, 3, s->t_send);
  s->t_read = lx__ms_arg(L, 4, s->t_read);
  return 0;
}

/* s:settimeout(ms): all three. */
static int lx_tcp_settimeout(lua_State *L) {
  lx_tcp_t *s = lx__check(L);
  s->t_connect = s->t_send = s->t_read = lx__ms_arg(L, 2, s->t_read);
  return 0;
}

static int lx_tcp_getreusedtimes(lua_State *L) {
  lua_pushinteger(L, lx__check(L)->reused);
  return 1;
}

/* s:setkeepalive([idle_ms [, pool_size]]): 1, or nil and why (the socket
 * is closed then, as after s:close()). */
static int lx_tcp_setkeepalive(lua_State *L) {
  lx_tcp_t *s = lx__check(L);
  uint32_t idle = lx__ms_arg(L, 2, LX_TCP_IDLE_MS);
  lua_Integer size = luaL_optinteger(L, 3, LX_TCP_POOL_SIZE);
  if (size < 1 || size > LX_TCP_POOL_MAX)
    return luaL_argerror(L, 3, "pool_size must be 1 to 1024");
  const char *why = NULL;
  if (s->server)
    why = "a server connection can't be pooled";
  else if (s->op != OP_NONE)
    why = "socket busy (another coroutine waits on it)";
  else if (s->state != S_OPEN || !s->c || !reactor_conn_is_open(s->c))
    why = s->state == S_CLOSED ? s->errbuf : "closed";
  else if (lx__avail(s))
    why = "unread data in the buffer";
  else if (reactor_conn_congested(s->c)) /* a send timed out */
    why = "unsent data";
  if (why) {
    lua_pushnil(L);
    lua_pushstring(L, why);
    lx__drop_conn(s, CONN_LOCAL);
    if (s->state != S_CLOSED) lx__set_closed(s, "closed");
    return 2;
  }
  lx_client_t *cl = s->cl;
  lx_tcp_idle_t *e = calloc(1, sizeof(*e));
  char *key = strdup(s->key);
  if (!e || !key || !cl) {
    free(e);
    free(key);
    lx__drop_conn(s, CONN_LOCAL);
    lx__set_closed(s, "closed");
    return lx_push_fail(L, -ENOMEM);
  }
  /* Room for it: the oldest of its key past pool_size - 1, and the
   * oldest of all past the lane's cap. */
  lx_tcp_idle_t *last = NULL, *oldest_key = NULL;
  int same = 0;
  for (lx_tcp_idle_t *x = cl->idle; x; x = x->next) {
    last = x;
    if (!strcmp(x->key, key)) {
      same++;
      oldest_key = x;
    }
  }
  if (same >= size && oldest_key)
    lx__idle_free(oldest_key, true);
  else if (cl->nidle >= LX_TCP_POOL_MAX && last)
    lx__idle_free(last, true);
  e->kind = K_IDLE;
  e->cl = cl;
  e->c = s->c;
  e->key = key;
  e->reused = s->reused;
  e->next = cl->idle;
  if (e->next) e->next->prev = e;
  cl->idle = e;
  cl->nidle++;
  reactor_conn_set_udata(e->c, e);
  reactor_conn_set_timeout(e->c, idle);
  if (s->paused) reactor_conn_resume(e->c);
  s->paused = false;
  s->c = NULL;
  lx__set_closed(s, "closed");
  lua_pushinteger(L, 1);
  return 1;
}

/* s:close(): 1, or nil and "closed" when it was closed already. Queued
 * bytes still go out. A coroutine waiting on s gets nil, "closed". */
static int lx_tcp_close(lua_State *L) {
  lx_tcp_t *s = lx__check(L);
  if (s->state == S_CLOSED && !s->c) {
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
  }
  if (s->dq) {
    dns_cancel(s->dq);
    s->dq = NULL;
  }
  if (s->c) {
    conn_t *c = s->c;
    s->c = NULL;
    reactor_conn_set_udata(c, NULL);
    reactor_conn_close(c, CONN_LOCAL);
  }
  lx__set_closed(s, "closed");
  if (s->op != OP_NONE && !s->queued) lx__post_try(s);
  lua_pushinteger(L, 1);
  return 1;
}

static void lx__sock_unlink(lx_tcp_t *s);

/* A socket whose Lua object or lane goes: its lookup, timer and
 * connection end, and it leaves its client's list. */
static void lx__detach(lx_tcp_t *s, int reason) {
  if (s->dq) dns_cancel(s->dq);
  s->dq = NULL;
  lx__timer_stop(s);
  lx__drop_conn(s, reason);
  lx__sock_unlink(s);
  s->cl = NULL;
}

static void lx__sock_unlink(lx_tcp_t *s) {
  lx_client_t *cl = s->cl;
  if (!cl) return;
  if (s->prev)
    s->prev->next = s->next;
  else if (cl->socks == s)
    cl->socks = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = NULL;
}

/* A socket is collected when nothing refers to it: never while it waits
 * (anchored), so only its connection and lookup are left to end. */
static int lx_tcp_gc(lua_State *L) {
  lx_tcp_t *s = luaL_checkudata(L, 1, LX_TCP_MT);
  if (s->cl) lx__detach(s, CONN_LOCAL);
  free(s->buf);
  free(s->key);
  free(s->host);
  free(s->path);
  free(s->pat);
  free(s->tls_host);
  net_tls_ctx_unref(s->tls);
  s->tls = NULL;
  s->buf = s->key = s->host = s->path = s->pat = s->tls_host = NULL;
  return 0;
}

static int lx_tcp_tostring(lua_State *L) {
  lx_tcp_t *s = lx__check(L);
  lua_pushfstring(L, "tcp socket (%s, %s)", s->key ? s->key : "?",
                  s->state == S_OPEN ? "open" : s->state == S_CLOSED
                                                     ? "closed"
                                                     : "connecting");
  return 1;
}

void lx_tcp_lane_close(lx_lane_t *ln) {
  lx_client_t *cl = lx_client_closing(ln);
  if (!cl) return;
  while (cl->socks) {
    lx__detach(cl->socks, CONN_SHUTDOWN); /* its anchor, if any, goes
                                             with the Lua state */
  }
  while (cl->idle) lx__idle_free(cl->idle, true);
}

void lx_tcp_open(lua_State *L, lx_lane_t *ln) {
  luaL_newmetatable(L, LX_TCP_MT);
  lua_pushcfunction(L, lx_tcp_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, lx_tcp_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushliteral(L, LX_TCP_MT);
  lua_setfield(L, -2, "__metatable");
  lx_embed_core_table(L, "tcp");
  lua_pushvalue(L, -2);
  lua_setfield(L, -2, "mt"); /* tcp.lua sets its __index */
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_tcp_new, 1);
  lua_setfield(L, -2, "new");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_tcp_recv, 1);
  lua_setfield(L, -2, "recv");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_tcp_send, 1);
  lua_setfield(L, -2, "send");
  lua_pushlightuserdata(L, (void *)lx_tcp_arm_connect);
  lua_setfield(L, -2, "arm_connect");
  lua_pushlightuserdata(L, (void *)lx_tcp_arm_io);
  lua_setfield(L, -2, "arm_io");
  static const luaL_Reg plain[] = {
      {"settimeouts", lx_tcp_settimeouts},
      {"settimeout", lx_tcp_settimeout},
      {"getreusedtimes", lx_tcp_getreusedtimes},
      {"setkeepalive", lx_tcp_setkeepalive},
      {"close", lx_tcp_close},
      {"peer", lx_tcp_peer},
      {"uid", lx_tcp_uid},
      {"tls", lx_tcp_tls},
      {NULL, NULL}};
  for (const luaL_Reg *r = plain; r->name; r++) {
    lua_pushcfunction(L, r->func);
    lua_setfield(L, -2, r->name);
  }
  lua_pushinteger(L, R_N);
  lua_setfield(L, -2, "R_N");
  lua_pushinteger(L, R_LINE);
  lua_setfield(L, -2, "R_LINE");
  lua_pushinteger(L, R_ALL);
  lua_setfield(L, -2, "R_ALL");
  lua_pushinteger(L, R_UNTIL);
  lua_setfield(L, -2, "R_UNTIL");
  lua_pop(L, 2);
  lx_require(L, "moonport.tcp");
  lua_setfield(L, -2, "tcp");
}
