/* SPDX-License-Identifier: MIT */

/* fuzz_ws: a libFuzzer target for the WebSocket reader (src/http/ws.h).
 *
 * Input: byte 0 picks the reader (bit 0: need_mask; bits 1-3: max_msg out
 * of a few small sizes, so the limits are hit), bytes 1-3 are the sizes of
 * the pieces the stream arrives in (cycled, 1-256 bytes), the rest is the
 * stream of frames. The stream is read whole and piece by piece, with each
 * masking choice, and the events must be the same. ws_utf8_valid is checked
 * against a plain decoder written here, ws_accept_key against its shape. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/ws.h"
#include "fuzz_check.h"


/* ---- a plain UTF-8 decoder: one code point at a time ---- */

static bool fz_utf8(const unsigned char *p, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned c = p[i];
    size_t more;
    uint32_t cp, min;
    if (c < 0x80) more = 0, cp = c, min = 0;
    else if ((c & 0xE0) == 0xC0) more = 1, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) more = 2, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) more = 3, cp = c & 0x07, min = 0x10000;
    else return false;
    if (n - i - 1 < more) return false;
    for (size_t k = 1; k <= more; k++) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = cp << 6 | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      return false;
    i += more + 1;
  }
  return true;
}

/* ---- the events of a stream ---- */

typedef struct {
  int opcode, code;
  size_t len;
  char *data; /* a copy */
} fz_event_t;

typedef struct {
  fz_event_t *ev;
  size_t n, cap;
  ssize_t end;     /* a negated close code, or 0 */
  size_t consumed; /* bytes the whole frames took */
} fz_trace_t;

static void fz_trace_free(fz_trace_t *t) {
  for (size_t i = 0; i < t->n; i++) free(t->ev[i].data);
  free(t->ev);
}

/* Records an event after checking what the header promises of it. */
static void fz_record(fz_trace_t *t, const ws_reader_t *r, const ws_event_t *ev,
                      const char *in, size_t in_len) {
  int op = ev->opcode;
  FUZZ_CHECK(op == 0 || op == WS_TEXT || op == WS_BINARY || op == WS_CLOSE ||
             op == WS_PING || op == WS_PONG);
  if (op == 0) FUZZ_CHECK(r->msg_opcode == WS_TEXT || r->msg_opcode == WS_BINARY);
  if (ev->len) {
    bool in_input = ev->data >= in && ev->data + ev->len <= in + in_len;
    bool in_msg = r->msg && ev->data >= r->msg &&
                  ev->data + ev->len <= r->msg + r->msg_len;
    FUZZ_CHECK(in_input || in_msg);
  }
  if (op == WS_TEXT || op == WS_BINARY) FUZZ_CHECK(ev->len <= r->max_msg);
  if (op & 0x8) FUZZ_CHECK(ev->len <= 125);
  if (op == WS_TEXT)
    FUZZ_CHECK(fz_utf8((const unsigned char *)ev->data, ev->len));
  if (op == WS_CLOSE) {
    FUZZ_CHECK(ev->len <= 123);
    FUZZ_CHECK(fz_utf8((const unsigned char *)ev->data, ev->len));
    int c = ev->code; /* RFC 6455 7.4: what a peer may send */
    if (c == WS_CLOSE_NO_STATUS)
      FUZZ_CHECK(ev->len == 0);
    else
      FUZZ_CHECK((c >= 1000 && c <= 1003) || (c >= 1007 && c <= 1014) ||
                 (c >= 3000 && c <= 4999));
  } else {
    FUZZ_CHECK(ev->code == 0);
  }
  if (t->n == t->cap) {
    t->cap = t->cap ? t->cap * 2 : 16;
    t->ev = realloc(t->ev, t->cap * sizeof(*t->ev));
    FUZZ_CHECK(t->ev != NULL);
  }
  fz_event_t *e = &t->ev[t->n++];
  e->opcode = op;
  e->code = ev->code;
  e->len = ev->len;
  e->data = malloc(ev->len ? ev->len : 1);
  FUZZ_CHECK(e->data != NULL);
  if (ev->len) memcpy(e->data, ev->data, ev->len);
}

/* One call of ws_read on in[0..len), through an exactly-sized heap copy
 * so a read past the end faults; the unmasked bytes are copied back. */
