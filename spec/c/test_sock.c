/* SPDX-License-Identifier: MIT */

/* Unit tests for src/net/sock.h: the uuid table and the write queue.
 * Own main(); checks from check.h. */
#include "net/sock.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- check macros (main thread only) ---- */

#include "check.h"


static bool fd_is_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

/* ---- uuids ---- */

static void test_uuid_zero_and_capacity(void) {
  CHECK(sock_capacity() >= 64);
  CHECK(sock_capacity() <= ((size_t)1 << SOCK_FD_BITS));
  CHECK(!sock_uuid_valid(0));
  CHECK_EQ(sock_uuid_owner(0), -1);
  CHECK(sock_uuid_udata(0, 0) == NULL);
  sock_uuid_close(0); /* harmless */
  CHECK(!sock_uuid_valid(0));

  /* An fd beyond the table: no uuid. */
  int x;
  int cap = (int)sock_capacity();
  CHECK_EQ(sock_uuid_open(cap, 1, &x), 0);
  CHECK_EQ(sock_uuid_open(cap + 1000, 1, &x), 0);
  CHECK_EQ(sock_uuid_open(-1, 1, &x), 0);
  if (sock_capacity() < ((size_t)1 << SOCK_FD_BITS)) {
    /* A made-up uuid naming an fd beyond the table is not valid. */
    sock_uuid_t beyond = ((sock_uuid_t)1 << SOCK_FD_BITS) | (sock_uuid_t)cap;
    CHECK(!sock_uuid_valid(beyond));
    CHECK_EQ(sock_uuid_owner(beyond), -1);
    CHECK(sock_uuid_udata(beyond, 1) == NULL);
    sock_uuid_close(beyond); /* harmless */
  }
  /* The last fd of the table works. */
  sock_uuid_t last = sock_uuid_open(cap - 1, 2, &x);
  CHECK(last != 0);
  CHECK_EQ(sock_uuid_fd(last), cap - 1);
  CHECK(sock_uuid_valid(last));
  sock_uuid_close(last);
  CHECK(!sock_uuid_valid(last));
}

static void test_uuid_lifecycle(void) {
  int a = 1, b = 2;
  int p[2];
  CHECK_EQ(pipe(p), 0);
  int fd = p[0];

  sock_uuid_t u1 = sock_uuid_open(fd, 3, &a);
  CHECK(u1 != 0);
  CHECK_EQ(sock_uuid_fd(u1), fd);
  CHECK(sock_uuid_valid(u1));
  CHECK_EQ(sock_uuid_owner(u1), 3);
  CHECK(sock_uuid_udata(u1, 3) == &a);
  CHECK(sock_uuid_udata(u1, 4) == NULL); /* another owner sees nothing */
  CHECK(sock_uuid_udata(u1, -1) == NULL);
  CHECK((u1 >> SOCK_FD_BITS) != 0); /* a generation, also for small fds */

  /* Close: the generation moves on and the uuid is dead at once. */
  sock_uuid_close(u1);
  CHECK(!sock_uuid_valid(u1));
  CHECK_EQ(sock_uuid_owner(u1), -1);
  CHECK(sock_uuid_udata(u1, 3) == NULL);
  close(p[0]);
  close(p[1]);

  /* The kernel hands out the same fd number again. */
  int q[2];
  CHECK_EQ(pipe(q), 0);
  CHECK_EQ(q[0], fd);
  sock_uuid_t u2 = sock_uuid_open(q[0], 5, &b);
  CHECK(u2 != 0);
  CHECK(u2 != u1);
  CHECK_EQ(sock_uuid_fd(u2), fd);
  CHECK(!sock_uuid_valid(u1)); /* the old handle stays dead */
  CHECK(sock_uuid_valid(u2));
  CHECK_EQ(sock_uuid_owner(u1), -1);
  CHECK_EQ(sock_uuid_owner(u2), 5);
  CHECK(sock_uuid_udata(u1, 5) == NULL); /* the old handle can't reach b */
  CHECK(sock_uuid_udata(u1, 3) == NULL);
  CHECK(sock_uuid_udata(u2, 5) == &b);
  CHECK(sock_uuid_udata(u2, 3) == NULL);

  /* Closing a stale uuid leaves the new connection alone. */
  sock_uuid_close(u1);
  CHECK(sock_uuid_valid(u2));
  CHECK_EQ(sock_uuid_owner(u2), 5);
  CHECK(sock_uuid_udata(u2, 5) == &b);

  /* Opening the fd again without a close also bumps the generation. */
  sock_uuid_t u3 = sock_uuid_open(q[0], 6, NULL);
  CHECK(u3 != u2 && u3 != u1 && u3 != 0);
  CHECK(!sock_uuid_valid(u2));
  CHECK(sock_uuid_valid(u3));
  CHECK_EQ(sock_uuid_owner(u3), 6);
  CHECK(sock_uuid_udata(u3, 6) == NULL); /* udata NULL is allowed */
  sock_uuid_close(u3);
  sock_uuid_close(u3); /* twice is harmless */
  CHECK(!sock_uuid_valid(u3));

  /* Many cycles on one fd: every uuid is new and only the newest lives. */
  sock_uuid_t prev = u3;
  bool all_new = true, old_dead = true, new_live = true;
  for (int i = 0; i < 1000; i++) {
    sock_uuid_t u = sock_uuid_open(q[0], 7, &a);
    all_new &= u != prev && u != 0;
    old_dead &= !sock_uuid_valid(prev);
    new_live &= sock_uuid_valid(u) && sock_uuid_owner(u) == 7;
    sock_uuid_close(u);
    old_dead &= !sock_uuid_valid(u);
    prev = u;
  }
  CHECK(all_new);
  CHECK(old_dead);
  CHECK(new_live);
  close(q[0]);
  close(q[1]);
}

