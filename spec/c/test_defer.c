/* SPDX-License-Identifier: MIT */

/* Unit tests for src/core/defer.h: the task queue, its eventfd wake-up and
 * the thread pool. Own main(); checks from check.h. */
#include "core/defer.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- check macros (main thread only) ---- */

#include "check.h"

/* ---- helpers ---- */

/* Whether fd polls readable right now. */
static bool readable(int fd) {
  struct pollfd p = {.fd = fd, .events = POLLIN};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* A log of task runs, consumer thread only. */
#define LOG_CAP 40000
static intptr_t g_log[LOG_CAP];
static size_t g_log_n;

static void log_task(void *a, void *b) {
  (void)b;
  if (g_log_n < LOG_CAP) g_log[g_log_n++] = (intptr_t)a;
}

static void log_reset(void) { g_log_n = 0; }

/* ---- FIFO order, max, pending ---- */

static void test_fifo(void) {
  defer_queue_t q;
  CHECK_EQ(defer_queue_init(&q, false), 0);
  CHECK_EQ(defer_wake_fd(&q), -1);
  defer_wake_clear(&q); /* no eventfd: a no-op */
  CHECK(!defer_pending(&q));
  CHECK_EQ(defer_run(&q, SIZE_MAX), 0);

  log_reset();
  for (intptr_t i = 0; i < 10; i++)
    CHECK_EQ(defer_push(&q, log_task, (void *)i, NULL), 0);
  CHECK(defer_pending(&q));
  CHECK_EQ(defer_run(&q, 3), 3);
  CHECK(defer_pending(&q));
  CHECK_EQ(defer_run(&q, 0), 0);
  CHECK_EQ(defer_run(&q, SIZE_MAX), 7);
  CHECK(!defer_pending(&q));
  CHECK_EQ(g_log_n, 10);
  bool ordered = true;
  for (size_t i = 0; i < g_log_n; i++) ordered &= g_log[i] == (intptr_t)i;
  CHECK(ordered);
  defer_queue_deinit(&q);
}

/* Both arguments reach the task unchanged. */
static void *g_seen_a, *g_seen_b;
static void args_task(void *a, void *b) {
  g_seen_a = a;
  g_seen_b = b;
}

static void test_args(void) {
  defer_queue_t q;
  int x, y;
  CHECK_EQ(defer_queue_init(&q, false), 0);
  CHECK_EQ(defer_push(&q, args_task, &x, &y), 0);
  CHECK_EQ(defer_run(&q, 1), 1);
  CHECK(g_seen_a == &x);
  CHECK(g_seen_b == &y);
  defer_queue_deinit(&q);
}

/* ---- growth past the initial capacity, also while the ring wraps ---- */

static void test_growth(void) {
  defer_queue_t q;
  CHECK_EQ(defer_queue_init(&q, false), 0);
  log_reset();
  /* Move head off 0 so the ring is wrapped when it has to grow. */
  intptr_t next = 0;
  for (int i = 0; i < 50; i++) defer_push(&q, log_task, (void *)next++, NULL);
  CHECK_EQ(defer_run(&q, 30), 30);
  int failed = 0;
  for (int i = 0; i < 10000; i++)
    failed += defer_push(&q, log_task, (void *)next++, NULL) != 0;
  CHECK_EQ(failed, 0);
  CHECK_EQ(defer_run(&q, SIZE_MAX), 10020);
  CHECK_EQ(g_log_n, 10050);
  bool ordered = true;
  for (size_t i = 0; i < g_log_n; i++) ordered &= g_log[i] == (intptr_t)i;
  CHECK(ordered);
  CHECK(!defer_pending(&q));

  /* Interleaved pushes and runs keep FIFO across several wraps. */
  log_reset();
  intptr_t pushed = 0;
  for (int round = 0; round < 200; round++) {
    for (int i = 0; i < 37; i++) defer_push(&q, log_task, (void *)pushed++, NULL);
    defer_run(&q, 29);
  }
  defer_run(&q, SIZE_MAX);
  CHECK_EQ(g_log_n, pushed);
  ordered = true;
  for (size_t i = 0; i < g_log_n; i++) ordered &= g_log[i] == (intptr_t)i;
  CHECK(ordered);
  defer_queue_deinit(&q);
}

/* ---- a task pushing another task ---- */

static defer_queue_t *g_q;

static void chain_task(void *a, void *b) {
  intptr_t left = (intptr_t)a;
  log_task((void *)(1000 + left), NULL);
  if (left > 0) defer_push(g_q, chain_task, (void *)(left - 1), b);
}

static void push_child_task(void *a, void *b) {
  log_task(a, NULL);
  defer_push(g_q, log_task, b, NULL);
}

static void test_task_pushes(void) {
  defer_queue_t q;
  CHECK_EQ(defer_queue_init(&q, true), 0);
  g_q = &q;

  /* A pushes B while C is already queued: FIFO gives A, C, B. */
  log_reset();
  defer_push(&q, push_child_task, (void *)1, (void *)3);
  defer_push(&q, log_task, (void *)2, NULL);
  CHECK_EQ(defer_run(&q, SIZE_MAX), 3);
  CHECK_EQ(g_log_n, 3);
  CHECK_EQ(g_log[0], 1);
  CHECK_EQ(g_log[1], 2);
  CHECK_EQ(g_log[2], 3);

  /* Beyond max, the pushed task waits for the next call. */
  log_reset();
  defer_push(&q, push_child_task, (void *)7, (void *)8);
  CHECK_EQ(defer_run(&q, 1), 1);
  CHECK(defer_pending(&q));
  CHECK_EQ(g_log_n, 1);
  CHECK_EQ(defer_run(&q, SIZE_MAX), 1);
  CHECK_EQ(g_log_n, 2);
  CHECK_EQ(g_log[1], 8);

  /* A chain of 100 self-pushes within one unbounded run. */
  log_reset();
  defer_push(&q, chain_task, (void *)99, NULL);
  CHECK_EQ(defer_run(&q, SIZE_MAX), 100);
  CHECK(!defer_pending(&q));
  CHECK_EQ(g_log_n, 100);
  CHECK_EQ(g_log[0], 1099);
  CHECK_EQ(g_log[99], 1000);

  g_q = NULL;
  defer_queue_deinit(&q);
}

/* ---- the eventfd ---- */

static void noop_task(void *a, void *b) {
  (void)a;
  (void)b;
}

static void test_wake(void) {
  defer_queue_t q;
  CHECK_EQ(defer_queue_init(&q, true), 0);
  int fd = defer_wake_fd(&q);
  CHECK(fd >= 0);
  CHECK(!readable(fd));

  CHECK_EQ(defer_push(&q, noop_task, NULL, NULL), 0);
  CHECK(readable(fd));
  CHECK_EQ(defer_push(&q, noop_task, NULL, NULL), 0);
  CHECK(readable(fd));
  defer_wake_clear(&q);
  CHECK(!readable(fd));
  CHECK(defer_pending(&q)); /* clearing the wake-up keeps the tasks */
  defer_wake_clear(&q);     /* clearing twice is harmless */
  CHECK(!readable(fd));

  CHECK_EQ(defer_run(&q, SIZE_MAX), 2);
  CHECK(!defer_pending(&q));
  /* Empty again: the next push wakes again. */
  CHECK_EQ(defer_push(&q, noop_task, NULL, NULL), 0);
  CHECK(readable(fd));
  defer_wake_clear(&q);
  CHECK(!readable(fd));
  CHECK_EQ(defer_run(&q, SIZE_MAX), 1);

  /* deinit drops queued tasks without running them and closes the fd. */
  g_seen_a = NULL;
  defer_push(&q, args_task, &q, NULL);
  defer_queue_deinit(&q);
  CHECK(g_seen_a == NULL);
  CHECK_EQ(defer_wake_fd(&q), -1);
}

/* ---- defer_queue_after_fork ---- */

struct fork_hold {
  defer_queue_t *q;
  atomic_int state; /* 1: lock held, 2: may release */
};

static void *hold_lock_thread(void *p) {
  struct fork_hold *h = p;
  pthread_mutex_lock(&h->q->lock);
  atomic_store(&h->state, 1);
  while (atomic_load(&h->state) != 2) sleep_ms(1);
  pthread_mutex_unlock(&h->q->lock);
  return NULL;
}

/* The child's verdict as an exit code: the first failed step, or 0. */
static int child_after_fork(defer_queue_t *q) {
  defer_queue_after_fork(q);
  if (defer_pending(q)) return 10;
  if (defer_run(q, SIZE_MAX) != 0) return 11;
  if (g_log_n != 0) return 12;
  if (defer_wake_fd(q) < 0) return 13; /* the eventfd is kept */
  if (readable(defer_wake_fd(q))) return 14;
  if (defer_push(q, log_task, (void *)42, NULL) != 0) return 15;
  if (!readable(defer_wake_fd(q))) return 16;
  if (defer_run(q, SIZE_MAX) != 1 || g_log_n != 1 || g_log[0] != 42)
    return 17;
  return 0;
}

static int wait_child(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

static void test_after_fork(void) {
  defer_queue_t q;
  CHECK_EQ(defer_queue_init(&q, true), 0);
  log_reset();
  for (intptr_t i = 0; i < 5; i++) defer_push(&q, log_task, (void *)i, NULL);
  CHECK(readable(defer_wake_fd(&q)));

  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) _exit(child_after_fork(&q));
  CHECK(pid > 0);
  if (pid > 0) CHECK_EQ(wait_child(pid), 0);

  /* The parent's queue is untouched. */
  CHECK(defer_pending(&q));
  CHECK_EQ(defer_run(&q, SIZE_MAX), 5);
  CHECK_EQ(g_log_n, 5);

  /* Forked while another thread holds the lock: the child must not hang. */
  log_reset();
  defer_wake_clear(&q);
  defer_push(&q, log_task, (void *)9, NULL);
  struct fork_hold h = {.q = &q};
  atomic_init(&h.state, 0);
  pthread_t tid;
  CHECK_EQ(pthread_create(&tid, NULL, hold_lock_thread, &h), 0);
  while (atomic_load(&h.state) != 1) sleep_ms(1);
  fflush(stdout);
  pid = fork();
  if (pid == 0) {
    alarm(10); /* a deadlock ends as SIGALRM, not as a hang */
    _exit(child_after_fork(&q));
  }
  atomic_store(&h.state, 2);
  pthread_join(tid, NULL);
  CHECK(pid > 0);
  if (pid > 0) CHECK_EQ(wait_child(pid), 0);
  CHECK_EQ(defer_run(&q, SIZE_MAX), 1);
  defer_queue_deinit(&q);
}

/* ---- many producers, one consumer ---- */

#define PRODUCERS 4
#define PER_PRODUCER 25000

static defer_queue_t g_mq;
static long g_mp_count[PRODUCERS];   /* consumer only */
static intptr_t g_mp_next[PRODUCERS]; /* next expected sequence number */
static long g_mp_misorder;
static long g_mp_total;

static void mp_task(void *a, void *b) {
  intptr_t who = (intptr_t)a, seq = (intptr_t)b;
  if (who < 0 || who >= PRODUCERS) {
    g_mp_misorder++;
    return;
  }
  if (seq != g_mp_next[who]) g_mp_misorder++;
  g_mp_next[who] = seq + 1;
  g_mp_count[who]++;
  g_mp_total++;
}

static atomic_int g_mp_push_failures;

static void *mp_producer(void *arg) {
  intptr_t who = (intptr_t)arg;
  for (intptr_t i = 0; i < PER_PRODUCER; i++) {
    if (defer_push(&g_mq, mp_task, (void *)who, (void *)i) != 0)
      atomic_fetch_add(&g_mp_push_failures, 1);
    if ((i & 1023) == 0) sched_yield();
  }
  return NULL;
}

static void test_multi_producer(void) {
  CHECK_EQ(defer_queue_init(&g_mq, true), 0);
  int fd = defer_wake_fd(&g_mq);
  pthread_t tids[PRODUCERS];
  int created = 0;
  for (intptr_t i = 0; i < PRODUCERS; i++)
    created += pthread_create(&tids[i], NULL, mp_producer, (void *)i) == 0;
  CHECK_EQ(created, PRODUCERS);

  /* The consumer loop of an event loop: wait for the eventfd, clear it,
   * drain. With that order no wake-up may be lost, so the poll never
   * times out while tasks are still to come. */
  long want = (long)created * PER_PRODUCER;
  int timeouts = 0, batches = 0;
  while (g_mp_total < want && timeouts == 0) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int n = poll(&p, 1, 10000);
    if (n == 0) {
      timeouts++;
      break;
    }
    defer_wake_clear(&g_mq);
    defer_run(&g_mq, 1000); /* bounded, like the reactor */
    while (defer_pending(&g_mq)) defer_run(&g_mq, 1000);
    batches++;
  }
  for (int i = 0; i < created; i++) pthread_join(tids[i], NULL);
  defer_run(&g_mq, SIZE_MAX);

  CHECK_EQ(timeouts, 0);
  CHECK_EQ(atomic_load(&g_mp_push_failures), 0);
  CHECK_EQ(g_mp_total, want);
  CHECK_EQ(g_mp_misorder, 0);
  for (int i = 0; i < created; i++) CHECK_EQ(g_mp_count[i], PER_PRODUCER);
  CHECK(batches >= 1);
  CHECK(!defer_pending(&g_mq));
  defer_queue_deinit(&g_mq);
}

