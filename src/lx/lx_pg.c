/* SPDX-License-Identifier: MIT */

/* lx_pg: mp.pg(url, opts), PostgreSQL for scripts over src/pg: a pool per
 * client object and lane (made on its first query), queries that wait in
 * their coroutine, results turned into Lua values by column type. The
 * conveniences (transactions, pipelines) are lua/moonport/pg.lua. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "lx/lx_client.h"
#include "lx/lx_embed.h"
#include "lx/lx_lane.h"
#include "lx/lx_pg.h"
#include "lx/lx_pg_result.h"
#include "pg/pg.h"

#define LX_PG_MT "moonport.pg"
#define LX_PG_TX_MT "moonport.pg.tx"
#define LX_PG_MS_MAX 86400000
#define LX_PG_TIMEOUT_MS 30000
#define LX_PG_CONNECT_MS 5000
#define LX_PG_IDLE_MS 60000
#define LX_PG_POOL_TIMEOUT_MS 10000

typedef struct lx_pg {
  lx_lane_t *ln;
  pg_pool_t *pool; /* made on first use; NULL before and once closed */
  bool closed;
  bool closing_now; /* inside pg_pool_free: answers go through a task */
  char *url;
  pg_opts_t o;
  uint32_t timeout_ms;
  struct lx_pg *prev, *next; /* the lane's open clients */
  pg_pool_t *listener; /* db:listen's connection, in the elected lane */
  int self_ref;        /* anchors the client while it listens */
} lx_pg_t;

typedef struct {
  lx_pg_t *db;
  pg_conn_t *conn; /* NULL once released */
  pg_pool_t *pool; /* the pool conn belongs to */
  bool copy_ended; /* COPY TO STDOUT: the rows are all in */
} lx_pg_tx_t;

/* The lane's state: its open clients and the json decoder's ref. */
typedef struct {
  lx_pg_t *dbs;
  int json_ref;
  int notify_ref; /* pg.lua's dispatcher of notifications */
} lx_pg_lane_t;

static const char lx_pg_key = 0;

static lx_pg_lane_t *lx__lane_state(lua_State *L) {
  lua_pushlightuserdata(L, (void *)&lx_pg_key);
  lua_rawget(L, LUA_REGISTRYINDEX);
  lx_pg_lane_t *s = lua_touserdata(L, -1);
  lua_pop(L, 1);
  return s;
}

/* One wait in flight: a query or an acquire. */
typedef struct {
  lx_lane_t *ln;
  lx_pg_t *db;
  lx_run_t run;
  pg_query_t *q;
  pg_res_t *res;     /* a query's answer, until pushed */
  pg_conn_t *conn;   /* an acquire's */
  char err[128];
  bool acquire;
  pg_res_t **bres;   /* a pipeline's answers */
  int nbres;
  int db_ref;        /* an acquire's client, for its tx's environment */
} lx_pgq_t;

static lx_pgq_t *lx__waiter_new(lx_lane_t *ln, lx_pg_t *db,
                                const lx_run_t *run) {
  lx_pgq_t *w = calloc(1, sizeof(*w));
  if (!w) return NULL;
  w->ln = ln;
  w->db = db;
  w->run = *run;
  w->db_ref = LUA_NOREF;
  return w;
}

/* ---- the pool ---- */

static pg_pool_t *lx__pool(lx_pg_t *db, char *err, size_t errlen) {
  if (db->pool) return db->pool;
  if (db->closed) {
    snprintf(err, errlen, "closed");
    return NULL;
  }
  int rc = 0;
  dns_resolver_t *d = lx_client_dns(db->ln, &rc);
  if (!d) {
    snprintf(err, errlen, "no resolver (%s)", strerror(-rc));
    return NULL;
  }
  db->pool = pg_pool_new(db->ln->r, d, db->url, &db->o, err, errlen);
  if (db->pool) pg_pool_set_stats(db->pool, db->ln->stats);
  return db->pool;
}

static void lx__db_close(lx_pg_t *db) {
  if (db->closed) return;
  db->closed = true;
  lx_pg_lane_t *s = lx__lane_state(db->ln->L);
  if (db->prev) db->prev->next = db->next;
  else if (s) s->dbs = db->next;
  if (db->next) db->next->prev = db->prev;
  db->prev = db->next = NULL;
  if (db->pool) {
    pg_pool_t *p = db->pool;
    db->pool = NULL;
    db->closing_now = true;
    pg_pool_free(p); /* waits are answered "closed", through tasks */
    db->closing_now = false;
  }
  if (db->listener) {
    pg_pool_free(db->listener);
    db->listener = NULL;
  }
  if (db->self_ref != LUA_NOREF && !db->ln->closing) {
    luaL_unref(db->ln->L, LUA_REGISTRYINDEX, db->self_ref);
  }
  db->self_ref = LUA_NOREF;
  free(db->url);
  db->url = NULL;
}

void lx_pg_close_all(lx_lane_t *ln) {
  lx_pg_lane_t *s = lx__lane_state(ln->L);
  while (s && s->dbs) lx__db_close(s->dbs);
}

/* ---- waits ---- */

static void lx__resume_task(void *a, void *b);

