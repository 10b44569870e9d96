/* SPDX-License-Identifier: MIT */

/*
 * pubsub_load: pub/sub fan-out load generator for the moonport benchmark
 * harness (scripts/bench-pubsub), against bench/pubsub.lua. Single-threaded,
 * epoll, one process.
 *
 * 1. Opens S subscriber connections (at most 256 handshakes in flight),
 *    sends "sub\n" on each and waits for every "ok W L\n" acknowledgement
 *    (W: the worker that serves it). With -n N, fails unless the
 *    subscribers are spread over exactly N distinct workers.
 * 2. Opens one publisher connection, asks "who\n" (its worker), then sends
 *    "pub <seq> <t_ns> <padding>\n" lines: seq counts from 0, t_ns is
 *    CLOCK_MONOTONIC when the line was formatted, and the whole line the
 *    subscribers receive ("<seq> <t_ns> <padding>\n") is M bytes (-m).
 *    Pacing: at most Q messages in flight (-q; a message is in flight until
 *    every subscriber has it), so no queue in the server can grow without
 *    bound; with -r R also at most R messages per second (sent in bursts of
 *    whatever is due when the loop wakes, at least every millisecond).
 * 3. Every subscriber parses its lines and, for every delivery, records the
 *    latency receive time - t_ns in a log-linear histogram (128 sub-buckets
 *    per power of two: < 1 % error), overall and per worker, and the same
 *    to the kernel's receive timestamp (arr_* below; -T: not measured,
 *    SO_TIMESTAMPNS left off). Per subscriber
 *    the sequence numbers must arrive 0, 1, 2, ...: a gap counts as lost
 *    messages, a number at or below one already seen as out of order.
 * The first W seconds (-w) are a warm-up (not counted), then D seconds
 * (-d) are measured; then publishing stops and the tool waits for
 * everything in flight (for as long as deliveries keep coming, at most
 * 30 s): whatever a subscriber still lacks then is counted as lost. If
 * nothing is delivered for 3 s while messages are in flight, the run stops
 * there and reports a stall (with which workers' subscribers lag) on
 * stderr.
 *
 * With -P PID (the server's root process) the CPU time (utime + stime,
 * clock ticks, from /proc/PID/stat) of PID and of every process whose
 * parent is PID (its workers) is read at the start and the end of the
 * measured window.
 *
 * Several servers (scripts/bench-redis: moonport servers joined through
 * Redis): -p PORT,PORT,... spreads the subscribers over them in turn
 * (subscriber i on port i mod N) and publishes on the first; -P may be
 * given once per server (their CPU adds up); -X PID reads the CPU time of
 * one more process (Redis) as extra_ticks; -s SECONDS waits that long
 * after the last subscription is acknowledged before publishing (Redis
 * subscribes asynchronously). Per server: srv<K>_subs, srv<K>_p50_us,
 * srv<K>_p99_us, srv<K>_arr_p50_us, srv<K>_arr_p99_us (K from 0, in -p
 * order; only with more than one port). Worker indexes (dist, w<W>_*) are
 * then those of all servers together.
 *
 * Prints one line of key=value pairs on stdout (for the script) and a
 * readable summary on stderr:
 *   msgs=N secs=S msg_rate=R deliveries=D delivery_rate=R p50_us=.. p90_us=..
 *   p99_us=.. p999_us=.. max_us=.. lost=L out_of_order=O bad_lines=B errors=E
 *   stall=0|1
 *   subs=S workers_seen=K dist=W:n,W:n pub_worker=W window=Q rate=R msg=M
 *   sub_secs=.. arr_p50_us=.. arr_p99_us=.. arr_max_us=.. no_rx_stamp=0
 *   clock_step=0 undelivered=0 drain_secs=.. sub_mean_min_us=.. sub_mean_min_idx=..
 *   sub_mean_max_us=.. sub_mean_max_idx=..
 *   w<W>_p50_us=.. w<W>_p99_us=.. w<W>_arr_p50_us=.. w<W>_arr_p99_us=..
 *   w<W>_deliveries=.. (per worker) client_cpu_pct=P client_cpu_s=S
 *   machine_busy_ticks=B machine_softirq_ticks=B
 *   [server_ticks=T root_ticks=T ksoftirqd_ticks=T server_procs=N
 *    procs_changed=0|1 clk_tck=100]
 * arr_*: latency to the kernel's receive timestamp of the read that
 * brought the line (SO_TIMESTAMPNS; for a read of several segments, the
 * last one's), converted to CLOCK_MONOTONIC: when the message was in the
 * subscriber's socket, without this tool's delay in reading it.
 * sub_mean_*: the lowest and highest mean latency of one subscriber (in
 * the socket when known), and which subscriber (index in opening order).
 *
 * With -W PATH every connection is a WebSocket instead (scripts/bench-fanout):
 * it opens with an upgrade request for PATH, then the same lines travel as
 * one WebSocket message each, client to server masked (with a zero key),
 * server to client unmasked; the subscriber strips the frame heads and
 * parses the payloads as lines (each message ends with its newline).
 *
 * RLIMIT_NOFILE is raised to the hard limit.
 *
 * Build: gcc -O2 -o pubsub_load pubsub_load.c
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <getopt.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#define BENCH_NAME "pubsub_load"
#include "bench_common.h"

#define MAX_PROCS 64

/* CPU ticks of `root` and of its children (found by scanning /proc);
 * their pids go to pids[] (root first), their count to *np; -1 if the root
 * is unreadable. `root_ticks` gets the root's share, `ksoftirqd` the
 * ticks of the ksoftirqd/N kernel threads (network processing deferred
 * from interrupts, on behalf of every socket). */
