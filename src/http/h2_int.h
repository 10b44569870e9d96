/* SPDX-License-Identifier: MIT */

/* h2_int: what the files of the HTTP/2 framer share and nothing else
 * sees: a connection's and a stream's state, the framer's bounds, and
 * the internal functions (h2__*) each file offers the others. h2.c holds
 * the session and the exchanges, h2_response.c frames responses,
 * h2_events.c the event streams (h2_stream.h), h2_upgrade.c HTTP/1.1's
 * Upgrade to h2c. Everything here belongs to the connection's reactor
 * thread. */
#ifndef MP_HTTP_H2_INT_H
#define MP_HTTP_H2_INT_H

#include <nghttp2/nghttp2.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "http/h2_stream.h"
#include "http/select.h"
#include "http/server.h"

/* Bytes of frames queued for the socket past which nghttp2 is asked for
 * no more until the queue drained (on_ready). */
#define H2_SEND_BUDGET (256u << 10)
/* Bytes of small frames h2__flush gathers into one write: the largest
 * write the reactor puts on the io_uring batch (the batch's limit, 16
 * KiB, in net/uring.h). A bigger frame (a full DATA frame) goes alone,
 * uncopied. */
#define H2_GATHER ((size_t)16 << 10)
/* Request body bytes a connection buffers for its streams at most (each
 * is also under max_body); a stream past it is refused (REFUSED_STREAM,
 * which a client may retry). */
#define H2_BODY_BUDGET(srv) ((srv)->max_body + (4u << 20))
/* Frames that make no progress (empty DATA, PRIORITY, unknown types,
 * SETTINGS, PING, WINDOW_UPDATE, RST_STREAM) a connection may send per
 * request it makes, plus this many, before it is told GOAWAY
 * (ENHANCE_YOUR_CALM). */
#define H2_IDLE_FRAMES 1000
/* Bytes of response body a stream buffers at most for a client that
 * does not open its window; past it, writes fail (-ENOBUFS). */
#define H2_OUT_MAX ((size_t)16 << 20)

/* A response body a stream buffers past which its exchange says it is
 * congested (http_h2_exchange_congested), and below which a watcher that
 * was told so hears HTTP_WATCH_READY. */
#define H2_STREAM_HIGH ((size_t)512 << 10)
#define H2_STREAM_LOW ((size_t)128 << 10)
/* An event stream keeps its drained buffer up to this size (freed past
 * it): a burst doesn't stay allocated for the stream's life. */
#define H2_EVENT_KEEP ((size_t)64 << 10)

typedef struct h2_conn h2_conn_t;

/* ---- the session's memory (h2_mem.c) ---- */

/* A lane's slots of whole pages, for the big blocks of its sessions. */
typedef struct h2_pool h2_pool_t;

/* A block of a session's slot: kept (given back when it reads as zeros:
 * the stream map's table), the frame buffer (given back when the session
 * has nothing to send), an HPACK ring (its entries copied aside, then
 * given back: h2_mem.c), or freed by nghttp2. */
enum { H2_BLOCK_KEEP, H2_BLOCK_FRAMES, H2_BLOCK_RING, H2_BLOCK_DEAD };
#define H2_MEM_BLOCKS 6
typedef struct {
  uint32_t off, len;
  uint8_t kind;
} h2_block_t;

/* A session's allocator (nghttp2_mem, mem_user_data: itself). */
typedef struct h2_mem {
  nghttp2_mem mem;
  h2_pool_t *pool; /* NULL: malloc alone */
  char *slot;      /* the pool's, or NULL */
  size_t used;     /* bytes of the slot handed out, in whole pages */
  h2_block_t blocks[H2_MEM_BLOCKS];
  int nblocks;
  bool making; /* nghttp2 makes the session: big blocks go to the slot */
  bool warm;   /* its pages may be resident: in the pool's list */
  bool active; /* touched since the last sweep */
  int nrings;  /* HPACK rings in the slot's first page */
  void *rings; /* their entries while their page is given back, or NULL */
  struct h2_mem *wnext, **wprev;
} h2_mem_t;

/* A request stream: its request until the exchange completes, then its
 * response's unsent body. */
typedef struct h2_stream {
  struct h2_stream *next;           /* in the ready queue */
  struct h2_stream *anext, **aprev; /* in the connection's list */
  h2_conn_t *h;
  int32_t id;
  bool queued, running, done, closed;
  bool ended;     /* END_STREAM came */
  bool streaming; /* stream_body: the app reads body[boff..blen) */
  size_t boff;
  int refuse; /* a status to answer at its turn (413, 431...), or 0 */
  /* the request */
  struct h2_req *rq;
  char *hb; /* header bytes (names, values), offsets until the end */
  size_t hlen, hcap, hsize;
  uint32_t moff, mlen, toff, tlen;
  int nh; /* entries of off[] */
  char *body;
  size_t blen, bcap;
  uint64_t t_start;
  /* the response's body not yet framed */
  char *ob;
  size_t olen, ooff, ocap;
  bool olast, deferred, submitted;
  bool end_sent; /* our END_STREAM went out */
  bool discard;  /* the rest of its body is read and dropped */
  uint64_t dropped;
  int fd;
  off_t foff;
  uint64_t fleft;
  /* an event stream (h2_stream.h): its events, once its exchange is over */
  const http_stream_ops_t *sops;
  void *sctx;
  struct h2_stream *dnext; /* closed, its on_closed due (h2__reap) */
  bool stalled;            /* buffered bytes at the last idle timeout */
  bool want_ready;         /* told congested: a watcher waits for READY */
  /* last: read up to nh only, so h2__stream_new leaves it uncleared */
  uint32_t off[HTTP_MAX_HEADERS][4]; /* name, len, value, len */
} h2_stream_t;

