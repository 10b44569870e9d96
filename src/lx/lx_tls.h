/* SPDX-License-Identifier: MIT */

/* lx_tls: the `tls` options of mp.listen / mp.http (a server's
 * certificates) and of the clients (trust, SNI), and conn:tls(). The
 * record layer itself is net/tls.h, under the reactor. Lane thread. */
#ifndef MP_LX_TLS_H
#define MP_LX_TLS_H

#include "lx/lx_lane.h"
#include "net/tls.h"

struct lx_shared_listener;

#define LX_TLS_MAX_CERTS 16
#define LX_TLS_MAX_NAMES 64

/* A listen call's `tls` value, read (not loaded yet). The strings belong
 * to the Lua table, which must stay on the stack. */
typedef struct {
  net_tls_cert_t certs[LX_TLS_MAX_CERTS];
  const char *names[LX_TLS_MAX_CERTS][LX_TLS_MAX_NAMES];
  size_t n; /* 0: no tls */
} lx_tls_conf_t;

/* Reads the `tls` value at idx ({cert=, key=[, chain=]} or a list of
 * {cert=, key=, names={...}}; nil or false: none) into *conf. Raises on a
 * malformed one, so call it before anything is held. */
void lx_tls_parse(lua_State *L, int idx, lx_tls_conf_t *conf,
                  const char *what);

/* The server context of shared listener `sl`: the one sl has (made by the
 * root, or another lane), or a new one made from conf (then sl holds it).
 * The caller gets a reference. In the root a new one is always made, so
 * a reload reads the certificates again. NULL with one line in err (the
 * file and why) when they don't load. `alpn`: the protocols offered by
 * ALPN (net_tls_server_ctx_alpn), or NULL. */
net_tls_ctx_t *lx_tls_server(lx_lane_t *ln, struct lx_shared_listener *sl,
                             const lx_tls_conf_t *conf, const char *alpn,
                             char *err, size_t errlen);

/* A client's `tls` value at idx (true, or {verify=, ca=, sni=, cert=,
 * key=}): a context (a reference the caller drops; the shared default for
 * `true`) and, in *sni, the name to send and verify instead of the host
 * (or NULL). nil/false: NULL, no TLS. Raises on a bad table or file. */
net_tls_ctx_t *lx_tls_client(lua_State *L, int idx, const char **sni,
                             const char *alpn);

/* Pushes conn:tls()'s answer for c: {protocol=, cipher=, sni=, alpn=,
 * resumed=} or nil for a plain connection. Returns 1. */
int lx_tls_push_info(lua_State *L, conn_t *c);

#endif
