/* SPDX-License-Identifier: MIT */

/* Unit tests of the one ownership rule on failure (docs/ARCHITECTURE.md,
 * "Ownership on failure"): a call of src/net that takes a buffer by
 * reference or an fd takes it whether it succeeds or fails, releasing the
 * buffer / closing the fd itself when it fails.
 *
 * Failures are made for real: allocations fail through a malloc
 * interposer (this file's malloc wins over libc's and ASan's, and forwards
 * to the next one), queues are filled past max_queue, connections are
 * closed or their peer is gone. Each reference's release frees the buffer
 * it was given and counts, so a second release is a double free (ASan)
 * and a missing one a leak (LeakSanitizer) as well as a wrong count; an
 * fd that should be closed is checked with fcntl. The reactor cases run
 * inside a real loop on this thread, once with io_uring (when the kernel
 * has it) and once with MOONPORT_IO_URING=0. Own main(); check.h. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "check.h"
#include "net/batch.h"
#include "net/reactor.h"
#include "net/sock.h"

/* ---- failing allocations ---- */

static pthread_t g_main;
static volatile int g_malloc_fail; /* mallocs of the main thread to fail */

/* TSan's runtime resolves its own interceptors with dlsym before it can
 * serve a malloc, so under TSan there is no interposer and the
 * out-of-memory cases are left out (this file runs on one thread: ASan
 * and the release build cover them). */
#if defined(__SANITIZE_THREAD__)
#define FAILS 0
#else
#define FAILS 1
static void *(*g_real_malloc)(size_t);

void *malloc(size_t n) {
  if (!g_real_malloc) {
    /* dlsym does not allocate on success; a nested call would recurse, so
     * it gets NULL (it cannot come from code that frees its result). */
    static __thread bool resolving;
    if (resolving) return NULL;
    resolving = true;
    g_real_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    resolving = false;
    if (!g_real_malloc) abort();
  }
  if (g_malloc_fail > 0 && pthread_equal(pthread_self(), g_main)) {
    g_malloc_fail--;
    errno = ENOMEM;
    return NULL;
  }
  return g_real_malloc(n);
}
#endif

/* ---- references and fds ---- */

static int g_released; /* release calls */

static void release_buf(void *ctx, void *ctx2) {
  (void)ctx2;
  g_released++;
  free(ctx);
}

/* A buffer of n bytes for a reference; released by release_buf. */
static char *ref_buf(size_t n) {
  char *p = malloc(n);
  if (p) memset(p, 'r', n);
  return p;
}

static bool fd_closed(int fd) {
  return fcntl(fd, F_GETFD) == -1 && errno == EBADF;
}

static int temp_fd(void) {
  char path[] = "/tmp/moonport-own-XXXXXX";
  int fd = mkstemp(path);
  if (fd < 0) return -1;
  unlink(path);
  if (write(fd, "0123456789", 10) != 10) {
    close(fd);
    return -1;
  }
  return fd;
}

/* ---- the write queue alone ---- */

static void test_sock_wq(void) {
  sock_wq_t wq;
  sock_wq_init(&wq);
  char *b;
  int rc;

  /* push_ref: out of memory releases the reference before returning. */
  if (FAILS) {
    g_released = 0;
    b = ref_buf(8);
    g_malloc_fail = 1;
    rc = sock_wq_push_ref(&wq, b, 8, release_buf, b, NULL);
    g_malloc_fail = 0;
    CHECK_EQ(rc, -ENOMEM);
    CHECK_EQ(g_released, 1);
    CHECK_EQ(wq.bytes, 0);
    CHECK(wq.head == NULL);

    /* A NULL release is legal: nothing to call, nothing queued. */
    g_malloc_fail = 1;
    rc = sock_wq_push_ref(&wq, "static", 6, NULL, NULL, NULL);
    g_malloc_fail = 0;
    CHECK_EQ(rc, -ENOMEM);
    CHECK(wq.head == NULL);
  }

  /* The success path releases exactly once too, when dropped. */
  g_released = 0;
  b = ref_buf(8);
  CHECK_EQ(sock_wq_push_ref(&wq, b, 8, release_buf, b, NULL), 0);
  CHECK_EQ(g_released, 0);
  sock_wq_clear(&wq);
  CHECK_EQ(g_released, 1);

  /* push_file: out of memory closes the fd; so does an empty range. */
  int fd;
  if (FAILS) {
    fd = temp_fd();
    CHECK(fd >= 0);
    g_malloc_fail = 1;
    rc = sock_wq_push_file(&wq, fd, 0, 10);
    g_malloc_fail = 0;
    CHECK_EQ(rc, -ENOMEM);
    CHECK(fd_closed(fd));
  }
  fd = temp_fd();
  CHECK_EQ(sock_wq_push_file(&wq, fd, 0, 0), 0);
  CHECK(fd_closed(fd));
  CHECK(wq.head == NULL);

  /* A failed copy takes nothing and leaves the queue as it was. */
  CHECK_EQ(sock_wq_push_copy(&wq, "ab", 2), 0);
  if (FAILS) {
    g_malloc_fail = 1;
    char big[20000];
    memset(big, 'x', sizeof(big));
    rc = sock_wq_push_copy(&wq, big, sizeof(big));
    g_malloc_fail = 0;
    CHECK_EQ(rc, -ENOMEM);
    CHECK_EQ(wq.bytes, 2);
  }
  sock_wq_clear(&wq);
}

