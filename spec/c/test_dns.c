/* SPDX-License-Identifier: MIT */

/* Unit test for src/net/dns.h: a real reactor on the main thread, a real
 * c-ares channel pointed at a stub DNS server that this test runs on the
 * same reactor (a UDP socket on 127.0.0.1 answering A queries; names
 * starting with "slow" answered 300 ms late, "never.test" not at all).
 * Because the stub shares the loop, a resolver that blocked the loop
 * would never get its answer. The steps run one after the other, each
 * started when the previous one's callbacks are in; a watchdog ends the
 * run after 20 s. Own main(); checks from check.h. */
#include "net/dns.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

static reactor_t *g_r;
static dns_resolver_t *g_d;
static int g_pending;            /* callbacks the current step waits for */
static void (*g_next)(void);     /* the step after it */
static bool g_in_resolve;        /* inside a dns_resolve call */

/* ---- the stub server ---- */

#define STUB_NAMES 32
static struct {
  char name[256];
  int count;
} g_seen[STUB_NAMES];
static int g_stub_fd;
static reactor_watch_t *g_stub_w;

static int stub_count(const char *name) {
  for (int i = 0; i < STUB_NAMES; i++)
    if (strcasecmp(g_seen[i].name, name) == 0) return g_seen[i].count;
  return 0;
}

static void stub_note(const char *name) {
  for (int i = 0; i < STUB_NAMES; i++) {
    if (strcasecmp(g_seen[i].name, name) == 0 || !g_seen[i].name[0]) {
      snprintf(g_seen[i].name, sizeof(g_seen[i].name), "%s", name);
      g_seen[i].count++;
      return;
    }
  }
}

typedef struct {
  mp_timer_t t;
  struct sockaddr_in peer;
  size_t len;
  unsigned char pkt[512];
} late_t;

static void late_send(mp_timer_t *t) {
  late_t *l = t->udata;
  sendto(g_stub_fd, l->pkt, l->len, 0, (struct sockaddr *)&l->peer,
         sizeof(l->peer));
}

static void late_free(mp_timer_t *t) { free(t->udata); }

static void stub_read(void *arg) {
  unsigned char q[512], out[512];
  struct sockaddr_in peer;
  socklen_t pl = sizeof(peer);
  ssize_t n = recvfrom(g_stub_fd, q, sizeof(q), 0, (struct sockaddr *)&peer, &pl);
  if (n < 12) return;
  /* the question: labels, then type and class */
  char name[256];
  size_t p = 12, nl = 0;
  while (p < (size_t)n && q[p]) {
    size_t k = q[p++];
    if (p + k > (size_t)n || nl + k + 2 > sizeof(name)) return;
    if (nl) name[nl++] = '.';
    memcpy(name + nl, q + p, k);
    nl += k;
    p += k;
  }
  name[nl] = 0;
  if (p + 5 > (size_t)n) return;
  int qtype = q[p + 1] << 8 | q[p + 2];
  size_t qend = p + 5;
  if (qtype == 1) stub_note(name);
  if (strcasecmp(name, "never.test") == 0) return;
  /* A records for the names it knows; NXDOMAIN for the rest */
  const char *ip = NULL;
  uint32_t ttl = 60;
  if (strcasecmp(name, "fast.test") == 0) ip = "10.0.0.1", ttl = 1;
  else if (strcasecmp(name, "other.test") == 0) ip = "10.0.0.2";
  else if (strcasecmp(name, "other2.test") == 0) ip = "10.0.0.4";
  else if (strncasecmp(name, "slow", 4) == 0) ip = "10.0.0.3";
  memcpy(out, q, qend);
  out[2] = 0x81; /* QR, RD */
  out[3] = 0x80 | (ip ? 0 : 3); /* RA, NOERROR or NXDOMAIN */
  out[4] = 0, out[5] = 1;
  out[6] = 0, out[7] = ip && qtype == 1 ? 1 : 0;
  memset(out + 8, 0, 4);
  size_t o = qend;
  if (ip && qtype == 1) {
    unsigned char rr[] = {0xc0, 0x0c, 0, 1, 0, 1, (unsigned char)(ttl >> 24),
                          (unsigned char)(ttl >> 16), (unsigned char)(ttl >> 8),
                          (unsigned char)ttl, 0, 4};
    memcpy(out + o, rr, sizeof(rr));
    o += sizeof(rr);
    inet_pton(AF_INET, ip, out + o);
    o += 4;
  }
  if (strncasecmp(name, "slow", 4) == 0) {
    late_t *l = calloc(1, sizeof(*l));
    memcpy(l->pkt, out, o);
    l->len = o;
    l->peer = peer;
    timer_init(&l->t);
    timer_start(reactor_timers(g_r), &l->t, reactor_now(g_r), 300, 0, 1,
                late_send, late_free, l);
    return;
  }
  sendto(g_stub_fd, out, o, 0, (struct sockaddr *)&peer, pl);
}

