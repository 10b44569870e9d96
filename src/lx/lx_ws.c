/* SPDX-License-Identifier: MIT */

/* lx_ws: the Lua face of the streams an HTTP connection can turn into:
 * WebSocket (after an upgrade) and Server-Sent Events (res:sse). Each is
 * a Lua object bound to its connection by uuid; their subscriptions
 * without a function forward messages to the client from C, without
 * entering Lua. The HTTP server hands a stream its connection's events
 * through lx_stream_ops (http/server.h); frames, close frames, SSE events
 * and the shared fan-out frames are written by http/ws_sse.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "http/compress.h"
#include "http/h2_stream.h"
#include "http/ws_deflate.h"
#include "http/ws_sse.h"
#include "http/ws.h"
#include "lx/lx_conn.h"
#include "lx/lx_lane.h"
#include "lx/lx_pubsub.h"
#include "lx/lx_server.h"
#include "lx/lx_tls.h"
#include "lx/lx_ws.h"

#define LX_WS_MT "moonport.websocket"
#define LX_SSE_MT "moonport.sse"

/* Messages past HTTP_WS_INLINE and this long are queued by reference to
 * the Lua string. */
#define LX_WS_ZERO_COPY_MIN 16384
/* A WebSocket's input buffer starts this small and, once drained, is kept
 * only up to LX_WS_IN_KEEP bytes (freed past it): an idle subscriber holds
 * no 4 KiB it used once. */
#define LX_WS_IN_MIN 256
#define LX_WS_IN_KEEP 1024
/* Seconds a close handshake we started may take. */
#define LX_WS_CLOSE_WAIT_MS 5000

enum { LX_KIND_WS = 1, LX_KIND_SSE = 2 };

struct lx_ws_cfg {
  /* registry refs or NOREF */
  int on_upgrade, on_open, on_message, on_ready, on_close;
  size_t max_msg;
  bool compress; /* permessage-deflate is offered back: pmd */
  ws_pmd_cfg_t pmd;
};

struct lx_stream {
  int kind;
  lx_lane_t *ln;
  sock_uuid_t uuid;
  int32_t sid; /* SSE over HTTP/2: its stream (h2_stream.h), else 0 */
  const lx_ws_cfg_t *cfg; /* WS: the service's (it outlives its conns) */
  int on_open, on_close;  /* SSE: its own refs */
  int obj_ref;            /* the Lua object, LUA_NOREF until pushed */
  char *last_id;          /* SSE: the Last-Event-ID the client sent */
  http_gz_t *gz;          /* SSE: its gzip stream (compress), or NULL */
  ws_z_t *z;              /* WS: permessage-deflate, when agreed */
  size_t z_threshold;     /* ... messages shorter go plain */
  /* WebSocket input */
  ws_reader_t rd;
  char *in;
  size_t len, off, cap;
  bool waiting;    /* on_message is suspended: the input waits for it */
  bool close_sent; /* our close frame is out */
  bool close_got;  /* the peer's close frame came */
  bool pinged;     /* idle once already: a ping went out */
  uint64_t close_by; /* close_sent by ws:close: the peer's answer is due
                        then, whatever else it sends */
  int code;        /* for on_close: the close code seen or sent */
  size_t reason_len;
  char reason[124];
};

typedef struct {
  sock_uuid_t uuid;
  int kind;
  int32_t sid;
} lx_stream_ud_t;

/* The stream of connection c (HTTP/2: its stream sid), or NULL. */
static lx_stream_t *lx__stream_at(conn_t *c, int32_t sid) {
  return sid ? http_h2_stream_of(c, sid, &lx_stream_ops)
             : http_conn_stream_of(c, &lx_stream_ops);
}

static lx_lane_t *lx__ln(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

/* ---- settings ---- */

static int lx__fn_ref(lua_State *L, int idx, const char *name) {
  lua_getfield(L, idx, name);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return LUA_NOREF;
  }
  if (!lua_isfunction(L, -1))
    luaL_error(L, "mp.http: websocket.%s must be a function (got %s)", name,
               luaL_typename(L, -1));
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

static int lx__ws_bits(lua_State *L, int idx, const char *name, int def) {
  lua_getfield(L, idx, name);
  int v = def;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER || lua_tonumber(L, -1) < 9 ||
        lua_tonumber(L, -1) > 15 ||
        lua_tonumber(L, -1) != (int)lua_tonumber(L, -1))
      luaL_error(L, "compress.%s must be a whole number 9..15", name);
    v = (int)lua_tonumber(L, -1);
  }
  lua_pop(L, 1);
  return v;
}

static bool lx__ws_flag(lua_State *L, int idx, const char *name, bool def) {
  lua_getfield(L, idx, name);
  bool v = lua_isnil(L, -1) ? def : lua_toboolean(L, -1);
  lua_pop(L, 1);
  return v;
}