static long long tree_ticks(int root, int *pids, int *np, long long *root_ticks,
                            long long *ksoftirqd)
{
    if (*np >= MAX_PROCS)
        return -1;
    long long total = proc_stat(root, NULL, NULL);
    *ksoftirqd = 0;
    if (total < 0)
        return -1;
    *root_ticks = total;
    pids[(*np)++] = root;
    DIR *d = opendir("/proc");
    if (!d)
        return total;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        int pid = atoi(e->d_name), pp = 0, ks = 0;
        if (pid == root)
            continue;
        long long t = proc_stat(pid, &pp, &ks);
        if (t >= 0 && ks)
            *ksoftirqd += t;
        if (t < 0 || pp != root)
            continue;
        total += t;
        if (*np < MAX_PROCS)
            pids[(*np)++] = pid;
    }
    closedir(d);
    return total;
}

#define MAX_SERVERS 8

/* tree_ticks summed over every server root in roots[0..n) (pids of all
 * of them to pids[], the roots' own ticks to *root_ticks; ksoftirqd
 * counted once); -1 if a root is unreadable. */
static long long trees_ticks(const int *roots, int n, int *pids, int *np,
                             long long *root_ticks, long long *ksoftirqd)
{
    long long total = 0, r = 0, k = 0;
    *np = 0;
    *root_ticks = 0;
    *ksoftirqd = 0;
    for (int i = 0; i < n; i++) {
        long long t = tree_ticks(roots[i], pids, np, &r, &k);
        if (t < 0)
            return -1;
        total += t;
        *root_ticks += r;
        if (i == 0)
            *ksoftirqd = k;
    }
    return total;
}

/* VmRSS in KiB of the server trees (roots and their children), or -1. */
static long long trees_rss_kb(const int *roots, int n)
{
    int pids[MAX_PROCS], np = 0;
    long long r, k;
    if (trees_ticks(roots, n, pids, &np, &r, &k) < 0)
        return -1;
    long long total = 0;
    for (int i = 0; i < np; i++) {
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/%d/status", pids[i]);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        while (fgets(line, sizeof line, f))
            if (strncmp(line, "VmRSS:", 6) == 0)
                total += atoll(line + 6);
        fclose(f);
    }
    return total;
}

static int same_procs(const int *a, int na, const int *b, int nb)
{
    if (na != nb)
        return 0;
    for (int i = 0; i < na; i++) {
        int found = 0;
        for (int j = 0; j < nb; j++)
            found |= a[i] == b[j];
        if (!found)
            return 0;
    }
    return 1;
}

static void usage(void)
{
    fprintf(stderr,
        "usage: pubsub_load [-H host] [-p port] [-c subscribers] [-n workers]\n"
        "                   [-d seconds] [-w warmup_seconds] [-q in_flight]\n"
        "                   [-r msgs_per_sec] [-m msg_bytes] [-P server_pid] [-T]\n"
        "                   [-X other_pid] [-s settle_seconds] [-W ws_path]\n"
        "  defaults: -H 127.0.0.1 -p 3002 -c 1000 -d 10 -w 1 -q 16 -r 0 (no rate\n"
        "  limit, only -q) -m 64; -n 0 accepts any spread over workers;\n"
        "  -T: no kernel receive timestamps (no arrival latency);\n"
        "  -p PORT,PORT,...: several servers (publisher on the first); -P once per server\n"
        "  -W PATH: WebSocket connections to PATH (messages are frames)\n"
        "  -k SECONDS: with -P, the servers' VmRSS before subscribing (rss_base_kb), SECONDS\n"
        "     after the last subscription (rss_idle_kb) and after the last delivery (rss_after_kb)\n");
    exit(2);
}

/* ---- connections ------------------------------------------------------- */

#define MAX_WORKERS 64 /* worker indexes 0..63 (0: a one-process server) */
#define RING (1u << 16) /* completion counters; -q must not exceed it */
#define MAX_LINE 4096

/* -W: what a WebSocket stream from the server has left to decode. */
struct ws_in {
    uint8_t in_body;   /* past the HTTP response head */
    uint8_t head_match; /* bytes of "\r\n\r\n" matched */
    uint8_t hlen;      /* bytes of a frame head seen */
    uint8_t h[14];
    uint64_t left;     /* payload bytes of the current frame still due */
};

static const char *ws_path; /* -W */

/* Strips the HTTP head and frame heads from p[0..n) in place; returns how
 * many payload bytes remain at p. Payloads of every opcode are kept (the
 * server sends nothing but text messages here). */
static size_t ws_unframe(struct ws_in *w, char *p, size_t n)
{
    size_t in = 0, out = 0;
    while (in < n) {
        if (!w->in_body) {
            char c = p[in++];
            static const char end[] = "\r\n\r\n";
            w->head_match = c == end[w->head_match] ? w->head_match + 1 : (c == '\r');
            if (w->head_match == 4)
                w->in_body = 1;
            continue;
        }
        if (w->left) {
            size_t k = n - in < w->left ? n - in : (size_t)w->left;
            memmove(p + out, p + in, k);
            out += k;
            in += k;
            w->left -= k;
            continue;
        }
        w->h[w->hlen++] = (uint8_t)p[in++];
        if (w->hlen < 2)
            continue;
        size_t need = 2, l7 = w->h[1] & 0x7f;
        if (l7 == 126)
            need = 4;
        else if (l7 == 127)
            need = 10;
        if (w->h[1] & 0x80)
            need += 4; /* never from a server */
        if (w->hlen < need)
            continue;
        uint64_t len = l7;
        if (l7 == 126)
            len = (uint64_t)w->h[2] << 8 | w->h[3];
        else if (l7 == 127)
            for (int i = 0; i < 8; i++)
                len = len << 8 | w->h[2 + i];
        w->left = len;
        w->hlen = 0;
    }
    return out;
}

