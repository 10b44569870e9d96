/* SPDX-License-Identifier: MIT */

/* fuzz_multipart: a libFuzzer target for the streaming multipart parser
 * (src/http/multipart.h).
 *
 * Input: byte 0 picks the limits (small ones, so that they are hit) and
 * the boundary (one of a few, a 1-byte one among them), bytes 1-3 are the
 * sizes of the pieces the body arrives in (cycled, 1-256 bytes), the rest
 * is the body. It is parsed whole and piece by piece; the traces (part
 * headers, data, part ends, the end or the error) must be the same, except
 * that a part over max_part may show more or less of its data first. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "http/multipart.h"

typedef struct {
  unsigned char *s;
  size_t n, cap;
} fz_trace_t;

static void fz_put(fz_trace_t *t, const void *p, size_t n) {
  if (t->n + n > t->cap) {
    t->cap = (t->n + n) * 2 + 64;
    t->s = realloc(t->s, t->cap);
    FUZZ_CHECK(t->s != NULL);
  }
  if (n) memcpy(t->s + t->n, p, n);
  t->n += n;
}

/* The trace of body parsed in pieces of sizes[i % 3] (0: whole); returns
 * the final result (0 or the error). */
static long fz_run(const char *boundary, const multipart_limits_t *lim, const uint8_t *body,
                   size_t len, const uint8_t *sizes, fz_trace_t *t) {
  multipart_t *m = multipart_new(boundary, strlen(boundary), lim);
  FUZZ_CHECK(m != NULL);
  size_t off = 0, k = 0;
  long rc = 0;
  bool done = false;
  while (off < len && rc >= 0) {
    size_t n = sizes ? (size_t)sizes[k++ % 3] + 1 : len;
    if (n > len - off) n = len - off;
    /* a copy of exactly n bytes, so ASan sees an over-read */
    char *p = malloc(n);
    FUZZ_CHECK(p != NULL);
    memcpy(p, body + off, n);
    size_t at = 0;
    for (;;) {
      multipart_event_t ev;
      rc = multipart_parse(m, p + at, n - at, &ev);
      if (rc < 0) break;
      FUZZ_CHECK((size_t)rc <= n - at);
      at += (size_t)rc;
      unsigned char tag = (unsigned char)ev.type;
      if (ev.type == MULTIPART_NONE) {
        FUZZ_CHECK(at == n);
        break;
      }
      if (ev.type == MULTIPART_DONE) {
        FUZZ_CHECK(at == n);
        if (!done) fz_put(t, &tag, 1);
        done = true;
        break;
      }
      FUZZ_CHECK(!done);
      if (ev.type == MULTIPART_DATA) {
        FUZZ_CHECK(ev.n > 0);
        fz_put(t, ev.p, ev.n); /* data bytes, untagged: pieces merge */
      } else {
        fz_put(t, "\xff", 1);
        fz_put(t, &tag, 1);
        if (ev.type == MULTIPART_PART) {
          FUZZ_CHECK(ev.n <= lim->max_header);
          fz_put(t, ev.p, ev.n);
          fz_put(t, "\xff", 1);
        }
      }
    }
    free(p);
    off += n;
  }
  if (rc >= 0) rc = multipart_finish(m);
  FUZZ_CHECK(rc == 0 || rc == -400 || rc == -413);
  FUZZ_CHECK(multipart_parts(m) <= lim->max_parts);
  if (rc < 0) FUZZ_CHECK(multipart_error(m)[0] != 0);
  multipart_free(m);
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const char *const boundaries[] = {"x", "B0", "----formdata-1234", "a'()+_,-./:=?b"};
  if (size < 4) return 0;
  multipart_limits_t lim = {
      .max_parts = (data[0] & 1) ? 3 : 100,
      .max_header = (data[0] & 2) ? 24 : 1024,
      .max_part = (data[0] & 4) ? 16 : 1 << 20,
  };
  const char *b = boundaries[(data[0] >> 3) & 3];
  fz_trace_t whole = {0}, pieces = {0};
  long r1 = fz_run(b, &lim, data + 4, size - 4, NULL, &whole);
  long r2 = fz_run(b, &lim, data + 4, size - 4, data + 1, &pieces);
  FUZZ_CHECK(r1 == r2);
  bool part_limit = r1 == -413 && (data[0] & 4);
  if (!part_limit) {
    FUZZ_CHECK(whole.n == pieces.n);
    FUZZ_CHECK(whole.n == 0 || memcmp(whole.s, pieces.s, whole.n) == 0);
  }
  free(whole.s);
  free(pieces.s);
  return 0;
}
