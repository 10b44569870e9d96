/* SPDX-License-Identifier: MIT */

/* server/worker: a process that serves: the only one (-w 1) or one worker
 * of several. Its lanes run on their own threads; its main thread runs a
 * small reactor of its own (as the root's thread does) that watches the
 * wake-up eventfd (signals, lanes done, frames queued for the root) and
 * the link to the root, and once a second checks the watchdog and sends
 * the heartbeat. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/defer.h"
#include "core/log.h"
#include "core/notify.h"
#include "core/stats.h"
#include "core/timer.h"
#include "lx/lx_engine.h"
#include "net/poll.h" /* POLL_*: so not <signal.h>, whose POLL_HUP clashes */
#include "net/reactor.h"
#include "net/sock.h"
#include "server/ipc.h"
#include "server/pidfile.h"
#include "server/process.h"

/* The main thread's state while the lanes run. */
typedef struct {
  lx_server_t *srv;
  reactor_t *r;
  defer_pool_t *pool;
  int ipc_fd;               /* the link to the root, or -1 (none, or gone) */
  reactor_watch_t *ipc_w;   /* watching ipc_fd */
  unsigned ipc_flags;       /* its interest now */
  int handled;              /* stop signals acted on */
  bool orphan;              /* the root is gone */
  bool ready;               /* every lane's start handlers returned: the
                               root (or systemd) was told it serves */
  bool lanes_done;          /* every lane's loop returned */
  bool stopped;             /* reactor_shutdown was called */
  uint64_t hard;            /* shutting down: past this, lanes still in
                               Lua are left behind (the process exits) */
  mp_timer_t tick;          /* 4 times a second: the watchdog (its beat
                               goes out once a second) */
  mp_timer_t deadline;      /* at `hard`, or the last flush's end */
} worker_t;

/* A shutdown's deadline passed and a lane is still in a Lua callback (an
 * endless loop can't be stopped from outside its thread): say which, and
 * end the process without it. */
static void exit_stuck(lx_server_t *srv) {
  for (size_t i = 0; i < srv->nlanes; i++) {
    const char *what;
    if (!lx_lane_busy(srv->lanes[i], &what)) continue;
    log_error("lane %zu is still running %s at the shutdown deadline; "
              "exiting without it", i + 1, what ? what : "Lua");
  }
  pidfile_remove();
  _exit(1);
}

static void lane_thread(void *arg, size_t index) {
  lx_server_t *srv = arg;
  lx_lane_run(srv->lanes[index]);
}

static void worker_step(worker_t *w);

/* Every lane has run its start handlers: only now does the process count
 * as serving, so a rolling reload retires the worker this one replaces
 * after the new code's mp.on("start") ran (and --reload, READY=1 and the
 * pid file say so). */
static void worker_ready(worker_t *w) {
  lx_server_t *srv = w->srv;
  w->ready = true;
  server_ipc_ready(srv);
  if (srv->proc.ipc_fd >= 0)
    log_info("started: %zu lane%s, script %s", srv->nlanes,
             srv->nlanes == 1 ? "" : "s", srv->script);
  if (srv->proc.ipc_fd < 0) {
    pidfile_write();
    notify_send("READY=1");
  }
}

static void on_deadline(mp_timer_t *t) {
  worker_t *w = t->udata;
  if ((size_t)atomic_load(&w->srv->lanes_done) < w->srv->nlanes)
    exit_stuck(w->srv);
  /* The last frames' second is over. */
  w->stopped = true;
  reactor_shutdown(w->r, 0);
}

static void set_hard(worker_t *w, uint64_t h) {
  if (w->hard && h >= w->hard) return;
  w->hard = h;
  uint64_t now = reactor_now(w->r);
  timer_stop(reactor_timers(w->r), &w->deadline);
  timer_start(reactor_timers(w->r), &w->deadline, now,
              h > now ? h - now : 0, 0, 1, on_deadline, NULL, w);
}

static void on_tick(mp_timer_t *t) { worker_step(t->udata); }

static void on_wake(void *arg) {
  proc_drain_wake();
  worker_step(arg);
}

/* Frames from the root; EOF means it is gone. */
static void on_ipc(void *arg, unsigned events) {
  worker_t *w = arg;
  if (events & POLL_WRITE) {
    pthread_mutex_lock(&w->srv->proc.ipc_lock);
    link_flush(&w->srv->proc.link);
    pthread_mutex_unlock(&w->srv->proc.ipc_lock);
  }
  bool eof = false;
  while (w->ipc_fd >= 0 && (events & (POLL_READ | POLL_HUP))) {
    char buf[65536];
    ssize_t n = recv(w->ipc_fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      server_ipc_feed(w->srv, buf, (size_t)n);
      continue;
    }
    eof = n == 0 || (errno != EAGAIN && errno != EINTR);
    break;
  }
  if (eof) atomic_store(&proc_root_gone, 1);
  worker_step(w);
}

