/* SPDX-License-Identifier: MIT */

/* lx_metric: mp.counter, mp.gauge and mp.histogram, a script's metrics in
 * the server's shared mapping (core/metric.h), exported with the
 * server's own on the status endpoint and by mp.metrics(). */
#ifndef MP_LX_METRIC_H
#define MP_LX_METRIC_H

#include "lx/lx_lane.h"

/* Fills core.metric with the primitives lua/moonport/metric.lua builds
 * the objects from, and sets mp.counter, mp.gauge and mp.histogram in
 * the table at the top of L. */
void lx_metric_open(lua_State *L, lx_lane_t *ln);

#endif
