/* SPDX-License-Identifier: MIT */

/* lx_pubsub: mp.subscribe, conn:subscribe, mp.publish and the delivery of
 * messages into a lane's Lua callbacks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/glob.h"
#include "cluster/link.h"
#include "cluster/pubsub.h"
#include "core/log.h"
#include "http/ws_sse.h"
#include "lx/lx_embed.h"
#include "lx/lx_engine.h"
#include "lx/lx_lane.h"
#include "lx/lx_pubsub.h"
#include "lx/lx_server.h"

/* The row's slot (lx_module.h): set by the runner before the first lane,
 * read-only after. */
int lx_pubsub_slot = -1;

static lx_pubsub_lane_t *lx__pl(const lx_lane_t *ln) {
  return lx_lane_state(ln, lx_pubsub_slot);
}

void lx_pubsub_init(lua_State *L, lx_lane_t *ln) {
  lx_pubsub_lane_t *pl = lx__pl(ln);
  lua_newtable(L);
  pl->subs_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_newtable(L);
  pl->psubs_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_newtable(L);
  pl->conn_subs_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

#define LX_SUB_MT "moonport.subscription"

/* A subscription. Lives as long as Lua holds it; `active` until cancelled
 * (by sub:cancel(), or by its connection closing). */
typedef struct {
  lx_lane_t *ln;
  int fn_ref;
  bool pattern, active;
  sock_uuid_t uuid; /* the connection it belongs to, or 0 */
  int32_t sid;      /* ... and its HTTP/2 stream, or 0 */
  lx_forward_fn fwd; /* set: messages go to the connection from C */
  size_t len;
  char ch[];
} lx_sub_t;

static lx_lane_t *lx__ln(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

/* pubsub_subscribe / _unsubscribe, telling the root about a first or last
 * subscriber; the lock keeps those notices in the order of the counts. */
static int lx__count(lx_lane_t *ln, const char *ch, size_t len, bool pattern,
                     bool add) {
  lx_server_t *srv = ln->srv;
  bool ipc = srv->proc.ipc_fd >= 0;
  /* With one process and several lanes, the lock also keeps the notices
   * to Redis in the order of the counts. */
  bool lock = ipc || (srv->engine_r && !srv->root);
  if (lock) pthread_mutex_lock(&srv->proc.ipc_lock);
  int rc = add ? pubsub_subscribe(srv->ps, ln->index, ch, len, pattern)
               : pubsub_unsubscribe(srv->ps, ln->index, ch, len, pattern);
  if (!ipc && rc == 1) lx_engine_count(srv, ch, len, pattern, add);
  if (ipc && rc == 1) {
    int type = add ? (pattern ? IPC_PSUB : IPC_SUB)
                   : (pattern ? IPC_PUNSUB : IPC_UNSUB);
    if (link_send(&srv->proc.link, type, 0, ch, len, NULL, 0))
      log_error("pub/sub: cannot reach the root process: %s", strerror(errno));
  }
  if (lock) pthread_mutex_unlock(&srv->proc.ipc_lock);
  return rc;
}

/* Pushes the lane's table of subscriber lists for exact channels or for
 * patterns: { [channel] = { sub, sub, ... } }. */
static void lx__lists(lua_State *L, lx_lane_t *ln, bool pattern) {
  lx_pubsub_lane_t *pl = lx__pl(ln);
  lua_rawgeti(L, LUA_REGISTRYINDEX, pattern ? pl->psubs_ref : pl->subs_ref);
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
  return lx_subscribe_stream(L, ln, base, uuid, 0, fwd);
}

int lx_subscribe_stream(lua_State *L, lx_lane_t *ln, int base, sock_uuid_t uuid,
                        int32_t sid, lx_forward_fn fwd) {
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
  s->sid = sid;
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
    lua_rawgeti(L, LUA_REGISTRYINDEX, lx__pl(ln)->conn_subs_ref);
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
  lua_rawgeti(L, LUA_REGISTRYINDEX, lx__pl(ln)->conn_subs_ref);
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

void lx_pubsub_stream_closed(lx_lane_t *ln, sock_uuid_t uuid, int32_t sid) {
  if (!sid) { /* the connection's own stream: all of them */
    lx_pubsub_conn_closed(ln, uuid);
    return;
  }
  lua_State *L = ln->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, lx__pl(ln)->conn_subs_ref);
  lua_pushnumber(L, (lua_Number)uuid);
  lua_rawget(L, -2);
  if (lua_istable(L, -1)) { /* the stream's go, the others close up */
    int list = lua_gettop(L);
    int n = (int)lua_objlen(L, list), w = 0;
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, list, i);
      lx_sub_t *s = lua_touserdata(L, -1);
      if (s && s->sid == sid) {
        lx__cancel(L, -1);
        lua_pop(L, 1);
      } else {
        lua_rawseti(L, list, ++w);
      }
    }
    for (int i = w + 1; i <= n; i++) {
      lua_pushnil(L);
      lua_rawseti(L, list, i);
    }
    if (w == 0) { /* the last stream's: the connection's entry goes (an
                   * HTTP connection has no close of its own here) */
      lua_pushnumber(L, (lua_Number)uuid);
      lua_pushnil(L);
      lua_rawset(L, -4);
    }
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
      s->fwd(ln, c, s->sid, fc);
      continue;
    }
    /* an HTTP/2 event stream's subscriber holds the loop, not the
     * connection (which carries other streams), and needn't wait for it */
    conn_t *hold = s->sid ? NULL : c;
    if (hold && reactor_conn_busy(hold)) {
      lx__conn_later(ln, hold, s->fn_ref, ch_idx, msg_idx);
      continue;
    }
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->fn_ref);
    lua_pushvalue(L, ch_idx);
    lua_pushvalue(L, msg_idx);
    lx_call(ln, L, 2, hold ? LX_CONN : LX_PLAIN, hold, NULL, "subscriber");
  }
  lua_pop(L, 1);
}

