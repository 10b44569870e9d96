/* SPDX-License-Identifier: MIT */

/* Unit tests for src/http/server.h without Lua: a real reactor on its own
 * thread runs the HTTP server over one end of a socketpair, with C hooks
 * as the application (they answer with the request's method, target and
 * body). The main thread is the client (blocking socket with timeouts):
 * pipelined requests answered in order, one in flight at a time;
 * keep-alive decisions (HTTP/1.0, Connection: close); refusals (400, 408,
 * 413, 431, 505) and their closing; 100 Continue; chunked bodies; a
 * streamed body (stream_body) taken through the body calls; the 404
 * without on_request; the access log line; http/ws_sse.h's SSE events and
 * shared frames. Every wait is bounded. Own
 * main(); checks from check.h. */
#include "http/server.h"

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
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "http/access.h"
#include "http/ws_sse.h"

/* ---- the application: C hooks ---- */

typedef struct {
  proto_t proto; /* first: http_conn_stream_of's contract */
  http_server_t srv;
} svc_t;

static svc_t g_svc, g_svc404, g_svcstream; /* on_request; none; stream_body */
static reactor_t *g_r;
static _Atomic int g_requests;       /* on_request calls */
static _Atomic int g_closed;         /* on_close calls */
static _Atomic sock_uuid_t g_held;   /* the /slow request waiting */

static void answer(http_exchange_t *x, const char *body, size_t blen) {
  char text[1024];
  int n =
      snprintf(text, sizeof(text), "%.*s %.*s [%.*s]", (int)x->req->method_len,
               x->req->method, (int)x->req->target_len, x->req->target,
               (int)blen, body ? body : "");
  http_head_t h = http_exchange_head(x, 200);
  http_res_send(x, &h, text, (size_t)n, NULL, NULL, NULL);
}

static void on_request(http_exchange_t *x, const char *body, size_t blen) {
  conn_t *c = x->conn->c;
  atomic_fetch_add(&g_requests, 1);
  if (x->req->target_len == 5 && memcmp(x->req->target, "/slow", 5) == 0) {
    /* as a handler that waits: the connection stays held, the answer
     * comes from a task posted later */
    reactor_conn_hold(c);
    atomic_store(&g_held, x->conn->uuid);
    return;
  }
  if (x->streaming) { /* take the whole streamed body, then answer */
    char all[256];
    size_t at = 0;
    const char *p;
    long n;
    while ((n = http_body_peek(x, &p)) > 0) {
      size_t k = (size_t)n < sizeof(all) - at ? (size_t)n : sizeof(all) - at;
      memcpy(all + at, p, k);
      at += k;
      http_body_consume(x, (size_t)n);
    }
    answer(x, n == HTTP_BODY_END ? all : "waits", n == HTTP_BODY_END ? at : 5);
    return;
  }
  answer(x, body, blen);
}

static void slow_answer(void *a, void *b) {
  conn_t *c = reactor_conn_find(g_r, atomic_load(&g_held));
  if (!c) return;
  http_conn_t *hc = reactor_conn_udata(c);
  answer(&hc->x, "late", 4);
  reactor_conn_release(c);
}

static void on_open(conn_t *c) {
  svc_t *svc = reactor_conn_service(c);
  http_server_accept(&svc->srv, c);
}

static void on_close(conn_t *c, int reason) {
  http_conn_closed(c, reactor_conn_udata(c), reason);
  atomic_fetch_add(&g_closed, 1);
}

static http_cache_t *g_cache;
static int g_log_fd = -1;

static void adopt(void *a, void *b) {
  svc_t *svc = b;
  reactor_adopt(g_r, (int)(intptr_t)a, &svc->proto, svc,
                (conn_opts_t){.timeout_ms = svc->srv.header_timeout_ms});
}

/* ---- the client ---- */

