/* SPDX-License-Identifier: MIT */

/* server: process management for moonport, the one entry point main.c
 * calls once the command line is parsed.
 *
 * Contract. server_main owns the process from there on: it opens the
 * logs, maps the counters, loads the script into the lanes, installs the
 * signal handlers, forks and supervises the workers (with more than one),
 * and returns the exit status once everything is stopped and freed. The
 * options must outlive the call. Main thread only. */
#ifndef MP_SERVER_H
#define MP_SERVER_H

#include <stdbool.h>

typedef struct server_opts {
  const char *script; /* the Lua script */
  int argc;           /* its arguments */
  char **argv;
  double drain;       /* seconds a replaced worker has to finish */
  double lua_timeout; /* seconds a callback may run; 0: no watchdog */
  double grace;       /* graceful shutdown deadline in seconds */
  const char *pidfile;   /* --pidfile, or NULL */
  const char *redis;     /* --redis URL, or NULL */
  const char *log;       /* --log PATH ("-": stdout), or NULL */
  const char *error_log; /* --error-log PATH, or NULL */
  bool watch;            /* --watch (needs workers > 1) */
  bool check;            /* --check: load, report, exit (lx_check_script) */
  long max_memory;       /* MB a worker may use, 0: no limit */
  long workers;          /* worker processes (1: no fork) */
  long threads;          /* lanes per process */
} server_opts_t;

/* Runs the server; returns the process's exit status. */
int server_main(const server_opts_t *o);

#endif
