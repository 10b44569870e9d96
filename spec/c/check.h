/* check: the unit tests' check macros. Each test file includes it once,
 * calls CHECK/CHECK_EQ from its main thread, and ends main with
 * `return check_summary();`, which prints the "N passed, N failed" line. */
#ifndef MP_CHECK_H
#define MP_CHECK_H

#include <stdio.h>

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

static inline int check_summary(void) {
  printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail ? 1 : 0;
}

#endif