/* A masked (zero key) frame head for a text message of `len` bytes at p;
 * returns its size. */
static size_t ws_head(char *p, size_t len)
{
    size_t h = 0;
    p[h++] = (char)0x81;
    if (len < 126) {
        p[h++] = (char)(0x80 | len);
    } else {
        p[h++] = (char)(0x80 | 126);
        p[h++] = (char)(len >> 8);
        p[h++] = (char)(len & 0xff);
    }
    memset(p + h, 0, 4);
    return h + 4;
}

/* The upgrade request for ws_path, then `line` as a message; into out. */
static size_t ws_hello(char *out, const char *line)
{
    int n = sprintf(out, "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                    "Sec-WebSocket-Version: 13\r\n\r\n", ws_path);
    size_t len = strlen(line);
    size_t h = ws_head(out + n, len);
    memcpy(out + n + h, line, len);
    return (size_t)n + h + len;
}

struct sub {
    int fd;
    int srv;           /* which server (index in -p) */
    int worker;        /* from the ack; -1 before */
    uint64_t expect;   /* next sequence number due */
    uint16_t part_len; /* bytes of an unfinished line */
    uint64_t lat_sum, lat_n; /* measured deliveries: latency (in socket if known) */
    char *part;        /* MAX_LINE bytes */
    struct ws_in ws;   /* -W: the frame decoder */
};

static struct sub *subs;
static int nsubs;
static int ep;
static int acked;
static uint64_t lost, out_of_order, errors, bad_lines;

/* publishing state */
static uint64_t published;          /* messages formatted (sequence numbers 0..published-1) */
static uint64_t completed;          /* messages every subscriber has */
static int32_t remaining[RING];     /* subscribers still owed message seq % RING */
static int measuring;
static uint64_t m_deliveries, m_msgs, total_deliveries;
static uint64_t last_progress;
static hist_t hist_all, hist_w[MAX_WORKERS];
static hist_t hist_arr, hist_arr_w[MAX_WORKERS]; /* kernel arrival time */
static hist_t hist_srv[MAX_SERVERS], hist_arr_srv[MAX_SERVERS]; /* per server */
static struct sockaddr_in addrs[MAX_SERVERS];
static int naddrs = 1;
static int srv_subs[MAX_SERVERS];
static int64_t real_minus_mono;     /* CLOCK_REALTIME - CLOCK_MONOTONIC, ns */
static uint64_t no_rx_stamp;        /* reads that came without a timestamp */
static int rx_stamps = 1;           /* -T turns SO_TIMESTAMPNS off */
static int dist[MAX_WORKERS];

#define PUB_IDX ((uint32_t)0x7fffffff)

static void sub_failed(struct sub *s, const char *why)
{
    fprintf(stderr, "pubsub_load: subscriber %ld (worker %d): %s\n",
            (long)(s - subs), s->worker, why);
    errors++;
    epoll_ctl(ep, EPOLL_CTL_DEL, s->fd, NULL);
    close(s->fd);
    s->fd = -1;
}

/* One line (without its newline) arrived on subscriber s: read at time t
 * (CLOCK_MONOTONIC), in the socket since `arrived` (the kernel's receive
 * timestamp converted to CLOCK_MONOTONIC; 0 if unknown). */
static void on_line(struct sub *s, char *line, size_t len, uint64_t t, uint64_t arrived)
{
    if (s->worker < 0) {
        int w = -1, lane = 0;
        line[len] = 0;
        if (sscanf(line, "ok %d %d", &w, &lane) < 1 || w < 0 || w >= MAX_WORKERS) {
            sub_failed(s, "expected \"ok W L\" after \"sub\"");
            return;
        }
        s->worker = w;
        dist[w]++;
        acked++;
        return;
    }
    char *end;
    uint64_t seq = strtoull(line, &end, 10);
    if (end == line || *end != ' ') {
        bad_lines++;
        return;
    }
    uint64_t ts = strtoull(end + 1, &end, 10);
    if (seq >= published) {
        bad_lines++; /* never sent */
        return;
    }
    if (seq < s->expect) {
        out_of_order++; /* a duplicate or a late one after a gap */
        return;
    }
    /* a gap: those messages are lost for this subscriber (in flight no
     * longer: they will never complete either, which shows as a stall) */
    if (seq > s->expect)
        lost += seq - s->expect;
    s->expect = seq + 1;
    total_deliveries++;
    last_progress = t;
    if (--remaining[seq % RING] == 0)
        completed++;
    if (measuring) {
        m_deliveries++;
        uint64_t lat = t >= ts ? t - ts : 0;
        hist_add(&hist_all, lat);
        hist_add(&hist_w[s->worker], lat);
        hist_add(&hist_srv[s->srv], lat);
        if (arrived) {
            lat = arrived >= ts ? arrived - ts : 0;
            hist_add(&hist_arr, lat);
            hist_add(&hist_arr_w[s->worker], lat);
            hist_add(&hist_arr_srv[s->srv], lat);
        }
        s->lat_sum += lat;
        s->lat_n++;
    }
}

static char rxbuf[MAX_LINE + 65536];

/* CLOCK_REALTIME - CLOCK_MONOTONIC in ns, from the closest of a few pairs */
static int64_t clock_offset(void)
{
    int64_t best_gap = INT64_MAX, off = 0;
    for (int i = 0; i < 9; i++) {
        struct timespec r;
        uint64_t m0 = now_ns();
        clock_gettime(CLOCK_REALTIME, &r);
        uint64_t m1 = now_ns();
        int64_t gap = (int64_t)(m1 - m0);
        if (gap < best_gap) {
            best_gap = gap;
            off = (int64_t)r.tv_sec * 1000000000ll + r.tv_nsec - (int64_t)(m0 + (m1 - m0) / 2);
        }
    }
    return off;
}

/* Reads everything available on subscriber s. */
static void sub_read(struct sub *s)
{
    for (;;) {
        memcpy(rxbuf, s->part, s->part_len);
        /* recvmsg for SO_TIMESTAMPNS: when the last segment read arrived */
        union {
            char buf[CMSG_SPACE(sizeof(struct timespec))];
            struct cmsghdr align;
        } cm;
        struct iovec iov = { rxbuf + s->part_len, sizeof rxbuf - s->part_len };
        struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
                             .msg_control = cm.buf, .msg_controllen = sizeof cm.buf };
        ssize_t r = recvmsg(s->fd, &mh, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        if (r <= 0) {
            sub_failed(s, r == 0 ? "closed by the server" : strerror(errno));
            return;
        }
        uint64_t t = now_ns(), arrived = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
                struct timespec ts;
                memcpy(&ts, CMSG_DATA(c), sizeof ts);
                int64_t real = (int64_t)ts.tv_sec * 1000000000ll + ts.tv_nsec;
                if (real > real_minus_mono)
                    arrived = (uint64_t)(real - real_minus_mono);
            }
        }
        if (!arrived && s->worker >= 0 && rx_stamps)
            no_rx_stamp++;
        size_t got = (size_t)r;
        if (ws_path)
            got = ws_unframe(&s->ws, rxbuf + s->part_len, got);
        size_t have = s->part_len + got, pos = 0;
        for (;;) {
            char *nl = memchr(rxbuf + pos, '\n', have - pos);
            if (!nl)
                break;
            size_t len = (size_t)(nl - (rxbuf + pos));
            on_line(s, rxbuf + pos, len, t, arrived);
            if (s->fd < 0)
                return;
            pos += len + 1;
        }
        if (have - pos >= MAX_LINE) {
            sub_failed(s, "line too long");
            return;
        }
        s->part_len = (uint16_t)(have - pos);
        memcpy(s->part, rxbuf + pos, s->part_len);
        if ((size_t)r < sizeof rxbuf - (have - got))
            return; /* short read: drained (level-triggered anyway) */
    }
}

