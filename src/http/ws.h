/* SPDX-License-Identifier: MIT */

/* ws: the WebSocket protocol (RFC 6455) without sockets: the handshake's
 * accept key, a reader that turns client frames into messages, frame
 * heads for what the server sends, and UTF-8 validation. No global state:
 * any thread. */
#ifndef MP_WS_H
#define MP_WS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Opcodes (RFC 6455 5.2). */
enum {
  WS_CONT = 0x0,
  WS_TEXT = 0x1,
  WS_BINARY = 0x2,
  WS_CLOSE = 0x8,
  WS_PING = 0x9,
  WS_PONG = 0xA,
};

/* Close codes the reader fails with (negated) and the server sends. */
enum {
  WS_CLOSE_NORMAL = 1000,
  WS_CLOSE_GOING_AWAY = 1001,
  WS_CLOSE_PROTOCOL = 1002,
  WS_CLOSE_NO_STATUS = 1005, /* never on the wire */
  WS_CLOSE_BAD_DATA = 1007,  /* text that is not UTF-8 */
  WS_CLOSE_POLICY = 1008,
  WS_CLOSE_TOO_BIG = 1009,
  WS_CLOSE_ERROR = 1011,
};

/* Longest frame head: 2 bytes, 8 of length, 4 of mask. */
#define WS_MAX_HEAD 14

/* Writes the Sec-WebSocket-Accept value for a client's Sec-WebSocket-Key
 * into out (28 characters and a NUL). */
void ws_accept_key(const char *key, size_t len, char out[29]);

/* Whether p[0..n) is UTF-8 (no overlong forms, no surrogates, nothing
 * past U+10FFFF). */
bool ws_utf8_valid(const char *p, size_t n);

/* Writes the head of an unmasked frame (the server's) with `len` payload
 * bytes into out; returns its length (2, 4 or 10). `opcode` may carry
 * WS_RSV1 (http/ws_deflate.h): a compressed message's first frame. */
size_t ws_frame_head(char out[10], int opcode, bool fin, uint64_t len);

/* ---- the client's side (mp.websocket): its frames are masked ---- */

/* Writes the head of a masked frame (a client's) with `len` payload bytes
 * and the masking key `key` into out; returns its length (6, 8 or 14).
 * The caller masks the payload with ws_mask and the same key; the key
 * must be new and unpredictable for each frame (RFC 6455 5.3). */
size_t ws_frame_head_masked(char out[WS_MAX_HEAD], int opcode, bool fin,
                            uint64_t len, const unsigned char key[4]);
/* XORs p[0..n) with the masking key (masks and unmasks alike). */
void ws_mask(char *p, size_t n, const unsigned char key[4]);

/* One event out of the reader. */
typedef struct {
  int opcode;       /* WS_TEXT, WS_BINARY, WS_PING, WS_PONG, WS_CLOSE; 0:
                       none yet (a fragment was taken) */
  const char *data; /* the message (into the input, or the reader's
                       buffer): valid until the next ws_read */
  size_t len;
  int code;         /* WS_CLOSE: the peer's code (WS_CLOSE_NO_STATUS if
                       it sent none); data/len are its reason */
} ws_event_t;

/* Turns a client's frames into messages. Fragments of a message are
 * gathered in a buffer of at most max_msg bytes. */
struct ws_z;
typedef struct {
  size_t max_msg;
  bool need_mask; /* a server's reader: unmasked frames are refused */
  int msg_opcode; /* of the fragmented message in progress, or 0 */
  bool msg_z;     /* ... and it is compressed (RSV1 on its first frame) */
  char *msg;      /* owned */
  size_t msg_len, msg_cap;
  /* permessage-deflate (http/ws_deflate.h) when agreed, or NULL (then
   * RSV1 is refused): borrowed. Inflated messages go to zbuf (owned,
   * at most max_msg + 1 bytes; freed at the next read when large). */
  struct ws_z *z;
  char *zbuf;
  size_t zcap;
} ws_reader_t;

void ws_reader_init(ws_reader_t *r, size_t max_msg, bool need_mask);
void ws_reader_deinit(ws_reader_t *r);

/* Reads one frame from in[0..len), which it unmasks in place. Returns the
 * bytes the frame took (> 0; then *ev says what, if anything, is whole),
 * 0 if the frame is not whole yet (nothing taken), or a close code,
 * negated: -WS_CLOSE_PROTOCOL for a malformed frame (reserved bits or
 * opcodes, an unmasked frame when need_mask, a fragmented or long control
 * frame, a continuation with no message, a new message inside one, a
 * close payload of 1 byte or with a code no one may send),
 * -WS_CLOSE_TOO_BIG for a message over max_msg (known from the frame's
 * head, before its payload arrives; for a compressed message also its
 * inflated size, checked while it inflates, so at most max_msg + 1 bytes
 * are ever made of it), -WS_CLOSE_BAD_DATA for text or a close reason
 * that is not UTF-8 or compressed data that is not deflate, -ENOMEM.
 * With r->z, a message whose first frame has RSV1 is inflated (RSV1 on
 * a control frame or a continuation is -WS_CLOSE_PROTOCOL). */
ssize_t ws_read(ws_reader_t *r, char *in, size_t len, ws_event_t *ev);

#endif