/* fd 0 gets a generation too, so its uuid is never 0. */
static void test_uuid_fd_zero(void) {
  int x;
  sock_uuid_t u = sock_uuid_open(0, 1, &x);
  CHECK(u != 0);
  CHECK_EQ(sock_uuid_fd(u), 0);
  CHECK(sock_uuid_valid(u));
  CHECK(sock_uuid_udata(u, 1) == &x);
  sock_uuid_close(u);
  CHECK(!sock_uuid_valid(u));
  CHECK(!sock_uuid_valid(0));
}

/* One owner thread opens and closes while another thread reads owners:
 * the answer is the owner or -1, never anything else (and, under TSan, no
 * data race). */
#define RACE_FD 40
static _Atomic sock_uuid_t g_race_uuid;
static atomic_int g_race_stop;
static atomic_long g_race_reads;

static void *race_owner_thread(void *arg) {
  (void)arg;
  /* Keep going until the reader has overlapped for a while. */
  for (long i = 0; i < 20000 || atomic_load(&g_race_reads) < 20000; i++) {
    sock_uuid_t u = sock_uuid_open(RACE_FD, 9, &g_race_stop);
    atomic_store(&g_race_uuid, u);
    sock_uuid_close(u);
  }
  atomic_store(&g_race_stop, 1);
  return NULL;
}

static void test_uuid_threads(void) {
  atomic_store(&g_race_uuid, 0);
  atomic_store(&g_race_stop, 0);
  atomic_store(&g_race_reads, 0);
  pthread_t tid;
  CHECK_EQ(pthread_create(&tid, NULL, race_owner_thread, NULL), 0);
  long bad = 0, seen_valid = 0, reads = 0;
  while (!atomic_load(&g_race_stop)) {
    sock_uuid_t u = atomic_load(&g_race_uuid);
    int owner = sock_uuid_owner(u);
    if (owner != -1 && owner != 9) bad++;
    if (u && sock_uuid_valid(u)) seen_valid++;
    reads++;
    atomic_fetch_add_explicit(&g_race_reads, 1, memory_order_relaxed);
  }
  pthread_join(tid, NULL);
  CHECK_EQ(bad, 0);
  CHECK(reads >= 20000);
  CHECK(!sock_uuid_valid(atomic_load(&g_race_uuid)));
  (void)seen_valid; /* timing-dependent: not checked */
}

/* ---- the write queue ---- */

static int g_sp[2]; /* [0] written by the queue, [1] the peer that reads */

static void pair_open(void) {
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, g_sp))
    perror("socketpair");
}

static void pair_close(void) {
  close(g_sp[0]);
  close(g_sp[1]);
}

/* Reads everything the peer has right now. */
static size_t peer_read(char *buf, size_t cap) {
  size_t got = 0;
  while (got < cap) {
    ssize_t n = read(g_sp[1], buf + got, cap - got);
    if (n <= 0) break;
    got += (size_t)n;
  }
  return got;
}

struct release_log {
  int calls;
  void *ctx, *ctx2;
  int order; /* g_release_seq at the call */
};
static int g_release_seq;

static void release_cb(void *ctx, void *ctx2) {
  struct release_log *l = ctx;
  l->calls++;
  l->ctx = ctx;
  l->ctx2 = ctx2;
  l->order = ++g_release_seq;
}

/* A temp file holding `data`, opened for reading; the name is gone. */
static int temp_file(const void *data, size_t len) {
  char path[] = "/tmp/moonport-test-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  unlink(path);
  const char *p = data;
  size_t left = len;
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n <= 0) {
      close(fd);
      return -1;
    }
    p += n;
    left -= (size_t)n;
  }
  return fd;
}

