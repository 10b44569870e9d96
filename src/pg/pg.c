/* SPDX-License-Identifier: MIT */

/* pg: a lane's pool of libpq connections in pipeline mode on its reactor
 * (pg.h). This file is the pool: its FIFO of waiting queries, the tick
 * (a 0 ms timer) that runs every callback outside libpq and outside the
 * call that started the work, choosing a connection for each query, and
 * the API that makes queries, pipelines and pinned connections. A
 * connection's own life is pg_conn.c; results pg_res.c; LISTEN
 * pg_listen.c; COPY pg_copy.c. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "pg/pg_int.h"

void pg__st_add(pg_pool_t *p, int what, uint64_t n) {
  if (p->stats) stats_add(p->stats, what, n);
}

/* Keeps the busy gauge: a live connection with a query in flight or a
 * transaction on it. */
void pg__conn_busy_update(pg_conn_t *c) {
  bool b = c->st != C_DEAD && (c->inflight > 0 || c->pinned);
  if (b == c->busy_counted) return;
  c->busy_counted = b;
  if (c->p->stats) stats_add(c->p->stats, b ? STAT_PG_BUSY_IN : STAT_PG_BUSY_OUT, 1);
}

/* ---- queries: refs, timers, the done list ---- */

void pg__query_unref(pg_query_t *q) {
  if (--q->refs > 0) return;
  if (q->kind == Q_BATCH) {
    for (int i = 0; i < q->nkids; i++) {
      if (q->kids[i]) pg__query_unref(q->kids[i]);
      if (q->kres) pg_res_free(q->kres[i]);
    }
    free(q->kids);
    free(q->kres);
  }
  pg_res_free(q->res);
  free(q->sql);
  free(q);
}

static void query_timer_done(mp_timer_t *t) { pg__query_unref(t->udata); }

void pg__query_stop_timer(pg_query_t *q) {
  timer_stop(reactor_timers(q->p->r), &q->timer);
}

int pg__query_arm(pg_query_t *q, uint32_t ms, timer_fn fn) {
  if (!ms) return 0;
  reactor_t *r = q->p->r;
  if (timer_start(reactor_timers(r), &q->timer, reactor_now(r), ms, 0, 1, fn,
                  query_timer_done, q))
    return -ENOMEM;
  q->refs++;
  return 0;
}

/* q is answered (q->res, or q->fail): its callback runs from the done list
 * once the pool's state is consistent again. Takes the pool's ref on q. */
void pg__query_finish(pg_query_t *q, const char *fail) {
  pg_pool_t *p = q->p;
  pg__query_stop_timer(q);
  if (fail && fail != q->failbuf) {
    snprintf(q->failbuf, sizeof(q->failbuf), "%s", fail);
  }
  q->fail = fail ? q->failbuf : NULL;
  if (q->kind == Q_SUB) { /* into its batch, which is done with the last */
    pg_query_t *b = q->parent;
    pg_res_t *r = q->res;
    q->res = NULL;
    if (!r) r = pg__res_new();
    if (r && q->fail && !r->msg[0]) snprintf(r->msg, sizeof(r->msg), "%s", q->fail);
    b->kres[q->idx] = r;
    b->kids[q->idx] = NULL;
    pg__query_unref(q);
    if (--b->left == 0) pg__query_finish(b, NULL);
    return;
  }
  if (q->kind == Q_BATCH) {
    /* Not sent (a pool timeout, a close): its statements never ran. */
    for (int i = 0; i < q->nkids; i++)
      if (q->kids[i]) {
        pg__query_unref(q->kids[i]);
        q->kids[i] = NULL;
      }
  }
  if (q->abandoned || q->kind == Q_INTERNAL) {
    pg__query_unref(q);
    return;
  }
  q->done_next = NULL;
  if (p->done_tail)
    p->done_tail->done_next = q;
  else
    p->done = q;
  p->done_tail = q;
  pg__pool_kick(p);
}

