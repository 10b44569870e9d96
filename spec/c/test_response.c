/* SPDX-License-Identifier: MIT */

/* Unit tests for src/http/response.h without Lua: the response writer and
 * its body filters, over HTTP/1.1 on a real reactor (its own thread, one
 * end of a socketpair per connection). Two test filters sit in the
 * server's chain: "upper" uppercases every body byte and changes headers
 * before the head goes out (sets X-Filter, replaces Content-Type); it
 * stays out of paths under /plain. "double" repeats every byte, so the
 * body's length changes: it makes the length unknown and the response
 * goes chunked; it takes part only under /double. The application answers
 * with http_res_send (Content-Length), http_res_head/write/end (chunked,
 * with trailers), http_res_sendfile, for GET and HEAD, and a 304 whose
 * body is dropped. The access log's byte counts are the bytes the client
 * got (after the filters). Every wait is bounded. Own main(); checks
 * from check.h. */
#include "http/response.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"
#include "http/server.h"

static reactor_t *g_r;
static http_cache_t *g_cache;
static int g_log_fd = -1;
static char g_file[64];     /* a temporary file for /file */
static _Atomic int g_frees; /* filter states freed */

typedef struct {
  proto_t proto;
  http_server_t srv;
} svc_t;
static svc_t g_svc;

static bool target_is(const http_exchange_t *x, const char *prefix) {
  size_t n = strlen(prefix);
  return x->req->target_len >= n && memcmp(x->req->target, prefix, n) == 0;
}

/* ---- the filters ---- */

static int upper_head(const http_filter_t *f, http_exchange_t *x,
                      http_head_t *h, long long *len, void **state) {
  if (target_is(x, "/plain")) return 0;
  if (http_res_header_set(x, h, "X-Filter", "upper")) return -ENOMEM;
  if (http_res_header_set(x, h, "Content-Type", "text/x-upper")) return -ENOMEM;
  *state = malloc(1); /* a state to free, so leaks show under ASan */
  return *state ? 1 : -ENOMEM;
}

static int upper_body(void *state, http_exchange_t *x, int at, const char *p,
                      size_t n, bool last) {
  char buf[512];
  while (n) {
    size_t k = n < sizeof(buf) ? n : sizeof(buf);
    for (size_t i = 0; i < k; i++) buf[i] = (char)toupper((unsigned char)p[i]);
    int rc = http_filter_pass(x, at, buf, k, false);
    if (rc) return rc;
    p += k;
    n -= k;
  }
  return last ? http_filter_pass(x, at, NULL, 0, true) : 0;
}

static void count_free(void *state) {
  free(state);
  atomic_fetch_add(&g_frees, 1);
}

static int double_head(const http_filter_t *f, http_exchange_t *x,
                       http_head_t *h, long long *len, void **state) {
  if (!target_is(x, "/double")) return 0;
  *len = -1; /* the length changes: chunked */
  *state = malloc(1);
  return *state ? 1 : -ENOMEM;
}

static int double_body(void *state, http_exchange_t *x, int at, const char *p,
                       size_t n, bool last) {
  for (size_t i = 0; i < n; i++) {
    char two[2] = {p[i], p[i]};
    int rc = http_filter_pass(x, at, two, 2, false);
    if (rc) return rc;
  }
  return last ? http_filter_pass(x, at, NULL, 0, true) : 0;
}

static const http_filter_t f_upper = {"upper", upper_head, upper_body,
                                      count_free, NULL};
static const http_filter_t f_double = {"double", double_head, double_body,
                                       count_free, NULL};

/* ---- the application ---- */

static void on_request(http_exchange_t *x, const char *body, size_t blen) {
  static const char type[] = "Content-Type: text/plain\r\nX-App: yes\r\n";
  http_head_t h = http_exchange_head(x, 200);
  h.headers = type;
  h.hlen = sizeof(type) - 1;
  h.has_type = true;
  if (target_is(x, "/chunked") || target_is(x, "/double/chunked") ||
      target_is(x, "/plain/chunked")) {
    static const char trailers[] = "X-Sum: 8\r\n";
    http_res_head(x, &h, -1);
    http_res_write(x, "abc", 3, NULL, NULL, NULL);
    http_res_write(x, "defgh", 5, NULL, NULL, NULL);
    http_res_end(x, trailers, sizeof(trailers) - 1);
  } else if (target_is(x, "/304")) {
    h.status = 304;
    http_res_send(x, &h, "dropped", 7, NULL, NULL, NULL);
  } else if (target_is(x, "/file") || target_is(x, "/plain/file")) {
    int fd = open(g_file, O_RDONLY | O_CLOEXEC);
    http_res_sendfile(x, &h, fd, 2, 20000); /* from byte 2 */
  } else if (target_is(x, "/big")) {
    static char big[10000];
    memset(big, 'z', sizeof(big));
    http_res_send(x, &h, big, sizeof(big), NULL, NULL, NULL);
  } else {
    http_res_send(x, &h, "hello world", 11, NULL, NULL, NULL);
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

/* ---- the client ---- */

static int client(void) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) exit(1);
  struct timeval tv = {.tv_sec = 3};
  setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  if (reactor_post(g_r, adopt, (void *)(intptr_t)sv[1], &g_svc)) exit(1);
  return sv[0];
}

