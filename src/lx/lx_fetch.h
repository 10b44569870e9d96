/* SPDX-License-Identifier: MIT */

/* lx_fetch: mp.fetch, the HTTP/1.1 client (lua/moonport/fetch.lua), and
 * the one C primitive it needs: core.fetch.parse, the response head parsed
 * by src/http/http1_response.c into Lua values. Everything else (the URL,
 * the request, the body framing, redirects, the pool) is Lua over mp.tcp.
 * Lane thread only. */
#ifndef MP_LX_FETCH_H
#define MP_LX_FETCH_H

#include "lx/lx_lane.h"

/* Registers core.fetch.parse and sets mp.fetch in the module table at the
 * top of L (after lx_client_open: fetch.lua uses mp.tcp). */
void lx_fetch_open(lua_State *L, lx_lane_t *ln);

#endif
