/* lx_pubsub: mp.subscribe, conn:subscribe, mp.publish and the delivery of
 * messages into a lane's Lua callbacks. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "cluster/glob.h"
#include "cluster/pubsub.h"
#include "core/log.h"
#include "lx/lx.h"

#define LX_SUB_MT "moonport.subscription"

/* A subscription. Lives as long as Lua holds it; `active` until cancelled
 * (by sub:cancel(), or by its connection closing). */
typedef struct {
  lx_lane_t *ln;
  int fn_ref;
  bool pattern, active;
  sock_uuid_t uuid; /* the connection it belongs to, or 0 */
  lx_forward_fn fwd; /* set: messages go to the connection from C */
  size_t len;
  char ch[];
} lx_sub_t;

static lx_lane_t *lx__ln(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

/* ---- to the root (workers) ---- */

/* Writes what the socket takes of the queued bytes. ipc_lock held. */
static void lx__ipc_flush_locked(lx_server_t *srv) {
  while (srv->ipc_out_off < srv->ipc_out_len) {
    ssize_t n = send(srv->ipc_fd, srv->ipc_out + srv->ipc_out_off,
                     srv->ipc_out_len - srv->ipc_out_off,
                     MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) /* the root is gone */
        srv->ipc_out_off = srv->ipc_out_len;
      break;
    }
    srv->ipc_out_off += (size_t)n;
  }
  if (srv->ipc_out_off == srv->ipc_out_len) srv->ipc_out_off = srv->ipc_out_len = 0;
}

/* Sends one frame to the root, or queues what the socket doesn't take
 * (behind what is queued already, so frames keep their order), waking the
 * main thread to flush it. ipc_lock held. Never blocks: a root lane busy
 * in Lua must not stall the worker's lanes. Returns 0; -ENOBUFS for a
 * publish (`droppable`) that would take the queue past LX_IPC_OUT_MAX
 * (control frames are small and always queued: their order matters);
 * -ENOMEM; or -EPIPE once the root is gone. */
static int lx__ipc_send_locked(lx_server_t *srv, int type, unsigned flags,
                               const char *ch, size_t clen, const char *msg,
                               size_t mlen) {
  char hdr[IPC_HEADER];
  ipc_header(hdr, type, flags, clen, mlen);
  struct iovec iov[3] = {{hdr, IPC_HEADER}, {(void *)ch, clen},
                         {(void *)msg, mlen}};
  int cnt = 3, i = 0;
  if (srv->ipc_out_len) lx__ipc_flush_locked(srv);
  if (!srv->ipc_out_len) {
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
    for (;;) {
      ssize_t n = sendmsg(srv->ipc_fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -errno;
      if (n < 0) n = 0;
      while (i < cnt && (size_t)n >= iov[i].iov_len)
        n -= (ssize_t)iov[i++].iov_len;
      if (i < cnt) {
        iov[i].iov_base = (char *)iov[i].iov_base + n;
        iov[i].iov_len -= (size_t)n;
      }
      break;
    }
    if (i == cnt) return 0;
  }
  size_t rest = 0;
  for (int k = i; k < cnt; k++) rest += iov[k].iov_len;
  bool whole = i == 0 && iov[0].iov_len == IPC_HEADER; /* nothing went */
  if (type == IPC_PUBLISH && whole &&
      srv->ipc_out_len - srv->ipc_out_off + rest > LX_IPC_OUT_MAX)
    return -ENOBUFS;
  if (srv->ipc_out_len + rest > srv->ipc_out_cap) {
    if (srv->ipc_out_off) { /* slide the unsent part to the front */
      memmove(srv->ipc_out, srv->ipc_out + srv->ipc_out_off,
              srv->ipc_out_len - srv->ipc_out_off);
      srv->ipc_out_len -= srv->ipc_out_off;
      srv->ipc_out_off = 0;
    }
    size_t cap = srv->ipc_out_cap ? srv->ipc_out_cap : 65536;
    while (cap < srv->ipc_out_len + rest) cap *= 2;
    if (cap != srv->ipc_out_cap) {
      char *out = realloc(srv->ipc_out, cap);
      if (!out) return -ENOMEM;
      srv->ipc_out = out;
      srv->ipc_out_cap = cap;
    }
  }
  for (int k = i; k < cnt; k++) {
    if (iov[k].iov_len)
      memcpy(srv->ipc_out + srv->ipc_out_len, iov[k].iov_base, iov[k].iov_len);
    srv->ipc_out_len += iov[k].iov_len;
  }
  uint64_t one = 1; /* the main thread now polls for POLLOUT */
  ssize_t w = write(srv->wake_fd, &one, sizeof(one));
  (void)w;
  return 0;
}

bool lx_ipc_out_pending(lx_server_t *srv) {
  pthread_mutex_lock(&srv->ipc_lock);
  bool pending = srv->ipc_out_len > srv->ipc_out_off;
  pthread_mutex_unlock(&srv->ipc_lock);
  return pending;
}

void lx_ipc_flush(lx_server_t *srv) {
  pthread_mutex_lock(&srv->ipc_lock);
  if (srv->ipc_fd >= 0) lx__ipc_flush_locked(srv);
  pthread_mutex_unlock(&srv->ipc_lock);
}

/* pubsub_subscribe / _unsubscribe, telling the root about a first or last
 * subscriber; the lock keeps those notices in the order of the counts. */
static int lx__count(lx_lane_t *ln, const char *ch, size_t len, bool pattern,
                     bool add) {
  lx_server_t *srv = ln->srv;
  bool ipc = srv->ipc_fd >= 0;
  /* With one process and several lanes, the lock also keeps the notices
   * to Redis in the order of the counts. */
  bool lock = ipc || (srv->engine_r && !srv->root);
  if (lock) pthread_mutex_lock(&srv->ipc_lock);
  int rc = add ? pubsub_subscribe(srv->ps, ln->index, ch, len, pattern)
               : pubsub_unsubscribe(srv->ps, ln->index, ch, len, pattern);
  if (!ipc && rc == 1) lx_engine_count(srv, ch, len, pattern, add);
  if (ipc && rc == 1) {
    int type = add ? (pattern ? IPC_PSUB : IPC_SUB)
                   : (pattern ? IPC_PUNSUB : IPC_UNSUB);
    if (lx__ipc_send_locked(srv, type, 0, ch, len, NULL, 0))
      log_error("pub/sub: cannot reach the root process: %s", strerror(errno));
  }
  if (lock) pthread_mutex_unlock(&srv->ipc_lock);
  return rc;
}

/* Pushes the lane's table of subscriber lists for exact channels or for
 * patterns: { [channel] = { sub, sub, ... } }. */
static void lx__lists(lua_State *L, lx_lane_t *ln, bool pattern) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, pattern ? ln->psubs_ref : ln->subs_ref);
}

