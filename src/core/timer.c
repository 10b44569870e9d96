/* SPDX-License-Identifier: MIT */

/* timer: a binary min-heap ordered by due time, with index back-pointers so
 * a stop removes in O(log n). */
#include "core/timer.h"

#include <errno.h>
#include <stdlib.h>

void timer_heap_init(timer_heap_t *h) {
  h->v = h->batch = NULL;
  h->n = h->cap = h->bcap = 0;
}

void timer_heap_deinit(timer_heap_t *h) {
  for (size_t i = 0; i < h->n; i++) {
    h->v[i]->idx = TIMER_NOT_QUEUED;
    h->v[i]->armed = false;
  }
  free(h->v);
  free(h->batch);
  timer_heap_init(h);
}

void timer_init(mp_timer_t *t) {
  *t = (mp_timer_t){.idx = TIMER_NOT_QUEUED};
}

static bool timer__less(const mp_timer_t *a, const mp_timer_t *b) {
  return a->due < b->due;
}

static void timer__set(timer_heap_t *h, size_t i, mp_timer_t *t) {
  h->v[i] = t;
  t->idx = i;
}

static void timer__up(timer_heap_t *h, size_t i) {
  mp_timer_t *t = h->v[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!timer__less(t, h->v[parent])) break;
    timer__set(h, i, h->v[parent]);
    i = parent;
  }
  timer__set(h, i, t);
}

static void timer__down(timer_heap_t *h, size_t i) {
  mp_timer_t *t = h->v[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n) break;
    if (c + 1 < h->n && timer__less(h->v[c + 1], h->v[c])) c++;
    if (!timer__less(h->v[c], t)) break;
    timer__set(h, i, h->v[c]);
    i = c;
  }
  timer__set(h, i, t);
}

static int timer__push(timer_heap_t *h, mp_timer_t *t) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? h->cap * 2 : 16;
    mp_timer_t **v = realloc(h->v, cap * sizeof(*v));
    if (!v) return -ENOMEM;
    h->v = v;
    h->cap = cap;
  }
  h->v[h->n] = t;
  timer__up(h, h->n++);
  return 0;
}

static void timer__remove(timer_heap_t *h, mp_timer_t *t) {
  size_t i = t->idx;
  if (i == TIMER_NOT_QUEUED) return;
  t->idx = TIMER_NOT_QUEUED;
  mp_timer_t *last = h->v[--h->n];
  if (i == h->n) return;
  timer__set(h, i, last);
  if (i > 0 && timer__less(last, h->v[(i - 1) / 2]))
    timer__up(h, i);
  else
    timer__down(h, i);
}

int timer_start(timer_heap_t *h, mp_timer_t *t, uint64_t now, uint64_t delay,
                uint64_t interval, int64_t count, timer_fn fn,
                timer_fn on_finish, void *udata) {
  if (t->armed) return -EBUSY;
  t->due = now + delay;
  t->interval = interval;
  t->remaining = count <= 0 ? -1 : count;
  t->fn = fn;
  t->on_finish = on_finish;
  t->udata = udata;
  int rc = timer__push(h, t);
  if (rc) return rc;
  t->armed = true;
  return 0;
}

void timer_stop(timer_heap_t *h, mp_timer_t *t) {
  if (!t->armed) return;
  t->armed = false;
  timer__remove(h, t);
  /* Inside its own fn, timer_heap_run sees armed == false afterwards and
   * finishes it there, so on_finish never runs under the caller's feet. */
  if (!t->firing && t->on_finish) t->on_finish(t);
}

int64_t timer_heap_wait(const timer_heap_t *h, uint64_t now) {
  if (h->n == 0) return -1;
  uint64_t due = h->v[0]->due;
  return due <= now ? 0 : (int64_t)(due - now);
}

size_t timer_heap_run(timer_heap_t *h, uint64_t now) {
  /* Take every timer due now out first, so that timers the callbacks start
   * (even for "now") wait for the next call, and none of the due ones is
   * skipped. While in the batch a timer counts as firing: a stop from
   * another callback defers its on_finish to here, so the storage stays
   * valid until the batch is done with it. */
  size_t nb = 0;
  while (h->n > 0 && h->v[0]->due <= now) {
    if (nb == h->bcap) {
      size_t cap = h->bcap ? h->bcap * 2 : 16;
      mp_timer_t **b = realloc(h->batch, cap * sizeof(*b));
      if (!b) break; /* the rest runs on a later call */
      h->batch = b;
      h->bcap = cap;
    }
    mp_timer_t *t = h->v[0];
    timer__remove(h, t);
    t->firing = true;
    h->batch[nb++] = t;
  }
  size_t ran = 0;
  for (size_t i = 0; i < nb; i++) {
    mp_timer_t *t = h->batch[i];
    if (t->idx != TIMER_NOT_QUEUED) { /* stopped and started again */
      t->firing = false;
      continue;
    }
    if (t->armed) {
      if (t->remaining > 0) t->remaining--;
      t->fn(t);
      ran++;
    }
    t->firing = false;
    if (t->idx != TIMER_NOT_QUEUED) continue; /* fn stopped and restarted it */
    if (t->armed && t->remaining != 0) {
      t->due += t->interval;
      if (t->due <= now) t->due = now + (t->interval ? t->interval : 1);
      if (timer__push(h, t) == 0) continue;
    }
    t->armed = false;
    if (t->on_finish) t->on_finish(t);
  }
  return ran;
}

size_t timer_heap_size(const timer_heap_t *h) { return h->n; }
