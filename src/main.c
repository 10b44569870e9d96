/* main: the command line; starts the lanes and turns signals into a
 * graceful shutdown. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <sched.h>
#include <sys/inotify.h>
#include <signal.h>
#include <stdint.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/defer.h"
#include "cluster/cluster.h"
#include "cluster/pubsub.h"
#include "core/log.h"
#include "core/stats.h"
#include "core/notify.h"
#include "lx/lx.h"
#include "net/sock.h"

static const char usage[] =
    "usage: moonport [options] script.lua [script args...]\n"
    "       moonport --reload PIDFILE\n"
    "       moonport --reopen-logs PIDFILE\n"
    "\n"
    "Runs a Lua script that serves TCP and Unix sockets (see docs/API.md).\n"
    "\n"
    "options (environment variable in brackets):\n"
    "  -w, --workers N   worker processes; with more than one, a root\n"
    "                    process supervises them (the number of CPU cores;\n"
    "                    1: one process, no fork) [MOONPORT_WORKERS]\n"
    "  --redis URL       pub/sub across servers through Redis:\n"
    "                    redis://[:password@]host[:port][/db] [MOONPORT_REDIS]\n"
    "  --log PATH        an access log of mp.http requests (combined\n"
    "                    format and the seconds taken; - for stdout)\n"
    "  --error-log PATH  moonport's own log (and anything else written to\n"
    "                    stderr) goes to PATH instead of stderr\n"
    "  --log-level LEVEL error, warn (the default), info or debug: the\n"
    "                    most verbose lines logged [MOONPORT_LOG_LEVEL]\n"
    "  --reopen-logs PIDFILE  ask the server with that pid file to reopen\n"
    "                    its --log and --error-log files (as kill -WINCH\n"
    "                    does), after logrotate moved them\n"
    "  --pidfile PATH    write the root's pid to PATH\n"
    "  --reload PIDFILE  ask the server with that pid file to reload its\n"
    "                    script (as kill -HUP does) and wait: exit 0 once\n"
    "                    every worker runs the new code, 1 with the reason\n"
    "                    if it failed (MOONPORT_RELOAD_TIMEOUT, 60 s)\n"
    "  --watch           reload when a .lua file in the script's folder\n"
    "                    is saved\n"
    "  --drain-timeout SEC  a replaced worker's time to finish its\n"
    "                    connections (10) [MOONPORT_DRAIN_TIMEOUT]\n"
    "  --lua-timeout SEC replace a worker whose Lua callback runs longer\n"
    "                    (30; 0: never) [MOONPORT_LUA_TIMEOUT]\n"
    "  --max-memory MB   replace a worker whose resident memory passes MB\n"
    "                    (0: no limit) [MOONPORT_MAX_MEMORY]\n"
    "  -t, --threads N   lanes per process: threads, each with its own Lua\n"
    "                    VM (1) [MOONPORT_THREADS]\n"
    "  -g, --grace SEC   graceful shutdown deadline in seconds (8)\n"
    "                    [MOONPORT_GRACE]\n"
    "  -v, --verbose     log lifecycle events: --log-level info\n"
    "                    [MOONPORT_VERBOSE=1]\n"
    "  -h, --help        this text\n"
    "  -V, --version     the version\n";

typedef struct {
  double drain;    /* seconds a replaced worker has to finish */
  double lua_timeout; /* seconds a callback may run; 0: no watchdog */
  const char *pidfile;
  const char *redis;   /* --redis URL */
  const char *log;     /* --log PATH */
  const char *error_log; /* --error-log PATH */
  const char *reload;  /* --reload PIDFILE */
  const char *reopen;  /* --reopen-logs PIDFILE */
  int log_level;       /* enum log_level, or -1: the default */
  bool watch;
  long max_memory; /* MB, 0: none */
  long workers;
  long threads;
  double grace;
} options_t;

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "moonport: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, " (see moonport --help)\n");
  return 2;
}

static bool parse_long(const char *s, long min, long max, long *out) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min || v > max) return false;
  *out = v;
  return true;
}

static bool parse_double(const char *s, double min, double max, double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= min && v <= max)) return false;
  *out = v;
  return true;
}

/* Environment first, so the command line wins. Returns 0 to go on, or an
 * exit status + 1. */
static int parse_env(options_t *o) {
  const char *v;
  if ((v = getenv("MOONPORT_DRAIN_TIMEOUT")) && *v &&
      !parse_double(v, 0, 86400, &o->drain))
    return 1 + usage_error("MOONPORT_DRAIN_TIMEOUT must be 0 to 86400 seconds, not '%s'", v);
  if ((v = getenv("MOONPORT_REDIS")) && *v) o->redis = v;
  if ((v = getenv("MOONPORT_LUA_TIMEOUT")) && *v &&
      !parse_double(v, 0, 86400, &o->lua_timeout))
    return 1 + usage_error("MOONPORT_LUA_TIMEOUT must be 0 to 86400 seconds, not '%s'", v);
  if ((v = getenv("MOONPORT_MAX_MEMORY")) && *v &&
      !parse_long(v, 0, 1 << 20, &o->max_memory))
    return 1 + usage_error("MOONPORT_MAX_MEMORY must be 0 to 1048576 MB, not '%s'", v);
  if ((v = getenv("MOONPORT_WORKERS")) && *v &&
      !parse_long(v, 1, 256, &o->workers))
    return 1 + usage_error("MOONPORT_WORKERS must be 1 to 256, not '%s'", v);
  if ((v = getenv("MOONPORT_THREADS")) && *v &&
      !parse_long(v, 1, 1024, &o->threads))
    return 1 + usage_error("MOONPORT_THREADS must be 1 to 1024, not '%s'", v);
  if ((v = getenv("MOONPORT_GRACE")) && *v &&
      !parse_double(v, 0, 86400, &o->grace))
    return 1 + usage_error("MOONPORT_GRACE must be 0 to 86400 seconds, not '%s'", v);
  if ((v = getenv("MOONPORT_VERBOSE")) && *v && strcmp(v, "0") != 0)
    o->log_level = LOG_INFO;
  enum log_level lv;
  if ((v = getenv("MOONPORT_LOG_LEVEL")) && *v) {
    if (log_parse_level(v, &lv) != 0)
      return 1 + usage_error("MOONPORT_LOG_LEVEL must be error, warn, info or debug, not '%s'", v);
    o->log_level = (int)lv;
  }
  return 0;
}

