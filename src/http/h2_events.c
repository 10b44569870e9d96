/* SPDX-License-Identifier: MIT */

/* h2_events: event streams over HTTP/2 (h2_stream.h). An exchange that
 * opens one sends its head and completes at once, so the connection's
 * next streams run; the stream then takes the application's writes into
 * its own buffer (bounded by the listener's max_queue: past it only that
 * stream is reset), keeps an idle one alive with comments and resets a
 * stalled one, and its on_closed runs as the connection's next callback
 * once the client or the server ends it. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "http/h2_int.h"

/* ---- event streams (h2_stream.h) ---- */

bool http_h2_exchange_congested(const http_exchange_t *x) {
  http_conn_t *hc = x->conn;
  h2_conn_t *h = hc->framer == &http_framer_h2 ? hc->proto : NULL;
  h2_stream_t *st = h ? h->cur : NULL;
  if (!st || st->olen - st->ooff <= H2_STREAM_HIGH) return false;
  st->want_ready = true;
  return true;
}

/* Stream sid of c if it is an open event stream of ops (NULL ops: any). */
static h2_stream_t *h2__event_stream(conn_t *c, int32_t sid,
                                     const http_stream_ops_t *ops) {
  http_conn_t *hc = c ? reactor_conn_udata(c) : NULL;
  if (!hc || hc->framer != &http_framer_h2 || !hc->proto || sid <= 0)
    return NULL;
  h2_conn_t *h = hc->proto;
  if (!h->s) return NULL;
  h2_stream_t *st = nghttp2_session_get_stream_user_data(h->s, sid);
  if (!st || !st->sops || st->closed || (ops && st->sops != ops)) return NULL;
  return st;
}

int32_t http_h2_stream_open(http_exchange_t *x, const http_head_t *hd,
                            const http_stream_ops_t *ops, void *ctx) {
  http_conn_t *hc = x->conn;
  h2_conn_t *h = hc->framer == &http_framer_h2 ? hc->proto : NULL;
  h2_stream_t *st = h ? h->cur : NULL;
  if (!st) return -EPROTONOSUPPORT;
  if (st->closed || st->submitted) return -EPIPE;
  static const char fixed[] = "Content-Type: text/event-stream\r\n"
                              "Cache-Control: no-cache\r\n";
  size_t fl = sizeof(fixed) - 1;
  char *lines = malloc(fl + hd->hlen);
  if (!lines) return -ENOMEM;
  memcpy(lines, fixed, fl);
  if (hd->hlen) memcpy(lines + fl, hd->headers, hd->hlen);
  http_out_t *o = x->out;
  http_out_reset(o);
  o->h = *hd;
  o->h.headers = lines;
  o->h.hlen = fl + hd->hlen;
  o->h.has_type = true;
  o->len = -1;
  int rc = h2__submit_head(h, st, o, false);
  free(lines);
  if (rc) return rc;
  st->sops = ops;
  st->sctx = ctx;
  int32_t id = st->id;
  x->log_status = hd->status;
  x->log_bytes = 0;
  h2__complete(x, true); /* the connection's next streams run */
  return id;
}

void *http_h2_stream_of(conn_t *c, int32_t sid, const http_stream_ops_t *ops) {
  h2_stream_t *st = h2__event_stream(c, sid, ops);
  return st ? st->sctx : NULL;
}

int http_h2_stream_write(conn_t *c, int32_t sid, const char *p, size_t n) {
  h2_stream_t *st = h2__event_stream(c, sid, NULL);
  if (!st || st->olast) return -EPIPE;
  h2_conn_t *h = st->h;
  int rc = h2__obuf_put(st, p, n, reactor_conn_max_queue(c));
  if (rc == -ENOBUFS || rc == -ENOMEM) {
    /* a reader this far behind gets a cut, not a gap; the others go on */
    nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, sid, NGHTTP2_CANCEL);
  } else if (st->deferred && nghttp2_session_resume_data(h->s, sid) == 0) {
    st->deferred = false;
  }
  h2__flush(h);
  return rc;
}

size_t http_h2_stream_buffered(conn_t *c, int32_t sid) {
  h2_stream_t *st = h2__event_stream(c, sid, NULL);
  return st ? st->olen - st->ooff : 0;
}

/* Ends st after what it buffered. */
void h2__stream_end(h2_stream_t *st) {
  if (st->olast) return;
  st->olast = true;
  if (st->deferred && nghttp2_session_resume_data(st->h->s, st->id) == 0)
    st->deferred = false;
}

void http_h2_stream_end(conn_t *c, int32_t sid) {
  h2_stream_t *st = h2__event_stream(c, sid, NULL);
  if (!st) return;
  h2__stream_end(st);
  h2__flush(st->h);
}

/* The closed event streams hear of it (on_closed) and go. */
static void h2__reap(h2_conn_t *h) {
  if (h->reaping) return;
  h->reaping = true;
  while (h->dead) {
    h2_stream_t *st = h->dead;
    h->dead = st->dnext;
    st->sops->on_closed(h->hc->c, st->sctx, CONN_PEER);
    h2__stream_free(st);
  }
  h->reaping = false;
}

static void h2__reap_task(conn_t *c, void *arg) {
  (void)arg;
  http_conn_t *hc = c ? reactor_conn_udata(c) : NULL;
  if (!hc || hc->framer != &http_framer_h2 || !hc->proto) return;
  h2_conn_t *h = hc->proto;
  h->reap_task = false;
  h2__reap(h);
  h2__flush(h);
}

/* on_closed runs as the connection's next callback: not from inside
 * nghttp2, nor from inside the write of an application's handler. */
void h2__reap_later(h2_conn_t *h) {
  if (h->reap_task) return;
  if (reactor_conn_task(h->hc->c, h2__reap_task, NULL) == 0)
    h->reap_task = true;
}

/* At an idle timeout: an event stream with nothing buffered gets a
 * comment (keeps proxies from timing it out), one whose bytes did not
 * move since the last timeout is reset. Whether one is left open. */
bool h2__events_idle(h2_conn_t *h) {
  bool open = false;
  for (h2_stream_t *st = h->all; st; st = st->anext) {
    if (!st->sops || st->closed || st->olast) continue;
    if (st->olen > st->ooff) {
      if (st->stalled) {
        nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id,
                                  NGHTTP2_CANCEL);
        continue;
      }
      st->stalled = true;
    } else if (h2__obuf_put(st, ":\n\n", 3, 3) == 0 && st->deferred &&
               nghttp2_session_resume_data(h->s, st->id) == 0) {
      st->deferred = false;
    }
    open = true;
  }
  return open;
}
