/* SPDX-License-Identifier: MIT */

/* check: the unit tests' check macros. Each test file includes it once,
 * calls CHECK/CHECK_EQ from its main thread, and ends main with
 * `return check_summary();`, which prints the "N passed, N failed" line. */
#ifndef MP_CHECK_H
#define MP_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int g_pass, g_fail;

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (cond) {                                                              \
      g_pass++;                                                              \
    } else {                                                                 \
      g_fail++;                                                              \
      printf("%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);        \
    }                                                                        \
  } while (0)

#define CHECK_EQ(a, b)                                                       \
  do {                                                                       \
    long long check_a_ = (long long)(a), check_b_ = (long long)(b);          \
    if (check_a_ == check_b_) {                                              \
      g_pass++;                                                              \
    } else {                                                                 \
      g_fail++;                                                              \
      printf("%s:%d: check failed: %s == %s (%lld != %lld)\n", __FILE__,     \
             __LINE__, #a, #b, check_a_, check_b_);                          \
    }                                                                        \
  } while (0)

/* s copied so that it ends exactly at a PROT_NONE page, with no NUL
 * after it: a parser that reads one byte too far faults at once. The copy
 * lives until the next call. */
static inline const char *check_guard(const char *s) {
  static char *page;
  static size_t psize;
  if (!page) {
    psize = (size_t)sysconf(_SC_PAGESIZE);
    page = mmap(NULL, 2 * psize, PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED || mprotect(page + psize, psize, PROT_NONE)) abort();
  }
  size_t n = strlen(s);
  if (n > psize) abort();
  char *p = page + psize - n;
  memcpy(p, s, n);
  return p;
}

static inline int check_summary(void) {
  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

#endif
