/* SPDX-License-Identifier: MIT */

/* Unit test: the pure parts of static files (paths, media types, Range,
 * validators, Accept-Encoding, dates). Every input is placed so that it
 * ends right before an unreadable page: a read past its end faults. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "http/static.h"
#include "check.h"

#define guard check_guard

static ssize_t path(const char *s, char *out, size_t cap) {
  return http_static_path(guard(s), strlen(s), out, cap);
}

static bool path_is(const char *s, const char *want) {
  char out[256];
  ssize_t n = path(s, out, sizeof(out));
  return n == (ssize_t)strlen(want) && strcmp(out, want) == 0;
}

static void test_path(void) {
  CHECK(path_is("/", "."));
  CHECK(path_is("/index.html", "index.html"));
  CHECK(path_is("/a/b%20c.txt", "a/b c.txt"));
  CHECK(path_is("//a//b", "a//b"));
  CHECK(path_is("/dir/", "dir/"));
  CHECK(path_is("/.well-known/x", ".well-known/x"));
  CHECK(path_is("/a..b/c...", "a..b/c..."));
  CHECK(path_is("/caf%C3%A9", "caf\xc3\xa9"));
  char out[256];
  /* climbing out */
  const char *escape[] = {"/..", "/../etc/passwd", "/a/../../b", "/a/..",
                          "/%2e%2e/x", "/%2E%2e/x", "/.%2e/x", "/a%2f..%2f..%2fx",
                          "/a\\..\\b", "/a%5cb", "/a\\b", NULL};
  for (int i = 0; escape[i]; i++)
    CHECK_EQ(path(escape[i], out, sizeof(out)), HTTP_STATIC_ESCAPE);
  /* malformed */
  const char *bad[] = {"/a%00b", "/a%", "/a%4", "/a%zz", "/%0", NULL};
  for (int i = 0; bad[i]; i++)
    CHECK_EQ(path(bad[i], out, sizeof(out)), HTTP_STATIC_BAD);
  /* not ours to look up */
  const char *skip[] = {"", "*", "a/b", "/a%2fb", "/a%2Fb", "/.git/config",
                        "/.env", "/a/./b", "/.", "/x/.hidden", "/.well-knownx", NULL};
  for (int i = 0; skip[i]; i++)
    CHECK_EQ(path(skip[i], out, sizeof(out)), HTTP_STATIC_SKIP);
  /* too long for the buffer: out of cap, never written past it */
  CHECK_EQ(path("/abcdefgh", out, 9), HTTP_STATIC_SKIP);
  CHECK_EQ(path("/abcdefgh", out, 10), 8);
}

static bool mime_is(const char *name, const char *want) {
  return strcmp(http_static_mime(guard(name), strlen(name)), want) == 0;
}

static void test_mime(void) {
  CHECK(mime_is("index.html", "text/html; charset=utf-8"));
  CHECK(mime_is("a/B.HTM", "text/html; charset=utf-8"));
  CHECK(mime_is("s.css", "text/css; charset=utf-8"));
  CHECK(mime_is("app.js", "text/javascript; charset=utf-8"));
  CHECK(mime_is("m.mjs", "text/javascript; charset=utf-8"));
  CHECK(mime_is("d.json", "application/json; charset=utf-8"));
  CHECK(mime_is("app.js.map", "application/json; charset=utf-8"));
  CHECK(mime_is("r.txt", "text/plain; charset=utf-8"));
  CHECK(mime_is("t.csv", "text/csv; charset=utf-8"));
  CHECK(mime_is("i.svg", "image/svg+xml"));
  CHECK(mime_is("i.png", "image/png"));
  CHECK(mime_is("i.jpg", "image/jpeg"));
  CHECK(mime_is("i.JPEG", "image/jpeg"));
  CHECK(mime_is("i.gif", "image/gif"));
  CHECK(mime_is("i.webp", "image/webp"));
  CHECK(mime_is("favicon.ico", "image/x-icon"));
  CHECK(mime_is("m.wasm", "application/wasm"));
  CHECK(mime_is("f.woff", "font/woff"));
  CHECK(mime_is("f.woff2", "font/woff2"));
  CHECK(mime_is("d.pdf", "application/pdf"));
  CHECK(mime_is("d.xml", "application/xml"));
  CHECK(mime_is("v.mp4", "video/mp4"));
  CHECK(mime_is("v.webm", "video/webm"));
  CHECK(mime_is("a.mp3", "audio/mpeg"));
  CHECK(mime_is("noext", "application/octet-stream"));
  CHECK(mime_is("dir.html/noext", "application/octet-stream"));
  CHECK(mime_is("x.unknown", "application/octet-stream"));
  CHECK(mime_is("trailing.", "application/octet-stream"));
  CHECK(mime_is("", "application/octet-stream"));
  CHECK(mime_is(".html", "text/html; charset=utf-8"));
}