static void test_wq_copy(void) {
  pair_open();
  sock_wq_t wq;
  sock_wq_init(&wq);
  CHECK(wq.head == NULL && wq.tail == NULL);
  CHECK_EQ(wq.bytes, 0);
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0); /* empty */

  /* Small copies share one packet. */
  CHECK_EQ(sock_wq_push_copy(&wq, "hello", 5), 0);
  sock_packet_t *first = wq.head;
  CHECK(first != NULL);
  CHECK_EQ(sock_wq_push_copy(&wq, ", ", 2), 0);
  CHECK_EQ(sock_wq_push_copy(&wq, "world", 5), 0);
  CHECK_EQ(sock_wq_push_copy(&wq, "ignored", 0), 0); /* no-op */
  CHECK(wq.head == first && wq.tail == first);
  CHECK_EQ(wq.bytes, 12);
  /* The copy is taken at push time. */
  char scratch[8] = "!!!";
  CHECK_EQ(sock_wq_push_copy(&wq, scratch, 1), 0);
  scratch[0] = 'X';
  CHECK(wq.tail == first);
  CHECK_EQ(wq.bytes, 13);

  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  CHECK(wq.head == NULL && wq.tail == NULL);
  CHECK_EQ(wq.bytes, 0);
  char buf[64] = {0};
  CHECK_EQ(peer_read(buf, sizeof(buf)), 13);
  CHECK(memcmp(buf, "hello, world!", 13) == 0);

  /* Many small copies (more than one shared buffer holds) keep order. */
  size_t total = 0;
  char line[32];
  int push_failures = 0;
  for (int i = 0; i < 2000; i++) {
    int n = snprintf(line, sizeof(line), "%d,", i);
    push_failures += sock_wq_push_copy(&wq, line, (size_t)n) != 0;
    total += (size_t)n;
  }
  CHECK_EQ(push_failures, 0);
  CHECK_EQ(wq.bytes, total);
  CHECK(wq.head != wq.tail); /* more than 4 KiB: several packets */
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  char *big = malloc(total + 1);
  CHECK_EQ(peer_read(big, total + 1), total);
  size_t pos = 0;
  bool same = true;
  for (int i = 0; i < 2000 && same; i++) {
    int n = snprintf(line, sizeof(line), "%d,", i);
    same = pos + (size_t)n <= total && memcmp(big + pos, line, (size_t)n) == 0;
    pos += (size_t)n;
  }
  CHECK(same);
  free(big);

  /* A copy larger than the largest pool class (16 KiB) gets its own
   * packet; a small one after it a new one. */
  enum { LARGE = 20000 };
  char *large = malloc(LARGE);
  memset(large, 'L', LARGE);
  CHECK_EQ(sock_wq_push_copy(&wq, "s", 1), 0);
  sock_packet_t *small = wq.tail;
  CHECK_EQ(sock_wq_push_copy(&wq, large, LARGE), 0);
  CHECK(wq.tail != small);
  sock_packet_t *lp = wq.tail;
  CHECK_EQ(sock_wq_push_copy(&wq, "e", 1), 0);
  CHECK(wq.tail != lp);
  CHECK_EQ(wq.bytes, LARGE + 2);
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  char *got = malloc(LARGE + 3);
  CHECK_EQ(peer_read(got, LARGE + 3), LARGE + 2);
  CHECK(got[0] == 's' && got[LARGE + 1] == 'e');
  same = true;
  for (int i = 1; i <= LARGE; i++) same &= got[i] == 'L';
  CHECK(same);
  free(got);
  free(large);
  sock_wq_clear(&wq);
  pair_close();
}

