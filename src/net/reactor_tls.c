/* SPDX-License-Identifier: MIT */

/* reactor_tls: the TLS part of the reactor's connections (net/tls.h);
 * see reactor.c for the rest and reactor_int.h for what they share. */
#include "net/reactor_int.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"

/* ---- TLS (net/tls.h) ----
 *
 * A TLS connection's write queue `wq` holds plaintext, exactly as a plain
 * connection's holds what goes on the wire, so back pressure, max_queue,
 * on_ready and a graceful close mean the same over TLS. Plaintext is
 * encrypted when it goes out: at once when nothing waits (the records go
 * to the socket, or on the io_uring batch, from `tls_out`), else by the
 * flush, which turns at most REACTOR_TLS_STEP of the queue into records
 * each time the socket has room. So the records that wait in memory are
 * bounded by one step whatever was queued, and bytes are encrypted in the
 * order they go on the wire (a record's sequence number is its place in
 * the stream: nothing queued may be encrypted ahead of what waits). A
 * file in the queue is read and encrypted by the same flush (no kTLS). */

/* Records from OpenSSL (the handshake's, or conn__tls_put's). */
static int conn__tls_out(void *arg, const void *data, size_t len) {
  conn_t *c = arg;
  if (c->flags & F_DEAD) return -EPIPE;
  return sock_wq_push_copy(&c->tls_out, data, len);
}

int conn__tls_init(conn_t *c, conn_opts_t opts) {
  reactor_t *r = c->r;
  if (!r->tls_plain) {
    r->tls_plain = malloc(REACTOR_TLS_PLAIN);
    r->tls_gather = malloc(REACTOR_TLS_CHUNK);
    if (!r->tls_plain || !r->tls_gather) return -ENOMEM;
  }
  c->tls = net_tls_new(opts.tls, opts.tls_host, conn__tls_out, c);
  if (!c->tls) return -ENOMEM;
  c->tls_plain_reply = opts.tls_plain_reply;
  c->flags |= F_HANDSHAKE;
  c->open_timeout_ms = c->timeout_ms;
  if (!c->timeout_ms) c->timeout_ms = REACTOR_HANDSHAKE_MS;
  /* the io_uring batch sends records, not the plaintext */
  net_uring_io_init(&c->io, c->fd, &c->tls_out);
  return 0;
}

/* Turns up to REACTOR_TLS_STEP bytes from the head of the plaintext queue
 * into records. Small pieces (pipelined answers, frames) are gathered into
 * one record. 0 or a negative errno. */
int conn__tls_encrypt(conn_t *c) {
  reactor_t *r = c->r;
  size_t done = 0;
  while (done < REACTOR_TLS_STEP && c->wq.head) {
    struct iovec iov[16];
    int cnt = sock_wq_iov(&c->wq, iov, 16, NULL);
    size_t n;
    if (cnt == 0) { /* a file */
      ssize_t got = sock_wq_read_file(&c->wq, r->tls_gather, REACTOR_TLS_CHUNK);
      if (got < 0) return (int)got;
      if (net_tls_write(c->tls, r->tls_gather, (size_t)got)) return -EPROTO;
      n = (size_t)got;
    } else if (cnt == 1 || iov[0].iov_len >= REACTOR_TLS_CHUNK / 2) {
      n = iov[0].iov_len < REACTOR_TLS_CHUNK ? iov[0].iov_len
                                             : REACTOR_TLS_CHUNK;
      if (net_tls_write(c->tls, iov[0].iov_base, n)) return -EPROTO;
      sock_wq_consume(&c->wq, n);
    } else {
      n = 0;
      for (int i = 0; i < cnt && n < REACTOR_TLS_CHUNK; i++) {
        size_t k = iov[i].iov_len;
        if (k > REACTOR_TLS_CHUNK - n) k = REACTOR_TLS_CHUNK - n;
        memcpy(r->tls_gather + n, iov[i].iov_base, k);
        n += k;
      }
      if (net_tls_write(c->tls, r->tls_gather, n)) return -EPROTO;
      sock_wq_consume(&c->wq, n);
    }
    done += n;
  }
  return 0;
}

