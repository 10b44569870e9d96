/* SPDX-License-Identifier: MIT */

/* For measuring under valgrind only (scripts/bench-callgrind): valgrind
 * does not know openat2(2), which mp.http's public folder opens files
 * with, so this preload answers it with openat(O_NOFOLLOW). The folder's
 * containment (RESOLVE_BENEATH) is not kept: never serve with it. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdarg.h>

#ifndef SYS_openat2
#define SYS_openat2 437
#endif

long syscall(long n, ...);

long syscall(long n, ...) {
  va_list ap;
  va_start(ap, n);
  long a[6];
  for (int i = 0; i < 6; i++) a[i] = va_arg(ap, long);
  va_end(ap);
  if (n == SYS_openat2) {
    const struct open_how *how = (const void *)a[2];
    return openat((int)a[0], (const char *)a[1], (int)how->flags | O_NOFOLLOW,
                  (int)how->mode);
  }
  static long (*real)(long, ...);
  if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  return real(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}