/* Takes the value of option `name` from "--name=V", "-xV" or the next
 * argument. */
static const char *opt_value(int argc, char **argv, int *i, const char *arg,
                             size_t skip) {
  if (arg[skip] == '=') return arg + skip + 1;
  if (arg[skip]) return arg + skip;
  if (*i + 1 < argc) return argv[++*i];
  return NULL;
}

/* Returns the index of the script argument, or -(exit status) - 1. */
static int parse_args(int argc, char **argv, options_t *o) {
  int i = 1;
  for (; i < argc; i++) {
    const char *a = argv[i];
    if (a[0] != '-' || a[1] == 0) break;
    if (strcmp(a, "--") == 0) {
      i++;
      break;
    }
    const char *v;
    if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
      fputs(usage, stdout);
      return -1;
    } else if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
      printf("moonport %s\n", MOONPORT_VERSION);
      return -1;
    } else if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
      o->log_level = LOG_INFO;
    } else if (strncmp(a, "--log-level", 11) == 0) {
      if (a[11] && a[11] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, 11);
      if (!v) return -usage_error("%s needs a level (error, warn, info, debug)", a) - 1;
      enum log_level lv;
      if (log_parse_level(v, &lv) != 0)
        return -usage_error("--log-level must be error, warn, info or debug, not '%s'", v) - 1;
      o->log_level = (int)lv;
    } else if (strncmp(a, "--error-log", 11) == 0 ||
               strncmp(a, "--reopen-logs", 13) == 0) {
      size_t skip = a[3] == 'r' ? 11 : 13;
      if (a[skip] && a[skip] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, skip);
      if (!v || !*v) return -usage_error("%s needs a file name", a) - 1;
      *(skip == 11 ? &o->error_log : &o->reopen) = v;
    } else if (strncmp(a, "--drain-timeout", 15) == 0) {
      if (a[15] && a[15] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, 15);
      if (!v) return -usage_error("%s needs seconds", a) - 1;
      if (!parse_double(v, 0, 86400, &o->drain))
        return -usage_error("--drain-timeout must be 0 to 86400 seconds, not '%s'", v) - 1;
    } else if (strncmp(a, "--lua-timeout", 13) == 0) {
      if (a[13] && a[13] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, 13);
      if (!v) return -usage_error("%s needs seconds", a) - 1;
      if (!parse_double(v, 0, 86400, &o->lua_timeout))
        return -usage_error("--lua-timeout must be 0 to 86400 seconds, not '%s'", v) - 1;
    } else if (strncmp(a, "--redis", 7) == 0) {
      if (a[7] && a[7] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, 7);
      if (!v || !*v) return -usage_error("%s needs a redis:// URL", a) - 1;
      o->redis = v;
    } else if (strncmp(a, "--pidfile", 9) == 0 || strncmp(a, "--reload", 8) == 0) {
      size_t skip = a[2] == 'p' ? 9 : 8;
      if (a[skip] && a[skip] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, skip);
      if (!v || !*v) return -usage_error("%s needs a file name", a) - 1;
      *(skip == 9 ? &o->pidfile : &o->reload) = v;
    } else if (strncmp(a, "--log", 5) == 0) {
      if (a[5] && a[5] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, 5);
      if (!v || !*v) return -usage_error("%s needs a file name (or -)", a) - 1;
      o->log = v;
    } else if (strcmp(a, "--watch") == 0) {
      o->watch = true;
    } else if (strncmp(a, "--max-memory", 12) == 0) {
      if (a[12] && a[12] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, 12);
      if (!v) return -usage_error("%s needs megabytes", a) - 1;
      if (!parse_long(v, 0, 1 << 20, &o->max_memory))
        return -usage_error("--max-memory must be 0 to 1048576 MB, not '%s'", v) - 1;
    } else if (strncmp(a, "-w", 2) == 0 || strncmp(a, "--workers", 9) == 0) {
      size_t skip = a[1] == 'w' ? 2 : 9;
      if (skip == 9 && a[9] && a[9] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, skip);
      if (!v) return -usage_error("%s needs a number of workers", a) - 1;
      if (!parse_long(v, 1, 256, &o->workers))
        return -usage_error("--workers must be 1 to 256, not '%s'", v) - 1;
    } else if (strncmp(a, "-t", 2) == 0 || strncmp(a, "--threads", 9) == 0) {
      size_t skip = a[1] == 't' ? 2 : 9;
      if (skip == 9 && a[9] && a[9] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, skip);
      if (!v) return -usage_error("%s needs a number of threads", a) - 1;
      if (!parse_long(v, 1, 1024, &o->threads))
        return -usage_error("--threads must be 1 to 1024, not '%s'", v) - 1;
    } else if (strncmp(a, "-g", 2) == 0 || strncmp(a, "--grace", 7) == 0) {
      size_t skip = a[1] == 'g' ? 2 : 7;
      if (skip == 7 && a[7] && a[7] != '=') return -usage_error("unknown option '%s'", a) - 1;
      v = opt_value(argc, argv, &i, a, skip);
      if (!v) return -usage_error("%s needs seconds", a) - 1;
      if (!parse_double(v, 0, 86400, &o->grace))
        return -usage_error("--grace must be 0 to 86400 seconds, not '%s'", v) - 1;
    } else {
      return -usage_error("unknown option '%s'", a) - 1;
    }
  }
  if (o->reload || o->reopen) return i;
  if (i >= argc) return -usage_error("%s", "no script given") - 1;
  return i;
}

