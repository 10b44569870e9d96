/* SPDX-License-Identifier: MIT */

/* lx_pg_result: a query's rows as Lua values by column type (for
 * lx_pg.c): numbers, booleans, strings, bytea as raw bytes, json and
 * jsonb through mp.json, arrays as tables, NULL as mp.null. */
#ifndef MP_LX_PG_RESULT_H
#define MP_LX_PG_RESULT_H

#include <lua.h>

#include "pg/pg.h"

/* Pushes res (borrowed): the rows, with .columns and .affected (1 value),
 * or nil, the error line and, for an error from the server, a table of
 * its fields (sqlstate, detail, hint, ...) (2 or 3 values). json_ref is
 * the registry ref of the JSON decoder. Returns how many it pushed. */
int lx_pg_push_result(lua_State *L, const pg_res_t *res, int json_ref);

#endif
