/* SPDX-License-Identifier: MIT */

/* server/root: the root process of several workers. It runs the script in
 * a root lane (which opens the listening sockets), forks the workers
 * (cluster/cluster.h), supervises them from its reactor, reloads (SIGHUP,
 * moonport --reload, --watch through inotify) by loading the script anew
 * and replacing the workers one at a time, restarts them (SIGUSR1), passes
 * on SIGWINCH, and stops them. It serves no connection itself. Moved from
 * main.c. */
#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "core/log.h"
#include "core/notify.h"
#include "core/stats.h"
#include "core/timer.h"
#include "lx/lx_engine.h"
#include "net/reactor.h"
#include "net/sock.h"
#include "net/tls.h"
#include "server/ipc.h"
#include "server/pidfile.h"
#include "server/process.h"

/* Whether a reload's roll of the workers has not finished yet. */
static bool reload_rolling;

/* A roll of the workers finished: a reload whose roll it ends (or joins:
 * a roll moves to the newest generation) is done. */
static void root_rolled(const char *what, void *arg) {
  (void)what;
  (void)arg;
  if (!reload_rolling) return;
  reload_rolling = false;
  reload_status("ok", "every worker runs the new code");
  notify_send("READY=1\nSTATUS=serving");
}

/* A worker process started (the first ones, and each restart). */
static void root_started(int sink, int ipc_fd, cluster_cause_t cause,
                         void *arg) {
  lx_server_t *srv = arg;
  static const int counter[CLUSTER_CAUSE_N] = {
      [CLUSTER_CAUSE_FIRST] = -1,
      [CLUSTER_CAUSE_CRASH] = STAT_SRV_RESTARTS_CRASH,
      [CLUSTER_CAUSE_WATCHDOG] = STAT_SRV_RESTARTS_WATCHDOG,
      [CLUSTER_CAUSE_MEMORY] = STAT_SRV_RESTARTS_MEMORY,
      [CLUSTER_CAUSE_RELOAD] = STAT_SRV_RESTARTS_RELOAD,
      [CLUSTER_CAUSE_RESTART] = STAT_SRV_RESTARTS_RESTART};
  if (counter[cause] >= 0)
    atomic_fetch_add(&stats_server(srv->stats)[counter[cause]], 1);
  server_ipc_worker_started(sink, ipc_fd, arg);
}

/* A worker process exited: its counters join the totals of the gone, and
 * its slots are free for the next process on that sink. */
static void root_exited(int sink, void *arg) {
  lx_server_t *srv = arg;
  int per = (int)srv->threads + 1;
  stats_retire(srv->stats, sink * per, per);
  server_ipc_worker_exited(sink, arg);
}

/* What workers tell the root about themselves. */
static void root_news(int type, int sink, const char *msg, size_t len,
                      void *arg) {
  cluster_t *c = arg;
  if (type == IPC_READY) {
    cluster_ready(c, sink);
    static bool ready_told; /* root thread only */
    if (!ready_told && cluster_serving(c)) {
      ready_told = true;
      notify_send("READY=1");
    }
  } else if (type == IPC_BEAT) {
    cluster_beat(c, sink);
  } else if (type == IPC_STUCK) {
    char why[256];
    snprintf(why, sizeof(why), "%.*s", (int)(len < 200 ? len : 200), msg);
    cluster_stuck(c, sink, why);
  }
}

typedef struct {
  lx_server_t *srv;
  cluster_t *c;
  int inotify;   /* --watch, or -1 */
  mp_timer_t debounce;
  int handled;   /* stop signals acted on */
} root_t;

/* Loads the script anew in the root lane; if that works, the workers are
 * replaced one at a time by processes that load it too. */
