/* SPDX-License-Identifier: MIT */

/* pg_conn: one libpq connection of a pool (pg_int.h): resolve, connect,
 * send each query as a pipeline segment, read its results back in order,
 * and keep its prepared statements.
 *
 * Each query is one pipeline segment: [Parse (a new prepared statement)]
 * Bind/Execute, then Sync. libpq hands back, per segment, each command's
 * results followed by NULL, then a PGRES_PIPELINE_SYNC; the head of the
 * connection's queue says which command the next result belongs to.
 * Results are read in single-row mode, so a result past max_result is cut
 * off row by row instead of being held whole first. */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "net/poll.h"
#include "pg/pg_cancel.h"
#include "pg/pg_int.h"

static void conn_io(void *arg, unsigned ev);

/* ---- prepared statements ---- */

static uint64_t stmt_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a: keys are the app's SQL */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static pg_stmt_t *stmt_find(pg_conn_t *c, const char *sql, uint64_t h) {
  int n = c->p->o.stmt_cache;
  for (int i = 0; i < n; i++)
    if (c->stmts[i].sql && c->stmts[i].hash == h &&
        strcmp(c->stmts[i].sql, sql) == 0)
      return &c->stmts[i];
  return NULL;
}

static void stmt_drop(pg_conn_t *c, pg_stmt_t *s, bool deallocate) {
  if (deallocate && c->st == C_READY) {
    char sql[48];
    snprintf(sql, sizeof(sql), "DEALLOCATE %s", s->name);
    pg__conn_send_internal(c, sql);
  }
  free(s->sql);
  s->sql = NULL;
}

/* A slot for a new statement: a free one, or the least recently used
 * (deallocated on the server first, in the pipeline's order). */
static pg_stmt_t *stmt_slot(pg_conn_t *c) {
  int n = c->p->o.stmt_cache;
  pg_stmt_t *lru = NULL;
  for (int i = 0; i < n; i++) {
    if (!c->stmts[i].sql) return &c->stmts[i];
    if (!lru || c->stmts[i].used < lru->used) lru = &c->stmts[i];
  }
  if (lru) stmt_drop(c, lru, true);
  return lru;
}

/* Drops the statement q ran, if its slot still holds it (another query
 * may have dropped it and reused the slot while q was in flight). */
static void stmt_forget(pg_conn_t *c, pg_query_t *q, bool deallocate) {
  if (q->stmt && q->stmt->sql && q->stmt->id == q->stmt_id)
    stmt_drop(c, q->stmt, deallocate);
  q->stmt = NULL;
}

/* The server forgot every prepared statement of the session (DISCARD ALL,
 * DEALLOCATE ALL), those prepared before q was sent: the ones prepared
 * behind it in the pipeline still exist. */
static void stmt_forget_all(pg_conn_t *c, unsigned before) {
  for (int i = 0; i < c->p->o.stmt_cache; i++)
    if (c->stmts[i].sql && c->stmts[i].id <= before)
      stmt_drop(c, &c->stmts[i], false);
}

/* After q's result: keeps the cache in step with what the server did.
 * A statement the server dropped (26000, "prepared statement does not
 * exist": DEALLOCATE by hand) or replanned into another result type
 * (0A000, "cached plan must not change result type": a schema change) is
 * forgotten. True when q may run once more, prepared afresh: it failed
 * before running, outside a transaction of the caller's. */
static bool stmt_after(pg_conn_t *c, pg_query_t *q) {
  pg_res_t *r = q->res;
  if (!r) return false;
  if (!r->err) {
    const char *cmd = r->head ? PQcmdStatus(r->head) : "";
    if (strcmp(cmd, "DISCARD ALL") == 0 || strcmp(cmd, "DEALLOCATE ALL") == 0)
      stmt_forget_all(c, q->seq_sent);
    return false;
  }
  const char *code = PQresultErrorField(r->err, PG_DIAG_SQLSTATE);
  if (!code || !q->stmt || q->prepared_now) return false;
  bool stale = strcmp(code, "0A000") == 0;
  if (!stale && strcmp(code, "26000") != 0) return false;
  stmt_forget(c, q, stale);
  return q->kind == Q_QUERY && !q->pin && !q->retried;
}

/* ---- connections ---- */

