/* lx: the Lua binding's shared internals: lanes (one thread, one reactor,
 * one lua_State each), the callback runner, and the process-wide server
 * that owns the lanes and the shared listening sockets. */
#ifndef MP_LX_H
#define MP_LX_H

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
#include "lx/lx_listen.h"

typedef struct lx_timer lx_timer_t;

/* What a callback is about, for error handling and for holding. */
enum { LX_PLAIN = 0, LX_CONN, LX_TIMER };

typedef struct {
  lua_State *co;
  int co_ref;
  int kind;
  conn_t *c;          /* LX_CONN: held while suspended */
  lx_timer_t *timer;  /* LX_TIMER: stopped on error */
  const char *what;   /* "on_data", "timer", ... for the log */
  int anchor;         /* registry ref keeping `timer` alive while suspended */
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
/* Raises unless L is the coroutine of the callback now running. */
void lx_check_waitable(lua_State *L, lx_lane_t *ln, const char *api);

/* A suspended callback waiting for a timer (mp.sleep). */
typedef struct lx_sleep {
  mp_timer_t timer;
  lx_run_t run;
  lx_lane_t *ln;
  struct lx_sleep *prev, *next;
} lx_sleep_t;

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
  int subs_ref, psubs_ref; /* { [channel or pattern] = { sub, ... } } */
  int conn_subs_ref;       /* { [uuid] = { sub, ... } } */
  bool closing;            /* being freed: posted tasks only clean up */
  bool owns_r;             /* false: a root lane on the root's reactor */
  bool retired;            /* replaced by a reload: runs only what its
                              remaining connections need, then is freed */
  _Atomic int tasks;       /* posted tasks that will use the lane */
  struct lx_timer *timers; /* running mp.after / mp.every timers */
  bool free_posted;        /* retired: its free is queued */
  lx_lane_t *next_retired; /* srv->retired */
  struct lx_redis *redis_clients; /* open mp.redis clients */
  struct lx_service *services; /* every service of this lane */
  lx_sleep_t *sleeps;          /* suspended in mp.sleep */
  int port0_listens;           /* mp.listen calls with port 0 so far */
  struct http_cache *http_cache; /* mp.http's (http/server.h), lx_http_lane_free */
  stats_slot_t *stats;         /* its slot of srv->stats, or NULL */
  mp_timer_t stats_timer;      /* once a second: its gauges */
  bool loading;                /* the script's top level is running */
};

/* ---- lx_lane.c ---- */

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

/* Runs every function of the list at registry `list_ref`. */
void lx_call_list(lx_lane_t *ln, int list_ref, const char *what);

/* The lane of a state (from the registry). */
lx_lane_t *lx_lane_of(lua_State *L);

/* Pushes nil and a message for a negative errno, returns 2. */
int lx_push_fail(lua_State *L, int err);
/* A lower-case message for a negative errno ("connection refused"). */
const char *lx_errmsg(int err, char *buf, size_t len);

/* ---- lx_conn.c ---- */

/* A set of handlers with its protocol: a listener's, or one client's. */
typedef struct lx_service {
  proto_t proto;
  lx_lane_t *ln;
  int on_open, on_data, on_ready, on_timeout, on_shutdown, on_close,
      on_fail; /* registry refs or LUA_NOREF */
  conn_opts_t opts;
  listener_t *listener;
  lx_shared_listener_t *shared;
  int conns;   /* connections using it */
  bool client; /* freed with its one connection */
  void *ext;   /* a protocol's own settings (HTTP), freed by ext_free */
  void (*ext_free)(struct lx_service *s);
  bool closed; /* the listener is closed */
  struct lx_service *prev, *next;
} lx_service_t;

/* Makes metatable `name` (left on the stack) for userdata objects whose
 * methods are C closures with upvalues (the lane, the metatable), and
 * whose `env` field is a table made on first use. */
void lx_meta_env(lua_State *L, lx_lane_t *ln, const char *name,
                 const luaL_Reg *methods);
/* Pushes a new userdata of `size` bytes with metatable `name` (made by
 * lx_meta_env) and returns it. */
void *lx_new_env_ud(lua_State *L, size_t size, const char *name);
/* In a method made by lx_meta_env: argument 1 as that object, or raises. */
void *lx_check_self(lua_State *L, const char *name);

/* A function, or a table or userdata whose metatable has __call (an
 * mp.router), at idx. */
