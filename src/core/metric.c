/* SPDX-License-Identifier: MIT */

/* metric: a script's metrics in shared memory; see metric.h. */
#include "core/metric.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

typedef struct {
  int type, nlabels, nbuckets;
  char name[METRIC_MAX_NAME];
  char help[METRIC_MAX_HELP];
  char labels[METRIC_MAX_LABELS][METRIC_MAX_NAME];
  double bounds[METRIC_MAX_BUCKETS];
} metric_family_t;

typedef struct {
  uint32_t family;
  uint32_t cell; /* its first cell */
  uint32_t len;  /* of values */
  char values[METRIC_MAX_VALUES];
} metric_series_t;

/* A cell is a double's bits (counters, gauges, a histogram's sum) or a
 * count (a histogram's buckets). */
struct metric_set {
  pthread_mutex_t lock;           /* registering only */
  _Atomic uint32_t nfamilies;     /* published: written before, under lock */
  _Atomic uint32_t nseries;
  uint32_t ncells;                /* under lock */
  _Atomic uint64_t dropped;
  metric_family_t families[METRIC_MAX_FAMILIES];
  metric_series_t series[METRIC_MAX_SERIES];
  _Atomic uint64_t cells[METRIC_MAX_CELLS];
};

metric_set_t *metric_set_new(void) {
  /* MAP_NORESERVE: only the pages a script's metrics touch are made */
  metric_set_t *m = mmap(NULL, sizeof(*m), PROT_READ | PROT_WRITE,
                         MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return NULL;
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  int rc = pthread_mutex_init(&m->lock, &a);
  pthread_mutexattr_destroy(&a);
  if (rc) {
    munmap(m, sizeof(*m));
    errno = rc;
    return NULL;
  }
  return m;
}

void metric_set_free(metric_set_t *m) {
  if (m) munmap(m, sizeof(*m));
}

/* A process that died holding the lock left at most an entry that was
 * never published (counts are bumped last): the next one goes on. */
static void metric__lock(metric_set_t *m) {
  if (pthread_mutex_lock(&m->lock) == EOWNERDEAD)
    pthread_mutex_consistent(&m->lock);
}

static int metric__cells(const metric_family_t *f) {
  return f->type == METRIC_HISTOGRAM ? f->nbuckets + 2 : 1;
}

int metric_family(metric_set_t *m, int type, const char *name,
                  const char *help, const char *const *labels, int nlabels,
                  const double *buckets, int nbuckets) {
  if (nlabels < 0 || nlabels > METRIC_MAX_LABELS || nbuckets < 0 ||
      nbuckets > METRIC_MAX_BUCKETS || strlen(name) >= METRIC_MAX_NAME)
    return -EINVAL;
  if (type != METRIC_HISTOGRAM) nbuckets = 0;
  metric__lock(m);
  uint32_t n = atomic_load_explicit(&m->nfamilies, memory_order_relaxed);
  int found = -1;
  for (uint32_t i = 0; i < n && found < 0; i++)
    if (strcmp(m->families[i].name, name) == 0) found = (int)i;
  if (found >= 0) {
    const metric_family_t *f = &m->families[found];
    bool same = f->type == type && f->nlabels == nlabels &&
                f->nbuckets == nbuckets;
    for (int k = 0; same && k < nlabels; k++)
      same = strcmp(f->labels[k], labels[k]) == 0;
    for (int k = 0; same && k < nbuckets; k++) same = f->bounds[k] == buckets[k];
    pthread_mutex_unlock(&m->lock);
    return same ? found : -EEXIST;
  }
  if (n == METRIC_MAX_FAMILIES) {
    pthread_mutex_unlock(&m->lock);
    return -ENOSPC;
  }
  metric_family_t *f = &m->families[n];
  memset(f, 0, sizeof(*f));
  f->type = type;
  f->nlabels = nlabels;
  f->nbuckets = nbuckets;
  snprintf(f->name, sizeof(f->name), "%s", name);
  snprintf(f->help, sizeof(f->help), "%s", help ? help : "");
  for (int k = 0; k < nlabels; k++)
    snprintf(f->labels[k], sizeof(f->labels[k]), "%s", labels[k]);
  for (int k = 0; k < nbuckets; k++) f->bounds[k] = buckets[k];
  atomic_store_explicit(&m->nfamilies, n + 1, memory_order_release);
  pthread_mutex_unlock(&m->lock);
  return (int)n;
}

int metric_series(metric_set_t *m, int family, const char *values,
                  size_t len) {
  if (len > METRIC_MAX_VALUES) return -E2BIG;
  if (family < 0 ||
      (uint32_t)family >=
          atomic_load_explicit(&m->nfamilies, memory_order_acquire))
    return -EINVAL;
  metric__lock(m);
  uint32_t n = atomic_load_explicit(&m->nseries, memory_order_relaxed);
  for (uint32_t i = 0; i < n; i++) {
    const metric_series_t *s = &m->series[i];
    if (s->family == (uint32_t)family && s->len == len &&
        memcmp(s->values, values, len) == 0) {
      pthread_mutex_unlock(&m->lock);
      return (int)i;
    }
  }
  int need = metric__cells(&m->families[family]);
  if (n == METRIC_MAX_SERIES || m->ncells + (uint32_t)need > METRIC_MAX_CELLS) {
    pthread_mutex_unlock(&m->lock);
    atomic_fetch_add_explicit(&m->dropped, 1, memory_order_relaxed);
    return -ENOSPC;
  }
  metric_series_t *s = &m->series[n];
  s->family = (uint32_t)family;
  s->cell = m->ncells;
  s->len = (uint32_t)len;
  memcpy(s->values, values, len);
  m->ncells += (uint32_t)need;
  atomic_store_explicit(&m->nseries, n + 1, memory_order_release);
  pthread_mutex_unlock(&m->lock);
  return (int)n;
}

static double metric__d(uint64_t bits) {
  double d;
  memcpy(&d, &bits, sizeof(d));
  return d;
}

static uint64_t metric__bits(double d) {
  uint64_t b;
  memcpy(&b, &d, sizeof(b));
  return b;
}

static void metric__add_double(_Atomic uint64_t *cell, double v) {
  uint64_t old = atomic_load_explicit(cell, memory_order_relaxed);
  while (!atomic_compare_exchange_weak_explicit(
      cell, &old, metric__bits(metric__d(old) + v), memory_order_relaxed,
      memory_order_relaxed)) {
  }
}

/* The series, or NULL (counted as dropped). */
static const metric_series_t *metric__get(metric_set_t *m, int series) {
  if (series < 0 ||
      (uint32_t)series >=
          atomic_load_explicit(&m->nseries, memory_order_acquire)) {
    atomic_fetch_add_explicit(&m->dropped, 1, memory_order_relaxed);
    return NULL;
  }
  return &m->series[series];
}

void metric_add(metric_set_t *m, int series, double v) {
  const metric_series_t *s = metric__get(m, series);
  if (s) metric__add_double(&m->cells[s->cell], v);
}

void metric_set(metric_set_t *m, int series, double v) {
  const metric_series_t *s = metric__get(m, series);
  if (s)
    atomic_store_explicit(&m->cells[s->cell], metric__bits(v),
                          memory_order_relaxed);
}

void metric_observe(metric_set_t *m, int series, double v) {
  const metric_series_t *s = metric__get(m, series);
  if (!s) return;
  const metric_family_t *f = &m->families[s->family];
  int b = 0;
  while (b < f->nbuckets && !(v <= f->bounds[b])) b++; /* NaN: +Inf */
  atomic_fetch_add_explicit(&m->cells[s->cell + (uint32_t)b], 1,
                            memory_order_relaxed);
  metric__add_double(&m->cells[s->cell + (uint32_t)f->nbuckets + 1], v);
}

double metric_value(metric_set_t *m, int series) {
  if (series < 0 ||
      (uint32_t)series >= atomic_load_explicit(&m->nseries, memory_order_acquire))
    return 0;
  const metric_series_t *s = &m->series[series];
  const metric_family_t *f = &m->families[s->family];
  if (f->type != METRIC_HISTOGRAM)
    return metric__d(atomic_load_explicit(&m->cells[s->cell], memory_order_relaxed));
  uint64_t count = 0;
  for (int b = 0; b <= f->nbuckets; b++)
    count += atomic_load_explicit(&m->cells[s->cell + (uint32_t)b],
                                  memory_order_relaxed);
  return (double)count;
}

uint64_t metric_dropped(metric_set_t *m) {
  return atomic_load_explicit(&m->dropped, memory_order_relaxed);
}

/* ---- the text format ---- */

typedef struct {
  void (*out)(void *ctx, const char *s, size_t len);
  void *ctx;
} metric_w_t;

static void metric__put(metric_w_t *w, const char *s, size_t n) {
  if (n) w->out(w->ctx, s, n);
}
static void metric__puts(metric_w_t *w, const char *s) {
  metric__put(w, s, strlen(s));
}

/* A label value or help text with \, " (labels only) and newline
 * escaped. */
static void metric__escaped(metric_w_t *w, const char *s, size_t n,
                            bool quote) {
  size_t from = 0;
  for (size_t i = 0; i < n; i++) {
    const char *e = s[i] == '\\'              ? "\\\\"
                    : s[i] == '\n'            ? "\\n"
                    : quote && s[i] == '"' ? "\\\""
                                              : NULL;
    if (!e) continue;
    metric__put(w, s + from, i - from);
    metric__puts(w, e);
    from = i + 1;
  }
  metric__put(w, s + from, n - from);
}

static void metric__num(metric_w_t *w, double v) {
  char b[40];
  if (isnan(v))
    metric__puts(w, "NaN");
  else if (isinf(v))
    metric__puts(w, v > 0 ? "+Inf" : "-Inf");
  else
    metric__put(w, b, (size_t)snprintf(b, sizeof(b), "%.17g", v));
}

/* name{l1="v1",...[,le="x"]} (the braces only when there is a label). */
static void metric__head(metric_w_t *w, const metric_family_t *f,
                         const char *suffix, const metric_series_t *s,
                         const char *le) {
  metric__puts(w, f->name);
  metric__puts(w, suffix);
  if (!f->nlabels && !le) {
    metric__puts(w, " ");
    return;
  }
  metric__puts(w, "{");
  const char *v = s->values;
  const char *end = s->values + s->len;
  for (int k = 0; k < f->nlabels; k++) {
    size_t vl = v < end ? strnlen(v, (size_t)(end - v)) : 0;
    if (k) metric__puts(w, ",");
    metric__puts(w, f->labels[k]);
    metric__puts(w, "=\"");
    metric__escaped(w, v, vl, true);
    metric__puts(w, "\"");
    v += vl + 1;
  }
  if (le) {
    if (f->nlabels) metric__puts(w, ",");
    metric__puts(w, "le=\"");
    metric__puts(w, le);
    metric__puts(w, "\"");
  }
  metric__puts(w, "} ");
}

void metric_text(metric_set_t *m,
                 void (*out)(void *ctx, const char *s, size_t len),
                 void *ctx) {
  static const char *const types[] = {"counter", "gauge", "histogram"};
  metric_w_t w = {out, ctx};
  uint32_t nf = atomic_load_explicit(&m->nfamilies, memory_order_acquire);
  uint32_t ns = atomic_load_explicit(&m->nseries, memory_order_acquire);
  for (uint32_t i = 0; i < nf; i++) {
    const metric_family_t *f = &m->families[i];
    metric__puts(&w, "# HELP ");
    metric__puts(&w, f->name);
    metric__puts(&w, " ");
    metric__escaped(&w, f->help, strlen(f->help), false);
    metric__puts(&w, "\n# TYPE ");
    metric__puts(&w, f->name);
    metric__puts(&w, " ");
    metric__puts(&w, types[f->type]);
    metric__puts(&w, "\n");
    for (uint32_t j = 0; j < ns; j++) {
      const metric_series_t *s = &m->series[j];
      if (s->family != i) continue;
      const _Atomic uint64_t *c = &m->cells[s->cell];
      if (f->type != METRIC_HISTOGRAM) {
        metric__head(&w, f, "", s, NULL);
        metric__num(&w, metric__d(atomic_load_explicit(c, memory_order_relaxed)));
        metric__puts(&w, "\n");
        continue;
      }
      uint64_t cum = 0;
      char le[40];
      for (int b = 0; b <= f->nbuckets; b++) {
        cum += atomic_load_explicit(&c[b], memory_order_relaxed);
        if (b < f->nbuckets)
          snprintf(le, sizeof(le), "%.15g", f->bounds[b]);
        else
          snprintf(le, sizeof(le), "+Inf");
        metric__head(&w, f, "_bucket", s, le);
        char n[24];
        metric__put(&w, n, (size_t)snprintf(n, sizeof(n), "%llu", (unsigned long long)cum));
        metric__puts(&w, "\n");
      }
      metric__head(&w, f, "_sum", s, NULL);
      metric__num(&w, metric__d(atomic_load_explicit(&c[f->nbuckets + 1],
                                                     memory_order_relaxed)));
      metric__puts(&w, "\n");
      metric__head(&w, f, "_count", s, NULL);
      char n[24];
      metric__put(&w, n, (size_t)snprintf(n, sizeof(n), "%llu", (unsigned long long)cum));
      metric__puts(&w, "\n");
    }
  }
}
