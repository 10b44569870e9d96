/* SPDX-License-Identifier: MIT */

/* Unit test: the HTTP/1.x request parser and the chunked decoder. */
#include <stdlib.h>
#include <string.h>

#include "http/http1.h"
#include "check.h"

static http_request_t req;

static int parse(const char *s) {
  return http_parse_head(s, strlen(s), 8192, &req);
}

static bool str_is(const char *p, uint32_t n, const char *want) {
  return n == strlen(want) && memcmp(p, want, n) == 0;
}

static void test_simple(void) {
  const char *s = "GET /a/b?x=1 HTTP/1.1\r\nHost: example.com\r\n"
                  "User-Agent:  curl/8  \r\nAccept: */*\r\n\r\nrest";
  CHECK_EQ(parse(s), (int)strlen(s) - 4);
  CHECK(str_is(req.method, req.method_len, "GET"));
  CHECK(str_is(req.target, req.target_len, "/a/b?x=1"));
  CHECK_EQ(req.minor, 1);
  CHECK_EQ(req.nheaders, 3);
  CHECK(str_is(req.headers[1].value, req.headers[1].value_len, "curl/8"));
  const http_header_t *h = http_header(&req, "user-agent");
  CHECK(h && str_is(h->value, h->value_len, "curl/8"));
  CHECK(http_header(&req, "x-none") == NULL);
  CHECK(req.keep_alive);
  CHECK_EQ(req.content_length, -1);
  CHECK(!req.chunked && !req.expect_continue && !req.upgrade);
}

static void test_partial(void) {
  const char *s = "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello";
  size_t head = strlen(s) - 5;
  for (size_t n = 0; n < head; n++)
    CHECK_EQ(http_parse_head(s, n, 8192, &req), HTTP_NEED_MORE);
  CHECK_EQ(http_parse_head(s, head, 8192, &req), (int)head);
  CHECK_EQ(req.content_length, 5);
  /* bare LF line ends, and empty lines before the request line */
  CHECK_EQ(parse("\r\n\nGET / HTTP/1.0\nA: b\n\n"), 24);
  CHECK_EQ(req.minor, 0);
  CHECK(!req.keep_alive);
}

static void test_limits(void) {
  char big[9000];
  memset(big, 'a', sizeof(big));
  memcpy(big, "GET /", 5);
  CHECK_EQ(http_parse_head(big, sizeof(big), 8192, &req), HTTP_HEAD_TOO_LARGE);
  CHECK_EQ(http_parse_head(big, 8191, 8192, &req), HTTP_NEED_MORE);
  /* a head that ends past the limit is too large even if whole */
  char *h = malloc(20000);
  size_t n = (size_t)sprintf(h, "GET / HTTP/1.1\r\nHost: x\r\n");
  char val[201];
  memset(val, 'v', 200);
  val[200] = 0;
  while (n < 9000) n += (size_t)sprintf(h + n, "X-A: %s\r\n", val);
  n += (size_t)sprintf(h + n, "\r\n");
  CHECK_EQ(http_parse_head(h, n, 8192, &req), HTTP_HEAD_TOO_LARGE);
  CHECK_EQ(http_parse_head(h, n, 16384, &req), (int)n);
  /* too many fields */
  n = (size_t)sprintf(h, "GET / HTTP/1.1\r\nHost: x\r\n");
  for (int i = 0; i < HTTP_MAX_HEADERS; i++) n += (size_t)sprintf(h + n, "A: b\r\n");
  n += (size_t)sprintf(h + n, "\r\n");
  CHECK_EQ(http_parse_head(h, n, 16384, &req), HTTP_HEAD_TOO_LARGE);
  free(h);
}

