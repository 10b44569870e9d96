/* SPDX-License-Identifier: MIT */

/* lx_engine: the Redis engine of a process: pub/sub across servers through
 * Redis (src/redis), counting which channels this server has subscribers
 * for and publishing with scope = "cluster". Started by src/server on the
 * process's main reactor. */
#ifndef MP_LX_ENGINE_H
#define MP_LX_ENGINE_H

#include <stdbool.h>
#include <stddef.h>

#include "net/reactor.h"

typedef struct lx_server lx_server_t;

/* The Redis engine (lx_engine.c): started on reactor r if srv->redis_url
 * is set (0, or -1 after a log line); stopped; a worker forgets the
 * root's. */
int lx_engine_start(lx_server_t *srv, reactor_t *r);
void lx_engine_stop(lx_server_t *srv);
void lx_engine_after_fork(lx_server_t *srv);
/* The first subscriber of a channel or pattern in this server appeared
 * (add) or the last went: tells Redis. Any thread; callers keep these in
 * the order of their counts. No-op without an engine here. */
void lx_engine_count(lx_server_t *srv, const char *ch, size_t len,
                     bool pattern, bool add);
/* pubsub_clear_sink's callback: a key lost its last subscriber. */
void lx_engine_gone(const char *ch, size_t len, bool pattern, void *srv);
/* Publishes through Redis (cluster scope). Any thread. Returns 0, or
 * -ENOBUFS (nothing sent) while LX_ENGINE_BACKLOG_MAX bytes of publishes
 * wait for a Redis that is slow or away. */
#define LX_ENGINE_BACKLOG_MAX ((size_t)64 << 20)
int lx_engine_publish(lx_server_t *srv, const char *ch, size_t clen,
                      const char *msg, size_t mlen, bool json);

#endif