/* A request struct and its response's writer state (as server.c's). */
struct h2_req {
  http_request_t req;
  http_out_t out;
  char log_id[HTTP_LOG_ID_MAX];
};

struct h2_conn {
  nghttp2_session *s;
  h2_mem_t mem; /* s's allocator */
  http_conn_t *hc;
  h2_stream_t *qhead, *qtail; /* whole requests, in order */
  h2_stream_t *cur;           /* the one in hc->x */
  h2_stream_t *all;           /* every stream */
  uint64_t window_start;      /* of the idle-frame count */
  size_t buffered;            /* request body bytes of all streams */
  uint64_t idle_frames, requests, served;
  bool in_run, task, refusing, goaway, flushing;
  bool in_recv;   /* inside nghttp2_session_mem_recv: nothing is sent */
  bool notice;    /* the shutdown notice and its PING went out */
  bool body_news; /* the streamed body in hc->x has news for its reader */
  bool reaping, reap_task;
  h2_stream_t *dead; /* closed event streams whose on_closed is due */
};

/* h2.c (the session, streams, exchanges, the connection) */
void h2__stream_free(h2_stream_t *st);
/* A new stream of h's (st->h set, in no list), zeroed but for off[]
 * (1.6 KiB not cleared per request), with no fd; NULL when out of
 * memory. */
h2_stream_t *h2__stream_new(h2_conn_t *h);
void h2__enqueue(h2_conn_t *h, h2_stream_t *st);
long h2__hput(h2_stream_t *st, const uint8_t *p, size_t n);
bool h2__make_request(h2_conn_t *h, h2_stream_t *st);
bool h2__wants_events(const http_request_t *r);
void h2__run(h2_conn_t *h);
void h2__complete(http_exchange_t *x, bool keep_alive);
void h2__flush(h2_conn_t *h);
bool h2__init(http_conn_t *hc);
/* Whether the session whose allocator m is has nothing to send (its frame
 * buffer holds nothing it needs) and is in no call of nghttp2's. */
bool h2__quiet(h2_mem_t *m);

/* h2_mem.c (the pages an idle session gives back). A pool is made for a
 * lane's reactor (NULL when out of memory) and freed by its owner
 * (http_h2_pool_free), after its last session. */
h2_pool_t *h2_pool_new(reactor_t *r);
/* Prepares m for a session of pool p's (p NULL: plain malloc); set
 * m->making while nghttp2 makes the session. */
void h2_mem_init(h2_mem_t *m, h2_pool_t *p);
/* The session read or sent: its pages are resident until a sweep finds it
 * quiet (h2__quiet) a whole interval later. */
void h2_mem_touch(h2_mem_t *m);
/* After nghttp2_session_del: the slot goes back to the pool. */
void h2_mem_deinit(h2_mem_t *m);
/* Before any call of nghttp2's that may read or write its HPACK tables
 * (mem_recv, mem_send, session_del): the rings a quiet session gave back
 * get their entries again (a page fault and a few stores). */
void h2__mem_wake(h2_mem_t *m);
static inline void h2_mem_wake(h2_mem_t *m) {
  if (m->rings) h2__mem_wake(m);
}

/* Spare blocks of a lane's (h2_mem.c): a request's stream struct (1.8
 * KiB), its request struct (3.5 KiB), its header bytes' first buffer and
 * its response's first buffer. Past glibc's per-thread cache in size, each
 * cost a malloc and a free of some 300 instructions a request; a lane
 * keeps a few of each instead, and gives them back once its sessions are
 * quiet (the sweep). Takes a block of the kind's size (malloc when the
 * lane has none; p NULL: malloc), or NULL when out of memory; gives one
 * back (NULL: nothing; free when the lane keeps enough). */
enum { H2_SPARE_STREAM, H2_SPARE_REQ, H2_SPARE_HBUF, H2_SPARE_OBUF, H2_SPARES };
#define H2_HBUF_FIRST 512
#define H2_OBUF_FIRST 4096
void *h2_spare_take(h2_pool_t *p, int kind);
void h2_spare_put(h2_pool_t *p, int kind, void *b);
/* A buffer of the kind (header bytes, response) grown to cap: its first
 * (b NULL, cap the kind's size) is a spare, the rest realloc; NULL when out
 * of memory. Freed by h2_spare_free with its cap: a spare again when of
 * the kind's size, free otherwise. */
void *h2_spare_realloc(h2_pool_t *p, int kind, void *b, size_t cap);
void h2_spare_free(h2_pool_t *p, int kind, void *b, size_t cap);

/* h2_events.c (event streams) */
void h2__stream_end(h2_stream_t *st);
void h2__reap_later(h2_conn_t *h);
bool h2__events_idle(h2_conn_t *h);

/* h2_response.c (the response: head, body, file) */
bool h2__conn_specific(const char *n, size_t l);
int h2__submit_head(h2_conn_t *h, h2_stream_t *st, http_out_t *o, bool end);
int h2__obuf_put(h2_stream_t *st, const char *p, size_t n, size_t max);
int h2__out(http_exchange_t *x, const char *p, size_t n, bool last,
            sock_release_fn release, void *ctx, void *ctx2);
int h2__out_file(http_exchange_t *x, int fd, off_t off, uint64_t len);

#endif
