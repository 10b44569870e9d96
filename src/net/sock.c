/* SPDX-License-Identifier: MIT */

/* sock: the uuid table, socket set-up calls and the write queue. */
#include "net/sock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#define SOCK_GEN_MASK ((1ull << SOCK_GEN_BITS) - 1)
#define SOCK_FD_MAX ((size_t)1 << SOCK_FD_BITS)

/* One entry per fd. The owner thread writes an entry; other threads only
 * read states and owners, hence atomics (an fd closed by one loop can be
 * accepted by another, an ordering TSan cannot see through the kernel).
 * `state` is the generation of the fd's latest open shifted left by one,
 * with bit 0 set while that open lasts: one word, so a reader never sees
 * one open's generation with another's flag. */
struct sock_entry {
  _Atomic uint64_t state;
  _Atomic int owner;
  _Atomic(void *) udata;
};

/* Set once by sock_init on the main thread before other threads exist. */
static struct sock_entry *sock_table;
static size_t sock_cap;

int sock_init(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rlim_t want = rl.rlim_max;
    if (want == RLIM_INFINITY || want > SOCK_FD_MAX) want = SOCK_FD_MAX;
    if (rl.rlim_cur != want) {
      rl.rlim_cur = want;
      setrlimit(RLIMIT_NOFILE, &rl);
      getrlimit(RLIMIT_NOFILE, &rl);
    }
  } else {
    rl.rlim_cur = 1024;
  }
  size_t cap = rl.rlim_cur == RLIM_INFINITY ? SOCK_FD_MAX : (size_t)rl.rlim_cur;
  if (cap > SOCK_FD_MAX) cap = SOCK_FD_MAX;
  if (cap < 64) cap = 64;
  sock_table = calloc(cap, sizeof(*sock_table));
  if (!sock_table) return -ENOMEM;
  sock_cap = cap;
  return 0;
}

void sock_deinit(void) {
  free(sock_table);
  sock_table = NULL;
  sock_cap = 0;
}

size_t sock_capacity(void) { return sock_cap; }

static struct sock_entry *sock__entry(sock_uuid_t uuid) {
  size_t fd = (size_t)sock_uuid_fd(uuid);
  return fd < sock_cap ? &sock_table[fd] : NULL;
}

static sock_uuid_t sock__make(int fd, uint64_t gen) {
  return ((gen & SOCK_GEN_MASK) << SOCK_FD_BITS) | (sock_uuid_t)fd;
}

/* The uuid an entry's state names while it is open, else 0. */
static sock_uuid_t sock__live(int fd, uint64_t state) {
  return (state & 1) ? sock__make(fd, state >> 1) : 0;
}

sock_uuid_t sock_uuid_open(int fd, int owner, void *udata) {
  if (fd < 0 || (size_t)fd >= sock_cap) return 0;
  struct sock_entry *e = &sock_table[fd];
  /* Generations count the opens of this fd, skipping 0 (a zeroed entry
   * has generation 0, so no uuid made up from a bare fd is ever valid). */
  uint64_t gen = atomic_load_explicit(&e->state, memory_order_relaxed) >> 1;
  gen = (gen + 1) & SOCK_GEN_MASK;
  if (!gen) gen = 1;
  atomic_store_explicit(&e->owner, owner, memory_order_release);
  atomic_store_explicit(&e->udata, udata, memory_order_relaxed);
  atomic_store_explicit(&e->state, gen << 1 | 1, memory_order_release);
  return sock__make(fd, gen);
}

void sock_uuid_close(sock_uuid_t uuid) {
  struct sock_entry *e = sock__entry(uuid);
  if (!e) return;
  uint64_t state = atomic_load_explicit(&e->state, memory_order_relaxed);
  if (sock__live(sock_uuid_fd(uuid), state) != uuid) return;
  atomic_store_explicit(&e->state, state & ~(uint64_t)1, memory_order_release);
  atomic_store_explicit(&e->udata, NULL, memory_order_relaxed);
  atomic_store_explicit(&e->owner, -1, memory_order_relaxed);
}