static void test_target_forms(void) {
  const char *good[] = {
      "OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET HTTPS://x/y HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET http://x:8080 HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET http://[::1]:8080/p HTTP/1.1\r\nHost: x\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
    CHECK_EQ(parse(good[i]), (int)strlen(good[i]));
  /* absolute-form: http or https only, a host, no userinfo (RFC 9110
   * 4.2.1, 4.2.4; nginx refuses these too) */
  const char *bad[] = {
      "GET coap+tcp://x/y HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET ftp://a.example/p HTTP/1.1\r\nHost: a.example\r\n\r\n",
      "GET http://user@a.example/p HTTP/1.1\r\nHost: a.example\r\n\r\n",
      "GET http://u:pw@a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n",
      "GET http:///p HTTP/1.1\r\nHost: a.example\r\n\r\n",
      "GET http://a:b:c/p HTTP/1.1\r\nHost: a\r\n\r\n",
      "GET http://a:70000/p HTTP/1.1\r\nHost: a\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    CHECK_EQ(parse(bad[i]), HTTP_BAD);
  /* the target's authority is the host, whatever Host says (RFC 9112
   * 3.2.2) */
  const char *s =
      "GET http://a.example:81/p?q HTTP/1.1\r\nHost: b.example\r\n\r\n";
  CHECK_EQ(parse(s), (int)strlen(s));
  const http_header_t *h = http_header(&req, "host");
  CHECK(h && str_is(h->value, h->value_len, "a.example:81"));
  CHECK_EQ(req.nheaders, 1);
  s = "GET HTTP://a.example HTTP/1.0\r\nHost: b\r\n\r\n";
  CHECK_EQ(parse(s), (int)strlen(s));
  h = http_header(&req, "host");
  CHECK(h && str_is(h->value, h->value_len, "a.example"));
  CHECK(h->value == req.target + 7);
  /* authority-form is CONNECT's own form, and CONNECT is not implemented
   * (moonport doesn't tunnel): 501, where "CONNECT /x" is malformed (400) */
  CHECK_EQ(parse("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n"),
           HTTP_NOT_IMPLEMENTED);
}

/* What nginx refuses and RFC 9112 / 9110 say to refuse (issue 14). */
static void test_validation(void) {
  /* Host must be uri-host[:port] */
  CHECK_EQ(parse("GET / HTTP/1.1\r\nHost: a b\r\n\r\n"), HTTP_BAD);
  CHECK_EQ(parse("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n"), HTTP_BAD);
  CHECK_EQ(parse("GET / HTTP/1.1\r\nHost: a?b\r\n\r\n"), HTTP_BAD);
  CHECK_EQ(parse("GET / HTTP/1.1\r\nHost: u@h\r\n\r\n"), HTTP_BAD);
  CHECK_EQ(parse("GET / HTTP/1.1\r\nHost: caf\xc3\xa9\r\n\r\n"), HTTP_BAD);
  const char *bad_hosts[] = {"a:b:c",  "a:99999999", "[::1",  "a:65536", "[]",
                             "[::1]x", "a]",         "[::g]", "a[b"};
  for (size_t i = 0; i < sizeof(bad_hosts) / sizeof(bad_hosts[0]); i++) {
    char buf[128];
    snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\nHost: %s\r\n\r\n",
             bad_hosts[i]);
    if (parse(buf) != HTTP_BAD) printf("  Host: %s was taken\n", bad_hosts[i]);
    CHECK_EQ(parse(buf), HTTP_BAD);
  }
  const char *hosts[] = {
      "x",         "example.com:8080",    "[::1]:8080", "",
      "a-b.c_d~e", "xn--caf-dma.example", "%41b",       "127.0.0.1",
      "a:",        "[::ffff:127.0.0.1]",  "a:65535"};
  for (size_t i = 0; i < sizeof(hosts) / sizeof(hosts[0]); i++) {
    char buf[128];
    snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", hosts[i]);
    CHECK_EQ(parse(buf), (int)strlen(buf));
  }
  /* the target is visible ASCII: a raw byte past 0x7e is refused */
  CHECK_EQ(parse("GET /caf\xc3\xa9 HTTP/1.1\r\nHost: x\r\n\r\n"), HTTP_BAD);
  CHECK_EQ(parse("GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n"), HTTP_BAD);
  CHECK(parse("GET /caf%C3%A9 HTTP/1.1\r\nHost: x\r\n\r\n") > 0);
  /* methods are case-sensitive: "get" is not GET, and no registered
   * method has a lower-case letter: 501; extension methods go through */
  CHECK_EQ(parse("get / HTTP/1.1\r\nHost: x\r\n\r\n"), HTTP_NOT_IMPLEMENTED);
  CHECK_EQ(parse("Get / HTTP/1.1\r\nHost: x\r\n\r\n"), HTTP_NOT_IMPLEMENTED);
  CHECK(parse("PURGE / HTTP/1.1\r\nHost: x\r\n\r\n") > 0);
  CHECK(parse("VERSION-CONTROL / HTTP/1.1\r\nHost: x\r\n\r\n") > 0);
  /* the request line of a refused head is still found for the log */
  size_t start = 99;
  CHECK_EQ(http_request_line_span("\r\nGET /x HTTP/1.1\r\nHost", 26, &start), 15);
  CHECK_EQ(start, 2);
  CHECK_EQ(http_request_line_span("GET /x HTTP/3.0\n", 16, &start), 15);
  CHECK_EQ(http_request_line_span("GET /x HTTP/1.1", 15, &start), -1); /* not whole */
  CHECK_EQ(http_request_line_span("BAD\1LINE\r\n\r\n", 13, &start), -1);
}

static void test_bad(void) {
  const char *bad[] = {
      "GET\r\n\r\n",
      "GET  / HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET / HTTP/1.1 \r\nHost: x\r\n\r\n",
      "G(T / HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET / HTTP/1.x\r\nHost: x\r\n\r\n",
      "GET / http/1.1\r\nHost: x\r\n\r\n",
      "GET / HTTP/1.1\r\n\r\n",                        /* no Host */
      "GET index.html HTTP/1.1\r\nHost: x\r\n\r\n",     /* no target form */
      "GET * HTTP/1.1\r\nHost: x\r\n\r\n",              /* '*': OPTIONS only */
      "GET ://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET 1http://x/ HTTP/1.1\r\nHost: x\r\n\r\n",
      "CONNECT /x HTTP/1.1\r\nHost: x\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",   /* two Hosts */
      "GET / HTTP/1.1\r\nHost : x\r\n\r\n",            /* space before : */
      "GET / HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n",  /* obs-fold */
      "GET / HTTP/1.1\r\nHost: x\r\nNoColon\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: x\r\nA: b\x01\r\n\r\n",  /* CTL */
      "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
      "Transfer-Encoding: chunked\r\n\r\n",             /* smuggling */
      "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
      "GET /a\x7f HTTP/1.1\r\nHost: x\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int rc = parse(bad[i]);
    if (rc != HTTP_BAD) printf("case %zu: %d\n", i, rc);
    CHECK_EQ(rc, HTTP_BAD);
  }
  CHECK_EQ(parse("GET / HTTP/2.0\r\nHost: x\r\n\r\n"), HTTP_BAD_VERSION);
  CHECK_EQ(parse("GET / HTTP/1.2\r\nHost: x\r\n\r\n"), HTTP_BAD_VERSION);
  CHECK_EQ(parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"),
           HTTP_NOT_IMPLEMENTED);
  CHECK_EQ(parse("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
           HTTP_NOT_IMPLEMENTED);
  /* the same length twice is fine */
  CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
              "Content-Length: 2\r\n\r\n") > 0);
  CHECK_EQ(req.content_length, 2);
}