static void lx__answer(lx_pgq_t *w) {
  lx_lane_t *ln = w->ln;
  if (ln->closing) {
    lx_run_abandon(ln, &w->run);
    if (w->db_ref != LUA_NOREF) luaL_unref(ln->L, LUA_REGISTRYINDEX, w->db_ref);
    for (int i = 0; i < w->nbres; i++) pg_res_free(w->bres[i]);
    free(w->bres);
    pg_res_free(w->res);
    if (w->conn && w->db->pool) pg_release(w->db->pool, w->conn, false);
    free(w);
    return;
  }
  lx_run_t run = w->run;
  lua_State *co = run.co;
  int n;
  if (w->acquire) {
    if (!w->conn) {
      lua_pushnil(co);
      lua_pushstring(co, w->err);
      n = 2;
    } else {
      lx_pg_tx_t *tx = lua_newuserdata(co, sizeof(*tx));
      tx->db = w->db;
      tx->conn = w->conn;
      tx->pool = w->db->pool;
      tx->copy_ended = false;
      luaL_getmetatable(co, LX_PG_TX_MT);
      lua_setmetatable(co, -2);
      /* The tx keeps its client alive (its __gc reads the client). */
      lua_createtable(co, 1, 0);
      lua_rawgeti(co, LUA_REGISTRYINDEX, w->db_ref);
      lua_rawseti(co, -2, 1);
      lua_setfenv(co, -2);
      n = 1;
    }
    luaL_unref(co, LUA_REGISTRYINDEX, w->db_ref);
  } else if (w->bres) {
    lx_pg_lane_t *s = lx__lane_state(co);
    lua_createtable(co, w->nbres, 0);
    for (int i = 0; i < w->nbres; i++) {
      int k = lx_pg_push_result(co, w->bres[i], s->json_ref);
      if (k > 1) { /* nil, err[, info]: { err =, sqlstate =, ... } */
        int top = lua_gettop(co);
        if (k == 3) {
          lua_pushvalue(co, top - 1);
          lua_setfield(co, top, "err");
          lua_replace(co, top - 2);
          lua_settop(co, top - 2);
        } else {
          lua_createtable(co, 0, 1);
          lua_pushvalue(co, top);
          lua_setfield(co, -2, "err");
          lua_replace(co, top - 1);
          lua_settop(co, top - 1);
        }
      }
      lua_rawseti(co, -2, i + 1);
      pg_res_free(w->bres[i]);
    }
    free(w->bres);
    n = 1;
  } else {
    lx_pg_lane_t *s = lx__lane_state(co);
    n = lx_pg_push_result(co, w->res, s->json_ref);
    pg_res_free(w->res);
  }
  free(w);
  lx_resume(ln, &run, n);
}

static void lx__resume_task(void *a, void *b) {
  (void)b;
  lx__answer(a);
}

static void lx__deliver(lx_pgq_t *w) {
  /* From inside pg_pool_free (db:close from another callback): the
   * resume waits for a task of its own. */
  if (w->db->closing_now && !w->ln->closing &&
      reactor_defer(w->ln->r, lx__resume_task, w, NULL) == 0)
    return;
  lx__answer(w);
}

static void lx__query_done(void *arg, pg_res_t *res) {
  lx_pgq_t *w = arg;
  w->res = res;
  lx__deliver(w);
}

static void lx__batch_done(void *arg, pg_res_t **res, int n) {
  lx_pgq_t *w = arg;
  w->bres = res;
  w->nbres = n;
  lx__deliver(w);
}

static void lx__acquire_done(void *arg, pg_conn_t *c, const char *err) {
  lx_pgq_t *w = arg;
  w->conn = c;
  if (err) snprintf(w->err, sizeof(w->err), "%s", err);
  lx__deliver(w);
}

static void lx__cancel(lx_lane_t *ln, void *arg) {
  lx_pgq_t *w = arg;
  pg_query_abandon(w->q);
  if (w->db_ref != LUA_NOREF) luaL_unref(ln->L, LUA_REGISTRYINDEX, w->db_ref);
  lx_run_abandon(ln, &w->run);
  free(w);
}

/* ---- options ---- */

static uint32_t lx__opt_ms(lua_State *L, int t, const char *key, uint32_t dflt,
                           const char *api) {
  lua_getfield(L, t, key);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return dflt;
  }
  lua_Number v = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : -1;
  lua_pop(L, 1);
  if (!(v >= 0 && v <= LX_PG_MS_MAX))
    luaL_error(L, "%s: %s must be a number of milliseconds from 0 to %d", api,
               key, LX_PG_MS_MAX);
  return (uint32_t)ceil(v);
}

static lua_Number lx__opt_num(lua_State *L, int t, const char *key,
                              lua_Number dflt, lua_Number min, lua_Number max,
                              const char *api) {
  lua_getfield(L, t, key);
  if (lua_isnil(L, -1)) {
    lua_pop(L, 1);
    return dflt;
  }
  lua_Number v = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : NAN;
  lua_pop(L, 1);
  if (!(v >= min && v <= max) || v != floor(v))
    luaL_error(L, "%s: %s must be a whole number from %.0f to %.0f", api, key,
               min, max);
  return v;
}