/* Keeps reading the subscribers (nothing should come) for `secs`. */
static void sub_idle(double secs)
{
    uint64_t until = now_ns() + (uint64_t)(secs * 1e9);
    struct epoll_event sev[512];
    while (now_ns() < until && !stop_flag) {
        int n = epoll_wait(ep, sev, 512, 10);
        for (int i = 0; i < n; i++)
            if (sev[i].data.u32 != PUB_IDX && subs[sev[i].data.u32].fd >= 0)
                sub_read(&subs[sev[i].data.u32]);
    }
}

static int new_socket(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (rx_stamps)
        setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);
    if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) < 0 && errno != EINPROGRESS) {
        int e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    return fd;
}

/*
 * Opens all subscriber connections (at most `window` handshakes in
 * flight), sends "sub\n" on each, and waits for every ack.
 * Returns 0, or -1 with a message printed.
 */
static int subscribe_all(int window, double limit_s)
{
    int next = 0, pending = 0, connected = 0, retries = 0;
    struct epoll_event evs[512];
    uint64_t deadline = now_ns() + (uint64_t)(limit_s * 1e9);

    while (acked < nsubs) {
        while (next < nsubs && pending < window) {
            struct sub *s = &subs[next];
            s->srv = next % naddrs;
            s->fd = new_socket(&addrs[s->srv]);
            if (s->fd < 0) {
                fprintf(stderr, "pubsub_load: connection %d: %s\n", next, strerror(errno));
                return -1;
            }
            struct epoll_event e = { .events = EPOLLOUT, .data.u32 = (uint32_t)next };
            if (epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &e) < 0)
                die("epoll_ctl ADD");
            next++;
            pending++;
        }
        if (now_ns() > deadline) {
            fprintf(stderr, "pubsub_load: after %.0f s only %d of %d connections open, "
                    "%d subscriptions acknowledged\n", limit_s, connected, nsubs, acked);
            return -1;
        }
        if (stop_flag || errors)
            return -1;
        int n = epoll_wait(ep, evs, 512, 100);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            int idx = (int)evs[i].data.u32;
            struct sub *s = &subs[idx];
            if (s->fd < 0)
                continue;
            if (s->worker >= 0 || (evs[i].events & EPOLLIN)) {
                sub_read(s); /* the ack */
                continue;
            }
            int err = 0;
            socklen_t len = sizeof err;
            getsockopt(s->fd, SOL_SOCKET, SO_ERROR, &err, &len);
            if (err) {
                /* a handshake lost to a full backlog: retry a few times */
                if ((err == ECONNREFUSED || err == ETIMEDOUT || err == EAGAIN ||
                     err == ECONNRESET) && retries < 100) {
                    retries++;
                    close(s->fd);
                    s->fd = new_socket(&addrs[s->srv]);
                    if (s->fd < 0)
                        die("connect");
                    struct epoll_event e = { .events = EPOLLOUT, .data.u32 = (uint32_t)idx };
                    if (epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &e) < 0)
                        die("epoll_ctl ADD");
                    continue;
                }
                fprintf(stderr, "pubsub_load: connection %d failed: %s\n", idx, strerror(err));
                return -1;
            }
            char hello[512];
            size_t hl = ws_path ? ws_hello(hello, "sub\n") : 4;
            if (!ws_path)
                memcpy(hello, "sub\n", 4);
            if (write(s->fd, hello, hl) != (ssize_t)hl) {
                fprintf(stderr, "pubsub_load: write sub: %s\n", strerror(errno));
                return -1;
            }
            struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP, .data.u32 = (uint32_t)idx };
            if (epoll_ctl(ep, EPOLL_CTL_MOD, s->fd, &e) < 0)
                die("epoll_ctl MOD");
            pending--;
            connected++;
        }
    }
    if (retries)
        fprintf(stderr, "pubsub_load: %d handshakes retried\n", retries);
    return 0;
}