/* Signals. No thread blocks them, so a process started from a lane
 * (os.execute, io.popen: posix_spawn, which runs no atfork handlers)
 * starts with an ordinary mask; handlers, unlike SIG_IGN, are reset by
 * exec. The handler only counts and wakes the main thread. */
static _Atomic int signals_seen;     /* SIGINT/SIGTERM so far */
static _Atomic int last_signal;
static _Atomic int root_gone;        /* a worker's root died (SIGUSR2) */
static _Atomic int children_exited;  /* the root got SIGCHLD */
static _Atomic int restarts_asked;   /* the root got SIGUSR1 */
static _Atomic int reloads_asked;    /* SIGHUP */
static _Atomic int reopens_asked;    /* SIGWINCH: reopen the log files */
static int wake_fd = -1;             /* eventfd the main thread polls */

static void wake(void) {
  uint64_t one = 1;
  ssize_t w = write(wake_fd, &one, sizeof(one));
  (void)w;
}

static void on_root_gone(int sig) {
  int saved = errno;
  atomic_store(&root_gone, 1);
  wake();
  errno = saved;
}

static void on_restart(int sig) {
  int saved = errno;
  atomic_fetch_add(&restarts_asked, 1);
  wake();
  errno = saved;
}

static void on_reload(int sig) {
  int saved = errno;
  atomic_fetch_add(&reloads_asked, 1);
  wake();
  errno = saved;
}

static void on_reopen(int sig) {
  int saved = errno;
  atomic_fetch_add(&reopens_asked, 1);
  wake();
  errno = saved;
}

static void on_child(int sig) {
  int saved = errno;
  atomic_store(&children_exited, 1);
  wake();
  errno = saved;
}

static void on_stop_signal(int sig) {
  int saved = errno;
  atomic_store(&last_signal, sig);
  atomic_fetch_add(&signals_seen, 1);
  wake();
  errno = saved;
}

/* SIGPIPE: writes to a closed socket then fail with EPIPE instead of
 * killing us; SIGHUP in a worker: a terminal's hangup reaches the whole
 * process group, and reloading is the root's business. */
static void on_ignored(int sig) { (void)sig; }

static void handle(int sig, void (*fn)(int)) {
  struct sigaction sa = {.sa_handler = fn, .sa_flags = SA_RESTART};
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}

/* ---- reopening the logs (logrotate) ----
 *
 * SIGWINCH asks a process to reopen its --log and --error-log files by
 * name: logrotate moves a file away and signals, lines written until the
 * signal is handled still go to the moved file, later ones to a new file
 * at the old name, and none is lost (log_reopen_fd swaps the file under
 * the same fd, so a write in flight on another lane lands whole in one of
 * them). SIGWINCH because the others are taken: HUP reloads, USR1
 * restarts the workers, USR2 tells a worker its root died, and the real
 * time signals have no name logrotate scripts and kill(1) users know. A
 * terminal sends WINCH to its foreground group when it is resized; that
 * reopens the same files, which is harmless. The root reopens its own
 * files first (workers it forks later inherit the new ones) and passes
 * the signal to every worker. Main (or root) thread only. */

static const char *access_path; /* --log, unless "-" */
static const char *error_path;  /* --error-log */

static void reopen_logs(lx_server_t *srv) {
  int rc;
  if (error_path && (rc = log_reopen_fd(STDERR_FILENO, error_path)))
    log_error("cannot reopen the error log %s: %s", error_path, strerror(-rc));
  if (access_path && srv->access_fd >= 0 &&
      (rc = log_reopen_fd(srv->access_fd, access_path)))
    log_error("cannot reopen the access log %s: %s", access_path, strerror(-rc));
  log_info("SIGWINCH: reopened the log files");
}

/* ---- the pid file ---- */

static const char *pidfile;

/* Writes our pid to the pid file (through a temporary file and a rename,
 * so a reader never sees half of it). */
static int pidfile_write(void) {
  if (!pidfile) return 0;
  char stale[4200]; /* the reload outcome of an earlier server */
  snprintf(stale, sizeof(stale), "%s.reload", pidfile);
  unlink(stale);
  char tmp[4200];
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", pidfile, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%d\n", (int)getpid()) < 0 || fclose(f) != 0 ||
      rename(tmp, pidfile) != 0) {
    log_error("cannot write the pid file %s: %s", pidfile, strerror(errno));
    unlink(tmp);
    return -1;
  }
  return 0;
}

/* Reads the pid in `path`: > 0, or 0 with a message in err. */
static pid_t pidfile_read(const char *path, char *err, size_t len) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, len, "cannot read %s: %s", path, strerror(errno));
    return 0;
  }
  long pid = 0;
  int got = fscanf(f, "%ld", &pid);
  fclose(f);
  if (got != 1 || pid <= 0 || pid > 1 << 22) {
    snprintf(err, len, "%s holds no pid", path);
    return 0;
  }
  return (pid_t)pid;
}

/* ---- the outcome of reloads, for moonport --reload ----
 *
 * With --pidfile, each reload's outcome is written to PIDFILE.reload as one
 * line "SEQ STATE MESSAGE": SEQ counts the reloads asked of this process,
 * STATE is "rolling" (the root lane loaded the new code; workers are being
 * replaced), "ok" (every worker runs it) or "failed" (MESSAGE says why).
 * moonport --reload waits for a SEQ past the one it saw before its SIGHUP
 * with a final STATE. Root thread only. */

static unsigned reload_seq;
static bool reload_rolling; /* a reload's roll has not finished yet */

static void reload_path(char *out, size_t len) {
  snprintf(out, len, "%s.reload", pidfile);
}

