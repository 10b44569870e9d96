/* SPDX-License-Identifier: MIT */

/* lx_crypto: registers mp.crypto and mp.jwt (lx_crypto.h). Both are Lua
 * over the FFI; the C here only makes sure the core's functions are in
 * the binary. */
#include <lauxlib.h>
#include <lua.h>

#include "core/crypto.h"
#include "core/log.h"
#include "lx/lx_crypto.h"
#include "lx/lx_embed.h"

/* One function of each core object crypto.lua and jwt.lua call through
 * ffi.C: named here so the linker takes those objects out of the core
 * archive (nothing else in the binary may call them) and -rdynamic
 * exports them. */
void *const lx_crypto_ffi[] = {(void *)crypto_hash, (void *)crypto_pkey_verify};

void lx_crypto_open(lua_State *L, lx_lane_t *ln) {
  (void)ln;
  /* A missing algorithm (MD5 under a FIPS-only provider) fails only the
   * calls that use it, each with nil, err. */
  if (crypto_init())
    log_warn("mp.crypto: libcrypto lacks an algorithm; the calls using it fail");
  lx_require(L, "moonport.crypto");
  lua_setfield(L, -2, "crypto");
}

void lx_jwt_open(lua_State *L, lx_lane_t *ln) {
  (void)ln;
  lx_require(L, "moonport.jwt");
  lua_setfield(L, -2, "jwt");
}
