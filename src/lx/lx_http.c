/* lx_http: mp.http, an HTTP/1.1 server whose requests run Lua handlers.
 * The protocol is C (src/http/http1 parses); each request becomes a Lua
 * table and a response object, and on_request runs in a pooled coroutine
 * like every callback, so it may wait (mp.sleep, r:cmd). One request of a
 * connection at a time: pipelined ones wait in the input buffer. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "http/http1.h"
#include "http/ws.h"
#include "lx/lx.h"

#define LX_RES_MT "moonport.http.response"
#define LX_HTTP_ZERO_COPY_MIN 16384

/* ---- settings of one mp.http ---- */

typedef struct {
  int on_request; /* registry ref, or LUA_NOREF: 404 */
  lx_ws_cfg_t *ws; /* websocket handlers, or NULL */
  size_t max_header, max_body;
  uint32_t header_timeout_ms, idle_ms;
} lx_http_cfg_t;

/* ---- a connection ---- */

enum { H_HEAD, H_BODY, H_BUSY, H_CLOSING, H_STREAM /* WebSocket or SSE */ };

typedef struct {
  lx_service_t *svc;
  char *in;          /* input not yet consumed */
  size_t len, cap;
  int state;
  http_request_t req;
  size_t head_len;   /* of the request in hand */
  http_chunked_t chunk;
  size_t chunk_raw;  /* input bytes the chunked decoder took */
  char *body;        /* a chunked body, decoded */
  size_t body_len, body_cap;
  bool continued;    /* 100 Continue sent */
  bool keep_alive;   /* of the request in flight */
  uint64_t deadline; /* the request that is arriving must be whole by
                        then (header_timeout from its first byte) */
  lx_stream_t *stream; /* H_STREAM: what the connection became */
} lx_hconn_t;

/* The response object of one request. */
typedef struct {
  sock_uuid_t uuid;
  lx_lane_t *ln;
  int status;
  bool head_only;  /* a HEAD request: no body bytes */
  bool keep_alive;
  bool http10;
  bool started;    /* the head is sent (streaming) */
  bool done;       /* the response is complete */
  bool has_type;
  size_t hlen, hcap;
  char *headers;   /* "Name: value\r\n" lines the handler set */
} lx_res_t;

static lx_http_cfg_t *lx__cfg(lx_service_t *s) { return s->ext; }

static const char *lx__reason(int status) {
  switch (status) {
  case 100: return "Continue";
  case 101: return "Switching Protocols";
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 206: return "Partial Content";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 303: return "See Other";
  case 304: return "Not Modified";
  case 307: return "Temporary Redirect";
  case 308: return "Permanent Redirect";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 413: return "Content Too Large";
  case 415: return "Unsupported Media Type";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 505: return "HTTP Version Not Supported";
  default: return "Status";
  }
}

/* The Date header's value, made at most once a second per lane. */
static const char *lx__date(void) {
  static __thread time_t last;
  static __thread char buf[64];
  time_t now = time(NULL);
  if (now != last) {
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    last = now;
  }
  return buf;
}

/* A response to a request the server refuses; the connection then
 * closes. */
