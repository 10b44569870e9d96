/* SPDX-License-Identifier: MIT */

/* Unit tests of TLS under the reactor (net/tls.h, reactor.c's "TLS"):
 * first the record layer alone (two net_tls_t talking through memory),
 * then a real loop on this thread with a TLS echo server and TLS clients
 * over loopback sockets: bulk data both ways (memory writes, references
 * and a file through the flush), host-name checks, a handshake that never
 * comes (cut by the timeout, no callbacks), plaintext on the TLS port,
 * and a client that queued past its write limit before its handshake.
 * The test certificates are made with the openssl command into a
 * temporary folder. Own main(); check.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "net/reactor.h"
#include "net/sock.h"
#include "net/tls.h"

static char g_dir[64], g_cert[128], g_key[128];

static void make_cert(void) {
  strcpy(g_dir, "/tmp/mp-tls-XXXXXX");
  if (!mkdtemp(g_dir)) abort();
  snprintf(g_cert, sizeof(g_cert), "%s/cert.pem", g_dir);
  snprintf(g_key, sizeof(g_key), "%s/key.pem", g_dir);
  char cmd[512];
  snprintf(cmd, sizeof(cmd),
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
           "-nodes -keyout %s -out %s -days 2 -subj /CN=localhost -addext "
           "subjectAltName=DNS:localhost,IP:127.0.0.1 2>/dev/null",
           g_key, g_cert);
  if (system(cmd) != 0) {
    printf("openssl req failed\n");
    exit(1);
  }
}

/* ---- the record layer alone ---- */

typedef struct {
  char buf[1 << 20];
  size_t len;
} pipe_t;

static int pipe_out(void *arg, const void *data, size_t len) {
  pipe_t *p = arg;
  if (p->len + len > sizeof(p->buf)) return -ENOBUFS;
  memcpy(p->buf + p->len, data, len);
  p->len += len;
  return 0;
}

/* Hands what `from` wrote to `to`, then reads `to` (plaintext into out). */
static ssize_t pump(pipe_t *from, net_tls_t *to, char *out, size_t cap,
                    size_t *got) {
  static char hold[1 << 20];
  memcpy(hold, from->buf, from->len);
  size_t n = from->len;
  from->len = 0;
  net_tls_feed(to, hold, n);
  ssize_t r;
  *got = 0;
  while ((r = net_tls_read(to, out + *got, cap - *got)) > 0) *got += (size_t)r;
  if (net_tls_stash(to)) abort();
  return r;
}

