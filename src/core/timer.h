/* SPDX-License-Identifier: MIT */

/* timer: one-shot and repeating timers in a binary min-heap, driven by the
 * owning event loop (no file descriptor per timer). Single-threaded: a heap
 * and its timers belong to the thread that runs it. */
#ifndef MP_TIMER_H
#define MP_TIMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct timer_s mp_timer_t;
typedef void (*timer_fn)(mp_timer_t *t);

/* Caller-provided storage (timer_init); the heap only points at it. Fields
 * are the heap's; read `udata` and `remaining` freely. */
struct timer_s {
  uint64_t due;       /* ms, monotonic */
  uint64_t interval;  /* ms between runs */
  int64_t remaining;  /* runs left; < 0 forever */
  timer_fn fn;        /* each run; must not free the timer */
  timer_fn on_finish; /* once, after the last run or a stop; may be NULL;
                         the heap is done with the storage when it runs */
  void *udata;
  size_t idx;         /* position in the heap, or TIMER_NOT_QUEUED */
  bool armed;         /* started and not yet finished */
  bool firing;        /* fn is running, or about to in this batch */
};

#define TIMER_NOT_QUEUED ((size_t)-1)

typedef struct {
  mp_timer_t **v;
  size_t n, cap;
  mp_timer_t **batch; /* the timers timer_heap_run is running */
  size_t bcap;
} timer_heap_t;

void timer_heap_init(timer_heap_t *h);
/* Frees the heap's array. Timers still queued are dropped without their
 * on_finish: the caller owns their storage. */
void timer_heap_deinit(timer_heap_t *h);

/* Prepares timer storage (not started). */
void timer_init(mp_timer_t *t);

/* Starts `t`: first run `delay` ms after `now`, then every `interval` ms,
 * `count` runs in all (count <= 0: forever; a one-shot is count 1).
 * Returns 0, -EBUSY if already armed, or -ENOMEM (nothing started, no
 * callback will run). */
int timer_start(timer_heap_t *h, mp_timer_t *t, uint64_t now, uint64_t delay,
                uint64_t interval, int64_t count, timer_fn fn,
                timer_fn on_finish, void *udata);

/* Stops an armed timer: it will not run again and on_finish is called once
 * (right away, or, if called from inside its own fn, when fn returns).
 * A timer that is not armed is left alone. */
void timer_stop(timer_heap_t *h, mp_timer_t *t);

/* Milliseconds from `now` until the earliest due timer: 0 if one is due,
 * -1 if none is queued. */
int64_t timer_heap_wait(const timer_heap_t *h, uint64_t now);

/* Runs every timer due at `now`, in due order; repeating ones are queued
 * again. Timers started by callbacks for a time <= now run in a later call.
 * Returns how many callbacks ran. */
size_t timer_heap_run(timer_heap_t *h, uint64_t now);

/* How many timers are queued. */
size_t timer_heap_size(const timer_heap_t *h);

#endif
