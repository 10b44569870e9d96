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

/* One worker process. */
typedef struct {
  pid_t pid;      /* 0 when none */
  int sink;       /* its post-office sink: the slot's index, or index + n */
  int ipc;        /* the root's end of its socketpair (owned by the hooks'
                     side; a new child closes its copy), or -1 */
  uint64_t since; /* when it was started */
  bool ready;     /* it said it serves */
} cluster_proc_t;

/* Worker number `index`: the process serving it, and during a replacement
 * the one being replaced. */
typedef struct {
  cluster_proc_t cur, old;
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
  int rolling; /* the slot a rolling restart is at (1..n), or 0 */
  size_t max_rss;
  mp_timer_t kill_timer, mem_timer;
  cluster_slot_t *slots;
};

static const cluster_proc_t no_proc = {.ipc = -1};

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
  timer_init(&c->mem_timer);
  for (int i = 0; i < n; i++) {
    c->slots[i] = (cluster_slot_t){no_proc, no_proc, {0}, c, i + 1};
    c->slots[i].cur.sink = i + 1;
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
  for (int i = 0; i < c->n; i++)
    live += (c->slots[i].cur.pid > 0) + (c->slots[i].old.pid > 0);
  return live;
}

/* In the child: keep only what the worker needs, then run it. */
static void cluster__child(cluster_t *c, cluster_slot_t *s, int ipc) {
  /* Learn of the root's death even if it is killed outright: SIGUSR2
   * means "the root is gone" to a worker. */
  prctl(PR_SET_PDEATHSIG, SIGUSR2);
  if (getppid() != c->root_pid) _exit(1); /* died before prctl took hold */
  for (int i = 0; i < c->n; i++) {
    if (c->slots[i].cur.ipc >= 0) close(c->slots[i].cur.ipc);
    if (c->slots[i].old.ipc >= 0) close(c->slots[i].old.ipc);
  }
  signal(SIGCHLD, SIG_DFL);
  signal(SIGUSR1, SIG_DFL);
  exit(c->worker(s->index, ipc, c->arg));
}

/* Starts a process for slot s as s->cur, on `sink`. */
static int cluster__fork(cluster_slot_t *s, int sink) {
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
  s->cur = (cluster_proc_t){pid, sink, sv[0], reactor_now(c->root), false};
  log_info("worker %d started (pid %d)", s->index, (int)pid);
  if (c->hooks.started) c->hooks.started(sink, sv[0], c->arg);
  return 0;
}

int cluster_start(cluster_t *c) {
  for (int i = 0; i < c->n; i++) {
    int rc = cluster__fork(&c->slots[i], i + 1);
    if (rc) {
      for (int j = 0; j < i; j++) kill(c->slots[j].cur.pid, SIGKILL);
      return rc;
    }
  }
  return 0;
}

static void cluster__respawn(mp_timer_t *t) {
  cluster_slot_t *s = t->udata;
  if (s->c->stopping || s->cur.pid > 0) return;
  int rc = cluster__fork(s, s->cur.sink);
  if (rc) {
    log_error("cannot start worker %d: %s; trying again", s->index,
              strerror(-rc));
    timer_start(reactor_timers(s->c->root), &s->respawn,
                reactor_now(s->c->root), CLUSTER_SLOW_RESPAWN_MS, 0, 1,
                cluster__respawn, NULL, s);
  }
}

bool cluster_replace(cluster_t *c, int index, const char *why) {
  if (index < 1 || index > c->n || c->stopping) return false;
  cluster_slot_t *s = &c->slots[index - 1];
  if (s->old.pid > 0 || s->cur.pid <= 0) return false; /* busy or down */
  log_warn("worker %d (pid %d): %s; starting its replacement", index,
           (int)s->cur.pid, why);
  cluster_proc_t old = s->cur;
  int sink = old.sink == index ? index + c->n : index;
  int rc = cluster__fork(s, sink);
  if (rc) {
    log_error("cannot start a replacement for worker %d: %s", index,
              strerror(-rc));
    return false;
  }
  s->old = old;
  return true;
}

/* Replaces the next worker of a rolling restart, or ends it. */
static void cluster__roll(cluster_t *c) {
  while (c->rolling > 0 && c->rolling <= c->n) {
    if (cluster_replace(c, c->rolling, "rolling restart")) return;
    c->rolling++; /* down or busy: on to the next one */
  }
  if (c->rolling > c->n) log_info("rolling restart done");
  c->rolling = 0;
}

void cluster_restart_all(cluster_t *c) {
  if (c->stopping || c->rolling) return;
  c->rolling = 1;
  cluster__roll(c);
}