static void lx__remove(lua_State *L, lx_sub_t *s, int sub_idx) {
  lx__lists(L, s->ln, s->pattern);
  lua_pushlstring(L, s->ch, s->len);
  lua_rawget(L, -2);
  if (lua_istable(L, -1)) {
    int n = (int)lua_objlen(L, -1);
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      bool hit = lua_rawequal(L, -1, sub_idx);
      lua_pop(L, 1);
      if (!hit) continue;
      for (int j = i; j < n; j++) {
        lua_rawgeti(L, -1, j + 1);
        lua_rawseti(L, -2, j);
      }
      lua_pushnil(L);
      lua_rawseti(L, -2, n);
      if (n == 1) { /* the list is empty: drop it */
        lua_pushlstring(L, s->ch, s->len);
        lua_pushnil(L);
        lua_rawset(L, -4);
      }
      break;
    }
  }
  lua_pop(L, 2);
}

/* Cancels the subscription at stack index idx. */
static void lx__cancel(lua_State *L, int idx) {
  lx_sub_t *s = lua_touserdata(L, idx);
  if (!s->active) return;
  s->active = false;
  /* Uncount first: the Lua steps below can raise (out of memory), and an
   * inactive subscription left in a list is only skipped. */
  if (s->ln->srv->ps) lx__count(s->ln, s->ch, s->len, s->pattern, false);
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  lx__remove(L, s, idx);
  luaL_unref(L, LUA_REGISTRYINDEX, s->fn_ref);
  s->fn_ref = LUA_NOREF;
}

static int lx_sub_cancel(lua_State *L) {
  luaL_checkudata(L, 1, LX_SUB_MT);
  lx__cancel(L, 1);
  return 0;
}

static int lx_sub_active(lua_State *L) {
  lx_sub_t *s = luaL_checkudata(L, 1, LX_SUB_MT);
  lua_pushboolean(L, s->active);
  return 1;
}

static int lx_sub_channel(lua_State *L) {
  lx_sub_t *s = luaL_checkudata(L, 1, LX_SUB_MT);
  lua_pushlstring(L, s->ch, s->len);
  return 1;
}

/* subscribe(channel, fn [, { match = "glob" }]) for the lane, owned by
 * connection `uuid` (0: none). Arguments start at `base`. With `fwd`, fn
 * may be left out (nil, or the options in its place): messages then go
 * through fwd. */
