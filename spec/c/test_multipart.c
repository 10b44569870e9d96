/* SPDX-License-Identifier: MIT */

/* test_multipart: the streaming multipart parser (src/http/multipart.h).
 * Each body is parsed whole, byte by byte and in random pieces (each
 * piece ending at an unreadable page, so an over-read faults), and the
 * events must come out the same: a trace of part headers, data, part
 * ends and the end. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "http/multipart.h"

/* n bytes of p copied to end at a PROT_NONE page */
static const char *guard(const char *p, size_t n) {
  static char *page;
  static size_t psize;
  if (!page) {
    psize = (size_t)sysconf(_SC_PAGESIZE) * 32; /* 128 KiB: the longest body */
    page = mmap(NULL, 2 * psize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED || mprotect(page + psize, psize, PROT_NONE)) abort();
  }
  if (n > psize) abort();
  memcpy(page + psize - n, p, n);
  return page + psize - n;
}

typedef struct {
  char *s;
  size_t n, cap;
} trace_t;

static void put(trace_t *t, const char *p, size_t n) {
  if (t->n + n + 1 > t->cap) {
    t->cap = (t->n + n + 1) * 2;
    t->s = realloc(t->s, t->cap);
    if (!t->s) abort();
  }
  memcpy(t->s + t->n, p, n);
  t->n += n;
  t->s[t->n] = 0;
}

static const multipart_limits_t LIM = {.max_parts = 100, .max_header = 1024, .max_part = 1 << 20};

/* Parses body in pieces: piece(i) gives the size of the i-th (0: random
 * 1..64). The trace: <P headers> data... <E> ... <D>, or <ERR n why>. */
static trace_t run(const char *boundary, const char *body, size_t len, size_t piece,
                   const multipart_limits_t *lim) {
  trace_t t = {0};
  multipart_t *m = multipart_new(boundary, strlen(boundary), lim ? lim : &LIM);
  if (!m) abort();
  size_t off = 0;
  long rc = 0;
  while (off < len && rc >= 0) {
    size_t n = piece ? piece : 1 + (size_t)(rand() % 64);
    if (n > len - off) n = len - off;
    const char *p = guard(body + off, n);
    size_t at = 0;
    for (;;) {
      multipart_event_t ev;
      rc = multipart_parse(m, p + at, n - at, &ev);
      if (rc < 0) break;
      CHECK(rc >= 0 && (size_t)rc <= n - at);
      at += (size_t)rc;
      if (ev.type == MULTIPART_PART) {
        put(&t, "<P ", 3);
        put(&t, ev.p, ev.n);
        put(&t, ">", 1);
      } else if (ev.type == MULTIPART_DATA) {
        CHECK(ev.n > 0);
        put(&t, ev.p, ev.n);
      } else if (ev.type == MULTIPART_END) {
        put(&t, "<E>", 3);
      } else if (ev.type == MULTIPART_DONE) {
        if (!strstr(t.s ? t.s : "", "<D>")) put(&t, "<D>", 3);
      } else {
        CHECK(at == n); /* NONE: all of it taken */
        break;
      }
      if (ev.type == MULTIPART_DONE && at == n) break;
    }
    off += n;
  }
  if (rc >= 0) rc = multipart_finish(m);
  if (rc < 0) {
    char e[96];
    int k = snprintf(e, sizeof(e), "<ERR %ld %s>", -rc, multipart_error(m));
    put(&t, e, (size_t)k);
  }
  if (!t.s) put(&t, "", 0);
  multipart_free(m);
  return t;
}

/* The same trace whole, byte by byte and in random pieces; returns the
 * whole one (the caller frees it). */
static char *same(const char *boundary, const char *body, size_t len,
                  const multipart_limits_t *lim) {
  trace_t whole = run(boundary, body, len, len ? len : 1, lim);
  trace_t bytes = run(boundary, body, len, 1, lim);
  CHECK_EQ(whole.n, bytes.n);
  CHECK(whole.n == bytes.n && memcmp(whole.s, bytes.s, whole.n) == 0);
  if (whole.n != bytes.n || memcmp(whole.s, bytes.s, whole.n))
    printf("  whole: %s\n  bytes: %s\n", whole.s, bytes.s);
  for (int k = 0; k < 20; k++) {
    trace_t r = run(boundary, body, len, 0, lim);
    CHECK(whole.n == r.n && memcmp(whole.s, r.s, whole.n) == 0);
    free(r.s);
  }
  free(bytes.s);
  return whole.s;
}