static void test_wq_ref(void) {
  pair_open();
  sock_wq_t wq;
  sock_wq_init(&wq);
  static const char ref[] = "REFERENCED";
  struct release_log l = {0};
  int tag;
  CHECK_EQ(sock_wq_push_copy(&wq, "<", 1), 0);
  CHECK_EQ(sock_wq_push_ref(&wq, ref, 10, release_cb, &l, &tag), 0);
  CHECK_EQ(sock_wq_push_copy(&wq, ">", 1), 0);
  CHECK(wq.head != wq.tail); /* the copy after a ref is a new packet */
  CHECK_EQ(wq.bytes, 12);
  CHECK_EQ(l.calls, 0); /* not before it is written */
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  CHECK_EQ(l.calls, 1);
  CHECK(l.ctx == &l);
  CHECK(l.ctx2 == &tag);
  char buf[32] = {0};
  CHECK_EQ(peer_read(buf, sizeof(buf)), 12);
  CHECK(memcmp(buf, "<REFERENCED>", 12) == 0);
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  CHECK_EQ(l.calls, 1); /* once */

  /* Several refs in a row, released in order; a NULL release is allowed;
   * so is an empty ref. */
  struct release_log r1 = {0}, r2 = {0}, r3 = {0};
  g_release_seq = 0;
  CHECK_EQ(sock_wq_push_ref(&wq, "ab", 2, release_cb, &r1, NULL), 0);
  CHECK_EQ(sock_wq_push_ref(&wq, "cd", 2, NULL, NULL, NULL), 0);
  CHECK_EQ(sock_wq_push_ref(&wq, "", 0, release_cb, &r2, NULL), 0);
  CHECK_EQ(sock_wq_push_ref(&wq, "ef", 2, release_cb, &r3, NULL), 0);
  CHECK_EQ(wq.bytes, 6);
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  CHECK_EQ(r1.calls, 1);
  CHECK_EQ(r2.calls, 1);
  CHECK_EQ(r3.calls, 1);
  CHECK(r1.order < r2.order && r2.order < r3.order);
  CHECK_EQ(peer_read(buf, sizeof(buf)), 6);
  CHECK(memcmp(buf, "abcdef", 6) == 0);
  CHECK(wq.head == NULL && wq.tail == NULL);

  /* More than one writev's worth of packets (16 iovecs). */
  struct release_log many = {0};
  char expect[64];
  int ref_failures = 0;
  for (int i = 0; i < 40; i++) {
    expect[i] = (char)('A' + i % 26);
    ref_failures +=
        sock_wq_push_ref(&wq, &expect[i], 1, release_cb, &many, NULL) != 0;
  }
  CHECK_EQ(ref_failures, 0);
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  CHECK_EQ(many.calls, 40);
  CHECK_EQ(peer_read(buf, sizeof(buf)), 32); /* buf holds 32 */
  CHECK(memcmp(buf, expect, 32) == 0);
  CHECK_EQ(peer_read(buf, sizeof(buf)), 8);
  CHECK(memcmp(buf, expect + 32, 8) == 0);
  sock_wq_clear(&wq);
  pair_close();
}

static void test_wq_file(void) {
  pair_open();
  sock_wq_t wq;
  sock_wq_init(&wq);
  const char *content = "0123456789abcdefghijklmnopqrstuvwxyz";
  int f1 = temp_file(content, strlen(content));
  CHECK(f1 >= 0);
  CHECK_EQ(sock_wq_push_copy(&wq, "[", 1), 0);
  CHECK_EQ(sock_wq_push_file(&wq, f1, 10, 6), 0); /* "abcdef" */
  CHECK_EQ(sock_wq_push_copy(&wq, "]", 1), 0);
  CHECK_EQ(wq.bytes, 8); /* a file counts its length */
  CHECK(fd_is_open(f1));
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  CHECK(!fd_is_open(f1)); /* the queue closed it when done */
  char buf[64] = {0};
  CHECK_EQ(peer_read(buf, sizeof(buf)), 8);
  CHECK(memcmp(buf, "[abcdef]", 8) == 0);

  /* Whole file from offset 0, twice the same content via two fds. */
  int f2 = temp_file(content, strlen(content));
  int f3 = dup(f2);
  CHECK_EQ(sock_wq_push_file(&wq, f2, 0, 36), 0);
  CHECK_EQ(sock_wq_push_file(&wq, f3, 30, 6), 0);
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  CHECK_EQ(peer_read(buf, sizeof(buf)), 42);
  CHECK(memcmp(buf, content, 36) == 0);
  CHECK(memcmp(buf + 36, "uvwxyz", 6) == 0);
  CHECK(!fd_is_open(f2));
  CHECK(!fd_is_open(f3));

  /* Length 0: nothing queued, the fd is closed at once. */
  int f4 = temp_file(content, 3);
  CHECK_EQ(sock_wq_push_file(&wq, f4, 0, 0), 0);
  CHECK(!fd_is_open(f4));
  CHECK(wq.head == NULL);
  CHECK_EQ(wq.bytes, 0);

  /* A file shorter than its queued length: an error, not a hang. */
  int f5 = temp_file(content, 4);
  CHECK_EQ(sock_wq_push_file(&wq, f5, 0, 10), 0);
  int rc = sock_wq_flush(g_sp[0], &wq);
  CHECK(rc < 0);
  CHECK_EQ(peer_read(buf, sizeof(buf)), 4);
  sock_wq_clear(&wq);
  CHECK(!fd_is_open(f5));
  pair_close();
}

/* ---- a full socket ---- */