bool sock_uuid_valid(sock_uuid_t uuid) {
  struct sock_entry *e = sock__entry(uuid);
  if (!e || !uuid) return false;
  uint64_t state = atomic_load_explicit(&e->state, memory_order_acquire);
  return sock__live(sock_uuid_fd(uuid), state) == uuid;
}

int sock_uuid_owner(sock_uuid_t uuid) {
  struct sock_entry *e = sock__entry(uuid);
  if (!e || !sock_uuid_valid(uuid)) return -1;
  int owner = atomic_load_explicit(&e->owner, memory_order_acquire);
  return sock_uuid_valid(uuid) ? owner : -1;
}

void *sock_uuid_udata(sock_uuid_t uuid, int owner) {
  struct sock_entry *e = sock__entry(uuid);
  if (!e || !sock_uuid_valid(uuid)) return NULL;
  if (atomic_load_explicit(&e->owner, memory_order_relaxed) != owner)
    return NULL;
  return atomic_load_explicit(&e->udata, memory_order_relaxed);
}

/* ---- sockets ---- */

static int sock__resolve(const char *host, int port, bool passive,
                         struct addrinfo **out) {
  char service[16];
  snprintf(service, sizeof(service), "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = passive ? AI_PASSIVE : 0};
  hints.ai_flags |= AI_NUMERICHOST;
  if (getaddrinfo(host, service, &hints, out) == 0) return 0;
  hints.ai_flags &= ~AI_NUMERICHOST;
  if (getaddrinfo(host, service, &hints, out) == 0) return 0;
  return -EADDRNOTAVAIL;
}

/* Makes a TCP socket for each address host:port resolves to until
 * try(fd, address, arg) accepts one (returns 0); returns its fd or the last
 * error. */
static int sock__tcp(const char *host, int port, bool passive,
                     int (*try)(int fd, const struct addrinfo *p, void *arg),
                     void *arg) {
  struct addrinfo *ai;
  int rc = sock__resolve(host, port, passive, &ai);
  if (rc) return rc;
  rc = -EADDRNOTAVAIL;
  for (struct addrinfo *p = ai; p; p = p->ai_next) {
    int fd = socket(p->ai_family, p->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    p->ai_protocol);
    if (fd < 0) {
      rc = -errno;
      continue;
    }
    rc = try(fd, p, arg);
    if (rc == 0) {
      freeaddrinfo(ai);
      return fd;
    }
    close(fd);
  }
  freeaddrinfo(ai);
  return rc;
}

struct sock__listen_opts {
  int backlog;
  bool reuseport;
  bool probe; /* bind only, without SO_REUSEPORT: is the port free? */
};

static int sock__try_listen(int fd, const struct addrinfo *p, void *arg) {
  struct sock__listen_opts *o = arg;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (o->probe) return bind(fd, p->ai_addr, p->ai_addrlen) ? -errno : 0;
  if (o->reuseport &&
      setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)))
    return -errno;
  if (bind(fd, p->ai_addr, p->ai_addrlen) || listen(fd, o->backlog))
    return -errno;
  return 0;
}

int sock_listen_tcp(const char *host, int port, int backlog) {
  struct sock__listen_opts o = {backlog, false, false};
  return sock__tcp(host && *host ? host : NULL, port, true, sock__try_listen,
                   &o);
}

int sock_listen_tcp_shared(const char *host, int port, int backlog) {
  struct sock__listen_opts o = {backlog, true, false};
  return sock__tcp(host && *host ? host : NULL, port, true, sock__try_listen,
                   &o);
}