static void lx__refuse(conn_t *c, lx_hconn_t *hc, int status) {
  const char *reason = lx__reason(status);
  char buf[512];
  int n = snprintf(buf, sizeof(buf),
                   "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: text/plain\r\n"
                   "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                   status, reason, lx__date(), strlen(reason) + 1, reason);
  reactor_conn_write(c, buf, (size_t)n);
  hc->state = H_CLOSING;
  reactor_conn_close(c, CONN_LOCAL);
}

static void lx__hconn_free(lx_hconn_t *hc) {
  if (!hc) return;
  free(hc->in);
  free(hc->body);
  free(hc);
}

static void lx__process(conn_t *c, lx_hconn_t *hc);
static void lx_http_on_data(conn_t *c, const char *data, size_t len);
static void lx__complete(conn_t *c, lx_hconn_t *hc, bool keep_alive);
static int lx__write_head(conn_t *c, lx_res_t *res, long long len,
                          const char *body, bool *inlined);

/* The idle timer, used as the arriving request's deadline. */
static void lx__until_deadline(conn_t *c, lx_hconn_t *hc) {
  uint64_t now = reactor_now(hc->svc->ln->r);
  reactor_conn_set_timeout(c, hc->deadline > now ? (uint32_t)(hc->deadline - now) : 1);
}

static void lx_http_on_open(conn_t *c) {
  lx_service_t *s = reactor_conn_service(c);
  s->conns++;
  lx_hconn_t *hc = calloc(1, sizeof(*hc));
  if (!hc) {
    reactor_conn_force_close(c, CONN_ERROR);
    return;
  }
  hc->svc = s;
  reactor_conn_set_udata(c, hc);
  reactor_conn_set_timeout(c, lx__cfg(s)->header_timeout_ms);
}

lx_stream_t *lx_http_stream(conn_t *c) {
  lx_service_t *s = reactor_conn_service(c);
  if (!s || s->proto.on_data != lx_http_on_data) return NULL;
  lx_hconn_t *hc = reactor_conn_udata(c);
  return hc && hc->state == H_STREAM ? hc->stream : NULL;
}

static void lx_http_on_data(conn_t *c, const char *data, size_t len) {
  lx_hconn_t *hc = reactor_conn_udata(c);
  if (!hc || hc->state == H_CLOSING) return;
  if (hc->state == H_STREAM) {
    lx_stream_data(c, hc->stream, data, len);
    return;
  }
  lx_http_cfg_t *cfg = lx__cfg(hc->svc);
  /* What one request may take in the buffer: its head and its body (a
   * chunked body's framing counts, up to a head's worth). */
  size_t limit = cfg->max_header + cfg->max_body + cfg->max_header;
  if (hc->len + len > limit) {
    lx__refuse(c, hc, hc->state == H_HEAD ? 431 : 413);
    return;
  }
  uint64_t now = reactor_now(hc->svc->ln->r);
  if (hc->len == 0) { /* a request begins */
    hc->deadline = now + cfg->header_timeout_ms;
  } else if (now >= hc->deadline) { /* dribbled in too slowly */
    lx__refuse(c, hc, 408);
    return;
  }
  if (hc->len + len > hc->cap) {
    size_t cap = hc->cap ? hc->cap : 4096;
    while (cap < hc->len + len) cap *= 2;
    char *p = realloc(hc->in, cap);
    if (!p) {
      lx__refuse(c, hc, 500);
      return;
    }
    hc->in = p;
    hc->cap = cap;
    /* A parsed head waiting for its body points into the buffer: parse it
     * again where it is now (the same bytes: it succeeds as before). */
    if (hc->state == H_BODY)
      http_parse_head(hc->in, hc->len, cfg->max_header, &hc->req);
  }
  memcpy(hc->in + hc->len, data, len);
  hc->len += len;
  if (hc->state == H_HEAD || hc->state == H_BODY) lx__process(c, hc);
}

static void lx_http_on_timeout(conn_t *c) {
  lx_hconn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == H_STREAM)
    lx_stream_timeout(c, hc->stream);
  else if (hc && hc->state != H_BUSY && hc->len > 0)
    lx__refuse(c, hc, 408); /* a request that comes too slowly */
  else
    reactor_conn_close(c, CONN_TIMEOUT);
}

static void lx_http_on_ready(conn_t *c) {
  lx_hconn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == H_STREAM) lx_stream_ready(c, hc->stream);
}

static void lx_http_on_shutdown(conn_t *c) {
  lx_hconn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == H_STREAM) lx_stream_shutdown(c, hc->stream);
  else if (!hc || hc->state != H_BUSY) reactor_conn_close(c, CONN_SHUTDOWN);
  else hc->keep_alive = false; /* close after the response in flight */
}

static void lx_http_on_close(conn_t *c, int reason) {
  lx_hconn_t *hc = reactor_conn_udata(c);
  lx_service_t *s = reactor_conn_service(c);
  lx_pubsub_conn_closed(s->ln, reactor_conn_uuid(c));
  if (hc && hc->stream) {
    lx_stream_t *st = hc->stream;
    hc->stream = NULL;
    hc->state = H_CLOSING;
    lx_stream_closed(c, st, reason);
  }
  reactor_conn_set_udata(c, NULL);
  lx__hconn_free(hc);
  s->conns--;
  lx_service_maybe_free(s);
}

/* ---- requests into Lua ---- */

static void lx__body_add(const char *p, size_t n, void *arg) {
  lx_hconn_t *hc = arg;
  if (hc->body_len + n > hc->body_cap) {
    size_t cap = hc->body_cap ? hc->body_cap : 4096;
    while (cap < hc->body_len + n) cap *= 2;
    char *b = realloc(hc->body, cap);
    if (!b) {
      hc->body_len = SIZE_MAX; /* marks the failure */
      return;
    }
    hc->body = b;
    hc->body_cap = cap;
  }
  if (hc->body_len != SIZE_MAX) {
    memcpy(hc->body + hc->body_len, p, n);
    hc->body_len += n;
  }
}

/* Pushes the request table. Returns false (nothing pushed) for a target
 * that can't be decoded. */
