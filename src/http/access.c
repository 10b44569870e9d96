/* SPDX-License-Identifier: MIT */

/* access: formats access-log lines; see access.h. */
#include "http/access.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* A line being built: bounded, never written past its end. */
typedef struct {
  char *b;
  size_t at, cap;
} al_line_t;

static void al__raw(al_line_t *l, const char *s, size_t n) {
  if (n > l->cap - l->at) n = l->cap - l->at;
  memcpy(l->b + l->at, s, n);
  l->at += n;
}

/* Appends s[0..n) escaped, at most `max` bytes of output; a longer field
 * is cut and ends with "...", so the fields after it always fit. */
static void al__esc(al_line_t *l, const char *s, size_t n, size_t max) {
  static const char hex[] = "0123456789abcdef";
  size_t end = l->at + max < l->cap ? l->at + max : l->cap;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    bool esc = ch < 0x20 || ch >= 0x7f || ch == '"' || ch == '\\';
    if (l->at + (esc ? 4 : 1) + 3 > end && i + 1 < n) {
      al__raw(l, "...", 3);
      return;
    }
    if (l->at + (esc ? 4 : 1) > end) return;
    if (esc) {
      l->b[l->at++] = '\\';
      l->b[l->at++] = 'x';
      l->b[l->at++] = hex[ch >> 4];
      l->b[l->at++] = hex[ch & 15];
    } else {
      l->b[l->at++] = (char)ch;
    }
  }
}

/* What one field may take (escaped): with these the line always has room
 * for every field. */
#define AL_IP 128
#define AL_METHOD 64
#define AL_TARGET 2048
#define AL_HEADER 512

size_t http_access_line(char *buf, const char *ip, time_t when,
                        const http_request_t *req, const char *raw,
                        size_t rawlen, int status, uint64_t bytes,
                        double seconds) {
  struct tm tm;
  gmtime_r(&when, &tm);
  char stamp[40], num[64];
  strftime(stamp, sizeof(stamp), "%d/%b/%Y:%H:%M:%S +0000", &tm);
  al_line_t l = {buf, 0, HTTP_ACCESS_LINE_MAX - 1}; /* room for the '\n' */
  al__esc(&l, ip, strlen(ip), AL_IP);
  al__raw(&l, " - - [", 6);
  al__raw(&l, stamp, strlen(stamp));
  al__raw(&l, "] \"", 3);
  const http_header_t *ref = NULL, *ua = NULL;
  if (req) {
    al__esc(&l, req->method, req->method_len, AL_METHOD);
    al__raw(&l, " ", 1);
    al__esc(&l, req->target, req->target_len, AL_TARGET);
    al__raw(&l, num,
            req->h2
                ? (size_t)snprintf(num, sizeof(num), " HTTP/2.0")
                : (size_t)snprintf(num, sizeof(num), " HTTP/1.%d", req->minor));
    ref = http_header(req, "referer");
    ua = http_header(req, "user-agent");
  } else if (rawlen) {
    al__esc(&l, raw, rawlen, AL_TARGET + AL_METHOD);
  } else {
    al__raw(&l, "-", 1);
  }
  al__raw(&l, num, (size_t)snprintf(num, sizeof(num), "\" %d %llu \"", status,
                                    (unsigned long long)bytes));
  if (ref)
    al__esc(&l, ref->value, ref->value_len, AL_HEADER);
  else
    al__raw(&l, "-", 1);
  al__raw(&l, "\" \"", 3);
  if (ua)
    al__esc(&l, ua->value, ua->value_len, AL_HEADER);
  else
    al__raw(&l, "-", 1);
  al__raw(&l, num, (size_t)snprintf(num, sizeof(num), "\" %.3f", seconds));
  buf[l.at++] = '\n';
  return l.at;
}
