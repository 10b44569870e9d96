/* cluster: fork, supervise, respawn and stop worker processes. */
#include "cluster/cluster.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"

/* A worker that dies sooner than this after it started is replaced after
 * CLUSTER_SLOW_RESPAWN_MS, so a script that crashes at once can't make
 * the root fork in a tight loop. */
#define CLUSTER_QUICK_DEATH_MS 1000
#define CLUSTER_FAST_RESPAWN_MS 20
#define CLUSTER_SLOW_RESPAWN_MS 500

typedef struct {
  pid_t pid;      /* 0 when not running */
  int ipc;        /* the root's end of the socketpair (owned by the hooks'
                     side; a new child closes its copy), or -1 */
  uint64_t since; /* when it was started */
  mp_timer_t respawn;
  cluster_t *c;
  int index; /* 1-based */
} cluster_slot_t;

/* Root thread only. */
struct cluster {
  reactor_t *root;
  int n;
  uint64_t grace_ms;
  cluster_worker_fn worker;
  cluster_hooks_t hooks;
  void *arg;
  pid_t root_pid;
  bool stopping;
  int stop_requests;
  mp_timer_t kill_timer;
  cluster_slot_t *slots;
};

cluster_t *cluster_new(reactor_t *root, int n, uint64_t grace_ms,
                       cluster_worker_fn worker, cluster_hooks_t hooks,
                       void *arg) {
  cluster_t *c = calloc(1, sizeof(*c));
  if (!c) return NULL;
  c->slots = calloc((size_t)n, sizeof(*c->slots));
  if (!c->slots) {
    free(c);
    return NULL;
  }
  c->root = root;
  c->n = n;
  c->grace_ms = grace_ms;
  c->worker = worker;
  c->hooks = hooks;
  c->arg = arg;
  c->root_pid = getpid();
  timer_init(&c->kill_timer);
  for (int i = 0; i < n; i++) {
    c->slots[i] = (cluster_slot_t){.ipc = -1, .c = c, .index = i + 1};
    timer_init(&c->slots[i].respawn);
  }
  return c;
}

void cluster_free(cluster_t *c) {
  if (!c) return;
  free(c->slots);
  free(c);
}

int cluster_live(const cluster_t *c) {
  int live = 0;
  for (int i = 0; i < c->n; i++) live += c->slots[i].pid > 0;
  return live;
}

/* In the child: keep only what the worker needs, then run it. */
static void cluster__child(cluster_t *c, cluster_slot_t *s, int ipc) {
  /* Learn of the root's death even if it is killed outright: SIGUSR2
   * means "the root is gone" to a worker. */
  prctl(PR_SET_PDEATHSIG, SIGUSR2);
  if (getppid() != c->root_pid) _exit(1); /* died before prctl took hold */
  for (int i = 0; i < c->n; i++)
    if (c->slots[i].ipc >= 0) close(c->slots[i].ipc);
  signal(SIGCHLD, SIG_DFL);
  exit(c->worker(s->index, ipc, c->arg));
}

static int cluster__fork(cluster_slot_t *s) {
  cluster_t *c = s->c;
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return -errno;
  fflush(NULL); /* or buffered output would be written by both processes */
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    close(sv[0]);
    close(sv[1]);
    return -e;
  }
  if (pid == 0) {
    close(sv[0]);
    cluster__child(c, s, sv[1]);
  }
  close(sv[1]);
  s->ipc = sv[0];
  s->pid = pid;
  s->since = reactor_now(c->root);
  log_info("worker %d started (pid %d)", s->index, (int)pid);
  if (c->hooks.started) c->hooks.started(s->index, sv[0], c->arg);
  return 0;
}

int cluster_start(cluster_t *c) {
  for (int i = 0; i < c->n; i++) {
    int rc = cluster__fork(&c->slots[i]);
    if (rc) {
      for (int j = 0; j < i; j++) kill(c->slots[j].pid, SIGKILL);
      return rc;
    }
  }
  return 0;
}

static void cluster__respawn(mp_timer_t *t) {
  cluster_slot_t *s = t->udata;
  if (s->c->stopping || s->pid > 0) return;
  int rc = cluster__fork(s);
  if (rc) {
    log_error("cannot start worker %d: %s; trying again", s->index,
              strerror(-rc));
    timer_start(reactor_timers(s->c->root), &s->respawn,
                reactor_now(s->c->root), CLUSTER_SLOW_RESPAWN_MS, 0, 1,
                cluster__respawn, NULL, s);
  }
}

void cluster_reap(cluster_t *c) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    cluster_slot_t *s = NULL;
    for (int i = 0; i < c->n; i++)
      if (c->slots[i].pid == pid) s = &c->slots[i];
    if (!s) continue; /* a process the script started */
    s->pid = 0;
    s->ipc = -1; /* its owner closes it */
    if (c->hooks.exited) c->hooks.exited(s->index, c->arg);
    char how[64];
    if (WIFSIGNALED(status))
      snprintf(how, sizeof(how), "was killed by signal %d", WTERMSIG(status));
    else
      snprintf(how, sizeof(how), "exited with status %d", WEXITSTATUS(status));
    if (c->stopping) {
      log_info("worker %d (pid %d) %s", s->index, (int)pid, how);
      continue;
    }
    log_warn("worker %d (pid %d) %s; starting a new one", s->index, (int)pid,
             how);
    uint64_t lived = reactor_now(c->root) - s->since;
    timer_start(reactor_timers(c->root), &s->respawn, reactor_now(c->root),
                lived < CLUSTER_QUICK_DEATH_MS ? CLUSTER_SLOW_RESPAWN_MS
                                               : CLUSTER_FAST_RESPAWN_MS,
                0, 1, cluster__respawn, NULL, s);
  }
  if (c->stopping && cluster_live(c) == 0) {
    timer_stop(reactor_timers(c->root), &c->kill_timer);
    reactor_shutdown(c->root, c->grace_ms);
  }
}

static void cluster__kill_all(mp_timer_t *t) {
  cluster_t *c = t->udata;
  for (int i = 0; i < c->n; i++) {
    if (c->slots[i].pid <= 0) continue;
    log_warn("worker %d (pid %d) did not stop in time; killing it",
             c->slots[i].index, (int)c->slots[i].pid);
    kill(c->slots[i].pid, SIGKILL);
  }
}

void cluster_stop(cluster_t *c) {
  c->stop_requests++;
  if (!c->stopping) {
    c->stopping = true;
    for (int i = 0; i < c->n; i++)
      timer_stop(reactor_timers(c->root), &c->slots[i].respawn);
    timer_start(reactor_timers(c->root), &c->kill_timer, reactor_now(c->root),
                c->grace_ms + 2000, 0, 1, cluster__kill_all, NULL, c);
  }
  for (int i = 0; i < c->n; i++)
    if (c->slots[i].pid > 0) kill(c->slots[i].pid, SIGTERM);
  if (cluster_live(c) == 0) {
    timer_stop(reactor_timers(c->root), &c->kill_timer);
    reactor_shutdown(c->root, c->grace_ms);
  }
}
