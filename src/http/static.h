/* SPDX-License-Identifier: MIT */

/* static: the pure parts of serving files over HTTP: a request target's
 * path made safe to open under a folder, the media type of a file name,
 * the Range, If-None-Match, If-Range and Accept-Encoding fields, and HTTP
 * dates. Nothing here touches the file system or allocates; every
 * function reads only the bytes it is given (no NUL terminator needed)
 * and may be called from any thread. The connection side (opening,
 * answering) is in src/http/public.c. */
#ifndef MP_HTTP_STATIC_H
#define MP_HTTP_STATIC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Results of http_static_path besides a length. */
enum {
  HTTP_STATIC_SKIP = -1,       /* not a path to look up: leave it to the app */
  HTTP_STATIC_BAD = -400,      /* a bad %-escape or a NUL: malformed */
  HTTP_STATIC_ESCAPE = -404,   /* tries to leave the folder: answer 404 */
};

/* Turns the raw (still %-encoded) path of a target into the relative
 * path to open under the public folder, written to out[0..cap) with a
 * terminating NUL: "/a/b%20c" gives "a/b c", "/" gives ".". Returns the
 * length written, or:
 *   HTTP_STATIC_BAD    a bad %-escape, or a NUL once decoded;
 *   HTTP_STATIC_ESCAPE a ".." segment or a backslash (raw or decoded);
 *   HTTP_STATIC_SKIP   the path doesn't start with '/', holds an encoded
 *                      slash (%2F), a segment that starts with '.' other
 *                      than ".well-known" (hidden files such as .git or
 *                      .env are not served), or doesn't fit in cap.
 * Segments are checked after decoding, so "%2e%2e" is "..". Empty
 * segments ("a//b") are kept: the kernel reads them as one slash. This is
 * the lexical check only; symlinks are for openat2(RESOLVE_BENEATH). */
ssize_t http_static_path(const char *path, size_t len, char *out, size_t cap);

/* The media type for a file name, by its extension (case-insensitive):
 * text types, JavaScript and JSON with "; charset=utf-8";
 * "application/octet-stream" when unknown. A static string. */
const char *http_static_mime(const char *name, size_t len);

/* Results of http_static_range. */
enum {
  HTTP_RANGE_IGNORE = 0,        /* serve the whole file (200) */
  HTTP_RANGE_OK = 1,            /* serve [*first, *last] (206) */
  HTTP_RANGE_UNSATISFIABLE = 2, /* answer 416 */
};

/* Reads a Range field value against a file of `size` bytes. One range of
 * the "bytes" unit ("a-b", "a-", "-n"; blanks around it and empty list
 * elements allowed) gives HTTP_RANGE_OK with the inclusive bounds (b past
 * the end is cut to the end; "-n" over the size is the whole file), or
 * HTTP_RANGE_UNSATISFIABLE when it starts at or past the end or is "-0".
 * Ignored (the whole file is served, as RFC 9110 14.2 allows): another
 * unit, bad syntax, b < a, more than one range, and any range of an empty
 * file. */
int http_static_range(const char *value, size_t len, uint64_t size,
                      uint64_t *first, uint64_t *last);

/* If-None-Match: whether the list `value` names `etag` (a quoted
 * entity-tag such as "\"1f-2a\"", possibly W/) by weak comparison (the
 * W/ prefixes don't matter), or is "*". A malformed list matches
 * nothing. */
bool http_static_etag_match(const char *value, size_t len, const char *etag,
                            size_t elen);

/* Whether an If-Range field value still holds, so the Range applies: an
 * entity-tag must equal `etag` by strong comparison (a weak tag never
 * does); a date must equal `mtime` (seconds) exactly. Anything else is
 * false. */
bool http_static_if_range(const char *value, size_t len, const char *etag,
                          size_t elen, int64_t mtime);

/* Whether Accept-Encoding `value` accepts gzip: "gzip" or "x-gzip" with
 * a q above 0, or "*" with a q above 0 when gzip is not listed. A q of
 * 0 (also "0.0", "0.000") refuses it. */
bool http_static_accepts_gzip(const char *value, size_t len);

/* Parses an HTTP date (IMF-fixdate "Sun, 06 Nov 1994 08:49:37 GMT", and
 * the obsolete RFC 850 and asctime forms) into seconds since the epoch;
 * -1 if it is not one. */
int64_t http_static_parse_date(const char *s, size_t len);

/* Writes the IMF-fixdate of `t` to out (at least 30 bytes, NUL
 * included). Returns its length (29). */
size_t http_static_format_date(int64_t t, char *out);

#endif