/* Runs the callbacks of the done list: from the tick (so never inside the
 * call that started the work, nor inside libpq's), or from pg_pool_free.
 * A callback may free the pool (a nested call drains the rest). */
static void deliver(pg_pool_t *p) {
  while (p->done) {
    pg_query_t *q = p->done;
    p->done = q->done_next;
    if (!p->done) p->done_tail = NULL;
    if (q->abandoned) {
      pg__query_unref(q);
      continue;
    }
    q->abandoned = true; /* the handle is spent */
    if (q->kind == Q_ACQUIRE) {
      if (p->closing && !q->fail) { /* its connection went with the pool */
        snprintf(q->failbuf, sizeof(q->failbuf), "closed");
        q->fail = q->failbuf;
      }
      pg_conn_t *c = q->fail ? NULL : q->c;
      q->acb(q->arg, c, q->fail);
    } else if (q->kind == Q_BATCH) {
      for (int i = 0; i < q->nkids; i++) {
        if (!q->kres[i]) q->kres[i] = pg__res_new();
        if (q->kres[i] && q->fail && !q->kres[i]->msg[0])
          snprintf(q->kres[i]->msg, sizeof(q->kres[i]->msg), "%s", q->fail);
      }
      bool oom = false;
      for (int i = 0; i < q->nkids; i++) oom |= !q->kres[i];
      if (oom) {
        log_warn("pg: out of memory for a pipeline's results");
      } else {
        pg_res_t **v = q->kres;
        q->kres = NULL; /* the callback's now */
        q->bcb(q->arg, v, q->nkids);
      }
    } else {
      pg_res_t *res = q->res;
      q->res = NULL;
      if (!res) res = pg__res_new();
      if (!res) {
        log_warn("pg: out of memory for a result");
      } else {
        if (q->fail) snprintf(res->msg, sizeof(res->msg), "%s", q->fail);
        q->cb(q->arg, res);
      }
    }
    pg__query_unref(q);
  }
}

static void zombies_free(pg_pool_t *p) {
  while (p->zombies) {
    pg_conn_t *c = p->zombies;
    p->zombies = c->zombie_next;
    free(c);
  }
}

static void pool_tick_fn(mp_timer_t *t) {
  pg_pool_t *p = t->udata;
  while (p->kicked && !p->freed) {
    p->kicked = false;
    zombies_free(p);
    pg__pool_pump(p);
    deliver(p);
    pg__notes_deliver(p);
    pg__copy_wake_all(p);
  }
}

static void pool_tick_done(mp_timer_t *t) { pg__pool_unref(t->udata); }

/* Something for the tick to do, on the loop's next turn. */
void pg__pool_kick(pg_pool_t *p) {
  p->kicked = true;
  if (p->tick.armed || p->freed) return;
  if (timer_start(reactor_timers(p->r), &p->tick, reactor_now(p->r), 0, 0, 1,
                  pool_tick_fn, pool_tick_done, p) == 0)
    p->refs++;
  else
    log_warn("pg: out of memory (a timer)");
}

/* ---- the pool's queue ---- */

static void queue_push(pg_pool_t *p, pg_query_t *q, bool front) {
  q->queued = true;
  q->prev = q->next = NULL;
  if (front) {
    q->next = p->qhead;
    if (p->qhead) p->qhead->prev = q;
    else p->qtail = q;
    p->qhead = q;
  } else {
    q->prev = p->qtail;
    if (p->qtail) p->qtail->next = q;
    else p->qhead = q;
    p->qtail = q;
  }
  p->nwait++;
  pg__st_add(p, STAT_PG_WAIT_IN, 1);
}

static void queue_remove(pg_pool_t *p, pg_query_t *q) {
  if (q->prev) q->prev->next = q->next;
  else p->qhead = q->next;
  if (q->next) q->next->prev = q->prev;
  else p->qtail = q->prev;
  q->prev = q->next = NULL;
  q->queued = false;
  p->nwait--;
  pg__st_add(p, STAT_PG_WAIT_OUT, 1);
}

