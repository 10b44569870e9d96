/* SPDX-License-Identifier: MIT */

/* Unit test: WebSocket frames, the accept key and UTF-8 checks. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "http/ws.h"

/* A masked client frame of `op` with payload p[0..n) into out. */
static size_t client_frame(char *out, int op, bool fin, const char *p, size_t n) {
  size_t h = ws_frame_head(out, op, fin, n);
  out[1] |= (char)0x80;
  const unsigned char mask[4] = {0x37, 0xfa, 0x21, 0x3d};
  memcpy(out + h, mask, 4);
  for (size_t i = 0; i < n; i++) out[h + 4 + i] = (char)(p[i] ^ mask[i & 3]);
  return h + 4 + n;
}

static void test_accept(void) {
  char out[29];
  ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", 24, out); /* RFC 6455 1.3 */
  CHECK(strcmp(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=") == 0);
}

static void test_utf8(void) {
  CHECK(ws_utf8_valid("", 0));
  CHECK(ws_utf8_valid("hello, world: plain ascii text", 30));
  CHECK(ws_utf8_valid("\xce\xba\xe1\xbd\xb9\xcf\x83\xce\xbc\xce\xb5", 11));
  CHECK(ws_utf8_valid("\xf4\x8f\xbf\xbf", 4));       /* U+10FFFF */
  CHECK(!ws_utf8_valid("\xf4\x90\x80\x80", 4));      /* past it */
  CHECK(!ws_utf8_valid("\xed\xa0\x80", 3));          /* a surrogate */
  CHECK(!ws_utf8_valid("\xc0\xaf", 2));              /* overlong */
  CHECK(!ws_utf8_valid("\xe0\x80\xaf", 3));          /* overlong */
  CHECK(!ws_utf8_valid("abcdefgh\xce", 9));          /* cut short */
  CHECK(!ws_utf8_valid("\x80", 1));
  CHECK(!ws_utf8_valid("\xff", 1));
}

static void test_heads(void) {
  char h[10];
  CHECK_EQ(ws_frame_head(h, WS_TEXT, true, 5), 2);
  CHECK_EQ((unsigned char)h[0], 0x81);
  CHECK_EQ(h[1], 5);
  CHECK_EQ(ws_frame_head(h, WS_BINARY, true, 300), 4);
  CHECK_EQ((unsigned char)h[1], 126);
  CHECK_EQ(((unsigned char)h[2] << 8) | (unsigned char)h[3], 300);
  CHECK_EQ(ws_frame_head(h, WS_BINARY, false, 70000), 10);
  CHECK_EQ((unsigned char)h[0], 0x02);
  CHECK_EQ((unsigned char)h[1], 127);
  CHECK_EQ((unsigned char)h[7], 0x01);
  CHECK_EQ((unsigned char)h[8], 0x11);
  CHECK_EQ((unsigned char)h[9], 0x70);
}

static void test_read(void) {
  ws_reader_t r;
  ws_reader_init(&r, 1000, true);
  ws_event_t ev;
  char buf[4096];
  size_t n = client_frame(buf, WS_TEXT, true, "Hello", 5);
  for (size_t i = 0; i < n; i++) CHECK_EQ(ws_read(&r, buf, i, &ev), 0);
  CHECK_EQ(ws_read(&r, buf, n, &ev), (long long)n);
  CHECK_EQ(ev.opcode, WS_TEXT);
  CHECK(ev.len == 5 && memcmp(ev.data, "Hello", 5) == 0);

  /* fragments with a ping between them */
  size_t at = client_frame(buf, WS_TEXT, false, "Hel", 3);
  at += client_frame(buf + at, WS_PING, true, "p", 1);
  at += client_frame(buf + at, WS_CONT, true, "lo", 2);
  ssize_t used = ws_read(&r, buf, at, &ev);
  CHECK(used > 0 && ev.opcode == 0);
  size_t off = (size_t)used;
  used = ws_read(&r, buf + off, at - off, &ev);
  CHECK(ev.opcode == WS_PING && ev.len == 1 && ev.data[0] == 'p');
  off += (size_t)used;
  used = ws_read(&r, buf + off, at - off, &ev);
  CHECK_EQ(off + (size_t)used, at);
  CHECK(ev.opcode == WS_TEXT && ev.len == 5 && memcmp(ev.data, "Hello", 5) == 0);

  /* the limits and the rules */
  static char big[1001];
  memset(big, 'x', sizeof(big));
  n = client_frame(buf, WS_BINARY, true, big, 1001);
  CHECK_EQ(ws_read(&r, buf, 4, &ev), -WS_CLOSE_TOO_BIG); /* from the head */
  n = client_frame(buf, WS_BINARY, false, big, 600);
  CHECK_EQ(ws_read(&r, buf, n, &ev), (long long)n);
  n = client_frame(buf, WS_CONT, true, big, 401);
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_TOO_BIG);
  ws_reader_deinit(&r);
  ws_reader_init(&r, 1000, true);
  n = ws_frame_head(buf, WS_TEXT, true, 0); /* unmasked */
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_PROTOCOL);
  n = client_frame(buf, WS_CONT, true, "x", 1);
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_PROTOCOL);
  n = client_frame(buf, WS_PING, false, "x", 1);
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_PROTOCOL);
  n = client_frame(buf, WS_PING, true, big, 126);
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_PROTOCOL);
  n = client_frame(buf, WS_TEXT, true, "\xff", 1);
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_BAD_DATA);
  n = client_frame(buf, 3, true, "x", 1); /* reserved opcode */
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_PROTOCOL);
  n = client_frame(buf, WS_TEXT, true, "x", 1);
  buf[0] |= 0x40; /* RSV1 without an extension */
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_PROTOCOL);
  n = client_frame(buf, WS_TEXT, false, "a", 1);
  CHECK_EQ(ws_read(&r, buf, n, &ev), (long long)n);
  n = client_frame(buf, WS_TEXT, true, "b", 1); /* a new message inside one */
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_PROTOCOL);
  ws_reader_deinit(&r);

  /* close frames */
  ws_reader_init(&r, 1000, true);
  n = client_frame(buf, WS_CLOSE, true, "\x03\xe8" "bye", 5);
  CHECK_EQ(ws_read(&r, buf, n, &ev), (long long)n);
  CHECK(ev.opcode == WS_CLOSE && ev.code == 1000 && ev.len == 3);
  n = client_frame(buf, WS_CLOSE, true, "", 0);
  CHECK_EQ(ws_read(&r, buf, n, &ev), (long long)n);
  CHECK(ev.code == WS_CLOSE_NO_STATUS && ev.len == 0);
  n = client_frame(buf, WS_CLOSE, true, "\x03", 1);
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_PROTOCOL);
  n = client_frame(buf, WS_CLOSE, true, "\x03\xed", 2); /* 1005 */
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_PROTOCOL);
  n = client_frame(buf, WS_CLOSE, true, "\x0f\xa0", 2); /* 4000 */
  CHECK_EQ(ws_read(&r, buf, n, &ev), (long long)n);
  n = client_frame(buf, WS_CLOSE, true, "\x03\xe8\xff", 3);
  CHECK_EQ(ws_read(&r, buf, n, &ev), -WS_CLOSE_BAD_DATA);
  ws_reader_deinit(&r);
}