int sock_listen_tcp_group(const char *host, int port, int backlog) {
  if (port != 0) {
    /* A bind without SO_REUSEPORT conflicts with any listener there, a
     * reuseport group of another process included, which the group's
     * own bind would silently join (any process of the same user may). */
    struct sock__listen_opts o = {backlog, false, true};
    int fd = sock__tcp(host && *host ? host : NULL, port, true,
                       sock__try_listen, &o);
    if (fd < 0) return fd;
    close(fd);
  }
  return sock_listen_tcp_shared(host, port, backlog);
}

static int sock__unix_addr(const char *path, struct sockaddr_un *sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  if (strlen(path) >= sizeof(sa->sun_path)) return -ENAMETOOLONG;
  strcpy(sa->sun_path, path);
  return 0;
}

int sock_unbound(bool unix_domain) {
  int fd = socket(unix_domain ? AF_UNIX : AF_INET,
                  SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  return fd < 0 ? -errno : fd;
}

int sock_listen_unix(const char *path, int backlog) {
  struct sockaddr_un sa;
  int rc = sock__unix_addr(path, &sa);
  if (rc) return rc;
  for (int attempt = 0; attempt < 2; attempt++) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -errno;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
      if (listen(fd, backlog) == 0) return fd;
      rc = -errno;
      close(fd);
      unlink(path);
      return rc;
    }
    rc = -errno;
    close(fd);
    if (rc != -EADDRINUSE || attempt > 0) return rc;
    /* A socket file nobody accepts on is left over from a process that
     * died; one that answers belongs to a live server. */
    struct stat st;
    if (stat(path, &st) || !S_ISSOCK(st.st_mode)) return rc;
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (probe < 0) return rc;
    int live = connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0 ||
               errno != ECONNREFUSED; /* EAGAIN: alive, its backlog is full */
    close(probe);
    if (live) return rc;
    unlink(path);
  }
  return rc;
}

int sock_local_port(int fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (getsockname(fd, (struct sockaddr *)&ss, &len)) return -errno;
  if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
  if (ss.ss_family == AF_INET6)
    return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  return 0;
}

static void sock__nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

int sock_accept(int listen_fd) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  int fd = accept4(listen_fd, (struct sockaddr *)&ss, &len,
                   SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) return errno == EWOULDBLOCK ? -EAGAIN : -errno;
  if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6) sock__nodelay(fd);
  return fd;
}

static int sock__try_connect(int fd, const struct addrinfo *p, void *arg) {
  bool *done = arg;
  sock__nodelay(fd);
  if (connect(fd, p->ai_addr, p->ai_addrlen) == 0) {
    *done = true;
    return 0;
  }
  if (errno != EINPROGRESS) return -errno;
  *done = false;
  return 0;
}

int sock_connect_tcp(const char *host, int port, bool *done) {
  return sock__tcp(host, port, false, sock__try_connect, done);
}

int sock_connect_unix(const char *path, bool *done) {
  struct sockaddr_un sa;
  int rc = sock__unix_addr(path, &sa);
  if (rc) return rc;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  /* A Unix connect completes at once or fails; EAGAIN means the listener's
   * backlog is full, which is a failure too (nothing is in progress). */
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
    *done = true;
    return fd;
  }
  rc = -errno;
  close(fd);
  return rc;
}

int sock_connect_result(int fd) {
  int err = 0;
  socklen_t len = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)) return -errno;
  return -err;
}

int sock_peer_addr(int fd, sock_addr_t *a) {
  struct sockaddr_storage ss;
  socklen_t len = sizeof(ss);
  if (getpeername(fd, (struct sockaddr *)&ss, &len)) return -errno;
  memset(a, 0, sizeof(*a));
  if (ss.ss_family == AF_INET) {
    struct sockaddr_in *in = (struct sockaddr_in *)&ss;
    a->family = AF_INET;
    a->port = ntohs(in->sin_port);
    memcpy(a->addr, &in->sin_addr, 4);
  } else if (ss.ss_family == AF_INET6) {
    struct sockaddr_in6 *in = (struct sockaddr_in6 *)&ss;
    a->family = AF_INET6;
    a->port = ntohs(in->sin6_port);
    memcpy(a->addr, &in->sin6_addr, 16);
  } else {
    a->family = AF_UNIX;
  }
  return 0;
}