bool lx_ws_compress_opts(lua_State *L, int idx, ws_pmd_cfg_t *pmd) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  ws_pmd_cfg_init(pmd);
  lua_getfield(L, idx, "compress");
  int t = lua_type(L, -1);
  bool on = t == LUA_TTABLE || (t == LUA_TBOOLEAN && lua_toboolean(L, -1));
  if (t != LUA_TNIL && t != LUA_TBOOLEAN && t != LUA_TTABLE)
    luaL_error(L, "compress must be true or a table (got %s)",
               luaL_typename(L, -1));
  if (t == LUA_TTABLE) {
    int ct = lua_gettop(L);
    pmd->want.server_no_ctx =
        lx__ws_flag(L, ct, "server_no_context_takeover", true);
    pmd->want.client_no_ctx =
        lx__ws_flag(L, ct, "client_no_context_takeover", false);
    pmd->want.server_bits = lx__ws_bits(L, ct, "server_max_window_bits", 15);
    pmd->want.client_bits = lx__ws_bits(L, ct, "client_max_window_bits", 15);
    lua_getfield(L, ct, "threshold");
    if (!lua_isnil(L, -1)) {
      if (lua_type(L, -1) != LUA_TNUMBER || lua_tonumber(L, -1) < 0)
        luaL_error(L, "compress.threshold must be a number of bytes");
      pmd->threshold = (size_t)lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
    lua_getfield(L, ct, "level");
    if (!lua_isnil(L, -1)) {
      if (lua_type(L, -1) != LUA_TNUMBER || lua_tonumber(L, -1) < 1 ||
          lua_tonumber(L, -1) > 9)
        luaL_error(L, "compress.level must be 1..9");
      pmd->level = (int)lua_tonumber(L, -1);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return on;
}

/* Raises on a bad websocket table; returns max_msg. */
static size_t lx__ws_check(lua_State *L, int idx) {
  if (!lua_istable(L, idx))
    luaL_error(L, "mp.http: websocket must be a table of handlers (got %s)",
               luaL_typename(L, idx));
  lua_getfield(L, idx, "max_msg");
  lua_Number max = 1 << 20;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER)
      luaL_error(L, "mp.http: websocket.max_msg must be a number");
    max = lua_tonumber(L, -1);
    if (max < 1 || max > (lua_Number)(1u << 30))
      luaL_error(L, "mp.http: websocket.max_msg out of range (1..2^30)");
  }
  lua_pop(L, 1);
  /* Check every handler before taking any reference. */
  static const char *const names[] = {"on_upgrade", "on_open", "on_message",
                                      "on_ready", "on_close"};
  for (int i = 0; i < 5; i++) {
    lua_getfield(L, idx, names[i]);
    bool bad = !lua_isnil(L, -1) && !lua_isfunction(L, -1);
    lua_pop(L, 1);
    if (bad) lx__fn_ref(L, idx, names[i]); /* raises */
  }
  ws_pmd_cfg_t pmd;
  lx_ws_compress_opts(L, idx, &pmd); /* raises on a bad one */
  return (size_t)max;
}

void lx_ws_cfg_check(lua_State *L, int idx) {
  lx__ws_check(L, idx < 0 ? lua_gettop(L) + idx + 1 : idx);
}

lx_ws_cfg_t *lx_ws_cfg_new(lua_State *L, int idx) {
  idx = idx < 0 ? lua_gettop(L) + idx + 1 : idx;
  size_t max = lx__ws_check(L, idx);
  lx_ws_cfg_t *cfg = malloc(sizeof(*cfg));
  if (!cfg) luaL_error(L, "out of memory");
  cfg->max_msg = max;
  cfg->compress = lx_ws_compress_opts(L, idx, &cfg->pmd);
  cfg->on_upgrade = lx__fn_ref(L, idx, "on_upgrade");
  cfg->on_open = lx__fn_ref(L, idx, "on_open");
  cfg->on_message = lx__fn_ref(L, idx, "on_message");
  cfg->on_ready = lx__fn_ref(L, idx, "on_ready");
  cfg->on_close = lx__fn_ref(L, idx, "on_close");
  return cfg;
}

void lx_ws_cfg_free(lua_State *L, lx_ws_cfg_t *cfg) {
  if (!cfg) return;
  luaL_unref(L, LUA_REGISTRYINDEX, cfg->on_upgrade);
  luaL_unref(L, LUA_REGISTRYINDEX, cfg->on_open);
  luaL_unref(L, LUA_REGISTRYINDEX, cfg->on_message);
  luaL_unref(L, LUA_REGISTRYINDEX, cfg->on_ready);
  luaL_unref(L, LUA_REGISTRYINDEX, cfg->on_close);
  free(cfg);
}

int lx_ws_cfg_on_upgrade(const lx_ws_cfg_t *cfg) { return cfg->on_upgrade; }

/* ---- streams ---- */

static lx_stream_t *lx__stream_new(lx_lane_t *ln, conn_t *c, int kind) {
  lx_stream_t *st = calloc(1, sizeof(*st));
  if (!st) return NULL;
  st->kind = kind;
  st->ln = ln;
  st->uuid = reactor_conn_uuid(c);
  st->on_open = st->on_close = st->obj_ref = LUA_NOREF;
  st->code = 1006;
  stats_add(ln->stats, kind == LX_KIND_WS ? STAT_WS_OPENED : STAT_SSE_OPENED, 1);
  return st;
}