static void reload_status(const char *state, const char *msg) {
  if (!pidfile) return;
  char path[4200], tmp[4300];
  reload_path(path, sizeof(path));
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
  FILE *f = fopen(tmp, "w");
  if (!f || fprintf(f, "%u %s %s\n", reload_seq, state, msg ? msg : "") < 0 ||
      fclose(f) != 0 || rename(tmp, path) != 0) {
    log_error("cannot write %s: %s", path, strerror(errno));
    unlink(tmp);
  }
}

/* Reads PIDFILE.reload: its SEQ (0 if there is none), its STATE and
 * MESSAGE. */
static unsigned reload_read(const char *pid_path, char *state, size_t slen,
                            char *msg, size_t mlen) {
  char path[4200];
  snprintf(path, sizeof(path), "%s.reload", pid_path);
  state[0] = msg[0] = 0;
  FILE *f = fopen(path, "r");
  if (!f) return 0;
  char line[4096];
  unsigned seq = 0;
  if (fgets(line, sizeof(line), f)) {
    line[strcspn(line, "\n")] = 0;
    int off = 0;
    char st[32];
    if (sscanf(line, "%u %31s %n", &seq, st, &off) >= 2) {
      snprintf(state, slen, "%s", st);
      snprintf(msg, mlen, "%s", off > 0 ? line + off : "");
    } else {
      seq = 0;
    }
  }
  fclose(f);
  return seq;
}

/* A roll of the workers finished: a reload whose roll it ends (or joins:
 * a roll moves to the newest generation) is done. */
static void root_rolled(const char *what, void *arg) {
  (void)what;
  (void)arg;
  if (!reload_rolling) return;
  reload_rolling = false;
  reload_status("ok", "every worker runs the new code");
  notify_send("READY=1\nSTATUS=serving");
}

/* A worker process started (the first ones, and each restart). */
static void root_started(int sink, int ipc_fd, void *arg) {
  lx_server_t *srv = arg;
  static int started;
  if (++started > srv->nworkers)
    atomic_fetch_add(&stats_server(srv->stats)[STAT_SRV_WORKER_RESTARTS], 1);
  lx_ipc_worker_started(sink, ipc_fd, arg);
}

/* A worker process exited: its counters join the totals of the gone, and
 * its slots are free for the next process on that sink. */
static void root_exited(int sink, void *arg) {
  lx_server_t *srv = arg;
  int per = (int)srv->threads + 1;
  stats_retire(srv->stats, sink * per, per);
  lx_ipc_worker_exited(sink, arg);
}

/* Removes the pid file (and the reload outcome) if it is still ours. */
static void pidfile_remove(void) {
  char err[256];
  if (pidfile && pidfile_read(pidfile, err, sizeof(err)) == getpid()) {
    char path[4200];
    reload_path(path, sizeof(path));
    unlink(path);
    unlink(pidfile);
  }
}

/* moonport --reload PIDFILE: asks the server to reload and waits for the
 * outcome (MOONPORT_RELOAD_TIMEOUT seconds at most, 60 by default). 0 once
 * every worker runs the new code; 1 with the reason otherwise. */
static int reload_other(const char *path) {
  char err[4200], state[32], msg[4096];
  pid_t pid = pidfile_read(path, err, sizeof(err));
  if (!pid) {
    fprintf(stderr, "moonport: %s\n", err);
    return 1;
  }
  unsigned before = reload_read(path, state, sizeof(state), msg, sizeof(msg));
  if (kill(pid, SIGHUP) != 0) {
    fprintf(stderr, "moonport: cannot signal pid %d (from %s): %s\n",
            (int)pid, path, strerror(errno));
    return 1;
  }
  const char *t = getenv("MOONPORT_RELOAD_TIMEOUT");
  double secs = t && atof(t) > 0 ? atof(t) : 60;
  uint64_t deadline = reactor_clock_ms() + (uint64_t)(secs * 1000);
  while (reactor_clock_ms() < deadline) {
    unsigned seq = reload_read(path, state, sizeof(state), msg, sizeof(msg));
    if (seq > before && strcmp(state, "ok") == 0) {
      printf("moonport: pid %d reloaded: %s\n", (int)pid, msg);
      return 0;
    }
    if (seq > before && strcmp(state, "failed") == 0) {
      fprintf(stderr, "moonport: reload failed: %s\n", msg);
      return 1;
    }
    if (kill(pid, 0) != 0 && errno == ESRCH) {
      fprintf(stderr, "moonport: pid %d exited during the reload\n", (int)pid);
      return 1;
    }
    usleep(20 * 1000);
  }
  fprintf(stderr, "moonport: pid %d did not finish the reload within %g s%s%s\n",
          (int)pid, secs, state[0] ? "; last state: " : "", state);
  return 1;
}

/* moonport --reopen-logs PIDFILE: signals the server and returns at once
 * (the root passes the signal on to its workers). */
static int reopen_other(const char *path) {
  char err[4200];
  pid_t pid = pidfile_read(path, err, sizeof(err));
  if (!pid) {
    fprintf(stderr, "moonport: %s\n", err);
    return 1;
  }
  if (kill(pid, SIGWINCH) != 0) {
    fprintf(stderr, "moonport: cannot signal pid %d (from %s): %s\n",
            (int)pid, path, strerror(errno));
    return 1;
  }
  return 0;
}

/* A shutdown's deadline passed and a lane is still in a Lua callback (an
 * endless loop can't be stopped from outside its thread): say which, and
 * end the process without it. */
static void exit_stuck(lx_server_t *srv) {
  for (size_t i = 0; i < srv->nlanes; i++) {
    lx_lane_t *ln = srv->lanes[i];
    if (!atomic_load(&ln->busy_since)) continue;
    const char *what = atomic_load(&ln->busy_what);
    log_error("lane %zu is still running %s at the shutdown deadline; "
              "exiting without it", i + 1, what ? what : "Lua");
  }
  pidfile_remove();
  _exit(1);
}

