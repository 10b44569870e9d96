/* SPDX-License-Identifier: MIT */

/* cluster: fork, supervise, respawn, replace and stop worker processes. */
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
/* A new worker may take the watchdog's timeout plus this to start. */
#define CLUSTER_START_SLACK_MS 10000

/* One worker process. */
typedef struct {
  pid_t pid;      /* 0 when none */
  int sink;       /* its post-office sink (see CLUSTER_SINKS) */
  int ipc;        /* the root's end of its socketpair (owned by the hooks'
                     side; a new child closes its copy), or -1 */
  uint64_t since; /* when it was started */
  uint64_t beat;  /* its last heartbeat */
  uint64_t deadline; /* draining: killed after this; starting: when it was
                        killed for not starting; 0 otherwise */
  unsigned gen;   /* the cluster generation it was started in */
  bool ready;     /* it said it serves */
  bool watchdog;  /* killed by the tick for not starting to serve */
} cluster_proc_t;

#define CLUSTER_OLD (CLUSTER_GENERATIONS - 1)

/* Worker number `index`: the process serving it, and the replaced ones
 * (started before it) still finishing their connections. */
typedef struct {
  cluster_proc_t cur, old[CLUSTER_OLD];
  mp_timer_t respawn;
  cluster_cause_t respawn_cause; /* why the last process ended */
  cluster_t *c;
  int index; /* 1-based */
} cluster_slot_t;

/* Root thread only. */
struct cluster {
  reactor_t *root;
  int n;
  uint64_t grace_ms, drain_ms, beat_ms;
  cluster_worker_fn worker;
  cluster_hooks_t hooks;
  void *arg;
  pid_t root_pid;
  bool stopping;
  unsigned gen;        /* bumped by each roll; new processes take it */
  const char *rolling; /* what the roll in progress is for, or NULL */
  cluster_cause_t roll_cause; /* its new processes' */
  size_t max_rss;
  mp_timer_t kill_timer, tick;
  cluster_slot_t *slots;
};

static const cluster_proc_t no_proc = {.ipc = -1};

static void cluster__tick(mp_timer_t *t);

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
  c->drain_ms = 10000;
  c->worker = worker;
  c->hooks = hooks;
  c->arg = arg;
  c->root_pid = getpid();
  timer_init(&c->kill_timer);
  timer_init(&c->tick);
  for (int i = 0; i < n; i++) {
    cluster_slot_t *s = &c->slots[i];
    s->cur = no_proc;
    for (int k = 0; k < CLUSTER_OLD; k++) s->old[k] = no_proc;
    s->c = c;
    s->index = i + 1;
    s->cur.sink = i + 1;
    timer_init(&s->respawn);
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
  for (int i = 0; i < c->n; i++) {
    live += c->slots[i].cur.pid > 0;
    for (int k = 0; k < CLUSTER_OLD; k++) live += c->slots[i].old[k].pid > 0;
  }
  return live;
}

/* In the child: keep only what the worker needs, then run it. */
static void cluster__child(cluster_t *c, cluster_slot_t *s, int sink, int ipc) {
  /* Learn of the root's death even if it is killed outright: SIGUSR2
   * means "the root is gone" to a worker. */
  prctl(PR_SET_PDEATHSIG, SIGUSR2);
  if (getppid() != c->root_pid) _exit(1); /* died before prctl took hold */
  for (int i = 0; i < c->n; i++) {
    if (c->slots[i].cur.ipc >= 0) close(c->slots[i].cur.ipc);
    for (int k = 0; k < CLUSTER_OLD; k++)
      if (c->slots[i].old[k].ipc >= 0) close(c->slots[i].old[k].ipc);
  }
  signal(SIGCHLD, SIG_DFL);
  signal(SIGUSR1, SIG_DFL);
  exit(c->worker(s->index, sink, ipc, c->arg));
}

/* Starts a process for slot s as s->cur, on `sink`. */
static int cluster__fork(cluster_slot_t *s, int sink, cluster_cause_t cause) {
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
    cluster__child(c, s, sink, sv[1]);
  }
  close(sv[1]);
  uint64_t now = reactor_now(c->root);
  s->cur = (cluster_proc_t){.pid = pid, .sink = sink, .ipc = sv[0],
                            .since = now, .beat = now, .gen = c->gen};
  log_info("worker %d started (pid %d)", s->index, (int)pid);
  if (c->hooks.started) c->hooks.started(sink, sv[0], cause, c->arg);
  return 0;
}

int cluster_start(cluster_t *c) {
  for (int i = 0; i < c->n; i++) {
    int rc = cluster__fork(&c->slots[i], i + 1, CLUSTER_CAUSE_FIRST);
    if (rc) {
      for (int j = 0; j < i; j++) kill(c->slots[j].cur.pid, SIGKILL);
      return rc;
    }
  }
  timer_start(reactor_timers(c->root), &c->tick, reactor_now(c->root), 500,
              500, 0, cluster__tick, NULL, c);
  return 0;
}