lx_stream_t *lx_ws_new(lx_lane_t *ln, conn_t *c, const lx_ws_cfg_t *cfg) {
  lx_stream_t *st = lx__stream_new(ln, c, LX_KIND_WS);
  if (!st) return NULL;
  st->cfg = cfg;
  ws_reader_init(&st->rd, cfg->max_msg, true);
  return st;
}

size_t lx_ws_negotiate(lx_stream_t *st, const char *offer, size_t len,
                       char *resp, size_t cap) {
  ws_z_free(st->z); /* (again: to leave it off) */
  st->z = NULL;
  st->rd.z = NULL;
  ws_pmd_t p;
  if (!st->cfg->compress || !offer ||
      !ws_pmd_accept(&st->cfg->pmd, offer, len, &p, resp, cap))
    return 0;
  if (!(st->z = ws_z_new(&p, true, st->cfg->pmd.level))) return 0;
  st->z_threshold = st->cfg->pmd.threshold;
  st->rd.z = st->z;
  return strlen(resp);
}

/* A data message for st's connection, compressed when agreed and long
 * enough: a new buffer holding `room` free bytes then the deflated
 * bytes (*zlen), or NULL to send it plain (or out of memory). */
static char *lx__ws_deflate(lx_stream_t *st, const char *p, size_t n,
                            size_t room, size_t *zlen) {
  if (!st->z || n < st->z_threshold) return NULL;
  char *z = ws_z_deflate(st->z, p, n, room, zlen);
  if (z) {
    stats_add(st->ln->stats, STAT_WS_DEFLATES, 1);
    stats_add(st->ln->stats, STAT_WS_DEFL_IN, n);
    stats_add(st->ln->stats, STAT_WS_DEFL_OUT, *zlen);
  }
  return z;
}

static void lx__free_release(void *ctx, void *ctx2) {
  (void)ctx2;
  free(ctx);
}

/* Pushes the stream's Lua object (one per stream, kept until it closes). */
static void lx__push_obj(lua_State *L, lx_stream_t *st) {
  if (st->obj_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, st->obj_ref);
    return;
  }
  lx_stream_ud_t *ud = lx_new_env_ud(
      L, sizeof(*ud), st->kind == LX_KIND_WS ? LX_WS_MT : LX_SSE_MT);
  ud->uuid = st->uuid;
  ud->kind = st->kind;
  ud->sid = st->sid;
  lua_pushvalue(L, -1);
  st->obj_ref = luaL_ref(L, LUA_REGISTRYINDEX);
}

void lx_stream_push(lua_State *L, lx_stream_t *st) { lx__push_obj(L, st); }

/* Writes a frame (http/ws_sse.h); a long message goes by reference to
 * the Lua string at `idx` of L. 0 or a negative errno. */
static int lx__ws_frame(conn_t *c, int op, const char *p, size_t n,
                        lua_State *L, int idx, lx_lane_t *ln) {
  if (L && n > HTTP_WS_INLINE && n >= LX_WS_ZERO_COPY_MIN) {
    lua_pushvalue(L, idx);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return http_ws_send_ref(c, op, p, n, lx_unref_release, ln,
                            (void *)(intptr_t)ref);
  }
  return http_ws_send(c, op, p, n);
}

/* Sends our close frame (once) and waits for the peer's, for a while. */
static void lx__ws_send_close(conn_t *c, lx_stream_t *st, int code,
                              const char *reason, size_t rlen) {
  if (st->close_sent) return;
  st->close_sent = true;
  http_ws_send_close(c, code, reason, rlen);
  if (!st->close_got) st->code = code;
}

/* The peer broke the protocol (or a limit): close with `code`. */
static void lx__ws_fail(conn_t *c, lx_stream_t *st, int code) {
  static const char *const why[] = {"protocol error", "invalid UTF-8",
                                    "message too big", "server error"};
  const char *r = code == WS_CLOSE_PROTOCOL   ? why[0]
                  : code == WS_CLOSE_BAD_DATA ? why[1]
                  : code == WS_CLOSE_TOO_BIG  ? why[2]
                                              : why[3];
  lx__ws_send_close(c, st, code, r, strlen(r));
  st->reason_len = strlen(r);
  memcpy(st->reason, r, st->reason_len);
  st->close_got = true; /* read nothing more */
  /* CONN_LOCAL, not CONN_ERROR: a local close lingers (shuts down writing
   * and drains the input), so the close frame isn't lost to a reset when
   * the client is still sending. */
  reactor_conn_close(c, CONN_LOCAL);
}

/* Runs on_message; returns whether it is suspended. */
static bool lx__ws_message(conn_t *c, lx_stream_t *st, const ws_event_t *ev) {
  if (st->cfg->on_message == LUA_NOREF) return false;
  lx_lane_t *ln = st->ln;
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, st->cfg->on_message);
  lx__push_obj(co, st);
  lua_pushlstring(co, ev->data, ev->len);
  lua_pushboolean(co, ev->opcode == WS_TEXT);
  return lx_call_on(ln, co, co_ref, 3, LX_CONN, c, NULL, "on_message");
}