void sock_addr_text(const sock_addr_t *a, char *ip, size_t iplen, int *port) {
  *port = a->port;
  if (a->family == AF_INET && iplen >= 16) { /* "255.255.255.255" */
    char *o = ip;
    for (int i = 0; i < 4; i++) {
      unsigned v = a->addr[i];
      if (v >= 100) *o++ = (char)('0' + v / 100);
      if (v >= 10) *o++ = (char)('0' + v / 10 % 10);
      *o++ = (char)('0' + v % 10);
      *o++ = i < 3 ? '.' : '\0';
    }
  } else if (a->family == AF_INET || a->family == AF_INET6) {
    if (!inet_ntop(a->family, a->addr, ip, (socklen_t)iplen) && iplen)
      ip[0] = 0;
  } else {
    snprintf(ip, iplen, "unix");
  }
}

int sock_peer(int fd, char *ip, size_t iplen, int *port) {
  sock_addr_t a;
  int rc = sock_peer_addr(fd, &a);
  if (rc) return rc;
  sock_addr_text(&a, ip, iplen, port);
  return 0;
}

int sock_local_path(int fd, char *path, size_t len) {
  struct sockaddr_un sa;
  socklen_t salen = sizeof(sa);
  if (getsockname(fd, (struct sockaddr *)&sa, &salen)) return -errno;
  if (sa.sun_family != AF_UNIX) return -EAFNOSUPPORT;
  size_t n = salen > offsetof(struct sockaddr_un, sun_path)
                 ? salen - offsetof(struct sockaddr_un, sun_path)
                 : 0;
  if (n > 0 && sa.sun_path[n - 1] == 0) n--;
  if (n >= len) n = len - 1;
  memcpy(path, sa.sun_path, n);
  path[n] = 0;
  return 0;
}

/* ---- the write queue ---- */

enum { PKT_COPY, PKT_REF, PKT_FILE };

/* A packet not from a pool class (a copy larger than the largest). */
#define SOCK_CLS_NONE 0xff

struct sock_packet {
  sock_packet_t *next;
  int kind;
  uint8_t cls; /* its pool class, or SOCK_CLS_NONE */
  size_t len, off; /* bytes in the packet, bytes already written */
  union {
    struct {
      size_t cap;
      char data[];
    } copy;
    struct {
      const char *data;
      sock_release_fn release;
      void *ctx, *ctx2;
    } ref;
    struct {
      int fd;
      off_t pos;
    } file;
  } u;
};

#define SOCK_COPY_OFF offsetof(sock_packet_t, u.copy.data)

/* Class 0 is a bare packet (a reference or a file); the others are copy
 * packets whose allocations are 256 B, 1 KiB, 4 KiB and 16 KiB of data
 * (the largest write a reactor batches), so a small response or frame
 * takes a small packet and a run of small writes grows into larger ones. */
static const size_t sock__class_size[SOCK_POOL_CLASSES] = {
    sizeof(sock_packet_t), 256, 1024, 4096, 16384 + SOCK_COPY_OFF};

static size_t sock__class_cap(int cls) {
  return sock__class_size[cls] - SOCK_COPY_OFF;
}

void sock_pool_init(sock_pool_t *pool, size_t max_idle) {
  memset(pool, 0, sizeof(*pool));
  pool->max_idle = max_idle;
}

void sock_pool_trim(sock_pool_t *pool, size_t keep) {
  for (int cls = SOCK_POOL_CLASSES - 1; cls >= 0 && pool->idle > keep; cls--) {
    while (pool->free[cls] && pool->idle > keep) {
      sock_packet_t *p = pool->free[cls];
      pool->free[cls] = p->next;
      pool->idle -= sock__class_size[cls];
      free(p);
    }
  }
}

