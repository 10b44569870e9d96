/* SPDX-License-Identifier: MIT */

/* http1_response: the HTTP/1.x response parser of the client side (the
 * foundation of issue 12's mp.fetch). It reads a response's head (status
 * line and header fields) from the caller's buffer without copying (every
 * string points into that buffer) and decides how the body is framed.
 * Bodies are read by the caller: Content-Length bytes, the chunked decoder
 * of http1.h (http_chunked_feed), or up to the connection's close.
 * No allocation, no global state: any thread. */
#ifndef MP_HTTP1_RESPONSE_H
#define MP_HTTP1_RESPONSE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/http1.h" /* http_header_t, http_chunked_* */

/* Header fields a response may have; more is HTTP_RES_TOO_LARGE. */
#define HTTP_RES_MAX_HEADERS 100

/* Results of http_parse_response besides a head length (> 0), in the
 * picohttpparser convention. */
enum {
  HTTP_RES_BAD = -1,        /* malformed, or framing that can't be trusted */
  HTTP_RES_INCOMPLETE = -2, /* may still be whole with more bytes */
  HTTP_RES_TOO_LARGE = -3,  /* past max_head bytes or HTTP_RES_MAX_HEADERS */
};

/* How the body that follows the head is delimited (RFC 9112 6.3). */
enum http_body {
  HTTP_BODY_NONE,    /* no body: HEAD, 1xx, 204, 304 (any length given
                        describes the resource, not this message) */
  HTTP_BODY_LENGTH,  /* exactly content_length bytes (0 included) */
  HTTP_BODY_CHUNKED, /* Transfer-Encoding: chunked; http_chunked_feed */
  HTTP_BODY_CLOSE,   /* everything until the server closes */
};

typedef struct {
  int minor;                /* HTTP/1.minor */
  int status;               /* 100..999 */
  const char *reason;       /* may be empty */
  uint32_t reason_len;
  int nheaders;
  http_header_t headers[HTTP_RES_MAX_HEADERS];
  enum http_body body;
  int64_t content_length;   /* the field's value, -1: none given */
  /* The connection may carry another request once this body is read:
   * HTTP/1.1 without "Connection: close", HTTP/1.0 with
   * "Connection: keep-alive"; never for HTTP_BODY_CLOSE or a 101. */
  bool keep_alive;
  /* An interim response (1xx except 101): the caller skips it (after the
   * head length) and parses the final one that follows. */
  bool interim;
  bool upgrade;             /* 101 Switching Protocols: the bytes after the
                               head belong to the new protocol */
} http_response_t;

/* Parses the head of a response at buf[0..len) to a request that was HEAD
 * when `head_request` (then there is never a body). Returns its length in
 * bytes (status line, fields and the empty line) once it is whole;
 * HTTP_RES_INCOMPLETE if it may still be (len < max_head); or
 * HTTP_RES_TOO_LARGE / HTTP_RES_BAD. Lines end with CRLF or a bare LF.
 * Rejected as bad: a status line that is not "HTTP/1.0" or "HTTP/1.1",
 * SP, three digits (the first 1-9), then SP and a reason (or nothing); a
 * control byte in the reason or a field value; a malformed field name, a
 * blank before its colon; obsolete line folding (a client must unfold it,
 * which a zero-copy parser can't: refused instead); a Content-Length that
 * is not 1-18 digits or that differs between fields (equal duplicates are
 * accepted, as RFC 9110 8.6 allows); Content-Length together with
 * Transfer-Encoding, and Transfer-Encoding in an HTTP/1.0 response (both
 * faulty framing, RFC 9112 6.1 and 6.3); a coding other than chunked
 * before a final chunked (this client decodes none). A Transfer-Encoding
 * whose final coding is not chunked is close-delimited (RFC 9112 6.3
 * rule 4). On success every field of `res` is set. */
int http_parse_response(const char *buf, size_t len, size_t max_head,
                        bool head_request, http_response_t *res);

/* Case-insensitive lookup: the first field called `name`, or NULL. */
const http_header_t *http_response_header(const http_response_t *res,
                                          const char *name);

#endif