static void cluster__respawn(mp_timer_t *t) {
  cluster_slot_t *s = t->udata;
  if (s->c->stopping || s->cur.pid > 0) return;
  int rc = cluster__fork(s, s->cur.sink, s->respawn_cause);
  if (rc) {
    log_error("cannot start worker %d: %s; trying again", s->index,
              strerror(-rc));
    timer_start(reactor_timers(s->c->root), &s->respawn,
                reactor_now(s->c->root), CLUSTER_SLOW_RESPAWN_MS, 0, 1,
                cluster__respawn, NULL, s);
  }
}

/* A sink no process of slot s uses, or -1. */
static int cluster__free_sink(cluster_slot_t *s) {
  for (int k = 0; k < CLUSTER_GENERATIONS; k++) {
    int sink = s->index + k * s->c->n;
    bool used = s->cur.sink == sink;
    for (int j = 0; j < CLUSTER_OLD && !used; j++)
      used = s->old[j].pid > 0 && s->old[j].sink == sink;
    if (!used) return sink;
  }
  return -1;
}

/* A replaced process of slot s that was not told to drain yet. */
static bool cluster__replacing(const cluster_slot_t *s) {
  for (int j = 0; j < CLUSTER_OLD; j++)
    if (s->old[j].pid > 0 && !s->old[j].deadline) return true;
  return false;
}

bool cluster_replace(cluster_t *c, int index, const char *why,
                     cluster_cause_t cause) {
  if (index < 1 || index > c->n || c->stopping) return false;
  cluster_slot_t *s = &c->slots[index - 1];
  if (s->cur.pid <= 0 || cluster__replacing(s)) return false;
  int j = 0;
  while (j < CLUSTER_OLD && s->old[j].pid > 0) j++;
  int sink = cluster__free_sink(s);
  if (j == CLUSTER_OLD || sink < 0) return false; /* too many draining */
  /* A roll (a reload) is routine; a stuck or bloated worker is news. */
  log_write(c->rolling && why == c->rolling ? LOG_INFO : LOG_WARN,
            "worker %d (pid %d): %s; starting its replacement", index,
            (int)s->cur.pid, why);
  cluster_proc_t old = s->cur;
  int rc = cluster__fork(s, sink, cause);
  if (rc) {
    log_error("cannot start a replacement for worker %d: %s", index,
              strerror(-rc));
    return false;
  }
  s->old[j] = old;
  return true;
}

/* Moves a roll on: replaces the first worker started before it, once no
 * other replacement is under way; ends it when none is left. */
static void cluster__roll(cluster_t *c) {
  if (!c->rolling || c->stopping) return;
  for (int i = 0; i < c->n; i++) {
    cluster_slot_t *s = &c->slots[i];
    if (s->cur.pid > 0 && (!s->cur.ready || cluster__replacing(s)))
      return; /* one at a time: wait until it serves */
  }
  for (int i = 0; i < c->n; i++) {
    cluster_slot_t *s = &c->slots[i];
    if (s->cur.pid <= 0 || s->cur.gen == c->gen) continue;
    /* False when it has no free sink yet: the tick tries again. */
    cluster_replace(c, s->index, c->rolling, c->roll_cause);
    return;
  }
  const char *what = c->rolling;
  log_info("%s done", what);
  c->rolling = NULL;
  if (c->hooks.rolled) c->hooks.rolled(what, c->arg);
}

void cluster_roll(cluster_t *c, const char *what, cluster_cause_t cause) {
  if (c->stopping) return;
  c->gen++;
  c->rolling = what;
  c->roll_cause = cause;
  cluster__roll(c);
}

/* Tells a replaced process to drain, and when it will be killed. */
static void cluster__drain(cluster_t *c, cluster_proc_t *p) {
  p->deadline = reactor_now(c->root) + c->drain_ms + c->grace_ms + 2000;
  if (!(c->hooks.drain && c->hooks.drain(p->sink, c->arg)))
    kill(p->pid, SIGTERM);
}

/* The process on `sink`, and its slot. */
static cluster_proc_t *cluster__find(cluster_t *c, int sink,
                                     cluster_slot_t **slot) {
  if (sink < 1 || sink >= CLUSTER_SINKS(c->n)) return NULL;
  cluster_slot_t *s = &c->slots[(sink - 1) % c->n];
  *slot = s;
  if (s->cur.pid > 0 && s->cur.sink == sink) return &s->cur;
  for (int j = 0; j < CLUSTER_OLD; j++)
    if (s->old[j].pid > 0 && s->old[j].sink == sink) return &s->old[j];
  return NULL;
}