static void unwatch_ipc(worker_t *w) {
  if (w->ipc_w) reactor_unwatch(w->ipc_w);
  w->ipc_w = NULL;
  w->ipc_fd = -1;
}

/* Everything the main thread checks whenever it wakes. */
static void worker_step(worker_t *w) {
  lx_server_t *srv = w->srv;
  if (w->stopped) return;
  server_ipc_watchdog(srv);
  if (atomic_exchange(&proc_reopens_asked, 0)) proc_reopen_logs(srv);
  if (atomic_exchange(&proc_reloads_asked, 0)) {
    log_warn("SIGHUP: reloading needs worker processes (-w 2 or more: "
             "reload replaces them); nothing changed");
    reload_begin();
    reload_status("failed", "reloading needs worker processes (-w 2 or "
                            "more); nothing changed");
  }
  /* The root is gone (killed outright, say): nobody will tell us to stop,
   * and nobody replaces us; close soon. */
  if (w->lanes_done && w->ipc_w && atomic_load(&proc_root_gone)) {
    unwatch_ipc(w); /* nobody to flush to */
  } else if (!w->orphan && srv->proc.ipc_fd >= 0 &&
             atomic_load(&proc_root_gone)) {
    w->orphan = true;
    log_warn("the root process is gone; worker %d stops", srv->worker_index);
    uint64_t grace = srv->proc.grace_ms < 1000 ? srv->proc.grace_ms : 1000;
    for (size_t i = 0; i < srv->nlanes; i++)
      reactor_shutdown(lx_lane_reactor(srv->lanes[i]), grace);
    unwatch_ipc(w);
    set_hard(w, reactor_clock_ms() + grace + 500);
  }
  int seen = atomic_load(&proc_signals_seen);
  if (seen != w->handled) {
    if (w->handled == 0 && srv->proc.ipc_fd < 0) {
      notify_send("STOPPING=1");
      /* one process (no root): refuse new connections now, don't let
       * them wait in the backlog to be reset at exit. A worker's socket
       * is its successor's during a reload: the root ends it at a stop. */
      lx_server_stop_listening(srv);
    }
    log_info("%s: %s", proc_stop_signal_name(),
             w->handled == 0 ? "shutting down gracefully" : "closing now");
    uint64_t grace = w->handled == 0 ? srv->proc.grace_ms : 0;
    for (size_t i = 0; i < srv->nlanes; i++)
      reactor_shutdown(lx_lane_reactor(srv->lanes[i]), grace);
    set_hard(w, reactor_clock_ms() + grace + 2000);
    w->handled = seen;
  }
  if (!w->ready && !w->orphan &&
      (size_t)atomic_load(&srv->lanes_started) == srv->nlanes)
    worker_ready(w);
  if (!w->lanes_done &&
      (size_t)atomic_load(&srv->lanes_done) == srv->nlanes) {
    w->lanes_done = true;
    /* What the lanes queued for the root last (their final unsubscribes
     * and publishes) gets a second to go out. */
    if (w->ipc_w) {
      w->hard = 0;
      set_hard(w, reactor_clock_ms() + 1000);
    }
  }
  /* Write interest while frames for the root wait: the lanes queued them
   * rather than block (cluster/link.h), and this thread writes them. */
  bool pending = false;
  if (w->ipc_w) {
    pthread_mutex_lock(&srv->proc.ipc_lock);
    pending = link_pending(&srv->proc.link);
    pthread_mutex_unlock(&srv->proc.ipc_lock);
    unsigned want = POLL_READ | (pending ? POLL_WRITE : 0);
    if (want != w->ipc_flags && reactor_watch_set(w->ipc_w, want) == 0)
      w->ipc_flags = want;
  }
  if (w->lanes_done && !pending) {
    w->stopped = true;
    reactor_shutdown(w->r, 0);
  }
}

