/* SPDX-License-Identifier: MIT */

/* static: the pure parts of serving files (safe paths, media types,
 * Range, validators, Accept-Encoding, dates); see static.h. */
#include "http/static.h"

#include <string.h>
#include <strings.h>
#include <time.h>

#include "http/http1.h"

static bool st__ows(char ch) { return ch == ' ' || ch == '\t'; }
static bool st__digit(char ch) { return ch >= '0' && ch <= '9'; }

static char st__lower(char ch) {
  return ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
}

/* Whether s[0..n) equals the lower-case word `w` ignoring case. */
static bool st__is(const char *s, size_t n, const char *w) {
  size_t wl = strlen(w);
  if (n != wl) return false;
  for (size_t i = 0; i < n; i++)
    if (st__lower(s[i]) != w[i]) return false;
  return true;
}

/* ---- paths ---- */

ssize_t http_static_path(const char *path, size_t len, char *out, size_t cap) {
  if (len == 0 || path[0] != '/' || len + 1 > cap) return HTTP_STATIC_SKIP;
  bool encoded_slash = false;
  for (size_t i = 0; i < len; i++) {
    if (path[i] == '\\') return HTTP_STATIC_ESCAPE;
    if (path[i] == '%' && i + 2 < len && path[i + 1] == '2' &&
        st__lower(path[i + 2]) == 'f')
      encoded_slash = true;
  }
  ssize_t n = http_unescape(path, len, out, false);
  if (n < 0 || memchr(out, 0, (size_t)n)) return HTTP_STATIC_BAD;
  if (memchr(out, '\\', (size_t)n)) return HTTP_STATIC_ESCAPE;
  /* ".." anywhere is refused outright (it can only be meant to climb);
   * other dot segments only make the path not one we serve. */
  bool hidden = false;
  size_t i = 0;
  while (i < (size_t)n) {
    size_t j = i;
    while (j < (size_t)n && out[j] != '/') j++;
    const char *seg = out + i;
    size_t sl = j - i;
    if (sl == 2 && seg[0] == '.' && seg[1] == '.') return HTTP_STATIC_ESCAPE;
    if (sl > 0 && seg[0] == '.' && !(sl == 11 && memcmp(seg, ".well-known", 11) == 0))
      hidden = true;
    i = j + 1;
  }
  if (hidden || encoded_slash) return HTTP_STATIC_SKIP;
  /* relative to the folder: no leading slashes ("//etc" is "etc") */
  size_t skip = 0;
  while (skip < (size_t)n && out[skip] == '/') skip++;
  size_t rl = (size_t)n - skip;
  memmove(out, out + skip, rl);
  if (rl == 0) out[rl++] = '.';
  out[rl] = 0;
  return (ssize_t)rl;
}

/* ---- media types ---- */

#define ST_UTF8 "; charset=utf-8"

static const struct {
  const char *ext, *type;
} st_types[] = {
    {"html", "text/html" ST_UTF8},
    {"htm", "text/html" ST_UTF8},
    {"css", "text/css" ST_UTF8},
    {"js", "text/javascript" ST_UTF8},
    {"mjs", "text/javascript" ST_UTF8},
    {"json", "application/json" ST_UTF8},
    {"map", "application/json" ST_UTF8},
    {"webmanifest", "application/manifest+json" ST_UTF8},
    {"txt", "text/plain" ST_UTF8},
    {"md", "text/markdown" ST_UTF8},
    {"csv", "text/csv" ST_UTF8},
    {"xml", "application/xml"},
    {"svg", "image/svg+xml"},
    {"png", "image/png"},
    {"jpg", "image/jpeg"},
    {"jpeg", "image/jpeg"},
    {"gif", "image/gif"},
    {"webp", "image/webp"},
    {"avif", "image/avif"},
    {"ico", "image/x-icon"},
    {"bmp", "image/bmp"},
    {"wasm", "application/wasm"},
    {"woff", "font/woff"},
    {"woff2", "font/woff2"},
    {"ttf", "font/ttf"},
    {"otf", "font/otf"},
    {"pdf", "application/pdf"},
    {"zip", "application/zip"},
    {"gz", "application/gzip"},
    {"tar", "application/x-tar"},
    {"mp4", "video/mp4"},
    {"webm", "video/webm"},
    {"ogv", "video/ogg"},
    {"mp3", "audio/mpeg"},
    {"ogg", "audio/ogg"},
    {"oga", "audio/ogg"},
    {"wav", "audio/wav"},
    {"flac", "audio/flac"},
    {"m4a", "audio/mp4"},
    {"vtt", "text/vtt" ST_UTF8},
};