static void lx__ws_process(conn_t *c, lx_stream_t *st);

/* A suspended on_message finished: the waiting input goes on. */
static void lx__ws_resume(conn_t *c, void *arg) {
  (void)arg;
  if (!c) return;
  lx_stream_t *st = http_conn_stream_of(c, &lx_stream_ops);
  if (!st || st->kind != LX_KIND_WS) return;
  st->waiting = false;
  lx__ws_process(c, st);
}

/* Handles the whole frames in the input, one message callback at a time. */
static void lx__ws_process(conn_t *c, lx_stream_t *st) {
  while (!st->waiting && !st->close_got && reactor_conn_is_open(c)) {
    ws_event_t ev;
    ssize_t n = ws_read(&st->rd, st->in + st->off, st->len - st->off, &ev);
    if (n == 0) break;
    if (n < 0) {
      lx__ws_fail(c, st, n == -ENOMEM ? WS_CLOSE_ERROR : (int)-n);
      return;
    }
    st->off += (size_t)n;
    switch (ev.opcode) {
    case WS_PING: /* answered until the peer's close (RFC 6455 5.5.2) */
      lx__ws_frame(c, WS_PONG, ev.data, ev.len, NULL, 0, st->ln);
      break;
    case WS_CLOSE:
      st->close_got = true;
      st->code = ev.code;
      st->reason_len = ev.len < sizeof(st->reason) ? ev.len : sizeof(st->reason);
      memcpy(st->reason, ev.data, st->reason_len);
      /* The answer echoes the code (RFC 6455 5.5.1); the server closes
       * the TCP connection first (7.1.1). */
      lx__ws_send_close(c, st, ev.code, NULL, 0);
      reactor_conn_close(c, CONN_PEER);
      return;
    case WS_TEXT:
    case WS_BINARY:
      if (st->close_sent) break; /* closing: messages are dropped */
      if (lx__ws_message(c, st, &ev)) {
        st->waiting = true;
        if (reactor_conn_task(c, lx__ws_resume, NULL))
          reactor_conn_force_close(c, CONN_ERROR);
      }
      break;
    default: /* a pong, or a fragment taken */
      break;
    }
  }
  if (st->off) {
    memmove(st->in, st->in + st->off, st->len - st->off);
    st->len -= st->off;
    st->off = 0;
  }
  /* Drained: a connection that sat idle after a burst keeps at most a
   * small buffer (what most clients send fits it, so they never churn). */
  if (st->len == 0 && st->cap > LX_WS_IN_KEEP) {
    free(st->in);
    st->in = NULL;
    st->cap = 0;
  }
}

static void lx_stream_data(conn_t *c, lx_stream_t *st, const char *data, size_t len) {
  if (st->kind != LX_KIND_WS || st->close_got) return; /* SSE: ignored */
  st->pinged = false;
  if (st->close_by) { /* reading resets the idle clock: keep the deadline */
    uint64_t now = reactor_now(st->ln->r);
    if (now >= st->close_by) {
      reactor_conn_close(c, CONN_TIMEOUT);
      return;
    }
    reactor_conn_set_timeout(c, (uint32_t)(st->close_by - now));
  }
  /* One frame of the largest message, a control frame, and what one read
   * brings past them. */
  size_t limit = st->rd.max_msg + st->rd.max_msg / 256 + 64 + 2 * WS_MAX_HEAD +
                 125 + 65536; /* (a compressed frame's own bound: ws.c) */
  if (st->len + len > limit) {
    lx__ws_fail(c, st, WS_CLOSE_TOO_BIG);
    return;
  }
  if (st->len + len > st->cap) {
    size_t cap = st->cap ? st->cap : LX_WS_IN_MIN;
    while (cap < st->len + len) cap *= 2;
    char *p = realloc(st->in, cap);
    if (!p) {
      lx__ws_fail(c, st, WS_CLOSE_ERROR);
      return;
    }
    st->in = p;
    st->cap = cap;
  }
  memcpy(st->in + st->len, data, len);
  st->len += len;
  if (!st->waiting) lx__ws_process(c, st);
}

/* on_open of a WebSocket, with the upgrade request pushed by push_req;
 * then the bytes that came after the request. */
void lx_ws_begin(conn_t *c, lx_stream_t *st,
                 bool (*push_req)(lua_State *L, void *arg), void *arg,
                 const char *rest, size_t rest_len) {
  lx_lane_t *ln = st->ln;
  bool suspended = false;
  if (st->cfg->on_open != LUA_NOREF) {
    int co_ref;
    lua_State *co = lx_co_take(ln, &co_ref);
    lua_rawgeti(co, LUA_REGISTRYINDEX, st->cfg->on_open);
    lx__push_obj(co, st);
    if (!push_req(co, arg)) lua_pushnil(co);
    suspended = lx_call_on(ln, co, co_ref, 2, LX_CONN, c, NULL, "on_open");
  }
  if (suspended) {
    st->waiting = true;
    if (reactor_conn_task(c, lx__ws_resume, NULL))
      reactor_conn_force_close(c, CONN_ERROR);
  }
  if (rest_len && reactor_conn_is_open(c)) lx_stream_data(c, st, rest, rest_len);
}

