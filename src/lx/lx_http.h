/* SPDX-License-Identifier: MIT */

/* lx_http: the Lua face of mp.http (the req and res objects and the
 * hooks of src/http/server.h that run Lua). Lane thread. */
#ifndef MP_LX_HTTP_H
#define MP_LX_HTTP_H

#include "lx/lx_conn.h"
#include "lx/lx_lane.h"

/* The module's state in a lane (lx_module.h: its row's slot and
 * lane_size). */
typedef struct {
  struct http_cache *cache; /* src/http's (http/server.h); lx_http_lane_free */
  struct h2_pool *h2_pool;  /* the same, for HTTP/2 sessions' pages */
} lx_http_lane_t;
extern int lx_http_slot;

/* Adds mp.http to the module table at the top of L. */
void lx_http_open(lua_State *L, lx_lane_t *ln);
/* Frees what mp.http keeps per lane (buffers idle connections gave back);
 * after the lane's connections are gone. */
void lx_http_lane_free(lx_lane_t *ln);
#endif
