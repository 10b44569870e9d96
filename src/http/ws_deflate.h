/* SPDX-License-Identifier: MIT */

/* ws_deflate: the permessage-deflate extension of WebSocket (RFC 7692)
 * without sockets: the parameter negotiation (a server's answer to a
 * client's offers; a client's offer and its check of the answer), and
 * the compression of messages on zlib.
 *
 * Memory: without context takeover in a direction, no zlib state is kept
 * for it between messages: each message is compressed (or inflated) by
 * a stream kept per thread and reset for it, so an idle connection that
 * agreed no context takeover both ways holds only its ws_z_t (a few
 * dozen bytes). With context takeover the connection keeps its own
 * stream: deflate (1 << (bits + 2)) + (1 << (WS_Z_MEMLEVEL + 9)) bytes
 * plus about 6 KiB, 192 KiB at 15 bits; inflate (1 << bits) plus about
 * 7 KiB, 39 KiB at 15 bits.
 *
 * Threads: a ws_z_t belongs to its connection's thread; the per-thread
 * streams are that thread's alone. */
#ifndef MP_WS_DEFLATE_H
#define MP_WS_DEFLATE_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The RSV1 bit of a frame's first byte: the message is compressed. It
 * may be or'ed into the opcode given to ws_frame_head. */
#define WS_RSV1 0x40
/* memLevel of the deflate streams */
#define WS_Z_MEMLEVEL 7

/* The parameters of one agreement (or what a side wants). Window bits
 * are 8..15 (15: no limit). */
typedef struct {
  bool server_no_ctx; /* server_no_context_takeover */
  bool client_no_ctx; /* client_no_context_takeover */
  int server_bits;    /* server_max_window_bits */
  int client_bits;    /* client_max_window_bits */
} ws_pmd_t;

/* The settings of a side. */
typedef struct {
  ws_pmd_t want;
  size_t threshold; /* messages shorter than this go uncompressed */
  int level;        /* zlib level, 1..9 */
} ws_pmd_cfg_t;

/* Fills cfg with the defaults: no server context takeover (the server's
 * messages are deflated alone, so a fan-out deflates once), the client's
 * context takeover as the client offers it (client_no_context_takeover
 * is answered only when offered: npm ws refuses it in an answer when its
 * user asked for takeover), 15 bits either way, threshold 64, level 1
 * (the fastest: a realtime message is small, a higher level buys little
 * on it). */
void ws_pmd_cfg_init(ws_pmd_cfg_t *cfg);

/* Server: reads a client's Sec-WebSocket-Extensions value (its offers in
 * order, comma-separated, each with parameters) and takes the first
 * permessage-deflate offer it can agree to (an offer with an unknown or
 * repeated parameter or a bad value is skipped, as is one that asks for
 * a server window of 8 bits, which zlib cannot keep to). Returns 1 with
 * *out and the answer's value in resp (NUL-terminated, at most cap
 * bytes; 160 are always enough), or 0 for no agreement. Pure. */
int ws_pmd_accept(const ws_pmd_cfg_t *cfg, const char *v, size_t len,
                  ws_pmd_t *out, char *resp, size_t cap);
/* Client: writes the offer for cfg (NUL-terminated, 160 bytes are
 * enough); returns its length. */
size_t ws_pmd_offer(const ws_pmd_cfg_t *cfg, char *out, size_t cap);
/* Client: checks the server's Sec-WebSocket-Extensions answer to that
 * offer. 1 with *out when it agrees permessage-deflate, 0 when the value
 * is empty (NULL: no field), -1 when it names anything else or breaks
 * the rules (the client must fail the connection, RFC 7692 5). */
int ws_pmd_agreed(const ws_pmd_cfg_t *cfg, const char *v, size_t len,
                  ws_pmd_t *out);

/* A connection's compression state. */
typedef struct ws_z ws_z_t;
/* For a connection that agreed p, on the `server` side or the client's,
 * compressing at `level`. NULL with errno (ENOMEM). */
ws_z_t *ws_z_new(const ws_pmd_t *p, bool server, int level);
void ws_z_free(ws_z_t *z);
/* Whether this side's messages are compressed without context (each one
 * alone, so one compressed frame fits every connection with the same
 * window bits and level: ws_z_send_bits). */
bool ws_z_send_alone(const ws_z_t *z);
int ws_z_send_bits(const ws_z_t *z);

/* Compresses one message p[0..n) for sending (the trailing 00 00 ff ff
 * of the flush left out, RFC 7692 7.2.1). The result is `room` bytes for
 * the caller (a frame head, say) and then *olen bytes, in a new malloc'd
 * buffer; NULL when out of memory. */
char *ws_z_deflate(ws_z_t *z, const char *p, size_t n, size_t room,
                   size_t *olen);
/* The same with no connection: without context, at `bits` and `level`
 * (a message fanned out to every connection that sends alone). */
char *ws_z_deflate_alone(int bits, int level, const char *p, size_t n,
                         size_t room, size_t *olen);

/* Inflates one received message p[0..n) into *buf (malloc'd, *cap bytes,
 * grown as needed and kept by the caller), its length in *olen. At most
 * max bytes come out: past them it stops, having made at most max + 1,
 * and returns -1009 (the message is too big), however much more the
 * input would make. 0, -1009, -1007 (not deflate data), or -ENOMEM. */
int ws_z_inflate(ws_z_t *z, const char *p, size_t n, size_t max, char **buf,
                 size_t *cap, size_t *olen);

#endif
