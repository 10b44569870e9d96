/* SPDX-License-Identifier: MIT */

/* multipart: the streaming multipart/form-data parser (multipart.h).
 *
 * A body is "--B" (the first delimiter may follow a preamble), then for
 * each part: optional spaces, CRLF, header lines, an empty line, the
 * data, and "\r\nB" again; "--" after a delimiter ends the body. The
 * parser treats the body as if it began with CRLF, so the first
 * delimiter is the same "\r\n--B" as the others.
 *
 * The delimiter search: Boyer-Moore-Horspool over the piece in hand, then
 * a look at its last bytes for a delimiter's beginning. Those bytes are
 * taken (m->match counts them) without being reported as data; if the
 * next piece does not complete the delimiter they are reported from
 * m->delim, which holds the same bytes. A boundary has no CR, so a
 * delimiter can begin only at a CR: when the bytes held back turn out
 * not to be one, none of them can begin another. */
#include "http/multipart.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { ST_PREAMBLE, ST_AFTER, ST_HEADERS, ST_DATA, ST_DONE, ST_ERROR };

/* Spaces allowed between a delimiter and its CRLF (RFC 2046's transport
 * padding; a bound so that it can't run forever). */
#define MP_PADDING_MAX 64

struct multipart {
  multipart_limits_t lim;
  int state;
  int after;     /* ST_AFTER: 0 start, 1 a '-', 2 padding, 3 a CR */
  int term;      /* ST_HEADERS: bytes of "\r\n\r\n" matched */
  int rc;        /* ST_ERROR: the result */
  const char *err;
  size_t match;  /* delimiter bytes taken but not yet decided */
  size_t dlen;
  size_t hlen;   /* header bytes in hbuf */
  size_t nparts;
  size_t padding;
  uint64_t part_size;
  uint8_t skip[256];
  char delim[4 + MULTIPART_BOUNDARY_MAX];
  char hbuf[]; /* lim.max_header bytes */
};

static bool mp__bchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         strchr("'()+_,-./:=? ", c) != NULL;
}

multipart_t *multipart_new(const char *boundary, size_t blen,
                           const multipart_limits_t *lim) {
  if (!boundary || blen == 0 || blen > MULTIPART_BOUNDARY_MAX || !lim ||
      !lim->max_parts || !lim->max_header || !lim->max_part ||
      boundary[blen - 1] == ' ') {
    errno = EINVAL;
    return NULL;
  }
  for (size_t i = 0; i < blen; i++)
    if (!boundary[i] || !mp__bchar((unsigned char)boundary[i])) {
      errno = EINVAL;
      return NULL;
    }
  multipart_t *m = calloc(1, sizeof(*m) + lim->max_header);
  if (!m) return NULL;
  m->lim = *lim;
  memcpy(m->delim, "\r\n--", 4);
  memcpy(m->delim + 4, boundary, blen);
  m->dlen = blen + 4;
  for (int c = 0; c < 256; c++) m->skip[c] = (uint8_t)m->dlen;
  for (size_t i = 0; i + 1 < m->dlen; i++)
    m->skip[(unsigned char)m->delim[i]] = (uint8_t)(m->dlen - 1 - i);
  m->state = ST_PREAMBLE;
  m->match = 2; /* the CRLF the body is taken to begin with */
  m->err = "";
  return m;
}

void multipart_free(multipart_t *m) { free(m); }

const char *multipart_error(const multipart_t *m) { return m->err; }

size_t multipart_parts(const multipart_t *m) { return m->nparts; }

static long mp__fail(multipart_t *m, int rc, const char *err) {
  m->state = ST_ERROR;
  m->rc = rc;
  m->err = err;
  return rc;
}

/* Data p[0..n) was found (in the preamble: dropped); `took` bytes of the
 * input are used. */
static long mp__data_out(multipart_t *m, multipart_event_t *ev, const char *p,
                         size_t n, size_t took) {
  if (m->state == ST_DATA && n) {
    m->part_size += n;
    if (m->part_size > m->lim.max_part) return mp__fail(m, -413, "part too large");
    ev->type = MULTIPART_DATA;
    ev->p = p;
    ev->n = n;
  }
  return (long)took;
}

/* A whole delimiter, its last bytes at the input's start (took). */
static long mp__delim(multipart_t *m, multipart_event_t *ev, size_t took) {
  if (m->state == ST_DATA) ev->type = MULTIPART_END;
  m->state = ST_AFTER;
  m->after = 0;
  m->padding = 0;
  m->match = 0;
  return (long)took;
}

/* The first position of the delimiter in buf[0..len), or -1. */
static long mp__find(const multipart_t *m, const char *buf, size_t len) {
  size_t dl = m->dlen, i = 0;
  const unsigned char *b = (const unsigned char *)buf;
  unsigned char last = (unsigned char)m->delim[dl - 1];
  while (i + dl <= len) {
    unsigned char c = b[i + dl - 1];
    if (c == last && b[i] == '\r' && memcmp(buf + i, m->delim, dl - 1) == 0) return (long)i;
    i += m->skip[c];
  }
  return -1;
}

