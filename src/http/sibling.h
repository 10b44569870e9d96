/* SPDX-License-Identifier: MIT */

/* sibling: which files of a public folder have precompressed siblings
 * (".gz", ".br"), remembered per thread, so that serving a file costs no
 * look for them after its first request (two failed opens were about a
 * fifth of a small file's CPU). What is remembered stays true because
 * the folder of each remembered file is watched with inotify before it
 * is looked in: any change there (a file made, removed, renamed, its
 * mode changed; the folder itself moved or removed) forgets everything
 * at the next lookup, which reads the watch first. A file is known by
 * its path and its device and inode, so a path that now names another
 * file is looked at again. Without inotify (or past the limits below)
 * every request looks, as before.
 *
 * Bounds, per thread: HTTP_SIB_MAX files (past it everything is
 * forgotten), HTTP_SIB_DIRS watched folders (past it the watch is
 * closed and made anew), paths up to HTTP_SIB_PATH_MAX bytes (longer
 * ones are not remembered). Reactor thread; nothing is shared between
 * threads. */
#ifndef MP_HTTP_SIBLING_H
#define MP_HTTP_SIBLING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { HTTP_SIB_GZ = 1, HTTP_SIB_BR = 2 };

#define HTTP_SIB_MAX 2048
#define HTTP_SIB_DIRS 256
#define HTTP_SIB_PATH_MAX 255

/* The siblings (HTTP_SIB_* bits) last seen for the file at rel[0..n)
 * with device dev and inode ino, or -1 when it is not known. */
int http_sib_get(const char *rel, size_t n, uint64_t dev, uint64_t ino);

/* Watches the folder of rel[0..n) under the folder open at dirfd, before
 * its siblings are looked for: true when what is found may then be
 * remembered with http_sib_put. */
bool http_sib_watch(int dirfd, const char *rel, size_t n);

/* Remembers `bits` for the file (after http_sib_watch said true). */
void http_sib_put(const char *rel, size_t n, uint64_t dev, uint64_t ino,
                  unsigned bits);

/* How many files this thread remembers (for tests). */
size_t http_sib_count(void);

#endif