static void test_memory(void) {
  char err[256];
  net_tls_cert_t ct = {.cert = g_cert, .key = g_key};
  net_tls_ctx_t *sctx = net_tls_server_ctx(&ct, 1, true, err, sizeof(err));
  CHECK(sctx != NULL);
  net_tls_client_opts_t co = {.verify = true, .ca = g_cert, .alpn = "http/1.1"};
  net_tls_ctx_t *cctx = net_tls_client_ctx(&co, err, sizeof(err));
  CHECK(cctx != NULL);
  if (!sctx || !cctx) return;
  static pipe_t c2s, s2c;
  c2s.len = s2c.len = 0;
  net_tls_t *cli = net_tls_new(cctx, "localhost", pipe_out, &c2s);
  net_tls_t *srv = net_tls_new(sctx, NULL, pipe_out, &s2c);
  static char out[1 << 20];
  size_t got;
  CHECK_EQ(net_tls_read(cli, out, sizeof(out)), NET_TLS_WANT); /* hello */
  CHECK(c2s.len > 0);
  ssize_t rs = 0, rc = 0;
  for (int i = 0; i < 6 && (!net_tls_open(cli) || !net_tls_open(srv)); i++) {
    rs = pump(&c2s, srv, out, sizeof(out), &got);
    rc = pump(&s2c, cli, out, sizeof(out), &got);
  }
  (void)rs;
  (void)rc;
  CHECK(net_tls_open(cli));
  CHECK(net_tls_open(srv));
  net_tls_info_t info;
  net_tls_info(srv, &info);
  CHECK(strcmp(info.protocol, "TLSv1.3") == 0);
  CHECK(info.sni && strcmp(info.sni, "localhost") == 0);
  CHECK(strcmp(info.alpn, "http/1.1") == 0);
  /* 300 KB one way, a few records */
  static char big[300000];
  for (size_t i = 0; i < sizeof(big); i++) big[i] = (char)(i * 7 + 3);
  CHECK_EQ(net_tls_write(cli, big, sizeof(big)), 0);
  pump(&c2s, srv, out, sizeof(out), &got);
  CHECK_EQ(got, sizeof(big));
  CHECK(memcmp(out, big, sizeof(big)) == 0);
  /* byte by byte: partial records wait in the stash */
  CHECK_EQ(net_tls_write(srv, "pong", 4), 0);
  size_t total = 0;
  char small[16];
  size_t n = s2c.len;
  static char rec[4096];
  memcpy(rec, s2c.buf, n);
  s2c.len = 0;
  for (size_t i = 0; i < n; i++) {
    char one = rec[i];
    net_tls_feed(cli, &one, 1);
    ssize_t r = net_tls_read(cli, small + total, sizeof(small) - total);
    if (r > 0) total += (size_t)r;
    CHECK(net_tls_stash(cli) == 0);
  }
  CHECK_EQ(total, 4);
  CHECK(memcmp(small, "pong", 4) == 0);
  /* close_notify is a clean end */
  net_tls_close_notify(cli);
  CHECK_EQ(pump(&c2s, srv, out, sizeof(out), &got), NET_TLS_EOF);
  net_tls_free(cli);
  net_tls_free(srv);

  /* the wrong name fails with a reason that says so */
  c2s.len = s2c.len = 0;
  cli = net_tls_new(cctx, "example.org", pipe_out, &c2s);
  srv = net_tls_new(sctx, NULL, pipe_out, &s2c);
  net_tls_read(cli, out, sizeof(out));
  for (int i = 0; i < 4 && !net_tls_has_failed(cli); i++) {
    pump(&c2s, srv, out, sizeof(out), &got);
    pump(&s2c, cli, out, sizeof(out), &got);
  }
  CHECK(net_tls_has_failed(cli));
  CHECK(strstr(net_tls_error(cli), "hostname mismatch") != NULL);
  net_tls_free(cli);
  net_tls_free(srv);

  /* the name check never fails open: strings inet_pton does not read as
   * an address are names (and match no DNS entry of the certificate,
   * which lists localhost and IP 127.0.0.1); an address is checked as
   * one */
  static const struct {
    const char *host;
    bool opens;
  } names[] = {{"127.0.0.1", true},   {"127.1", false}, {"2130706433", false},
               {"127.0.0.1.", false}, {"::1", false},   {"127.0.0.2", false},
               {"LOCALHOST", true}};
  for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
    c2s.len = s2c.len = 0;
    cli = net_tls_new(cctx, names[k].host, pipe_out, &c2s);
    srv = net_tls_new(sctx, NULL, pipe_out, &s2c);
    net_tls_read(cli, out, sizeof(out));
    for (int i = 0; i < 6 && !net_tls_has_failed(cli) && !net_tls_open(cli);
         i++) {
      pump(&c2s, srv, out, sizeof(out), &got);
      pump(&s2c, cli, out, sizeof(out), &got);
    }
    if (net_tls_open(cli) != names[k].opens)
      printf("  name %s: opened %d\n", names[k].host, net_tls_open(cli));
    CHECK(net_tls_open(cli) == names[k].opens);
    CHECK(net_tls_has_failed(cli) == !names[k].opens);
    net_tls_free(cli);
    net_tls_free(srv);
  }

  /* plaintext where a ClientHello goes */
  s2c.len = 0;
  srv = net_tls_new(sctx, NULL, pipe_out, &s2c);
  net_tls_feed(srv, "GET / HTTP/1.1\r\n", 16);
  CHECK_EQ(net_tls_read(srv, out, sizeof(out)), NET_TLS_PLAIN);
  net_tls_free(srv);
  /* garbage fails, no crash */
  srv = net_tls_new(sctx, NULL, pipe_out, &s2c);
  static char junk[3000];
  for (size_t i = 0; i < sizeof(junk); i++) junk[i] = (char)(0x16 + i * 31);
  net_tls_feed(srv, junk, sizeof(junk));
  CHECK_EQ(net_tls_read(srv, out, sizeof(out)), NET_TLS_FAIL);
  net_tls_free(srv);

  /* certificates that don't load say which file and why */
  net_tls_cert_t bad = {.cert = g_cert, .key = "/nonexistent/key.pem"};
  CHECK(net_tls_server_ctx(&bad, 1, false, err, sizeof(err)) == NULL);
  CHECK(strstr(err, "/nonexistent/key.pem") && strstr(err, "No such file"));
  net_tls_ctx_unref(sctx);
  net_tls_ctx_unref(cctx);
}

