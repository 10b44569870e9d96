/* lx_moonport: the `moonport` Lua module: listen, connect, timers, sleep,
 * defer, lifecycle events and facts about the process. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "lx/lx.h"
#include "lx/lx_client.h"
#include "lx/lx_embed.h"
#include "redis/redis.h"

#define LX_TIMER_MT "moonport.timer"
#define LX_LISTENER_MT "moonport.listener"

static lx_lane_t *lx__ln(lua_State *L) {
  return lua_touserdata(L, lua_upvalueindex(1));
}

/* ---- shared listening sockets ---- */

static lx_shared_listener_t *lx__shared_acquire(lx_server_t *srv,
                                                const char *key,
                                                const char *host, int port,
                                                const char *path, int backlog,
                                                int *err) {
  pthread_mutex_lock(&srv->listen_lock);
  lx_shared_listener_t *sl = srv->listeners;
  while (sl && strcmp(sl->key, key) != 0) sl = sl->next;
  if (sl) {
    sl->refs++;
    pthread_mutex_unlock(&srv->listen_lock);
    return sl;
  }
  /* A root with several workers opens one socket per worker on the same
   * TCP port, so the kernel spreads connections over the workers (one
   * shared socket would let the idlest process take them all). The root
   * keeps them all open: a replaced worker takes over the same socket,
   * and connections waiting in it are not lost. */
  int nw = path || !srv->root ? 0 : srv->nworkers;
  int *wfds = nw ? calloc((size_t)nw, sizeof(int)) : NULL;
  if (nw && !wfds) {
    pthread_mutex_unlock(&srv->listen_lock);
    *err = -ENOMEM;
    return NULL;
  }
  int fd = path ? sock_listen_unix(path, backlog)
           : nw ? sock_listen_tcp_group(host, port, backlog)
                : sock_listen_tcp(host, port, backlog);
  for (int i = 0; i < nw && fd >= 0; i++) {
    int p = sock_local_port(fd);
    wfds[i] = i == 0 ? fd : sock_listen_tcp_shared(host, p, backlog);
    if (wfds[i] < 0) {
      int e = wfds[i];
      for (int j = 0; j < i; j++) close(wfds[j]);
      fd = e;
    }
  }
  if (fd < 0) {
    free(wfds);
    pthread_mutex_unlock(&srv->listen_lock);
    *err = fd;
    return NULL;
  }
  sl = calloc(1, sizeof(*sl));
  if (sl) {
    sl->key = strdup(key);
    sl->svc = calloc(srv->nlanes, sizeof(*sl->svc));
  }
  if (sl && path) sl->path = strdup(path);
  if (!sl || !sl->key || !sl->svc || (path && !sl->path)) {
    if (sl) {
      free(sl->key);
      free(sl->svc);
      free(sl->path);
    }
    free(sl);
    close(fd);
    if (path) unlink(path);
    pthread_mutex_unlock(&srv->listen_lock);
    *err = -ENOMEM;
    return NULL;
  }
  sl->fd = fd;
  sl->worker_fds = wfds;
  sl->nworker_fds = nw;
  sl->refs = 1;
  sl->next = srv->listeners;
  srv->listeners = sl;
  pthread_mutex_unlock(&srv->listen_lock);
  return sl;
}

/* Set once before lanes run; read at exit. */
static bool lx_unlink_paths = true;

static void lx__shared_close(lx_shared_listener_t *sl) {
  if (sl->nworker_fds) {
    for (int i = 0; i < sl->nworker_fds; i++)
      if (sl->worker_fds[i] >= 0) close(sl->worker_fds[i]);
  } else {
    close(sl->fd);
  }
  free(sl->worker_fds);
  if (sl->path && lx_unlink_paths) unlink(sl->path);
  free(sl->path);
  free(sl->key);
  free(sl->svc);
  free(sl);
}

void lx_shared_release(lx_server_t *srv, lx_shared_listener_t *sl) {
  pthread_mutex_lock(&srv->listen_lock);
  if (--sl->refs > 0) {
    pthread_mutex_unlock(&srv->listen_lock);
    return;
  }
  lx_shared_listener_t **pp = &srv->listeners;
  while (*pp && *pp != sl) pp = &(*pp)->next;
  if (*pp) *pp = sl->next;
  pthread_mutex_unlock(&srv->listen_lock);
  lx__shared_close(sl);
}

