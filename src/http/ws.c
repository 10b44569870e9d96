/* SPDX-License-Identifier: MIT */

/* ws: WebSocket frames, the handshake key and UTF-8 checks (RFC 6455). */
#include "http/ws.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/crypto.h"
#include "http/ws_deflate.h"

/* An inflated message's buffer past this size is freed at the next read:
 * an idle connection keeps no large one. */
#define WS_ZBUF_KEEP 16384

/* ---- the handshake: base64(SHA-1(key + GUID)) ---- */

void ws_accept_key(const char *key, size_t len, char out[29]) {
  static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  static const char b64[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  unsigned char buf[128 + sizeof(guid)];
  if (len > 128) len = 128; /* a real key is 24 characters */
  memcpy(buf, key, len);
  memcpy(buf + len, guid, sizeof(guid) - 1);
  unsigned char d[21];
  /* SHA-1 through libcrypto (core/crypto.h). It fails only without
   * memory; a zero digest then makes a key the client refuses. */
  if (crypto_sha1(buf, len + sizeof(guid) - 1, d) < 0) memset(d, 0, 20);
  d[20] = 0;
  char *o = out;
  for (int i = 0; i < 21; i += 3) {
    uint32_t v = (uint32_t)d[i] << 16 | (uint32_t)d[i + 1] << 8 | d[i + 2];
    *o++ = b64[v >> 18 & 63];
    *o++ = b64[v >> 12 & 63];
    *o++ = b64[v >> 6 & 63];
    *o++ = b64[v & 63];
  }
  out[27] = '='; /* 20 bytes: the last group has one byte of padding */
  out[28] = 0;
}

/* ---- UTF-8 ---- */

bool ws_utf8_valid(const char *s, size_t n) {
  if (n == 0) return true; /* s may be NULL */
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  while (p < end) {
    /* ASCII runs, eight bytes at a time */
    while (end - p >= 8) {
      uint64_t w;
      memcpy(&w, p, 8);
      if (w & 0x8080808080808080ull) break;
      p += 8;
    }
    if (p == end) break;
    unsigned c = *p;
    if (c < 0x80) {
      p++;
      continue;
    }
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c == 0xE0) need = 2, lo = 0xA0;
    else if (c >= 0xE1 && c <= 0xEC) need = 2;
    else if (c == 0xED) need = 2, hi = 0x9F; /* no surrogates */
    else if (c >= 0xEE && c <= 0xEF) need = 2;
    else if (c == 0xF0) need = 3, lo = 0x90;
    else if (c >= 0xF1 && c <= 0xF3) need = 3;
    else if (c == 0xF4) need = 3, hi = 0x8F; /* up to U+10FFFF */
    else return false;
    if ((size_t)(end - p) <= need) return false;
    if (p[1] < lo || p[1] > hi) return false;
    for (size_t i = 2; i <= need; i++)
      if (p[i] < 0x80 || p[i] > 0xBF) return false;
    p += need + 1;
  }
  return true;
}

/* ---- frames ---- */

size_t ws_frame_head(char out[10], int opcode, bool fin, uint64_t len) {
  out[0] = (char)((fin ? 0x80 : 0) | (opcode & 0x4F)); /* WS_RSV1 may be in */
  if (len < 126) {
    out[1] = (char)len;
    return 2;
  }
  if (len <= 0xFFFF) {
    out[1] = 126;
    out[2] = (char)(len >> 8);
    out[3] = (char)len;
    return 4;
  }
  out[1] = 127;
  for (int i = 0; i < 8; i++) out[2 + i] = (char)(len >> (56 - 8 * i));
  return 10;
}

void ws_reader_init(ws_reader_t *r, size_t max_msg, bool need_mask) {
  memset(r, 0, sizeof(*r));
  r->max_msg = max_msg;
  r->need_mask = need_mask;
}

void ws_reader_deinit(ws_reader_t *r) {
  free(r->msg);
  free(r->zbuf);
  memset(r, 0, sizeof(*r));
}

static void ws__unmask(char *p, size_t n, const unsigned char m[4]) {
  size_t i = 0;
  if (n >= 8) {
    uint64_t m8;
    unsigned char mb[8] = {m[0], m[1], m[2], m[3], m[0], m[1], m[2], m[3]};
    memcpy(&m8, mb, 8);
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      memcpy(&w, p + i, 8);
      w ^= m8;
      memcpy(p + i, &w, 8);
    }
  }
  for (; i < n; i++) p[i] ^= (char)m[i & 3];
}

/* ---- the client's frames (mp.websocket): masked with a key per frame ---- */

size_t ws_frame_head_masked(char out[WS_MAX_HEAD], int opcode, bool fin,
                            uint64_t len, const unsigned char key[4]) {
  size_t n = ws_frame_head(out, opcode, fin, len);
  out[1] = (char)(out[1] | 0x80);
  memcpy(out + n, key, 4);
  return n + 4;
}

void ws_mask(char *p, size_t n, const unsigned char key[4]) { ws__unmask(p, n, key); }

/* Close codes a peer may send (RFC 6455 7.4). */
static bool ws__code_ok(unsigned code) {
  if (code >= 3000 && code <= 4999) return true;
  if (code < 1000 || code > 1014) return false;
  return code != 1004 && code != 1005 && code != 1006;
}

/* Inflates a compressed message into r->zbuf; *out, *olen: the result. */
static int ws__inflate(ws_reader_t *r, char *p, size_t n, char **out,
                       size_t *olen) {
  size_t got = 0;
  int rc = ws_z_inflate(r->z, p, n, r->max_msg, &r->zbuf, &r->zcap, &got);
  if (rc == -1009) return -WS_CLOSE_TOO_BIG;
  if (rc == -1007) return -WS_CLOSE_BAD_DATA;
  if (rc) return rc;
  *out = r->zbuf ? r->zbuf : (char *)"";
  *olen = got;
  return 0;
}