int lx_subscribe(lua_State *L, lx_lane_t *ln, int base, sock_uuid_t uuid,
                 lx_forward_fn fwd) {
  size_t len;
  const char *ch = luaL_checklstring(L, base, &len);
  if (fwd && lua_istable(L, base + 1)) { /* (channel, opts) */
    lua_pushnil(L);
    lua_insert(L, base + 1);
  }
  if (fwd && lua_isnoneornil(L, base + 1)) {
    lua_settop(L, base + 2);
  } else {
    fwd = NULL;
    luaL_checktype(L, base + 1, LUA_TFUNCTION);
  }
  bool pattern = false;
  if (!lua_isnoneornil(L, base + 2)) {
    luaL_checktype(L, base + 2, LUA_TTABLE);
    lua_getfield(L, base + 2, "match");
    const char *m = lua_tostring(L, -1);
    if (m && strcmp(m, "glob") == 0)
      pattern = true;
    else if (m && strcmp(m, "exact") != 0)
      return luaL_error(L, "subscribe: match must be \"exact\" or \"glob\"");
    lua_pop(L, 1);
  }
  if (len > LX_MAX_CHANNEL)
    return luaL_error(L, "subscribe: channel of %d bytes (the limit is %d)",
                      (int)len, LX_MAX_CHANNEL);
  /* Every publish is matched against every pattern (under the post
   * office's lock): the cap keeps each match one linear pass. */
  if (pattern && len > GLOB_MAX_PATTERN)
    return luaL_error(L, "subscribe: pattern of %d bytes (the limit is %d)",
                      (int)len, GLOB_MAX_PATTERN);
  /* Everything that can raise (each Lua allocation, on out of memory)
   * comes first, with the subscription inactive (dispatch skips it): the
   * count, which tells the root or Redis, is the last step and cannot
   * raise, so a subscription is counted exactly when it is active. */
  lx_sub_t *s = lua_newuserdata(L, sizeof(*s) + len);
  int sub_idx = lua_gettop(L);
  s->ln = ln;
  s->pattern = pattern;
  s->active = false;
  s->fn_ref = LUA_NOREF;
  s->uuid = uuid;
  s->fwd = fwd;
  s->len = len;
  memcpy(s->ch, ch, len);
  luaL_getmetatable(L, LX_SUB_MT);
  lua_setmetatable(L, sub_idx);
  /* lists[channel][#+1] = sub */
  lx__lists(L, ln, pattern);
  lua_pushlstring(L, ch, len);
  lua_rawget(L, -2);
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    lua_newtable(L);
    lua_pushlstring(L, ch, len);
    lua_pushvalue(L, -2);
    lua_rawset(L, -4);
  }
  lua_pushvalue(L, sub_idx);
  lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
  lua_pop(L, 2);
  if (uuid) { /* conn_subs[uuid][#+1] = sub, cancelled at close */
    lua_rawgeti(L, LUA_REGISTRYINDEX, ln->conn_subs_ref);
    lua_pushnumber(L, (lua_Number)uuid);
    lua_rawget(L, -2);
    if (!lua_istable(L, -1)) {
      lua_pop(L, 1);
      lua_newtable(L);
      lua_pushnumber(L, (lua_Number)uuid);
      lua_pushvalue(L, -2);
      lua_rawset(L, -4);
    }
    lua_pushvalue(L, sub_idx);
    lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
    lua_pop(L, 2);
  }
  if (!fwd) { /* last of the Lua steps: a raise before it leaks no ref */
    lua_pushvalue(L, base + 1);
    s->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  if (lx__count(ln, ch, len, pattern, true) < 0) {
    lx__remove(L, s, sub_idx); /* in its conn_subs list it stays inactive */
    luaL_unref(L, LUA_REGISTRYINDEX, s->fn_ref);
    s->fn_ref = LUA_NOREF;
    return luaL_error(L, "subscribe: out of memory");
  }
  s->active = true;
  lua_settop(L, sub_idx);
  return 1;
}

void lx_pubsub_conn_closed(lx_lane_t *ln, sock_uuid_t uuid) {
  lua_State *L = ln->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, ln->conn_subs_ref);
  lua_pushnumber(L, (lua_Number)uuid);
  lua_rawget(L, -2);
  if (lua_istable(L, -1)) {
    int n = (int)lua_objlen(L, -1);
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      lx__cancel(L, -1);
      lua_pop(L, 1);
    }
    lua_pushnumber(L, (lua_Number)uuid);
    lua_pushnil(L);
    lua_rawset(L, -4);
  }
  lua_pop(L, 2);
}

static int lx_subscribe_fn(lua_State *L) {
  return lx_subscribe(L, lx__ln(L), 1, 0, NULL);
}

/* ---- delivery ---- */

/* A delivery to a connection whose callback runs or waits: it waits its
 * turn as one of the connection's callbacks. */
typedef struct {
  lx_lane_t *ln;
  int ref; /* registry: { fn, channel, message } */
} lx_later_t;

static void lx__later_run(conn_t *c, void *arg) {
  lx_later_t *t = arg;
  lx_lane_t *ln = t->ln;
  lua_State *L = ln->L;
  if (c && !ln->closing) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->ref);
    for (int i = 1; i <= 3; i++) lua_rawgeti(L, -i, i);
    lua_remove(L, -4);
    lx_call(ln, L, 2, LX_CONN, c, NULL, "subscriber");
  }
  luaL_unref(L, LUA_REGISTRYINDEX, t->ref);
  free(t);
}