void lx_server_after_fork(lx_server_t *srv) {
  pthread_mutex_init(&srv->listen_lock, NULL);
  lx_unlink_paths = false; /* the socket files are the root's */
  for (lx_shared_listener_t *sl = srv->listeners; sl; sl = sl->next) {
    memset(sl->svc, 0, srv->nlanes * sizeof(*sl->svc));
    sl->refs = 0;
    if (!sl->nworker_fds) continue;
    /* This worker's socket; the others are its siblings'. */
    for (int i = 0; i < sl->nworker_fds; i++)
      if (i != srv->worker_index - 1) close(sl->worker_fds[i]);
    sl->fd = sl->worker_fds[srv->worker_index - 1];
    free(sl->worker_fds);
    sl->worker_fds = NULL;
    sl->nworker_fds = 0;
  }
}

void lx_server_close_listeners(lx_server_t *srv) {
  pthread_mutex_lock(&srv->listen_lock);
  lx_shared_listener_t *sl = srv->listeners;
  srv->listeners = NULL;
  pthread_mutex_unlock(&srv->listen_lock);
  while (sl) {
    lx_shared_listener_t *next = sl->next;
    lx__shared_close(sl);
    sl = next;
  }
}

/* Forgets lane `index`'s service `svc` on a shared listener (closing). */
void lx_shared_detach(lx_server_t *srv, lx_shared_listener_t *sl, int index,
                      struct lx_service *svc) {
  pthread_mutex_lock(&srv->listen_lock);
  if (sl->svc[index] == svc) sl->svc[index] = NULL;
  pthread_mutex_unlock(&srv->listen_lock);
}

/* ---- spreading connections over lanes ---- */

/* EPOLLEXCLUSIVE wakes one lane per connection, and on an idle server
 * mostly the same one; so the lane that accepts hands connections round
 * robin to the lanes listening on the same socket. */
typedef struct {
  lx_shared_listener_t *sl;
  int fd, lane;
} lx_handoff_t;

static void lx__adopt(void *a, void *b) {
  lx_handoff_t *h = a;
  lx_server_t *srv = b;
  pthread_mutex_lock(&srv->listen_lock);
  lx_service_t *s = h->sl->svc[h->lane];
  pthread_mutex_unlock(&srv->listen_lock);
  /* Only this lane frees its service, so s stays valid from here on. */
  if (s)
    reactor_adopt(srv->lanes[h->lane]->r, h->fd, &s->proto, s, s->opts);
  else
    close(h->fd);
  lx_shared_release(srv, h->sl);
  free(h);
}

static void lx__dispatch(listener_t *l, int fd, void *arg) {
  lx_service_t *svc = arg;
  lx_lane_t *ln = svc->ln;
  lx_server_t *srv = ln->srv;
  lx_shared_listener_t *sl = svc->shared;
  int target = ln->index;
  pthread_mutex_lock(&srv->listen_lock);
  for (size_t k = 0; k < srv->nlanes; k++) {
    unsigned i = sl->next_lane++ % (unsigned)srv->nlanes;
    if (sl->svc[i]) {
      target = (int)i;
      break;
    }
  }
  lx_handoff_t *h = target != ln->index ? malloc(sizeof(*h)) : NULL;
  if (h) sl->refs++;
  pthread_mutex_unlock(&srv->listen_lock);
  if (h) {
    *h = (lx_handoff_t){sl, fd, target};
    if (reactor_post(srv->lanes[target]->r, lx__adopt, h, srv) == 0) return;
    lx_shared_release(srv, sl);
    free(h);
  }
  reactor_adopt(ln->r, fd, &svc->proto, svc, svc->opts);
}

/* ---- mp.listen ---- */

typedef struct {
  lx_service_t *svc; /* NULL once closed */
  int port;
  char address[128];
} lx_listener_ud_t;

/* Pushes the listener object of a service; tcp_fd < 0 for Unix. */
static lx_listener_ud_t *lx__push_listener(lua_State *L, lx_service_t *svc,
                                           const char *address, int tcp_fd) {
  lx_listener_ud_t *ud = lua_newuserdata(L, sizeof(*ud));
  ud->svc = svc;
  ud->port = tcp_fd >= 0 ? sock_local_port(tcp_fd) : 0;
  snprintf(ud->address, sizeof(ud->address), "%s", address);
  luaL_getmetatable(L, LX_LISTENER_MT);
  lua_setmetatable(L, -2);
  return ud;
}

