/* SPDX-License-Identifier: MIT */

/* ipc: the frames root and workers exchange over their socketpair, and a
 * reader that cuts a byte stream into frames with a size limit. */
#ifndef MP_IPC_H
#define MP_IPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Frame: an 8-byte header (u32 body length, u8 type, u8 flags, u16
 * channel length, host byte order: both ends are one machine and one
 * binary), then the channel, then the message. */
#define IPC_HEADER 8

enum ipc_type {
  IPC_SUB = 1,   /* worker -> root: first subscriber of a channel */
  IPC_UNSUB,     /* worker -> root: last subscriber gone */
  IPC_PSUB,      /* the same for glob patterns */
  IPC_PUNSUB,
  IPC_PUBLISH,   /* worker -> root: route a message (flags: scope, JSON) */
  IPC_DELIVER,   /* root -> worker: deliver a message to local subscribers */
  IPC_READY,     /* worker -> root: every lane runs; it serves */
  IPC_DRAIN,     /* root -> worker: stop accepting, finish, then exit */
  IPC_BEAT,      /* worker -> root: alive, no lane stuck (every second) */
  IPC_STUCK,     /* worker -> root: a lane is stuck (message: what) */
};

/* Flags: the low bits carry the scope, bit 7 says the message is JSON. */
#define IPC_SCOPE_MASK 0x0fu
#define IPC_JSON 0x80u
/* IPC_DELIVER only: for the exact channel's subscribers only; or for one
 * pattern's only, the message then ending with the pattern and its
 * length (u32). */
#define IPC_EXACT 0x40u
#define IPC_PATTERN 0x20u

/* Bytes a frame takes. */
static inline size_t ipc_frame_size(size_t clen, size_t mlen) {
  return IPC_HEADER + clen + mlen;
}

/* Writes the header for a frame into out[IPC_HEADER]. */
void ipc_header(char *out, int type, unsigned flags, size_t clen,
                size_t mlen);

typedef void (*ipc_frame_fn)(int type, unsigned flags, const char *ch,
                             size_t clen, const char *msg, size_t mlen,
                             void *arg);
/* A frame over the limit: its bytes are skipped, and this is called once. */
typedef void (*ipc_oversize_fn)(size_t body, size_t limit, void *arg);

/* Caller-provided storage; single-threaded. */
typedef struct {
  size_t max_body;
  char hdr[IPC_HEADER];
  size_t hdr_have;
  char *body; /* the frame being read */
  size_t body_len, body_have;
  size_t skip; /* bytes of an oversized frame still to drop */
} ipc_reader_t;

void ipc_reader_init(ipc_reader_t *r, size_t max_body);
void ipc_reader_deinit(ipc_reader_t *r);

/* Feeds `len` bytes; calls on_frame for each whole frame (its pointers are
 * valid during the call only). Returns 0, or -ENOMEM (the reader is then
 * reset, the frame lost). A frame whose header is malformed (a channel
 * longer than the body) is dropped like an oversized one. */
int ipc_reader_feed(ipc_reader_t *r, const char *data, size_t len,
                    ipc_frame_fn on_frame, ipc_oversize_fn on_oversize,
                    void *arg);

#endif
