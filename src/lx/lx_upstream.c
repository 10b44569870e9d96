/* SPDX-License-Identifier: MIT */

/* lx_upstream: the C primitives of mp.upstream (lua/moonport/upstream.lua):
 * one proxied try (core.upstream.try, a waiter over src/http/proxy.c),
 * the lane's pool of upstream connections, and the key hash of the
 * consistent-hash balancer. Choosing the server, retries and health are
 * Lua; the bytes never are. Lane thread only. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/shdict.h"
#include "http/proxy.h"
#include "http/server.h"
#include "lx/lx_client.h"
#include "lx/lx_embed.h"
#include "lx/lx_lane.h"
#include "lx/lx_shared.h"
#include "lx/lx_upstream.h"
#include "net/sock.h"

/* The dictionary of upstream.lua's shared state. */
#define LX_UP_DICT "moonport.upstream"

/* The row's slot (lx_module.h): set by the runner before the first lane,
 * read-only after. */
int lx_upstream_slot = -1;

/* Tries in flight, each with the run it resumes. Kept in the lane's
 * spares after use (a malloc and a free of every proxied request, ~140
 * instructions): at most LX_UP_SPARE_MAX; none under ASan, so that a use
 * after free is still caught. */
typedef struct lx_up_wait {
  lx_lane_t *ln;
  lx_run_t run;
  struct lx_up_wait *next; /* among the spares */
} lx_up_wait_t;

#if defined(__SANITIZE_ADDRESS__)
#define LX_UP_SPARE_MAX 0
#else
#define LX_UP_SPARE_MAX 64
#endif

static lx_upstream_lane_t *lx__ul(const lx_lane_t *ln) {
  return lx_lane_state(ln, lx_upstream_slot);
}

static lx_up_wait_t *lx__wait_new(lx_lane_t *ln) {
  lx_upstream_lane_t *ul = lx__ul(ln);
  lx_up_wait_t *w = ul->spare;
  if (!w) return malloc(sizeof(*w));
  ul->spare = w->next;
  ul->n_spare--;
  return w;
}

/* w back to its lane's spares; freed once the lane is closing (its close
 * hook has freed the spares, or is about to). */
static void lx__wait_free(lx_up_wait_t *w) {
  lx_lane_t *ln = w->ln;
  lx_upstream_lane_t *ul = lx__ul(ln);
  if (ln->closing || ul->n_spare >= LX_UP_SPARE_MAX) {
    free(w);
    return;
  }
  w->next = ul->spare;
  ul->spare = w;
  ul->n_spare++;
}

/* The lane's pool, made on first use (its state: a registry look-up here
 * cost ~200 instructions of every proxied request). */
static proxy_pool_t *lx__pool(lx_lane_t *ln, bool make) {
  lx_upstream_lane_t *ul = lx__ul(ln);
  if (!ul->pool && make) ul->pool = proxy_pool_new(ln->r);
  return ul->pool;
}

void lx_upstream_lane_free(lx_lane_t *ln) {
  lx_upstream_lane_t *ul = lx__ul(ln);
  while (ul->spare) {
    lx_up_wait_t *w = ul->spare;
    ul->spare = w->next;
    free(w);
  }
  ul->n_spare = 0;
  proxy_pool_t *p = ul->pool;
  ul->pool = NULL;
  proxy_pool_free(p);
}

/* The request in flight whose conn_id and _xid (the request table's)
 * are at idx and idx + 1, or NULL (it is over). Up:proxy passes them as
 * arguments: two lua_getfield calls here, in the check and again in the
 * arm, cost about 800 instructions of every proxied request. */
static conn_t *lx__client(lua_State *L, lx_lane_t *ln, int idx, http_conn_t **hcp) {
  *hcp = NULL;
  sock_uuid_t uuid = (sock_uuid_t)lua_tonumber(L, idx);
  uint64_t xid = (uint64_t)lua_tonumber(L, idx + 1);
  conn_t *c = uuid ? reactor_conn_find(ln->r, uuid) : NULL;
  /* only the exchange of mp.http in flight, not one kept past its end */
  http_exchange_t *x = http_exchange_find(c, xid);
  if (!x || x->conn->watch) return NULL;
  *hcp = x->conn;
  return c;
}

/* try(req, ip, port, key, keepalive, connect_ms, timeout_ms, host, target,
 * extra, drop, fresh, tls, tls_name, conn_id, xid, body): req's fields
 * conn_id, _xid and body (rawget: nil when streamed) come as arguments
 * too. Misuse raises here, before the wait.
 * tls is nil, true or mp.tcp's table (lx_client_tls); its context is made
 * here (a bad table or an unreadable file raises) and cached in the
 * lane's client, where the arm finds it again. */