/* Byte i of the test stream. */
static char stream_byte(size_t i) { return (char)((i * 7 + (i >> 9)) & 0xff); }

static void test_wq_full(void) {
  pair_open();
  int sndbuf = 16384;
  setsockopt(g_sp[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  sock_wq_t wq;
  sock_wq_init(&wq);

  /* 4 MiB in all: copies, a ref, a file, copies. */
  enum { COPY1 = 1500000, REF = 1000000, FILELEN = 1000000, TAIL = 694304 };
  const size_t total = COPY1 + REF + FILELEN + TAIL + 3 * 100;
  char *all = malloc(total);
  for (size_t i = 0; i < total; i++) all[i] = stream_byte(i);

  size_t at = 0;
  CHECK_EQ(sock_wq_push_copy(&wq, all + at, COPY1), 0);
  at += COPY1;
  for (int i = 0; i < 3; i++, at += 100)
    CHECK_EQ(sock_wq_push_copy(&wq, all + at, 100), 0);
  struct release_log l = {0};
  CHECK_EQ(sock_wq_push_ref(&wq, all + at, REF, release_cb, &l, NULL), 0);
  at += REF;
  int f = temp_file(all + at - 5, FILELEN + 10); /* offset 5 into the file */
  CHECK(f >= 0);
  CHECK_EQ(sock_wq_push_file(&wq, f, 5, FILELEN), 0);
  at += FILELEN;
  CHECK_EQ(sock_wq_push_copy(&wq, all + at, TAIL), 0);
  at += TAIL;
  CHECK_EQ(at, total);
  CHECK_EQ(wq.bytes, total);

  /* The peer does not read: the socket fills and flush says 1. */
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 1);
  CHECK(wq.head != NULL);
  CHECK(wq.bytes > 0 && wq.bytes < total);
  size_t queued = wq.bytes;
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 1); /* still full */
  CHECK_EQ(wq.bytes, queued);
  CHECK_EQ(l.calls, 0);

  /* Drain bit by bit; every flush either empties the queue or says 1.
   * The ref is released, and the file closed, only once all of it went
   * into the socket. */
  char *got = malloc(total);
  size_t have = 0;
  const size_t ref_end = COPY1 + 300 + REF, file_end = ref_end + FILELEN;
  int rc = 1, rounds = 0, bad_rc = 0, bad_bytes = 0;
  bool released_early = false, closed_early = false, released_late = false;
  while (rounds < 100000) {
    have += peer_read(got + have, total - have);
    rc = sock_wq_flush(g_sp[0], &wq);
    if (rc != 0 && rc != 1) bad_rc++;
    if (wq.bytes > total - have) bad_bytes++; /* claims less was sent */
    size_t sent = total - wq.bytes;
    if (l.calls && sent < ref_end) released_early = true;
    if (!l.calls && sent >= ref_end) released_late = true; /* too late */
    if (!fd_is_open(f) && sent < file_end) closed_early = true;
    rounds++;
    if (rc != 1) break;
  }
  /* Whatever the socket still holds. */
  for (int i = 0; i < 1000 && have < total; i++)
    have += peer_read(got + have, total - have);
  CHECK_EQ(rc, 0);
  CHECK_EQ(bad_rc, 0);
  CHECK_EQ(bad_bytes, 0);
  CHECK(!released_early);
  CHECK(!released_late);
  CHECK(!closed_early);
  CHECK(rounds > 2);
  CHECK_EQ(have, total);
  CHECK(memcmp(got, all, total) == 0);
  CHECK_EQ(l.calls, 1);
  CHECK(!fd_is_open(f));
  CHECK(wq.head == NULL && wq.tail == NULL);
  CHECK_EQ(wq.bytes, 0);
  free(got);
  free(all);
  pair_close();
}

/* ---- sock_wq_clear ---- */