static void lx__opt_keys(lua_State *L, int t, const char *const *keys,
                         const char *api) {
  lua_pushnil(L);
  while (lua_next(L, t)) {
    lua_pop(L, 1);
    bool known = false;
    if (lua_type(L, -1) == LUA_TSTRING)
      for (const char *const *k = keys; *k && !known; k++)
        known = strcmp(lua_tostring(L, -1), *k) == 0;
    if (!known)
      luaL_error(L, "%s: unknown option '%s'", api,
                 lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                : luaL_typename(L, -1));
  }
}

/* The target at idx: a client, or a transaction (its connection). */
static lx_pg_t *lx__target(lua_State *L, int idx, lx_pg_tx_t **txp) {
  *txp = NULL;
  void *u = lua_touserdata(L, idx);
  if (u && lua_getmetatable(L, idx)) {
    luaL_getmetatable(L, LX_PG_MT);
    bool db = lua_rawequal(L, -1, -2);
    lua_pop(L, 1);
    luaL_getmetatable(L, LX_PG_TX_MT);
    bool tx = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    if (db) return u;
    if (tx) {
      *txp = u;
      return (*txp)->db;
    }
  }
  luaL_argerror(L, idx, "pg client or transaction expected");
  return NULL;
}

/* A query's options and the index of its sql: q({ timeout = ms }, sql, ...). */
static int lx__query_opts(lua_State *L, int idx, const lx_pg_t *db,
                          uint32_t *ms) {
  *ms = db->timeout_ms;
  if (lua_type(L, idx) != LUA_TTABLE) return idx;
  static const char *const keys[] = {"timeout", NULL};
  lx__opt_keys(L, idx, keys, "pg: query");
  *ms = lx__opt_ms(L, idx, "timeout", db->timeout_ms, "pg: query");
  return idx + 1;
}

/* A misuse found by check, which pg.lua calls: raised at the line that
 * called db:query (level 2: check's caller is pg.lua's wrapper). */
static int lx__misuse(lua_State *L, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  luaL_where(L, 2);
  lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  lua_concat(L, 2);
  return lua_error(L);
}

/* Checks one parameter of a pipeline statement or a query. */
static void lx__check_param(lua_State *L, int idx, int n) {
  int t = lua_type(L, idx);
  if (t != LUA_TNIL && t != LUA_TBOOLEAN && t != LUA_TNUMBER &&
      t != LUA_TSTRING &&
      !(t == LUA_TLIGHTUSERDATA && lua_touserdata(L, idx) == NULL))
    lx__misuse(L,
               "pg: parameter $%d is a %s (nil, booleans, numbers and "
               "strings only)",
               n, luaL_typename(L, idx));
  if (t == LUA_TNUMBER && !isfinite(lua_tonumber(L, idx)))
    lx__misuse(L, "pg: parameter $%d is not a finite number", n);
}

/* The end of a check: whether db (or tx) can take a query now: true, or
 * false and why. Raises when this is no place to wait. */