static void lx__conn_later(lx_lane_t *ln, conn_t *c, int fn_ref, int ch_idx,
                           int msg_idx) {
  lua_State *L = ln->L;
  lx_later_t *t = malloc(sizeof(*t));
  if (!t) {
    log_error("pub/sub: out of memory; a message to a connection is lost");
    return;
  }
  lua_createtable(L, 3, 0);
  lua_rawgeti(L, LUA_REGISTRYINDEX, fn_ref);
  lua_rawseti(L, -2, 1);
  lua_pushvalue(L, ch_idx);
  lua_rawseti(L, -2, 2);
  lua_pushvalue(L, msg_idx);
  lua_rawseti(L, -2, 3);
  *t = (lx_later_t){ln, luaL_ref(L, LUA_REGISTRYINDEX)};
  if (reactor_conn_task(c, lx__later_run, t)) {
    luaL_unref(L, LUA_REGISTRYINDEX, t->ref);
    free(t);
    log_error("pub/sub: out of memory; a message to a connection is lost");
  }
}

/* Calls every active subscriber in list (at the top of L) with channel and
 * message (at ch_idx and msg_idx). */
static void lx__call_list(lx_lane_t *ln, int ch_idx, int msg_idx,
                          lx_fwd_ctx_t *fc) {
  lua_State *L = ln->L;
  int list = lua_gettop(L);
  int n = (int)lua_objlen(L, list);
  /* Copy first: a callback may cancel (or add) subscriptions. */
  lua_createtable(L, n, 0);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, list, i);
    lua_rawseti(L, -2, i);
  }
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, -1, i);
    lx_sub_t *s = lua_touserdata(L, -1);
    lua_pop(L, 1);
    if (!s || !s->active) continue;
    conn_t *c = s->uuid ? reactor_conn_find(ln->r, s->uuid) : NULL;
    if (s->uuid && !c) continue; /* closing: cancelled at its on_close */
    stats_add(ln->stats, STAT_PUBSUB_DELIVERED, 1);
    if (s->fwd) { /* straight to the client: no Lua, no waiting its turn */
      s->fwd(ln, c, fc);
      continue;
    }
    if (c && reactor_conn_busy(c)) {
      lx__conn_later(ln, c, s->fn_ref, ch_idx, msg_idx);
      continue;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->fn_ref);
    lua_pushvalue(L, ch_idx);
    lua_pushvalue(L, msg_idx);
    lx_call(ln, L, 2, c ? LX_CONN : LX_PLAIN, c, NULL, "subscriber");
  }
  lua_pop(L, 1);
}

static void lx__dispatch(lx_lane_t *ln, pubsub_msg_t *m, lx_fwd_ctx_t *fc);

void lx_pubsub_dispatch(lx_lane_t *ln, pubsub_msg_t *m) {
  lx_fwd_ctx_t fc = {m, -1, {NULL, NULL}};
  lx__dispatch(ln, m, &fc);
  lx_fwd_ctx_done(&fc);
}

static void lx__dispatch(lx_lane_t *ln, pubsub_msg_t *m, lx_fwd_ctx_t *fc) {
  lua_State *L = ln->L;
  int top = lua_gettop(L);
  lua_pushlstring(L, pubsub_msg_channel(m), m->clen);
  int ch_idx = lua_gettop(L);
  if (m->flags & PUBSUB_JSON) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "cjson");
    if (lua_pcall(L, 1, 1, 0) == 0) {
      lua_getfield(L, -1, "decode");
      lua_remove(L, -2);
      lua_pushlstring(L, pubsub_msg_body(m), m->mlen);
      if (lua_pcall(L, 1, 1, 0)) {
        log_error("pub/sub: a JSON message on a channel cannot be decoded: %s",
                  lua_tostring(L, -1));
        lua_settop(L, top);
        return;
      }
    } else {
      log_error("pub/sub: %s", lua_tostring(L, -1));
      lua_settop(L, top);
      return;
    }
  } else {
    lua_pushlstring(L, pubsub_msg_body(m), m->mlen);
  }
  int msg_idx = lua_gettop(L);
  if (m->flags & PUBSUB_PATTERN) { /* that pattern's subscribers only */
    lx__lists(L, ln, true);
    lua_pushlstring(L, pubsub_msg_pattern(m), m->plen);
    lua_rawget(L, -2);
    if (lua_istable(L, -1)) lx__call_list(ln, ch_idx, msg_idx, fc);
    lua_settop(L, top);
    return;
  }
  lx__lists(L, ln, false);
  lua_pushvalue(L, ch_idx);
  lua_rawget(L, -2);
  if (lua_istable(L, -1)) lx__call_list(ln, ch_idx, msg_idx, fc);
  lua_pop(L, 2);
  if (m->flags & PUBSUB_EXACT) {
    lua_settop(L, top);
    return;
  }
  lx__lists(L, ln, true);
  int pats = lua_gettop(L);
  /* Matching patterns first, then calls: callbacks may change the table. */
  lua_newtable(L);
  int hits = lua_gettop(L), nhits = 0;
  lua_pushnil(L);
  while (lua_next(L, pats)) {
    size_t plen;
    const char *p = lua_tolstring(L, -2, &plen);
    if (glob_match(p, plen, pubsub_msg_channel(m), m->clen))
      lua_rawseti(L, hits, ++nhits);
    else
      lua_pop(L, 1);
  }
  for (int i = 1; i <= nhits; i++) {
    lua_rawgeti(L, hits, i);
    lx__call_list(ln, ch_idx, msg_idx, fc);
    lua_pop(L, 1);
  }
  lua_settop(L, top);
}

