/* SPDX-License-Identifier: MIT */

/* metric: a script's own metrics (mp.counter, mp.gauge, mp.histogram) in
 * one shared memory mapping, so that every lane of every process updates
 * and reads the same figures with no message between processes.
 *
 * Threads and processes: metric_set_new maps MAP_SHARED | MAP_ANONYMOUS
 * memory before the workers are forked; every other function may be
 * called from any thread of any process that inherited it. Registering a
 * family or a series (a family's set of label values) takes one
 * process-shared robust mutex; an update is one atomic add (a counter,
 * a histogram bucket) or compare-and-swap (a double) on the series' own
 * cells, with no lock. Readers take no lock: entries are written before
 * the count that publishes them (release / acquire). Everything in the
 * mapping is an index, never a pointer.
 *
 * Limits: METRIC_MAX_FAMILIES families, METRIC_MAX_SERIES series and
 * METRIC_MAX_CELLS value cells (a counter or gauge takes one, a
 * histogram its buckets + 2) in all. A series that does not fit is not
 * made (-ENOSPC) and metric_dropped counts the updates that had nowhere
 * to go.
 *
 * Errors: 0 / an index, or a negative errno. */
#ifndef MP_METRIC_H
#define MP_METRIC_H

#include <stddef.h>
#include <stdint.h>

#define METRIC_MAX_FAMILIES 256
#define METRIC_MAX_SERIES 8192
#define METRIC_MAX_CELLS 65536
#define METRIC_MAX_NAME 96    /* a family's or label's name, NUL included */
#define METRIC_MAX_HELP 256   /* NUL included */
#define METRIC_MAX_LABELS 8
#define METRIC_MAX_VALUES 256 /* a series' label values, packed */
#define METRIC_MAX_BUCKETS 32 /* finite bounds; +Inf is added */

enum { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };

typedef struct metric_set metric_set_t;

/* Maps an empty set. NULL and errno on failure. The handle is the
 * caller's (metric_set_free); a forked child's copy is valid in it. */
metric_set_t *metric_set_new(void);
/* Unmaps this process's view. */
void metric_set_free(metric_set_t *m);

/* The family `name` of `type` with these label names and (histograms)
 * `nbuckets` increasing finite bucket bounds: made if new, else found.
 * Returns its index, -EEXIST when `name` is registered with another type,
 * labels or buckets (or help), -ENOSPC when the set is full. Names are
 * checked by the caller. */
int metric_family(metric_set_t *m, int type, const char *name,
                  const char *help, const char *const *labels, int nlabels,
                  const double *buckets, int nbuckets);
/* The series of `family` whose label values are `values` (`len` bytes:
 * each value followed by a NUL, as many as the family has labels), made
 * if new. Returns its index, -E2BIG for len over METRIC_MAX_VALUES,
 * -ENOSPC (counted by metric_dropped) when the set is full. */
int metric_series(metric_set_t *m, int family, const char *values,
                  size_t len);

/* Counters and gauges: adds v (a counter's v is >= 0: the caller
 * checks). Gauges: sets v. Histograms: counts v in its bucket and adds it
 * to the sum. A negative series (a failed metric_series) counts as
 * dropped. */
void metric_add(metric_set_t *m, int series, double v);
void metric_set(metric_set_t *m, int series, double v);
void metric_observe(metric_set_t *m, int series, double v);
/* A counter's or gauge's value; a histogram's count. */
double metric_value(metric_set_t *m, int series);
/* Updates that had no series to go to. */
uint64_t metric_dropped(metric_set_t *m);

/* Appends every family in the Prometheus text format (0.0.4) through
 * `out(ctx, text, len)`, which may be called many times. */
void metric_text(metric_set_t *m, void (*out)(void *ctx, const char *s,
                                              size_t len),
                 void *ctx);

#endif
