/* SPDX-License-Identifier: MIT */

/* h2: the HTTP/2 framer (RFC 9113) of an HTTP listener, over nghttp2.
 *
 * nghttp2's session does the framing, HPACK, flow control and the
 * protocol's state machine, and has no I/O of its own: the reactor's reads
 * (decrypted first on a TLS connection) are fed to it, and what it has to
 * send goes to the connection's write queue, as OpenSSL's records do, so
 * the queue's batching (io_uring or writev) and back pressure stay as
 * they are. No Lua here: the application gets exchanges (server.h), as
 * from HTTP/1.1.
 *
 * Streams and exchanges: a request stream keeps its head and its body
 * until the application runs it; the exchanges of one connection run one
 * at a time through hc->x, in the order their requests became whole (as
 * HTTP/1.1's pipelined requests do), because an application's handler
 * that waits holds its connection (reactor_conn_hold) and with it the
 * connection's other events. Responses are multiplexed: an exchange
 * that completed keeps sending its body (from its stream's buffer or its
 * file, as its window allows) while the next ones run.
 *
 * Limits (ARCHITECTURE's "Threats and limits"): streams open at once
 * (SETTINGS_MAX_CONCURRENT_STREAMS), a request's header list (max_header,
 * counted as HPACK does: name + value + 32 per field), bodies (max_body
 * each, H2_BODY_BUDGET buffered per connection), nghttp2's own bounds on
 * HPACK tables, CONTINUATION frames, reset streams (Rapid Reset), queued
 * SETTINGS/PING acknowledgements, and the flood bounds below.
 *
 * Threads: the connection's reactor thread, like server.h. */
#include <errno.h>
#include <nghttp2/nghttp2.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "http/h2_int.h"

static void h2__goaway_notice(h2_conn_t *h);
static void h2__body_tell(h2_conn_t *h);
static void h2__schedule(h2_conn_t *h);

static void h2__unqueue(h2_conn_t *h, h2_stream_t *st);

h2_stream_t *h2__stream_new(h2_conn_t *h) {
  h2_stream_t *st = h2_spare_take(h->mem.pool, H2_SPARE_STREAM);
  if (!st) return NULL;
  memset(st, 0, offsetof(h2_stream_t, off));
  st->h = h;
  st->fd = -1;
  return st;
}

/* The stream's header bytes and request struct go back to the lane. */
static void h2__request_free(h2_stream_t *st) {
  h2_pool_t *p = st->h->mem.pool;
  h2_spare_free(p, H2_SPARE_HBUF, st->hb, st->hcap);
  if (st->rq) {
    http_out_reset(&st->rq->out);
    h2_spare_put(p, H2_SPARE_REQ, st->rq);
  }
}

void h2__stream_free(h2_stream_t *st) {
  if (!st) return;
  h2_conn_t *h = st->h;
  if (h->cur == st) h->cur = NULL;
  if (st->queued) h2__unqueue(h, st);
  h->buffered -= st->blen;
  *st->aprev = st->anext;
  if (st->anext) st->anext->aprev = st->aprev;
  h2__request_free(st);
  if (st->fd >= 0) close(st->fd);
  free(st->body);
  h2_spare_free(h->mem.pool, H2_SPARE_OBUF, st->ob, st->ocap);
  h2_spare_put(h->mem.pool, H2_SPARE_STREAM, st);
}

/* The request's parts go (the response keeps only its body). */
static void h2__drop_request(h2_stream_t *st) {
  st->h->buffered -= st->blen;
  h2__request_free(st);
  free(st->body);
  st->hb = st->body = NULL;
  st->rq = NULL;
  st->blen = st->bcap = st->hlen = st->hcap = 0;
}

void h2__enqueue(h2_conn_t *h, h2_stream_t *st) {
  if (st->queued || st->running || st->done) return; /* once */
  st->queued = true;
  st->next = NULL;
  if (h->qtail)
    h->qtail->next = st;
  else
    h->qhead = st;
  h->qtail = st;
  if (!h->in_recv) h2__schedule(h); /* (h2_on_data runs the queue next) */
}

static void h2__unqueue(h2_conn_t *h, h2_stream_t *st) {
  h2_stream_t **pp = &h->qhead, *prev = NULL;
  while (*pp && *pp != st) {
    prev = *pp;
    pp = &(*pp)->next;
  }
  if (!*pp) return;
  *pp = st->next;
  if (h->qtail == st) h->qtail = prev;
  st->queued = false;
}

/* ---- nghttp2's callbacks: what the client sent ---- */

static int h2__on_begin_headers(nghttp2_session *s, const nghttp2_frame *f,
                                void *ud) {
  h2_conn_t *h = ud;
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0;
  h2_stream_t *st = h2__stream_new(h);
  if (!st) return NGHTTP2_ERR_CALLBACK_FAILURE;
  st->id = f->hd.stream_id;
  st->t_start = reactor_now(h->hc->srv->r);
  st->anext = h->all;
  if (h->all) h->all->aprev = &st->anext;
  st->aprev = &h->all;
  h->all = st;
  h->requests++;
  nghttp2_session_set_stream_user_data(s, st->id, st);
  return 0;
}

