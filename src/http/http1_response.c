/* http1_response: the HTTP/1.x response parser (RFC 9110, 9112) of the
 * client side: status line, header fields, the body's framing. The
 * request parser is http1.c; the chunked decoder is shared with it. */
#include "http/http1_response.h"

#include <string.h>

/* tchar (RFC 9110 5.6.2): the characters of field names. */
static const unsigned char res_tchar[256] = {
    ['!'] = 1, ['#'] = 1, ['$'] = 1, ['%'] = 1, ['&'] = 1, ['\''] = 1,
    ['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1, ['^'] = 1, ['_'] = 1,
    ['`'] = 1, ['|'] = 1, ['~'] = 1,
    ['0'] = 1, ['1'] = 1, ['2'] = 1, ['3'] = 1, ['4'] = 1, ['5'] = 1,
    ['6'] = 1, ['7'] = 1, ['8'] = 1, ['9'] = 1, ['A'] = 1, ['B'] = 1,
    ['C'] = 1, ['D'] = 1, ['E'] = 1, ['F'] = 1, ['G'] = 1, ['H'] = 1,
    ['I'] = 1, ['J'] = 1, ['K'] = 1, ['L'] = 1, ['M'] = 1, ['N'] = 1,
    ['O'] = 1, ['P'] = 1, ['Q'] = 1, ['R'] = 1, ['S'] = 1, ['T'] = 1,
    ['U'] = 1, ['V'] = 1, ['W'] = 1, ['X'] = 1, ['Y'] = 1, ['Z'] = 1,
    ['a'] = 1, ['b'] = 1, ['c'] = 1, ['d'] = 1, ['e'] = 1, ['f'] = 1,
    ['g'] = 1, ['h'] = 1, ['i'] = 1, ['j'] = 1, ['k'] = 1, ['l'] = 1,
    ['m'] = 1, ['n'] = 1, ['o'] = 1, ['p'] = 1, ['q'] = 1, ['r'] = 1,
    ['s'] = 1, ['t'] = 1, ['u'] = 1, ['v'] = 1, ['w'] = 1, ['x'] = 1,
    ['y'] = 1, ['z'] = 1,
};

static bool res__ieq(const char *a, size_t alen, const char *b) {
  size_t blen = strlen(b);
  if (alen != blen) return false;
  for (size_t i = 0; i < alen; i++) {
    int x = (unsigned char)a[i], y = (unsigned char)b[i];
    if (x >= 'A' && x <= 'Z') x += 32;
    if (y >= 'A' && y <= 'Z') y += 32;
    if (x != y) return false;
  }
  return true;
}

const http_header_t *http_response_header(const http_response_t *res,
                                          const char *name) {
  for (int i = 0; i < res->nheaders; i++)
    if (res__ieq(res->headers[i].name, res->headers[i].name_len, name))
      return &res->headers[i];
  return NULL;
}

/* Control bytes other than HTAB, and DEL, can't be in a reason phrase or
 * a field value (RFC 9110 5.5); obs-text (0x80-0xff) may. */
static bool res__text_ok(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    if ((ch < ' ' && ch != '\t') || ch == 0x7f) return false;
  }
  return true;
}

/* "HTTP/1.x SP ddd [SP reason]". A missing SP after the code (with no
 * reason) is accepted: RFC 9112 4 has the client ignore the reason. */
static int res__status_line(const char *s, size_t n, http_response_t *res) {
  if (n < 12 || memcmp(s, "HTTP/1.", 7) != 0) return HTTP_RES_BAD;
  if (s[7] != '0' && s[7] != '1') return HTTP_RES_BAD;
  if (s[8] != ' ') return HTTP_RES_BAD;
  if (s[9] < '1' || s[9] > '9' || s[10] < '0' || s[10] > '9' ||
      s[11] < '0' || s[11] > '9')
    return HTTP_RES_BAD;
  res->minor = s[7] - '0';
  res->status = (s[9] - '0') * 100 + (s[10] - '0') * 10 + (s[11] - '0');
  res->reason = s + n;
  res->reason_len = 0;
  if (n > 12) {
    if (s[12] != ' ') return HTTP_RES_BAD;
    if (!res__text_ok(s + 13, n - 13)) return HTTP_RES_BAD;
    res->reason = s + 13;
    res->reason_len = (uint32_t)(n - 13);
  }
  return 0;
}

/* Content-Length digits; -1 if malformed or 19 digits and more. */
static int64_t res__length(const char *v, size_t n) {
  if (n == 0 || n > 18) return -1;
  int64_t x = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9') return -1;
    x = x * 10 + (v[i] - '0');
  }
  return x;
}

/* Whether a comma-separated value lists `token` (case-insensitive). */
static bool res__list_has(const char *v, size_t len, const char *token) {
  size_t i = 0;
  while (i < len) {
    while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    size_t start = i;
    while (i < len && v[i] != ',') i++;
    size_t end = i;
    while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t')) end--;
    if (end > start && res__ieq(v + start, end - start, token)) return true;
  }
  return false;
}

