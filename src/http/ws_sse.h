/* SPDX-License-Identifier: MIT */

/* ws_sse: writing to a connection that became a stream (WebSocket or
 * Server-Sent Events), without Lua: WebSocket frames (small ones in one
 * write with their head, long ones by reference), close frames, SSE
 * events, and shared frames for a fan-out (one message framed once for
 * every subscriber, each write queue holding a reference). The stream's
 * state and its Lua objects are lx_ws.c's; the connection protocol that
 * hands it the stream is server.h's.
 * Threads: the connection's reactor thread (a shared frame's count is a
 * plain counter: every reference is taken and dropped on that thread). */
#ifndef MP_HTTP_WS_SSE_H
#define MP_HTTP_WS_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "net/reactor.h"

/* Messages up to this size go out in one write with their frame head. */
#define HTTP_WS_INLINE 4096

/* Writes one final WebSocket frame of opcode `op` with p[0..n).
 * 0 or a negative errno; a frame cut in half (its head went, its body
 * could not) force-closes the connection. */
int http_ws_send(conn_t *c, int op, const char *p, size_t n);
/* The same for a long message (n > HTTP_WS_INLINE) whose bytes are
 * queued by reference: release(ctx, ctx2) runs once the write is done,
 * failed, or never queued (the caller's reference is the call's in every
 * case). */
int http_ws_send_ref(conn_t *c, int op, const char *p, size_t n,
                     void (*release)(void *ctx, void *ctx2), void *ctx,
                     void *ctx2);
/* Writes a close frame with `code` (WS_CLOSE_NO_STATUS: an empty one) and
 * up to 123 bytes of `reason`. */
int http_ws_send_close(conn_t *c, int code, const char *reason, size_t rlen);

/* An SSE event: "event:" and "id:" lines if given, then `data` split
 * into "data:" lines (CR LF, LF or CR end a line), then an empty line.
 * Returns malloc'd memory holding `room` bytes for the caller, then the
 * text (*out_len bytes); NULL when out of memory. */
char *http_sse_event(const char *data, size_t n, const char *ev, size_t evl,
                     const char *id, size_t idl, size_t room, size_t *out_len);

/* A framed message shared by the write queues of a fan-out. */
typedef struct http_frame {
  unsigned refs;
  size_t len;
  char data[];
} http_frame_t;
/* A WebSocket frame (text or binary) or an SSE event of body[0..n), with
 * one reference (the caller's); NULL when out of memory. */
http_frame_t *http_frame_ws(const char *body, size_t n, bool text);
http_frame_t *http_frame_sse(const char *body, size_t n);
/* A WebSocket frame of opcode `op` (WS_RSV1 may be or'ed in: a deflated
 * message) of body[0..n), as http_frame_ws. */
http_frame_t *http_frame_ws_op(const char *body, size_t n, int op);
void http_frame_unref(http_frame_t *f);
/* Queues f on c with a reference of its own (released when the write
 * completes or fails). A connection that can't keep up (-ENOBUFS,
 * -ENOMEM) is force-closed: a cut, not a gap in the stream. */
int http_frame_send(conn_t *c, http_frame_t *f);

#endif
