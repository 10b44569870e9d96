/* SPDX-License-Identifier: MIT */

/*
 * echo_floor: the cost floor for the moonport echo benchmark.
 *
 * A minimal single-threaded, level-triggered epoll echo server: accept, then
 * per readiness event one read() and one write() of what was read. Nothing
 * else: no per-connection state, no buffering of unsent bytes (a short write
 * drops the rest; with the benchmark's small ping-pong messages a write never
 * comes up short), no timeouts. It is the lower bound on server CPU per round
 * trip that any event-loop server pays on this machine.
 *
 * usage: echo_floor PORT [ADDRESS]   (address defaults to 127.0.0.1)
 * Raises RLIMIT_NOFILE to the hard limit. SIGINT/SIGTERM end it.
 *
 * Build: gcc -O2 -o echo_floor echo_floor.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static char buf[65536];

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: echo_floor PORT [ADDRESS]\n");
        return 2;
    }
    int port = atoi(argv[1]);
    const char *addr = argc > 2 ? argv[2] : "127.0.0.1";

    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    signal(SIGPIPE, SIG_IGN);

    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((unsigned short)port) };
    if (port <= 0 || port > 65535 || inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        fprintf(stderr, "echo_floor: bad port or address\n");
        return 2;
    }
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (ls < 0 || bind(ls, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(ls, SOMAXCONN) < 0) {
        fprintf(stderr, "echo_floor: %s:%d: %s\n", addr, port, strerror(errno));
        return 1;
    }

    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = ls };
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &ev);

    struct epoll_event evs[512];
    for (;;) {
        int n = epoll_wait(ep, evs, 512, -1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            perror("echo_floor: epoll_wait");
            return 1;
        }
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd;
            if (fd == ls) {
                int c;
                while ((c = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
                    struct epoll_event ce = { .events = EPOLLIN, .data.fd = c };
                    epoll_ctl(ep, EPOLL_CTL_ADD, c, &ce);
                }
                continue;
            }
            ssize_t r = read(fd, buf, sizeof buf);
            if (r > 0) {
                if (write(fd, buf, (size_t)r) < 0 && errno != EAGAIN)
                    close(fd);
            } else if (r == 0 || errno != EAGAIN) {
                close(fd); /* also removes it from the epoll set */
            }
        }
    }
}
