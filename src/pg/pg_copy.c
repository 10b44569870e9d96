/* SPDX-License-Identifier: MIT */

/* pg_copy: COPY on a pinned connection taken out of pipeline mode
 * (pg.h's pg_copy_*): each step returns at once or says what to wait
 * for; the waiter is woken from the pool's tick. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/poll.h"
#include "pg/pg_int.h"

/* COPY waiters whose events came (or whose connection failed). */
void pg__copy_wake_all(pg_pool_t *p) {
  bool again = true;
  while (again && !p->freed) {
    again = false;
    for (pg_conn_t *c = p->conns; c; c = c->next)
      if (c->copy_woken && c->copy_cb) {
        void (*cb)(void *) = c->copy_cb;
        c->copy_cb = NULL;
        c->copy_woken = false;
        cb(c->copy_arg); /* may change the list: start over */
        again = true;
        break;
      }
  }
}

/* ---- COPY ---- */

int pg_copy_begin(pg_conn_t *c, const char *sql) {
  if (c->st != C_READY || !c->pinned) return -EPIPE;
  if (c->inflight) return -EBUSY;
  if (!PQexitPipelineMode(c->pq)) return -EBUSY;
  if (!PQsendQuery(c->pq, sql)) {
    pg__conn_fail(c, PQerrorMessage(c->pq));
    return -EPIPE;
  }
  c->st = C_COPY;
  pg__conn_busy_update(c);
  return 0;
}

/* Back to pipeline mode after the COPY's last result. */
static void copy_leave(pg_conn_t *c) {
  PGresult *x;
  while (!PQisBusy(c->pq) && (x = PQgetResult(c->pq))) PQclear(x);
  if (!PQenterPipelineMode(c->pq)) {
    pg__conn_fail(c, "cannot enter pipeline mode after COPY");
    return;
  }
  c->st = C_READY;
  pg__conn_watch(c, POLL_READ);
}

/* A final result: *res for the caller; 0, or -EAGAIN. */
static int copy_result(pg_conn_t *c, pg_res_t **res) {
  if (PQisBusy(c->pq)) return -EAGAIN;
  PGresult *x = PQgetResult(c->pq);
  pg_res_t *r = pg__res_new();
  if (!r) {
    PQclear(x);
    pg__conn_fail(c, "out of memory");
    return -EPIPE;
  }
  ExecStatusType st = x ? PQresultStatus(x) : PGRES_FATAL_ERROR;
  if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) {
    r->head = x;
  } else if (x) {
    pg__res_set_server_error(r, x);
  } else {
    snprintf(r->msg, sizeof(r->msg), "closed");
  }
  *res = r;
  copy_leave(c);
  return 0;
}

int pg_copy_started(pg_conn_t *c, pg_res_t **res) {
  *res = NULL;
  if (c->st != C_COPY) return -EPIPE;
  if (PQisBusy(c->pq)) return -EAGAIN;
  PGresult *x = PQgetResult(c->pq);
  ExecStatusType st = x ? PQresultStatus(x) : PGRES_FATAL_ERROR;
  if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT) {
    PQclear(x);
    return st == PGRES_COPY_IN ? 1 : 2;
  }
  pg_res_t *r = pg__res_new();
  if (!r) {
    PQclear(x);
    pg__conn_fail(c, "out of memory");
    return -EPIPE;
  }
  if (x && (st == PGRES_FATAL_ERROR || st == PGRES_NONFATAL_ERROR))
    pg__res_set_server_error(r, x);
  else {
    snprintf(r->msg, sizeof(r->msg), "not a COPY statement");
    PQclear(x);
  }
  *res = r;
  copy_leave(c);
  return 0;
}

int pg_copy_put(pg_conn_t *c, const char *data, size_t len) {
  if (c->st != C_COPY) return -EPIPE;
  if (PQflush(c->pq) != 0) return -EAGAIN; /* the last chunk is still going */
  if (len > (size_t)INT32_MAX) return -EINVAL;
  int rc = PQputCopyData(c->pq, data, (int)len);
  if (rc < 0) {
    pg__conn_fail(c, PQerrorMessage(c->pq));
    return -EPIPE;
  }
  if (rc == 0) return -EAGAIN;
  if (PQflush(c->pq) < 0) {
    pg__conn_fail(c, PQerrorMessage(c->pq));
    return -EPIPE;
  }
  return 0;
}

/* What is still in libpq's buffer written: 0, -EAGAIN (not all of it
 * yet), -EPIPE (the connection failed, or is no longer in a COPY). */
static int copy_flushed(pg_conn_t *c) {
  if (c->st != C_COPY) return -EPIPE;
  int f = PQflush(c->pq);
  if (f < 0) {
    pg__conn_fail(c, PQerrorMessage(c->pq));
    return -EPIPE;
  }
  return f ? -EAGAIN : 0;
}

int pg_copy_end(pg_conn_t *c, const char *errmsg) {
  int f = copy_flushed(c);
  if (f) return f;
  int rc = PQputCopyEnd(c->pq, errmsg);
  if (rc < 0) {
    pg__conn_fail(c, PQerrorMessage(c->pq));
    return -EPIPE;
  }
  if (rc == 0) return -EAGAIN;
  return 0;
}

int pg_copy_finish(pg_conn_t *c, pg_res_t **res) {
  *res = NULL;
  int f = copy_flushed(c);
  if (f) return f;
  return copy_result(c, res);
}

int pg_copy_get(pg_conn_t *c, char **row, size_t *len) {
  *row = NULL;
  *len = 0;
  if (c->st != C_COPY) return -EPIPE;
  char *r = NULL;
  int n = PQgetCopyData(c->pq, &r, 1);
  if (n > 0) {
    *row = r;
    *len = (size_t)n;
    return 1;
  }
  if (n == 0) return -EAGAIN;
  if (n == -1) return 0; /* the end: pg_copy_finish */
  pg__conn_fail(c, PQerrorMessage(c->pq));
  return -EPIPE;
}

void pg_copy_free(char *row) { PQfreemem(row); }

void pg_copy_wait(pg_conn_t *c, unsigned events, void (*cb)(void *arg),
                  void *arg) {
  c->copy_cb = cb;
  c->copy_arg = arg;
  c->copy_woken = c->st != C_COPY; /* dead: woken at once, by the tick */
  if (c->copy_woken) {
    pg__pool_kick(c->p);
    return;
  }
  c->wflags = events;
  reactor_watch_set(c->w, events);
}

void pg_copy_unwait(pg_conn_t *c) {
  c->copy_cb = NULL;
  c->copy_woken = false;
}
