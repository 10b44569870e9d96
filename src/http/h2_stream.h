/* SPDX-License-Identifier: MIT */

/* h2_stream: an HTTP/2 stream that outlives its exchange (Server-Sent
 * Events). Over HTTP/1.1 an event stream takes its whole connection
 * (http_res_sse, http_conn_stream); over HTTP/2 it is one stream among
 * others: its head goes, its exchange completes at once (the
 * connection's other streams run), and the stream stays open, written by
 * http_h2_stream_write into a buffer of its own that DATA frames drain as
 * the stream's and the connection's windows allow.
 *
 * Back pressure: a stream buffers at most its connection's max_queue
 * bytes (reactor_conn_max_queue); a write past it resets that stream
 * (RST_STREAM CANCEL) and fails with -ENOBUFS: a cut rather than a gap,
 * as over HTTP/1.1, and the connection's other streams go on. A stream
 * whose bytes have not moved for two idle timeouts is reset the same way;
 * an idle one gets a comment (":") at each, as over HTTP/1.1.
 *
 * Events: ops->on_closed(c, ctx, reason) once, when the stream closes
 * (client's RST_STREAM, our end, a reset, the connection's close), after
 * nghttp2's callbacks are over. At shutdown or reload the stream ends
 * (END_STREAM after what it buffered) and the GOAWAY follows; on_shutdown
 * and on_timeout are not called. ops->on_data is never called (the
 * request's body, if any, is dropped).
 *
 * Threads: the connection's reactor thread. */
#ifndef MP_HTTP_H2_STREAM_H
#define MP_HTTP_H2_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "http/server.h"

/* Exchange x (of an HTTP/2 connection, its head not sent) becomes an
 * event stream: 200-like head h with Content-Type text/event-stream,
 * logged, and x completes. Returns the stream id (> 0), or a negative
 * errno (-EPROTONOSUPPORT: x is not HTTP/2's). */
int32_t http_h2_stream_open(http_exchange_t *x, const http_head_t *h,
                            const http_stream_ops_t *ops, void *ctx);
/* The ctx of stream sid of c opened with ops, or NULL once closed. */
void *http_h2_stream_of(conn_t *c, int32_t sid, const http_stream_ops_t *ops);
/* Appends p[0..n) to the stream's buffer. 0, -EPIPE (closed or ending),
 * -ENOBUFS (past the cap: the stream is reset), -ENOMEM. */
int http_h2_stream_write(conn_t *c, int32_t sid, const char *p, size_t n);
/* Bytes the stream buffers (not yet framed). */
size_t http_h2_stream_buffered(conn_t *c, int32_t sid);
/* Ends the stream after what it buffered (END_STREAM). */
void http_h2_stream_end(conn_t *c, int32_t sid);

/* Whether exchange x (HTTP/2's; false for another) buffers more of its
 * response body than a stream should (512 KiB, for a reader slower than
 * the producer): a producer that can pause (the proxy) waits for
 * HTTP_WATCH_READY, which comes once the stream drained below 128 KiB,
 * instead of filling the stream's 16 MiB cap. */
bool http_h2_exchange_congested(const http_exchange_t *x);

#endif