static int lx_listen(lua_State *L) {
  return lx_listen_with(L, lx__ln(L), lx_service_new_server);
}

int lx_listen_with(lua_State *L, lx_lane_t *ln,
                   lx_service_t *(*make)(lua_State *L, lx_lane_t *ln, int idx)) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "path");
  lua_getfield(L, 1, "address");
  lua_getfield(L, 1, "port");
  lua_getfield(L, 1, "backlog");
  const char *path = lua_tostring(L, -4);
  const char *host = luaL_optstring(L, -3, "0.0.0.0");
  int backlog = (int)luaL_optinteger(L, -1, SOMAXCONN);
  int port = 0;
  if (path && strlen(path) > 200)
    return luaL_error(L, "mp.listen: Unix socket path too long");
  if (!path) {
    if (!lua_isnumber(L, -2))
      return luaL_error(L, "mp.listen: give a port (TCP) or a path (Unix)");
    lua_Number p = lua_tonumber(L, -2);
    if (p < 0 || p > 65535 || p != (int)p)
      return luaL_error(L, "mp.listen: bad port %s", lua_tostring(L, -2));
    port = (int)p;
    if (strlen(host) > 200) return luaL_error(L, "mp.listen: address too long");
  }
  /* Lanes running the same script share one socket per address. Port 0
   * asks for a fresh port each time, so the n-th port-0 listen of a lane
   * shares with the n-th of the other lanes. */
  char key[300], desc[300];
  if (path)
    snprintf(key, sizeof(key), "unix:%s", path);
  else if (port)
    snprintf(key, sizeof(key), "tcp:%s:%d", host, port);
  else
    snprintf(key, sizeof(key), "tcp:%s:0#%d", host, ln->port0_listens++);
  if (path)
    snprintf(desc, sizeof(desc), "unix:%s", path);
  else
    snprintf(desc, sizeof(desc), strchr(host, ':') ? "[%s]:%d" : "%s:%d",
             host, port);
  lx_service_t *svc = make(L, ln, 1);
  int err = 0;
  lx_shared_listener_t *sl =
      lx__shared_acquire(ln->srv, key, host, port, path, backlog, &err);
  if (!sl) {
    lx_service_free(svc);
    char buf[128];
    return luaL_error(L, "cannot listen on %s: %s", desc,
                      lx_errmsg(err, buf, sizeof(buf)));
  }
  svc->shared = sl;
  if (ln->is_root) {
    /* The root opens the sockets before it forks; workers serve them. */
    svc->closed = true;
    lx__push_listener(L, svc, path ? path : host, path ? -1 : sl->fd);
    return 1;
  }
  pthread_mutex_lock(&ln->srv->listen_lock);
  bool twice = sl->svc[ln->index] != NULL;
  if (!twice) sl->svc[ln->index] = svc;
  pthread_mutex_unlock(&ln->srv->listen_lock);
  if (twice) {
    lx_service_free(svc);
    return luaL_error(L, "cannot listen on %s: this lane listens there "
                         "already", desc);
  }
  svc->listener = reactor_listen(ln->r, sl->fd, &svc->proto, svc, svc->opts);
  if (!svc->listener) {
    int e = errno;
    lx_service_free(svc);
    return luaL_error(L, "cannot listen on %s: %s", desc, strerror(e));
  }
  if (ln->srv->nlanes > 1)
    reactor_listener_set_dispatch(svc->listener, lx__dispatch, svc);
  lx_listener_ud_t *ud =
      lx__push_listener(L, svc, path ? path : host, path ? -1 : sl->fd);
  if (ln->index == 0 && path)
    log_info("listening on %s", desc);
  else if (ln->index == 0)
    log_info(strchr(host, ':') ? "listening on [%s]:%d" : "listening on %s:%d",
             host, ud->port);
  return 1;
}

static int lx_listener_port(lua_State *L) {
  lx_listener_ud_t *ud = luaL_checkudata(L, 1, LX_LISTENER_MT);
  lua_pushinteger(L, ud->port);
  return 1;
}

static int lx_listener_address(lua_State *L) {
  lx_listener_ud_t *ud = luaL_checkudata(L, 1, LX_LISTENER_MT);
  lua_pushstring(L, ud->address);
  return 1;
}

