/* SPDX-License-Identifier: MIT */

/* server/ipc: the frames between the root and its worker processes
 * (cluster/ipc.h) as moonport uses them: pub/sub routing, a worker's
 * READY, the DRAIN that replaces it, and the watchdog's BEAT and STUCK.
 *
 * Contract. No Lua: lanes are reached through lx/lx_server.h. A worker's
 * side runs on its main thread (server/worker.c); the root's side on the
 * root's thread (its reactor carries one connection per worker). The
 * peers array belongs to the root (server_ipc_new_peers before the first
 * fork, server_ipc_free_peers at exit). */
#ifndef MP_SERVER_IPC_H
#define MP_SERVER_IPC_H

#include <stdbool.h>
#include <stddef.h>

#include "cluster/pubsub.h"
#include "lx/lx_server.h"

/* ---- a worker ---- */

/* Bytes read from the root: frames for this worker (DELIVER, DRAIN). */
void server_ipc_feed(lx_server_t *srv, const char *data, size_t len);
/* Tells the root this worker serves (IPC_READY). */
void server_ipc_ready(lx_server_t *srv);
/* The watchdog's check, about once a second: a lane whose callback runs
 * past srv->proc.lua_timeout_ms is reported (a log line; in a worker also to
 * the root as IPC_STUCK, and the root replaces the worker); otherwise a
 * worker sends its heartbeat (IPC_BEAT). Also with one process (the log
 * line only). */
void server_ipc_watchdog(lx_server_t *srv);

/* ---- the root ---- */

/* The peers, one per post-office sink; NULL when out of memory. */
struct server_peer *server_ipc_new_peers(lx_server_t *srv);
void server_ipc_free_peers(lx_server_t *srv);
/* The root's post office delivery: sink 0 is the root lane, the others
 * are workers (a DELIVER frame on their link). */
void server_root_deliver(int sink, pubsub_msg_t *m, void *srv);
/* The cluster's hooks: a worker on `sink` started with its end of the
 * socketpair (the root adopts it), exited (its subscriptions go), or is
 * told to drain (false: it can't be reached). */
void server_ipc_worker_started(int sink, int ipc_fd, void *srv);
void server_ipc_worker_exited(int sink, void *srv);
bool server_ipc_drain(int sink, void *srv);

#endif