/* The transfer codings of every Transfer-Encoding field, in order: how
 * many, how many are chunked, whether the last one seen is. */
typedef struct {
  int n, chunked;
  bool last_chunked;
} res_te_t;

static void res__te_add(res_te_t *te, const char *v, size_t len) {
  size_t i = 0;
  while (i < len) {
    while (i < len && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    size_t start = i;
    while (i < len && v[i] != ',') i++;
    size_t end = i;
    while (end > start && (v[end - 1] == ' ' || v[end - 1] == '\t')) end--;
    if (end == start) continue;
    bool ch = res__ieq(v + start, end - start, "chunked");
    te->n++;
    te->chunked += ch;
    te->last_chunked = ch;
  }
}

int http_parse_response(const char *buf, size_t len, size_t max_head,
                        bool head_request, http_response_t *res) {
  size_t lim = len < max_head ? len : max_head;
  int more = len >= max_head ? HTTP_RES_TOO_LARGE : HTTP_RES_INCOMPLETE;
  const char *nl = memchr(buf, '\n', lim);
  if (!nl) return more;
  size_t e = (size_t)(nl - buf);
  size_t ce = e > 0 && buf[e - 1] == '\r' ? e - 1 : e;
  res->nheaders = 0;
  res->content_length = -1;
  res->keep_alive = res->interim = res->upgrade = false;
  if (res__status_line(buf, ce, res)) return HTTP_RES_BAD;
  size_t p = e + 1;
  bool cl_seen = false, te_seen = false, conn_close = false, conn_keep = false;
  res_te_t te = {0, 0, false};
  for (;;) {
    nl = memchr(buf + p, '\n', lim - p);
    if (!nl) return more;
    e = (size_t)(nl - buf);
    ce = e > p && buf[e - 1] == '\r' ? e - 1 : e;
    if (ce == p) { /* the empty line: the head is whole */
      p = e + 1;
      break;
    }
    const char *s = buf + p;
    size_t n = ce - p;
    if (s[0] == ' ' || s[0] == '\t') return HTTP_RES_BAD; /* obs-fold */
    size_t c = 0;
    while (c < n && res_tchar[(unsigned char)s[c]]) c++;
    if (c == 0 || c >= n || s[c] != ':') return HTTP_RES_BAD;
    size_t v = c + 1, ve = n;
    while (v < ve && (s[v] == ' ' || s[v] == '\t')) v++;
    while (ve > v && (s[ve - 1] == ' ' || s[ve - 1] == '\t')) ve--;
    if (!res__text_ok(s + v, ve - v)) return HTTP_RES_BAD;
    if (res->nheaders == HTTP_RES_MAX_HEADERS) return HTTP_RES_TOO_LARGE;
    http_header_t *h = &res->headers[res->nheaders++];
    h->name = s;
    h->name_len = (uint32_t)c;
    h->value = s + v;
    h->value_len = (uint32_t)(ve - v);
    /* The fields the framing depends on. */
    if (res__ieq(s, c, "content-length")) {
      int64_t cl = res__length(h->value, h->value_len);
      if (cl < 0 || (cl_seen && cl != res->content_length)) return HTTP_RES_BAD;
      res->content_length = cl;
      cl_seen = true;
    } else if (res__ieq(s, c, "transfer-encoding")) {
      te_seen = true;
      res__te_add(&te, h->value, h->value_len);
    } else if (res__ieq(s, c, "connection")) {
      conn_close |= res__list_has(h->value, h->value_len, "close");
      conn_keep |= res__list_has(h->value, h->value_len, "keep-alive");
    }
    p = e + 1;
  }
  /* Framing (RFC 9112 6.3), checked whatever the status: a response with
   * contradictory framing is refused even where it has no body, since the
   * connection can't be trusted to be in step after it. */
  if (te_seen && (cl_seen || res->minor == 0 || te.n == 0)) return HTTP_RES_BAD;
  if (te_seen && te.last_chunked && (te.chunked > 1 || te.n > 1))
    return HTTP_RES_BAD;
  res->keep_alive = res->minor == 1 ? !conn_close : conn_keep && !conn_close;
  int st = res->status;
  if (st == 101) {
    res->upgrade = true;
    res->keep_alive = false;
    res->body = HTTP_BODY_NONE;
  } else if (st < 200) {
    res->interim = true;
    res->body = HTTP_BODY_NONE;
  } else if (head_request || st == 204 || st == 304) {
    res->body = HTTP_BODY_NONE;
  } else if (te_seen) {
    res->body = te.last_chunked ? HTTP_BODY_CHUNKED : HTTP_BODY_CLOSE;
  } else if (cl_seen) {
    res->body = HTTP_BODY_LENGTH;
  } else {
    res->body = HTTP_BODY_CLOSE;
  }
  if (res->body == HTTP_BODY_CLOSE) res->keep_alive = false;
  return (int)p;
}