/* ---- the reactor's writes, in a running loop ---- */

#define FILL ((size_t)512 * 1024) /* more than a socket buffer takes */

typedef struct {
  sock_uuid_t uuid;
} own_conn_t;

static void own_open(conn_t *c) {
  own_conn_t *oc = reactor_conn_service(c);
  oc->uuid = reactor_conn_uuid(c);
}

static const proto_t own_proto = {.on_open = own_open};

typedef struct {
  reactor_t *r;
  bool uring;        /* sends wait for the batch (io_uring on) */
  own_conn_t full;   /* a queue already holding bytes */
  own_conn_t small;  /* max_queue 1 KiB, filled past it */
  own_conn_t fresh;  /* an empty queue */
  own_conn_t closed; /* closed by the application */
  own_conn_t gone;   /* its peer closed both ends */
  int peers[5];
  char *fill;
  int release_expect; /* releases by the end of the loop */
  int gone_rc;
} own_run_t;

static conn_t *own_find(own_run_t *o, own_conn_t *oc) {
  return reactor_conn_find(o->r, oc->uuid);
}

/* Everything here runs as a task of the loop: the ring (if any) is set
 * up, and nothing else runs in between. */
static void own_cases(void *a, void *b) {
  own_run_t *o = a;
  (void)b;
  conn_t *full = own_find(o, &o->full), *small = own_find(o, &o->small);
  conn_t *fresh = own_find(o, &o->fresh), *closed = own_find(o, &o->closed);
  conn_t *gone = own_find(o, &o->gone);
  CHECK(full && small && fresh && closed && gone);
  close(o->peers[4]); /* here: an earlier event would have closed it */
  o->peers[4] = -1;
  if (!(full && small && fresh && closed && gone)) {
    reactor_shutdown(o->r, 0);
    return;
  }

  /* A queue with bytes in it: the large write leaves the rest queued. */
  CHECK_EQ(reactor_conn_write(full, o->fill, FILL), 0);
  CHECK(reactor_conn_pending(full) > 0);

  /* Out of memory in the queue behind bytes already queued: -ENOMEM, and
   * the reference was released once (not by the queue and again by the
   * reactor, not by neither). */
  char *buf;
  int rc, fd;
  if (FAILS) {
    g_released = 0;
    buf = ref_buf(100);
    g_malloc_fail = 1;
    rc = reactor_conn_write_ref(full, buf, 100, release_buf, buf, NULL);
    g_malloc_fail = 0;
    CHECK_EQ(rc, -ENOMEM);
    CHECK_EQ(g_released, 1);

    /* The same on an empty queue: with io_uring the write waits in the
     * queue for the batch and fails there; without, the socket takes it at
     * once and the reference is released on success. Once either way. */
    g_released = 0;
    buf = ref_buf(100);
    g_malloc_fail = 1;
    rc = reactor_conn_write_ref(fresh, buf, 100, release_buf, buf, NULL);
    g_malloc_fail = 0;
    CHECK_EQ(rc, o->uring ? -ENOMEM : 0);
    CHECK_EQ(g_released, 1);
    CHECK(reactor_conn_is_open(fresh));

    /* sendfile out of memory: -ENOMEM, the fd closed. */
    fd = temp_fd();
    g_malloc_fail = 1;
    rc = reactor_conn_sendfile(full, fd, 0, 10);
    g_malloc_fail = 0;
    CHECK_EQ(rc, -ENOMEM);
    CHECK(fd_closed(fd));
  }

  /* Past max_queue: -ENOBUFS, released / closed. */
  CHECK_EQ(reactor_conn_write(small, o->fill, FILL), 0);
  CHECK(reactor_conn_pending(small) >= 1024);
  g_released = 0;
  buf = ref_buf(100);
  CHECK_EQ(reactor_conn_write_ref(small, buf, 100, release_buf, buf, NULL),
           -ENOBUFS);
  CHECK_EQ(g_released, 1);
  fd = temp_fd();
  CHECK_EQ(reactor_conn_sendfile(small, fd, 0, 10), -ENOBUFS);
  CHECK(fd_closed(fd));

  /* Closed by the application: -EPIPE, released / closed. */
  reactor_conn_close(closed, CONN_LOCAL);
  CHECK(!reactor_conn_is_open(closed));
  g_released = 0;
  buf = ref_buf(100);
  CHECK_EQ(reactor_conn_write_ref(closed, buf, 100, release_buf, buf, NULL),
           -EPIPE);
  CHECK_EQ(g_released, 1);
  fd = temp_fd();
  CHECK_EQ(reactor_conn_sendfile(closed, fd, 0, 10), -EPIPE);
  CHECK(fd_closed(fd));

  /* The peer is gone: the write fails on the way out (directly: at once,
   * -EPIPE; batched: after the call returned 0, when the batch's send
   * fails and the connection dies). The reference is released once in
   * both cases; counted at the end. */
  g_released = 0;
  buf = ref_buf(100);
  o->gone_rc = reactor_conn_write_ref(gone, buf, 100, release_buf, buf, NULL);
  o->release_expect = 1;

  reactor_shutdown(o->r, 0);
}

