/* SPDX-License-Identifier: MIT */

/* h2_response: a response over HTTP/2: its head as a HEADERS frame
 * (the application's header lines, connection-specific fields left out),
 * its body from the stream's buffer or its file as nghttp2 asks for it
 * (the stream's window allowing), deferred while the buffer is empty. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "http/h2_int.h"

/* ---- the response ---- */

static ssize_t h2__read(nghttp2_session *s, int32_t id, uint8_t *buf,
                        size_t length, uint32_t *flags,
                        nghttp2_data_source *src, void *ud) {
  h2_stream_t *st = src->ptr;
  (void)s;
  (void)id;
  (void)ud;
  if (st->fd >= 0) {
    size_t want = st->fleft < length ? (size_t)st->fleft : length;
    ssize_t got = pread(st->fd, buf, want, st->foff);
    if (got <= 0) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    st->foff += got;
    st->fleft -= (uint64_t)got;
    if (!st->fleft) {
      close(st->fd);
      st->fd = -1;
      *flags |= NGHTTP2_DATA_FLAG_EOF;
    }
    return got;
  }
  size_t have = st->olen - st->ooff;
  if (!have) {
    if (st->olast) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      return 0;
    }
    st->deferred = true;
    return NGHTTP2_ERR_DEFERRED;
  }
  size_t k = have < length ? have : length;
  st->stalled = false;
  memcpy(buf, st->ob + st->ooff, k);
  st->ooff += k;
  if (st->ooff == st->olen) {
    st->ooff = st->olen = 0;
    if (st->sops && st->ocap > H2_EVENT_KEEP) { /* a burst's room goes */
      free(st->ob);
      st->ob = NULL;
      st->ocap = 0;
    }
    if (st->olast) *flags |= NGHTTP2_DATA_FLAG_EOF;
  }
  return (ssize_t)k;
}

static bool h2__bodiless(int status) {
  return status < 200 || status == 204 || status == 304;
}

/* Whether a response header may not go out over HTTP/2 (RFC 9113
 * 8.2.2: connection-specific fields). */
