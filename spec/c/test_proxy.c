/* SPDX-License-Identifier: MIT */

/* test_proxy: the proxy's head rewrite (src/http/proxy.c) on parsed
 * requests: hop-by-hop fields and the ones Connection names dropped,
 * X-Forwarded-* and Forwarded appended, the framing, the options, and the
 * output limit. */
#include <errno.h>
#include <string.h>

#include "check.h"
#include "http/http1.h"
#include "http/proxy.h"

static char out[8192];

/* The upstream head for raw request `raw` with options o ("" on error). */
static long head(const char *raw, proxy_head_opts_t *o, size_t cap) {
  static http_request_t req;
  int n = http_parse_head(raw, strlen(raw), 8192, &req);
  CHECK(n > 0);
  if (n <= 0) return -1;
  long l = proxy_request_head(out, cap, &req, o);
  if (l >= 0) out[l] = 0;
  else out[0] = 0;
  return l;
}

static bool has(const char *s) { return strstr(out, s) != NULL; }
static bool starts(const char *s) { return strncmp(out, s, strlen(s)) == 0; }

int main(void) {
  /* hop-by-hop names, case-insensitive, and the Connection-listed ones */
  CHECK(proxy_hop_by_hop("Keep-Alive", 10, NULL, 0));
  CHECK(proxy_hop_by_hop("te", 2, NULL, 0));
  CHECK(proxy_hop_by_hop("TRANSFER-ENCODING", 17, NULL, 0));
  CHECK(proxy_hop_by_hop("Proxy-Connection", 16, NULL, 0));
  CHECK(!proxy_hop_by_hop("X-Thing", 7, NULL, 0));
  CHECK(proxy_hop_by_hop("X-Thing", 7, "close, x-thing", 14));
  CHECK(proxy_hop_by_hop("x-thing", 7, " X-Thing ,close", 15));
  CHECK(!proxy_hop_by_hop("X-Thin", 6, "x-thing", 7));

  proxy_head_opts_t o = {.peer = "10.0.0.9", .proto = "http", .body_len = -2};
  long l = head("GET /a?b=1 HTTP/1.1\r\nHost: ex.com\r\nConnection: keep-alive, X-Secret\r\n"
                "X-Secret: s\r\nKeep-Alive: 5\r\nTE: trailers\r\nUpgrade: h2c\r\n"
                "X-Forwarded-For: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\nX-Keep: k\r\n\r\n",
                &o, sizeof(out));
  CHECK(l > 0);
  CHECK(starts("GET /a?b=1 HTTP/1.1\r\nHost: ex.com\r\n"));
  CHECK(!has("X-Secret") && !has("Keep-Alive") && !has("TE:") && !has("Upgrade"));
  CHECK(!has("Connection"));
  CHECK(has("X-Keep: k\r\n"));
  CHECK(has("X-Forwarded-For: 1.2.3.4, 10.0.0.9\r\n"));
  CHECK(has("X-Forwarded-Proto: http\r\n"));
  CHECK(has("X-Forwarded-Host: ex.com\r\n"));
  CHECK(has("Forwarded: for=1.2.3.4, for=10.0.0.9;proto=http;host=\"ex.com\"\r\n"));
  CHECK(!has("Content-Length") && !has("Transfer-Encoding"));
  CHECK(l >= 4 && memcmp(out + l - 4, "\r\n\r\n", 4) == 0);

  /* an IPv6 peer is quoted in Forwarded; options replace and drop */
  proxy_head_opts_t o6 = {.peer = "::1", .proto = "https", .body_len = 5,
                          .target = "/v2/x", .target_len = 5,
                          .host = "up:81", .host_len = 5,
                          .extra = "X-Added: 1\r\n", .extra_len = 12,
                          .drop = "x-gone\nx-also\n", .drop_len = 14};
  l = head("POST /x HTTP/1.1\r\nHost: ex.com\r\nX-Gone: 1\r\nx-also: 2\r\nContent-Length: 5\r\n\r\n",
           &o6, sizeof(out));
  CHECK(l > 0);
  CHECK(starts("POST /v2/x HTTP/1.1\r\nHost: up:81\r\n"));
  CHECK(has("for=\"[::1]\";proto=https"));
  CHECK(has("X-Added: 1\r\n") && !has("X-Gone") && !has("x-also"));
  CHECK(has("Content-Length: 5\r\n"));

  /* a streamed chunked body stays chunked; a streamed sized one keeps its length */
  proxy_head_opts_t os = {.peer = "1.1.1.1", .proto = "http", .body_len = -1};
  l = head("PUT /u HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n", &os, sizeof(out));
  CHECK(l > 0 && has("Transfer-Encoding: chunked\r\n") && !has("Content-Length"));
  l = head("PUT /u HTTP/1.1\r\nHost: h\r\nContent-Length: 1234\r\n\r\n", &os, sizeof(out));
  CHECK(l > 0 && has("Content-Length: 1234\r\n") && !has("chunked"));

  /* a WebSocket upgrade passes its Upgrade on */
  l = head("GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
           &o, sizeof(out));
  CHECK(l > 0 && has("Connection: upgrade\r\nUpgrade: websocket\r\n"));
  CHECK(has("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"));

  /* every output size short of the whole head is -ENOSPC, never an overrun */
  const char *raw = "GET / HTTP/1.1\r\nHost: h\r\nX-A: aaaaaaaaaaaaaaaa\r\n\r\n";
  long full = head(raw, &o, sizeof(out));
  CHECK(full > 0);
  int bad = 0;
  for (long cap = 0; cap < full; cap++)
    if (head(raw, &o, (size_t)cap) != -ENOSPC) bad++;
  CHECK_EQ(bad, 0);
  CHECK_EQ(head(raw, &o, (size_t)full), full);
  return check_summary();
}
