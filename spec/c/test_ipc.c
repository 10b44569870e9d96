/* SPDX-License-Identifier: MIT */

/* Unit tests for src/cluster/ipc.h: the frames between root and workers.
 * The header layout, and ipc_reader_feed cutting a byte stream into frames:
 * split at every byte boundary, several frames in one feed, empty channels
 * and messages, a frame over the limit skipped (on_oversize once, the next
 * frame still parsed), a malformed header (channel longer than the body)
 * dropped. Own main(); checks from check.h. */
#include "cluster/ipc.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* ---- what the reader handed over ---- */

typedef struct {
  int type;
  unsigned flags;
  char *ch, *msg;
  size_t clen, mlen;
} frame_t;

#define MAXF 64

typedef struct {
  frame_t f[MAXF];
  int n;
  int oversize;
  size_t ov_body, ov_limit;
} got_t;

static void got_reset(got_t *g) {
  for (int i = 0; i < g->n && i < MAXF; i++) {
    free(g->f[i].ch);
    free(g->f[i].msg);
  }
  memset(g, 0, sizeof(*g));
}

static char *dup_bytes(const char *p, size_t n) {
  char *d = malloc(n ? n : 1);
  if (d && n) memcpy(d, p, n);
  return d;
}

static void on_frame(int type, unsigned flags, const char *ch, size_t clen,
                     const char *msg, size_t mlen, void *arg) {
  got_t *g = arg;
  if (g->n < MAXF) {
    frame_t *f = &g->f[g->n];
    f->type = type;
    f->flags = flags;
    f->clen = clen;
    f->mlen = mlen;
    f->ch = dup_bytes(ch, clen);
    f->msg = dup_bytes(msg, mlen);
  }
  g->n++;
}

static void on_oversize(size_t body, size_t limit, void *arg) {
  got_t *g = arg;
  g->oversize++;
  g->ov_body = body;
  g->ov_limit = limit;
}

/* ---- building a stream ---- */

typedef struct {
  int type;
  unsigned flags;
  const char *ch;
  size_t clen;
  const char *msg;
  size_t mlen;
} spec_t;

/* Appends the frame to buf at *len (buf must be large enough). */
static void put(char *buf, size_t *len, const spec_t *s) {
  ipc_header(buf + *len, s->type, s->flags, s->clen, s->mlen);
  *len += IPC_HEADER;
  memcpy(buf + *len, s->ch, s->clen);
  *len += s->clen;
  if (s->mlen) memcpy(buf + *len, s->msg, s->mlen);
  *len += s->mlen;
}

static bool same(const frame_t *f, const spec_t *s) {
  return f->type == s->type && f->flags == s->flags && f->clen == s->clen &&
         f->mlen == s->mlen && memcmp(f->ch, s->ch, s->clen) == 0 &&
         (s->mlen == 0 || memcmp(f->msg, s->msg, s->mlen) == 0);
}

/* Every frame of `want` arrived, in order, and nothing else. */
static bool all_there(const got_t *g, const spec_t *want, int n) {
  if (g->n != n) return false;
  for (int i = 0; i < n; i++)
    if (!same(&g->f[i], &want[i])) return false;
  return true;
}

/* Feeds buf in pieces of `chunk` bytes. */
static int feed_chunks(ipc_reader_t *r, const char *buf, size_t len,
                       size_t chunk, got_t *g) {
  int rc = 0;
  for (size_t off = 0; off < len; off += chunk) {
    size_t n = len - off < chunk ? len - off : chunk;
    rc |= ipc_reader_feed(r, buf + off, n, on_frame, on_oversize, g);
  }
  return rc;
}

/* ---- the header ---- */