static int lx_listener_close(lua_State *L) {
  lx_listener_ud_t *ud = luaL_checkudata(L, 1, LX_LISTENER_MT);
  lx_service_t *s = ud->svc;
  if (!s) return 0;
  ud->svc = NULL;
  s->closed = true;
  if (s->listener) reactor_listener_close(s->listener);
  s->listener = NULL;
  if (s->shared) {
    lx_shared_detach(s->ln->srv, s->shared, s->ln->index, s);
    lx_shared_release(s->ln->srv, s->shared);
  }
  s->shared = NULL;
  lx_service_maybe_free(s);
  return 0;
}

/* ---- mp.connect ---- */

typedef struct {
  lx_service_t *svc;
  int err;
  int udref;
} lx_fail_later_t;

static void lx__fail_later(void *a, void *b) {
  lx_fail_later_t *f = a;
  lx_service_t *s = f->svc;
  lx_lane_t *ln = s->ln;
  if (s->on_fail != LUA_NOREF) {
    char buf[128];
    lua_State *L = ln->L;
    lua_rawgeti(L, LUA_REGISTRYINDEX, s->on_fail);
    lua_rawgeti(L, LUA_REGISTRYINDEX, f->udref);
    lua_pushstring(L, lx_errmsg(f->err, buf, sizeof(buf)));
    lx_call(ln, L, 2, LX_PLAIN, NULL, NULL, "on_fail");
  }
  luaL_unref(ln->L, LUA_REGISTRYINDEX, f->udref);
  s->conns = 0;
  lx_service_maybe_free(s);
  free(f);
}

static int lx_connect(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "path");
  lua_getfield(L, 1, "host");
  lua_getfield(L, 1, "port");
  lua_getfield(L, 1, "connect_timeout");
  const char *path = lua_tostring(L, -4);
  const char *host = luaL_optstring(L, -3, "127.0.0.1");
  lua_Number port = lua_tonumber(L, -2);
  lua_Number ct = luaL_optnumber(L, -1, 10);
  if (!path && (port <= 0 || port > 65535 || port != (int)port))
    return luaL_error(L, "mp.connect: give a host and port (TCP) or a path "
                         "(Unix)");
  if (ct < 0 || ct > 4e6)
    return luaL_error(L, "mp.connect: connect_timeout out of range");
  lx_service_t *svc = lx_service_new(L, ln, 1, true);
  svc->conns = 1;
  int err = 0;
  conn_t *c = reactor_connect(ln->r, host, (int)port, path,
                              (uint32_t)(ct * 1000), &svc->proto, svc,
                              svc->opts, &err);
  if (c) {
    lx_conn_push(L, ln, c);
    return 1;
  }
  /* Failed at once: still answered through on_fail, from the loop, so the
   * caller sees the same order of events as for a late failure. */
  lx_fail_later_t *f = malloc(sizeof(*f));
  if (!f) {
    lx_service_free(svc);
    return luaL_error(L, "out of memory");
  }
  lx_conn_push_closed(L, ln);
  lua_pushvalue(L, -1);
  *f = (lx_fail_later_t){svc, err, luaL_ref(L, LUA_REGISTRYINDEX)};
  reactor_defer(ln->r, lx__fail_later, f, NULL);
  return 1;
}

/* ---- timers ---- */

struct lx_timer {
  mp_timer_t t;
  lx_lane_t *ln;
  int fn_ref, done_ref, self_ref;
  bool failed;
  bool linked; /* on the lane's list of running timers */
  struct lx_timer *prev, *next;
};

static void lx__timer_fire(mp_timer_t *mt) {
  lx_timer_t *t = mt->udata;
  lx_lane_t *ln = t->ln;
  int co_ref;
  lua_State *co = lx_co_take(ln, &co_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, t->fn_ref);
  lua_rawgeti(co, LUA_REGISTRYINDEX, t->self_ref);
  lx_call_on(ln, co, co_ref, 1, LX_TIMER, NULL, t, "timer");
}

static void lx__timer_unlink(lx_timer_t *t) {
  if (!t->linked) return;
  t->linked = false;
  if (t->prev)
    t->prev->next = t->next;
  else
    t->ln->timers = t->next;
  if (t->next) t->next->prev = t->prev;
  t->prev = t->next = NULL;
}