/* Appends n bytes to the stream's header bytes; their offset, or -1. */
long h2__hput(h2_stream_t *st, const uint8_t *p, size_t n) {
  if (st->hlen + n > st->hcap) {
    size_t cap = st->hcap ? st->hcap : H2_HBUF_FIRST;
    while (cap < st->hlen + n) cap *= 2;
    char *b = h2_spare_realloc(st->h->mem.pool, H2_SPARE_HBUF, st->hb, cap);
    if (!b) return -1;
    st->hb = b;
    st->hcap = cap;
  }
  memcpy(st->hb + st->hlen, p, n);
  st->hlen += n;
  return (long)(st->hlen - n);
}

static int h2__on_header(nghttp2_session *s, const nghttp2_frame *f,
                         const uint8_t *name, size_t nl, const uint8_t *value,
                         size_t vl, uint8_t flags, void *ud) {
  h2_conn_t *h = ud;
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST)
    return 0; /* trailers are skipped, as HTTP/1.1's are */
  h2_stream_t *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
  if (!st || st->refuse) return 0;
  st->hsize += nl + vl + 32; /* as SETTINGS_MAX_HEADER_LIST_SIZE counts */
  if (st->hsize > h->hc->srv->max_header) {
    st->refuse = 431;
    return 0;
  }
  if (nl && name[0] == ':') {
    if (nl == 7 && memcmp(name, ":method", 7) == 0) {
      long o = h2__hput(st, value, vl);
      if (o < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
      st->moff = (uint32_t)o;
      st->mlen = (uint32_t)vl;
    } else if (nl == 5 && memcmp(name, ":path", 5) == 0) {
      long o = h2__hput(st, value, vl);
      if (o < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
      st->toff = (uint32_t)o;
      st->tlen = (uint32_t)vl;
    } else if (nl == 10 && memcmp(name, ":authority", 10) == 0) {
      name = (const uint8_t *)"host"; /* what HTTP/1.1's Host says */
      nl = 4;
    } else {
      return 0; /* :scheme */
    }
    if (nl != 4) return 0;
  }
  if (st->nh == HTTP_MAX_HEADERS) {
    st->refuse = 431;
    return 0;
  }
  long no = h2__hput(st, name, nl), vo = h2__hput(st, value, vl);
  if (no < 0 || vo < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
  uint32_t *e = st->off[st->nh++];
  e[0] = (uint32_t)no;
  e[1] = (uint32_t)nl;
  e[2] = (uint32_t)vo;
  e[3] = (uint32_t)vl;
  (void)flags;
  return 0;
}

/* The head is whole: the request struct is made from what came. False
 * when out of memory. */
bool h2__make_request(h2_conn_t *h, h2_stream_t *st) {
  /* headers[] (3.2 KiB) is read up to nheaders only: the rest of the
   * struct is zeroed, not all of it, for each request */
  st->rq = h2_spare_take(h->mem.pool, H2_SPARE_REQ);
  if (!st->rq) return false;
  http_request_t *r = &st->rq->req;
  memset(r, 0, offsetof(http_request_t, headers));
  memset(&r->content_length, 0,
         sizeof(*st->rq) - offsetof(struct h2_req, req.content_length));
  /* Cookie fields may come split (RFC 9113 8.2.3): one field again, with
   * "; " between, as HTTP/1.1 sends it. */
  int ncookie = 0;
  size_t clen = 0;
  for (int i = 0; i < st->nh; i++)
    if (st->off[i][1] == 6 &&
        memcmp(st->hb + st->off[i][0], "cookie", 6) == 0) {
      ncookie++;
      clen += st->off[i][3] + 2;
    }
  if (ncookie > 1) {
    size_t need = st->hlen + clen;
    if (need > st->hcap) {
      char *b = realloc(st->hb, need);
      if (!b) return false;
      st->hb = b;
      st->hcap = need;
    }
    size_t at = st->hlen, first = SIZE_MAX;
    int w = 0;
    for (int i = 0; i < st->nh; i++) {
      uint32_t *e = st->off[i];
      bool ck = e[1] == 6 && memcmp(st->hb + e[0], "cookie", 6) == 0;
      if (ck) {
        if (st->hlen > at) {
          memcpy(st->hb + st->hlen, "; ", 2);
          st->hlen += 2;
        }
        memcpy(st->hb + st->hlen, st->hb + e[2], e[3]);
        st->hlen += e[3];
        if (first != SIZE_MAX) continue;
        first = (size_t)w;
      }
      memmove(st->off[w++], e, sizeof(st->off[0]));
    }
    st->nh = w;
    st->off[first][2] = (uint32_t)at;
    st->off[first][3] = (uint32_t)(st->hlen - at);
  }
  r->method = st->hb + st->moff;
  r->method_len = st->mlen;
  r->target = st->hb + st->toff;
  r->target_len = st->tlen;
  r->minor = 1;
  r->h2 = true;
  r->keep_alive = true;
  r->content_length = -1;
  r->nheaders = st->nh;
  for (int i = 0; i < st->nh; i++) {
    http_header_t *hd = &r->headers[i];
    hd->name = st->hb + st->off[i][0];
    hd->name_len = st->off[i][1];
    hd->value = st->hb + st->off[i][2];
    hd->value_len = st->off[i][3];
    if (hd->name_len == 14 && memcmp(hd->name, "content-length", 14) == 0) {
      int64_t v = 0;
      for (uint32_t k = 0; k < hd->value_len && v < ((int64_t)1 << 50); k++)
        v = v * 10 + (hd->value[k] - '0'); /* nghttp2 checked its digits */
      r->content_length = v;
    }
  }
  if (!st->mlen || !st->tlen) st->refuse = st->refuse ? st->refuse : 400;
  if (st->mlen == 7 && memcmp(r->method, "CONNECT", 7) == 0)
    st->refuse = st->refuse ? st->refuse : 501;
  if (r->content_length > (int64_t)h->hc->srv->max_body)
    st->refuse = st->refuse ? st->refuse : 413;
  return true;
}

/* Whether r asks for Server-Sent Events (EventSource sends this). */
bool h2__wants_events(const http_request_t *r) {
  const http_header_t *a = http_header(r, "accept");
  if (!a) return false;
  for (uint32_t i = 0; i + 17 <= a->value_len; i++)
    if (memcmp(a->value + i, "text/event-stream", 17) == 0) return true;
  return false;
}

/* Whether r says Expect: 100-continue. */
static bool h2__expects_continue(const http_request_t *r) {
  const http_header_t *e = http_header(r, "expect");
  return e && e->value_len == 12 &&
         strncasecmp(e->value, "100-continue", 12) == 0;
}

static int h2__on_frame_recv(nghttp2_session *s, const nghttp2_frame *f,
                             void *ud) {
  h2_conn_t *h = ud;
  h2_stream_t *st =
      f->hd.stream_id ? nghttp2_session_get_stream_user_data(s, f->hd.stream_id)
                      : NULL;
  bool end = f->hd.flags & NGHTTP2_FLAG_END_STREAM;
  uint64_t now = reactor_now(h->hc->srv->r);
  if (now - h->window_start > 10000) { /* the flood count is per 10 s */
    h->window_start = now;
    h->idle_frames = h->requests = 0;
  }
  switch (f->hd.type) {
  case NGHTTP2_HEADERS:
    if (!st || f->headers.cat != NGHTTP2_HCAT_REQUEST) {
      if (st && end) { /* trailers end the body */
        st->ended = true;
        if (st->running) h->body_news = true;
        h2__enqueue(h, st);
      }
      return 0;
    }
    if (!h2__make_request(h, st)) return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (!end && !st->refuse && h2__expects_continue(&st->rq->req)) {
      /* the body is wanted (a refusal, 413 say, answers instead): a 100
       * HEADERS before it, as HTTP/1.1's 100 Continue (RFC 9113 8.1) */
      static const nghttp2_nv cont[] = {
          {(uint8_t *)":status", (uint8_t *)"100", 7, 3, NGHTTP2_NV_FLAG_NONE}};
      nghttp2_submit_headers(s, NGHTTP2_FLAG_NONE, st->id, NULL, cont, 1, NULL);
    }
    st->ended = end;
    st->streaming = h->hc->srv->stream_body && !st->refuse;
    if (end || st->refuse || st->streaming) h2__enqueue(h, st);
    return 0;
  case NGHTTP2_DATA:
    if (!f->hd.length && !end) h->idle_frames++;
    if (st && end && st->rq) {
      st->ended = true;
      if (st->running) h->body_news = true;
      h2__enqueue(h, st);
    }
    break;
  case NGHTTP2_PING:
    if ((f->hd.flags & NGHTTP2_FLAG_ACK) && h->notice && !h->goaway &&
        memcmp(f->ping.opaque_data, "mpgoaway", 8) == 0) {
      /* a round trip after the notice: the streams the client opened
       * meanwhile have arrived, and the last GOAWAY names them */
      nghttp2_submit_goaway(s, NGHTTP2_FLAG_NONE,
                            nghttp2_session_get_last_proc_stream_id(s),
                            NGHTTP2_NO_ERROR, NULL, 0);
      h->goaway = true;
      break;
    }
    h->idle_frames++;
    break;
  case NGHTTP2_WINDOW_UPDATE: /* a reader's: progress */
  case NGHTTP2_GOAWAY: break;
  default: /* SETTINGS, PING, PRIORITY, RST_STREAM */ h->idle_frames++; break;
  }
  if (h->idle_frames > H2_IDLE_FRAMES + 8 * h->requests) {
    nghttp2_session_terminate_session(s, NGHTTP2_ENHANCE_YOUR_CALM);
    h->goaway = true;
  }
  return 0;
}

/* Appends a DATA frame's bytes to the stream's body buffer (growing it
 * from `first` bytes by doubling) and counts them against the
 * connection's budget. -ENOMEM when the buffer can't grow. */
static int h2__body_append(h2_conn_t *h, h2_stream_t *st, const uint8_t *data,
                           size_t len, size_t first) {
  if (st->blen + len > st->bcap) {
    size_t cap = st->bcap ? st->bcap : first;
    while (cap < st->blen + len) cap *= 2;
    char *b = realloc(st->body, cap);
    if (!b) return -ENOMEM;
    st->body = b;
    st->bcap = cap;
  }
  memcpy(st->body + st->blen, data, len);
  st->blen += len;
  h->buffered += len;
  return 0;
}

static int h2__on_data(nghttp2_session *s, uint8_t flags, int32_t id,
                       const uint8_t *data, size_t len, void *ud) {
  h2_conn_t *h = ud;
  http_server_t *srv = h->hc->srv;
  h2_stream_t *st = nghttp2_session_get_stream_user_data(s, id);
  /* the connection's window is ours to give back at once: the stream's
   * bounds what one stream buffers */
  if (st && (!st->streaming || st->discard))
    nghttp2_session_consume(s, id, len);
  else
    nghttp2_session_consume_connection(s, len);
  if (st && st->discard) {
    /* the answer is out and nobody reads the rest: it goes, as a client
     * expects to send it whole; a body past max_body is cut instead
     * (RST_STREAM NO_ERROR after the whole response, RFC 9113 8.1) */
    st->dropped += len;
    if (st->dropped > srv->max_body && st->end_sent)
      nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, id, NGHTTP2_NO_ERROR);
    return 0;
  }
  if (st && st->streaming && !st->refuse) {
    /* stream_body: the stream's window, opened as the app takes bytes
     * (h2__body_consume), is what it buffers: flow control is the back
     * pressure */
    if (st->boff) {
      memmove(st->body, st->body + st->boff, st->blen - st->boff);
      st->blen -= st->boff;
      h->buffered -= st->boff;
      st->boff = 0;
    }
    if (h2__body_append(h, st, data, len, 16384))
      return NGHTTP2_ERR_CALLBACK_FAILURE;
    if (st->running) h->body_news = true;
    return 0;
  }
  if (!st || st->refuse || st->queued) return 0;
  if (st->blen + len > srv->max_body) {
    st->refuse = 413;
    h2__enqueue(h, st);
    return 0;
  }
  if (h->buffered + len > H2_BODY_BUDGET(srv)) {
    nghttp2_submit_rst_stream(s, NGHTTP2_FLAG_NONE, id, NGHTTP2_REFUSED_STREAM);
    return 0;
  }
  if (h2__body_append(h, st, data, len, 4096))
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  (void)flags;
  return 0;
}

static int h2__on_frame_send(nghttp2_session *s, const nghttp2_frame *f,
                             void *ud) {
  (void)ud;
  if (!(f->hd.flags & NGHTTP2_FLAG_END_STREAM) ||
      (f->hd.type != NGHTTP2_DATA && f->hd.type != NGHTTP2_HEADERS))
    return 0;
  h2_stream_t *st = nghttp2_session_get_stream_user_data(s, f->hd.stream_id);
  if (!st) return 0;
  st->end_sent = true;
  return 0;
}

static int h2__on_stream_close(nghttp2_session *s, int32_t id, uint32_t code,
                               void *ud) {
  h2_conn_t *h = ud;
  h2_stream_t *st = nghttp2_session_get_stream_user_data(s, id);
  (void)code;
  if (!st) return 0;
  nghttp2_session_set_stream_user_data(s, id, NULL);
  st->closed = true;
  if (st->sops) { /* its on_closed runs after nghttp2's callbacks */
    st->dnext = h->dead;
    h->dead = st;
    h2__reap_later(h);
    return 0;
  }
  if (st->running) { /* freed when its exchange completes */
    if (st->streaming && !st->ended) h->body_news = true;
    return 0;
  }
  h2__unqueue(h, st);
  h2__stream_free(st);
  return 0;
}

/* ---- streamed request bodies (stream_body) ---- */

/* The streamed body in hand had news (bytes, its end, a reset): a reader
 * that waits is told, now that nghttp2's callbacks are over. */
static void h2__body_tell(h2_conn_t *h) {
  http_conn_t *hc = h->hc;
  h2_stream_t *st = h->cur;
  if (!h->body_news) return;
  h->body_news = false;
  if (!st || hc->state != HTTP_C_BUSY || !hc->x.streaming) return;
  if (st->closed && !st->ended && !hc->x.body_err) hc->x.body_err = "closed";
  hc->x.body_seen = st->blen; /* (bytes buffered, for the max check) */
  if (hc->x.reading)
    hc->srv->on_body(&hc->x);
  else if (hc->watch)
    hc->watch(hc->c, hc->watch_arg, HTTP_WATCH_BODY);
}

static long h2__body_peek(http_exchange_t *x, const char **p) {
  h2_conn_t *h = x->conn->proto;
  h2_stream_t *st = h->cur;
  if (x->body_err) return HTTP_BODY_ERR;
  if (!st) {
    x->body_err = "closed";
    return HTTP_BODY_ERR;
  }
  size_t n = st->blen - st->boff;
  if (n == 0) {
    if (st->closed && !st->ended) {
      x->body_err = "closed";
      return HTTP_BODY_ERR;
    }
    if (!st->ended) return HTTP_BODY_WAIT;
    x->body_done = true;
    return HTTP_BODY_END;
  }
  *p = st->body + st->boff;
  return (long)n;
}

static void h2__body_consume(http_exchange_t *x, size_t n) {
  h2_conn_t *h = x->conn->proto;
  h2_stream_t *st = h->cur;
  if (!st) return;
  st->boff += n;
  if (st->boff == st->blen) {
    h->buffered -= st->blen;
    st->boff = st->blen = 0;
  }
  x->body_left += n; /* taken so far */
  if (x->body_left > x->conn->srv->max_body) {
    x->body_err = "too large";
    if (!st->closed)
      nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id,
                                NGHTTP2_CANCEL);
  } else if (!st->closed) {
    nghttp2_session_consume_stream(h->s, st->id, n); /* the window opens */
  }
  if (st->ended && st->blen == 0) x->body_done = true;
  h2__flush(h);
}