static void lx__deliver_task(void *a, void *b) {
  lx_lane_t *ln = a;
  pubsub_msg_t *m = b;
  if (!ln->closing && !ln->retired) lx_pubsub_dispatch(ln, m);
  pubsub_msg_unref(m);
  lx_lane_task_done(ln);
}

void lx_pubsub_deliver(int sink, pubsub_msg_t *m, void *arg) {
  lx_server_t *srv = arg;
  lx_lane_t *ln = srv->lanes[sink];
  pubsub_msg_ref(m);
  atomic_fetch_add(&ln->tasks, 1);
  if (reactor_post(ln->r, lx__deliver_task, ln, m)) {
    log_error("pub/sub: out of memory; a message to lane %d is lost",
              sink + 1);
    atomic_fetch_sub(&ln->tasks, 1);
    pubsub_msg_unref(m);
  }
}

void lx_pubsub_cancel_all(lx_lane_t *ln) {
  lua_State *L = ln->L;
  for (int pattern = 0; pattern < 2; pattern++) {
    /* Collect first: cancelling edits the lists. */
    lx__lists(L, ln, pattern);
    lua_newtable(L);
    int n = 0;
    lua_pushnil(L);
    while (lua_next(L, -3)) {
      int k = (int)lua_objlen(L, -1);
      for (int i = 1; i <= k; i++) {
        lua_rawgeti(L, -1, i);
        lua_rawseti(L, -4, ++n);
      }
      lua_pop(L, 1);
    }
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      lx__cancel(L, -1);
      lua_pop(L, 1);
    }
    lua_pop(L, 2);
  }
}

/* ---- publishing ---- */

enum { SCOPE_CLUSTER, SCOPE_PROCESS, SCOPE_SIBLINGS, SCOPE_ROOT };

static int lx_publish(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  size_t clen, mlen;
  const char *ch = luaL_checklstring(L, 1, &clen);
  uint32_t flags = 0;
  if (lua_istable(L, 2)) {
    lua_getglobal(L, "require");
    lua_pushliteral(L, "cjson");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "encode");
    lua_pushvalue(L, 2);
    lua_call(L, 1, 1); /* raises on a table cjson can't encode */
    lua_replace(L, 2);
    lua_pop(L, 1);
    flags |= PUBSUB_JSON;
  }
  const char *msg = luaL_checklstring(L, 2, &mlen);
  int scope = SCOPE_CLUSTER;
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    lua_getfield(L, 3, "scope");
    static const char *const names[] = {"cluster", "process", "siblings",
                                        "root", NULL};
    scope = lua_isnil(L, -1) ? SCOPE_CLUSTER : luaL_checkoption(L, -1, NULL, names);
    lua_pop(L, 1);
  }
  if (clen > LX_MAX_CHANNEL)
    return luaL_error(L, "mp.publish: channel of %d bytes (the limit is %d)",
                      (int)clen, LX_MAX_CHANNEL);
  if (mlen > LX_MAX_MESSAGE)
    return luaL_error(L, "mp.publish: message of %d bytes (the limit is %d)",
                      (int)mlen, LX_MAX_MESSAGE);
  lx_server_t *srv = ln->srv;
  if (srv->remote && scope == SCOPE_CLUSTER && srv->ipc_fd < 0) {
    /* Through Redis to every server, this one included. */
    if (lx_engine_publish(srv, ch, clen, msg, mlen, flags & PUBSUB_JSON)) {
      lua_pushnil(L);
      lua_pushfstring(L, "redis is behind: %d MiB of messages wait to be "
                         "sent (Redis is slow or away)",
                      (int)(LX_ENGINE_BACKLOG_MAX >> 20));
      return 2;
    }
    return 0;
  }
  if (srv->ipc_fd >= 0) {
    /* A worker: its own subscribers directly (in order, no round trip),
     * the others through the root (through Redis for the cluster: then
     * its own come back that way too). */
    if (scope != SCOPE_PROCESS) {
      pthread_mutex_lock(&srv->ipc_lock);
      int rc = lx__ipc_send_locked(srv, IPC_PUBLISH,
                                   (unsigned)scope |
                                       (flags & PUBSUB_JSON ? IPC_JSON : 0),
                                   ch, clen, msg, mlen);
      pthread_mutex_unlock(&srv->ipc_lock);
      if (rc == -ENOBUFS) {
        lua_pushnil(L);
        lua_pushfstring(L, "the root process is behind: %d MiB of messages "
                           "wait for it", (int)(LX_IPC_OUT_MAX >> 20));
        return 2;
      }
      if (rc) return lx_push_fail(L, rc);
    }
    if (scope != SCOPE_CLUSTER && scope != SCOPE_PROCESS) return 0;
    if (scope == SCOPE_CLUSTER && srv->remote) return 0;
  } else if (!srv->root && scope == SCOPE_SIBLINGS) {
    return 0; /* one process: the whole cluster and its root; no siblings */
  }
  pubsub_msg_t *m = pubsub_msg_new(ch, clen, msg, mlen, flags);
  if (!m) return luaL_error(L, "mp.publish: out of memory");
  if (!srv->root || scope == SCOPE_CLUSTER)
    pubsub_publish(srv->ps, m, -1, -1);
  else if (scope == SCOPE_SIBLINGS) /* from the root: every worker */
    pubsub_publish(srv->ps, m, 0, -1);
  else if (pubsub_wants(srv->ps, 0, m)) /* process or root: the root lane */
    lx_pubsub_deliver(0, m, srv);
  pubsub_msg_unref(m);
  return 0;
}

