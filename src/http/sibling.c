/* SPDX-License-Identifier: MIT */

/* sibling: the per-thread memory of precompressed siblings; see
 * sibling.h. */
#include "http/sibling.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <unistd.h>

#define SIB_BUCKETS 4096 /* a power of two, twice HTTP_SIB_MAX */

/* what changes which names a folder holds, or whether one can be opened */
#define SIB_MASK                                                               \
  (IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB |           \
   IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)

typedef struct sib_ent {
  struct sib_ent *next; /* in its bucket */
  uint64_t dev, ino;
  uint32_t hash;
  uint8_t bits;
  uint8_t len;
  char path[];
} sib_ent_t;

typedef struct {
  int ifd;      /* the inotify instance, or -1 */
  int wd_max;   /* the highest watch made on it: watches ever made */
  bool refused; /* inotify is not there: never asked again */
  size_t count;
  sib_ent_t **b; /* SIB_BUCKETS, made with the first file */
} sib_tls_t;

static pthread_key_t sib_key;
static pthread_once_t sib_once = PTHREAD_ONCE_INIT;

static void sib__forget(sib_tls_t *t) {
  if (!t->count) return;
  for (size_t i = 0; i < SIB_BUCKETS; i++) {
    sib_ent_t *e = t->b[i];
    while (e) {
      sib_ent_t *next = e->next;
      free(e);
      e = next;
    }
    t->b[i] = NULL;
  }
  t->count = 0;
}

/* Closes the watch (every folder's with it) and forgets every file. */
static void sib__close(sib_tls_t *t) {
  sib__forget(t);
  if (t->ifd >= 0) close(t->ifd);
  t->ifd = -1;
  t->wd_max = 0;
}

static void sib__tls_free(void *p) {
  sib_tls_t *t = p;
  sib__close(t);
  free(t->b);
  free(t);
}

static void sib__key_make(void) { pthread_key_create(&sib_key, sib__tls_free); }

static sib_tls_t *sib__tls(bool make) {
  pthread_once(&sib_once, sib__key_make);
  sib_tls_t *t = pthread_getspecific(sib_key);
  if (t || !make) return t;
  if (!(t = calloc(1, sizeof(*t)))) return NULL;
  t->ifd = -1;
  if (pthread_setspecific(sib_key, t)) {
    free(t);
    return NULL;
  }
  return t;
}

static uint32_t sib__hash(const char *s, size_t n) {
  uint32_t h = 2166136261u; /* FNV-1a */
  for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 16777619u;
  return h;
}

/* Reads what the watch saw: anything at all forgets every file (a
 * change is rare; which files it touched is not worth knowing). */
static void sib__drain(sib_tls_t *t) {
  char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
  for (;;) {
    ssize_t got = read(t->ifd, buf, sizeof(buf));
    if (got > 0) {
      sib__forget(t);
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    if (got < 0 && errno == EAGAIN) return;
    sib__close(t); /* an error: nothing can be trusted */
    return;
  }
}

int http_sib_get(const char *rel, size_t n, uint64_t dev, uint64_t ino) {
  sib_tls_t *t = sib__tls(false);
  if (!t || !t->count) return -1;
  sib__drain(t);
  if (!t->count) return -1;
  uint32_t h = sib__hash(rel, n);
  for (sib_ent_t *e = t->b[h & (SIB_BUCKETS - 1)]; e; e = e->next)
    if (e->hash == h && e->len == n && memcmp(e->path, rel, n) == 0)
      return e->dev == dev && e->ino == ino ? e->bits : -1;
  return -1;
}

bool http_sib_watch(int dirfd, const char *rel, size_t n) {
  if (n > HTTP_SIB_PATH_MAX) return false;
  sib_tls_t *t = sib__tls(true);
  if (!t || t->refused) return false;
  if (t->ifd >= 0 && t->wd_max >= HTTP_SIB_DIRS) sib__close(t);
  if (t->ifd < 0 && (t->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0) {
    if (errno == ENOSYS || errno == EINVAL) t->refused = true;
    t->ifd = -1;
    return false;
  }
  /* the folder as the file's open found it: rel's folder under dirfd */
  size_t dl = n;
  while (dl && rel[dl - 1] != '/') dl--;
  char path[64 + HTTP_SIB_PATH_MAX];
  snprintf(path, sizeof(path), "/proc/self/fd/%d/%.*s", dirfd, (int)dl, rel);
  int wd = inotify_add_watch(t->ifd, path, SIB_MASK);
  if (wd < 0) return false; /* ENOSPC (the user's watches), no /proc... */
  if (wd > t->wd_max) t->wd_max = wd;
  return true;
}

void http_sib_put(const char *rel, size_t n, uint64_t dev, uint64_t ino,
                  unsigned bits) {
  sib_tls_t *t = sib__tls(false);
  if (!t || t->ifd < 0 || n > HTTP_SIB_PATH_MAX) return;
  if (!t->b && !(t->b = calloc(SIB_BUCKETS, sizeof(*t->b)))) return;
  uint32_t h = sib__hash(rel, n);
  sib_ent_t **head = &t->b[h & (SIB_BUCKETS - 1)];
  for (sib_ent_t *e = *head; e; e = e->next)
    if (e->hash == h && e->len == n && memcmp(e->path, rel, n) == 0) {
      e->dev = dev, e->ino = ino, e->bits = (uint8_t)bits;
      return;
    }
  if (t->count >= HTTP_SIB_MAX) {
    sib__forget(t);
    head = &t->b[h & (SIB_BUCKETS - 1)];
  }
  sib_ent_t *e = malloc(sizeof(*e) + n);
  if (!e) return;
  e->dev = dev, e->ino = ino, e->hash = h;
  e->bits = (uint8_t)bits;
  e->len = (uint8_t)n;
  memcpy(e->path, rel, n);
  e->next = *head;
  *head = e;
  t->count++;
}

size_t http_sib_count(void) {
  sib_tls_t *t = sib__tls(false);
  return t ? t->count : 0;
}