static void test_wq_clear(void) {
  pair_open();
  sock_wq_t wq;
  sock_wq_init(&wq);
  sock_wq_clear(&wq); /* empty: harmless */
  CHECK(wq.head == NULL && wq.tail == NULL);

  struct release_log l1 = {0}, l2 = {0};
  int tag;
  int f = temp_file("abc", 3);
  CHECK_EQ(sock_wq_push_copy(&wq, "x", 1), 0);
  CHECK_EQ(sock_wq_push_ref(&wq, "yy", 2, release_cb, &l1, &tag), 0);
  CHECK_EQ(sock_wq_push_file(&wq, f, 0, 3), 0);
  CHECK_EQ(sock_wq_push_ref(&wq, "zz", 2, release_cb, &l2, NULL), 0);
  CHECK_EQ(sock_wq_push_copy(&wq, "w", 1), 0);
  CHECK_EQ(wq.bytes, 9);
  sock_wq_clear(&wq);
  CHECK_EQ(l1.calls, 1);
  CHECK(l1.ctx == &l1 && l1.ctx2 == &tag);
  CHECK_EQ(l2.calls, 1);
  CHECK(!fd_is_open(f));
  CHECK(wq.head == NULL && wq.tail == NULL);
  CHECK_EQ(wq.bytes, 0);
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  char buf[16];
  CHECK_EQ(peer_read(buf, sizeof(buf)), 0); /* nothing was written */

  /* Usable after clear. */
  CHECK_EQ(sock_wq_push_copy(&wq, "ok", 2), 0);
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
  CHECK_EQ(peer_read(buf, sizeof(buf)), 2);

  /* A ref written in part is released once by clear. */
  int sndbuf = 8192;
  setsockopt(g_sp[0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  size_t len = 1 << 20;
  char *data = calloc(1, len);
  struct release_log l3 = {0};
  CHECK_EQ(sock_wq_push_ref(&wq, data, len, release_cb, &l3, NULL), 0);
  CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 1);
  CHECK(wq.bytes > 0 && wq.bytes < len);
  CHECK_EQ(l3.calls, 0);
  sock_wq_clear(&wq);
  CHECK_EQ(l3.calls, 1);
  CHECK_EQ(wq.bytes, 0);
  free(data);
  pair_close();
}

/* A flush to a socket whose peer is gone reports an error (SIGPIPE is
 * ignored, as moonport's main does). */
static void test_wq_peer_gone(void) {
  pair_open();
  sock_wq_t wq;
  sock_wq_init(&wq);
  close(g_sp[1]);
  struct release_log l = {0};
  CHECK_EQ(sock_wq_push_ref(&wq, "data", 4, release_cb, &l, NULL), 0);
  int rc = sock_wq_flush(g_sp[0], &wq);
  CHECK(rc < 0);
  CHECK_EQ(rc, -EPIPE);
  CHECK_EQ(l.calls, 0); /* still queued */
  CHECK_EQ(wq.bytes, 4);
  sock_wq_clear(&wq);
  CHECK_EQ(l.calls, 1);
  close(g_sp[0]);
}

/* ---- known bugs (opt-in, see the header comment) ---- */

/* "Whether `uuid` still names an open connection": a made-up uuid whose
 * generation is 0 (the table starts zeroed) names nothing, yet the table
 * compares generations only, so it looks valid and owned by loop 0. */
static void generation_zero_never_valid(void) {
  int fd = (int)sock_capacity() - 2; /* never opened by these tests */
  sock_uuid_t never = (sock_uuid_t)fd; /* fd, generation 0 */
  CHECK(!sock_uuid_valid(never));
  CHECK_EQ(sock_uuid_owner(never), -1);
}

/* ---- the packet pool and shared (refcounted) packets ---- */

static void test_pool_steady_state(void) {
  pair_open();
  sock_pool_t pool;
  sock_pool_init(&pool, SOCK_POOL_DEFAULT_IDLE);
  sock_wq_t wq;
  sock_wq_init_pooled(&wq, &pool);
  struct release_log l = {0};
  char buf[20000], msg[3000];
  memset(msg, 'm', sizeof(msg));
  /* One round: a response-sized copy, a reference, a larger copy. The
   * first round allocates; every later one is served from the pool. */
  size_t want = 0, got = 0;
  for (int round = 0; round < 1000; round++) {
    CHECK_EQ(sock_wq_push_copy(&wq, msg, 100), 0);
    CHECK_EQ(sock_wq_push_ref(&wq, msg, 66, release_cb, &l, NULL), 0);
    CHECK_EQ(sock_wq_push_copy(&wq, msg, 3000), 0);
    want += 3166;
    CHECK_EQ(sock_wq_flush(g_sp[0], &wq), 0);
    got += peer_read(buf, sizeof(buf));
    if (round == 0) CHECK_EQ(pool.misses, 3);
  }
  CHECK_EQ(got, want);
  CHECK_EQ(l.calls, 1000);
  CHECK_EQ(pool.misses, 3);
  CHECK_EQ(pool.hits, 2997);
  CHECK(wq.head == NULL && wq.bytes == 0);
  /* Idle: the packets wait in the pool, nothing in the queue. */
  CHECK(pool.idle > 0 && pool.idle <= pool.max_idle);

  /* A bulk copy, larger than the largest class, is never pooled. */
  char *bulk = calloc(1, 40000);
  size_t before = pool.idle;
  CHECK_EQ(sock_wq_push_copy(&wq, bulk, 40000), 0);
  CHECK_EQ(pool.idle, before); /* not taken from the pool either */
  sock_wq_clear(&wq);
  CHECK_EQ(pool.idle, before);
  free(bulk);

  sock_pool_trim(&pool, 0);
  CHECK_EQ(pool.idle, 0);
  sock_pool_deinit(&pool);
  pair_close();
}

static void test_pool_bound(void) {
  sock_pool_t pool;
  sock_pool_init(&pool, 4096); /* a small bound */
  sock_wq_t wq;
  sock_wq_init_pooled(&wq, &pool);
  /* 200 packets queued at once (a slow peer) and then dropped: the pool
   * keeps at most its bound, the rest go back to malloc. */
  for (int i = 0; i < 100; i++) {
    CHECK_EQ(sock_wq_push_ref(&wq, "r", 1, NULL, NULL, NULL), 0);
    CHECK_EQ(sock_wq_push_file(&wq, temp_file("f", 1), 0, 1), 0);
  }
  CHECK_EQ(pool.misses, 200);
  sock_wq_clear(&wq);
  CHECK(pool.idle > 0 && pool.idle <= 4096);
  /* Trimming leaves at most what is asked. */
  sock_pool_trim(&pool, 1000);
  CHECK(pool.idle <= 1000);
  sock_pool_deinit(&pool);
  CHECK_EQ(pool.idle, 0);
}

/* A frame shared by several queues: freed by whichever reference goes
 * last, through a write or a close, never before (ASan would see a read
 * of freed memory). */
struct shared_frame {
  int refs;
  int *freed;
  char data[64];
};

static void frame_release(void *ctx, void *ctx2) {
  (void)ctx2;
  struct shared_frame *f = ctx;
  if (--f->refs == 0) {
    (*f->freed)++;
    free(f);
  }
}

static void test_shared_frame(void) {
  int sp[3][2];
  for (int i = 0; i < 3; i++)
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC,
                        0, sp[i]), 0);
  int sndbuf = 4096;
  setsockopt(sp[2][0], SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
  sock_pool_t pool;
  sock_pool_init(&pool, SOCK_POOL_DEFAULT_IDLE);
  sock_wq_t wq[3];
  for (int i = 0; i < 3; i++) sock_wq_init_pooled(&wq[i], &pool);

  /* Queue 2's socket is full first, so its copy of the stream stays
   * queued mid-write. */
  char fill[65536];
  memset(fill, 'x', sizeof(fill));
  while (write(sp[2][0], fill, sizeof(fill)) > 0) {
  }
  int freed = 0;
  enum { MSGS = 50 };
  for (int m = 0; m < MSGS; m++) {
    struct shared_frame *f = malloc(sizeof(*f));
    f->refs = 1; /* the publisher's */
    f->freed = &freed;
    snprintf(f->data, sizeof(f->data), "message %03d\n", m);
    for (int i = 0; i < 3; i++) {
      f->refs++;
      CHECK_EQ(sock_wq_push_ref(&wq[i], f->data, 12, frame_release, f, NULL), 0);
    }
    frame_release(f, NULL); /* the publisher is done with it */
    CHECK_EQ(sock_wq_flush(sp[0][0], &wq[0]), 0);
  }
  CHECK_EQ(freed, 0); /* queues 1 and 2 still hold every frame */
  /* Queue 1 writes everything: the frames live on in queue 2. */
  CHECK_EQ(sock_wq_flush(sp[1][0], &wq[1]), 0);
  CHECK_EQ(freed, 0);
  CHECK_EQ(sock_wq_flush(sp[2][0], &wq[2]), 1); /* still full */
  CHECK_EQ(wq[2].bytes, MSGS * 12);
  /* Every reader got every message in order. */
  for (int i = 0; i < 2; i++) {
    char buf[MSGS * 12 + 1];
    ssize_t n = read(sp[i][1], buf, sizeof(buf));
    CHECK_EQ(n, MSGS * 12);
    bool ok = n == MSGS * 12;
    for (int m = 0; ok && m < MSGS; m++) {
      char want[32];
      snprintf(want, sizeof(want), "message %03d\n", m);
      ok = memcmp(buf + m * 12, want, 12) == 0;
    }
    CHECK(ok);
  }
  /* Queue 2's connection closes mid-write: the last references go. */
  sock_wq_clear(&wq[2]);
  CHECK_EQ(freed, MSGS);
  for (int i = 0; i < 3; i++) {
    close(sp[i][0]);
    close(sp[i][1]);
  }
  sock_pool_deinit(&pool);
}

