/* SPDX-License-Identifier: MIT */

/* lx_dns: mp.resolve, name lookups on the lane's c-ares resolver
 * (lx_client.h keeps the resolver). Lane thread. */
#ifndef MP_LX_DNS_H
#define MP_LX_DNS_H

#include "lx/lx_lane.h"

/* Registers mp.resolve into the module table at the top of L. */
void lx_dns_open(lua_State *L, lx_lane_t *ln);

#endif