static const luaL_Reg lx_sub_methods[] = {{"cancel", lx_sub_cancel},
                                          {"active", lx_sub_active},
                                          {"channel", lx_sub_channel},
                                          {NULL, NULL}};

void lx_pubsub_open(lua_State *L, lx_lane_t *ln) {
  luaL_newmetatable(L, LX_SUB_MT);
  lua_newtable(L);
  luaL_setfuncs(L, lx_sub_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushliteral(L, LX_SUB_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_subscribe_fn, 1);
  lua_setfield(L, -2, "subscribe");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_publish, 1);
  lua_setfield(L, -2, "publish");
}

/* ---- between processes ---- */

/* In each lane of a replaced worker, before it drains: its
 * mp.on("reload") handlers, which may hand state to the new worker (its
 * subscriptions are in place: it said it was ready). */
static void lx__reload_task(void *a, void *b) {
  lx_lane_t *ln = a;
  lx_call_list(ln, ln->reload_ref, "reload handler");
}

/* A worker's frames from the root. */
static void lx__from_root(int type, unsigned flags, const char *ch,
                          size_t clen, const char *msg, size_t mlen,
                          void *arg) {
  lx_server_t *srv = arg;
  if (type == IPC_DRAIN) { /* replaced: finish, then exit */
    log_info("worker %d (pid %d) was replaced; finishing its connections",
             srv->worker_index, (int)getpid());
    for (size_t i = 0; i < srv->nlanes; i++) {
      reactor_post(srv->lanes[i]->r, lx__reload_task, srv->lanes[i], NULL);
      reactor_drain(srv->lanes[i]->r, srv->drain_ms, srv->grace_ms);
    }
    return;
  }
  if (type != IPC_DELIVER) return;
  uint32_t f = (flags & IPC_JSON ? PUBSUB_JSON : 0) |
               (flags & IPC_EXACT ? PUBSUB_EXACT : 0);
  const char *pat = NULL;
  uint32_t plen = 0;
  if (flags & IPC_PATTERN) {
    if (mlen < 4) return;
    memcpy(&plen, msg + mlen - 4, 4);
    if (plen > mlen - 4) return;
    mlen -= 4 + plen;
    pat = msg + mlen;
    f |= PUBSUB_PATTERN;
  }
  pubsub_msg_t *m = pubsub_msg_new_for(ch, clen, msg, mlen, pat, plen, f);
  if (!m) {
    log_error("pub/sub: out of memory; a message is lost");
    return;
  }
  pubsub_publish(srv->ps, m, -1, -1);
  pubsub_msg_unref(m);
}

static void lx__oversize(size_t body, size_t limit, void *arg) {
  log_error("pub/sub: refused a frame of %zu bytes from another process "
            "(the limit is %zu)", body, limit);
}

void lx_ipc_feed(lx_server_t *srv, const char *data, size_t len) {
  if (ipc_reader_feed(&srv->ipc_reader, data, len, lx__from_root,
                      lx__oversize, srv))
    log_error("pub/sub: out of memory reading from the root; a frame is lost");
}

