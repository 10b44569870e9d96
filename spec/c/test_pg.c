/* SPDX-License-Identifier: MIT */

/* Unit test: a listening pool's notification queue. Notifications wait
 * for the pool's tick; past PG_NOTES_MAX the oldest go, so a callback
 * that fell behind sees the newest PG_NOTES_MAX, in order, and the pool
 * counts what it dropped. No server: a pool opens no connection until
 * its first query, and the queue is fed as its reader feeds it. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "pg/pg_int.h"

static int g_seen;
static int g_first = -1, g_last = -1;
static int g_order_ok = 1;
static int g_channel_ok = 1;

static void on_note(void *arg, const char *channel, const char *payload,
                    size_t len) {
  int n = -1;
  (void)arg;
  if (sscanf(payload, "n%d", &n) != 1 || strlen(payload) != len) n = -1;
  if (strcmp(channel, "jobs") != 0) g_channel_ok = 0;
  if (g_seen == 0)
    g_first = n;
  else if (n != g_last + 1)
    g_order_ok = 0;
  g_last = n;
  g_seen++;
}

static void test_drop_oldest(reactor_t *r) {
  pg_opts_t o = {.max = 1,
                 .max_result = PG_MAX_RESULT_DEFAULT,
                 .stmt_cache = PG_STMT_CACHE_DEFAULT};
  char err[256];
  pg_pool_t *p =
      pg_pool_new(r, NULL, "postgres://127.0.0.1:1/none", &o, err, sizeof(err));
  CHECK(p != NULL);
  if (!p) return;
  CHECK_EQ(pg_pool_listen(p, "jobs", on_note, NULL), 0);

  /* within the limit: every one, in order */
  char payload[32];
  for (int i = 0; i < 3; i++) {
    snprintf(payload, sizeof(payload), "n%d", i);
    pg__notes_push(p, "jobs", payload);
  }
  CHECK_EQ(p->nnotes, 3);
  pg__notes_deliver(p);
  CHECK_EQ(g_seen, 3);
  CHECK_EQ(g_first, 0);
  CHECK_EQ(g_last, 2);
  CHECK_EQ(p->notes_dropped, 0);

  /* five past the limit: the five oldest go, the rest keep their order */
  g_seen = 0;
  for (int i = 0; i < PG_NOTES_MAX + 5; i++) {
    snprintf(payload, sizeof(payload), "n%d", i);
    pg__notes_push(p, "jobs", payload);
  }
  CHECK_EQ(p->nnotes, PG_NOTES_MAX);
  CHECK_EQ(p->notes_dropped, 5);
  pg__notes_deliver(p);
  CHECK_EQ(g_seen, PG_NOTES_MAX);
  CHECK_EQ(g_first, 5);
  CHECK_EQ(g_last, PG_NOTES_MAX + 4);
  CHECK(g_order_ok);
  CHECK(g_channel_ok);
  CHECK_EQ(p->nnotes, 0);
  CHECK(p->nhead == NULL && p->ntail == NULL);

  /* what is still queued when the pool goes is freed with it (ASan) */
  pg__notes_push(p, "jobs", "n0");
  pg_pool_free(p);
}

int main(void) {
  reactor_t *r = reactor_new(0);
  if (!r) return 1;
  test_drop_oldest(r);
  reactor_free(r);
  return check_summary();
}
