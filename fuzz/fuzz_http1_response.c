/* SPDX-License-Identifier: MIT */

/* fuzz_http1_response: a libFuzzer target for the HTTP/1.x response
 * parser (src/http/http1_response.h).
 *
 * The first byte's low bit says whether the request was HEAD; the rest is
 * a response stream. Each head (interim 1xx ones skipped, as a client
 * does) is parsed in an allocation of exactly its length, again with
 * several head limits and shorter prefixes, and the results are checked
 * against each other and against what the fields say (pointers inside the
 * head, tokens, the framing rules). A chunked body is decoded whole and a
 * byte at a time, and the two must agree. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http/http1_response.h"
#include "fuzz_check.h"

#define FZ_MAX_HEAD 8192

static bool fz_within(const char *p, size_t n, const char *buf, size_t len) {
  return p >= buf && p <= buf + len && n <= (size_t)(buf + len - p);
}

static int fz_lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

static bool fz_ieq(const char *a, size_t alen, const char *b) {
  size_t blen = strlen(b);
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

static int fz_parse(const char *data, size_t len, size_t max_head, bool head,
                    http_response_t *res) {
  /* an allocation of exactly len bytes: ASan sees a read past it */
  char *copy = malloc(len ? len : 1);
  if (!copy) abort();
  memcpy(copy, data, len);
  int rc = http_parse_response(copy, len, max_head, head, res);
  /* pointers into the copy are rebased onto data for the caller */
  if (rc > 0) {
    ptrdiff_t d = data - copy;
    res->reason += d;
    for (int i = 0; i < res->nheaders; i++) {
      res->headers[i].name += d;
      res->headers[i].value += d;
    }
  }
  free(copy);
  return rc;
}

static void fz_check_head(const char *buf, size_t len, bool head, int rc,
                          const http_response_t *res) {
  size_t n = (size_t)rc;
  FUZZ_CHECK(n <= len && n <= FZ_MAX_HEAD);
  FUZZ_CHECK(res->minor == 0 || res->minor == 1);
  FUZZ_CHECK(res->status >= 100 && res->status <= 999);
  FUZZ_CHECK(memcmp(buf, "HTTP/1.", 7) == 0);
  FUZZ_CHECK(fz_within(res->reason, res->reason_len, buf, n));
  FUZZ_CHECK(res->nheaders >= 0 && res->nheaders <= HTTP_RES_MAX_HEADERS);
  int64_t cl = -1;
  bool te = false;
  for (int i = 0; i < res->nheaders; i++) {
    const http_header_t *h = &res->headers[i];
    FUZZ_CHECK(h->name_len > 0 && fz_within(h->name, h->name_len, buf, n));
    FUZZ_CHECK(fz_within(h->value, h->value_len, buf, n));
    for (uint32_t k = 0; k < h->name_len; k++)
      FUZZ_CHECK(fz_tchar((unsigned char)h->name[k]));
    FUZZ_CHECK(h->name[h->name_len] == ':');
    if (h->value_len) {
      FUZZ_CHECK(h->value[0] != ' ' && h->value[0] != '\t');
      FUZZ_CHECK(h->value[h->value_len - 1] != ' ' &&
                 h->value[h->value_len - 1] != '\t');
    }
    for (uint32_t k = 0; k < h->value_len; k++)
      FUZZ_CHECK(h->value[k] != '\r' && h->value[k] != '\n' && h->value[k]);
    if (fz_ieq(h->name, h->name_len, "content-length")) {
      /* a reference reading of the digits: every field says the same */
      FUZZ_CHECK(h->value_len >= 1 && h->value_len <= 18);
      int64_t x = 0;
      for (uint32_t k = 0; k < h->value_len; k++) {
        FUZZ_CHECK(h->value[k] >= '0' && h->value[k] <= '9');
        x = x * 10 + (h->value[k] - '0');
      }
      FUZZ_CHECK(cl < 0 || cl == x);
      cl = x;
    }
    if (fz_ieq(h->name, h->name_len, "transfer-encoding")) te = true;
  }
  FUZZ_CHECK(res->content_length == cl);
  FUZZ_CHECK(!(te && cl >= 0));
  FUZZ_CHECK(!(te && res->minor == 0));
  int st = res->status;
  FUZZ_CHECK(res->interim == (st >= 100 && st < 200 && st != 101));
  FUZZ_CHECK(res->upgrade == (st == 101));
  bool none = head || st < 200 || st == 204 || st == 304;
  FUZZ_CHECK((res->body == HTTP_BODY_NONE) == none);
  if (res->body == HTTP_BODY_CHUNKED) FUZZ_CHECK(te);
  if (res->body == HTTP_BODY_LENGTH) FUZZ_CHECK(cl >= 0 && !te);
  if (res->body == HTTP_BODY_CLOSE) FUZZ_CHECK(!res->keep_alive && cl < 0);
  if (res->upgrade) FUZZ_CHECK(!res->keep_alive);
  /* the last two bytes are the empty line */
  FUZZ_CHECK(buf[n - 1] == '\n');
}