static void lx__timer_finish(mp_timer_t *mt) {
  lx_timer_t *t = mt->udata;
  lx_lane_t *ln = t->ln;
  lua_State *L = ln->L;
  lx__timer_unlink(t);
  if (!t->failed && t->done_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->done_ref);
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
    lx_call(ln, L, 1, LX_PLAIN, NULL, NULL, "timer on_done");
  }
  luaL_unref(L, LUA_REGISTRYINDEX, t->fn_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, t->done_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, t->self_ref); /* collectable from now */
  t->fn_ref = t->done_ref = t->self_ref = LUA_NOREF;
}

int lx_timer_anchor(lx_timer_t *t) {
  if (t->self_ref == LUA_NOREF) return LUA_NOREF;
  lua_State *L = t->ln->L;
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
  return luaL_ref(L, LUA_REGISTRYINDEX);
}

void lx_timers_stop_all(lx_lane_t *ln) {
  while (ln->timers) {
    lx_timer_t *t = ln->timers;
    /* Off the list first: a timer due in the batch now running finishes
     * only when the batch reaches it. */
    lx__timer_unlink(t);
    t->failed = true; /* no on_done: the code is being replaced */
    timer_stop(reactor_timers(ln->r), &t->t);
  }
}

void lx_timer_failed(lx_timer_t *t) {
  t->failed = true;
  timer_stop(reactor_timers(t->ln->r), &t->t);
}

static lua_Number lx__ms(lua_State *L, int idx) {
  lua_Number ms = luaL_checknumber(L, idx);
  if (ms < 0 || ms > 1e12) luaL_argerror(L, idx, "milliseconds out of range");
  return ms;
}