/* ---- publisher ---------------------------------------------------------- */

static int pub_fd = -1;
static char pub_out[1 << 20];
static size_t pub_len, pub_sent;
static int pub_want_out;
static size_t msg_size;

static void pub_set_events(uint32_t ev)
{
    struct epoll_event e = { .events = ev, .data.u32 = PUB_IDX };
    if (epoll_ctl(ep, EPOLL_CTL_MOD, pub_fd, &e) < 0)
        die("epoll_ctl MOD publisher");
}

/* writes what is queued; 0 ok (maybe still pending), -1 error */
static int pub_flush(void)
{
    while (pub_sent < pub_len) {
        ssize_t w = write(pub_fd, pub_out + pub_sent, pub_len - pub_sent);
        if (w > 0) {
            pub_sent += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            if (!pub_want_out) {
                pub_want_out = 1;
                pub_set_events(EPOLLIN | EPOLLOUT);
            }
            return 0;
        }
        return -1;
    }
    pub_len = pub_sent = 0;
    if (pub_want_out) {
        pub_want_out = 0;
        pub_set_events(EPOLLIN);
    }
    return 0;
}

/* formats message number `published` into the output buffer */
static void pub_format(void)
{
    if (ws_path) /* a message of "pub " + msg_size bytes */
        pub_len += ws_head(pub_out + pub_len, msg_size + 4);
    char *p = pub_out + pub_len;
    uint64_t seq = published;
    int n = sprintf(p, "pub %llu %llu ", (unsigned long long)seq,
                    (unsigned long long)now_ns());
    /* the subscribers get the line without "pub ": msg_size bytes in all */
    size_t body = (size_t)n - 4;
    while (body + 1 < msg_size) {
        p[n++] = 'x';
        body++;
    }
    p[n++] = '\n';
    pub_len += (size_t)n;
    remaining[seq % RING] = nsubs;
    published++;
    if (measuring)
        m_msgs++;
}

/* ---- main -------------------------------------------------------------- */

static void print_lag(void)
{
    /* per worker: how many subscribers lack messages, the furthest behind */
    for (int w = 0; w < MAX_WORKERS; w++) {
        if (!dist[w])
            continue;
        int behind = 0;
        uint64_t min_expect = UINT64_MAX;
        for (int i = 0; i < nsubs; i++) {
            if (subs[i].worker != w || subs[i].fd < 0)
                continue;
            if (subs[i].expect < published)
                behind++;
            if (subs[i].expect < min_expect)
                min_expect = subs[i].expect;
        }
        fprintf(stderr, "pubsub_load:   worker %d: %d of %d subscribers lack messages; "
                "the furthest behind has %llu of %llu\n", w, behind, dist[w],
                (unsigned long long)(min_expect == UINT64_MAX ? 0 : min_expect),
                (unsigned long long)published);
    }
}