void cluster_ready(cluster_t *c, int sink) {
  cluster_slot_t *s;
  cluster_proc_t *p = cluster__find(c, sink, &s);
  if (!p || p != &s->cur) return;
  p->ready = true;
  p->beat = reactor_now(c->root);
  /* The replacement serves: the ones it replaces stop accepting now and
   * finish their connections. */
  for (int j = 0; j < CLUSTER_OLD; j++)
    if (s->old[j].pid > 0 && !s->old[j].deadline) cluster__drain(c, &s->old[j]);
  cluster__roll(c);
}

void cluster_beat(cluster_t *c, int sink) {
  cluster_slot_t *s;
  cluster_proc_t *p = cluster__find(c, sink, &s);
  if (p) p->beat = reactor_now(c->root);
}

void cluster_stuck(cluster_t *c, int sink, const char *why) {
  cluster_slot_t *s;
  cluster_proc_t *p = cluster__find(c, sink, &s);
  if (p == &s->cur && p->ready)
    cluster_replace(c, s->index, why, CLUSTER_CAUSE_WATCHDOG);
}

static void cluster__how(int status, char *how, size_t len) {
  if (WIFSIGNALED(status))
    snprintf(how, len, "was killed by signal %d", WTERMSIG(status));
  else
    snprintf(how, len, "exited with status %d", WEXITSTATUS(status));
}

/* Reaps the workers that exited. Each worker's pid is waited for by name,
 * never with waitpid(-1): the root script's own children (io.popen,
 * os.execute) must stay for their pclose/system to collect, or those would
 * fail with ECHILD. A SIGCHLD for such a child finds no worker to reap. */
static void cluster__reaped(cluster_t *c, cluster_slot_t *s,
                            cluster_proc_t *old, pid_t pid, int status) {
  char how[64];
  cluster__how(status, how, sizeof(how));
  if (old) {
    log_info("worker %d (pid %d), replaced, %s", s->index, (int)pid, how);
    if (c->hooks.exited) c->hooks.exited(old->sink, c->arg);
    *old = no_proc;
    return;
  }
  int sink = s->cur.sink;
  uint64_t lived = reactor_now(c->root) - s->cur.since;
  s->respawn_cause =
      s->cur.watchdog ? CLUSTER_CAUSE_WATCHDOG : CLUSTER_CAUSE_CRASH;
  s->cur = no_proc;
  s->cur.sink = sink;
  if (c->hooks.exited) c->hooks.exited(sink, c->arg);
  if (c->stopping) {
    log_info("worker %d (pid %d) %s", s->index, (int)pid, how);
    return;
  }
  log_warn("worker %d (pid %d) %s; starting a new one", s->index, (int)pid,
           how);
  timer_start(reactor_timers(c->root), &s->respawn, reactor_now(c->root),
              lived < CLUSTER_QUICK_DEATH_MS ? CLUSTER_SLOW_RESPAWN_MS
                                             : CLUSTER_FAST_RESPAWN_MS,
              0, 1, cluster__respawn, NULL, s);
}

/* waitpid for one known process: true when it was reaped. */
static bool cluster__wait(pid_t pid, int *status) {
  pid_t got;
  do got = waitpid(pid, status, WNOHANG);
  while (got < 0 && errno == EINTR);
  return got == pid;
}

void cluster_reap(cluster_t *c) {
  int status;
  for (int i = 0; i < c->n; i++) {
    cluster_slot_t *s = &c->slots[i];
    pid_t pid = s->cur.pid;
    if (pid > 0 && cluster__wait(pid, &status))
      cluster__reaped(c, s, NULL, pid, status);
    for (int j = 0; j < CLUSTER_OLD; j++) {
      pid = s->old[j].pid;
      if (pid > 0 && cluster__wait(pid, &status))
        cluster__reaped(c, s, &s->old[j], pid, status);
    }
  }
  if (c->stopping && cluster_live(c) == 0) {
    timer_stop(reactor_timers(c->root), &c->kill_timer);
    reactor_shutdown(c->root, c->grace_ms);
  }
}

/* Calls fn on every live process. */
static void cluster__each(cluster_t *c,
                          void (*fn)(cluster_t *, cluster_slot_t *,
                                     cluster_proc_t *)) {
  for (int i = 0; i < c->n; i++) {
    cluster_slot_t *s = &c->slots[i];
    if (s->cur.pid > 0) fn(c, s, &s->cur);
    for (int j = 0; j < CLUSTER_OLD; j++)
      if (s->old[j].pid > 0) fn(c, s, &s->old[j]);
  }
}