/* ST_PREAMBLE and ST_DATA: up to the next delimiter. */
static long mp__scan(multipart_t *m, const char *buf, size_t len, multipart_event_t *ev) {
  const char *d = m->delim;
  size_t dl = m->dlen;
  if (m->match) {
    size_t k = 0;
    while (k < len && m->match + k < dl && buf[k] == d[m->match + k]) k++;
    if (m->match + k == dl) return mp__delim(m, ev, k);
    if (k == len) {
      m->match += k;
      return (long)len;
    }
    /* not a delimiter: what was held back is data (a copy of it is d) */
    size_t n = m->match + k;
    m->match = 0;
    return mp__data_out(m, ev, d, n, k);
  }
  long at = mp__find(m, buf, len);
  if (at > 0) return mp__data_out(m, ev, buf, (size_t)at, (size_t)at);
  if (at == 0) return mp__delim(m, ev, dl);
  /* the longest end of buf that begins a delimiter is held back */
  size_t from = len >= dl ? len - dl + 1 : 0;
  const char *cr = memchr(buf + from, '\r', len - from);
  while (cr && memcmp(cr, d, len - (size_t)(cr - buf)) != 0)
    cr = memchr(cr + 1, '\r', len - (size_t)(cr + 1 - buf));
  size_t keep = cr ? len - (size_t)(cr - buf) : 0;
  m->match = keep;
  return mp__data_out(m, ev, buf, len - keep, len);
}

/* ST_AFTER: "--" (the end) or padding and CRLF (a part). */
static long mp__after(multipart_t *m, const char *buf, size_t len, multipart_event_t *ev) {
  for (size_t i = 0; i < len; i++) {
    char c = buf[i];
    switch (m->after) {
    case 0:
      if (c == '-') {
        m->after = 1;
        continue;
      }
      /* fall through */
    case 2:
      if (c == ' ' || c == '\t') {
        m->after = 2;
        if (++m->padding > MP_PADDING_MAX) return mp__fail(m, -400, "bad delimiter line");
        continue;
      }
      if (c == '\r') {
        m->after = 3;
        continue;
      }
      return mp__fail(m, -400, "bad delimiter line");
    case 1:
      if (c != '-') return mp__fail(m, -400, "bad delimiter line");
      m->state = ST_DONE; /* the epilogue is ignored: all of it is taken */
      ev->type = MULTIPART_DONE;
      return (long)len;
    default: /* 3 */
      if (c != '\n') return mp__fail(m, -400, "bad delimiter line");
      if (m->nparts == m->lim.max_parts) return mp__fail(m, -413, "too many parts");
      m->nparts++;
      m->state = ST_HEADERS;
      m->hlen = 0;
      m->term = 2; /* the delimiter line's CRLF: an empty line ends the block */
      return (long)i + 1;
    }
  }
  return (long)len;
}

/* ST_HEADERS: copies the block up to its empty line. */
static long mp__headers(multipart_t *m, const char *buf, size_t len, multipart_event_t *ev) {
  static const char end[] = "\r\n\r\n";
  for (size_t i = 0; i < len; i++) {
    char c = buf[i];
    if (m->hlen >= m->lim.max_header) return mp__fail(m, -413, "part header too large");
    if (c == 0) return mp__fail(m, -400, "bad part header");
    m->hbuf[m->hlen++] = c;
    if (c == end[m->term])
      m->term++;
    else
      m->term = c == '\r' ? 1 : 0;
    if (m->term == 4) {
      m->state = ST_DATA;
      m->part_size = 0;
      m->match = 0;
      ev->type = MULTIPART_PART;
      ev->p = m->hbuf;
      ev->n = m->hlen - 2;
      return (long)i + 1;
    }
  }
  return (long)len;
}

long multipart_parse(multipart_t *m, const char *buf, size_t len,
                     multipart_event_t *ev) {
  ev->type = MULTIPART_NONE;
  ev->p = NULL;
  ev->n = 0;
  size_t off = 0;
  while (off < len || m->state == ST_ERROR) {
    long n;
    switch (m->state) {
    case ST_PREAMBLE:
    case ST_DATA: n = mp__scan(m, buf + off, len - off, ev); break;
    case ST_AFTER: n = mp__after(m, buf + off, len - off, ev); break;
    case ST_HEADERS: n = mp__headers(m, buf + off, len - off, ev); break;
    case ST_DONE:
      ev->type = MULTIPART_DONE;
      return (long)len;
    default: return m->rc;
    }
    if (n < 0) return n;
    off += (size_t)n;
    if (ev->type != MULTIPART_NONE) return (long)off;
  }
  if (m->state == ST_DONE) ev->type = MULTIPART_DONE;
  return (long)off;
}

int multipart_finish(multipart_t *m) {
  if (m->state == ST_DONE) return 0;
  if (m->state == ST_ERROR) return m->rc;
  return (int)mp__fail(m, -400, "the body ended inside the multipart data");
}