static bool lx__push_req(lua_State *L, lx_hconn_t *hc, const char *body,
                         size_t blen) {
  http_request_t *r = &hc->req;
  const char *t = r->target;
  size_t tl = r->target_len;
  /* absolute-form: keep the path and query */
  if (tl > 7 && (strncmp(t, "http://", 7) == 0 || strncmp(t, "https://", 8) == 0)) {
    const char *p = memchr(t + 8, '/', tl - 8);
    size_t skip = p ? (size_t)(p - t) : tl;
    t += skip;
    tl -= skip;
    if (tl == 0) t = "/", tl = 1;
  }
  const char *q = memchr(t, '?', tl);
  size_t plen = q ? (size_t)(q - t) : tl;
  char stack[1024];
  char *path = plen <= sizeof(stack) ? stack : malloc(plen);
  if (!path) return false;
  ssize_t dl = http_unescape(t, plen, path, false);
  if (dl < 0 || memchr(path, 0, (size_t)dl)) {
    if (path != stack) free(path);
    return false;
  }
  lua_createtable(L, 0, 8);
  lua_pushlstring(L, r->method, r->method_len);
  lua_setfield(L, -2, "method");
  lua_pushlstring(L, path, (size_t)dl);
  lua_setfield(L, -2, "path");
  if (path != stack) free(path);
  if (q)
    lua_pushlstring(L, q + 1, tl - plen - 1);
  else
    lua_pushliteral(L, "");
  lua_setfield(L, -2, "query");
  lua_pushlstring(L, r->target, r->target_len);
  lua_setfield(L, -2, "target");
  lua_pushstring(L, r->minor ? "1.1" : "1.0");
  lua_setfield(L, -2, "version");
  /* headers: lower-case names; repeated fields joined with ", " */
  lua_createtable(L, 0, r->nheaders);
  char name[256];
  for (int i = 0; i < r->nheaders; i++) {
    const http_header_t *h = &r->headers[i];
    size_t n = h->name_len < sizeof(name) ? h->name_len : sizeof(name) - 1;
    for (size_t k = 0; k < n; k++) {
      char ch = h->name[k];
      name[k] = ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
    }
    lua_pushlstring(L, name, n);
    lua_pushvalue(L, -1);
    lua_rawget(L, -3);
    if (lua_isstring(L, -1)) {
      lua_pushliteral(L, ", ");
      lua_pushlstring(L, h->value, h->value_len);
      lua_concat(L, 3);
    } else {
      lua_pop(L, 1);
      lua_pushlstring(L, h->value, h->value_len);
    }
    lua_rawset(L, -3);
  }
  lua_setfield(L, -2, "headers");
  lua_pushlstring(L, body, blen);
  lua_setfield(L, -2, "body");
  return true;
}

static lx_res_t *lx__push_res(lua_State *L, lx_lane_t *ln, conn_t *c,
                              lx_hconn_t *hc) {
  lx_res_t *res = lua_newuserdata(L, sizeof(*res));
  memset(res, 0, sizeof(*res));
  res->uuid = reactor_conn_uuid(c);
  res->ln = ln;
  res->status = 200;
  res->head_only = hc->req.method_len == 4 && memcmp(hc->req.method, "HEAD", 4) == 0;
  res->keep_alive = hc->keep_alive;
  res->http10 = hc->req.minor == 0;
  luaL_getmetatable(L, LX_RES_MT);
  lua_setmetatable(L, -2);
  return res;
}

/* Registry key of the Lua wrapper that runs a handler and then finishes
 * its response (or answers 500 for an error). */
static const char lx_runner_key = 0;
static const char lx_runner_src[] =
    "local xpcall, traceback = xpcall, debug.traceback\n"
    "return function(handler, req, res)\n"
    "  local ok, err = xpcall(handler, traceback, req, res)\n"
    "  if ok then res:_done() else res:_fail(err) end\n"
    "end\n";

static bool lx__push_upgrade_req(lua_State *L, void *arg) {
  return lx__push_req(L, arg, "", 0);
}

/* A WebSocket handshake (RFC 6455 4.2): answers 101 and hands the
 * connection to lx_ws, or refuses. */
static void lx__upgrade(conn_t *c, lx_hconn_t *hc) {
  http_request_t *r = &hc->req;
  const http_header_t *ver = http_header(r, "sec-websocket-version");
  const http_header_t *key = http_header(r, "sec-websocket-key");
  if (r->method_len != 3 || memcmp(r->method, "GET", 3) != 0 || r->minor != 1 ||
      !key || key->value_len != 24) {
    lx__refuse(c, hc, 400);
    return;
  }
  if (!ver || ver->value_len != 2 || memcmp(ver->value, "13", 2) != 0) {
    static const char resp[] =
        "HTTP/1.1 426 Upgrade Required\r\nSec-WebSocket-Version: 13\r\n"
        "Content-Length: 0\r\nConnection: close\r\n\r\n";
    reactor_conn_write(c, resp, sizeof(resp) - 1);
    hc->state = H_CLOSING;
    reactor_conn_close(c, CONN_LOCAL);
    return;
  }
  lx_stream_t *st = lx_ws_new(hc->svc->ln, c, lx__cfg(hc->svc)->ws);
  if (!st) {
    lx__refuse(c, hc, 500);
    return;
  }
  char accept[29];
  ws_accept_key(key->value, key->value_len, accept);
  char resp[160];
  int n = snprintf(resp, sizeof(resp),
                   "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                   "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
                   accept);
  reactor_conn_write(c, resp, (size_t)n);
  hc->state = H_STREAM;
  hc->stream = st;
  reactor_conn_set_timeout(c, lx__cfg(hc->svc)->idle_ms);
  size_t used = hc->head_len < hc->len ? hc->head_len : hc->len;
  lx_ws_begin(c, st, lx__push_upgrade_req, hc, hc->in + used, hc->len - used);
  /* The request's bytes are not needed any more. */
  free(hc->in);
  hc->in = NULL;
  hc->len = hc->cap = hc->head_len = 0;
}

