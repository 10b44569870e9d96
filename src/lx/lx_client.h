/* SPDX-License-Identifier: MIT */

/* lx_client: the per-lane state that what a handler uses to reach the
 * world and wait for it shares: mp.resolve (lx_dns.h, on the lane's c-ares
 * resolver), mp.tcp (lx_tcp.h, waiting sockets and their keep-alive pool)
 * and mp.wait (lx_wait.h, a callback API turned into a wait). Each of
 * those is a row of lx_modules.c of its own and includes this header;
 * this one names none of them.
 *
 * The per-lane state (lx_client_t) is made on the lane's first use of any
 * of them and freed by lx_client_lane_free (the "client" row's close,
 * after the tcp and wait rows' closes). Everything here belongs to the
 * lane's thread. */
#ifndef MP_LX_CLIENT_H
#define MP_LX_CLIENT_H

#include "lx/lx_lane.h"
#include "net/dns.h"
#include "net/tls.h"

typedef struct lx_tcp lx_tcp_t;
typedef struct lx_tcp_idle lx_tcp_idle_t;
typedef struct lx_wake lx_wake_t;

/* Client TLS contexts a lane made from `tls` tables, by their settings
 * (verify, ca, cert, key), so each mp.fetch of an https:// URL doesn't load
 * its trust store again. A few per lane; the oldest goes past the cap. */
#define LX_CLIENT_TLS_CACHE 8
typedef struct {
  char *key;            /* the settings, as in a pool key; NULL: free */
  net_tls_ctx_t *ctx;   /* a reference */
} lx_client_tls_t;

typedef struct lx_client {
  lx_lane_t *ln;
  dns_resolver_t *dns;   /* made on the first lookup, NULL before */
  lx_tcp_t *socks;       /* every mp.tcp socket with a connection or a wait */
  lx_tcp_idle_t *idle;   /* the keep-alive pool, newest first */
  size_t nidle;
  lx_wake_t *wakes;      /* mp.wait calls armed with a timer */
  lx_client_tls_t tls[LX_CLIENT_TLS_CACHE]; /* [0] the newest */
  bool closing;          /* lx_client_lane_free is running */
} lx_client_t;

/* Frees the lane's resolver and TLS cache, once lx_tcp_lane_close and
 * lx_wait_lane_close have ended its sockets and waits (the lane is
 * going). Call in lx_lane_free before the reactor is freed, while the Lua
 * state still exists. Safe when nothing was ever made. */
void lx_client_lane_free(lx_lane_t *ln);

/* The lane's state, made on first use; NULL when out of memory. */
lx_client_t *lx_client_of(lx_lane_t *ln);
/* The lane's resolver, made on first use (MOONPORT_DNS_SERVERS="ip:port,.."
 * replaces /etc/resolv.conf's servers); NULL with *err a negative errno. */
dns_resolver_t *lx_client_dns(lx_lane_t *ln, int *err);

/* The client TLS context for the `tls` value at idx of L (true, or a
 * table: see lx_tls_client), from the lane's cache or made and cached.
 * Pushes one value: a userdata holding a reference to the context (its
 * __gc drops it, so a later raise leaks nothing), or nil for nil/false
 * (then returns NULL). The context returned is borrowed from that
 * userdata: take a reference (net_tls_ctx_ref) to keep it. *sni gets the
 * table's sni (or NULL; borrowed from the table); *key the settings'
 * string (borrowed from the cache until the next call), for pool keys.
 * Raises on a bad table or a file that doesn't load. */
net_tls_ctx_t *lx_client_tls(lua_State *L, lx_client_t *cl, int idx,
                             const char **sni, const char **key);

/* The lane is being freed: its state, now marked closing (so callbacks
 * only clean up), or NULL if it was never made (never makes it). The
 * close hooks of the tcp, wait and client rows each start with it. */
lx_client_t *lx_client_closing(lx_lane_t *ln);

#endif