static int lx__try_check(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  lx_check_waitable(L, ln, "up:proxy");
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checkstring(L, 2);
  luaL_checkinteger(L, 3);
  size_t kl;
  luaL_checklstring(L, 4, &kl);
  if (kl >= 64) luaL_argerror(L, 4, "key too long");
  if (lua_toboolean(L, 13)) {
    lx_client_t *cl = lx_client_of(ln);
    if (!cl) return luaL_error(L, "up:proxy: out of memory");
    const char *sni, *tkey;
    if (!lx_client_tls(L, cl, 13, &sni, &tkey))
      return luaL_error(L, "up:proxy: no TLS context");
    lua_pop(L, 1);
    luaL_checkstring(L, 14);
  }
  /* The request's own handler (the common case) can't be refused: its
   * connection's uuid is the one passed, so the look-up of the request
   * (the arm's again, ~170 instructions) is left to the arm. */
  const lx_run_t *run = ln->running;
  if (run->kind == LX_CONN && run->c &&
      reactor_conn_uuid(run->c) == (sock_uuid_t)lua_tonumber(L, 15))
    return 0;
  http_conn_t *hc;
  conn_t *c = lx__client(L, ln, 15, &hc);
  if (c && (run->kind != LX_CONN || run->c != c))
    luaL_error(L, "up:proxy: only in the request's own handler (not in a "
                  "timer or another callback)");
  return 0;
}

static void lx__try_done(void *arg, const proxy_result_t *r) {
  lx_up_wait_t *w = arg;
  lx_lane_t *ln = w->ln;
  lx_run_t run = w->run;
  lx__wait_free(w);
  if (ln->closing) {
    lx_run_abandon(ln, &run);
    return;
  }
  lua_State *co = run.co;
  if (r->status > 0) lua_pushinteger(co, r->status);
  else lua_pushnil(co);
  if (r->tls_error) {
    lua_pushfstring(co, "tls: %s", r->tls_error);
  } else if (r->err) {
    char buf[96];
    lua_pushstring(co, r->err == -EPROTO       ? "bad response"
                       : r->err == -EIO        ? "client body broke"
                       : r->err == -EPIPE      ? "client closed"
                       : r->err == -ECONNRESET ? "upstream closed early"
                                               : lx_errmsg(r->err, buf, sizeof(buf)));
  } else {
    lua_pushnil(co);
  }
  lua_pushboolean(co, r->sent);
  lua_pushboolean(co, r->answered);
  lua_pushboolean(co, r->reused);
  lua_pushnumber(co, (lua_Number)r->ms);
  lua_pushboolean(co, r->spliced);
  lx_resume(ln, &run, 7);
}

static const char *lx__optlstr(lua_State *L, int idx, size_t *n) {
  *n = 0;
  return lua_type(L, idx) == LUA_TSTRING ? lua_tolstring(L, idx, n) : NULL;
}

/* The client went away before the try: the answer is posted (nothing
 * resumes inside an arm). */
static void lx__try_gone(void *a, void *b) {
  (void)b;
  proxy_result_t r = {.err = -EPIPE};
  lx__try_done(a, &r);
}

