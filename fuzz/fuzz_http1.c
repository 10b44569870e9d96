/* SPDX-License-Identifier: MIT */

/* fuzz_http1: a libFuzzer target for the HTTP/1.x parser (src/http/http1.h).
 *
 * The whole input is a request stream. Its head is parsed with several
 * head limits, and the results are checked against each other and against
 * what the header promises; a chunked body after the head is decoded whole,
 * split at a point the input picks (its last two bytes), and a byte at a
 * time, and the three must agree. The target and the input are
 * percent-decoded against a reference decoder written here. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http1.h"
#include "fuzz_check.h"


static bool fz_within(const char *p, size_t n, const char *buf, size_t len) {
  return p >= buf && p <= buf + len && n <= (size_t)(buf + len - p);
}

static int fz_lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static bool fz_ieq(const char *a, size_t alen, const char *b, size_t blen) {
  if (alen != blen) return false;
  for (size_t i = 0; i < alen; i++)
    if (fz_lower((unsigned char)a[i]) != fz_lower((unsigned char)b[i]))
      return false;
  return true;
}

static bool fz_tchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Reference for http_list_has: split on commas, trim blanks, compare. */
static bool fz_list_has(const char *v, size_t len, const char *token) {
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && v[i] != ',') continue;
    size_t s = start, e = i;
    while (s < e && (v[s] == ' ' || v[s] == '\t')) s++;
    while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
    if (fz_ieq(v + s, e - s, token, strlen(token))) return true;
    start = i + 1;
  }
  return false;
}