static bool h2__body_finished(const http_exchange_t *x) {
  const h2_conn_t *h = x->conn->proto;
  const h2_stream_t *st = h->cur;
  return !st || (st->ended && st->blen == st->boff);
}

/* ---- exchanges ---- */

/* Runs the next whole requests, one at a time. */
void h2__run(h2_conn_t *h) {
  http_conn_t *hc = h->hc;
  if (h->in_run) return;
  h->in_run = true;
  while (!h->cur && h->qhead && hc->state == HTTP_C_HEAD) {
    h2_stream_t *st = h->qhead;
    h2__unqueue(h, st);
    if (st->closed) {
      h2__stream_free(st);
      continue;
    }
    if (!st->rq) { /* a refusal before the head was whole */
      nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id,
                                NGHTTP2_REFUSED_STREAM);
      continue;
    }
    h->cur = st;
    st->running = true;
    http_exchange_t *x = &hc->x;
    x->req = &st->rq->req;
    x->out = &st->rq->out;
    x->log_id = st->rq->log_id;
    x->log_id_len = 0;
    x->id = ++hc->srv->exchanges;
    x->version = "2";
    x->keep_alive = true;
    x->streaming = st->streaming;
    x->reading = false;
    x->body_done = st->streaming && st->ended && st->blen == 0;
    x->body_err = NULL;
    x->body_seen = st->blen;
    x->body_left = 0;
    x->log_status = 0;
    x->log_bytes = 0;
    x->t_start = st->t_start;
    hc->state = HTTP_C_BUSY;
    if (st->refuse)
      http_conn_refuse(hc->c, hc, st->refuse);
    else if (st->streaming)
      http_exchange_dispatch(hc, NULL, 0);
    else
      http_exchange_dispatch(hc, st->body ? st->body : "", st->blen);
  }
  h->in_run = false;
  /* idle once a request was served; until then header_timeout holds (a
   * bare preface, SETTINGS or PINGs are not a request) */
  if (!h->cur && hc->state == HTTP_C_HEAD && h->served)
    reactor_conn_set_timeout(hc->c, hc->srv->idle_ms);
  h2__flush(h);
}