/* ---- the pool ---- */

#define POOL_N 6

struct pool_probe {
  atomic_int hits[POOL_N];
  atomic_int done[POOL_N];
  atomic_int bad_index;
  atomic_int signals_open; /* runs whose mask was not the caller's */
  atomic_int faults_blocked; /* runs that found SIGSEGV & co. blocked */
  atomic_int running, max_running;
  void *self;
};

static void pool_run(void *arg, size_t index) {
  struct pool_probe *p = arg;
  if (p->self != p || index >= POOL_N) {
    atomic_fetch_add(&p->bad_index, 1);
    return;
  }
  atomic_fetch_add(&p->hits[index], 1);
  sigset_t cur;
  pthread_sigmask(SIG_BLOCK, NULL, &cur);
  /* The caller blocked SIGUSR1 only: threads start with its mask, so a
   * process they spawn gets an ordinary one. */
  if (!sigismember(&cur, SIGUSR1) || sigismember(&cur, SIGTERM) ||
      sigismember(&cur, SIGINT))
    atomic_fetch_add(&p->signals_open, 1);
  /* A crash in a pool thread must still be delivered. */
  if (sigismember(&cur, SIGSEGV) || sigismember(&cur, SIGBUS) ||
      sigismember(&cur, SIGFPE) || sigismember(&cur, SIGABRT))
    atomic_fetch_add(&p->faults_blocked, 1);
  int now = atomic_fetch_add(&p->running, 1) + 1;
  int max = atomic_load(&p->max_running);
  while (now > max && !atomic_compare_exchange_weak(&p->max_running, &max, now)) {
  }
  /* Stagger the ends so a join that returns early is caught. */
  sleep_ms(20 + 15 * (long)index);
  atomic_fetch_sub(&p->running, 1);
  atomic_store(&p->done[index], 1);
}

