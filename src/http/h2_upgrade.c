/* SPDX-License-Identifier: MIT */

/* h2_upgrade: HTTP/1.1's Upgrade to h2c (RFC 7540 3.2): the
 * HTTP2-Settings field checked before the switch (a bad one is served as
 * HTTP/1.1), the request carried over as stream 1, the 101, then the
 * client's preface. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/crypto.h"
#include "http/h2_int.h"

/* ---- HTTP/1.1's Upgrade: h2c (RFC 7540 3.2) ---- */

/* Characters of an HTTP2-Settings field taken at most (base64url of 96
 * settings: more than RFC 9113 defines, or any client sends). */
#define H2_SETTINGS_FIELD_MAX 768

/* Undoes h2__init: hc is HTTP/1.1's again (its framer `h1`). */
static void h2__uninit(http_conn_t *hc, const http_framer_t *h1) {
  h2_conn_t *h = hc->proto;
  while (h->all) h2__stream_free(h->all);
  h2_mem_wake(&h->mem); /* (never quiet yet: for the shape) */
  nghttp2_session_del(h->s);
  h2_mem_deinit(&h->mem); /* (its slot goes back to the lane's pool) */
  free(h);
  hc->proto = NULL;
  hc->framer = h1;
}

/* Whether the settings of an HTTP2-Settings field (a SETTINGS frame's
 * payload, RFC 9113 6.5.1: 16-bit id, 32-bit value) have values RFC 9113
 * 6.5.2 allows. nghttp2_session_upgrade2 would take bad ones and answer
 * them with a GOAWAY after the 101; checked before, such a request is
 * served as HTTP/1.1 instead. Unknown ids are allowed (and ignored). */
static bool h2__settings_ok(const uint8_t *p, size_t n) {
  for (size_t i = 0; i + 6 <= n; i += 6) {
    unsigned id = (unsigned)p[i] << 8 | p[i + 1];
    uint32_t v = (uint32_t)p[i + 2] << 24 | (uint32_t)p[i + 3] << 16 |
                 (uint32_t)p[i + 4] << 8 | p[i + 5];
    switch (id) {
    case NGHTTP2_SETTINGS_ENABLE_PUSH:
    case NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL:
    case NGHTTP2_SETTINGS_NO_RFC7540_PRIORITIES:
      if (v > 1) return false;
      break;
    case NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE:
      if (v > (uint32_t)NGHTTP2_MAX_WINDOW_SIZE) return false;
      break;
    case NGHTTP2_SETTINGS_MAX_FRAME_SIZE:
      if (v < (1u << 14) || v > (1u << 24) - 1) return false;
      break;
    default: break;
    }
  }
  return true;
}

bool http_h2_upgrade(http_conn_t *hc) {
  const http_request_t *r = hc->x.req;
  /* a body would come as HTTP/1.1 before the switch: served as HTTP/1.1,
   * as nghttpd does; an event stream is kept on HTTP/1.1 there too (an
   * EventSource never asks for the upgrade) */
  if (r->content_length > 0 || r->chunked || r->expect_continue ||
      h2__wants_events(r) || r->method_len >= 0xffff || r->target_len >= 0xffff)
    return false;
  const http_header_t *hs = NULL;
  for (int i = 0; i < r->nheaders; i++) {
    const http_header_t *f = &r->headers[i];
    if (f->name_len == 14 && strncasecmp(f->name, "http2-settings", 14) == 0) {
      if (hs) return false; /* exactly one (RFC 7540 3.2.1) */
      hs = f;
    }
  }
  if (!hs || hs->value_len > H2_SETTINGS_FIELD_MAX) return false;
  uint8_t set[H2_SETTINGS_FIELD_MAX / 4 * 3 + 2];
  long n = crypto_base64_decode(set, hs->value, hs->value_len, CRYPTO_B64_URL);
  if (n < 0 || n % 6 || !h2__settings_ok(set, (size_t)n)) return false;
  const http_framer_t *h1 = hc->framer;
  if (!h2__init(hc)) return false;
  h2_conn_t *h = hc->proto;
  h2_stream_t *st = h2__stream_new(h);
  if (!st) goto fail;
  st->id = 1;
  st->t_start = hc->x.t_start;
  st->anext = h->all;
  if (h->all) h->all->aprev = &st->anext;
  st->aprev = &h->all;
  h->all = st;
  h->requests++;
  /* the request as stream 1's (names lower-case, connection-specific
   * fields left out, Host kept as :authority's is) */
  long mo = h2__hput(st, (const uint8_t *)r->method, r->method_len);
  long to = h2__hput(st, (const uint8_t *)r->target, r->target_len);
  if (mo < 0 || to < 0) goto fail;
  st->moff = (uint32_t)mo;
  st->mlen = (uint32_t)r->method_len;
  st->toff = (uint32_t)to;
  st->tlen = (uint32_t)r->target_len;
  for (int i = 0; i < r->nheaders && st->nh < HTTP_MAX_HEADERS; i++) {
    const http_header_t *f = &r->headers[i];
    long no = h2__hput(st, (const uint8_t *)f->name, f->name_len);
    if (no < 0) goto fail;
    char *name = st->hb + no;
    for (size_t k = 0; k < f->name_len; k++)
      name[k] = (char)tolower((unsigned char)name[k]);
    if (h2__conn_specific(name, f->name_len) ||
        (f->name_len == 14 && memcmp(name, "http2-settings", 14) == 0) ||
        (f->name_len == 2 && memcmp(name, "te", 2) == 0)) {
      st->hlen = (size_t)no; /* left out */
      continue;
    }
    long vo = h2__hput(st, (const uint8_t *)f->value, f->value_len);
    if (vo < 0) goto fail;
    uint32_t *e = st->off[st->nh++];
    e[0] = (uint32_t)no, e[1] = (uint32_t)f->name_len;
    e[2] = (uint32_t)vo, e[3] = (uint32_t)f->value_len;
  }
  /* nghttp2 applies the client's settings (or refuses them) and makes
   * stream 1, half closed: its request is whole */
  bool head = r->method_len == 4 && memcmp(r->method, "HEAD", 4) == 0;
  if (nghttp2_session_upgrade2(h->s, set, (size_t)n, head, st) ||
      !nghttp2_session_want_read(h->s))
    goto fail;
  if (!h2__make_request(h, st)) goto fail;
  st->ended = true;
  st->streaming = hc->srv->stream_body && !st->refuse;
  static const char sw[] = "HTTP/1.1 101 Switching Protocols\r\n"
                           "Connection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
  if (reactor_conn_write(hc->c, sw, sizeof(sw) - 1) < 0) goto fail;
  h2__enqueue(h, st);
  return true;
fail:
  h2__uninit(hc, h1);
  return false;
}

void http_h2_upgraded(http_conn_t *hc) {
  hc->state = HTTP_C_HEAD;
  reactor_conn_set_timeout(hc->c, hc->srv->header_timeout_ms);
  h2__run(hc->proto); /* stream 1 answers; the client's preface follows */
}