int main(int argc, char **argv)
{
    const char *host = "127.0.0.1";
    int port = 3002, want_workers = 0, window = 16, opt;
    int roots[MAX_SERVERS], nroots = 0, xpid = 0;
    int ports[MAX_SERVERS];
    const char *port_list = NULL;
    double seconds = 10, warmup = 1, rate = 0, settle = 0, keep = 0;
    long long rss_base = -1, rss_idle = -1, rss_after = -1;
    nsubs = 1000;
    msg_size = 64;

    while ((opt = getopt(argc, argv, "H:p:c:n:d:w:q:r:m:P:TX:s:W:k:h")) != -1) {
        switch (opt) {
        case 'H': host = optarg; break;
        case 'p': port_list = optarg; break;
        case 'c': nsubs = atoi(optarg); break;
        case 'n': want_workers = atoi(optarg); break;
        case 'd': seconds = atof(optarg); break;
        case 'w': warmup = atof(optarg); break;
        case 'q': window = atoi(optarg); break;
        case 'r': rate = atof(optarg); break;
        case 'm': msg_size = (size_t)atol(optarg); break;
        case 'P':
            if (nroots == MAX_SERVERS)
                usage();
            roots[nroots++] = atoi(optarg);
            break;
        case 'T': rx_stamps = 0; break;
        case 'X': xpid = atoi(optarg); break;
        case 's': settle = atof(optarg); break;
        case 'W': ws_path = optarg; break;
        case 'k': keep = atof(optarg); break;
        default: usage();
        }
    }
    ports[0] = port;
    if (port_list) {
        naddrs = 0;
        for (const char *p = port_list; *p && naddrs < MAX_SERVERS + 1; ) {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v <= 0 || v > 65535 || naddrs == MAX_SERVERS)
                usage();
            ports[naddrs++] = (int)v;
            p = *end == ',' ? end + 1 : end;
            if (*end && *end != ',')
                usage();
        }
        if (naddrs == 0)
            usage();
        port = ports[0];
    }
    int pid = nroots ? roots[0] : 0; /* "CPU measured" below */
    if (optind != argc || port <= 0 || port > 65535 || nsubs <= 0 || seconds <= 0 || settle < 0 ||
        warmup < 0 || window < 1 || (unsigned)window > RING || rate < 0 ||
        msg_size < 16 || msg_size > 1024 || want_workers < 0)
        usage();

    struct sockaddr_in sa;
    int rc = bench_setup(host, port, nsubs, "subscribers", &sa);
    if (rc)
        return rc;
    addrs[0] = sa;
    for (int i = 1; i < naddrs; i++)
        if (parse_addr(host, ports[i], &addrs[i]) < 0)
            return 2;

    subs = calloc((size_t)nsubs, sizeof *subs);
    char *parts = malloc((size_t)nsubs * MAX_LINE);
    if (!subs || !parts)
        die("malloc");
    for (int i = 0; i < nsubs; i++) {
        subs[i].fd = -1;
        subs[i].worker = -1;
        subs[i].part = parts + (size_t)i * MAX_LINE;
    }
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        die("epoll_create1");

    /* 1. subscribers */
    if (keep > 0 && nroots)
        rss_base = trees_rss_kb(roots, nroots);
    uint64_t t0 = now_ns();
    if (subscribe_all(256, 30) < 0)
        return 1;
    double sub_s = (double)(now_ns() - t0) / 1e9;
    for (int i = 0; i < nsubs; i++)
        srv_subs[subs[i].srv]++;
    if (settle > 0) {
        /* keep reading (nothing should come) while the servers settle */
        uint64_t until = now_ns() + (uint64_t)(settle * 1e9);
        struct epoll_event sev[512];
        while (now_ns() < until && !stop_flag) {
            int n = epoll_wait(ep, sev, 512, 10);
            for (int i = 0; i < n; i++)
                if (subs[sev[i].data.u32].fd >= 0)
                    sub_read(&subs[sev[i].data.u32]);
        }
    }
    if (keep > 0 && nroots) {
        sub_idle(keep);
        rss_idle = trees_rss_kb(roots, nroots);
    }
    int nworkers_seen = 0;
    char dist_s[512] = "";
    size_t dl = 0;
    for (int w = 0; w < MAX_WORKERS; w++) {
        if (!dist[w])
            continue;
        nworkers_seen++;
        dl += (size_t)snprintf(dist_s + dl, sizeof dist_s - dl, "%s%d:%d",
                               dl ? "," : "", w, dist[w]);
    }
    fprintf(stderr, "pubsub_load: %d subscribers acknowledged in %.2f s; per worker %s\n",
            nsubs, sub_s, dist_s);
    if (want_workers && nworkers_seen != want_workers) {
        fprintf(stderr, "pubsub_load: the subscribers are spread over %d worker(s) (%s), "
                "expected %d\n", nworkers_seen, dist_s, want_workers);
        return 1;
    }

    /* 2. the publisher: which worker serves it */
    pub_fd = new_socket(&sa);
    if (pub_fd < 0)
        die("publisher connect");
    struct epoll_event pe = { .events = EPOLLIN, .data.u32 = PUB_IDX };
    if (epoll_ctl(ep, EPOLL_CTL_ADD, pub_fd, &pe) < 0)
        die("epoll_ctl ADD publisher");
    int pub_worker = -1;
    {
        /* blocking-style handshake with a deadline: connect, "who", "me W L" */
        int fl = fcntl(pub_fd, F_GETFL);
        fcntl(pub_fd, F_SETFL, fl & ~O_NONBLOCK);
        struct timeval tv = { .tv_sec = 10 };
        setsockopt(pub_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(pub_fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        char b[512], hello[512];
        size_t got = 0, hl = ws_path ? ws_hello(hello, "who\n") : 4;
        struct ws_in pw = { 0 };
        if (!ws_path)
            memcpy(hello, "who\n", 4);
        if (write(pub_fd, hello, hl) != (ssize_t)hl)
            die("publisher write");
        while (got < sizeof b - 1 && !memchr(b, '\n', got)) {
            ssize_t r = read(pub_fd, b + got, sizeof b - 1 - got);
            if (r <= 0) {
                fprintf(stderr, "pubsub_load: no answer to \"who\" on the publisher "
                        "connection\n");
                return 1;
            }
            got += ws_path ? ws_unframe(&pw, b + got, (size_t)r) : (size_t)r;
        }
        b[got] = 0;
        if (sscanf(b, "me %d", &pub_worker) != 1) {
            fprintf(stderr, "pubsub_load: bad answer to \"who\": %s\n", b);
            return 1;
        }
        fcntl(pub_fd, F_SETFL, fl | O_NONBLOCK);
    }

    /* 3. load */
    real_minus_mono = clock_offset();
    long clk_tck = sysconf(_SC_CLK_TCK);
    int pids0[MAX_PROCS], pids1[MAX_PROCS], np0 = 0, np1 = 0;
    long long cpu0 = -1, cpu1 = -1, root0 = 0, root1 = 0, ksi0 = 0, ksi1 = 0;
    double self0 = self_cpu_s();
    long long sirq0 = 0, sirq1 = 0;
    long long x0 = -1, x1 = -1; /* -X: the other process's ticks */
    long long busy0 = machine_busy_ticks(&sirq0), busy1 = -1;
    uint64_t start = now_ns();
    uint64_t t_measure = start + (uint64_t)(warmup * 1e9);
    uint64_t t_end = t_measure + (uint64_t)(seconds * 1e9);
    uint64_t t_drain_end = 0;
    uint64_t rate_start = start; /* -r: message k is due at rate_start + k / rate */
    int draining = 0, stall = 0;
    if (warmup <= 0) {
        measuring = 1;
        t_measure = start;
        if (xpid)
            x0 = proc_stat(xpid, NULL, NULL);
        if (pid)
            cpu0 = trees_ticks(roots, nroots, pids0, &np0, &root0, &ksi0);
    }
    last_progress = start;

    struct epoll_event evs[1024];
    uint64_t now = start, t_stop = 0;
    for (;;) {
        if (stop_flag) {
            fprintf(stderr, "pubsub_load: interrupted\n");
            break;
        }
        /* publish what the window (and the rate) allow */
        if (!draining && pub_len == 0) {
            while (published - completed < (uint64_t)window &&
                   pub_len + MAX_LINE < sizeof pub_out) {
                if (rate > 0 &&
                    now < rate_start + (uint64_t)((double)published * 1e9 / rate))
                    break;
                pub_format();
            }
            if (pub_len && pub_flush() < 0) {
                fprintf(stderr, "pubsub_load: publisher write: %s\n", strerror(errno));
                errors++;
                break;
            }
        }
        int timeout = 10;
        if (rate > 0 && !draining)
            timeout = 1;
        int n = epoll_wait(ep, evs, 1024, timeout);
        if (n < 0 && errno != EINTR)
            die("epoll_wait");
        for (int i = 0; i < n; i++) {
            uint32_t idx = evs[i].data.u32;
            if (idx == PUB_IDX) {
                if (evs[i].events & EPOLLOUT && pub_flush() < 0) {
                    fprintf(stderr, "pubsub_load: publisher write: %s\n", strerror(errno));
                    errors++;
                }
                if (evs[i].events & (EPOLLIN | EPOLLERR | EPOLLHUP)) {
                    char b[256];
                    ssize_t r = read(pub_fd, b, sizeof b);
                    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
                        fprintf(stderr, "pubsub_load: the server closed the publisher "
                                "connection\n");
                        errors++;
                        epoll_ctl(ep, EPOLL_CTL_DEL, pub_fd, NULL);
                    } else if (r > 0) {
                        bad_lines++;
                    }
                }
                continue;
            }
            struct sub *s = &subs[idx];
            if (s->fd >= 0)
                sub_read(s);
        }
        now = now_ns();
        if (errors)
            break;
        if (!measuring && !draining && now >= t_measure) {
            measuring = 1;
            t_measure = now;
            t_end = now + (uint64_t)(seconds * 1e9);
            if (pid)
                cpu0 = trees_ticks(roots, nroots, pids0, &np0, &root0, &ksi0);
            self0 = self_cpu_s();
            busy0 = machine_busy_ticks(&sirq0);
            if (xpid)
                x0 = proc_stat(xpid, NULL, NULL);
        }
        if (measuring && !draining && now >= t_end) {
            t_stop = now;
            if (pid)
                cpu1 = trees_ticks(roots, nroots, pids1, &np1, &root1, &ksi1);
            busy1 = machine_busy_ticks(&sirq1);
            if (xpid)
                x1 = proc_stat(xpid, NULL, NULL);
            self0 = self_cpu_s() - self0; /* from here on: the window's CPU time */
            measuring = 0;
            draining = 1;
            t_drain_end = now + 30000000000ull;
        }
        if (draining && (completed == published || now >= t_drain_end))
            break;
        if (published > completed && now - last_progress > 3000000000ull) {
            fprintf(stderr, "pubsub_load: STALL: no delivery for %.1f s with %llu "
                    "message(s) in flight (%llu published, %llu complete)\n",
                    (double)(now - last_progress) / 1e9,
                    (unsigned long long)(published - completed),
                    (unsigned long long)published, (unsigned long long)completed);
            print_lag();
            stall = 1;
            break;
        }
    }
    if (!draining) { /* stopped early: close the window here */
        t_stop = now;
        if (pid)
            cpu1 = trees_ticks(roots, nroots, pids1, &np1, &root1, &ksi1);
        busy1 = machine_busy_ticks(&sirq1);
        if (xpid)
            x1 = proc_stat(xpid, NULL, NULL);
        self0 = self_cpu_s() - self0;
    }
    double self_cpu = self0;
    int64_t step = clock_offset() - real_minus_mono;
    int clock_step = step > 1000000 || step < -1000000; /* arrival times are off */
    if (draining && !stall && completed != published) {
        fprintf(stderr, "pubsub_load: after %.1f s, %llu of %llu messages still not "
                "delivered to every subscriber\n", (double)(now - t_stop) / 1e9,
                (unsigned long long)(published - completed), (unsigned long long)published);
        print_lag();
    }
    if (keep > 0 && nroots && !stall && !stop_flag) {
        sub_idle(keep); /* delivered: what the server keeps while idle */
        rss_after = trees_rss_kb(roots, nroots);
    }
    /* whatever a live subscriber still lacks now is lost */
    uint64_t undelivered = 0;
    for (int i = 0; i < nsubs; i++)
        if (subs[i].fd >= 0 && subs[i].expect < published)
            undelivered += published - subs[i].expect;
    if (!stall && !stop_flag)
        lost += undelivered;

    /* fairness: the mean latency of the luckiest and the unluckiest subscriber */
    double sub_min = 0, sub_max = 0;
    int sub_min_i = -1, sub_max_i = -1;
    for (int i = 0; i < nsubs; i++) {
        if (!subs[i].lat_n)
            continue;
        double m = (double)subs[i].lat_sum / (double)subs[i].lat_n / 1000.0;
        if (sub_min_i < 0 || m < sub_min)
            sub_min = m, sub_min_i = i;
        if (sub_max_i < 0 || m > sub_max)
            sub_max = m, sub_max_i = i;
    }
    double secs = (double)(t_stop - t_measure) / 1e9;
    if (secs <= 0)
        secs = 1e-9;
    double msg_rate = (double)m_msgs / secs, del_rate = (double)m_deliveries / secs;
    printf("msgs=%llu secs=%.3f msg_rate=%.1f deliveries=%llu delivery_rate=%.1f "
           "p50_us=%.1f p90_us=%.1f p99_us=%.1f p999_us=%.1f max_us=%.1f "
           "lost=%llu out_of_order=%llu bad_lines=%llu errors=%llu stall=%d "
           "subs=%d workers_seen=%d dist=%s pub_worker=%d window=%d rate=%.0f msg=%zu "
           "sub_secs=%.3f arr_p50_us=%.1f arr_p99_us=%.1f arr_max_us=%.1f "
           "no_rx_stamp=%llu clock_step=%d undelivered=%llu drain_secs=%.3f "
           "sub_mean_min_us=%.1f sub_mean_min_idx=%d sub_mean_max_us=%.1f sub_mean_max_idx=%d",
           (unsigned long long)m_msgs, secs, msg_rate, (unsigned long long)m_deliveries,
           del_rate, hist_pct_us(&hist_all, 50), hist_pct_us(&hist_all, 90),
           hist_pct_us(&hist_all, 99), hist_pct_us(&hist_all, 99.9),
           (double)hist_all.max / 1000.0, (unsigned long long)lost,
           (unsigned long long)out_of_order, (unsigned long long)bad_lines,
           (unsigned long long)errors, stall, nsubs, nworkers_seen, dist_s, pub_worker,
           window, rate, msg_size, sub_s, hist_pct_us(&hist_arr, 50),
           hist_pct_us(&hist_arr, 99), (double)hist_arr.max / 1000.0,
           (unsigned long long)no_rx_stamp, clock_step, (unsigned long long)undelivered,
           draining ? (double)(now - t_stop) / 1e9 : 0.0, sub_min, sub_min_i, sub_max,
           sub_max_i);
    for (int w = 0; w < MAX_WORKERS; w++)
        if (dist[w])
            printf(" w%d_p50_us=%.1f w%d_p99_us=%.1f w%d_arr_p50_us=%.1f "
                   "w%d_arr_p99_us=%.1f w%d_deliveries=%llu", w,
                   hist_pct_us(&hist_w[w], 50), w, hist_pct_us(&hist_w[w], 99), w,
                   hist_pct_us(&hist_arr_w[w], 50), w, hist_pct_us(&hist_arr_w[w], 99), w,
                   (unsigned long long)hist_w[w].n);
    if (naddrs > 1)
        for (int k = 0; k < naddrs; k++)
            printf(" srv%d_subs=%d srv%d_p50_us=%.1f srv%d_p99_us=%.1f srv%d_arr_p50_us=%.1f "
                   "srv%d_arr_p99_us=%.1f", k, srv_subs[k], k, hist_pct_us(&hist_srv[k], 50),
                   k, hist_pct_us(&hist_srv[k], 99), k, hist_pct_us(&hist_arr_srv[k], 50),
                   k, hist_pct_us(&hist_arr_srv[k], 99));
    if (xpid)
        printf(" extra_ticks=%lld", (x0 >= 0 && x1 >= 0) ? x1 - x0 : -1LL);
    if (keep > 0)
        printf(" rss_base_kb=%lld rss_idle_kb=%lld rss_after_kb=%lld", rss_base, rss_idle,
               rss_after);
    printf(" client_cpu_pct=%.0f client_cpu_s=%.3f machine_busy_ticks=%lld "
           "machine_softirq_ticks=%lld",
           100.0 * self_cpu / secs, self_cpu,
           (busy0 >= 0 && busy1 >= 0) ? busy1 - busy0 : -1LL,
           (busy0 >= 0 && busy1 >= 0) ? sirq1 - sirq0 : -1LL);
    if (pid)
        printf(" server_ticks=%lld root_ticks=%lld ksoftirqd_ticks=%lld server_procs=%d "
               "procs_changed=%d clk_tck=%ld",
               (cpu0 >= 0 && cpu1 >= 0) ? cpu1 - cpu0 : -1LL,
               (cpu0 >= 0 && cpu1 >= 0) ? root1 - root0 : -1LL,
               (cpu0 >= 0 && cpu1 >= 0) ? ksi1 - ksi0 : -1LL, np1,
               !same_procs(pids0, np0, pids1, np1), clk_tck);
    printf("\n");
    fprintf(stderr, "pubsub_load: %d subs, publisher on worker %d, window %d%s, %.2f s: "
            "%llu msgs (%.0f/s), %llu deliveries (%.0f/s), p50 %.1f us, p99 %.1f us, "
            "max %.1f us (in the socket: p50 %.1f us, p99 %.1f us), lost %llu, "
            "out of order %llu, errors %llu%s\n",
            nsubs, pub_worker, window, rate > 0 ? " (rate-limited)" : "", secs,
            (unsigned long long)m_msgs, msg_rate, (unsigned long long)m_deliveries, del_rate,
            hist_pct_us(&hist_all, 50), hist_pct_us(&hist_all, 99),
            (double)hist_all.max / 1000.0, hist_pct_us(&hist_arr, 50),
            hist_pct_us(&hist_arr, 99), (unsigned long long)lost,
            (unsigned long long)out_of_order, (unsigned long long)errors,
            stall ? ", STALLED" : "");
    for (int i = 0; i < nsubs; i++)
        if (subs[i].fd >= 0)
            close(subs[i].fd);
    close(pub_fd);
    return (errors || stall || lost || out_of_order || bad_lines || stop_flag) ? 3 : 0;
}
