/* SPDX-License-Identifier: MIT */

/* process: what the files of src/server share (process.h): the signal
 * handlers every process installs, the main thread's eventfd, reopening
 * the logs, the start line and the teardown. server.c, root.c and
 * worker.c call it; it calls none of them. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "core/log.h"
#include "net/sock.h"
#include "lx/lx_engine.h"
#include "server/ipc.h"
#include "server/process.h"

/* ---- signals ----
 *
 * No thread blocks them, so a process started from a lane (os.execute,
 * io.popen: posix_spawn, which runs no atfork handlers) starts with an
 * ordinary mask; handlers, unlike SIG_IGN, are reset by exec. A handler
 * only counts and wakes the main thread. */
_Atomic int proc_signals_seen;
_Atomic int proc_last_signal;
_Atomic int proc_root_gone;
_Atomic int proc_children_exited;
_Atomic int proc_restarts_asked;
_Atomic int proc_reloads_asked;
_Atomic int proc_reopens_asked;
int proc_wake_fd = -1;

static void wake(void) {
  uint64_t one = 1;
  ssize_t w = write(proc_wake_fd, &one, sizeof(one));
  (void)w;
}

void proc_drain_wake(void) {
  uint64_t v;
  ssize_t r = read(proc_wake_fd, &v, sizeof(v));
  (void)r;
}

void proc_on_root_gone(int sig) {
  int saved = errno;
  atomic_store(&proc_root_gone, 1);
  wake();
  errno = saved;
}

void proc_on_restart(int sig) {
  int saved = errno;
  atomic_fetch_add(&proc_restarts_asked, 1);
  wake();
  errno = saved;
}

void proc_on_reload(int sig) {
  int saved = errno;
  atomic_fetch_add(&proc_reloads_asked, 1);
  wake();
  errno = saved;
}

void proc_on_reopen(int sig) {
  int saved = errno;
  atomic_fetch_add(&proc_reopens_asked, 1);
  wake();
  errno = saved;
}

void proc_on_child(int sig) {
  int saved = errno;
  atomic_store(&proc_children_exited, 1);
  wake();
  errno = saved;
}

void proc_on_stop_signal(int sig) {
  int saved = errno;
  atomic_store(&proc_last_signal, sig);
  atomic_fetch_add(&proc_signals_seen, 1);
  wake();
  errno = saved;
}

/* mp.stop(), on a lane thread. The worker of a root asks the root, which
 * stops every worker (this one too); the root, or a process alone, starts
 * its own shutdown as its SIGTERM handler would, without sending itself a
 * signal: which thread a signal lands on, and when a sanitizer's runtime
 * lets it run, are not ours to choose. A worker whose root is gone (its
 * parent changed) stops alone. */
void proc_stop_server(lx_server_t *srv) {
  int root = srv->proc.root_pid;
  if (root > 0 && getppid() == root && kill(root, SIGTERM) == 0) return;
  proc_on_stop_signal(SIGTERM);
}

/* SIGPIPE: writes to a closed socket then fail with EPIPE instead of
 * killing us; SIGHUP in a worker: a terminal's hangup reaches the whole
 * process group, and reloading is the root's business. */
void proc_on_ignored(int sig) { (void)sig; }

void proc_handle(int sig, void (*fn)(int)) {
  struct sigaction sa = {.sa_handler = fn, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}

void proc_signals_serving(bool worker) {
  proc_handle(SIGINT, proc_on_stop_signal);
  proc_handle(SIGTERM, proc_on_stop_signal);
  if (worker)
    proc_handle(SIGUSR2, proc_on_root_gone);
  else
    proc_handle(SIGHUP, proc_on_reload);
  proc_handle(SIGWINCH, proc_on_reopen);
}

void proc_signals_forked(void) {
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  proc_handle(SIGHUP, proc_on_ignored);
}

const char *proc_stop_signal_name(void) {
  return atomic_load(&proc_last_signal) == SIGINT ? "SIGINT" : "SIGTERM";
}

int proc_new_wake_fd(lx_server_t *srv) {
  srv->proc.wake_fd = proc_wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (proc_wake_fd >= 0) return 0;
  log_error("cannot start: %s", strerror(errno));
  return -1;
}

/* ---- reopening the logs (logrotate) ----
 *
 * SIGWINCH asks a process to reopen its --log and --error-log files by
 * name: logrotate moves a file away and signals, lines written until the
 * signal is handled still go to the moved file, later ones to a new file
 * at the old name, and none is lost (log_reopen_fd swaps the file under
 * the same fd, so a write in flight on another lane lands whole in one of
 * them). SIGWINCH because the others are taken: HUP reloads, USR1
 * restarts the workers, USR2 tells a worker its root died, and the real
 * time signals have no name logrotate scripts and kill(1) users know. A
 * terminal sends WINCH to its foreground group when it is resized; that
 * reopens the same files, which is harmless. The root reopens its own
 * files first (workers it forks later inherit the new ones) and passes
 * the signal to every worker. Main (or root) thread only. */

static const char *access_path; /* --log, unless "-" */
static const char *error_path;  /* --error-log */

void proc_set_log_paths(const char *access, const char *error) {
  access_path = access;
  error_path = error;
}

void proc_reopen_logs(lx_server_t *srv) {
  int rc;
  if (error_path && (rc = log_reopen_fd(STDERR_FILENO, error_path)))
    log_error("cannot reopen the error log %s: %s", error_path, strerror(-rc));
  if (access_path && srv->access_fd >= 0 &&
      (rc = log_reopen_fd(srv->access_fd, access_path)))
    log_error("cannot reopen the access log %s: %s", access_path,
              strerror(-rc));
  log_info("SIGWINCH: reopened the log files");
}

/* ---- the start line ---- */

/* One line (at info) saying what is served: the version, the script,
 * every listening socket as a URL, workers x lanes. */
void proc_announce(lx_server_t *srv) {
  if (log_get_level() < LOG_INFO) return;
  char urls[2048];
  size_t at = lx_server_listen_urls(srv, urls, sizeof(urls));
  log_info("version %s serving %s on %s; %d worker%s x %zu lane%s",
           MOONPORT_VERSION, srv->script, at ? urls : "no socket",
           srv->nworkers, srv->nworkers == 1 ? "" : "s", srv->threads,
           srv->threads == 1 ? "" : "s");
}

/* The one teardown of every process (a worker, the only process, the
 * root), from any point of start-up on: each step is safe on what was
 * never made. */
void proc_cleanup(lx_server_t *srv) {
  lx_engine_stop(srv);
  srv->exiting = true; /* the root's retired lanes wait for the last step */
  size_t n = srv->root ? 1 : srv->nlanes; /* the root has its one lane */
  for (size_t i = 0; srv->lanes && i < n; i++) lx_lane_free(srv->lanes[i]);
  lx_lane_free_retired(srv);
  pubsub_free(srv->ps);
  srv->ps = NULL;
  server_ipc_free_peers(srv);
  ipc_reader_deinit(&srv->proc.ipc_reader);
  link_free(&srv->proc.link);
  lx_server_close_listeners(srv);
  free(srv->lanes);
  srv->lanes = NULL;
  free(srv->group.r);
  srv->group.r = NULL;
  if (srv->proc.wake_fd >= 0) close(srv->proc.wake_fd);
  srv->proc.wake_fd = proc_wake_fd = -1;
  pthread_mutex_destroy(&srv->listen_lock);
  lx_shared_free_all(srv);
  sock_deinit();
}
