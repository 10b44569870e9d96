/* SPDX-License-Identifier: MIT */

/* http1_lex: the lexical pieces the request parser (http1.c) and the
 * response parser (http1_response.c) share. Internal to src/http: not a
 * public contract. Pure functions of their arguments; any thread. */
#ifndef MP_HTTP1_LEX_H
#define MP_HTTP1_LEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* tchar (RFC 9110 5.6.2): 1 for the characters of methods and field
 * names. */
extern const unsigned char http__tchar[256];
/* An ASCII letter in lower case; anything else as it is. */
static inline int http__lower(int c) {
  return c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c;
}
/* Eight bytes with their ASCII capitals in lower case (any other byte,
 * 0x80 and up too, as it is): a capital is a byte whose low seven bits
 * are 'A'..'Z' (each sum stays inside its byte) and whose top bit is
 * clear, and gets 0x20 added. */
static inline uint64_t http__lower8(uint64_t x) {
  const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
  uint64_t h = x & ~highs;
  uint64_t ge_a = h + (0x80 - 'A') * ones;     /* top bit: h >= 'A' */
  uint64_t gt_z = h + (0x80 - 'Z' - 1) * ones; /* top bit: h > 'Z' */
  return x | ((ge_a & ~gt_z & ~x & highs) >> 2);
}
static inline uint64_t http__load8(const char *p) {
  uint64_t x;
  memcpy(&x, p, 8);
  return x;
}
static inline uint64_t http__load4(const char *p) {
  uint32_t x;
  memcpy(&x, p, 4);
  return x;
}
/* a[0..alen) equals b[0..blen), ASCII case-insensitively. Eight bytes
 * at a time (the last eight, or two fours, overlap what came before):
 * a field name is compared with a literal in a few instructions, not ten
 * a byte (the response side of a proxied request compares ~70 bytes).
 * Always inline: a call would cost more than a compare of another length,
 * and a literal's words fold only inline. */
static inline __attribute__((always_inline)) bool
http__ieqn(const char *a, size_t alen, const char *b, size_t blen) {
  if (alen != blen) return false;
  if (alen >= 8) {
    size_t i = 0;
    for (; i + 8 < alen; i += 8)
      if (http__lower8(http__load8(a + i)) != http__lower8(http__load8(b + i)))
        return false;
    return http__lower8(http__load8(a + alen - 8)) ==
           http__lower8(http__load8(b + alen - 8));
  }
  if (alen >= 4)
    return http__lower8(http__load4(a) | http__load4(a + alen - 4) << 32) ==
           http__lower8(http__load4(b) | http__load4(b + alen - 4) << 32);
  for (size_t i = 0; i < alen; i++)
    if (http__lower((unsigned char)a[i]) != http__lower((unsigned char)b[i]))
      return false;
  return true;
}
/* a[0..alen) equals the NUL-terminated b, ASCII case-insensitively.
 * Inline: for a literal b (every caller's) the length is a constant, so
 * a field of another length costs one compare (the response parser asks
 * three names of every field). */
static inline __attribute__((always_inline)) bool
http__ieq(const char *a, size_t alen, const char *b) {
  return http__ieqn(a, alen, b, strlen(b));
}
/* s[0..n) may stand in a field value or a reason phrase: no control
 * byte but HTAB, no DEL (RFC 9110 5.5; obs-text, 0x80-0xff, may). Eight
 * bytes at a time: a word with no byte below 0x20 and none equal to 0x7f
 * (bytes of 0x80 and up never count) is passed whole; one that may have
 * either, or a tab, is looked at byte by byte. */
static inline bool http__text_ok(const char *s, size_t n) {
  const uint64_t ones = 0x0101010101010101u, highs = 0x8080808080808080u;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x;
    memcpy(&x, s + i, 8);
    uint64_t lo = (x - 0x20 * ones) & ~x & highs; /* a byte < 0x20 */
    uint64_t d = x ^ (0x7f * ones);               /* 0 where DEL */
    uint64_t del = (d - ones) & ~d & highs;
    if (!(lo | del)) continue;
    for (size_t k = i; k < i + 8; k++) {
      unsigned char ch = (unsigned char)s[k];
      if ((ch < ' ' && ch != '\t') || ch == 0x7f) return false;
    }
  }
  for (; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if ((ch < ' ' && ch != '\t') || ch == 0x7f) return false;
  }
  return true;
}
/* Content-Length digits as a number; -1 if malformed or 19 digits and
 * more. */
int64_t http__length(const char *v, size_t n);

#endif