static void test_pool(void) {
  struct pool_probe p;
  memset(&p, 0, sizeof(p));
  p.self = &p;
  sigset_t usr1, before, after;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, &before);

  defer_pool_t *pool = defer_pool_new(POOL_N, pool_run, &p);
  CHECK(pool != NULL);
  /* The caller's own mask is unchanged. */
  pthread_sigmask(SIG_BLOCK, NULL, &after);
  CHECK(sigismember(&after, SIGUSR1));
  CHECK(!sigismember(&after, SIGTERM));
  defer_pool_join(pool);
  pthread_sigmask(SIG_SETMASK, &before, NULL);

  int all_once = 1, all_done = 1;
  for (int i = 0; i < POOL_N; i++) {
    all_once &= atomic_load(&p.hits[i]) == 1;
    all_done &= atomic_load(&p.done[i]) == 1;
  }
  CHECK(all_once);
  CHECK(all_done); /* join returned only after every run returned */
  CHECK_EQ(atomic_load(&p.bad_index), 0);
  CHECK_EQ(atomic_load(&p.signals_open), 0);
  CHECK_EQ(atomic_load(&p.faults_blocked), 0);
  CHECK_EQ(atomic_load(&p.running), 0);
  CHECK(atomic_load(&p.max_running) >= 1);

  /* An empty pool and a NULL pool. */
  memset(&p, 0, sizeof(p));
  p.self = &p;
  pool = defer_pool_new(0, pool_run, &p);
  CHECK(pool != NULL);
  defer_pool_join(pool);
  defer_pool_join(NULL);
  int any = 0;
  for (int i = 0; i < POOL_N; i++) any |= atomic_load(&p.hits[i]);
  CHECK_EQ(any, 0);
}

