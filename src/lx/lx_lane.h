/* SPDX-License-Identifier: MIT */

/* lx_lane: a lane (one thread, one reactor, one lua_State) and its
 * callback runner: pooled coroutines, waiting (the arm/resume contract),
 * errors. Every other lx_ header builds on this one. Lane thread only,
 * unless a prototype says otherwise. */
#ifndef MP_LX_LANE_H
#define MP_LX_LANE_H

#include <lauxlib.h>
#include <lua.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cluster/ipc.h"
#include "cluster/pubsub.h"
#include "core/defer.h"
#include "core/stats.h"
#include "http/server.h"
#include "net/reactor.h"
#include "lx/lx_server.h" /* struct lx_server, and what src/server calls */

typedef struct lx_timer lx_timer_t;

/* What a callback is about, for error handling and for holding. */
enum { LX_PLAIN = 0, LX_CONN, LX_TIMER, LX_TASK };

typedef struct lx_run {
  lua_State *co;
  int co_ref;
  int kind;
  conn_t *c;          /* LX_CONN: held while suspended */
  lx_timer_t *timer;  /* LX_TIMER: stopped on error */
  const char *what;   /* "on_data", "timer", ... for the log */
  int anchor;         /* registry ref keeping `timer` alive while suspended */
  void *owner;        /* kinds above LX_CONN: the module's object (a task) */
  bool held;          /* it suspended once: its hold (c, or the loop) is on */
} lx_run_t;

/* How a waiting API suspends a callback: from Lua it yields
 * (lx_wait_token, arm, args...). The runner recognises the token, holds
 * the callback (its connection, or the lane) and calls arm(ln, run, co)
 * with the args at co's stack index 3 and up; arm keeps a copy of *run and
 * later calls lx_resume with what the wait returns. arm returns 0, or a
 * negative errno, and then the callback fails with that error. A yield
 * without the token is reported as an error. */
typedef int (*lx_arm_fn)(lx_lane_t *ln, const lx_run_t *run, lua_State *co);
extern const char lx_wait_token;
/* Pushes the real coroutine.yield (scripts see a checked one that raises
 * when a callback's own coroutine yields outside a waiting API). */
void lx_push_raw_yield(lua_State *L);
/* Pushes a Lua function f(...) that calls check(...) (a C function with the
 * lane as upvalue 1, which raises on misuse) and then waits through arm. */
void lx_push_waiter(lua_State *L, lx_lane_t *ln, lua_CFunction check,
                    lx_arm_fn arm);
/* Cancelling a wait (t:kill, lx_task.h). An arm whose wait can end early
 * calls lx_wait_cancel_on(ln, cancel, arg) before it returns 0; the
 * runner hands that to the module of the run's kind (run_waiting), which
 * may later call cancel(ln, arg) instead of waiting for the event:
 * cancel stops the event, frees what the arm allocated and
 * lx_run_abandon's its copy of the run, never resuming it. An arm that
 * registers nothing cannot be cut short (the run is dropped when its
 * event comes: run_resuming). */
typedef void (*lx_cancel_fn)(lx_lane_t *ln, void *arg);
void lx_wait_cancel_on(lx_lane_t *ln, lx_cancel_fn cancel, void *arg);
/* Raises unless L is the coroutine of the callback now running. */
void lx_check_waitable(lua_State *L, lx_lane_t *ln, const char *api);

/* Everything in a lane belongs to the lane's thread (after start-up, which
 * runs on the main thread before the lane thread exists). */
struct lx_lane {
  lx_server_t *srv;
  int index; /* 0-based; Lua sees index + 1 */
  bool is_root; /* the root process's lane: runs the script, serves nothing */
  reactor_t *r;
  lua_State *L;
  lx_run_t *running;  /* the callback now running, or NULL */
  /* For the watchdog (read by the main thread): when the outermost
   * callback now running started (reactor_clock_ms() + 1; 0: none), and
   * its name. */
  _Atomic uint64_t busy_since;
  _Atomic(const char *) busy_what;
  struct lx_idle_co {
    lua_State *co;
    int ref; /* registry anchor */
  } *idle;   /* coroutines ready for the next callback */
  int idle_n, idle_cap;
  int start_ref, stop_ref, worker_start_ref,
      reload_ref; /* lists of mp.on handlers */
  void **state;   /* per row of srv->modules: its lane state, or NULL
                    (lx_module.h's slot and lane_size) */
  bool closing;            /* being freed: posted tasks only clean up */
  bool owns_r;             /* false: a root lane on the root's reactor */
  bool retired;            /* replaced by a reload: runs only what its
                              remaining connections need, then is freed */
  _Atomic int tasks;       /* posted tasks that will use the lane */
  bool free_posted;        /* retired: its free is queued */
  lx_lane_t *next_retired; /* srv->retired */
  struct lx_service *services; /* every service of this lane */
  int port0_listens;           /* mp.listen calls with port 0 so far */
  stats_slot_t *stats;         /* its slot of srv->stats, or NULL */
  mp_timer_t stats_timer;      /* once a second: its gauges */
  bool loading;                /* the script's top level is running */
  lx_cancel_fn arm_cancel;     /* set by the arm now running, or NULL */
  void *arm_cancel_arg;
};

