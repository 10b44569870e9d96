/* SPDX-License-Identifier: MIT */

/* lx_log: mp.log. */
#ifndef MP_LX_LOG_H
#define MP_LX_LOG_H

#include "lx/lx_lane.h"

/* mp.log(level, ...). Any lane. */
int lx_log(lua_State *L);
#endif