bool lx_is_callable(lua_State *L, int idx);
/* Pushes c's peer: ip, port (Unix sockets: "unix", path), or nil for
 * NULL or an unknown peer. Returns the count pushed. */
int lx_push_peer(lua_State *L, conn_t *c);
/* A write's release callback for a Lua string kept alive while queued:
 * ctx is the lane, ctx2 the registry ref to drop. */
void lx_unref_release(void *ctx, void *ctx2);
/* Registers the connection metatable in L. */
void lx_conn_open(lua_State *L, lx_lane_t *ln);
/* Reads the on_* handlers and options of table at `idx` into a new
 * service (raises on bad values). */
lx_service_t *lx_service_new(lua_State *L, lx_lane_t *ln, int idx,
                             bool client);
/* lx_service_new for a listener (idx: the options table). */
lx_service_t *lx_service_new_server(lua_State *L, lx_lane_t *ln, int idx);
/* Puts a service made elsewhere (HTTP) on its lane's list. */
void lx_service_link(lx_service_t *s);
/* Frees a service when nothing uses it any more. */
void lx_service_maybe_free(lx_service_t *s);
void lx_service_free(lx_service_t *s);
/* Pushes the connection object for c (made on first use). */
void lx_conn_push(lua_State *L, lx_lane_t *ln, conn_t *c);
/* Pushes a connection object that is already closed. */
void lx_conn_push_closed(lua_State *L, lx_lane_t *ln);

/* ---- lx_pubsub.c ---- */

/* A message framed for the wire (lx_ws.c), shared by reference by the
 * write queues of every subscriber it goes to; freed with its last
 * reference. Lane thread. */
typedef struct http_frame lx_frame_t; /* http/stream.h */

/* One message on its way to the subscribers of a lane that forward it
 * from C (a WebSocket's or an SSE stream's subscribe without a function):
 * what they share, made by the first that needs it. */
typedef struct {
  pubsub_msg_t *m;
  int text; /* the body is UTF-8: 1, 0, or -1 not known yet */
  /* The message as a WebSocket frame [0] and as an SSE event [1], built
   * once per dispatch; the dispatch holds one reference to each. */
  lx_frame_t *frame[2];
} lx_fwd_ctx_t;
/* Drops the dispatch's references to the frames in ctx (a frame still
 * queued to a subscriber lives on until that write completes or its
 * connection closes). Lane thread. */
void lx_fwd_ctx_done(lx_fwd_ctx_t *ctx);
/* Sends the message in ctx to connection c (open, of this lane). */
typedef void (*lx_forward_fn)(lx_lane_t *ln, conn_t *c, lx_fwd_ctx_t *ctx);

/* Adds subscribe and publish to the module table at the top of L. */
void lx_pubsub_open(lua_State *L, lx_lane_t *ln);
/* subscribe(channel, fn [, opts]) with arguments from stack index `base`,
 * owned by connection uuid (0: none); pushes the subscription. */
int lx_subscribe(lua_State *L, lx_lane_t *ln, int base, sock_uuid_t uuid,
                 lx_forward_fn fwd);
/* Cancels the subscriptions of a connection that closed. */
void lx_pubsub_conn_closed(lx_lane_t *ln, sock_uuid_t uuid);
/* Cancels every subscription of a lane (it is retired). */
void lx_pubsub_cancel_all(lx_lane_t *ln);
/* Calls this lane's subscribers of message m. */
void lx_pubsub_dispatch(lx_lane_t *ln, pubsub_msg_t *m);


/* ---- lx_engine.c ---- */


/* ---- lx_redis.c ---- */

/* Adds mp.redis to the module table at the top of L. */
void lx_redis_open(lua_State *L, lx_lane_t *ln);
/* Closes the lane's mp.redis clients (before its reactor goes). */
void lx_redis_close_all(lx_lane_t *ln);

/* ---- lx_timer.c, lx_moonport.c ---- */

/* Stops every timer of a retired lane, without their on_done. */
void lx_timers_stop_all(lx_lane_t *ln);
/* Ends every mp.sleep of a retired lane without resuming it. */
void lx_sleeps_abandon(lx_lane_t *ln);
/* Frees what is left of the lane's mp.sleep waits (after its reactor). */
void lx_sleeps_free(lx_lane_t *ln);
/* A timer whose callback failed: stop it without its on_done. */
void lx_timer_failed(lx_timer_t *t);
/* A registry ref to the timer's userdata (LUA_NOREF once finished). */
int lx_timer_anchor(lx_timer_t *t);
/* Adds mp.after, mp.every and mp.sleep to the module table at the top of
 * L (lx_timer.c, as are the four above). */