bool pg__conn_flush(pg_conn_t *c) {
  int f = PQflush(c->pq);
  if (f < 0) {
    pg__conn_fail(c, PQerrorMessage(c->pq));
    return false;
  }
  pg__conn_watch(c, POLL_READ | (f ? POLL_WRITE : 0));
  return true;
}

void pg__conn_watch(pg_conn_t *c, unsigned flags) {
  int fd = PQsocket(c->pq);
  if (c->w && fd != c->fd) {
    reactor_unwatch(c->w);
    c->w = NULL;
  }
  if (!c->w) {
    if (fd < 0) return;
    c->fd = fd;
    c->wflags = flags;
    c->w = reactor_watch_io(c->p->r, fd, flags, conn_io, c);
    if (!c->w) pg__conn_fail(c, "out of memory (watch)");
    return;
  }
  if (c->wflags != flags) {
    c->wflags = flags;
    reactor_watch_set(c->w, flags);
  }
}

static void flight_push(pg_conn_t *c, pg_query_t *q) {
  q->c = c;
  q->next = NULL;
  q->prev = c->tail;
  if (c->tail)
    c->tail->next = q;
  else
    c->head = q;
  c->tail = q;
  c->inflight++;
  pg__conn_busy_update(c);
}

static void flight_pop(pg_conn_t *c, pg_query_t *q) {
  if (q->prev)
    q->prev->next = q->next;
  else
    c->head = q->next;
  if (q->next)
    q->next->prev = q->prev;
  else
    c->tail = q->prev;
  q->prev = q->next = NULL;
  c->inflight--;
  if (!c->inflight) c->idle_since = reactor_now(c->p->r);
  pg__conn_busy_update(c);
}

static void query_timeout_fn(mp_timer_t *t) {
  pg_query_t *q = t->udata;
  pg_conn_t *c = q->c;
  if (!c || q->abandoned || q->timed_out) return;
  q->timed_out = true;
  c->p->n_timeouts++;
  pg__st_add(c->p, STAT_PG_TIMEOUTS, 1);
  /* The caller hears "timeout" now; the query stays at its place in the
   * flight (its results still come, in order) with nobody to tell. The
   * server is asked to stop it; until its results are in, no new query
   * is sent on c, so the cancel can only hit it or what was in flight. */
  if (!c->cancelling) {
    PGcancel *cn = PQgetCancel(c->pq);
    if (cn && pg__cancel_post(cn) == 0) c->cancelling = true;
  }
  pg_query_t *ghost = calloc(1, sizeof(*ghost));
  if (!ghost) { /* no memory for the stand-in: drop the connection */
    pg__conn_fail(c, "out of memory");
    return;
  }
  /* A stand-in takes q's place in the flight; q itself is answered. */
  *ghost = *q;
  ghost->kind = Q_INTERNAL;
  ghost->refs = 1;
  ghost->sql = NULL;
  ghost->res = q->res;
  q->res = NULL;
  timer_init(&ghost->timer);
  ghost->timer.udata = ghost;
  if (ghost->prev)
    ghost->prev->next = ghost;
  else
    c->head = ghost;
  if (ghost->next)
    ghost->next->prev = ghost;
  else
    c->tail = ghost;
  q->prev = q->next = NULL;
  q->c = NULL;
  pg__query_finish(q, "timeout");
}