ssize_t ws_read(ws_reader_t *r, char *in, size_t len, ws_event_t *ev) {
  const unsigned char *u = (const unsigned char *)in;
  memset(ev, 0, sizeof(*ev));
  if (len < 2) return 0;
  bool fin = u[0] & 0x80;
  int op = u[0] & 0x0F;
  bool masked = u[1] & 0x80;
  if (r->zcap > WS_ZBUF_KEEP) { /* the last message's: handed out already */
    free(r->zbuf);
    r->zbuf = NULL;
    r->zcap = 0;
  }
  if (u[0] & 0x30) return -WS_CLOSE_PROTOCOL; /* no such extension agreed */
  bool rsv1 = u[0] & WS_RSV1;
  if (rsv1 && (!r->z || (op & 0x8) || op == WS_CONT))
    return -WS_CLOSE_PROTOCOL; /* RSV1: the first frame of a data message */
  if (op != WS_CONT && op != WS_TEXT && op != WS_BINARY && op != WS_CLOSE &&
      op != WS_PING && op != WS_PONG)
    return -WS_CLOSE_PROTOCOL;
  if (r->need_mask && !masked) return -WS_CLOSE_PROTOCOL;
  uint64_t plen = u[1] & 0x7F;
  size_t head = 2;
  if (plen == 126) {
    if (len < 4) return 0;
    plen = (uint64_t)u[2] << 8 | u[3];
    head = 4;
  } else if (plen == 127) {
    if (len < 10) return 0;
    plen = 0;
    for (int i = 0; i < 8; i++) plen = plen << 8 | u[2 + i];
    if (plen >> 63) return -WS_CLOSE_PROTOCOL;
    head = 10;
  }
  bool control = op & 0x8;
  if (control && (!fin || plen > 125)) return -WS_CLOSE_PROTOCOL;
  if (op == WS_CONT && !r->msg_opcode) return -WS_CLOSE_PROTOCOL;
  if ((op == WS_TEXT || op == WS_BINARY) && r->msg_opcode)
    return -WS_CLOSE_PROTOCOL;
  if (!control) {
    uint64_t so_far = op == WS_CONT ? r->msg_len : 0;
    /* a compressed message may be a little longer than what it inflates
     * to (deflate's stored blocks): its own bound, the inflated size is
     * checked while it inflates */
    bool z = rsv1 || (op == WS_CONT && r->msg_z);
    uint64_t max = z ? r->max_msg + r->max_msg / 256 + 64 : r->max_msg;
    if (plen > max || so_far + plen > max) return -WS_CLOSE_TOO_BIG;
  }
  unsigned char mask[4] = {0, 0, 0, 0};
  if (masked) {
    if (len < head + 4) return 0;
    memcpy(mask, u + head, 4);
    head += 4;
  }
  if (len - head < plen) return 0;
  char *payload = in + head;
  size_t n = (size_t)plen;
  if (masked) ws__unmask(payload, n, mask);
  ssize_t used = (ssize_t)(head + n);

  if (control) {
    ev->opcode = op;
    ev->data = payload;
    ev->len = n;
    if (op == WS_CLOSE) {
      if (n == 1) return -WS_CLOSE_PROTOCOL;
      ev->code = WS_CLOSE_NO_STATUS;
      if (n >= 2) {
        unsigned code = (unsigned)(unsigned char)payload[0] << 8 |
                        (unsigned char)payload[1];
        if (!ws__code_ok(code)) return -WS_CLOSE_PROTOCOL;
        if (!ws_utf8_valid(payload + 2, n - 2)) return -WS_CLOSE_BAD_DATA;
        ev->code = (int)code;
        ev->data = payload + 2;
        ev->len = n - 2;
      }
    }
    return used;
  }
  if (fin && op != WS_CONT) { /* a whole message in one frame */
    if (rsv1) {
      int rc = ws__inflate(r, payload, n, &payload, &n);
      if (rc) return rc;
    }
    if (op == WS_TEXT && !ws_utf8_valid(payload, n)) return -WS_CLOSE_BAD_DATA;
    ev->opcode = op;
    ev->data = payload;
    ev->len = n;
    return used;
  }
  /* a fragment: gather it */
  if (op != WS_CONT) {
    r->msg_opcode = op;
    r->msg_z = rsv1;
    r->msg_len = 0;
  }
  if (r->msg_len + n > r->msg_cap) {
    size_t cap = r->msg_cap ? r->msg_cap : 4096;
    while (cap < r->msg_len + n) cap *= 2;
    size_t max = r->msg_z ? r->max_msg + r->max_msg / 256 + 64 : r->max_msg;
    if (cap > max && max >= r->msg_len + n) cap = max;
    char *m = realloc(r->msg, cap ? cap : 1);
    if (!m) return -ENOMEM;
    r->msg = m;
    r->msg_cap = cap;
  }
  if (n) memcpy(r->msg + r->msg_len, payload, n);
  r->msg_len += n;
  if (!fin) return used;
  int mop = r->msg_opcode;
  r->msg_opcode = 0;
  char *data = r->msg ? r->msg : (char *)"";
  size_t dlen = r->msg_len;
  if (r->msg_z) {
    int rc = ws__inflate(r, data, dlen, &data, &dlen);
    if (rc) return rc;
  }
  if (mop == WS_TEXT && !ws_utf8_valid(data, dlen)) return -WS_CLOSE_BAD_DATA;
  ev->opcode = mop;
  ev->data = data;
  ev->len = dlen;
  return used;
}