#define B "----b0und"
#define D "\r\n--" B

static void check_trace(const char *body, const char *want, const multipart_limits_t *lim) {
  char *got = same(B, body, strlen(body), lim);
  CHECK(strcmp(got, want) == 0);
  if (strcmp(got, want)) printf("  want: %s\n  got:  %s\n", want, got);
  free(got);
}

int main(void) {
  srand(29);
  /* a form with a field and a file */
  check_trace("--" B "\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\nvalue" D
              "\r\nContent-Disposition: form-data; name=\"f\"; filename=\"x.txt\"\r\n"
              "Content-Type: text/plain\r\n\r\nline 1\r\nline 2\r\n" D "--\r\n",
              "<P Content-Disposition: form-data; name=\"a\"\r\n>value<E>"
              "<P Content-Disposition: form-data; name=\"f\"; filename=\"x.txt\"\r\n"
              "Content-Type: text/plain\r\n>line 1\r\nline 2\r\n<E><D>", NULL);
  /* a preamble, padding after a delimiter, an epilogue; a part without
   * headers; an empty part */
  check_trace("preamble\r\nmore --" B "x\r\n" D "  \t\r\n\r\nno headers" D
              "\r\nX: 1\r\n\r\n" D "--epilogue\r\n" D "\r\nignored",
              "<P >no headers<E><P X: 1\r\n><E><D>", NULL);
  /* data full of near-delimiters: CRs, CRLF--, a boundary missing its
   * last byte, one with a byte changed */
  check_trace("--" B "\r\n\r\n\r\r\n\r\n-\r\n--\r\n--" "----b0un" "\r\n--" "----b0unx"
              "\r--" B "\r\n-" B D "--",
              "<P >\r\r\n\r\n-\r\n--\r\n------b0un\r\n------b0unx\r--" B "\r\n-" B "<E><D>",
              NULL);
  /* the body starts with CRLF before the first delimiter */
  check_trace("\r\n--" B "\r\n\r\nx" D "--", "<P >x<E><D>", NULL);
  /* binary data with NULs and every byte */
  {
    char body[600];
    size_t n = 0;
    const size_t h = strlen("--" B "\r\n\r\n");
    memcpy(body, "--" B "\r\n\r\n", h);
    n = h;
    for (int i = 0; i < 256; i++) body[n++] = (char)i;
    for (int i = 0; i < 256; i++) body[n++] = (char)(255 - i);
    memcpy(body + n, D "--", sizeof(D "--") - 1);
    n += sizeof(D "--") - 1;
    char *got = same(B, body, n, NULL);
    CHECK(memcmp(got, "<P >", 4) == 0 && memcmp(got + 4, body + h, 512) == 0 &&
          memcmp(got + 4 + 512, "<E><D>", 7) == 0);
    free(got);
  }
  /* malformed: junk after a delimiter, a NUL in a header, a truncated body
   * (inside data, inside headers, no delimiter at all) */
  check_trace("--" B "x\r\n\r\n" D "--", "<ERR 400 bad delimiter line>", NULL);
  check_trace("--" B "\r\nA: \r\n\r\n" D "-x", "<P A: \r\n><E><ERR 400 bad delimiter line>", NULL);
  check_trace("--" B "\r\n\r\ndata" D, "<P >data<E><ERR 400 the body ended inside the multipart data>",
              NULL);
  check_trace("--" B "\r\nA: b", "<ERR 400 the body ended inside the multipart data>", NULL);
  check_trace("no delimiter", "<ERR 400 the body ended inside the multipart data>", NULL);
  check_trace("", "<ERR 400 the body ended inside the multipart data>", NULL);
  check_trace("--" B "  ", "<ERR 400 the body ended inside the multipart data>", NULL);
  {
    char pad[200];
    snprintf(pad, sizeof(pad), "--" B "%070d\r\n\r\n" D "--", 0);
    memset(pad + strlen("--" B), ' ', 70);
    check_trace(pad, "<ERR 400 bad delimiter line>", NULL);
  }
  /* limits: parts, header bytes, data bytes */
  multipart_limits_t lim = {.max_parts = 2, .max_header = 16, .max_part = 10};
  check_trace("--" B "\r\n\r\na" D "\r\n\r\nb" D "--", "<P >a<E><P >b<E><D>", &lim);
  check_trace("--" B "\r\n\r\na" D "\r\n\r\nb" D "\r\n\r\nc" D "--",
              "<P >a<E><P >b<E><ERR 413 too many parts>", &lim);
  /* max_header counts the block with its empty line: 16 bytes here */
  check_trace("--" B "\r\nX: 123456789\r\n\r\na" D "--", "<P X: 123456789\r\n>a<E><D>", &lim);
  check_trace("--" B "\r\nX: 1234567890\r\n\r\na" D "--", "<ERR 413 part header too large>", &lim);
  check_trace("--" B "\r\n\r\n0123456789" D "--", "<P >0123456789<E><D>", &lim);
  {
    /* past max_part: an error whatever the pieces (the data before it
     * may differ, so only the end is compared) */
    const char *body = "--" B "\r\n\r\n0123456789A" D "--";
    for (size_t piece = 1; piece < 40; piece++) {
      trace_t t = run(B, body, strlen(body), piece, &lim);
      CHECK(strstr(t.s, "<ERR 413 part too large>") != NULL);
      free(t.s);
    }
  }
  /* an error sticks */
  {
    multipart_t *m = multipart_new(B, strlen(B), &LIM);
    multipart_event_t ev;
    CHECK_EQ(multipart_parse(m, "--" B "?", strlen("--" B "?"), &ev), -400);
    CHECK_EQ(multipart_parse(m, "x", 1, &ev), -400);
    CHECK_EQ(multipart_finish(m), -400);
    multipart_free(m);
  }
  /* after the end, everything is taken */
  {
    multipart_t *m = multipart_new(B, strlen(B), &LIM);
    multipart_event_t ev;
    const char *body = "--" B "--";
    CHECK_EQ(multipart_parse(m, body, strlen(body), &ev), (long)strlen(body));
    CHECK_EQ(ev.type, MULTIPART_DONE);
    CHECK_EQ(multipart_parse(m, "rest", 4, &ev), 4);
    CHECK_EQ(ev.type, MULTIPART_DONE);
    CHECK_EQ(multipart_finish(m), 0);
    CHECK_EQ(multipart_parts(m), 0);
    multipart_free(m);
  }
  /* bad boundaries and limits */
  CHECK(multipart_new("", 0, &LIM) == NULL);
  CHECK(multipart_new("a\rb", 3, &LIM) == NULL);
  CHECK(multipart_new("ab ", 3, &LIM) == NULL);
  CHECK(multipart_new("a;b", 3, &LIM) == NULL);
  {
    char lng[72];
    memset(lng, 'a', 71);
    CHECK(multipart_new(lng, 71, &LIM) == NULL);
    multipart_t *m = multipart_new(lng, 70, &LIM);
    CHECK(m != NULL);
    multipart_free(m);
    multipart_limits_t z = {0, 1, 1};
    CHECK(multipart_new("ab", 2, &z) == NULL);
  }
  /* a long random body with a 1-byte boundary, against the pieces */
  {
    size_t n = 0, cap = 1 << 16;
    char *body = malloc(cap);
    n += (size_t)sprintf(body, "--x");
    for (int part = 0; part < 30; part++) {
      n += (size_t)sprintf(body + n, "\r\nN: %d\r\n\r\n", part);
      int len = rand() % 1500;
      for (int i = 0; i < len; i++) {
        /* bytes that often look like the start of a delimiter */
        static const char alpha[] = "\r\n-x\r\r--ab";
        body[n++] = alpha[rand() % 10];
        /* never the whole delimiter */
        if (n >= 4 && memcmp(body + n - 4, "\r\n--", 4) == 0) body[n - 1] = 'y';
        if (n >= 5 && memcmp(body + n - 5, "\r\n--x", 5) == 0) body[n - 1] = 'z';
      }
      n += (size_t)sprintf(body + n, "\r\n--x");
    }
    n += (size_t)sprintf(body + n, "--");
    char *got = same("x", body, n, NULL);
    CHECK(strstr(got, "<E><D>") != NULL);
    CHECK(strstr(got, "<ERR") == NULL);
    free(got);
    free(body);
  }
  return check_summary();
}
