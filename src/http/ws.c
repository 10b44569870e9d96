/* ws: WebSocket frames, the handshake key and UTF-8 checks (RFC 6455). */
#include "http/ws.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- the handshake: base64(SHA-1(key + GUID)) ---- */

static uint32_t ws__rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

/* SHA-1 (FIPS 180-4) of one short message: enough for a handshake key. */
static void ws__sha1(const unsigned char *msg, size_t len, unsigned char out[20]) {
  uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
  size_t total = ((len + 8) / 64 + 1) * 64;
  unsigned char block[64];
  for (size_t off = 0; off < total; off += 64) {
    for (size_t i = 0; i < 64; i++) {
      size_t at = off + i;
      unsigned char b;
      if (at < len) b = msg[at];
      else if (at == len) b = 0x80;
      else if (at >= total - 8) b = (unsigned char)(((uint64_t)len * 8) >> (8 * (total - 1 - at)));
      else b = 0;
      block[i] = b;
    }
    uint32_t w[80];
    for (int i = 0; i < 16; i++)
      w[i] = (uint32_t)block[4 * i] << 24 | (uint32_t)block[4 * i + 1] << 16 |
             (uint32_t)block[4 * i + 2] << 8 | block[4 * i + 3];
    for (int i = 16; i < 80; i++)
      w[i] = ws__rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
    for (int i = 0; i < 80; i++) {
      uint32_t f, k;
      if (i < 20) f = (b & c) | (~b & d), k = 0x5A827999;
      else if (i < 40) f = b ^ c ^ d, k = 0x6ED9EBA1;
      else if (i < 60) f = (b & c) | (b & d) | (c & d), k = 0x8F1BBCDC;
      else f = b ^ c ^ d, k = 0xCA62C1D6;
      uint32_t t = ws__rol(a, 5) + f + e + k + w[i];
      e = d;
      d = c;
      c = ws__rol(b, 30);
      b = a;
      a = t;
    }
    h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e;
  }
  for (int i = 0; i < 5; i++) {
    out[4 * i] = (unsigned char)(h[i] >> 24);
    out[4 * i + 1] = (unsigned char)(h[i] >> 16);
    out[4 * i + 2] = (unsigned char)(h[i] >> 8);
    out[4 * i + 3] = (unsigned char)h[i];
  }
}

void ws_accept_key(const char *key, size_t len, char out[29]) {
  static const char guid[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  static const char b64[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  unsigned char buf[128 + sizeof(guid)];
  if (len > 128) len = 128; /* a real key is 24 characters */
  memcpy(buf, key, len);
  memcpy(buf + len, guid, sizeof(guid) - 1);
  unsigned char d[21];
  ws__sha1(buf, len + sizeof(guid) - 1, d);
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
  out[0] = (char)((fin ? 0x80 : 0) | (opcode & 0x0F));
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

ssize_t ws_read(ws_reader_t *r, char *in, size_t len, ws_event_t *ev) {
  const unsigned char *u = (const unsigned char *)in;
  memset(ev, 0, sizeof(*ev));
  if (len < 2) return 0;
  bool fin = u[0] & 0x80;
  int op = u[0] & 0x0F;
  bool masked = u[1] & 0x80;
  if (u[0] & 0x70) return -WS_CLOSE_PROTOCOL; /* no extensions agreed */
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
    if (plen > r->max_msg || so_far + plen > r->max_msg)
      return -WS_CLOSE_TOO_BIG;
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
    if (op == WS_TEXT && !ws_utf8_valid(payload, n)) return -WS_CLOSE_BAD_DATA;
    ev->opcode = op;
    ev->data = payload;
    ev->len = n;
    return used;
  }
  /* a fragment: gather it */
  if (op != WS_CONT) {
    r->msg_opcode = op;
    r->msg_len = 0;
  }
  if (r->msg_len + n > r->msg_cap) {
    size_t cap = r->msg_cap ? r->msg_cap : 4096;
    while (cap < r->msg_len + n) cap *= 2;
    if (cap > r->max_msg && r->max_msg >= r->msg_len + n) cap = r->max_msg;
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
  if (mop == WS_TEXT && !ws_utf8_valid(r->msg, r->msg_len))
    return -WS_CLOSE_BAD_DATA;
  ev->opcode = mop;
  ev->data = r->msg ? r->msg : "";
  ev->len = r->msg_len;
  if (!r->msg) ev->data = "";
  return used;
}
