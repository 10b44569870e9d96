/* SPDX-License-Identifier: MIT */

/* lx_wsc: the C half of mp.websocket, the WebSocket client
 * (lua/moonport/websocket.lua). It lends the Lua side the server's frame
 * code (http/ws.h): the reader of frames (here refusing masked ones, which
 * only a client may send), masked frames with a fresh random key each, the
 * handshake key and its expected accept value, and the 101's parse
 * (http/http1_response.h). The socket is an mp.connect connection; all
 * state is in Lua values: any lane, its own thread only. */
#ifndef MP_LX_WSC_H
#define MP_LX_WSC_H

#include "lx/lx_lane.h"

/* Fills core.wsc (lx_embed.h) and sets mp.websocket in the module table
 * at the top of L (luaopen_moonport). */
void lx_wsc_open(lua_State *L, lx_lane_t *ln);

#endif
