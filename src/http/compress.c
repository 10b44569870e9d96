/* SPDX-License-Identifier: MIT */

/* compress: gzip and brotli response compression as a body filter, and
 * the gzip stream of SSE; see compress.h. */
#include "http/compress.h"

#include <brotli/encode.h>
#include <errno.h>
#include <libdeflate.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/stats.h"
#include "http/server.h"

/* ---- Accept-Encoding ---- */

static bool cz__ows(char ch) { return ch == ' ' || ch == '\t'; }

static bool cz__tchar(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
         (ch >= '0' && ch <= '9') || (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

static bool cz__is(const char *s, size_t n, const char *w) {
  return strlen(w) == n && strncasecmp(s, w, n) == 0;
}

/* A qvalue (RFC 9110 12.4.2) in thousandths; -1 when malformed. */
static int cz__qvalue(const char *s, size_t n) {
  if (n == 0 || (s[0] != '0' && s[0] != '1')) return -1;
  int v = (s[0] - '0') * 1000;
  if (n == 1) return v;
  if (s[1] != '.' || n > 5) return -1;
  int scale = 100;
  for (size_t i = 2; i < n; i++, scale /= 10) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v += (s[i] - '0') * scale;
  }
  return v > 1000 ? -1 : v;
}

/* http_coding_pick, with gzip first at equal q when gzip_first. */
static int cz__pick(const char *value, size_t len, unsigned allow,
                    bool gzip_first);

int http_coding_pick(const char *value, size_t len, unsigned allow) {
  return cz__pick(value, len, allow, false);
}

static int cz__pick(const char *value, size_t len, unsigned allow,
                    bool gzip_first) {
  if (!value) return HTTP_CODING_IDENTITY;
  /* q of gzip, br, identity and "*": -1 not listed */
  int q[4] = {-1, -1, -1, -1};
  size_t i = 0;
  while (i < len) {
    while (i < len && (cz__ows(value[i]) || value[i] == ',')) i++;
    if (i == len) break;
    size_t t0 = i;
    while (i < len && cz__tchar(value[i])) i++;
    size_t tl = i - t0;
    int eq = 1000;
    for (;;) { /* parameters: ;name=value, a token or a quoted string */
      while (i < len && cz__ows(value[i])) i++;
      if (i == len || value[i] != ';') break;
      i++;
      while (i < len && cz__ows(value[i])) i++;
      size_t n0 = i;
      while (i < len && cz__tchar(value[i])) i++;
      size_t nl = i - n0;
      while (i < len && cz__ows(value[i])) i++;
      if (i == len || value[i] != '=') {
        eq = 0;
        break;
      }
      i++;
      while (i < len && cz__ows(value[i])) i++;
      size_t v0 = i;
      if (i < len && value[i] == '"') {
        i++;
        while (i < len && value[i] != '"') i += value[i] == '\\' ? 2 : 1;
        if (i >= len) {
          i = len;
          eq = 0;
          break;
        }
        i++;
      } else {
        while (i < len && cz__tchar(value[i])) i++;
      }
      if (cz__is(value + n0, nl, "q")) {
        int v = cz__qvalue(value + v0, i - v0);
        eq = v < 0 ? 0 : v; /* malformed: refused */
      }
    }
    while (i < len && cz__ows(value[i])) i++;
    if (i < len && value[i] != ',') eq = 0; /* junk after the element */
    int k = -1;
    if (cz__is(value + t0, tl, "gzip") || cz__is(value + t0, tl, "x-gzip"))
      k = 0;
    else if (cz__is(value + t0, tl, "br"))
      k = 1;
    else if (cz__is(value + t0, tl, "identity"))
      k = 2;
    else if (tl == 1 && value[t0] == '*')
      k = 3;
    if (k >= 0 && eq > q[k]) q[k] = eq;
    while (i < len && value[i] != ',') i++;
  }
  int gz = q[0] >= 0 ? q[0] : q[3] >= 0 ? q[3] : 0;
  int br = q[1] >= 0 ? q[1] : q[3] >= 0 ? q[3] : 0;
  if (!(allow & (1u << HTTP_CODING_GZIP))) gz = 0;
  if (!(allow & (1u << HTTP_CODING_BR))) br = 0;
  bool take_br = gzip_first ? br > gz : br >= gz;
  int best = take_br ? HTTP_CODING_BR : HTTP_CODING_GZIP;
  int bq = take_br ? br : gz;
  if (bq <= 0) return HTTP_CODING_IDENTITY;
  /* identity unlisted is the last choice; listed, it competes */
  if (q[2] > bq) return HTTP_CODING_IDENTITY;
  return best;
}

/* ---- settings ---- */

const char *const http_compress_default_types[] = {
    "text/*",
    "application/json",
    "application/javascript",
    "application/x-javascript",
    "application/xml",
    "application/xhtml+xml",
    "application/rss+xml",
    "application/atom+xml",
    "application/ld+json",
    "application/manifest+json",
    "application/problem+json",
    "application/geo+json",
    "application/wasm",
    "application/x-ndjson",
    "image/svg+xml",
    "image/x-icon",
    "font/ttf",
    "font/otf",
    NULL,
};

void http_compress_cfg_init(http_compress_cfg_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  cfg->level = 5;
  cfg->brotli = true;
  cfg->min_size = 1024;
  cfg->file_max = 8u << 20;
  cfg->cache = 4u << 20;
  for (int i = 0; http_compress_default_types[i]; i++) {
    strcpy(cfg->types[i], http_compress_default_types[i]);
    cfg->ntypes = i + 1;
  }
}

bool http_compress_type_ok(const http_compress_cfg_t *cfg, const char *type,
                           size_t len) {
  size_t n = 0;
  while (n < len && type[n] != ';' && !cz__ows(type[n])) n++;
  for (int i = 0; i < cfg->ntypes; i++) {
    const char *t = cfg->types[i];
    size_t tl = strlen(t);
    if (tl >= 2 && t[tl - 1] == '*' && t[tl - 2] == '/') {
      if (n > tl - 1 && strncasecmp(type, t, tl - 1) == 0) return true;
    } else if (tl == n && strncasecmp(type, t, n) == 0) {
      return true;
    }
  }
  return false;
}

/* ---- a compressed stream: gzip (zlib) or br (libbrotli) ---- */

struct http_gz {
  z_stream z;
  BrotliEncoderState *br; /* a br stream's, else NULL (gzip) */
  size_t in, out;         /* a br stream's counts */
};

http_gz_t *http_gz_new(int coding, int level) {
  http_gz_t *g = calloc(1, sizeof(*g));
  if (!g) return NULL;
  if (coding == HTTP_CODING_BR) {
    g->br = BrotliEncoderCreateInstance(NULL, NULL, NULL);
    if (!g->br ||
        !BrotliEncoderSetParameter(g->br, BROTLI_PARAM_QUALITY,
                                   HTTP_BR_STREAM_QUALITY) ||
        !BrotliEncoderSetParameter(g->br, BROTLI_PARAM_LGWIN,
                                   HTTP_BR_STREAM_LGWIN) ||
        !BrotliEncoderSetParameter(g->br, BROTLI_PARAM_MODE,
                                   BROTLI_MODE_TEXT)) {
      if (g->br) BrotliEncoderDestroyInstance(g->br);
      free(g);
      errno = ENOMEM;
      return NULL;
    }
    return g;
  }
  /* 16 + wbits: a gzip header and trailer around the deflate data */
  if (deflateInit2(&g->z, level, Z_DEFLATED, 16 + HTTP_GZ_WBITS,
                   HTTP_GZ_MEMLEVEL, Z_DEFAULT_STRATEGY) != Z_OK) {
    free(g);
    errno = ENOMEM;
    return NULL;
  }
  return g;
}

static int cz__br_push(http_gz_t *g, const char *p, size_t n, bool last,
                       int (*out)(void *ctx, const char *p, size_t n),
                       void *ctx) {
  uint8_t buf[16384];
  const uint8_t *next_in = (const uint8_t *)p;
  size_t avail_in = n;
  BrotliEncoderOperation op =
      last ? BROTLI_OPERATION_FINISH : BROTLI_OPERATION_FLUSH;
  g->in += n;
  for (;;) {
    uint8_t *next_out = buf;
    size_t avail_out = sizeof(buf);
    if (!BrotliEncoderCompressStream(g->br, op, &avail_in, &next_in, &avail_out,
                                     &next_out, NULL))
      return -EIO;
    size_t got = sizeof(buf) - avail_out;
    if (got) {
      g->out += got;
      int rc = out(ctx, (const char *)buf, got);
      if (rc) return rc;
    }
    /* done when the input is taken and nothing is held back: flushed, or
     * the stream ended */
    if (avail_in == 0 && !BrotliEncoderHasMoreOutput(g->br) &&
        (!last || BrotliEncoderIsFinished(g->br)))
      break;
  }
  return 0;
}

int http_gz_push(http_gz_t *g, const char *p, size_t n, bool last,
                 int (*out)(void *ctx, const char *p, size_t n), void *ctx) {
  if (g->br) return cz__br_push(g, p ? p : "", n, last, out, ctx);
  unsigned char buf[16384];
  g->z.next_in = (unsigned char *)(uintptr_t)p;
  g->z.avail_in = (uInt)n;
  int flush = last ? Z_FINISH : Z_SYNC_FLUSH;
  for (;;) {
    g->z.next_out = buf;
    g->z.avail_out = sizeof(buf);
    int zr = deflate(&g->z, flush);
    if (zr == Z_STREAM_ERROR) return -EIO;
    size_t got = sizeof(buf) - g->z.avail_out;
    if (got) {
      int rc = out(ctx, (const char *)buf, got);
      if (rc) return rc;
    }
    /* done when deflate had room to spare (all input taken and flushed),
     * or the stream ended */
    if (zr == Z_STREAM_END || (g->z.avail_out != 0 && !last)) break;
    if (zr == Z_BUF_ERROR && g->z.avail_out != 0) break;
  }
  return 0;
}

void http_gz_counts(const http_gz_t *g, size_t *in, size_t *out) {
  *in = g->br ? g->in : g->z.total_in;
  *out = g->br ? g->out : g->z.total_out;
}

void http_gz_free(http_gz_t *g) {
  if (!g) return;
  if (g->br)
    BrotliEncoderDestroyInstance(g->br);
  else
    deflateEnd(&g->z);
  free(g);
}

/* ---- one-shot compressors ---- */

/* libdeflate's compressors by level, made on first use and kept for the
 * thread's life (each holds its tables: a few hundred KiB at level 5),
 * freed when the thread ends (a lane retired by a reload). Thread: each
 * thread's set is its own (a pthread key). */
/* A file's compressed bytes in a thread's cache: one entry per file
 * (device, inode), coding and level, for one version of the file (size,
 * mtime, ctime): a lookup that finds another version drops it. */
typedef struct zc_ent {
  struct zc_ent *hnext;       /* its bucket's chain */
  struct zc_ent *prev, *next; /* the LRU list, newest first */
  uint64_t dev, ino, size;
  int64_t mtime, ctime; /* nanoseconds */
  int coding, level;
  size_t len;
  char data[];
} zc_ent_t;

#define ZC_BUCKETS 1024
/* what an entry costs beyond its bytes, counted against cfg->cache */
#define ZC_OVERHEAD (sizeof(zc_ent_t) + 16)

typedef struct {
  struct libdeflate_compressor *c[13];
  zc_ent_t **zb; /* ZC_BUCKETS chains, made on first use */
  zc_ent_t *newest, *oldest;
  size_t zbytes; /* entries' len + ZC_OVERHEAD */
  size_t zcount;
  char *zspare; /* the last answer not kept (too large), until the next */
} cz_tls_t;

static void zc__unlink(cz_tls_t *t, zc_ent_t *e);
static pthread_key_t cz_key;
static pthread_once_t cz_once = PTHREAD_ONCE_INIT;

static void cz__tls_free(void *p) {
  cz_tls_t *t = p;
  for (int i = 0; i < 13; i++)
    if (t->c[i]) libdeflate_free_compressor(t->c[i]);
  while (t->oldest) zc__unlink(t, t->oldest);
  free(t->zb);
  free(t->zspare);
  free(t);
}

static void cz__key_make(void) { pthread_key_create(&cz_key, cz__tls_free); }

static cz_tls_t *cz__tls(void) {
  pthread_once(&cz_once, cz__key_make);
  cz_tls_t *t = pthread_getspecific(cz_key);
  if (!t && (t = calloc(1, sizeof(*t))) && pthread_setspecific(cz_key, t)) {
    free(t);
    t = NULL;
  }
  return t;
}

/* The gzip of in[0..n) in a new buffer (*out_len bytes), or NULL. */
static char *cz__gzip_whole(int level, const char *in, size_t n,
                            size_t *out_len) {
  cz_tls_t *t = cz__tls();
  if (!t) return NULL;
  struct libdeflate_compressor **c = &t->c[level];
  if (!*c) *c = libdeflate_alloc_compressor(level);
  if (!*c) return NULL;
  size_t cap = libdeflate_gzip_compress_bound(*c, n);
  char *buf = malloc(cap);
  if (!buf) return NULL;
  *out_len = libdeflate_gzip_compress(*c, in, n, buf, cap);
  if (!*out_len) {
    free(buf);
    return NULL;
  }
  return buf;
}

static int cz_head(const http_filter_t *f, http_exchange_t *x, http_head_t *h,
                   long long *len, void **state);

static char *cz__br_whole(int level, const char *in, size_t n,
                          size_t *out_len) {
  int q = level > 11 ? 11 : level;
  /* a window no larger than the body: less memory for small bodies */
  int lgwin = BROTLI_MIN_WINDOW_BITS;
  while (lgwin < 22 && ((size_t)1 << lgwin) < n) lgwin++;
  size_t cap = BrotliEncoderMaxCompressedSize(n);
  if (!cap) return NULL;
  char *buf = malloc(cap);
  if (!buf) return NULL;
  *out_len = cap;
  if (!BrotliEncoderCompress(q, lgwin, BROTLI_MODE_TEXT, n, (const uint8_t *)in,
                             out_len, (uint8_t *)buf)) {
    free(buf);
    return NULL;
  }
  return buf;
}

char *http_compress_whole(int coding, int level, const char *in, size_t n,
                          size_t *out_len) {
  return coding == HTTP_CODING_BR ? cz__br_whole(level, in, n, out_len)
                                  : cz__gzip_whole(level, in, n, out_len);
}

/* ---- compressed files, cached per thread ---- */

static size_t zc__bucket(uint64_t dev, uint64_t ino, int coding, int level) {
  uint64_t h = (dev * 0x9E3779B97F4A7C15u) ^ ino;
  h ^= (uint64_t)(coding * 16 + level) << 56;
  h *= 0xFF51AFD7ED558CCDu;
  return (size_t)(h >> 54) % ZC_BUCKETS;
}

/* Takes e out of the cache and frees it. */
static void zc__unlink(cz_tls_t *t, zc_ent_t *e) {
  zc_ent_t **pp = &t->zb[zc__bucket(e->dev, e->ino, e->coding, e->level)];
  while (*pp != e) pp = &(*pp)->hnext;
  *pp = e->hnext;
  if (e->prev)
    e->prev->next = e->next;
  else
    t->newest = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    t->oldest = e->prev;
  t->zbytes -= e->len + ZC_OVERHEAD;
  t->zcount--;
  free(e);
}

static void zc__front(cz_tls_t *t, zc_ent_t *e) {
  e->prev = NULL;
  e->next = t->newest;
  if (t->newest) t->newest->prev = e;
  t->newest = e;
  if (!t->oldest) t->oldest = e;
}

static int64_t zc__ns(struct timespec ts) {
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

const char *http_zcache_file(const http_compress_cfg_t *cfg, int fd,
                             const struct stat *st, int coding, size_t *len,
                             stats_slot_t *stats) {
  cz_tls_t *t = cz__tls();
  if (!t) return NULL;
  free(t->zspare);
  t->zspare = NULL;
  if (!t->zb && !(t->zb = calloc(ZC_BUCKETS, sizeof(*t->zb)))) return NULL;
  uint64_t dev = (uint64_t)st->st_dev, ino = (uint64_t)st->st_ino;
  uint64_t size = (uint64_t)st->st_size;
  int64_t mt = zc__ns(st->st_mtim), ct = zc__ns(st->st_ctim);
  int level = cfg->level;
  zc_ent_t *e = t->zb[zc__bucket(dev, ino, coding, level)];
  while (e && !(e->dev == dev && e->ino == ino && e->coding == coding &&
                e->level == level))
    e = e->hnext;
  if (e && e->size == size && e->mtime == mt && e->ctime == ct) {
    if (t->newest != e) { /* the most recently used goes first */
      e->prev->next = e->next;
      if (e->next)
        e->next->prev = e->prev;
      else
        t->oldest = e->prev;
      zc__front(t, e);
    }
    if (stats) stats_add(stats, STAT_HTTP_COMP_CACHED, 1);
    *len = e->len;
    return e->data;
  }
  if (e) zc__unlink(t, e); /* the file changed: that version is gone */
  if (size > HTTP_FILE_WHOLE) {
    errno = EFBIG;
    return NULL;
  }
  char *in = malloc(size ? (size_t)size : 1);
  if (!in) return NULL;
  ssize_t got = pread(fd, in, (size_t)size, 0);
  if (got != (ssize_t)size) {
    free(in);
    errno = got < 0 ? errno : EIO;
    return NULL;
  }
  size_t olen = 0;
  char *out = http_compress_whole(coding, level, in, (size_t)size, &olen);
  free(in);
  if (!out) {
    errno = ENOMEM;
    return NULL;
  }
  if (stats) {
    stats_add(stats, STAT_HTTP_COMP_IN, size);
    stats_add(stats, STAT_HTTP_COMP_OUT, olen);
  }
  *len = olen;
  size_t cost = olen + ZC_OVERHEAD;
  if (cost > cfg->cache || !(e = malloc(sizeof(*e) + olen))) {
    t->zspare = out; /* sent once, then freed */
    return out;
  }
  while (t->oldest && t->zbytes + cost > cfg->cache) zc__unlink(t, t->oldest);
  e->dev = dev;
  e->ino = ino;
  e->size = size;
  e->mtime = mt;
  e->ctime = ct;
  e->coding = coding;
  e->level = level;
  e->len = olen;
  memcpy(e->data, out, olen);
  free(out);
  zc_ent_t **b = &t->zb[zc__bucket(dev, ino, coding, level)];
  e->hnext = *b;
  *b = e;
  zc__front(t, e);
  t->zbytes += cost;
  t->zcount++;
  return e->data;
}

const http_compress_cfg_t *http_compress_cfg_of(const http_server_t *srv) {
  for (int i = 0; i < srv->nfilters; i++)
    if (srv->filters[i]->head == cz_head) return srv->filters[i]->cfg;
  return NULL;
}

/* ---- the filter ---- */

typedef struct {
  const http_compress_cfg_t *cfg;
  int coding;
  bool whole;    /* the length was known: one shot if it comes whole */
  bool started;  /* a piece went through (the stream is in use) */
  http_gz_t *gz; /* a streamed body's */
  stats_slot_t *stats;
  size_t in_bytes, out_bytes;
} cz_state_t;

/* Sets Vary to name Accept-Encoding (added to what it names). */
static int cz__vary(http_exchange_t *x, http_head_t *h) {
  size_t vl;
  const char *v = http_res_header_get(h, "vary", &vl);
  if (!v) return http_res_header_set(x, h, "Vary", "Accept-Encoding");
  for (size_t i = 0; i + 15 <= vl; i++)
    if (strncasecmp(v + i, "accept-encoding", 15) == 0) return 0;
  if (vl == 1 && v[0] == '*') return 0;
  char buf[512];
  if (vl + 18 > sizeof(buf)) return 0; /* a Vary that long: left alone */
  memcpy(buf, v, vl);
  memcpy(buf + vl, ", Accept-Encoding", 18);
  return http_res_header_set(x, h, "Vary", buf);
}

/* A strong ETag becomes weak: the compressed bytes are not the
 * original's, and a range of them means nothing. */
static int cz__etag(http_exchange_t *x, http_head_t *h) {
  size_t el;
  const char *e = http_res_header_get(h, "etag", &el);
  if (!e || el < 2 || e[0] != '"' || el > 250) return 0;
  char buf[256];
  buf[0] = 'W';
  buf[1] = '/';
  memcpy(buf + 2, e, el);
  buf[el + 2] = 0;
  return http_res_header_set(x, h, "ETag", buf);
}

static int cz_head(const http_filter_t *f, http_exchange_t *x, http_head_t *h,
                   long long *len, void **state) {
  const http_compress_cfg_t *cfg = f->cfg;
  if (h->no_compress) return 0;
  if (h->status < 200 || h->status == 204 || h->status == 304 ||
      h->status == 206)
    return 0;
  size_t vl;
  if (http_res_header_get(h, "content-encoding", &vl)) return 0;
  const char *type = http_res_header_get(h, "content-type", &vl);
  if (!type) { /* the writer's default, when there is a body */
    type = "text/plain";
    vl = 10;
  }
  if (!http_compress_type_ok(cfg, type, vl)) return 0;
  const http_request_t *r = x->req;
  /* considered: the answer varies with Accept-Encoding from here on */
  int rc = cz__vary(x, h);
  if (rc) return rc;
  /* HEAD goes on: its head says what a GET's would (the encoding, and the
   * compressed length of a whole body) */
  if (!r || http_header(r, "range")) return 0;
  if (*len >= 0 && (size_t)*len < cfg->min_size) return 0;
  if (*len >= 0 && x->out->file && (size_t)*len > cfg->file_max) return 0;
  const http_header_t *ae = http_header(r, "accept-encoding");
  unsigned allow = 1u << HTTP_CODING_GZIP;
  if (cfg->brotli) allow |= 1u << HTTP_CODING_BR;
  /* a body that comes whole: br first at equal q; a stream: gzip first
   * (a br stream holds far more memory for about the same bytes, see
   * compress.h) */
  bool whole =
      *len >= 0 && (!x->out->file || (uint64_t)*len <= HTTP_FILE_WHOLE);
  int coding =
      cz__pick(ae ? ae->value : NULL, ae ? ae->value_len : 0, allow, !whole);
  if (coding == HTTP_CODING_IDENTITY) return 0;
  cz_state_t *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  s->cfg = cfg;
  s->coding = coding;
  s->whole = *len >= 0;
  s->stats = x->conn->srv->stats;
  if ((rc = http_res_header_set(x, h, "Content-Encoding",
                                coding == HTTP_CODING_BR ? "br" : "gzip")) ||
      (rc = cz__etag(x, h)) ||
      (rc = http_res_header_set(x, h, "Accept-Ranges", NULL))) {
    free(s);
    return rc;
  }
  *len = s->whole ? HTTP_LEN_LATER : -1;
  *state = s;
  return 1;
}

typedef struct {
  http_exchange_t *x;
  int at;
  cz_state_t *s;
} cz_pass_t;

static int cz__out(void *ctx, const char *p, size_t n) {
  cz_pass_t *ps = ctx;
  ps->s->out_bytes += n;
  return http_filter_pass(ps->x, ps->at, p, n, false);
}

static void cz__count(cz_state_t *s) {
  if (!s->stats) return;
  stats_add(s->stats, STAT_HTTP_COMP_IN, s->in_bytes);
  stats_add(s->stats, STAT_HTTP_COMP_OUT, s->out_bytes);
  s->in_bytes = s->out_bytes = 0;
}

static int cz_body(void *state, http_exchange_t *x, int at, const char *p,
                   size_t n, bool last) {
  cz_state_t *s = state;
  s->in_bytes += n;
  if (!s->started && last && s->whole) { /* the whole body in one piece */
    s->started = true;
    size_t olen = 0;
    char *buf = s->coding == HTTP_CODING_BR
                    ? cz__br_whole(s->cfg->level, p ? p : "", n, &olen)
                    : cz__gzip_whole(s->cfg->level, p ? p : "", n, &olen);
    if (!buf) return -ENOMEM;
    s->out_bytes += olen;
    cz__count(s);
    int rc = http_filter_pass(x, at, buf, olen, true);
    free(buf);
    return rc;
  }
  s->started = true;
  if (x->out->no_body) /* HEAD of a stream: nothing to compress */
    return last ? http_filter_pass(x, at, NULL, 0, true) : 0;
  if (!s->gz && !(s->gz = http_gz_new(s->coding, s->cfg->level)))
    return -ENOMEM;
  cz_pass_t ps = {x, at, s};
  int rc = 0;
  if (n || last) rc = http_gz_push(s->gz, p, n, last, cz__out, &ps);
  if (last) cz__count(s);
  if (!rc && last) rc = http_filter_pass(x, at, NULL, 0, true);
  return rc;
}

static void cz_free(void *state) {
  cz_state_t *s = state;
  cz__count(s); /* what a cut stream compressed counts too */
  http_gz_free(s->gz);
  free(s);
}

int http_compress_stream_pick(const http_compress_cfg_t *cfg,
                              const http_exchange_t *x, const http_head_t *h) {
  if (!cfg || h->no_compress || !x->req) return HTTP_CODING_IDENTITY;
  const http_header_t *ae = http_header(x->req, "accept-encoding");
  if (!ae) return HTTP_CODING_IDENTITY;
  unsigned allow = 1u << HTTP_CODING_GZIP;
  if (cfg->brotli) allow |= 1u << HTTP_CODING_BR;
  return cz__pick(ae->value, ae->value_len, allow, true);
}

void http_compress_filter_init(http_filter_t *f,
                               const http_compress_cfg_t *cfg) {
  memset(f, 0, sizeof(*f));
  f->name = "compress";
  f->head = cz_head;
  f->body = cz_body;
  f->free = cz_free;
  f->cfg = (void *)(uintptr_t)cfg;
}