/* What a successful parse must look like, buffer by buffer. */
static void fz_check_request(const char *buf, size_t len, int rc,
                             const http_request_t *req) {
  size_t head = (size_t)rc;
  FUZZ_CHECK(head <= len);
  FUZZ_CHECK(req->method_len > 0 &&
             fz_within(req->method, req->method_len, buf, head));
  for (uint32_t i = 0; i < req->method_len; i++)
    FUZZ_CHECK(fz_tchar((unsigned char)req->method[i]));
  FUZZ_CHECK(req->target_len > 0 &&
             fz_within(req->target, req->target_len, buf, head));
  for (uint32_t i = 0; i < req->target_len; i++) {
    unsigned char c = (unsigned char)req->target[i];
    FUZZ_CHECK(c > ' ' && c != 0x7f);
  }
  FUZZ_CHECK(req->minor == 0 || req->minor == 1);
  FUZZ_CHECK(req->nheaders >= 0 && req->nheaders <= HTTP_MAX_HEADERS);
  FUZZ_CHECK(req->content_length >= -1);
  FUZZ_CHECK(!req->chunked || (req->content_length == -1 && req->minor == 1));

  bool seen_cl = false, close = false, keep = false, conn_upgrade = false;
  bool upgrade_field = false;
  int hosts = 0, tes = 0;
  for (int i = 0; i < req->nheaders; i++) {
    const http_header_t *h = &req->headers[i];
    FUZZ_CHECK(h->name_len > 0 && fz_within(h->name, h->name_len, buf, head));
    FUZZ_CHECK(fz_within(h->value, h->value_len, buf, head));
    /* an absolute-form target's authority is the Host field's value
     * (http1.h): it points into the target then */
    bool from_target = h->value >= req->target &&
                       h->value + h->value_len <= req->target + req->target_len;
    FUZZ_CHECK(h->value >= h->name + h->name_len ||
               (from_target && fz_ieq(h->name, h->name_len, "host", 4) &&
                h->value_len > 0));
    for (uint32_t k = 0; k < h->name_len; k++)
      FUZZ_CHECK(fz_tchar((unsigned char)h->name[k]));
    FUZZ_CHECK(h->name[h->name_len] == ':');
    for (uint32_t k = 0; k < h->value_len; k++) {
      unsigned char c = (unsigned char)h->value[k];
      FUZZ_CHECK((c >= ' ' || c == '\t') && c != 0x7f);
    }
    if (h->value_len) {
      FUZZ_CHECK(h->value[0] != ' ' && h->value[0] != '\t');
      char last = h->value[h->value_len - 1];
      FUZZ_CHECK(last != ' ' && last != '\t');
    }

    /* http_header finds the first field of that name. */
    char name[256];
    if (h->name_len < sizeof(name)) {
      memcpy(name, h->name, h->name_len);
      name[h->name_len] = 0;
      const http_header_t *f = http_header(req, name);
      FUZZ_CHECK(f != NULL && f <= h && f >= req->headers);
      FUZZ_CHECK(fz_ieq(f->name, f->name_len, h->name, h->name_len));
      for (const http_header_t *e = req->headers; e < f; e++)
        FUZZ_CHECK(!fz_ieq(e->name, e->name_len, h->name, h->name_len));
    }

    if (fz_ieq(h->name, h->name_len, "content-length", 14)) {
      FUZZ_CHECK(h->value_len > 0 && h->value_len <= 18);
      int64_t v = 0;
      for (uint32_t k = 0; k < h->value_len; k++) {
        FUZZ_CHECK(h->value[k] >= '0' && h->value[k] <= '9');
        v = v * 10 + (h->value[k] - '0');
      }
      FUZZ_CHECK(v == req->content_length);
      seen_cl = true;
    } else if (fz_ieq(h->name, h->name_len, "transfer-encoding", 17)) {
      FUZZ_CHECK(fz_ieq(h->value, h->value_len, "chunked", 7));
      tes++;
    } else if (fz_ieq(h->name, h->name_len, "host", 4)) {
      hosts++;
    } else if (fz_ieq(h->name, h->name_len, "connection", 10)) {
      bool c = fz_list_has(h->value, h->value_len, "close");
      bool k = fz_list_has(h->value, h->value_len, "keep-alive");
      bool u = fz_list_has(h->value, h->value_len, "upgrade");
      FUZZ_CHECK(c == http_list_has(h->value, h->value_len, "close"));
      FUZZ_CHECK(k == http_list_has(h->value, h->value_len, "keep-alive"));
      FUZZ_CHECK(u == http_list_has(h->value, h->value_len, "upgrade"));
      close |= c, keep |= k, conn_upgrade |= u;
    } else if (fz_ieq(h->name, h->name_len, "upgrade", 7)) {
      upgrade_field = true;
    }
  }
  FUZZ_CHECK(seen_cl == (req->content_length >= 0));
  FUZZ_CHECK(tes <= 1 && req->chunked == (tes == 1));
  FUZZ_CHECK(hosts <= 1 && (req->minor == 0 || hosts == 1));
  FUZZ_CHECK(req->keep_alive == (req->minor == 1 ? !close : keep && !close));
  FUZZ_CHECK(req->upgrade == (conn_upgrade && upgrade_field));
  FUZZ_CHECK((http_header(req, "host") != NULL) == (hosts == 1));
}

/* Two parses of the same bytes at different addresses agree. */
static void fz_same(const char *a, const http_request_t *ra, const char *b,
                    const http_request_t *rb) {
  FUZZ_CHECK(ra->method - a == rb->method - b);
  FUZZ_CHECK(ra->method_len == rb->method_len);
  FUZZ_CHECK(ra->target - a == rb->target - b);
  FUZZ_CHECK(ra->target_len == rb->target_len);
  FUZZ_CHECK(ra->minor == rb->minor && ra->nheaders == rb->nheaders);
  FUZZ_CHECK(ra->content_length == rb->content_length);
  FUZZ_CHECK(ra->chunked == rb->chunked && ra->keep_alive == rb->keep_alive);
  FUZZ_CHECK(ra->expect_continue == rb->expect_continue);
  FUZZ_CHECK(ra->upgrade == rb->upgrade);
  for (int i = 0; i < ra->nheaders; i++) {
    const http_header_t *x = &ra->headers[i], *y = &rb->headers[i];
    FUZZ_CHECK(x->name - a == y->name - b && x->name_len == y->name_len);
    FUZZ_CHECK(x->value - a == y->value - b && x->value_len == y->value_len);
  }
}

/* ---- chunked bodies ---- */

typedef struct {
  const char *in;  /* the slice being fed, for the bounds check */
  size_t in_len;
  char *body;
  size_t len, cap;
} fz_body_t;