static bool lx__is_upgrade(const http_request_t *r) {
  if (!r->upgrade) return false;
  const http_header_t *u = http_header(r, "upgrade");
  return u && http_list_has(u->value, u->value_len, "websocket");
}

/* The request in hand is whole: run on_request. */
static void lx__dispatch(conn_t *c, lx_hconn_t *hc, const char *body,
                         size_t blen) {
  lx_service_t *s = hc->svc;
  lx_lane_t *ln = s->ln;
  lx_http_cfg_t *cfg = lx__cfg(s);
  if (cfg->ws && lx__is_upgrade(&hc->req)) {
    lx__upgrade(c, hc);
    return;
  }
  if (cfg->on_request == LUA_NOREF) {
    static const char nf[] = "Not Found\n";
    lx_res_t res = {.status = 404, .keep_alive = hc->keep_alive,
                    .http10 = hc->req.minor == 0,
                    .head_only = hc->req.method_len == 4 &&
                                 memcmp(hc->req.method, "HEAD", 4) == 0};
    bool inlined;
    hc->state = H_BUSY;
    lx__write_head(c, &res, (long long)sizeof(nf) - 1, nf, &inlined);
    lx__complete(c, hc, res.keep_alive && hc->keep_alive);
    return;
  }
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  lua_pushlightuserdata(co, (void *)&lx_runner_key);
  lua_rawget(co, LUA_REGISTRYINDEX);
  lua_rawgeti(co, LUA_REGISTRYINDEX, lx__cfg(s)->on_request);
  if (!lx__push_req(co, hc, body, blen)) {
    lua_settop(co, 0);
    luaL_unref(ln->L, LUA_REGISTRYINDEX, co_ref);
    lx__refuse(c, hc, 400);
    return;
  }
  lx__push_res(co, ln, c, hc);
  hc->state = H_BUSY;
  reactor_conn_set_timeout(c, 0); /* the handler takes what it takes */
  lx_call_on(ln, co, co_ref, 3, LX_CONN, c, NULL, "on_request");
}

/* Parses what is buffered and runs the requests that are whole, one at a
 * time. */
static void lx__process(conn_t *c, lx_hconn_t *hc) {
  lx_http_cfg_t *cfg = lx__cfg(hc->svc);
  while (hc->state == H_HEAD || hc->state == H_BODY) {
    if (hc->state == H_HEAD) {
      if (hc->len == 0) {
        reactor_conn_set_timeout(c, cfg->idle_ms);
        return;
      }
      int rc = http_parse_head(hc->in, hc->len, cfg->max_header, &hc->req);
      if (rc == HTTP_NEED_MORE) {
        lx__until_deadline(c, hc);
        return;
      }
      if (rc < 0) {
        lx__refuse(c, hc, -rc);
        return;
      }
      hc->head_len = (size_t)rc;
      hc->keep_alive = hc->req.keep_alive;
      if (hc->req.content_length > (int64_t)cfg->max_body) {
        lx__refuse(c, hc, 413); /* before reading it */
        return;
      }
      hc->continued = false;
      hc->chunk_raw = 0;
      hc->body_len = 0;
      if (hc->req.chunked) http_chunked_init(&hc->chunk, cfg->max_header);
      hc->state = H_BODY;
    }
    const char *body;
    size_t blen, used;
    if (hc->req.chunked) {
      bool done = false;
      ssize_t n = http_chunked_feed(&hc->chunk, hc->in + hc->head_len + hc->chunk_raw,
                                    hc->len - hc->head_len - hc->chunk_raw,
                                    lx__body_add, hc, &done);
      if (n < 0) {
        lx__refuse(c, hc, 400);
        return;
      }
      hc->chunk_raw += (size_t)n;
      if (hc->body_len == SIZE_MAX) {
        lx__refuse(c, hc, 500);
        return;
      }
      if (hc->body_len > cfg->max_body) {
        lx__refuse(c, hc, 413);
        return;
      }
      if (!done) goto wait_body;
      body = hc->body ? hc->body : "";
      blen = hc->body_len;
      used = hc->head_len + hc->chunk_raw;
    } else {
      blen = hc->req.content_length > 0 ? (size_t)hc->req.content_length : 0;
      if (hc->len - hc->head_len < blen) goto wait_body;
      body = hc->in + hc->head_len;
      used = hc->head_len + blen;
    }
    /* The request leaves the buffer when its response is done; until then
     * its strings stay where they are (the Lua table has copies). */
    hc->head_len = used;
    lx__dispatch(c, hc, body, blen);
    continue; /* H_BUSY ends the loop unless the handler finished */
  wait_body:
    if (hc->req.expect_continue && !hc->continued) {
      hc->continued = true;
      static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
      reactor_conn_write(c, cont, sizeof(cont) - 1);
    }
    lx__until_deadline(c, hc);
    return;
  }
}