/* Same parse with other limits and shorter inputs. */
static void fz_check_limits(const char *buf, size_t len, bool head, int rc,
                            const http_response_t *first) {
  static http_response_t again;
  if (rc > 0) {
    size_t n = (size_t)rc;
    FUZZ_CHECK(fz_parse(buf, n, FZ_MAX_HEAD, head, &again) == rc);
    FUZZ_CHECK(again.status == first->status && again.body == first->body &&
               again.nheaders == first->nheaders &&
               again.keep_alive == first->keep_alive);
    FUZZ_CHECK(fz_parse(buf, len, FZ_MAX_HEAD * 4, head, &again) == rc);
    FUZZ_CHECK(fz_parse(buf, n - 1, FZ_MAX_HEAD, head, &again) ==
               HTTP_RES_INCOMPLETE);
    if (n > 1)
      FUZZ_CHECK(fz_parse(buf, len, n - 1, head, &again) == HTTP_RES_TOO_LARGE);
  } else if (rc == HTTP_RES_INCOMPLETE) {
    FUZZ_CHECK(len < FZ_MAX_HEAD);
    /* a prefix of an incomplete head is incomplete: only whole lines
     * are judged, and they are the same lines */
    FUZZ_CHECK(fz_parse(buf, len / 2, FZ_MAX_HEAD, head, &again) ==
               HTTP_RES_INCOMPLETE);
  } else {
    FUZZ_CHECK(rc == HTTP_RES_BAD || rc == HTTP_RES_TOO_LARGE);
  }
}

typedef struct {
  uint8_t *p;
  size_t n;
} fz_sink_t;

static void fz_body(const char *p, size_t n, void *arg) {
  fz_sink_t *s = arg;
  memcpy(s->p + s->n, p, n);
  s->n += n;
}

static void fz_check_chunked(const char *in, size_t len) {
  uint8_t *a = malloc(len + 1), *b = malloc(len + 1);
  if (!a || !b) abort();
  fz_sink_t sa = {a, 0}, sb = {b, 0};
  http_chunked_t ca, cb;
  http_chunked_init(&ca, 1024);
  http_chunked_init(&cb, 1024);
  bool da = false, db = false;
  ssize_t ra = http_chunked_feed(&ca, in, len, fz_body, &sa, &da);
  ssize_t rb = 0;
  bool bad = false;
  for (size_t i = 0; i < len && !db; i++) {
    ssize_t k = http_chunked_feed(&cb, in + i, 1, fz_body, &sb, &db);
    if (k < 0) {
      bad = true;
      break;
    }
    rb += k;
  }
  if (ra < 0) {
    FUZZ_CHECK(bad);
  } else {
    FUZZ_CHECK(!bad && ra == rb && da == db && sa.n == sb.n);
    FUZZ_CHECK(sa.n == 0 || memcmp(a, b, sa.n) == 0);
    FUZZ_CHECK(sa.n <= (size_t)ra);
  }
  free(a);
  free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  bool head = data[0] & 1;
  const char *buf = (const char *)data + 1;
  size_t len = size - 1;
  static http_response_t res;
  /* the interim responses first, as a client skips them */
  for (int round = 0; round < 8; round++) {
    int rc = fz_parse(buf, len, FZ_MAX_HEAD, head, &res);
    fz_check_limits(buf, len, head, rc, &res);
    if (rc <= 0) return 0;
    fz_check_head(buf, len, head, rc, &res);
    buf += rc;
    len -= (size_t)rc;
    if (!res.interim) break;
  }
  if (res.body == HTTP_BODY_CHUNKED) fz_check_chunked(buf, len);
  if (res.body == HTTP_BODY_LENGTH && res.content_length >= 0)
    FUZZ_CHECK(res.content_length <= 999999999999999999LL);
  return 0;
}
