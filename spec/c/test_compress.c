/* SPDX-License-Identifier: MIT */

/* Unit test: the pure parts of response compression (Accept-Encoding
 * with q-values, the media types) and the gzip stream of SSE and
 * streamed bodies, checked by zlib's inflate piece by piece: each flushed
 * piece must decode whole before the next one is given. Every header
 * value ends right before an unreadable page (a read past it faults).
 * Then the filter in a server's chain, over HTTP/1.1 on a real reactor
 * (its own thread, one end of a socketpair per connection, as
 * test_response.c): a whole body (one shot, Content-Length), a streamed
 * one (chunked, inflated after de-chunking), a file, a small body, a
 * client without Accept-Encoding; every body inflated and compared. */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <brotli/decode.h>
#include <sys/stat.h>
#include <zlib.h>

#include "check.h"
#include "http/compress.h"
#include "http/server.h"

#define GZ (1u << HTTP_CODING_GZIP)
#define BR (1u << HTTP_CODING_BR)

static int pick(const char *v, unsigned allow) {
  return http_coding_pick(check_guard(v), strlen(v), allow);
}

static void test_pick(void) {
  CHECK_EQ(http_coding_pick(NULL, 0, GZ | BR), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("", GZ | BR), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzip", GZ | BR), HTTP_CODING_GZIP);
  CHECK_EQ(pick("x-gzip", GZ), HTTP_CODING_GZIP);
  CHECK_EQ(pick("br", GZ | BR), HTTP_CODING_BR);
  CHECK_EQ(pick("br", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzip, deflate, br", GZ | BR), HTTP_CODING_BR);
  CHECK_EQ(pick("gzip, deflate, br", GZ), HTTP_CODING_GZIP);
  CHECK_EQ(pick("br;q=0.5, gzip", GZ | BR), HTTP_CODING_GZIP);
  CHECK_EQ(pick("br;q=0.5, gzip;q=0.4", GZ | BR), HTTP_CODING_BR);
  CHECK_EQ(pick("gzip;q=0", GZ | BR), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzip;q=0.000", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzip;q=0.001", GZ), HTTP_CODING_GZIP);
  CHECK_EQ(pick("gzip ; q = 1.0", GZ), HTTP_CODING_GZIP);
  CHECK_EQ(pick("GZip;Q=1", GZ), HTTP_CODING_GZIP);
  CHECK_EQ(pick("*", GZ | BR), HTTP_CODING_BR);
  CHECK_EQ(pick("*;q=0", GZ | BR), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("*;q=0.3, gzip;q=0", GZ | BR), HTTP_CODING_BR);
  CHECK_EQ(pick("*, br;q=0", GZ | BR), HTTP_CODING_GZIP);
  CHECK_EQ(pick("gzip;q=0.5, identity", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzip;q=0.5, identity;q=0.4", GZ), HTTP_CODING_GZIP);
  CHECK_EQ(pick("identity;q=0", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("identity;q=0, gzip", GZ), HTTP_CODING_GZIP);
  /* malformed q values refuse their coding, never more */
  CHECK_EQ(pick("gzip;q=2", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzip;q=1.5", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzip;q=abc, br", GZ | BR), HTTP_CODING_BR);
  CHECK_EQ(pick("gzip;q=0.12345", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzip;q", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzip;a=\"x,y\";q=1", GZ), HTTP_CODING_GZIP);
  CHECK_EQ(pick("gzip;a=\"unterminated", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick("gzipx", GZ), HTTP_CODING_IDENTITY);
  CHECK_EQ(pick(",,, gzip ,", GZ), HTTP_CODING_GZIP);
  CHECK_EQ(pick("gzip;q=0, gzip", GZ), HTTP_CODING_GZIP); /* the higher one */
}

static bool type_ok(const http_compress_cfg_t *cfg, const char *t) {
  return http_compress_type_ok(cfg, check_guard(t), strlen(t));
}

static void test_types(void) {
  http_compress_cfg_t cfg;
  http_compress_cfg_init(&cfg);
  CHECK(type_ok(&cfg, "text/html"));
  CHECK(type_ok(&cfg, "text/plain; charset=utf-8"));
  CHECK(type_ok(&cfg, "TEXT/CSS"));
  CHECK(type_ok(&cfg, "application/json"));
  CHECK(type_ok(&cfg, "application/json;charset=utf-8"));
  CHECK(type_ok(&cfg, "image/svg+xml"));
  CHECK(!type_ok(&cfg, "image/png"));
  CHECK(!type_ok(&cfg, "application/gzip"));
  CHECK(!type_ok(&cfg, "application/zip"));
  CHECK(!type_ok(&cfg, "text/"));
  CHECK(!type_ok(&cfg, "application/jsonx"));
  CHECK(!type_ok(&cfg, ""));
  cfg.ntypes = 1;
  strcpy(cfg.types[0], "application/x-mine");
  CHECK(type_ok(&cfg, "application/x-mine"));
  CHECK(!type_ok(&cfg, "text/html"));
}

/* The decoder of the stream under test. */
typedef struct {
  z_stream z;
  char text[65536];
  size_t len;
} inflater_t;

static int feed(void *ctx, const char *p, size_t n) {
  inflater_t *in = ctx;
  in->z.next_in = (unsigned char *)(uintptr_t)p;
  in->z.avail_in = (uInt)n;
  while (in->z.avail_in) {
    in->z.next_out = (unsigned char *)in->text + in->len;
    in->z.avail_out = (uInt)(sizeof(in->text) - in->len);
    int zr = inflate(&in->z, Z_SYNC_FLUSH);
    in->len = sizeof(in->text) - in->z.avail_out;
    if (zr != Z_OK && zr != Z_STREAM_END) return -5;
    if (zr == Z_STREAM_END) break;
  }
  return 0;
}

static void test_stream(void) {
  inflater_t in;
  memset(&in, 0, sizeof(in));
  CHECK_EQ(inflateInit2(&in.z, 16 + 15), Z_OK);
  http_gz_t *g = http_gz_new(HTTP_CODING_GZIP, 5);
  CHECK(g != NULL);
  char piece[64];
  size_t want = 0;
  for (int i = 0; i < 200; i++) {
    int n = snprintf(piece, sizeof(piece), "data: event number %d\n\n", i);
    CHECK_EQ(http_gz_push(g, piece, (size_t)n, false, feed, &in), 0);
    want += (size_t)n;
    /* flushed: everything so far decodes now */
    if (in.len != want) {
      CHECK_EQ(in.len, want);
      break;
    }
  }
  /* a big piece: more output than one buffer of the stream */
  char *big = malloc(40000);
  for (int i = 0; i < 40000; i++) big[i] = (char)('a' + (i * 7919) % 26);
  CHECK_EQ(http_gz_push(g, big, 20000, false, feed, &in), 0);
  CHECK_EQ(in.len, want + 20000);
  CHECK_EQ(http_gz_push(g, NULL, 0, true, feed, &in), 0);
  size_t zin, zout;
  http_gz_counts(g, &zin, &zout);
  CHECK_EQ(zin, want + 20000);
  CHECK(zout > 0 && zout < zin);
  CHECK(memcmp(in.text + want, big, 20000) == 0);
  free(big);
  http_gz_free(g);
  inflateEnd(&in.z);
}

/* The decoder of a br stream under test. */
typedef struct {
  BrotliDecoderState *d;
  char text[65536];
  size_t len;
} unbr_t;

static int feed_br(void *ctx, const char *p, size_t n) {
  unbr_t *in = ctx;
  const uint8_t *next_in = (const uint8_t *)p;
  size_t avail_in = n;
  for (;;) {
    uint8_t *next_out = (uint8_t *)in->text + in->len;
    size_t avail_out = sizeof(in->text) - in->len;
    BrotliDecoderResult r = BrotliDecoderDecompressStream(
        in->d, &avail_in, &next_in, &avail_out, &next_out, NULL);
    in->len = sizeof(in->text) - avail_out;
    if (r == BROTLI_DECODER_RESULT_ERROR) return -5;
    if (r != BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT) break;
  }
  return 0;
}

/* A br stream: every flushed piece decodes whole before the next. */
static void test_br_stream(void) {
  unbr_t in;
  memset(&in, 0, sizeof(in));
  in.d = BrotliDecoderCreateInstance(NULL, NULL, NULL);
  http_gz_t *g = http_gz_new(HTTP_CODING_BR, 5);
  CHECK(g != NULL);
  char piece[64];
  size_t want = 0;
  for (int i = 0; i < 200; i++) {
    int n = snprintf(piece, sizeof(piece), "data: event number %d\n\n", i);
    CHECK_EQ(http_gz_push(g, piece, (size_t)n, false, feed_br, &in), 0);
    want += (size_t)n;
    if (in.len != want) {
      CHECK_EQ(in.len, want);
      break;
    }
  }
  char *big = malloc(40000);
  for (int i = 0; i < 40000; i++) big[i] = (char)('a' + (i * 7919) % 26);
  CHECK_EQ(http_gz_push(g, big, 40000, false, feed_br, &in), 0);
  CHECK_EQ(in.len, want + 40000);
  CHECK_EQ(http_gz_push(g, NULL, 0, true, feed_br, &in), 0);
  CHECK(BrotliDecoderIsFinished(in.d));
  size_t zin, zout;
  http_gz_counts(g, &zin, &zout);
  CHECK_EQ(zin, want + 40000);
  CHECK(zout > 0 && zout < zin);
  CHECK(memcmp(in.text + want, big, 40000) == 0);
  free(big);
  http_gz_free(g);
  BrotliDecoderDestroyInstance(in.d);
}

/* gunzip of p[0..n) equals the file's text. */
static bool gz_is(const char *p, size_t n, const char *text, size_t tl) {
  inflater_t *in = calloc(1, sizeof(*in));
  inflateInit2(&in->z, 16 + 15);
  bool ok = feed(in, p, n) == 0 && in->len == tl && !memcmp(in->text, text, tl);
  inflateEnd(&in->z);
  free(in);
  return ok;
}

static int cache_file(const char *path, const char *text, size_t n,
                      struct stat *st) {
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  CHECK(fd >= 0);
  CHECK_EQ(write(fd, text, n), (ssize_t)n);
  fstat(fd, st);
  return fd;
}

/* The compressed-file cache: a hit gives the kept bytes without
 * compressing (the stats do not move), a changed file is compressed
 * again, the least recently used entry goes when the bytes would pass
 * cfg.cache, and a result larger than cfg.cache is never kept. */
static void test_zcache(void) {
  http_compress_cfg_t cfg;
  http_compress_cfg_init(&cfg);
  stats_slot_t *sl = calloc(1, sizeof(*sl));
  char dir[] = "/tmp/test_compress_XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char pa[64], pb[64];
  snprintf(pa, sizeof(pa), "%s/a", dir);
  snprintf(pb, sizeof(pb), "%s/b", dir);
  char *ta = malloc(8000), *tb = malloc(8000);
  srand(27);
  for (int i = 0; i < 8000; i++) {
    ta[i] = "0123456789abcdef"[rand() % 16]; /* compresses to about half */
    tb[i] = "0123456789abcdef"[rand() % 16];
  }
  struct stat sa, sb;
  int fa = cache_file(pa, ta, 4000, &sa), fb = cache_file(pb, tb, 4000, &sb);
  size_t la, lb, l2;
  cfg.cache = 3000; /* one ~2 KB entry fits, two do not */
  const char *za = http_zcache_file(&cfg, fa, &sa, HTTP_CODING_GZIP, &la, sl);
  CHECK(za && gz_is(za, la, ta, 4000));
  CHECK(la > 1500 && la < 2900);
  CHECK_EQ(sl->v[STAT_HTTP_COMP_IN], 4000u);
  const char *z2 = http_zcache_file(&cfg, fa, &sa, HTTP_CODING_GZIP, &l2, sl);
  CHECK(z2 == za && l2 == la); /* the kept bytes */
  CHECK_EQ(sl->v[STAT_HTTP_COMP_IN], 4000u);
  CHECK_EQ(sl->v[STAT_HTTP_COMP_CACHED], 1u);
  const char *zb = http_zcache_file(&cfg, fb, &sb, HTTP_CODING_GZIP, &lb, sl);
  CHECK(zb && gz_is(zb, lb, tb, 4000));
  CHECK_EQ(sl->v[STAT_HTTP_COMP_IN], 8000u); /* b pushed a out */
  za = http_zcache_file(&cfg, fa, &sa, HTTP_CODING_GZIP, &la, sl);
  CHECK(za && gz_is(za, la, ta, 4000));
  CHECK_EQ(sl->v[STAT_HTTP_COMP_IN], 12000u);
  CHECK_EQ(sl->v[STAT_HTTP_COMP_CACHED], 1u);
  /* a changes: compressed again, with its new bytes */
  close(fa);
  struct timespec later = {sa.st_mtim.tv_sec + 5, 0};
  fa = cache_file(pa, tb, 4000, &sa);
  struct timespec ts[2] = {later, later};
  futimens(fa, ts);
  fstat(fa, &sa);
  za = http_zcache_file(&cfg, fa, &sa, HTTP_CODING_GZIP, &la, sl);
  CHECK(za && gz_is(za, la, tb, 4000));
  CHECK_EQ(sl->v[STAT_HTTP_COMP_IN], 16000u);
  za = http_zcache_file(&cfg, fa, &sa, HTTP_CODING_GZIP, &la, sl);
  CHECK_EQ(sl->v[STAT_HTTP_COMP_CACHED], 2u);
  /* larger than the cache: sent, not kept, and nothing pushed out */
  close(fb);
  fb = cache_file(pb, ta, 8000, &sb);
  for (int i = 0; i < 2; i++) {
    zb = http_zcache_file(&cfg, fb, &sb, HTTP_CODING_GZIP, &lb, sl);
    CHECK(zb && lb > 3000 && gz_is(zb, lb, ta, 8000));
  }
  CHECK_EQ(sl->v[STAT_HTTP_COMP_IN], 32000u);
  za = http_zcache_file(&cfg, fa, &sa, HTTP_CODING_GZIP, &la, sl);
  CHECK_EQ(sl->v[STAT_HTTP_COMP_CACHED], 3u);
  /* cache = 0 keeps nothing */
  cfg.cache = 0;
  za = http_zcache_file(&cfg, fa, &sa, HTTP_CODING_BR, &la, sl);
  za = http_zcache_file(&cfg, fa, &sa, HTTP_CODING_BR, &la, sl);
  CHECK(za != NULL);
  CHECK_EQ(sl->v[STAT_HTTP_COMP_CACHED], 3u);
  close(fa);
  close(fb);
  unlink(pa);
  unlink(pb);
  rmdir(dir);
  free(ta);
  free(tb);
  free(sl);
}

/* ---- the filter in a server ---- */

static reactor_t *g_r;
static http_cache_t *g_cache;
static int g_log_fd = -1;
static char g_file[64];
static char g_text[20000]; /* the bodies: compressible text */
static http_compress_cfg_t g_cfg;
static http_filter_t g_filter;

typedef struct {
  proto_t proto;
  http_server_t srv;
} svc_t;
static svc_t g_svc;

static bool target_is(const http_exchange_t *x, const char *t) {
  return x->req->target_len == strlen(t) &&
         memcmp(x->req->target, t, x->req->target_len) == 0;
}

static void on_request(http_exchange_t *x, const char *body, size_t blen) {
  static const char type[] = "Content-Type: text/plain\r\nETag: \"e1\"\r\n";
  http_head_t h = http_exchange_head(x, 200);
  h.headers = type;
  h.hlen = sizeof(type) - 1;
  h.has_type = true;
  if (target_is(x, "/stream")) {
    http_res_head(x, &h, -1);
    for (int i = 0; i < 4; i++)
      http_res_write(x, g_text + i * 3000, 3000, NULL, NULL, NULL);
    http_res_end(x, NULL, 0);
  } else if (target_is(x, "/file")) {
    http_res_sendfile(x, &h, open(g_file, O_RDONLY | O_CLOEXEC), 0,
                      sizeof(g_text));
  } else if (target_is(x, "/small")) {
    http_res_send(x, &h, g_text, 50, NULL, NULL, NULL);
  } else {
    http_res_send(x, &h, g_text, 8000, NULL, NULL, NULL);
  }
}

static void on_open(conn_t *c) {
  svc_t *svc = reactor_conn_service(c);
  http_server_accept(&svc->srv, c);
}

static void on_close(conn_t *c, int reason) {
  http_conn_closed(c, reactor_conn_udata(c), reason);
}

static void adopt(void *a, void *b) {
  svc_t *svc = b;
  reactor_adopt(g_r, (int)(intptr_t)a, &svc->proto, svc,
                (conn_opts_t){.timeout_ms = svc->srv.header_timeout_ms});
}

static void *run(void *arg) {
  reactor_run(g_r);
  return NULL;
}

/* One request (Connection: close) with Accept-Encoding `ae` (NULL:
 * none); the answer to the close, NUL-terminated, static. */
static const char *ask(const char *target, const char *ae, size_t *n) {
  static char buf[65536];
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) exit(1);
  struct timeval tv = {.tv_sec = 3};
  setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  if (reactor_post(g_r, adopt, (void *)(intptr_t)sv[1], &g_svc)) exit(1);
  char req[256];
  int rl = snprintf(req, sizeof(req),
                    "GET %s HTTP/1.1\r\nHost: x\r\n%s%s%sConnection: "
                    "close\r\n\r\n",
                    target, ae ? "Accept-Encoding: " : "", ae ? ae : "",
                    ae ? "\r\n" : "");
  if (write(sv[0], req, (size_t)rl) != rl) exit(1);
  size_t at = 0;
  ssize_t r;
  while (at < sizeof(buf) - 1 &&
         (r = read(sv[0], buf + at, sizeof(buf) - 1 - at)) > 0)
    at += (size_t)r;
  buf[at] = 0;
  close(sv[0]);
  *n = at;
  return buf;
}

/* The body of a response (de-chunked when chunked) into out; its length,
 * or -1 when malformed. */
static long body(const char *resp, size_t n, char *out, size_t cap) {
  const char *b = strstr(resp, "\r\n\r\n");
  if (!b) return -1;
  b += 4;
  size_t blen = n - (size_t)(b - resp);
  if (!strstr(resp, "Transfer-Encoding: chunked")) {
    if (blen > cap) return -1;
    memcpy(out, b, blen);
    return (long)blen;
  }
  size_t at = 0;
  for (;;) {
    char *end;
    unsigned long k = strtoul(b, &end, 16);
    if (end == b || strncmp(end, "\r\n", 2)) return -1;
    b = end + 2;
    if (!k) return (long)at;
    if (at + k > cap) return -1;
    memcpy(out + at, b, k);
    at += k;
    b += k + 2;
  }
}

/* gunzip of p[0..n) equals want[0..wn). */
static bool gunzips_to(const char *p, size_t n, const char *want, size_t wn) {
  static char out[65536];
  z_stream z;
  memset(&z, 0, sizeof(z));
  if (inflateInit2(&z, 16 + 15) != Z_OK) return false;
  z.next_in = (unsigned char *)(uintptr_t)p;
  z.avail_in = (uInt)n;
  z.next_out = (unsigned char *)out;
  z.avail_out = sizeof(out);
  int zr = inflate(&z, Z_FINISH);
  size_t got = sizeof(out) - z.avail_out;
  inflateEnd(&z);
  return zr == Z_STREAM_END && got == wn && memcmp(out, want, wn) == 0;
}

static void test_filter(void) {
  signal(SIGPIPE, SIG_IGN);
  if (sock_init()) exit(1);
  g_r = reactor_new(0);
  if (!g_r) exit(1);
  char logpath[] = "/tmp/mp-test-compress-log-XXXXXX";
  g_log_fd = mkstemp(logpath);
  for (size_t i = 0; i < sizeof(g_text); i++)
    g_text[i] = "the quick brown fox jumps over the lazy dog\n"[(i * 7) % 44];
  strcpy(g_file, "/tmp/mp-test-compress-file-XXXXXX");
  int ff = mkstemp(g_file);
  if (write(ff, g_text, sizeof(g_text)) != (ssize_t)sizeof(g_text)) exit(1);
  close(ff);
  http_compress_cfg_init(&g_cfg);
  g_cfg.min_size = 100;
  http_compress_filter_init(&g_filter, &g_cfg);
  g_svc.proto = http_server_proto(on_open, on_close);
  http_server_t *s = &g_svc.srv;
  s->r = g_r;
  s->max_header = 1024;
  s->header_timeout_ms = 3000;
  s->idle_ms = 5000;
  s->public_fd = -1;
  s->access_fd = &g_log_fd;
  s->cache = &g_cache;
  s->conn_size = sizeof(http_conn_t);
  s->on_request = on_request;
  s->filters[0] = &g_filter;
  s->nfilters = 1;
  pthread_t th;
  pthread_create(&th, NULL, run, NULL);
  static char b[65536];
  size_t n;
  const char *got;
  long bl;

  /* whole: one shot, Content-Length of the compressed bytes */
  got = ask("/whole", "gzip", &n);
  CHECK(strstr(got, "\r\nContent-Encoding: gzip\r\n") != NULL);
  CHECK(strstr(got, "\r\nVary: Accept-Encoding\r\n") != NULL);
  CHECK(strstr(got, "\r\nETag: W/\"e1\"\r\n") != NULL);
  CHECK(!strstr(got, "chunked"));
  bl = body(got, n, b, sizeof(b));
  char cl[64];
  snprintf(cl, sizeof(cl), "\r\nContent-Length: %ld\r\n", bl);
  CHECK(strstr(got, cl) != NULL);
  CHECK(bl > 0 && bl < 1000);
  CHECK(bl > 0 && gunzips_to(b, (size_t)bl, g_text, 8000));

  /* the stream: chunked, one gzip stream over the pieces */
  got = ask("/stream", "gzip", &n);
  CHECK(strstr(got, "\r\nTransfer-Encoding: chunked\r\n") != NULL);
  CHECK(strstr(got, "\r\nContent-Encoding: gzip\r\n") != NULL);
  bl = body(got, n, b, sizeof(b));
  CHECK(bl > 0 && gunzips_to(b, (size_t)bl, g_text, 12000));

  /* a file through the filter: read whole, Content-Length */
  got = ask("/file", "br;q=0.1, gzip", &n);
  CHECK(strstr(got, "\r\nContent-Encoding: gzip\r\n") != NULL);
  CHECK(strstr(got, "\r\nContent-Length: ") != NULL);
  bl = body(got, n, b, sizeof(b));
  CHECK(bl > 0 && gunzips_to(b, (size_t)bl, g_text, sizeof(g_text)));

  /* br for a whole body when preferred: its bytes are not gzip's */
  got = ask("/whole", "gzip;q=0.5, br", &n);
  CHECK(strstr(got, "\r\nContent-Encoding: br\r\n") != NULL);

  /* small, and no Accept-Encoding: plain, with Vary */
  got = ask("/small", "gzip", &n);
  CHECK(!strstr(got, "Content-Encoding"));
  CHECK(strstr(got, "\r\nVary: Accept-Encoding\r\n") != NULL);
  CHECK(strstr(got, "\r\nContent-Length: 50\r\n") != NULL);
  got = ask("/whole", NULL, &n);
  CHECK(!strstr(got, "Content-Encoding"));
  CHECK(strstr(got, "\r\nETag: \"e1\"\r\n") != NULL);
  bl = body(got, n, b, sizeof(b));
  CHECK(bl == 8000 && memcmp(b, g_text, 8000) == 0);

  reactor_shutdown(g_r, 0);
  pthread_join(th, NULL);
  reactor_free(g_r);
  http_cache_free(g_cache);
  close(g_log_fd);
  unlink(g_file);
  unlink(logpath);
  sock_deinit();
}

int main(void) {
  alarm(60);
  test_pick();
  test_types();
  test_stream();
  test_br_stream();
  test_zcache();
  test_filter();
  return check_summary();
}