static void lane_thread(void *arg, size_t index) {
  lx_server_t *srv = arg;
  lx_lane_run(srv->lanes[index]);
}

static void cleanup(lx_server_t *srv) {
  lx_engine_stop(srv);
  for (size_t i = 0; i < srv->nlanes; i++) lx_lane_free(srv->lanes[i]);
  pubsub_free(srv->ps);
  srv->ps = NULL;
  ipc_reader_deinit(&srv->ipc_reader);
  free(srv->ipc_out);
  srv->ipc_out = NULL;
  lx_server_close_listeners(srv);
  free(srv->lanes);
  free(srv->group.r);
  if (srv->wake_fd >= 0) close(srv->wake_fd);
  pthread_mutex_destroy(&srv->listen_lock);
  lx_shared_free_all(srv);
  sock_deinit();
}

static int new_wake_fd(lx_server_t *srv) {
  srv->wake_fd = wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd >= 0) return 0;
  log_error("cannot start: %s", strerror(errno));
  return -1;
}

/* ---- the start line ---- */

/* Appends the URL of the listening socket of service `s` to out. */
static size_t listener_url(const lx_service_t *s, char *out, size_t len) {
  const lx_shared_listener_t *sl = s->shared;
  bool http = s->ext != NULL; /* only mp.http services have settings */
  if (sl->path)
    return (size_t)snprintf(out, len, "%s:%s", http ? "http+unix" : "unix",
                            sl->path);
  struct sockaddr_storage ss;
  socklen_t sl_len = sizeof(ss);
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (getsockname(sl->fd, (struct sockaddr *)&ss, &sl_len) == 0) {
    if (ss.ss_family == AF_INET6) {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
      port = ntohs(a->sin6_port);
      return (size_t)snprintf(out, len, "%s://[%s]:%d", http ? "http" : "tcp",
                              host, port);
    }
    struct sockaddr_in *a = (struct sockaddr_in *)&ss;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
  }
  return (size_t)snprintf(out, len, "%s://%s:%d", http ? "http" : "tcp", host,
                          port);
}

/* One line (at info) saying what is served: the version, the script,
 * every listening socket as a URL, workers x lanes. Call while no lane
 * thread runs (it reads the lanes' service lists). */
static void announce(lx_server_t *srv) {
  if (log_get_level() < LOG_INFO) return;
  char urls[2048];
  size_t at = 0;
  const lx_shared_listener_t *seen[64];
  int nseen = 0;
  urls[0] = 0;
  size_t nlanes = srv->root ? 1 : srv->nlanes; /* the root has its lane */
  for (size_t i = 0; i < nlanes; i++) {
    /* Services are listed newest first: collect, then print in order. */
    const lx_service_t *list[64];
    int n = 0;
    for (const lx_service_t *s = srv->lanes[i]->services; s && n < 64;
         s = s->next) {
      if (!s->shared || s->client || (s->closed && !srv->lanes[i]->is_root))
        continue;
      bool dup = false;
      for (int k = 0; k < nseen && !dup; k++) dup = seen[k] == s->shared;
      for (int k = 0; k < n && !dup; k++) dup = list[k]->shared == s->shared;
      if (!dup) list[n++] = s;
    }
    for (int k = n - 1; k >= 0 && at < sizeof(urls) - 1; k--) {
      if (nseen < 64) seen[nseen++] = list[k]->shared;
      if (at) at += (size_t)snprintf(urls + at, sizeof(urls) - at, ", ");
      if (at < sizeof(urls) - 1)
        at += listener_url(list[k], urls + at, sizeof(urls) - at);
    }
  }
  log_info("version %s serving %s on %s; %d worker%s x %zu lane%s",
           MOONPORT_VERSION, srv->script, at ? urls : "no socket",
           srv->nworkers, srv->nworkers == 1 ? "" : "s", srv->threads,
           srv->threads == 1 ? "" : "s");
}

/* Serves with T lanes in this process: the whole server when there is one
 * worker, or one worker of several (ipc_fd >= 0: its link to the root).
 * Returns the exit status. */