int proc_run_lanes(lx_server_t *srv, int ipc_fd) {
  srv->lanes = calloc(srv->nlanes, sizeof(*srv->lanes));
  srv->group.r = calloc(srv->nlanes, sizeof(*srv->group.r));
  srv->group.n = srv->nlanes;
  srv->ps = pubsub_new((int)srv->nlanes, lx_pubsub_deliver, srv);
  if (!srv->lanes || !srv->group.r || !srv->ps) {
    log_error("out of memory");
    return 1;
  }
  /* Each lane loads the script on this thread, before any lane runs: a
   * script that fails anywhere stops start-up with one line. */
  for (size_t i = 0; i < srv->nlanes; i++) {
    char err[1024];
    srv->lanes[i] = lx_lane_new(srv, (int)i, false, NULL, err, sizeof(err));
    if (!srv->lanes[i]) {
      log_error("%s", err);
      proc_cleanup(srv);
      return 1;
    }
    srv->group.r[i] = lx_lane_reactor(srv->lanes[i]);
  }
  if (ipc_fd < 0 && lx_engine_start(srv, srv->group.r[0])) {
    proc_cleanup(srv);
    return 1;
  }
  /* The main thread's own loop: its index is past the lanes' (it owns no
   * connection). */
  static worker_t w; /* timers and watches point here */
  w = (worker_t){.srv = srv, .ipc_fd = ipc_fd};
  timer_init(&w.tick);
  timer_init(&w.deadline);
  w.r = reactor_new((int)srv->nlanes);
  reactor_watch_t *ww = w.r ? reactor_watch(w.r, proc_wake_fd, on_wake, &w) : NULL;
  if (ww && ipc_fd >= 0) {
    w.ipc_flags = POLL_READ;
    w.ipc_w = reactor_watch_io(w.r, ipc_fd, w.ipc_flags, on_ipc, &w);
  }
  if (!ww || (ipc_fd >= 0 && !w.ipc_w)) {
    log_error("cannot start: %s", strerror(errno));
    reactor_free(w.r);
    proc_cleanup(srv);
    return 1;
  }
  /* Until here a signal simply ends the process (a script stuck at top
   * level can be interrupted); from now on it starts a shutdown. */
  proc_signals_serving(ipc_fd >= 0);
  if (ipc_fd < 0) proc_announce(srv);
  w.pool = defer_pool_new(srv->nlanes, lane_thread, srv);
  if (!w.pool) {
    log_error("cannot start %zu threads: %s", srv->nlanes, strerror(errno));
    reactor_free(w.r);
    proc_cleanup(srv);
    return 1;
  }
  timer_start(reactor_timers(w.r), &w.tick, reactor_now(w.r), 250, 250, 0,
              on_tick, NULL, &w);
  worker_step(&w); /* a signal may have come during start-up */
  int rc = reactor_run(w.r);
  if (rc) log_error("the main loop failed: %s", strerror(-rc));
  timer_stop(reactor_timers(w.r), &w.tick);
  timer_stop(reactor_timers(w.r), &w.deadline);
  if (w.ipc_w) reactor_unwatch(w.ipc_w);
  reactor_unwatch(ww);
  defer_pool_join(w.pool);
  reactor_free(w.r);
  proc_cleanup(srv);
  if (ipc_fd < 0) pidfile_remove();
  log_info("stopped");
  return 0;
}

int proc_worker_main(int index, int sink, int ipc_fd, void *arg) {
  lx_server_t *srv = arg;
  log_set_worker(index);
  srv->worker_index = index;
  srv->sink = sink;
  srv->serial = stats_next_serial(srv->stats);
  srv->root = false;
  srv->lanes = NULL; /* the root lane stays the root's */
  srv->ps = NULL;
  srv->proc.peers = NULL;
  srv->proc.ipc_fd = ipc_fd;
  srv->proc.root_pid = getppid(); /* just forked by it */
  pthread_mutex_init(&srv->proc.ipc_lock, NULL);
  pthread_mutex_init(&srv->shared_lock, NULL);
  ipc_reader_init(&srv->proc.ipc_reader, LX_MAX_CHANNEL + LX_MAX_MESSAGE);
  srv->nlanes = srv->threads;
  atomic_store(&srv->lanes_done, 0);
  atomic_store(&srv->lanes_started, 0);
  atomic_store(&proc_signals_seen, 0);
  atomic_store(&proc_children_exited, 0);
  proc_signals_forked();
  pidfile_set(NULL); /* the root's */
  lx_engine_after_fork(srv);
  if (srv->proc.wake_fd >= 0) close(srv->proc.wake_fd);
  if (proc_new_wake_fd(srv)) return 1;
  link_init(&srv->proc.link, ipc_fd, srv->proc.wake_fd);
  lx_server_after_fork(srv);
  return proc_run_lanes(srv, ipc_fd);
}
