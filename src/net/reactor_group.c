/* SPDX-License-Identifier: MIT */

/* reactor_group: the calls across a process's reactors (net/reactor.h:
 * reactor_defer_io, reactor_each, the group's lifetime); reactor.c is the
 * loop itself. */
#include "net/reactor_int.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ---- groups ---- */

struct reactor__io_task {
  sock_uuid_t uuid;
  void (*fn)(conn_t *c, void *a);
  void *a;
};

static void reactor__io_run(void *task, void *reactor) {
  struct reactor__io_task *t = task;
  conn_t *c = reactor_conn_find(reactor, t->uuid);
  t->fn(c, t->a);
  free(t);
}

void reactor_defer_io(reactor_group_t *g, sock_uuid_t uuid,
                      void (*fn)(conn_t *c, void *a), void *a) {
  int owner = sock_uuid_owner(uuid);
  struct reactor__io_task *t =
      owner >= 0 && (size_t)owner < g->n ? malloc(sizeof(*t)) : NULL;
  if (t) {
    *t = (struct reactor__io_task){uuid, fn, a};
    if (reactor_post(g->r[owner], reactor__io_run, t, g->r[owner]) == 0) return;
    free(t);
  }
  fn(NULL, a);
}

/* One per reactor, in one block that the last to finish frees. */
struct reactor__each_task {
  void *service;
  void (*fn)(conn_t *c, void *a);
  void *a;
  struct reactor__each_task *block; /* [0]: holds the count */
  atomic_size_t left;
};

static void reactor__each_done(struct reactor__each_task *block) {
  if (atomic_fetch_sub(&block->left, 1) == 1) free(block);
}

static void reactor__each_run(void *task, void *reactor) {
  struct reactor__each_task *t = task;
  reactor_t *r = reactor;
  for (conn_t *c = r->live, *next; c; c = next) {
    next = c->next;
    /* (a TLS connection still in its handshake is not the protocol's yet) */
    if (c->service == t->service && !(c->flags & (F_DEAD | F_HANDSHAKE)))
      t->fn(c, t->a);
  }
  reactor__each_done(t->block);
}

size_t reactor_each(reactor_group_t *g, void *service,
                    void (*fn)(conn_t *c, void *a), void *a) {
  /* Every task first: out of memory, none runs (rather than some). */
  struct reactor__each_task *t = calloc(g->n ? g->n : 1, sizeof(*t));
  if (!t) return 0;
  for (size_t i = 0; i < g->n; i++) {
    t[i].service = service;
    t[i].fn = fn;
    t[i].a = a;
    t[i].block = t;
  }
  size_t reached = g->n;
  atomic_init(&t[0].left, reached);
  if (!reached) free(t);
  for (size_t i = 0; i < g->n; i++)
    if (reactor_post(g->r[i], reactor__each_run, &t[i], g->r[i])) {
      reached--;
      reactor__each_done(&t[0]); /* (a full mailbox that could not grow) */
    }
  return reached;
}