static int range(const char *v, uint64_t size, uint64_t *a, uint64_t *b) {
  *a = *b = 12345;
  return http_static_range(guard(v), strlen(v), size, a, b);
}

static void test_range(void) {
  uint64_t a, b;
  CHECK_EQ(range("bytes=0-9", 100, &a, &b), HTTP_RANGE_OK);
  CHECK(a == 0 && b == 9);
  CHECK_EQ(range("bytes=10-", 100, &a, &b), HTTP_RANGE_OK);
  CHECK(a == 10 && b == 99);
  CHECK_EQ(range("bytes=-10", 100, &a, &b), HTTP_RANGE_OK);
  CHECK(a == 90 && b == 99);
  CHECK_EQ(range("bytes=-1000", 100, &a, &b), HTTP_RANGE_OK);
  CHECK(a == 0 && b == 99);
  CHECK_EQ(range("bytes=50-1000", 100, &a, &b), HTTP_RANGE_OK);
  CHECK(a == 50 && b == 99);
  CHECK_EQ(range("bytes=99-99", 100, &a, &b), HTTP_RANGE_OK);
  CHECK(a == 99 && b == 99);
  CHECK_EQ(range("Bytes= 5-6 ,", 100, &a, &b), HTTP_RANGE_OK);
  CHECK(a == 5 && b == 6);
  CHECK_EQ(range("bytes=0-99999999999999999999999", 100, &a, &b), HTTP_RANGE_OK);
  CHECK(a == 0 && b == 99);
  /* unsatisfiable */
  CHECK_EQ(range("bytes=100-", 100, &a, &b), HTTP_RANGE_UNSATISFIABLE);
  CHECK_EQ(range("bytes=100-200", 100, &a, &b), HTTP_RANGE_UNSATISFIABLE);
  CHECK_EQ(range("bytes=-0", 100, &a, &b), HTTP_RANGE_UNSATISFIABLE);
  CHECK_EQ(range("bytes=99999999999999999999999-", 100, &a, &b),
           HTTP_RANGE_UNSATISFIABLE);
  /* ignored: the whole file */
  const char *ignore[] = {"", "bytes", "bytes=", "bytes=,", "items=0-1", "bytes=a-b",
                          "bytes=5", "bytes=-", "bytes=9-5", "bytes=0-1,5-6",
                          "bytes=0-1 x", "bytes =0-1", "bytes=--1", "bytes=1--2", NULL};
  for (int i = 0; ignore[i]; i++)
    CHECK_EQ(range(ignore[i], 100, &a, &b), HTTP_RANGE_IGNORE);
  /* an empty file has no ranges */
  CHECK_EQ(range("bytes=0-", 0, &a, &b), HTTP_RANGE_IGNORE);
  CHECK_EQ(range("bytes=-5", 0, &a, &b), HTTP_RANGE_IGNORE);
}

#define ETAG "\"1f-2a\""

static bool inm(const char *v) {
  return http_static_etag_match(guard(v), strlen(v), ETAG, strlen(ETAG));
}

static void test_etag(void) {
  CHECK(inm(ETAG));
  CHECK(inm("W/" ETAG));
  CHECK(inm("*"));
  CHECK(inm("  *  "));
  CHECK(inm("\"x\", " ETAG));
  CHECK(inm("\"x\",W/\"y\" ,  " ETAG " , \"z\""));
  CHECK(inm(",," ETAG));
  CHECK(!inm("\"1f-2b\""));
  CHECK(!inm("1f-2a"));
  CHECK(!inm("\"1f-2a"));
  CHECK(!inm("\"x\" garbage, " ETAG));
  CHECK(!inm(""));
  CHECK(!inm("*, \"x\""));
  CHECK(!inm("\"1f-2a\"x"));
  /* our own tag may be weak too */
  CHECK(http_static_etag_match(guard(ETAG), strlen(ETAG), "W/" ETAG, strlen(ETAG) + 2));
}

static bool ir(const char *v, int64_t mtime) {
  return http_static_if_range(guard(v), strlen(v), ETAG, strlen(ETAG), mtime);
}

