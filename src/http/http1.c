/* SPDX-License-Identifier: MIT */

/* http1: the HTTP/1.x request parser (RFC 9110, 9112). */
#include "http/http1.h"
#include "http/http1_lex.h"

#include <string.h>
#include <strings.h>

/* The letters and digits, for the character tables below. */
#define HTTP_ALNUM_ENTRIES                                                   \
  ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1,          \
  ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1, ['A'] = 1, ['B'] = 1,          \
  ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1,          \
  ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1,          \
  ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1,          \
  ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1,          \
  ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1,          \
  ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1,          \
  ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1,          \
  ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,          \
  ['y'] = 1, ['z'] = 1

/* tchar (RFC 9110 5.6.2): the characters of methods and field names. */
const unsigned char http__tchar[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1,
    ['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1,
    ['`'] = 1, ['|'] = 1, ['~'] = 1,
    HTTP_ALNUM_ENTRIES,
};

bool http_list_has(const char *v, size_t len, const char *token) {
  size_t tlen = strlen(token), i = 0;
  while (i < len) {
    while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    size_t start = i;
    while (i < len && v[i] != ',') i++;
    size_t end = i;
    while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t')) end--;
    if (end > start && http__ieqn(v + start, end - start, token, tlen))
      return true;
  }
  return false;
}

const http_header_t *http_header(const http_request_t *req, const char *name) {
  size_t n = strlen(name);
  for (int i = 0; i < req->nheaders; i++)
    if (http__ieqn(req->headers[i].name, req->headers[i].name_len, name, n))
      return &req->headers[i];
  return NULL;
}

/* The end of the line that starts at p: the index of its '\n', or -1. */
static inline long http__eol(const char *buf, size_t p, size_t len) {
  const char *nl = memchr(buf + p, '\n', len - p);
  return nl ? (long)(nl - buf) : -1;
}

/* The line's content ends before "\r\n" or "\n". */
static inline size_t http__content_end(const char *buf, size_t start,
                                       size_t nl) {
  return nl > start && buf[nl - 1] == '\r' ? nl - 1 : nl;
}

/* Host = uri-host [ ":" port ] (RFC 9110 7.2, RFC 3986 3.2.2): an IP
 * literal in brackets (hex digits, ':' and '.' inside), or a reg-name
 * (unreserved, sub-delims, %-escapes: no ':', no bracket), then an
 * optional port of at most five digits, 65535 at most. A space, '/', '?',
 * '#', '@' or a byte past ASCII can't be part of one. Empty is allowed (a
 * URI without authority). */
static const unsigned char http_hostchar[256] = {
    ['!'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1,         ['('] = 1,
    [')'] = 1, ['*'] = 1, ['+'] = 1, [','] = 1, ['-'] = 1,          ['.'] = 1,
    [';'] = 1, ['='] = 1, ['_'] = 1, ['~'] = 1, HTTP_ALNUM_ENTRIES,
};

static bool http__host_ok(const char *v, size_t n) {
  size_t i = 0;
  if (n && v[0] == '[') {
    for (i = 1; i < n && v[i] != ']'; i++) {
      char c = v[i];
      if (!((c >= '0' && c <= '9') ||
            ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') || c == ':' || c == '.'))
        return false;
    }
    if (i >= n || i == 1) return false; /* no ']', or "[]" */
    i++;
  } else {
    while (i < n && http_hostchar[(unsigned char)v[i]]) i++;
  }
  if (i == n) return true;
  if (v[i] != ':' || n - i - 1 > 5) return false;
  unsigned port = 0;
  for (i++; i < n; i++) {
    if (v[i] < '0' || v[i] > '9') return false;
    port = port * 10 + (unsigned)(v[i] - '0');
  }
  return port <= 65535;
}

/* An absolute-form target's authority: the bytes after "http://" or
 * "https://" up to the first '/' or '?'. The scheme's length (7 or 8), or
 * 0 for any other target. */
static size_t http__absolute(const char *t, size_t n, const char **auth,
                             size_t *alen) {
  size_t scheme = n >= 7 && strncasecmp(t, "http://", 7) == 0    ? 7
                  : n >= 8 && strncasecmp(t, "https://", 8) == 0 ? 8
                                                                 : 0;
  if (!scheme) return 0;
  size_t i = scheme;
  while (i < n && t[i] != '/' && t[i] != '?') i++;
  *auth = t + scheme;
  *alen = i - scheme;
  return scheme;
}

/* RFC 9112 3.2: origin-form ("/..."), absolute-form (an http or https
 * URI: another scheme is not ours to serve), authority-form for CONNECT,
 * "*" for OPTIONS. An absolute-form authority must be a host (RFC 9110
 * 4.2.1: not empty) without userinfo (4.2.4: "user@" is refused, as nginx
 * does) and an optional port. */
static bool http__target_ok(const http_request_t *r) {
  const char *t = r->target;
  size_t n = r->target_len;
  if (r->method_len == 7 && memcmp(r->method, "CONNECT", 7) == 0)
    return memchr(t, ':', n) != NULL && !memchr(t, '/', n);
  if (t[0] == '/') return true;
  if (r->method_len == 7 && memcmp(r->method, "OPTIONS", 7) == 0 && n == 1 &&
      t[0] == '*')
    return true;
  const char *auth;
  size_t alen;
  if (!http__absolute(t, n, &auth, &alen)) return false;
  return alen > 0 && !memchr(auth, '@', alen) && http__host_ok(auth, alen);
}

/* Inlined into http_parse_head, the hot caller. */
static inline __attribute__((always_inline)) int
http__request_line(const char *s, size_t n, http_request_t *req) {
  size_t i = 0;
  unsigned lower = 0;
  while (i < n && http__tchar[(unsigned char)s[i]]) {
    lower |= (unsigned)(s[i] - 'a') < 26u;
    i++;
  }
  if (i == 0 || i >= n || s[i] != ' ') return HTTP_BAD;
  req->method = s;
  req->method_len = (uint32_t)i;
  size_t t = ++i;
  /* visible ASCII only (RFC 9112 3.2): no control bytes, none past 0x7e */
  while (i < n && (unsigned char)s[i] > ' ' && (unsigned char)s[i] < 0x7f) i++;
  if (i == t || i >= n || s[i] != ' ') return HTTP_BAD;
  req->target = s + t;
  req->target_len = (uint32_t)(i - t);
  if (!http__target_ok(req)) return HTTP_BAD;
  i++;
  if (n - i != 8 || memcmp(s + i, "HTTP/", 5) != 0) return HTTP_BAD;
  char major = s[i + 5], dot = s[i + 6], minor = s[i + 7];
  if (major < '0' || major > '9' || dot != '.' || minor < '0' || minor > '9')
    return HTTP_BAD;
  if (major != '1' || (minor != '0' && minor != '1')) return HTTP_BAD_VERSION;
  req->minor = minor - '0';
  /* A method the server can't implement for any resource (RFC 9110
   * 15.6.2: 501): one with a lower-case letter (methods are case-sensitive
   * and every registered one is upper case, so "get" is not GET), and
   * CONNECT (moonport doesn't tunnel). */
  if (lower || (req->method_len == 7 && memcmp(s, "CONNECT", 7) == 0))
    return HTTP_NOT_IMPLEMENTED;
  return 0;
}

/* Parses "Content-Length" digits; -1 if malformed or over 2^62. */
int64_t http__length(const char *v, size_t n) {
  if (n == 0 || n > 18) return -1;
  int64_t x = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9') return -1;
    x = x * 10 + (v[i] - '0');
  }
  return x;
}

long http_request_line_span(const char *buf, size_t len, size_t *start) {
  size_t p = 0;
  while (p < len && (buf[p] == '\r' || buf[p] == '\n')) p++;
  long nl = http__eol(buf, p, len);
  if (nl < 0) return -1;
  size_t end = http__content_end(buf, p, (size_t)nl);
  http_request_t scratch;
  int rc = http__request_line(buf + p, end - p, &scratch);
  if (rc != 0 && rc != HTTP_BAD_VERSION) return -1;
  *start = p;
  return (long)(end - p);
}

int http_parse_head(const char *buf, size_t len, size_t max_head,
                    http_request_t *req) {
  size_t p = 0;
  size_t lim = len < max_head ? len : max_head;
  /* Empty lines before the request line are ignored. */
  while (p < lim && (buf[p] == '\r' || buf[p] == '\n')) p++;
  long nl = http__eol(buf, p, lim);
  if (nl < 0) return len >= max_head ? HTTP_HEAD_TOO_LARGE : HTTP_NEED_MORE;
  req->nheaders = 0;
  req->content_length = -1;
  req->chunked = req->keep_alive = req->expect_continue = req->upgrade = false;
  req->h2 = false;
  int rc = http__request_line(buf + p, http__content_end(buf, p, (size_t)nl) - p,
                              req);
  if (rc) return rc;
  p = (size_t)nl + 1;
  bool host = false, te = false, conn_close = false, conn_keep = false,
       conn_upgrade = false, upgrade_field = false;
  for (;;) {
    nl = http__eol(buf, p, lim);
    if (nl < 0) return len >= max_head ? HTTP_HEAD_TOO_LARGE : HTTP_NEED_MORE;
    size_t end = http__content_end(buf, p, (size_t)nl);
    if (end == p) { /* the empty line: the head is whole */
      p = (size_t)nl + 1;
      break;
    }
    const char *s = buf + p;
    size_t n = end - p;
    if (s[0] == ' ' || s[0] == '\t') return HTTP_BAD; /* obsolete folding */
    size_t c = 0;
    while (c < n && http__tchar[(unsigned char)s[c]]) c++;
    if (c == 0 || c >= n || s[c] != ':') return HTTP_BAD;
    size_t v = c + 1, ve = n;
    while (v < ve && (s[v] == ' ' || s[v] == '\t')) v++;
    while (ve > v && (s[ve - 1] == ' ' || s[ve - 1] == '\t')) ve--;
    /* Host's own check (below) refuses control bytes too */
    bool is_host = c == 4 && http__ieq(s, c, "host");
    if (!is_host && !http__text_ok(s + v, ve - v)) return HTTP_BAD;
    if (req->nheaders == HTTP_MAX_HEADERS) return HTTP_HEAD_TOO_LARGE;
    http_header_t *h = &req->headers[req->nheaders++];
    h->name = s;
    h->name_len = (uint32_t)c;
    h->value = s + v;
    h->value_len = (uint32_t)(ve - v);
    /* The fields the framing depends on. */
    if (http__ieq(s, c, "content-length")) {
      int64_t cl = http__length(h->value, h->value_len);
      if (cl < 0 || (req->content_length >= 0 && cl != req->content_length))
        return HTTP_BAD;
      req->content_length = cl;
    } else if (http__ieq(s, c, "transfer-encoding")) {
      if (te || !http__ieq(h->value, h->value_len, "chunked"))
        return HTTP_NOT_IMPLEMENTED;
      te = true;
    } else if (is_host) {
      if (host || !http__host_ok(h->value, h->value_len)) return HTTP_BAD;
      host = true;
    } else if (http__ieq(s, c, "connection")) {
      conn_close |= http_list_has(h->value, h->value_len, "close");
      conn_keep |= http_list_has(h->value, h->value_len, "keep-alive");
      conn_upgrade |= http_list_has(h->value, h->value_len, "upgrade");
    } else if (http__ieq(s, c, "expect")) {
      req->expect_continue = http__ieq(h->value, h->value_len, "100-continue");
    } else if (http__ieq(s, c, "upgrade")) {
      upgrade_field = true;
    }
    p = (size_t)nl + 1;
  }
  if (te && (req->content_length >= 0 || req->minor == 0)) return HTTP_BAD;
  if (req->minor == 1 && !host) return HTTP_BAD;
  /* An absolute-form target's authority is the request's host, whatever
   * the Host field says (RFC 9112 3.2.2): the field's value is replaced
   * by it (pointing into the target). An HTTP/1.0 request without Host
   * keeps none: every pointer stays a field line's or the request line's. */
  const char *auth;
  size_t alen;
  if (host && req->target[0] != '/' &&
      http__absolute(req->target, req->target_len, &auth, &alen)) {
    for (int k = 0; k < req->nheaders; k++)
      if (http__ieq(req->headers[k].name, req->headers[k].name_len, "host")) {
        req->headers[k].value = auth;
        req->headers[k].value_len = (uint32_t)alen;
        break;
      }
  }
  req->chunked = te;
  req->keep_alive = req->minor == 1 ? !conn_close : conn_keep && !conn_close;
  req->upgrade = conn_upgrade && upgrade_field;
  return (int)p;
}

/* ---- chunked ---- */

enum {
  CH_SIZE,      /* hex digits of a chunk size */
  CH_EXT,       /* a chunk extension, skipped to the end of the line */
  CH_SIZE_LF,   /* after the size line's CR */
  CH_DATA,
  CH_DATA_CR,   /* the CRLF after a chunk's data */
  CH_DATA_LF,
  CH_TRAILER,   /* start of a trailer line (or the final empty line) */
  CH_TRAILER_LINE,
  CH_TRAILER_LF,
  CH_END_LF,    /* after the final empty line's CR */
  CH_DONE,
};

#define HTTP_MAX_SIZE_LINE 4096

void http_chunked_init(http_chunked_t *c, size_t max_trailers) {
  memset(c, 0, sizeof(*c));
  c->max_trailers = max_trailers;
}

static int http__hexval(int ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  ch = http__lower(ch);
  if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
  return -1;
}

ssize_t http_chunked_feed(http_chunked_t *c, const char *in, size_t len,
                          void (*data)(const char *p, size_t n, void *arg),
                          void *arg, bool *done) {
  size_t i = 0;
  *done = c->state == CH_DONE;
  while (i < len && c->state != CH_DONE) {
    unsigned char ch = (unsigned char)in[i];
    switch (c->state) {
    case CH_SIZE: {
      int h = http__hexval(ch);
      if (h >= 0) {
        /* every byte of the size line counts, leading zeros too */
        if (++c->line > HTTP_MAX_SIZE_LINE) return HTTP_BAD;
        if (c->left >> 58) return HTTP_BAD; /* over 2^62 */
        c->left = c->left * 16 + (uint64_t)h;
      } else if (c->line == 0) {
        return HTTP_BAD; /* no digits */
      } else if (ch == ';' || ch == ' ' || ch == '\t') {
        c->state = CH_EXT;
      } else if (ch == '\r') {
        c->state = CH_SIZE_LF;
      } else {
        return HTTP_BAD; /* a bare LF too: chunk framing is CRLF only */
      }
      i++;
      break;
    }
    case CH_EXT:
      if (++c->line > HTTP_MAX_SIZE_LINE) return HTTP_BAD;
      if (ch == '\r') c->state = CH_SIZE_LF;
      else if (ch < ' ' && ch != '\t') return HTTP_BAD;
      i++;
      break;
    case CH_SIZE_LF:
      if (ch != '\n') return HTTP_BAD;
      i++;
      c->line = 0;
      c->state = c->left ? CH_DATA : CH_TRAILER;
      break;
    case CH_DATA: {
      size_t n = len - i;
      if ((uint64_t)n > c->left) n = (size_t)c->left;
      if (data) data(in + i, n, arg);
      i += n;
      c->left -= n;
      if (!c->left) c->state = CH_DATA_CR;
      break;
    }
    case CH_DATA_CR:
      if (ch != '\r') return HTTP_BAD;
      c->state = CH_DATA_LF;
      i++;
      break;
    case CH_DATA_LF:
      if (ch != '\n') return HTTP_BAD;
      c->state = CH_SIZE;
      i++;
      break;
    case CH_TRAILER:
      if (ch == '\r') {
        c->state = CH_END_LF;
      } else if (ch == '\n') {
        return HTTP_BAD;
      } else {
        c->state = CH_TRAILER_LINE;
        continue; /* the same byte starts the line */
      }
      i++;
      break;
    case CH_TRAILER_LINE:
      if (++c->trailers > c->max_trailers) return HTTP_BAD;
      if (ch == '\r') c->state = CH_TRAILER_LF;
      else if (ch == '\n') return HTTP_BAD;
      i++;
      break;
    case CH_TRAILER_LF:
      if (ch != '\n') return HTTP_BAD;
      c->state = CH_TRAILER;
      i++;
      break;
    case CH_END_LF:
      if (ch != '\n') return HTTP_BAD;
      c->state = CH_DONE;
      i++;
      break;
    }
  }
  *done = c->state == CH_DONE;
  return (ssize_t)i;
}

/* ---- targets ---- */

void http_target_split(const char *target, size_t len, const char **path,
                       size_t *plen, const char **query, size_t *qlen) {
  const char *t = target;
  size_t tl = len;
  size_t scheme = tl >= 7 && strncasecmp(t, "http://", 7) == 0    ? 7
                  : tl >= 8 && strncasecmp(t, "https://", 8) == 0 ? 8
                                                                   : 0;
  if (scheme) { /* absolute-form: drop the scheme and the authority */
    size_t i = scheme;
    while (i < tl && t[i] != '/' && t[i] != '?') i++;
    t += i;
    tl -= i;
  }
  const char *q = memchr(t, '?', tl);
  size_t pl = q ? (size_t)(q - t) : tl;
  *query = q ? q + 1 : NULL;
  *qlen = q ? tl - pl - 1 : 0;
  if (pl == 0 && scheme) {
    *path = "/";
    *plen = 1;
  } else {
    *path = t;
    *plen = pl;
  }
}

ssize_t http_unescape(const char *s, size_t len, char *out, bool plus_space) {
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    char ch = s[i];
    if (ch == '%') {
      if (i + 2 >= len) return -1;
      int h = http__hexval((unsigned char)s[i + 1]);
      int l = http__hexval((unsigned char)s[i + 2]);
      if (h < 0 || l < 0) return -1;
      out[o++] = (char)(h * 16 + l);
      i += 2;
    } else {
      out[o++] = plus_space && ch == '+' ? ' ' : ch;
    }
  }
  return (ssize_t)o;
}
