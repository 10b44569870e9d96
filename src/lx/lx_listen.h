/* SPDX-License-Identifier: MIT */

/* lx_listen: listening sockets shared by the lanes of a process (and, in
 * the root, opened for every worker before the fork).
 *
 * Contract. srv->listeners and every lx_shared_listener_t field are
 * guarded by srv->listen_lock; any lane thread may call these. A listener
 * lives while `refs` counts a service or a hand-off in flight; the last
 * release closes it (and unlinks a Unix path, in the process that made
 * it). lx_server_close_listeners and lx_server_after_fork (lx_server.h)
 * are for the main thread. */
#ifndef MP_LX_LISTEN_H
#define MP_LX_LISTEN_H

#include "lx/lx_server.h"
#include "net/reactor.h"

struct lx_service;

/* The shared listener for `key` ("tcp:ADDR:PORT", "unix:PATH"), opened on
 * first use (host/port, or path; backlog) with one more ref; NULL with
 * *err a negative errno. */
lx_shared_listener_t *lx_shared_acquire(lx_server_t *srv, const char *key,
                                        const char *host, int port,
                                        const char *path, int backlog,
                                        int *err);
/* The end of a root reload: its new TLS contexts replace the listeners'
 * (ok), or are dropped (the script failed). Root thread. */
void lx_shared_reload_end(lx_server_t *srv, bool ok);
/* Drops one ref (a service closed, a hand-off done). */
void lx_shared_release(lx_server_t *srv, lx_shared_listener_t *sl);
/* Forgets lane `index`'s service `svc` on a shared listener (closing). */
void lx_shared_detach(lx_server_t *srv, lx_shared_listener_t *sl, int index,
                      struct lx_service *svc);
/* The reactor's dispatch for a listener of several lanes (arg: the
 * accepting lane's service): hands fd round robin to a lane listening on
 * the same socket, or adopts it here. Lane thread. */
void lx_listen_dispatch(listener_t *l, int fd, void *arg);

#endif