static bool own_adopt(reactor_t *r, own_conn_t *oc, int *peer,
                      conn_opts_t opts) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv))
    return false;
  int small = 4096;
  setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  *peer = sv[1];
  reactor_adopt(r, sv[0], &own_proto, oc, opts);
  return oc->uuid != 0;
}

static void test_reactor_writes(bool uring_on) {
  if (uring_on)
    unsetenv("MOONPORT_IO_URING");
  else
    setenv("MOONPORT_IO_URING", "0", 1);
  own_run_t o = {0};
  net_batch_t *probe = net_batch_new(8); /* what reactor_run will get */
  o.uring = probe != NULL;
  net_batch_free(probe);
  o.r = reactor_new(0);
  CHECK(o.r != NULL);
  if (!o.r) return;
  o.fill = malloc(FILL);
  memset(o.fill, 'f', FILL);
  conn_opts_t def = {0}, tiny = {.max_queue = 1024};
  CHECK(own_adopt(o.r, &o.full, &o.peers[0], def));
  CHECK(own_adopt(o.r, &o.small, &o.peers[1], tiny));
  CHECK(own_adopt(o.r, &o.fresh, &o.peers[2], def));
  CHECK(own_adopt(o.r, &o.closed, &o.peers[3], def));
  CHECK(own_adopt(o.r, &o.gone, &o.peers[4], def));

  /* reactor_adopt of an fd epoll refuses (a regular file): closed. */
  int fd = temp_fd();
  own_conn_t none = {0};
  reactor_adopt(o.r, fd, &own_proto, &none, def);
  CHECK(fd_closed(fd));
  CHECK_EQ(none.uuid, 0);

  CHECK_EQ(reactor_post(o.r, own_cases, &o, NULL), 0);
  CHECK_EQ(reactor_run(o.r), 0);
  CHECK_EQ(o.gone_rc, o.uring ? 0 : -EPIPE);
  CHECK_EQ(g_released, o.release_expect);

  /* A stopped reactor takes the fd too, and closes it. */
  fd = temp_fd();
  reactor_adopt(o.r, fd, &own_proto, &none, def);
  CHECK(fd_closed(fd));

  /* Whatever was still queued by reference is released by the free:
   * nothing leaks (LeakSanitizer checks the buffers at exit). */
  g_released = 0;
  reactor_free(o.r);
  CHECK_EQ(g_released, 0); /* all were released already, none twice */
  for (int i = 0; i < 5; i++)
    if (o.peers[i] >= 0) close(o.peers[i]);
  free(o.fill);
}

/* The batch's ring is restricted (IORING_REGISTER_RESTRICTIONS) to send,
 * sendmsg and recv: a NOP is refused with -EACCES; the three still work. */
static int g_batch_res[3];
static void batch_done(void *tag, int res, void *arg) {
  (void)arg;
  g_batch_res[(intptr_t)tag] = res;
}
static void test_batch_restricted(void) {
  unsetenv("MOONPORT_IO_URING");
  net_batch_t *b = net_batch_new(8);
  if (!b) {
    printf("  no io_uring here: the restriction test is skipped\n");
    return;
  }
  CHECK_EQ(net_batch__nop(b), -EACCES);
  int sv[2];
  CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  struct iovec one = {.iov_base = "ab", .iov_len = 2};
  struct iovec two[2] = {{.iov_base = "c", .iov_len = 1},
                         {.iov_base = "d", .iov_len = 1}};
  char buf[8];
  CHECK(net_batch_send(b, sv[0], &one, 1, (void *)(intptr_t)0));
  CHECK(net_batch_send(b, sv[0], two, 2, (void *)(intptr_t)1));
  CHECK_EQ(net_batch_run(b, batch_done, NULL), 0);
  CHECK(net_batch_recv(b, sv[1], buf, sizeof(buf), (void *)(intptr_t)2));
  CHECK_EQ(net_batch_run(b, batch_done, NULL), 0);
  CHECK_EQ(g_batch_res[0], 2);
  CHECK_EQ(g_batch_res[1], 2);
  CHECK_EQ(g_batch_res[2], 4);
  CHECK(memcmp(buf, "abcd", 4) == 0);
  close(sv[0]);
  close(sv[1]);
  net_batch_free(b);
}

int main(void) {
  g_main = pthread_self();
  signal(SIGPIPE, SIG_IGN);
  alarm(60);
  if (sock_init() != 0) {
    printf("sock_init failed\n");
    return 1;
  }
  test_sock_wq();
  test_batch_restricted();
  test_reactor_writes(true);
  test_reactor_writes(false);
  sock_deinit();
  return check_summary();
}