/* Runs as the connection's callback after a response finished. */
static void lx__next(conn_t *c, void *arg) {
  if (!c) return;
  lx_hconn_t *hc = reactor_conn_udata(c);
  if (hc && hc->state == H_HEAD) lx__process(c, hc);
}

/* The response of the request in flight is complete. */
static void lx__complete(conn_t *c, lx_hconn_t *hc, bool keep_alive) {
  size_t used = hc->head_len;
  if (used > hc->len) used = hc->len;
  memmove(hc->in, hc->in + used, hc->len - used);
  hc->len -= used;
  hc->head_len = 0;
  if (!keep_alive) {
    hc->state = H_CLOSING;
    reactor_conn_close(c, CONN_LOCAL);
    return;
  }
  hc->state = H_HEAD;
  hc->deadline = reactor_now(hc->svc->ln->r) + lx__cfg(hc->svc)->header_timeout_ms;
  /* Not from here (inside the handler's Lua): pipelined requests run as
   * the connection's next callback. */
  if (hc->len)
    reactor_conn_task(c, lx__next, NULL);
  else
    reactor_conn_set_timeout(c, lx__cfg(hc->svc)->idle_ms);
}

/* ---- the response object ---- */

static lx_res_t *lx__res(lua_State *L) {
  return luaL_checkudata(L, 1, LX_RES_MT);
}

/* The connection of a response still in flight, or NULL. */
static conn_t *lx__res_conn(lx_res_t *res, lx_hconn_t **hc) {
  conn_t *c = reactor_conn_find(res->ln->r, res->uuid);
  *hc = c ? reactor_conn_udata(c) : NULL;
  if (!*hc || (*hc)->state != H_BUSY) return NULL;
  return c;
}

static int lx_res_status(lua_State *L) {
  lx_res_t *res = lx__res(L);
  lua_Integer s = luaL_checkinteger(L, 2);
  if (s < 100 || s > 999) return luaL_argerror(L, 2, "status must be 100..999");
  if (res->started || res->done)
    return luaL_error(L, "res:status: the response is already sent");
  res->status = (int)s;
  lua_settop(L, 1);
  return 1;
}

static bool lx__header_ok(const char *s, size_t n, bool name) {
  if (n == 0 && name) return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '\r' || ch == '\n' || ch == 0) return false;
    if (name && (ch <= ' ' || ch == ':' || ch >= 0x7f)) return false;
  }
  return true;
}

static void lx__add_header(lua_State *L, lx_res_t *res, const char *k,
                           size_t kl, const char *v, size_t vl) {
  size_t need = res->hlen + kl + vl + 4;
  if (need > res->hcap) {
    size_t cap = res->hcap ? res->hcap * 2 : 256;
    while (cap < need) cap *= 2;
    char *p = realloc(res->headers, cap);
    if (!p) luaL_error(L, "out of memory");
    res->headers = p;
    res->hcap = cap;
  }
  memcpy(res->headers + res->hlen, k, kl);
  memcpy(res->headers + res->hlen + kl, ": ", 2);
  memcpy(res->headers + res->hlen + kl + 2, v, vl);
  memcpy(res->headers + res->hlen + kl + 2 + vl, "\r\n", 2);
  res->hlen = need;
  if (kl == 12 && strncasecmp(k, "content-type", 12) == 0) res->has_type = true;
}

static int lx_res_header(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t kl, vl;
  const char *k = luaL_checklstring(L, 2, &kl);
  const char *v = luaL_checklstring(L, 3, &vl);
  if (res->started || res->done)
    return luaL_error(L, "res:header: the response is already sent");
  if (!lx__header_ok(k, kl, true))
    return luaL_argerror(L, 2, "not a valid header name");
  if (!lx__header_ok(v, vl, false))
    return luaL_argerror(L, 3, "a header value can't hold CR, LF or NUL");
  if ((kl == 14 && strncasecmp(k, "content-length", 14) == 0) ||
      (kl == 17 && strncasecmp(k, "transfer-encoding", 17) == 0))
    return luaL_argerror(L, 2, "moonport sets this header itself");
  lx__add_header(L, res, k, kl, v, vl);
  lua_settop(L, 1);
  return 1;
}

/* Small bodies go out in the same write as the head. */
#define LX_HTTP_INLINE_BODY 4096

/* Writes the status line, the headers and, if it is small, the body
 * (*inlined says so); len < 0: a chunked body follows (or, for an HTTP/1.0
 * client, one delimited by closing the connection). */
