/* SPDX-License-Identifier: MIT */

/* exchange: the words of the protocol (reason phrases, the Date value),
 * the access log and a connection becoming a stream, for both framers
 * and the writer; see exchange.h. */
#include "http/exchange.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "http/access.h"
#include "http/static.h"

/* ---- the response head's words ---- */

static const char *ex__reason(int status) {
  switch (status) {
  case 100: return "Continue";
  case 101: return "Switching Protocols";
  case 200: return "OK";
  case 201: return "Created";
  case 202: return "Accepted";
  case 204: return "No Content";
  case 206: return "Partial Content";
  case 301: return "Moved Permanently";
  case 302: return "Found";
  case 303: return "See Other";
  case 304: return "Not Modified";
  case 307: return "Temporary Redirect";
  case 308: return "Permanent Redirect";
  case 400: return "Bad Request";
  case 401: return "Unauthorized";
  case 403: return "Forbidden";
  case 404: return "Not Found";
  case 405: return "Method Not Allowed";
  case 408: return "Request Timeout";
  case 409: return "Conflict";
  case 413: return "Content Too Large";
  case 415: return "Unsupported Media Type";
  case 416: return "Range Not Satisfiable";
  case 429: return "Too Many Requests";
  case 431: return "Request Header Fields Too Large";
  case 500: return "Internal Server Error";
  case 501: return "Not Implemented";
  case 502: return "Bad Gateway";
  case 503: return "Service Unavailable";
  case 505: return "HTTP Version Not Supported";
  default: return "Status";
  }
}

static const char *ex__date(void) {
  static __thread time_t last;
  static __thread char buf[32];
  time_t now = time(NULL);
  if (now != last) {
    http_static_format_date((int64_t)now, buf);
    last = now;
  }
  return buf;
}

const char *http_reason(int status) { return ex__reason(status); }
const char *http_date_now(void) { return ex__date(); }

/* ---- the access log ---- */

void http_conn_log(http_conn_t *hc, int status, uint64_t bytes) {
  conn_t *c = hc->c;
  http_server_t *srv = hc->srv;
  unsigned cls = (unsigned)status / 100;
  if (cls >= 1 && cls <= 5)
    stats_add(srv->stats, STAT_HTTP_1XX + (int)cls - 1, 1);
  stats_add(srv->stats, hc->framer->stat_reqs, 1);
  stats_add(srv->stats, hc->framer->stat_body, bytes);
  /* one clock read for both (a vDSO call, not free at 10^5 a second) */
  uint64_t took = reactor_now(srv->r) - hc->x.t_start;
  stats_latency(srv->stats, (int)cls, took);
  if (!srv->access_fd || *srv->access_fd < 0) return;
  char ip[128];
  int port;
  if (reactor_conn_peer(c, ip, sizeof(ip), &port)) strcpy(ip, "-");
  const http_request_t *req = hc->state == HTTP_C_HEAD ? NULL : hc->x.req;
  size_t start = 0, rawlen = 0;
  long span;
  if (!req && hc->in &&
      (span = http_request_line_span(hc->in, hc->len, &start)) > 0)
    rawlen = (size_t)span;
  char buf[HTTP_ACCESS_LINE_MAX + HTTP_LOG_ID_MAX + 1];
  size_t n = http_access_line(buf, ip, time(NULL), req, hc->in + start, rawlen,
                              status, bytes, (double)took / 1000.0);
  if (hc->x.log_id_len && req) { /* " id" before the '\n' */
    buf[n - 1] = ' ';
    memcpy(buf + n, hc->x.log_id, hc->x.log_id_len);
    n += hc->x.log_id_len;
    buf[n++] = '\n';
  }
  /* one write(2), so lines of different threads and processes don't mix
   * (O_APPEND) */
  ssize_t w = write(*srv->access_fd, buf, n);
  (void)w; /* a full disk loses log lines, not requests */
}

/* ---- streams ---- */

void http_conn_stream(http_conn_t *hc, const http_stream_ops_t *ops, void *st,
                      const char **rest, size_t *rest_len) {
  conn_t *c = hc->c;
  hc->state = HTTP_C_STREAM;
  hc->stream_ops = ops;
  hc->stream = st;
  reactor_conn_set_timeout(c, hc->srv->idle_ms);
  size_t used = hc->head_len < hc->len ? hc->head_len : hc->len;
  if (rest) *rest = hc->in ? hc->in + used : "";
  if (rest_len) *rest_len = hc->len - used;
}
