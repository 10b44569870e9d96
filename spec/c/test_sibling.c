/* SPDX-License-Identifier: MIT */

/* Unit test: the per-thread memory of precompressed siblings (sibling.h)
 * on a real folder: what is remembered, what forgets it (a change in a
 * watched folder, another file at the path) and its bounds (files,
 * folders, path length). */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "http/sibling.h"
#include "check.h"

static char root[64];
static int rootfd;

static void touch(const char *rel) {
  char p[512];
  snprintf(p, sizeof(p), "%s/%s", root, rel);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
}

static void mkdir_in(const char *rel) {
  char p[512];
  snprintf(p, sizeof(p), "%s/%s", root, rel);
  CHECK(mkdir(p, 0755) == 0);
}

/* Watches rel's folder and remembers bits for it, as public.c does. */
static bool learn(const char *rel, uint64_t ino, unsigned bits) {
  size_t n = strlen(rel);
  if (!http_sib_watch(rootfd, rel, n)) return false;
  http_sib_put(rel, n, 1, ino, bits);
  return true;
}

static int get(const char *rel, uint64_t ino) {
  return http_sib_get(rel, strlen(rel), 1, ino);
}

static void test_remember(void) {
  CHECK_EQ(get("a.txt", 7), -1); /* nothing yet */
  CHECK(learn("a.txt", 7, 0));
  CHECK(learn("sub/b.txt", 8, HTTP_SIB_GZ | HTTP_SIB_BR));
  CHECK_EQ(get("a.txt", 7), 0);
  CHECK_EQ(get("sub/b.txt", 8), HTTP_SIB_GZ | HTTP_SIB_BR);
  CHECK_EQ(get("a.txt", 9), -1);  /* another file at the path */
  CHECK_EQ(get("a.txtx", 7), -1); /* another path */
  CHECK_EQ(get("a.tx", 7), -1);
  CHECK_EQ(http_sib_count(), 2);
  http_sib_put("a.txt", 5, 1, 9, HTTP_SIB_BR); /* the path's new file */
  CHECK_EQ(get("a.txt", 9), HTTP_SIB_BR);
  CHECK_EQ(http_sib_count(), 2);
}

static void test_forget(void) {
  /* a file made in a watched folder forgets every file */
  CHECK_EQ(get("a.txt", 9), HTTP_SIB_BR);
  touch("a.txt.gz");
  CHECK_EQ(get("a.txt", 9), -1);
  CHECK_EQ(get("sub/b.txt", 8), -1);
  CHECK_EQ(http_sib_count(), 0);
  /* removed, in the subfolder */
  CHECK(learn("sub/b.txt", 8, 0));
  CHECK_EQ(get("sub/b.txt", 8), 0);
  touch("sub/b.txt.br");
  CHECK_EQ(get("sub/b.txt", 8), -1);
  CHECK(learn("sub/b.txt", 8, HTTP_SIB_BR));
  char p[512];
  snprintf(p, sizeof(p), "%s/sub/b.txt.br", root);
  CHECK(unlink(p) == 0);
  CHECK_EQ(get("sub/b.txt", 8), -1);
  /* a change in a folder nothing remembered is watched in: kept */
  CHECK(learn("sub/b.txt", 8, 0));
  touch("other/x");
  CHECK_EQ(get("sub/b.txt", 8), 0);
  /* the folder itself renamed away */
  char q[512];
  snprintf(p, sizeof(p), "%s/sub", root);
  snprintf(q, sizeof(q), "%s/sub.old", root);
  CHECK(rename(p, q) == 0);
  CHECK_EQ(get("sub/b.txt", 8), -1);
}

/* The inotify watches this process holds (the kernel's count). */
static int watches(void) {
  int n = 0;
  DIR *d = opendir("/proc/self/fdinfo");
  if (!d) return -1;
  struct dirent *de;
  while ((de = readdir(d))) {
    char p[300], line[512];
    snprintf(p, sizeof(p), "/proc/self/fdinfo/%s", de->d_name);
    FILE *f = fopen(p, "r");
    if (!f) continue;
    while (fgets(line, sizeof(line), f))
      if (strncmp(line, "inotify wd:", 11) == 0) n++;
    fclose(f);
  }
  closedir(d);
  return n;
}

static void test_bounds(void) {
  /* a path too long is not remembered (and not watched) */
  char longp[HTTP_SIB_PATH_MAX + 2];
  memset(longp, 'x', sizeof(longp) - 1);
  longp[sizeof(longp) - 1] = 0;
  CHECK(!http_sib_watch(rootfd, longp, strlen(longp)));
  /* a folder that is not there can't be watched */
  CHECK(!http_sib_watch(rootfd, "nothere/a", 9));
  /* past HTTP_SIB_MAX files everything is forgotten first */
  char rel[32];
  CHECK(http_sib_watch(rootfd, "f", 1));
  for (int i = 0; i < HTTP_SIB_MAX + 10; i++) {
    int n = snprintf(rel, sizeof(rel), "f%d", i);
    http_sib_put(rel, (size_t)n, 1, (uint64_t)i, 0);
    CHECK(http_sib_count() <= HTTP_SIB_MAX);
  }
  CHECK_EQ(http_sib_count(), 10);
  CHECK_EQ(get("f0", 0), -1);
  CHECK_EQ(get(rel, HTTP_SIB_MAX + 9), 0);
  /* past HTTP_SIB_DIRS folders the watch is made anew (forgetting
   * everything), and what is watched from then on is still seen */
  for (int i = 0; i < HTTP_SIB_DIRS + 5; i++) {
    snprintf(rel, sizeof(rel), "d%d", i);
    mkdir_in(rel);
    snprintf(rel, sizeof(rel), "d%d/f", i);
    CHECK(learn(rel, 1, 0));
  }
  CHECK(watches() <= HTTP_SIB_DIRS);
  CHECK(watches() >= 5);
  CHECK_EQ(get(rel, 1), 0);
  snprintf(rel, sizeof(rel), "d%d/f.gz", HTTP_SIB_DIRS + 4);
  touch(rel);
  snprintf(rel, sizeof(rel), "d%d/f", HTTP_SIB_DIRS + 4);
  CHECK_EQ(get(rel, 1), -1);
}

int main(void) {
  snprintf(root, sizeof(root), "/tmp/mp-test-sibling-XXXXXX");
  if (!mkdtemp(root)) return 1;
  rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  mkdir_in("sub");
  mkdir_in("other");
  test_remember();
  test_forget();
  test_bounds();
  close(rootfd);
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
  if (system(cmd) != 0) CHECK(0);
  return check_summary();
}
