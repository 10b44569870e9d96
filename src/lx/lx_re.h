/* SPDX-License-Identifier: MIT */

/* lx_re: mp.re, regular expressions on PCRE2 with its JIT
 * (lua/moonport/re.lua, which calls libpcre2-8 through LuaJIT's FFI).
 * Lane thread only. */
#ifndef MP_LX_RE_H
#define MP_LX_RE_H

#include "lx/lx_lane.h"

/* Puts PCRE2's constants (from pcre2.h, so the Lua half hard-codes none)
 * and whether its JIT works here in core.re, then sets mp.re in the
 * module table at the top of L. */
void lx_re_open(lua_State *L, lx_lane_t *ln);

#endif
