/* SPDX-License-Identifier: MIT */

/* Unit test: the shared counters (core/stats): a forked child's adds are
 * seen by the parent, sums over slots, and retiring a dead process's
 * slots keeps its counts (its open connections counted closed) and drops
 * its gauges. */
#include <sys/wait.h>
#include <unistd.h>

#include "core/stats.h"
#include "check.h"

static void test_shared_across_fork(void) {
  stats_t *s = stats_new(6);
  CHECK(s != NULL);
  CHECK_EQ(stats_slots(s), 6);
  stats_add(stats_slot(s, 0), STAT_CONN_ACCEPTED, 1);
  pid_t pid = fork();
  if (pid == 0) {
    stats_slot_t *sl = stats_slot(s, 3);
    for (int i = 0; i < 1000; i++) stats_add(sl, STAT_HTTP_2XX, 1);
    stats_add(sl, STAT_CONN_ACCEPTED, 5);
    stats_add(sl, STAT_CONN_CLOSED, 2);
    stats_add(sl, STAT_WS_OPENED, 3);
    stats_set(sl, STAT_LUA_KB, 640);
    _exit(0);
  }
  int st;
  waitpid(pid, &st, 0);
  uint64_t v[STAT_N];
  stats_sum(s, 0, 6, true, v);
  CHECK_EQ(v[STAT_HTTP_2XX], 1000);
  CHECK_EQ(v[STAT_CONN_ACCEPTED], 6);
  CHECK_EQ(v[STAT_CONN_CLOSED], 2);
  CHECK_EQ(v[STAT_LUA_KB], 640);
  stats_sum(s, 3, 1, false, v); /* one slot */
  CHECK_EQ(v[STAT_CONN_ACCEPTED], 5);
  /* the child is gone: its slots retire */
  stats_retire(s, 3, 3);
  stats_sum(s, 0, 6, true, v);
  CHECK_EQ(v[STAT_HTTP_2XX], 1000);         /* kept */
  CHECK_EQ(v[STAT_CONN_ACCEPTED], 6);
  CHECK_EQ(v[STAT_CONN_CLOSED], 5);         /* its 3 open ones closed */
  CHECK_EQ(v[STAT_WS_OPENED], v[STAT_WS_CLOSED]);
  CHECK_EQ(v[STAT_LUA_KB], 0);              /* its gauge dropped */
  stats_sum(s, 3, 3, false, v);             /* the slots are clean */
  CHECK_EQ(v[STAT_HTTP_2XX], 0);
  CHECK(stats_slot(s, 6) == NULL && stats_slot(s, -1) == NULL);
  stats_add(NULL, STAT_HTTP_2XX, 1);        /* no slot: nothing */
  CHECK(stats_uptime(s) >= 0);
  stats_free(s);
  CHECK(stats_new(0) == NULL);
}

int main(void) {
  test_shared_across_fork();
  return check_summary();
}
