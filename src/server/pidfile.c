/* server/pidfile: the pid file, PIDFILE.reload, and --reload /
 * --reopen-logs (see pidfile.h). Moved from main.c. */
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "net/reactor.h"
#include "server/pidfile.h"

static const char *pidfile;
static unsigned reload_seq;

void pidfile_set(const char *path) { pidfile = path; }

int pidfile_write(void) {
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

static void reload_path(char *out, size_t len) {
  snprintf(out, len, "%s.reload", pidfile);
}

void reload_begin(void) { reload_seq++; }

void reload_status(const char *state, const char *msg) {
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

void pidfile_remove(void) {
  char err[256];
  if (pidfile && pidfile_read(pidfile, err, sizeof(err)) == getpid()) {
    char path[4200];
    reload_path(path, sizeof(path));
    unlink(path);
    unlink(pidfile);
  }
}

int reload_other(const char *path) {
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

int reopen_other(const char *path) {
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
