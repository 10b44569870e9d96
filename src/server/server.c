/* SPDX-License-Identifier: MIT */

/* server: starting a moonport process from its options (server.h): logs,
 * counters, and the choice between one process (worker.c) and a root with
 * workers (root.c); what every process shares is in process.c. main.c is
 * the command line only. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "core/log.h"
#include "core/metric.h"
#include "net/tls.h"
#include "core/notify.h"
#include "core/stats.h"
#include "net/sock.h"
#include "server/pidfile.h"
#include "server/process.h"
#include "server/server.h"

/* ---- start ---- */

int server_main(const server_opts_t *o) {
  int rc;
  log_set_worker(o->workers == 1 ? 1 : 0);
  pidfile_set(o->pidfile);
  if (o->error_log && (rc = log_reopen_fd(STDERR_FILENO, o->error_log))) {
    fprintf(stderr, "moonport: cannot open the error log %s: %s\n",
            o->error_log, strerror(-rc));
    return 1;
  }
  proc_set_log_paths(o->log && strcmp(o->log, "-") != 0 ? o->log : NULL,
                     o->error_log);
  if (notify_init())
    log_warn("NOTIFY_SOCKET is not a socket path; not notifying the service "
             "manager");

  proc_handle(SIGPIPE, proc_on_ignored);

  if ((rc = sock_init())) {
    log_error("cannot start: %s", strerror(-rc));
    return 1;
  }
  /* Before any fork: every worker derives the same ticket keys. */
  if ((rc = net_tls_global_init())) {
    log_error("cannot start: OpenSSL: %s", strerror(-rc));
    return 1;
  }
  static lx_server_t srv; /* the lanes point at it until the process ends */
  srv.modules = lx_binding_modules();
  srv.script = o->script;
  srv.argc = o->argc;
  srv.argv = o->argv;
  srv.nlanes = srv.threads = (size_t)o->threads;
  srv.nworkers = (int)o->workers;
  srv.proc.max_memory = (size_t)o->max_memory << 20;
  srv.proc.drain_ms = (uint64_t)(o->drain * 1000);
  srv.worker_index = srv.nworkers == 1 ? 1 : 0;
  srv.proc.grace_ms = (uint64_t)(o->grace * 1000);
  srv.proc.lua_timeout_ms = (uint64_t)(o->lua_timeout * 1000);
  srv.redis_url = o->redis;
  srv.redis_cli = srv.remote = o->redis != NULL;
  pthread_mutex_init(&srv.listen_lock, NULL);
  pthread_mutex_init(&srv.proc.ipc_lock, NULL);
  pthread_mutex_init(&srv.shared_lock, NULL);
  srv.proc.ipc_fd = -1;
  srv.proc.stop = proc_stop_server;
  link_init(&srv.proc.link, -1, -1);
  srv.access_fd = -1;
  if (o->log) {
    srv.access_fd = strcmp(o->log, "-") == 0 ? STDOUT_FILENO : log_open(o->log);
    if (srv.access_fd < 0) {
      log_error("cannot open the access log %s: %s", o->log,
                strerror(-srv.access_fd));
      return 1;
    }
  }
  int per = (int)srv.threads + 1;
  srv.stats = stats_new(srv.nworkers > 1 ? CLUSTER_SINKS(srv.nworkers) * per : per);
  if (!srv.stats) {
    log_error("cannot map the counters: %s", strerror(errno));
    return 1;
  }
  srv.metrics = metric_set_new(); /* NULL: mp.counter and co. raise */
  if (!srv.metrics)
    log_warn("cannot map the script's metrics: %s", strerror(errno));
  srv.serial = stats_next_serial(srv.stats);
  if (proc_new_wake_fd(&srv)) return 1;
  if (o->check) {
    srv.nworkers = 1;
    srv.nlanes = srv.threads = 1;
    srv.check = true;
    return lx_check_script(&srv);
  }
  return srv.nworkers > 1 ? proc_run_root(&srv, o->watch)
                          : proc_run_lanes(&srv, -1);
}