static void h2__task(conn_t *c, void *arg) {
  (void)arg;
  if (!c) return;
  http_conn_t *hc = reactor_conn_udata(c);
  if (!hc || hc->framer != &http_framer_h2 || !hc->proto) return;
  h2_conn_t *h = hc->proto;
  h->task = false;
  h2__run(h);
}

/* The queue runs as the connection's next callback (not from inside the
 * application's handler, nor from inside nghttp2's). */
static void h2__schedule(h2_conn_t *h) {
  if (h->task || h->in_run || h->cur) return;
  if (reactor_conn_task(h->hc->c, h2__task, NULL) == 0) h->task = true;
}

void h2__complete(http_exchange_t *x, bool keep_alive) {
  http_conn_t *hc = x->conn;
  h2_conn_t *h = hc->proto;
  h2_stream_t *st = h->cur;
  http_conn_log(hc, x->log_status, x->log_bytes);
  http_out_reset(x->out);
  x->log_id_len = 0;
  x->req = NULL;
  x->out = NULL;
  hc->state = HTTP_C_HEAD;
  h->cur = NULL;
  h->served++;
  if (st) {
    st->running = false;
    st->done = true;
    /* a response that could not end is reset; a body the client is
     * still sending and nobody reads is cancelled once the response is
     * whole (RST_STREAM NO_ERROR, RFC 9113 8.1) */
    if (!st->closed && (!st->submitted || (!keep_alive && !st->olast)))
      nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id,
                                NGHTTP2_INTERNAL_ERROR);
    else if (!st->closed && !st->ended) {
      st->discard = true; /* h2__on_data drops the rest, up to max_body */
      if (st->streaming && st->blen > st->boff) /* the window reopens */
        nghttp2_session_consume_stream(h->s, st->id, st->blen - st->boff);
    }
    h2__drop_request(st);
    if (st->closed) h2__stream_free(st);
  }
  if (reactor_draining(hc->srv->r)) h2__goaway_notice(h);
  if (!h->in_run) {
    h2__flush(h);
    h2__schedule(h);
    if (!h->qhead) reactor_conn_set_timeout(hc->c, hc->srv->idle_ms);
  }
}

