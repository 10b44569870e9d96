/* SPDX-License-Identifier: MIT */

/* lx_engine: the Redis pub/sub engine's place in a server. It lives on one
 * reactor (the root lane's, or lane 1's in a one-process server); lanes
 * and IPC reach it with posted operations, in the order of the counts that
 * caused them. */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "lx/lx_engine.h"
#include "lx/lx_lane.h"
#include "lx/lx_server.h"
#include "redis/redis.h"

/* A table published through Redis travels as this tag and its JSON, so
 * that it arrives as a table; any other message is bytes as they are. */
#define LX_JSON_TAG "\0mp-json\0"
#define LX_JSON_TAG_LEN 9

enum { LX_SUB, LX_UNSUB, LX_PUB };

typedef struct {
  lx_server_t *srv;
  int op;
  bool pattern;
  size_t clen, mlen;
  char data[]; /* channel, then message */
} lx_eop_t;

static void lx__eop_run(void *a, void *b) {
  lx_eop_t *o = a;
  redis_engine_t *e = o->srv->engine;
  if (e && o->op == LX_SUB)
    redis_engine_subscribe(e, o->data, o->clen, o->pattern);
  else if (e && o->op == LX_UNSUB)
    redis_engine_unsubscribe(e, o->data, o->clen, o->pattern);
  else if (e)
    redis_engine_publish(e, o->data, o->clen, o->data + o->clen, o->mlen);
  if (o->op == LX_PUB)
    atomic_fetch_sub_explicit(&o->srv->engine_posted, o->clen + o->mlen,
                              memory_order_relaxed);
  free(o);
}

static void lx__post(lx_server_t *srv, int op, bool pattern, const char *ch,
                     size_t clen, const char *msg, size_t mlen, bool json) {
  size_t tag = json ? LX_JSON_TAG_LEN : 0;
  lx_eop_t *o = malloc(sizeof(*o) + clen + tag + mlen);
  if (!o) {
    log_error("redis: out of memory; a %s is lost",
              op == LX_PUB ? "message" : "subscription change");
    return;
  }
  *o = (lx_eop_t){srv, op, pattern, clen, tag + mlen};
  memcpy(o->data, ch, clen);
  memcpy(o->data + clen, LX_JSON_TAG, tag);
  if (mlen) memcpy(o->data + clen + tag, msg, mlen);
  if (op == LX_PUB)
    atomic_fetch_add_explicit(&srv->engine_posted, clen + tag + mlen,
                              memory_order_relaxed);
  if (reactor_post(srv->engine_r, lx__eop_run, o, NULL)) {
    log_error("redis: out of memory; a %s is lost",
              op == LX_PUB ? "message" : "subscription change");
    if (op == LX_PUB)
      atomic_fetch_sub_explicit(&srv->engine_posted, clen + tag + mlen,
                                memory_order_relaxed);
    free(o);
  }
}

void lx_engine_count(lx_server_t *srv, const char *ch, size_t len,
                     bool pattern, bool add) {
  if (srv->engine_r) lx__post(srv, add ? LX_SUB : LX_UNSUB, pattern, ch, len,
                              NULL, 0, false);
}

void lx_engine_gone(const char *ch, size_t len, bool pattern, void *srv) {
  lx_engine_count(srv, ch, len, pattern, false);
}

int lx_engine_publish(lx_server_t *srv, const char *ch, size_t clen,
                      const char *msg, size_t mlen, bool json) {
  /* A hint, not a reservation: publishers on several lanes may pass it
   * together by a message each, which the engine's own queue bound then
   * covers. */
  size_t held =
      atomic_load_explicit(&srv->engine_posted, memory_order_relaxed) +
      atomic_load_explicit(&srv->engine_held, memory_order_relaxed);
  if (held + clen + mlen > LX_ENGINE_BACKLOG_MAX) return -ENOBUFS;
  lx__post(srv, LX_PUB, false, ch, clen, msg, mlen, json);
  return 0;
}

/* A message from Redis, for the subscribers of its channel (pat NULL) or
 * of pattern pat: to every sink of this process that has some. */
static void lx__engine_msg(const char *ch, size_t clen, const char *msg,
                           size_t mlen, const char *pat, size_t plen,
                           void *arg) {
  lx_server_t *srv = arg;
  uint32_t flags = pat ? PUBSUB_PATTERN : PUBSUB_EXACT;
  if (mlen >= LX_JSON_TAG_LEN && memcmp(msg, LX_JSON_TAG, LX_JSON_TAG_LEN) == 0) {
    flags |= PUBSUB_JSON;
    msg += LX_JSON_TAG_LEN;
    mlen -= LX_JSON_TAG_LEN;
  }
  if (clen > LX_MAX_CHANNEL || mlen > LX_MAX_MESSAGE) {
    log_error("redis: refused a message of %zu bytes on a channel of %zu "
              "bytes (the limits are %d and %d)", mlen, clen, LX_MAX_MESSAGE,
              LX_MAX_CHANNEL);
  } else {
    pubsub_msg_t *m = pubsub_msg_new_for(ch, clen, msg, mlen, pat, plen, flags);
    if (m) {
      pubsub_publish(srv->ps, m, -1, -1);
      pubsub_msg_unref(m);
    } else {
      log_error("redis: out of memory; a message is lost");
    }
  }
}

static void lx__engine_each(void (*add)(const char *, size_t, bool, void *),
                            void *add_arg, void *arg) {
  lx_server_t *srv = arg;
  pubsub_each(srv->ps, add, add_arg);
}

int lx_engine_start(lx_server_t *srv, reactor_t *r) {
  srv->engine_started = true;
  if (!srv->redis_url) return 0;
  redis_url_t u;
  char err[512];
  if (redis_url_parse(srv->redis_url, &u, err, sizeof(err))) {
    log_error("--redis: %s", err);
    return -1;
  }
  if (u.tls) { /* rediss: a CA or key file that doesn't load stops here */
    net_tls_ctx_t *t = redis_url_tls(&u, err, sizeof(err));
    if (!t) {
      log_error("--redis: %s", err);
      return -1;
    }
    net_tls_ctx_unref(t);
  }
  srv->engine_r = r;
  srv->engine = redis_engine_new(r, &u, lx__engine_msg, lx__engine_each, srv);
  if (!srv->engine) {
    log_error("redis: out of memory");
    srv->engine_r = NULL;
    return -1;
  }
  redis_engine_set_gauge(srv->engine, &srv->engine_held);
  char where[300];
  log_info("pub/sub through Redis at %s%s",
           redis_url_where(&u, where, sizeof(where)), u.tls ? " (TLS)" : "");
  return 0;
}

void lx_engine_stop(lx_server_t *srv) {
  redis_engine_t *e = srv->engine;
  srv->engine = NULL;
  redis_engine_free(e);
  free(srv->redis_url_own);
  srv->redis_url_own = NULL;
  srv->redis_url = NULL;
}

void lx_engine_after_fork(lx_server_t *srv) {
  if (srv->engine) redis_engine_close_fds(srv->engine);
  srv->engine = NULL; /* the root's: a worker neither uses nor frees it */
  srv->engine_r = NULL;
}