static int lx__write_head(conn_t *c, lx_res_t *res, long long len,
                          const char *body, bool *inlined) {
  lx_hconn_t *hc = reactor_conn_udata(c);
  if (hc && !hc->keep_alive) res->keep_alive = false; /* shutting down */
  bool chunked = len < 0 && !res->http10;
  if (len < 0 && res->http10) res->keep_alive = false;
  size_t blen = body && len > 0 && len <= LX_HTTP_INLINE_BODY && !res->head_only
                    ? (size_t)len : 0;
  char stack[512 + LX_HTTP_INLINE_BODY + 1024];
  size_t need = 400 + res->hlen + blen;
  char *buf = need <= sizeof(stack) ? stack : malloc(need);
  if (!buf) return -ENOMEM;
  size_t cap = need <= sizeof(stack) ? sizeof(stack) : need;
  int n = snprintf(buf, cap, "HTTP/1.1 %d %s\r\nDate: %s\r\n", res->status,
                   lx__reason(res->status), lx__date());
  if (chunked)
    n += snprintf(buf + n, cap - (size_t)n, "Transfer-Encoding: chunked\r\n");
  else if (len >= 0 && res->status != 204 && res->status != 304 &&
           res->status >= 200)
    n += snprintf(buf + n, cap - (size_t)n, "Content-Length: %lld\r\n", len);
  if (!res->keep_alive)
    n += snprintf(buf + n, cap - (size_t)n, "Connection: close\r\n");
  else if (res->http10)
    n += snprintf(buf + n, cap - (size_t)n, "Connection: keep-alive\r\n");
  if (!res->has_type && len != 0)
    n += snprintf(buf + n, cap - (size_t)n,
                  "Content-Type: text/plain; charset=utf-8\r\n");
  size_t at = (size_t)n;
  if (res->hlen) memcpy(buf + at, res->headers, res->hlen);
  at += res->hlen;
  memcpy(buf + at, "\r\n", 2);
  at += 2;
  if (blen) memcpy(buf + at, body, blen);
  at += blen;
  *inlined = blen > 0 || len <= 0 || res->head_only;
  int rc = reactor_conn_write(c, buf, at);
  if (buf != stack) free(buf);
  return rc;
}

/* Writes the Lua string at idx. */
static int lx__write_body(lua_State *L, lx_res_t *res, conn_t *c, int idx,
                          const char *p, size_t n) {
  if (n >= LX_HTTP_ZERO_COPY_MIN) {
    lua_pushvalue(L, idx);
    int ref = luaL_ref(L, LUA_REGISTRYINDEX);
    return reactor_conn_write_ref(c, p, n, lx_unref_release, res->ln,
                                  (void *)(intptr_t)ref);
  }
  return reactor_conn_write(c, p, n);
}

/* Ends the response: the connection goes on to the next request. */
static void lx__finish(lx_res_t *res, conn_t *c, lx_hconn_t *hc) {
  res->done = true;
  free(res->headers);
  res->headers = NULL;
  res->hlen = res->hcap = 0;
  lx__complete(c, hc, res->keep_alive && hc->keep_alive);
}

static int lx_res_send(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t n = 0;
  const char *body = lua_isnoneornil(L, 2) ? "" : luaL_checklstring(L, 2, &n);
  if (res->done || res->started)
    return luaL_error(L, "res:send: the response is already sent");
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) {
    res->done = true;
    return lx_push_fail(L, -EPIPE);
  }
  /* 1xx, 204 and 304 have no body (RFC 9110 6.4.1): one given is dropped */
  if (res->status < 200 || res->status == 204 || res->status == 304) n = 0;
  bool inlined;
  int rc = lx__write_head(c, res, (long long)n, body, &inlined);
  if (!rc && !inlined) rc = lx__write_body(L, res, c, 2, body, n);
  lx__finish(res, c, hc);
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

static int lx_res_json(lua_State *L) {
  lx_res_t *res = lx__res(L);
  luaL_checkany(L, 2);
  if (!lua_isnoneornil(L, 3)) {
    lua_pushcfunction(L, lx_res_status);
    lua_pushvalue(L, 1);
    lua_pushvalue(L, 3);
    lua_call(L, 2, 0);
  }
  lua_getglobal(L, "require");
  lua_pushliteral(L, "cjson");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "encode");
  lua_pushvalue(L, 2);
  lua_call(L, 1, 1);
  if (!res->has_type && !res->started && !res->done)
    lx__add_header(L, res, "Content-Type", 12, "application/json", 16);
  lua_replace(L, 2);
  lua_settop(L, 2);
  return lx_res_send(L);
}

static int lx_res_redirect(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t ul;
  const char *url = luaL_checklstring(L, 2, &ul);
  lua_Integer status = luaL_optinteger(L, 3, 302);
  if (status < 300 || status > 399) return luaL_argerror(L, 3, "a 3xx status");
  if (!lx__header_ok(url, ul, false)) return luaL_argerror(L, 2, "bad URL");
  if (res->started || res->done)
    return luaL_error(L, "res:redirect: the response is already sent");
  res->status = (int)status;
  lx__add_header(L, res, "Location", 8, url, ul);
  lua_settop(L, 1);
  return lx_res_send(L);
}