static void test_flags(void) {
  CHECK(parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: Close\r\n\r\n") > 0);
  CHECK(!req.keep_alive);
  CHECK(parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n") > 0);
  CHECK(req.keep_alive);
  CHECK(parse("POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\n"
              "Transfer-Encoding: Chunked\r\n\r\n") > 0);
  CHECK(req.expect_continue && req.chunked);
  CHECK(parse("GET /ws HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\n"
              "Upgrade: websocket\r\n\r\n") > 0);
  CHECK(req.upgrade && req.keep_alive);
  CHECK(parse("GET http://x/abs?q HTTP/1.1\r\nHost: x\r\n\r\n") > 0);
  CHECK(str_is(req.target, req.target_len, "http://x/abs?q"));
  CHECK(http_list_has("a, b ,c", 7, "B"));
  CHECK(!http_list_has("ab, c", 5, "a"));
}

typedef struct {
  char buf[256];
  size_t n;
} sink_t;

static void collect(const char *p, size_t n, void *arg) {
  sink_t *s = arg;
  if (s->n + n <= sizeof(s->buf)) memcpy(s->buf + s->n, p, n);
  s->n += n;
}

/* Feeds `in` in pieces of `step` bytes; returns the bytes consumed, or
 * the error. */
static ssize_t feed(const char *in, size_t len, size_t step, sink_t *s,
                    bool *done) {
  http_chunked_t c;
  http_chunked_init(&c, 1024);
  memset(s, 0, sizeof(*s));
  size_t off = 0;
  *done = false;
  while (off < len && !*done) {
    size_t n = len - off < step ? len - off : step;
    ssize_t r = http_chunked_feed(&c, in + off, n, collect, s, done);
    if (r < 0) return r;
    off += (size_t)r;
    if ((size_t)r < n && !*done) return -1;
  }
  return (ssize_t)off;
}

static void test_chunked(void) {
  const char *body = "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT";
  size_t len = strlen(body);
  for (size_t step = 1; step <= len; step++) {
    sink_t s;
    bool done;
    ssize_t r = feed(body, len, step, &s, &done);
    CHECK_EQ(r, (ssize_t)len - 4);
    CHECK(done);
    CHECK_EQ(s.n, 11);
    CHECK(memcmp(s.buf, "hello world", 11) == 0);
  }
  sink_t s;
  bool done;
  CHECK_EQ(feed("0\r\n\r\n", 5, 5, &s, &done), 5);
  CHECK(done && s.n == 0);
  /* chunk framing is CRLF only (RFC 9112 7.1): a bare LF anywhere in it
   * is refused, as a request smuggling risk */
  const char *bad[] = {"x\r\n", "\r\n", "5\r\nhelloX\r\n", "5\rX",
                       "FFFFFFFFFFFFFFFFF\r\n", "5;\x01\r\n",
                       "A\n", "A;ext\n", "3\r\nabc\n", "0\r\n\n",
                       "0\r\nX-T: 1\n\r\n"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    CHECK_EQ(feed(bad[i], strlen(bad[i]), 64, &s, &done), HTTP_BAD);
  /* trailers over the limit */
  char *t = malloc(4096);
  size_t n = (size_t)sprintf(t, "0\r\n");
  while (n < 2000) n += (size_t)sprintf(t + n, "X-Trailer: 0123456789\r\n");
  n += (size_t)sprintf(t + n, "\r\n");
  CHECK_EQ(feed(t, n, 64, &s, &done), HTTP_BAD);
  free(t);
  /* The size line's limit counts every byte, leading zeros too: 5,000
   * zeros then "3" is refused like a 5,000-byte extension (byte by byte
   * and whole); 4,000 zeros are still a size line within it. */
  char *z = malloc(8192);
  memset(z, '0', 5000);
  n = 5000 + (size_t)sprintf(z + 5000, "3\r\nabc\r\n0\r\n\r\n");
  CHECK_EQ(feed(z, n, 1, &s, &done), HTTP_BAD);
  CHECK_EQ(feed(z, n, n, &s, &done), HTTP_BAD);
  n = 4000 + (size_t)sprintf(z + 4000, "3\r\nabc\r\n0\r\n\r\n");
  CHECK_EQ(feed(z + 1000, n - 1000, 64, &s, &done), (ssize_t)(n - 1000));
  CHECK(done && s.n == 3);
  memset(z, '0', 4090);
  n = 4090 + (size_t)sprintf(z + 4090, "3;abcdefgh\r\nabc\r\n0\r\n\r\n");
  CHECK_EQ(feed(z, n, 64, &s, &done), HTTP_BAD); /* digits + extension */
  free(z);
}

static void test_unescape(void) {
  char out[64];
  CHECK_EQ(http_unescape("/a%20b%2Fc", 10, out, false), 6);
  CHECK(memcmp(out, "/a b/c", 6) == 0);
  CHECK_EQ(http_unescape("a+b", 3, out, true), 3);
  CHECK(out[1] == ' ');
  CHECK_EQ(http_unescape("a+b", 3, out, false), 3);
  CHECK(out[1] == '+');
  CHECK_EQ(http_unescape("%2", 2, out, false), -1);
  CHECK_EQ(http_unescape("%zz", 3, out, false), -1);
  CHECK_EQ(http_unescape("%", 1, out, false), -1);
}

static bool split_is(const char *t, const char *p, const char *q) {
  const char *pp, *qq;
  size_t pl, ql;
  http_target_split(check_guard(t), strlen(t), &pp, &pl, &qq, &ql);
  if (pl != strlen(p) || memcmp(pp, p, pl) != 0) return false;
  if (!q) return qq == NULL;
  return qq && ql == strlen(q) && memcmp(qq, q, ql) == 0;
}

/* The one target splitter (the app's req.path/req.query and the static
 * lookup both use it): odd absolute forms included. */
static void test_split(void) {
  static const struct {
    const char *target, *path, *query;
  } cases[] = {
      {"/a/b", "/a/b", NULL},
      {"/a?x=1&y", "/a", "x=1&y"},
      {"/a?", "/a", ""},
      {"/?a?b", "/", "a?b"},
      {"http://h.example/p?q", "/p", "q"},
      {"HTTPS://h.example:8443/p/q", "/p/q", NULL},
      {"http://h.example", "/", NULL},
      {"http://h.example?x", "/", "x"},
      {"*", "*", NULL},
      /* an empty authority: the path starts right after the scheme */
      {"http:///public/admin", "/public/admin", NULL},
      {"http:///admin/x?q=1", "/admin/x", "q=1"},
      {"http://", "/", NULL},
      {"https://", "/", NULL},
      {"http:///", "/", NULL},
      /* a '?' ends the authority: the query is kept */
      {"http://q?x=1", "/", "x=1"},
      {"http://h?x=/y", "/", "x=/y"},
      {"http://h:80?", "/", ""},
      {"HtTp://h/a%2Fb?c", "/a%2Fb", "c"},
      /* not a scheme: origin-form rules */
      {"http:/x", "http:/x", NULL},
      {"httpx://h/p", "httpx://h/p", NULL},
      {"ftp://h/p", "ftp://h/p", NULL},
      {"", "", NULL},
      {"?", "", ""},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    bool ok = split_is(cases[i].target, cases[i].path, cases[i].query);
    if (!ok) printf("split of \"%s\"\n", cases[i].target);
    CHECK(ok);
  }
}

int main(void) {
  test_simple();
  test_partial();
  test_limits();
  test_bad();
  test_target_forms();
  test_validation();
  test_flags();
  test_chunked();
  test_unescape();
  test_split();
  return check_summary();
}
