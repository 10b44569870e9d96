/* SPDX-License-Identifier: MIT */

/* multipart: a streaming parser of multipart/form-data bodies (RFC 7578
 * over RFC 2046's multipart syntax), fed the body in pieces of any size.
 *
 * The caller hands it each piece and gets events back one at a time:
 * a part's header block, pieces of a part's data, a part's end, the
 * body's end. Data events point into the caller's piece (nothing is
 * copied; the delimiter is searched for in place, Boyer-Moore-Horspool)
 * or, for the few bytes at a piece's end that looked like the start of a
 * delimiter and were not, into the parser's copy of the delimiter. A
 * header block is copied into the parser's own buffer (max_header
 * bytes), so it may span pieces. Memory: the parser and max_header
 * bytes, whatever the body's size.
 *
 * Limits: the number of parts, the header bytes of one part and the data
 * bytes of one part; passing one is an error (-413), as is bad syntax
 * (-400). After an error every call returns it again.
 *
 * Pure: no I/O, no Lua; one parser is used by one thread at a time. */
#ifndef MP_HTTP_MULTIPART_H
#define MP_HTTP_MULTIPART_H

#include <stddef.h>
#include <stdint.h>

/* The longest boundary RFC 2046 allows. */
#define MULTIPART_BOUNDARY_MAX 70

typedef struct multipart multipart_t;

typedef struct {
  size_t max_parts;  /* parts of a body */
  size_t max_header; /* bytes of one part's header block */
  uint64_t max_part; /* data bytes of one part */
} multipart_limits_t;

enum {
  MULTIPART_NONE, /* all of the piece was taken: feed the next one */
  MULTIPART_PART, /* a part begins: p, n = its header lines, each ending
                     in CRLF ("" if it has none); valid until the next call */
  MULTIPART_DATA, /* p, n = a piece of the part's data (n > 0) */
  MULTIPART_END,  /* the part's data ended */
  MULTIPART_DONE, /* the closing delimiter: what follows is ignored */
};

typedef struct {
  int type;
  const char *p;
  size_t n;
} multipart_event_t;

/* A parser for bodies delimited by `boundary` (blen bytes, 1 to
 * MULTIPART_BOUNDARY_MAX, RFC 2046 bchars, not ending in a space).
 * NULL with errno EINVAL for a bad boundary or zero limits, ENOMEM. */
multipart_t *multipart_new(const char *boundary, size_t blen,
                           const multipart_limits_t *lim);
void multipart_free(multipart_t *m);

/* Parses from buf (len bytes) up to the next event, fills *ev and
 * returns the bytes of buf it took (0 to len). A result below len means
 * "call again with the rest"; MULTIPART_NONE comes only with all of buf
 * taken. Negative: -400 (bad syntax) or -413 (a limit), see
 * multipart_error. MULTIPART_DONE takes all of buf (the epilogue is
 * ignored), and so does every call after it. */
long multipart_parse(multipart_t *m, const char *buf, size_t len,
                     multipart_event_t *ev);

/* The body ended (no more pieces): 0 if the closing delimiter came,
 * else -400 (a truncated body). */
int multipart_finish(multipart_t *m);

/* What went wrong, for a message ("too many parts", ...); "" if
 * nothing did. */
const char *multipart_error(const multipart_t *m);

/* Parts begun so far. */
size_t multipart_parts(const multipart_t *m);

#endif