/* ---- under a reactor ---- */

#define BULK (3u << 20)
static unsigned char *g_bulk;
static reactor_t *g_r;
static int g_file_fd = -1;

typedef struct {
  size_t got;
  bool bad;
  bool opened, closed, failed;
  int fail_err;
  char tls_err[160];
  bool tls_seen;
} cli_t;

static cli_t g_c1, g_c2;
static int g_srv_opens, g_srv_closes, g_done_needed;

static void maybe_stop(void) {
  if (--g_done_needed == 0) reactor_shutdown(g_r, 100);
}

/* server: echoes */
/* The listener's 300 ms limit is for the handshakes (the silent client);
 * an open echo connection has none, so a slow run (ASan, a loaded
 * machine) can't cut the 3 MiB exchange. */
static void s_open(conn_t *c) {
  g_srv_opens++;
  reactor_conn_set_timeout(c, 0);
}
static void s_data(conn_t *c, const char *d, size_t n) {
  reactor_conn_write(c, d, n);
}
static void s_close(conn_t *c, int reason) {
  (void)c;
  (void)reason;
  g_srv_closes++;
}
static const proto_t srv_proto = {
    .on_open = s_open, .on_data = s_data, .on_close = s_close};

static void free_ref(void *a, void *b) {
  (void)b;
  free(a);
}

/* client 1: sends BULK bytes: first as 50 small writes in one callback
 * (they share the iteration's io_uring batch: once a connection went on
 * the send list twice there, and its records out twice), then, once their
 * echo is back, the rest as a copy, a reference and a file; checks the
 * echo byte for byte */
#define SMALL 500
static void c_open(conn_t *c) {
  cli_t *k = reactor_conn_udata(c);
  k->opened = true;
  net_tls_info_t info;
  k->tls_seen = reactor_conn_tls(c, &info) && !info.server;
  for (size_t at = 0; at < SMALL; at += 10) reactor_conn_write(c, g_bulk + at, 10);
}
static void c_rest(conn_t *c) {
  size_t at = SMALL, third = (BULK - at) / 3;
  reactor_conn_write(c, g_bulk + at, third);
  unsigned char *ref = malloc(third);
  memcpy(ref, g_bulk + at + third, third);
  reactor_conn_write_ref(c, ref, third, free_ref, ref, NULL);
  reactor_conn_sendfile(c, dup(g_file_fd), (off_t)(at + 2 * third),
                        BULK - at - 2 * third);
}
static void c_data(conn_t *c, const char *d, size_t n) {
  cli_t *k = reactor_conn_udata(c);
  if (k->got + n > BULK || memcmp(d, g_bulk + k->got, n) != 0) k->bad = true;
  bool small_done = k->got < SMALL && k->got + n >= SMALL;
  k->got += n;
  if (small_done && !k->bad) c_rest(c);
  if (k->got >= BULK || k->bad) reactor_conn_close(c, CONN_LOCAL);
}
static void c_close(conn_t *c, int reason) {
  cli_t *k = reactor_conn_udata(c);
  (void)reason;
  k->closed = true;
  maybe_stop();
}
static void c_fail(conn_t *c, int err) {
  cli_t *k = reactor_conn_udata(c);
  k->failed = true;
  k->fail_err = err;
  const char *e = reactor_conn_tls_error(c);
  snprintf(k->tls_err, sizeof(k->tls_err), "%s", e ? e : "");
  maybe_stop();
}
static const proto_t cli_proto = {.on_open = c_open,
                                  .on_data = c_data,
                                  .on_close = c_close,
                                  .on_fail = c_fail};

