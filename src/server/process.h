/* SPDX-License-Identifier: MIT */

/* server/process: what the files of src/server share (process.c; used by
 * server.c, root.c, worker.c); not for the rest of the tree.
 *
 * Contract. The signal handlers only count in these atomics and write the
 * main thread's eventfd (proc_wake_fd); the main thread (the root's, or a
 * worker's) reads and resets them. Everything else here is main thread
 * only. */
#ifndef MP_SERVER_PROCESS_H
#define MP_SERVER_PROCESS_H

#include <stdatomic.h>
#include <stdbool.h>

#include "lx/lx_server.h"

extern _Atomic int proc_signals_seen;    /* SIGINT/SIGTERM so far */
extern _Atomic int proc_last_signal;
extern _Atomic int proc_root_gone;       /* a worker's root died (SIGUSR2) */
extern _Atomic int proc_children_exited; /* the root got SIGCHLD */
extern _Atomic int proc_restarts_asked;  /* the root got SIGUSR1 */
extern _Atomic int proc_reloads_asked;   /* SIGHUP */
extern _Atomic int proc_reopens_asked;   /* SIGWINCH: reopen the log files */
extern int proc_wake_fd;                 /* the main thread's eventfd */

/* Installs fn for sig (SA_RESTART). */
void proc_handle(int sig, void (*fn)(int));
void proc_on_stop_signal(int sig);
/* mp.stop() (lx_proc_t.stop): the graceful shutdown of the whole server. */
void proc_stop_server(lx_server_t *srv);
void proc_on_reload(int sig);
void proc_on_reopen(int sig);
void proc_on_restart(int sig);
void proc_on_child(int sig);
void proc_on_root_gone(int sig);
void proc_on_ignored(int sig);
/* A serving process's handlers, once its lanes are loaded (until then a
 * signal simply ends it: a script stuck at top level can be interrupted):
 * SIGINT/SIGTERM stop, SIGWINCH reopens the logs, and SIGHUP reloads
 * (one process: refused with a reason) or, in a worker, SIGUSR2 says its
 * root died. */
void proc_signals_serving(bool worker);
/* In a new worker: the root's stop handlers are not ours (the default
 * until it serves), and a terminal's SIGHUP is ignored. */
void proc_signals_forked(void);
/* "SIGINT" or "SIGTERM": the last stop signal. */
const char *proc_stop_signal_name(void);
/* Reads what woke the main thread off proc_wake_fd. */
void proc_drain_wake(void);
/* A new eventfd for srv->proc.wake_fd and proc_wake_fd: 0, or -1 logged. */
int proc_new_wake_fd(lx_server_t *srv);

/* The files proc_reopen_logs reopens: --log (NULL: none, or stdout) and
 * --error-log (NULL: none). The strings must outlive the process. */
void proc_set_log_paths(const char *access, const char *error);
/* Reopens --error-log and --log by name (SIGWINCH). */
void proc_reopen_logs(lx_server_t *srv);
/* One line (at info) saying what is served. While no lane thread runs. */
void proc_announce(lx_server_t *srv);
/* Frees everything the process made (the lanes, the engine, the post
 * office, the links, the listeners, the dictionaries), once no lane
 * thread runs: the one teardown of root.c and worker.c, at exit and on
 * any failure of start-up. */
void proc_cleanup(lx_server_t *srv);

/* Serves with srv->nlanes lanes in this process: the whole server (ipc_fd
 * -1) or one worker of several. Returns the exit status. (worker.c) */
int proc_run_lanes(lx_server_t *srv, int ipc_fd);
/* cluster_new's worker body, in a forked child: worker `index` on post
 * office sink `sink`, ipc_fd its end of the socketpair, arg the server.
 * Returns the child's exit status. (worker.c) */
int proc_worker_main(int index, int sink, int ipc_fd, void *arg);
/* The root of several workers (root.c). Returns the exit status. */
int proc_run_root(lx_server_t *srv, bool watch);

#endif