static int run_lanes(lx_server_t *srv, int ipc_fd) {
  srv->lanes = calloc(srv->nlanes, sizeof(*srv->lanes));
  srv->group.r = calloc(srv->nlanes, sizeof(*srv->group.r));
  srv->group.n = srv->nlanes;
  srv->ps = pubsub_new((int)srv->nlanes,
                       lx_pubsub_deliver, srv);
  if (!srv->lanes || !srv->group.r || !srv->ps) {
    log_error("out of memory");
    return 1;
  }
  /* Each lane loads the script on this thread, before any lane runs: a
   * script that fails anywhere stops start-up with one line. */
  for (size_t i = 0; i < srv->nlanes; i++) {
    char err[1024];
    srv->lanes[i] = lx_lane_new(srv, (int)i, false, NULL, err, sizeof(err));
    if (!srv->lanes[i]) {
      log_error("%s", err);
      cleanup(srv);
      return 1;
    }
    srv->group.r[i] = srv->lanes[i]->r;
  }
  if (ipc_fd < 0 && lx_engine_start(srv, srv->lanes[0]->r)) {
    cleanup(srv);
    return 1;
  }
  /* Until here a signal simply ends the process (a script stuck at top
   * level can be interrupted); from now on it starts a shutdown. */
  handle(SIGINT, on_stop_signal);
  handle(SIGTERM, on_stop_signal);
  if (ipc_fd >= 0)
    handle(SIGUSR2, on_root_gone);
  else
    handle(SIGHUP, on_reload);
  handle(SIGWINCH, on_reopen);
  if (ipc_fd < 0) announce(srv);
  defer_pool_t *pool = defer_pool_new(srv->nlanes, lane_thread, srv);
  if (!pool) {
    log_error("cannot start %zu threads: %s", srv->nlanes, strerror(errno));
    cleanup(srv);
    return 1;
  }
  lx_ipc_ready(srv);
  if (ipc_fd >= 0)
    log_info("started: %zu lane%s, script %s", srv->nlanes,
             srv->nlanes == 1 ? "" : "s", srv->script);
  if (ipc_fd < 0) {
    pidfile_write();
    notify_send("READY=1");
  }

  int handled = 0;
  bool orphan = false;
  uint64_t hard = 0; /* shutting down: past this, lanes still in Lua are
                        left behind (the process exits) */
  while ((size_t)atomic_load(&srv->lanes_done) < srv->nlanes) {
    /* POLLOUT while frames for the root wait: the lanes queued them
     * rather than block (lx_pubsub.c), and this thread writes them. */
    short out = ipc_fd >= 0 && lx_ipc_out_pending(srv) ? POLLOUT : 0;
    struct pollfd p[2] = {{.fd = wake_fd, .events = POLLIN},
                          {.fd = ipc_fd, .events = (short)(POLLIN | out)}};
    uint64_t now = reactor_clock_ms();
    if (hard && now >= hard) exit_stuck(srv);
    int wait = hard && hard - now < 1000 ? (int)(hard - now) : 1000;
    poll(p, ipc_fd >= 0 ? 2 : 1, wait);
    uint64_t v;
    ssize_t r = read(wake_fd, &v, sizeof(v));
    (void)r;
    if (ipc_fd >= 0 && (p[1].revents & POLLOUT)) lx_ipc_flush(srv);
    lx_ipc_watchdog(srv);
    if (atomic_exchange(&reopens_asked, 0)) reopen_logs(srv);
    if (atomic_exchange(&reloads_asked, 0)) {
      log_warn("SIGHUP: reloading needs worker processes (-w 2 or more: "
               "reload replaces them); nothing changed");
      reload_seq++;
      reload_status("failed", "reloading needs worker processes (-w 2 or "
                              "more); nothing changed");
    }
    /* Frames from the root; EOF means it is gone. */
    bool eof = false;
    while (ipc_fd >= 0 && (p[1].revents & ~POLLOUT)) {
      char buf[65536];
      ssize_t n = recv(ipc_fd, buf, sizeof(buf), MSG_DONTWAIT);
      if (n > 0) {
        lx_ipc_feed(srv, buf, (size_t)n);
        continue;
      }
      eof = n == 0 || (errno != EAGAIN && errno != EINTR);
      break;
    }
    /* The root is gone (killed outright, say): nobody will tell us to
     * stop, and nobody replaces us; close soon. */
    if (!orphan && (atomic_load(&root_gone) || eof)) {
      orphan = true;
      log_warn("the root process is gone; worker %d stops", srv->worker_index);
      uint64_t grace = srv->grace_ms < 1000 ? srv->grace_ms : 1000;
      for (size_t i = 0; i < srv->nlanes; i++)
        reactor_shutdown(srv->lanes[i]->r, grace);
      ipc_fd = -1;
      uint64_t h = reactor_clock_ms() + grace + 500;
      if (!hard || h < hard) hard = h;
    }
    int seen = atomic_load(&signals_seen);
    if (seen == handled) continue;
    int sig = atomic_load(&last_signal);
    if (handled == 0 && ipc_fd < 0 && !orphan) notify_send("STOPPING=1");
    log_info("%s: %s", sig == SIGINT ? "SIGINT" : "SIGTERM",
             handled == 0 ? "shutting down gracefully" : "closing now");
    for (size_t i = 0; i < srv->nlanes; i++)
      reactor_shutdown(srv->lanes[i]->r, handled == 0 ? srv->grace_ms : 0);
    uint64_t h = reactor_clock_ms() + (handled == 0 ? srv->grace_ms : 0) + 2000;
    if (!hard || h < hard) hard = h;
    handled = seen;
  }
  defer_pool_join(pool);
  /* What the lanes queued for the root last (their final unsubscribes
   * and publishes) gets a second to go out. */
  for (uint64_t end = reactor_clock_ms() + 1000;
       ipc_fd >= 0 && lx_ipc_out_pending(srv) && reactor_clock_ms() < end;) {
    struct pollfd p = {.fd = ipc_fd, .events = POLLOUT};
    if (poll(&p, 1, 100) > 0) lx_ipc_flush(srv);
    if (p.revents & (POLLERR | POLLHUP)) break;
  }
  cleanup(srv);
  if (ipc_fd < 0) pidfile_remove();
  log_info("stopped");
  return 0;
}

static int worker_main(int index, int sink, int ipc_fd, void *arg) {
  lx_server_t *srv = arg;
  log_set_worker(index);
  srv->worker_index = index;
  srv->sink = sink;
  srv->serial = stats_next_serial(srv->stats);
  srv->root = false;
  srv->lanes = NULL; /* the root lane stays the root's */
  srv->ps = NULL;
  srv->peers = NULL;
  srv->ipc_fd = ipc_fd;
  pthread_mutex_init(&srv->ipc_lock, NULL);
  pthread_mutex_init(&srv->shared_lock, NULL);
  ipc_reader_init(&srv->ipc_reader, LX_MAX_CHANNEL + LX_MAX_MESSAGE);
  srv->nlanes = srv->threads;
  atomic_store(&srv->lanes_done, 0);
  atomic_store(&signals_seen, 0);
  atomic_store(&children_exited, 0);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  handle(SIGHUP, on_ignored);
  pidfile = NULL; /* the root's */
  lx_engine_after_fork(srv);
  if (srv->wake_fd >= 0) close(srv->wake_fd);
  if (new_wake_fd(srv)) return 1;
  lx_server_after_fork(srv);
  return run_lanes(srv, ipc_fd);
}

