/* SPDX-License-Identifier: MIT */

/* lx_tcp_server: the protocol of mp.listen services with on_connect: each
 * accepted connection becomes an mp.tcp socket (lx_tcp_int.h) passed to
 * on_connect in a coroutine of its own. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "lx/lx_conn.h"
#include "lx/lx_tcp.h"
#include "lx/lx_tcp_int.h"

/* ---- server connections (mp.listen { on_connect = }) ----
 *
 * An accepted connection becomes a socket like mp.tcp's, handed to
 * on_connect in a coroutine of its own (LX_PLAIN: it holds the lane, not
 * the connection, since a held connection would get no on_data while its
 * coroutine waits in receive). The service's connection count is kept
 * here, as lx_conn.c does for the callback style. */

struct lx__srv_push {
  lx_service_t *sv;
  conn_t *c;
  lx_tcp_t *s;
};

static int lx__srv_push(lua_State *L, void *arg) {
  struct lx__srv_push *p = arg;
  lua_rawgeti(L, LUA_REGISTRYINDEX, p->sv->on_connect);
  lx_tcp_t *s = lua_newuserdata(L, sizeof(*s));
  memset(s, 0, sizeof(*s));
  s->kind = K_SOCK;
  s->anchor = LUA_NOREF;
  timer_init(&s->timer);
  luaL_getmetatable(L, LX_TCP_MT);
  lua_setmetatable(L, -2);
  s->key = strdup("server");
  if (!s->key) luaL_error(L, "out of memory");
  p->s = s;
  return 2;
}

static void lx__srv_open(conn_t *c) {
  lx_service_t *sv = reactor_conn_service(c);
  lx_lane_t *ln = sv->ln;
  sv->conns++;
  lx_client_t *cl = lx_client_of(ln);
  struct lx__srv_push p = {sv, c, NULL};
  int co_ref, n;
  lua_State *co =
      cl ? lx_co_take_push(ln, &co_ref, lx__srv_push, &p, &n) : NULL;
  if (!co) {
    if (!cl) log_error("on_connect: out of memory");
    reactor_conn_force_close(c, CONN_ERROR);
    return;
  }
  lx_tcp_t *s = p.s;
  s->cl = cl;
  s->c = c;
  s->state = S_OPEN;
  s->server = true;
  s->uuid = reactor_conn_uuid(c);
  s->max_buffer = sv->max_buffer ? sv->max_buffer : LX_TCP_MAX_BUFFER;
  s->max_line = sv->max_line ? sv->max_line : LX_TCP_MAX_LINE;
  if (s->max_line > s->max_buffer) s->max_line = s->max_buffer;
  /* No per-call bound by default: the listener's idle timeout closes a
   * connection nothing moves on (s:settimeouts adds one). */
  s->t_connect = s->t_send = s->t_read = 0;
  s->next = cl->socks;
  if (s->next) s->next->prev = s;
  cl->socks = s;
  reactor_conn_set_udata(c, s);
  lx_call_on(ln, co, co_ref, n - 1, LX_PLAIN, NULL, NULL, "on_connect");
}

/* The server is stopping: a read that would wait gets nil, "shutdown"
 * (buffered data is still returned), so the coroutine can end; sends
 * still work. */
static void lx__srv_shutdown(conn_t *c) {
  lx_tcp_t *s = reactor_conn_udata(c);
  if (!s) return;
  s->shutdown = true;
  lx_tcp__try(s);
}

static void lx__srv_close(conn_t *c, int reason) {
  lx_service_t *sv = reactor_conn_service(c);
  lx_tcp__gone(c, 0, reason);
  sv->conns--;
  lx_service_maybe_free(sv);
}

static const proto_t lx_tcp_server_proto = {
    .on_open = lx__srv_open,
    .on_data = lx_tcp__on_data,
    .on_ready = lx_tcp__on_ready,
    .on_timeout = lx_tcp__on_timeout,
    .on_shutdown = lx__srv_shutdown,
    .on_close = lx__srv_close,
    .on_fail = lx_tcp__on_fail,
};

lx_service_t *lx_tcp_service_new(lua_State *L, lx_lane_t *ln, int idx) {
  lx_service_t *s = lx_service_new_server(L, ln, idx);
  if (s->on_connect != LUA_NOREF) s->proto = lx_tcp_server_proto;
  return s;
}
