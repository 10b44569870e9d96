/* SPDX-License-Identifier: MIT */

/* Unit test: the HTTP/1.x response parser (src/http/http1_response.h) and
 * the framing decisions a client takes from it, with bodies read through
 * the shared chunked decoder. Inputs end right before a PROT_NONE page
 * (check_guard), so a read past the end faults. */
#include <stdlib.h>
#include <string.h>

#include "http/http1_response.h"
#include "check.h"

static http_response_t res;

static int parse_n(const char *s, size_t n, bool head) {
  return http_parse_response(s, n, 8192, head, &res);
}

static int parse(const char *s) {
  const char *g = check_guard(s);
  return parse_n(g, strlen(s), false);
}

static int parse_head_req(const char *s) {
  const char *g = check_guard(s);
  return parse_n(g, strlen(s), true);
}

static bool str_is(const char *p, uint32_t n, const char *want) {
  return n == strlen(want) && memcmp(p, want, n) == 0;
}

static void test_simple(void) {
  const char *s = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                  "Content-Length:  5 \r\nX-A: b\r\n\r\nhello";
  CHECK_EQ(parse(s), (int)strlen(s) - 5);
  CHECK_EQ(res.minor, 1);
  CHECK_EQ(res.status, 200);
  CHECK(str_is(res.reason, res.reason_len, "OK"));
  CHECK_EQ(res.nheaders, 3);
  CHECK_EQ(res.body, HTTP_BODY_LENGTH);
  CHECK_EQ(res.content_length, 5);
  CHECK(res.keep_alive && !res.interim && !res.upgrade);
  const http_header_t *h = http_response_header(&res, "content-type");
  CHECK(h && str_is(h->value, h->value_len, "text/plain"));
  CHECK(http_response_header(&res, "x-none") == NULL);
  /* a reason with spaces and obs-text; none at all, with or without SP */
  CHECK(parse("HTTP/1.1 404 Not \xe9 Found\r\n\r\n") > 0);
  CHECK(str_is(res.reason, res.reason_len, "Not \xe9 Found"));
  CHECK(parse("HTTP/1.1 200 \r\n\r\n") > 0);
  CHECK_EQ(res.reason_len, 0);
  CHECK(parse("HTTP/1.1 200\r\n\r\n") > 0);
  CHECK_EQ(res.reason_len, 0);
  CHECK_EQ(res.body, HTTP_BODY_CLOSE);
  /* bare LF line ends */
  CHECK_EQ(parse("HTTP/1.0 200 OK\nContent-Length: 0\n\n"), 35);
  CHECK_EQ(res.minor, 0);
  CHECK(!res.keep_alive);
}

static void test_partial(void) {
  const char *s = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n";
  size_t n = strlen(s);
  for (size_t i = 0; i < n; i++) {
    /* each prefix ends at the guard page */
    char tmp[64];
    memcpy(tmp, s, i);
    tmp[i] = 0;
    const char *g = check_guard(tmp);
    CHECK_EQ(parse_n(g, i, false), HTTP_RES_INCOMPLETE);
  }
  CHECK_EQ(parse(s), (int)n);
}

static char body_buf[64];
static size_t body_len;

static void on_body(const char *p, size_t n, void *arg) {
  if (body_len + n <= sizeof(body_buf)) memcpy(body_buf + body_len, p, n);
  body_len += n;
}

