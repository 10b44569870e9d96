/* lx_shared: the Lua face of mp.shared dictionaries (src/core/shdict.c). */
#ifndef MP_LX_SHARED_H
#define MP_LX_SHARED_H

#include "lx/lx_lane.h"

/* Adds mp.shared to the module table at the top of L. */
void lx_shared_open(lua_State *L, lx_lane_t *ln);
#endif
