/* SPDX-License-Identifier: MIT */

/* defer: mutex-guarded ring of tasks plus an eventfd for wake-ups. */
#include "core/defer.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>

int defer_queue_init(defer_queue_t *q, bool wake) {
  q->ring = NULL;
  q->head = q->count = q->cap = 0;
  q->wake_fd = -1;
  int rc = pthread_mutex_init(&q->lock, NULL);
  if (rc) return -rc;
  if (wake) {
    q->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (q->wake_fd < 0) {
      rc = -errno;
      pthread_mutex_destroy(&q->lock);
      return rc;
    }
  }
  return 0;
}

void defer_queue_deinit(defer_queue_t *q) {
  free(q->ring);
  q->ring = NULL;
  q->head = q->count = q->cap = 0;
  if (q->wake_fd >= 0) close(q->wake_fd);
  q->wake_fd = -1;
  pthread_mutex_destroy(&q->lock);
}

/* Doubles the ring, unwrapping it so head becomes 0. Lock held. */
static int defer__grow(defer_queue_t *q) {
  size_t cap = q->cap ? q->cap * 2 : 64;
  defer_task_t *ring = malloc(cap * sizeof(*ring));
  if (!ring) return -ENOMEM;
  for (size_t i = 0; i < q->count; i++)
    ring[i] = q->ring[(q->head + i) % q->cap];
  free(q->ring);
  q->ring = ring;
  q->cap = cap;
  q->head = 0;
  return 0;
}

int defer_push(defer_queue_t *q, defer_fn fn, void *a, void *b) {
  pthread_mutex_lock(&q->lock);
  if (q->count == q->cap && defer__grow(q)) {
    pthread_mutex_unlock(&q->lock);
    return -ENOMEM;
  }
  q->ring[(q->head + q->count) % q->cap] = (defer_task_t){fn, a, b};
  bool was_empty = q->count++ == 0;
  pthread_mutex_unlock(&q->lock);
  /* Only the empty-to-non-empty edge needs a wake-up: the consumer drains
   * everything that is queued once it is awake. */
  if (was_empty && q->wake_fd >= 0) {
    uint64_t one = 1;
    ssize_t w = write(q->wake_fd, &one, sizeof(one));
    (void)w; /* EAGAIN means the counter is already non-zero: still awake */
  }
  return 0;
}

size_t defer_run(defer_queue_t *q, size_t max) {
  size_t ran = 0;
  while (ran < max) {
    pthread_mutex_lock(&q->lock);
    if (q->count == 0) {
      pthread_mutex_unlock(&q->lock);
      break;
    }
    defer_task_t t = q->ring[q->head];
    q->head = (q->head + 1) % q->cap;
    q->count--;
    pthread_mutex_unlock(&q->lock);
    t.fn(t.a, t.b);
    ran++;
  }
  return ran;
}

bool defer_pending(defer_queue_t *q) {
  pthread_mutex_lock(&q->lock);
  bool any = q->count > 0;
  pthread_mutex_unlock(&q->lock);
  return any;
}

int defer_wake_fd(const defer_queue_t *q) { return q->wake_fd; }

void defer_wake_clear(defer_queue_t *q) {
  if (q->wake_fd < 0) return;
  uint64_t v;
  ssize_t r = read(q->wake_fd, &v, sizeof(v));
  (void)r;
}

void defer_queue_after_fork(defer_queue_t *q) {
  pthread_mutex_init(&q->lock, NULL);
  q->head = q->count = 0;
  defer_wake_clear(q);
}

struct defer_pool {
  size_t n;
  void (*run)(void *arg, size_t index);
  void *arg;
  /* The threads wait at this gate until every one of them exists, so a
   * failed start can send them home before `run` is ever called. */
  pthread_mutex_t gate_lock;
  pthread_cond_t gate_cond;
  int gate; /* guarded by gate_lock: 0 wait, 1 go, -1 abort */
  struct defer_pool_slot {
    struct defer_pool *pool;
    size_t index;
    pthread_t tid;
  } slots[];
};

static void *defer__thread(void *p) {
  struct defer_pool_slot *s = p;
  defer_pool_t *pool = s->pool;
  pthread_mutex_lock(&pool->gate_lock);
  while (pool->gate == 0) pthread_cond_wait(&pool->gate_cond, &pool->gate_lock);
  int go = pool->gate > 0;
  pthread_mutex_unlock(&pool->gate_lock);
  if (go) pool->run(pool->arg, s->index);
  return NULL;
}

static void defer__open_gate(defer_pool_t *pool, int value) {
  pthread_mutex_lock(&pool->gate_lock);
  pool->gate = value;
  pthread_cond_broadcast(&pool->gate_cond);
  pthread_mutex_unlock(&pool->gate_lock);
}

defer_pool_t *defer_pool_new(size_t n, void (*run)(void *arg, size_t index),
                             void *arg) {
  defer_pool_t *pool = calloc(1, sizeof(*pool) + n * sizeof(pool->slots[0]));
  if (!pool) return NULL;
  pool->n = n;
  pool->run = run;
  pool->arg = arg;
  pthread_mutex_init(&pool->gate_lock, NULL);
  pthread_cond_init(&pool->gate_cond, NULL);
  size_t started = 0;
  int err = 0;
  for (; started < n; started++) {
    pool->slots[started] = (struct defer_pool_slot){pool, started, 0};
    err = pthread_create(&pool->slots[started].tid, NULL, defer__thread,
                         &pool->slots[started]);
    if (err) break;
  }
  defer__open_gate(pool, err ? -1 : 1);
  if (err) {
    for (size_t i = 0; i < started; i++)
      pthread_join(pool->slots[i].tid, NULL);
    pthread_cond_destroy(&pool->gate_cond);
    pthread_mutex_destroy(&pool->gate_lock);
    free(pool);
    errno = err;
    return NULL;
  }
  return pool;
}

void defer_pool_join(defer_pool_t *pool) {
  if (!pool) return;
  for (size_t i = 0; i < pool->n; i++) pthread_join(pool->slots[i].tid, NULL);
  pthread_cond_destroy(&pool->gate_cond);
  pthread_mutex_destroy(&pool->gate_lock);
  free(pool);
}