/* Sends q (params copied in q) on c as one pipeline segment. */
int pg__conn_send(pg_conn_t *c, pg_query_t *q) {
  PGconn *pq = c->pq;
  q->nseg = 0;
  q->seg = 0;
  q->seg_began = false;
  q->prepared_now = false;
  q->stmt = NULL;
  q->seq_sent = c->stmt_seq;
  int ok;
  if (q->kind == Q_INTERNAL || q->nparams == 0 || c->p->o.stmt_cache == 0) {
    ok = PQsendQueryParams(pq, q->sql, q->nparams, NULL,
                           (const char *const *)q->vals, q->lens, q->fmts, 0);
    q->segs[q->nseg++] = q->kind == Q_INTERNAL ? SEG_DISCARD : SEG_EXEC;
  } else {
    uint64_t h = stmt_hash(q->sql);
    pg_stmt_t *s = stmt_find(c, q->sql, h);
    ok = 1;
    if (!s) {
      s = stmt_slot(c);
      if (!s || !(s->sql = strdup(q->sql))) return -ENOMEM;
      s->hash = h;
      s->id = ++c->stmt_seq;
      snprintf(s->name, sizeof(s->name), "mp%u", s->id);
      ok = PQsendPrepare(pq, s->name, q->sql, 0, NULL);
      q->segs[q->nseg++] = SEG_PREPARE;
      q->prepared_now = true;
    }
    s->used = ++c->stmt_clock;
    q->stmt = s;
    q->stmt_id = s->id;
    if (ok)
      ok = PQsendQueryPrepared(pq, s->name, q->nparams,
                               (const char *const *)q->vals, q->lens, q->fmts,
                               0);
    q->segs[q->nseg++] = SEG_EXEC;
  }
  if (!ok || (!q->nosync && !PQpipelineSync(pq))) return -EIO;
  flight_push(c, q);
  q->sent_at = reactor_now(c->p->r);
  if ((q->kind == Q_QUERY || q->kind == Q_SUB) && q->timeout_ms &&
      pg__query_arm(q, q->timeout_ms, query_timeout_fn))
    return 0; /* sent; only its timer failed: it runs to its end */
  return 0;
}

int pg__conn_send_internal(pg_conn_t *c, const char *sql) {
  pg_query_t *q = pg__query_alloc(c->p, sql, 0, NULL, NULL);
  if (!q) return -ENOMEM;
  q->kind = Q_INTERNAL;
  int err = pg__conn_send(c, q);
  if (err) pg__query_unref(q);
  return err;
}

static void conn_ready(pg_conn_t *c) {
  pg_pool_t *p = c->p;
  if (c->ctimer.armed) timer_stop(reactor_timers(p->r), &c->ctimer);
  if (PQsetnonblocking(c->pq, 1) || !PQenterPipelineMode(c->pq)) {
    pg__conn_fail(c, PQerrorMessage(c->pq));
    return;
  }
  c->st = C_READY;
  c->idle_since = reactor_now(p->r);
  for (int i = 0; i < p->ninit; i++) /* LISTEN again, before anything */
    if (pg__conn_send_internal(c, p->init[i])) {
      pg__conn_fail(c, "out of memory");
      return;
    }
  pg__conn_watch(c, POLL_READ);
  if (p->ninit && !pg__conn_flush(c)) return;
  pg__pool_pump(p);
}

static void conn_poll_connect(pg_conn_t *c) {
  for (;;) {
    PostgresPollingStatusType s = PQconnectPoll(c->pq);
    if (s == PGRES_POLLING_OK) {
      conn_ready(c);
      return;
    }
    if (s == PGRES_POLLING_FAILED) {
      char why[256];
      snprintf(why, sizeof(why), "connect: %s", PQerrorMessage(c->pq));
      pg__conn_fail(c, why);
      return;
    }
    /* Watched afresh at each step: libpq may have closed the socket and
     * made another under the same number (a retry without TLS). */
    if (c->w) {
      reactor_unwatch(c->w);
      c->w = NULL;
    }
    pg__conn_watch(c, s == PGRES_POLLING_READING ? POLL_READ : POLL_WRITE);
    return;
  }
}

/* The connection is unusable: every query in flight on it is answered
 * "closed" (none is sent again: it may have run), the statements and the
 * socket go. A pinned connection stays allocated, dead, until released. */
void pg__conn_fail(pg_conn_t *c, const char *why) {
  pg_pool_t *p = c->p;
  if (c->st == C_DEAD) return;
  bool was_connecting = c->st != C_READY && c->st != C_COPY;
  c->st = C_DEAD;
  if (c->dq) {
    dns_cancel(c->dq);
    c->dq = NULL;
  }
  if (c->ctimer.armed) timer_stop(reactor_timers(p->r), &c->ctimer);
  if (c->w) {
    reactor_unwatch(c->w);
    c->w = NULL;
  }
  while (c->head) {
    pg_query_t *q = c->head;
    flight_pop(c, q);
    q->c = NULL;
    p->n_errors++;
    pg__query_finish(q, "closed");
  }
  char line[256];
  snprintf(line, sizeof(line), "%s", why ? why : "closed");
  size_t n = strlen(line);
  while (n && (line[n - 1] == '\n' || line[n - 1] == ' ')) line[--n] = 0;
  if (was_connecting) {
    snprintf(p->last_err, sizeof(p->last_err), "%s", line);
    if (!p->closing) log_warn("pg: %s", line);
  }
  if (c->pq) {
    PQfinish(c->pq);
    c->pq = NULL;
  }
  for (int i = 0; i < p->o.stmt_cache; i++) free(c->stmts[i].sql);
  free(c->stmts);
  c->stmts = NULL;
  pg__conn_busy_update(c);
  if (c->copy_cb) c->copy_woken = true; /* it hears -EPIPE */
  if (!c->pinned) pg__conn_free(c);
  if (p->closing) return;
  /* A connect that failed with nobody else to serve the queue: the
   * waiters hear why rather than waiting for the pool timeout. */
  if (was_connecting) {
    bool any = false;
    for (pg_conn_t *o = p->conns; o && !any; o = o->next) any = o->st != C_DEAD;
    if (!any) pg__queue_fail_all(p, p->last_err);
  }
  pg__pool_kick(p);
}