/* The root's side of one worker's socketpair. */
typedef struct lx_peer {
  lx_server_t *srv;
  int index;
  sock_uuid_t uuid; /* its connection in the root's reactor, or 0 */
  ipc_reader_t reader;
} lx_peer_t;

static void lx__root_frame(int type, unsigned flags, const char *ch,
                           size_t clen, const char *msg, size_t mlen,
                           void *arg) {
  lx_peer_t *p = arg;
  lx_server_t *srv = p->srv;
  switch (type) {
  case IPC_SUB:
  case IPC_PSUB:
    if (pubsub_subscribe(srv->ps, p->index, ch, clen, type == IPC_PSUB) == 1)
      lx_engine_count(srv, ch, clen, type == IPC_PSUB, true);
    return;
  case IPC_UNSUB:
  case IPC_PUNSUB:
    if (pubsub_unsubscribe(srv->ps, p->index, ch, clen, type == IPC_PUNSUB) == 1)
      lx_engine_count(srv, ch, clen, type == IPC_PUNSUB, false);
    return;
  case IPC_READY:
  case IPC_BEAT:
  case IPC_STUCK:
    if (srv->worker_news)
      srv->worker_news(type, p->index, msg, mlen, srv->news_arg);
    return;
  case IPC_PUBLISH: break;
  default: return;
  }
  if (srv->engine && (flags & IPC_SCOPE_MASK) == SCOPE_CLUSTER) {
    /* Everyone, the publisher too, gets it when it comes back. Refused
     * while Redis is behind: the worker can't be told, so a log line at
     * the first drop of each run of them. Root thread only. */
    static bool dropping;
    if (lx_engine_publish(srv, ch, clen, msg, mlen, flags & IPC_JSON) == 0) {
      dropping = false;
    } else if (!dropping) {
      dropping = true;
      log_error("redis: %zu MiB of messages wait for Redis (slow or away); "
                "dropping workers' messages until it catches up",
                LX_ENGINE_BACKLOG_MAX >> 20);
    }
    return;
  }
  pubsub_msg_t *m = pubsub_msg_new(ch, clen, msg, mlen,
                                   flags & IPC_JSON ? PUBSUB_JSON : 0);
  if (!m) {
    log_error("pub/sub: out of memory; a message is lost");
    return;
  }
  unsigned scope = flags & IPC_SCOPE_MASK;
  if (scope == SCOPE_CLUSTER) /* the publisher delivered its own */
    pubsub_publish(srv->ps, m, p->index, -1);
  else if (scope == SCOPE_SIBLINGS)
    pubsub_publish(srv->ps, m, p->index, 0);
  else if (scope == SCOPE_ROOT && pubsub_wants(srv->ps, 0, m))
    lx_pubsub_deliver(0, m, srv);
  pubsub_msg_unref(m);
}

static void lx__peer_open(conn_t *c) {
  lx_peer_t *p = reactor_conn_service(c);
  p->uuid = reactor_conn_uuid(c);
}

static void lx__peer_data(conn_t *c, const char *data, size_t len) {
  lx_peer_t *p = reactor_conn_service(c);
  if (ipc_reader_feed(&p->reader, data, len, lx__root_frame, lx__oversize, p))
    log_error("pub/sub: out of memory reading from worker %d; a frame is "
              "lost", (p->index - 1) % p->srv->nworkers + 1);
}

static void lx__peer_close(conn_t *c, int reason) {
  lx_peer_t *p = reactor_conn_service(c);
  if (p->uuid == reactor_conn_uuid(c)) p->uuid = 0;
}

static const proto_t lx_peer_proto = {.on_open = lx__peer_open,
                                      .on_data = lx__peer_data,
                                      .on_close = lx__peer_close};

static void lx__release_msg(void *m, void *unused) { pubsub_msg_unref(m); }

void lx_root_deliver(int sink, pubsub_msg_t *m, void *arg) {
  lx_server_t *srv = arg;
  if (sink == 0) {
    lx_pubsub_deliver(0, m, srv);
    return;
  }
  lx_peer_t *p = &srv->peers[sink];
  conn_t *c = p->uuid ? reactor_conn_find(srv->lanes[0]->r, p->uuid) : NULL;
  if (!c) return; /* between a worker's death and its replacement */
  char hdr[IPC_HEADER + LX_MAX_CHANNEL];
  bool pat = m->flags & PUBSUB_PATTERN;
  unsigned f = (m->flags & PUBSUB_JSON ? IPC_JSON : 0) |
               (m->flags & PUBSUB_EXACT ? IPC_EXACT : 0) |
               (pat ? IPC_PATTERN : 0);
  ipc_header(hdr, IPC_DELIVER, f, m->clen,
             m->mlen + (pat ? m->plen + 4 : 0));
  memcpy(hdr + IPC_HEADER, pubsub_msg_channel(m), m->clen);
  int rc = reactor_conn_write(c, hdr, IPC_HEADER + m->clen);
  if (rc == 0 && m->mlen) {
    pubsub_msg_ref(m);
    rc = reactor_conn_write_ref(c, pubsub_msg_body(m), m->mlen,
                                lx__release_msg, m, NULL);
  }
  if (rc == 0 && pat) { /* the pattern, then its length */
    uint32_t plen = (uint32_t)m->plen;
    rc = reactor_conn_write(c, pubsub_msg_pattern(m), m->plen);
    if (rc == 0) rc = reactor_conn_write(c, (const char *)&plen, 4);
  }
  if (rc == -ENOBUFS) {
    /* Half a frame would corrupt the stream: the worker is too far behind
     * to be told anything more, so it is cut off and replaced. */
    log_error("pub/sub: worker %d is not keeping up (%zu bytes queued); "
              "closing its link", (sink - 1) % srv->nworkers + 1,
              reactor_conn_pending(c));
    reactor_conn_force_close(c, CONN_ERROR);
  }
}

