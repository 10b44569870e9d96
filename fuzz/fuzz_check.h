/* fuzz_check: the fuzz targets' invariant check. */
#ifndef MP_FUZZ_CHECK_H
#define MP_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

/* A broken invariant: say which and abort, so libFuzzer saves the input. */
#define FUZZ_CHECK(cond)                                                     \
  do {                                                                       \
    if (!(cond)) {                                                           \
      fprintf(stderr, "%s:%d: invariant broken: %s\n", __FILE__, __LINE__,   \
              #cond);                                                        \
      abort();                                                               \
    }                                                                        \
  } while (0)

#endif
