/* SPDX-License-Identifier: MIT */

/* lx_shared: the Lua face of mp.shared dictionaries (src/core/shdict.c). */
#ifndef MP_LX_SHARED_H
#define MP_LX_SHARED_H

#include "lx/lx_lane.h"

/* Adds mp.shared to the module table at the top of L. */
void lx_shared_open(lua_State *L, lx_lane_t *ln);
/* The FFI's get path (lua/moonport/shared.lua declares it with ffi.cdef;
 * see lx_shared.c). */
int moonport_shared_get(void *h, const char *k, size_t klen, double *num,
                        const char **s, size_t *len, uint32_t *flags);
/* mp.limit's GCRA decision (lua/moonport/limit.lua declares it with
 * ffi.cdef; see lx_shared.c). */
int moonport_shared_gcra(void *h, const char *p, size_t pl, const char *k,
                         size_t kl, double interval_us, double tolerance_us,
                         double n, double *wait_us);

/* The dictionary `name` of this process, or NULL. Any thread (takes
 * srv->shared_lock); dictionaries live until exit. */
struct shdict *lx_shared_find(lx_server_t *srv, const char *name);
#endif
