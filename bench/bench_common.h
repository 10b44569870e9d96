/* SPDX-License-Identifier: MIT */

/* bench_common.h: helpers shared by the benchmark load generators (echo_load.c, pubsub_load.c). */
#ifndef BENCH_COMMON_H
#define BENCH_COMMON_H

/* The including file defines BENCH_NAME (its program name, for messages)
 * and _GNU_SOURCE before any #include. */
#ifndef BENCH_NAME
#error "define BENCH_NAME before including bench_common.h"
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* ---- histogram --------------------------------------------------------- */

#define SUB_BITS 7
#define SUB (1u << SUB_BITS)
#define NBUCKETS ((64 - SUB_BITS + 1) * SUB)

typedef struct {
    uint64_t b[NBUCKETS];
    uint64_t n, max;
} hist_t;

static unsigned bucket_of(uint64_t v)
{
    if (v < SUB)
        return (unsigned)v;
    int msb = 63 - __builtin_clzll(v);
    int shift = msb - SUB_BITS;
    return (unsigned)((shift + 1) * SUB + ((v >> shift) - SUB));
}

/* midpoint of the bucket's range */
static uint64_t value_of(unsigned idx)
{
    if (idx < SUB)
        return idx;
    unsigned shift = idx / SUB - 1;
    uint64_t lo = (uint64_t)(idx % SUB + SUB) << shift;
    return lo + (((uint64_t)1 << shift) >> 1);
}

static void hist_add(hist_t *h, uint64_t ns)
{
    h->b[bucket_of(ns)]++;
    h->n++;
    if (ns > h->max)
        h->max = ns;
}

static double hist_pct_us(const hist_t *h, double pct)
{
    if (h->n == 0)
        return 0;
    uint64_t want = (uint64_t)((double)h->n * pct / 100.0 + 0.5);
    if (want < 1)
        want = 1;
    uint64_t seen = 0;
    for (unsigned i = 0; i < NBUCKETS; i++) {
        seen += h->b[i];
        if (seen >= want) {
            uint64_t v = value_of(i);
            return (double)(v > h->max ? h->max : v) / 1000.0;
        }
    }
    return (double)h->max / 1000.0;
}

/* ---- helpers ----------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what)
{
    fprintf(stderr, BENCH_NAME ": %s: %s\n", what, strerror(errno));
    exit(1);
}

/* the start of a file (one read, at most size - 1 bytes) into buf,
 * NUL-terminated; 0, or -1 if unreadable or empty */
static int read_head(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = 0;
    return 0;
}

/* utime + stime (clock ticks) of a process, and (each if not NULL) its
 * parent pid and whether it is a ksoftirqd kernel thread; -1 if unreadable */
static long long proc_stat(int pid, int *ppid, int *ksoftirqd)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (read_head(path, buf, sizeof buf) < 0)
        return -1;
    char *p = strrchr(buf, ')'); /* comm may contain spaces */
    if (!p)
        return -1;
    if (ksoftirqd) {
        char *comm = strchr(buf, '(');
        *ksoftirqd = comm && strncmp(comm + 1, "ksoftirqd/", 10) == 0;
    }
    p += 2; /* now at field 3 (state) */
    int pp = 0;
    unsigned long long ut = 0, st = 0;
    /* 4 = ppid, 5..13 skipped, 14 = utime, 15 = stime */
    if (sscanf(p, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
               &pp, &ut, &st) != 3)
        return -1;
    if (ppid)
        *ppid = pp;
    return (long long)(ut + st);
}

/* this process's own CPU time, seconds */
static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* busy clock ticks of the whole machine (all CPUs), from /proc/stat:
 * user + nice + system + irq + softirq + steal; -1 if unreadable. The
 * softirq share (network receive processing, which /proc/PID/stat does not
 * charge to the process that caused it) goes to *softirq if not NULL. */
static long long machine_busy_ticks(long long *softirq)
{
    char buf[512];
    if (read_head("/proc/stat", buf, sizeof buf) < 0)
        return -1;
    unsigned long long v[8] = {0};
    if (sscanf(buf, "cpu %llu %llu %llu %llu %llu %llu %llu %llu",
               &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) < 7)
        return -1;
    if (softirq)
        *softirq = (long long)v[6];
    return (long long)(v[0] + v[1] + v[2] + v[5] + v[6] + v[7]);
}

/* ---- setup ------------------------------------------------------------- */

static volatile sig_atomic_t stop_flag;
static void on_signal(int sig) { (void)sig; stop_flag = 1; }

/* SIGPIPE ignored; SIGINT and SIGTERM set stop_flag */
static void setup_signals(void)
{
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sact = { .sa_handler = on_signal };
    sigaction(SIGINT, &sact, NULL);
    sigaction(SIGTERM, &sact, NULL);
}

/* host (IPv4 address) and port into *sa; 0, or -1 with a message printed */
static int parse_addr(const char *host, int port, struct sockaddr_in *sa)
{
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, host, &sa->sin_addr) != 1) {
        fprintf(stderr, BENCH_NAME ": host must be an IPv4 address: %s\n", host);
        return -1;
    }
    return 0;
}

/* Raises RLIMIT_NOFILE to the hard limit; 0 if `n` descriptors (plus a
 * margin of 16) fit, else -1 with a message printed ("<n> <what> need ..."). */
static int raise_nofile(int n, const char *what)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
        (rlim_t)n + 16 > rl.rlim_cur) {
        fprintf(stderr, BENCH_NAME ": %d %s need more descriptors than "
                "RLIMIT_NOFILE allows (%llu)\n", n, what, (unsigned long long)rl.rlim_cur);
        return -1;
    }
    return 0;
}

/* The common start of main(): the address, descriptors and signals.
 * 0, or the exit status (2: bad address, 1: too few descriptors). */
static int bench_setup(const char *host, int port, int n, const char *what,
                       struct sockaddr_in *sa)
{
    if (parse_addr(host, port, sa) < 0)
        return 2;
    if (raise_nofile(n, what) < 0)
        return 1;
    setup_signals();
    return 0;
}

#endif /* BENCH_COMMON_H */