static void test_header(void) {
  char h[IPC_HEADER];
  ipc_header(h, IPC_PUBLISH, 0x80u | 2u, 5, 100);
  uint32_t body;
  uint16_t clen;
  memcpy(&body, h, 4);
  memcpy(&clen, h + 6, 2);
  CHECK_EQ(body, 105);
  CHECK_EQ((unsigned char)h[4], IPC_PUBLISH);
  CHECK_EQ((unsigned char)h[5], 0x82);
  CHECK_EQ(clen, 5);
  CHECK_EQ(ipc_frame_size(5, 100), 113);
  CHECK_EQ(ipc_frame_size(0, 0), IPC_HEADER);

  ipc_header(h, IPC_SUB, 0, 4096, (size_t)8 << 20);
  memcpy(&body, h, 4);
  memcpy(&clen, h + 6, 2);
  CHECK_EQ(body, 4096 + (8 << 20));
  CHECK_EQ(clen, 4096);
  CHECK_EQ((unsigned char)h[4], IPC_SUB);
  CHECK_EQ((unsigned char)h[5], 0);

  /* the flags carry a scope and the JSON bit */
  CHECK_EQ(IPC_SCOPE_MASK & IPC_JSON, 0);
  ipc_header(h, IPC_DELIVER, IPC_JSON | 3u, 0, 0);
  CHECK_EQ((unsigned char)h[5] & IPC_SCOPE_MASK, 3);
  CHECK((unsigned char)h[5] & IPC_JSON);
}

/* ---- a stream of frames ---- */

static char bin[300];

static spec_t stream[] = {
    {IPC_SUB, 0, "chat", 4, NULL, 0},
    {IPC_PUBLISH, 0x80u | 2u, "room", 4, "hello", 5},
    {IPC_DELIVER, 0, "", 0, "", 0},             /* empty channel and message */
    {IPC_DELIVER, 0x80u, "x", 1, bin, sizeof(bin)}, /* bytes 0..255 */
    {IPC_PUNSUB, 0, "p.*", 3, NULL, 0},
    {IPC_PUBLISH, 1, "a\0b", 3, "\0", 1},       /* NUL bytes */
    {IPC_DELIVER, 0, "empty.msg", 9, NULL, 0},
};
#define NSTREAM ((int)(sizeof(stream) / sizeof(stream[0])))

static size_t build_stream(char *buf) {
  size_t len = 0;
  for (int i = 0; i < NSTREAM; i++) put(buf, &len, &stream[i]);
  return len;
}

static void test_stream(void) {
  for (size_t i = 0; i < sizeof(bin); i++) bin[i] = (char)(i & 0xff);
  char buf[1024];
  size_t len = build_stream(buf);
  got_t g = {0};
  ipc_reader_t r;

  /* all in one feed */
  ipc_reader_init(&r, 4096);
  CHECK_EQ(ipc_reader_feed(&r, buf, len, on_frame, on_oversize, &g), 0);
  CHECK(all_there(&g, stream, NSTREAM));
  CHECK_EQ(g.oversize, 0);
  got_reset(&g);
  /* the reader goes on with the next feed */
  CHECK_EQ(ipc_reader_feed(&r, buf, len, on_frame, on_oversize, &g), 0);
  CHECK(all_there(&g, stream, NSTREAM));
  got_reset(&g);
  CHECK_EQ(ipc_reader_feed(&r, buf, 0, on_frame, on_oversize, &g), 0);
  CHECK_EQ(g.n, 0);
  ipc_reader_deinit(&r);

  /* split in two at every byte boundary */
  int bad = 0;
  for (size_t cut = 0; cut <= len; cut++) {
    ipc_reader_init(&r, 4096);
    int rc = ipc_reader_feed(&r, buf, cut, on_frame, on_oversize, &g);
    rc |= ipc_reader_feed(&r, buf + cut, len - cut, on_frame, on_oversize, &g);
    if (rc || !all_there(&g, stream, NSTREAM) || g.oversize) bad++;
    got_reset(&g);
    ipc_reader_deinit(&r);
  }
  CHECK_EQ(bad, 0);

  /* in three pieces, two cuts anywhere (every pair) */
  bad = 0;
  for (size_t a = 0; a <= len; a += 3) {
    for (size_t b = a; b <= len; b += 5) {
      ipc_reader_init(&r, 4096);
      int rc = ipc_reader_feed(&r, buf, a, on_frame, on_oversize, &g);
      rc |= ipc_reader_feed(&r, buf + a, b - a, on_frame, on_oversize, &g);
      rc |= ipc_reader_feed(&r, buf + b, len - b, on_frame, on_oversize, &g);
      if (rc || !all_there(&g, stream, NSTREAM)) bad++;
      got_reset(&g);
      ipc_reader_deinit(&r);
    }
  }
  CHECK_EQ(bad, 0);

  /* in pieces of every size, byte by byte included */
  bad = 0;
  for (size_t chunk = 1; chunk <= len; chunk++) {
    ipc_reader_init(&r, 4096);
    if (feed_chunks(&r, buf, len, chunk, &g) || !all_there(&g, stream, NSTREAM))
      bad++;
    got_reset(&g);
    ipc_reader_deinit(&r);
  }
  CHECK_EQ(bad, 0);
}