static int lx__check_ready(lua_State *L, lx_pg_t *db, lx_pg_tx_t *tx,
                           const char *what) {
  lx_check_waitable(L, lua_touserdata(L, lua_upvalueindex(1)), what);
  const char *why = NULL;
  if (db->closed)
    why = "closed";
  else if (tx && !tx->conn)
    why = "transaction is over";
  else if (tx && (tx->pool != db->pool || !pg_conn_alive(tx->conn)))
    why = "closed";
  if (why) {
    lua_pushboolean(L, 0);
    lua_pushstring(L, why);
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

/* core.pg.check(db_or_tx, [opts], sql, ...): raises on misuse; false and
 * why when it cannot be sent; true otherwise. */
static int lx_pg_check(lua_State *L) {
  lx_pg_tx_t *tx;
  lx_pg_t *db = lx__target(L, 1, &tx);
  uint32_t ms;
  int first = lx__query_opts(L, 2, db, &ms);
  if (lua_type(L, first) != LUA_TSTRING)
    return lx__misuse(L, "pg: query needs an SQL string (got %s)",
                      luaL_typename(L, first));
  int top = lua_gettop(L);
  if (top - first > PG_MAX_PARAMS)
    return lx__misuse(L, "pg: at most %d parameters", PG_MAX_PARAMS);
  for (int i = first + 1; i <= top; i++) lx__check_param(L, i, i - first);
  return lx__check_ready(L, db, tx, "pg query");
}

/* v in decimal into buf (32 bytes); its length. The common parameter
 * (an id) without snprintf's floating-point formatting. */
static size_t lx__format_int(char *buf, long long v) {
  char tmp[24];
  size_t n = 0;
  unsigned long long u =
      v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
  do {
    tmp[n++] = (char)('0' + u % 10);
    u /= 10;
  } while (u);
  size_t len = 0;
  if (v < 0) buf[len++] = '-';
  while (n) buf[len++] = tmp[--n];
  buf[len] = 0;
  return len;
}

/* Fills vals/lens for the parameters at L[first .. first + n - 1], numbers
 * and booleans as text into nums (32 bytes each). */
static void lx__params(lua_State *L, int first, int n, const char **vals,
                       size_t *lens, char (*nums)[32]) {
  for (int i = 0; i < n; i++) {
    int idx = first + i;
    switch (lua_type(L, idx)) {
    case LUA_TBOOLEAN:
      vals[i] = lua_toboolean(L, idx) ? "true" : "false";
      lens[i] = strlen(vals[i]);
      break;
    case LUA_TNUMBER: {
      lua_Number v = lua_tonumber(L, idx);
      vals[i] = nums[i];
      lens[i] = v == floor(v) && fabs(v) < 1e18 && (v != 0 || !signbit(v))
                    ? lx__format_int(nums[i], (long long)v)
                    : (size_t)snprintf(nums[i], 32, "%.17g", v);
      break;
    }
    case LUA_TSTRING: vals[i] = lua_tolstring(L, idx, &lens[i]); break;
    default: vals[i] = NULL; lens[i] = 0;
    }
  }
}

static int lx_pg_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  lx_pg_tx_t *tx;
  lx_pg_t *db = lx__target(co, 3, &tx); /* checked: does not raise */
  uint32_t ms;
  int first = lx__query_opts(co, 4, db, &ms);
  const char *sql = lua_tostring(co, first);
  int n = lua_gettop(co) - first;
  char err[256];
  pg_pool_t *p = lx__pool(db, err, sizeof(err));
  if (!p) return -ENOTCONN;
  const char *sv[16];
  size_t sl[16];
  char snum[16][32];
  const char **vals = sv;
  size_t *lens = sl;
  char (*nums)[32] = snum;
  void *blk = NULL;
  if (n > 16) {
    blk = malloc((size_t)n * (sizeof(char *) + sizeof(size_t) + 32));
    if (!blk) return -ENOMEM;
    vals = blk;
    lens = (size_t *)(vals + n);
    nums = (char (*)[32])(lens + n);
  }
  lx__params(co, first + 1, n, vals, lens, nums);
  lx_pgq_t *w = lx__waiter_new(ln, db, run);
  if (!w) {
    free(blk);
    return -ENOMEM;
  }
  w->q = pg_query(p, tx ? tx->conn : NULL, sql, n, vals, lens, ms,
                  lx__query_done, w);
  free(blk);
  if (!w->q) {
    int e = errno;
    free(w);
    return -e;
  }
  lx_wait_cancel_on(ln, lx__cancel, w);
  return 0;
}

/* core.pg.pipeline_check(db_or_tx, [opts], list) */
static int lx_pg_pipeline_check(lua_State *L) {
  lx_pg_tx_t *tx;
  lx_pg_t *db = lx__target(L, 1, &tx);
  uint32_t ms = db->timeout_ms;
  int li = lua_type(L, 3) == LUA_TTABLE ? lx__query_opts(L, 2, db, &ms) : 2;
  if (lua_type(L, li) != LUA_TTABLE)
    return lx__misuse(L, "pg: pipeline needs a list of { sql, params... }");
  int n = (int)lua_objlen(L, li);
  if (n < 1 || n > PG_PIPELINE_DEPTH)
    return lx__misuse(L, "pg: pipeline of %d statements (1 to %d)", n, PG_PIPELINE_DEPTH);
  for (int i = 1; i <= n; i++) {
    lua_rawgeti(L, li, i);
    int st = lua_gettop(L);
    if (lua_type(L, st) != LUA_TTABLE) return lx__misuse(L, "pg: pipeline statement %d is not a table", i);
    lua_rawgeti(L, st, 1);
    if (lua_type(L, -1) != LUA_TSTRING)
      return lx__misuse(L, "pg: pipeline statement %d needs an SQL string first", i);
    lua_pop(L, 1);
    lua_getfield(L, st, "n");
    int np = lua_isnumber(L, -1) ? (int)lua_tonumber(L, -1) - 1 : (int)lua_objlen(L, st) - 1;
    lua_pop(L, 1);
    if (np > PG_MAX_PARAMS) return lx__misuse(L, "pg: at most %d parameters", PG_MAX_PARAMS);
    for (int j = 1; j <= np; j++) {
      lua_rawgeti(L, st, j + 1);
      lx__check_param(L, lua_gettop(L), j);
      lua_pop(L, 1);
    }
    lua_pop(L, 1);
  }
  return lx__check_ready(L, db, tx, "pg pipeline");
}

static int lx_pg_pipeline_arm(lx_lane_t *ln, const lx_run_t *run,
                              lua_State *co) {
  lx_pg_tx_t *tx;
  lx_pg_t *db = lx__target(co, 3, &tx);
  uint32_t ms = db->timeout_ms;
  int li = lua_type(co, 5) == LUA_TTABLE ? lx__query_opts(co, 4, db, &ms) : 4;
  int n = (int)lua_objlen(co, li);
  char err[256];
  pg_pool_t *p = lx__pool(db, err, sizeof(err));
  if (!p) return -ENOTCONN;
  /* The statements' parameters, unpacked onto co's stack (they stay
   * there, alive, until pg_batch has copied them). */
  int total = 0;
  int base = lua_gettop(co);
  if (!lua_checkstack(co, n * 2 + 8)) return -ENOMEM;
  int *np = calloc((size_t)n, sizeof(int));
  pg_stmt_args_t *a = calloc((size_t)n, sizeof(*a));
  if (!np || !a) {
    free(np);
    free(a);
    return -ENOMEM;
  }
  for (int i = 0; i < n; i++) {
    lua_rawgeti(co, li, i + 1);
    lua_getfield(co, -1, "n");
    int k = lua_isnumber(co, -1) ? (int)lua_tonumber(co, -1) - 1 : (int)lua_objlen(co, -2) - 1;
    lua_pop(co, 1);
    np[i] = k < 0 ? 0 : k;
    total += np[i];
  }
  size_t per = sizeof(char *) + sizeof(size_t) + 32;
  char *blk = malloc((size_t)(total ? total : 1) * per);
  if (!blk || !lua_checkstack(co, total + 8)) {
    free(np);
    free(a);
    free(blk);
    return -ENOMEM;
  }
  const char **vals = (const char **)blk;
  size_t *lens = (size_t *)(vals + total);
  char (*nums)[32] = (char (*)[32])(lens + total);
  int off = 0;
  for (int i = 0; i < n; i++) {
    int st = base + 1 + i;
    lua_rawgeti(co, st, 1);
    a[i].sql = lua_tostring(co, -1);
    lua_pop(co, 1); /* the string stays alive: the table holds it */
    int first = lua_gettop(co) + 1;
    for (int j = 0; j < np[i]; j++) lua_rawgeti(co, st, j + 2);
    lx__params(co, first, np[i], vals + off, lens + off, nums + off);
    a[i].nparams = np[i];
    a[i].vals = vals + off;
    a[i].lens = lens + off;
    off += np[i];
  }
  lx_pgq_t *w = lx__waiter_new(ln, db, run);
  if (w) w->q = pg_batch(p, tx ? tx->conn : NULL, n, a, ms, lx__batch_done, w);
  int e = errno;
  lua_settop(co, base);
  free(np);
  free(a);
  free(blk);
  if (!w) return -ENOMEM;
  if (!w->q) {
    free(w);
    return -e;
  }
  lx_wait_cancel_on(ln, lx__cancel, w);
  return 0;
}

/* ---- COPY: steps that never wait (false: wait, then again) ---- */

#define LX_PG_COPY_CHUNK ((size_t)64 << 10)

static pg_conn_t *lx__copy_conn(lua_State *L, lx_pg_tx_t **txp) {
  lx_pg_tx_t *tx = luaL_checkudata(L, 1, LX_PG_TX_MT);
  *txp = tx;
  if (!tx->conn || tx->pool != tx->db->pool) return NULL;
  return tx->conn;
}

static int lx__copy_rc(lua_State *L, int rc) {
  if (rc == -EAGAIN) {
    lua_pushboolean(L, 0);
    return 1;
  }
  if (rc < 0) {
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int lx_pg_copy_begin(lua_State *L) {
  lx_pg_tx_t *tx;
  pg_conn_t *c = lx__copy_conn(L, &tx);
  const char *sql = luaL_checkstring(L, 2);
  tx->copy_ended = false;
  int rc = c ? pg_copy_begin(c, sql) : -EPIPE;
  if (rc == -EBUSY) {
    lua_pushnil(L);
    lua_pushliteral(L, "busy");
    return 2;
  }
  return lx__copy_rc(L, rc);
}

static int lx__copy_res(lua_State *L, pg_res_t *res) {
  lx_pg_lane_t *s = lx__lane_state(L);
  if (pg_res_error(res)) {
    int n = lx_pg_push_result(L, res, s->json_ref);
    pg_res_free(res);
    return n;
  }
  long long n = pg_res_affected(res);
  pg_res_free(res);
  lua_pushnumber(L, (lua_Number)(n < 0 ? 0 : n));
  return 1;
}

static int lx_pg_copy_started(lua_State *L) {
  lx_pg_tx_t *tx;
  pg_conn_t *c = lx__copy_conn(L, &tx);
  pg_res_t *res = NULL;
  int rc = c ? pg_copy_started(c, &res) : -EPIPE;
  if (rc == 1 || rc == 2) {
    lua_pushstring(L, rc == 1 ? "in" : "out");
    return 1;
  }
  if (rc == 0) return lx__copy_res(L, res) > 1 ? 3 : 1;
  return lx__copy_rc(L, rc);
}

static int lx_pg_copy_put(lua_State *L) {
  lx_pg_tx_t *tx;
  pg_conn_t *c = lx__copy_conn(L, &tx);
  size_t len;
  const char *d = luaL_checklstring(L, 2, &len);
  return lx__copy_rc(L, c ? pg_copy_put(c, d, len) : -EPIPE);
}

static int lx_pg_copy_end(lua_State *L) {
  lx_pg_tx_t *tx;
  pg_conn_t *c = lx__copy_conn(L, &tx);
  const char *why = luaL_optstring(L, 2, NULL);
  return lx__copy_rc(L, c ? pg_copy_end(c, why) : -EPIPE);
}

/* Rows that are in, up to LX_PG_COPY_CHUNK bytes, as one string; true at
 * the end; false: wait. */
static int lx_pg_copy_get(lua_State *L) {
  lx_pg_tx_t *tx;
  pg_conn_t *c = lx__copy_conn(L, &tx);
  if (!c) return lx__copy_rc(L, -EPIPE);
  if (tx->copy_ended) return lx__copy_rc(L, 0);
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  size_t got = 0;
  int rc;
  for (;;) {
    char *row;
    size_t len;
    rc = pg_copy_get(c, &row, &len);
    if (rc != 1) break;
    luaL_addlstring(&b, row, len); /* may raise (no memory): row leaks then */
    pg_copy_free(row);
    got += len;
    if (got >= LX_PG_COPY_CHUNK) break;
  }
  if (rc == 0) tx->copy_ended = true;
  if (got) {
    luaL_pushresult(&b);
    return 1;
  }
  luaL_pushresult(&b);
  lua_pop(L, 1);
  return lx__copy_rc(L, rc == 0 ? 0 : rc);
}

static int lx_pg_copy_finish(lua_State *L) {
  lx_pg_tx_t *tx;
  pg_conn_t *c = lx__copy_conn(L, &tx);
  pg_res_t *res = NULL;
  int rc = c ? pg_copy_finish(c, &res) : -EPIPE;
  if (rc == 0) return lx__copy_res(L, res);
  return lx__copy_rc(L, rc);
}

typedef struct {
  lx_lane_t *ln;
  lx_run_t run;
  pg_conn_t *c;
} lx_pgw_t;

static void lx__copy_woken(void *arg) {
  lx_pgw_t *w = arg;
  lx_lane_t *ln = w->ln;
  lx_run_t run = w->run;
  free(w);
  if (ln->closing) {
    lx_run_abandon(ln, &run);
    return;
  }
  lx_resume(ln, &run, 0);
}

static void lx__copy_cancel(lx_lane_t *ln, void *arg) {
  lx_pgw_t *w = arg;
  pg_copy_unwait(w->c);
  lx_run_abandon(ln, &w->run);
  free(w);
}

static int lx_pg_copy_wait_check(lua_State *L) {
  lx_pg_tx_t *tx = luaL_checkudata(L, 1, LX_PG_TX_MT);
  (void)tx;
  lx_check_waitable(L, lua_touserdata(L, lua_upvalueindex(1)), "pg copy");
  return 0;
}

/* copy_wait(tx, events): until the connection has those events */
static int lx_pg_copy_wait_arm(lx_lane_t *ln, const lx_run_t *run,
                               lua_State *co) {
  lx_pg_tx_t *tx = lua_touserdata(co, 3);
  unsigned ev = (unsigned)lua_tonumber(co, 4);
  if (!tx->conn || tx->pool != tx->db->pool) return -EPIPE;
  lx_pgw_t *w = calloc(1, sizeof(*w));
  if (!w) return -ENOMEM;
  w->ln = ln;
  w->run = *run;
  w->c = tx->conn;
  pg_copy_wait(tx->conn, ev, lx__copy_woken, w);
  lx_wait_cancel_on(ln, lx__copy_cancel, w);
  return 0;
}

/* core.pg.acquire_check(db) / acquire_arm: a connection for a
 * transaction, as a tx object. */
static int lx_pg_acquire_check(lua_State *L) {
  lx_pg_t *db = luaL_checkudata(L, 1, LX_PG_MT);
  lx_check_waitable(L, lua_touserdata(L, lua_upvalueindex(1)), "pg transaction");
  if (db->closed) {
    lua_pushboolean(L, 0);
    lua_pushliteral(L, "closed");
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int lx_pg_acquire_arm(lx_lane_t *ln, const lx_run_t *run,
                             lua_State *co) {
  lx_pg_t *db = lua_touserdata(co, 3);
  char err[256];
  pg_pool_t *p = lx__pool(db, err, sizeof(err));
  if (!p) return -ENOTCONN;
  lx_pgq_t *w = lx__waiter_new(ln, db, run);
  if (!w) return -ENOMEM;
  w->acquire = true;
  lua_pushvalue(co, 3);
  w->db_ref = luaL_ref(co, LUA_REGISTRYINDEX);
  w->q = pg_acquire(p, lx__acquire_done, w);
  if (!w->q) {
    int e = errno;
    luaL_unref(co, LUA_REGISTRYINDEX, w->db_ref);
    free(w);
    return -e;
  }
  lx_wait_cancel_on(ln, lx__cancel, w);
  return 0;
}

/* core.pg.release(tx, reusable) */
static int lx_pg_release(lua_State *L) {
  lx_pg_tx_t *tx = luaL_checkudata(L, 1, LX_PG_TX_MT);
  bool reusable = lua_toboolean(L, 2);
  if (tx->conn && tx->pool && tx->pool == tx->db->pool)
    pg_release(tx->pool, tx->conn, reusable);
  tx->conn = NULL;
  return 0;
}

static int lx_pg_tx_gc(lua_State *L) {
  lx_pg_tx_t *tx = luaL_checkudata(L, 1, LX_PG_TX_MT);
  /* Never finished (its task was killed mid-transaction): the connection
   * is in a transaction nobody will end, so it is closed. */
  if (tx->conn && tx->pool && tx->pool == tx->db->pool)
    pg_release(tx->pool, tx->conn, false);
  tx->conn = NULL;
  return 0;
}

/* core.pg.stats(db): { size =, busy =, waiting =, queries =, errors =,
 * timeouts =, query_ms = } of this lane's pool. */
static int lx_pg_stats(lua_State *L) {
  lx_pg_t *db = luaL_checkudata(L, 1, LX_PG_MT);
  pg_pool_stats_t st = {0};
  if (db->pool) pg_pool_stats(db->pool, &st);
  lua_createtable(L, 0, 7);
  lua_pushnumber(L, st.size);
  lua_setfield(L, -2, "size");
  lua_pushnumber(L, st.busy);
  lua_setfield(L, -2, "busy");
  lua_pushnumber(L, st.waiting);
  lua_setfield(L, -2, "waiting");
  lua_pushnumber(L, (lua_Number)st.queries);
  lua_setfield(L, -2, "queries");
  lua_pushnumber(L, (lua_Number)st.errors);
  lua_setfield(L, -2, "errors");
  lua_pushnumber(L, (lua_Number)st.timeouts);
  lua_setfield(L, -2, "timeouts");
  lua_pushnumber(L, (lua_Number)st.query_us / 1000.0);
  lua_setfield(L, -2, "query_ms");
  return 1;
}

/* A notification for the elected lane's client: pg.lua's dispatcher
 * runs (db, channel, payload) in a coroutine of its own. */
static void lx__notify(void *arg, const char *ch, const char *payload,
                       size_t len) {
  lx_pg_t *db = arg;
  lx_lane_t *ln = db->ln;
  if (ln->closing || db->self_ref == LUA_NOREF) return;
  lua_State *L = ln->L;
  lx_pg_lane_t *s = lx__lane_state(L);
  if (!lua_checkstack(L, 5)) return;
  lua_rawgeti(L, LUA_REGISTRYINDEX, s->notify_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, db->self_ref);
  lua_pushstring(L, ch);
  lua_pushlstring(L, payload, len);
  lx_call(ln, L, 3, LX_PLAIN, NULL, NULL, "pg listen");
}

/* The lane that holds the server's LISTEN connections: the root's, or
 * the first lane of a one-process server. */
static bool lx__elected(const lx_lane_t *ln) {
  return ln->is_root ||
         (!ln->srv->root && ln->srv->proc.ipc_fd < 0 && ln->index == 0);
}

/* core.pg.elected() */
static int lx_pg_elected(lua_State *L) {
  lua_pushboolean(L, lx__elected(lua_touserdata(L, lua_upvalueindex(1))));
  return 1;
}

/* core.pg.listen(db, channel): LISTEN on the client's own connection;
 * true, or nil and why. The elected lane only (pg.lua checks). */
static int lx_pg_listen(lua_State *L) {
  lx_pg_t *db = luaL_checkudata(L, 1, LX_PG_MT);
  const char *ch = luaL_checkstring(L, 2);
  if (db->closed) {
    lua_pushnil(L);
    lua_pushliteral(L, "closed");
    return 2;
  }
  char err[256];
  if (!db->listener) {
    int rc = 0;
    dns_resolver_t *d = lx_client_dns(db->ln, &rc);
    if (!d) return lx_push_fail(L, rc);
    pg_opts_t o = db->o;
    o.max = 1;
    o.idle_ms = 0;
    o.pool_timeout_ms = 0;
    o.stmt_cache = 0;
    db->listener = pg_pool_new(db->ln->r, d, db->url, &o, err, sizeof(err));
    if (!db->listener) {
      lua_pushnil(L);
      lua_pushstring(L, err);
      return 2;
    }
  }
  int rc = pg_pool_listen(db->listener, ch, lx__notify, db);
  if (rc) return lx_push_fail(L, rc);
  if (db->self_ref == LUA_NOREF) {
    lua_pushvalue(L, 1);
    db->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int lx_pg_gc(lua_State *L) {
  lx__db_close(luaL_checkudata(L, 1, LX_PG_MT));
  return 0;
}

static int lx_pg_tostring(lua_State *L) {
  lx_pg_t *db = luaL_checkudata(L, 1, LX_PG_MT);
  lua_pushfstring(L, "pg client (%s)", db->closed ? "closed" : "open");
  return 1;
}

/* mp.pg(url [, { pool =, timeout =, connect_timeout =, idle_timeout =,
 * pool_timeout =, statement_cache =, max_result = }]) */
static int lx_pg_new(lua_State *L) {
  lx_lane_t *ln = lua_touserdata(L, lua_upvalueindex(1));
  const char *url = luaL_checkstring(L, 1);
  pg_opts_t o = {.max = PG_POOL_DEFAULT, .connect_ms = LX_PG_CONNECT_MS,
                 .idle_ms = LX_PG_IDLE_MS, .pool_timeout_ms = LX_PG_POOL_TIMEOUT_MS,
                 .max_result = PG_MAX_RESULT_DEFAULT,
                 .stmt_cache = PG_STMT_CACHE_DEFAULT};
  uint32_t timeout = LX_PG_TIMEOUT_MS;
  if (!lua_isnoneornil(L, 2)) {
    luaL_checktype(L, 2, LUA_TTABLE);
    static const char *const keys[] = {"pool", "timeout", "connect_timeout",
                                       "idle_timeout", "pool_timeout",
                                       "statement_cache", "max_result", NULL};
    lx__opt_keys(L, 2, keys, "mp.pg");
    o.max = (int)lx__opt_num(L, 2, "pool", o.max, 1, PG_POOL_MAX, "mp.pg");
    timeout = lx__opt_ms(L, 2, "timeout", timeout, "mp.pg");
    o.connect_ms = lx__opt_ms(L, 2, "connect_timeout", o.connect_ms, "mp.pg");
    o.idle_ms = lx__opt_ms(L, 2, "idle_timeout", o.idle_ms, "mp.pg");
    o.pool_timeout_ms = lx__opt_ms(L, 2, "pool_timeout", o.pool_timeout_ms, "mp.pg");
    o.stmt_cache = (int)lx__opt_num(L, 2, "statement_cache", o.stmt_cache, 0,
                                    100000, "mp.pg");
    o.max_result = (size_t)lx__opt_num(L, 2, "max_result", (lua_Number)o.max_result,
                                       1024, (lua_Number)((size_t)1 << 40), "mp.pg");
  }
  char err[512];
  if (pg_url_check(url, err, sizeof(err)))
    return luaL_error(L, "mp.pg: %s", err);
  lx_pg_t *db = lua_newuserdata(L, sizeof(*db));
  memset(db, 0, sizeof(*db));
  db->ln = ln;
  db->o = o;
  db->timeout_ms = timeout;
  db->self_ref = LUA_NOREF;
  db->url = strdup(url);
  luaL_getmetatable(L, LX_PG_MT);
  lua_setmetatable(L, -2);
  if (!db->url) {
    db->closed = true;
    return luaL_error(L, "mp.pg: out of memory");
  }
  lx_pg_lane_t *s = lx__lane_state(L);
  db->next = s->dbs;
  if (db->next) db->next->prev = db;
  s->dbs = db;
  return 1;
}

static int lx_pg_close(lua_State *L) { return lx_pg_gc(L); }

void lx_pg_open(lua_State *L, lx_lane_t *ln) {
  lua_pushlightuserdata(L, (void *)&lx_pg_key);
  lx_pg_lane_t *s = lua_newuserdata(L, sizeof(*s));
  memset(s, 0, sizeof(*s));
  lx_require(L, "moonport.json");
  lua_getfield(L, -1, "decode");
  s->json_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  lua_rawset(L, LUA_REGISTRYINDEX);

  lx_embed_core_table(L, "pg");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_pg_check, 1);
  lua_setfield(L, -2, "check");
  lua_pushlightuserdata(L, (void *)lx_pg_arm);
  lua_setfield(L, -2, "arm");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_pg_acquire_check, 1);
  lua_setfield(L, -2, "acquire_check");
  lua_pushlightuserdata(L, (void *)lx_pg_acquire_arm);
  lua_setfield(L, -2, "acquire_arm");
  lua_pushcfunction(L, lx_pg_release);
  lua_setfield(L, -2, "release");
  static const luaL_Reg copy_fns[] = {
      {"copy_begin", lx_pg_copy_begin}, {"copy_started", lx_pg_copy_started},
      {"copy_put", lx_pg_copy_put},     {"copy_end", lx_pg_copy_end},
      {"copy_get", lx_pg_copy_get},     {"copy_finish", lx_pg_copy_finish},
      {NULL, NULL}};
  for (const luaL_Reg *f = copy_fns; f->name; f++) {
    lua_pushcfunction(L, f->func);
    lua_setfield(L, -2, f->name);
  }
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_pg_copy_wait_check, 1);
  lua_setfield(L, -2, "copy_wait_check");
  lua_pushlightuserdata(L, (void *)lx_pg_copy_wait_arm);
  lua_setfield(L, -2, "copy_wait_arm");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_pg_pipeline_check, 1);
  lua_setfield(L, -2, "pipeline_check");
  lua_pushlightuserdata(L, (void *)lx_pg_pipeline_arm);
  lua_setfield(L, -2, "pipeline_arm");
  lua_pushcfunction(L, lx_pg_stats);
  lua_setfield(L, -2, "stats");
  lua_pushcfunction(L, lx_pg_close);
  lua_setfield(L, -2, "close");
  lua_pushcfunction(L, lx_pg_listen);
  lua_setfield(L, -2, "listen");
  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_pg_elected, 1);
  lua_setfield(L, -2, "elected");
  lua_pop(L, 1);

  /* The methods are pg.lua's; __index is filled there. */
  lx_require(L, "moonport.pg"); /* { db = methods, tx = methods, notify = } */
  lua_getfield(L, -1, "notify");
  s->notify_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  luaL_newmetatable(L, LX_PG_MT);
  lua_getfield(L, -2, "db");
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, lx_pg_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushcfunction(L, lx_pg_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pushliteral(L, LX_PG_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
  luaL_newmetatable(L, LX_PG_TX_MT);
  lua_getfield(L, -2, "tx");
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, lx_pg_tx_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushliteral(L, LX_PG_TX_MT);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 2);

  lua_pushlightuserdata(L, ln);
  lua_pushcclosure(L, lx_pg_new, 1);
  lua_setfield(L, -2, "pg");
  lua_pushlightuserdata(L, NULL); /* mp.null */
  lua_setfield(L, -2, "null");
}