const char *http_static_mime(const char *name, size_t len) {
  size_t dot = len;
  for (size_t i = len; i > 0; i--) {
    if (name[i - 1] == '/') break;
    if (name[i - 1] == '.') {
      dot = i - 1;
      break;
    }
  }
  if (dot < len) {
    const char *ext = name + dot + 1;
    size_t el = len - dot - 1;
    for (size_t i = 0; i < sizeof(st_types) / sizeof(st_types[0]); i++)
      if (st__is(ext, el, st_types[i].ext)) return st_types[i].type;
  }
  return "application/octet-stream";
}

/* ---- Range ---- */

/* Reads digits at s[*i..len) into *v, saturating at UINT64_MAX. Returns
 * whether there was at least one. */
static bool st__number(const char *s, size_t len, size_t *i, uint64_t *v) {
  size_t start = *i;
  uint64_t n = 0;
  while (*i < len && st__digit(s[*i])) {
    unsigned d = (unsigned)(s[*i] - '0');
    n = n > (UINT64_MAX - d) / 10 ? UINT64_MAX : n * 10 + d;
    (*i)++;
  }
  *v = n;
  return *i > start;
}

int http_static_range(const char *value, size_t len, uint64_t size,
                      uint64_t *first, uint64_t *last) {
  if (len < 6 || strncasecmp(value, "bytes=", 6) != 0) return HTTP_RANGE_IGNORE;
  size_t i = 6;
  int count = 0;
  bool suffix = false, has_b = false;
  uint64_t a = 0, b = 0;
  while (i < len) {
    while (i < len && (st__ows(value[i]) || value[i] == ',')) i++;
    if (i == len) break;
    if (++count > 1) return HTTP_RANGE_IGNORE;
    if (value[i] == '-') {
      i++;
      suffix = true;
      if (!st__number(value, len, &i, &a)) return HTTP_RANGE_IGNORE;
    } else {
      if (!st__number(value, len, &i, &a)) return HTTP_RANGE_IGNORE;
      if (i == len || value[i] != '-') return HTTP_RANGE_IGNORE;
      i++;
      has_b = st__number(value, len, &i, &b);
    }
    while (i < len && st__ows(value[i])) i++;
    if (i < len && value[i] != ',') return HTTP_RANGE_IGNORE;
  }
  if (count == 0 || size == 0) return HTTP_RANGE_IGNORE;
  if (suffix) {
    if (a == 0) return HTTP_RANGE_UNSATISFIABLE;
    *first = a >= size ? 0 : size - a;
    *last = size - 1;
    return HTTP_RANGE_OK;
  }
  if (has_b && b < a) return HTTP_RANGE_IGNORE;
  if (a >= size) return HTTP_RANGE_UNSATISFIABLE;
  *first = a;
  *last = has_b && b < size - 1 ? b : size - 1;
  return HTTP_RANGE_OK;
}

/* ---- validators ---- */

/* An entity-tag at s[*i..len): optional W/, then a quoted opaque tag.
 * Sets the tag (quotes included) and whether it was weak. */
static bool st__etag(const char *s, size_t len, size_t *i, const char **tag,
                     size_t *tl, bool *weak) {
  size_t k = *i;
  *weak = k + 1 < len && s[k] == 'W' && s[k + 1] == '/';
  if (*weak) k += 2;
  if (k >= len || s[k] != '"') return false;
  size_t start = k++;
  while (k < len && s[k] != '"') {
    unsigned char ch = (unsigned char)s[k];
    if (ch < 0x21 || ch == 0x7f) return false;
    k++;
  }
  if (k >= len) return false;
  k++;
  *tag = s + start;
  *tl = k - start;
  *i = k;
  return true;
}

static void st__strip_weak(const char **etag, size_t *elen) {
  if (*elen >= 2 && (*etag)[0] == 'W' && (*etag)[1] == '/') {
    *etag += 2;
    *elen -= 2;
  }
}

bool http_static_etag_match(const char *value, size_t len, const char *etag,
                            size_t elen) {
  st__strip_weak(&etag, &elen);
  size_t i = 0;
  while (i < len && st__ows(value[i])) i++;
  size_t end = len;
  while (end > i && st__ows(value[end - 1])) end--;
  if (end - i == 1 && value[i] == '*') return true;
  while (i < end) {
    while (i < end && (st__ows(value[i]) || value[i] == ',')) i++;
    if (i == end) break;
    const char *tag;
    size_t tl;
    bool weak;
    if (!st__etag(value, end, &i, &tag, &tl, &weak)) return false;
    while (i < end && st__ows(value[i])) i++;
    if (i < end && value[i] != ',') return false;
    if (tl == elen && memcmp(tag, etag, tl) == 0) return true;
  }
  return false;
}

