/* SPDX-License-Identifier: MIT */

/* lx_moonport: the `moonport` module itself (luaopen_moonport), mp.listen,
 * mp.connect and the small functions of mp. Lane thread. */
#ifndef MP_LX_MOONPORT_H
#define MP_LX_MOONPORT_H

#include "lx/lx_conn.h"

/* mp.listen's body, with the service for each lane made by `make` from
 * the options table at idx (mp.http passes its own). */
int lx_listen_with(lua_State *L, lx_lane_t *ln,
                   lx_service_t *(*make)(lua_State *L, lx_lane_t *ln, int idx));

/* The `moonport` module loader (package.preload). */
int luaopen_moonport(lua_State *L);
#endif
