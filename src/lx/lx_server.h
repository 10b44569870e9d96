/* SPDX-License-Identifier: MIT */

/* lx_server: the process-wide server of the Lua binding, as the process
 * layer (src/server) sees it, without lua.h: the struct every lane points
 * at, and the few functions of the binding src/server calls.
 *
 * Contract. src/server (root, worker loop, IPC, reload) fills the struct
 * before any lane exists and frees what it made after the lanes are gone;
 * the binding (src/lx) owns the lanes, the listeners and the Lua side.
 * Fields say which thread may touch them; unless they say otherwise, the
 * main thread (the root's, or a worker's) before the lanes run, and the
 * lanes read them afterwards. */
#ifndef MP_LX_SERVER_H
#define MP_LX_SERVER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cluster/ipc.h"
#include "cluster/pubsub.h"
#include "core/stats.h"
#include "net/reactor.h"
#include "cluster/link.h"

#define MOONPORT_VERSION "0.1.0"

/* Pub/sub limits: a channel name, and one message (after JSON encoding). */
#define LX_MAX_CHANNEL 4096
#define LX_MAX_MESSAGE (8 << 20)

typedef struct lx_server lx_server_t;
typedef struct lx_lane lx_lane_t;

/* A shared listening socket: every lane that listens on the same address
 * accepts from one fd. Guarded by lx_server.listen_lock. */
typedef struct lx_shared_listener {
  char *key;  /* "tcp:ADDR:PORT" or "unix:PATH" */
  char *path; /* Unix path to unlink at exit, or NULL */
  int fd;
  int *worker_fds; /* root with TCP: one SO_REUSEPORT socket per worker */
  int nworker_fds;
  int refs;                  /* services using it, and hand-offs in flight */
  struct lx_service **svc;   /* per lane: its service here, or NULL */
  unsigned next_lane;        /* round robin for hand-offs */
  /* TLS: the context its connections use (one ref), made from the
   * script's `tls` by the first lane that listens here: in the root of
   * -w N (and again by each reload there), so workers use the
   * certificates the root read and checked (lx_tls.c). */
  struct net_tls_ctx *tls;
  struct net_tls_ctx *tls_next; /* a root reload's, until it succeeds */
  struct lx_shared_listener *next;
} lx_shared_listener_t;

/* The process part of the server: what src/server makes, runs and frees
 * (the links between processes, the main thread's eventfd, the timeouts
 * of its supervision). The binding reads only ipc_fd, ipc_lock, link (a
 * worker's frames to the root, lx_pubsub.c) and wake_fd (a lane is done,
 * lx_lane.c). */
typedef struct lx_proc {
  uint64_t grace_ms;
  uint64_t drain_ms; /* a replaced worker's time to finish (--drain-timeout) */
  size_t max_memory; /* bytes a worker may use before it is replaced */
  uint64_t lua_timeout_ms;   /* a callback running longer is stuck (0: off) */
  int ipc_fd;                /* a worker's socketpair end to the root, or -1 */
  pthread_mutex_t ipc_lock;  /* guards `link`; also orders pub/sub counts */
  /* A worker's frames to the root (cluster/link.h; guarded by ipc_lock):
   * any lane sends, the main thread flushes. Publishes past LINK_OUT_MAX
   * are refused. */
  server_link_t link;
  ipc_reader_t ipc_reader;   /* a worker's frames from the root (main thread) */
  struct server_peer *peers; /* the root's links to worker processes, by
                                post-office sink (1..2 * nworkers);
                                server/ipc.c's */
  /* Root: a worker's news for the supervisor: IPC_READY (it serves),
   * IPC_BEAT (alive) or IPC_STUCK (msg: which lane runs what). */
  void (*worker_news)(int type, int sink, const char *msg, size_t len,
                      void *arg);
  void *news_arg;
  uint64_t beat_sent; /* a worker's main thread: its last IPC_BEAT */
  bool stuck_told;    /* ... and whether it reported the stuck lane */
  int wake_fd; /* eventfd the main thread polls: signals, lanes done */
  /* mp.stop(): starts the graceful shutdown of the whole server, from any
   * lane (server/process.c's proc_stop_server). */
  void (*stop)(struct lx_server *srv);
  int root_pid; /* a worker's root, as forked (0 in the root or alone) */
} lx_proc_t;

/* The server: its binding part (lanes, listeners, dictionaries, the
 * engine, counters) and, in `proc`, its process part. */
