/* SPDX-License-Identifier: MIT */

/* glob: channel pattern matching in time linear in the channel.
 *
 * A pattern is a list of elements that each take one byte (a literal, `?`,
 * a class) with `*`s between them. Matching runs the pattern as an NFA
 * whose states are "the first i elements are matched", kept as a bitset
 * (shift-and): for each byte of the channel, every state whose next
 * element takes the byte moves on, and every state followed by a `*`
 * also stays. One pass over the channel, a few word operations per byte,
 * whatever the pattern: no backtracking, so `*aaa…b` against a long run of
 * `a` costs what `*` does (the backtracking matcher this replaced was
 * O(len(pat) * len(str)): 2 ms for a 256-byte pattern against a 4 KiB
 * channel, issue 16 item 9). Which elements take a byte is worked out the
 * first time that byte occurs in the channel. A pattern with more elements
 * than the bitset holds falls back to the backtracking matcher (the post
 * office never sees one: lx_pubsub caps patterns at GLOB_MAX_PATTERN). */
#include "cluster/glob.h"

#include <stdint.h>
#include <string.h>

/* Matches one bracket class starting after '['; *pi is moved past the
 * class. */
static bool glob__class(const char *pat, size_t plen, size_t *pi,
                        unsigned char c) {
  size_t i = *pi;
  bool negate = false, hit = false;
  if (i < plen && pat[i] == '^') {
    negate = true;
    i++;
  }
  while (i < plen && pat[i] != ']') {
    unsigned char lo = (unsigned char)pat[i];
    if (lo == '\\' && i + 1 < plen) lo = (unsigned char)pat[++i];
    if (i + 2 < plen && pat[i + 1] == '-' && pat[i + 2] != ']') {
      unsigned char hi = (unsigned char)pat[i + 2];
      i += 2;
      if (hi == '\\' && i + 1 < plen) hi = (unsigned char)pat[++i];
      if (lo > hi) {
        unsigned char t = lo;
        lo = hi;
        hi = t;
      }
      if (c >= lo && c <= hi) hit = true;
    } else if (c == lo) {
      hit = true;
    }
    i++;
  }
  *pi = i < plen ? i + 1 : i; /* past ']' */
  return hit != negate;
}

/* The backtracking matcher: one backtrack point for the last `*`, which is
 * enough because a later `*` can absorb anything an earlier one would
 * have. O(len(pat) * len(str)); used only past GLOB__MAX_ELEMS. */
static bool glob__backtrack(const char *pat, size_t plen, const char *str,
                            size_t slen) {
  size_t p = 0, s = 0;
  size_t star_p = (size_t)-1, star_s = 0;
  while (s < slen) {
    if (p < plen) {
      char pc = pat[p];
      if (pc == '*') {
        while (p < plen && pat[p] == '*') p++;
        if (p == plen) return true;
        star_p = p;
        star_s = s;
        continue;
      }
      if (pc == '?') {
        p++;
        s++;
        continue;
      }
      if (pc == '[') {
        size_t q = p + 1;
        if (glob__class(pat, plen, &q, (unsigned char)str[s])) {
          p = q;
          s++;
          continue;
        }
      } else {
        if (pc == '\\' && p + 1 < plen) pc = pat[++p];
        if (pc == str[s]) {
          p++;
          s++;
          continue;
        }
      }
    }
    /* Mismatch: let the last star take one more byte, or fail. */
    if (star_p == (size_t)-1) return false;
    p = star_p;
    s = ++star_s;
  }
  while (p < plen && pat[p] == '*') p++;
  return p == plen;
}

#define GLOB__WORDS 4
#define GLOB__MAX_ELEMS (GLOB__WORDS * 64 - 1) /* state 0 is "none yet" */

/* Whether element `e` (its first byte at pat[e]) takes byte c. */
static bool glob__takes(const char *pat, size_t plen, size_t e,
                        unsigned char c) {
  char pc = pat[e];
  if (pc == '?') return true;
  if (pc == '[') {
    size_t q = e + 1;
    return glob__class(pat, plen, &q, c);
  }
  if (pc == '\\' && e + 1 < plen) pc = pat[e + 1];
  return (unsigned char)pc == c;
}

bool glob_match(const char *pat, size_t plen, const char *str, size_t slen) {
  /* Split the pattern: elem[i] is where element i + 1 starts; bit i of
   * `star` says a `*` follows state i (after i elements). */
  uint16_t elem[GLOB__MAX_ELEMS];
  uint64_t star[GLOB__WORDS] = {0};
  size_t k = 0;
  for (size_t i = 0; i < plen;) {
    if (pat[i] == '*') {
      star[k / 64] |= 1ull << (k % 64);
      i++;
      continue;
    }
    if (k == GLOB__MAX_ELEMS || plen > UINT16_MAX)
      return glob__backtrack(pat, plen, str, slen);
    elem[k++] = (uint16_t)i;
    if (pat[i] == '[') {
      size_t q = i + 1;
      glob__class(pat, plen, &q, 0); /* its end does not depend on the byte */
      i = q;
    } else if (pat[i] == '\\' && i + 1 < plen) {
      i += 2;
    } else {
      i++;
    }
  }
  size_t words = k / 64 + 1;
  /* take[c]: bit i + 1 set when element i + 1 takes byte c (the move from
   * state i), filled on first use. */
  uint64_t take[256][GLOB__WORDS];
  uint64_t known[4] = {0};
  uint64_t d[GLOB__WORDS] = {1};
  for (size_t s = 0; s < slen; s++) {
    unsigned char c = (unsigned char)str[s];
    if (!(known[c / 64] >> (c % 64) & 1)) {
      known[c / 64] |= 1ull << (c % 64);
      memset(take[c], 0, sizeof(take[c]));
      for (size_t i = 0; i < k; i++)
        if (glob__takes(pat, plen, elem[i], c))
          take[c][(i + 1) / 64] |= 1ull << ((i + 1) % 64);
    }
    uint64_t carry = 0, any = 0;
    for (size_t w = 0; w < words; w++) {
      uint64_t moved = d[w] << 1 | carry;
      carry = d[w] >> 63;
      d[w] = (moved & take[c][w]) | (d[w] & star[w]);
      any |= d[w];
    }
    if (!any) return false;
  }
  return d[k / 64] >> (k % 64) & 1;
}

bool glob_is_pattern(const char *pat, size_t plen) {
  for (size_t i = 0; i < plen; i++)
    if (pat[i] == '*' || pat[i] == '?' || pat[i] == '[' || pat[i] == '\\')
      return true;
  return false;
}
