/* cluster: the root process's side of running several worker processes:
 * fork them, supervise them, replace the ones that die, and stop them
 * gracefully. Driven by the root's reactor (one thread). */
#ifndef MP_CLUSTER_H
#define MP_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "net/reactor.h"

typedef struct cluster cluster_t;

/* Runs in a new worker process: `index` is 1..n, `ipc_fd` its end of a
 * socketpair to the root (EOF there means the root is gone). Returns the
 * process's exit status. */
typedef int (*cluster_worker_fn)(int index, int ipc_fd, void *arg);

/* In the root: a worker process started on post-office sink `sink` (its
 * number, or its number + n while it replaces another), and `ipc_fd` is
 * the root's end of its socketpair (the callee owns it from now on); or
 * the process on `sink` exited. */
typedef struct {
  void (*started)(int sink, int ipc_fd, void *arg);
  void (*exited)(int sink, void *arg);
  /* Asks the process on `sink` to stop accepting and finish its
   * connections; false if it can't be told (then it gets SIGTERM). */
  bool (*drain)(int sink, void *arg);
} cluster_hooks_t;

/* A cluster of `n` workers supervised from reactor `root`. NULL and errno
 * on failure. Root thread. */
cluster_t *cluster_new(reactor_t *root, int n, uint64_t grace_ms,
                       cluster_worker_fn worker, cluster_hooks_t hooks,
                       void *arg);
void cluster_free(cluster_t *c);

/* Forks every worker. Returns 0 or a negative errno (workers already
 * started are stopped). Call before the root's loop runs. */
int cluster_start(cluster_t *c);

/* Reaps workers that exited (call when SIGCHLD arrived): logs how each
 * ended and, unless stopping, starts a replacement shortly. */
void cluster_reap(cluster_t *c);

/* Stops the workers gracefully (SIGTERM; a second call passes it on
 * again, which workers take as "close now"); whoever is left after the
 * grace period plus 2 s gets SIGKILL. Once none is left, the root reactor
 * is shut down. */
void cluster_stop(cluster_t *c);

/* Live worker processes (a worker being replaced counts twice). */
int cluster_live(const cluster_t *c);

/* Replaces worker `index` (1..n) gracefully: a new process starts on the
 * same socket, and once it says it is ready (cluster_ready) the old one is
 * told to stop, finishing its connections within the grace period. False
 * when the worker is down, already being replaced, or we are stopping. */
bool cluster_replace(cluster_t *c, int index, const char *why);
/* Replaces every worker, one at a time (SIGUSR1). */
void cluster_restart_all(cluster_t *c);
/* The process on `sink` serves now. */
void cluster_ready(cluster_t *c, int sink);
/* Replaces a worker whose resident memory passes `bytes` (0: no limit);
 * checked once a second. */
void cluster_set_max_memory(cluster_t *c, size_t bytes);

#endif