static void root_reload(root_t *rt, const char *why) {
  char err[1024];
  reload_begin();
  log_info("%s: reloading %s", why, rt->srv->script);
  notify_reloading();
  if (!lx_lane_reload_root(rt->srv, err, sizeof(err))) {
    log_error("reload failed; the old code keeps serving: %s", err);
    reload_status("failed", err);
    notify_send("READY=1\nSTATUS=the last reload failed; the old code serves");
    return;
  }
  log_info("%s: reloaded %s; replacing the workers one at a time", why,
           rt->srv->script); /* routine: info; failures are errors */
  atomic_fetch_add(&stats_server(rt->srv->stats)[STAT_SRV_RELOADS], 1);
  reload_rolling = true;
  /* new workers, new ticket secret: what a worker's memory gave away ends
   * with the reload (a resumption across it is a full handshake) */
  if (net_tls_reseed()) log_warn("reload: the ticket secret was not renewed");
  reload_status("rolling", "the root loaded the new code; replacing the workers");
  cluster_roll(rt->c, "reload", CLUSTER_CAUSE_RELOAD);
}

static void root_debounced(mp_timer_t *t) {
  if (atomic_load(&proc_signals_seen) == 0) root_reload(t->udata, "--watch");
}

/* --watch: a .lua or .html file in the script's folder (or one of its
 * subfolders) was written, moved in or removed. Editors save in bursts,
 * so the reload waits for 300 ms of quiet. */
static void root_inotify(void *arg) {
  root_t *rt = arg;
  char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
  bool hit = false;
  ssize_t n;
  while ((n = read(rt->inotify, buf, sizeof(buf))) > 0) {
    for (char *p = buf; p < buf + n;) {
      struct inotify_event *ev = (struct inotify_event *)p;
      size_t l = ev->len ? strlen(ev->name) : 0;
      /* .html: mp.template's files, when they sit beside the script */
      if (ev->name[0] != '.' &&
          ((l > 4 && strcmp(ev->name + l - 4, ".lua") == 0) ||
           (l > 5 && strcmp(ev->name + l - 5, ".html") == 0)))
        hit = true;
      p += sizeof(*ev) + ev->len;
    }
  }
  if (!hit) return;
  reactor_t *r = lx_lane_reactor(rt->srv->lanes[0]);
  timer_stop(reactor_timers(r), &rt->debounce);
  timer_start(reactor_timers(r), &rt->debounce, reactor_now(r), 300, 0, 1,
              root_debounced, NULL, rt);
}

#define WATCH_MASK (IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE)
#define WATCH_MAX_SUBDIRS 64

/* The folder's immediate subfolders too (views/ for mp.template, lib/ for
 * modules), at most WATCH_MAX_SUBDIRS, those that exist at start; one
 * that can't be watched is skipped. */
static void root_watch_subdirs(int fd, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  int n = 0;
  struct dirent *ent;
  while ((ent = readdir(d)) && n < WATCH_MAX_SUBDIRS) {
    if (ent->d_name[0] == '.') continue;
    char path[4096];
    struct stat st;
    if (snprintf(path, sizeof(path), "%s/%s", dir, ent->d_name) >=
            (int)sizeof(path) ||
        stat(path, &st) || !S_ISDIR(st.st_mode))
      continue;
    if (inotify_add_watch(fd, path, WATCH_MASK) >= 0) n++;
  }
  closedir(d);
}

static int root_watch(root_t *rt) {
  char *copy = strdup(rt->srv->script);
  rt->inotify = copy ? inotify_init1(IN_NONBLOCK | IN_CLOEXEC) : -1;
  const char *dir = copy ? dirname(copy) : NULL;
  int wd =
      rt->inotify >= 0 ? inotify_add_watch(rt->inotify, dir, WATCH_MASK) : -1;
  int e = errno;
  if (wd >= 0) root_watch_subdirs(rt->inotify, dir);
  free(copy);
  if (wd < 0 || !reactor_watch(lx_lane_reactor(rt->srv->lanes[0]),
                               rt->inotify, root_inotify, rt)) {
    log_error("--watch: cannot watch the script's folder: %s", strerror(e));
    return -1;
  }
  return 0;
}