static int lx__timer_new(lua_State *L, lua_Number delay, lua_Number interval,
                         lua_Number count, int fn_idx, int done_idx) {
  lx_lane_t *ln = lx__ln(L);
  luaL_checktype(L, fn_idx, LUA_TFUNCTION);
  if (done_idx && !lua_isnoneornil(L, done_idx))
    luaL_checktype(L, done_idx, LUA_TFUNCTION);
  else
    done_idx = 0;
  /* The userdata goes on top: an absent on_done's slot may be where it
   * lands, so that slot was decided above. */
  lx_timer_t *t = lua_newuserdata(L, sizeof(*t));
  timer_init(&t->t);
  t->ln = ln;
  t->failed = false;
  t->linked = false;
  t->fn_ref = t->done_ref = t->self_ref = LUA_NOREF;
  luaL_getmetatable(L, LX_TIMER_MT);
  lua_setmetatable(L, -2);
  int rc = timer_start(reactor_timers(ln->r), &t->t, reactor_now(ln->r),
                       (uint64_t)delay, (uint64_t)interval, (int64_t)count,
                       lx__timer_fire, lx__timer_finish, t);
  if (rc) return luaL_error(L, "cannot start a timer: out of memory");
  t->prev = NULL;
  t->next = ln->timers;
  if (t->next) t->next->prev = t;
  ln->timers = t;
  t->linked = true;
  lua_pushvalue(L, fn_idx);
  t->fn_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  if (done_idx) {
    lua_pushvalue(L, done_idx);
    t->done_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_pushvalue(L, -1);
  t->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

static int lx_after(lua_State *L) {
  return lx__timer_new(L, lx__ms(L, 1), 0, 1, 2, 0);
}

static int lx_every(lua_State *L) {
  lua_Number ms = lx__ms(L, 1);
  lua_Number times = luaL_optnumber(L, 3, 0);
  if (times < 0 || times != (lua_Number)(int64_t)times)
    return luaL_argerror(L, 3, "times must be a whole number >= 0");
  return lx__timer_new(L, ms, ms, times, 2, 4);
}

static int lx_timer_stop(lua_State *L) {
  lx_timer_t *t = luaL_checkudata(L, 1, LX_TIMER_MT);
  timer_stop(reactor_timers(t->ln->r), &t->t);
  return 0;
}

static int lx_timer_active(lua_State *L) {
  lx_timer_t *t = luaL_checkudata(L, 1, LX_TIMER_MT);
  lua_pushboolean(L, t->t.armed);
  return 1;
}

/* ---- waiting ---- */

static void lx__sleep_fire(mp_timer_t *mt) {
  lx_sleep_t *s = mt->udata;
  lx_lane_t *ln = s->ln;
  if (s->prev)
    s->prev->next = s->next;
  else
    ln->sleeps = s->next;
  if (s->next) s->next->prev = s->prev;
  s->prev = s->next = NULL;
  lx_run_t run = s->run;
  lx_resume(ln, &run, 0);
}

/* The timer is done with its storage only after fn returned. */
static void lx__sleep_free(mp_timer_t *mt) { free(mt->udata); }

static int lx__sleep_arm(lx_lane_t *ln, const lx_run_t *run, lua_State *co) {
  lx_sleep_t *s = calloc(1, sizeof(*s));
  if (!s) return -ENOMEM;
  s->run = *run;
  s->ln = ln;
  timer_init(&s->timer);
  if (timer_start(reactor_timers(ln->r), &s->timer, reactor_now(ln->r),
                  (uint64_t)lua_tonumber(co, 3), 0, 1, lx__sleep_fire,
                  lx__sleep_free, s)) {
    free(s);
    return -ENOMEM;
  }
  s->next = ln->sleeps;
  if (s->next) s->next->prev = s;
  ln->sleeps = s;
  return 0;
}

void lx_sleeps_abandon(lx_lane_t *ln) {
  while (ln->sleeps) {
    lx_sleep_t *s = ln->sleeps;
    ln->sleeps = s->next;
    lx_run_abandon(ln, &s->run);
    timer_stop(reactor_timers(ln->r), &s->timer); /* frees s */
  }
}

static int lx__sleep_check(lua_State *L) {
  lx__ms(L, 1);
  lx_check_waitable(L, lx__ln(L), "mp.sleep");
  return 0;
}

/* ---- defer, events, stop ---- */

static void lx__defer_run(void *a, void *b) {
  lx_lane_t *ln = a;
  int ref = (int)(intptr_t)b;
  lua_State *L = ln->L;
  if (ln->retired) { /* its code was replaced */
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    lx_lane_task_done(ln);
    return;
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
  luaL_unref(L, LUA_REGISTRYINDEX, ref);
  lua_getfield(L, -1, "n");
  int nargs = (int)lua_tointeger(L, -1);
  lua_pop(L, 1);
  for (int i = 1; i <= nargs + 1; i++) lua_rawgeti(L, -i, i);
  lua_remove(L, -(nargs + 2));
  lx_call(ln, L, nargs, LX_PLAIN, NULL, NULL, "deferred function");
  lx_lane_task_done(ln);
}

static int lx_defer(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  int n = lua_gettop(L);
  lua_createtable(L, n, 1);
  for (int i = 1; i <= n; i++) {
    lua_pushvalue(L, i);
    lua_rawseti(L, -2, i);
  }
  lua_pushinteger(L, n - 1);
  lua_setfield(L, -2, "n");
  int ref = luaL_ref(L, LUA_REGISTRYINDEX);
  atomic_fetch_add(&ln->tasks, 1);
  if (reactor_defer(ln->r, lx__defer_run, ln, (void *)(intptr_t)ref)) {
    atomic_fetch_sub(&ln->tasks, 1);
    luaL_unref(L, LUA_REGISTRYINDEX, ref);
    return luaL_error(L, "mp.defer: out of memory");
  }
  return 0;
}

static int lx_on(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  const char *name = luaL_checkstring(L, 1);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  int list;
  if (strcmp(name, "start") == 0)
    list = ln->start_ref;
  else if (strcmp(name, "stop") == 0)
    list = ln->stop_ref;
  else if (strcmp(name, "worker_start") == 0)
    list = ln->worker_start_ref;
  else if (strcmp(name, "reload") == 0)
    list = ln->reload_ref;
  else
    return luaL_argerror(
        L, 1, "unknown event (known: start, stop, worker_start, reload)");
  lua_rawgeti(L, LUA_REGISTRYINDEX, list);
  lua_pushvalue(L, 2);
  lua_rawseti(L, -2, (int)lua_objlen(L, -2) + 1);
  return 0;
}

/* mp.engine { redis = url }: pub/sub through Redis, like --redis (which
 * wins). Only before the server starts: at the script's top level. */
static int lx_engine(lua_State *L) {
  lx_lane_t *ln = lx__ln(L);
  lx_server_t *srv = ln->srv;
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_getfield(L, 1, "redis");
  if (!lua_isstring(L, -1))
    return luaL_error(L, "mp.engine: give { redis = \"redis://host:port\" }");
  const char *url = lua_tostring(L, -1);
  if (srv->redis_cli) return 0; /* --redis / MOONPORT_REDIS win */
  if (srv->redis_url && strcmp(srv->redis_url, url) == 0) return 0;
  if (srv->engine_started)
    return luaL_error(L, "mp.engine: the engine is chosen when the server "
                         "starts (at the script's top level); it uses %s",
                      srv->redis_url ? srv->redis_url : "none");
  if (srv->redis_url)
    return luaL_error(L, "mp.engine: already set to %s", srv->redis_url);
  char err[512];
  redis_url_t u;
  if (redis_url_parse(url, &u, err, sizeof(err)))
    return luaL_error(L, "mp.engine: %s", err);
  srv->redis_url = srv->redis_url_own = strdup(url);
  if (!srv->redis_url) return luaL_error(L, "mp.engine: out of memory");
  srv->remote = true;
  return 0;
}

static int lx_stop(lua_State *L) {
  kill(getpid(), SIGTERM);
  return 0;
}

/* ---- facts ---- */

static int lx_threads(lua_State *L) {
  lua_pushinteger(L, (lua_Integer)lx__ln(L)->srv->nlanes);
  return 1;
}

static int lx_lane(lua_State *L) {
  lua_pushinteger(L, lx__ln(L)->index + 1);
  return 1;
}

static int lx_is_root(lua_State *L) {
  lua_pushboolean(L, lx__ln(L)->is_root);
  return 1;
}

static int lx_worker(lua_State *L) {
  lua_pushinteger(L, lx__ln(L)->srv->worker_index);
  return 1;
}

static int lx_workers(lua_State *L) {
  lua_pushinteger(L, lx__ln(L)->srv->nworkers);
  return 1;
}

static int lx_pid(lua_State *L) {
  lua_pushinteger(L, getpid());
  return 1;
}

static int lx_now(lua_State *L) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  lua_pushnumber(L, (lua_Number)ts.tv_sec * 1e3 + (lua_Number)ts.tv_nsec / 1e6);
  return 1;
}

static const luaL_Reg lx_functions[] = {
    {"listen", lx_listen},   {"connect", lx_connect}, {"after", lx_after},
    {"every", lx_every},     {"defer", lx_defer},
    {"on", lx_on},           {"stop", lx_stop},       {"threads", lx_threads},
    {"lane", lx_lane},       {"pid", lx_pid},         {"now", lx_now},
    {"is_root", lx_is_root}, {"worker", lx_worker},   {"workers", lx_workers},
    {"engine", lx_engine},   {"log", lx_log},
    {NULL, NULL}};

static const luaL_Reg lx_timer_methods[] = {
    {"stop", lx_timer_stop}, {"active", lx_timer_active}, {NULL, NULL}};

static const luaL_Reg lx_listener_methods[] = {{"port", lx_listener_port},
                                               {"address", lx_listener_address},
                                               {"close", lx_listener_close},
                                               {NULL, NULL}};

static void lx__class(lua_State *L, const char *name, const luaL_Reg *methods) {
  luaL_newmetatable(L, name);
  lua_newtable(L);
  luaL_setfuncs(L, methods, 0);
  lua_setfield(L, -2, "__index");
  lua_pushstring(L, name);
  lua_setfield(L, -2, "__metatable");
  lua_pop(L, 1);
}

int luaopen_moonport(lua_State *L) {
  lx_lane_t *ln = lx_lane_of(L);
  lx__class(L, LX_TIMER_MT, lx_timer_methods);
  lx__class(L, LX_LISTENER_MT, lx_listener_methods);
  lua_newtable(L);
  lua_pushlightuserdata(L, ln);
  luaL_setfuncs(L, lx_functions, 1);
  lx_push_waiter(L, ln, lx__sleep_check, lx__sleep_arm);
  lua_setfield(L, -2, "sleep");
  lx_pubsub_open(L, ln);
  lx_http_open(L, ln);
  lx_redis_open(L, ln);
  lx_client_open(L, ln); /* mp.resolve, mp.tcp, mp.wait */
  lx_stats_open(L, ln);
  lx_shared_open(L, ln);
  lua_pushliteral(L, MOONPORT_VERSION);
  lua_setfield(L, -2, "version");
  lua_createtable(L, ln->srv->argc, 0);
  for (int i = 0; i < ln->srv->argc; i++) {
    lua_pushstring(L, ln->srv->argv[i]);
    lua_rawseti(L, -2, i + 1);
  }
  lua_setfield(L, -2, "args");
  lx_require(L, "moonport.mp"); /* the Lua-written parts: lua/moonport/mp.lua */
  lua_insert(L, -2);
  lua_call(L, 1, 1);
  return 1;
}
