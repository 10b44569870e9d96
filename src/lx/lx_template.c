/* SPDX-License-Identifier: MIT */

/* lx_template: registers mp.template (lx_template.h). */
#include <lua.h>

#include "lx/lx_embed.h"
#include "lx/lx_template.h"

void lx_template_open(lua_State *L, lx_lane_t *ln) {
  (void)ln;
  lx_require(L, "moonport.template");
  lua_setfield(L, -2, "template");
}