/* What workers tell the root about themselves. */
static void root_news(int type, int sink, const char *msg, size_t len,
                      void *arg) {
  cluster_t *c = arg;
  if (type == IPC_READY) {
    cluster_ready(c, sink);
    static bool ready_told; /* root thread only */
    if (!ready_told && cluster_serving(c)) {
      ready_told = true;
      notify_send("READY=1");
    }
  } else if (type == IPC_BEAT) {
    cluster_beat(c, sink);
  } else if (type == IPC_STUCK) {
    char why[256];
    snprintf(why, sizeof(why), "%.*s", (int)(len < 200 ? len : 200), msg);
    cluster_stuck(c, sink, why);
  }
}

typedef struct {
  lx_server_t *srv;
  cluster_t *c;
  int inotify;   /* --watch, or -1 */
  char *base;    /* the script's file name */
  mp_timer_t debounce;
} root_t;

/* Loads the script anew in the root lane; if that works, the workers are
 * replaced one at a time by processes that load it too. */
static void root_reload(root_t *rt, const char *why) {
  char err[1024];
  reload_seq++;
  log_info("%s: reloading %s", why, rt->srv->script);
  notify_reloading();
  if (!lx_lane_reload_root(rt->srv, err, sizeof(err))) {
    log_error("reload failed; the old code keeps serving: %s", err);
    reload_status("failed", err);
    notify_send("READY=1\nSTATUS=the last reload failed; the old code serves");
    return;
  }
  log_warn("%s: reloaded %s; replacing the workers one at a time", why,
           rt->srv->script);
  atomic_fetch_add(&stats_server(rt->srv->stats)[STAT_SRV_RELOADS], 1);
  reload_rolling = true;
  reload_status("rolling", "the root loaded the new code; replacing the workers");
  cluster_roll(rt->c, "reload");
}

static void root_debounced(mp_timer_t *t) {
  if (atomic_load(&signals_seen) == 0) root_reload(t->udata, "--watch");
}

/* --watch: a .lua file in the script's folder was written, moved in or
 * removed. Editors save in bursts, so the reload waits for 300 ms of
 * quiet. */
static void root_inotify(void *arg) {
  root_t *rt = arg;
  char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
  bool hit = false;
  ssize_t n;
  while ((n = read(rt->inotify, buf, sizeof(buf))) > 0) {
    for (char *p = buf; p < buf + n;) {
      struct inotify_event *ev = (struct inotify_event *)p;
      size_t l = ev->len ? strlen(ev->name) : 0;
      if (l > 4 && strcmp(ev->name + l - 4, ".lua") == 0 && ev->name[0] != '.')
        hit = true;
      p += sizeof(*ev) + ev->len;
    }
  }
  if (!hit) return;
  reactor_t *r = rt->srv->lanes[0]->r;
  timer_stop(reactor_timers(r), &rt->debounce);
  timer_start(reactor_timers(r), &rt->debounce, reactor_now(r), 300, 0, 1,
              root_debounced, NULL, rt);
}

static int root_watch(root_t *rt) {
  char *copy = strdup(rt->srv->script);
  rt->inotify = copy ? inotify_init1(IN_NONBLOCK | IN_CLOEXEC) : -1;
  int wd = rt->inotify >= 0
               ? inotify_add_watch(rt->inotify, dirname(copy),
                                   IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE)
               : -1;
  int e = errno;
  free(copy);
  if (wd < 0 ||
      !reactor_watch(rt->srv->lanes[0]->r, rt->inotify, root_inotify, rt)) {
    log_error("--watch: cannot watch the script's folder: %s", strerror(e));
    return -1;
  }
  return 0;
}

/* The root's wake-ups: signals to stop, workers that exited. */
static void root_wake(void *arg) {
  root_t *rt = arg;
  cluster_t *c = rt->c;
  uint64_t v;
  ssize_t r = read(wake_fd, &v, sizeof(v));
  (void)r;
  static int handled;
  if (atomic_exchange(&children_exited, 0)) cluster_reap(c);
  if (atomic_exchange(&reopens_asked, 0)) {
    reopen_logs(rt->srv);
    cluster_signal(c, SIGWINCH);
  }
  if (atomic_exchange(&restarts_asked, 0)) {
    log_info("SIGUSR1: restarting the workers one at a time");
    cluster_roll(c, "rolling restart");
  }
  int seen = atomic_load(&signals_seen);
  if (atomic_exchange(&reloads_asked, 0)) {
    if (handled || seen) {
      log_warn("SIGHUP: not reloading while stopping");
      reload_seq++;
      reload_status("failed", "the server is stopping");
    } else
      root_reload(rt, "SIGHUP");
  }
  if (seen != handled) {
    if (!handled) notify_send("STOPPING=1");
    log_info("%s: stopping the workers",
             atomic_load(&last_signal) == SIGINT ? "SIGINT" : "SIGTERM");
    handled = seen;
    cluster_stop(c);
  }
}

/* Several workers: this process is the root. It runs the script in a root
 * lane (which opens the listening sockets), forks the workers, supervises
 * them, and serves no connection itself. */
