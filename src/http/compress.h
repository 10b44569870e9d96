/* SPDX-License-Identifier: MIT */

/* compress: response compression (gzip, brotli) as a body filter of the
 * response writer (http/response.h), and a gzip stream for the writers
 * that sit outside the chain (Server-Sent Events).
 *
 * The filter is protocol-blind: it reads the request's Accept-Encoding
 * and Range fields and the head's lines, changes header lines
 * (Content-Encoding, Vary, ETag) and the body, and never sees framing
 * bytes, so it works over any framer below the writer.
 *
 * A body whose length is known when the head is given (http_res_send, a
 * file) is compressed in one shot when it arrives whole (libdeflate for
 * gzip: it measured faster than zlib's deflate at the same level on a
 * 16 KiB JSON body, and smaller; libbrotli for br) and goes out with a
 * Content-Length. A streamed body (http_res_write) goes through a zlib
 * stream with a small window (HTTP_GZ_WBITS, HTTP_GZ_MEMLEVEL), flushed
 * at every piece so that each piece reaches the client at once, freed at
 * the end. A stream is br when the client ranks br above gzip (or takes
 * br only): a br stream flushed at each small piece is about as small as
 * the gzip one but holds over ten times its memory (HTTP_BR_STREAM_*),
 * so at equal q a stream goes gzip while a whole body goes br.
 *
 * Threads: the filter and a gzip stream run on the connection's reactor
 * thread; the one-shot compressors are kept per thread. */
#ifndef MP_HTTP_COMPRESS_H
#define MP_HTTP_COMPRESS_H

#include <stdbool.h>
#include <stddef.h>

#include "core/stats.h"
#include "http/response.h"

/* Content codings. */
enum {
  HTTP_CODING_IDENTITY = 0,
  HTTP_CODING_GZIP = 1,
  HTTP_CODING_BR = 2,
};

/* The coding to answer with, from an Accept-Encoding value (NULL: the
 * field is absent) among `allow` (a mask of 1 << HTTP_CODING_GZIP and
 * 1 << HTTP_CODING_BR): the allowed coding with the highest q above 0
 * ("*" stands for the codings not listed), br before gzip at equal q;
 * identity when none is acceptable or identity is listed with a higher q
 * than the best coding. Never fails (a malformed element refuses its
 * coding): the caller never has to answer 406. Pure; any thread. */
int http_coding_pick(const char *value, size_t len, unsigned allow);

/* Media types the filter compresses when the settings name none:
 * text/ (all of it), JSON, JavaScript, XML, SVG, WebAssembly, and a few more.
 */
extern const char *const http_compress_default_types[];

#define HTTP_COMPRESS_TYPES_MAX 32
#define HTTP_COMPRESS_TYPE_LEN 64

/* Settings of one server's compression (the filter's cfg). */
typedef struct {
  int level;       /* gzip 1..9; brotli's quality is the same, at most 11 */
  bool brotli;     /* br is offered */
  size_t min_size; /* bodies of a known length under this go as they are */
  size_t file_max; /* files over this go as they are */
  size_t cache;    /* bytes of compressed files kept per thread; 0: none */
  /* media types, without parameters (a type that ends in "/" then a star
   * names a whole tree: text/ and a star for every text type) */
  char types[HTTP_COMPRESS_TYPES_MAX][HTTP_COMPRESS_TYPE_LEN];
  int ntypes;
} http_compress_cfg_t;

/* Fills cfg with the defaults (level 5, brotli on, min_size 1024,
 * file_max 8 MiB, cache 4 MiB, the default types). */
void http_compress_cfg_init(http_compress_cfg_t *cfg);
/* Whether a Content-Type value (parameters and case ignored) is one of
 * cfg's types. */
bool http_compress_type_ok(const http_compress_cfg_t *cfg, const char *type,
                           size_t len);
/* The filter, for http_server_t.filters, with cfg (borrowed: it must
 * outlive the server's connections). */
void http_compress_filter_init(http_filter_t *f,
                               const http_compress_cfg_t *cfg);

