/* SPDX-License-Identifier: MIT */

/* defer: a thread-safe FIFO of small tasks, with an optional eventfd that
 * wakes the consuming event loop, and a pool of threads to run loops on. */
#ifndef MP_DEFER_H
#define MP_DEFER_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

typedef void (*defer_fn)(void *a, void *b);

typedef struct {
  defer_fn fn;
  void *a, *b;
} defer_task_t;

/* Caller-provided storage; see defer_queue_init. All fields are guarded by
 * `lock`, except wake_fd, which is fixed between init and deinit. */
typedef struct {
  pthread_mutex_t lock;
  defer_task_t *ring;
  size_t head, count, cap;
  int wake_fd; /* eventfd, or -1 when the queue was made without one */
} defer_queue_t;

/* Prepares an empty queue in `q`. With `wake` an eventfd is made that turns
 * readable when a task is pushed into an empty queue (poll it, then call
 * defer_wake_clear). Returns 0 or a negative errno. */
int defer_queue_init(defer_queue_t *q, bool wake);

/* Drops every task without running it and releases the queue's memory and
 * eventfd. No other thread may use the queue any more. */
void defer_queue_deinit(defer_queue_t *q);

/* Appends a task. Any thread. Returns 0, or -ENOMEM (the task is not
 * queued and will never run). */
int defer_push(defer_queue_t *q, defer_fn fn, void *a, void *b);

/* Runs up to `max` tasks in FIFO order on the calling thread (the consumer)
 * and returns how many ran. Tasks pushed while running wait for the next
 * call beyond `max`. The lock is not held while a task runs, so a task may
 * push. */
size_t defer_run(defer_queue_t *q, size_t max);

/* Whether tasks are waiting. Any thread (a snapshot). */
bool defer_pending(defer_queue_t *q);

/* The eventfd to poll for readability, or -1. */
int defer_wake_fd(const defer_queue_t *q);

/* Resets the eventfd after it polled readable. Consumer thread. */
void defer_wake_clear(defer_queue_t *q);

/* In a child after fork(): the lock may have been held by a thread that no
 * longer exists, and the tasks belong to the parent. Re-creates the lock
 * and drops the tasks; the eventfd is kept. */
void defer_queue_after_fork(defer_queue_t *q);

/* A pool of threads, each running run(arg, index) once, index 0..n-1.
 * Threads start with the caller's signal mask. No `run` is called until
 * every thread exists: when one cannot start, none runs, the others are
 * joined, and NULL is returned with errno set. */
typedef struct defer_pool defer_pool_t;
defer_pool_t *defer_pool_new(size_t n, void (*run)(void *arg, size_t index),
                             void *arg);

/* Waits for every thread of the pool to return, then frees it. */
void defer_pool_join(defer_pool_t *pool);

#endif
