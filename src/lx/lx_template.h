/* SPDX-License-Identifier: MIT */

/* lx_template: mp.template (lua/moonport/template.lua), HTML templates
 * compiled to Lua; all Lua, nothing of its own to end. Lane thread only. */
#ifndef MP_LX_TEMPLATE_H
#define MP_LX_TEMPLATE_H

#include "lx/lx_lane.h"

/* Sets mp.template in the module table at the top of L. */
void lx_template_open(lua_State *L, lx_lane_t *ln);

#endif
