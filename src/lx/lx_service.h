/* SPDX-License-Identifier: MIT */

/* lx_service: the type of a service (a listener's or a client's handlers
 * and options, with its protocol), alone, so the files that only read a
 * service (lx_listen.c, lx_tls.c) need not include lx_conn.h, which makes
 * and frees them. Lane thread. */
#ifndef MP_LX_SERVICE_H
#define MP_LX_SERVICE_H

#include "lx/lx_lane.h"

/* A set of handlers with its protocol: a listener's, or one client's. */
typedef struct lx_service {
  proto_t proto;
  lx_lane_t *ln;
  int on_open, on_data, on_ready, on_timeout, on_shutdown, on_close,
      on_fail;    /* registry refs or LUA_NOREF */
  int on_connect; /* the cosocket style (lx_tcp_server_proto), or NOREF */
  size_t max_buffer, max_line; /* on_connect sockets' limits (0: default) */
  conn_opts_t opts;
  listener_t *listener;
  lx_shared_listener_t *shared;
  int conns;   /* connections using it */
  bool client; /* freed with its one connection */
  void *ext;   /* a protocol's own settings (HTTP), freed by ext_free */
  void (*ext_free)(struct lx_service *s);
  const char *alpn; /* what a TLS listener offers in ALPN (HTTP: its framers) */
  bool closed; /* the listener is closed */
  struct lx_service *prev, *next;
} lx_service_t;

#endif