/* The frames are http/ws_sse.h's, shared by every subscriber's queue. */
void lx_fwd_ctx_done(lx_fwd_ctx_t *fc) {
  for (int i = 0; i < 2; i++) {
    http_frame_unref(fc->frame[i]);
    fc->frame[i] = NULL;
  }
  http_frame_unref(fc->zframe);
  fc->zframe = NULL;
}

static void lx__dispatch(lx_lane_t *ln, pubsub_msg_t *m, lx_fwd_ctx_t *fc);

void lx_pubsub_dispatch(lx_lane_t *ln, pubsub_msg_t *m) {
  lx_fwd_ctx_t fc = {m, -1, {NULL, NULL}, NULL, 0, 0};
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

enum {
  SCOPE_CLUSTER = LINK_SCOPE_CLUSTER,
  SCOPE_PROCESS = LINK_SCOPE_PROCESS,
  SCOPE_SIBLINGS = LINK_SCOPE_SIBLINGS,
  SCOPE_ROOT = LINK_SCOPE_ROOT
};

static int lx_publish(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  size_t clen, mlen;
  const char *ch = luaL_checklstring(L, 1, &clen);
  uint32_t flags = 0;
  if (lua_istable(L, 2)) {
    lx_require(L, "moonport.json"); /* mp.json.encode: "/" stays "/" */
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
  if (srv->remote && scope == SCOPE_CLUSTER && srv->proc.ipc_fd < 0) {
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
  if (srv->proc.ipc_fd >= 0) {
    /* A worker: its own subscribers directly (in order, no round trip),
     * the others through the root (through Redis for the cluster: then
     * its own come back that way too). */
    if (scope != SCOPE_PROCESS) {
      pthread_mutex_lock(&srv->proc.ipc_lock);
      int rc = link_send(&srv->proc.link, IPC_PUBLISH,
                         (unsigned)scope | (flags & PUBSUB_JSON ? IPC_JSON : 0),
                         ch, clen, msg, mlen);
      pthread_mutex_unlock(&srv->proc.ipc_lock);
      if (rc == -ENOBUFS) {
        lua_pushnil(L);
        lua_pushfstring(L, "the root process is behind: %d MiB of messages "
                           "wait for it", (int)(LINK_OUT_MAX >> 20));
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