/* ---- SSE ---- */

lx_stream_t *lx_sse_new(lua_State *L, lx_lane_t *ln, conn_t *c, int opts,
                        const char *last_id, size_t last_len, http_gz_t *gz) {
  lx_stream_t *st = lx__stream_new(ln, c, LX_KIND_SSE);
  if (!st) {
    http_gz_free(gz);
    return NULL;
  }
  st->gz = gz;
  if (last_id) {
    st->last_id = malloc(last_len + 1);
    if (st->last_id) {
      memcpy(st->last_id, last_id, last_len);
      st->last_id[last_len] = 0;
    }
  }
  if (opts) {
    lua_getfield(L, opts, "on_open");
    st->on_open = lua_isfunction(L, -1) ? luaL_ref(L, LUA_REGISTRYINDEX)
                                        : (lua_pop(L, 1), LUA_NOREF);
    lua_getfield(L, opts, "on_close");
    st->on_close = lua_isfunction(L, -1) ? luaL_ref(L, LUA_REGISTRYINDEX)
                                         : (lua_pop(L, 1), LUA_NOREF);
  }
  return st;
}

void lx_sse_set_stream(lx_stream_t *st, int32_t sid) { st->sid = sid; }

typedef struct {
  conn_t *c;
  int32_t sid;
} lx_sse_to_t;

/* Bytes of an SSE stream to its connection, or its HTTP/2 stream. */
static int lx__sse_put(conn_t *c, int32_t sid, const char *p, size_t n) {
  return sid ? http_h2_stream_write(c, sid, p, n) : reactor_conn_write(c, p, n);
}

static int lx__sse_out(void *ctx, const char *p, size_t n) {
  lx_sse_to_t *to = ctx;
  return lx__sse_put(to->c, to->sid, p, n);
}

/* A stream that can't go on is cut: over HTTP/2 the stream alone (the
 * failed write reset it), else its connection. */
static void lx__sse_cut(conn_t *c, lx_stream_t *st) {
  if (st->sid)
    http_h2_stream_end(c, st->sid);
  else
    reactor_conn_force_close(c, CONN_ERROR);
}

/* Writes SSE text to c: as it is, or through the stream's gzip stream
 * (flushed, so the event reaches the client at once). A stream cut in
 * the middle of a compressed piece can't go on: the connection closes. */
static int lx__sse_write(conn_t *c, lx_stream_t *st, const char *text,
                         size_t len) {
  if (!st->gz) return lx__sse_put(c, st->sid, text, len);
  size_t in0, out0, in1, out1;
  http_gz_counts(st->gz, &in0, &out0);
  lx_sse_to_t to = {c, st->sid};
  int rc = http_gz_push(st->gz, text, len, false, lx__sse_out, &to);
  http_gz_counts(st->gz, &in1, &out1);
  stats_add(st->ln->stats, STAT_HTTP_COMP_IN, in1 - in0);
  stats_add(st->ln->stats, STAT_HTTP_COMP_OUT, out1 - out0);
  if (rc) lx__sse_cut(c, st);
  return rc;
}

static void lx__sse_open(conn_t *c, void *arg) {
  if (!c) return;
  lx_stream_t *st = lx__stream_at(c, (int32_t)(intptr_t)arg);
  if (!st || st->kind != LX_KIND_SSE || st->on_open == LUA_NOREF) return;
  lx_lane_t *ln = st->ln;
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, st->on_open);
  lx__push_obj(co, st);
  /* an HTTP/2 event stream's callback holds the loop, not the
   * connection, which carries other streams */
  lx_call_on(ln, co, co_ref, 1, st->sid ? LX_PLAIN : LX_CONN,
             st->sid ? NULL : c, NULL, "on_open");
}

void lx_sse_begin(conn_t *c, lx_stream_t *st) {
  if (st->on_open != LUA_NOREF &&
      reactor_conn_task(c, lx__sse_open, (void *)(intptr_t)st->sid))
    lx__sse_cut(c, st);
}

/* ---- forwarding subscriptions ---- */

/* One framed message per kind and dispatch (http_frame_t): every
 * subscriber's write queue holds a reference, so a fan-out to N
 * subscribers builds the frame once and copies nothing per subscriber. */

/* The message as a frame for a stream of `kind`, with the dispatch's
 * reference; NULL when out of memory. */
static lx_frame_t *lx__frame_new(lx_fwd_ctx_t *fc, int kind) {
  pubsub_msg_t *m = fc->m;
  const char *body = pubsub_msg_body(m);
  if (kind != LX_KIND_WS) return http_frame_sse(body, m->mlen);
  if (fc->text < 0) fc->text = ws_utf8_valid(body, m->mlen);
  return http_frame_ws(body, m->mlen, fc->text);
}

/* A message to a subscriber that agreed permessage-deflate. Without
 * server context takeover the deflated frame is made once per dispatch
 * (and window bits and level) and shared by reference like the plain
 * one; with it, the connection's own stream deflates it for it alone. */
