/* SPDX-License-Identifier: MIT */

/* server/pidfile: the pid file, PIDFILE.reload, and --reload /
 * --reopen-logs (see pidfile.h). Moved from main.c. */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "net/reactor.h"
#include "server/pidfile.h"

static const char *pidfile;
static unsigned reload_seq;

void pidfile_set(const char *path) { pidfile = path; }

/* Writes `text` to `path` through a temporary file of an unpredictable
 * name made in the same folder (mkstemp: O_CREAT | O_EXCL, so a link
 * planted there is never followed), then renames it over `path` (which
 * replaces a link at `path` itself rather than writing through it). 0, or
 * -1 with errno. */
static int write_atomic(const char *path, const char *text) {
  char tmp[4300];
  if (snprintf(tmp, sizeof(tmp), "%s.XXXXXX", path) >= (int)sizeof(tmp)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int fd = mkstemp(tmp);
  if (fd < 0) return -1;
  size_t len = strlen(text);
  int rc =
      fchmod(fd, 0644) == 0 && write(fd, text, len) == (ssize_t)len ? 0 : -1;
  int saved = errno;
  if (close(fd) != 0 && rc == 0) {
    rc = -1;
    saved = errno;
  }
  if (rc == 0 && rename(tmp, path) != 0) {
    rc = -1;
    saved = errno;
  }
  if (rc) unlink(tmp);
  errno = saved;
  return rc;
}

int pidfile_write(void) {
  if (!pidfile) return 0;
  char stale[4200]; /* the reload outcome of an earlier server */
  snprintf(stale, sizeof(stale), "%s.reload", pidfile);
  unlink(stale);
  char line[32];
  snprintf(line, sizeof(line), "%d\n", (int)getpid());
  if (write_atomic(pidfile, line) != 0) {
    log_error("cannot write the pid file %s: %s", pidfile, strerror(errno));
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

static void reload_path(char *out, size_t len) {
  snprintf(out, len, "%s.reload", pidfile);
}

void reload_begin(void) { reload_seq++; }

void reload_status(const char *state, const char *msg) {
  if (!pidfile) return;
  char path[4200], line[4200];
  reload_path(path, sizeof(path));
  snprintf(line, sizeof(line), "%u %s %s\n", reload_seq, state, msg ? msg : "");
  if (write_atomic(path, line) != 0)
    log_error("cannot write %s: %s", path, strerror(errno));
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

void pidfile_remove(void) {
  char err[256];
  if (pidfile && pidfile_read(pidfile, err, sizeof(err)) == getpid()) {
    char path[4200];
    reload_path(path, sizeof(path));
    unlink(path);
    unlink(pidfile);
  }
}

/* The program a process runs, from /proc/PID/exe, without the
 * " (deleted)" an upgrade leaves: 0, or -errno. */
static int proc_exe(pid_t pid, char *out, size_t len) {
  char link[64];
  snprintf(link, sizeof(link), "/proc/%d/exe", (int)pid);
  ssize_t n = readlink(link, out, len - 1);
  if (n < 0) return -errno;
  out[n] = 0;
  size_t k = strlen(out), d = strlen(" (deleted)");
  if (k > d && strcmp(out + k - d, " (deleted)") == 0) out[k - d] = 0;
  return 0;
}

/* Whether the pid read from `path` may be signalled: a moonport server
 * (its program is ours, or is named moonport), running as the owner of
 * the pid file (or the file is root's). A pid file the service can write
 * is then no way for it to have root signal another program, or another
 * user's process. 0, or 1 after a line on stderr. */
static int check_target(pid_t pid, const char *path) {
  char exe[PATH_MAX], self[PATH_MAX];
  int rc = proc_exe(pid, exe, sizeof(exe));
  if (rc) {
    fprintf(stderr, "moonport: pid %d (from %s): %s\n", (int)pid, path,
            strerror(-rc));
    return 1;
  }
  struct stat a, b;
  bool same = proc_exe(getpid(), self, sizeof(self)) == 0 &&
              stat(exe, &a) == 0 && stat(self, &b) == 0 &&
              a.st_dev == b.st_dev && a.st_ino == b.st_ino;
  char base[PATH_MAX];
  snprintf(base, sizeof(base), "%s", exe);
  if (!same && strcmp(basename(base), "moonport") != 0) {
    fprintf(stderr,
            "moonport: pid %d (from %s) is not a moonport server: it runs %s\n",
            (int)pid, path, exe);
    return 1;
  }
  char proc[64];
  snprintf(proc, sizeof(proc), "/proc/%d", (int)pid);
  struct stat f, p;
  if (stat(path, &f) != 0 || stat(proc, &p) != 0) {
    fprintf(stderr, "moonport: pid %d (from %s): %s\n", (int)pid, path,
            strerror(errno));
    return 1;
  }
  if (f.st_uid != 0 && f.st_uid != p.st_uid) {
    fprintf(stderr,
            "moonport: pid %d (from %s) runs as uid %u, the pid file belongs "
            "to uid %u: not signalled\n",
            (int)pid, path, (unsigned)p.st_uid, (unsigned)f.st_uid);
    return 1;
  }
  return 0;
}

int reload_other(const char *path) {
  char err[4200], state[32], msg[4096];
  pid_t pid = pidfile_read(path, err, sizeof(err));
  if (!pid) {
    fprintf(stderr, "moonport: %s\n", err);
    return 1;
  }
  if (check_target(pid, path)) return 1;
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

int reopen_other(const char *path) {
  char err[4200];
  pid_t pid = pidfile_read(path, err, sizeof(err));
  if (!pid) {
    fprintf(stderr, "moonport: %s\n", err);
    return 1;
  }
  if (check_target(pid, path)) return 1;
  if (kill(pid, SIGWINCH) != 0) {
    fprintf(stderr, "moonport: cannot signal pid %d (from %s): %s\n",
            (int)pid, path, strerror(errno));
    return 1;
  }
  return 0;
}