/* Sends one request with Connection: close and reads the answer to the
 * close (NUL-terminated, static; *n its length). */
static const char *ask(const char *method, const char *target, size_t *n) {
  static char buf[65536];
  int fd = client();
  char req[256];
  int rl = snprintf(req, sizeof(req),
                    "%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                    method, target);
  if (write(fd, req, (size_t)rl) != rl) exit(1);
  size_t at = 0;
  ssize_t r;
  while (at < sizeof(buf) - 1 &&
         (r = read(fd, buf + at, sizeof(buf) - 1 - at)) > 0)
    at += (size_t)r;
  buf[at] = 0;
  close(fd);
  *n = at;
  return buf;
}

static int count_str(const char *text, const char *s) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, s)); p += strlen(s)) n++;
  return n;
}

static const char *body_of(const char *resp) {
  const char *p = strstr(resp, "\r\n\r\n");
  return p ? p + 4 : "";
}

static void *run(void *arg) {
  reactor_run(g_r);
  return NULL;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  alarm(60);
  if (sock_init()) return 1;
  g_r = reactor_new(0);
  if (!g_r) return 1;
  char logpath[] = "/tmp/mp-test-response-log-XXXXXX";
  g_log_fd = mkstemp(logpath);
  strcpy(g_file, "/tmp/mp-test-response-file-XXXXXX");
  int ff = mkstemp(g_file);
  for (int i = 0; i < 20002; i++) {
    char ch = (char)('a' + i % 26);
    if (write(ff, &ch, 1) != 1) return 1;
  }
  close(ff);
  g_svc.proto = http_server_proto(on_open, on_close);
  http_server_t *s = &g_svc.srv;
  s->r = g_r;
  s->max_header = 1024;
  s->max_body = 1000;
  s->header_timeout_ms = 3000;
  s->idle_ms = 5000;
  s->public_fd = -1;
  s->access_fd = &g_log_fd;
  s->cache = &g_cache;
  s->conn_size = sizeof(http_conn_t);
  s->on_request = on_request;
  s->filters[0] = &f_upper;
  s->filters[1] = &f_double;
  s->nfilters = 2;
  pthread_t th;
  pthread_create(&th, NULL, run, NULL);
  size_t n;
  const char *got;

  /* Content-Length: the filter's headers, the app's other line, the
   * body uppercased, the length unchanged. */
  got = ask("GET", "/cl", &n);
  CHECK(strncmp(got, "HTTP/1.1 200 OK\r\n", 17) == 0);
  CHECK(strstr(got, "\r\nContent-Length: 11\r\n") != NULL);
  CHECK(strstr(got, "\r\nX-Filter: upper\r\n") != NULL);
  CHECK(strstr(got, "\r\nContent-Type: text/x-upper\r\n") != NULL);
  CHECK(strstr(got, "text/plain") == NULL); /* replaced, not added */
  CHECK(strstr(got, "\r\nX-App: yes\r\n") != NULL);
  CHECK(strcmp(body_of(got), "HELLO WORLD") == 0);

  /* Without the filter (/plain): as the application said. */
  got = ask("GET", "/plain", &n);
  CHECK(strstr(got, "\r\nContent-Type: text/plain\r\n") &&
        !strstr(got, "X-Filter"));
  CHECK(strcmp(body_of(got), "hello world") == 0);

  /* A body past the inline size, through the filter. */
  got = ask("GET", "/big", &n);
  CHECK(strstr(got, "\r\nContent-Length: 10000\r\n") != NULL);
  const char *b = body_of(got);
  CHECK_EQ(strlen(b), 10000);
  CHECK(b[0] == 'Z' && b[9999] == 'Z' && !strchr(b, 'z'));

  /* Chunked, with trailers: each piece a chunk, uppercased. */
  got = ask("GET", "/chunked", &n);
  CHECK(strstr(got, "\r\nTransfer-Encoding: chunked\r\n") != NULL);
  CHECK(!strstr(got, "Content-Length"));
  CHECK(strstr(got, "\r\nX-Filter: upper\r\n") != NULL);
  CHECK(strcmp(body_of(got),
               "3\r\nABC\r\n5\r\nDEFGH\r\n0\r\nX-Sum: 8\r\n\r\n") == 0);
  got = ask("GET", "/plain/chunked", &n);
  CHECK(strcmp(body_of(got),
               "3\r\nabc\r\n5\r\ndefgh\r\n0\r\nX-Sum: 8\r\n\r\n") == 0);

  /* A filter that changes the length: the response goes chunked, and
   * both filters run in order (upper, then double). */
  got = ask("GET", "/double", &n);
  CHECK(strstr(got, "\r\nTransfer-Encoding: chunked\r\n") != NULL);
  CHECK(!strstr(got, "Content-Length"));
  CHECK_EQ(count_str(body_of(got), "2\r\n"), 11);
  CHECK(strstr(body_of(got), "2\r\nHH\r\n2\r\nEE\r\n") == body_of(got));
  CHECK(strstr(got, "\r\n0\r\n\r\n") != NULL);

  /* HEAD: the head of the GET (its length, the filter's headers), no
   * body; chunked HEAD: no chunks, no terminator. */
  got = ask("HEAD", "/cl", &n);
  CHECK(strstr(got, "\r\nContent-Length: 11\r\n") != NULL);
  CHECK(strstr(got, "\r\nX-Filter: upper\r\n") != NULL);
  CHECK_EQ(strlen(body_of(got)), 0);
  got = ask("HEAD", "/chunked", &n);
  CHECK(strstr(got, "\r\nTransfer-Encoding: chunked\r\n") != NULL);
  CHECK_EQ(strlen(body_of(got)), 0);

  /* 304: no body, no length, even though the application gave one; the
   * filter still sees the head. */
  got = ask("GET", "/304", &n);
  CHECK(strncmp(got, "HTTP/1.1 304 Not Modified\r\n", 27) == 0);
  CHECK(!strstr(got, "Content-Length") && !strstr(got, "Transfer-Encoding"));
  CHECK(strstr(got, "\r\nX-Filter: upper\r\n") != NULL);
  CHECK_EQ(strlen(body_of(got)), 0);

  /* sendfile: through the filter, read in pieces; without, sendfile(2)
   * from the offset. */
  got = ask("GET", "/file", &n);
  CHECK(strstr(got, "\r\nContent-Length: 20000\r\n") != NULL);
  b = body_of(got);
  CHECK_EQ(strlen(b), 20000);
  CHECK(strncmp(b, "CDEFG", 5) == 0 &&
        !strpbrk(b, "abcdefghijklmnopqrstuvwxyz"));
  got = ask("GET", "/plain/file", &n);
  b = body_of(got);
  CHECK_EQ(strlen(b), 20000);
  CHECK(strncmp(b, "cdefg", 5) == 0);
  got = ask("HEAD", "/file", &n);
  CHECK(strstr(got, "\r\nContent-Length: 20000\r\n") &&
        strlen(body_of(got)) == 0);

  /* The access log counts the bytes the client got (after the filters):
   * 11 for /cl, 22 for /double (its chunk framing not counted), 0 for
   * HEAD and 304. */
  /* (each line is written before its connection closes, and ask()
   * read to the close) */
  char text[16384];
  ssize_t tl = pread(g_log_fd, text, sizeof(text) - 1, 0);
  text[tl > 0 ? tl : 0] = 0;
  CHECK(strstr(text, "\"GET /cl HTTP/1.1\" 200 11 ") != NULL);
  CHECK(strstr(text, "\"GET /double HTTP/1.1\" 200 22 ") != NULL);
  CHECK(strstr(text, "\"HEAD /cl HTTP/1.1\" 200 0 ") != NULL);
  CHECK(strstr(text, "\"GET /304 HTTP/1.1\" 304 0 ") != NULL);
  CHECK(strstr(text, "\"GET /file HTTP/1.1\" 200 20000 ") != NULL);

  /* Every filter state was freed: one per filtered response. */
  CHECK_EQ(atomic_load(&g_frees), 10);

  reactor_shutdown(g_r, 0);
  pthread_join(th, NULL);
  reactor_free(g_r);
  http_cache_free(g_cache);
  close(g_log_fd);
  unlink(logpath);
  unlink(g_file);
  sock_deinit();
  return check_summary();
}