int http_exchange_h1_required(http_exchange_t *x) {
  http_conn_t *hc = x->conn;
  h2_conn_t *h = hc->framer == &http_framer_h2 ? hc->proto : NULL;
  h2_stream_t *st = h ? h->cur : NULL;
  if (!st) return -EINVAL;
  if (!st->closed && !st->submitted)
    nghttp2_submit_rst_stream(h->s, NGHTTP2_FLAG_NONE, st->id,
                              NGHTTP2_HTTP_1_1_REQUIRED);
  st->submitted = true;
  x->log_status = 0;
  h2__complete(x, true);
  return 0;
}

static void h2__refuse(http_conn_t *hc, int status) {
  h2_conn_t *h = hc->proto;
  http_exchange_t *x = &hc->x;
  if (!h->cur || hc->state != HTTP_C_BUSY || h->refusing ||
      (x->out && x->out->head_sent)) {
    if (h->cur && hc->state == HTTP_C_BUSY) {
      h2__complete(x, false); /* the stream is reset */
      return;
    }
    nghttp2_session_terminate_session(h->s, NGHTTP2_INTERNAL_ERROR);
    h2__flush(h);
    hc->state = HTTP_C_CLOSING;
    reactor_conn_close(hc->c, CONN_LOCAL);
    return;
  }
  h->refusing = true;
  http_head_t hd = http_exchange_head(x, status);
  const http_page_t *page = http_conn_page(hc, status);
  char type[128], text[64];
  size_t n;
  const char *body;
  if (page) {
    hd.hlen = (size_t)snprintf(type, sizeof(type), "Content-Type: %s\r\n",
                               page->type);
    hd.headers = type;
    hd.has_type = true;
    body = page->body;
    n = page->len;
  } else {
    n = (size_t)snprintf(text, sizeof(text), "%s\n", http_reason(status));
    body = text;
  }
  http_res_send(x, &hd, body, n, NULL, NULL, NULL);
  h->refusing = false;
}

