/* SPDX-License-Identifier: MIT */

/* multipart_parse: the C multipart parser's own speed, for
 * scripts/bench-upload: a body of one MIB-sized file part (keystream-like
 * bytes from a xorshift generator, so CRs come at random) parsed from
 * memory in 64 KiB pieces, ROUNDS times; prints the best GB/s of one
 * core.
 * usage: multipart_parse MIB ROUNDS */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http/multipart.h"

int main(int argc, char **argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
  int rounds = argc > 2 ? atoi(argv[2]) : 5;
  const char *b = "----------------------------372345678901234567890123";
  char head[256];
  int hl = snprintf(head, sizeof(head),
                    "--%s\r\nContent-Disposition: form-data; name=\"f\"; filename=\"x\"\r\n"
                    "Content-Type: application/octet-stream\r\n\r\n", b);
  size_t n = mib << 20, total = (size_t)hl + n + strlen(b) + 8;
  char *body = malloc(total);
  if (!body) return 1;
  memcpy(body, head, (size_t)hl);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i < n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    memcpy(body + hl + i, &x, n - i < 8 ? n - i : 8);
  }
  size_t tl = (size_t)snprintf(body + hl + n, total - hl - n, "\r\n--%s--", b);
  total = (size_t)hl + n + tl;
  multipart_limits_t lim = {.max_parts = 10, .max_header = 8192, .max_part = UINT64_MAX};
  double best = 0;
  for (int r = 0; r < rounds; r++) {
    multipart_t *m = multipart_new(b, strlen(b), &lim);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t data = 0;
    for (size_t off = 0; off < total;) {
      size_t len = total - off < 65536 ? total - off : 65536;
      size_t at = 0;
      while (at < len) {
        multipart_event_t ev;
        long k = multipart_parse(m, body + off + at, len - at, &ev);
        if (k < 0) return 2;
        at += (size_t)k;
        if (ev.type == MULTIPART_DATA) data += ev.n;
        if (ev.type == MULTIPART_NONE || ev.type == MULTIPART_DONE) break;
      }
      off += len;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (multipart_finish(m) || data != n) return 3;
    multipart_free(m);
    double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    double gbs = (double)total / s / 1e9;
    if (gbs > best) best = gbs;
  }
  printf("%.2f\n", best);
  return 0;
}