void cluster_ready(cluster_t *c, int sink) {
  for (int i = 0; i < c->n; i++) {
    cluster_slot_t *s = &c->slots[i];
    if (s->cur.pid <= 0 || s->cur.sink != sink) continue;
    s->cur.ready = true;
    /* The replacement serves: the old process stops accepting now and
     * finishes its connections within the grace period. */
    if (s->old.pid > 0 &&
        !(c->hooks.drain && c->hooks.drain(s->old.sink, c->arg)))
      kill(s->old.pid, SIGTERM);
    if (c->rolling == s->index) {
      c->rolling++;
      cluster__roll(c);
    }
    return;
  }
}

static void cluster__how(int status, char *how, size_t len) {
  if (WIFSIGNALED(status))
    snprintf(how, len, "was killed by signal %d", WTERMSIG(status));
  else
    snprintf(how, len, "exited with status %d", WEXITSTATUS(status));
}

void cluster_reap(cluster_t *c) {
  int status;
  pid_t pid;
  while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
    cluster_slot_t *s = NULL;
    bool was_old = false;
    for (int i = 0; i < c->n && !s; i++) {
      if (c->slots[i].cur.pid == pid) s = &c->slots[i];
      if (c->slots[i].old.pid == pid) {
        s = &c->slots[i];
        was_old = true;
      }
    }
    if (!s) continue; /* a process the script started */
    char how[64];
    cluster__how(status, how, sizeof(how));
    if (was_old) {
      log_info("worker %d (pid %d), replaced, %s", s->index, (int)pid, how);
      if (c->hooks.exited) c->hooks.exited(s->old.sink, c->arg);
      s->old = no_proc;
      continue;
    }
    int sink = s->cur.sink;
    uint64_t lived = reactor_now(c->root) - s->cur.since;
    s->cur = no_proc;
    s->cur.sink = sink;
    if (c->hooks.exited) c->hooks.exited(sink, c->arg);
    if (c->stopping) {
      log_info("worker %d (pid %d) %s", s->index, (int)pid, how);
      continue;
    }
    log_warn("worker %d (pid %d) %s; starting a new one", s->index, (int)pid,
             how);
    if (c->rolling == s->index) { /* its replacement died: move on */
      c->rolling++;
      cluster__roll(c);
    }
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
    cluster_proc_t *ps[2] = {&c->slots[i].cur, &c->slots[i].old};
    for (int k = 0; k < 2; k++) {
      if (ps[k]->pid <= 0) continue;
      log_warn("worker %d (pid %d) did not stop in time; killing it",
               c->slots[i].index, (int)ps[k]->pid);
      kill(ps[k]->pid, SIGKILL);
    }
  }
}

void cluster_stop(cluster_t *c) {
  if (!c->stopping) {
    c->stopping = true;
    c->rolling = 0;
    timer_stop(reactor_timers(c->root), &c->mem_timer);
    for (int i = 0; i < c->n; i++)
      timer_stop(reactor_timers(c->root), &c->slots[i].respawn);
    timer_start(reactor_timers(c->root), &c->kill_timer, reactor_now(c->root),
                c->grace_ms + 2000, 0, 1, cluster__kill_all, NULL, c);
  }
  for (int i = 0; i < c->n; i++) {
    if (c->slots[i].cur.pid > 0) kill(c->slots[i].cur.pid, SIGTERM);
    if (c->slots[i].old.pid > 0) kill(c->slots[i].old.pid, SIGTERM);
  }
  if (cluster_live(c) == 0) {
    timer_stop(reactor_timers(c->root), &c->kill_timer);
    reactor_shutdown(c->root, c->grace_ms);
  }
}

/* Resident bytes of a process, or 0 if unknown. */
static size_t cluster__rss(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/statm", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  int got = fscanf(f, "%lu %lu", &size, &resident);
  fclose(f);
  return got == 2 ? (size_t)resident * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

static void cluster__check_memory(mp_timer_t *t) {
  cluster_t *c = t->udata;
  for (int i = 0; i < c->n; i++) {
    cluster_slot_t *s = &c->slots[i];
    if (s->cur.pid <= 0 || !s->cur.ready || s->old.pid > 0) continue;
    size_t rss = cluster__rss(s->cur.pid);
    if (rss <= c->max_rss) continue;
    char why[96];
    snprintf(why, sizeof(why), "uses %zu MB, over --max-memory %zu MB",
             rss >> 20, c->max_rss >> 20);
    cluster_replace(c, s->index, why);
  }
}

void cluster_set_max_memory(cluster_t *c, size_t bytes) {
  c->max_rss = bytes;
  timer_stop(reactor_timers(c->root), &c->mem_timer);
  if (bytes)
    timer_start(reactor_timers(c->root), &c->mem_timer, reactor_now(c->root),
                1000, 1000, 0, cluster__check_memory, NULL, c);
}