static int stub_start(void) {
  g_stub_fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
  struct sockaddr_in a = {.sin_family = AF_INET};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t al = sizeof(a);
  if (bind(g_stub_fd, (struct sockaddr *)&a, sizeof(a)) ||
      getsockname(g_stub_fd, (struct sockaddr *)&a, &al))
    abort();
  g_stub_w = reactor_watch(g_r, g_stub_fd, stub_read, NULL);
  if (!g_stub_w) abort();
  return ntohs(a.sin_port);
}

/* ---- stepping ---- */

static void step_go(void *a, void *b) { g_next(); }

static void one_done(void) {
  if (--g_pending == 0) reactor_defer(g_r, step_go, NULL, NULL);
}

static void expect(int n, void (*next)(void)) {
  g_pending = n;
  g_next = next;
}

static dns_req_t *resolve(dns_resolver_t *d, const char *host, int family,
                          uint32_t timeout_ms, dns_cb cb, void *arg) {
  g_in_resolve = true;
  dns_req_t *q = dns_resolve(d, host, family, timeout_ms, cb, arg);
  g_in_resolve = false;
  CHECK(q != NULL);
  return q;
}

static bool is_v4(const dns_addr_t *a, const char *ip) {
  struct in_addr x;
  inet_pton(AF_INET, ip, &x);
  return a->family == AF_INET && a->a.v4.s_addr == x.s_addr;
}

static mp_timer_t g_wait;
static void wait_fire(mp_timer_t *t) { one_done(); }
static void wait_ms(uint64_t ms) {
  timer_init(&g_wait);
  timer_start(reactor_timers(g_r), &g_wait, reactor_now(g_r), ms, 0, 1,
              wait_fire, NULL, NULL);
}

/* ---- the steps ---- */

static uint64_t g_fast_at, g_t0;
static void step_cache(void);
static void step_slow(void);
static void step_timeout(void);
static void step_cancel(void);
static void step_hosts(void);
static void step_numeric(void);
static void step_ttl(void);
static void step_free(void);
static void step_end(void);
static void step_bound(void);
static int g_stub_port;

/* An answer arrives, from the stub, never inside dns_resolve. */
static void on_fast(void *arg, int err, const dns_addr_t *a, size_t n,
                    uint32_t ttl) {
  CHECK(!g_in_resolve);
  CHECK_EQ(err, 0);
  CHECK_EQ(n, 1);
  CHECK(n == 1 && is_v4(&a[0], "10.0.0.1"));
  CHECK_EQ(ttl, 1);
  CHECK_EQ(stub_count("fast.test"), 1);
  g_fast_at = reactor_clock_ms();
  one_done();
}

static void step_answer(void) {
  printf("-- an answer arrives\n");
  expect(1, step_cache);
  resolve(g_d, "fast.test", AF_INET, 2000, on_fast, NULL);
}

/* The cache answers without a query (name case and a final dot don't
 * matter). */
static void on_cached(void *arg, int err, const dns_addr_t *a, size_t n,
                      uint32_t ttl) {
  CHECK(!g_in_resolve);
  CHECK_EQ(err, 0);
  CHECK(n == 1 && is_v4(&a[0], "10.0.0.1"));
  CHECK(ttl <= 1);
  CHECK_EQ(stub_count("fast.test"), 1);
  dns_stats_t st;
  dns_stats(g_d, &st);
  CHECK_EQ(st.cache_hits, 1);
  CHECK_EQ(st.queries, 1);
  one_done();
}

static void step_cache(void) {
  printf("-- a cache hit needs no query\n");
  expect(1, step_slow);
  resolve(g_d, "FAST.test.", AF_INET, 2000, on_cached, NULL);
}

/* A slow answer doesn't hold the loop: a ticker ticks and another lookup
 * is answered meanwhile; two requests for the slow name share a query. */
