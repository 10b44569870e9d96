/* SPDX-License-Identifier: MIT */

/* batch: io_uring used as a vector of non-blocking sends and receives;
 * see batch.h. */
#include "net/batch.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef struct {
  void *tag;
  int res;
  struct msghdr msg;
  struct iovec iov[NET_BATCH_IOV];
} batch_slot_t;

struct net_batch {
  struct io_uring ring;
  unsigned cap, n;
  batch_slot_t *slots;
};

net_batch_t *net_batch_new(unsigned entries) {
  const char *env = getenv("MOONPORT_IO_URING");
  if (env && strcmp(env, "0") == 0) {
    errno = ENOTSUP;
    return NULL;
  }
  net_batch_t *b = calloc(1, sizeof(*b));
  batch_slot_t *slots = calloc(entries, sizeof(*slots));
  if (!b || !slots) {
    free(b);
    free(slots);
    errno = ENOMEM;
    return NULL;
  }
  /* One thread submits, and completions need no interrupt of it. The
   * ring starts disabled, so it can be restricted before any use. */
  struct io_uring_params p = {.flags = IORING_SETUP_SINGLE_ISSUER |
                                       IORING_SETUP_COOP_TASKRUN |
                                       IORING_SETUP_R_DISABLED};
  int rc = io_uring_queue_init_params(entries, &b->ring, &p);
  if (rc == -EINVAL) { /* kernels before 6.0 */
    memset(&p, 0, sizeof(p));
    p.flags = IORING_SETUP_R_DISABLED;
    rc = io_uring_queue_init_params(entries, &b->ring, &p);
  }
  /* A ring does only what the batch asks of it: send, sendmsg and recv,
   * no SQE flags, no io_uring_register operation (so no files, buffers or
   * eventfds can be added later). A seccomp filter such as systemd's
   * SystemCallFilter= sees io_uring_enter only, not the operations it
   * runs: this keeps those to the three a socket server needs, whatever
   * else an attacker with control of this process could submit. */
  if (rc == 0) {
    struct io_uring_restriction res[] = {
        {.opcode = IORING_RESTRICTION_SQE_OP, .sqe_op = IORING_OP_SEND},
        {.opcode = IORING_RESTRICTION_SQE_OP, .sqe_op = IORING_OP_SENDMSG},
        {.opcode = IORING_RESTRICTION_SQE_OP, .sqe_op = IORING_OP_RECV},
        {.opcode = IORING_RESTRICTION_SQE_FLAGS_ALLOWED, .sqe_flags = 0},
    };
    /* (liburing 2.3 as Debian ships it exports neither
     * io_uring_register_restrictions nor io_uring_enable_rings: the
     * register calls themselves, which return 0 or a negative errno) */
    rc = io_uring_register((unsigned)b->ring.ring_fd,
                           IORING_REGISTER_RESTRICTIONS, res,
                           sizeof(res) / sizeof(res[0]));
    if (rc == 0)
      rc = io_uring_register((unsigned)b->ring.ring_fd,
                             IORING_REGISTER_ENABLE_RINGS, NULL, 0);
    if (rc < 0) io_uring_queue_exit(&b->ring);
  }
  if (rc < 0) {
    free(b);
    free(slots);
    errno = -rc;
    return NULL;
  }
  b->cap = entries;
  b->slots = slots;
  return b;
}

int net_batch__nop(net_batch_t *b) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);
  if (!sqe) return -EBUSY;
  io_uring_prep_nop(sqe);
  int rc = io_uring_submit_and_wait(&b->ring, 1);
  if (rc < 0) return rc;
  struct io_uring_cqe *cqe;
  if ((rc = io_uring_wait_cqe(&b->ring, &cqe)) < 0) return rc;
  rc = cqe->res;
  io_uring_cqe_seen(&b->ring, cqe);
  return rc;
}

void net_batch_free(net_batch_t *b) {
  if (!b) return;
  io_uring_queue_exit(&b->ring);
  free(b->slots);
  free(b);
}

unsigned net_batch_count(const net_batch_t *b) { return b->n; }

bool net_batch_send(net_batch_t *b, int fd, const struct iovec *iov, int cnt,
                    void *tag) {
  if (b->n >= b->cap || cnt < 1 || cnt > NET_BATCH_IOV) return false;
  struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);
  if (!sqe) return false;
  batch_slot_t *s = &b->slots[b->n];
  s->tag = tag;
  s->res = -ECANCELED;
  if (cnt == 1) {
    io_uring_prep_send(sqe, fd, iov[0].iov_base, iov[0].iov_len,
                       MSG_DONTWAIT | MSG_NOSIGNAL);
  } else {
    memcpy(s->iov, iov, (size_t)cnt * sizeof(*iov));
    s->msg = (struct msghdr){.msg_iov = s->iov, .msg_iovlen = (size_t)cnt};
    io_uring_prep_sendmsg(sqe, fd, &s->msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  }
  io_uring_sqe_set_data64(sqe, b->n);
  b->n++;
  return true;
}

bool net_batch_recv(net_batch_t *b, int fd, void *buf, size_t len, void *tag) {
  if (b->n >= b->cap) return false;
  struct io_uring_sqe *sqe = io_uring_get_sqe(&b->ring);
  if (!sqe) return false;
  batch_slot_t *s = &b->slots[b->n];
  s->tag = tag;
  s->res = -ECANCELED;
  io_uring_prep_recv(sqe, fd, buf, len, MSG_DONTWAIT);
  io_uring_sqe_set_data64(sqe, b->n);
  b->n++;
  return true;
}

int net_batch_run(net_batch_t *b, void (*done)(void *tag, int res, void *arg),
                  void *arg) {
  unsigned n = b->n;
  if (!n) return 0;
  b->n = 0;
  /* Non-blocking operations complete while they are submitted; waiting for all
   * of them costs no extra system call. */
  int rc;
  do {
    rc = io_uring_submit_and_wait(&b->ring, n);
  } while (rc == -EINTR);
  unsigned seen = 0;
  if (rc >= 0) {
    struct io_uring_cqe *cqe;
    while (seen < n && io_uring_peek_cqe(&b->ring, &cqe) == 0) {
      uint64_t i = io_uring_cqe_get_data64(cqe);
      if (i < n) b->slots[i].res = cqe->res;
      io_uring_cqe_seen(&b->ring, cqe);
      seen++;
    }
  }
  for (unsigned i = 0; i < n; i++)
    done(b->slots[i].tag, rc < 0 ? rc : b->slots[i].res, arg);
  return rc < 0 ? rc : 0;
}
