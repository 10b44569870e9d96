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

/* In the root: worker `index` started, and `ipc_fd` is the root's end of
 * its socketpair (the callee owns it from now on); or it exited. */
typedef struct {
  void (*started)(int index, int ipc_fd, void *arg);
  void (*exited)(int index, void *arg);
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

/* Live workers. */
int cluster_live(const cluster_t *c);

#endif