void sock_pool_deinit(sock_pool_t *pool) { sock_pool_trim(pool, 0); }

/* A packet of class `cls`, from the pool when it has one. */
static sock_packet_t *sock__get(sock_pool_t *pool, int cls) {
  sock_packet_t *p = pool ? pool->free[cls] : NULL;
  if (p) {
    pool->free[cls] = p->next;
    pool->idle -= sock__class_size[cls];
    pool->hits++;
  } else {
    p = malloc(sock__class_size[cls]);
    if (!p) return NULL;
    if (pool) pool->misses++;
  }
  p->cls = (uint8_t)cls;
  return p;
}

static void sock__put(sock_pool_t *pool, sock_packet_t *p) {
  size_t size = p->cls == SOCK_CLS_NONE ? 0 : sock__class_size[p->cls];
  if (!pool || !size || pool->idle + size > pool->max_idle) {
    free(p);
    return;
  }
  p->next = pool->free[p->cls];
  pool->free[p->cls] = p;
  pool->idle += size;
}

void sock_wq_init(sock_wq_t *wq) { sock_wq_init_pooled(wq, NULL); }

void sock_wq_init_pooled(sock_wq_t *wq, sock_pool_t *pool) {
  wq->head = wq->tail = NULL;
  wq->bytes = 0;
  wq->pool = pool;
}

static void sock__free_packet(sock_wq_t *wq, sock_packet_t *p) {
  if (p->kind == PKT_REF && p->u.ref.release)
    p->u.ref.release(p->u.ref.ctx, p->u.ref.ctx2);
  else if (p->kind == PKT_FILE)
    close(p->u.file.fd);
  sock__put(wq->pool, p);
}

void sock_wq_clear(sock_wq_t *wq) {
  sock_packet_t *p = wq->head;
  wq->head = wq->tail = NULL;
  wq->bytes = 0;
  while (p) {
    sock_packet_t *next = p->next;
    sock__free_packet(wq, p);
    p = next;
  }
}

static void sock__append(sock_wq_t *wq, sock_packet_t *p) {
  p->next = NULL;
  if (wq->tail)
    wq->tail->next = p;
  else
    wq->head = p;
  wq->tail = p;
  wq->bytes += p->len - p->off;
}

int sock_wq_push_copy(sock_wq_t *wq, const void *data, size_t len) {
  if (len == 0) return 0;
  sock_packet_t *t = wq->tail;
  if (t && t->kind == PKT_COPY && t->u.copy.cap - t->len >= len) {
    memcpy(t->u.copy.data + t->len, data, len);
    t->len += len;
    wq->bytes += len;
    return 0;
  }
  /* Behind a full copy packet more small writes are likely (pipelined
   * responses): at least twice its size, so a run grows geometrically. */
  size_t want = len;
  if (t && t->kind == PKT_COPY && want < 2 * t->u.copy.cap)
    want = 2 * t->u.copy.cap;
  int cls = 1;
  while (cls < SOCK_POOL_CLASSES && sock__class_cap(cls) < want) cls++;
  if (cls == SOCK_POOL_CLASSES && sock__class_cap(cls - 1) >= len)
    cls--; /* the growth asked for more than the largest class: that one */
  sock_packet_t *p;
  size_t cap;
  if (cls < SOCK_POOL_CLASSES) {
    p = sock__get(wq->pool, cls);
    cap = sock__class_cap(cls);
  } else { /* bulk: a packet of its own size, straight from malloc */
    p = malloc(SOCK_COPY_OFF + len);
    cap = len;
    if (p) p->cls = SOCK_CLS_NONE;
  }
  if (!p) return -ENOMEM;
  p->kind = PKT_COPY;
  p->len = len;
  p->off = 0;
  p->u.copy.cap = cap;
  memcpy(p->u.copy.data, data, len);
  sock__append(wq, p);
  return 0;
}