bool http_static_if_range(const char *value, size_t len, const char *etag,
                          size_t elen, int64_t mtime) {
  while (len && st__ows(value[0])) value++, len--;
  while (len && st__ows(value[len - 1])) len--;
  if (len && (value[0] == '"' || (len > 1 && value[0] == 'W' && value[1] == '/'))) {
    size_t i = 0;
    const char *tag;
    size_t tl;
    bool weak;
    if (!st__etag(value, len, &i, &tag, &tl, &weak) || i != len || weak)
      return false;
    return !(elen >= 2 && etag[0] == 'W') && tl == elen &&
           memcmp(tag, etag, tl) == 0;
  }
  int64_t t = http_static_parse_date(value, len);
  return t >= 0 && t == mtime;
}

/* ---- Accept-Encoding ---- */

/* Whether a qvalue is above zero: any digit other than 0 in it. A
 * malformed one counts as 0, so a client is never sent a coding it may
 * not have asked for. */
static bool st__q_positive(const char *s, size_t n) {
  bool digits = false, nonzero = false;
  for (size_t i = 0; i < n; i++) {
    if (st__digit(s[i])) {
      digits = true;
      if (s[i] != '0') nonzero = true;
    } else if (s[i] != '.') {
      return false;
    }
  }
  return digits && nonzero;
}

