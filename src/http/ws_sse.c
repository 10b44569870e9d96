/* SPDX-License-Identifier: MIT */

/* ws_sse: WebSocket frames, SSE events and shared fan-out frames written
 * to stream connections; see ws_sse.h. */
#include "http/ws_sse.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "http/ws.h"

int http_ws_send(conn_t *c, int op, const char *p, size_t n) {
  char head[10];
  size_t h = ws_frame_head(head, op, true, n);
  if (n <= HTTP_WS_INLINE) {
    char buf[10 + HTTP_WS_INLINE];
    memcpy(buf, head, h);
    if (n) memcpy(buf + h, p, n);
    return reactor_conn_write(c, buf, h + n);
  }
  int rc = reactor_conn_write(c, head, h);
  if (rc) return rc;
  rc = reactor_conn_write(c, p, n);
  if (rc) reactor_conn_force_close(c, CONN_ERROR); /* the head went alone */
  return rc;
}

int http_ws_send_ref(conn_t *c, int op, const char *p, size_t n,
                     void (*release)(void *ctx, void *ctx2), void *ctx,
                     void *ctx2) {
  char head[10];
  size_t h = ws_frame_head(head, op, true, n);
  int rc = reactor_conn_write(c, head, h);
  if (rc) {
    release(ctx, ctx2);
    return rc;
  }
  rc = reactor_conn_write_ref(c, p, n, release, ctx, ctx2);
  if (rc) reactor_conn_force_close(c, CONN_ERROR); /* the head went alone */
  return rc;
}

int http_ws_send_close(conn_t *c, int code, const char *reason, size_t rlen) {
  char p[125];
  size_t n = 0;
  if (code != WS_CLOSE_NO_STATUS) {
    p[0] = (char)(code >> 8);
    p[1] = (char)code;
    if (rlen > 123) rlen = 123;
    if (rlen) memcpy(p + 2, reason, rlen);
    n = 2 + rlen;
  }
  return http_ws_send(c, WS_CLOSE, p, n);
}

char *http_sse_event(const char *data, size_t n, const char *ev, size_t evl,
                     const char *id, size_t idl, size_t room, size_t *out_len) {
  size_t lines = 1;
  for (size_t i = 0; i < n; i++)
    if (data[i] == '\n' || (data[i] == '\r' && (i + 1 >= n || data[i + 1] != '\n')))
      lines++;
  size_t cap = n + lines * 7 + (ev ? evl + 8 : 0) + (id ? idl + 5 : 0) + 2;
  char *base = malloc(room + cap);
  if (!base) return NULL;
  char *out = base + room;
  size_t at = 0;
  if (ev) {
    memcpy(out + at, "event: ", 7);
    memcpy(out + at + 7, ev, evl);
    at += 7 + evl;
    out[at++] = '\n';
  }
  if (id) {
    memcpy(out + at, "id: ", 4);
    memcpy(out + at + 4, id, idl);
    at += 4 + idl;
    out[at++] = '\n';
  }
  size_t start = 0;
  for (size_t i = 0; i <= n; i++) {
    bool end = i == n || data[i] == '\n' || data[i] == '\r';
    if (!end) continue;
    memcpy(out + at, "data: ", 6);
    memcpy(out + at + 6, data + start, i - start);
    at += 6 + i - start;
    out[at++] = '\n';
    if (i < n && data[i] == '\r' && i + 1 < n && data[i + 1] == '\n') i++;
    start = i + 1;
  }
  out[at++] = '\n';
  *out_len = at;
  return base;
}

/* ---- shared frames ---- */

http_frame_t *http_frame_ws(const char *body, size_t n, bool text) {
  return http_frame_ws_op(body, n, text ? WS_TEXT : WS_BINARY);
}

http_frame_t *http_frame_ws_op(const char *body, size_t n, int op) {
  char head[10];
  size_t h = ws_frame_head(head, op, true, n);
  http_frame_t *f = malloc(sizeof(*f) + h + n);
  if (!f) return NULL;
  memcpy(f->data, head, h);
  memcpy(f->data + h, body, n);
  f->len = h + n;
  f->refs = 1;
  return f;
}

http_frame_t *http_frame_sse(const char *body, size_t n) {
  size_t len;
  char *base = http_sse_event(body, n, NULL, 0, NULL, 0, sizeof(http_frame_t), &len);
  if (!base) return NULL;
  http_frame_t *f = (http_frame_t *)(void *)base;
  f->len = len;
  f->refs = 1;
  return f;
}

void http_frame_unref(http_frame_t *f) {
  if (f && --f->refs == 0) free(f);
}

static void st__frame_release(void *ctx, void *ctx2) {
  (void)ctx2;
  http_frame_unref(ctx);
}

int http_frame_send(conn_t *c, http_frame_t *f) {
  f->refs++; /* the write's; released when it completes or fails */
  int rc = reactor_conn_write_ref(c, f->data, f->len, st__frame_release, f, NULL);
  if (rc == -ENOBUFS || rc == -ENOMEM) /* can't keep up: cut, not a gap */
    reactor_conn_force_close(c, CONN_ERROR);
  return rc;
}