static void fz_collect(const char *p, size_t n, void *arg) {
  fz_body_t *b = arg;
  FUZZ_CHECK(fz_within(p, n, b->in, b->in_len));
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 256;
    while (cap < b->len + n) cap *= 2;
    b->body = realloc(b->body, cap);
    FUZZ_CHECK(b->body != NULL);
    b->cap = cap;
  }
  memcpy(b->body + b->len, p, n);
  b->len += n;
}

typedef struct {
  bool bad, done;
  size_t end; /* bytes of the input the body took (all of them if !done) */
} fz_chunked_result_t;

/* Feeds in[0..len) to a fresh decoder in pieces of at most `step` bytes
 * (the first piece is `first` bytes, maybe none), each piece in its own exactly-sized
 * heap copy so a read past it faults. */
static fz_chunked_result_t fz_chunked(const char *in, size_t len, size_t first,
                                      size_t step, size_t max_trailers,
                                      fz_body_t *body) {
  fz_chunked_result_t res = {false, false, 0};
  http_chunked_t c;
  http_chunked_init(&c, max_trailers);
  size_t off = 0;
  for (bool at_first = true; off < len; at_first = false) {
    size_t n = at_first ? first : step; /* an empty first piece is legal */
    if (n > len - off) n = len - off;
    char *piece = malloc(n ? n : 1);
    FUZZ_CHECK(piece != NULL);
    memcpy(piece, in + off, n);
    body->in = piece;
    body->in_len = n;
    bool done = false;
    ssize_t used = http_chunked_feed(&c, piece, n, fz_collect, body, &done);
    free(piece);
    if (used == HTTP_BAD) {
      res.bad = true;
      return res;
    }
    FUZZ_CHECK(used >= 0 && (size_t)used <= n);
    FUZZ_CHECK(done || (size_t)used == n);
    off += (size_t)used;
    if (done) {
      res.done = true;
      /* Once done, the decoder takes nothing more. */
      bool again = false;
      FUZZ_CHECK(http_chunked_feed(&c, in, len, fz_collect, body, &again) == 0);
      FUZZ_CHECK(again);
      break;
    }
  }
  res.end = off;
  return res;
}

static void fz_check_chunked(const char *in, size_t len, size_t split) {
  static const size_t max_trailers[] = {0, 16, 8192};
  for (size_t t = 0; t < sizeof(max_trailers) / sizeof(*max_trailers); t++) {
    fz_body_t whole = {0}, halves = {0}, bytes = {0};
    fz_chunked_result_t a =
        fz_chunked(in, len, len, len, max_trailers[t], &whole);
    fz_chunked_result_t b =
        fz_chunked(in, len, split, len, max_trailers[t], &halves);
    fz_chunked_result_t c = fz_chunked(in, len, 1, 1, max_trailers[t], &bytes);
    FUZZ_CHECK(a.bad == b.bad && a.bad == c.bad);
    if (!a.bad) {
      FUZZ_CHECK(a.done == b.done && a.done == c.done);
      FUZZ_CHECK(a.end == b.end && a.end == c.end);
      FUZZ_CHECK(whole.len <= a.end);
      FUZZ_CHECK(whole.len == halves.len && whole.len == bytes.len);
      FUZZ_CHECK(whole.len == 0 ||
                 (memcmp(whole.body, halves.body, whole.len) == 0 &&
                  memcmp(whole.body, bytes.body, whole.len) == 0));
    }
    free(whole.body);
    free(halves.body);
    free(bytes.body);
  }
}

/* ---- percent-decoding ---- */