/* res:write(chunk): streams the body (chunked). */
static int lx_res_write(lua_State *L) {
  lx_res_t *res = lx__res(L);
  size_t n;
  const char *p = luaL_checklstring(L, 2, &n);
  if (res->done) return luaL_error(L, "res:write: the response is finished");
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) return lx_push_fail(L, -EPIPE);
  int rc = 0;
  if (!res->started) {
    bool inlined;
    res->started = true;
    rc = lx__write_head(c, res, -1, NULL, &inlined);
  }
  if (!rc && n && !res->head_only) {
    if (!res->http10) {
      char size[24];
      int sl = snprintf(size, sizeof(size), "%zx\r\n", n);
      rc = reactor_conn_write(c, size, (size_t)sl);
    }
    if (!rc) rc = lx__write_body(L, res, c, 2, p, n);
    if (!rc && !res->http10) rc = reactor_conn_write(c, "\r\n", 2);
  }
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* res:finish(): ends a streamed body (or sends an empty response). */
static int lx_res_finish(lua_State *L) {
  lx_res_t *res = lx__res(L);
  if (res->done) return 0;
  if (!res->started) {
    lua_settop(L, 1);
    return lx_res_send(L);
  }
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) {
    res->done = true;
    return 0;
  }
  if (!res->http10 && !res->head_only) reactor_conn_write(c, "0\r\n\r\n", 5);
  lx__finish(res, c, hc);
  return 0;
}

static int lx_res_sendfile(lua_State *L) {
  lx_res_t *res = lx__res(L);
  const char *path = luaL_checkstring(L, 2);
  if (res->done || res->started)
    return luaL_error(L, "res:sendfile: the response is already sent");
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) return lx_push_fail(L, -EPIPE);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    int e = fd < 0 ? errno : EISDIR;
    if (fd >= 0) close(fd);
    return lx_push_fail(L, -e);
  }
  bool inlined;
  int rc = lx__write_head(c, res, (long long)st.st_size, NULL, &inlined);
  if (!rc && st.st_size && !res->head_only)
    rc = reactor_conn_sendfile(c, fd, 0, (size_t)st.st_size); /* owns fd */
  else
    close(fd);
  lx__finish(res, c, hc);
  if (rc) return lx_push_fail(L, rc);
  lua_pushboolean(L, 1);
  return 1;
}

/* res:sse([handlers]): the response becomes a stream of Server-Sent
 * Events; returns its object. */
static int lx_res_sse(lua_State *L) {
  lx_res_t *res = lx__res(L);
  int opts = 0;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    opts = 2;
    static const char *const names[] = {"on_open", "on_close"};
    for (int i = 0; i < 2; i++) {
      lua_getfield(L, 2, names[i]);
      if (!lua_isnil(L, -1) && !lua_isfunction(L, -1))
        return luaL_error(L, "res:sse: %s must be a function", names[i]);
      lua_pop(L, 1);
    }
  }
  if (res->done || res->started)
    return luaL_error(L, "res:sse: the response is already sent");
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) {
    res->done = true;
    return lx_push_fail(L, -EPIPE);
  }
  const http_header_t *last = http_header(&hc->req, "last-event-id");
  lx_stream_t *st = lx_sse_new(L, res->ln, c, opts, last ? last->value : NULL,
                               last ? last->value_len : 0);
  if (!st) return luaL_error(L, "out of memory");
  char head[256];
  int n = snprintf(head, sizeof(head),
                   "HTTP/1.1 %d %s\r\nDate: %s\r\nContent-Type: text/event-stream\r\n"
                   "Cache-Control: no-cache\r\nX-Accel-Buffering: no\r\n",
                   res->status, lx__reason(res->status), lx__date());
  int rc = reactor_conn_write(c, head, (size_t)n);
  if (!rc && res->hlen) rc = reactor_conn_write(c, res->headers, res->hlen);
  if (!rc) rc = reactor_conn_write(c, "\r\n", 2);
  res->done = true;
  free(res->headers);
  res->headers = NULL;
  res->hlen = res->hcap = 0;
  /* The stream ends with the connection: nothing more is read as HTTP. */
  hc->state = H_STREAM;
  hc->stream = st;
  reactor_conn_set_timeout(c, lx__cfg(hc->svc)->idle_ms);
  lx_sse_begin(c, st);
  lx_stream_push(L, st);
  if (rc) reactor_conn_close(c, CONN_ERROR);
  return 1;
}

/* After the handler returned: a response it did not finish is finished
 * now (an empty one with its status if it sent nothing). */
static int lx_res_done(lua_State *L) {
  lx_res_t *res = lx__res(L);
  if (!res->done) lx_res_finish(L);
  return 0;
}

/* The handler failed: the trace goes to the log, the client gets a 500
 * if nothing was sent yet (else the connection closes). */
static int lx_res_fail(lua_State *L) {
  lx_res_t *res = lx__res(L);
  log_error("error in on_request: %s", luaL_optstring(L, 2, "?"));
  if (res->done) return 0;
  lx_hconn_t *hc;
  conn_t *c = lx__res_conn(res, &hc);
  if (!c) return 0;
  if (res->started) {
    res->done = true;
    hc->state = H_CLOSING;
    reactor_conn_force_close(c, CONN_ERROR);
    return 0;
  }
  res->status = 500;
  res->hlen = 0;
  res->has_type = false;
  lua_settop(L, 1);
  lua_pushliteral(L, "Internal Server Error\n");
  return lx_res_send(L);
}

static int lx_res_gc(lua_State *L) {
  lx_res_t *res = lx__res(L);
  free(res->headers);
  res->headers = NULL;
  return 0;
}