bool h2__conn_specific(const char *n, size_t l) {
  static const char *const names[] = {"connection", "keep-alive",
                                      "proxy-connection", "transfer-encoding",
                                      "upgrade"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (strlen(names[i]) == l && memcmp(names[i], n, l) == 0) return true;
  return false;
}

#define H2_NV(n, nl, v, vl)                                                    \
  ((nghttp2_nv){(uint8_t *)(n), (uint8_t *)(v), (nl), (vl),                    \
                NGHTTP2_NV_FLAG_NONE})

/* Submits the head of st's response (o: the writer's), with the body to
 * come from h2__read (unless `end`: then the head ends the stream). */
int h2__submit_head(h2_conn_t *h, h2_stream_t *st, http_out_t *o, bool end) {
  const http_head_t *hd = &o->h;
  size_t lines = 0;
  for (size_t i = 0; i < hd->hlen; i++) lines += hd->headers[i] == '\n';
  size_t cap = lines + 5;
  nghttp2_nv stack[64];
  nghttp2_nv *nv = cap <= 64 ? stack : malloc(cap * sizeof(*nv));
  char *low = hd->hlen ? malloc(hd->hlen) : NULL;
  if (!nv || (hd->hlen && !low)) {
    if (nv != stack) free(nv);
    free(low);
    return -ENOMEM;
  }
  char status[20], clen[20];
  size_t sl = (size_t)(http_put_dec(status, (uint64_t)hd->status) - status);
  size_t k = 0;
  nv[k++] = H2_NV(":status", 7, status, sl);
  nv[k++] = H2_NV("date", 4, http_date_now(), 29);
  if (o->len >= 0 && !h2__bodiless(hd->status)) {
    size_t cl = (size_t)(http_put_dec(clen, (uint64_t)o->len) - clen);
    nv[k++] = H2_NV("content-length", 14, clen, cl);
  }
  if (!hd->has_type && o->len != 0 && !h2__bodiless(hd->status))
    nv[k++] = H2_NV("content-type", 12, "text/plain; charset=utf-8", 25);
  const char *p = hd->headers, *e = p ? p + hd->hlen : NULL;
  char *q = low;
  while (p && p < e && k < cap) {
    const char *eol = memchr(p, '\n', (size_t)(e - p));
    if (!eol) break;
    const char *colon = memchr(p, ':', (size_t)(eol - p));
    if (colon) {
      size_t nl = (size_t)(colon - p);
      for (size_t i = 0; i < nl; i++) {
        char ch = p[i];
        q[i] = ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch;
      }
      const char *v = colon + 1, *ve = eol;
      while (v < ve && (*v == ' ' || *v == '\t')) v++;
      if (ve > v && ve[-1] == '\r') ve--;
      if (!h2__conn_specific(q, nl))
        nv[k++] = H2_NV(q, nl, v, (size_t)(ve - v));
      q += nl;
    }
    p = eol + 1;
  }
  nghttp2_data_provider dp = {.source.ptr = st, .read_callback = h2__read};
  int rv = nghttp2_submit_response(h->s, st->id, nv, k, end ? NULL : &dp);
  if (nv != stack) free(nv);
  free(low); /* nghttp2 copied the fields */
  o->head_sent = true;
  st->submitted = true;
  o->h.headers = NULL;
  o->h.hlen = 0;
  return rv ? -EPROTO : 0;
}

/* Appends p[0..n) to the stream's unsent body, which holds at most max
 * bytes: 0, -ENOBUFS or -ENOMEM. */
int h2__obuf_put(h2_stream_t *st, const char *p, size_t n, size_t max) {
  if (!n) return 0;
  if (st->olen - st->ooff + n > max) return -ENOBUFS;
  if (st->olen + n > st->ocap) {
    if (st->ooff) {
      memmove(st->ob, st->ob + st->ooff, st->olen - st->ooff);
      st->olen -= st->ooff;
      st->ooff = 0;
    }
    size_t cap = st->ocap ? st->ocap : H2_OBUF_FIRST;
    while (cap < st->olen + n) cap *= 2;
    if (cap != st->ocap) {
      char *b = h2_spare_realloc(st->h->mem.pool, H2_SPARE_OBUF, st->ob, cap);
      if (!b) return -ENOMEM;
      st->ob = b;
      st->ocap = cap;
    }
  }
  memcpy(st->ob + st->olen, p, n);
  st->olen += n;
  return 0;
}

int h2__out(http_exchange_t *x, const char *p, size_t n, bool last,
            sock_release_fn release, void *ctx, void *ctx2) {
  h2_conn_t *h = x->conn->proto;
  h2_stream_t *st = h->cur;
  int rc = 0;
  if (!st || st->closed) {
    rc = -EPIPE;
    goto out;
  }
  if ((rc = h2__obuf_put(st, p, n, H2_OUT_MAX))) goto out;
  if (last) st->olast = true;
  if (!st->submitted)
    rc = h2__submit_head(h, st, x->out, last && st->olen == 0);
  else if (st->deferred && nghttp2_session_resume_data(h->s, st->id) == 0)
    st->deferred = false;
  /* a whole answer given inside h2__run (a handler that answered at once)
   * goes with the run's own flush, gathered with the answers of the
   * streams it runs next: one write, one TLS record for them all */
  if (!h->in_run || !last) h2__flush(h);
out:
  if (release) release(ctx, ctx2);
  return rc;
}

int h2__out_file(http_exchange_t *x, int fd, off_t off, uint64_t len) {
  h2_conn_t *h = x->conn->proto;
  h2_stream_t *st = h->cur;
  if (!st || st->closed) {
    close(fd);
    return -EPIPE;
  }
  if (st->fd >= 0) close(st->fd);
  st->fd = fd;
  st->foff = off;
  st->fleft = len;
  st->olast = true;
  int rc = h2__submit_head(h, st, x->out, false);
  if (!h->in_run) h2__flush(h); /* (else the run's flush, as in h2__out) */
  return rc;
}