static int client_of(svc_t *svc) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) {
    perror("socketpair");
    exit(1);
  }
  struct timeval tv = {.tv_sec = 3};
  setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  fcntl(sv[1], F_SETFL, O_NONBLOCK);
  if (reactor_post(g_r, adopt, (void *)(intptr_t)sv[1], svc)) exit(1);
  return sv[0];
}

static int client(void) { return client_of(&g_svc); }

static void send_all(int fd, const char *s) {
  size_t n = strlen(s);
  while (n) {
    ssize_t w = write(fd, s, n);
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

/* Reads until `want` bytes came, the peer closed, or the timeout: the
 * bytes (NUL-terminated, static). *eof: the peer closed. */
static const char *recv_some(int fd, size_t want, bool *eof) {
  static char buf[16384];
  size_t at = 0;
  *eof = false;
  while (at < want && at < sizeof(buf) - 1) {
    ssize_t r = read(fd, buf + at, sizeof(buf) - 1 - at);
    if (r == 0) *eof = true;
    if (r <= 0) break;
    at += (size_t)r;
  }
  buf[at] = 0;
  return buf;
}

/* Reads everything up to the peer's close. */
static const char *recv_to_close(int fd, bool *eof) {
  return recv_some(fd, (size_t)-1, eof);
}

/* Counts the occurrences of s in text. */
static int count(const char *text, const char *s) {
  int n = 0;
  for (const char *p = text; (p = strstr(p, s)); p += strlen(s)) n++;
  return n;
}

static void *run(void *arg) {
  reactor_run(g_r);
  return NULL;
}

int main(void) {
  signal(SIGPIPE, SIG_IGN);
  alarm(60); /* the whole file, bounded */
  if (sock_init()) return 1;
  g_r = reactor_new(0);
  if (!g_r) return 1;
  char logpath[] = "/tmp/mp-test-server-log-XXXXXX";
  g_log_fd = mkstemp(logpath);
  g_svc.proto = http_server_proto(on_open, on_close);
  http_server_t *s = &g_svc.srv;
  s->r = g_r;
  s->max_header = 256;
  s->max_body = 1000;
  s->header_timeout_ms = 300;
  s->idle_ms = 5000;
  s->public_fd = -1;
  s->access_fd = &g_log_fd;
  s->cache = &g_cache;
  s->conn_size = sizeof(http_conn_t);
  s->on_request = on_request;
  /* the same, without on_request; and with stream_body */
  g_svc404 = g_svc;
  g_svc404.srv.on_request = NULL;
  g_svcstream = g_svc;
  g_svcstream.srv.stream_body = true;
  pthread_t th;
  pthread_create(&th, NULL, run, NULL);
  bool eof;
  const char *got;

  /* Pipelined: three requests in one write, three answers in order, on a
   * connection that stays open. */
  int fd = client();
  send_all(fd, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b?q=1 HTTP/1.1\r\nHost: x\r\n\r\n"
               "POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz");
  got = recv_some(fd, 3 * 100, &eof);
  CHECK_EQ(count(got, "HTTP/1.1 200 OK\r\n"), 3);
  const char *a = strstr(got, "GET /a []"), *b = strstr(got, "GET /b?q=1 []"),
             *c = strstr(got, "POST /c [xyz]");
  CHECK(a && b && c && a < b && b < c);
  CHECK(!strstr(got, "Connection: close"));
  CHECK(strstr(got, "Date: ") && strstr(got, " GMT\r\n"));
  CHECK(!eof);

  /* ... and the same connection goes on */
  send_all(fd, "GET /d HTTP/1.1\r\nHost: x\r\n\r\n");
  got = recv_some(fd, 60, &eof);
  CHECK(strstr(got, "GET /d []") != NULL);

  /* One request in flight at a time: /slow holds its connection, the
   * pipelined /after waits for its answer and comes second. */
  atomic_store(&g_held, 0);
  send_all(fd, "GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /after HTTP/1.1\r\nHost: x\r\n\r\n");
  for (int i = 0; i < 300 && !atomic_load(&g_held); i++) usleep(1000);
  CHECK(atomic_load(&g_held) != 0);
  struct timeval shortv = {.tv_usec = 150000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &shortv, sizeof(shortv));
  got = recv_some(fd, 1, &eof);
  CHECK_EQ(strlen(got), 0); /* nothing before the first answer */
  struct timeval tv = {.tv_sec = 3};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  reactor_post(g_r, slow_answer, NULL, NULL);
  got = recv_some(fd, 2 * 100, &eof);
  const char *late = strstr(got, "GET /slow [late]"), *after = strstr(got, "GET /after []");
  CHECK(late && after && late < after);
  close(fd);

  /* Keep-alive decisions: HTTP/1.0 closes unless asked; Connection:
   * close closes; HTTP/1.0 with keep-alive stays and says so. */
  fd = client();
  send_all(fd, "GET /old HTTP/1.0\r\n\r\n");
  got = recv_to_close(fd, &eof);
  CHECK(eof && strstr(got, "Connection: close\r\n") && strstr(got, "GET /old []"));
  close(fd);
  fd = client();
  send_all(fd, "GET /bye HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  got = recv_to_close(fd, &eof);
  CHECK(eof && strstr(got, "Connection: close\r\n"));
  close(fd);
  fd = client();
  send_all(fd, "GET /ka HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  got = recv_some(fd, 100, &eof);
  CHECK(!eof && strstr(got, "Connection: keep-alive\r\n"));
  close(fd);

  /* Refusals: each answers its status and closes. */
  static const struct {
    const char *req, *status;
  } refusals[] = {
      {"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 400 Bad Request"}, /* no Host */
      {"GET / HTTP/2.0\r\nHost: x\r\n\r\n", "HTTP/1.1 505 "},
      {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n", "HTTP/1.1 413 "},
      {"GET / HTTP/1.1\r\nHost: x\r\nX: "
       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
       "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
       "\r\n\r\n", "HTTP/1.1 431 "},
      {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "HTTP/1.1 400 "},
      {"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", "HTTP/1.1 501 "},
  };
  for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
    int before = atomic_load(&g_requests);
    fd = client();
    send_all(fd, refusals[i].req);
    got = recv_to_close(fd, &eof);
    CHECK(eof);
    CHECK(strncmp(got, refusals[i].status, strlen(refusals[i].status)) == 0);
    if (strncmp(got, refusals[i].status, strlen(refusals[i].status)))
      printf("  refusal %zu got: %.60s\n", i, got);
    CHECK(strstr(got, "Connection: close\r\n") != NULL);
    CHECK_EQ(atomic_load(&g_requests), before); /* the app never saw it */
    close(fd);
  }

  /* A head that dribbles in past header_timeout: 408, closed. */
  fd = client();
  send_all(fd, "GET /late HTTP/1.1\r\nHo");
  uint64_t t0 = reactor_clock_ms();
  got = recv_to_close(fd, &eof);
  CHECK(eof && strncmp(got, "HTTP/1.1 408 ", 13) == 0);
  CHECK(reactor_clock_ms() - t0 >= 250);
  close(fd);

  /* 100 Continue before the body, then the answer; a chunked body comes
   * decoded. */
  fd = client();
  send_all(fd, "POST /up HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
               "Content-Length: 2\r\n\r\n");
  got = recv_some(fd, 25, &eof);
  CHECK(strcmp(got, "HTTP/1.1 100 Continue\r\n\r\n") == 0);
  send_all(fd, "ok");
  got = recv_some(fd, 100, &eof);
  CHECK(strstr(got, "POST /up [ok]") != NULL);
  send_all(fd, "POST /ch HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  got = recv_some(fd, 100, &eof);
  CHECK(strstr(got, "POST /ch [abcde]") != NULL);
  close(fd);

  /* Without on_request: 404 from the server, keep-alive. */
  fd = client_of(&g_svc404);
  send_all(fd, "GET /none HTTP/1.1\r\nHost: x\r\n\r\n");
  got = recv_some(fd, 100, &eof);
  CHECK(strncmp(got, "HTTP/1.1 404 Not Found\r\n", 24) == 0 && !eof);
  close(fd);

  /* stream_body: the hook runs at the head and takes the body itself. */
  fd = client_of(&g_svcstream);
  send_all(fd, "POST /s HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nwxyz");
  got = recv_some(fd, 100, &eof);
  CHECK(strstr(got, "POST /s [wxyz]") != NULL);
  close(fd);

  /* The access log has one line per answer, refusals included. */
  for (int i = 0; i < 300 && atomic_load(&g_closed) < 14; i++) usleep(1000);
  char text[16384];
  ssize_t n = pread(g_log_fd, text, sizeof(text) - 1, 0);
  text[n > 0 ? n : 0] = 0;
  CHECK(strstr(text, "\"GET /a HTTP/1.1\" 200 ") != NULL);
  CHECK(strstr(text, "\"GET / HTTP/2.0\" 505 ") != NULL); /* the raw line */
  CHECK(strstr(text, "\"POST / HTTP/1.1\" 413 ") != NULL);
  CHECK(strstr(text, "\"GET /none HTTP/1.1\" 404 10 ") != NULL);

  /* A line's fields are escaped and bounded. */
  http_request_t rq;
  const char *raw = "GET /x?y HTTP/1.1\r\nHost: x\r\nUser-Agent: a\\b\"\xc3\xa9\r\n\r\n";
  CHECK(http_parse_head(raw, strlen(raw), 1024, &rq) > 0);
  char line[HTTP_ACCESS_LINE_MAX];
  size_t ll = http_access_line(line, "1.2.3.4", 0, &rq, NULL, 0, 200, 5, 0.25);
  line[ll] = 0;
  CHECK(strcmp(line, "1.2.3.4 - - [01/Jan/1970:00:00:00 +0000] \"GET /x?y "
                     "HTTP/1.1\" 200 5 \"-\" \"a\\x5cb\\x22\\xc3\\xa9\" 0.250\n") == 0);
  /* a long field is cut at its bound and ends with "..." */
  static char big[3000];
  int bl = snprintf(big, sizeof(big), "GET /y HTTP/1.1\r\nHost: x\r\nUser-Agent: ");
  memset(big + bl, 'u', 2000);
  memcpy(big + bl + 2000, "\r\n\r\n", 5);
  CHECK(http_parse_head(big, strlen(big), sizeof(big), &rq) > 0);
  ll = http_access_line(line, "1.2.3.4", 0, &rq, NULL, 0, 200, 5, 0.25);
  line[ll] = 0;
  const char *ua = strstr(line, "\"uuu");
  CHECK(ua && strncmp(ua + 1 + 509, "...\" 0.250\n", 12) == 0 && ua[509] == 'u');

  /* http/ws_sse.h's pure parts: an SSE event's lines, a shared frame */
  size_t el;
  char *ev = http_sse_event("a\r\nb\rc\n", 7, "e", 1, "1", 1, 3, &el);
  CHECK(ev && el == strlen("event: e\nid: 1\ndata: a\ndata: b\ndata: c\ndata: \n\n") &&
        memcmp(ev + 3, "event: e\nid: 1\ndata: a\ndata: b\ndata: c\ndata: \n\n", el) == 0);
  free(ev);
  http_frame_t *fr = http_frame_ws("hi", 2, true);
  CHECK(fr && fr->refs == 1 && fr->len == 4 && memcmp(fr->data, "\x81\x02hi", 4) == 0);
  http_frame_unref(fr);
  fr = http_frame_sse("x", 1);
  CHECK(fr && fr->len == 9 && memcmp(fr->data, "data: x\n\n", 9) == 0);
  http_frame_unref(fr);

  reactor_shutdown(g_r, 0);
  pthread_join(th, NULL);
  reactor_free(g_r);
  http_cache_free(g_cache);
  close(g_log_fd);
  unlink(logpath);
  sock_deinit();
  return check_summary();
}