static void pool_timeout_fn(mp_timer_t *t) {
  pg_query_t *q = t->udata;
  pg_pool_t *p = q->p;
  if (!q->queued) return;
  queue_remove(p, q);
  p->n_timeouts++;
  pg__st_add(p, STAT_PG_TIMEOUTS, 1);
  pg__query_finish(q, "pool timeout");
}

/* Fails every waiter (a connect failed and no connection is left). */
void pg__queue_fail_all(pg_pool_t *p, const char *why) {
  while (p->qhead) {
    pg_query_t *q = p->qhead;
    queue_remove(p, q);
    pg__query_finish(q, why);
  }
}

/* ---- choosing a connection ---- */

static pg_conn_t *pool_pick(pg_pool_t *p) {
  pg_conn_t *best = NULL;
  for (pg_conn_t *c = p->conns; c; c = c->next) {
    if (c->st != C_READY || c->pinned || c->cancelling ||
        c->inflight >= PG_PIPELINE_DEPTH)
      continue;
    if (!best || c->inflight < best->inflight) best = c;
  }
  return best;
}

/* Sends what waits, while a connection can take it, and opens connections
 * up to the cap while anything waits or every connection is busy. */

void pg__pool_pump(pg_pool_t *p) {
  if (p->closing) return;
  if (p->pumping) {
    p->pump_again = true;
    return;
  }
  p->pumping = true;
  do {
    p->pump_again = false;
  while (p->qhead && !p->closing) {
    pg_query_t *q = p->qhead;
    pg_conn_t *c = pool_pick(p);
    int opening = 0;
    for (pg_conn_t *o = p->conns; o; o = o->next)
      opening += o->st == C_RESOLVING || o->st == C_CONNECTING;
    if ((!c || c->inflight > 0 || q->kind == Q_ACQUIRE) && opening < p->nwait &&
        p->nconns < p->o.max) {
      if (!pg__conn_open(p)) break;
      continue; /* it may have failed at once */
    }
    /* A transaction wants a connection of its own: an idle one, else it
     * waits for one (a busy one is still fine if no other can come). */
    if (!c) break;
    if (q->kind == Q_ACQUIRE && c->inflight > 0 && opening > 0) break;
    queue_remove(p, q);
    pg__query_stop_timer(q);
    if (q->kind == Q_ACQUIRE) {
      c->pinned = true;
      pg__conn_busy_update(c);
      q->c = c;
      pg__query_finish(q, NULL);
      continue;
    }
    if (q->kind == Q_BATCH) {
      pg__batch_send(c, q);
      continue;
    }
    int err = pg__conn_send(c, q);
    if (err) {
      pg__query_finish(q, err == -ENOMEM ? "out of memory" : "closed");
      pg__conn_fail(c, PQerrorMessage(c->pq));
      continue;
    }
    if (!pg__conn_flush(c)) continue;
  }
  } while (p->pump_again && !p->closing);
  p->pumping = false;
}

/* Closes connections idle past idle_ms. */
static void pool_sweep(mp_timer_t *t) {
  pg_pool_t *p = t->udata;
  uint64_t now = reactor_now(p->r);
  pg_conn_t *c = p->conns, *next;
  for (; c; c = next) {
    next = c->next;
    if (c->st == C_READY && !c->pinned && !c->inflight &&
        now - c->idle_since >= p->o.idle_ms)
      pg__conn_fail(c, NULL);
  }
}

/* ---- the pool ---- */

int pg_url_check(const char *url, char *err, size_t errlen) {
  char *e = NULL;
  PQconninfoOption *o = PQconninfoParse(url, &e);
  if (!o) {
    snprintf(err, errlen, "%s", e ? e : "bad connection string (out of memory?)");
    size_t n = strlen(err);
    while (n && (err[n - 1] == '\n' || err[n - 1] == ' ')) err[--n] = 0;
    PQfreemem(e);
    return -1;
  }
  int rc = 0;
  for (PQconninfoOption *x = o; x->keyword; x++) {
    if (!x->val) continue;
    if ((!strcmp(x->keyword, "host") || !strcmp(x->keyword, "hostaddr") ||
         !strcmp(x->keyword, "port")) && strchr(x->val, ',')) {
      snprintf(err, errlen, "one host only (%s=%s)", x->keyword, x->val);
      rc = -1;
    }
  }
  PQconninfoFree(o);
  return rc;
}

