/* SPDX-License-Identifier: MIT */

/* server/ipc: the root's and the workers' sides of their socketpairs
 * (see ipc.h): routing pub/sub frames between processes, a worker's READY,
 * the DRAIN that replaces it, and the watchdog's heartbeat. Moved here
 * from lx_pubsub.c: none of it runs Lua. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster/cluster.h"
#include "cluster/ipc.h"
#include "cluster/link.h"
#include "core/log.h"
#include "lx/lx_engine.h"
#include "server/ipc.h"

/* A worker's frames from the root. */
static void srv__from_root(int type, unsigned flags, const char *ch,
                          size_t clen, const char *msg, size_t mlen,
                          void *arg) {
  lx_server_t *srv = arg;
  if (type == IPC_DRAIN) { /* replaced: finish, then exit */
    log_info("worker %d (pid %d) was replaced; finishing its connections",
             srv->worker_index, (int)getpid());
    for (size_t i = 0; i < srv->nlanes; i++) {
      lx_lane_post_reload(srv->lanes[i]);
      reactor_drain(lx_lane_reactor(srv->lanes[i]), srv->proc.drain_ms,
                    srv->proc.grace_ms);
    }
    return;
  }
  if (type != IPC_DELIVER) return;
  uint32_t f = (flags & IPC_JSON ? PUBSUB_JSON : 0) |
               (flags & IPC_EXACT ? PUBSUB_EXACT : 0);
  const char *pat = NULL;
  uint32_t plen = 0;
  if (flags & IPC_PATTERN) {
    if (mlen < 4) return;
    memcpy(&plen, msg + mlen - 4, 4);
    if (plen > mlen - 4) return;
    mlen -= 4 + plen;
    pat = msg + mlen;
    f |= PUBSUB_PATTERN;
  }
  pubsub_msg_t *m = pubsub_msg_new_for(ch, clen, msg, mlen, pat, plen, f);
  if (!m) {
    log_error("pub/sub: out of memory; a message is lost");
    return;
  }
  pubsub_publish(srv->ps, m, -1, -1);
  pubsub_msg_unref(m);
}

static void srv__oversize(size_t body, size_t limit, void *arg) {
  log_error("pub/sub: refused a frame of %zu bytes from another process "
            "(the limit is %zu)", body, limit);
}

void server_ipc_feed(lx_server_t *srv, const char *data, size_t len) {
  if (ipc_reader_feed(&srv->proc.ipc_reader, data, len, srv__from_root,
                      srv__oversize, srv))
    log_error("pub/sub: out of memory reading from the root; a frame is lost");
}

/* The root's side of one worker's socketpair. */
typedef struct server_peer {
  lx_server_t *srv;
  int index;
  sock_uuid_t uuid; /* its connection in the root's reactor, or 0 */
  ipc_reader_t reader;
} server_peer_t;

static void srv__root_frame(int type, unsigned flags, const char *ch,
                           size_t clen, const char *msg, size_t mlen,
                           void *arg) {
  server_peer_t *p = arg;
  lx_server_t *srv = p->srv;
  switch (type) {
  case IPC_SUB:
  case IPC_PSUB:
    if (pubsub_subscribe(srv->ps, p->index, ch, clen, type == IPC_PSUB) == 1)
      lx_engine_count(srv, ch, clen, type == IPC_PSUB, true);
    return;
  case IPC_UNSUB:
  case IPC_PUNSUB:
    if (pubsub_unsubscribe(srv->ps, p->index, ch, clen, type == IPC_PUNSUB) == 1)
      lx_engine_count(srv, ch, clen, type == IPC_PUNSUB, false);
    return;
  case IPC_READY:
  case IPC_BEAT:
  case IPC_STUCK:
    if (srv->proc.worker_news)
      srv->proc.worker_news(type, p->index, msg, mlen, srv->proc.news_arg);
    return;
  case IPC_PUBLISH: break;
  default: return;
  }
  if (srv->engine && (flags & IPC_SCOPE_MASK) == LINK_SCOPE_CLUSTER) {
    /* Everyone, the publisher too, gets it when it comes back. Refused
     * while Redis is behind: the worker can't be told, so a log line at
     * the first drop of each run of them. Root thread only. */
    static bool dropping;
    if (lx_engine_publish(srv, ch, clen, msg, mlen, flags & IPC_JSON) == 0) {
      dropping = false;
    } else if (!dropping) {
      dropping = true;
      log_error("redis: %zu MiB of messages wait for Redis (slow or away); "
                "dropping workers' messages until it catches up",
                LX_ENGINE_BACKLOG_MAX >> 20);
    }
    return;
  }
  pubsub_msg_t *m = pubsub_msg_new(ch, clen, msg, mlen,
                                   flags & IPC_JSON ? PUBSUB_JSON : 0);
  if (!m) {
    log_error("pub/sub: out of memory; a message is lost");
    return;
  }
  unsigned scope = flags & IPC_SCOPE_MASK;
  if (scope == LINK_SCOPE_CLUSTER) /* the publisher delivered its own */
    pubsub_publish(srv->ps, m, p->index, -1);
  else if (scope == LINK_SCOPE_SIBLINGS)
    pubsub_publish(srv->ps, m, p->index, 0);
  else if (scope == LINK_SCOPE_ROOT && pubsub_wants(srv->ps, 0, m))
    lx_pubsub_deliver(0, m, srv);
  pubsub_msg_unref(m);
}

