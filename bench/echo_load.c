/* SPDX-License-Identifier: MIT */

/*
 * echo_load: TCP echo load generator for the moonport benchmark harness
 * (scripts/bench-echo). Single-threaded, epoll, one process.
 *
 * Ping-pong mode (default): opens C connections, then on every connection
 * sends one M-byte message, waits for the complete M-byte echo, checks it,
 * and sends the next. The first W seconds are a warm-up and are not counted;
 * the next D seconds are measured. Prints one line of key=value pairs on
 * stdout (for the script) and a readable summary on stderr:
 *
 *   rt=N secs=S rps=R p50_us=.. p90_us=.. p99_us=.. p999_us=.. max_us=..
 *   errors=E mismatches=0 conns=C msg=M client_cpu_pct=P client_cpu_s=S
 *   machine_busy_ticks=B [server_ticks=T clk_tck=100]
 * machine_busy_ticks (all CPUs, /proc/stat, over the window) minus the
 * server's and this process's CPU time shows how much else ran meanwhile.
 *
 * Latency is per round trip: from the start of the write of a message to the
 * arrival of the last byte of its echo (CLOCK_MONOTONIC), kept in a log-linear
 * histogram (128 sub-buckets per power of two: < 1 % error).
 * With -P PID the server's CPU time (utime + stime from /proc/PID/stat, in
 * clock ticks) is read at the start and the end of the measured window, so
 * the warm-up is excluded.
 *
 * Idle mode (-i): opens C connections, prints "connected=C" on stdout, then
 * holds them open without traffic until SIGTERM/SIGINT or D seconds pass
 * (default 120), reporting on stderr any the server closes.
 *
 * RLIMIT_NOFILE is raised to the hard limit. Connections are opened with at
 * most 256 handshakes in flight so a burst of 10,000 stays inside the
 * server's listen backlog.
 *
 * Build: gcc -O2 -o echo_load echo_load.c
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define BENCH_NAME "echo_load"
#include "bench_common.h"

static hist_t hist;

static void usage(void)
{
    fprintf(stderr,
        "usage: echo_load [-H host] [-p port] [-c conns] [-m msg_bytes]\n"
        "                 [-d seconds] [-w warmup_seconds] [-P server_pid] [-i]\n"
        "  defaults: -H 127.0.0.1 -p 3000 -c 100 -m 64 -d 10 -w 1\n"
        "  -i  idle mode: open the connections, print connected=N, hold them\n"
        "      without traffic until SIGTERM/SIGINT or -d seconds (default 120)\n");
    exit(2);
}

/* ---- connections ------------------------------------------------------- */

struct conn {
    int fd;
    uint32_t seq;      /* message number, varies the payload */
    size_t sent, got;  /* bytes of the current message written / echoed */
    uint64_t t0;       /* when the current message's write began */
    int want_out;      /* EPOLLOUT registered */
};

static struct conn *conns;
static int nconns;
static size_t msg_size;
static unsigned char *txbuf, *rxbuf; /* per-connection msg_size slices */
static int ep;

static void fill_msg(struct conn *c)
{
    unsigned char *m = txbuf + (size_t)(c - conns) * msg_size;
    for (size_t i = 0; i + 1 < msg_size; i++)
        m[i] = (unsigned char)('a' + (c->seq + i) % 26);
    m[msg_size - 1] = '\n';
}

static void set_events(struct conn *c, uint32_t ev)
{
    struct epoll_event e = { .events = ev, .data.u32 = (uint32_t)(c - conns) };
    if (epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &e) < 0)
        die("epoll_ctl MOD");
}

/*
 * Opens all connections, at most `window` handshakes in flight.
 * Returns 0, or -1 with a message printed.
 */
static int connect_all(const struct sockaddr_in *sa, int window, double limit_s)
{
    int next = 0, pending = 0, done = 0, retries = 0;
    struct epoll_event evs[512];
    uint64_t deadline = now_ns() + (uint64_t)(limit_s * 1e9);

    while (done < nconns) {
        while (next < nconns && pending < window) {
            struct conn *c = &conns[next];
            c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (c->fd < 0) {
                fprintf(stderr, "echo_load: socket() for connection %d: %s\n",
                        next, strerror(errno));
                return -1;
            }
            int one = 1;
            setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            int r = connect(c->fd, (const struct sockaddr *)sa, sizeof *sa);
            if (r < 0 && errno != EINPROGRESS) {
                fprintf(stderr, "echo_load: connect() for connection %d: %s\n",
                        next, strerror(errno));
                return -1;
            }
            struct epoll_event e = { .events = EPOLLOUT, .data.u32 = (uint32_t)next };
            if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &e) < 0)
                die("epoll_ctl ADD");
            next++;
            pending++;
        }
        if (now_ns() > deadline) {
            fprintf(stderr, "echo_load: only %d of %d connections opened in %.0f s\n",
                    done, nconns, limit_s);
            return -1;
        }
        if (stop_flag)
            return -1;
        int n = epoll_wait(ep, evs, 512, 100);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            int idx = (int)evs[i].data.u32;
            struct conn *c = &conns[idx];
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err) {
                /* a handshake lost to a full backlog: retry a few times */
                if ((err == ECONNREFUSED || err == ETIMEDOUT || err == EAGAIN ||
                     err == ECONNRESET) && retries < 100) {
                    retries++;
                    close(c->fd);
                    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
                    if (c->fd < 0)
                        die("socket");
                    int one = 1;
                    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    if (connect(c->fd, (const struct sockaddr *)sa, sizeof *sa) < 0 &&
                        errno != EINPROGRESS) {
                        fprintf(stderr, "echo_load: connect: %s\n", strerror(errno));
                        return -1;
                    }
                    struct epoll_event e = { .events = EPOLLOUT, .data.u32 = (uint32_t)idx };
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &e) < 0)
                        die("epoll_ctl ADD");
                    continue;
                }
                fprintf(stderr, "echo_load: connection %d failed: %s\n", idx, strerror(err));
                return -1;
            }
            /* connected: watch for input only (idle mode: for closes) */
            set_events(c, EPOLLIN | EPOLLRDHUP);
            pending--;
            done++;
        }
    }
    if (retries)
        fprintf(stderr, "echo_load: %d handshakes retried\n", retries);
    return 0;
}