void conn__tls_flush(conn_t *c) {
  if (c->flags & F_DEAD) return;
  /* Written here and now: whatever waited for the batch goes first. */
  if (net_uring_queued(&c->io)) net_uring_send_cancel(c->r->uring, &c->io);
  bool open = net_tls_open(c->tls);
  for (;;) {
    if (c->tls_out.head) {
      int rc = sock_wq_flush(c->fd, &c->tls_out);
      if (rc < 0) {
        conn__kill_errno(c, rc);
        return;
      }
      if (rc == 1) { /* the socket is full: a write event resumes */
        if (!(c->flags & F_HANDSHAKE)) conn__wrote(c, false);
        return;
      }
    }
    if (open && c->wq.head) {
      if (conn__tls_encrypt(c)) {
        conn__kill(c, CONN_ERROR);
        return;
      }
      continue;
    }
    if (open && (c->flags & F_CLOSING) && !(c->flags & F_TLS_BYE)) {
      c->flags |= F_TLS_BYE;
      net_tls_close_notify(c->tls);
      if (c->tls_out.head) continue;
    }
    break;
  }
  if (open || (c->flags & F_CLOSING)) conn__wrote(c, !c->wq.head);
}

/* A write of plaintext (conn__write's TLS half). */
int conn__tls_write(conn_t *c, const char *p, size_t len,
                    sock_release_fn release, void *ctx, void *ctx2) {
  int rc;
  reactor_t *r = c->r;
  if (c->wq.bytes >= c->max_queue) {
    rc = -ENOBUFS;
    goto fail;
  }
  stats_add(r->stats, STAT_BYTES_OUT, len);
  if (net_tls_open(c->tls) && !c->wq.head) {
    /* Nothing waits: encrypt now. A small write joins the batch of the
     * loop iteration (io_uring), as a plain connection's does. */
    if (r->uring && len <= NET_URING_SEND_MAX &&
        c->tls_out.bytes + len <= NET_URING_SEND_MAX &&
        (net_uring_queued(&c->io) || !c->tls_out.head)) {
      if (net_tls_write(c->tls, p, len)) goto broken;
      /* (a second small write of the iteration joins the records already
       * on the batch: io must not be put on the list twice) */
      if (!net_uring_queued(&c->io)) net_uring_send_later(r->uring, &c->io);
      if (release) release(ctx, ctx2);
      return 0;
    }
    if (c->tls_out.head) conn__tls_flush(c); /* what waited goes first */
    while (len > 0 && !c->tls_out.head && !(c->flags & F_DEAD)) {
      size_t n = len < REACTOR_TLS_CHUNK ? len : REACTOR_TLS_CHUNK;
      if (net_tls_write(c->tls, p, n)) goto broken;
      p += n;
      len -= n;
      int w = sock_wq_flush(c->fd, &c->tls_out);
      if (w < 0) {
        conn__kill_errno(c, w);
        rc = -EPIPE;
        goto fail;
      }
    }
    if (c->flags & F_DEAD) {
      rc = -EPIPE;
      goto fail;
    }
    if (!(c->flags & F_HANDSHAKE)) c->last_active = r->now;
    if (len == 0) {
      if (release) release(ctx, ctx2);
      return 0;
    }
  }
  /* The rest waits as plaintext (the socket is full, something waits
   * already, or the handshake is not done). */
  rc = release ? sock_wq_push_ref(&c->wq, p, len, release, ctx, ctx2)
               : sock_wq_push_copy(&c->wq, p, len);
  if (rc) return rc; /* the push released the reference */
  conn__after_queue(c);
  return 0;
broken:
  conn__kill(c, CONN_ERROR);
  rc = -EPIPE;
fail:
  if (release) release(ctx, ctx2);
  return rc;
}

/* The handshake is done: on_open (from the pending list, before any
 * plaintext), and what was written before goes out. */
static void conn__tls_opened(conn_t *c) {
  c->flags &= ~F_HANDSHAKE;
  if (c->connect_timer) timer_stop(&c->r->timers, c->connect_timer);
  c->timeout_ms = c->open_timeout_ms;
  c->last_active = c->r->now;
  conn__enqueue(c, P_OPEN);
  conn__tls_flush(c);
}