static void srv__peer_open(conn_t *c) {
  server_peer_t *p = reactor_conn_service(c);
  p->uuid = reactor_conn_uuid(c);
}

static void srv__peer_data(conn_t *c, const char *data, size_t len) {
  server_peer_t *p = reactor_conn_service(c);
  if (ipc_reader_feed(&p->reader, data, len, srv__root_frame, srv__oversize, p))
    log_error("pub/sub: out of memory reading from worker %d; a frame is "
              "lost", (p->index - 1) % p->srv->nworkers + 1);
}

static void srv__peer_close(conn_t *c, int reason) {
  server_peer_t *p = reactor_conn_service(c);
  if (p->uuid == reactor_conn_uuid(c)) p->uuid = 0;
}

static const proto_t srv_peer_proto = {.on_open = srv__peer_open,
                                      .on_data = srv__peer_data,
                                      .on_close = srv__peer_close};

static void srv__release_msg(void *m, void *unused) { pubsub_msg_unref(m); }

void server_root_deliver(int sink, pubsub_msg_t *m, void *arg) {
  lx_server_t *srv = arg;
  if (sink == 0) {
    lx_pubsub_deliver(0, m, srv);
    return;
  }
  server_peer_t *p = &srv->proc.peers[sink];
  conn_t *c = p->uuid ? reactor_conn_find(lx_lane_reactor(srv->lanes[0]), p->uuid) : NULL;
  if (!c) return; /* between a worker's death and its replacement */
  char hdr[IPC_HEADER + LX_MAX_CHANNEL];
  bool pat = m->flags & PUBSUB_PATTERN;
  unsigned f = (m->flags & PUBSUB_JSON ? IPC_JSON : 0) |
               (m->flags & PUBSUB_EXACT ? IPC_EXACT : 0) |
               (pat ? IPC_PATTERN : 0);
  ipc_header(hdr, IPC_DELIVER, f, m->clen,
             m->mlen + (pat ? m->plen + 4 : 0));
  memcpy(hdr + IPC_HEADER, pubsub_msg_channel(m), m->clen);
  int rc = reactor_conn_write(c, hdr, IPC_HEADER + m->clen);
  if (rc == 0 && m->mlen) {
    pubsub_msg_ref(m);
    rc = reactor_conn_write_ref(c, pubsub_msg_body(m), m->mlen,
                                srv__release_msg, m, NULL);
  }
  if (rc == 0 && pat) { /* the pattern, then its length */
    uint32_t plen = (uint32_t)m->plen;
    rc = reactor_conn_write(c, pubsub_msg_pattern(m), m->plen);
    if (rc == 0) rc = reactor_conn_write(c, (const char *)&plen, 4);
  }
  if (rc == -ENOBUFS) {
    /* Half a frame would corrupt the stream: the worker is too far behind
     * to be told anything more, so it is cut off and replaced. */
    log_error("pub/sub: worker %d is not keeping up (%zu bytes queued); "
              "closing its link", (sink - 1) % srv->nworkers + 1,
              reactor_conn_pending(c));
    reactor_conn_force_close(c, CONN_ERROR);
  }
}