/* ---- the connection ---- */

static ssize_t h2__send_cb(nghttp2_session *s, const uint8_t *d, size_t n,
                           int flags, void *ud) {
  (void)s;
  (void)d;
  (void)n;
  (void)flags;
  (void)ud;
  return NGHTTP2_ERR_CALLBACK_FAILURE; /* mem_send only */
}

/* Hands nghttp2's frames to the write queue, up to H2_SEND_BUDGET queued
 * (on_ready asks again); closes a connection nghttp2 is done with.
 *
 * nghttp2_session_mem_send hands out one frame at a time, and the
 * smallest response is two (HEADERS, DATA). Written one by one, each
 * frame was a TLS record of its own (an SSL_write costs about 7,600
 * instructions whatever its size) and, without io_uring, a system call
 * of its own. So frames are gathered (copied: mem_send's buffer is
 * reused by the next call) and go to the queue as one write of at most
 * H2_GATHER bytes: one record for a small response, or for all the
 * answers of one read. A frame too big to gather goes as it is, after
 * what was gathered. The buffer is on the stack: a write may run
 * another connection's flush (a close's callbacks), never this one's
 * (h->flushing). */
void h2__flush(h2_conn_t *h) {
  if (h->flushing || h->in_recv || !h->s) return;
  h2_mem_wake(&h->mem);
  conn_t *c = h->hc->c;
  uint8_t gather[H2_GATHER];
  size_t got = 0;
  h->flushing = true;
  /* A mem_send with nothing to send costs about 300 instructions, and a
   * request's read and its run each ended with one: want_write (a few
   * pointer tests) asks first. After a frame it says yes until the call
   * that returns 0, which finishes that frame's bookkeeping. */
  while (nghttp2_session_want_write(h->s) &&
         reactor_conn_pending(c) + got < H2_SEND_BUDGET) {
    const uint8_t *p;
    ssize_t n = nghttp2_session_mem_send(h->s, &p);
    if (n < 0) {
      h->flushing = false;
      h->hc->state = HTTP_C_CLOSING;
      reactor_conn_close(c, CONN_ERROR);
      return;
    }
    if (n == 0) break;
    if (got + (size_t)n <= H2_GATHER) {
      memcpy(gather + got, p, (size_t)n);
      got += (size_t)n;
      continue;
    }
    if (got && reactor_conn_write(c, gather, got)) { /* it closes */
      got = 0;
      break;
    }
    got = 0;
    if ((size_t)n < H2_GATHER) {
      memcpy(gather, p, (size_t)n);
      got = (size_t)n;
    } else if (reactor_conn_write(c, p, (size_t)n)) {
      break;
    }
  }
  if (got) (void)reactor_conn_write(c, gather, got); /* (a failure closes) */
  h->flushing = false;
  h2_mem_touch(&h->mem); /* (after a read too: every read ends here) */
  h2_stream_t *cur = h->cur;
  if (cur && cur->want_ready && cur->olen - cur->ooff <= H2_STREAM_LOW &&
      h->hc->watch && h->hc->state == HTTP_C_BUSY) {
    cur->want_ready = false; /* the stream drained: the proxy goes on */
    h->hc->watch(c, h->hc->watch_arg, HTTP_WATCH_READY);
    if (h->hc->state == HTTP_C_CLOSING || !h->s) return;
  }
  bool done =
      !nghttp2_session_want_read(h->s) && !nghttp2_session_want_write(h->s);
  if (h->goaway && !h->cur && !h->qhead && !nghttp2_session_want_write(h->s) &&
      !h->all)
    done = true;
  if (done && h->hc->state != HTTP_C_CLOSING && !h->cur) {
    h->hc->state = HTTP_C_CLOSING;
    reactor_conn_close(c, CONN_LOCAL);
  }
}

/* The callbacks, made once for every thread (read only after that; a
 * global, so that they stay reachable to the end). */
static nghttp2_session_callbacks *h2_cbs;
static pthread_once_t h2_cbs_once = PTHREAD_ONCE_INIT;

