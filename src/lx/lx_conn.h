/* SPDX-License-Identifier: MIT */

/* lx_conn: services (a listener's or a client's handlers and options)
 * and the Lua connection object; the helpers other classes use for
 * userdata with an `env` table. Lane thread. */
#ifndef MP_LX_CONN_H
#define MP_LX_CONN_H

#include "lx/lx_lane.h"
#include "lx/lx_service.h"

/* Makes metatable `name` (left on the stack) for userdata objects whose
 * methods are C closures with upvalues (the lane, the metatable), and
 * whose `env` field is a table made on first use. */
void lx_meta_env(lua_State *L, lx_lane_t *ln, const char *name,
                 const luaL_Reg *methods);
/* Pushes a new userdata of `size` bytes with metatable `name` (made by
 * lx_meta_env) and returns it. */
void *lx_new_env_ud(lua_State *L, size_t size, const char *name);
/* In a method made by lx_meta_env: argument 1 as that object, or raises. */
void *lx_check_self(lua_State *L, const char *name);

/* A function, or a table or userdata whose metatable has __call (an
 * mp.router), at idx. */
bool lx_is_callable(lua_State *L, int idx);
/* Pushes c's peer: ip, port (Unix sockets: "unix", path), or nil for
 * NULL or an unknown peer. Returns the count pushed. */
int lx_push_peer(lua_State *L, conn_t *c);
/* A write's release callback for a Lua string kept alive while queued:
 * ctx is the lane, ctx2 the registry ref to drop. */
void lx_unref_release(void *ctx, void *ctx2);
/* Registers the connection metatable in L. */
void lx_conn_open(lua_State *L, lx_lane_t *ln);
/* Reads the on_* handlers and options of table at `idx` into a new
 * service (raises on bad values). */
lx_service_t *lx_service_new(lua_State *L, lx_lane_t *ln, int idx,
                             bool client);
/* lx_service_new for a listener (idx: the options table). */
lx_service_t *lx_service_new_server(lua_State *L, lx_lane_t *ln, int idx);
/* Puts a service made elsewhere (HTTP) on its lane's list. */
void lx_service_link(lx_service_t *s);
/* Frees a service when nothing uses it any more. */
void lx_service_maybe_free(lx_service_t *s);
void lx_service_free(lx_service_t *s);
/* Pushes the connection object for c (made on first use). */
void lx_conn_push(lua_State *L, lx_lane_t *ln, conn_t *c);
/* Pushes a connection object that is already closed. */
void lx_conn_push_closed(lua_State *L, lx_lane_t *ln);
#endif
