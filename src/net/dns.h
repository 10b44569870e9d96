/* SPDX-License-Identifier: MIT */

/* dns: non-blocking name resolution for a lane, on Debian's c-ares driven
 * by the lane's reactor (its sockets are reactor watches, its timeouts a
 * reactor timer), so a slow DNS server never stalls the lane's other
 * connections. The foundation of issue 12's mp.resolve and of the
 * lookups of mp.connect, mp.redis and mp.fetch.
 *
 * One resolver per reactor; the resolver, its requests and every callback
 * belong to that reactor's thread. A resolver keeps a cache honouring the
 * answers' TTLs (bounded: the least recently used entry goes first),
 * answers numeric addresses without a query, reads /etc/hosts before DNS
 * (c-ares lookups "fb"), and shares one query between requests for the
 * same name and family that are in flight at once. */
#ifndef MP_DNS_H
#define MP_DNS_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#include "net/reactor.h"

typedef struct dns_resolver dns_resolver_t;
typedef struct dns_req dns_req_t;

typedef struct {
  int family; /* AF_INET or AF_INET6 */
  union {
    struct in_addr v4;
    struct in6_addr v6;
  } a;
} dns_addr_t;

/* Addresses kept per answer; the rest of a longer answer is dropped. */
#define DNS_MAX_ADDRS 16
/* Cache entries when dns_opts_t.cache_max is 0. */
#define DNS_DEFAULT_CACHE 256
/* TTLs are capped at a day: a name that moves is re-read at least daily. */
#define DNS_MAX_TTL 86400u
/* Longest host name accepted (RFC 1035: 253 characters in text form). */
#define DNS_MAX_NAME 253

/* The answer, on the reactor's thread and never from inside dns_resolve
 * (at the soonest on the loop's next turn). err is 0 with n >= 1
 * addresses valid only during the call and ttl_s the seconds they may be
 * kept (the smallest TTL of the records, what is left of it on a cache
 * hit, 0 for numeric and /etc/hosts answers); or a negative errno with
 * n == 0: -ENOENT no such name (or no address of that family), -ETIMEDOUT
 * the request's timeout, -EAGAIN the servers failed or refused (SERVFAIL,
 * REFUSED, none reachable), -EINVAL a malformed name or an address of
 * the other family, -EAFNOSUPPORT a family other than AF_INET,
 * AF_INET6, AF_UNSPEC, -ECANCELED the resolver was freed, -ENOMEM,
 * -EIO anything else. */
typedef void (*dns_cb)(void *arg, int err, const dns_addr_t *addrs, size_t n,
                       uint32_t ttl_s);

typedef struct {
  size_t cache_max;         /* entries, 0: DNS_DEFAULT_CACHE */
  /* "ip[:port],..." (ares_set_servers_ports_csv); NULL: /etc/resolv.conf */
  const char *servers;
  uint32_t try_timeout_ms;  /* c-ares's per-try timeout, 0: its default */
  int tries;                /* 0: c-ares's default */
} dns_opts_t;

/* A resolver on reactor `r` (opts may be NULL). NULL with *err a negative
 * errno on failure. Reactor thread, or before the loop runs. */
dns_resolver_t *dns_new(reactor_t *r, const dns_opts_t *opts, int *err);

/* Frees the resolver: every pending request gets its callback at once,
 * inside dns_free, with -ECANCELED (or with its answer if one had already
 * arrived), so owners can free what they passed as arg; then the c-ares
 * channel and its sockets go. A dns_resolve on it from those callbacks
 * fails (-ESHUTDOWN), a second dns_free is ignored. May be called from a
 * dns callback. Call it before reactor_free. */
void dns_free(dns_resolver_t *d);

/* Resolves `host` (a name, or a numeric IPv4/IPv6 address) for `family`
 * (AF_INET, AF_INET6, or AF_UNSPEC for both). timeout_ms bounds this
 * request (0: only c-ares's own tries and timeouts do); a query that
 * outlives it goes on and fills the cache. Returns a handle valid until
 * the callback has returned or dns_cancel; NULL with errno ENOMEM,
 * EINVAL (an empty name or one over DNS_MAX_NAME) or ESHUTDOWN (the
 * resolver is being freed), and then no callback runs. */
dns_req_t *dns_resolve(dns_resolver_t *d, const char *host, int family,
                       uint32_t timeout_ms, dns_cb cb, void *arg);

/* The callback of `q` will not run. Safe from inside any dns callback;
 * from inside q's own callback it does nothing. */
void dns_cancel(dns_req_t *q);

/* Counters, for tests and metrics. */
typedef struct {
  uint64_t queries;    /* lookups handed to c-ares (shared ones once) */
  uint64_t cache_hits; /* requests answered from the cache */
  size_t cached;       /* entries now */
} dns_stats_t;
void dns_stats(const dns_resolver_t *d, dns_stats_t *out);

/* A short name for a dns_cb err ("no such host", "timeout", ...). */
const char *dns_strerror(int err);

#endif