static int lx__try_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  /* the arguments start at index 3 */
  http_conn_t *hc;
  conn_t *c = lx__client(co, ln, 17, &hc);
  if (!c) {
    lx_up_wait_t *w = lx__wait_new(ln);
    if (!w) return -ENOMEM;
    w->ln = ln;
    w->run = *run;
    if (reactor_defer(ln->r, lx__try_gone, w, NULL)) {
      lx__wait_free(w);
      return -ENOMEM;
    }
    return 0;
  }
  proxy_pool_t *pool = lx__pool(ln, true);
  if (!pool) return -ENOMEM;
  /* First, before anything is allocated: the check made the context, so
   * this is the client cache's hit and raises nothing. Our reference is
   * dropped once proxy_start returns (a connect takes its own). */
  net_tls_ctx_t *tls = NULL;
  const char *tls_host = NULL;
  if (lua_toboolean(co, 15)) {
    lx_client_t *cl = lx_client_of(ln);
    const char *sni = NULL, *tkey;
    tls = cl ? lx_client_tls(co, cl, 15, &sni, &tkey) : NULL;
    if (!tls) return -ENOMEM;
    net_tls_ctx_ref(tls);
    lua_pop(co, 1); /* the box: our reference holds it */
    tls_host = sni ? sni : lua_tostring(co, 16);
  }
  proxy_head_opts_t o = {0};
  char ip[128];
  int pport;
  if (reactor_conn_peer(c, ip, sizeof(ip), &pport)) strcpy(ip, "unknown");
  o.peer = ip;
  o.proto = reactor_conn_tls(c, NULL) ? "https" : "http";
  o.host = lx__optlstr(co, 10, &o.host_len);
  o.target = lx__optlstr(co, 11, &o.target_len);
  o.extra = lx__optlstr(co, 12, &o.extra_len);
  o.drop = lx__optlstr(co, 13, &o.drop_len);
  size_t blen = 0;
  const char *body = NULL;
  if (hc->x.streaming) {
    o.body_len = -1;
  } else {
    /* a string on the stack until the copy */
    body =
        lua_type(co, 19) == LUA_TSTRING ? lua_tolstring(co, 19, &blen) : NULL;
    o.body_len = body ? (long long)blen : -2;
  }
  size_t cap = hc->head_len + o.extra_len + o.target_len + o.host_len + 1024;
  char stack[16384];
  char *head = cap <= sizeof(stack) ? stack : malloc(cap);
  if (!head) {
    net_tls_ctx_unref(tls);
    return -ENOMEM;
  }
  long hl = proxy_request_head(head, cap, hc->x.req, &o);
  if (hl < 0) {
    if (head != stack) free(head);
    net_tls_ctx_unref(tls);
    return (int)hl;
  }
  lx_up_wait_t *w = lx__wait_new(ln);
  if (!w) {
    if (head != stack) free(head);
    net_tls_ctx_unref(tls);
    return -ENOMEM;
  }
  w->ln = ln;
  w->run = *run;
  proxy_try_t t = {
      .ip = lua_tostring(co, 4),
      .port = (int)lua_tointeger(co, 5),
      .key = lua_tostring(co, 6),
      .keepalive = (uint32_t)lua_tointeger(co, 7),
      .connect_ms = (uint32_t)lua_tointeger(co, 8),
      .timeout_ms = (uint32_t)lua_tointeger(co, 9),
      .head = head,
      .head_len = (size_t)hl,
      .body = body,
      .body_len = blen,
      .stream_body = hc->x.streaming,
      .chunk_body = hc->x.streaming && hc->x.req->chunked,
      .head_request = http_is_method(hc->x.req, "HEAD"),
      .upgrade = hc->x.req->upgrade,
      .fresh = lua_toboolean(co, 14),
      .tls = tls,
      .tls_host = tls_host,
  };
  int rc = proxy_start(pool, c, hc, &t, lx__try_done, w);
  if (head != stack) free(head);
  net_tls_ctx_unref(tls);
  if (rc) lx__wait_free(w);
  return rc;
}

double moonport_upstream_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* hash(s): a 32-bit FNV-1a of s, the same in every process (the
 * consistent-hash ring's points and keys). */
static int lx_up_hash(lua_State *L) {
  size_t n;
  const unsigned char *s = (const unsigned char *)luaL_checklstring(L, 1, &n);
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; i++) {
    h ^= s[i];
    h *= 16777619u;
  }
  /* FNV's low bits mix poorly for short keys: a final avalanche */
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  lua_pushnumber(L, (lua_Number)h);
  return 1;
}

/* idle(): upstream connections the lane's pool holds. */
static int lx_up_idle(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  proxy_pool_t *p = lx__pool(ln, false);
  lua_pushinteger(L, p ? (lua_Integer)proxy_pool_idle(p) : 0);
  return 1;
}

void lx_upstream_open(lua_State *L, lx_lane_t *ln) {
  lx_embed_core_table(L, "upstream");
  lx_push_waiter(L, ln, lx__try_check, lx__try_arm);
  lua_setfield(L, -2, "try");
  /* the waiter's halves, which up:proxy calls itself (upstream.lua says
   * why) */
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx__try_check, 1);
  lua_setfield(L, -2, "try_check");
  lua_pushlightuserdata(L, (void *)lx__try_arm);
  lua_setfield(L, -2, "try_arm");
  lua_pushcfunction(L, lx_up_hash);
  lua_setfield(L, -2, "hash");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_up_idle, 1);
  lua_setfield(L, -2, "idle");
  lua_pop(L, 1);
  lx_require(L, "moonport.upstream");
  lua_setfield(L, -2, "upstream");
  /* the edge's other half: rate and concurrency limits, Lua over
   * mp.shared's d:_gcra and d:incr */
  lx_require(L, "moonport.limit");
  lua_setfield(L, -2, "limit");
}

