/* SPDX-License-Identifier: MIT */

/* fuzz_tls: a libFuzzer target for a server connection's record layer
 * (src/net/tls.c) as the reactor drives it: bytes fed in pieces, read
 * until it wants more, the rest stashed before the piece goes.
 *
 * Input: byte 0 is the size of the pieces the stream arrives in (1-256
 * bytes), the rest is what a client sent. Whatever it is, the layer must
 * answer with a value of its contract, keep no pointer into a piece it was
 * told to stash, never open on garbage without a handshake, and be freed
 * without a leak. The certificate is made once, with the openssl command. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_check.h"
#include "net/tls.h"

static net_tls_ctx_t *g_ctx;
static size_t g_out; /* bytes the layer wrote back (alerts, ServerHello) */

static int fz_out(void *arg, const void *data, size_t len) {
  (void)arg;
  (void)data;
  g_out += len;
  return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  char dir[] = "/tmp/mp-fuzz-tls-XXXXXX";
  if (!mkdtemp(dir)) abort();
  char cmd[512], cert[64], key[64];
  snprintf(cert, sizeof(cert), "%s/c.pem", dir);
  snprintf(key, sizeof(key), "%s/k.pem", dir);
  snprintf(cmd, sizeof(cmd),
           "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
           "-nodes -keyout %s -out %s -days 2 -subj /CN=localhost "
           "2>/dev/null",
           key, cert);
  if (system(cmd) != 0 || net_tls_global_init()) abort();
  net_tls_cert_t ct = {.cert = cert, .key = key};
  char err[256];
  g_ctx = net_tls_server_ctx(&ct, 1, true, err, sizeof(err));
  if (!g_ctx) abort();
  unlink(cert);
  unlink(key);
  rmdir(dir);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t piece = (size_t)data[0] + 1;
  data++;
  size--;
  net_tls_t *t = net_tls_new(g_ctx, NULL, fz_out, NULL);
  FUZZ_CHECK(t != NULL);
  static char plain[1 << 16];
  bool opened = false, ended = false;
  for (size_t at = 0; at < size && !ended;) {
    size_t n = size - at < piece ? size - at : piece;
    /* a copy that goes away after the piece, like the reactor's buffer */
    char *buf = malloc(n);
    memcpy(buf, data + at, n);
    at += n;
    net_tls_feed(t, buf, n);
    for (;;) {
      ssize_t r = net_tls_read(t, plain, sizeof(plain));
      FUZZ_CHECK(r <= (ssize_t)sizeof(plain));
      if (r > 0) {
        FUZZ_CHECK(opened); /* no plaintext before the handshake */
        continue;
      }
      if (r == NET_TLS_OPENED) {
        FUZZ_CHECK(!opened);
        opened = true;
        FUZZ_CHECK(net_tls_open(t));
        continue;
      }
      if (r == NET_TLS_WANT) break;
      FUZZ_CHECK(r == NET_TLS_EOF || r == NET_TLS_FAIL || r == NET_TLS_PLAIN);
      if (r != NET_TLS_EOF) FUZZ_CHECK(net_tls_has_failed(t));
      ended = true;
      break;
    }
    FUZZ_CHECK(net_tls_stash(t) == 0);
    memset(buf, 0xAA, n); /* a kept pointer would read this */
    free(buf);
  }
  /* A client that never finished cannot have opened: a full handshake
   * needs a key exchange only a real client can make. */
  if (opened) net_tls_write(t, "x", 1);
  net_tls_free(t);
  return 0;
}