static void test_framing(void) {
  /* chunked, decoded by the shared decoder */
  const char *s = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nT: x\r\n\r\n";
  int head = parse(s);
  CHECK(head > 0);
  CHECK_EQ(res.body, HTTP_BODY_CHUNKED);
  CHECK(res.keep_alive);
  http_chunked_t c;
  http_chunked_init(&c, 1024);
  body_len = 0;
  bool done = false;
  /* one byte at a time, the way a socket may deliver it */
  const char *body = s + head;
  size_t blen = strlen(body);
  for (size_t i = 0; i < blen && !done; i++) {
    ssize_t k = http_chunked_feed(&c, body + i, 1, on_body, NULL, &done);
    CHECK_EQ(k, 1);
  }
  CHECK(done);
  CHECK_EQ(body_len, 11);
  CHECK(memcmp(body_buf, "hello world", 11) == 0);
  /* transfer codings: the case of the token, a list over two fields */
  CHECK(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: CHUNKED\r\n\r\n") > 0);
  CHECK_EQ(res.body, HTTP_BODY_CHUNKED);
  CHECK(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n") > 0);
  CHECK_EQ(res.body, HTTP_BODY_CLOSE); /* not final chunked: until close */
  CHECK(!res.keep_alive);
  CHECK(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n") > 0);
  CHECK_EQ(res.body, HTTP_BODY_CLOSE);
  CHECK_EQ(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"),
           HTTP_RES_BAD); /* a coding this client can't undo */
  CHECK_EQ(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n"),
           HTTP_RES_BAD);
  CHECK_EQ(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"),
           HTTP_RES_BAD);
  CHECK_EQ(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: \r\n\r\n"), HTTP_RES_BAD);
  CHECK_EQ(parse("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                 "Content-Length: 5\r\n\r\n"),
           HTTP_RES_BAD); /* smuggling-shaped framing */
  CHECK_EQ(parse("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"),
           HTTP_RES_BAD);
  /* close-delimited */
  CHECK(parse("HTTP/1.1 200 OK\r\nServer: x\r\n\r\n") > 0);
  CHECK_EQ(res.body, HTTP_BODY_CLOSE);
  CHECK(!res.keep_alive);
  /* Connection */
  CHECK(parse("HTTP/1.1 200 OK\r\nConnection: Close\r\nContent-Length: 0\r\n\r\n") > 0);
  CHECK(!res.keep_alive);
  CHECK(parse("HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n") > 0);
  CHECK(res.keep_alive);
  CHECK_EQ(res.body, HTTP_BODY_LENGTH);
}

static void test_no_body(void) {
  const char *with_len = "HTTP/1.1 200 OK\r\nContent-Length: 42\r\n\r\n";
  CHECK(parse_head_req(with_len) > 0);
  CHECK_EQ(res.body, HTTP_BODY_NONE);
  CHECK_EQ(res.content_length, 42); /* the resource's length, reported */
  CHECK(res.keep_alive);
  CHECK(parse_head_req("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n") > 0);
  CHECK_EQ(res.body, HTTP_BODY_NONE);
  CHECK(parse("HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n") > 0);
  CHECK_EQ(res.body, HTTP_BODY_NONE);
  CHECK(res.keep_alive);
  CHECK(parse("HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n") > 0);
  CHECK_EQ(res.body, HTTP_BODY_NONE);
  CHECK(res.keep_alive);
  /* 1xx: interim, skipped by the caller; the final one follows */
  const char *s = "HTTP/1.1 100 Continue\r\n\r\n"
                  "HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
                  "HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n";
  const char *g = check_guard(s);
  size_t len = strlen(s), off = 0;
  int n, seen = 0;
  while ((n = parse_n(g + off, len - off, false)) > 0 && res.interim) {
    CHECK_EQ(res.body, HTTP_BODY_NONE);
    off += (size_t)n;
    seen++;
  }
  CHECK_EQ(seen, 2);
  CHECK(n > 0);
  CHECK_EQ(res.status, 201);
  CHECK_EQ(off + (size_t)n, len);
  /* 101: the rest is the new protocol's */
  CHECK(parse("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
              "Connection: Upgrade\r\n\r\n\x81\x00") > 0);
  CHECK(res.upgrade && !res.interim && !res.keep_alive);
  CHECK_EQ(res.body, HTTP_BODY_NONE);
}

static void test_content_length(void) {
  CHECK(parse("HTTP/1.1 200 OK\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\n") > 0);
  CHECK_EQ(res.content_length, 3);
  CHECK(parse("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n") > 0);
  CHECK_EQ(res.body, HTTP_BODY_LENGTH);
  CHECK_EQ(res.content_length, 0);
  CHECK(parse("HTTP/1.1 200 OK\r\nContent-Length: 999999999999999999\r\n\r\n") > 0);
  const char *bad[] = {
      "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: +1\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 1 2\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 3, 3\r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: \r\n\r\n",
      "HTTP/1.1 200 OK\r\nContent-Length: 1000000000000000000\r\n\r\n",
      /* checked even where there is no body */
      "HTTP/1.1 204 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    CHECK_EQ(parse(bad[i]), HTTP_RES_BAD);
}

static void test_malformed(void) {
  const char *bad[] = {
      "HTTP/2.0 200 OK\r\n\r\n",
      "HTTP/1.2 200 OK\r\n\r\n",
      "HTTP/1.1 20 OK\r\n\r\n",
      "HTTP/1.1 099 Low\r\n\r\n",
      "HTTP/1.1 2000 OK\r\n\r\n",
      "HTTP/1.1 200OK\r\n\r\n",
      "HTTP/1.1  200 OK\r\n\r\n",
      "http/1.1 200 OK\r\n\r\n",
      "ICY 200 OK\r\n\r\n",
      "\r\nHTTP/1.1 200 OK\r\n\r\n",
      "HTTP/1.1 200 O\x01K\r\n\r\n",
      "HTTP/1.1 200 OK\r\nA: b\r\n c\r\n\r\n",   /* obs-fold */
      "HTTP/1.1 200 OK\r\nA : b\r\n\r\n",        /* blank before colon */
      "HTTP/1.1 200 OK\r\n: b\r\n\r\n",
      "HTTP/1.1 200 OK\r\nA\r\n\r\n",
      "HTTP/1.1 200 OK\r\nA(b: c\r\n\r\n",
      "HTTP/1.1 200 OK\r\nA: b\x7f\r\n\r\n",
      "HTTP/1.1 200 OK\r\nA: b\rc\r\n\r\n",
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int rc = parse(bad[i]);
    if (rc != HTTP_RES_BAD) printf("  bad[%zu] gave %d\n", i, rc);
    CHECK_EQ(rc, HTTP_RES_BAD);
  }
}

static void test_limits(void) {
  char *h = malloc(20000);
  /* a head past max_head, whole or not */
  size_t n = (size_t)sprintf(h, "HTTP/1.1 200 OK\r\n");
  char val[201];
  memset(val, 'v', 200);
  val[200] = 0;
  while (n < 9000) n += (size_t)sprintf(h + n, "X-A: %s\r\n", val);
  n += (size_t)sprintf(h + n, "\r\n");
  CHECK_EQ(http_parse_response(h, n, 8192, false, &res), HTTP_RES_TOO_LARGE);
  CHECK_EQ(http_parse_response(h, 8191, 8192, false, &res), HTTP_RES_INCOMPLETE);
  CHECK_EQ(http_parse_response(h, n, 16384, false, &res), (int)n);
  /* a status line alone past the limit */
  memset(h, 'a', 9000);
  memcpy(h, "HTTP/1.1 200 ", 13);
  CHECK_EQ(http_parse_response(h, 9000, 8192, false, &res), HTTP_RES_TOO_LARGE);
  /* too many fields, then exactly the limit */
  n = (size_t)sprintf(h, "HTTP/1.1 200 OK\r\n");
  for (int i = 0; i <= HTTP_RES_MAX_HEADERS; i++)
    n += (size_t)sprintf(h + n, "A: b\r\n");
  n += (size_t)sprintf(h + n, "\r\n");
  CHECK_EQ(http_parse_response(h, n, 16384, false, &res), HTTP_RES_TOO_LARGE);
  n = (size_t)sprintf(h, "HTTP/1.1 200 OK\r\n");
  for (int i = 0; i < HTTP_RES_MAX_HEADERS; i++)
    n += (size_t)sprintf(h + n, "A: b\r\n");
  n += (size_t)sprintf(h + n, "\r\n");
  CHECK_EQ(http_parse_response(h, n, 16384, false, &res), (int)n);
  CHECK_EQ(res.nheaders, HTTP_RES_MAX_HEADERS);
  free(h);
  /* the chunk-size line limit of the shared decoder (4 KiB) */
  char *big = malloc(5000);
  memset(big, '0', 4999);
  big[4999] = 0;
  http_chunked_t c;
  http_chunked_init(&c, 1024);
  bool done;
  /* (over a page: check_guard can't hold it) */
  CHECK_EQ(http_chunked_feed(&c, big, 4999, NULL, NULL, &done), HTTP_BAD);
  free(big);
}

int main(void) {
  test_simple();
  test_partial();
  test_framing();
  test_no_body();
  test_content_length();
  test_malformed();
  test_limits();
  return check_summary();
}
