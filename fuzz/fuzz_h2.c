/* SPDX-License-Identifier: MIT */

/* fuzz_h2: a libFuzzer target for the HTTP/2 framer (src/http/h2*.c): the
 * connection state machine over nghttp2, its streams, exchanges, body
 * buffers, limits and output, without a reactor.
 *
 * Input: byte 0 picks the server (bit 0: stream_body; bit 1: answer each
 * exchange at once, else after the read; bit 2: a small max_header, so
 * 431 is hit; bit 3: a small max_body; bit 4: the write queue reads
 * "full" now and then, so output waits for on_ready), bytes 1-2 are the
 * sizes of the pieces the client's bytes arrive in (cycled, 1-512), the
 * rest is what the client sends after the connection preface (which the
 * target sends first, so that the fuzzer works on frames). Bit 7: the
 * rest starts with an HTTP/1.1 head (to its blank line) that asks for
 * Upgrade: h2c (http_h2_upgrade: the HTTP2-Settings field, the request
 * made stream 1); what follows it comes after the preface as above.
 * The reactor and the rest of src/http are stubs here: an exchange is
 * answered through the framer's hooks as the response writer would, a
 * streamed body is read whole first; every fourth piece comes a second
 * later, after the sweep that takes a quiet session's pages (h2_mem.c).
 * What the server writes must be a sequence of well-formed frames; ASan
 * and UBSan check the rest, and the close must free everything
 * (LeakSanitizer). */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "http/select.h"
#include "http/server.h"

/* ---- a connection without a reactor ---- */

struct conn {
  void *udata;
  bool closed;
  void (*task)(conn_t *c, void *arg);
  void *task_arg;
};

static struct conn fz_conn;
static uint64_t fz_now;
static bool fz_full, fz_flaky;
static unsigned fz_tick;
/* the server's output, parsed as frames as it comes */
static uint8_t fz_hdr[9];
static size_t fz_hlen;
static uint64_t fz_skip;
static size_t fz_text; /* bytes of "HTTP/1.1 101" to pass over first */

void *reactor_conn_udata(const conn_t *c) { return c->udata; }
void reactor_conn_set_udata(conn_t *c, void *udata) { c->udata = udata; }
sock_uuid_t reactor_conn_uuid(const conn_t *c) {
  return (sock_uuid_t)(uintptr_t)c;
}
void reactor_conn_set_timeout(conn_t *c, uint32_t ms) { (void)c, (void)ms; }
uint32_t reactor_conn_timeout(const conn_t *c) { return (void)c, 1000; }
size_t reactor_conn_max_queue(const conn_t *c) { return (void)c, 1 << 20; }
void reactor_conn_close(conn_t *c, int reason) {
  (void)reason, c->closed = true;
}
void reactor_conn_force_close(conn_t *c, int reason) {
  (void)reason, c->closed = true;
}
uint64_t reactor_now(const reactor_t *r) { return (void)r, fz_now; }
/* the timers (h2_mem.c's sweep), run as the pieces arrive */
static timer_heap_t fz_timers;
timer_heap_t *reactor_timers(reactor_t *r) { return (void)r, &fz_timers; }

bool reactor_draining(const reactor_t *r) { return (void)r, false; }
size_t reactor_conn_pending(const conn_t *c) {
  (void)c;
  return fz_full ? (size_t)1 << 30 : 0;
}
int reactor_conn_task(conn_t *c, void (*fn)(conn_t *c, void *arg), void *arg) {
  FUZZ_CHECK(!c->task); /* h2.c keeps one at a time */
  c->task = fn;
  c->task_arg = arg;
  return 0;
}

/* Every frame the server writes: a 9-byte head and its payload. */
int reactor_conn_write(conn_t *c, const void *data, size_t len) {
  if (c->closed) return -EPIPE;
  const uint8_t *p = data;
  while (len && fz_text) { /* the 101, then frames */
    FUZZ_CHECK(fz_text > 4 || *p == "\r\n\r\n"[4 - fz_text]);
    fz_text--, p++, len--;
  }
  while (len) {
    if (fz_skip) {
      size_t k = fz_skip < len ? (size_t)fz_skip : len;
      fz_skip -= k;
      p += k;
      len -= k;
      continue;
    }
    fz_hdr[fz_hlen++] = *p++;
    len--;
    if (fz_hlen == 9) {
      uint32_t flen =
          (uint32_t)fz_hdr[0] << 16 | (uint32_t)fz_hdr[1] << 8 | fz_hdr[2];
      FUZZ_CHECK(flen <= 16384);  /* the default SETTINGS_MAX_FRAME_SIZE */
      FUZZ_CHECK(fz_hdr[3] <= 9); /* no frame type of our own */
      fz_skip = flen;
      fz_hlen = 0;
    }
  }
  return 0;
}

/* ---- the rest of src/http, as the server would ---- */

const http_framer_t http_framer_h1 = {.alpn = "http/1.1"};

const char *http_date_now(void) { return "Thu, 01 Jan 1970 00:00:00 GMT"; }
const char *http_reason(int status) { return (void)status, "Status"; }
void http_out_free(http_out_t *o) { (void)o; }
void http_conn_log(http_conn_t *hc, int status, uint64_t bytes) {
  (void)hc, (void)status, (void)bytes;
}

int http_res_send(http_exchange_t *x, const http_head_t *h, const char *body,
                  size_t n, sock_release_fn release, void *ctx, void *ctx2) {
  http_out_t *o = x->out;
  o->active = true;
  o->h = *h;
  o->len = (long long)n;
  x->log_status = h->status;
  int rc = x->conn->framer->out(x, body, n, true, release, ctx, ctx2);
  x->conn->framer->complete(x, rc == 0);
  return rc;
}