/* ---- limits ---- */

static void test_oversize(void) {
  enum { LIMIT = 64 };
  char big[200], buf[2048];
  memset(big, 'B', sizeof(big));
  spec_t over = {IPC_PUBLISH, 2, "big", 3, big, sizeof(big) - 3}; /* body 200 */
  spec_t at_limit = {IPC_DELIVER, 0, "lim", 3, big, LIMIT - 3};   /* body 64 */
  spec_t one_over = {IPC_DELIVER, 0, "lim", 3, big, LIMIT - 2};   /* body 65 */
  spec_t after = {IPC_SUB, 0, "next", 4, NULL, 0};
  spec_t after2 = {IPC_PUBLISH, 0, "n2", 2, "m", 1};

  size_t len = 0;
  put(buf, &len, &over);
  put(buf, &len, &after);
  put(buf, &len, &at_limit);
  put(buf, &len, &one_over);
  put(buf, &len, &after2);
  spec_t want[] = {after, at_limit, after2};

  got_t g = {0};
  ipc_reader_t r;
  ipc_reader_init(&r, LIMIT);
  CHECK_EQ(ipc_reader_feed(&r, buf, len, on_frame, on_oversize, &g), 0);
  CHECK(all_there(&g, want, 3));
  CHECK_EQ(g.oversize, 2);
  CHECK_EQ(g.ov_body, LIMIT + 1); /* the last one refused */
  CHECK_EQ(g.ov_limit, LIMIT);
  got_reset(&g);
  ipc_reader_deinit(&r);

  /* one oversized frame then one good one, split at every byte boundary
   * and byte by byte: on_oversize exactly once each time */
  len = 0;
  put(buf, &len, &over);
  put(buf, &len, &after);
  int bad = 0, bad_count = 0, bad_args = 0;
  for (size_t cut = 0; cut <= len; cut++) {
    ipc_reader_init(&r, LIMIT);
    ipc_reader_feed(&r, buf, cut, on_frame, on_oversize, &g);
    ipc_reader_feed(&r, buf + cut, len - cut, on_frame, on_oversize, &g);
    if (!all_there(&g, &after, 1)) bad++;
    if (g.oversize != 1) bad_count++;
    if (g.ov_body != 200 || g.ov_limit != LIMIT) bad_args++;
    got_reset(&g);
    ipc_reader_deinit(&r);
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(bad_count, 0);
  CHECK_EQ(bad_args, 0);
  ipc_reader_init(&r, LIMIT);
  feed_chunks(&r, buf, len, 1, &g);
  CHECK(all_there(&g, &after, 1));
  CHECK_EQ(g.oversize, 1);
  got_reset(&g);
  ipc_reader_deinit(&r);

  /* without an on_oversize callback the frame is still skipped */
  ipc_reader_init(&r, LIMIT);
  CHECK_EQ(ipc_reader_feed(&r, buf, len, on_frame, NULL, &g), 0);
  CHECK(all_there(&g, &after, 1));
  got_reset(&g);
  ipc_reader_deinit(&r);
}

/* A header whose channel is longer than its body. */
static size_t put_malformed(char *buf, size_t len, uint32_t body,
                            uint16_t clen) {
  char h[IPC_HEADER] = {0};
  memcpy(h, &body, 4);
  h[4] = IPC_PUBLISH;
  memcpy(h + 6, &clen, 2);
  memcpy(buf + len, h, IPC_HEADER);
  len += IPC_HEADER;
  memset(buf + len, 'm', body);
  return len + body;
}

static void test_malformed(void) {
  char buf[512];
  spec_t after = {IPC_PUBLISH, 0, "ok", 2, "fine", 4};
  size_t len = put_malformed(buf, 0, 3, 10);
  put(buf, &len, &after);
  got_t g = {0};
  ipc_reader_t r;

  int bad = 0, oversize_calls = 0;
  for (size_t cut = 0; cut <= len; cut++) {
    ipc_reader_init(&r, 4096);
    ipc_reader_feed(&r, buf, cut, on_frame, on_oversize, &g);
    ipc_reader_feed(&r, buf + cut, len - cut, on_frame, on_oversize, &g);
    if (!all_there(&g, &after, 1)) bad++;
    if (g.oversize > 1) oversize_calls++;
    got_reset(&g);
    ipc_reader_deinit(&r);
  }
  CHECK_EQ(bad, 0);
  CHECK_EQ(oversize_calls, 0); /* reported at most once, like an oversized one */

  /* body 0 with a channel of 1: nothing to skip; the next frame follows */
  len = put_malformed(buf, 0, 0, 1);
  put(buf, &len, &after);
  ipc_reader_init(&r, 4096);
  ipc_reader_feed(&r, buf, len, on_frame, on_oversize, &g);
  CHECK(all_there(&g, &after, 1));
  got_reset(&g);
  ipc_reader_deinit(&r);

  /* a channel exactly as long as the body is fine: an empty message */
  spec_t exact = {IPC_SUB, 0, "abc", 3, NULL, 0};
  len = 0;
  put(buf, &len, &exact);
  ipc_reader_init(&r, 3);
  ipc_reader_feed(&r, buf, len, on_frame, on_oversize, &g);
  CHECK(all_there(&g, &exact, 1));
  CHECK_EQ(g.oversize, 0);
  got_reset(&g);
  ipc_reader_deinit(&r);
}

/* ---- a big frame, and a reader dropped mid-frame ---- */

static void test_big_and_deinit(void) {
  size_t mlen = (size_t)1 << 20;
  char *msg = malloc(mlen);
  char *buf = malloc(mlen + 64);
  CHECK(msg && buf);
  if (!msg || !buf) {
    free(msg);
    free(buf);
    return;
  }
  for (size_t i = 0; i < mlen; i++) msg[i] = (char)(i * 31 + 7);
  spec_t big = {IPC_DELIVER, 0x80u, "big.channel", 11, msg, mlen};
  spec_t small = {IPC_UNSUB, 0, "s", 1, NULL, 0};
  size_t len = 0;
  put(buf, &len, &big);
  put(buf, &len, &small);
  spec_t want[] = {big, small};
  got_t g = {0};
  ipc_reader_t r;
  ipc_reader_init(&r, 4096 + ((size_t)8 << 20));
  CHECK_EQ(feed_chunks(&r, buf, len, 65536, &g), 0);
  CHECK(all_there(&g, want, 2));
  got_reset(&g);
  CHECK_EQ(feed_chunks(&r, buf, len, 4093, &g), 0); /* odd-sized pieces */
  CHECK(all_there(&g, want, 2));
  got_reset(&g);
  /* half a frame, then the reader goes away: nothing leaks (ASan) */
  ipc_reader_feed(&r, buf, len / 2, on_frame, on_oversize, &g);
  CHECK_EQ(g.n, 0);
  ipc_reader_deinit(&r);
  ipc_reader_deinit(&r); /* twice is harmless */
  /* half a header, then deinit */
  ipc_reader_init(&r, 64);
  ipc_reader_feed(&r, buf, 3, on_frame, on_oversize, &g);
  ipc_reader_deinit(&r);
  got_reset(&g);
  free(msg);
  free(buf);
}

int main(void) {
  test_header();
  test_stream();
  test_oversize();
  test_malformed();
  test_big_and_deinit();
  return check_summary();
}