static void lx__fwd_deflated(conn_t *c, lx_stream_t *st, lx_fwd_ctx_t *fc) {
  pubsub_msg_t *m = fc->m;
  const char *body = pubsub_msg_body(m);
  if (fc->text < 0) fc->text = ws_utf8_valid(body, m->mlen);
  int op = (fc->text ? WS_TEXT : WS_BINARY) | WS_RSV1;
  int bits = ws_z_send_bits(st->z), level = st->cfg->pmd.level;
  bool alone = ws_z_send_alone(st->z);
  lx_frame_t *f = NULL;
  if (alone && fc->zframe && fc->zbits == bits && fc->zlevel == level) {
    f = fc->zframe;
  } else {
    size_t zn;
    char *z = lx__ws_deflate(st, body, m->mlen, 0, &zn);
    f = z ? http_frame_ws_op(z, zn, op) : NULL;
    free(z);
    if (f && alone && !fc->zframe) { /* the dispatch's, for the others */
      fc->zframe = f;
      fc->zbits = bits;
      fc->zlevel = level;
    }
  }
  if (!f) {
    log_error("pub/sub: out of memory; a client that missed a message is "
              "disconnected");
    reactor_conn_force_close(c, CONN_ERROR);
    return;
  }
  http_frame_send(c, f);
  if (f != fc->zframe) http_frame_unref(f); /* only the queue's is left */
}

static void lx__fwd(lx_lane_t *ln, conn_t *c, int32_t sid, lx_fwd_ctx_t *fc) {
  (void)ln;
  lx_stream_t *st = lx__stream_at(c, sid);
  if (!st || (st->kind == LX_KIND_WS && st->close_sent)) return;
  if (st->gz) { /* its own gzip stream: the plain text, deflated for it */
    pubsub_msg_t *m = fc->m;
    size_t len;
    char *text =
        http_sse_event(pubsub_msg_body(m), m->mlen, NULL, 0, NULL, 0, 0, &len);
    if (!text)
      lx__sse_cut(c, st); /* a cut, not a gap */
    else
      lx__sse_write(c, st, text, len); /* cuts the stream if it fails */
    free(text);
    return;
  }
  if (st->z && fc->m->mlen >= st->z_threshold) {
    lx__fwd_deflated(c, st, fc);
    return;
  }
  int i = st->kind == LX_KIND_WS ? 0 : 1;
  if (!fc->frame[i]) fc->frame[i] = lx__frame_new(fc, st->kind);
  lx_frame_t *f = fc->frame[i];
  if (!f) {
    /* A gap in the stream would be worse than a cut. */
    log_error("pub/sub: out of memory; a client that missed a message is "
              "disconnected");
    lx__sse_cut(c, st);
    return;
  }
  if (st->sid) /* copied into the stream's buffer (a reset past its cap) */
    http_h2_stream_write(c, st->sid, f->data, f->len);
  else
    http_frame_send(c, f);
}

/* ---- the Lua objects ---- */

/* The stream of a method's object, and its connection; NULL once closed. */
static lx_stream_t *lx__stream(lua_State *L, conn_t **cp) {
  lx_stream_ud_t *ud = lx_check_self(L, "websocket or sse object");
  conn_t *c = ud->uuid ? reactor_conn_find(lx__ln(L)->r, ud->uuid) : NULL;
  lx_stream_t *st = c ? lx__stream_at(c, ud->sid) : NULL;
  if (st && st->kind != ud->kind) st = NULL;
  *cp = st ? c : NULL;
  return st;
}