static void test_if_range(void) {
  CHECK(ir(ETAG, 0));
  CHECK(ir(" " ETAG " ", 0));
  CHECK(!ir("W/" ETAG, 0)); /* strong comparison */
  CHECK(!ir("\"other\"", 0));
  CHECK(!ir(ETAG ", \"x\"", 0));
  CHECK(ir("Sun, 06 Nov 1994 08:49:37 GMT", 784111777));
  CHECK(ir("Wed, 09 Jun 2021 10:18:14 GMT", 1623233894));
  CHECK(!ir("Sun, 06 Nov 1994 08:49:37 GMT", 784111778));
  CHECK(!ir("yesterday", 784111777));
  CHECK(!ir("", 0));
}

static bool gz(const char *v) { return http_static_accepts_gzip(guard(v), strlen(v)); }

static void test_gzip(void) {
  CHECK(gz("gzip"));
  CHECK(gz("GZip"));
  CHECK(gz("x-gzip"));
  CHECK(gz("gzip, deflate, br"));
  CHECK(gz("deflate, gzip;q=1.0, *;q=0.5"));
  CHECK(gz("br;q=1, gzip;q=0.001"));
  CHECK(gz("gzip ; q = 0.5"));
  CHECK(gz("*"));
  CHECK(gz("identity;q=0, *"));
  CHECK(gz("gzip;level=\"a;q=0\";q=1"));
  CHECK(!gz(""));
  CHECK(!gz("identity"));
  CHECK(!gz("deflate, br"));
  CHECK(!gz("gzip;q=0"));
  CHECK(!gz("gzip;Q=0.000"));
  CHECK(!gz("gzip; q=0.0, deflate"));
  CHECK(!gz("*;q=0"));
  CHECK(!gz("gzip;q=0, *"));       /* explicit refusal beats * */
  CHECK(!gz("*, gzip;q=0"));
  CHECK(!gz("gzipx"));
  CHECK(!gz("gzip;q=abc"));        /* malformed q: not accepted */
  CHECK(!gz("gzip;q=\"1"));        /* unterminated quote: no over-read */
  CHECK(!gz("gzip;x=\"\\"));
}

static int64_t date(const char *s) { return http_static_parse_date(guard(s), strlen(s)); }

static void test_date(void) {
  CHECK_EQ(date("Sun, 06 Nov 1994 08:49:37 GMT"), 784111777);
  CHECK_EQ(date("Sunday, 06-Nov-94 08:49:37 GMT"), 784111777);
  CHECK_EQ(date("Sun Nov  6 08:49:37 1994"), 784111777);
  CHECK_EQ(date("Sun Nov 16 08:49:37 1994"), 784111777 + 10 * 86400);
  CHECK_EQ(date("Thu, 01 Jan 1970 00:00:00 GMT"), 0);
  const char *bad[] = {"", "Sun", "Sun,", "Sun, 06 Nov 1994 08:49:37", "Sun, 06 Nov 1994 08:49:37 UTC",
                       "Sun, 6 Nov 1994 08:49:37 GMT", "Sun, 06 Foo 1994 08:49:37 GMT",
                       "Sun, 06 Nov 1994 24:00:00 GMT", "Sun, 06 Nov 1994 08:49:37 GMTx",
                       "Sun, 00 Nov 1994 08:49:37 GMT", "Sun Nov  6 08:49:37", "garbage", NULL};
  for (int i = 0; bad[i]; i++) CHECK_EQ(date(bad[i]), -1);
  char out[32];
  CHECK_EQ(http_static_format_date(784111777, out), 29);
  CHECK(strcmp(out, "Sun, 06 Nov 1994 08:49:37 GMT") == 0);
  http_static_format_date(0, out);
  CHECK(strcmp(out, "Thu, 01 Jan 1970 00:00:00 GMT") == 0);
  http_static_format_date(1709210096, out); /* a leap day */
  CHECK(strcmp(out, "Thu, 29 Feb 2024 12:34:56 GMT") == 0);
  CHECK_EQ(date(out), 1709210096);
  /* the thread's last date is kept: the same again, then another, then back */
  CHECK_EQ(http_static_format_date(1709210096, out), 29);
  CHECK(strcmp(out, "Thu, 29 Feb 2024 12:34:56 GMT") == 0);
  http_static_format_date(784111777, out);
  CHECK(strcmp(out, "Sun, 06 Nov 1994 08:49:37 GMT") == 0);
  http_static_format_date(1709210096, out);
  CHECK(strcmp(out, "Thu, 29 Feb 2024 12:34:56 GMT") == 0);
}

int main(void) {
  test_path();
  test_mime();
  test_range();
  test_etag();
  test_if_range();
  test_gzip();
  test_date();
  return check_summary();
}