static mp_timer_t g_tick;
static int g_ticks;
static bool g_other_done;
static void tick(mp_timer_t *t) { g_ticks++; }

static void on_other(void *arg, int err, const dns_addr_t *a, size_t n,
                     uint32_t ttl) {
  CHECK_EQ(err, 0);
  CHECK(n == 1 && is_v4(&a[0], "10.0.0.2"));
  CHECK_EQ(ttl, 60);
  g_other_done = true;
  one_done();
}

static void on_slow(void *arg, int err, const dns_addr_t *a, size_t n,
                    uint32_t ttl) {
  CHECK_EQ(err, 0);
  CHECK(n == 1 && is_v4(&a[0], "10.0.0.3"));
  uint64_t took = reactor_clock_ms() - g_t0;
  CHECK(took >= 250);
  CHECK(g_other_done);
  CHECK(g_ticks >= 5);
  if (arg) printf("   slow answer after %llu ms, %d ticks meanwhile\n",
                  (unsigned long long)took, g_ticks);
  CHECK_EQ(stub_count("slow.test"), 1);
  if (--g_pending == 0) {
    timer_stop(reactor_timers(g_r), &g_tick);
    reactor_defer(g_r, step_go, NULL, NULL);
  }
}

static void step_slow(void) {
  printf("-- a slow answer doesn't block the reactor\n");
  expect(3, step_timeout);
  g_t0 = reactor_clock_ms();
  timer_init(&g_tick);
  timer_start(reactor_timers(g_r), &g_tick, reactor_now(g_r), 20, 20, 0, tick,
              NULL, NULL);
  resolve(g_d, "slow.test", AF_INET, 3000, on_slow, (void *)1);
  resolve(g_d, "slow.test", AF_INET, 3000, on_slow, NULL);
  resolve(g_d, "other.test", AF_INET, 3000, on_other, NULL);
}

/* The request's timeout fires. */
static void on_never(void *arg, int err, const dns_addr_t *a, size_t n,
                     uint32_t ttl) {
  CHECK_EQ(err, -ETIMEDOUT);
  CHECK_EQ(n, 0);
  uint64_t took = reactor_clock_ms() - g_t0;
  CHECK(took >= 190 && took < 1500);
  CHECK(stub_count("never.test") >= 1);
  one_done();
}

static void step_timeout(void) {
  printf("-- the timeout fires\n");
  expect(1, step_cancel);
  g_t0 = reactor_clock_ms();
  resolve(g_d, "never.test", AF_INET, 200, on_never, NULL);
}

/* Cancel: at once (a query in flight, and a cache hit not yet delivered),
 * and from inside another request's callback. */
static int g_cancelled_ran;
static dns_req_t *g_victim, *g_self;
static void on_must_not(void *arg, int err, const dns_addr_t *a, size_t n,
                        uint32_t ttl) {
  g_cancelled_ran++;
}

static void on_canceller(void *arg, int err, const dns_addr_t *a, size_t n,
                         uint32_t ttl) {
  CHECK_EQ(err, 0);
  CHECK(n == 1 && is_v4(&a[0], "10.0.0.4"));
  dns_cancel(g_victim);
  dns_cancel(g_self); /* its own: nothing happens */
  wait_ms(500);       /* the victim's answer would have come by then */
}

static void step_cancel(void) {
  printf("-- cancel works\n");
  expect(1, step_hosts);
  g_cancelled_ran = 0;
  dns_cancel(resolve(g_d, "slow-a.test", AF_INET, 2000, on_must_not, NULL));
  dns_cancel(resolve(g_d, "other.test", AF_INET, 2000, on_must_not, NULL));
  dns_cancel(resolve(g_d, "192.0.2.1", AF_INET, 2000, on_must_not, NULL));
  g_victim = resolve(g_d, "slow-b.test", AF_INET, 2000, on_must_not, NULL);
  g_self = resolve(g_d, "other2.test", AF_INET, 2000, on_canceller, NULL);
}

/* /etc/hosts: "localhost" without a query. */
static void on_localhost(void *arg, int err, const dns_addr_t *a, size_t n,
                         uint32_t ttl) {
  CHECK_EQ(g_cancelled_ran, 0); /* (the previous step) */
  CHECK_EQ(stub_count("slow-a.test"), 1);
  CHECK_EQ(stub_count("slow-b.test"), 1);
  CHECK_EQ(err, 0);
  CHECK(n >= 1 && is_v4(&a[0], "127.0.0.1"));
  CHECK_EQ(stub_count("localhost"), 0);
  one_done();
}