void lx_timer_open(lua_State *L, lx_lane_t *ln);

/* mp.listen's body, with the service for each lane made by `make` from
 * the options table at idx (mp.http passes its own). */
int lx_listen_with(lua_State *L, lx_lane_t *ln,
                   lx_service_t *(*make)(lua_State *L, lx_lane_t *ln, int idx));

/* ---- lx_shared.c ---- */

/* Adds mp.shared to the module table at the top of L. */
void lx_shared_open(lua_State *L, lx_lane_t *ln);

/* ---- lx_http.c ---- */

/* Adds mp.http to the module table at the top of L. */
void lx_http_open(lua_State *L, lx_lane_t *ln);
/* Frees what mp.http keeps per lane (buffers idle connections gave back);
 * after the lane's connections are gone. */
void lx_http_lane_free(lx_lane_t *ln);

/* ---- lx_stats.c: mp.stats(), mp.metrics() ---- */

/* The slot of lane `index` (0-based; the root lane: is_root) of this
 * process. */
stats_slot_t *lx_stats_slot(lx_server_t *srv, int index, bool is_root);
/* Starts / stops the lane's once-a-second gauges (Lua heap, loop lag). */
void lx_stats_lane_start(lx_lane_t *ln);
void lx_stats_lane_stop(lx_lane_t *ln);
/* The whole server's figures in the Prometheus text format (0.0.4), in a
 * malloc'd string of *len bytes; NULL when out of memory. */
char *lx_stats_prometheus(lx_server_t *srv, size_t *len);
/* mp.stats and mp.metrics into the table at the top of L. */
void lx_stats_open(lua_State *L, lx_lane_t *ln);

typedef struct lx_stream lx_stream_t;

/* ---- lx_ws.c: WebSocket and SSE streams ---- */

typedef struct lx_ws_cfg lx_ws_cfg_t;
/* mp.http's `websocket` table at idx: handlers and max_msg (raises on
 * bad values). Freed by lx_ws_cfg_free. */
lx_ws_cfg_t *lx_ws_cfg_new(lua_State *L, int idx);
/* Only the checks of lx_ws_cfg_new (raises on bad values). */
void lx_ws_cfg_check(lua_State *L, int idx);
void lx_ws_cfg_free(lua_State *L, lx_ws_cfg_t *cfg);
/* The registry ref of websocket.on_upgrade (run before the 101, where an
 * app may refuse the upgrade or pick a subprotocol), or LUA_NOREF. */
int lx_ws_cfg_on_upgrade(const lx_ws_cfg_t *cfg);
/* Registers the websocket and sse metatables in L. */
void lx_ws_open(lua_State *L, lx_lane_t *ln);
/* A WebSocket on c, whose 101 answer is sent (NULL: out of memory). The
 * caller makes c a stream of it (http_conn_stream with lx_stream_ops),
 * then calls lx_ws_begin:
 * on_open with the request push_req pushes, then the bytes that came
 * after the request. */
lx_stream_t *lx_ws_new(lx_lane_t *ln, conn_t *c, const lx_ws_cfg_t *cfg);
void lx_ws_begin(conn_t *c, lx_stream_t *st,
                 bool (*push_req)(lua_State *L, void *arg), void *arg,
                 const char *rest, size_t rest_len);
/* An SSE stream on c, whose head is sent; handlers from the table at
 * `opts` of L (0: none); last_id: the Last-Event-ID the client sent, or
 * NULL. Then lx_sse_begin (on_open runs as c's next callback). */
lx_stream_t *lx_sse_new(lua_State *L, lx_lane_t *ln, conn_t *c, int opts,
                        const char *last_id, size_t last_len);
void lx_sse_begin(conn_t *c, lx_stream_t *st);
/* Pushes the stream's Lua object. */
void lx_stream_push(lua_State *L, lx_stream_t *st);
/* The connection events of a stream (on_closed frees it), for
 * http_conn_stream: the HTTP server hands a connection that became a
 * WebSocket or SSE stream to these. */
extern const http_stream_ops_t lx_stream_ops;

/* The `moonport` module loader (package.preload). */
int luaopen_moonport(lua_State *L);
struct lx_service;

/* ---- lx_log.c ---- */

/* mp.log(level, ...). Any lane. */
int lx_log(lua_State *L);

#endif
