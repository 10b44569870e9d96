/* SPDX-License-Identifier: MIT */

/* test_shdict: the shared dictionary's store: values, TTL, LRU eviction,
 * the buddy allocator giving every byte back, limits, threads and
 * processes at once, a process killed holding a shard's lock, and damage. */
#include <errno.h>
#include <stdint.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "core/shdict.h"

static shd_value_t str(const char *s) {
  return (shd_value_t){.type = SHD_STR, .s = s, .len = strlen(s)};
}

static int set(shdict_t *d, const char *k, shd_value_t v, double ttl) {
  bool f;
  return shdict_store(d, SHD_SET, k, strlen(k), &v, ttl, &f);
}

/* The string at k, into buf ("" if missing or not a string). */
static const char *get_s(shdict_t *d, const char *k, char *buf, size_t cap) {
  shd_value_t v;
  int rc = shdict_get(d, k, strlen(k), false, &v, buf, cap - 1, NULL);
  if (rc || v.type != SHD_STR || !v.s) return "";
  buf[v.len] = 0;
  return buf;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static void test_values(void) {
  shdict_t *d = shdict_new("values", 1 << 20);
  CHECK(d != NULL);
  CHECK(shdict_capacity(d) > (900u << 10));
  CHECK_EQ(shdict_free_space(d), shdict_capacity(d));
  char buf[64];
  CHECK_EQ(set(d, "a", str("hello"), 0), 0);
  CHECK(strcmp(get_s(d, "a", buf, sizeof(buf)), "hello") == 0);
  shd_value_t v = {.type = SHD_NUM, .num = 2.5, .flags = 7};
  CHECK_EQ(set(d, "n", v, 0), 0);
  shd_value_t out;
  CHECK_EQ(shdict_get(d, "n", 1, false, &out, buf, sizeof(buf), NULL), 0);
  CHECK_EQ(out.type, SHD_NUM);
  CHECK(out.num == 2.5);
  CHECK_EQ(out.flags, 7);
  CHECK_EQ(set(d, "b", (shd_value_t){.type = SHD_BOOL, .num = 1}, 0), 0);
  CHECK_EQ(shdict_get(d, "b", 1, false, &out, buf, sizeof(buf), NULL), 0);
  CHECK_EQ(out.type, SHD_BOOL);
  CHECK(out.num == 1);
  /* A string longer than the buffer: its length, to retry with. */
  CHECK_EQ(shdict_get(d, "a", 1, false, &out, buf, 3, NULL), 0);
  CHECK(out.s == NULL);
  CHECK_EQ(out.len, 5);
  /* Overwrite in place and with a bigger block. */
  CHECK_EQ(set(d, "a", str("bye"), 0), 0);
  CHECK(strcmp(get_s(d, "a", buf, sizeof(buf)), "bye") == 0);
  char big[500];
  memset(big, 'x', sizeof(big) - 1);
  big[sizeof(big) - 1] = 0;
  CHECK_EQ(set(d, "a", str(big), 0), 0);
  char bbuf[600];
  CHECK_EQ(strlen(get_s(d, "a", bbuf, sizeof(bbuf))), 499);
  /* add / replace / delete */
  bool f;
  shd_value_t one = str("1");
  CHECK_EQ(shdict_store(d, SHD_ADD, "a", 1, &one, 0, &f), -EEXIST);
  CHECK_EQ(shdict_store(d, SHD_REPLACE, "zz", 2, &one, 0, &f), -ENOENT);
  CHECK_EQ(shdict_store(d, SHD_ADD, "zz", 2, &one, 0, &f), 0);
  CHECK_EQ(shdict_store(d, SHD_REPLACE, "zz", 2, &v, 0, &f), 0);
  CHECK_EQ(shdict_delete(d, "zz", 2), 0);
  CHECK_EQ(shdict_get(d, "zz", 2, false, &out, buf, sizeof(buf), NULL), -ENOENT);
  CHECK_EQ(shdict_delete(d, "zz", 2), 0);
  shd_value_t nil = {.type = SHD_NIL};
  CHECK_EQ(shdict_store(d, SHD_SET, "a", 1, &nil, 0, &f), 0);
  CHECK_EQ(shdict_get(d, "a", 1, false, &out, buf, sizeof(buf), NULL), -ENOENT);
  /* incr */
  double x;
  CHECK_EQ(shdict_incr(d, "c", 1, 1, NULL, 0, &x, &f), -ENOENT);
  double init = 10;
  CHECK_EQ(shdict_incr(d, "c", 1, 1, &init, 0, &x, &f), 0);
  CHECK(x == 11);
  CHECK_EQ(shdict_incr(d, "c", 1, -3, &init, 0, &x, &f), 0);
  CHECK(x == 8);
  CHECK_EQ(set(d, "s", str("abc"), 0), 0);
  CHECK_EQ(shdict_incr(d, "s", 1, 1, &init, 0, &x, &f), -EINVAL);
  /* keys */
  size_t n;
  char *keys = shdict_keys(d, 0, &n);
  CHECK_EQ(n, 4); /* n, b, c, s */
  free(keys);
  keys = shdict_keys(d, 2, &n);
  CHECK_EQ(n, 2);
  free(keys);
  shdict_flush_all(d);
  CHECK_EQ(shdict_free_space(d), shdict_capacity(d));
  keys = shdict_keys(d, 0, &n);
  CHECK_EQ(n, 0);
  free(keys);
  shdict_free(d);
}

static void test_limits(void) {
  CHECK(shdict_new("small", 1024) == NULL);
  CHECK(shdict_new("", 1 << 20) == NULL);
  CHECK(shdict_new("a-name-that-is-far-too-long-for-a-dictionary-name-to-have-0123456789", 1 << 20) == NULL);
  shdict_t *d = shdict_new("limits", 64 << 10);
  char k[SHDICT_MAX_KEY + 2];
  memset(k, 'k', sizeof(k));
  bool f;
  shd_value_t v = str("v");
  CHECK_EQ(shdict_store(d, SHD_SET, k, SHDICT_MAX_KEY + 1, &v, 0, &f),
           -ENAMETOOLONG);
  CHECK_EQ(shdict_store(d, SHD_SET, k, SHDICT_MAX_KEY, &v, 0, &f), 0);
  CHECK_EQ(shdict_store(d, SHD_SET, k, 0, &v, 0, &f), -EINVAL);
  size_t max = shdict_max_item(d);
  CHECK(max > 16 << 10 && max < 64 << 10);
  char *big = malloc(max + 1);
  memset(big, 'v', max + 1);
  shd_value_t bv = {.type = SHD_STR, .s = big, .len = max - 1};
  CHECK_EQ(shdict_store(d, SHD_SET, "k", 1, &bv, 0, &f), 0); /* exactly */
  bv.len = max;
  CHECK_EQ(shdict_store(d, SHD_SET, "k", 1, &bv, 0, &f), -E2BIG);
  free(big);
  shdict_free(d);
}

static void test_ttl(void) {
  shdict_t *d = shdict_new("ttl", 64 << 10);
  char buf[32];
  CHECK_EQ(set(d, "t", str("soon"), 0.05), 0);
  CHECK_EQ(set(d, "p", str("kept"), 0), 0);
  double left;
  CHECK_EQ(shdict_ttl(d, "t", 1, &left), 0);
  CHECK(left > 0 && left <= 0.05);
  CHECK_EQ(shdict_ttl(d, "p", 1, &left), 0);
  CHECK(left == 0);
  CHECK(strcmp(get_s(d, "t", buf, sizeof(buf)), "soon") == 0);
  sleep_ms(80);
  shd_value_t v;
  CHECK_EQ(shdict_get(d, "t", 1, false, &v, buf, sizeof(buf), NULL), -ENOENT);
  bool old = false;
  CHECK_EQ(shdict_get(d, "t", 1, true, &v, buf, sizeof(buf), &old), 0);
  CHECK(old);
  CHECK_EQ(shdict_ttl(d, "t", 1, &left), -ENOENT);
  CHECK_EQ(shdict_expire(d, "t", 1, 10), -ENOENT);
  /* add over an expired item works; incr with init too */
  bool f;
  shd_value_t x = str("again");
  CHECK_EQ(shdict_store(d, SHD_ADD, "t", 1, &x, 0, &f), 0);
  CHECK_EQ(shdict_expire(d, "p", 1, 0.03), 0);
  sleep_ms(50);
  CHECK_EQ(shdict_get(d, "p", 1, false, &v, buf, sizeof(buf), NULL), -ENOENT);
  CHECK_EQ(set(d, "e1", str("x"), 0.01), 0);
  CHECK_EQ(set(d, "e2", str("x"), 0.01), 0);
  sleep_ms(30);
  /* e1 and e2 (p went when e1 was set: a store frees expired items at
   * the LRU tail first). */
  CHECK_EQ(shdict_flush_expired(d, 0), 2);
  CHECK_EQ(shdict_get(d, "p", 1, true, &v, buf, sizeof(buf), &old), -ENOENT);
  CHECK_EQ(shdict_get(d, "e1", 2, true, &v, buf, sizeof(buf), &old), -ENOENT);
  CHECK(strcmp(get_s(d, "t", buf, sizeof(buf)), "again") == 0);
  shdict_free(d);
}

static void test_lru(void) {
  shdict_t *d = shdict_new("lru", 8 << 10); /* one shard */
  char k[16], buf[300], val[200];
  memset(val, 'v', sizeof(val) - 1);
  val[sizeof(val) - 1] = 0;
  bool f = false;
  int i = 0;
  shd_value_t v = str(val);
  for (; !f && i < 1000; i++) {
    snprintf(k, sizeof(k), "k%d", i);
    CHECK_EQ(shdict_store(d, SHD_SET, k, strlen(k), &v, 0, &f), 0);
    if (i == 2) get_s(d, "k0", buf, sizeof(buf)); /* k0 is used again */
  }
  CHECK(f);
  CHECK(i > 5 && i < 100);
  /* k1 was the least recently used; k0 was read after k1 was written. */
  CHECK(strcmp(get_s(d, "k1", buf, sizeof(buf)), "") == 0);
  CHECK(strcmp(get_s(d, "k0", buf, sizeof(buf)), val) == 0);
  snprintf(k, sizeof(k), "k%d", i - 1);
  CHECK(strcmp(get_s(d, k, buf, sizeof(buf)), val) == 0);
  /* One item bigger than the whole shard can't be had. */
  size_t max = shdict_max_item(d);
  char *big = calloc(1, max);
  memset(big, 'b', max - 10);
  shd_value_t bv = str(big);
  int rc = shdict_store(d, SHD_SET, "big", 3, &bv, 0, &f);
  CHECK(rc == 0 || rc == -ENOMEM); /* the arena's top block may be smaller */
  free(big);
  shdict_free(d);
}

/* Random sets and deletes against a model; then everything deleted gives
 * every byte back (the buddies merged again). */
static void test_random(void) {
  shdict_t *d = shdict_new("random", 256 << 10);
  enum { N = 200 };
  static int model[N]; /* length of k<i>'s value, -1: absent */
  for (int i = 0; i < N; i++) model[i] = -1;
  static char val[3000], buf[3100];
  memset(val, 'r', sizeof(val));
  unsigned seed = 1;
  int evicted = 0;
  for (int step = 0; step < 20000; step++) {
    seed = seed * 1103515245u + 12345u;
    int i = (int)((seed >> 8) % N);
    char k[16];
    snprintf(k, sizeof(k), "k%d", i);
    bool f = false;
    if ((seed >> 20) % 4 == 0) {
      shdict_delete(d, k, strlen(k));
      model[i] = -1;
      continue;
    }
    int len = (int)((seed >> 4) % 2500);
    shd_value_t v = {.type = SHD_STR, .s = val, .len = (size_t)len};
    CHECK_EQ(shdict_store(d, SHD_SET, k, strlen(k), &v, 0, &f), 0);
    model[i] = len;
    if (f) evicted++;
    shd_value_t out;
    CHECK_EQ(shdict_get(d, k, strlen(k), false, &out, buf, sizeof(buf), NULL), 0);
    CHECK_EQ(out.len, len);
  }
  CHECK(evicted > 0);
  int found = 0;
  for (int i = 0; i < N; i++) {
    char k[16];
    snprintf(k, sizeof(k), "k%d", i);
    shd_value_t out;
    int rc = shdict_get(d, k, strlen(k), false, &out, buf, sizeof(buf), NULL);
    if (rc == 0) {
      found++;
      if ((int)out.len != model[i]) CHECK_EQ(out.len, model[i]);
    } else if (model[i] >= 0 && rc != -ENOENT) {
      CHECK_EQ(rc, -ENOENT);
    }
    shdict_delete(d, k, strlen(k));
  }
  CHECK(found > 20);
  CHECK_EQ(shdict_free_space(d), shdict_capacity(d));
  CHECK_EQ(shdict_repairs(d), 0);
  shdict_free(d);
}

typedef struct {
  shdict_t *d;
  int n;
} incr_arg_t;

static void *incr_thread(void *arg) {
  incr_arg_t *a = arg;
  double init = 0, x;
  bool f;
  char k[16];
  for (int i = 0; i < a->n; i++) {
    shdict_incr(a->d, "hits", 4, 1, &init, 0, &x, &f);
    snprintf(k, sizeof(k), "t%d", i % 50);
    shdict_incr(a->d, k, strlen(k), 1, &init, 0, &x, &f);
  }
  return NULL;
}

/* Threads and processes adding to the same counters. */
static void test_concurrent(void) {
  shdict_t *d = shdict_new("conc", 1 << 20);
  enum { T = 4, N = 20000 };
  pid_t kid = fork();
  if (kid == 0) {
    incr_arg_t a = {d, N};
    incr_thread(&a);
    _exit(0);
  }
  pthread_t th[T];
  incr_arg_t a = {d, N};
  for (int i = 0; i < T; i++) pthread_create(&th[i], NULL, incr_thread, &a);
  for (int i = 0; i < T; i++) pthread_join(th[i], NULL);
  int st;
  waitpid(kid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  shd_value_t v;
  char buf[8];
  CHECK_EQ(shdict_get(d, "hits", 4, false, &v, buf, sizeof(buf), NULL), 0);
  CHECK_EQ((long)v.num, (long)(T + 1) * N);
  CHECK_EQ(shdict_get(d, "t7", 2, false, &v, buf, sizeof(buf), NULL), 0);
  CHECK_EQ((long)v.num, (long)(T + 1) * N / 50);
  shdict_free(d);
}

/* Readers (which take no lock unless they must) while writers set values
 * of changing lengths, delete and evict, so blocks keep being reused for
 * other keys: every value read must be whole, one writer's bytes. */
typedef struct {
  shdict_t *d;
  int writer;
  int n;
  long bad, hits;
} rw_arg_t;

static char rw_byte(int key, size_t len) { return (char)('a' + (key + len) % 26); }

static void *rw_thread(void *arg) {
  rw_arg_t *a = arg;
  char val[700], buf[700], k[16];
  unsigned seed = (unsigned)a->writer * 7919u + 1;
  for (int i = 0; i < a->n; i++) {
    seed = seed * 1103515245u + 12345u;
    int key = (int)((seed >> 8) % 300);
    snprintf(k, sizeof(k), "rw%d", key);
    if (a->writer) {
      size_t len = (seed >> 4) % 600;
      if ((seed >> 20) % 8 == 0) {
        shdict_delete(a->d, k, strlen(k));
        continue;
      }
      memset(val, rw_byte(key, len), len);
      shd_value_t v = {.type = SHD_STR, .s = val, .len = len};
      bool f;
      shdict_store(a->d, SHD_SET, k, strlen(k), &v, 0, &f);
    } else {
      shd_value_t v;
      if (shdict_get(a->d, k, strlen(k), false, &v, buf, sizeof(buf), NULL))
        continue;
      a->hits++;
      if (v.type != SHD_STR || !v.s || v.len >= 600) {
        a->bad++;
        continue;
      }
      for (size_t j = 0; j < v.len; j++)
        if (buf[j] != rw_byte(key, v.len)) {
          a->bad++;
          break;
        }
    }
  }
  return NULL;
}

static void test_readers_writers(void) {
  shdict_t *d = shdict_new("rw", 64 << 10); /* small: evictions all along */
  enum { W = 2, R = 2, N = 100000 };
  pid_t kid = fork();
  if (kid == 0) { /* a reader in another process too */
    rw_arg_t a = {d, 0, N, 0, 0};
    rw_thread(&a);
    _exit(a.bad ? 1 : 0);
  }
  pthread_t th[W + R];
  rw_arg_t a[W + R];
  for (int i = 0; i < W + R; i++) {
    a[i] = (rw_arg_t){d, i < W ? i + 1 : 0, N, 0, 0};
    pthread_create(&th[i], NULL, rw_thread, &a[i]);
  }
  long bad = 0, hits = 0;
  for (int i = 0; i < W + R; i++) {
    pthread_join(th[i], NULL);
    bad += a[i].bad;
    hits += a[i].hits;
  }
  int st;
  waitpid(kid, &st, 0);
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  CHECK_EQ(bad, 0);
  CHECK(hits > 1000);
  CHECK_EQ(shdict_repairs(d), 0);
  shdict_free(d);
}

/* A child takes a shard's lock and is killed with SIGKILL while holding
 * it: the parent gets the lock (EOWNERDEAD), and the shard is dropped only
 * if the child was changing it. Other shards keep their items. */
static void test_dead_owner(bool writing) {
  shdict_t *d = shdict_new("robust", 1 << 20);
  char buf[32];
  const char *k1 = "victim";
  char k2[16];
  for (int i = 0;; i++) { /* a key in another shard */
    snprintf(k2, sizeof(k2), "other%d", i);
    if (shdict__shard(d, k2, strlen(k2)) != shdict__shard(d, k1, strlen(k1)))
      break;
  }
  CHECK_EQ(set(d, k1, str("v1"), 0), 0);
  CHECK_EQ(set(d, k2, str("v2"), 0), 0);
  int p[2];
  CHECK_EQ(pipe(p), 0);
  pid_t kid = fork();
  if (kid == 0) {
    shdict__hold(d, k1, strlen(k1), writing);
    char c = 'x';
    if (write(p[1], &c, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char c;
  CHECK_EQ(read(p[0], &c, 1), 1);
  /* The other shard is not locked. */
  CHECK(strcmp(get_s(d, k2, buf, sizeof(buf)), "v2") == 0);
  kill(kid, SIGKILL);
  int st;
  waitpid(kid, &st, 0);
  CHECK(WIFSIGNALED(st));
  CHECK(strcmp(get_s(d, k1, buf, sizeof(buf)), writing ? "" : "v1") == 0);
  CHECK_EQ(shdict_repairs(d), 1);
  CHECK_EQ(set(d, k1, str("again"), 0), 0);
  CHECK(strcmp(get_s(d, k1, buf, sizeof(buf)), "again") == 0);
  CHECK(strcmp(get_s(d, k2, buf, sizeof(buf)), "v2") == 0);
  close(p[0]);
  close(p[1]);
  shdict_free(d);
}

/* Children setting in a tight loop, killed at random moments: the
 * dictionary keeps working. */
static void test_kill_loop(void) {
  shdict_t *d = shdict_new("killed", 256 << 10);
  for (int round = 0; round < 20; round++) {
    pid_t kid = fork();
    if (kid == 0) {
      char k[16], v[100];
      memset(v, 'w', sizeof(v));
      for (unsigned i = 0;; i++) {
        snprintf(k, sizeof(k), "w%u", i % 3000);
        shd_value_t x = {.type = SHD_STR, .s = v, .len = i % 100};
        bool f;
        shdict_store(d, SHD_SET, k, strlen(k), &x, 0, &f);
      }
    }
    sleep_ms(2 + round % 5);
    kill(kid, SIGKILL);
    waitpid(kid, NULL, 0);
    char buf[16];
    CHECK_EQ(set(d, "alive", str("yes"), 0), 0);
    CHECK(strcmp(get_s(d, "alive", buf, sizeof(buf)), "yes") == 0);
  }
  shdict_flush_all(d);
  CHECK_EQ(shdict_free_space(d), shdict_capacity(d));
  shdict_free(d);
}

/* Garbage over every shard's state: calls return errors or work, never
 * fault, and the dictionary is usable afterwards. */
static void test_damage(void) {
  for (uint32_t seed = 1; seed <= 20; seed++) {
    shdict_t *d = shdict_new("damaged", 64 << 10);
    for (int i = 0; i < 50; i++) {
      char k[16];
      snprintf(k, sizeof(k), "d%d", i);
      set(d, k, str("some value"), 0);
    }
    shdict__damage(d, seed);
    int errs = 0;
    for (int i = 0; i < 200; i++) {
      char k[16], buf[64];
      snprintf(k, sizeof(k), "d%d", i % 60);
      shd_value_t v;
      bool f;
      double x, init = 0;
      int rc = shdict_get(d, k, strlen(k), true, &v, buf, sizeof(buf), NULL);
      errs += rc == -EIO;
      rc = set(d, k, str("new"), i % 2 ? 0 : 10);
      errs += rc == -EIO;
      errs += shdict_incr(d, k, strlen(k), 1, &init, 0, &x, &f) == -EIO;
      size_t n;
      free(shdict_keys(d, 0, &n));
      shdict_flush_expired(d, 0);
    }
    CHECK(errs > 0);
    CHECK(shdict_repairs(d) > 0);
    char buf[16];
    CHECK_EQ(set(d, "fine", str("yes"), 0), 0);
    CHECK(strcmp(get_s(d, "fine", buf, sizeof(buf)), "yes") == 0);
    shdict_flush_all(d);
    CHECK_EQ(shdict_free_space(d), shdict_capacity(d));
    shdict_free(d);
  }
}

/* Keys chosen to collide: each 16-byte block comes in two versions that
 * differ in bit 63 of the first word and bits 63 and 32 of the second, a
 * difference a multiply-xorshift hash carries through and then cancels
 * whatever its seed, so 2^10 keys of 160 bytes shared one hash (and one
 * shard, one bucket). Under a keyed PRF they spread over the shards like
 * any keys, and every one is stored and found. */
static void test_collisions(void) {
  shdict_t *d = shdict_new("collide", 16u << 20); /* 64 shards */
  CHECK(d != NULL);
  if (!d) return;
  enum { BLOCKS = 10, KEYS = 1 << BLOCKS, LEN = 16 * BLOCKS };
  static unsigned seen[64];
  memset(seen, 0, sizeof(seen));
  unsigned shards = 0, found = 0;
  for (unsigned k = 0; k < KEYS; k++) {
    char key[LEN];
    for (int b = 0; b < BLOCKS; b++) {
      uint64_t w[2] = {0x6b65792d626c6f63ull + (uint64_t)b,
                       0x2d6d6f6f6e706f72ull};
      if (k >> b & 1) {
        w[0] ^= 1ull << 63;
        w[1] ^= 1ull << 63 | 1ull << 32;
      }
      memcpy(key + 16 * b, w, 16);
    }
    uint32_t sh = shdict__shard(d, key, LEN);
    if (sh < 64 && seen[sh]++ == 0) shards++;
    shd_value_t v = {.type = SHD_NUM, .num = k};
    bool f;
    CHECK_EQ(shdict_store(d, SHD_SET, key, LEN, &v, 0, &f), 0);
  }
  for (unsigned k = 0; k < KEYS; k++) {
    char key[LEN];
    for (int b = 0; b < BLOCKS; b++) {
      uint64_t w[2] = {0x6b65792d626c6f63ull + (uint64_t)b,
                       0x2d6d6f6f6e706f72ull};
      if (k >> b & 1) {
        w[0] ^= 1ull << 63;
        w[1] ^= 1ull << 63 | 1ull << 32;
      }
      memcpy(key + 16 * b, w, 16);
    }
    shd_value_t v;
    if (shdict_get(d, key, LEN, false, &v, NULL, 0, NULL) == 0 &&
        v.type == SHD_NUM && v.num == k)
      found++;
  }
  printf("  %u crafted keys: %u of 64 shards, %u found\n", KEYS, shards, found);
  CHECK(shards >= 32);
  CHECK_EQ(found, KEYS);
  shdict_free(d);
}

/* GCRA (mp.limit): burst + 1 pass at one instant, exactly, with four
 * threads deciding at once (rejections take the lock-free read, passes
 * the lock); a rejection's wait is exact to the microsecond; a key
 * holding a string is refused. */
typedef struct {
  shdict_t *d;
  double now;
  int passed;
} gcra_arg_t;

static void *gcra_thread(void *p) {
  gcra_arg_t *a = p;
  for (int i = 0; i < 5000; i++) {
    double wait;
    bool f;
    int rc = shdict_gcra(a->d, "g", 1, a->now, 1000, 49 * 1000.0, 1, &wait, &f);
    if (rc == 1) a->passed++;
  }
  return NULL;
}

static void test_gcra(void) {
  shdict_t *d = shdict_new("gcra", 1 << 20);
  CHECK(d != NULL);
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  double now = (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
  gcra_arg_t a[4];
  pthread_t t[4];
  for (int i = 0; i < 4; i++) {
    a[i] = (gcra_arg_t){d, now, 0};
    CHECK(pthread_create(&t[i], NULL, gcra_thread, &a[i]) == 0);
  }
  int passed = 0;
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    passed += a[i].passed;
  }
  CHECK(passed == 50);
  double wait;
  bool f;
  CHECK(shdict_gcra(d, "g", 1, now, 1000, 49000, 1, &wait, &f) == 0);
  CHECK(wait > 999 && wait < 1001);
  CHECK(shdict_gcra(d, "g", 1, now + wait - 1, 1000, 49000, 1, &wait, &f) == 0);
  CHECK(shdict_gcra(d, "g", 1, now + 1000, 1000, 49000, 1, &wait, &f) == 1);
  CHECK(shdict_gcra(d, "g", 1, now + 1000, 1000, 49000, 1, &wait, &f) == 0);
  /* n units at once, and the clock read inside (now < 0) */
  CHECK(shdict_gcra(d, "h", 1, -1, 1000, 4000, 5, &wait, &f) == 1);
  CHECK(shdict_gcra(d, "h", 1, -1, 1000, 4000, 1, &wait, &f) == 0);
  CHECK(set(d, "s", str("x"), 0) == 0);
  CHECK(shdict_gcra(d, "s", 1, now, 1000, 0, 1, &wait, &f) == -EINVAL);
  shdict_free(d);
}

int main(void) {
  test_values();
  test_limits();
  test_ttl();
  test_lru();
  test_random();
  test_concurrent();
  test_readers_writers();
  test_dead_owner(true);
  test_dead_owner(false);
  test_kill_loop();
  test_damage();
  test_collisions();
  test_gcra();
  return check_summary();
}
