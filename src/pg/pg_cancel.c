/* SPDX-License-Identifier: MIT */

/* pg_cancel: PQcancel on a thread of its own, so a lane never blocks on
 * the new connection a cancel request opens (pg_cancel.h). */
#include <errno.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/log.h"
#include "pg/pg_cancel.h"

#define PG_CANCEL_QUEUE_MAX 1024

/* The queue of cancels, guarded by lock; cancel_pid is the process that
 * started the thread (a forked child starts its own), also under lock. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static PGcancel *queue[PG_CANCEL_QUEUE_MAX];
static size_t qhead, qcount;
static pid_t cancel_pid;

static void *pg__cancel_thread(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&lock);
    while (qcount == 0) pthread_cond_wait(&cond, &lock);
    PGcancel *c = queue[qhead];
    qhead = (qhead + 1) % PG_CANCEL_QUEUE_MAX;
    qcount--;
    pthread_mutex_unlock(&lock);
    char err[256];
    if (!PQcancel(c, err, sizeof(err)))
      log_warn("pg: cancel request failed: %s", err);
    PQfreeCancel(c);
  }
  return NULL;
}

int pg__cancel_post(void *cancel) {
  PGcancel *c = cancel;
  pthread_mutex_lock(&lock);
  if (cancel_pid != getpid()) {
    /* A child forked from a process with the thread has the old queue
     * (its entries are the parent's) and no thread. */
    qhead = qcount = 0;
    pthread_t t;
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    int err = pthread_create(&t, &a, pg__cancel_thread, NULL);
    pthread_attr_destroy(&a);
    if (err) {
      pthread_mutex_unlock(&lock);
      PQfreeCancel(c);
      return -err;
    }
    cancel_pid = getpid();
  }
  if (qcount == PG_CANCEL_QUEUE_MAX) {
    pthread_mutex_unlock(&lock);
    PQfreeCancel(c);
    return -ENOBUFS;
  }
  queue[(qhead + qcount) % PG_CANCEL_QUEUE_MAX] = c;
  qcount++;
  pthread_cond_signal(&cond);
  pthread_mutex_unlock(&lock);
  return 0;
}