static void step_hosts(void) {
  printf("-- /etc/hosts is read (localhost)\n");
  expect(1, step_numeric);
  resolve(g_d, "localhost", AF_INET, 2000, on_localhost, NULL);
}

/* Numeric addresses need no query; a wrong family, an unknown name. */
static dns_stats_t g_before;
static void on_num4(void *arg, int err, const dns_addr_t *a, size_t n,
                    uint32_t ttl) {
  CHECK(!g_in_resolve);
  CHECK_EQ(err, 0);
  CHECK(n == 1 && is_v4(&a[0], "192.0.2.7"));
  CHECK_EQ(ttl, 0);
  one_done();
}
static void on_num6(void *arg, int err, const dns_addr_t *a, size_t n,
                    uint32_t ttl) {
  struct in6_addr one;
  inet_pton(AF_INET6, "::1", &one);
  CHECK_EQ(err, 0);
  CHECK(n == 1 && a[0].family == AF_INET6 &&
        memcmp(&a[0].a.v6, &one, sizeof(one)) == 0);
  one_done();
}
static void on_err(void *arg, int err, const dns_addr_t *a, size_t n,
                   uint32_t ttl) {
  CHECK_EQ(err, (int)(intptr_t)arg);
  CHECK_EQ(n, 0);
  one_done();
}

/* AF_UNSPEC asks A and AAAA; the stub has only an A record. */
static void on_unspec(void *arg, int err, const dns_addr_t *a, size_t n,
                      uint32_t ttl) {
  CHECK_EQ(err, 0);
  CHECK(n == 1 && is_v4(&a[0], "10.0.0.4"));
  one_done();
}

static void step_numeric(void) {
  printf("-- numeric addresses, errors, AF_UNSPEC\n");
  expect(6, step_ttl);
  dns_stats(g_d, &g_before);
  resolve(g_d, "192.0.2.7", AF_UNSPEC, 2000, on_num4, NULL);
  resolve(g_d, "::1", AF_UNSPEC, 2000, on_num6, NULL);
  resolve(g_d, "192.0.2.7", AF_INET6, 2000, on_err, (void *)(intptr_t)-EINVAL);
  resolve(g_d, "x.test", 12345, 2000, on_err, (void *)(intptr_t)-EAFNOSUPPORT);
  dns_stats_t st;
  dns_stats(g_d, &st);
  CHECK_EQ(st.queries, g_before.queries); /* none of those asked the server */
  resolve(g_d, "nx.test", AF_INET, 2000, on_err, (void *)(intptr_t)-ENOENT);
  resolve(g_d, "other2.test", AF_UNSPEC, 2000, on_unspec, NULL);
  g_in_resolve = true;
  CHECK(dns_resolve(g_d, "", AF_INET, 0, on_must_not, NULL) == NULL);
  CHECK_EQ(errno, EINVAL);
  char big[300];
  memset(big, 'a', sizeof(big) - 1);
  big[sizeof(big) - 1] = 0;
  CHECK(dns_resolve(g_d, big, AF_INET, 0, on_must_not, NULL) == NULL);
  g_in_resolve = false;
}

/* Past the TTL (1 s for fast.test), the name is asked again. */
static void on_fast_again(void *arg, int err, const dns_addr_t *a, size_t n,
                          uint32_t ttl) {
  CHECK_EQ(err, 0);
  CHECK(n == 1 && is_v4(&a[0], "10.0.0.1"));
  CHECK_EQ(stub_count("fast.test"), 2);
  one_done();
}

static void step_ttl_go(void) {
  expect(1, step_free);
  resolve(g_d, "fast.test", AF_INET, 2000, on_fast_again, NULL);
}

static void step_ttl(void) {
  printf("-- TTL expiry re-queries\n");
  uint64_t since = reactor_clock_ms() - g_fast_at;
  expect(1, step_ttl_go);
  wait_ms(since >= 1100 ? 1 : 1100 - since);
}

/* Freeing a resolver: pending requests get -ECANCELED inside dns_free;
 * freeing one from inside its own callback. */