void pg__conn_free(pg_conn_t *c) {
  pg_pool_t *p = c->p;
  if (c->prev)
    c->prev->next = c->next;
  else
    p->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  p->nconns--;
  pg__st_add(p, STAT_PG_CONN_CLOSED, 1);
  c->zombie_next = p->zombies; /* it may be inside its own callback */
  p->zombies = c;
  pg__pool_kick(p);
}

static void conn_connect_timeout(mp_timer_t *t) {
  pg_conn_t *c = t->udata;
  pg__conn_fail(c, "connect: timeout");
}

/* The server's NOTICEs (a DROP ... IF EXISTS that had nothing to drop)
 * go to the debug log, not to stderr as libpq's default does. */
static void conn_notice(void *arg, const char *msg) {
  (void)arg;
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n') n--;
  log_write(LOG_DEBUG, "pg: %.*s", (int)n, msg);
}

static void conn_start_libpq(pg_conn_t *c, const char *addr) {
  pg_pool_t *p = c->p;
  if (p->hostaddr_idx >= 0) p->vals[p->hostaddr_idx] = (char *)addr;
  c->pq = PQconnectStartParams((const char *const *)p->keys,
                               (const char *const *)p->vals, 0);
  if (p->hostaddr_idx >= 0) p->vals[p->hostaddr_idx] = NULL;
  if (!c->pq) {
    pg__conn_fail(c, "connect: out of memory");
    return;
  }
  PQsetNoticeProcessor(c->pq, conn_notice, NULL);
  if (PQstatus(c->pq) == CONNECTION_BAD) {
    char why[256];
    snprintf(why, sizeof(why), "connect: %s", PQerrorMessage(c->pq));
    pg__conn_fail(c, why);
    return;
  }
  c->st = C_CONNECTING;
  conn_poll_connect(c);
}

static void conn_resolved(void *arg, int err, const dns_addr_t *a, size_t n,
                          uint32_t ttl) {
  (void)ttl;
  pg_conn_t *c = arg;
  c->dq = NULL;
  if (err || n == 0) {
    char why[300];
    snprintf(why, sizeof(why), "connect: %s: %s", c->p->host,
             dns_strerror(err ? err : -ENOENT));
    pg__conn_fail(c, why);
    return;
  }
  char ip[INET6_ADDRSTRLEN];
  inet_ntop(a[0].family, &a[0].a, ip, sizeof(ip));
  conn_start_libpq(c, ip);
}

bool pg__conn_open(pg_pool_t *p) {
  pg_conn_t *c = calloc(1, sizeof(*c));
  if (!c) return false;
  c->stmts = p->o.stmt_cache
                 ? calloc((size_t)p->o.stmt_cache, sizeof(pg_stmt_t))
                 : NULL;
  if (p->o.stmt_cache && !c->stmts) {
    free(c);
    return false;
  }
  c->p = p;
  c->fd = -1;
  c->st = C_RESOLVING;
  pg__st_add(p, STAT_PG_CONN_OPENED, 1);
  timer_init(&c->ctimer);
  c->next = p->conns;
  if (p->conns) p->conns->prev = c;
  p->conns = c;
  p->nconns++;
  if (p->o.connect_ms)
    timer_start(reactor_timers(p->r), &c->ctimer, reactor_now(p->r),
                p->o.connect_ms, 0, 1, conn_connect_timeout, NULL, c);
  if (p->host[0]) {
    c->dq = dns_resolve(p->dns, p->host, AF_UNSPEC, p->o.connect_ms,
                        conn_resolved, c);
    if (!c->dq) pg__conn_fail(c, "connect: cannot resolve (no memory)");
    return true;
  }
  conn_start_libpq(c, NULL);
  return true;
}

