/* SPDX-License-Identifier: MIT */

/* main: the command line only: options from the environment and argv,
 * then src/server runs the server (server_main) or signals a running one
 * (--reload, --reopen-logs). */
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "lx/lx_server.h" /* MOONPORT_VERSION */
#include "server/pidfile.h"
#include "server/server.h"

static const char usage[] =
    "usage: moonport [options] script.lua [script args...]\n"
    "       moonport --reload PIDFILE\n"
    "       moonport --reopen-logs PIDFILE\n"
    "       moonport --check script.lua [script args...]\n"
    "\n"
    "Runs a Lua script that serves TCP and Unix sockets (see docs/API.md).\n"
    "\n"
    "options (environment variable in brackets):\n"
    "  -w, --workers N   worker processes; with more than one, a root\n"
    "                    process supervises them (the number of CPU cores;\n"
    "                    1: one process, no fork) [MOONPORT_WORKERS]\n"
    "  --redis URL       pub/sub across servers through Redis:\n"
    "                    redis://[:password@]host[:port][/db] "
    "[MOONPORT_REDIS]\n"
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
    "  --check           load the script in a throw-away lane without\n"
    "                    listening, warn about globals read that nothing\n"
    "                    defines (file:line); exit 0 if clean, 1 if not\n"
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
  bool check;
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
    } else if (strcmp(a, "--check") == 0) {
      o->check = true;
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
  server_opts_t so = {.script = argv[script],
                      .argc = argc - script - 1,
                      .argv = argv + script + 1,
                      .drain = o.drain,
                      .lua_timeout = o.lua_timeout,
                      .grace = o.grace,
                      .pidfile = o.pidfile,
                      .redis = o.redis,
                      .log = o.log,
                      .error_log = o.error_log,
                      .watch = o.watch,
                      .check = o.check,
                      .max_memory = o.max_memory,
                      .workers = o.workers,
                      .threads = o.threads};
  return server_main(&so);
}