static int g_freed_cbs;
static dns_resolver_t *g_d2;
static void on_freed(void *arg, int err, const dns_addr_t *a, size_t n,
                     uint32_t ttl) {
  CHECK_EQ(err, -ECANCELED);
  g_freed_cbs++;
}

static void on_d2(void *arg, int err, const dns_addr_t *a, size_t n,
                  uint32_t ttl) {
  CHECK_EQ(err, 0);
  int before = g_freed_cbs;
  dns_free(g_d2); /* from its own callback; never.test hears now */
  CHECK_EQ(g_freed_cbs, before + 1);
  one_done();
}

/* The cache's bound: with room for one name, the older one is dropped
 * and asked again. */
static dns_resolver_t *g_d3;
static int g_bound_phase;
static void on_bound(void *arg, int err, const dns_addr_t *a, size_t n,
                     uint32_t ttl) {
  CHECK_EQ(err, 0);
  one_done();
}

static void step_bound_check(void) {
  dns_stats_t st;
  dns_stats(g_d3, &st);
  if (g_bound_phase == 0) {
    CHECK_EQ(st.cached, 1);
    CHECK_EQ(st.queries, 2);
    g_bound_phase = 1;
    expect(1, step_bound_check);
    resolve(g_d3, "other.test", AF_INET, 2000, on_bound, NULL);
    return;
  }
  CHECK_EQ(st.queries, 3); /* other.test was evicted by other2.test */
  CHECK_EQ(st.cache_hits, 0);
  CHECK_EQ(st.cached, 1);
  dns_free(g_d3);
  step_end();
}

static void step_bound(void) {
  printf("-- the cache is bounded\n");
  char servers[64];
  snprintf(servers, sizeof(servers), "127.0.0.1:%d", g_stub_port);
  dns_opts_t o = {.servers = servers, .cache_max = 1};
  int err = 0;
  g_d3 = dns_new(g_r, &o, &err);
  CHECK(g_d3 != NULL);
  expect(2, step_bound_check);
  resolve(g_d3, "other.test", AF_INET, 2000, on_bound, NULL);
  resolve(g_d3, "other2.test", AF_INET, 2000, on_bound, NULL);
}

static void step_free(void) {
  printf("-- freeing the resolver\n");
  resolve(g_d, "never.test", AF_INET, 0, on_freed, NULL);
  resolve(g_d, "slow-c.test", AF_INET, 5000, on_freed, NULL);
  dns_free(g_d);
  g_d = NULL;
  CHECK_EQ(g_freed_cbs, 2);
  int err = 0;
  g_d2 = dns_new(g_r, NULL, &err);
  CHECK(g_d2 != NULL);
  expect(1, step_bound);
  resolve(g_d2, "slow-d.test", AF_INET, 3000, on_freed, NULL);
  resolve(g_d2, "192.0.2.9", AF_INET, 3000, on_d2, NULL);
}

static mp_timer_t g_watchdog;
static void step_close(void) {
  timer_stop(reactor_timers(g_r), &g_watchdog);
  reactor_unwatch(g_stub_w);
  close(g_stub_fd);
  reactor_shutdown(g_r, 0);
}

/* The stub's late answers still queued go out first (their timers own
 * memory), then the loop stops. */
static void step_end(void) {
  expect(1, step_close);
  wait_ms(350);
}

static void watchdog(mp_timer_t *t) {
  printf("watchdog: the run took too long (a step waits for %d)\n", g_pending);
  g_fail++;
  if (g_d) dns_free(g_d);
  g_d = NULL;
  reactor_unwatch(g_stub_w);
  reactor_shutdown(g_r, 0);
}

int main(void) {
  g_r = reactor_new(0);
  if (!g_r) abort();
  int port = g_stub_port = stub_start();
  char servers[64];
  snprintf(servers, sizeof(servers), "127.0.0.1:%d", port);
  dns_opts_t o = {.servers = servers, .try_timeout_ms = 2000, .tries = 1};
  int err = 0;
  g_d = dns_new(g_r, &o, &err);
  CHECK(g_d != NULL);
  if (!g_d) return check_summary();
  timer_init(&g_watchdog);
  timer_start(reactor_timers(g_r), &g_watchdog, reactor_now(g_r), 20000, 0, 1,
              watchdog, NULL, NULL);
  reactor_defer(g_r, step_go, NULL, NULL);
  g_next = step_answer;
  reactor_run(g_r);
  reactor_free(g_r);
  return check_summary();
}
