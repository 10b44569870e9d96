/* SPDX-License-Identifier: MIT */

/* lx_tcp: mp.tcp, client sockets whose calls wait only their coroutine,
 * their keep-alive pool (in the lane's lx_client_t), and the protocol of
 * mp.listen services with on_connect. Lane thread. */
#ifndef MP_LX_TCP_H
#define MP_LX_TCP_H

#include "lx/lx_conn.h"

/* Registers mp.tcp's C half into the module table at the top of L. */
void lx_tcp_open(lua_State *L, lx_lane_t *ln);
/* The lane is going: closes every socket's connection and the pool's.
 * Before the reactor is freed. */
void lx_tcp_lane_close(lx_lane_t *ln);
/* lx_service_new_server for mp.listen: a service whose options have
 * on_connect gets lx_tcp_server_proto, so each accepted connection
 * becomes an mp.tcp socket passed to on_connect in a coroutine of its
 * own (the service's max_buffer, max_line). Raises like
 * lx_service_new_server. */
lx_service_t *lx_tcp_service_new(lua_State *L, lx_lane_t *ln, int idx);

#endif
