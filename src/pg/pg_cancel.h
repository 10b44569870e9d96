/* SPDX-License-Identifier: MIT */

/* pg_cancel: the thread that runs libpq's blocking PQcancel off the lanes.
 * One per process, started on first use (again in a forked child: a
 * thread does not survive fork). Internal to src/pg. */
#ifndef MP_PG_CANCEL_H
#define MP_PG_CANCEL_H

/* Takes `cancel` (a PGcancel *): the thread sends the cancel request and
 * frees it; nothing is reported back (the query's own result says how it
 * ended). 0, or a negative errno (then it was freed here, not sent). Any
 * thread. */
int pg__cancel_post(void *cancel);

#endif