/* a raw TCP client that says nothing, and one that speaks plaintext */
static int g_silent = -1, g_plain = -1;
static uint64_t g_t0, g_cut_ms;
static reactor_watch_t *g_watch;

/* The silent client's socket turns readable when the server cuts it. */
static void silent_cut(void *arg) {
  (void)arg;
  char b[64];
  ssize_t n = read(g_silent, b, sizeof(b));
  if (n > 0) return;
  g_cut_ms = reactor_clock_ms() - g_t0;
  reactor_unwatch(g_watch);
  maybe_stop();
}

static void test_reactor(void) {
  char err[256];
  net_tls_cert_t ct = {.cert = g_cert, .key = g_key};
  net_tls_ctx_t *sctx = net_tls_server_ctx(&ct, 1, true, err, sizeof(err));
  net_tls_client_opts_t co = {.verify = true, .ca = g_cert};
  net_tls_ctx_t *cctx = net_tls_client_ctx(&co, err, sizeof(err));
  if (!sctx || !cctx) abort();
  g_bulk = malloc(BULK);
  for (size_t i = 0; i < BULK; i++) g_bulk[i] = (unsigned char)(i * 13 + i / 7);
  char path[160];
  snprintf(path, sizeof(path), "%s/bulk.bin", g_dir);
  g_file_fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (g_file_fd < 0 || write(g_file_fd, g_bulk, BULK) != (ssize_t)BULK) abort();

  g_r = reactor_new(0);
  int lfd = sock_listen_tcp("127.0.0.1", 0, 64);
  int port = sock_local_port(lfd);
  conn_opts_t so = {.timeout_ms = 300, .tls = sctx,
                    .tls_plain_reply = "HTTP/1.1 400 Bad Request\r\n\r\n"};
  listener_t *l = reactor_listen(g_r, lfd, &srv_proto, NULL, so);
  CHECK(l != NULL);
  memset(&g_c1, 0, sizeof(g_c1));
  memset(&g_c2, 0, sizeof(g_c2));
  g_done_needed = 3;
  int e = 0;
  conn_opts_t o1 = {.tls = cctx, .tls_host = "localhost"};
  conn_t *c1 = reactor_connect(g_r, "127.0.0.1", port, NULL, 3000, &cli_proto,
                               NULL, o1, &e);
  CHECK(c1 != NULL);
  if (c1) reactor_conn_set_udata(c1, &g_c1);
  conn_opts_t o2 = {.tls = cctx, .tls_host = "wrong.example"};
  conn_t *c2 = reactor_connect(g_r, "127.0.0.1", port, NULL, 3000, &cli_proto,
                               NULL, o2, &e);
  CHECK(c2 != NULL);
  if (c2) reactor_conn_set_udata(c2, &g_c2);
  bool done;
  g_silent = sock_connect_tcp("127.0.0.1", port, &done);
  g_plain = sock_connect_tcp("127.0.0.1", port, &done);
  usleep(50000);
  CHECK(write(g_plain, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 27) == 27);
  g_t0 = reactor_clock_ms();
  g_watch = reactor_watch(g_r, g_silent, silent_cut, NULL);
  reactor_run(g_r);
  /* a handshake that never comes is cut at the connection's limit (the
   * sweep runs once a second) */
  CHECK(g_cut_ms >= 250 && g_cut_ms < 2500);
  CHECK(g_c1.opened && g_c1.tls_seen);
  CHECK_EQ(g_c1.got, BULK);
  CHECK(!g_c1.bad);
  CHECK(g_c1.closed);
  CHECK(g_c2.failed && !g_c2.opened);
  CHECK_EQ(g_c2.fail_err, -EPROTO);
  CHECK(strstr(g_c2.tls_err, "hostname mismatch") != NULL);
  /* the echo's connection opened and closed; the wrong-name one failed on
   * the client, which the server sees as a failed handshake: no callback */
  CHECK_EQ(g_srv_opens, 1);
  reactor_listener_close(l);
  reactor_free(g_r);
  /* the plaintext client got the reply, then EOF */
  char buf[256];
  ssize_t n = read(g_plain, buf, sizeof(buf) - 1);
  CHECK(n > 0 && strncmp(buf, "HTTP/1.1 400", 12) == 0);
  close(g_plain);
  close(g_silent);
  close(lfd);
  close(g_file_fd);
  unlink(path);
  free(g_bulk);
  net_tls_ctx_unref(sctx);
  net_tls_ctx_unref(cctx);
}

