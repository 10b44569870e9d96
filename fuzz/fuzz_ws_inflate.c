/* SPDX-License-Identifier: MIT */

/* fuzz_ws_inflate: a libFuzzer target for the WebSocket reader with
 * permessage-deflate agreed (src/http/ws.h, src/http/ws_deflate.h).
 *
 * Input: byte 0 picks the agreement (bit 0: the client's context
 * takeover; bits 1-3: the client's window bits, 9..15; bits 4-6: max_msg
 * out of a few sizes, so the limits are hit); byte 1 the mode; the rest:
 *   mode even: a stream of client frames, read as they are (mutated
 *     compressed frames: RSV1 anywhere, any payload);
 *   mode odd: messages (split at each 0xff byte) that a client-side ws_z
 *     deflates with the same agreement and frames here (fragmented when
 *     byte 1 says so), then bytes at positions taken from the input are
 *     flipped when bit 1 of byte 1 is set.
 * Checked: no message out is longer than max_msg; the inflate buffer
 * never holds more than max_msg + 1 bytes; text out is UTF-8; an
 * unmutated message comes out equal to what went in (or -1009 when it is
 * longer than max_msg); the reader and the streams leak nothing. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_check.h"
#include "http/ws.h"
#include "http/ws_deflate.h"

static const size_t fz_max[8] = {0, 1, 16, 125, 300, 4096, 70000, 1 << 20};

/* Frames a compressed message as a client would (mask 0, in `parts`
 * fragments, RSV1 on the first); appends to *out. */
static void fz_frame(char **out, size_t *len, const char *z, size_t zn, int op,
                     int parts) {
  static const unsigned char key[4] = {0, 0, 0, 0};
  size_t per = parts > 1 ? zn / (size_t)parts + 1 : zn;
  size_t at = 0;
  bool first = true;
  do {
    size_t k = zn - at < per ? zn - at : per;
    bool fin = at + k >= zn;
    char head[WS_MAX_HEAD];
    int o = first ? (op | WS_RSV1) : WS_CONT;
    size_t h = ws_frame_head_masked(head, o, fin, k, key);
    *out = realloc(*out, *len + h + k);
    FUZZ_CHECK(*out != NULL);
    memcpy(*out + *len, head, h);
    if (k) memcpy(*out + *len + h, z + at, k);
    *len += h + k;
    at += k;
    first = false;
  } while (at < zn);
}

typedef struct {
  const char *p;
  size_t n;
} fz_msg_t;

/* Reads the whole stream; checks every event. want: the messages that
 * went in (NULL: unknown). Returns the number of messages out. */
static size_t fz_read(ws_reader_t *r, char *in, size_t len,
                      const fz_msg_t *want, size_t nwant) {
  size_t got = 0, off = 0;
  for (;;) {
    ws_event_t ev;
    ssize_t n = ws_read(r, in + off, len - off, &ev);
    FUZZ_CHECK(r->zcap <= r->max_msg + 1 || r->zcap <= 16384);
    if (n <= 0) {
      if (want && n < 0 && got < nwant)
        FUZZ_CHECK(n == -WS_CLOSE_TOO_BIG && want[got].n > r->max_msg);
      break;
    }
    off += (size_t)n;
    if (ev.opcode == WS_TEXT || ev.opcode == WS_BINARY) {
      FUZZ_CHECK(ev.len <= r->max_msg);
      if (ev.opcode == WS_TEXT) FUZZ_CHECK(ws_utf8_valid(ev.data, ev.len));
      if (want) {
        FUZZ_CHECK(got < nwant);
        FUZZ_CHECK(ev.len == want[got].n);
        FUZZ_CHECK(ev.len == 0 || memcmp(ev.data, want[got].p, ev.len) == 0);
      }
      got++;
    }
  }
  return got;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  ws_pmd_t p = {
      .server_no_ctx = true,
      .client_no_ctx = !(data[0] & 1),
      .server_bits = 15,
      .client_bits = 9 + (data[0] >> 1 & 7) % 7,
  };
  size_t max_msg = fz_max[data[0] >> 4 & 7];
  int mode = data[1];
  const char *rest = (const char *)data + 2;
  size_t rlen = size - 2;

  ws_z_t *sz = ws_z_new(&p, true, 1);
  FUZZ_CHECK(sz != NULL);
  ws_reader_t r;
  ws_reader_init(&r, max_msg, true);
  r.z = sz;

  if (!(mode & 1)) {
    char *in = malloc(rlen ? rlen : 1);
    FUZZ_CHECK(in != NULL);
    memcpy(in, rest, rlen);
    fz_read(&r, in, rlen, NULL, 0);
    free(in);
  } else {
    /* messages split at 0xff, deflated by a client */
    ws_z_t *cz = ws_z_new(&p, false, 1 + (mode >> 4) % 9);
    FUZZ_CHECK(cz != NULL);
    fz_msg_t msgs[64];
    size_t nm = 0, at = 0;
    while (at <= rlen && nm < 64) {
      const char *e = memchr(rest + at, 0xff, rlen - at);
      size_t k = e ? (size_t)(e - (rest + at)) : rlen - at;
      msgs[nm].p = rest + at;
      msgs[nm].n = k;
      nm++;
      at += k + 1;
      if (!e) break;
    }
    char *stream = NULL;
    size_t slen = 0;
    for (size_t i = 0; i < nm; i++) {
      size_t zn = 0;
      char *z = ws_z_deflate(cz, msgs[i].p, msgs[i].n, 0, &zn);
      FUZZ_CHECK(z != NULL);
      int parts = 1 + (mode >> 2 & 3);
      fz_frame(&stream, &slen, z, zn, WS_BINARY, parts);
      free(z);
    }
    bool mutate = mode & 2;
    if (mutate && slen)
      for (size_t i = 0; i < rlen && i < 8; i++)
        stream[(unsigned char)rest[i] * 7919u % slen] ^= (char)(rest[i] | 1);
    if (stream) fz_read(&r, stream, slen, mutate ? NULL : msgs, nm);
    free(stream);
    ws_z_free(cz);
  }
  ws_reader_deinit(&r);
  ws_z_free(sz);
  return 0;
}