static void h2__callbacks_make(void) {
  nghttp2_session_callbacks *cbs;
  if (nghttp2_session_callbacks_new(&cbs)) return;
  nghttp2_session_callbacks_set_send_callback(cbs, h2__send_cb);
  nghttp2_session_callbacks_set_on_begin_headers_callback(cbs,
                                                          h2__on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(cbs, h2__on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cbs, h2__on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cbs, h2__on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cbs,
                                                         h2__on_stream_close);
  nghttp2_session_callbacks_set_on_frame_send_callback(cbs, h2__on_frame_send);
  h2_cbs = cbs;
}

static nghttp2_session_callbacks *h2__callbacks(void) {
  pthread_once(&h2_cbs_once, h2__callbacks_make);
  return h2_cbs;
}

/* Whether the session behind m has nothing to send and is in no call of
 * nghttp2's: its frame buffer holds nothing it needs (h2_mem.c). */
bool h2__quiet(h2_mem_t *m) {
  h2_conn_t *h = (h2_conn_t *)(void *)((char *)m - offsetof(h2_conn_t, mem));
  return h->s && !h->in_recv && !h->flushing &&
         nghttp2_session_want_read(h->s) && !nghttp2_session_want_write(h->s);
}

/* The thread's pool of pages for sessions, made on first use (NULL: none,
 * the session's blocks come from malloc). */
static h2_pool_t *h2__pool(http_server_t *srv) {
  h2_pool_t **pp = srv->h2_pool;
  if (pp && !*pp) *pp = h2_pool_new(srv->r);
  return pp ? *pp : NULL;
}

/* Makes hc's HTTP/2 state and sends the server's SETTINGS. False when
 * out of memory. */
bool h2__init(http_conn_t *hc) {
  http_server_t *srv = hc->srv;
  h2_conn_t *h = calloc(1, sizeof(*h));
  nghttp2_session_callbacks *cbs = h2__callbacks();
  nghttp2_option *opt = NULL;
  if (!h || !cbs || nghttp2_option_new(&opt)) {
    free(h);
    return false;
  }
  h->hc = hc;
  h2_mem_init(&h->mem, h2__pool(srv));
  /* the connection's window comes back as bytes arrive, a stream's too
   * (h2__on_data): bodies are bounded by max_body, not by windows */
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
  nghttp2_option_set_max_outbound_ack(opt, 1000);
  nghttp2_option_set_max_settings(opt, 32);
  nghttp2_option_set_max_continuations(opt, 8);
  /* no priority tree of closed streams: idle connections hold less */
  nghttp2_option_set_no_closed_streams(opt, 1);
  /* Rapid Reset (CVE-2023-44487): 1000 resets at once, then 33 a second */
  nghttp2_option_set_stream_reset_rate_limit(opt, 1000, 33);
  h->mem.making = true;
  int rv = nghttp2_session_server_new3(&h->s, cbs, h, opt, &h->mem.mem);
  h->mem.making = false;
  nghttp2_option_del(opt);
  if (rv) {
    h2_mem_deinit(&h->mem);
    free(h);
    return false;
  }
  uint32_t streams = srv->h2_max_streams ? srv->h2_max_streams : 100;
  nghttp2_settings_entry iv[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, streams},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 256u << 10},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, (uint32_t)srv->max_header},
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
  };
  nghttp2_submit_settings(h->s, NGHTTP2_FLAG_NONE, iv,
                          sizeof(iv) / sizeof(iv[0]));
  /* the connection's window: room for a body budget's worth */
  nghttp2_session_set_local_window_size(h->s, NGHTTP2_FLAG_NONE, 0, 4 << 20);
  hc->proto = h;
  hc->framer = &http_framer_h2;
  return true;
}

static void h2_on_data(conn_t *c, const char *data, size_t len);

static http_conn_t *h2_open(http_server_t *srv, conn_t *c) {
  size_t size = srv->conn_size > sizeof(http_conn_t) ? srv->conn_size
                                                     : sizeof(http_conn_t);
  http_conn_t *hc = calloc(1, size);
  if (!hc || (hc->srv = srv, hc->c = c, !h2__init(hc))) {
    free(hc);
    reactor_conn_force_close(c, CONN_ERROR);
    return NULL;
  }
  hc->x.conn = hc;
  hc->uuid = reactor_conn_uuid(c);
  reactor_conn_set_udata(c, hc);
  reactor_conn_set_timeout(c, srv->header_timeout_ms);
  h2__flush(hc->proto);
  return hc;
}

void http_h2_take(http_conn_t *hc, const char *data, size_t len) {
  if (!h2__init(hc)) {
    hc->state = HTTP_C_CLOSING;
    reactor_conn_force_close(hc->c, CONN_ERROR);
    return;
  }
  reactor_conn_set_timeout(hc->c, hc->srv->header_timeout_ms);
  h2_on_data(hc->c, data, len);
}

static void h2_on_data(conn_t *c, const char *data, size_t len) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (!hc || hc->state == HTTP_C_CLOSING) return;
  h2_conn_t *h = hc->proto;
  h2_mem_wake(&h->mem);
  h->in_recv = true;
  ssize_t n = nghttp2_session_mem_recv(h->s, (const uint8_t *)data, len);
  h->in_recv = false;
  if (n < 0) {
    /* nghttp2 queues a GOAWAY for a protocol error, but not for its
     * fatal ones (too many CONTINUATIONs, a flood, a bad preface): one
     * goes out then too (a no-op when one is queued), then the close */
    nghttp2_session_terminate_session(h->s,
                                      n == NGHTTP2_ERR_TOO_MANY_CONTINUATIONS ||
                                              n == NGHTTP2_ERR_FLOODED
                                          ? NGHTTP2_ENHANCE_YOUR_CALM
                                          : NGHTTP2_PROTOCOL_ERROR);
    h2__flush(h);
    hc->state = HTTP_C_CLOSING;
    reactor_conn_close(c, CONN_LOCAL);
    return;
  }
  /* in the connection's own callback (not a handler's): the requests that
   * became whole run now, as HTTP/1.1's do from its read, and the run's
   * flush sends what the read queued too (a first request's SETTINGS ack
   * goes with its answer: one write) */
  bool run = !h->cur && hc->state == HTTP_C_HEAD && !h->task && !h->in_run;
  if (!run) h2__flush(h);
  h2__body_tell(h);
  if (run) h2__run(h);
}