/* ---- /metrics ---- */

typedef struct {
  char name[160]; /* "upstream|addr" */
  double req, err, ms;
  bool down;
} lx_up_row_t;

static double lx__num(shdict_t *d, const char *key) {
  shd_value_t v;
  char buf[64];
  bool expired;
  if (shdict_get(d, key, strlen(key), false, &v, buf, sizeof(buf), &expired))
    return 0;
  return v.type == SHD_NUM ? v.num : 0;
}

static bool lx__is_down(shdict_t *d, const char *key) {
  shd_value_t v;
  char buf[64];
  bool expired;
  if (shdict_get(d, key, strlen(key), false, &v, buf, sizeof(buf), &expired) ||
      v.type != SHD_NUM)
    return false;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double now = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
  return v.num < 0 || v.num > now;
}

#define LX_UP_ROWS 512

char *lx_upstream_prometheus(lx_server_t *srv, size_t *n) {
  shdict_t *d = lx_shared_find(srv, LX_UP_DICT);
  if (!d) return NULL;
  size_t nk;
  char *keys = shdict_keys(d, 0, &nk);
  if (!keys) return NULL;
  lx_up_row_t *rows = calloc(LX_UP_ROWS, sizeof(*rows));
  size_t nr = 0, at = 0;
  for (size_t i = 0; rows && i < nk; i++) {
    uint32_t kl;
    memcpy(&kl, keys + at, 4);
    const char *k = keys + at + 4;
    at += 4 + kl;
    /* "m|U|A|r" names a server that was used; "d|U|A" one marked down */
    const char *name = NULL;
    size_t len = 0;
    if (kl > 4 && k[0] == 'm' && k[1] == '|' && k[kl - 1] == 'r' && k[kl - 2] == '|') {
      name = k + 2;
      len = kl - 4;
    } else if (kl > 2 && k[0] == 'd' && k[1] == '|') {
      name = k + 2;
      len = kl - 2;
    }
    if (!name || len >= sizeof(rows[0].name) || !memchr(name, '|', len)) continue;
    size_t j = 0;
    while (j < nr && (strlen(rows[j].name) != len || memcmp(rows[j].name, name, len)))
      j++;
    if (j == nr) {
      if (nr == LX_UP_ROWS) continue;
      memcpy(rows[nr].name, name, len);
      rows[nr].name[len] = 0;
      nr++;
    }
  }
  free(keys);
  if (!rows || !nr) {
    free(rows);
    return NULL;
  }
  char key[200];
  for (size_t j = 0; j < nr; j++) {
    snprintf(key, sizeof(key), "m|%s|r", rows[j].name);
    rows[j].req = lx__num(d, key);
    snprintf(key, sizeof(key), "m|%s|e", rows[j].name);
    rows[j].err = lx__num(d, key);
    snprintf(key, sizeof(key), "m|%s|t", rows[j].name);
    rows[j].ms = lx__num(d, key);
    snprintf(key, sizeof(key), "d|%s", rows[j].name);
    rows[j].down = lx__is_down(d, key);
  }
  static const struct {
    const char *name, *type, *help;
  } m[] = {
      {"moonport_upstream_requests_total", "counter", "Requests proxied to an upstream server (tries)."},
      {"moonport_upstream_errors_total", "counter", "Tries that failed or answered 5xx."},
      {"moonport_upstream_latency_seconds_sum", "counter", "Time to the response head, summed."},
      {"moonport_upstream_up", "gauge", "1 unless health marked the server down."},
  };
  size_t cap = 1024 + nr * 4 * 256, len = 0;
  char *out = malloc(cap);
  if (!out) {
    free(rows);
    return NULL;
  }
  for (int i = 0; i < 4; i++) {
    len += (size_t)snprintf(out + len, cap - len, "# HELP %s %s\n# TYPE %s %s\n", m[i].name,
                            m[i].help, m[i].name, m[i].type);
    for (size_t j = 0; j < nr; j++) {
      const char *bar = strchr(rows[j].name, '|');
      double v = i == 0 ? rows[j].req : i == 1 ? rows[j].err
               : i == 2 ? rows[j].ms / 1000 : (rows[j].down ? 0 : 1);
      len += (size_t)snprintf(out + len, cap - len, "%s{upstream=\"%.*s\",server=\"%s\"} %.*f\n",
                              m[i].name, (int)(bar - rows[j].name), rows[j].name, bar + 1,
                              i == 2 ? 3 : 0, v);
    }
  }
  free(rows);
  *n = len;
  return out;
}
