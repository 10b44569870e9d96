/* SPDX-License-Identifier: MIT */

/* http1_response: the HTTP/1.x response parser (RFC 9110, 9112) of the
 * client side: status line, header fields, the body's framing. The
 * request parser is http1.c; the chunked decoder is shared with it. */
#include "http/http1_response.h"

#include "http/http1.h"
#include "http/http1_lex.h"

#include <string.h>

const http_header_t *http_response_header(const http_response_t *res,
                                          const char *name) {
  size_t n = strlen(name);
  for (int i = 0; i < res->nheaders; i++)
    if (http__ieqn(res->headers[i].name, res->headers[i].name_len, name, n))
      return &res->headers[i];
  return NULL;
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
    if (!http__text_ok(s + 13, n - 13)) return HTTP_RES_BAD;
    res->reason = s + 13;
    res->reason_len = (uint32_t)(n - 13);
  }
  return 0;
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
    bool ch = http__ieq(v + start, end - start, "chunked");
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
    /* the name, four bytes a step while they last (a table look-up and
     * a branch a byte cost ~290 instructions of a proxied request) */
    size_t c = 0;
    const unsigned char *u = (const unsigned char *)s;
    while (c + 4 <= n && (http__tchar[u[c]] & http__tchar[u[c + 1]] &
                          http__tchar[u[c + 2]] & http__tchar[u[c + 3]]))
      c += 4;
    while (c < n && http__tchar[u[c]]) c++;
    if (c == 0 || c >= n || s[c] != ':') return HTTP_RES_BAD;
    size_t v = c + 1, ve = n;
    while (v < ve && (s[v] == ' ' || s[v] == '\t')) v++;
    while (ve > v && (s[ve - 1] == ' ' || s[ve - 1] == '\t')) ve--;
    if (!http__text_ok(s + v, ve - v)) return HTTP_RES_BAD;
    if (res->nheaders == HTTP_RES_MAX_HEADERS) return HTTP_RES_TOO_LARGE;
    http_header_t *h = &res->headers[res->nheaders++];
    h->name = s;
    h->name_len = (uint32_t)c;
    h->value = s + v;
    h->value_len = (uint32_t)(ve - v);
    /* The fields the framing depends on. */
    if (http__ieq(s, c, "content-length")) {
      int64_t cl = http__length(h->value, h->value_len);
      if (cl < 0 || (cl_seen && cl != res->content_length)) return HTTP_RES_BAD;
      res->content_length = cl;
      cl_seen = true;
    } else if (http__ieq(s, c, "transfer-encoding")) {
      te_seen = true;
      res__te_add(&te, h->value, h->value_len);
    } else if (http__ieq(s, c, "connection")) {
      conn_close |= http_list_has(h->value, h->value_len, "close");
      /* keep-alive counts only in HTTP/1.0 (below): a 1.1 answer's
       * "Connection: keep-alive" is not looked through twice */
      if (res->minor == 0)
        conn_keep |= http_list_has(h->value, h->value_len, "keep-alive");
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