struct lx_server {
  lx_proc_t proc; /* src/server's */
  const char *script;
  int argc; /* script arguments */
  char **argv;
  size_t nlanes;  /* lanes of this process (1 in the root) */
  size_t threads; /* lanes per worker (-t) */
  lx_lane_t **lanes;
  /* The Lua modules whose hooks the lanes run (lx/lx_module.h; the
   * binding's table is lx_binding_modules()). Set before the first
   * lane. */
  const struct lx_module *modules;
  reactor_group_t group;
  pthread_mutex_t listen_lock;
  lx_shared_listener_t *listeners; /* guarded by listen_lock */
  int nworkers;                    /* worker processes (1: no fork) */
  int worker_index;                /* 1..nworkers in a worker; 0 in the root */
  bool root;                 /* this process is the root of several workers */
  bool check;                /* moonport --check: listeners are never bound */
  _Atomic int lanes_done;    /* lanes whose loop has returned */
  _Atomic int lanes_started; /* worker lanes whose start handlers have
                                returned (then srv->wake_fd is written) */
  pubsub_t *ps;       /* this process's post office: a sink per lane (in the
                         root: sink 0 its lane, sink i worker i) */
  lx_lane_t *retired; /* root: replaced root lanes not freed yet */
  /* Pub/sub through Redis (--redis): the URL; whether cluster-scope
   * messages go through it (every process knows); the engine and the
   * reactor it lives on (the root's, or lane 1's with one process). */
  const char *redis_url;
  char *redis_url_own; /* set by mp.engine */
  bool redis_cli;      /* from --redis / MOONPORT_REDIS */
  bool engine_started; /* lx_engine_start ran: mp.engine is too late */
  bool remote;
  struct redis_engine *engine;
  reactor_t *engine_r;
  /* Bytes of publishes on their way to Redis in this process: posted to
   * the engine's reactor and not taken yet (any thread adds, the engine's
   * subtracts), and held by the engine (its gauge: unsent or queued).
   * mp.publish refuses past LX_ENGINE_BACKLOG_MAX. */
  _Atomic size_t engine_posted, engine_held;
  bool exiting;       /* root: freeing everything; retired lanes wait */
  int access_fd;      /* --log: one line per HTTP request, or -1 */
  /* The server's counters (core/stats.h), mapped before any fork; this
   * process's sink (0: the root, or the only process), whose slots are
   * [sink * (threads + 1), + threads + 1). */
  struct stats *stats;
  /* mp.counter / mp.gauge / mp.histogram (core/metric.h), mapped with
   * the counters; NULL if that failed (the calls raise then). */
  struct metric_set *metrics;
  int sink;
  uint64_t serial; /* this process's number in the server (stats_next_serial) */
  /* mp.shared dictionaries by name: made in the root (or, with one
   * process, by lane 1) and inherited by forked workers. Never removed
   * while the process runs. */
  pthread_mutex_t shared_lock;
  struct lx_shared_dict *shared; /* guarded by shared_lock */
};

/* ---- the binding's functions for the process layer ----
 * Main thread (the root's, or a worker's) unless said otherwise. */

/* Makes lane `index` of `srv`: a reactor (or, for a reloaded root lane,
 * the root's reactor `on`) and a lua_State with the standard libraries and
 * the moonport module, then runs the script's top level. On failure
 * returns NULL and puts one line (without "moonport: ") in err. Main
 * thread, or the root's. */
lx_lane_t *lx_lane_new(lx_server_t *srv, int index, bool is_root,
                       reactor_t *on, char *err, size_t errlen);
/* Frees a lane whose loop has returned (or never ran). Main thread. */
void lx_lane_free(lx_lane_t *ln);
/* The lane thread's body: start handlers (then, in a worker lane, it
 * counts srv->lanes_started and writes srv->wake_fd), the loop, done (then
 * it counts srv->lanes_done and writes srv->wake_fd). */
void lx_lane_run(lx_lane_t *ln);
/* The lane's reactor. Any thread. */
reactor_t *lx_lane_reactor(const lx_lane_t *ln);
/* For the watchdog, any thread: when the outermost callback now running
 * on the lane started (reactor_clock_ms() + 1), or 0: none; *what names
 * it (may be NULL). */
uint64_t lx_lane_busy(const lx_lane_t *ln, const char **what);
/* Posts the lane's mp.on("reload") handlers to its thread (a replaced
 * worker, before it drains). Any thread. */
void lx_lane_post_reload(lx_lane_t *ln);
/* Root only: replaces the root lane by a new one running the script as it
 * is on disk now, on the same reactor. On failure (the script does not
 * load) nothing changes, err says why, and it returns false. On success
 * the old lane's mp.on("reload") handlers run, its timers, sleeps and
 * subscriptions end, its listeners pass to the new lane, and it is freed
 * once its last client connection is gone; the new lane's start handlers
 * run next. */
bool lx_lane_reload_root(lx_server_t *srv, char *err, size_t errlen);
/* Root, at exit, after the root lane (and so the reactor) is freed: frees
 * the retired root lanes left. */
void lx_lane_free_retired(lx_server_t *srv);

/* The post office's delivery into lane `sink` of srv (a mailbox post).
 * Any thread. */
void lx_pubsub_deliver(int sink, pubsub_msg_t *m, void *srv);

/* Shared listening sockets (lx_listen.c): closes every one (unlinking Unix
 * paths), at exit; in a new worker process forgets the root's claims on
 * the inherited ones. */
void lx_server_close_listeners(lx_server_t *srv);
void lx_server_after_fork(lx_server_t *srv);
/* At a graceful stop: every shared listening socket stops listening
 * (shutdown(2); the fds stay open until lx_server_close_listeners), so a
 * new connection is refused at once instead of waiting in a backlog that
 * nobody accepts from and being reset when the process exits. In the
 * root its sockets are the workers' too. Any thread. */
void lx_server_stop_listening(lx_server_t *srv);
/* Writes the URLs of every socket the server listens on ("http://ADDR:PORT,
 * unix:PATH", ...) into out (NUL-terminated); returns the length, 0 for
 * none. While no lane thread runs (it reads the lanes' services). */
size_t lx_server_listen_urls(lx_server_t *srv, char *out, size_t len);

/* moonport --check (lx_check.c): loads the script in one throw-away lane
 * (listeners made but never bound), then reports the globals its
 * functions read that neither the libraries nor the script define, as
 * "file:line: ..." lines on stderr. Returns the exit status: 0 clean, 1
 * for a script that fails to load or has warnings. Main thread, instead
 * of running the server. */
int lx_check_script(lx_server_t *srv);

/* The binding's module table, for lx_server.modules (lx_modules.c). */
const struct lx_module *lx_binding_modules(void);

/* Unmaps this process's mp.shared dictionaries. At exit, after the lanes
 * are gone. */
void lx_shared_free_all(lx_server_t *srv);

#endif