static void cluster__kill(cluster_t *c, cluster_slot_t *s, cluster_proc_t *p) {
  log_warn("worker %d (pid %d) did not stop in time; killing it", s->index,
           (int)p->pid);
  kill(p->pid, SIGKILL);
}

static void cluster__kill_all(mp_timer_t *t) {
  cluster__each(t->udata, cluster__kill);
}

static void cluster__term(cluster_t *c, cluster_slot_t *s, cluster_proc_t *p) {
  kill(p->pid, SIGTERM);
}

void cluster_stop(cluster_t *c) {
  if (!c->stopping) {
    c->stopping = true;
    c->rolling = NULL;
    timer_stop(reactor_timers(c->root), &c->tick);
    for (int i = 0; i < c->n; i++)
      timer_stop(reactor_timers(c->root), &c->slots[i].respawn);
    timer_start(reactor_timers(c->root), &c->kill_timer, reactor_now(c->root),
                c->grace_ms + 2000, 0, 1, cluster__kill_all, NULL, c);
  }
  cluster__each(c, cluster__term);
  if (cluster_live(c) == 0) {
    timer_stop(reactor_timers(c->root), &c->kill_timer);
    reactor_shutdown(c->root, c->grace_ms);
  }
}

/* Resident bytes of a process that are its own, or 0 if unknown: shared
 * pages (the binary and libraries, and mp.shared dictionaries, which every
 * worker maps and would otherwise count once per worker) are left out. */
static size_t cluster__rss(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0, shared = 0;
  int got = fscanf(f, "%lu %lu %lu", &size, &resident, &shared);
  fclose(f);
  if (got != 3 || shared > resident) return 0;
  return (size_t)(resident - shared) * (size_t)sysconf(_SC_PAGESIZE);
}

/* Twice a second: drain deadlines, heartbeats, memory, and a roll that
 * waits for a free sink. */
static void cluster__tick(mp_timer_t *t) {
  cluster_t *c = t->udata;
  uint64_t now = reactor_now(c->root);
  for (int i = 0; i < c->n; i++) {
    cluster_slot_t *s = &c->slots[i];
    for (int j = 0; j < CLUSTER_OLD; j++) {
      cluster_proc_t *p = &s->old[j];
      if (p->pid <= 0 || !p->deadline || now < p->deadline) continue;
      log_warn("worker %d (pid %d), replaced, did not finish in time; "
               "killing it", s->index, (int)p->pid);
      kill(p->pid, SIGKILL);
      p->deadline = UINT64_MAX;
    }
    cluster_proc_t *p = &s->cur;
    if (p->pid <= 0) continue;
    char why[128];
    if (c->beat_ms && !p->ready && !p->deadline &&
        now - p->since > c->beat_ms + CLUSTER_START_SLACK_MS) {
      log_error("worker %d (pid %d) did not start serving within %.1f s "
                "(stuck at the script's top level?); killing it", s->index,
                (int)p->pid, (double)(c->beat_ms + CLUSTER_START_SLACK_MS) / 1000);
      kill(p->pid, SIGKILL);
      p->deadline = now; /* killed once: cluster_reap takes it from here */
      p->watchdog = true;
      continue;
    }
    if (!p->ready || cluster__replacing(s)) continue;
    if (c->beat_ms && now - p->beat > c->beat_ms) {
      snprintf(why, sizeof(why), "sent no heartbeat for %.1f s",
               (double)(now - p->beat) / 1000);
      cluster_replace(c, s->index, why, CLUSTER_CAUSE_WATCHDOG);
      continue;
    }
    if (!c->max_rss) continue;
    size_t rss = cluster__rss(p->pid);
    if (rss <= c->max_rss) continue;
    snprintf(why, sizeof(why), "uses %zu MB, over --max-memory %zu MB",
             rss >> 20, c->max_rss >> 20);
    cluster_replace(c, s->index, why, CLUSTER_CAUSE_MEMORY);
  }
  cluster__roll(c);
}

void cluster_set_limits(cluster_t *c, size_t max_rss, uint64_t beat_timeout_ms,
                        uint64_t drain_ms) {
  c->max_rss = max_rss;
  c->beat_ms = beat_timeout_ms;
  c->drain_ms = drain_ms;
}

bool cluster_serving(const cluster_t *c) {
  for (int i = 0; i < c->n; i++)
    if (c->slots[i].cur.pid <= 0 || !c->slots[i].cur.ready) return false;
  return true;
}

void cluster_signal(cluster_t *c, int sig) {
  for (int i = 0; i < c->n; i++) {
    cluster_slot_t *s = &c->slots[i];
    if (s->cur.pid > 0) kill(s->cur.pid, sig);
    for (int j = 0; j < CLUSTER_OLD; j++)
      if (s->old[j].pid > 0) kill(s->old[j].pid, sig);
  }
}