static ssize_t fz_read(ws_reader_t *r, char *in, size_t len, fz_trace_t *t) {
  char *w = malloc(len ? len : 1);
  FUZZ_CHECK(w != NULL);
  memcpy(w, in, len);
  ws_event_t ev;
  ssize_t used = ws_read(r, w, len, &ev);
  FUZZ_CHECK(used <= (ssize_t)len);
  if (used > 0) {
    FUZZ_CHECK(used >= 2);
    fz_record(t, r, &ev, w, len);
    memcpy(in, w, (size_t)used);
  } else if (used == 0) {
    FUZZ_CHECK(memcmp(in, w, len) == 0); /* nothing taken, nothing changed */
  } else {
    FUZZ_CHECK(used == -WS_CLOSE_PROTOCOL || used == -WS_CLOSE_TOO_BIG ||
               used == -WS_CLOSE_BAD_DATA || used == -ENOMEM);
  }
  free(w);
  return used;
}

/* Reads the stream as it arrives in pieces of sizes[i % 3] (or whole, if
 * sizes is NULL), the way a connection does: what is left of a frame waits
 * for more. */
static void fz_run(const char *stream, size_t len, size_t max_msg,
                   bool need_mask, const size_t *sizes, fz_trace_t *t) {
  char *buf = malloc(len ? len : 1); /* ws_read unmasks in place */
  FUZZ_CHECK(buf != NULL);
  memcpy(buf, stream, len);
  ws_reader_t r;
  ws_reader_init(&r, max_msg, need_mask);
  memset(t, 0, sizeof(*t));
  size_t off = 0, have = 0;
  for (size_t piece = 0; t->end == 0; piece++) {
    size_t n = sizes ? sizes[piece % 3] : len;
    if (n > len - have) n = len - have;
    have += n;
    for (;;) {
      ssize_t used = fz_read(&r, buf + off, have - off, t);
      if (used < 0) t->end = used;
      if (used <= 0) break;
      off += (size_t)used;
    }
    if (have == len) break;
  }
  t->consumed = off;
  ws_reader_deinit(&r);
  free(buf);
}

static void fz_same(const fz_trace_t *a, const fz_trace_t *b) {
  FUZZ_CHECK(a->end == b->end && a->consumed == b->consumed);
  FUZZ_CHECK(a->n == b->n);
  for (size_t i = 0; i < a->n; i++) {
    FUZZ_CHECK(a->ev[i].opcode == b->ev[i].opcode);
    FUZZ_CHECK(a->ev[i].code == b->ev[i].code);
    FUZZ_CHECK(a->ev[i].len == b->ev[i].len);
    FUZZ_CHECK(memcmp(a->ev[i].data, b->ev[i].data, a->ev[i].len) == 0);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  /* UTF-8 and the accept key take any bytes; the fast path of the UTF-8
   * check reads eight at a time, so every alignment is tried. */
  for (size_t skip = 0; skip < 8 && skip <= size; skip++) {
    char *p = malloc(size - skip ? size - skip : 1);
    FUZZ_CHECK(p != NULL);
    memcpy(p, data + skip, size - skip);
    FUZZ_CHECK(ws_utf8_valid(p, size - skip) ==
               fz_utf8((const unsigned char *)p, size - skip));
    free(p);
  }
  char key[29];
  ws_accept_key((const char *)data, size, key);
  FUZZ_CHECK(key[27] == '=' && key[28] == 0);
  for (int i = 0; i < 27; i++)
    FUZZ_CHECK((key[i] >= 'A' && key[i] <= 'Z') ||
               (key[i] >= 'a' && key[i] <= 'z') ||
               (key[i] >= '0' && key[i] <= '9') || key[i] == '+' ||
               key[i] == '/');

  if (size < 4) return 0;
  static const size_t max_msgs[8] = {0, 1, 5, 125, 126, 300, 4097, 70000};
  size_t max_msg = max_msgs[data[0] >> 1 & 7];
  bool mask_first = data[0] & 1;
  const size_t sizes[3] = {(size_t)data[1] + 1, (size_t)data[2] + 1,
                           (size_t)data[3] + 1};
  const char *stream = (const char *)data + 4;
  size_t len = size - 4;
  const size_t ones[3] = {1, 1, 1};

  for (int m = 0; m < 2; m++) {
    bool need_mask = m ? !mask_first : mask_first;
    fz_trace_t whole, pieces, bytes;
    fz_run(stream, len, max_msg, need_mask, NULL, &whole);
    fz_run(stream, len, max_msg, need_mask, sizes, &pieces);
    fz_same(&whole, &pieces);
    if (len <= 512) { /* a byte at a time costs a call per byte */
      fz_run(stream, len, max_msg, need_mask, ones, &bytes);
      fz_same(&whole, &bytes);
      fz_trace_free(&bytes);
    }
    fz_trace_free(&whole);
    fz_trace_free(&pieces);
  }
  return 0;
}