/* A module's state in this lane: the row's slot (lx_module.h), which
 * the runner set before the first lane. */
static inline void *lx_lane_state(const lx_lane_t *ln, int slot) {
  return ln->state[slot];
}

/* Pushes the server-wide id of connection `uuid` of this process:
 * "SERIAL-UUID", a string no other connection of the server has (a uuid
 * is unique only within its process). */
void lx_push_uid(lua_State *L, lx_server_t *srv, sock_uuid_t uuid);
/* A task posted for lane ln is done (see lx_lane_t.tasks). */
void lx_lane_task_done(lx_lane_t *ln);
/* A service of lane ln was freed (a retired lane may be done). */
void lx_lane_service_gone(lx_lane_t *ln);

/* Takes the function and nargs arguments on top of `from` (a coroutine of
 * this lane, or its main state) and runs them in a pooled coroutine. */
void lx_call(lx_lane_t *ln, lua_State *from, int nargs, int kind, conn_t *c,
             lx_timer_t *timer, const char *what);
/* Pushes the function at registry `ref` onto a fresh pooled coroutine and
 * returns it, for callers that push arguments straight onto it (the hot
 * path). Then lx_call_on(ln, co, ref, nargs, ...), which returns whether
 * the callback is suspended (waiting) rather than done or failed. */
lua_State *lx_co_take(lx_lane_t *ln, int *co_ref);
bool lx_call_on(lx_lane_t *ln, lua_State *co, int co_ref, int nargs, int kind,
                conn_t *c, lx_timer_t *timer, const char *what);
/* lx_call_on for a kind above LX_CONN whose runs carry `owner`
 * (lx_run_t.owner; borrowed: it must outlive the run). */
bool lx_call_owned(lx_lane_t *ln, lua_State *co, int co_ref, int nargs,
                   int kind, void *owner, const char *what);
/* lx_co_take and the pushes of a callback's function and arguments, in
 * protected mode, for the callers whose pushes allocate (a request, a
 * chunk of data): out of memory there must fail that one callback, not
 * panic the process (issue 16, item 13). push(L, arg) pushes the function
 * and its arguments onto L (the lane's main state), at most LX_PUSH_MAX
 * values, and returns how many, or a negative number to start nothing.
 * Returns the coroutine with the values on it (*nargs: their count, the
 * function included) and *co_ref; or NULL with *nargs the negative number
 * push returned, or -ENOMEM (logged) when a push or the take ran out of
 * memory. */
#define LX_PUSH_MAX 16
lua_State *lx_co_take_push(lx_lane_t *ln, int *co_ref,
                           int (*push)(lua_State *L, void *arg), void *arg,
                           int *nargs);
/* Drops a suspended callback for good: releases what it held. */
void lx_run_abandon(lx_lane_t *ln, lx_run_t *run);
/* Continues a suspended callback (the run was copied when it suspended). */
void lx_resume(lx_lane_t *ln, lx_run_t *run, int nargs);
/* The running callback, if it is c's (LX_CONN), lets go of c: from here
 * on it holds only the lane's loop, so c's other events go on while it
 * waits, and an error of its own no longer closes c. For a callback whose
 * part of c is over while the callback goes on: an HTTP/2 handler after
 * res:sse() (its exchange is complete; the connection carries other
 * streams). */
void lx_run_detach(lx_lane_t *ln, conn_t *c);

/* Runs every function of the list at registry `list_ref`. */
void lx_call_list(lx_lane_t *ln, int list_ref, const char *what);

/* The lane of a state (from the registry). */
lx_lane_t *lx_lane_of(lua_State *L);

/* A file name from the script (public=, tls= cert/key/chain/ca): an
 * absolute one as given, a relative one joined to the script's folder
 * (made absolute when the lane started), so a server started from / finds
 * its files as require finds its modules. The result is a Lua string the
 * lane keeps for its life (a registry table); raises for a name longer
 * than PATH_MAX. Pushes nothing. On the lane's thread. */
const char *lx_script_path(lua_State *L, const char *name);
/* Pushes the script's folder, absolute (mp.script_dir). */
void lx_push_script_dir(lua_State *L);

/* Pushes nil and a message for a negative errno, returns 2. */
int lx_push_fail(lua_State *L, int err);
/* A lower-case message for a negative errno ("connection refused"). */
const char *lx_errmsg(int err, char *buf, size_t len);

#endif