void lx_ipc_worker_started(int sink, int fd, void *arg) {
  lx_server_t *srv = arg;
  lx_peer_t *p = &srv->peers[sink];
  p->srv = srv;
  p->index = sink;
  p->uuid = 0;
  ipc_reader_deinit(&p->reader);
  ipc_reader_init(&p->reader, LX_MAX_CHANNEL + LX_MAX_MESSAGE);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  conn_opts_t opts = {.timeout_ms = 0,
                      .write_limit = (size_t)64 << 20,
                      .max_queue = (size_t)256 << 20};
  reactor_adopt(srv->lanes[0]->r, fd, &lx_peer_proto, p, opts);
}

void lx_ipc_worker_exited(int sink, void *arg) {
  lx_server_t *srv = arg;
  pubsub_clear_sink(srv->ps, sink, lx_engine_gone, srv);
}

bool lx_ipc_drain(int sink, void *arg) {
  lx_server_t *srv = arg;
  lx_peer_t *p = &srv->peers[sink];
  conn_t *c = p->uuid ? reactor_conn_find(srv->lanes[0]->r, p->uuid) : NULL;
  char hdr[IPC_HEADER];
  ipc_header(hdr, IPC_DRAIN, 0, 0, 0);
  return c && reactor_conn_write(c, hdr, sizeof(hdr)) == 0;
}

void lx_ipc_ready(lx_server_t *srv) {
  if (srv->ipc_fd < 0) return;
  pthread_mutex_lock(&srv->ipc_lock);
  if (lx__ipc_send_locked(srv, IPC_READY, 0, "", 0, NULL, 0))
    log_error("cannot reach the root process: %s", strerror(errno));
  pthread_mutex_unlock(&srv->ipc_lock);
}

void lx_ipc_watchdog(lx_server_t *srv) {
  uint64_t now = reactor_clock_ms();
  for (size_t i = 0; srv->lua_timeout_ms && i < srv->nlanes; i++) {
    lx_lane_t *ln = srv->lanes[i];
    uint64_t since = atomic_load_explicit(&ln->busy_since, memory_order_acquire);
    if (!since || now + 1 - since <= srv->lua_timeout_ms) continue;
    if (srv->stuck_told) return; /* no heartbeat either */
    srv->stuck_told = true;
    const char *what = atomic_load_explicit(&ln->busy_what, memory_order_relaxed);
    char msg[160];
    int n = snprintf(msg, sizeof(msg), "lane %zu has been running %s for "
                     "%.1f s (over --lua-timeout)", i + 1,
                     what ? what : "Lua", (double)(now + 1 - since) / 1000);
    if (srv->ipc_fd < 0) {
      log_error("%s; it serves nothing else until it returns", msg);
      return;
    }
    pthread_mutex_lock(&srv->ipc_lock);
    lx__ipc_send_locked(srv, IPC_STUCK, 0, "", 0, msg, (size_t)n);
    pthread_mutex_unlock(&srv->ipc_lock);
    return;
  }
  srv->stuck_told = false;
  if (srv->ipc_fd < 0 || now - srv->beat_sent < 1000) return;
  srv->beat_sent = now;
  pthread_mutex_lock(&srv->ipc_lock);
  lx__ipc_send_locked(srv, IPC_BEAT, 0, "", 0, NULL, 0);
  pthread_mutex_unlock(&srv->ipc_lock);
}

void lx_ipc_free_peers(lx_server_t *srv) {
  if (!srv->peers) return;
  for (int i = 0; i < CLUSTER_SINKS(srv->nworkers); i++)
    ipc_reader_deinit(&srv->peers[i].reader);
  free(srv->peers);
  srv->peers = NULL;
}

lx_peer_t *lx_ipc_new_peers(lx_server_t *srv) {
  srv->peers = calloc((size_t)CLUSTER_SINKS(srv->nworkers), sizeof(*srv->peers));
  return srv->peers;
}