static void conn__tls_failed(conn_t *c, ssize_t why) {
  if (why == NET_TLS_PLAIN && c->tls_plain_reply) {
    /* A plain request to a TLS port: say so, in plaintext, then close
     * gracefully so the client reads it. */
    sock_wq_clear(&c->tls_out);
    if (sock_wq_push_copy(&c->tls_out, c->tls_plain_reply,
                          strlen(c->tls_plain_reply)) == 0) {
      c->flags |= F_CLOSING;
      c->reason = CONN_LOCAL;
      conn__tls_flush(c);
      return;
    }
  }
  if (c->flags & F_HANDSHAKE) c->fail_err = -EPROTO;
  /* A failed handshake's alert, if OpenSSL made one, goes out first. */
  if (c->tls_out.head) (void)sock_wq_flush(c->fd, &c->tls_out);
  conn__kill(c, CONN_ERROR);
}

/* conn__read's TLS half: raw bytes from the socket (or the batch's read
 * ahead) go into the record layer; the handshake runs there, and
 * decrypted bytes come out to on_data a few records at a time. */
static void conn__tls_read_some(conn_t *c);

void conn__tls_read(conn_t *c) {
  conn__tls_read_some(c);
  /* Whatever way it left (its round limit, say, right after a read), the
   * fed bytes not read yet must not point into the reactor's buffer or the
   * batch's slot, which the next connection's read reuses. */
  if (!(c->flags & F_DEAD) && net_tls_stash(c->tls)) conn__kill(c, CONN_ERROR);
}

static void conn__tls_read_some(conn_t *c) {
  reactor_t *r = c->r;
  for (int round = 0; round < 16; round++) {
    /* (a handshake goes on while the protocol, not opened yet, would
     * have paused reading: conn__can_read) */
    if (!conn__can_read(c)) return;
    /* What the record layer holds already. */
    size_t got = 0;
    ssize_t n = 0;
    while (got + 16384 <= REACTOR_TLS_PLAIN) {
      n = net_tls_read(c->tls, r->tls_plain + got, REACTOR_TLS_PLAIN - got);
      if (n <= 0) break;
      got += (size_t)n;
    }
    if (c->tls_out.head && !net_uring_queued(&c->io) && !(c->flags & F_DEAD)) {
      /* the handshake's messages, a ticket, an alert (an answer on the
       * batch list stays there) */
      conn__tls_flush(c);
      if (c->flags & F_DEAD) return;
    }
    if (got > 0) {
      if (net_tls_stash(c->tls)) { /* the rest must outlive r->rbuf */
        conn__kill(c, CONN_ERROR);
        return;
      }
      c->last_active = r->now;
      if (c->proto->on_data) {
        c->hold++;
        c->proto->on_data(c, r->tls_plain, got);
        if (--c->hold > 0) return; /* suspended: release re-queues reading */
        if (c->tasks) {
          conn__enqueue(c, P_TASK);
          return;
        }
      }
      if (n > 0 || n == NET_TLS_WANT) continue; /* more may wait */
    }
    if (n == NET_TLS_OPENED) {
      if (net_tls_stash(c->tls)) {
        conn__kill(c, CONN_ERROR);
        return;
      }
      conn__tls_opened(c); /* reading goes on after on_open */
      return;
    }
    if (n == NET_TLS_EOF) {
      reactor_conn_close(c, CONN_PEER);
      return;
    }
    if (n < 0) {
      conn__tls_failed(c, n);
      return;
    }
    if (net_tls_stash(c->tls)) {
      conn__kill(c, CONN_ERROR);
      return;
    }
    /* NET_TLS_WANT: more bytes from the socket. */
    if (!(c->flags & F_READ_PENDING)) return;
    const char *buf;
    char *own;
    ssize_t k = conn__read_raw(c, &buf, &own);
    if (k > 0) {
      if (!(c->flags & F_HANDSHAKE)) c->last_active = r->now;
      net_tls_feed(c->tls, buf, (size_t)k);
      if (own) { /* the batch's buffer goes now */
        int e = net_tls_stash(c->tls);
        free(own);
        if (e) {
          conn__kill(c, CONN_ERROR);
          return;
        }
      }
      continue;
    }
    free(own);
    if (conn__read_none(c, k)) continue;
    return;
  }
  conn__enqueue(c, P_READ); /* more to read: let others have a turn first */
}

bool reactor_conn_tls(const conn_t *c, net_tls_info_t *info) {
  if (!c->tls) return false;
  if (info) net_tls_info(c->tls, info);
  return true;
}

const char *reactor_conn_tls_error(const conn_t *c) {
  if (!c->tls) return NULL;
  return net_tls_has_failed(c->tls) ? net_tls_error(c->tls) : NULL;
}