void server_ipc_worker_started(int sink, int fd, void *arg) {
  lx_server_t *srv = arg;
  server_peer_t *p = &srv->proc.peers[sink];
  p->srv = srv;
  p->index = sink;
  p->uuid = 0;
  ipc_reader_deinit(&p->reader);
  ipc_reader_init(&p->reader, LX_MAX_CHANNEL + LX_MAX_MESSAGE);
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  conn_opts_t opts = {.timeout_ms = 0,
                      .write_limit = (size_t)64 << 20,
                      .max_queue = (size_t)256 << 20,
                      .internal = true};
  reactor_adopt(lx_lane_reactor(srv->lanes[0]), fd, &srv_peer_proto, p, opts);
}

void server_ipc_worker_exited(int sink, void *arg) {
  lx_server_t *srv = arg;
  pubsub_clear_sink(srv->ps, sink, lx_engine_gone, srv);
}

bool server_ipc_drain(int sink, void *arg) {
  lx_server_t *srv = arg;
  server_peer_t *p = &srv->proc.peers[sink];
  conn_t *c = p->uuid ? reactor_conn_find(lx_lane_reactor(srv->lanes[0]), p->uuid) : NULL;
  char hdr[IPC_HEADER];
  ipc_header(hdr, IPC_DRAIN, 0, 0, 0);
  return c && reactor_conn_write(c, hdr, sizeof(hdr)) == 0;
}

void server_ipc_ready(lx_server_t *srv) {
  if (srv->proc.ipc_fd < 0) return;
  pthread_mutex_lock(&srv->proc.ipc_lock);
  if (link_send(&srv->proc.link, IPC_READY, 0, "", 0, NULL, 0))
    log_error("cannot reach the root process: %s", strerror(errno));
  pthread_mutex_unlock(&srv->proc.ipc_lock);
}

void server_ipc_watchdog(lx_server_t *srv) {
  uint64_t now = reactor_clock_ms();
  for (size_t i = 0; srv->proc.lua_timeout_ms && i < srv->nlanes; i++) {
    lx_lane_t *ln = srv->lanes[i];
    const char *what;
    uint64_t since = lx_lane_busy(ln, &what);
    if (!since || now + 1 - since <= srv->proc.lua_timeout_ms) continue;
    if (srv->proc.stuck_told) return; /* no heartbeat either */
    srv->proc.stuck_told = true;
    char msg[160];
    int n = snprintf(msg, sizeof(msg), "lane %zu has been running %s for "
                     "%.1f s (over --lua-timeout)", i + 1,
                     what ? what : "Lua", (double)(now + 1 - since) / 1000);
    if (srv->proc.ipc_fd < 0) {
      log_error("%s; it serves nothing else until it returns", msg);
      return;
    }
    pthread_mutex_lock(&srv->proc.ipc_lock);
    link_send(&srv->proc.link, IPC_STUCK, 0, "", 0, msg, (size_t)n);
    pthread_mutex_unlock(&srv->proc.ipc_lock);
    return;
  }
  srv->proc.stuck_told = false;
  /* Twice a second on the 250 ms tick, so that the gap the root sees stays
   * well under a --lua-timeout of 1 s even when a tick comes late (once a
   * second, gaps of up to 1.25 s made a healthy worker look hung). */
  if (srv->proc.ipc_fd < 0 || now - srv->proc.beat_sent < 500) return;
  srv->proc.beat_sent = now;
  pthread_mutex_lock(&srv->proc.ipc_lock);
  link_send(&srv->proc.link, IPC_BEAT, 0, "", 0, NULL, 0);
  pthread_mutex_unlock(&srv->proc.ipc_lock);
}

void server_ipc_free_peers(lx_server_t *srv) {
  if (!srv->proc.peers) return;
  for (int i = 0; i < CLUSTER_SINKS(srv->nworkers); i++)
    ipc_reader_deinit(&srv->proc.peers[i].reader);
  free(srv->proc.peers);
  srv->proc.peers = NULL;
}

server_peer_t *server_ipc_new_peers(lx_server_t *srv) {
  srv->proc.peers =
      calloc((size_t)CLUSTER_SINKS(srv->nworkers), sizeof(*srv->proc.peers));
  return srv->proc.peers;
}
