/* SPDX-License-Identifier: MIT */

/* public: the static-file sender (mp.http's public folder); see
 * public.h. */
#include "http/public.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/log.h"
#include "http/compress.h"
#include "http/sibling.h"
#include "http/static.h"

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

#define PB_PATH_MAX 4096

/* Opens `rel` under the folder `dirfd`: an fd, or a negative errno. */
static int pb__open(int dirfd, const char *rel, uint64_t flags) {
  struct open_how how;
  memset(&how, 0, sizeof(how));
  how.flags = flags | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
  return fd < 0 ? -errno : (int)fd;
}

/* The head of a static response with the header lines `hdrs`. */
static http_head_t pb__head(http_conn_t *hc, int status, const char *hdrs,
                            size_t hl) {
  http_head_t res = http_exchange_head(&hc->x, status);
  res.has_type = true; /* set in hdrs when there is a body */
  res.headers = hdrs;
  res.hlen = hl;
  return res;
}

/* A short text answer (404, 403, 405, 301...) with `extra` header lines;
 * the connection goes on. */
static void pb__answer(conn_t *c, http_conn_t *hc, int status,
                              const char *extra, size_t el) {
  const http_page_t *page = http_conn_page(hc, status); /* error_pages */
  char type[128], stack[512], body[64];
  size_t tl = (size_t)snprintf(type, sizeof(type), "Content-Type: %s\r\n",
                               page ? page->type : "text/plain; charset=utf-8");
  size_t hl = tl + el;
  char *hdrs = hl <= sizeof(stack) ? stack : malloc(hl);
  if (!hdrs) {
    http_conn_refuse(c, hc, 500);
    return;
  }
  memcpy(hdrs, type, tl);
  if (el) memcpy(hdrs + tl, extra, el);
  http_head_t h = pb__head(hc, status, hdrs, hl);
  if (page) {
    http_res_send(&hc->x, &h, page->body, page->len, NULL, NULL, NULL);
  } else {
    int bl = snprintf(body, sizeof(body), "%s\n", http_reason(status));
    http_res_send(&hc->x, &h, body, (size_t)bl, NULL, NULL, NULL);
  }
  if (hdrs != stack) free(hdrs);
}

/* A folder asked for without its slash: 301 to the same path with it
 * (and the query). Leading slashes become one, so "//host/dir" can't
 * turn into a link to another site. */
static void pb__redirect(conn_t *c, http_conn_t *hc, const char *path,
                                size_t plen, const char *query, size_t qlen) {
  while (plen > 1 && path[1] == '/') path++, plen--;
  size_t need = plen + qlen + 20;
  char *loc = malloc(need);
  if (!loc) {
    pb__answer(c, hc, 500, NULL, 0);
    return;
  }
  int n = snprintf(loc, need, "Location: %.*s/%s%.*s\r\n", (int)plen, path,
                   query ? "?" : "", (int)qlen, query ? query : "");
  pb__answer(c, hc, 301, loc, (size_t)n);
  free(loc);
}

/* A compressible file compressed on the fly, through the thread's cache
 * of compressed files (http_zcache_file: compressed once, sent again
 * until the file changes), when compression is on and the client takes
 * it; HEAD gets the same head with the compressed length. Takes fd and
 * returns true when it answered; false leaves both to the caller (the
 * file goes as it is, or through the filter: too large, not a
 * compressible type, a client that takes none, an error). */
/* Header lines built by appending (snprintf was about 3,000 instructions
 * of a static answer, callgrind). The buffers are sized for the longest
 * lines; an append that would not fit is cut, never overrun. */
typedef struct {
  char *p, *end;
} pb_lines_t;

static void pb__add(pb_lines_t *b, const char *s, size_t n) {
  if (n > (size_t)(b->end - b->p)) n = (size_t)(b->end - b->p);
  memcpy(b->p, s, n);
  b->p += n;
}
#define PB_ADD(b, lit) pb__add(b, lit, sizeof(lit) - 1)