static void h2_on_timeout(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  h2_conn_t *h = hc ? hc->proto : NULL;
  if (hc && hc->x.reading && h && h->cur) {
    hc->x.body_err = "timeout"; /* the body stopped coming */
    hc->srv->on_body(&hc->x);
    return;
  }
  if (h && !h->goaway && !h->cur && h2__events_idle(h)) {
    reactor_conn_set_timeout(c, reactor_conn_timeout(c));
    h2__flush(h);
    return;
  }
  if (h && !h->goaway) {
    nghttp2_submit_goaway(h->s, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h->s),
                          NGHTTP2_NO_ERROR, NULL, 0);
    h->goaway = true;
    h2__flush(h);
  }
  if (hc) hc->state = HTTP_C_CLOSING;
  /* a client that never opened its window gets no more than that */
  reactor_conn_force_close(c, CONN_TIMEOUT);
}

static void h2_on_ready(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  if (!hc || !hc->proto || hc->state == HTTP_C_CLOSING) return;
  h2__flush(hc->proto);
  /* the queue drained: a watcher of the exchange in hand (the proxy)
   * may go on, as over HTTP/1.1 */
  h2_conn_t *h = hc->proto;
  if (hc->watch && hc->state == HTTP_C_BUSY &&
      !(h->cur && h->cur->olen - h->cur->ooff > H2_STREAM_HIGH))
    hc->watch(c, hc->watch_arg, HTTP_WATCH_READY);
}

/* The graceful GOAWAY of RFC 9113 6.8, in two steps: a GOAWAY that names
 * no last stream (nghttp2_submit_shutdown_notice) and a PING; at its ack
 * the GOAWAY with the last stream processed (h2__on_frame_recv). Streams
 * the client opened before it saw the first are served, none is lost,
 * and the connection closes once the last stream has ended. */
static void h2__goaway_notice(h2_conn_t *h) {
  if (h->notice || h->goaway) return;
  h->notice = true;
  if (nghttp2_submit_shutdown_notice(h->s) ||
      nghttp2_submit_ping(h->s, NGHTTP2_FLAG_NONE,
                          (const uint8_t *)"mpgoaway")) {
    nghttp2_submit_goaway(h->s, NGHTTP2_FLAG_NONE,
                          nghttp2_session_get_last_proc_stream_id(h->s),
                          NGHTTP2_NO_ERROR, NULL, 0);
    h->goaway = true;
  }
}

/* Graceful GOAWAY: streams in flight finish, the client opens new ones on
 * a new connection. */
static void h2_on_shutdown(conn_t *c) {
  http_conn_t *hc = reactor_conn_udata(c);
  h2_conn_t *h = hc ? hc->proto : NULL;
  if (!h) {
    reactor_conn_close(c, CONN_SHUTDOWN);
    return;
  }
  /* event streams end (EventSource reconnects, to the new code) */
  for (h2_stream_t *st = h->all; st; st = st->anext)
    if (st->sops && !st->closed) h2__stream_end(st);
  h2__goaway_notice(h);
  h2__flush(h);
}

static void h2_closed(conn_t *c, http_conn_t *hc, int reason) {
  /* a watcher (the proxy) hears of it last, before hc goes */
  if (hc && hc->watch) hc->watch(c, hc->watch_arg, HTTP_WATCH_CLOSED);
  reactor_conn_set_udata(c, NULL);
  if (!hc) return;
  h2_conn_t *h = hc->proto;
  if (h) {
    hc->state = HTTP_C_CLOSING;
    nghttp2_session *s = h->s;
    h->s = NULL;
    h->cur = NULL;
    /* nghttp2_session_del calls no close callback: the streams go here,
     * event streams telling their owner first */
    h->dead = NULL;
    h->reaping = true;
    for (h2_stream_t *st = h->all; st; st = st->anext)
      if (st->sops) st->sops->on_closed(c, st->sctx, reason);
    while (h->all) h2__stream_free(h->all);
    h2_mem_wake(&h->mem); /* (nghttp2 frees the HPACK entries) */
    nghttp2_session_del(s);
    h2_mem_deinit(&h->mem);
    free(h);
  }
  hc->proto = NULL;
  free(hc);
}

const http_framer_t http_framer_h2 = {
    .alpn = "h2",
    .open = h2_open,
    .on_data = h2_on_data,
    .on_timeout = h2_on_timeout,
    .on_ready = h2_on_ready,
    .on_shutdown = h2_on_shutdown,
    .closed = h2_closed,
    .out = h2__out,
    .out_file = h2__out_file,
    .complete = h2__complete,
    .refuse = h2__refuse,
    .body_peek = h2__body_peek,
    .body_consume = h2__body_consume,
    .body_finished = h2__body_finished,
    .stat_reqs = STAT_HTTP_H2_REQS,
    .stat_body = STAT_HTTP_H2_BODY,
};