/* For a stream that bypasses the filters (SSE): the coding of its
 * stream when cfg (NULL: compression is off) allows it, the response did
 * not turn it off (h->no_compress) and the client takes gzip or br
 * (gzip first at equal q; br only when cfg->brotli); else identity. */
int http_compress_stream_pick(const http_compress_cfg_t *cfg,
                              const struct http_exchange *x,
                              const http_head_t *h);

/* The settings of the compress filter in srv's chain, or NULL when it
 * has none (compression is off). */
struct http_server;
const http_compress_cfg_t *http_compress_cfg_of(const struct http_server *srv);

/* The gzip (libdeflate) or br (libbrotli) of in[0..n) at `level`, in one
 * shot: a malloc'd buffer of *out_len bytes, or NULL. */
char *http_compress_whole(int coding, int level, const char *in, size_t n,
                          size_t *out_len);

/* ---- compressed copies of files ---- */

/* The bytes of the regular file open at fd (st: its fstat; at most
 * HTTP_FILE_WHOLE bytes) compressed with `coding` at cfg's level:
 * *len bytes, valid until the next call on this thread, or NULL with
 * errno (EFBIG past HTTP_FILE_WHOLE, EIO, ENOMEM).
 *
 * They come from this thread's cache when it holds that version of the
 * file (same device and inode, size, mtime and ctime to the nanosecond:
 * what the file's ETag is made of, and ctime for a write that put the
 * mtime back); else the file is read and compressed, and the result kept
 * for the next request. The cache holds at most cfg->cache bytes
 * (compressed bytes plus a small fixed cost per entry) per thread, least
 * recently used out first; a result larger than that is sent and not
 * kept. A file that changed is compressed again, and the entry of its
 * old version dropped when it is looked up. With stats: a hit counts
 * STAT_HTTP_COMP_CACHED, a compression STAT_HTTP_COMP_IN/OUT.
 * Threads: each thread's cache is its own (freed when the thread ends);
 * no locks. */
struct stat;
const char *http_zcache_file(const http_compress_cfg_t *cfg, int fd,
                             const struct stat *st, int coding, size_t *len,
                             stats_slot_t *stats);

/* ---- a compressed stream (SSE, and the filter's streamed bodies) ---- */

/* The window and memory level of a stream: zlib's deflate then holds
 * about (1 << (WBITS + 2)) + (1 << (MEMLEVEL + 9)) bytes, 48 KiB, plus
 * its state of about 6 KiB, for as long as the stream lasts. */
#define HTTP_GZ_WBITS 12
#define HTTP_GZ_MEMLEVEL 6

/* A br stream's quality and window, whatever the level (measured on
 * 200 SSE events of ~70 bytes, each flushed: 14,420 bytes became 3,524
 * with br at quality 5, 3,786 with the gzip stream; libbrotli then holds
 * ~712 KiB while the stream is open; quality 2-4 hold 312-712 KiB and
 * made more bytes than gzip, 0-1 keep nothing across flushes and made
 * more bytes than they took). */
#define HTTP_BR_STREAM_QUALITY 5
#define HTTP_BR_STREAM_LGWIN 16

typedef struct http_gz http_gz_t;
/* A stream of `coding` (HTTP_CODING_GZIP at `level` 1..9, or
 * HTTP_CODING_BR); NULL with errno (ENOMEM). */
http_gz_t *http_gz_new(int coding, int level);
/* Compresses p[0..n) and flushes (Z_SYNC_FLUSH or brotli's flush, or the
 * stream's end when `last`), handing the output to out(ctx, bytes, len) in
 * pieces (a stack buffer, valid during the call). 0 or a negative errno (out's
 * own, or -ENOMEM, -EIO). */
int http_gz_push(http_gz_t *g, const char *p, size_t n, bool last,
                 int (*out)(void *ctx, const char *p, size_t n), void *ctx);
/* Bytes taken in and given out so far. */
void http_gz_counts(const http_gz_t *g, size_t *in, size_t *out);
void http_gz_free(http_gz_t *g);

#endif