static void pb__adds(pb_lines_t *b, const char *s) { pb__add(b, s, strlen(s)); }

/* The file's ETag, "size-mtime" in hex (mtime in ns), at out (room: 37
 * bytes, NUL included); its length. The thread keeps the last one made
 * (a file asked for again, or a folder's files of one size and time). */
static __thread struct {
  uint64_t size, mtime_ns;
  size_t len; /* 0: none yet */
  char tag[37];
} pb_last_etag;

static size_t pb__etag(char *out, uint64_t size, uint64_t mtime_ns) {
  if (pb_last_etag.len && pb_last_etag.size == size &&
      pb_last_etag.mtime_ns == mtime_ns) {
    memcpy(out, pb_last_etag.tag, pb_last_etag.len + 1);
    return pb_last_etag.len;
  }
  char *p = out;
  *p++ = '"';
  p = http_put_hex(p, size);
  *p++ = '-';
  p = http_put_hex(p, mtime_ns);
  *p++ = '"';
  *p = 0;
  size_t n = (size_t)(p - out);
  memcpy(pb_last_etag.tag, out, n + 1);
  pb_last_etag.size = size;
  pb_last_etag.mtime_ns = mtime_ns;
  pb_last_etag.len = n;
  return n;
}

/* The coding pb__cached would answer this request for the file with
 * (identity: it would not; *cfgp: the settings, or NULL). */
static int pb__zcoding(http_conn_t *hc, const struct stat *st, const char *type,
                       const http_compress_cfg_t **cfgp) {
  const http_compress_cfg_t *cfg = *cfgp = http_compress_cfg_of(hc->srv);
  uint64_t size = (uint64_t)st->st_size;
  if (!cfg || size < cfg->min_size || size > cfg->file_max ||
      size > HTTP_FILE_WHOLE || !http_compress_type_ok(cfg, type, strlen(type)))
    return HTTP_CODING_IDENTITY;
  const http_header_t *ae = http_header(hc->x.req, "accept-encoding");
  unsigned allow = 1u << HTTP_CODING_GZIP;
  if (cfg->brotli) allow |= 1u << HTTP_CODING_BR;
  return http_coding_pick(ae ? ae->value : NULL, ae ? ae->value_len : 0, allow);
}

static bool pb__cached(http_conn_t *hc, int fd, const struct stat *st,
                       const char *type, const char *etag, const char *date) {
  const http_compress_cfg_t *cfg;
  int coding = pb__zcoding(hc, st, type, &cfg);
  if (coding == HTTP_CODING_IDENTITY) return false;
  size_t len;
  const char *z = http_zcache_file(cfg, fd, st, coding, &len, hc->srv->stats);
  if (!z) return false;
  close(fd);
  char hdrs[512];
  pb_lines_t b = {hdrs, hdrs + sizeof(hdrs)};
  PB_ADD(&b, "Content-Type: ");
  pb__adds(&b, type);
  PB_ADD(&b, "\r\nETag: W/");
  pb__adds(&b, etag);
  PB_ADD(&b, "\r\nLast-Modified: ");
  pb__adds(&b, date);
  if (coding == HTTP_CODING_BR)
    PB_ADD(&b, "\r\nContent-Encoding: br\r\nVary: Accept-Encoding\r\n");
  else
    PB_ADD(&b, "\r\nContent-Encoding: gzip\r\nVary: Accept-Encoding\r\n");
  http_head_t h = pb__head(hc, 200, hdrs, (size_t)(b.p - hdrs));
  http_res_send(&hc->x, &h, z, len, NULL, NULL, NULL);
  return true;
}

/* Sends the file open at fd (st its stat; rel its path, with room for
 * ".gz" or ".br" after it), minding the validators, Range and the
 * precompressed siblings. */