static int run_root(lx_server_t *srv, bool watch) {
  char err[1024];
  srv->root = true;
  /* The root lane's own post office (sink 0); messages between processes
   * are not routed yet. */
  srv->lanes = calloc(1, sizeof(*srv->lanes));
  srv->ps = pubsub_new(CLUSTER_SINKS(srv->nworkers), lx_root_deliver, srv);
  if (!srv->lanes || !srv->ps || !lx_ipc_new_peers(srv)) {
    log_error("out of memory");
    return 1;
  }
  lx_lane_t *root = srv->lanes[0] =
      lx_lane_new(srv, 0, true, NULL, err, sizeof(err));
  if (!root) {
    log_error("%s", err);
    pubsub_free(srv->ps);
    free(srv->lanes);
    lx_server_close_listeners(srv);
    lx_shared_free_all(srv);
    return 1;
  }
  handle(SIGCHLD, on_child);
  cluster_hooks_t hooks = {root_started, root_exited, lx_ipc_drain,
                           root_rolled};
  root_t rt = {.srv = srv, .inotify = -1};
  timer_init(&rt.debounce);
  cluster_t *c = rt.c = cluster_new(root->r, srv->nworkers, srv->grace_ms,
                                    worker_main, hooks, srv);
  reactor_watch_t *w = c ? reactor_watch(root->r, wake_fd, root_wake, &rt) : NULL;
  int rc = w ? 0 : -ENOMEM;
  if (c) {
    cluster_set_limits(c, srv->max_memory, srv->lua_timeout_ms, srv->drain_ms);
    srv->worker_news = root_news;
    srv->news_arg = c;
  }
  if (!rc && watch && root_watch(&rt)) rc = -1;
  if (!rc && lx_engine_start(srv, root->r)) rc = -1;
  if (!rc) rc = cluster_start(c);
  if (rc) {
    if (rc != -1) log_error("cannot start the workers: %s", strerror(-rc));
    lx_engine_stop(srv);
    cluster_free(c);
    lx_lane_free(root);
    if (rt.inotify >= 0) close(rt.inotify);
    pubsub_free(srv->ps);
    lx_server_close_listeners(srv);
    lx_shared_free_all(srv);
    return 1;
  }
  handle(SIGINT, on_stop_signal);
  handle(SIGTERM, on_stop_signal);
  handle(SIGUSR1, on_restart);
  handle(SIGHUP, on_reload);
  handle(SIGWINCH, on_reopen);
  pidfile_write();
  announce(srv);
  lx_lane_run(root);
  /* The loop ends once every worker is gone (cluster_stop). */
  cluster_free(c);
  lx_engine_stop(srv);
  srv->exiting = true;
  lx_lane_free(srv->lanes[0]); /* the current one: it owns the reactor */
  lx_lane_free_retired(srv);
  if (rt.inotify >= 0) close(rt.inotify);
  pidfile_remove();
  pubsub_free(srv->ps);
  lx_ipc_free_peers(srv);
  free(srv->lanes);
  lx_server_close_listeners(srv);
  free(srv->group.r);
  close(srv->wake_fd);
  lx_shared_free_all(srv);
  sock_deinit();
  log_info("stopped");
  return 0;
}

/* CPUs this process may run on (taskset and cgroups' cpusets count). */
static long cpu_count(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0)
    return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? n : 1;
}

int main(int argc, char **argv) {
  options_t o = {.drain = 10, .lua_timeout = 30, .threads = 1, .grace = 8,
                 .log_level = -1};
  o.workers = cpu_count() > 256 ? 256 : cpu_count();
  int rc = parse_env(&o);
  if (rc) return rc - 1;
  int script = parse_args(argc, argv, &o);
  if (script < 0) return -script - 1;
  if (o.reload) return reload_other(o.reload);
  if (o.reopen) return reopen_other(o.reopen);
  if (o.watch && o.workers == 1)
    return usage_error("%s", "--watch needs worker processes (-w 2 or more): "
                             "a reload replaces them");
  if (o.log_level >= 0) log_set_level((enum log_level)o.log_level);
  log_set_worker(o.workers == 1 ? 1 : 0);
  pidfile = o.pidfile;
  if (o.error_log && (rc = log_reopen_fd(STDERR_FILENO, o.error_log))) {
    fprintf(stderr, "moonport: cannot open the error log %s: %s\n",
            o.error_log, strerror(-rc));
    return 1;
  }
  error_path = o.error_log;
  if (o.log && strcmp(o.log, "-") != 0) access_path = o.log;
  if (notify_init())
    log_warn("NOTIFY_SOCKET is not a socket path; not notifying the service "
             "manager");

  handle(SIGPIPE, on_ignored);

  if ((rc = sock_init())) {
    log_error("cannot start: %s", strerror(-rc));
    return 1;
  }
  lx_server_t srv = {0};
  srv.script = argv[script];
  srv.argc = argc - script - 1;
  srv.argv = argv + script + 1;
  srv.nlanes = srv.threads = (size_t)o.threads;
  srv.nworkers = (int)o.workers;
  srv.max_memory = (size_t)o.max_memory << 20;
  srv.drain_ms = (uint64_t)(o.drain * 1000);
  srv.worker_index = srv.nworkers == 1 ? 1 : 0;
  srv.grace_ms = (uint64_t)(o.grace * 1000);
  srv.lua_timeout_ms = (uint64_t)(o.lua_timeout * 1000);
  srv.redis_url = o.redis;
  srv.redis_cli = srv.remote = o.redis != NULL;
  pthread_mutex_init(&srv.listen_lock, NULL);
  pthread_mutex_init(&srv.ipc_lock, NULL);
  pthread_mutex_init(&srv.shared_lock, NULL);
  srv.ipc_fd = -1;
  srv.access_fd = -1;
  if (o.log) {
    srv.access_fd = strcmp(o.log, "-") == 0
                        ? STDOUT_FILENO
                        : open(o.log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (srv.access_fd < 0) {
      log_error("cannot open the access log %s: %s", o.log, strerror(errno));
      return 1;
    }
  }
  int per = (int)srv.threads + 1;
  srv.stats = stats_new(srv.nworkers > 1 ? CLUSTER_SINKS(srv.nworkers) * per : per);
  if (!srv.stats) {
    log_error("cannot map the counters: %s", strerror(errno));
    return 1;
  }
  srv.serial = stats_next_serial(srv.stats);
  if (new_wake_fd(&srv)) return 1;
  return srv.nworkers > 1 ? run_root(&srv, o.watch) : run_lanes(&srv, -1);
}
