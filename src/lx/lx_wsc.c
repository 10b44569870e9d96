/* SPDX-License-Identifier: MIT */

/* lx_wsc: mp.websocket's primitives over the server's frame code. */
#include "lx/lx_wsc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "http/http1_response.h"
#include "http/ws.h"
#include "http/ws_deflate.h"
#include "lx/lx_embed.h"
#include "lx/lx_ws.h"

#define LX_WSC_READER_MT "moonport.wsc.reader"

/* The 101's head may not be longer than this (a refusal's body is never
 * read: only its status matters). */
#define LX_WSC_MAX_HEAD 16384

/* ---- randomness: masking keys and the handshake key ---- */

/* Random bytes drawn in blocks, so a frame's key costs no system call.
 * Per thread: each lane has its own pool. */
static _Thread_local unsigned char wsc__pool[256];
static _Thread_local size_t wsc__left;

static int wsc__random(unsigned char *out, size_t n) {
  while (n) {
    if (!wsc__left) {
      ssize_t got = getrandom(wsc__pool, sizeof(wsc__pool), 0);
      if (got != (ssize_t)sizeof(wsc__pool)) return -EIO;
      wsc__left = sizeof(wsc__pool);
    }
    size_t take = n < wsc__left ? n : wsc__left;
    memcpy(out, wsc__pool + sizeof(wsc__pool) - wsc__left, take);
    /* a byte handed out is never handed out again */
    memset(wsc__pool + sizeof(wsc__pool) - wsc__left, 0, take);
    wsc__left -= take;
    out += take;
    n -= take;
  }
  return 0;
}