int sock_wq_push_ref(sock_wq_t *wq, const void *data, size_t len,
                     sock_release_fn release, void *ctx, void *ctx2) {
  sock_packet_t *p = sock__get(wq->pool, 0);
  if (!p) { /* taken in every case: the bytes are not needed any more */
    if (release) release(ctx, ctx2);
    return -ENOMEM;
  }
  p->kind = PKT_REF;
  p->len = len;
  p->off = 0;
  p->u.ref.data = data;
  p->u.ref.release = release;
  p->u.ref.ctx = ctx;
  p->u.ref.ctx2 = ctx2;
  sock__append(wq, p);
  return 0;
}

int sock_wq_push_file(sock_wq_t *wq, int file_fd, off_t offset, size_t len) {
  sock_packet_t *p = len ? sock__get(wq->pool, 0) : NULL;
  if (!p) {
    close(file_fd);
    return len ? -ENOMEM : 0;
  }
  p->kind = PKT_FILE;
  p->len = len;
  p->off = 0;
  p->u.file.fd = file_fd;
  p->u.file.pos = offset;
  sock__append(wq, p);
  return 0;
}

int sock_wq_iov(const sock_wq_t *wq, struct iovec *iov, int max,
                size_t *total) {
  int cnt = 0;
  size_t sum = 0;
  for (sock_packet_t *q = wq->head; q && q->kind != PKT_FILE && cnt < max;
       q = q->next, cnt++) {
    const char *base = q->kind == PKT_COPY ? q->u.copy.data : q->u.ref.data;
    iov[cnt].iov_base = (void *)(base + q->off);
    iov[cnt].iov_len = q->len - q->off;
    sum += q->len - q->off;
  }
  if (total) *total = sum;
  return cnt;
}

void sock_wq_consume(sock_wq_t *wq, size_t n) {
  wq->bytes -= n;
  while (wq->head && (n > 0 || wq->head->off == wq->head->len)) {
    sock_packet_t *q = wq->head;
    size_t take = q->len - q->off;
    if (take > n) take = n;
    q->off += take; /* for files, sendfile advanced pos itself */
    n -= take;
    if (q->off < q->len) break;
    wq->head = q->next;
    if (!wq->head) wq->tail = NULL;
    sock__free_packet(wq, q);
  }
}

ssize_t sock_wq_read_file(sock_wq_t *wq, void *buf, size_t cap) {
  sock_packet_t *p = wq->head;
  if (!p || p->kind != PKT_FILE) return 0;
  size_t want = p->len - p->off;
  if (want > cap) want = cap;
  ssize_t n;
  do
    n = pread(p->u.file.fd, buf, want, p->u.file.pos);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  if (n == 0) return -EIO; /* the file shrank under us */
  p->u.file.pos += n;
  sock_wq_consume(wq, (size_t)n);
  return n;
}

/* Writes runs of memory packets with one writev; files with sendfile. */
int sock_wq_flush(int fd, sock_wq_t *wq) {
  while (wq->head) {
    sock_packet_t *p = wq->head;
    ssize_t n;
    if (p->kind == PKT_FILE) {
      size_t want = p->len - p->off;
      if (want > (1u << 30)) want = 1u << 30;
      n = sendfile(fd, p->u.file.fd, &p->u.file.pos, want);
      if (n == 0) return -EIO; /* the file shrank under us */
    } else {
      struct iovec iov[16];
      n = writev(fd, iov, sock_wq_iov(wq, iov, 16, NULL));
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 1;
      return -errno;
    }
    sock_wq_consume(wq, (size_t)n);
  }
  return 0;
}

int sock_keepalive(int fd, int secs) {
  if (secs <= 0) return 0;
  int on = 1, cnt = 3, intvl = secs / 3 > 0 ? secs / 3 : 1;
  unsigned user_ms = (unsigned)secs * 2000u;
  if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &secs, sizeof(secs)) ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) ||
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) ||
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_ms, sizeof(user_ms)))
    return -errno;
  return 0;
}
