/* SPDX-License-Identifier: MIT */

/* cluster/link: a worker's byte stream of IPC frames (cluster/ipc.h) to its
 * root process, which never blocks the sender.
 *
 * Contract. The link does not own its lock: every call but link_init and
 * link_free is made with the mutex that guards the link held (in moonport,
 * lx_server.proc.ipc_lock, which also orders pub/sub counts; see lx_pubsub.c).
 * Any thread may send; what the socket refuses waits in the link, in
 * order, and the sender wakes the worker's main thread (wake_fd), which
 * flushes when the socket turns writable. The link does not own fd or
 * wake_fd. No Lua here. */
#ifndef MP_CLUSTER_LINK_H
#define MP_CLUSTER_LINK_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes a link may hold for a slow root before publishes are refused. */
#define LINK_OUT_MAX ((size_t)64 << 20)

/* An IPC_PUBLISH's scope, in its flags (IPC_SCOPE_MASK): every process
 * of the cluster (through Redis with --redis), this process only, the
 * other workers, or the root lane. mp.publish's `scope` option. */
enum { LINK_SCOPE_CLUSTER, LINK_SCOPE_PROCESS, LINK_SCOPE_SIBLINGS,
       LINK_SCOPE_ROOT };

typedef struct server_link {
  int fd;      /* the socketpair end to the root, or -1: no link */
  int wake_fd; /* eventfd of the main thread, written when bytes wait */
  char *out;   /* queued bytes [off, len) */
  size_t off, len, cap;
} server_link_t;

/* An empty link on fd (-1: none). */
void link_init(server_link_t *l, int fd, int wake_fd);
/* Frees what is queued (the fds stay open). */
void link_free(server_link_t *l);
/* Sends one frame, or queues what the socket does not take behind what
 * waits already, and wakes the main thread. Returns 0; -ENOBUFS for an
 * IPC_PUBLISH that would take the queue past
 * LINK_OUT_MAX (control frames are small and always queued: their order
 * matters); -ENOMEM; -EPIPE (or another errno) once the root is gone. */
int link_send(server_link_t *l, int type, unsigned flags, const char *ch,
              size_t clen, const char *msg, size_t mlen);
/* Whether bytes wait (then poll fd for writing). */
bool link_pending(const server_link_t *l);
/* Writes what the socket takes now; a dead root drops the queue. */
void link_flush(server_link_t *l);

#endif
