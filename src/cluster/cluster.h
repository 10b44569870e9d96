/* SPDX-License-Identifier: MIT */

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

/* Processes one worker slot may have at once: the one serving and up to
 * CLUSTER_GENERATIONS - 1 replaced ones still finishing their
 * connections. Each has its own post-office sink: slot i (1..n) uses
 * sinks i + k * n for k < CLUSTER_GENERATIONS; sink 0 is the root's. */
#define CLUSTER_GENERATIONS 4
#define CLUSTER_SINKS(n) (1 + CLUSTER_GENERATIONS * (n))

/* Runs in a new worker process: `index` is 1..n, `sink` its post-office
 * sink (unique among the live processes), `ipc_fd` its end of a
 * socketpair to the root (EOF there means the root is gone). Returns the
 * process's exit status. */
typedef int (*cluster_worker_fn)(int index, int sink, int ipc_fd, void *arg);

/* Why a worker process started: the first ones, or a restart because
 * the last one crashed (or was killed from outside), the watchdog found it
 * stuck (or silent, or never serving), it used too much memory, a reload
 * rolled the workers, or SIGUSR1 restarted them. */
typedef enum {
  CLUSTER_CAUSE_FIRST,
  CLUSTER_CAUSE_CRASH,
  CLUSTER_CAUSE_WATCHDOG,
  CLUSTER_CAUSE_MEMORY,
  CLUSTER_CAUSE_RELOAD,
  CLUSTER_CAUSE_RESTART,
  CLUSTER_CAUSE_N
} cluster_cause_t;

/* In the root: a worker process started on post-office sink `sink` (see
 * CLUSTER_SINKS; (sink - 1) % n + 1 is its number), and `ipc_fd` is
 * the root's end of its socketpair (the callee owns it from now on),
 * `cause` why it started; or the process on `sink` exited. */
typedef struct {
  void (*started)(int sink, int ipc_fd, cluster_cause_t cause, void *arg);
  void (*exited)(int sink, void *arg);
  /* Asks the process on `sink` to stop accepting and finish its
   * connections; false if it can't be told (then it gets SIGTERM). */
  bool (*drain)(int sink, void *arg);
  /* A roll (cluster_roll) finished: every worker is a process started
   * since the last roll began, and serves. May be NULL. */
  void (*rolled)(const char *what, void *arg);
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
 * ended and, unless stopping, starts a replacement shortly. Waits only for
 * the workers' pids: other children of the process are left to whoever
 * started them (io.popen's pclose in the root script). */
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
 * told to drain: stop accepting, finish its connections within
 * `drain_ms`, then shut down within the grace period; past that (plus
 * 2 s) it is killed. False when the worker is down, already being
 * replaced, has no free sink (too many replaced ones still draining), or
 * we are stopping. `cause` is the new process's (for the counters). */
bool cluster_replace(cluster_t *c, int index, const char *why,
                     cluster_cause_t cause);
/* Replaces every worker, one at a time, each new one serving before its
 * predecessor drains (SIGUSR1, and a reload: new processes load the
 * script anew). A call during a roll restarts it for every worker not
 * started since. `what` names it in the log; `cause` is the new
 * processes' (CLUSTER_CAUSE_RELOAD or _RESTART). */
void cluster_roll(cluster_t *c, const char *what, cluster_cause_t cause);
/* The process on `sink` serves now. */
void cluster_ready(cluster_t *c, int sink);
/* The process on `sink` is alive and none of its lanes is stuck. */
void cluster_beat(cluster_t *c, int sink);
/* The process on `sink` reports a stuck lane (`why` for the log): the
 * worker is replaced. */
void cluster_stuck(cluster_t *c, int sink, const char *why);
/* Limits, checked twice a second: a worker whose resident memory passes
 * `max_rss` bytes is replaced (0: no limit); so is one that sent no
 * heartbeat for `beat_timeout_ms` (0: never), or did not start serving in
 * that time; a drained worker is killed `drain_ms` + grace + 2 s after it
 * was told to drain. */
void cluster_set_limits(cluster_t *c, size_t max_rss, uint64_t beat_timeout_ms,
                        uint64_t drain_ms);
/* True once every worker slot has a process that said it serves (for
 * the service manager's READY=1 at start). */
bool cluster_serving(const cluster_t *c);
/* Sends `sig` to every live worker process, the replaced ones still
 * finishing their connections included (they still write logs). */
void cluster_signal(cluster_t *c, int sig);

#endif
