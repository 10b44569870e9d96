/* SPDX-License-Identifier: MIT */

/* lx_pubsub: mp.subscribe / mp.publish on a lane, and delivery of
 * messages to its subscribers (Lua callbacks, or frames forwarded from C
 * to WebSocket and SSE streams). Lane thread. */
#ifndef MP_LX_PUBSUB_H
#define MP_LX_PUBSUB_H

#include "lx/lx_lane.h"
#include "cluster/pubsub.h"

/* The module's state in a lane (lx_module.h: its row's slot and
 * lane_size): registry refs of its tables, made by lx_pubsub_init. */
typedef struct {
  int subs_ref, psubs_ref; /* { [channel or pattern] = { sub, ... } } */
  int conn_subs_ref;       /* { [uuid] = { sub, ... } } */
} lx_pubsub_lane_t;
extern int lx_pubsub_slot;
/* A new lane: makes the tables above (before the script runs). */
void lx_pubsub_init(lua_State *L, lx_lane_t *ln);

/* A message framed for the wire (lx_ws.c), shared by reference by the
 * write queues of every subscriber it goes to; freed with its last
 * reference. Lane thread. */
typedef struct http_frame lx_frame_t; /* http/ws_sse.h */

/* One message on its way to the subscribers of a lane that forward it
 * from C (a WebSocket's or an SSE stream's subscribe without a function):
 * what they share, made by the first that needs it. */
typedef struct {
  pubsub_msg_t *m;
  int text; /* the body is UTF-8: 1, 0, or -1 not known yet */
  /* The message as a WebSocket frame [0] and as an SSE event [1], built
   * once per dispatch; the dispatch holds one reference to each. */
  lx_frame_t *frame[2];
  /* The message deflated once for the subscribers that agreed
   * permessage-deflate without server context takeover (window bits
   * zbits, level zlevel), as a frame; NULL until one needs it. */
  lx_frame_t *zframe;
  int zbits, zlevel;
} lx_fwd_ctx_t;
/* Drops the dispatch's references to the frames in ctx (a frame still
 * queued to a subscriber lives on until that write completes or its
 * connection closes). Lane thread. */
void lx_fwd_ctx_done(lx_fwd_ctx_t *ctx);
/* Sends the message in ctx to connection c (open, of this lane), or to
 * its HTTP/2 stream sid (0: the connection itself). */
typedef void (*lx_forward_fn)(lx_lane_t *ln, conn_t *c, int32_t sid,
                              lx_fwd_ctx_t *ctx);

/* Adds subscribe and publish to the module table at the top of L. */
void lx_pubsub_open(lua_State *L, lx_lane_t *ln);
/* subscribe(channel, fn [, opts]) with arguments from stack index `base`,
 * owned by connection uuid (0: none); pushes the subscription. */
int lx_subscribe(lua_State *L, lx_lane_t *ln, int base, sock_uuid_t uuid,
                 lx_forward_fn fwd);
/* The same, owned by HTTP/2 stream sid of connection uuid (an event
 * stream, http/h2_stream.h); fwd gets sid. */
int lx_subscribe_stream(lua_State *L, lx_lane_t *ln, int base, sock_uuid_t uuid,
                        int32_t sid, lx_forward_fn fwd);
/* Cancels the subscriptions of a connection that closed (its streams'
 * too). */
void lx_pubsub_conn_closed(lx_lane_t *ln, sock_uuid_t uuid);
/* Cancels those of HTTP/2 stream sid of connection uuid, which closed
 * (the connection's entry goes with its last stream's); sid 0: the
 * connection's, as lx_pubsub_conn_closed. */
void lx_pubsub_stream_closed(lx_lane_t *ln, sock_uuid_t uuid, int32_t sid);
/* Cancels every subscription of a lane (it is retired). */
void lx_pubsub_cancel_all(lx_lane_t *ln);
/* Calls this lane's subscribers of message m. */
void lx_pubsub_dispatch(lx_lane_t *ln, pubsub_msg_t *m);
#endif