/* The root's wake-ups: signals to stop, workers that exited. */
static void root_wake(void *arg) {
  root_t *rt = arg;
  cluster_t *c = rt->c;
  proc_drain_wake();
  if (atomic_exchange(&proc_children_exited, 0)) cluster_reap(c);
  if (atomic_exchange(&proc_reopens_asked, 0)) {
    proc_reopen_logs(rt->srv);
    cluster_signal(c, SIGWINCH);
  }
  if (atomic_exchange(&proc_restarts_asked, 0)) {
    log_info("SIGUSR1: restarting the workers one at a time");
    cluster_roll(c, "rolling restart", CLUSTER_CAUSE_RESTART);
  }
  int seen = atomic_load(&proc_signals_seen);
  if (atomic_exchange(&proc_reloads_asked, 0)) {
    if (rt->handled || seen) {
      log_warn("SIGHUP: not reloading while stopping");
      reload_begin();
      reload_status("failed", "the server is stopping");
    } else
      root_reload(rt, "SIGHUP");
  }
  if (seen != rt->handled) {
    /* refuse new connections now rather than reset them at exit */
    if (!rt->handled) lx_server_stop_listening(rt->srv);
    if (!rt->handled) notify_send("STOPPING=1");
    log_info("%s: stopping the workers",
             atomic_load(&proc_last_signal) == SIGINT ? "SIGINT" : "SIGTERM");
    rt->handled = seen;
    cluster_stop(c);
  }
}

int proc_run_root(lx_server_t *srv, bool watch) {
  char err[1024];
  srv->root = true;
  /* The root lane's own post office (sink 0); messages between processes
   * are not routed yet. */
  srv->lanes = calloc(1, sizeof(*srv->lanes));
  srv->ps = pubsub_new(CLUSTER_SINKS(srv->nworkers), server_root_deliver, srv);
  if (!srv->lanes || !srv->ps || !server_ipc_new_peers(srv)) {
    log_error("out of memory");
    proc_cleanup(srv);
    return 1;
  }
  lx_lane_t *root = srv->lanes[0] =
      lx_lane_new(srv, 0, true, NULL, err, sizeof(err));
  if (!root) {
    log_error("%s", err);
    proc_cleanup(srv);
    return 1;
  }
  reactor_t *r = lx_lane_reactor(root);
  proc_handle(SIGCHLD, proc_on_child);
  cluster_hooks_t hooks = {root_started, root_exited, server_ipc_drain,
                           root_rolled};
  static root_t rt; /* the reactor's watches and timers point here */
  rt = (root_t){.srv = srv, .inotify = -1};
  timer_init(&rt.debounce);
  cluster_t *c = rt.c = cluster_new(r, srv->nworkers, srv->proc.grace_ms,
                                    proc_worker_main, hooks, srv);
  reactor_watch_t *w = c ? reactor_watch(r, proc_wake_fd, root_wake, &rt) : NULL;
  int rc = w ? 0 : -ENOMEM;
  if (c) {
    cluster_set_limits(c, srv->proc.max_memory, srv->proc.lua_timeout_ms,
                       srv->proc.drain_ms);
    srv->proc.worker_news = root_news;
    srv->proc.news_arg = c;
  }
  if (!rc && watch && root_watch(&rt)) rc = -1;
  if (!rc && lx_engine_start(srv, r)) rc = -1;
  if (!rc) rc = cluster_start(c);
  if (rc) {
    if (rc != -1) log_error("cannot start the workers: %s", strerror(-rc));
    cluster_free(c);
    if (rt.inotify >= 0) close(rt.inotify);
    proc_cleanup(srv);
    return 1;
  }
  proc_handle(SIGINT, proc_on_stop_signal);
  proc_handle(SIGTERM, proc_on_stop_signal);
  proc_handle(SIGUSR1, proc_on_restart);
  proc_handle(SIGHUP, proc_on_reload);
  proc_handle(SIGWINCH, proc_on_reopen);
  pidfile_write();
  proc_announce(srv);
  lx_lane_run(root);
  /* The loop ends once every worker is gone (cluster_stop). */
  cluster_free(c);
  if (rt.inotify >= 0) close(rt.inotify);
  proc_cleanup(srv); /* the current root lane first: it owns the reactor */
  pidfile_remove();
  log_info("stopped");
  return 0;
}
