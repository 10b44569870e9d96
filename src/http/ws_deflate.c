/* SPDX-License-Identifier: MIT */

/* ws_deflate: permessage-deflate negotiation and message compression;
 * see ws_deflate.h. */
#include "http/ws_deflate.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

void ws_pmd_cfg_init(ws_pmd_cfg_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->want.server_no_ctx = true;
  cfg->want.client_no_ctx = false;
  cfg->want.server_bits = 15;
  cfg->want.client_bits = 15;
  cfg->threshold = 64;
  cfg->level = 1;
}

/* ---- the extension header ---- */

static bool wz__ows(char ch) { return ch == ' ' || ch == '\t'; }

static bool wz__tchar(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static bool wz__is(const char *s, size_t n, const char *w) {
  return strlen(w) == n && strncasecmp(s, w, n) == 0;
}

/* One extension of a list: its name and parameters, as read by
 * wz__next. A parameter's value is -1 when absent, -2 when it is not a
 * number 8..15 (a quoted value is unquoted first, RFC 7692 7.1). */
enum { WZ_SNC, WZ_CNC, WZ_SBITS, WZ_CBITS, WZ_NPARAM };
typedef struct {
  const char *name;
  size_t nlen;
  bool seen[WZ_NPARAM];
  int val[WZ_NPARAM];
  bool bad; /* an unknown or repeated parameter, a bad value */
} wz_ext_t;

static int wz__bits(const char *s, size_t n) {
  if (n >= 2 && s[0] == '"' && s[n - 1] == '"') s++, n -= 2;
  if (n == 1 && s[0] >= '8' && s[0] <= '9') return s[0] - '0';
  if (n == 2 && s[0] == '1' && s[1] >= '0' && s[1] <= '5')
    return 10 + s[1] - '0';
  return -2;
}

/* Reads the extension at *i of v[0..len); false at the end. */
static bool wz__next(const char *v, size_t len, size_t *i, wz_ext_t *e) {
  memset(e, 0, sizeof(*e));
  size_t at = *i;
  while (at < len && (wz__ows(v[at]) || v[at] == ',')) at++;
  if (at >= len) return false;
  size_t n0 = at;
  while (at < len && wz__tchar(v[at])) at++;
  e->name = v + n0;
  e->nlen = at - n0;
  if (!e->nlen) e->bad = true;
  for (;;) {
    while (at < len && wz__ows(v[at])) at++;
    if (at >= len || v[at] != ';') break;
    at++;
    while (at < len && wz__ows(v[at])) at++;
    size_t p0 = at;
    while (at < len && wz__tchar(v[at])) at++;
    size_t pl = at - p0;
    while (at < len && wz__ows(v[at])) at++;
    const char *val = NULL;
    size_t vl = 0;
    if (at < len && v[at] == '=') {
      at++;
      while (at < len && wz__ows(v[at])) at++;
      size_t v0 = at;
      if (at < len && v[at] == '"') {
        at++;
        while (at < len && v[at] != '"') at++;
        if (at >= len) {
          e->bad = true;
          break;
        }
        at++;
      } else {
        while (at < len && wz__tchar(v[at])) at++;
      }
      val = v + v0;
      vl = at - v0;
      if (!vl) e->bad = true;
    }
    int k = wz__is(v + p0, pl, "server_no_context_takeover")   ? WZ_SNC
            : wz__is(v + p0, pl, "client_no_context_takeover") ? WZ_CNC
            : wz__is(v + p0, pl, "server_max_window_bits")     ? WZ_SBITS
            : wz__is(v + p0, pl, "client_max_window_bits")     ? WZ_CBITS
                                                               : -1;
    if (k < 0 || e->seen[k]) {
      e->bad = true;
      continue;
    }
    e->seen[k] = true;
    e->val[k] = val ? wz__bits(val, vl) : -1;
    if ((k == WZ_SNC || k == WZ_CNC) && val) e->bad = true; /* no value */
    if (k == WZ_SBITS && e->val[k] < 0) e->bad = true;      /* one needed */
    if (k == WZ_CBITS && e->val[k] == -2) e->bad = true;
  }
  while (at < len && v[at] != ',') {
    if (!wz__ows(v[at])) e->bad = true; /* junk after the parameters */
    at++;
  }
  *i = at;
  return true;
}

static size_t wz__answer(const ws_pmd_t *p, bool sbits, bool cbits, char *out,
                         size_t cap) {
  int n = snprintf(out, cap, "permessage-deflate%s%s",
                   p->server_no_ctx ? "; server_no_context_takeover" : "",
                   p->client_no_ctx ? "; client_no_context_takeover" : "");
  if (n > 0 && (size_t)n < cap && sbits)
    n += snprintf(out + n, cap - (size_t)n, "; server_max_window_bits=%d",
                  p->server_bits);
  if (n > 0 && (size_t)n < cap && cbits)
    n += snprintf(out + n, cap - (size_t)n, "; client_max_window_bits=%d",
                  p->client_bits);
  return n < 0 ? 0 : (size_t)n;
}

int ws_pmd_accept(const ws_pmd_cfg_t *cfg, const char *v, size_t len,
                  ws_pmd_t *out, char *resp, size_t cap) {
  size_t i = 0;
  wz_ext_t e;
  while (v && wz__next(v, len, &i, &e)) {
    if (e.bad || !wz__is(e.name, e.nlen, "permessage-deflate")) continue;
    ws_pmd_t p;
    p.server_no_ctx = e.seen[WZ_SNC] || cfg->want.server_no_ctx;
    p.client_no_ctx = e.seen[WZ_CNC] || cfg->want.client_no_ctx;
    p.server_bits = cfg->want.server_bits;
    if (e.seen[WZ_SBITS] && e.val[WZ_SBITS] < p.server_bits)
      p.server_bits = e.val[WZ_SBITS];
    if (p.server_bits < 9) continue; /* zlib deflates with 9 at least */
    /* the client's window: ours to limit only if it offered the
     * parameter; its value (if any) is the most it will use */
    p.client_bits = 15;
    bool cbits = false;
    if (e.seen[WZ_CBITS]) {
      p.client_bits = cfg->want.client_bits;
      if (e.val[WZ_CBITS] > 0 && e.val[WZ_CBITS] < p.client_bits)
        p.client_bits = e.val[WZ_CBITS];
      cbits = p.client_bits < 15 || e.val[WZ_CBITS] > 0;
    }
    bool sbits = e.seen[WZ_SBITS] || p.server_bits < 15;
    size_t n = wz__answer(&p, sbits, cbits, resp, cap);
    if (!n || n >= cap) return 0;
    *out = p;
    return 1;
  }
  return 0;
}

size_t ws_pmd_offer(const ws_pmd_cfg_t *cfg, char *out, size_t cap) {
  /* as a client: "server_*" is what we ask of the server, "client_*"
   * what we will do */
  ws_pmd_t p = cfg->want;
  int n = snprintf(out, cap, "permessage-deflate%s%s",
                   p.server_no_ctx ? "; server_no_context_takeover" : "",
                   p.client_no_ctx ? "; client_no_context_takeover" : "");
  if (n > 0 && (size_t)n < cap && p.server_bits < 15)
    n += snprintf(out + n, cap - (size_t)n, "; server_max_window_bits=%d",
                  p.server_bits);
  if (n > 0 && (size_t)n < cap) {
    if (p.client_bits < 15)
      n += snprintf(out + n, cap - (size_t)n, "; client_max_window_bits=%d",
                    p.client_bits);
    else
      n += snprintf(out + n, cap - (size_t)n, "; client_max_window_bits");
  }
  return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

int ws_pmd_agreed(const ws_pmd_cfg_t *cfg, const char *v, size_t len,
                  ws_pmd_t *out) {
  size_t i = 0;
  wz_ext_t e;
  if (!v) return 0;
  if (!wz__next(v, len, &i, &e)) return 0;
  if (e.bad || !wz__is(e.name, e.nlen, "permessage-deflate")) return -1;
  wz_ext_t more;
  if (wz__next(v, len, &i, &more)) return -1; /* only the one we offered */
  ws_pmd_t p;
  p.server_no_ctx = e.seen[WZ_SNC];
  if (cfg->want.server_no_ctx && !p.server_no_ctx) return -1; /* asked for */
  p.client_no_ctx = e.seen[WZ_CNC] || cfg->want.client_no_ctx;
  p.server_bits = e.seen[WZ_SBITS] ? e.val[WZ_SBITS] : 15;
  if (cfg->want.server_bits < 15 &&
      (!e.seen[WZ_SBITS] || p.server_bits > cfg->want.server_bits))
    return -1;
  p.client_bits = cfg->want.client_bits;
  if (e.seen[WZ_CBITS]) {
    if (e.val[WZ_CBITS] < 0) return -1; /* a value is needed in an answer */
    if (e.val[WZ_CBITS] < p.client_bits) p.client_bits = e.val[WZ_CBITS];
  }
  if (p.client_bits < 9) p.client_bits = 9; /* a smaller window is fine */
  *out = p;
  return 1;
}

/* ---- compression ---- */

struct ws_z {
  ws_pmd_t p;
  bool server;
  int level;
  z_stream *def; /* with context takeover: the connection's own */
  z_stream *inf;
};

/* Streams without context, per thread: deflate by window bits and
 * level, inflate by window bits. Made on first use, kept for the
 * thread's life, freed when it ends (a pthread key's destructor).
 * Thread: each thread's set is its own. */
typedef struct {
  z_stream *def[16][10];
  z_stream *inf[16];
} wz_tls_t;
static pthread_key_t wz_key;
static pthread_once_t wz_once = PTHREAD_ONCE_INIT;

static void wz__end(z_stream *z, bool deflating);

static void wz__tls_free(void *p) {
  wz_tls_t *t = p;
  for (int b = 0; b < 16; b++) {
    for (int l = 0; l < 10; l++) wz__end(t->def[b][l], true);
    wz__end(t->inf[b], false);
  }
  free(t);
}

static void wz__key_make(void) { pthread_key_create(&wz_key, wz__tls_free); }

static wz_tls_t *wz__tls(void) {
  pthread_once(&wz_once, wz__key_make);
  wz_tls_t *t = pthread_getspecific(wz_key);
  if (!t && (t = calloc(1, sizeof(*t))) && pthread_setspecific(wz_key, t)) {
    free(t);
    t = NULL;
  }
  return t;
}

static z_stream *wz__deflater(int bits, int level) {
  z_stream *z = calloc(1, sizeof(*z));
  if (!z) return NULL;
  if (deflateInit2(z, level, Z_DEFLATED, -bits, WS_Z_MEMLEVEL,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    free(z);
    return NULL;
  }
  return z;
}

static z_stream *wz__inflater(int bits) {
  z_stream *z = calloc(1, sizeof(*z));
  if (!z) return NULL;
  if (inflateInit2(z, -bits) != Z_OK) {
    free(z);
    return NULL;
  }
  return z;
}

static void wz__end(z_stream *z, bool deflating) {
  if (!z) return;
  if (deflating)
    deflateEnd(z);
  else
    inflateEnd(z);
  free(z);
}

ws_z_t *ws_z_new(const ws_pmd_t *p, bool server, int level) {
  ws_z_t *z = calloc(1, sizeof(*z));
  if (!z) {
    errno = ENOMEM;
    return NULL;
  }
  z->p = *p;
  z->server = server;
  z->level = level < 1 ? 1 : level > 9 ? 9 : level;
  return z;
}

void ws_z_free(ws_z_t *z) {
  if (!z) return;
  wz__end(z->def, true);
  wz__end(z->inf, false);
  free(z);
}

bool ws_z_send_alone(const ws_z_t *z) {
  return z->server ? z->p.server_no_ctx : z->p.client_no_ctx;
}

int ws_z_send_bits(const ws_z_t *z) {
  int b = z->server ? z->p.server_bits : z->p.client_bits;
  return b < 9 ? 9 : b;
}

static int wz__recv_bits(const ws_z_t *z) {
  int b = z->server ? z->p.client_bits : z->p.server_bits;
  return b < 9 ? 9 : b;
}

static bool wz__recv_alone(const ws_z_t *z) {
  return z->server ? z->p.client_no_ctx : z->p.server_no_ctx;
}

/* Deflates p[0..n) with sync flush through d into a new buffer after
 * `room` bytes; the flush's 00 00 ff ff is cut off. */
static char *wz__run_deflate(z_stream *d, const char *p, size_t n, size_t room,
                             size_t *olen) {
  size_t cap = room + deflateBound(d, n) + 16;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  d->next_in = (Bytef *)(uintptr_t)p;
  d->avail_in = (uInt)n;
  size_t at = room;
  for (;;) {
    d->next_out = (Bytef *)buf + at;
    d->avail_out = (uInt)(cap - at);
    int zr = deflate(d, Z_SYNC_FLUSH);
    at = cap - d->avail_out;
    if (zr != Z_OK && zr != Z_BUF_ERROR) {
      free(buf);
      return NULL;
    }
    if (d->avail_out != 0) break; /* all in and flushed */
    char *nb = realloc(buf, cap * 2);
    if (!nb) {
      free(buf);
      return NULL;
    }
    buf = nb;
    cap *= 2;
  }
  size_t out = at - room;
  static const char mark[4] = {0, 0, (char)0xff, (char)0xff};
  if (out >= 4 && memcmp(buf + room + out - 4, mark, 4) == 0) {
    out -= 4;
  } else if (out == 0) {
    /* nothing to flush (an empty message after a flushed one, with
     * context): one 00, which the receiver's 00 00 ff ff turns into an
     * empty stored block (RFC 7692 7.2.3.6) */
    buf[room] = 0;
    out = 1;
  }
  *olen = out;
  return buf;
}

char *ws_z_deflate_alone(int bits, int level, const char *p, size_t n,
                         size_t room, size_t *olen) {
  if (bits < 9 || bits > 15 || level < 1 || level > 9) return NULL;
  wz_tls_t *t = wz__tls();
  if (!t) return NULL;
  z_stream **d = &t->def[bits][level];
  if (!*d && !(*d = wz__deflater(bits, level))) return NULL;
  deflateReset(*d);
  return wz__run_deflate(*d, p, n, room, olen);
}

char *ws_z_deflate(ws_z_t *z, const char *p, size_t n, size_t room,
                   size_t *olen) {
  int bits = ws_z_send_bits(z);
  if (ws_z_send_alone(z))
    return ws_z_deflate_alone(bits, z->level, p, n, room, olen);
  if (!z->def && !(z->def = wz__deflater(bits, z->level))) return NULL;
  return wz__run_deflate(z->def, p, n, room, olen);
}

/* Grows *buf to hold at least `need` bytes, never past limit. */
static int wz__grow(char **buf, size_t *cap, size_t need, size_t limit) {
  if (need <= *cap) return 0;
  size_t nc = *cap ? *cap : 1024;
  while (nc < need) nc *= 2;
  if (nc > limit) nc = limit;
  char *nb = realloc(*buf, nc);
  if (!nb) return -ENOMEM;
  *buf = nb;
  *cap = nc;
  return 0;
}

int ws_z_inflate(ws_z_t *z, const char *p, size_t n, size_t max, char **buf,
                 size_t *cap, size_t *olen) {
  static const unsigned char tail[4] = {0, 0, 0xff, 0xff};
  bool alone = wz__recv_alone(z);
  int bits = wz__recv_bits(z);
  z_stream *inf;
  if (alone) {
    wz_tls_t *t = wz__tls();
    if (!t) return -ENOMEM;
    z_stream **s = &t->inf[bits];
    if (!*s && !(*s = wz__inflater(bits))) return -ENOMEM;
    inf = *s;
    inflateReset(inf);
  } else {
    if (!z->inf && !(z->inf = wz__inflater(bits))) return -ENOMEM;
    inf = z->inf;
  }
  size_t limit = max + 1; /* one byte past max tells it is too big */
  size_t at = 0;
  int rc = 0;
  for (int part = 0; part < 2 && !rc; part++) {
    inf->next_in = part ? (Bytef *)(uintptr_t)tail : (Bytef *)(uintptr_t)p;
    inf->avail_in = part ? 4 : (uInt)n;
    for (;;) {
      if (at == *cap &&
          (rc = wz__grow(buf, cap, at < 1024 ? 1024 : at * 2, limit)))
        break;
      if (at == *cap) { /* at the limit (past max) */
        rc = -1009;
        break;
      }
      inf->next_out = (Bytef *)*buf + at;
      inf->avail_out = (uInt)(*cap - at);
      int zr = inflate(inf, Z_SYNC_FLUSH);
      at = *cap - inf->avail_out;
      if (at > max) {
        rc = -1009;
        break;
      }
      if (zr == Z_STREAM_END) {
        /* a final block: the message ends here; with context the next
         * message starts a fresh stream (its window is gone) */
        inflateReset(inf);
        if (part == 0 && inf->avail_in) rc = -1007; /* bytes after it */
        break;
      }
      if (zr != Z_OK && zr != Z_BUF_ERROR) {
        rc = zr == Z_MEM_ERROR ? -ENOMEM : -1007;
        break;
      }
      /* all input taken and the output had room: flushed */
      if (inf->avail_out != 0 && (inf->avail_in == 0 || zr == Z_BUF_ERROR))
        break;
    }
  }
  if (rc && !alone) inflateReset(inf); /* the connection closes anyway */
  *olen = at;
  return rc;
}