static int lx_ws_send(lua_State *L) {
  conn_t *c;
  lx_stream_t *st = lx__stream(L, &c);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  int op;
  if (lua_isnoneornil(L, 3)) {
    op = ws_utf8_valid(p, n) ? WS_TEXT : WS_BINARY;
  } else {
    op = lua_toboolean(L, 3) ? WS_TEXT : WS_BINARY;
    if (op == WS_TEXT && !ws_utf8_valid(p, n))
      return luaL_argerror(L, 2, "a text message must be UTF-8");
  }
  if (!st || st->close_sent) return lx_push_fail(L, -EPIPE);
  size_t zn;
  char *z = lx__ws_deflate(st, p, n, 0, &zn);
  int rc = !z                     ? lx__ws_frame(c, op, p, n, L, 2, st->ln)
           : zn <= HTTP_WS_INLINE ? http_ws_send(c, op | WS_RSV1, z, zn)
                                  : http_ws_send_ref(c, op | WS_RSV1, z, zn,
                                                     lx__free_release, z, NULL);
  if (z && zn <= HTTP_WS_INLINE) free(z);
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int lx_ws_close(lua_State *L) {
  conn_t *c;
  lx_stream_t *st = lx__stream(L, &c);
  lua_Integer code = luaL_optinteger(L, 2, WS_CLOSE_NORMAL);
  size_t rl = 0;
  const char *reason = luaL_optlstring(L, 3, "", &rl);
  if (!((code >= 3000 && code <= 4999) || code == 1000 || code == 1001 ||
        (code >= 1007 && code <= 1014) || code == 1002 || code == 1003))
    return luaL_argerror(L, 2, "a close code: 1000-1003, 1007-1014 or 3000-4999");
  if (rl > 123 || !ws_utf8_valid(reason, rl))
    return luaL_argerror(L, 3, "a reason of at most 123 bytes of UTF-8");
  if (!st || st->close_sent) return 0;
  lx__ws_send_close(c, st, (int)code, reason, rl);
  st->reason_len = rl;
  memcpy(st->reason, reason, rl);
  reactor_conn_set_timeout(c, LX_WS_CLOSE_WAIT_MS);
  st->close_by = reactor_now(st->ln->r) + LX_WS_CLOSE_WAIT_MS;
  return 0;
}

static int lx_sse_send(lua_State *L) {
  conn_t *c;
  lx_stream_t *st = lx__stream(L, &c);
  size_t n, evl = 0, idl = 0;
  const char *p = luaL_checklstring(L, 2, &n);
  const char *ev = luaL_optlstring(L, 3, NULL, &evl);
  const char *id = NULL;
  if (!lua_isnoneornil(L, 4)) {
    if (lua_type(L, 4) == LUA_TNUMBER) lua_tostring(L, 4);
    id = luaL_checklstring(L, 4, &idl);
  }
  if (ev && (memchr(ev, '\n', evl) || memchr(ev, '\r', evl)))
    return luaL_argerror(L, 3, "an event name can't hold CR or LF");
  if (id && (memchr(id, '\n', idl) || memchr(id, '\r', idl) || memchr(id, 0, idl)))
    return luaL_argerror(L, 4, "an id can't hold CR, LF or NUL");
  if (!st) return lx_push_fail(L, -EPIPE);
  size_t len;
  char *text = http_sse_event(p, n, ev, evl, id, idl, 0, &len);
  if (!text) return luaL_error(L, "out of memory");
  int rc = lx__sse_write(c, st, text, len);
  free(text);
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int lx_sse_close(lua_State *L) {
  conn_t *c;
  lx_stream_t *st = lx__stream(L, &c);
  if (st && st->sid)
    http_h2_stream_end(c, st->sid); /* the stream ends, not its connection */
  else if (st)
    reactor_conn_close(c, CONN_LOCAL);
  return 0;
}

static int lx_sse_last_event_id(lua_State *L) {
  conn_t *c;
  lx_stream_t *st = lx__stream(L, &c);
  if (st && st->last_id) lua_pushstring(L, st->last_id);
  else lua_pushnil(L);
  return 1;
}

static int lx_stream_subscribe(lua_State *L) {
  conn_t *c;
  lx_stream_t *st = lx__stream(L, &c);
  if (!st) return lx_push_fail(L, -EPIPE);
  return lx_subscribe_stream(L, lx__ln(L), 2, st->uuid, st->sid, lx__fwd);
}

static int lx_stream_peer(lua_State *L) {
  conn_t *c;
  lx__stream(L, &c);
  return lx_push_peer(L, c);
}

/* ws:tls(), sse:tls(): as conn:tls() (nil over plain HTTP, or closed). */
static int lx_stream_tls(lua_State *L) {
  conn_t *c;
  lx__stream(L, &c);
  return lx_tls_push_info(L, c);
}

static int lx_stream_id(lua_State *L) {
  lx_stream_ud_t *ud = lx_check_self(L, "websocket or sse object");
  lua_pushnumber(L, (lua_Number)ud->uuid);
  return 1;
}

static int lx_stream_uid(lua_State *L) {
  lx_stream_ud_t *ud = lx_check_self(L, "websocket or sse object");
  lx_push_uid(L, lx__ln(L)->srv, ud->uuid);
  return 1;
}

static int lx_stream_is_open(lua_State *L) {
  conn_t *c;
  lx_stream_t *st = lx__stream(L, &c);
  lua_pushboolean(L, st && reactor_conn_is_open(c) &&
                         !(st->kind == LX_KIND_WS && st->close_sent));
  return 1;
}

static int lx_stream_pending(lua_State *L) {
  conn_t *c;
  lx_stream_t *st = lx__stream(L, &c);
  lua_pushnumber(L, !c        ? 0
                    : st->sid ? (lua_Number)http_h2_stream_buffered(c, st->sid)
                              : (lua_Number)reactor_conn_pending_ready(c));
  return 1;
}

static int lx_stream_tostring(lua_State *L) {
  lx_stream_ud_t *ud = lua_touserdata(L, 1);
  lua_pushfstring(L, "moonport.%s(%f)", ud->kind == LX_KIND_WS ? "websocket" : "sse",
                  (lua_Number)ud->uuid);
  return 1;
}

static const luaL_Reg lx_ws_methods[] = {
    {"send", lx_ws_send},           {"close", lx_ws_close},
    {"subscribe", lx_stream_subscribe}, {"peer", lx_stream_peer},
    {"id", lx_stream_id}, {"uid", lx_stream_uid},           {"is_open", lx_stream_is_open},
    {"pending", lx_stream_pending}, {"tls", lx_stream_tls}, {NULL, NULL}};

static const luaL_Reg lx_sse_methods[] = {
    {"send", lx_sse_send},
    {"close", lx_sse_close},
    {"subscribe", lx_stream_subscribe},
    {"last_event_id", lx_sse_last_event_id},
    {"peer", lx_stream_peer},
    {"id", lx_stream_id}, {"uid", lx_stream_uid},
    {"is_open", lx_stream_is_open},
    {"pending", lx_stream_pending},
    {"tls", lx_stream_tls},
    {NULL, NULL}};

void lx_ws_open(lua_State *L, lx_lane_t *ln) {
  lx_meta_env(L, ln, LX_WS_MT, lx_ws_methods);
  lua_pushcfunction(L, lx_stream_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  lx_meta_env(L, ln, LX_SSE_MT, lx_sse_methods);
  lua_pushcfunction(L, lx_stream_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
}

/* ---- connection events (from the HTTP server, http/server.h) ---- */

static void lx_stream_ready(conn_t *c, lx_stream_t *st) {
  if (st->kind != LX_KIND_WS || st->cfg->on_ready == LUA_NOREF) return;
  lx_lane_t *ln = st->ln;
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, st->cfg->on_ready);
  lx__push_obj(co, st);
  lx_call_on(ln, co, co_ref, 1, LX_CONN, c, NULL, "on_ready");
}

static void lx_stream_timeout(conn_t *c, lx_stream_t *st) {
  if (st->kind == LX_KIND_SSE) { /* a comment keeps proxies from timing out */
    if (reactor_conn_write(c, ":\n\n", 3) == 0) reactor_conn_set_timeout(c, reactor_conn_timeout(c));
    return;
  }
  if (st->close_sent || st->pinged) { /* no answer to a close or a ping */
    reactor_conn_close(c, CONN_TIMEOUT);
    return;
  }
  st->pinged = true;
  lx__ws_frame(c, WS_PING, NULL, 0, NULL, 0, st->ln);
  reactor_conn_set_timeout(c, reactor_conn_timeout(c));
}

static void lx_stream_shutdown(conn_t *c, lx_stream_t *st) {
  if (st->kind == LX_KIND_WS) {
    static const char why[] = "server shutting down";
    lx__ws_send_close(c, st, WS_CLOSE_GOING_AWAY, why, sizeof(why) - 1);
  }
  reactor_conn_close(c, CONN_SHUTDOWN);
}

static void lx_stream_closed(conn_t *c, lx_stream_t *st, int reason) {
  lx_lane_t *ln = st->ln;
  (void)reason;
  stats_add(ln->stats, st->kind == LX_KIND_WS ? STAT_WS_CLOSED : STAT_SSE_CLOSED, 1);
  /* Only a stream subscribes for its connection: a plain HTTP connection
   * has nothing to cancel and skips this look-up. */
  lx_pubsub_stream_closed(ln, st->uuid, st->sid);
  int on_close = st->kind == LX_KIND_WS ? st->cfg->on_close : st->on_close;
  if (on_close != LUA_NOREF && !ln->closing) {
    int co_ref;
    lua_State *co = lx_co_take(ln, &co_ref);
    lua_rawgeti(co, LUA_REGISTRYINDEX, on_close);
    lx__push_obj(co, st);
    int nargs = 1;
    if (st->kind == LX_KIND_WS) {
      lua_pushinteger(co, st->code);
      lua_pushlstring(co, st->reason, st->reason_len);
      nargs = 3;
    }
    lx_call_on(ln, co, co_ref, nargs, st->sid ? LX_PLAIN : LX_CONN,
               st->sid ? NULL : c, NULL, "on_close");
  }
  luaL_unref(ln->L, LUA_REGISTRYINDEX, st->obj_ref);
  luaL_unref(ln->L, LUA_REGISTRYINDEX, st->on_open);
  luaL_unref(ln->L, LUA_REGISTRYINDEX, st->on_close);
  ws_reader_deinit(&st->rd);
  free(st->in);
  free(st->last_id);
  http_gz_free(st->gz);
  ws_z_free(st->z);
  free(st);
}

/* The stream protocol object the HTTP server calls (http_stream_ops_t). */
static void lx__ops_data(conn_t *c, void *st, const char *d, size_t n) {
  lx_stream_data(c, st, d, n);
}
static void lx__ops_ready(conn_t *c, void *st) { lx_stream_ready(c, st); }
static void lx__ops_timeout(conn_t *c, void *st) { lx_stream_timeout(c, st); }
static void lx__ops_shutdown(conn_t *c, void *st) { lx_stream_shutdown(c, st); }
static void lx__ops_closed(conn_t *c, void *st, int reason) {
  lx_stream_closed(c, st, reason);
}
const http_stream_ops_t lx_stream_ops = {
    .on_data = lx__ops_data,
    .on_ready = lx__ops_ready,
    .on_timeout = lx__ops_timeout,
    .on_shutdown = lx__ops_shutdown,
    .on_closed = lx__ops_closed,
};