/* A client that queues more than its write limit before its handshake is
 * done (a rediss:// link's first big command): the queue is past the
 * limit (back pressure) while the server's handshake messages arrive, and
 * the handshake must go on all the same. Once it read nothing then, and
 * the connection hung until its connect timeout. Deterministic: the
 * writes are queued before the loop runs, so before the server answers. */
static cli_t g_q;
static void q_open(conn_t *c) {
  cli_t *k = reactor_conn_udata(c);
  k->opened = true;
}
static const proto_t q_proto = {.on_open = q_open,
                                .on_data = c_data,
                                .on_close = c_close,
                                .on_fail = c_fail};

static void test_queued_before_handshake(void) {
  char err[256];
  net_tls_cert_t ct = {.cert = g_cert, .key = g_key};
  net_tls_ctx_t *sctx = net_tls_server_ctx(&ct, 1, true, err, sizeof(err));
  net_tls_client_opts_t co = {.verify = true, .ca = g_cert};
  net_tls_ctx_t *cctx = net_tls_client_ctx(&co, err, sizeof(err));
  if (!sctx || !cctx) abort();
  g_bulk = malloc(BULK);
  for (size_t i = 0; i < BULK; i++) g_bulk[i] = (unsigned char)(i * 7 + i / 5);
  g_r = reactor_new(0);
  int lfd = sock_listen_tcp("127.0.0.1", 0, 64);
  int port = sock_local_port(lfd);
  conn_opts_t so = {.timeout_ms = 5000, .tls = sctx};
  listener_t *l = reactor_listen(g_r, lfd, &srv_proto, NULL, so);
  CHECK(l != NULL);
  memset(&g_q, 0, sizeof(g_q));
  g_q.got = SMALL; /* the echo starts there (and c_data writes no more) */
  g_done_needed = 1;
  g_srv_opens = 0;
  int e = 0;
  conn_opts_t o = {.tls = cctx, .tls_host = "localhost"};
  conn_t *c = reactor_connect(g_r, "127.0.0.1", port, NULL, 4000, &q_proto,
                              NULL, o, &e);
  CHECK(c != NULL);
  if (c) {
    reactor_conn_set_udata(c, &g_q);
    /* BULK - SMALL bytes in 64 KiB writes, three times the write limit */
    for (size_t at = SMALL; at < BULK; at += 65536) {
      size_t n = BULK - at < 65536 ? BULK - at : 65536;
      CHECK_EQ(reactor_conn_write(c, g_bulk + at, n), 0);
    }
    CHECK(reactor_conn_congested(c));
  }
  reactor_run(g_r);
  CHECK(g_q.opened && !g_q.failed);
  CHECK_EQ(g_q.got, BULK);
  CHECK(!g_q.bad);
  CHECK(g_q.closed);
  reactor_listener_close(l);
  reactor_free(g_r);
  close(lfd);
  free(g_bulk);
  net_tls_ctx_unref(sctx);
  net_tls_ctx_unref(cctx);
}

int main(void) {
  if (sock_init() || net_tls_global_init()) return 1;
  make_cert();
  test_memory();
  test_reactor();
  test_queued_before_handshake();
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf %s", g_dir);
  if (system(cmd) != 0) return 1;
  sock_deinit();
  return check_summary();
}