/* Reads what came: each result to the query at the head of the flight. */
/* Counts q's answer: a query, its time (timed: a batch's last statement
 * stands for the batch), an error and its SQLSTATE class. */
static void count_answer(pg_pool_t *p, const pg_query_t *q, bool timed) {
  if (timed) {
    uint64_t us = (reactor_now(p->r) - q->sent_at) * 1000;
    p->query_us += us;
    pg__st_add(p, STAT_PG_QUERY_US, us);
  }
  p->n_queries++;
  pg__st_add(p, STAT_PG_QUERIES, 1);
  if (!q->res || !q->res->msg[0]) return;
  p->n_errors++;
  pg__st_add(p, STAT_PG_ERRORS, 1);
  if (q->res->err)
    pg__st_add(p,
               STAT_PG_ERRCLASS + pg_errclass_index(PQresultErrorField(
                                      q->res->err, PG_DIAG_SQLSTATE)),
               1);
}

/* The bytes of a single-row result's row. */
static size_t row_bytes(const PGresult *x) {
  size_t n = 0;
  for (int f = 0; f < PQnfields(x); f++) n += (size_t)PQgetlength(x, 0, f);
  return n;
}

static void conn_process(pg_conn_t *c) {
  pg_pool_t *p = c->p;
  while (c->st == C_READY && c->head) {
    pg_query_t *q = c->head;
    if (q->seg < q->nseg && !q->seg_began && q->segs[q->seg] == SEG_EXEC)
      PQsetSingleRowMode(c->pq); /* refused (0) outside a query: harmless */
    if (PQisBusy(c->pq)) return;
    if (q->seg == q->nseg && q->nosync) { /* a batch's: the next goes on */
      flight_pop(c, q);
      if (q->timed_out) c->cancelling = false;
      count_answer(p, q, false);
      stmt_after(c, q);
      pg__query_finish(q, NULL);
      continue;
    }
    PGresult *x = PQgetResult(c->pq);
    if (q->seg == q->nseg) { /* the segment's Sync */
      if (!x || PQresultStatus(x) != PGRES_PIPELINE_SYNC) {
        PQclear(x);
        pg__conn_fail(c, "protocol out of step");
        return;
      }
      PQclear(x);
      flight_pop(c, q);
      if (q->timed_out) c->cancelling = false;
      if (c->cancelling) {
        bool any = false;
        for (pg_query_t *o = c->head; o && !any; o = o->next)
          any = o->timed_out;
        c->cancelling = any;
      }
      if (q->kind != Q_INTERNAL) count_answer(p, q, true);
      if (stmt_after(c, q)) { /* a stale statement: once more, prepared */
        pg_res_free(q->res);
        q->res = NULL;
        q->retried = true;
        pg__query_stop_timer(q);
        if (pg__conn_send(c, q) == 0 && pg__conn_flush(c)) continue;
        if (c->st != C_READY) return; /* conn_flush failed it, q with it */
        pg__query_finish(q, "closed");
        pg__conn_fail(c, "send failed");
        return;
      }
      pg__query_finish(q, NULL);
      continue;
    }
    if (!x) { /* the end of this segment's command */
      q->seg++;
      q->seg_began = false;
      continue;
    }
    q->seg_began = true;
    int kind = q->segs[q->seg];
    ExecStatusType st = PQresultStatus(x);
    if (kind == SEG_DISCARD || q->kind == Q_INTERNAL) {
      PQclear(x);
      continue;
    }
    if (!q->res && !(q->res = pg__res_new())) {
      PQclear(x);
      pg__conn_fail(c, "out of memory");
      return;
    }
    pg_res_t *r = q->res;
    if (st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR) {
      if (kind == SEG_PREPARE) /* not prepared: forget it */
        stmt_forget(c, q, false);
      if (!r->err)
        pg__res_set_server_error(r, x);
      else
        PQclear(x);
      continue;
    }
    if (st == PGRES_PIPELINE_ABORTED && kind == SEG_EXEC && !r->msg[0])
      snprintf(r->msg, sizeof(r->msg),
               "aborted: an earlier statement of the pipeline failed");
    if (kind == SEG_PREPARE || st == PGRES_PIPELINE_ABORTED) {
      PQclear(x);
      continue;
    }
    if (r->msg[0]) { /* past max_result: the rest is read and dropped */
      PQclear(x);
      continue;
    }
    if (st == PGRES_SINGLE_TUPLE ||
        (st == PGRES_TUPLES_OK && PQntuples(x) > 0)) {
      /* A row (single-row mode), or all of them when the mode was refused */
      int err = pg__res_add_rows(r, x, p->o.max_result);
      if (err == -ENOMEM) {
        PQclear(x);
        pg__conn_fail(c, "out of memory");
        return;
      }
      /* The first row's own result holds the columns until the end's
       * status replaces it: no copy, unless it would keep a big row twice. */
      if (!r->head && st == PGRES_SINGLE_TUPLE && row_bytes(x) <= 4096) {
        r->head = x;
        continue;
      }
      if (!r->head || (st == PGRES_TUPLES_OK && !err)) {
        PQclear(r->head); /* the whole result at once: its status */
        r->head = PQcopyResult(x, PG_COPYRES_ATTRS);
      }
      PQclear(x);
      if (!r->head) {
        pg__conn_fail(c, "out of memory");
        return;
      }
      continue;
    }
    /* TUPLES_OK (the end of the rows), COMMAND_OK, EMPTY_QUERY: the
     * status (rows affected) and the columns of an empty result. */
    PQclear(r->head);
    r->head = x;
  }
}