/* The pool's threads as producers into one queue, drained after join. */
static defer_queue_t g_pq;
static atomic_int g_pool_push_failures;

static void pool_producer(void *arg, size_t index) {
  (void)arg;
  for (intptr_t i = 0; i < 2000; i++)
    if (defer_push(&g_pq, mp_task, (void *)(intptr_t)index, (void *)i))
      atomic_fetch_add(&g_pool_push_failures, 1);
}

static void test_pool_producers(void) {
  CHECK_EQ(defer_queue_init(&g_pq, true), 0);
  memset(g_mp_count, 0, sizeof(g_mp_count));
  memset(g_mp_next, 0, sizeof(g_mp_next));
  g_mp_misorder = g_mp_total = 0;
  defer_pool_t *pool = defer_pool_new(PRODUCERS, pool_producer, NULL);
  CHECK(pool != NULL);
  defer_pool_join(pool);
  CHECK(readable(defer_wake_fd(&g_pq)));
  CHECK_EQ(defer_run(&g_pq, SIZE_MAX), PRODUCERS * 2000);
  CHECK_EQ(atomic_load(&g_pool_push_failures), 0);
  CHECK_EQ(g_mp_misorder, 0);
  for (int i = 0; i < PRODUCERS; i++) CHECK_EQ(g_mp_count[i], 2000);
  defer_queue_deinit(&g_pq);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  test_fifo();
  test_args();
  test_growth();
  test_task_pushes();
  test_wake();
  test_after_fork();
  test_multi_producer();
  test_pool();
  test_pool_producers();
  return check_summary();
}