static bool st__tchar(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || st__digit(ch) ||
         (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

bool http_static_accepts_gzip(const char *value, size_t len) {
  int gzip = -1, star = -1; /* -1 not listed, 0 refused, 1 accepted */
  size_t i = 0;
  while (i < len) {
    while (i < len && (st__ows(value[i]) || value[i] == ',')) i++;
    if (i == len) break;
    size_t t0 = i;
    while (i < len && st__tchar(value[i])) i++;
    size_t tl = i - t0;
    bool ok = true;
    /* parameters: ;name=value, value a token or a quoted string */
    for (;;) {
      while (i < len && st__ows(value[i])) i++;
      if (i == len || value[i] != ';') break;
      i++;
      while (i < len && st__ows(value[i])) i++;
      size_t n0 = i;
      while (i < len && st__tchar(value[i])) i++;
      size_t nl = i - n0;
      while (i < len && st__ows(value[i])) i++;
      if (i == len || value[i] != '=') break;
      i++;
      while (i < len && st__ows(value[i])) i++;
      size_t v0 = i;
      if (i < len && value[i] == '"') {
        i++;
        while (i < len && value[i] != '"') i += value[i] == '\\' ? 2 : 1;
        if (i >= len) { /* unterminated: refuse the element */
          i = len;
          ok = false;
          break;
        }
        i++;
      } else {
        while (i < len && st__tchar(value[i])) i++;
      }
      if (st__is(value + n0, nl, "q")) ok = st__q_positive(value + v0, i - v0);
    }
    if (st__is(value + t0, tl, "gzip") || st__is(value + t0, tl, "x-gzip")) {
      if (gzip < 1) gzip = ok;
    } else if (tl == 1 && value[t0] == '*') {
      star = ok;
    }
    /* skip whatever is left of a malformed element */
    while (i < len && value[i] != ',') i++;
  }
  return gzip == 1 || (gzip < 0 && star == 1);
}

/* ---- dates ---- */

static const char st_days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
static const char st_months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

/* A cursor over the date being parsed. */
typedef struct {
  const char *s;
  size_t len, i;
  bool ok;
} st_cur_t;

static void st__lit(st_cur_t *c, const char *w) {
  size_t n = strlen(w);
  if (c->ok && c->i + n <= c->len && memcmp(c->s + c->i, w, n) == 0)
    c->i += n;
  else
    c->ok = false;
}

/* Exactly n digits; a leading blank counts as 0 when `pad`. */
static int st__digits(st_cur_t *c, int n, bool pad) {
  int v = 0;
  for (int k = 0; k < n && c->ok; k++) {
    char ch = c->i < c->len ? c->s[c->i] : 0;
    if (st__digit(ch))
      v = v * 10 + (ch - '0');
    else if (!(pad && k == 0 && ch == ' '))
      c->ok = false;
    c->i++;
  }
  return v;
}

static int st__month(st_cur_t *c) {
  if (!c->ok || c->i + 3 > c->len) {
    c->ok = false;
    return 0;
  }
  for (int m = 0; m < 12; m++)
    if (memcmp(c->s + c->i, st_months[m], 3) == 0) {
      c->i += 3;
      return m;
    }
  c->ok = false;
  return 0;
}

static void st__hms(st_cur_t *c, struct tm *tm) {
  tm->tm_hour = st__digits(c, 2, false);
  st__lit(c, ":");
  tm->tm_min = st__digits(c, 2, false);
  st__lit(c, ":");
  tm->tm_sec = st__digits(c, 2, false);
}

int64_t http_static_parse_date(const char *s, size_t len) {
  st_cur_t c = {s, len, 0, true};
  struct tm tm;
  memset(&tm, 0, sizeof(tm));
  const char *comma = memchr(s, ',', len);
  if (comma && comma - s == 3) { /* Sun, 06 Nov 1994 08:49:37 GMT */
    c.i = 4;
    st__lit(&c, " ");
    tm.tm_mday = st__digits(&c, 2, false);
    st__lit(&c, " ");
    tm.tm_mon = st__month(&c);
    st__lit(&c, " ");
    tm.tm_year = st__digits(&c, 4, false) - 1900;
    st__lit(&c, " ");
    st__hms(&c, &tm);
    st__lit(&c, " GMT");
  } else if (comma) { /* Sunday, 06-Nov-94 08:49:37 GMT */
    c.i = (size_t)(comma - s) + 1;
    st__lit(&c, " ");
    tm.tm_mday = st__digits(&c, 2, false);
    st__lit(&c, "-");
    tm.tm_mon = st__month(&c);
    st__lit(&c, "-");
    int yy = st__digits(&c, 2, false);
    tm.tm_year = yy < 70 ? yy + 100 : yy;
    st__lit(&c, " ");
    st__hms(&c, &tm);
    st__lit(&c, " GMT");
  } else { /* Sun Nov  6 08:49:37 1994 */
    c.i = 3;
    st__lit(&c, " ");
    tm.tm_mon = st__month(&c);
    st__lit(&c, " ");
    tm.tm_mday = st__digits(&c, 2, true);
    st__lit(&c, " ");
    st__hms(&c, &tm);
    st__lit(&c, " ");
    tm.tm_year = st__digits(&c, 4, false) - 1900;
  }
  if (!c.ok || c.i != len || tm.tm_mday < 1 || tm.tm_mday > 31 ||
      tm.tm_hour > 23 || tm.tm_min > 59 || tm.tm_sec > 60)
    return -1;
  return (int64_t)timegm(&tm);
}

/* The last date this thread wrote: a folder's files share few mtimes,
 * and gmtime_r cost about 800 instructions of each static answer
 * (callgrind). */
static __thread int64_t st_last_t = INT64_MIN;
static __thread char st_last[30];

static void st__format_date(int64_t t, char *out);

size_t http_static_format_date(int64_t t, char *out) {
  if (t != st_last_t) {
    st__format_date(t, st_last);
    st_last_t = t;
  }
  memcpy(out, st_last, 30);
  return 29;
}

static void st__format_date(int64_t t, char *out) {
  time_t tt = (time_t)t;
  struct tm tm;
  gmtime_r(&tt, &tm);
  /* by hand rather than strftime: %a and %b follow the locale */
  memcpy(out, st_days[tm.tm_wday], 3);
  out[3] = ',';
  out[4] = ' ';
  out[5] = (char)('0' + tm.tm_mday / 10);
  out[6] = (char)('0' + tm.tm_mday % 10);
  out[7] = ' ';
  memcpy(out + 8, st_months[tm.tm_mon], 3);
  out[11] = ' ';
  int y = tm.tm_year + 1900;
  if (y < 0) y = 0;
  if (y > 9999) y = 9999;
  for (int k = 15; k >= 12; k--, y /= 10) out[k] = (char)('0' + y % 10);
  out[16] = ' ';
  out[17] = (char)('0' + tm.tm_hour / 10);
  out[18] = (char)('0' + tm.tm_hour % 10);
  out[19] = ':';
  out[20] = (char)('0' + tm.tm_min / 10);
  out[21] = (char)('0' + tm.tm_min % 10);
  out[22] = ':';
  out[23] = (char)('0' + tm.tm_sec / 10);
  out[24] = (char)('0' + tm.tm_sec % 10);
  memcpy(out + 25, " GMT", 5);
}