static void conn_io(void *arg, unsigned ev) {
  pg_conn_t *c = arg;
  pg_pool_t *p = c->p;
  p->refs++;
  if (c->st == C_CONNECTING) {
    conn_poll_connect(c);
  } else if (c->st == C_COPY) {
    /* Read into libpq only for a waiter (so a slow COPY reader holds the
     * server back through TCP, not through our memory). */
    if ((ev & POLL_WRITE) && PQflush(c->pq) < 0)
      pg__conn_fail(c, PQerrorMessage(c->pq));
    if (c->st == C_COPY && (ev & (POLL_READ | POLL_HUP)) &&
        !PQconsumeInput(c->pq))
      pg__conn_fail(c, PQerrorMessage(c->pq));
    if (c->st == C_COPY) {
      reactor_watch_set(c->w, 0);
      c->wflags = 0;
      if (c->copy_cb) {
        c->copy_woken = true;
        pg__pool_kick(p);
      }
    }
  } else if (c->st == C_READY) {
    if (ev & POLL_WRITE) pg__conn_flush(c);
    if (c->st == C_READY && (ev & (POLL_READ | POLL_HUP))) {
      if (!PQconsumeInput(c->pq)) {
        pg__conn_fail(c, PQerrorMessage(c->pq));
      } else {
        conn_process(c);
        if (c->st == C_READY) pg__notes_read(c);
        if (c->st == C_READY && !c->head) {
          /* Nothing in flight: anything readable now is the server going
           * away (an idle connection's FATAL on shutdown). */
          PGresult *x;
          while (!PQisBusy(c->pq) && (x = PQgetResult(c->pq))) PQclear(x);
          if (PQstatus(c->pq) == CONNECTION_BAD) pg__conn_fail(c, "closed");
        }
        if (c->st == C_READY) pg__pool_pump(p);
      }
    }
  }
  pg__pool_unref(p);
}

/* Sends batch b's statements on c, one Sync after the last. Each is in
 * c's flight on its own; b is answered when the last is. */
void pg__batch_send(pg_conn_t *c, pg_query_t *b) {
  b->c = c;
  b->left = b->nkids;
  for (int i = 0; i < b->nkids; i++) {
    pg_query_t *k = b->kids[i];
    if (c->st != C_READY) { /* the connection failed under an earlier one */
      pg__query_finish(k, "closed");
      continue;
    }
    k->nosync = i < b->nkids - 1;
    int err = pg__conn_send(c, k);
    if (err) {
      pg__query_finish(k, err == -ENOMEM ? "out of memory" : "closed");
      pg__conn_fail(c, PQerrorMessage(c->pq));
    }
  }
  if (c->st == C_READY) pg__conn_flush(c);
}