static const luaL_Reg lx_res_methods[] = {
    {"status", lx_res_status},     {"header", lx_res_header},
    {"send", lx_res_send},         {"json", lx_res_json},
    {"write", lx_res_write},       {"finish", lx_res_finish},
    {"redirect", lx_res_redirect}, {"sendfile", lx_res_sendfile},
    {"sse", lx_res_sse},
    {"_done", lx_res_done},        {"_fail", lx_res_fail},
    {NULL, NULL}};

/* ---- mp.http ---- */

static void lx__cfg_free(lx_service_t *s) {
  lx_http_cfg_t *cfg = s->ext;
  if (!cfg) return;
  luaL_unref(s->ln->L, LUA_REGISTRYINDEX, cfg->on_request);
  lx_ws_cfg_free(s->ln->L, cfg->ws);
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
      luaL_error(L, "mp.http: %s out of range (%g not in %g..%g)", name, v,
                 min, max);
  }
  lua_pop(L, 1);
  return v;
}

static lx_service_t *lx__http_service(lua_State *L, lx_lane_t *ln, int idx) {
  lua_getfield(L, idx, "on_request");
  lua_getfield(L, idx, "websocket");
  bool has_ws = !lua_isnil(L, -1);
  if (!lua_isfunction(L, -2) && !(lua_isnil(L, -2) && has_ws))
    luaL_error(L, "mp.http: on_request must be a function (got %s)",
               luaL_typename(L, -2));
  lua_pop(L, 2);
  lua_Number max_header = lx__opt(L, idx, "max_header", 8192, 256, 1 << 20);
  lua_Number max_body = lx__opt(L, idx, "max_body", 1 << 20, 0, (lua_Number)(1ull << 32));
  lua_Number header_timeout = lx__opt(L, idx, "header_timeout", 10, 0.01, 3600);
  lua_Number idle = lx__opt(L, idx, "timeout", 40, 0, 4e6);
  lua_Number limit = lx__opt(L, idx, "write_limit",
                             (lua_Number)REACTOR_DEFAULT_WRITE_LIMIT, 1024,
                             (lua_Number)((size_t)1 << 40));
  lua_Number max_queue = lx__opt(L, idx, "max_queue",
                                 (lua_Number)REACTOR_DEFAULT_MAX_QUEUE, 1024,
                                 (lua_Number)((size_t)1 << 40));
  lx_ws_cfg_t *ws = NULL; /* made last: it raises before allocating */
  if (has_ws) {
    lua_getfield(L, idx, "websocket");
    ws = lx_ws_cfg_new(L, -1);
    lua_pop(L, 1);
  }
  lx_service_t *s = calloc(1, sizeof(*s));
  lx_http_cfg_t *cfg = calloc(1, sizeof(*cfg));
  if (!s || !cfg) {
    free(s);
    free(cfg);
    lx_ws_cfg_free(L, ws);
    luaL_error(L, "out of memory");
  }
  s->ln = ln;
  s->on_open = s->on_data = s->on_ready = s->on_timeout = s->on_shutdown =
      s->on_close = s->on_fail = LUA_NOREF;
  s->opts.timeout_ms = (uint32_t)(header_timeout * 1000);
  s->opts.write_limit = (size_t)limit;
  s->opts.max_queue = (size_t)max_queue;
  s->proto.on_open = lx_http_on_open;
  s->proto.on_data = lx_http_on_data;
  s->proto.on_timeout = lx_http_on_timeout;
  s->proto.on_ready = lx_http_on_ready;
  s->proto.on_shutdown = lx_http_on_shutdown;
  s->proto.on_close = lx_http_on_close;
  cfg->max_header = (size_t)max_header;
  cfg->max_body = (size_t)max_body;
  cfg->header_timeout_ms = (uint32_t)(header_timeout * 1000);
  cfg->idle_ms = (uint32_t)(idle * 1000);
  lua_getfield(L, idx, "on_request");
  cfg->on_request = lua_isnil(L, -1) ? (lua_pop(L, 1), LUA_NOREF)
                                     : luaL_ref(L, LUA_REGISTRYINDEX);
  cfg->ws = ws;
  s->ext = cfg;
  s->ext_free = lx__cfg_free;
  lx_service_link(s);
  return s;
}

static int lx_http(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  return lx_listen_with(L, ln, lx__http_service);
}

void lx_http_open(lua_State *L, lx_lane_t *ln) {
  luaL_newmetatable(L, LX_RES_MT);
  lua_newtable(L);
  luaL_setfuncs(L, lx_res_methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, lx_res_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushliteral(L, LX_RES_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
  lua_pushlightuserdata(L, (void *)&lx_runner_key);
  if (luaL_loadbuffer(L, lx_runner_src, sizeof(lx_runner_src) - 1,
                      "=moonport.http"))
    lua_error(L);
  lua_call(L, 0, 1);
  lua_rawset(L, LUA_REGISTRYINDEX);
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_http, 1);
  lua_setfield(L, -2, "http");
}
