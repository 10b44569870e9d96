/* SPDX-License-Identifier: MIT */

/* Unit test: a script's metrics in shared memory (core/metric): families
 * found again by name and refused with another shape, series by label
 * values, exact sums from two processes adding at once (atomics, no
 * lock), histogram buckets, the limits, and the text format. */
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/metric.h"
#include "check.h"

typedef struct {
  char b[1 << 20];
  size_t n;
} text_t;

static void put(void *ctx, const char *s, size_t n) {
  text_t *t = ctx;
  if (t->n + n < sizeof(t->b)) memcpy(t->b + t->n, s, n), t->n += n;
  t->b[t->n] = 0;
}

static void test_families_and_series(void) {
  metric_set_t *m = metric_set_new();
  CHECK(m != NULL);
  const char *lab[] = {"page", "method"};
  int f = metric_family(m, METRIC_COUNTER, "hits_total", "Hits.", lab, 2, NULL, 0);
  CHECK_EQ(f, 0);
  CHECK_EQ(metric_family(m, METRIC_COUNTER, "hits_total", "other help", lab, 2, NULL, 0), 0);
  CHECK_EQ(metric_family(m, METRIC_GAUGE, "hits_total", "Hits.", lab, 2, NULL, 0), -EEXIST);
  CHECK_EQ(metric_family(m, METRIC_COUNTER, "hits_total", "Hits.", lab, 1, NULL, 0), -EEXIST);
  int a = metric_series(m, f, "/a\0GET\0", 7);
  int b = metric_series(m, f, "/b\0GET\0", 7);
  CHECK(a >= 0 && b >= 0 && a != b);
  CHECK_EQ(metric_series(m, f, "/a\0GET\0", 7), a);
  CHECK_EQ(metric_series(m, 99, "", 0), -EINVAL);
  char big[METRIC_MAX_VALUES + 1] = {0};
  CHECK_EQ(metric_series(m, f, big, sizeof(big)), -E2BIG);
  metric_add(m, a, 2);
  metric_add(m, a, 0.5);
  CHECK(metric_value(m, a) == 2.5);
  metric_add(m, -1, 1); /* dropped */
  CHECK_EQ(metric_dropped(m), 1);
  int g = metric_family(m, METRIC_GAUGE, "temp", "T with \\ and\nnewline", NULL, 0, NULL, 0);
  int gs = metric_series(m, g, "", 0);
  metric_set(m, gs, -3.25);
  double bounds[] = {0.1, 1};
  const char *kl[] = {"kind"};
  int h = metric_family(m, METRIC_HISTOGRAM, "job_seconds", "Jobs.", kl, 1, bounds, 2);
  int hs = metric_series(m, h, "a\"b\\c\n\0", 7);
  metric_observe(m, hs, 0.05);
  metric_observe(m, hs, 0.1); /* le is inclusive */
  metric_observe(m, hs, 0.5);
  metric_observe(m, hs, 7);
  metric_observe(m, hs, NAN); /* +Inf */
  CHECK(metric_value(m, hs) == 5);
  static text_t t;
  t.n = 0;
  metric_text(m, put, &t);
  CHECK(strstr(t.b, "# HELP hits_total Hits.\n# TYPE hits_total counter\n") != NULL);
  CHECK(strstr(t.b, "hits_total{page=\"/a\",method=\"GET\"} 2.5\n") != NULL);
  CHECK(strstr(t.b, "hits_total{page=\"/b\",method=\"GET\"} 0\n") != NULL);
  CHECK(strstr(t.b, "# HELP temp T with \\\\ and\\nnewline\n") != NULL);
  CHECK(strstr(t.b, "temp -3.25\n") != NULL);
  CHECK(strstr(t.b, "job_seconds_bucket{kind=\"a\\\"b\\\\c\\n\",le=\"0.1\"} 2\n") != NULL);
  CHECK(strstr(t.b, "job_seconds_bucket{kind=\"a\\\"b\\\\c\\n\",le=\"1\"} 3\n") != NULL);
  CHECK(strstr(t.b, "job_seconds_bucket{kind=\"a\\\"b\\\\c\\n\",le=\"+Inf\"} 5\n") != NULL);
  CHECK(strstr(t.b, "job_seconds_count{kind=\"a\\\"b\\\\c\\n\"} 5\n") != NULL);
  CHECK(strstr(t.b, "job_seconds_sum{kind=\"a\\\"b\\\\c\\n\"} NaN\n") != NULL);
  metric_set_free(m);
}

static void test_two_processes(void) {
  metric_set_t *m = metric_set_new();
  int f = metric_family(m, METRIC_COUNTER, "n_total", "", NULL, 0, NULL, 0);
  pid_t pid = fork();
  if (pid == 0) {
    /* the child finds the same family and series by name */
    int cf = metric_family(m, METRIC_COUNTER, "n_total", "", NULL, 0, NULL, 0);
    int cs = metric_series(m, cf, "", 0);
    for (int i = 0; i < 200000; i++) metric_add(m, cs, 1);
    _exit(cf == f ? 0 : 1);
  }
  int s = metric_series(m, f, "", 0);
  for (int i = 0; i < 200000; i++) metric_add(m, s, 1);
  int st;
  waitpid(pid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK(metric_value(m, s) == 400000);
  metric_set_free(m);
}

static void test_limits(void) {
  metric_set_t *m = metric_set_new();
  char name[32];
  for (int i = 0; i < METRIC_MAX_FAMILIES; i++) {
    snprintf(name, sizeof(name), "f%d", i);
    CHECK(metric_family(m, METRIC_COUNTER, name, "", NULL, 0, NULL, 0) == i);
  }
  CHECK_EQ(metric_family(m, METRIC_COUNTER, "one_more", "", NULL, 0, NULL, 0), -ENOSPC);
  const char *l[] = {"i"};
  CHECK_EQ(metric_family(m, METRIC_COUNTER, "f0", "", l, 1, NULL, 0), -EEXIST);
  int made = 0, refused = 0;
  for (int i = 0; i < METRIC_MAX_SERIES + 10; i++) {
    char v[16];
    int n = snprintf(v, sizeof(v), "%d", i) + 1;
    int rc = metric_series(m, 0, v, (size_t)n);
    if (rc >= 0) made++;
    else if (rc == -ENOSPC) refused++;
  }
  CHECK_EQ(made, METRIC_MAX_SERIES);
  CHECK_EQ(refused, 10);
  CHECK_EQ(metric_dropped(m), 10);
  metric_set_free(m);
}

int main(void) {
  test_families_and_series();
  test_two_processes();
  test_limits();
  return check_summary();
}
