/* lx_pubsub: mp.subscribe / mp.publish on a lane, and delivery of
 * messages to its subscribers (Lua callbacks, or frames forwarded from C
 * to WebSocket and SSE streams). Lane thread. */
#ifndef MP_LX_PUBSUB_H
#define MP_LX_PUBSUB_H

#include "lx/lx_lane.h"
#include "cluster/pubsub.h"

/* A message framed for the wire (lx_ws.c), shared by reference by the
 * write queues of every subscriber it goes to; freed with its last
 * reference. Lane thread. */
typedef struct http_frame lx_frame_t; /* http/stream.h */

/* One message on its way to the subscribers of a lane that forward it
 * from C (a WebSocket's or an SSE stream's subscribe without a function):
 * what they share, made by the first that needs it. */
typedef struct {
  pubsub_msg_t *m;
  int text; /* the body is UTF-8: 1, 0, or -1 not known yet */
  /* The message as a WebSocket frame [0] and as an SSE event [1], built
   * once per dispatch; the dispatch holds one reference to each. */
  lx_frame_t *frame[2];
} lx_fwd_ctx_t;
/* Drops the dispatch's references to the frames in ctx (a frame still
 * queued to a subscriber lives on until that write completes or its
 * connection closes). Lane thread. */
void lx_fwd_ctx_done(lx_fwd_ctx_t *ctx);
/* Sends the message in ctx to connection c (open, of this lane). */
typedef void (*lx_forward_fn)(lx_lane_t *ln, conn_t *c, lx_fwd_ctx_t *ctx);

/* Adds subscribe and publish to the module table at the top of L. */
void lx_pubsub_open(lua_State *L, lx_lane_t *ln);
/* subscribe(channel, fn [, opts]) with arguments from stack index `base`,
 * owned by connection uuid (0: none); pushes the subscription. */
int lx_subscribe(lua_State *L, lx_lane_t *ln, int base, sock_uuid_t uuid,
                 lx_forward_fn fwd);
/* Cancels the subscriptions of a connection that closed. */
void lx_pubsub_conn_closed(lx_lane_t *ln, sock_uuid_t uuid);
/* Cancels every subscription of a lane (it is retired). */
void lx_pubsub_cancel_all(lx_lane_t *ln);
/* Calls this lane's subscribers of message m. */
void lx_pubsub_dispatch(lx_lane_t *ln, pubsub_msg_t *m);
#endif