/* core.wsc.key() -> a Sec-WebSocket-Key: 16 random bytes in base64. */
static int lx_wsc_key(lua_State *L) {
  static const char b64[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  unsigned char k[18] = {0};
  if (wsc__random(k, 16) < 0) return luaL_error(L, "mp.websocket: no random bytes");
  char out[24];
  for (int i = 0, o = 0; i < 18; i += 3) {
    uint32_t v = (uint32_t)k[i] << 16 | (uint32_t)k[i + 1] << 8 | k[i + 2];
    out[o++] = b64[v >> 18 & 63];
    out[o++] = b64[v >> 12 & 63];
    out[o++] = b64[v >> 6 & 63];
    out[o++] = b64[v & 63];
  }
  out[22] = out[23] = '='; /* 16 bytes: two of padding */
  lua_pushlstring(L, out, 24);
  return 1;
}

/* core.wsc.accept(key) -> the Sec-WebSocket-Accept a server must answer. */
static int lx_wsc_accept(lua_State *L) {
  size_t n;
  const char *k = luaL_checklstring(L, 1, &n);
  char out[29];
  ws_accept_key(k, n, out);
  lua_pushlstring(L, out, 28);
  return 1;
}

/* core.wsc.frame(opcode, fin, data) -> a masked frame, its key new. */
static int lx_wsc_frame(lua_State *L) {
  int op = (int)luaL_checkinteger(L, 1);
  bool fin = lua_toboolean(L, 2);
  size_t n;
  const char *p = luaL_checklstring(L, 3, &n);
  unsigned char key[4];
  if (wsc__random(key, 4) < 0) return luaL_error(L, "mp.websocket: no random bytes");
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  char head[WS_MAX_HEAD];
  luaL_addlstring(&b, head, ws_frame_head_masked(head, op, fin, n, key));
  /* the payload masked in pieces of the Lua buffer's size; each piece
   * starts at a multiple of 4 bytes, so the key lines up */
  size_t off = 0;
  while (off < n) {
    char *dst = luaL_prepbuffer(&b);
    size_t take = n - off < LUAL_BUFFERSIZE ? n - off : LUAL_BUFFERSIZE & ~(size_t)3;
    memcpy(dst, p + off, take);
    ws_mask(dst, take, key);
    luaL_addsize(&b, take);
    off += take;
  }
  luaL_pushresult(&b);
  return 1;
}

/* core.wsc.utf8(s) -> whether s is UTF-8 (what ws:send sends as text). */
static int lx_wsc_utf8(lua_State *L) {
  size_t n;
  const char *p = luaL_checklstring(L, 1, &n);
  lua_pushboolean(L, ws_utf8_valid(p, n));
  return 1;
}

/* core.wsc.response(bytes) -> nil while the head is not whole; the head's
 * length, the status and the headers (lower-case names, the first of
 * each) once it is; or false, err for a head that can't be one. */
static int lx_wsc_response(lua_State *L) {
  size_t n;
  const char *p = luaL_checklstring(L, 1, &n);
  http_response_t res;
  int rc = http_parse_response(p, n, LX_WSC_MAX_HEAD, false, &res);
  if (rc == HTTP_RES_INCOMPLETE) return 0;
  if (rc < 0) {
    lua_pushboolean(L, 0);
    lua_pushstring(L, rc == HTTP_RES_TOO_LARGE ? "handshake: response head too large"
                                               : "handshake: malformed response");
    return 2;
  }
  lua_pushinteger(L, rc);
  lua_pushinteger(L, res.status);
  lua_createtable(L, 0, res.nheaders);
  for (int i = 0; i < res.nheaders; i++) {
    const http_header_t *h = &res.headers[i];
    char name[256];
    if (h->name_len >= sizeof(name)) continue;
    for (uint32_t j = 0; j < h->name_len; j++) {
      char c = h->name[j];
      name[j] = (char)(c >= 'A' && c <= 'Z' ? c + 32 : c);
    }
    lua_pushlstring(L, name, h->name_len);
    lua_pushvalue(L, -1);
    lua_rawget(L, -3);
    bool seen = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (seen) {
      lua_pop(L, 1);
      continue;
    }
    lua_pushlstring(L, h->value, h->value_len);
    lua_rawset(L, -3);
  }
  return 3;
}

/* ---- the reader: a server's frames into messages ---- */

typedef struct {
  ws_reader_t r;
  char *buf; /* bytes of a frame not whole yet */
  size_t len, cap;
  int failed; /* the close code it failed with, or 0 */
  /* permessage-deflate: offered (compress), then agreed (z, owned) */
  bool compress;
  ws_pmd_cfg_t pmd;
  ws_z_t *z;
} lx_wsc_reader_t;

/* core.wsc.reader(max_msg [, compress]) -> a reader; compress: true or
 * the table of mp.websocket's compress (raises on a bad one). */
static int lx_wsc_reader(lua_State *L) {
  lua_Number max = luaL_checknumber(L, 1);
  if (!(max >= 1 && max <= (lua_Number)(1u << 30)))
    return luaL_argerror(L, 1, "max_msg must be 1 to 2^30");
  lua_settop(L, 2);
  lua_createtable(L, 0, 1); /* { compress = arg 2 }, for the option reader */
  lua_pushvalue(L, 2);
  lua_setfield(L, -2, "compress");
  ws_pmd_cfg_t pmd;
  bool on = lx_ws_compress_opts(L, 3, &pmd); /* before anything is held */
  /* a client asks no server_no_context_takeover unless told to: npm ws
   * refuses the whole handshake when it is asked and not configured to
   * (browsers offer the same: "permessage-deflate; client_max_window_bits") */
  bool snc = false;
  if (lua_type(L, 2) == LUA_TTABLE) {
    lua_getfield(L, 2, "server_no_context_takeover");
    snc = lua_toboolean(L, -1);
    lua_pop(L, 1);
  }
  pmd.want.server_no_ctx = snc;
  lx_wsc_reader_t *rd = lua_newuserdata(L, sizeof(*rd));
  memset(rd, 0, sizeof(*rd));
  ws_reader_init(&rd->r, (size_t)max, false);
  rd->compress = on;
  rd->pmd = pmd;
  luaL_getmetatable(L, LX_WSC_READER_MT);
  lua_setmetatable(L, -2);
  return 1;
}

/* reader:offer() -> the Sec-WebSocket-Extensions value to send, or nil. */
static int lx_wsc_offer(lua_State *L) {
  lx_wsc_reader_t *rd = luaL_checkudata(L, 1, LX_WSC_READER_MT);
  char buf[192];
  size_t n = rd->compress ? ws_pmd_offer(&rd->pmd, buf, sizeof(buf)) : 0;
  if (!n) return 0;
  lua_pushlstring(L, buf, n);
  return 1;
}

/* reader:agree(value or nil) -> true (agreed), false (no extension), or
 * nil, err: the server answered what was not offered (the client fails
 * the connection, RFC 7692 5). */
static int lx_wsc_agree(lua_State *L) {
  lx_wsc_reader_t *rd = luaL_checkudata(L, 1, LX_WSC_READER_MT);
  size_t n = 0;
  const char *v = luaL_optlstring(L, 2, NULL, &n);
  if (!v) {
    lua_pushboolean(L, 0);
    return 1;
  }
  ws_pmd_t p;
  int rc = rd->compress ? ws_pmd_agreed(&rd->pmd, v, n, &p) : -1;
  if (rc < 0) {
    lua_pushnil(L);
    lua_pushstring(L, rd->compress
                          ? "handshake: the server answered an extension "
                            "that was not offered (or broke its rules)"
                          : "handshake: the server chose an extension, none "
                            "was offered");
    return 2;
  }
  if (rc > 0 && !rd->z) {
    if (!(rd->z = ws_z_new(&p, false, rd->pmd.level)))
      return luaL_error(L, "mp.websocket: out of memory");
    rd->r.z = rd->z;
  }
  lua_pushboolean(L, rc > 0);
  return 1;
}

/* reader:deflate(data) -> the message deflated (for a frame with RSV1),
 * or nil when it goes plain (not agreed, or under the threshold). */
static int lx_wsc_deflate(lua_State *L) {
  lx_wsc_reader_t *rd = luaL_checkudata(L, 1, LX_WSC_READER_MT);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  if (!rd->z || n < rd->pmd.threshold) return 0;
  size_t zn;
  char *z = ws_z_deflate(rd->z, p, n, 0, &zn);
  if (!z) return luaL_error(L, "mp.websocket: out of memory");
  lua_pushlstring(L, z, zn);
  free(z);
  return 1;
}

static int lx_wsc_reader_gc(lua_State *L) {
  lx_wsc_reader_t *rd = luaL_checkudata(L, 1, LX_WSC_READER_MT);
  ws_z_free(rd->z);
  rd->z = NULL;
  rd->r.z = NULL;
  ws_reader_deinit(&rd->r);
  free(rd->buf);
  rd->buf = NULL;
  rd->len = rd->cap = 0;
  return 0;
}

/* reader:feed(bytes) -> events, code. `events` is a flat list of
 * (opcode, data, close code) triples for what became whole, in order;
 * `code` is nil, or the close code (1002, 1007, 1009, 1011) the
 * connection must fail with after those events: a masked frame (only a
 * client masks), a malformed one, text not UTF-8, a message over max_msg.
 * Once failed, a reader takes nothing more. The bytes kept between calls
 * are at most one frame: a data frame's head over max_msg fails at once. */
static int lx_wsc_feed(lua_State *L) {
  lx_wsc_reader_t *rd = luaL_checkudata(L, 1, LX_WSC_READER_MT);
  size_t n;
  const char *in = luaL_checklstring(L, 2, &n);
  lua_newtable(L);
  if (rd->failed) {
    lua_pushinteger(L, rd->failed);
    return 2;
  }
  if (rd->len + n > rd->cap) {
    size_t cap = rd->cap ? rd->cap : 4096;
    while (cap < rd->len + n) cap *= 2;
    char *b = realloc(rd->buf, cap);
    if (!b) return luaL_error(L, "mp.websocket: out of memory");
    rd->buf = b;
    rd->cap = cap;
  }
  if (n) memcpy(rd->buf + rd->len, in, n);
  rd->len += n;
  size_t off = 0;
  int k = 0;
  while (off < rd->len) {
    if (rd->len - off >= 2 && ((unsigned char)rd->buf[off + 1] & 0x80)) {
      rd->failed = WS_CLOSE_PROTOCOL;
      break;
    }
    ws_event_t ev;
    ssize_t used = ws_read(&rd->r, rd->buf + off, rd->len - off, &ev);
    if (used == 0) break;
    if (used < 0) {
      rd->failed = used == -ENOMEM ? WS_CLOSE_ERROR : (int)-used;
      break;
    }
    off += (size_t)used;
    if (!ev.opcode) continue;
    lua_pushinteger(L, ev.opcode);
    lua_rawseti(L, -2, ++k);
    lua_pushlstring(L, ev.data ? ev.data : "", ev.len);
    lua_rawseti(L, -2, ++k);
    lua_pushinteger(L, ev.code);
    lua_rawseti(L, -2, ++k);
  }
  if (rd->failed) {
    rd->len = 0;
    lua_pushinteger(L, rd->failed);
    return 2;
  }
  memmove(rd->buf, rd->buf + off, rd->len - off);
  rd->len -= off;
  /* a long frame's buffer goes once it has been read */
  if (rd->len == 0 && rd->cap > 65536) {
    free(rd->buf);
    rd->buf = NULL;
    rd->cap = 0;
  }
  return 1;
}

void lx_wsc_open(lua_State *L, lx_lane_t *ln) {
  (void)ln;
  luaL_newmetatable(L, LX_WSC_READER_MT);
  lua_pushcfunction(L, lx_wsc_reader_gc);
  lua_setfield(L, -2, "__gc");
  lua_newtable(L);
  lua_pushcfunction(L, lx_wsc_feed);
  lua_setfield(L, -2, "feed");
  lua_pushcfunction(L, lx_wsc_offer);
  lua_setfield(L, -2, "offer");
  lua_pushcfunction(L, lx_wsc_agree);
  lua_setfield(L, -2, "agree");
  lua_pushcfunction(L, lx_wsc_deflate);
  lua_setfield(L, -2, "deflate");
  lua_setfield(L, -2, "__index");
  lua_pop(L, 1);
  lx_embed_core_table(L, "wsc");
  static const luaL_Reg fns[] = {{"key", lx_wsc_key},
                                 {"accept", lx_wsc_accept},
                                 {"frame", lx_wsc_frame},
                                 {"utf8", lx_wsc_utf8},
                                 {"response", lx_wsc_response},
                                 {"reader", lx_wsc_reader},
                                 {NULL, NULL}};
  for (const luaL_Reg *r = fns; r->name; r++) {
    lua_pushcfunction(L, r->func);
    lua_setfield(L, -2, r->name);
  }
  lua_pop(L, 1);
  lx_require(L, "moonport.websocket");
  lua_getfield(L, -1, "connect");
  lua_remove(L, -2);
  lua_setfield(L, -2, "websocket");
}
