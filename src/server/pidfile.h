/* SPDX-License-Identifier: MIT */

/* server/pidfile: the pid file, the outcome of reloads beside it
 * (PIDFILE.reload), and the commands that signal a running server through
 * it (moonport --reload, --reopen-logs).
 *
 * Contract. One pid file per process, set once at start (pidfile_set);
 * a forked worker calls pidfile_set(NULL) so nothing of the root's is
 * touched. Root (or only) process's main thread only. No Lua. */
#ifndef MP_SERVER_PIDFILE_H
#define MP_SERVER_PIDFILE_H

#include <sys/types.h>

/* The pid file's path (NULL: none; the string must outlive its use). */
void pidfile_set(const char *path);
/* Writes our pid (through a mkstemp file in the same folder and a rename,
 * so a reader never sees half of it and a planted link is never written
 * through) and removes an earlier server's PIDFILE.reload.
 * 0, or -1 after a log line. Nothing without a pid file. */
int pidfile_write(void);
/* Removes the pid file and PIDFILE.reload if the pid in it is still ours. */
void pidfile_remove(void);

/* The outcome of reloads, for moonport --reload: each one asked of this
 * process gets a number (reload_begin), then PIDFILE.reload is one line
 * "SEQ STATE MESSAGE" with STATE "rolling" (the root lane loaded the new
 * code; workers are being replaced), "ok" (every worker runs it) or
 * "failed" (MESSAGE says why). Nothing is written without a pid file. */
void reload_begin(void);
void reload_status(const char *state, const char *msg);

/* moonport --reload PIDFILE: sends SIGHUP and waits for a SEQ past the one
 * it saw before with a final STATE (MOONPORT_RELOAD_TIMEOUT seconds at
 * most, 60 by default). Exit status 0 once every worker runs the new
 * code; 1 with the reason on stderr otherwise. */
int reload_other(const char *pidfile);
/* moonport --reopen-logs PIDFILE: sends SIGWINCH and returns at once.
 * Both signal only a moonport process (/proc/PID/exe) that runs as the
 * pid file's owner (or the file is root's): status 1 and a line saying
 * why otherwise. */
int reopen_other(const char *pidfile);

#endif
