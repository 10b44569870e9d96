/* SPDX-License-Identifier: MIT */

/* lx_crypto: mp.crypto (lua/moonport/crypto.lua) and mp.jwt
 * (lua/moonport/jwt.lua), Lua over src/core/crypto.c and crypto_pkey.c
 * through LuaJIT's FFI. Lane thread only. */
#ifndef MP_LX_CRYPTO_H
#define MP_LX_CRYPTO_H

#include "lx/lx_lane.h"

/* Sets mp.crypto in the module table at the top of L. Fetches libcrypto's
 * algorithms first (once per process), which also links src/core/crypto.o
 * into the binary, whose exported crypto_* functions crypto.lua calls. */
void lx_crypto_open(lua_State *L, lx_lane_t *ln);

/* Sets mp.jwt in the module table at the top of L (after lx_crypto_open:
 * jwt.lua is written over mp.crypto). */
void lx_jwt_open(lua_State *L, lx_lane_t *ln);

#endif
