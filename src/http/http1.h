/* SPDX-License-Identifier: MIT */

/* http1: an HTTP/1.x request parser. It reads a request's head (request
 * line and header fields) from a buffer without copying (every string
 * points into the buffer), and decodes chunked bodies incrementally.
 * No allocation, no global state: any thread. */
#ifndef MP_HTTP1_H
#define MP_HTTP1_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Header fields a request may have; more is answered like a head over
 * the size limit (431). */
#define HTTP_MAX_HEADERS 100

/* Results of http_parse_head besides a head length (> 0). The negative
 * ones are the HTTP status to answer with, negated. */
enum {
  HTTP_NEED_MORE = 0,
  HTTP_BAD = -400,             /* malformed */
  HTTP_HEAD_TOO_LARGE = -431,  /* past max_head bytes or HTTP_MAX_HEADERS */
  HTTP_NOT_IMPLEMENTED = -501, /* a transfer coding other than chunked */
  HTTP_BAD_VERSION = -505,     /* not HTTP/1.0 or HTTP/1.1 */
};

typedef struct {
  const char *name, *value; /* value without surrounding blanks */
  uint32_t name_len, value_len;
} http_header_t;

typedef struct {
  const char *method, *target;
  uint32_t method_len, target_len;
  int minor;                 /* HTTP/1.minor */
  int nheaders;
  http_header_t headers[HTTP_MAX_HEADERS];
  int64_t content_length;    /* -1: none given */
  bool chunked;              /* Transfer-Encoding: chunked */
  bool keep_alive;           /* the connection stays open after this one */
  bool expect_continue;      /* Expect: 100-continue */
  bool upgrade;              /* Connection: upgrade with an Upgrade field */
  bool h2;                   /* came over HTTP/2 (http/h2.c fills it) */
} http_request_t;

/* Parses the head at buf[0..len). Returns its length in bytes (request
 * line, fields and the empty line) once it is whole; HTTP_NEED_MORE if it
 * may still be (len < max_head); or a negative status. Empty lines before
 * the request line are skipped (RFC 9112 2.2); lines may end with CRLF or
 * a bare LF. Rejected as 400: a malformed request line or field, obsolete
 * line folding, a space before a field's colon, Content-Length that is not
 * a number or differs between fields, Content-Length together with
 * Transfer-Encoding (request smuggling), a missing Host in HTTP/1.1, a
 * Host that is not uri-host[:port] (port 65535 at most), an absolute-form
 * target that is not http(s) or has userinfo or an empty host. An
 * absolute-form target's authority replaces the Host field's value (which
 * then points into the target): RFC 9112 3.2.2. */
int http_parse_head(const char *buf, size_t len, size_t max_head,
                    http_request_t *req);

/* For a log line about a request that was refused before its head was
 * parsed (408, 413, 431, 505...): if buf[0..len) starts with a whole,
 * well-formed request line (any HTTP/d.d version), its length without the
 * line end, with *start at its first byte; otherwise -1. */
long http_request_line_span(const char *buf, size_t len, size_t *start);

/* Case-insensitive lookup: the first field called `name`, or NULL. */
const http_header_t *http_header(const http_request_t *req,
                                 const char *name);

/* Whether a comma-separated field value lists `token` (case-insensitive),
 * as in "Connection: keep-alive, Upgrade". */
bool http_list_has(const char *value, size_t len, const char *token);

/* ---- chunked bodies ---- */

typedef struct {
  int state;
  uint64_t left;     /* bytes of the current chunk still to come */
  size_t line;       /* bytes of the current size or trailer line so far */
  size_t trailers;   /* bytes of trailer fields so far */
  size_t max_trailers;
} http_chunked_t;

void http_chunked_init(http_chunked_t *c, size_t max_trailers);

/* Decodes in[0..len): body bytes are handed to data(ptr, n, arg) as they
 * come (pointing into `in`). Returns the bytes consumed (all of them,
 * unless the body ended inside `in`: then up to its end, and *done is
 * set), or HTTP_BAD for malformed input (a bad size, a size over 2^62, a
 * chunk not ended by CRLF, a size line over 4 KiB, trailers over
 * max_trailers). Trailer fields are skipped. */
ssize_t http_chunked_feed(http_chunked_t *c, const char *in, size_t len,
                          void (*data)(const char *p, size_t n, void *arg),
                          void *arg, bool *done);

/* ---- targets ---- */

/* Splits a request target into its path and its query (the bytes after
 * the first '?', without it; *query is NULL when there is none). An
 * absolute-form target ("http://host/p?q", the scheme in any case) loses
 * its scheme and authority, which ends at the first '/' or '?' (an empty
 * one included: "http:///p" is "/p"), and gives "/" when it has no path.
 * The one splitter of the server: the app and the static lookup see the
 * same path. Pointers point into `target`. */
void http_target_split(const char *target, size_t len, const char **path,
                       size_t *plen, const char **query, size_t *qlen);

/* Percent-decodes s[0..len) into out (at least len bytes); '+' stays
 * '+' unless plus_space. Returns the decoded length, or -1 for a bad
 * escape. */
ssize_t http_unescape(const char *s, size_t len, char *out, bool plus_space);

#endif