/* Issue 16, item 6: a handle kept past its connection must not match a
 * later connection on the same fd for a long time. With 28-bit
 * generations stepping by two, the 2^27th reopen of one fd gave the first
 * connection's uuid back. Now it takes 2^32 - 1 opens of that fd, and the
 * uuid (53 bits) stays exact as a Lua number. */
static void test_uuid_generations_wide(void) {
  CHECK(SOCK_FD_BITS + SOCK_GEN_BITS <= 53);
  CHECK(SOCK_GEN_BITS >= 32);
  int x;
  int fd = (int)sock_capacity() - 2;
  sock_uuid_t first = sock_uuid_open(fd, 1, &x);
  CHECK(first != 0);
  sock_uuid_close(first);
  sock_uuid_t u = 0;
  uint32_t repeats = 0;
  for (uint32_t i = 0; i < (1u << 27); i++) {
    u = sock_uuid_open(fd, 1, &x);
    repeats += u == first;
    sock_uuid_close(u);
  }
  CHECK_EQ(repeats, 0);
  u = sock_uuid_open(fd, 1, &x);
  CHECK(u != first);
  CHECK(!sock_uuid_valid(first));
  CHECK(sock_uuid_udata(first, 1) == NULL);
  CHECK_EQ(sock_uuid_owner(first), -1);
  CHECK((sock_uuid_t)(double)u == u); /* a Lua number carries it exactly */
  CHECK(u < ((sock_uuid_t)1 << 53));
  sock_uuid_close(u);
}

