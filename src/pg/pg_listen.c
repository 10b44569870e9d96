/* SPDX-License-Identifier: MIT */

/* pg_listen: LISTEN on a pool of its own (pg_pool_listen): the channels
 * each new connection LISTENs to first, the notifications queued for the
 * tick (bounded by PG_NOTES_MAX), and the timer that keeps a connection. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "pg/pg_int.h"

void pg__notes_deliver(pg_pool_t *p) {
  while (p->nhead && !p->freed) {
    struct pg_note *n = p->nhead;
    p->nhead = n->next;
    if (!p->nhead) p->ntail = NULL;
    p->nnotes--;
    p->notify(p->notify_arg, n->data, n->data + n->clen + 1, n->len);
    free(n);
  }
}

void pg__notes_free(pg_pool_t *p) {
  while (p->nhead) {
    struct pg_note *n = p->nhead;
    p->nhead = n->next;
    free(n);
  }
  p->ntail = NULL;
  p->nnotes = 0;
}

/* One notification onto the tick's queue, the oldest dropped past
 * PG_NOTES_MAX (counted in a log line); nothing without a callback. */
void pg__notes_push(pg_pool_t *p, const char *channel, const char *payload) {
  if (!p->notify) return;
  size_t cl = strlen(channel), pl = strlen(payload);
  struct pg_note *x = malloc(sizeof(*x) + cl + pl + 2);
  if (!x) return;
  x->next = NULL;
  x->clen = cl;
  x->len = pl;
  memcpy(x->data, channel, cl + 1);
  memcpy(x->data + cl + 1, payload, pl + 1);
  if (p->ntail)
    p->ntail->next = x;
  else
    p->nhead = x;
  p->ntail = x;
  p->nnotes++;
  if (p->nnotes > PG_NOTES_MAX) {
    struct pg_note *old = p->nhead;
    p->nhead = old->next;
    free(old);
    p->nnotes--;
    if (p->notes_dropped++ % 1000 == 0)
      log_warn("pg: LISTEN callbacks are behind: notifications dropped "
               "(%llu so far)",
               (unsigned long long)p->notes_dropped);
  }
  pg__pool_kick(p);
}

/* Notifications that came with what was read, queued for the tick. */
void pg__notes_read(pg_conn_t *c) {
  PGnotify *n;
  while ((n = PQnotifies(c->pq))) {
    pg__notes_push(c->p, n->relname, n->extra);
    PQfreemem(n);
  }
}

/* ---- LISTEN ---- */

/* A listening pool keeps a connection: reopened within a second of a
 * loss (each new one LISTENs again first). */
static void pool_keep(mp_timer_t *t) {
  pg_pool_t *p = t->udata;
  if (p->closing) return;
  for (pg_conn_t *c = p->conns; c; c = c->next)
    if (c->st != C_DEAD) return;
  pg__conn_open(p);
}

int pg_pool_listen(pg_pool_t *p, const char *channel, pg_notify_fn fn,
                   void *arg) {
  if (p->closing) return -ESHUTDOWN;
  size_t n = strlen(channel);
  if (n == 0 || n > 63) return -EINVAL;
  /* LISTEN "name": a quoted identifier, its quotes doubled. */
  char *sql = malloc(2 * n + 16);
  if (!sql) return -ENOMEM;
  char *o = sql + sprintf(sql, "LISTEN \"");
  for (const char *s = channel; *s; s++) {
    if (*s == '"') *o++ = '"';
    *o++ = *s;
  }
  strcpy(o, "\"");
  for (int i = 0; i < p->ninit; i++)
    if (!strcmp(p->init[i], sql)) {
      free(sql);
      return 0;
    }
  char **ni = realloc(p->init, sizeof(char *) * (size_t)(p->ninit + 1));
  if (!ni) {
    free(sql);
    return -ENOMEM;
  }
  p->init = ni;
  p->init[p->ninit++] = sql;
  p->notify = fn;
  p->notify_arg = arg;
  for (pg_conn_t *c = p->conns; c; c = c->next)
    if (c->st == C_READY) { /* the live connection: LISTEN now */
      if (pg__conn_send_internal(c, sql) == 0) pg__conn_flush(c);
    }
  if (!p->keep.armed)
    timer_start(reactor_timers(p->r), &p->keep, reactor_now(p->r), 0, 1000, -1,
                pool_keep, NULL, p);
  return 0;
}