static void pb__send(conn_t *c, http_conn_t *hc, int fd,
                            struct stat *st, char *rel, size_t n) {
  http_request_t *r = hc->x.req;
  bool head = http_is_method(r, "HEAD");
  const char *type = http_static_mime(rel, n);
  /* Precompressed siblings (".br", ".gz"): one makes the answer vary
   * with Accept-Encoding whether or not this client takes it. The
   * client's preferred coding is looked for pref, then the other one it
   * takes. A request with a Range gets the original, so ranges always
   * count its bytes. */
  const http_header_t *ae = http_header(r, "accept-encoding");
  const char *aev = ae ? ae->value : NULL;
  size_t ael = ae ? ae->value_len : 0;
  bool ranged = http_header(r, "range") != NULL;
  int pref =
      http_coding_pick(aev, ael, 1u << HTTP_CODING_GZIP | 1u << HTTP_CODING_BR);
  bool takes[3] = {
      false, !ranged && http_coding_pick(aev, ael, 1u << HTTP_CODING_GZIP) != 0,
      !ranged && http_coding_pick(aev, ael, 1u << HTTP_CODING_BR) != 0};
  int order[2] = {pref == HTTP_CODING_BR ? HTTP_CODING_BR : HTTP_CODING_GZIP,
                  pref == HTTP_CODING_BR ? HTTP_CODING_GZIP : HTTP_CODING_BR};
  bool vary = false;
  int coding = HTTP_CODING_IDENTITY;
  /* which siblings there are, when this thread has looked since the
   * folder last changed (sibling.h); else both are looked for, after
   * the folder is watched, and what was found is remembered */
  uint64_t dev = (uint64_t)st->st_dev, ino = (uint64_t)st->st_ino;
  int known = http_sib_get(rel, n, dev, ino);
  bool learn = known < 0 && http_sib_watch(hc->srv->public_fd, rel, n);
  unsigned found = 0;
  for (int k = 0; k < 2; k++) {
    int cd = order[k];
    unsigned bit = cd == HTTP_CODING_BR ? HTTP_SIB_BR : HTTP_SIB_GZ;
    bool want = takes[cd] && coding == HTTP_CODING_IDENTITY;
    if (known >= 0 && !((unsigned)known & bit)) continue; /* none there */
    if (known >= 0 && !want) {
      vary = true;
      continue;
    }
    if (vary && !want && !learn) continue; /* nothing left to learn */
    memcpy(rel + n, cd == HTTP_CODING_BR ? ".br" : ".gz", 4);
    int sib = pb__open(hc->srv->public_fd, rel,
                       want ? O_RDONLY | O_NONBLOCK | O_NOCTTY : O_PATH);
    rel[n] = 0;
    struct stat sst;
    if (sib >= 0 && fstat(sib, &sst) == 0 && S_ISREG(sst.st_mode)) {
      vary = true;
      found |= bit;
      if (want) {
        int t = fd;
        fd = sib;
        sib = t;
        *st = sst;
        coding = cd;
      }
    }
    if (sib >= 0) close(sib);
  }
  if (learn) http_sib_put(rel, n, dev, ino, found);
  bool gzip = coding != HTTP_CODING_IDENTITY; /* precompressed */

  uint64_t size = (uint64_t)st->st_size;
  int64_t mtime = (int64_t)st->st_mtim.tv_sec;
  char etag[48], date[32];
  size_t el =
      pb__etag(etag, size,
               (uint64_t)mtime * 1000000000u + (uint64_t)st->st_mtim.tv_nsec);
  http_static_format_date(mtime, date);

  /* If-None-Match wins over If-Modified-Since (RFC 9110 13.2.2) */
  const http_header_t *inm = http_header(r, "if-none-match");
  const http_header_t *ims = http_header(r, "if-modified-since");
  bool not_modified = false;
  if (inm) {
    not_modified = http_static_etag_match(inm->value, inm->value_len, etag, el);
  } else if (ims) {
    int64_t t = http_static_parse_date(ims->value, ims->value_len);
    not_modified = t >= 0 && mtime <= t;
  }
  int status = not_modified ? 304 : 200;
  uint64_t first = 0, last = size ? size - 1 : 0;
  const http_header_t *rh = http_header(r, "range");
  if (status == 200 && rh && !head && !gzip) {
    const http_header_t *ir = http_header(r, "if-range");
    if (!ir ||
        http_static_if_range(ir->value, ir->value_len, etag, el, mtime)) {
      int k = http_static_range(rh->value, rh->value_len, size, &first, &last);
      if (k == HTTP_RANGE_OK) status = 206;
      if (k == HTTP_RANGE_UNSATISFIABLE) status = 416;
    }
  }

  if (status == 200 && !rh && !gzip && pb__cached(hc, fd, st, type, etag, date))
    return;

  char hdrs[512];
  int hl;
  /* a 304 carries what the 200 would: the weak ETag and Vary of a
   * variant compressed on the fly */
  const http_compress_cfg_t *zcfg = NULL;
  bool z304 = status == 304 && !gzip && !rh &&
              pb__zcoding(hc, st, type, &zcfg) != HTTP_CODING_IDENTITY;
  if (status == 416) {
    hl = snprintf(hdrs, sizeof(hdrs),
                  "Content-Type: text/plain; charset=utf-8\r\nAccept-Ranges: bytes\r\n"
                  "Content-Range: bytes */%" PRIu64 "\r\n",
                  size);
  } else {
    pb_lines_t b = {hdrs, hdrs + sizeof(hdrs)};
    if (status != 304) {
      PB_ADD(&b, "Content-Type: ");
      pb__adds(&b, type);
      PB_ADD(&b, "\r\n");
    }
    PB_ADD(&b, "ETag: ");
    if (z304) PB_ADD(&b, "W/");
    pb__add(&b, etag, el);
    PB_ADD(&b, "\r\nLast-Modified: ");
    pb__adds(&b, date);
    PB_ADD(&b, "\r\n");
    if (status != 304) {
      if (coding == HTTP_CODING_BR)
        PB_ADD(&b, "Content-Encoding: br\r\n");
      else if (coding == HTTP_CODING_GZIP)
        PB_ADD(&b, "Content-Encoding: gzip\r\n");
      else
        PB_ADD(&b, "Accept-Ranges: bytes\r\n");
    }
    if (vary || z304) PB_ADD(&b, "Vary: Accept-Encoding\r\n");
    hl = (int)(b.p - hdrs);
  }
  if (status == 206)
    hl += snprintf(hdrs + hl, sizeof(hdrs) - (size_t)hl,
                   "Content-Range: bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64 "\r\n", first,
                   last, size);
  if (status == 304 || status == 416) {
    static const char msg[] = "Range Not Satisfiable\n";
    close(fd);
    http_head_t h = pb__head(hc, status, hdrs, (size_t)hl);
    if (status == 304)
      http_res_send(&hc->x, &h, NULL, 0, NULL, NULL, NULL);
    else
      http_res_send(&hc->x, &h, msg, sizeof(msg) - 1, NULL, NULL, NULL);
    return;
  }
  uint64_t len = size ? last - first + 1 : 0;
  /* Small files go out with the head in one write; the rest by sendfile,
   * which takes the fd. (Measured with wrk on a 4 KB file: about 13% less
   * server CPU per request than the head followed by sendfile.) */
  char small[HTTP_INLINE_BODY];
  http_head_t h = pb__head(hc, status, hdrs, (size_t)hl);
  if (!head && len && len <= sizeof(small) && reactor_conn_pending(c) == 0) {
    /* (with answers queued before it, a copy would wait in the queue:
     * then the file goes by reference, below, whatever its size) */
    ssize_t got = pread(fd, small, (size_t)len, (off_t)first);
    close(fd);
    if (got != (ssize_t)len) {
      pb__answer(c, hc, 500, NULL, 0);
      return;
    }
    http_res_send(&hc->x, &h, small, (size_t)len, NULL, NULL, NULL);
  } else {
    http_res_sendfile(&hc->x, &h, fd, (off_t)first, len);
  }
}