pg_pool_t *pg_pool_new(reactor_t *r, dns_resolver_t *dns, const char *url,
                       const pg_opts_t *o, char *err, size_t errlen) {
  if (pg_url_check(url, err, errlen)) return NULL;
  char *e = NULL;
  PQconninfoOption *opts = PQconninfoParse(url, &e);
  PQfreemem(e);
  if (!opts) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  pg_pool_t *p = calloc(1, sizeof(*p));
  size_t n = 0;
  for (PQconninfoOption *x = opts; x->keyword; x++) n++;
  if (p) {
    p->keys = calloc(n + 3, sizeof(char *));
    p->vals = calloc(n + 3, sizeof(char *));
  }
  if (!p || !p->keys || !p->vals) {
    if (p) {
      free(p->keys);
      free(p->vals);
    }
    free(p);
    PQconninfoFree(opts);
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  p->r = r;
  p->dns = dns;
  p->o = *o;
  p->hostaddr_idx = -1;
  bool have_app = false, have_hostaddr = false;
  const char *host = NULL;
  int k = 0;
  for (PQconninfoOption *x = opts; x->keyword; x++) {
    if (!x->val) continue;
    if (!strcmp(x->keyword, "application_name")) have_app = true;
    if (!strcmp(x->keyword, "hostaddr")) have_hostaddr = true;
    if (!strcmp(x->keyword, "host")) host = x->val;
    p->keys[k] = strdup(x->keyword);
    p->vals[k] = strdup(x->val);
    k++;
  }
  if (!have_app) {
    p->keys[k] = strdup("application_name");
    p->vals[k] = strdup("moonport");
    k++;
  }
  /* A host name (not a socket directory, not with a hostaddr given) is
   * resolved by the lane's resolver, the address passed as hostaddr. */
  if (host && *host && host[0] != '/' && host[0] != '@' && !have_hostaddr) {
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->keys[k] = strdup("hostaddr");
    p->hostaddr_idx = k;
    k++;
  } else if (!host || !*host) {
    /* libpq's default would be its compiled-in socket directory: a local
     * connect that cannot block either. */
  }
  PQconninfoFree(opts);
  for (int i = 0; i < k; i++)
    if (!p->keys[i] || (i != p->hostaddr_idx && !p->vals[i])) {
      snprintf(err, errlen, "out of memory");
      for (int j = 0; j < k; j++) {
        free(p->keys[j]);
        free(p->vals[j]);
      }
      free(p->keys);
      free(p->vals);
      free(p);
      return NULL;
    }
  timer_init(&p->sweep);
  timer_init(&p->tick);
  timer_init(&p->keep);
  p->refs = 1;
  if (p->o.idle_ms) {
    uint32_t every = p->o.idle_ms < 1000 ? p->o.idle_ms : 1000;
    timer_start(reactor_timers(r), &p->sweep, reactor_now(r), every, every, -1,
                pool_sweep, NULL, p);
  }
  return p;
}

void pg__pool_unref(pg_pool_t *p) {
  if (--p->refs > 0) return;
  for (int i = 0; p->keys[i] || i == p->hostaddr_idx; i++) {
    free(p->keys[i]);
    if (i != p->hostaddr_idx) free(p->vals[i]);
  }
  free(p->keys);
  free(p->vals);
  for (int i = 0; i < p->ninit; i++) free(p->init[i]);
  free(p->init);
  free(p);
}

void pg_pool_free(pg_pool_t *p) {
  if (!p || p->freed) return;
  p->freed = true;
  p->closing = true;
  if (p->sweep.armed) timer_stop(reactor_timers(p->r), &p->sweep);
  pg__queue_fail_all(p, "closed");
  pg_conn_t *c = p->conns, *next;
  for (; c; c = next) {
    next = c->next;
    c->pinned = false;
    if (c->st == C_DEAD)
      pg__conn_free(c);
    else
      pg__conn_fail(c, NULL);
  }
  deliver(p);
  zombies_free(p);
  pg__notes_free(p);
  if (p->keep.armed) timer_stop(reactor_timers(p->r), &p->keep);
  timer_stop(reactor_timers(p->r), &p->tick); /* its on_finish unrefs */
  pg__pool_unref(p);
}

void pg_pool_set_stats(pg_pool_t *p, stats_slot_t *slot) { p->stats = slot; }

void pg_pool_stats(const pg_pool_t *p, pg_pool_stats_t *out) {
  memset(out, 0, sizeof(*out));
  for (pg_conn_t *c = p->conns; c; c = c->next) {
    if (c->st == C_DEAD) continue;
    out->size++;
    if (c->pinned || c->inflight) out->busy++;
  }
  out->waiting = p->nwait;
  out->queries = p->n_queries;
  out->errors = p->n_errors;
  out->timeouts = p->n_timeouts;
  out->query_us = p->query_us;
}

/* ---- the API ---- */

pg_query_t *pg__query_alloc(pg_pool_t *p, const char *sql, int nparams,
                            const char *const *vals, const size_t *lens) {
  size_t sl = strlen(sql) + 1;
  size_t bytes = 0;
  for (int i = 0; i < nparams; i++)
    if (vals[i]) bytes += lens[i] + 1;
  pg_query_t *q = calloc(1, sizeof(*q));
  size_t arrays = (size_t)nparams * (sizeof(char *) + 2 * sizeof(int));
  char *blk = malloc(sl + arrays + bytes + 16);
  if (!q || !blk) {
    free(q);
    free(blk);
    return NULL;
  }
  q->p = p;
  q->refs = 1;
  timer_init(&q->timer);
  q->timer.udata = q;
  q->sql = blk;
  memcpy(blk, sql, sl);
  char *at = blk + sl;
  at += (8 - ((uintptr_t)at & 7)) & 7;
  q->nparams = nparams;
  if (nparams) {
    q->vals = (char **)at;
    at += (size_t)nparams * sizeof(char *);
    q->lens = (int *)at;
    at += (size_t)nparams * sizeof(int);
    q->fmts = (int *)at;
    at += (size_t)nparams * sizeof(int);
    for (int i = 0; i < nparams; i++) {
      if (!vals[i]) {
        q->vals[i] = NULL;
        q->lens[i] = 0;
        q->fmts[i] = 0;
        continue;
      }
      memcpy(at, vals[i], lens[i]);
      at[lens[i]] = 0;
      q->vals[i] = at;
      q->lens[i] = (int)lens[i];
      q->fmts[i] = memchr(at, 0, lens[i]) ? 1 : 0;
      at += lens[i] + 1;
    }
  }
  return q;
}

/* A handle with no SQL of its own (a batch, an acquire): NULL with errno
 * ESHUTDOWN or ENOMEM. */
static pg_query_t *query_handle(pg_pool_t *p, int kind) {
  if (p->closing) {
    errno = ESHUTDOWN;
    return NULL;
  }
  pg_query_t *q = pg__query_alloc(p, "", 0, NULL, NULL);
  if (!q) {
    errno = ENOMEM;
    return NULL;
  }
  q->kind = kind;
  return q;
}

/* Into the pool's FIFO, with its pool_timeout, and sent if it can be. */
static pg_query_t *pool_enqueue(pg_pool_t *p, pg_query_t *q) {
  queue_push(p, q, false);
  if (p->o.pool_timeout_ms)
    pg__query_arm(q, p->o.pool_timeout_ms, pool_timeout_fn);
  pg__pool_pump(p);
  return q;
}

pg_query_t *pg_query(pg_pool_t *p, pg_conn_t *pin, const char *sql,
                     int nparams, const char *const *vals, const size_t *lens,
                     uint32_t timeout_ms, pg_done_fn cb, void *arg) {
  if (p->closing) {
    errno = ESHUTDOWN;
    return NULL;
  }
  if (nparams < 0 || nparams > PG_MAX_PARAMS) {
    errno = EINVAL;
    return NULL;
  }
  for (int i = 0; i < nparams; i++)
    if (vals[i] && lens[i] > (size_t)1 << 30) {
      errno = EINVAL;
      return NULL;
    }
  pg_query_t *q = pg__query_alloc(p, sql, nparams, vals, lens);
  if (!q) {
    errno = ENOMEM;
    return NULL;
  }
  q->kind = Q_QUERY;
  q->cb = cb;
  q->arg = arg;
  q->timeout_ms = timeout_ms;
  q->pin = pin;
  if (pin) {
    if (pin->st != C_READY) {
      pg__query_finish(q, "closed");
      return q;
    }
    int err = pg__conn_send(pin, q);
    if (err) {
      pg__query_finish(q, err == -ENOMEM ? "out of memory" : "closed");
      pg__conn_fail(pin, PQerrorMessage(pin->pq));
      return q;
    }
    pg__conn_flush(pin);
    return q;
  }
  return pool_enqueue(p, q);
}

pg_query_t *pg_batch(pg_pool_t *p, pg_conn_t *pin, int n,
                     const pg_stmt_args_t *stmts, uint32_t timeout_ms,
                     pg_batch_fn cb, void *arg) {
  if (n < 1 || n > PG_PIPELINE_DEPTH) {
    errno = EINVAL;
    return NULL;
  }
  pg_query_t *b = query_handle(p, Q_BATCH);
  if (!b) return NULL;
  b->bcb = cb;
  b->arg = arg;
  b->pin = pin;
  b->nkids = n;
  b->kids = calloc((size_t)n, sizeof(pg_query_t *));
  b->kres = calloc((size_t)n, sizeof(pg_res_t *));
  if (!b->kids || !b->kres) {
    free(b->kids);
    free(b->kres);
    free(b->sql);
    free(b);
    errno = ENOMEM;
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    const pg_stmt_args_t *a = &stmts[i];
    pg_query_t *k =
        a->nparams >= 0 && a->nparams <= PG_MAX_PARAMS
            ? pg__query_alloc(p, a->sql, a->nparams, a->vals, a->lens)
            : NULL;
    if (!k) {
      b->nkids = i; /* what was made goes with b */
      pg__query_unref(b);
      errno = ENOMEM;
      return NULL;
    }
    k->kind = Q_SUB;
    k->parent = b;
    k->idx = i;
    k->timeout_ms = timeout_ms;
    b->kids[i] = k;
  }
  if (pin) {
    if (pin->st != C_READY)
      pg__query_finish(b, "closed");
    else
      pg__batch_send(pin, b);
    return b;
  }
  return pool_enqueue(p, b);
}

void pg_query_abandon(pg_query_t *q) {
  if (q->abandoned) return;
  q->abandoned = true;
  if (q->queued) {
    queue_remove(q->p, q);
    pg__query_stop_timer(q);
    pg__query_unref(q);
  }
  /* Sent: it stays in its connection's flight until its results are in;
   * on the done list: dropped there. */
}

pg_query_t *pg_acquire(pg_pool_t *p, pg_acquire_fn cb, void *arg) {
  pg_query_t *q = query_handle(p, Q_ACQUIRE);
  if (!q) return NULL;
  q->acb = cb;
  q->arg = arg;
  return pool_enqueue(p, q);
}

void pg_release(pg_pool_t *p, pg_conn_t *c, bool reusable) {
  c->pinned = false;
  pg__conn_busy_update(c);
  if (c->st == C_DEAD) {
    pg__conn_free(c);
    return;
  }
  if (!reusable) {
    pg__conn_fail(c, NULL);
    return;
  }
  c->idle_since = reactor_now(p->r);
  pg__pool_pump(p);
}

bool pg_conn_alive(const pg_conn_t *c) { return c->st == C_READY; }
