/* SPDX-License-Identifier: MIT */

/* batch: many socket sends (or receives) in one system call (io_uring).
 *
 * The reactor writes what a loop iteration's callbacks produced with one
 * io_uring_enter instead of one write(2) per connection. Each send is
 * non-blocking (MSG_DONTWAIT): the kernel either takes the bytes at once or
 * answers -EAGAIN, so every result is in by the time net_batch_run returns
 * and nothing is left in flight. Where io_uring is missing or forbidden
 * (old kernels, seccomp, io_uring_disabled), net_batch_new returns NULL and
 * the reactor writes directly. The same goes for reading: the sockets one
 * epoll_wait reported readable are read with one io_uring_enter. One batch
 * belongs to one thread. */
#ifndef MP_BATCH_H
#define MP_BATCH_H

#include <stdbool.h>
#include <sys/uio.h>

typedef struct net_batch net_batch_t;

/* Up to NET_BATCH_IOV pieces per send. */
#define NET_BATCH_IOV 16

/* A batch of at most `entries` operations per run, or NULL (errno set)
 * when io_uring can't be used here. MOONPORT_IO_URING=0 in the environment
 * turns it off (errno ENOTSUP; the direct path, for tests and
 * comparisons). */
net_batch_t *net_batch_new(unsigned entries);
void net_batch_free(net_batch_t *b);
/* For the unit tests only: submits an IORING_OP_NOP alone (the batch must
 * be empty) and returns its result: -EACCES, as the ring is restricted to
 * send, sendmsg and recv. */
int net_batch__nop(net_batch_t *b);
/* Queues a send of iov[0..cnt) (cnt <= NET_BATCH_IOV; copied) on `fd`;
 * `tag` comes back with its result. False when the batch is full (run it
 * first). */
bool net_batch_send(net_batch_t *b, int fd, const struct iovec *iov, int cnt,
                    void *tag);
/* Queues a non-blocking receive of at most `len` bytes into `buf`; its
 * result is the bytes read, 0 at EOF, or a negative errno (-EAGAIN: none
 * there). False when the batch is full. */
bool net_batch_recv(net_batch_t *b, int fd, void *buf, size_t len, void *tag);
/* How many operations are queued. */
unsigned net_batch_count(const net_batch_t *b);
/* Runs everything queued and calls done(tag, result, arg) for each, in
 * queue order: for a send the bytes sent, or a negative errno (-EAGAIN:
 * the socket is full). Returns 0, or a negative errno when the submission itself failed
 * (then every operation gets that errno). */
int net_batch_run(net_batch_t *b, void (*done)(void *tag, int res, void *arg),
                  void *arg);

#endif