/* Whether an open error means "nothing there" (as opposed to refused). */
static bool pb__absent(int err) {
  return err == -ENOENT || err == -ENOTDIR || err == -ELOOP || err == -EXDEV ||
         err == -ENAMETOOLONG || err == -ENXIO;
}

/* Opens rel and stats it: the fd, or a negative errno. */
static int pb__stat(int dirfd, const char *rel, struct stat *st) {
  int fd = pb__open(dirfd, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY);
  if (fd >= 0 && fstat(fd, st) != 0) {
    int e = -errno;
    close(fd);
    return e;
  }
  return fd;
}

bool http_public_answer(http_exchange_t *x, bool app) {
  http_conn_t *hc = x->conn;
  conn_t *c = hc->c;
  http_server_t *cfg = hc->srv;
  http_request_t *r = hc->x.req;
  bool get = http_is_method(r, "GET") || http_is_method(r, "HEAD");
  if (!get && app) return false; /* without a look: the app's request */
  const char *path, *query;
  size_t plen, qlen;
  http_target_split(r->target, r->target_len, &path, &plen, &query, &qlen);
  if (cfg->public_prefix_len &&
      (plen < cfg->public_prefix_len ||
       memcmp(path, cfg->public_prefix, cfg->public_prefix_len) != 0))
    return false; /* outside public_prefix: not a file, no system call */
  /* room after the path for "/index.html" and then ".gz" or ".br" */
  char rel[PB_PATH_MAX + 16];
  ssize_t n = http_static_path(path, plen, rel, PB_PATH_MAX);
  if (n == HTTP_STATIC_BAD) {
    http_conn_refuse(c, hc, 400); /* as on_request's path decoding would */
    return true;
  }
  if (n == HTTP_STATIC_ESCAPE) {
    pb__answer(c, hc, 404, NULL, 0);
    return true;
  }
  struct stat st;
  int fd = n < 0 ? -ENOENT : pb__stat(cfg->public_fd, rel, &st);
  if (fd >= 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    fd = -ENOENT;
    if (path[plen - 1] != '/') {
      if (get) {
        pb__redirect(c, hc, path, plen, query, qlen);
        return true;
      }
      fd = -EISDIR; /* there is something: 405 below */
    } else {
      const char *index = rel[n - 1] == '/' || (n == 1 && rel[0] == '.')
                              ? "index.html" : "/index.html";
      if (n == 1 && rel[0] == '.') n = 0;
      n += snprintf(rel + n, sizeof(rel) - (size_t)n, "%s", index);
      fd = pb__stat(cfg->public_fd, rel, &st);
    }
  }
  if (fd >= 0 && !S_ISREG(st.st_mode)) {
    close(fd);
    fd = -ENOENT;
  }
  if (fd == -EACCES || fd == -EPERM) {
    pb__answer(c, hc, 403, NULL, 0);
    return true;
  }
  if (fd < 0 && !pb__absent(fd) && fd != -EISDIR) {
    char buf[128];
    log_error("static file \"%s\": %s", rel, strerror_r(-fd, buf, sizeof(buf)));
    pb__answer(c, hc, 500, NULL, 0);
    return true;
  }
  if (fd < 0 && fd != -EISDIR) {
    if (app) return false;
    pb__answer(c, hc, 404, NULL, 0);
    return true;
  }
  if (!get) { /* only without on_request */
    if (fd >= 0) close(fd);
    static const char allow[] = "Allow: GET, HEAD\r\n";
    pb__answer(c, hc, 405, allow, sizeof(allow) - 1);
    return true;
  }
  pb__send(c, hc, fd, &st, rel, (size_t)n);
  return true;
}

int http_public_open(const char *dir, const char **step) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    *step = "open";
    return -errno;
  }
  int probe = pb__open(fd, ".", O_PATH);
  if (probe < 0) {
    close(fd);
    *step = "openat2";
    return probe;
  }
  close(probe);
  return fd;
}
