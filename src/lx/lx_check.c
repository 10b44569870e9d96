/* SPDX-License-Identifier: MIT */

/* lx_check: moonport --check (see lx_server.h). The C side makes the
 * throw-away lane and prints; lua/moonport/check.lua reads the bytecode
 * for the globals. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/pubsub.h"
#include "lx/lx_embed.h"
#include "lx/lx_lane.h"
#include "lx/lx_server.h"

int lx_check_script(lx_server_t *srv) {
  srv->lanes = calloc(1, sizeof(*srv->lanes));
  srv->ps = pubsub_new(1, lx_pubsub_deliver, srv);
  if (!srv->lanes || !srv->ps) {
    fprintf(stderr, "moonport: --check: out of memory\n");
    return 1;
  }
  char err[1024];
  lx_lane_t *ln = srv->lanes[0] =
      lx_lane_new(srv, 0, false, NULL, err, sizeof(err));
  if (!ln) {
    fprintf(stderr, "moonport: %s\n", err);
    fprintf(stderr, "moonport: %s: the script does not load\n", srv->script);
    return 1;
  }
  lua_State *L = ln->L;
  int top = lua_gettop(L);
  int n = -1, mods = 0;
  lx_require(L, "moonport.check");
  lua_pushstring(L, srv->script);
  if (lua_pcall(L, 1, 2, 0) == 0 && lua_istable(L, -2)) {
    n = (int)lua_objlen(L, -2);
    for (int i = 1; i <= n; i++) {
      lua_rawgeti(L, -2, i);
      fprintf(stderr, "%s\n", lua_tostring(L, -1));
      lua_pop(L, 1);
    }
    mods = lua_istable(L, -1) ? (int)lua_objlen(L, -1) : 0;
  } else {
    fprintf(stderr, "moonport: --check: %s\n",
            lua_isstring(L, -1) ? lua_tostring(L, -1) : "failed");
  }
  /* the modules checked with it, as " (with a.lua, lib/b.lua)" */
  char with[512] = "";
  size_t wl = 0;
  for (int i = 1; i <= mods && wl < sizeof(with); i++) {
    lua_rawgeti(L, -1, i);
    int k = snprintf(with + wl, sizeof(with) - wl, "%s%s%s",
                     i == 1 ? " (with " : ", ", lua_tostring(L, -1),
                     i == mods ? ")" : "");
    lua_pop(L, 1);
    if (k < 0 || (size_t)k >= sizeof(with) - wl) {
      memcpy(with + sizeof(with) - 6, ", ...", 6); /* cut: say so */
      break;
    }
    wl += (size_t)k;
  }
  if (n == 0)
    fprintf(stderr, "moonport: %s%s: ok\n", srv->script, with);
  else if (n > 0)
    fprintf(stderr, "moonport: %s%s: %d warning%s\n", srv->script, with, n,
            n == 1 ? "" : "s");
  lua_settop(L, top);
  lx_lane_free(ln);
  srv->lanes[0] = NULL;
  return n == 0 ? 0 : 1;
}
