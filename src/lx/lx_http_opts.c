/* SPDX-License-Identifier: MIT */

/* lx_http_opts: mp.http's options (limits, the public folder, status,
 * error pages, compress, HTTP/2) read into a service and its
 * lx_http_cfg_t, checked before anything is held. lx_http.c adds the
 * hooks that run Lua. Lane thread. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "http/compress.h"
#include "http/public.h"
#include "http/server.h"
#include "lx/lx_conn.h"
#include "lx/lx_http_int.h"
#include "lx/lx_lane.h"
#include "lx/lx_server.h"
#include "lx/lx_ws.h"

static void lx__pages_free(http_page_t *pages) {
  if (!pages) return;
  for (int i = 0; i < 200; i++) free(pages[i].body);
  free(pages);
}

/* The error pages lua/moonport/http.lua prepared from error_pages (opts
 * _pages: { [status] = { body =, type = } }, checked there), or NULL.
 * Doesn't raise; NULL also when out of memory (then C's texts answer). */
static http_page_t *lx__pages(lua_State *L, int idx) {
  lua_getfield(L, idx, "_pages");
  if (!lua_istable(L, -1)) {
    lua_pop(L, 1);
    return NULL;
  }
  http_page_t *pages = calloc(200, sizeof(*pages));
  for (int st = 400; pages && st < 600; st++) {
    lua_rawgeti(L, -1, st);
    if (lua_istable(L, -1)) {
      size_t bl, tl;
      lua_getfield(L, -1, "body");
      lua_getfield(L, -2, "type");
      const char *b =
          lua_type(L, -2) == LUA_TSTRING ? lua_tolstring(L, -2, &bl) : NULL;
      const char *t =
          lua_type(L, -1) == LUA_TSTRING ? lua_tolstring(L, -1, &tl) : NULL;
      http_page_t *pg = &pages[st - 400];
      if (b && t && tl < sizeof(pg->type) && lx_http_header_ok(t, tl, false) &&
          (pg->body = malloc(bl ? bl : 1))) {
        memcpy(pg->body, b, bl);
        pg->len = bl;
        memcpy(pg->type, t, tl);
        pg->type[tl] = 0;
      }
      lua_pop(L, 2);
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  return pages;
}

static void lx__cfg_free(lx_service_t *s) {
  lx_http_cfg_t *cfg = s->ext;
  if (!cfg) return;
  lx__pages_free((http_page_t *)cfg->srv.pages);
  luaL_unref(s->ln->L, LUA_REGISTRYINDEX, cfg->on_request);
  for (int i = 0; i < 2; i++)
    if (cfg->vkey[i]) luaL_unref(s->ln->L, LUA_REGISTRYINDEX, cfg->vref[i]);
  lx_ws_cfg_free(s->ln->L, cfg->ws);
  if (cfg->srv.public_fd >= 0) close(cfg->srv.public_fd);
  free(cfg);
  s->ext = NULL;
}

static lua_Number lx__opt(lua_State *L, int idx, const char *name,
                          lua_Number def, lua_Number min, lua_Number max) {
  lua_getfield(L, idx, name);
  lua_Number v = def;
  if (!lua_isnil(L, -1)) {
    if (lua_type(L, -1) != LUA_TNUMBER)
      luaL_error(L, "mp.http: %s must be a number (got %s)", name,
                 luaL_typename(L, -1));
    v = lua_tonumber(L, -1);
    if (v < min || v > max)
      luaL_error(L, "mp.http: %s out of range (%g not in %g..%g)", name, v, min,
                 max);
  }
  lua_pop(L, 1);
  return v;
}

/* mp.http's compress = true | { level =, min_size =, brotli =, types =,
 * file_max =, cache = } into *cfg; false when it is off. Raises on a bad one.
 */
static bool lx__compress_opts(lua_State *L, int idx, http_compress_cfg_t *cfg) {
  http_compress_cfg_init(cfg);
  lua_getfield(L, idx, "compress");
  int t = lua_type(L, -1);
  if (t == LUA_TNIL || (t == LUA_TBOOLEAN && !lua_toboolean(L, -1))) {
    lua_pop(L, 1);
    return false;
  }
  if (t == LUA_TBOOLEAN) {
    lua_pop(L, 1);
    return true;
  }
  if (t != LUA_TTABLE)
    luaL_error(L, "mp.http: compress must be true or a table (got %s)",
               luaL_typename(L, -1));
  int ct = lua_gettop(L);
  cfg->level = (int)lx__opt(L, ct, "level", 5, 1, 9);
  cfg->min_size = (size_t)lx__opt(L, ct, "min_size", 1024, 0, 1 << 30);
  cfg->file_max = (size_t)lx__opt(L, ct, "file_max", 8 << 20, 0,
                                  (lua_Number)((size_t)1 << 40));
  cfg->cache = (size_t)lx__opt(L, ct, "cache", 4 << 20, 0,
                               (lua_Number)((size_t)1 << 34));
  lua_getfield(L, ct, "brotli");
  if (!lua_isnil(L, -1)) cfg->brotli = lua_toboolean(L, -1);
  lua_pop(L, 1);
  lua_getfield(L, ct, "types");
  if (!lua_isnil(L, -1)) {
    if (!lua_istable(L, -1))
      luaL_error(L, "mp.http: compress.types must be a list of media types");
    int n = (int)lua_objlen(L, -1);
    if (n > HTTP_COMPRESS_TYPES_MAX)
      luaL_error(L, "mp.http: compress.types holds at most %d types",
                 HTTP_COMPRESS_TYPES_MAX);
    cfg->ntypes = 0;
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -1, i);
      size_t tl;
      const char *ty = lua_tolstring(L, -1, &tl);
      if (lua_type(L, -1) != LUA_TSTRING || tl == 0 ||
          tl >= HTTP_COMPRESS_TYPE_LEN || !memchr(ty, '/', tl))
        luaL_error(L,
                   "mp.http: compress.types[%d] must be a media type such "
                   "as \"text/html\" or \"text/*\"",
                   i);
      memcpy(cfg->types[cfg->ntypes], ty, tl);
      cfg->types[cfg->ntypes][tl] = 0;
      cfg->ntypes++;
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 2);
  return true;
}

/* Opens the public folder named at opts[idx].public once, at mp.http
 * time (http_public_open). Raises on failure. */
static int lx__static_root(lua_State *L, int idx) {
  lua_getfield(L, idx, "public");
  const char *dir = lx_script_path(L, lua_tostring(L, -1));
  const char *step = "open";
  char buf[128];
  int fd = http_public_open(dir, &step);
  if (fd < 0 && strcmp(step, "open") == 0)
    luaL_error(L, "mp.http: public folder \"%s\": %s", dir,
               strerror_r(-fd, buf, sizeof(buf)));
  if (fd < 0)
    luaL_error(L,
               "mp.http: public folder \"%s\": openat2(2) fails (%s); "
               "static files need Linux 5.6 or later",
               dir, strerror_r(-fd, buf, sizeof(buf)));
  lua_pop(L, 1);
  return fd;
}

/* Reads mp.http's options at opts[idx] into a new service with its
 * lx_http_cfg_t (s->ext); the caller adds the hooks and links it. Raises
 * on a bad option, holding nothing then. */
lx_service_t *lx_http_service_new(lua_State *L, lx_lane_t *ln, int idx) {
  lua_getfield(L, idx, "public");
  if (!lua_isnil(L, -1) && lua_type(L, -1) != LUA_TSTRING)
    luaL_error(L, "mp.http: public must be a string (got %s)",
               luaL_typename(L, -1));
  bool has_public = !lua_isnil(L, -1);
  lua_getfield(L, idx, "public_prefix");
  size_t prefix_len = 0;
  const char *prefix = lua_tolstring(L, -1, &prefix_len);
  if (!lua_isnil(L, -1) &&
      (lua_type(L, -1) != LUA_TSTRING || prefix_len == 0 || prefix[0] != '/' ||
       prefix_len >= sizeof(((http_server_t *)0)->public_prefix) ||
       !has_public))
    luaL_error(L, "mp.http: public_prefix must be a path that starts with / "
                  "(under 128 bytes), given with public");
  char prefix_copy[128] = {0};
  if (prefix) memcpy(prefix_copy, prefix, prefix_len);
  lua_pop(L, 1);
  lua_getfield(L, idx, "status");
  /* status = { path =, allow = fn }: answered in Lua (lx__status_guard)
   * after allow(req) says yes, not from C before on_request */
  bool status_guard = false;
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "allow");
    status_guard = !lua_isnil(L, -1);
    if (status_guard && !lua_isfunction(L, -1))
      luaL_error(L, "mp.http: status.allow must be a function");
    lua_pop(L, 1);
    lua_getfield(L, -1, "path");
    lua_replace(L, -2);
  }
  size_t status_len = 0;
  const char *status = lua_tolstring(L, -1, &status_len);
  if (!lua_isnil(L, -1) &&
      (lua_type(L, -1) != LUA_TSTRING || status_len == 0 || status[0] != '/' ||
       status_len >= sizeof(((http_server_t *)0)->status_path)))
    luaL_error(L, "mp.http: status must be a path that starts with / (under "
                  "128 bytes)");
  char status_copy[128] = {0};
  if (status && !status_guard) memcpy(status_copy, status, status_len);
  if (status_guard && !status)
    luaL_error(L, "mp.http: status = { path =, allow = } needs a path");
  lua_pop(L, 1);
  lua_getfield(L, idx, "on_request");
  lua_getfield(L, idx, "websocket");
  bool has_ws = !lua_isnil(L, -1);
  if (!lx_is_callable(L, -2) &&
      !(lua_isnil(L, -2) && (has_public || has_ws || status_guard)))
    luaL_error(L, "mp.http: on_request must be a function or a router (got %s)",
               luaL_typename(L, -2));
  if (has_ws) lx_ws_cfg_check(L, -1); /* raises now, while nothing is held */
  lua_pop(L, 3);
  lua_getfield(L, idx, "stream_body");
  bool stream_body = lua_toboolean(L, -1);
  lua_getfield(L, idx, "http2");
  bool http2 = lua_isnil(L, -1) || lua_toboolean(L, -1);
  lua_getfield(L, idx, "h2c");
  bool h2c = lua_toboolean(L, -1);
  lua_pop(L, 3);
  lua_Number max_streams =
      lx__opt(L, idx, "max_concurrent_streams", 100, 1, 10000);
  lua_Number max_header = lx__opt(L, idx, "max_header", 8192, 256, 1 << 20);
  lua_Number max_body =
      lx__opt(L, idx, "max_body", 1 << 20, 0, (lua_Number)(1ull << 32));
  lua_Number header_timeout = lx__opt(L, idx, "header_timeout", 10, 0.01, 3600);
  lua_Number idle = lx__opt(L, idx, "timeout", 40, 0, 4e6);
  lua_Number limit =
      lx__opt(L, idx, "write_limit", (lua_Number)REACTOR_DEFAULT_WRITE_LIMIT,
              1024, (lua_Number)((size_t)1 << 40));
  lua_Number max_queue =
      lx__opt(L, idx, "max_queue", (lua_Number)REACTOR_DEFAULT_MAX_QUEUE, 1024,
              (lua_Number)((size_t)1 << 40));
  http_compress_cfg_t comp;
  bool compress = lx__compress_opts(L, idx, &comp);
  /* last: nothing may raise once the folder is open */
  int public_fd = has_public ? lx__static_root(L, idx) : -1;
  lx_ws_cfg_t *ws = NULL; /* checked above: only out of memory raises */
  if (has_ws) {
    lua_getfield(L, idx, "websocket");
    ws = lx_ws_cfg_new(L, -1);
    lua_pop(L, 1);
  }
  http_page_t *pages = lx__pages(L, idx);
  lx_service_t *s = calloc(1, sizeof(*s));
  lx_http_cfg_t *cfg = calloc(1, sizeof(*cfg));
  if (!s || !cfg) {
    free(s);
    free(cfg);
    lx__pages_free(pages);
    lx_ws_cfg_free(L, ws);
    if (public_fd >= 0) close(public_fd);
    luaL_error(L, "out of memory");
  }
  s->ln = ln;
  s->on_open = s->on_data = s->on_ready = s->on_timeout = s->on_shutdown =
      s->on_close = s->on_fail = s->on_connect = LUA_NOREF;
  s->opts.timeout_ms = (uint32_t)(header_timeout * 1000);
  s->opts.write_limit = (size_t)limit;
  s->opts.max_queue = (size_t)max_queue;
  http_server_t *hs = &cfg->srv;
  hs->r = ln->r;
  hs->max_header = (size_t)max_header;
  hs->max_body = (size_t)max_body;
  hs->header_timeout_ms = (uint32_t)(header_timeout * 1000);
  hs->idle_ms = (uint32_t)(idle * 1000);
  hs->stream_body = stream_body;
  hs->h2c = h2c;
  hs->h2_max_streams = (uint32_t)max_streams;
  hs->public_fd = public_fd;
  hs->on_before = public_fd >= 0 ? http_public_answer : NULL;
  memcpy(hs->public_prefix, prefix_copy, sizeof(prefix_copy));
  hs->public_prefix_len = prefix ? prefix_len : 0;
  memcpy(hs->status_path, status_copy, sizeof(status_copy));
  hs->status_len = status && !status_guard ? status_len : 0;
  hs->access_fd = &ln->srv->access_fd;
  hs->stats = ln->stats;
  hs->pages = pages;
  hs->app = s;
  lua_getfield(L, idx, "on_request");
  if (status_guard) { /* on_request behind moonport.http's status_guard */
    lua_getglobal(L, "require");
    lua_pushliteral(L, "moonport.http");
    lua_call(L, 1, 1);
    lua_getfield(L, -1, "status_guard");
    lua_getfield(L, idx, "status");
    lua_getfield(L, -1, "path");
    lua_getfield(L, -2, "allow");
    lua_remove(L, -3);
    lua_pushvalue(L, -5); /* on_request, or nil */
    lua_call(L, 3, 1);
    lua_replace(L, -3);
    lua_pop(L, 1);
  }
  cfg->on_request = lua_isnil(L, -1) ? (lua_pop(L, 1), LUA_NOREF)
                                     : luaL_ref(L, LUA_REGISTRYINDEX);
  cfg->ws = ws;
  if (compress) {
    cfg->compress = true;
    cfg->comp = comp;
    http_compress_filter_init(&cfg->comp_filter, &cfg->comp);
    hs->filters[hs->nfilters++] = &cfg->comp_filter;
  }
  cfg->http2 = http2;
  s->ext = cfg;
  s->ext_free = lx__cfg_free;
  s->alpn = cfg->http2 ? http_alpn_protos : http_alpn_protos_h1;
  return s;
}
