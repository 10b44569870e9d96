/* glob: iterative matching with one backtrack point for the last `*`,
 * which is enough because a later `*` can absorb anything an earlier one
 * would have, so matching stays O(len(pat) * len(str)). */
#include "cluster/glob.h"

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

bool glob_match(const char *pat, size_t plen, const char *str, size_t slen) {
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

bool glob_is_pattern(const char *pat, size_t plen) {
  for (size_t i = 0; i < plen; i++)
    if (pat[i] == '*' || pat[i] == '?' || pat[i] == '[' || pat[i] == '\\')
      return true;
  return false;
}