/* starts (or continues) writing the current message; 0 ok, -1 error */
static int pump_write(struct conn *c)
{
    const unsigned char *m = txbuf + (size_t)(c - conns) * msg_size;
    while (c->sent < msg_size) {
        ssize_t w = write(c->fd, m + c->sent, msg_size - c->sent);
        if (w > 0) {
            c->sent += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            if (!c->want_out) {
                c->want_out = 1;
                set_events(c, EPOLLIN | EPOLLOUT);
            }
            return 0;
        }
        return -1;
    }
    if (c->want_out) {
        c->want_out = 0;
        set_events(c, EPOLLIN);
    }
    return 0;
}

static void start_msg(struct conn *c)
{
    c->seq++;
    fill_msg(c);
    c->sent = c->got = 0;
    c->t0 = now_ns();
}

/* ---- main -------------------------------------------------------------- */

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    int port = 3000, pid = 0, idle = 0, opt;
    double seconds = -1, warmup = 1;
    nconns = 100;
    msg_size = 64;

    while ((opt = getopt(argc, argv, "H:p:c:m:d:w:P:ih")) != -1) {
        switch (opt) {
        case 'H': host = optarg; break;
        case 'p': port = atoi(optarg); break;
        case 'c': nconns = atoi(optarg); break;
        case 'm': msg_size = (size_t)atol(optarg); break;
        case 'd': seconds = atof(optarg); break;
        case 'w': warmup = atof(optarg); break;
        case 'P': pid = atoi(optarg); break;
        case 'i': idle = 1; break;
        default: usage();
        }
    }
    if (optind != argc || port <= 0 || port > 65535 || nconns <= 0 ||
        msg_size < 1 || msg_size > (64u << 20) || warmup < 0)
        usage();
    if (seconds < 0)
        seconds = idle ? 120 : 10;
    if (seconds <= 0)
        usage();

    struct sockaddr_in sa;
    int rc = bench_setup(host, port, nconns, "connections", &sa);
    if (rc)
        return rc;

    conns = calloc((size_t)nconns, sizeof *conns);
    if (!idle) {
        txbuf = malloc((size_t)nconns * msg_size);
        rxbuf = malloc((size_t)nconns * msg_size);
        if (!txbuf || !rxbuf)
            die("malloc");
    }
    if (!conns)
        die("calloc");
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");

    uint64_t tc = now_ns();
    if (connect_all(&sa, 256, 30) < 0)
        return 1;
    double connect_s = (double)(now_ns() - tc) / 1e9;

    struct epoll_event evs[1024];

    if (idle) {
        printf("connected=%d connect_secs=%.3f\n", nconns, connect_s);
        fflush(stdout);
        fprintf(stderr, "echo_load: %d idle connections to %s:%d open (%.2f s)\n",
                nconns, host, port, connect_s);
        int closed = 0;
        uint64_t end = now_ns() + (uint64_t)(seconds * 1e9);
        while (!stop_flag && now_ns() < end) {
            int n = epoll_wait(ep, evs, 1024, 200);
            for (int i = 0; i < n; i++) {
                struct conn *c = &conns[evs[i].data.u32];
                char b[512];
                ssize_t r = read(c->fd, b, sizeof b);
                if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
                    closed++;
                    fprintf(stderr, "echo_load: idle connection %u closed by server "
                            "(%d so far)\n", evs[i].data.u32, closed);
                }
            }
        }
        printf("closed_by_server=%d\n", closed);
        return 0;
    }

    /* ping-pong */
    long clk_tck = sysconf(_SC_CLK_TCK);
    long long cpu0 = -1, cpu1 = -1;
    double self0 = self_cpu_s();
    long long busy0 = machine_busy_ticks(NULL), busy1;
    uint64_t start = now_ns();
    uint64_t t_measure = start + (uint64_t)(warmup * 1e9);
    uint64_t t_end = t_measure + (uint64_t)(seconds * 1e9);
    int measuring = warmup <= 0;
    uint64_t rt = 0, errors = 0, mismatches = 0;
    int alive = nconns;
    if (measuring) {
        t_measure = start;
        if (pid)
            cpu0 = proc_stat(pid, NULL, NULL);
    }

    for (int i = 0; i < nconns; i++) {
        start_msg(&conns[i]);
        if (pump_write(&conns[i]) < 0) {
            fprintf(stderr, "echo_load: write: %s\n", strerror(errno));
            return 1;
        }
    }

    uint64_t now = now_ns();
    while (!stop_flag && alive > 0) {
        int n = epoll_wait(ep, evs, 1024, 10);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        now = now_ns();
        if (!measuring && now >= t_measure) {
            measuring = 1;
            t_measure = now;
            t_end = now + (uint64_t)(seconds * 1e9);
            if (pid)
                cpu0 = proc_stat(pid, NULL, NULL);
            self0 = self_cpu_s();
            busy0 = machine_busy_ticks(NULL);
            rt = 0;
            memset(&hist, 0, sizeof hist);
        }
        if (measuring && now >= t_end)
            break;
        for (int i = 0; i < n; i++) {
            struct conn *c = &conns[evs[i].data.u32];
            if (c->fd < 0)
                continue;
            if ((evs[i].events & EPOLLOUT) && pump_write(c) < 0)
                goto conn_error;
            if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                unsigned char *rx = rxbuf + (size_t)(c - conns) * msg_size;
                for (;;) {
                    if (c->got == msg_size) {
                        /* extra bytes beyond the echo: a server bug */
                        char extra;
                        ssize_t r = recv(c->fd, &extra, 1, MSG_PEEK);
                        if (r > 0) {
                            fprintf(stderr, "echo_load: server sent more than it received\n");
                            goto conn_error;
                        }
                        break;
                    }
                    ssize_t r = read(c->fd, rx + c->got, msg_size - c->got);
                    if (r > 0) {
                        c->got += (size_t)r;
                        if (c->got < msg_size)
                            continue;
                        if (c->sent < msg_size)
                            break; /* echo complete before our write? impossible */
                        uint64_t t = now_ns();
                        if (memcmp(rx, txbuf + (size_t)(c - conns) * msg_size, msg_size)) {
                            mismatches++;
                            fprintf(stderr, "echo_load: echo differs from message\n");
                            goto conn_error;
                        }
                        if (measuring) {
                            rt++;
                            hist_add(&hist, t - c->t0);
                        }
                        start_msg(c);
                        if (pump_write(c) < 0)
                            goto conn_error;
                        break; /* level-triggered: the next echo comes later */
                    }
                    if (r < 0 && errno == EINTR)
                        continue;
                    if (r < 0 && errno == EAGAIN)
                        break;
                    if (r == 0)
                        fprintf(stderr, "echo_load: server closed connection %ld\n",
                                (long)(c - conns));
                    goto conn_error;
                }
            }
            continue;
        conn_error:
            errors++;
            epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
            close(c->fd);
            c->fd = -1;
            alive--;
        }
    }
    if (pid)
        cpu1 = proc_stat(pid, NULL, NULL);
    double self_cpu = self_cpu_s() - self0;
    busy1 = machine_busy_ticks(NULL);
    double secs = (double)(now - t_measure) / 1e9;
    if (!measuring || secs <= 0)
        secs = 1e-9;

    double rps = (double)rt / secs;
    printf("rt=%llu secs=%.3f rps=%.1f p50_us=%.1f p90_us=%.1f p99_us=%.1f "
           "p999_us=%.1f max_us=%.1f errors=%llu mismatches=%llu conns=%d msg=%zu "
           "client_cpu_pct=%.0f client_cpu_s=%.3f machine_busy_ticks=%lld",
           (unsigned long long)rt, secs, rps, hist_pct_us(&hist, 50), hist_pct_us(&hist, 90),
           hist_pct_us(&hist, 99), hist_pct_us(&hist, 99.9), (double)hist.max / 1000.0,
           (unsigned long long)errors, (unsigned long long)mismatches, nconns, msg_size,
           100.0 * self_cpu / secs, self_cpu,
           (busy0 >= 0 && busy1 >= 0) ? busy1 - busy0 : -1LL);
    if (pid)
        printf(" server_ticks=%lld clk_tck=%ld",
               (cpu0 >= 0 && cpu1 >= 0) ? cpu1 - cpu0 : -1LL, clk_tck);
    printf("\n");
    fprintf(stderr, "echo_load: %d conns x %zu B, %.2f s: %llu round trips, %.0f rt/s, "
            "p50 %.1f us, p99 %.1f us, max %.1f us, errors %llu\n",
            nconns, msg_size, secs, (unsigned long long)rt, rps, hist_pct_us(&hist, 50),
            hist_pct_us(&hist, 99), (double)hist.max / 1000.0, (unsigned long long)errors);
    for (int i = 0; i < nconns; i++)
        if (conns[i].fd >= 0)
            close(conns[i].fd);
    return errors ? 3 : 0;
}