static bool fz_at_once;
static http_exchange_t *fz_pending;

/* Answers the exchange: its body (a streamed one read first) back. */
static void fz_answer(http_exchange_t *x, const char *body, size_t blen) {
  static const char hdrs[] = "X-A: b\r\nConnection: close\r\n";
  http_head_t h = {.status = 200, .headers = hdrs, .hlen = sizeof(hdrs) - 1};
  if (x->streaming) {
    size_t got = 0;
    for (;;) {
      const char *p;
      long n = x->conn->framer->body_peek(x, &p);
      if (n < 0) break;
      got += (size_t)n;
      x->conn->framer->body_consume(x, (size_t)n);
    }
    (void)got;
    body = "streamed";
    blen = 8;
  }
  http_out_t *o = x->out;
  o->active = true;
  o->h = h;
  o->len = -1;
  x->log_status = 200;
  const http_framer_t *fr = x->conn->framer;
  int rc = fr->out(x, body, blen / 2, false, NULL, NULL, NULL);
  if (!rc)
    rc = fr->out(x, body + blen / 2, blen - blen / 2, true, NULL, NULL, NULL);
  fr->complete(x, rc == 0);
}

static const char *fz_body;
static size_t fz_blen;

void http_exchange_dispatch(http_conn_t *hc, const char *body, size_t blen) {
  if (fz_at_once && !hc->x.streaming) {
    fz_answer(&hc->x, body, blen);
    return;
  }
  fz_pending = &hc->x;
  fz_body = body;
  fz_blen = blen;
}

/* ---- the target ---- */

static void fz_tasks(void) {
  while (fz_conn.task) {
    void (*fn)(conn_t *, void *) = fz_conn.task;
    fz_conn.task = NULL;
    fn(fz_conn.closed ? NULL : &fz_conn, fz_conn.task_arg);
    if (fz_pending) {
      http_exchange_t *x = fz_pending;
      fz_pending = NULL;
      fz_answer(x, fz_body, fz_blen);
    }
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 3) return 0;
  uint8_t mode = data[0];
  size_t piece[2] = {1 + (size_t)data[1] * 2, 1 + (size_t)data[2] * 2};
  data += 3;
  size -= 3;
  static http_cache_t *cache;
  static struct h2_pool *pool; /* kept across inputs, as a lane keeps it */
  http_server_t srv = {
      .max_header = mode & 4 ? 300 : 8192,
      .max_body = mode & 8 ? 1000 : 1 << 20,
      .header_timeout_ms = 1000,
      .idle_ms = 1000,
      .stream_body = mode & 1,
      .public_fd = -1,
      .cache = &cache,
      .h2_pool = &pool,
      .conn_size = sizeof(http_conn_t),
  };
  fz_at_once = mode & 2;
  fz_flaky = mode & 16;
  memset(&fz_conn, 0, sizeof(fz_conn));
  fz_hlen = 0;
  fz_skip = 0;
  fz_pending = NULL;
  http_conn_t *hc;
  http_request_t req;
  if (mode & 128) { /* an HTTP/1.1 connection's first request */
    const uint8_t *end = memmem(data, size, "\r\n\r\n", 4);
    if (!end) return 0;
    size_t hl = (size_t)(end - data) + 4;
    if (http_parse_head((const char *)data, hl, srv.max_header, &req) <= 0)
      return 0;
    hc = calloc(1, sizeof(*hc));
    if (!hc) return 0;
    hc->srv = &srv;
    hc->c = &fz_conn;
    hc->framer = &http_framer_h1;
    hc->x.conn = hc;
    hc->x.req = &req;
    hc->x.t_start = fz_now;
    reactor_conn_set_udata(&fz_conn, hc);
    static const char sw[] = "HTTP/1.1 101 Switching Protocols\r\n"
                             "Connection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
    fz_text = sizeof(sw) - 1;
    if (!http_h2_upgrade(hc)) {
      FUZZ_CHECK(hc->framer == &http_framer_h1 && !hc->proto);
      fz_text = 0;
      free(hc);
      return 0;
    }
    FUZZ_CHECK(hc->framer == &http_framer_h2);
    hc->x.req = NULL; /* as server.c gives its buffers back */
    http_h2_upgraded(hc);
    fz_tasks();
    data += hl;
    size -= hl;
  } else {
    hc = http_framer_h2.open(&srv, &fz_conn);
    if (!hc) return 0;
  }
  static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  http_framer_h2.on_data(&fz_conn, preface, sizeof(preface) - 1);
  fz_tasks();
  size_t off = 0;
  for (int i = 0; off < size && !fz_conn.closed; i++) {
    size_t n = piece[i & 1] < size - off ? piece[i & 1] : size - off;
    fz_now += 7;
    if (i % 4 == 3) { /* a second passes: a quiet session's pages go back,
                         and its next frames must not miss them */
      fz_now += 1000;
      timer_heap_run(&fz_timers, fz_now);
    }
    fz_full = fz_flaky && (++fz_tick % 3 == 0);
    http_framer_h2.on_data(&fz_conn, (const char *)data + off, n);
    fz_tasks();
    if (fz_full) {
      fz_full = false;
      http_framer_h2.on_ready(&fz_conn);
      fz_tasks();
    }
    off += n;
  }
  if (!fz_conn.closed && (mode & 32)) {
    http_framer_h2.on_shutdown(&fz_conn);
    fz_tasks();
  }
  if (!fz_conn.closed && (mode & 64)) http_framer_h2.on_timeout(&fz_conn);
  fz_pending = NULL;
  FUZZ_CHECK(!fz_text);
  http_framer_h2.closed(&fz_conn, reactor_conn_udata(&fz_conn), 0);
  fz_conn.closed = true;
  fz_tasks(); /* the queue gets fn(NULL) */
  return 0;
}