static int fz_hex(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static void fz_check_unescape(const char *s, size_t len) {
  for (int plus = 0; plus < 2; plus++) {
    char *out = malloc(len ? len : 1); /* exactly what the header asks */
    char *ref = malloc(len ? len : 1);
    FUZZ_CHECK(out && ref);
    ssize_t n = http_unescape(s, len, out, plus);
    ssize_t r = 0;
    for (size_t i = 0; i < len && r >= 0; i++) {
      if (s[i] != '%') {
        ref[r++] = plus && s[i] == '+' ? ' ' : s[i];
      } else if (len - i >= 3 && fz_hex((unsigned char)s[i + 1]) >= 0 &&
                 fz_hex((unsigned char)s[i + 2]) >= 0) {
        ref[r++] = (char)(fz_hex((unsigned char)s[i + 1]) * 16 +
                          fz_hex((unsigned char)s[i + 2]));
        i += 2;
      } else {
        r = -1;
      }
    }
    FUZZ_CHECK(n == r);
    FUZZ_CHECK(n < 0 || (size_t)n <= len);
    FUZZ_CHECK(n <= 0 || memcmp(out, ref, (size_t)n) == 0);
    free(out);
    free(ref);
  }
}

/* ---- the entry point ---- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *in = (const char *)data;
  /* The same bytes in an exactly-sized heap buffer: an over-read faults. */
  char *copy = malloc(size ? size : 1);
  FUZZ_CHECK(copy != NULL);
  memcpy(copy, data, size);

  static http_request_t req, req2, req3;
  /* With no limit first: every other limit is checked against it. */
  int best = http_parse_head(in, size, SIZE_MAX, &req);
  FUZZ_CHECK(best > 0 || best == HTTP_NEED_MORE || best == HTTP_BAD ||
             best == HTTP_HEAD_TOO_LARGE || best == HTTP_NOT_IMPLEMENTED ||
             best == HTTP_BAD_VERSION);
  if (best > 0) fz_check_request(in, size, best, &req);
  if (best == HTTP_HEAD_TOO_LARGE) /* only the field count, here */
    FUZZ_CHECK(req.nheaders == HTTP_MAX_HEADERS);

  const size_t limits[] = {0, 1, 16, 64, size / 2, size, size + 1, 8192};
  for (size_t l = 0; l < sizeof(limits) / sizeof(*limits); l++) {
    size_t max_head = limits[l];
    int rc = http_parse_head(in, size, max_head, &req2);
    int rc2 = http_parse_head(copy, size, max_head, &req3);
    FUZZ_CHECK(rc == rc2);
    if (rc > 0) fz_same(in, &req2, copy, &req3);
    if (rc == HTTP_NEED_MORE) FUZZ_CHECK(size < max_head);
    if (max_head > size) FUZZ_CHECK(rc == best); /* the limit never bites */
    if (best > 0) {
      /* A whole head is found whenever the limit reaches it; below, the
       * lines before the limit are the same valid ones, so it is only
       * too large. */
      FUZZ_CHECK(rc == ((size_t)best <= max_head ? best
                                                 : HTTP_HEAD_TOO_LARGE));
      if (rc > 0) fz_same(in, &req, in, &req2);
    } else {
      /* A limit only cuts the scan short: what it reports otherwise is
       * what the unlimited parse reports. */
      FUZZ_CHECK(rc == best || rc == HTTP_HEAD_TOO_LARGE);
    }
  }

  if (best > 0) {
    size_t head = (size_t)best;
    /* The head alone parses the same, and every shorter prefix of it is
     * incomplete (checked at two points, each in an exact-sized copy). */
    int rc3 = http_parse_head(copy, head, head + 1, &req3);
    FUZZ_CHECK(rc3 == best);
    fz_same(in, &req, copy, &req3);
    size_t cuts[2] = {head - 1, size >= 2 ? (data[0] * head) / 256 : 0};
    for (int k = 0; k < 2; k++) {
      char *pre = malloc(cuts[k] ? cuts[k] : 1);
      FUZZ_CHECK(pre != NULL);
      memcpy(pre, in, cuts[k]);
      FUZZ_CHECK(http_parse_head(pre, cuts[k], SIZE_MAX, &req3) ==
                 HTTP_NEED_MORE);
      free(pre);
    }

    fz_check_unescape(req.target, req.target_len);

    if (req.chunked) {
      size_t rest = size - head;
      size_t pick = size >= 2 ? (size_t)data[size - 2] << 8 | data[size - 1]
                              : 0;
      fz_check_chunked(copy + head, rest, rest ? pick % (rest + 1) : 0);
    }
  }
  fz_check_unescape(copy, size < 4096 ? size : 4096);
  free(copy);
  return 0;
}
