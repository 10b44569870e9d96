/* SPDX-License-Identifier: MIT */

/* lx_multipart: core.multipart, the streaming multipart parser for
 * lua/moonport/multipart.lua (see lx_multipart.c for its calls). */
#ifndef MP_LX_MULTIPART_H
#define MP_LX_MULTIPART_H

#include <stdio.h>

#include "http/multipart.h"
#include "lx/lx_lane.h"

/* A lane's parser metatable and core.multipart (lx_modules' init). */
void lx_multipart_init(lua_State *L, lx_lane_t *ln);

/* The parser at idx (raises unless it is an open one), and the open Lua
 * file (io.open's) at idx. */
multipart_t *lx_multipart_check(lua_State *L, int idx);
FILE *lx_multipart_file(lua_State *L, int idx);

/* part:save's loop: writes the part's data in s[0..len) to f until the
 * part ends (MULTIPART_END) or s does (MULTIPART_NONE); *took: the bytes of
 * s parsed, *wrote: the data bytes written. Else a parser error (-400,
 * -413), LX_MULTIPART_EIO (the write failed: errno) or
 * LX_MULTIPART_MISUSE (s holds no part's data). */
enum { LX_MULTIPART_EIO = -1, LX_MULTIPART_MISUSE = -2 };
int lx_multipart_save(multipart_t *m, const char *s, size_t len, FILE *f,
                      size_t *took, size_t *wrote);
/* Pushes what p:save returns for lx_multipart_save's rc: "end" or "more",
 * the bytes written and `off`; or nil, a message and a status (raises for
 * LX_MULTIPART_MISUSE). */
int lx_multipart_push_save(lua_State *L, multipart_t *m, int rc, size_t wrote,
                           size_t off);

#endif
