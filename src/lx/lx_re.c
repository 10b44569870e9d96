/* SPDX-License-Identifier: MIT */

/* lx_re: core.re for lua/moonport/re.lua (lx_re.h). The matching itself
 * is Lua over the FFI: a match from compiled Lua is then one C call into
 * PCRE2's JIT code, where the C API would add a stack round trip per
 * argument and per capture. What C gives here is what the FFI can't
 * read from a header: the constants, and a reference to libpcre2-8 so
 * the binary links it and ffi.C finds its functions. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <lauxlib.h>
#include <lua.h>
#include <pcre2.h>
#include <stdint.h>

#include "lx/lx_embed.h"
#include "lx/lx_re.h"

static const struct {
  const char *name;
  lua_Number value;
} consts[] = {
    {"CASELESS", PCRE2_CASELESS},
    {"MULTILINE", PCRE2_MULTILINE},
    {"DOTALL", PCRE2_DOTALL},
    {"EXTENDED", PCRE2_EXTENDED},
    {"UTF", PCRE2_UTF},
    {"ANCHORED", PCRE2_ANCHORED},
    {"NO_UTF_CHECK", PCRE2_NO_UTF_CHECK},
    {"NOTEMPTY_ATSTART", PCRE2_NOTEMPTY_ATSTART},
    {"JIT_COMPLETE", PCRE2_JIT_COMPLETE},
    {"INFO_CAPTURECOUNT", PCRE2_INFO_CAPTURECOUNT},
    {"INFO_NAMECOUNT", PCRE2_INFO_NAMECOUNT},
    {"INFO_NAMEENTRYSIZE", PCRE2_INFO_NAMEENTRYSIZE},
    {"INFO_NAMETABLE", PCRE2_INFO_NAMETABLE},
    {"ERROR_NOMATCH", PCRE2_ERROR_NOMATCH},
    {"ERROR_MATCHLIMIT", PCRE2_ERROR_MATCHLIMIT},
    {"ERROR_JIT_STACKLIMIT", PCRE2_ERROR_JIT_STACKLIMIT},
    {"ERROR_DEPTHLIMIT", PCRE2_ERROR_DEPTHLIMIT},
    {"ERROR_UTF8_FIRST", PCRE2_ERROR_UTF8_ERR1},
    {"ERROR_UTF8_LAST", PCRE2_ERROR_UTF8_ERR21},
};

void lx_re_open(lua_State *L, lx_lane_t *ln) {
  (void)ln;
  lx_embed_core_table(L, "re");
  for (size_t i = 0; i < sizeof(consts) / sizeof(consts[0]); i++) {
    lua_pushnumber(L, consts[i].value);
    lua_setfield(L, -2, consts[i].name);
  }
  uint32_t jit = 0;
  if (pcre2_config(PCRE2_CONFIG_JIT, &jit) < 0) jit = 0;
  lua_pushboolean(L, jit == 1);
  lua_setfield(L, -2, "jit");
  lua_pop(L, 1);
  lx_require(L, "moonport.re");
  lua_setfield(L, -2, "re");
}