/* The client's writer: a masked head, then ws_mask; a server's reader
 * gets the payload back, at every length class. */
static void test_masked(void) {
  const unsigned char key[4] = {0x01, 0x80, 0xfe, 0x5a};
  static char buf[70000 + WS_MAX_HEAD];
  static char msg[70000];
  for (size_t i = 0; i < sizeof(msg); i++) msg[i] = (char)('a' + i % 26);
  const size_t lens[] = {0, 5, 125, 126, 65535, 65536, 70000};
  const size_t heads[] = {6, 6, 6, 8, 8, 14, 14};
  for (int k = 0; k < 7; k++) {
    size_t h = ws_frame_head_masked(buf, WS_BINARY, true, lens[k], key);
    CHECK_EQ(h, heads[k]);
    CHECK(((unsigned char)buf[1] & 0x80) != 0);
    memcpy(buf + h, msg, lens[k]);
    ws_mask(buf + h, lens[k], key);
    if (lens[k] >= 4) CHECK(memcmp(buf + h, msg, 4) != 0);
    ws_reader_t r;
    ws_reader_init(&r, 1 << 20, true);
    ws_event_t ev;
    CHECK_EQ(ws_read(&r, buf, h + lens[k], &ev), (long long)(h + lens[k]));
    CHECK(ev.opcode == WS_BINARY && ev.len == lens[k]);
    CHECK(lens[k] == 0 || memcmp(ev.data, msg, lens[k]) == 0);
    ws_reader_deinit(&r);
  }
}

int main(void) {
  test_masked();
  test_accept();
  test_utf8();
  test_heads();
  test_read();
  return check_summary();
}
