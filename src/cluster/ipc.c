/* SPDX-License-Identifier: MIT */

/* ipc: framing for the root-worker socketpairs. */
#include "cluster/ipc.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

void ipc_header(char *out, int type, unsigned flags, size_t clen,
                size_t mlen) {
  uint32_t body = (uint32_t)(clen + mlen);
  uint16_t c = (uint16_t)clen;
  memcpy(out, &body, 4);
  out[4] = (char)type;
  out[5] = (char)flags;
  memcpy(out + 6, &c, 2);
}

void ipc_reader_init(ipc_reader_t *r, size_t max_body) {
  memset(r, 0, sizeof(*r));
  r->max_body = max_body;
}

void ipc_reader_deinit(ipc_reader_t *r) {
  free(r->body);
  r->body = NULL;
}

int ipc_reader_feed(ipc_reader_t *r, const char *data, size_t len,
                    ipc_frame_fn on_frame, ipc_oversize_fn on_oversize,
                    void *arg) {
  while (len > 0) {
    if (r->skip > 0) {
      size_t n = len < r->skip ? len : r->skip;
      r->skip -= n;
      data += n;
      len -= n;
      continue;
    }
    if (r->hdr_have < IPC_HEADER) {
      size_t n = IPC_HEADER - r->hdr_have;
      if (n > len) n = len;
      memcpy(r->hdr + r->hdr_have, data, n);
      r->hdr_have += n;
      data += n;
      len -= n;
      if (r->hdr_have < IPC_HEADER) break;
      uint32_t body;
      uint16_t clen;
      memcpy(&body, r->hdr, 4);
      memcpy(&clen, r->hdr + 6, 2);
      if (body > r->max_body || clen > body) {
        if (on_oversize) on_oversize(body, r->max_body, arg);
        r->skip = body;
        r->hdr_have = 0;
        continue;
      }
      r->body_len = body;
      r->body_have = 0;
      r->body = malloc(body ? body : 1);
      if (!r->body) {
        r->skip = body;
        r->hdr_have = 0;
        return -ENOMEM;
      }
    }
    size_t n = r->body_len - r->body_have;
    if (n > len) n = len;
    memcpy(r->body + r->body_have, data, n);
    r->body_have += n;
    data += n;
    len -= n;
    if (r->body_have < r->body_len) break;
    uint16_t clen;
    memcpy(&clen, r->hdr + 6, 2);
    char *body = r->body;
    r->body = NULL;
    r->hdr_have = 0;
    on_frame((unsigned char)r->hdr[4], (unsigned char)r->hdr[5], body, clen,
             body + clen, r->body_len - clen, arg);
    free(body);
  }
  return 0;
}