/* ---- peer addresses ---- */

/* sock_addr_text writes IPv4 without inet_ntop: every octet value in
 * every place gives inet_ntop's text; IPv6 and Unix as sock_peer did. */
static void test_addr_text(void) {
  sock_addr_t a = {AF_INET, 8080, {0}};
  char want[64], got[64];
  int port = 0, bad = 0;
  for (int pos = 0; pos < 4; pos++)
    for (int v = 0; v < 256; v++) {
      static const uint8_t base[4] = {127, 0, 10, 1};
      memcpy(a.addr, base, 4);
      a.addr[pos] = (uint8_t)v;
      inet_ntop(AF_INET, a.addr, want, sizeof(want));
      memset(got, 'x', sizeof(got));
      sock_addr_text(&a, got, sizeof(got), &port);
      bad += strcmp(want, got) != 0;
    }
  CHECK_EQ(bad, 0);
  CHECK_EQ(port, 8080);
  memset(a.addr, 255, 4);
  sock_addr_text(&a, got, 16, &port); /* the longest fits 16 bytes */
  CHECK(strcmp(got, "255.255.255.255") == 0);
  sock_addr_t a6 = {AF_INET6, 443, {0}};
  a6.addr[15] = 1;
  sock_addr_text(&a6, got, sizeof(got), &port);
  CHECK(strcmp(got, "::1") == 0);
  CHECK_EQ(port, 443);
  sock_addr_t u = {AF_UNIX, 0, {0}};
  sock_addr_text(&u, got, sizeof(got), &port);
  CHECK(strcmp(got, "unix") == 0);
  CHECK_EQ(port, 0);
  /* a connected pair: sock_peer_addr reads it, sock_peer agrees */
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sin = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof(sin);
  CHECK_EQ(bind(ls, (struct sockaddr *)&sin, sizeof(sin)), 0);
  CHECK_EQ(listen(ls, 1), 0);
  CHECK_EQ(getsockname(ls, (struct sockaddr *)&sin, &sl), 0);
  int cs = socket(AF_INET, SOCK_STREAM, 0);
  CHECK_EQ(connect(cs, (struct sockaddr *)&sin, sizeof(sin)), 0);
  sock_addr_t p;
  CHECK_EQ(sock_peer_addr(cs, &p), 0);
  CHECK_EQ(p.family, AF_INET);
  CHECK_EQ(p.port, ntohs(sin.sin_port));
  CHECK_EQ(sock_peer(cs, got, sizeof(got), &port), 0);
  CHECK(strcmp(got, "127.0.0.1") == 0);
  CHECK_EQ(port, ntohs(sin.sin_port));
  close(cs);
  close(ls);
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN);
  int rc = sock_init();
  CHECK_EQ(rc, 0);
  if (rc != 0) {
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return 1;
  }
  test_uuid_zero_and_capacity();
  test_uuid_lifecycle();
  test_uuid_generations_wide();
  test_uuid_fd_zero();
  test_uuid_threads();
  test_wq_copy();
  test_wq_ref();
  test_wq_file();
  test_wq_full();
  test_wq_clear();
  test_wq_peer_gone();
  test_pool_steady_state();
  test_pool_bound();
  test_shared_frame();
  generation_zero_never_valid();
  test_addr_text();
  sock_deinit();
  CHECK_EQ(sock_capacity(), 0);
  return check_summary();
}
